"""Shard sets: one tree packed into several complete archives and their manifest.

:func:`pack_shards` cuts the entries of a tree, in pack's order (depth-first, names
bytewise), into contiguous partitions, and writes each with :func:`pack_entries` as an
archive of its own: its files, symlinks and empty directories, and the directories
above them with the attributes they have in the source (the root included), so that
any packfs or FFRecord reader opens it alone.  The manifest
(:mod:`packfs.core.manifest`) lists them; it is what makes them one tree.

Where a set is cut:

- ``shard_size``: a shard takes files until the next one would take its file bytes
  past the size; a larger file gets a shard of its own.  Only file bytes count: each
  shard adds its table (about 100 bytes an entry), so a shard can be a little larger.
- ``shards=N``: the file bytes are cut into N parts of about equal size, each file
  going to the part its middle byte falls in.  A tree with fewer files than N (or a
  few very large files) gives fewer shards; the names say how many.

A cut falls only before a file: the directories met just before it go with it into
the next shard.  A hard link whose file lies in an earlier shard is stored as a copy
of that file (the same bytes and attributes), so that every shard stands alone; links
within one shard stay links.  An empty tree gives one shard that holds its root.

OUT ``data.ffr`` (or ``data``) gives ``data-00000-of-00004.ffr`` ... and the
manifest ``data.ffrset`` beside them.  The set appears whole or not at all: shards
are written to temporary files, renamed into place once all are complete, and the
manifest written last (a temporary file, fsync, rename).  A signal removes whatever
was written (the CLI's handler, through :mod:`packfs.write.temporaries`); the
temporary files a killed packer (``kill -9``) leaves are removed by the next pack of
the same set.  The same source gives the same bytes, shards and manifest alike.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import stat as stat_module
import time
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Mapping, Optional, Sequence

from ..core.manifest import MANIFEST_SUFFIX, ShardRecord, depth_first_key, manifest_bytes, parse_manifest, shard_record
from ..errors import PackError, PackSourceError
from .archives import archive_entries
from .container import TEMP_MARKER
from .exclude import ExcludePatterns
from .entry import Entry, PackProgress, PathLike
from .pack import pack_entries
from .skips import SkipList, SkippedPath
from .scan import open_beneath, scan_tree
from .sets import remove_abandoned_temporaries, temporary_name
from .temporaries import register, unregister

__all__ = ["ShardSetStats", "ShardCutter", "pack_shards", "set_names", "shard_name", "cut_entries",
           "complete_shard", "write_shard", "publish_set", "remove_abandoned_temporaries"]

log = logging.getLogger("packfs")

ARCHIVE_SUFFIX = ".ffr"


@dataclass(frozen=True)
class ShardSetStats:
    """What :func:`pack_shards` wrote: the manifest, each shard as the manifest lists
    it, and the tree's counts (``dirs`` counts each directory once, though every shard
    with entries below one holds it; ``hardlinks`` counts the links stored as links or
    as copies)."""

    manifest: str
    shards: tuple[ShardRecord, ...]
    files: int
    dirs: int
    symlinks: int
    hardlinks: int
    skipped: tuple[SkippedPath, ...]
    file_bytes: int
    archive_bytes: int
    seconds: float
    changed: tuple[str, ...] = ()

    @property
    def failed(self) -> tuple[SkippedPath, ...]:
        """The skipped paths that could not be read (always empty: a shard set is
        written whole or not at all)."""
        return tuple(path for path in self.skipped if path.failed)


# -- names -----------------------------------------------------------------------------


def set_names(out: PathLike) -> tuple[str, str]:
    """(directory, stem) of the set OUT names: ``dir/data.ffr``, ``dir/data.ffrset``
    and ``dir/data`` all give (``dir``, ``data``)."""
    path = os.path.abspath(os.fsdecode(out))
    directory, name = os.path.split(path)
    for suffix in (MANIFEST_SUFFIX, ARCHIVE_SUFFIX):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    if not name or name in (".", ".."):
        raise PackError(f"{os.fsdecode(out)!r}: expected a file name for the set (as data.ffr)")
    return directory, name


def shard_name(stem: str, number: int, count: int) -> str:
    """The file name of shard ``number`` (from 0) of ``count``."""
    return f"{stem}-{number:05d}-of-{count:05d}{ARCHIVE_SUFFIX}"


# -- where a set is cut ----------------------------------------------------------------


class ShardCutter:
    """Decides, file by file in pack order, where shards begin.

    Parameters
    ----------
    shard_size
        A shard's file bytes at most (a larger file alone in its shard).
    shards
        The number of parts (at most) to cut ``total_bytes`` into.
    total_bytes
        The file bytes of the whole tree (needed with ``shards``).
    """

    def __init__(self, shard_size: int | None = None, shards: int | None = None, total_bytes: int = 0) -> None:
        if (shard_size is None) == (shards is None):
            raise ValueError("give shard_size or shards, not both")
        if shard_size is not None and shard_size < 1:
            raise ValueError(f"shard_size must be at least 1, got {shard_size!r}")
        if shards is not None and shards < 1:
            raise ValueError(f"shards must be at least 1, got {shards!r}")
        self.shard_size = shard_size
        self.shards = shards
        self.total_bytes = total_bytes
        self._before = 0  # file bytes of the tree before the next file
        self._shard_bytes = 0
        self._shard_files = 0
        self._part = 0

    def starts_shard(self, size: int) -> bool:
        """Whether the next file, of ``size`` bytes, begins a new shard."""
        if self.shard_size is not None:
            cut = self._shard_files > 0 and self._shard_bytes + size > self.shard_size
        else:
            assert self.shards is not None
            total = max(self.total_bytes, 1)
            # The part its middle byte falls in: every file lands in one part, in order.
            part = min(self.shards - 1, (2 * self._before + size) * self.shards // (2 * total))
            cut = self._shard_files > 0 and part > self._part
            if cut or self._shard_files == 0:
                self._part = part
        if cut:
            self._shard_bytes = self._shard_files = 0
        self._shard_bytes += size
        self._shard_files += 1
        self._before += size
        return cut


def _entry_size(entry: Entry) -> int:
    if entry.size is not None:
        return entry.size
    if isinstance(entry.data, (bytes, bytearray, memoryview)):
        return len(entry.data)
    return 0


def cut_entries(entries: Iterable[Entry], cutter: ShardCutter) -> Iterator[list[Entry]]:
    """The shards' entries, in pack order: a cut falls only before a file, and the
    directories met just before it go with it.  (Anything with an Entry's ``kind``,
    ``path``, ``size`` and ``data`` will do: a plan cuts its stand-ins the same way.)  The root's entry is left out (see
    :func:`complete_shard`).  Each list is complete when the next is taken; entries
    whose data must be read in order (a stream) need :func:`_stream_shards`."""
    shard: list[Entry] = []
    pending: list[Entry] = []  # directories whose shard is decided by the next file
    for entry in entries:
        if entry.kind == "dir":
            if entry.key:
                pending.append(entry)
            continue
        if entry.kind == "file" and cutter.starts_shard(_entry_size(entry)):
            yield shard
            shard = []
        shard.extend(pending)
        pending.clear()
        shard.append(entry)
    shard.extend(pending)
    yield shard


def complete_shard(entries: Sequence[Entry], root: Entry | None, directories: dict[bytes, Entry],
                   files: Callable[[bytes], Optional[Entry]]) -> tuple[list[Entry], int]:
    """A shard's entries as an archive of its own, and its data slot count: the root
    and the directories above its first entry (from ``directories``, their source
    attributes; one not found is left to the packer, 0o755), and each hard link whose
    file is not in the shard replaced by a copy of that file (``files`` gives the
    file's entry by key, data and attributes)."""
    head: list[Entry] = [root] if root is not None else []
    if entries:
        own = {entry.key for entry in entries if entry.kind == "dir"}
        key = entries[0].key
        above = []
        while b"/" in key:
            key = key.rpartition(b"/")[0]
            if key not in own and key in directories:
                above.append(directories[key])
        head.extend(reversed(above))
    complete = head
    in_shard: set[bytes] = set()
    slots = 0
    for entry in entries:
        key = entry.key
        if entry.kind == "hardlink":
            target = entry.target_key
            if target not in in_shard:
                original = files(target)
                if original is None:
                    raise PackError(f"hard link {os.fsdecode(key)!r} points to {os.fsdecode(target)!r}, "
                                    "which is not an earlier file entry")
                entry = dataclasses.replace(original, path=entry.path)
        if entry.kind == "file":
            in_shard.add(key)
        if entry.kind in ("file", "symlink"):
            slots += 1
        complete.append(entry)
    return complete, slots


def write_shard(entries: Iterable[Entry], path: str, count: int | None,
                progress: PackProgress | None = None, codecs: Mapping[str, Any] | None = None) -> ShardRecord:
    """Write one shard's ``entries`` to ``path`` (a temporary name: registered here
    before it exists) with :func:`pack_entries`; return its record, named by the
    final name that ``path``'s caller gives it later (``file`` is left empty)."""
    register(path)
    try:
        pack_entries(entries, path, count=count, progress=progress, **(codecs or {}))
        return record_of(path, "")
    except BaseException:
        try:
            os.unlink(path)
        except OSError:
            pass
        unregister(path)
        raise


def record_of(path: str, file: str) -> ShardRecord:
    """The manifest's record of the shard at ``path``, listed as ``file``."""
    from ..core import Archive

    with Archive(path) as archive:
        return shard_record(archive, file)


def publish_set(directory: str, stem: str, written: Sequence[tuple[str, ShardRecord]], force: bool) -> list[ShardRecord]:
    """Rename each written shard (temporary path, record) into place as
    ``stem-NNNNN-of-NNNNN.ffr``, then write the manifest ``stem.ffrset`` (a temporary
    file, fsync, rename): a reader finds the whole set or none.  Without ``force``,
    existing files are not replaced.  On any error (a signal included) the shards
    already renamed are removed.  With ``force``, the shards of a set the manifest
    listed before and this one does not are removed once the new manifest is in
    place.  Returns the records as the manifest lists them."""
    count = len(written)
    names = [shard_name(stem, number, count) for number in range(count)]
    manifest = os.path.join(directory, stem + MANIFEST_SUFFIX)
    records = [record._replace(file=name) for (_, record), name in zip(written, names)]
    for before, after in zip(records, records[1:]):
        if depth_first_key(after.first) <= depth_first_key(before.last):
            raise PackError(f"{stem}: shard ranges overlap ({os.fsdecode(before.last)!r} and "
                            f"{os.fsdecode(after.first)!r}); entries were not in pack order")
    if not force:
        for name in names + [stem + MANIFEST_SUFFIX]:
            if os.path.lexists(os.path.join(directory, name)):
                raise PackError(f"{os.path.join(directory, name)!r} already exists; use --force to replace it")
    old_files = _listed_shards(manifest) if force else []
    published: list[str] = []
    manifest_temporary = os.path.join(directory, temporary_name(stem, stem + MANIFEST_SUFFIX))
    try:
        for (temporary, _), name in zip(written, names):
            final = os.path.join(directory, name)
            register(final)  # from here until the manifest is in place, a signal removes it
            published.append(final)
            _rename(temporary, final, force)
            unregister(temporary)
        _fsync_directory(directory)
        register(manifest_temporary)
        data = manifest_bytes(records)
        fd = os.open(manifest_temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        # Registered too: a signal between the rename and the unregistering below
        # removes the whole set, manifest included, never the shards alone.
        register(manifest)
        try:
            _rename(manifest_temporary, manifest, force)
        except BaseException:
            unregister(manifest)  # not renamed: what is there (if anything) is not this set's
            raise
        published.append(manifest)
        for path in published + [manifest_temporary]:
            unregister(path)
    except BaseException as error:
        for path in published + [manifest_temporary]:
            try:
                os.unlink(path)
            except OSError:
                pass
            unregister(path)
        if isinstance(error, OSError):
            raise PackError(f"cannot write the set {manifest!r}: {error.strerror or error}") from None
        raise
    try:
        _fsync_directory(directory)
    except OSError as error:
        raise PackError(f"cannot write the set {manifest!r}: {error.strerror}") from None
    for name in old_files:
        if name not in names:
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass
    return records


def _listed_shards(manifest: str) -> list[str]:
    """The shard files the manifest at ``manifest`` lists (none if it is not one)."""
    try:
        with open(manifest, "rb") as f:
            return [record.file for record in parse_manifest(f.read(), manifest)]
    except (OSError, PackError, ValueError):
        return []


def _rename(temporary: str, final: str, force: bool) -> None:
    if force:
        os.replace(temporary, final)
        return
    try:
        os.link(temporary, final)  # fails if final appeared meanwhile: nothing is clobbered
    except FileExistsError:
        raise PackError(f"{final!r} already exists; use --force to replace it") from None
    except OSError:
        if os.path.lexists(final):
            raise PackError(f"{final!r} already exists; use --force to replace it") from None
        os.replace(temporary, final)  # a file system without hard links
    else:
        os.unlink(temporary)


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- the sources -----------------------------------------------------------------------


def _file_opener(root: bytes, key: bytes) -> Callable[[], BinaryIO]:
    def open_file() -> BinaryIO:
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
        path = os.fsdecode(root + b"/" + key)
        try:
            fd = open_beneath(root, key, flags)
        except OSError as error:
            raise PackSourceError([SkippedPath(path, f"cannot open: {error.strerror}", True)]) from None
        if not stat_module.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise PackSourceError([SkippedPath(path, "no longer a regular file", True)])
        return os.fdopen(fd, "rb", buffering=0)

    return open_file


def _directory_entries(src: bytes, follow_symlinks: bool, exclude: Sequence[str], xattrs: bool,
                       directory: str, stem: str) -> list[Entry]:
    """The tree ``src`` as entries in pack order, each file opened when it is written
    (its attributes are the scan's; a file whose size changed since fails the pack)."""
    root = src.rstrip(b"/") or b"/"
    patterns = ExcludePatterns(exclude, root)
    skips = SkipList(False)
    skip: set[tuple[int, int]] = set()
    for name in os.listdir(directory):  # an earlier set here is not packed into this one
        if name == stem + MANIFEST_SUFFIX or (name.startswith(stem + "-") and name.endswith(ARCHIVE_SUFFIX)):
            try:
                info = os.stat(os.path.join(directory, name))
                skip.add((info.st_dev, info.st_ino))
            except OSError:
                pass
    out_directory = os.stat(directory)
    temp_files = ((out_directory.st_dev, out_directory.st_ino), os.fsencode(f".{stem}{TEMP_MARKER}"))
    items = scan_tree(root, follow_symlinks, patterns, skip, temp_files, skips, xattrs)
    if skips.failures:
        raise PackSourceError(skips.failures)
    for path in skips.paths:
        log.warning("skipped: %s (%s)", path.path, path.reason)
    for pattern in patterns.unused():
        log.warning("exclude pattern %r excluded nothing in %r", pattern, os.fsdecode(root))
    entries = []
    for item in items:
        info = item.info
        mode, uid, gid, mtime_ns = stat_module.S_IMODE(info.st_mode), info.st_uid, info.st_gid, info.st_mtime_ns
        if item.kind == "file":
            entries.append(Entry(item.key, _file_opener(root, item.key), size=info.st_size, mode=mode, uid=uid,
                                 gid=gid, mtime_ns=mtime_ns, xattrs=item.xattrs))
        elif item.kind == "symlink" or item.kind == "hardlink":
            entries.append(Entry(item.key, None, "symlink" if item.kind == "symlink" else "hardlink",
                                 target=item.target, mode=mode, uid=uid, gid=gid, mtime_ns=mtime_ns,
                                 xattrs=item.xattrs))
        else:
            entries.append(Entry(item.key, None, "dir", mode=mode, uid=uid, gid=gid, mtime_ns=mtime_ns,
                                 xattrs=item.xattrs))
    return entries


def pack_shards(
    src: PathLike,
    out: PathLike,
    *,
    shard_size: int | None = None,
    shards: int | None = None,
    follow_symlinks: bool = False,
    exclude: Sequence[str] = (),
    force: bool = False,
    progress: PackProgress | None = None,
    xattrs: bool = True,
    stdin: BinaryIO | None = None,
    codecs: Mapping[str, Any] | None = None,
) -> ShardSetStats:
    """Pack ``src`` (a directory, a tar or a zip; ``"-"``: a tar on ``stdin``) into a
    shard set: shards of at most ``shard_size`` file bytes, or ``shards`` parts of
    about equal bytes (see the module's documentation for the rules).

    A directory is scanned first (as :func:`pack_folder` does; a path that cannot be
    read fails the pack, nothing written), then each file read when its shard is
    written, stored with the attributes the scan found; a file whose size changed
    since fails the pack.  An uncompressed tar file and a zip are read in pack's
    order.  A tar stream or a compressed tar is read once, in member order, so it
    takes ``shard_size`` only (``shards`` needs the total first), and its members
    must come in pack's order (GNU tar ``--sort=name`` writes them so).

    Parameters
    ----------
    src, out
        The source, and the set's name: ``data.ffr`` (or ``data``, ``data.ffrset``)
        gives ``data-00000-of-0000N.ffr``... and the manifest ``data.ffrset``.
    shard_size, shards
        Exactly one of them.
    follow_symlinks, exclude, xattrs
        As for :func:`pack_folder` (``follow_symlinks`` and ``exclude``: a directory
        only).
    force
        Replace an existing set of the same name (its shards the new manifest does
        not list are removed after it is in place).
    progress
        Told the totals (a directory, a tar file, a zip), then each file as written.

    codecs
        Format 1.5's codec options for every shard, as pack_folder's keyword
        arguments: ``{"compress": "zstd", "dictionary": "auto"}`` (each shard trains
        its own dictionaries: a shard is a complete archive that opens alone).

    Returns
    -------
    ShardSetStats

    Raises
    ------
    PackSourceError
        Paths of a directory cannot be packed (every one listed).
    PackError
        ``src`` is not a directory, tar or zip; ``shards`` with a stream; members of a
        stream out of pack order; the set exists (without ``force``); writing failed.
    """
    started = time.perf_counter()
    if (shard_size is None) == (shards is None):
        raise ValueError("pack_shards needs shard_size or shards (one of them)")
    directory, stem = set_names(out)
    if not os.path.isdir(directory):
        raise PackError(f"cannot write {os.fsdecode(out)!r}: {directory!r} is not a directory")
    manifest = os.path.join(directory, stem + MANIFEST_SUFFIX)
    if not force and os.path.lexists(manifest):
        raise PackError(f"{manifest!r} already exists; use --force to replace it")
    remove_abandoned_temporaries(directory, stem)
    src_text = os.fsdecode(src)
    skips = SkipList(False, where=f"{src_text}: " if src_text != "-" else "<stdin>: ")
    counts = _Counts()
    written: list[tuple[str, ShardRecord]] = []
    try:
        if src_text != "-" and os.path.isdir(src_text):
            entries = _directory_entries(os.fsencode(src), follow_symlinks, exclude, xattrs, directory, stem)
            _write_planned(entries, directory, stem, shard_size, shards, progress, counts, written, codecs)
        else:
            if follow_symlinks or exclude:
                raise PackError("follow_symlinks and exclude apply to a directory only")
            with archive_entries(src_text, skips, stdin=stdin, xattrs=xattrs) as (members, planned):
                if planned:
                    _write_planned(list(members), directory, stem, shard_size, shards, progress, counts, written,
                                   codecs)
                elif shards is not None:
                    raise PackError(f"{src_text!r}: --shards needs the total size first, and a tar stream or a "
                                    "compressed tar is read once; use --shard-size, or an uncompressed tar file")
                else:
                    _write_streamed(members, directory, stem, ShardCutter(shard_size=shard_size), counts, written,
                                    progress, codecs)
        records = publish_set(directory, stem, written, force)
    except BaseException:
        for temporary, _ in written:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            unregister(temporary)
        raise
    finally:
        remove_abandoned_temporaries(directory, stem)
    return ShardSetStats(
        manifest=manifest, shards=tuple(records), files=counts.files + counts.hardlinks, dirs=len(counts.dirs),
        symlinks=counts.symlinks, hardlinks=counts.hardlinks, skipped=tuple(skips.paths),
        file_bytes=counts.file_bytes, archive_bytes=sum(record.size for record in records),
        seconds=time.perf_counter() - started)


class _Counts:
    """The tree's counts, as its entries pass."""

    def __init__(self) -> None:
        self.files = self.symlinks = self.hardlinks = self.file_bytes = 0
        self.dirs: set[bytes] = {b""}

    def add(self, entry: Entry) -> None:
        if entry.kind == "file":
            self.files += 1
            self.file_bytes += _entry_size(entry)
        elif entry.kind == "symlink":
            self.symlinks += 1
        elif entry.kind == "hardlink":
            self.hardlinks += 1
        else:
            self.dirs.add(entry.key)


def _write_planned(entries: list[Entry], directory: str, stem: str, shard_size: int | None, shards: int | None,
                   progress: PackProgress | None, counts: _Counts, written: list[tuple[str, ShardRecord]],
                   codecs: Mapping[str, Any] | None = None) -> None:
    """Write a source listed whole, in pack order, each file's data opened when read."""
    for entry in entries:
        counts.add(entry)
    total = sum(_entry_size(entry) for entry in entries if entry.kind == "file")
    if progress is not None:
        progress.start(counts.files, total)
    root = next((entry for entry in entries if entry.kind == "dir" and not entry.key), None)
    directories = {entry.key: entry for entry in entries if entry.kind == "dir"}
    targets = {entry.target_key for entry in entries if entry.kind == "hardlink"}
    linked = {entry.key: entry for entry in entries
              if entry.kind == "file" and entry.key in targets}
    cutter = ShardCutter(shard_size=shard_size, shards=shards, total_bytes=total)
    for number, shard in enumerate(cut_entries(entries, cutter)):
        complete, slots = complete_shard(shard, root, directories, linked.get)
        path = os.path.join(directory, temporary_name(stem, f"{number:05d}{ARCHIVE_SUFFIX}"))
        written.append((path, write_shard(complete, path, slots, progress, codecs)))


def _write_streamed(entries: Iterator[Entry], directory: str, stem: str, cutter: ShardCutter, counts: _Counts,
                    written: list[tuple[str, ShardRecord]], progress: PackProgress | None = None,
                    codecs: Mapping[str, Any] | None = None) -> None:
    """Write a source read once (a stream): each shard ends when the next file would
    not fit, its data spooled by pack_entries (the count is unknown until then), which
    tells ``progress`` each shard's totals as it starts copying it."""
    directories: dict[bytes, Entry] = {}
    root: list[Entry] = []
    carried: list[Entry] = []  # the next shard's first entries: directories, then the file that cut
    previous: tuple[bytes, ...] | None = None
    source = iter(entries)
    finished = False

    def shard_entries() -> Iterator[Entry]:
        nonlocal previous, finished
        pending: list[Entry] = []
        first = True
        in_shard: set[bytes] = set()

        def placed(entry: Entry) -> Iterator[Entry]:
            nonlocal first
            if first:
                first = False
                # The root and the directories above the entry (a stand-in: only its path counts).
                head, _ = complete_shard([Entry(entry.path, kind="dir")], root[0] if root else None, directories,
                                         lambda key: None)
                yield from head[:-1]
            if entry.kind == "hardlink" and entry.target_key not in in_shard:
                entry = _copy_from_earlier(entry, [path for path, _ in written])
            if entry.kind == "file":
                in_shard.add(entry.key)
            yield entry

        for entry in carried:
            yield from placed(entry)
        carried.clear()
        for entry in source:
            key = entry.key
            order = depth_first_key(key)
            if previous is not None and order <= previous:
                raise PackError(f"{os.fsdecode(key)!r} comes after {os.fsdecode(b'/'.join(previous))!r}: a shard "
                                "set needs a tar's members in pack order (depth-first, names bytewise: GNU tar "
                                "--sort=name), or an uncompressed tar file, a zip or a directory")
            previous = order
            counts.add(entry)
            if entry.kind == "dir":
                directories[key] = entry
                if key:
                    pending.append(entry)
                else:
                    root[:] = [entry]  # pack order puts it first; every shard's first entry brings it
                continue
            if entry.kind == "file" and cutter.starts_shard(_entry_size(entry)):
                carried.extend(pending)
                carried.append(entry)
                return
            for waiting in pending:
                yield from placed(waiting)
            pending.clear()
            yield from placed(entry)
        for waiting in pending:
            yield from placed(waiting)
        if first and root:
            yield root[0]
        finished = True

    number = 0
    while not finished:
        path = os.path.join(directory, temporary_name(stem, f"{number:05d}{ARCHIVE_SUFFIX}"))
        written.append((path, write_shard(shard_entries(), path, None, progress, codecs)))
        number += 1


def _copy_from_earlier(link: Entry, shards: Sequence[str]) -> Entry:
    """A hard link whose file lies in an earlier shard, as a copy of that file read
    back from it (a stream cannot be read again)."""
    from ..core import Archive

    target = link.target_key
    for path in reversed(shards):
        with Archive(path) as archive:
            try:
                entry = archive.lookup(target, follow=False)
            except FileNotFoundError:
                continue
            info = archive.stat(entry)
            if stat_module.S_ISREG(info.mode):
                data = archive.read(entry)
                return Entry(link.path, data, mode=info.mode & 0o7777, uid=info.uid, gid=info.gid,
                             mtime_ns=info.mtime_ns, xattrs=dict(archive.xattrs(entry)) or None)
    raise PackError(f"hard link {os.fsdecode(link.key)!r} points to {os.fsdecode(target)!r}, "
                    "which is not an earlier file entry")
