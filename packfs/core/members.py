"""The shards of a set: where each is, opening it when first used (and again after it
was dropped to stay within :func:`open_shard_limit`), checking it against what its
manifest says, sorting the shards into layers of ranges that do not overlap, and the
set's rule that no path is in two shards.  :class:`~.union.ShardSet` serves the merged
tree over them; a manifest is read and its shards located here.

Checking.  A path held twice is refused when a list or a glob is opened, and when a
manifest is written (``packfs pack``, ``set``, ``append`` open the set with
``check_records=True``): shards whose ranges overlap (different layers) are checked
against each other, a lookup in one of each path of the other, O(m log n) for the
smaller, m; and each directory above a shard's first leaf is looked up in the shard
whose range holds it, which must hold it as a directory if at all (O(shards x depth)).
Opening a manifest trusts the check made when it was written (its CRC guards it);
:meth:`ShardSet.verify` makes it again.  Sets packed at once have no overlaps.
"""

from __future__ import annotations

import bisect
import errno
import gc
import os
import threading
from collections import OrderedDict
from typing import Any, Iterator, Mapping, Optional, Sequence, Union
from urllib.parse import unquote

from ..errors import ClosedArchiveError, FormatError, PackfsError, PathNotFoundError
from ..format import S_IFDIR, S_IFMT
from ..source import (absolute_location, is_url, open_source, settled_cache_dir, shown_location,
                      with_cache_dir)
from .archive import Archive
from .manifest import (MANIFEST_SUFFIX, MAX_MANIFEST_BYTES, ShardRecord, depth_first_key, footer_crc, leaf_range,
                       looks_like_manifest, shard_file_problem)
from .paths import PathArg

__all__ = ["ShardMembers", "Shard", "Layer", "open_shard_limit", "is_shard_set_spec", "is_manifest_file",
           "read_manifest", "beside"]

GLOB_MAGIC = ("*", "?", "[")  # a name with one of these, not itself a file, is a glob of shards


class Shard:
    """One shard: where it is, what the manifest says of it, its archive once opened."""

    __slots__ = ("location", "name", "record", "archive", "first", "last", "first_key", "last_key", "index", "seen")

    def __init__(self, index: int, location: str, record: Optional[ShardRecord]) -> None:
        self.index = index
        self.location = location  # what opens it: a URL's user and password too
        self.name = shown_location(location)  # what messages show
        self.record = record
        self.archive: Optional[Archive] = None
        # (size, entries, footer CRC) when first opened: a re-open (after the shard was
        # closed to bound descriptors) must find the same bytes.
        self.seen: Optional[tuple[int, int, int]] = None
        self.first = self.last = b""
        self.first_key: tuple[bytes, ...] = ()
        self.last_key: tuple[bytes, ...] = ()

    def set_range(self, first: bytes, last: bytes) -> None:
        """The shard's range: its first and last leaf, in depth-first order."""
        self.first, self.last = first, last
        self.first_key, self.last_key = depth_first_key(first), depth_first_key(last)

    @property
    def empty(self) -> bool:
        """Holds the root alone: no range, nothing to merge but the root."""
        return not self.first and not self.last


class Layer:
    """Shards whose ranges do not overlap, sorted by range."""

    __slots__ = ("shards", "firsts", "ascending")

    def __init__(self) -> None:
        self.shards: list[Shard] = []
        self.firsts: list[tuple[bytes, ...]] = []
        self.ascending = True  # shard numbers rise with the ranges: the first holder found is the lowest

    def add(self, shard: Shard) -> None:
        """Put ``shard``, whose range follows the last one's, at the end of the layer."""
        if self.shards and shard.index < self.shards[-1].index:
            self.ascending = False
        self.shards.append(shard)
        self.firsts.append(shard.first_key)

    def holders(self, key: tuple[bytes, ...]) -> Iterator[Shard]:
        """The shards of this layer that may hold ``key``, in range order: the one whose
        range contains it, then those whose first leaf lies under it (it is then one of
        their ancestors, a directory)."""
        shards, firsts = self.shards, self.firsts
        at = bisect.bisect_right(firsts, key) - 1
        if at >= 0 and key <= shards[at].last_key:
            yield shards[at]
        depth = len(key)
        for position in range(at + 1, len(shards)):
            first = firsts[position]
            if len(first) <= depth or first[:depth] != key:
                break
            yield shards[position]


def open_shard_limit() -> int:
    """How many shards a set keeps open at once: a quarter of the soft limit on open
    files (``RLIMIT_NOFILE``), at least 8; a shard closed to stay within it is opened
    again (and checked again) when next used."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 256
    if soft == resource.RLIM_INFINITY or soft <= 0:
        soft = 1 << 16
    return max(8, min(soft, 1 << 20) // 4)


def is_shard_set_spec(spec: object) -> bool:
    """Whether ``spec`` names a shard set rather than one archive: a list or tuple of
    archives, a name ending in ``.ffrset``, or a local pattern with ``*``, ``?`` or
    ``[`` that is not itself a file."""
    if isinstance(spec, (list, tuple)):
        return True
    if not isinstance(spec, (str, bytes, os.PathLike)):
        return False
    name = os.fsdecode(spec)
    if name.endswith(MANIFEST_SUFFIX):
        return True
    return not is_url(name) and any(c in name for c in GLOB_MAGIC) and not os.path.exists(name)


def is_manifest_file(name: str, storage_options: Optional[Mapping[str, Any]],
                      cache_dir: Union[PathArg, bool, None]) -> bool:
    """Whether ``name`` (a file that is not an archive) begins as a manifest does."""
    try:
        source = open_source(name, storage_options=with_cache_dir(storage_options, False if is_url(name) else cache_dir))
    except (OSError, PackfsError):
        return False
    try:
        return looks_like_manifest(source.read(0, min(source.size, 16)))
    except (OSError, PackfsError):
        return False
    finally:
        source.close()


def read_manifest(name: str, storage_options: Optional[Mapping[str, Any]]) -> bytes:
    """The manifest ``name``\'s bytes, refused past MAX_MANIFEST_BYTES before any is read."""
    try:
        # Never from the disk cache: a manifest is replaced in place when a set grows.
        source = open_source(name, storage_options=with_cache_dir(storage_options, False))
    except FileNotFoundError:
        raise PathNotFoundError(f"{shown_location(name)!r}: no such shard-set manifest") from None
    try:
        # The size the source reports (a URL's Content-Length) is checked before a byte
        # is read: a hostile or mistaken claim costs no memory.
        if source.size > MAX_MANIFEST_BYTES:
            raise FormatError(f"{shown_location(name)!r}: {source.size} bytes is too large for a shard-set "
                              f"manifest (at most {MAX_MANIFEST_BYTES})")
        return source.read(0, source.size)
    finally:
        source.close()


def beside(manifest: str, file: str) -> str:
    """Where a manifest's ``file`` is: in the manifest's directory (or URL prefix)."""
    if is_url(manifest):
        # A server decodes %-escapes before it resolves '..': "%2e%2e/x" is "../x" there.
        problem = shard_file_problem(unquote(file))
        if problem:
            raise FormatError(f"{shown_location(manifest)!r}: shard file {file!r} is, %-decoded as a server reads "
                              f"it, {problem}")
        return manifest.rsplit("/", 1)[0] + "/" + file
    return os.path.join(os.path.dirname(manifest), file)



class ShardMembers:
    """The shards of one set, opened when first used, at most :func:`open_shard_limit`
    at once; ``path`` names the set in messages.  Raises at construction what
    :class:`~.union.ShardSet` raises at open (a path in two shards, a damaged manifest
    record's range), every shard it opened closed again."""

    def __init__(self, locations: Sequence[str], records: Optional[Sequence[ShardRecord]], where: str,
                 checksums: str, storage_options: Optional[Mapping[str, Any]],
                 cache_dir: Union[PathArg, bool, None], check_records: bool) -> None:
        self.path = where
        self.checksums = checksums
        self._options = dict(storage_options or {})
        # URL shards open when first used: their cache directory, like their locations
        # below, is settled now (a relative one would move with the working directory).
        if any(is_url(os.fspath(location)) for location in locations):
            cache_dir = settled_cache_dir(cache_dir if cache_dir is not None else self._options.get("cache_dir"))
        self._cache_dir = cache_dir
        self.lock = threading.Lock()
        self.closed = False
        # Shards open at once are bounded (a set may have more shards than the process
        # may open files): past the bound, the least recently used is dropped.
        self.open_limit = open_shard_limit()
        self.recent: OrderedDict[int, None] = OrderedDict()
        # Shards open when first used, perhaps after the process changed directory (a
        # mount's daemon serves from /): where they are is settled now.
        self.shards = [Shard(i, absolute_location(location), records[i] if records else None)
                       for i, location in enumerate(locations)]
        # Each shard's archive once opened (None before): the hot paths' one list index.
        self.opened: list[Optional[Archive]] = [None] * len(self.shards)
        try:
            if records is None:
                counts = []
                for shard in self.shards:
                    archive = self.archive(shard.index)
                    shard.set_range(*leaf_range(archive))
                    counts.append(archive.entry_count)
                    del archive  # closed when the bound on open shards needs its descriptor
            else:
                for shard, record in zip(self.shards, records):
                    shard.set_range(record.first, record.last)
                counts = [record.entries for record in records]
            self.bases = [0]
            for count in counts:
                self.bases.append(self.bases[-1] + count)
            self.layers = self._sort_into_layers()
            if records is None or check_records:
                self.check_overlaps()
                self.check_shared_directories()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close every shard opened; a shard asked for later raises ClosedArchiveError."""
        with self.lock:
            self.closed = True
            for shard in self.shards:
                if shard.archive is not None:
                    shard.archive.close()

    def keep_every_shard_open(self) -> None:
        """Lift the bound on shards open at once (``ShardSet.keep_every_shard_open``)."""
        with self.lock:
            self.open_limit = max(self.open_limit, len(self.shards))

    def archive(self, index: int) -> Archive:
        """Shard ``index``'s archive, opened (and checked against its manifest) on first
        use, and again after it was closed to keep the shards open within the bound."""
        shard = self.shards[index]
        archive = shard.archive
        if archive is not None:
            try:
                self.recent.move_to_end(index)
            except KeyError:
                pass  # dropped by another thread just now; the archive in hand still works
            return archive
        with self.lock:
            if self.closed:
                raise self.closed_error()
            archive = shard.archive
            if archive is None:
                archive = self._open_shard(shard)
                shard.archive = self.opened[index] = archive
                self.recent[index] = None
                while len(self.recent) > self.open_limit:
                    dropped, _ = self.recent.popitem(last=False)
                    # Dropped, not closed: a reader in another thread may hold the archive
                    # (or a file or view from it), and closing it under that reader would
                    # fail its call.  The last holder to let go frees the descriptor and
                    # the map (the source's finalizer), which for an idle shard is now.
                    self.shards[dropped].archive = self.opened[dropped] = None
            return archive

    def closed_error(self) -> ClosedArchiveError:
        """What a closed set raises when a shard is asked for."""
        # Worded as a closed Archive's (and a closed file's), which an opened shard raises.
        return ClosedArchiveError(f"I/O operation on a closed shard set ({self.path!r})")

    def _open_shard(self, shard: Shard) -> Archive:
        index = shard.index
        if shard.record is not None:
            self._check_inside(shard, None)  # before the open: never open (a FIFO, a device) outside
        try:
            try:
                opened = Archive(shard.location, checksums=self.checksums, storage_options=self._options,
                                 cache_dir=self._cache_dir)
            except OSError as error:
                if error.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                # Shards dropped but caught in a reference cycle hold their descriptors
                # until the cyclic collector runs: run it, and try once more.
                gc.collect()
                opened = Archive(shard.location, checksums=self.checksums, storage_options=self._options,
                                 cache_dir=self._cache_dir)
        except FileNotFoundError:
            if shard.record is None:
                raise  # a list's or a glob's archive, named by the user: not there
            # A damaged set, not a path missing from its tree: a mount answers
            # EIO and logs this, rather than ENOENT for a path that is listed.
            raise FormatError(f"{shard.name!r}: shard {index} of {self.path!r} is missing (moved or "
                              "removed since the manifest was written)") from None
        try:
            if shard.record is not None:
                self._check_inside(shard, opened)  # the file opened, whatever was swapped in meanwhile
            self._check_against_manifest(shard, opened)
        except BaseException:
            opened.close()
            raise
        return opened

    def _check_inside(self, shard: Shard, archive: Optional[Archive]) -> None:
        """Refuse a manifest's local shard that leads (through a symlink, of the file or
        of a directory on its way) outside the manifest's directory: a manifest names
        files in its directory or below it, and a set's directory of links to anywhere
        would serve whatever they point at.  ``archive``: the file as opened (its
        descriptor's path), else the name as it resolves now."""
        location, record = shard.location, shard.record
        if record is None or is_url(location) or not location.endswith(record.file):
            return
        directory = os.path.realpath(location[:len(location) - len(record.file)] or ".")
        real = None
        if archive is not None:
            try:
                real = os.readlink(f"/proc/self/fd/{archive.source.fileno()}")  # type: ignore[attr-defined]
            except (OSError, AttributeError, ValueError):
                real = None
        if real is None:
            real = os.path.realpath(location)
        if not real.startswith(directory.rstrip("/") + "/"):
            raise FormatError(f"{shard.name!r}: shard {shard.index} of {self.path!r} leads outside the set's "
                              f"directory {directory!r} (to {real!r}, through a symlink): refused")

    def _check_against_manifest(self, shard: Shard, archive: Archive) -> None:
        seen = (archive.size, archive.entry_count, footer_crc(archive))
        if shard.seen is not None:
            if seen != shard.seen:
                raise FormatError(f"{shard.name!r}: shard {shard.index} of {self.path!r} was replaced or "
                                  "rewritten since the set was opened")
            return
        record = shard.record
        if record is not None:
            if seen != (record.size, record.entries, record.footer_crc):
                raise FormatError(
                    f"{shard.name!r}: not the shard {self.path!r} lists ({archive.size} bytes and "
                    f"{archive.entry_count} entries, the manifest says {record.size} and {record.entries}, or its "
                    "footer differs): replaced or rewritten since the manifest was written"
                )
            # The manifest's range is what every lookup trusts to find a path's shard: a
            # range that lies (its CRC valid) would list names twice, or list paths that
            # no lookup then finds.  O(depth) reads, once per shard.
            first, last = leaf_range(archive)
            if (first, last) != (record.first, record.last):
                raise FormatError(
                    f"{shard.name!r}: shard {shard.index} of {self.path!r} holds "
                    f"{os.fsdecode(first)!r} to {os.fsdecode(last)!r}, its manifest says "
                    f"{os.fsdecode(record.first)!r} to {os.fsdecode(record.last)!r}: the manifest is wrong"
                )
        shard.seen = seen

    def _sort_into_layers(self) -> list[Layer]:
        layers: list[Layer] = []
        for shard in sorted((s for s in self.shards if not s.empty), key=lambda s: (s.first_key, s.index)):
            for layer in layers:
                if layer.shards[-1].last_key < shard.first_key:
                    layer.add(shard)
                    break
            else:
                layer = Layer()
                layer.add(shard)
                layers.append(layer)
        return layers


    def check_overlaps(self) -> None:
        """Refuse a path held by two shards as anything but a directory in both; only
        shards of different layers whose ranges overlap can."""
        if len(self.layers) < 2:
            return
        shards = [s for s in self.shards if not s.empty]
        for a_position, a in enumerate(shards):
            for b in shards[a_position + 1:]:
                if a.first_key <= b.last_key and b.first_key <= a.last_key:
                    self.check_pair(a, b)

    def check_shared_directories(self) -> None:
        """Refuse a shard whose first leaf lies under a path another shard holds as a
        file or symlink (the one kind of collision ranges that do not overlap allow):
        each ancestor of each first leaf is looked up in the shard whose range holds it."""
        for shard in self.shards:
            if shard.empty:
                continue
            parts = shard.first.split(b"/")[:-1]
            for depth in range(1, len(parts) + 1):
                path = b"/".join(parts[:depth])
                key = depth_first_key(path)
                for layer in self.layers:
                    at = bisect.bisect_right(layer.firsts, key) - 1
                    if at < 0 or key > layer.shards[at].last_key or layer.shards[at] is shard:
                        continue
                    other = layer.shards[at]
                    archive = self.archive(other.index)
                    entry = archive.find(path)
                    if entry >= 0 and archive.file_type(entry) != S_IFDIR:
                        raise FormatError(
                            f"{os.fsdecode(path)!r} is in both {other.name!r} (not as a directory) and "
                            f"{shard.name!r} (a directory): the archives of a set must not hold the same path "
                            "(but directories)"
                        )

    def check_pair(self, a: Shard, b: Shard) -> None:
        """Refuse a path held by both ``a`` and ``b`` (overlapping ranges) as anything but
        a directory in both: each path of the smaller inside the overlap looked up in the
        larger."""
        small, large = sorted((a, b), key=lambda s: self.archive(s.index).entry_count)
        small_archive, large_archive = self.archive(small.index), self.archive(large.index)
        low, high = max(a.first_key, b.first_key), min(a.last_key, b.last_key)
        modes = small_archive.column("mode")
        for entry in range(1, small_archive.entry_count):
            path = small_archive.path_of(entry)
            key = depth_first_key(path)
            if not low <= key <= high:
                continue
            other = large_archive.find(path)
            if other < 0:
                continue
            if int(modes[entry]) & S_IFMT != S_IFDIR or large_archive.file_type(other) != S_IFDIR:
                raise FormatError(
                    f"{os.fsdecode(path)!r} is in both {small.name!r} and {large.name!r}: the archives of a "
                    "set must not hold the same path (but directories)"
                )
