"""Writing shard sets' manifests: a set made of archives that exist, and a shard
appended to a set (docs/format.md, "Shard sets"; the manifest's bytes are
:mod:`packfs.core.manifest`'s).

A manifest is replaced whole: written to a temporary file beside it, synced, and
renamed over it, so a reader sees the old set or the new one, never a mix; readers and
mounts that opened the old one keep serving it (shards never change once written).
Appends to one set are serialised by a lock on the manifest file, taken again if the
manifest was replaced while waiting for it.
"""

from __future__ import annotations

import fcntl
import os
import secrets
from typing import Callable, Iterable, Sequence, TypeVar

from ..core import Archive, ShardSet
from ..core.manifest import MANIFEST_SUFFIX, ShardRecord, manifest_bytes, parse_manifest, shard_record
from ..errors import PackError, PathNotFoundError
from ..format import S_IFDIR
from . import temporaries
from .archives import archive_entries
from .container import TEMP_MARKER
from .exclude import ExcludePatterns
from .scan import scan_tree
from .skips import SkipList, SkippedPath
from .temporaries import abandoned

__all__ = ["write_manifest", "make_set", "append_shard", "set_stem", "appended_shard_name", "temporary_name",
           "remove_abandoned_temporaries", "tree_paths"]

T = TypeVar("T")
SHOWN_COLLISIONS = 5  # paths an append refused for collisions names; the rest are counted


def set_stem(manifest: str) -> str:
    """``/data/train`` for ``/data/train.ffrset`` (and for ``/data/train.ffr``): what a
    set's shard names start with."""
    for suffix in (MANIFEST_SUFFIX, ".ffr"):
        if manifest.endswith(suffix):
            return manifest[: -len(suffix)]
    return manifest


def temporary_name(stem: str, label: str) -> str:
    """A temporary file of the set: the writer's pid in it, after TEMP_MARKER, as
    ContainerWriter names its own, so that a killed writer's leftover is known."""
    return f".{stem}{TEMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}-{label}"


def remove_abandoned_temporaries(directory: str, stem: str, *, everyone_gone: str | None = None) -> None:
    """Remove the temporary files of set ``stem`` in ``directory`` whose writer is gone
    (its pid in the name): this module's own, and the ContainerWriter files behind
    them.  ``everyone_gone``: also remove, whoever wrote them, those whose name holds
    this text (a run that knows all its writers are done, whichever host they ran on)."""
    prefixes = (f".{stem}{TEMP_MARKER}", f"..{stem}{TEMP_MARKER}")
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        prefix = next((p for p in prefixes if name.startswith(p)), None)
        if prefix is None:
            continue
        path = os.path.join(directory, name)
        pid_text = name[len(prefix):].partition("-")[0]
        gone = everyone_gone is not None and everyone_gone in name
        if not gone and pid_text.isdigit():
            pid = int(pid_text)
            # Registered as str (here) or Path (ContainerWriter): gone only if neither.
            from pathlib import Path

            gone = abandoned(pid, path) and abandoned(pid, Path(path))
        if gone:
            try:
                os.unlink(path)
            except OSError:
                pass


def write_manifest(manifest: str, records: Sequence[ShardRecord]) -> None:
    """Write (or replace) ``manifest`` listing ``records``, atomically."""
    data = manifest_bytes(records)
    directory = os.path.dirname(os.path.abspath(manifest))
    stem = os.path.basename(set_stem(manifest))
    remove_abandoned_temporaries(directory, stem)  # a killed writer's, known by its pid
    temporary = os.path.join(directory, temporary_name(stem, os.path.basename(manifest)))
    temporaries.register(temporary)
    try:
        with open(temporary, "xb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, manifest)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
        temporaries.unregister(temporary)
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)  # the rename itself survives a crash
    finally:
        os.close(descriptor)


def _relative(manifest: str, archive: str) -> str:
    base = os.path.dirname(os.path.abspath(manifest))
    relative = os.path.relpath(os.path.abspath(archive), base)
    if relative.startswith(".." + os.sep) or relative == "..":
        raise PackError(f"{archive!r} is not in {base!r} or below it: a manifest names its shards relative to "
                        "its own directory")
    return relative


def make_set(manifest: str, archives: Sequence[str], force: bool = False) -> list[ShardRecord]:
    """Write ``manifest`` for ``archives`` (in or below its directory), which must make
    a set: no path held by two of them (checked, as every open checks it)."""
    if os.path.exists(manifest) and not force:
        raise PackError(f"{manifest!r} exists (--force replaces it)")
    records = []
    for archive in archives:
        with Archive(archive) as opened:
            records.append(shard_record(opened, _relative(manifest, archive)))
    with ShardSet([os.path.join(os.path.dirname(os.path.abspath(manifest)), r.file) for r in records], records,
                  manifest, check_records=True):
        pass  # opening checks that no path is in two shards
    write_manifest(manifest, records)
    return records


def appended_shard_name(manifest: str, records: Sequence[ShardRecord]) -> str:
    """The file an appended shard gets: ``STEM-NNNNN.ffr``, NNNNN its position in the
    set, beside the manifest."""
    stem = os.path.basename(set_stem(manifest))
    directory = os.path.dirname(os.path.abspath(manifest))
    taken = {record.file for record in records}
    number = len(records)
    # A file of that name that the set does not list (a killed append's shard, or
    # anyone's file) is left alone: the next free number is taken.
    while f"{stem}-{number:05d}.ffr" in taken or os.path.exists(os.path.join(directory, f"{stem}-{number:05d}.ffr")):
        number += 1
    return os.path.join(directory, f"{stem}-{number:05d}.ffr")


class _Unreported(SkipList):
    """The paths a scan leaves out, noted and not logged: the pack that follows the
    scan reports them."""

    def add(self, path: str, reason: str, failed: bool = False) -> None:
        self.paths.append(SkippedPath(path, reason, failed))


def tree_paths(src: str, manifest: str, follow_symlinks: bool = False,
               exclude: Sequence[str] = ()) -> list[tuple[bytes, bool]] | None:
    """(stored path, is a directory) of what packing ``src`` (a directory, a tar or a
    zip file, read as pack reads it) stores, each directory above a path included,
    found without reading any file's contents: what an append checks against the set
    before it packs.  None for a stream (``"-"``, a pipe), which is read only once.
    ``manifest``: the set's, whose writers' temporary files a scan leaves out."""
    if src == "-" or not os.path.exists(src) or not (os.path.isdir(src) or os.path.isfile(src)):
        return None  # a stream; or nothing: pack says what is wrong
    found: list[tuple[bytes, bool]] = []
    if os.path.isdir(src):
        root = os.fsencode(src).rstrip(b"/") or b"/"
        try:
            directory = os.stat(os.path.dirname(os.path.abspath(manifest)))
            temp_files = ((directory.st_dev, directory.st_ino),
                          os.fsencode(f".{os.path.basename(set_stem(manifest))}{TEMP_MARKER}"))
            items = scan_tree(root, follow_symlinks, ExcludePatterns(exclude, root), set(), temp_files,
                              _Unreported(True), xattrs=False)
        except OSError:
            return None  # the pack that follows says what is wrong, in its words
        found = [(item.key, item.kind == "dir") for item in items]
    else:
        with archive_entries(src, _Unreported(True), xattrs=False) as (entries, _):
            found = [(entry.key, entry.kind == "dir") for entry in entries]
    # A tar or zip need not list the directories above its members (a scan lists them
    # all): each path's are added, up to the first one already known.
    known = {path for path, _ in found}
    above = []
    for path, _ in list(found):
        cut = path.rfind(b"/")
        while cut > 0 and path[:cut] not in known:
            known.add(path[:cut])
            above.append((path[:cut], True))
            cut = path.rfind(b"/", 0, cut)
    return found + above


def _archive_paths(archive: Archive) -> Iterable[tuple[bytes, bool]]:
    """(stored path, is a directory) of every entry of ``archive`` but the root."""
    for entry in range(1, archive.entry_count):
        yield archive.path_of(entry), archive.file_type(entry) == S_IFDIR


def _refuse_held(manifest: str, records: Sequence[ShardRecord], paths: Iterable[tuple[bytes, bool]],
                 source: str) -> None:
    """PackError, counting them and naming the first few, if the set ``records`` holds
    any of ``paths`` already (the set's rule: :meth:`ShardSet.held_already`)."""
    base = os.path.dirname(os.path.abspath(manifest))
    with ShardSet([os.path.join(base, r.file) for r in records], records, manifest) as existing:
        held = existing.held_already(paths)
    if not held:
        return
    shown = ", ".join(repr(os.fsdecode(path)) for path in held[:SHOWN_COLLISIONS])
    more = f" and {len(held) - SHOWN_COLLISIONS} more" if len(held) > SHOWN_COLLISIONS else ""
    count = "1 path of it is" if len(held) == 1 else f"{len(held)} paths of it are"
    raise PackError(f"cannot append {source!r} to {manifest!r}: {count} in the set already: {shown}{more} (a set "
                    "holds each path once, but directories); nothing appended")


def append_shard(manifest: str, pack_into: Callable[[str], T], paths: Iterable[tuple[bytes, bool]] | None = None,
                 source: str = "the new shard") -> tuple[ShardRecord, T]:
    """Add a shard to the set ``manifest`` lists: ``pack_into(path)`` writes it as a
    complete archive at ``path`` (beside the manifest), the set with it is checked (no
    path in two shards), and a new manifest is renamed into place.  If anything fails
    the new shard is removed and the manifest is unchanged.  Returns the shard's record
    and what ``pack_into`` returned.

    ``paths``: what the shard will hold, as :func:`tree_paths` gives them, checked
    against the set before anything is packed; without them (a stream) the shard's own
    paths are checked once it is packed.  Either way a refusal is a PackError that
    counts the paths the set holds already and names the first few (``source`` names
    what was to be appended)."""
    while True:
        try:
            descriptor = os.open(manifest, os.O_RDONLY)
        except FileNotFoundError:
            raise PathNotFoundError(f"{manifest!r}: no such shard-set manifest") from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            if os.fstat(descriptor).st_ino != os.stat(manifest).st_ino:
                continue  # another append replaced it while this one waited: read the new one
            with os.fdopen(os.dup(descriptor), "rb") as current:
                records = parse_manifest(current.read(), repr(manifest))
            if paths is not None:
                _refuse_held(manifest, records, paths, source)  # before anything is written
            return _append_locked(manifest, records, pack_into, source, checked=paths is not None)
        finally:
            os.close(descriptor)


def _append_locked(manifest: str, records: list[ShardRecord], pack_into: Callable[[str], T],
                   source: str, checked: bool) -> tuple[ShardRecord, T]:
    path = appended_shard_name(manifest, records)
    result = pack_into(path)
    temporaries.register(path)  # until the manifest lists it: a signal removes it
    try:
        with Archive(path) as opened:
            if not checked:
                _refuse_held(manifest, records, _archive_paths(opened), source)
            record = shard_record(opened, os.path.basename(path))
        grown = [*records, record]
        base = os.path.dirname(os.path.abspath(manifest))
        with ShardSet([os.path.join(base, r.file) for r in grown], grown, manifest, check_records=True):
            pass  # opening checks the new shard against the shards its range overlaps
        write_manifest(manifest, grown)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        temporaries.unregister(path)
    return record, result
