"""Shard sets: several archives served as one tree, with :class:`Archive`'s interface.

A set is given as a manifest (``NAME.ffrset``, :mod:`.manifest`), a list of archives,
or a glob.  Every shard is a complete archive.  The set's tree is the union of the
shards' trees: a directory that several shards hold (the ancestors of where a shard
begins) is one directory whose listing merges theirs in name order; anything else is
held by exactly one shard, and two shards holding the same path as anything but a
directory is refused at open, naming both.

How a path is found without asking every shard.  Each shard owns a *range*: its first
and last leaf in depth-first order of paths (``manifest.leaf_range``).  Everything a
shard holds lies in its range, except the ancestors of its first leaf.  The shards are
sorted by range into *layers* in which ranges do not overlap (a set packed at once is
one layer; shards appended into the middle of the tree add layers).  In a layer a path
is held by at most the shard whose range contains it, plus, when it is a directory, the
shards whose first leaf lies under it, which follow that one: two binary searches over
the layer's ranges (O(log shards)), then one lookup in each shard found (O(log n)).
Opening reads the manifest and no shard (a shard is opened, and checked against the
manifest's size, footer CRC and range, its first and last leaf, when first used); a
list or a glob opens each shard to learn its range, O(depth) reads each.  Neither
reads a table.  At most :func:`open_shard_limit` shards are open at once (a set may
have more shards than the process may open files): past it the least recently used is
dropped, and opened (and checked) again when next used.  A manifest's local shard that
resolves outside the manifest's directory (a symlink) is refused.

Numbering.  Shard ``s``'s entry ``e`` is the set's entry ``base[s] + e`` (``base`` is
the running sum of the shards' entry counts, in the order given), and its inode
``base[s] + inode``; the root is entry 0.  A directory several shards hold is reported
under its number in the first of them (its *canonical* entry); listings and lookups
hand out only canonical numbers.  Data records are numbered the same way, over every
record of the shards in order (what FFRecord's ``FileReader`` over the shard files
numbers).

Opening, bounding and checking the shards is :mod:`.members`'s.
"""

from __future__ import annotations

import bisect
from bisect import bisect_right as _bisect_right
import glob as glob_module
import heapq
import os
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Optional, Sequence, Union

from ..errors import FormatError, NotADirectoryPathError, NotAFileError, PathNotFoundError
from ..format import S_IFDIR, S_IFLNK, S_IFMT, S_IFREG
from ..source import ByteSource, is_url, shown_location
from .archive import CHECKSUM_POLICIES, Archive, EntryStat, columns_by_entry
from .files import PackedFile
from .manifest import MANIFEST_SUFFIX, ShardRecord, depth_first_key, parse_manifest, shard_record
from .members import (GLOB_MAGIC, ShardMembers, beside, is_manifest_file, is_shard_set_spec, open_shard_limit,
                      read_manifest)
from .paths import PathArg, lookup_key, resolve_path
from .verify import VerifyReport

__all__ = ["ShardSet", "open_archive", "is_shard_set_spec", "SetFooter", "open_shard_limit"]

_KIND = {S_IFDIR: "dir", S_IFREG: "file", S_IFLNK: "symlink"}
_CANONICAL_CACHE = 1 << 16  # directories remembered (their canonical number); cleared when full


class SetFooter(NamedTuple):
    """What a set reports where an archive reports its footer (``PackedFolder.footer``)."""

    version_major: int
    version_minor: int
    entry_count: int



def open_archive(spec: Union[PathArg, list[PathArg], tuple[PathArg, ...], ByteSource], checksums: str = "always",
                 storage_options: Optional[Mapping[str, Any]] = None,
                 cache_dir: Union[PathArg, bool, None] = None) -> Union[Archive, "ShardSet"]:
    """Open what ``spec`` names: one archive (a path, a URL, a byte source), or a shard
    set (a manifest, a list of archives, a glob), as :class:`Archive` or
    :class:`ShardSet`, which front ends use alike.  A file that is not an archive but
    a manifest (whatever its name) opens as a set."""
    if isinstance(spec, (list, tuple)):
        return ShardSet.from_list(spec, checksums=checksums, storage_options=storage_options, cache_dir=cache_dir)
    if isinstance(spec, (str, bytes, os.PathLike)):
        name = os.fsdecode(spec)
        if name.endswith(MANIFEST_SUFFIX):
            return ShardSet.from_manifest(name, checksums=checksums, storage_options=storage_options,
                                          cache_dir=cache_dir)
        if not is_url(name) and any(c in name for c in GLOB_MAGIC) and not os.path.exists(name):
            return ShardSet.from_glob(name, checksums=checksums, storage_options=storage_options,
                                      cache_dir=cache_dir)
        try:
            return Archive(name, checksums=checksums, storage_options=storage_options, cache_dir=cache_dir)
        except FormatError:
            if not is_manifest_file(name, storage_options, cache_dir):
                raise
        return ShardSet.from_manifest(name, checksums=checksums, storage_options=storage_options,
                                      cache_dir=cache_dir)
    return Archive(spec, checksums=checksums, storage_options=storage_options, cache_dir=cache_dir)



class ShardSet:
    """Several archives as one tree (the module's documentation says how), with the
    interface front ends use on :class:`Archive`.  Open one with :func:`open_archive`
    or the ``from_*`` constructors.

    Raises (at open) FormatError when two shards hold the same path (naming both and
    the path; for a manifest, when it was written), when a manifest is damaged, or
    when a shard is not what its manifest says (checked when the shard is first used).
    """

    legacy = False

    def __init__(self, locations: Sequence[str], records: Optional[Sequence[ShardRecord]], where: str,
                 checksums: str = "always", storage_options: Optional[Mapping[str, Any]] = None,
                 cache_dir: Union[PathArg, bool, None] = None, check_records: bool = False) -> None:
        if checksums not in CHECKSUM_POLICIES:
            raise ValueError(f"checksums must be one of {CHECKSUM_POLICIES}, got {checksums!r}")
        if not locations:
            raise PathNotFoundError(f"{where}: a shard set needs at least one archive")
        self.checksums = checksums
        self._members = members = ShardMembers(locations, records, where, checksums, storage_options, cache_dir,
                                               check_records)
        # The members' lists, read by every lookup and read: one attribute away.
        self._shards = members.shards
        self._opened = members.opened
        self._shard = members.archive
        self._bases = members.bases
        self._entry_count = self._bases[-1]
        self._layers = members.layers
        self._prepare_lookups()
        self._canonical: dict[tuple[int, int], int] = {}
        self._merged_nlink: dict[int, int] = {}

    @property
    def path(self) -> str:
        """What the set is called in messages: its manifest, its archives, its glob."""
        return self._members.path

    @path.setter
    def path(self, where: str) -> None:
        """Name the set ``where`` (a glob's set is named by its pattern)."""
        self._members.path = where

    # -- opening -------------------------------------------------------------------------

    @classmethod
    def from_manifest(cls, manifest: PathArg, **options: Any) -> ShardSet:
        """The set a manifest file (or URL) lists; no shard is opened yet."""
        name = os.fsdecode(manifest)
        records = parse_manifest(read_manifest(name, options.get("storage_options")), repr(shown_location(name)))
        return cls([beside(name, record.file) for record in records], records, shown_location(name), **options)

    @classmethod
    def from_list(cls, archives: Sequence[PathArg], **options: Any) -> ShardSet:
        """The set of ``archives``, numbered in the order given; each is opened."""
        names = [os.fsdecode(archive) for archive in archives]
        shown = [shown_location(name) for name in names]
        if len(set(names)) != len(names):
            raise FormatError(f"a shard set lists one archive twice: {shown!r}")
        return cls(names, None, " + ".join(shown) if len(shown) <= 3 else f"{shown[0]} + {len(shown) - 1} more",
                   **options)

    @classmethod
    def from_glob(cls, pattern: str, **options: Any) -> ShardSet:
        """The set of the archives ``pattern`` matches, in name order."""
        names = sorted(glob_module.glob(pattern))
        if not names:
            raise PathNotFoundError(f"{pattern!r}: no archive matches")
        names = [name for name in names if not name.endswith(MANIFEST_SUFFIX)]
        set_ = cls.from_list(names, **options)
        set_.path = pattern
        return set_

    def _prepare_lookups(self) -> None:
        # A set of one layer whose shard numbers rise with the ranges (any set packed or
        # appended in order) is searched without generators: two bisects and a find.
        layer = self._layers[0] if len(self._layers) == 1 and self._layers[0].ascending else None
        self._fast = layer
        self._fast_lasts = [shard.last_key for shard in layer.shards] if layer else []
        self._fast_index = [shard.index for shard in layer.shards] if layer else []
        # The directories that may be shared, in a set of one layer: the ones above some
        # shard's first leaf (O(shards x depth)), sorted in depth-first order.
        candidates = set()
        for shard in self._shards:
            parts = shard.first.split(b"/")[:-1]
            for depth in range(1, len(parts) + 1):
                candidates.add(b"/".join(parts[:depth]))
        self._candidates = sorted(candidates, key=depth_first_key)
        self._candidate_keys = [depth_first_key(path) for path in self._candidates]
        self._shared_sets: dict[int, frozenset[int]] = {}

    # -- what the set is -----------------------------------------------------------------

    @property
    def shard_count(self) -> int:
        """How many archives the set has."""
        return len(self._shards)

    @property
    def shard_locations(self) -> list[str]:
        """The shards' paths or URLs, in numbering order, as they open (a URL's user and
        password included: show :func:`~packfs.source.shown_location` of one)."""
        return [shard.location for shard in self._shards]

    def shard_of(self, entry: int) -> tuple[Archive, int]:
        """(shard archive, its own entry number) for the set's ``entry``."""
        index, local = self._split(entry)
        return self._shard(index), local

    def keep_every_shard_open(self) -> None:
        """Lift the bound on shards open at once (:func:`open_shard_limit`): for a reader
        that holds every shard's descriptor itself (the compiled daemon's Forest, whose
        trees read each shard's descriptor and map by number), which must not see the
        set drop a shard (and its descriptor) under it."""
        self._members.keep_every_shard_open()

    @property
    def open_shards(self) -> int:
        """How many shards the set holds open now (at most :func:`open_shard_limit`,
        unless :meth:`keep_every_shard_open` was called)."""
        return len(self._members.recent)

    def shard(self, index: int) -> Archive:
        """Shard ``index``'s archive (opened, and checked against the manifest, on first use)."""
        return self._shard(index)

    @property
    def bases(self) -> tuple[int, ...]:
        """Each shard's first entry number in the set, and the set's entry count last."""
        return tuple(self._bases)

    @property
    def layer_count(self) -> int:
        """How many layers of shards with disjoint ranges the set sorted into (1 for a
        set packed at once; more where shards were appended into the middle of the tree)."""
        return len(self._layers)

    def shared_directories(self, nlink: bool = True) -> list[tuple[int, int, list[tuple[int, int]]]]:
        """Every directory more than one shard holds, as (canonical entry, nlink, parts):
        parts are (shard, entry in it), in range order, which for a set of one layer is
        the order their children follow each other in the merged listing (a name shared
        by two neighbouring parts is a directory both hold).  O(shards x depth):
        the root and the directories above each shard's first leaf, for a one-layer set;
        ValueError for a set of several layers, whose shared directories can lie
        anywhere in the overlapping ranges.  The merged nlink counts the merged listing's
        subdirectories, which costs a listing of each; with ``nlink=False`` it is given
        as 0 instead (the compiled daemon counts it from the parts)."""
        if len(self._layers) > 1:
            raise ValueError(f"{self.path!r}: shards with overlapping ranges ({len(self._layers)} layers)")
        order = {shard.index: position for position, shard in enumerate(self._layers[0].shards)} if self._layers else {}
        paths = {b""}
        for shard in self._shards:
            parts = shard.first.split(b"/")[:-1]
            for depth in range(1, len(parts) + 1):
                paths.add(b"/".join(parts[:depth]))
        shared = []
        for path in sorted(paths, key=depth_first_key):
            found = self._found(path)
            if len(found) < 2:
                continue
            found.sort(key=lambda item: order.get(item[0], -1))
            canonical = self.find(path)
            shared.append((canonical, self.stat(canonical).nlink if nlink else 0, found))
        return shared

    @property
    def entry_count(self) -> int:
        """Entries of all shards (a directory several hold is counted in each)."""
        return self._entry_count

    @property
    def data_records(self) -> int:
        """Data records of all shards (opens every shard)."""
        return sum(self._shard(s.index).data_records for s in self._shards)

    @property
    def record_count(self) -> int:
        """Records of all shards (opens every shard)."""
        return sum(self._shard(s.index).record_count for s in self._shards)

    @property
    def size(self) -> int:
        """The shards' bytes together."""
        return sum(s.record.size if s.record else self._shard(s.index).size for s in self._shards)

    @property
    def identity(self) -> object:
        """Equal for two opens of the same shards' bytes."""
        return tuple(self._shard(s.index).identity for s in self._shards)

    @property
    def footer(self) -> SetFooter:
        """The set's counts, shaped as an archive's footer."""
        first = self._shard(0).footer
        return SetFooter(first.version_major, first.version_minor, self._entry_count)

    @property
    def version(self) -> str:
        """The shards' format versions, and how many shards."""
        versions = sorted({self._shard(s.index).version for s in self._shards})
        return f"shard set of {len(self._shards)} archives (format {', '.join(versions)})"

    @property
    def section_spans(self) -> None:
        """None: a set is not one file read in place."""
        return None

    @property
    def has_codecs(self) -> bool:
        """Whether any shard uses format 1.5's codecs (:attr:`Archive.has_codecs`)."""
        return any(self._shard(s.index).has_codecs for s in self._shards)

    def codec_summary(self, top: int = 5) -> dict[str, object]:
        """Every shard's :meth:`Archive.codec_summary`, added up."""
        total: dict[str, Any] = {"compression": "uncompressed", "stored_bytes": 0, "original_bytes": 0,
                                 "files_by_codec": {}, "dedup_saved_bytes": 0, "dictionaries": 0,
                                 "dictionary_bytes": 0}
        kinds: dict[str, list[int]] = {}
        for shard in self._shards:
            part = self._shard(shard.index).codec_summary(top=1 << 30)
            if part["compression"] != "uncompressed":
                total["compression"] = part["compression"]
            for key in ("stored_bytes", "original_bytes", "dedup_saved_bytes", "dictionaries", "dictionary_bytes"):
                total[key] += part[key]
            for codec, files in part["files_by_codec"].items():  # type: ignore[attr-defined]
                total["files_by_codec"][codec] = total["files_by_codec"].get(codec, 0) + files
            for kind in part["kinds"]:  # type: ignore[attr-defined]
                sums = kinds.setdefault(kind["kind"], [0, 0, 0])
                for k, key in enumerate(("files", "original_bytes", "stored_bytes")):
                    sums[k] += kind[key]
        stored = total["stored_bytes"]
        total["ratio"] = round(total["original_bytes"] / stored, 2) if stored else 1.0
        total["kinds"] = [{"kind": kind, "files": files, "original_bytes": original, "stored_bytes": stored_part}
                          for kind, (files, original, stored_part) in
                          sorted(kinds.items(), key=lambda item: -item[1][1])[:top]]
        return total

    @property
    def xattr_entries(self) -> int:
        """Entries with extended attributes, in all shards."""
        return sum(self._shard(s.index).xattr_entries for s in self._shards)

    @property
    def xattr_bytes(self) -> int:
        """Bytes of extended attributes, in all shards."""
        return sum(self._shard(s.index).xattr_bytes for s in self._shards)

    def stats(self) -> dict[str, int]:
        """The shards' counters added up (:meth:`Archive.stats`)."""
        total: dict[str, int] = {}
        for shard in self._shards:
            if shard.archive is not None:
                for name, value in shard.archive.stats().items():
                    total[name] = total.get(name, 0) + value
        return total

    def directories_counted_twice(self) -> int:
        """How many directory entries repeat one another shard holds (each shared
        directory counts once per shard beyond its first): what a summary over the
        shards' columns subtracts.  O(shards x depth) for a set of one layer; a walk of
        the directories for a set of several."""
        if len(self._layers) <= 1:
            return sum(len(parts) - 1 for _, _, parts in self.shared_directories())
        seen = 0
        pending = [0]
        while pending:
            directory = pending.pop()
            seen += 1
            entries, _, modes = self.listing(directory)
            pending.extend(entry for entry, mode in zip(entries, modes) if mode & S_IFMT == S_IFDIR)
        total = sum(int(((self._shard(s.index).column("mode") & S_IFMT) == S_IFDIR).sum()) for s in self._shards)
        return total - seen

    def held_already(self, paths: Iterable[tuple[bytes, bool]]) -> list[bytes]:
        """The paths of a tree to be added to the set that the set holds already, as
        anything but a directory in both (the set's one rule): ``paths`` are (stored
        path, is a directory), the root left out.  Each is found as :meth:`find` finds
        it, in the shards whose ranges may hold it: no shard is read whole."""
        held = []
        for path, is_directory in paths:
            if not path:
                continue
            entry = self.find(path)
            if entry >= 0 and not (is_directory and self.file_type(entry) == S_IFDIR):
                held.append(path)
        return held

    def manifest_records(self) -> list[ShardRecord]:
        """What a manifest of this set lists (opens every shard)."""
        records = []
        for shard in self._shards:
            file = shard.record.file if shard.record else os.path.basename(shard.location)
            records.append(shard_record(self._shard(shard.index), file))
        return records

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Close every shard opened."""
        self._members.close()

    @property
    def closed(self) -> bool:
        """Whether close() was called."""
        return self._members.closed

    def __enter__(self) -> ShardSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ShardSet({self.path!r}, {len(self._shards)} shards)"

    def check_unchanged(self) -> None:
        """ArchiveChangedError if a shard opened so far changed in place."""
        for shard in self._shards:
            if shard.archive is not None:
                shard.archive.check_unchanged()

    def release_pages(self) -> None:
        """Every opened shard's :meth:`Archive.release_pages`."""
        for shard in self._shards:
            if shard.archive is not None:
                shard.archive.release_pages()

    # -- numbering -----------------------------------------------------------------------

    def _split(self, entry: int) -> tuple[int, int]:
        if not 0 <= entry < self._entry_count:
            raise NotAFileError(f"{self.path!r}: no entry {entry} (the set has {self._entry_count})")
        index = bisect.bisect_right(self._bases, entry) - 1
        return index, entry - self._bases[index]

    def _found(self, key: bytes) -> list[tuple[int, int]]:
        """(shard, entry) of ``key`` in every shard that holds it, lowest shard first
        (several only for a directory)."""
        if not key:
            return [(s.index, 0) for s in self._shards]
        path_key = depth_first_key(key)
        found = []
        for layer in self._layers:
            for shard in layer.holders(path_key):
                local = self._shard(shard.index).find(key)
                if local >= 0:
                    found.append((shard.index, local))
        found.sort()
        return found

    def _first_found(self, key: bytes) -> tuple[int, int]:
        """(shard, entry) of ``key`` in the lowest shard that holds it, or (-1, -1):
        in a layer whose shard numbers rise with its ranges the first hit is its lowest."""
        if not key:
            if self._members.closed:  # the root is found without asking a shard, which would say so
                raise self._members.closed_error()
            return 0, 0
        path_key = tuple(key.split(b"/"))
        fast = self._fast
        if fast is not None:
            firsts = fast.firsts
            at = bisect.bisect_right(firsts, path_key) - 1
            if at >= 0 and path_key <= self._fast_lasts[at]:
                index = self._fast_index[at]
                shard = self._shards[index]
                local = (shard.archive or self._shard(index)).find(key)
                if local >= 0:
                    return index, local
            at += 1
            depth = len(path_key)
            if at < len(firsts) and len(firsts[at]) > depth and firsts[at][:depth] == path_key:
                index = self._fast_index[at]
                local = self._shard(index).find(key)
                if local >= 0:
                    return index, local
            return -1, -1
        best = (-1, -1)
        for layer in self._layers:
            for shard in layer.holders(path_key):
                if best[0] >= 0 and shard.index > best[0] and layer.ascending:
                    break
                local = self._shard(shard.index).find(key)
                if local >= 0:
                    if best[0] < 0 or shard.index < best[0]:
                        best = (shard.index, local)
                    if layer.ascending:
                        break
        return best

    def _global(self, index: int, local: int) -> int:
        """The set's number for shard ``index``'s entry ``local``: its own, or, for a
        directory other shards hold too, the canonical one."""
        entry = self._bases[index] + local
        archive = self._shard(index)
        if archive.file_type(local) != S_IFDIR:
            return entry
        return self._canonical_directory(index, local)

    def _canonical_directory(self, index: int, local: int) -> int:
        if local == 0:
            return 0
        cached = self._canonical.get((index, local))
        if cached is not None:
            return cached
        shard, found = self._first_found(self._shard(index).path_of(local))
        canonical = self._bases[shard] + found if shard >= 0 else self._bases[index] + local
        if len(self._canonical) >= _CANONICAL_CACHE:
            self._canonical.clear()
        self._canonical[(index, local)] = canonical
        return canonical

    # -- looking up ----------------------------------------------------------------------

    def find(self, key: bytes) -> int:
        """The entry at stored path ``key`` (symlinks not followed), or -1."""
        shard, local = self._first_found(key)
        return -1 if shard < 0 else self._bases[shard] + local

    def lookup(self, path: PathArg, follow: bool = True) -> int:
        """The entry ``path`` names, symlinks followed as a shell does (:meth:`Archive.lookup`)."""
        key = lookup_key(path)
        index, local = self._first_found(key)
        if index >= 0 and (not follow or self._shard(index).file_type(local) != S_IFLNK):
            return self._bases[index] + local
        shown = os.fsdecode(path)
        return resolve_path(key, follow, shown, self.path, self.file_type, self.lookup_child, self.path_of,
                            self.readlink)

    def lookup_kind(self, path: PathArg, kind: int) -> int:
        """:meth:`lookup`, and NotAFileError or NotADirectoryPathError unless the entry is
        of type ``kind``."""
        entry = self.lookup(path)
        actual = self.file_type(entry)
        if actual != kind:
            if kind == S_IFDIR:
                raise NotADirectoryPathError(f"{os.fsdecode(path)!r} is not a directory but a {_KIND[actual]}")
            raise NotAFileError(f"{os.fsdecode(path)!r} is not a file but a {_KIND[actual]}")
        return entry

    def lookup_child(self, directory: int, name: bytes) -> int:
        """Entry of ``name`` in ``directory``, or -1: one shard's binary search, or, in a
        directory several shards hold, the lookup of its path (never every shard)."""
        index, local = self._split(directory)
        if self._shared(index, local):
            path = self.path_of(directory)
            return self.find(path + b"/" + name if path else name)
        child = self._shard(index).lookup_child(local, name)
        return -1 if child < 0 else self._bases[index] + child

    def _shared(self, index: int, local: int) -> bool:
        """Whether directory ``local`` of shard ``index`` is held by other shards too: in
        a set of one layer, the root and some of the directories above a shard's first
        leaf (each shard's found once, when first asked); in a set of several, any."""
        if local == 0:
            return len(self._shards) > 1
        if len(self._layers) > 1:
            return self._shard(index).file_type(local) == S_IFDIR
        shared = self._shared_sets.get(index)
        if shared is None:
            shared = self._shared_sets[index] = self._shared_in(index)
        return local in shared

    def _shared_in(self, index: int) -> frozenset[int]:
        shard = self._shards[index]
        archive = self._shard(index)
        low = bisect.bisect_left(self._candidate_keys, shard.first_key)
        high = bisect.bisect_right(self._candidate_keys, shard.last_key)
        parts = shard.first.split(b"/")[:-1]
        paths = [b"/".join(parts[:depth]) for depth in range(1, len(parts) + 1)] + self._candidates[low:high]
        shared = set()
        for path in paths:
            holders = 0
            for _ in self._layers[0].holders(depth_first_key(path)) if self._layers else ():
                holders += 1
            if holders > 1:
                entry = archive.find(path)
                if entry > 0:
                    shared.add(entry)
        return frozenset(shared)

    # -- attributes ----------------------------------------------------------------------

    def file_type(self, entry: int) -> int:
        """Entry ``entry``'s file type bits."""
        index, local = self._split(entry)
        return self._shard(index).file_type(local)

    def stat(self, entry: int) -> EntryStat:
        """Entry ``entry``'s attributes, with its inode in the set's numbering; a directory
        several shards hold counts its merged subdirectories in ``nlink``."""
        index, local = self._split(entry)
        archive = self._shard(index)
        stat = archive.stat(local)
        if stat.mode & S_IFMT == S_IFDIR:
            canonical = self._canonical_directory(index, local)
            nlink = stat.nlink
            if self._shared(index, local):
                nlink = self._merged_nlink.get(canonical, 0)
                if not nlink:
                    _, _, modes = self.listing(canonical)
                    nlink = 2 + sum(1 for mode in modes if mode & S_IFMT == S_IFDIR)
                    self._merged_nlink[canonical] = nlink
            return EntryStat(stat.mode, stat.uid, stat.gid, stat.mtime_ns, stat.size, nlink, canonical + 1)
        return EntryStat(stat.mode, stat.uid, stat.gid, stat.mtime_ns, stat.size, stat.nlink,
                         self._bases[index] + stat.inode)

    def inode(self, entry: int) -> int:
        """The inode number: the shard's, offset by the shard's base; a directory's is its
        canonical entry + 1."""
        index, local = self._split(entry)
        archive = self._shard(index)
        if archive.file_type(local) == S_IFDIR:
            return self._canonical_directory(index, local) + 1
        return self._bases[index] + archive.inode(local)

    def xattrs(self, entry: int) -> list[tuple[bytes, bytes]]:
        """Entry ``entry``'s extended attributes."""
        index, local = self._split(entry)
        return self._shard(index).xattrs(local)

    def name(self, entry: int) -> bytes:
        """Entry ``entry``'s name."""
        index, local = self._split(entry)
        return self._shard(index).name(local)

    def path_of(self, entry: int) -> bytes:
        """Entry ``entry``'s full path."""
        index, local = self._split(entry)
        return self._shard(index).path_of(local)

    def parent(self, entry: int) -> int:
        """Entry ``entry``'s parent directory, canonical."""
        index, local = self._split(entry)
        return self._canonical_directory(index, self._shard(index).parent(local))

    def children(self, directory: int) -> Sequence[int]:
        """A directory's children, in name order: a range of one shard's entries, or for a
        directory several shards hold, the merged list."""
        return self.listing(directory)[0]

    def listing(self, directory: int) -> tuple[Sequence[int], list[bytes], list[int]]:
        """A directory's children, their names and their modes, in name order."""
        entries, names, modes, _ = self._listing(directory, False)
        return entries, names, modes

    def listing_with_inodes(self, directory: int) -> tuple[Sequence[int], list[bytes], list[int], list[int]]:
        """:meth:`listing` and the children's inode numbers."""
        return self._listing(directory, True)

    def _listing(self, directory: int, inodes: bool) -> tuple[Sequence[int], list[bytes], list[int], list[int]]:
        index, local = self._split(directory)
        if not self._shared(index, local):
            base = self._bases[index]
            archive = self._shard(index)
            if inodes:
                part, names, modes, numbers = archive.listing_with_inodes(local)
                return range(part.start + base, part.stop + base), names, modes, [n + base for n in numbers]
            part, names, modes = archive.listing(local)
            return range(part.start + base, part.stop + base), names, modes, []
        holders = self._found(self.path_of(directory))
        if self._fast is not None:
            return self._concatenated(holders, inodes)
        streams = []
        for order, (shard, found) in enumerate(holders):
            archive = self._shard(shard)
            if archive.file_type(found) != S_IFDIR:
                continue
            part, names, modes, numbers = archive.listing_with_inodes(found)
            base = self._bases[shard]
            streams.append([(name, order, base + child, mode, base + number)
                            for child, name, mode, number in zip(part, names, modes, numbers)])
        entries: list[int] = []
        names_out: list[bytes] = []
        modes_out: list[int] = []
        inodes_out: list[int] = []
        for name, _, entry, mode, number in heapq.merge(*streams):
            if names_out and names_out[-1] == name:
                if mode & S_IFMT == S_IFDIR and modes_out[-1] & S_IFMT == S_IFDIR:
                    continue  # the same directory in a later shard: the first is canonical
                raise FormatError(f"{self.path!r}: {os.fsdecode(self.path_of(entry))!r} is in two shards")
            entries.append(entry)
            names_out.append(name)
            modes_out.append(mode)
            inodes_out.append(entry + 1 if mode & S_IFMT == S_IFDIR else number)
        return entries, names_out, modes_out, inodes_out

    def _concatenated(self, holders: list[tuple[int, int]], inodes: bool
                      ) -> tuple[list[int], list[bytes], list[int], list[int]]:
        """A shared directory's listing in a set of one ascending layer: its parts'
        children follow each other in shard order, and a name equal to the last one
        already listed is a directory both hold (the first is canonical)."""
        entries: list[int] = []
        names_out: list[bytes] = []
        modes_out: list[int] = []
        inodes_out: list[int] = []
        for shard, found in holders:
            archive = self._shard(shard)
            if archive.file_type(found) != S_IFDIR:
                continue
            base = self._bases[shard]
            numbers: Sequence[int]
            if inodes:
                part, names, modes, numbers = archive.listing_with_inodes(found)
            else:
                part, names, modes = archive.listing(found)
                numbers = part
            skip = 1 if names and names_out and names[0] == names_out[-1] else 0
            if skip and not (modes[0] & S_IFMT == S_IFDIR and modes_out[-1] & S_IFMT == S_IFDIR):
                raise FormatError(f"{self.path!r}: {os.fsdecode(archive.path_of(part[0]))!r} is in two shards")
            entries.extend(range(part.start + base + skip, part.stop + base))
            names_out.extend(names[skip:])
            modes_out.extend(modes[skip:])
            if inodes:
                inodes_out.extend(number + base for number in numbers[skip:])
        return entries, names_out, modes_out, inodes_out

    def listing_columns(self, part: Sequence[int]) -> tuple[list[bytes], list[int], list[int], list[int], list[int],
                                                              list[int], list[int]]:
        """(names, modes, uids, gids, mtimes_ns, sizes, nlinks) of the entries in ``part``
        (a slice of :meth:`children`)."""
        if isinstance(part, range) and len(part):
            index, local = self._split(part.start)
            if self._split(part.stop - 1)[0] == index:
                base = self._bases[index]
                return self._shard(index).listing_columns(range(part.start - base, part.stop - base))
        return columns_by_entry(self, part)

    def column(self, name: str) -> Any:
        """Table section ``name`` of every shard, concatenated (``record`` numbered over
        the shards' records in order)."""
        import numpy as np

        parts = []
        records = 0
        for shard in self._shards:
            archive = self._shard(shard.index)
            column = archive.column(name)
            if name == "record":
                column = np.where(column == np.uint64(2 ** 64 - 1), column, column + np.uint64(records))
                records += archive.record_count
            # A copy, not a view: a view keeps its shard's map, and the map a descriptor
            # of its own (mmap dups it), open past the bound on open shards.
            parts.append(np.array(column, copy=True))
        return np.concatenate(parts)

    def extent(self, entry: int) -> tuple[int, int]:
        """Where file ``entry``'s contents lie in its shard's file."""
        index, local = self._split(entry)
        return self._shard(index).extent(local)

    def extents_of(self, entries: Sequence[int]) -> Any:
        """:meth:`extent` of each of ``entries`` (an (n, 2) int64 array), each shard's
        checked at once (:meth:`Archive.extents_of`); the spans are in each one's shard."""
        import numpy as np

        wanted = np.asarray(entries, dtype=np.int64).reshape(-1)
        spans = np.empty((len(wanted), 2), dtype=np.int64)
        outside = (wanted < 0) | (wanted >= self._entry_count)
        if outside.any():
            self._split(int(wanted[outside][0]))  # raises
        shards = np.searchsorted(np.asarray(self._bases, dtype=np.int64), wanted, side="right") - 1
        for index in np.unique(shards).tolist():
            mine = shards == index
            spans[mine] = self._shard(index).extents_of(wanted[mine] - self._bases[index])
        return spans

    def prefetch(self, entries: Sequence[int]) -> int:
        """Each shard's files of ``entries`` fetched into the node's disk cache
        (:meth:`Archive.prefetch`), the shards one after another; the bytes fetched."""
        return sum(self._shard(index).prefetch([local for _, local in group])
                   for index, group in self._by_shard([int(entry) for entry in entries]).items())

    # -- reading -------------------------------------------------------------------------

    def _file(self, path: PathArg) -> tuple[int, int]:
        """(shard, entry) of the regular file at ``path``, symlinks followed."""
        key = lookup_key(path)
        shard, local = self._first_found(key)
        if shard >= 0 and self._shard(shard).file_type(local) == S_IFREG:
            return shard, local
        return self._split(self.lookup_kind(path, S_IFREG))

    def read_path(self, path: PathArg) -> bytes:
        """The contents of the file at ``path`` (symlinks followed)."""
        fast = self._fast
        if fast is not None:
            # The shard whose range holds the path reads it with its own hot path; what it
            # cannot find there (a symlink into another shard) takes the general one.
            key = lookup_key(path)
            at = bisect.bisect_right(fast.firsts, tuple(key.split(b"/"))) - 1
            if at >= 0:
                index = self._fast_index[at]
                archive = self._shards[index].archive or self._shard(index)
                try:
                    return archive.read_path(key)
                except (PathNotFoundError, NotADirectoryPathError, NotAFileError):
                    pass
        index, local = self._file(path)
        return self._shard(index).read(local)

    def read_view(self, path: PathArg) -> memoryview:
        """A view of the file at ``path`` (:meth:`Archive.read_view`)."""
        index, local = self._file(path)
        archive = self._shard(index)
        return archive.read_view(archive.path_of(local))

    def read(self, entry: int, offset: int = 0, size: int = -1) -> bytes:
        """Up to ``size`` bytes of file ``entry`` from ``offset`` (:meth:`Archive.read`)."""
        bases = self._bases
        if 0 <= entry < self._entry_count:
            index = _bisect_right(bases, entry) - 1
            archive = self._opened[index] or self._shard(index)
            return archive.read(entry - bases[index], offset, size)
        index, local = self._split(entry)  # raises, naming the entry
        return self._shard(index).read(local, offset, size)

    def open(self, entry: int, name: str = "") -> PackedFile:
        """A file object for file ``entry``."""
        index, local = self._split(entry)
        return self._shard(index).open(local, name)

    def check(self, entry: int) -> None:
        """Check file ``entry``'s CRC."""
        index, local = self._split(entry)
        self._shard(index).check(local)

    def readlink(self, entry: int, check: Optional[bool] = None) -> bytes:
        """Symlink ``entry``'s target."""
        index, local = self._split(entry)
        return self._shard(index).readlink(local, check)

    def read_chunks(self, entry: int, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """File ``entry`` in chunks, its CRC compared at the end."""
        index, local = self._split(entry)
        return self._shard(index).read_chunks(local, chunk_size)

    def read_extents(self, entry: int, chunk_size: int = 1 << 20) -> Iterator[tuple[int, bytes]]:
        """:meth:`Archive.read_extents` of file ``entry``: (offset, bytes), holes left out."""
        index, local = self._split(entry)
        return self._shard(index).read_extents(local, chunk_size)

    def codec(self, entry: int) -> int:
        """:meth:`Archive.codec` of file ``entry`` in its shard."""
        index, local = self._split(entry)
        return self._shard(index).codec(local)

    def unpack_bytes(self) -> int:
        """Every shard's :meth:`Archive.unpack_bytes`: what an unpack of the set writes."""
        return sum(self._shard(s.index).unpack_bytes() for s in self._shards)

    def _by_shard(self, items: Sequence[Union[int, PathArg]]) -> dict[int, list[tuple[int, int]]]:
        groups: dict[int, list[tuple[int, int]]] = {}
        for position, item in enumerate(items):
            if isinstance(item, (str, bytes, os.PathLike)):
                index, local = self._file(item)
            else:
                index, local = self._split(int(item))
            groups.setdefault(index, []).append((position, local))
        return groups

    def read_many(self, items: Sequence[Union[int, PathArg]]) -> list[bytes]:
        """Files by entry or path in the order asked, each shard's batch read together
        (:meth:`Archive.read_many`)."""
        if isinstance(items, (str, bytes, os.PathLike)):
            raise TypeError(f"read_many takes a list of paths or entries, not one path ({items!r})")
        results: list[bytes] = [b""] * len(items)
        for index, group in self._by_shard(items).items():
            data = self._shard(index).read_many([local for _, local in group])
            for (position, _), contents in zip(group, data):
                results[position] = contents
        return results

    def read_batch(self, entries: Sequence[int]) -> Iterator[tuple[int, bytes]]:
        """(position, contents) for each entry, each shard's batch in its archive order."""
        for index, group in self._by_shard(list(entries)).items():
            positions = [position for position, _ in group]
            for at, data in self._shard(index).read_batch([local for _, local in group]):
                yield positions[at], data

    # -- checking ------------------------------------------------------------------------

    def verify(self, progress: Optional[Callable[[int], None]] = None) -> VerifyReport:
        """Every shard's :meth:`Archive.verify`, together (problems and paths prefixed with
        the shard), and the set's own rule, checked again: no path in two shards."""
        records = bytes_checked = files = symlinks = 0
        bad_paths: list[str] = []
        bad_records: list[int] = []
        problems: list[str] = []
        record_base = 0
        for shard in self._shards:
            try:
                archive = self._shard(shard.index)
            except FormatError as error:
                # Not the shard its manifest lists (replaced, a range that lies, a link
                # outside the set): reported, and the other shards checked.
                problems.append(str(error))
                continue
            report = archive.verify(progress)
            records += report.records_checked
            bytes_checked += report.bytes_checked
            files += report.files_checked
            symlinks += report.symlinks_checked
            bad_paths += list(report.bad_paths)
            bad_records += [record_base + r for r in report.bad_records]
            problems += [f"{shard.name}: {problem}" for problem in report.problems]
            record_base += archive.record_count
        try:
            for a_position, a in enumerate(self._shards):
                for b in self._shards[a_position + 1:]:
                    if not (a.empty or b.empty) and a.first_key <= b.last_key and b.first_key <= a.last_key:
                        self._members.check_pair(a, b)
            self._members.check_shared_directories()
        except FormatError as error:
            problems.append(str(error))
        return VerifyReport(records, bytes_checked, tuple(bad_paths), tuple(bad_records), tuple(problems),
                            files, symlinks)

    def check_records(self) -> int:
        """Every shard's :meth:`Archive.check_records`; the bytes an unpack writes."""
        return sum(self._shard(s.index).check_records() for s in self._shards)
