"""Packing a shard set on a Dask cluster (the optional extra ``packfs[dask]``).

:func:`pack_on_dask` plans on the client: the files' sizes (measured by tasks on the
workers, in fixed chunks of files), sorted in pack order and cut into partitions by
bytes alone (:class:`~packfs.write.shards.ShardCutter`, the rule :func:`pack_shards`
uses), never by the number of workers.  Each partition becomes one task, which takes
the attributes of its files and directories, packs them into one shard on a worker
(to a temporary name in the output directory, renamed into place when complete) and
returns the shard's manifest record.  The client writes the manifest last.  A task's
output depends only on its partition and the files, so the set is the same bytes
whatever the number of workers, and for a list of every file of a tree (no symlinks,
hard links or empty directories) the same bytes as ``pack_shards`` of that tree with
the same ``shards`` or ``shard_size``.

A worker that dies mid-task (killed, out of memory) leaves a temporary file; Dask
runs the task again on another worker, which writes the same bytes under a new
temporary name.  Every temporary name carries a token of the run, and once every
task has ended the client removes whatever of its run is left, whichever host wrote
it: a pid says nothing about another host.  If the run fails, the shards already in
place are removed too, and no manifest is written.

The output directory must be one every worker and the client see (a shared file
system).
"""

from __future__ import annotations

import os
import secrets
from array import array
import stat as stat_module
import time
from typing import Any, BinaryIO, Iterable, NamedTuple, Optional, Sequence

from ..core.manifest import MANIFEST_SUFFIX, ShardRecord, depth_first_key
from ..core.paths import archive_key
from ..errors import PackError
from .container import TEMP_MARKER
from .entry import Entry, PathLike
from .scan import read_xattrs
from .shards import (ShardCutter, ShardSetStats, complete_shard, cut_entries, publish_set,
                     remove_abandoned_temporaries, set_names, shard_name, write_shard)

__all__ = ["Opaque", "Planned", "SourceFile", "pack_on_dask", "describe_file"]


class SourceFile:
    """A file's data for an :class:`Entry`, opened by path when the entry is written
    (on a worker): picklable, unlike an open file or a lambda."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self) -> BinaryIO:
        try:
            return open(self.path, "rb", buffering=0)
        except OSError as error:
            raise PackError(f"{self.path!r}: cannot open: {error.strerror}") from None

    def __repr__(self) -> str:
        return f"SourceFile({self.path!r})"


def describe_file(key: str | bytes, path: str, xattrs: bool = True, size: int | None = None) -> Entry:
    """The entry of file ``path`` stored as ``key``, with its attributes now; ``size``:
    the size it was planned with (a file whose size changed since is refused, and
    the pack refuses it again if it changes before it is written)."""
    try:
        info = os.stat(path)
    except OSError as error:
        raise PackError(f"{path!r}: cannot stat: {error.strerror}") from None
    if not stat_module.S_ISREG(info.st_mode):
        raise PackError(f"{path!r} is not a regular file")
    if size is not None and info.st_size != size:
        raise PackError(f"{path!r} changed size while packing: {size} bytes when listed, {info.st_size} now")
    return Entry(key, SourceFile(path), size=info.st_size, mode=stat_module.S_IMODE(info.st_mode), uid=info.st_uid,
                 gid=info.st_gid, mtime_ns=info.st_mtime_ns,
                 xattrs=read_xattrs(os.fsencode(path), True, path) if xattrs else None)


def _directory_entry(root: str, key: bytes, xattrs: bool) -> Entry:
    path = os.path.join(root, os.fsdecode(key)) if key else root
    try:
        info = os.lstat(path)
    except OSError as error:
        raise PackError(f"{path!r}: cannot stat: {error.strerror}") from None
    return Entry(key, None, "dir", mode=stat_module.S_IMODE(info.st_mode), uid=info.st_uid, gid=info.st_gid,
                 mtime_ns=info.st_mtime_ns, xattrs=read_xattrs(os.fsencode(path), True, path) if xattrs else None)


# Files sized by one task of the plan: the plan's own chunks, fixed, never tied to the
# number of workers (what a shard holds does not depend on them either way).
_SIZING_CHUNK = 4096


class Opaque:
    """Many items as one value for Dask: a list given to or returned by a task is
    serialised and scanned item by item (20,000 sizes cost 0.6-0.9 s that way, 0.02 s
    as one value: bench/dask_pack.py's tree)."""

    def __init__(self, items: Any) -> None:
        self.items = items


def _sizes(paths: Opaque) -> Opaque:
    """A plan task: the size of each file (a regular file: anything else is refused)."""
    sizes = array("q")
    for path in paths.items:
        try:
            info = os.stat(path)
        except OSError as error:
            raise PackError(f"{path!r}: cannot stat: {error.strerror}") from None
        if not stat_module.S_ISREG(info.st_mode):
            raise PackError(f"{path!r} is not a regular file")
        sizes.append(info.st_size)
    return Opaque(sizes)


def _pair_sizes(pairs: Iterable[Sequence[str]]) -> list[Opaque]:
    """A plan task over one partition of a bag: its (key, path, size) triples."""
    listed = [(key, path) for key, path in pairs]
    sizes = _sizes(Opaque([path for _, path in listed])).items
    return [Opaque([(key, path, size) for (key, path), size in zip(listed, sizes)])]


class Planned(NamedTuple):
    """A planned item: a file (its key, source path and size) or a directory above
    files; read by :func:`cut_entries` as it reads an Entry (kind, path, size, data)."""

    kind: str
    path: bytes
    source: Optional[str]
    size: int
    data: None = None

    @property
    def key(self) -> bytes:
        """The item's key, as :attr:`Entry.key <packfs.write.Entry.key>` (its path already is one)."""
        return self.path


def _plan(items: Any, root: str | None, client: Any) -> list[Planned]:
    """Every item to pack, in pack order, with the files' sizes (measured on the
    workers): the files, and for a list under ``root`` the directories above them."""
    from dask.bag import Bag

    if isinstance(items, Bag):
        if root is not None:
            raise ValueError("root applies to a list of files, not to a bag of (path in archive, file) pairs")
        listed = [(archive_key(key), path, size) for part in client.compute(items.map_partitions(_pair_sizes)).result()
                  for key, path, size in part.items]
        directories: set[bytes] = set()
    else:
        if root is None:
            raise ValueError("a list of files needs the root they lie under (root=...)")
        keys, paths = [], []
        for item in items:
            text = os.fsdecode(item)
            relative = os.path.relpath(text, root) if os.path.isabs(text) else os.path.normpath(text)
            if relative in (".", "..") or relative.startswith("../"):
                raise PackError(f"{text!r} is not a file under {root!r}")
            # normpath leaves no '.', '..' or doubled slash; the task's pack checks the
            # rest of what a name may be (NAME_MAX, NUL).
            keys.append(os.fsencode(relative))
            paths.append(root + "/" + relative)
        chunks = [paths[start:start + _SIZING_CHUNK] for start in range(0, len(paths), _SIZING_CHUNK)]
        sizes = [size for chunk in client.gather(client.map(_sizes, [Opaque(chunk) for chunk in chunks], pure=False))
                 for size in chunk.items]
        listed = list(zip(keys, paths, sizes))
        directories = {b""}
        for key, _, _ in listed:
            while b"/" in key:
                key = key.rpartition(b"/")[0]
                if key in directories:
                    break
                directories.add(key)
    planned = [Planned("dir", key, None, 0) for key in directories]
    planned += [Planned("file", key, path, size) for key, path, size in listed]
    planned.sort(key=lambda item: depth_first_key(item.path))
    for before, after in zip(planned, planned[1:]):
        if before.path == after.path:
            raise PackError(f"{os.fsdecode(after.path)!r} is given twice")
    return planned


def _pack_partition(root: str | None, partition: Opaque, xattrs: bool, directory: str, stem: str, name: str,
                    run: str, codecs: Optional[dict] = None) -> ShardRecord:
    """One task: take the attributes of a partition's files and directories (and of
    those above its first item), pack it into the shard ``name`` through a
    temporary file of this attempt renamed into place; its manifest record."""
    items: list[Planned] = partition.items
    entries = []
    for item in items:
        if item.source is not None:  # a file
            entries.append(describe_file(item.path, item.source, xattrs, item.size))
        elif root is not None:  # a directory: its attributes are the tree's, when there is one
            entries.append(_directory_entry(root, item.path, xattrs))
    directories: dict[bytes, Entry] = {}
    root_entry = None
    if root is not None and entries:
        key = entries[0].key
        while b"/" in key:
            key = key.rpartition(b"/")[0]
            directories[key] = _directory_entry(root, key, xattrs)
        root_entry = _directory_entry(root, b"", xattrs)
    complete, slots = complete_shard(entries, root_entry, directories, lambda key: None)
    temporary = os.path.join(directory, f".{stem}{TEMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}-{run}-{name}")
    record = write_shard(complete, temporary, slots, codecs=codecs)
    # Replace, not link: an earlier attempt cut off from the scheduler may have put
    # the same bytes there already.
    os.replace(temporary, os.path.join(directory, name))
    return record._replace(file=name)


def _stop(client: Any, futures: list[Any]) -> None:
    """Cancel the tasks no worker has taken yet, so that a failed or interrupted run
    ends soon; those taken run to their end (a running task cannot be stopped, and
    its shard must not appear after the clean-up), and the caller waits for them."""
    taken = {key for keys in client.processing().values() for key in keys}
    client.cancel([future for future in futures if future.key not in taken])


def pack_on_dask(
    items: Any,
    out: PathLike,
    *,
    root: PathLike | None = None,
    shards: int | None = None,
    shard_size: int | None = None,
    client: Any = None,
    force: bool = False,
    xattrs: bool = True,
    codecs: Optional[dict] = None,
) -> ShardSetStats:
    """Pack files into a shard set, one shard per task on a Dask cluster.

    Parameters
    ----------
    items
        A list of files under ``root`` (paths relative to it, or absolute below it),
        stored at their paths relative to ``root``, with the directories above them
        (their attributes from ``root``'s); or a ``dask.bag.Bag`` of ``(path in the
        archive, source file)`` pairs, whose directories the shards create (0o755).
    out
        The set's name, as for :func:`pack_shards`: ``data.ffr`` gives
        ``data-00000-of-0000N.ffr``... and ``data.ffrset``, in a directory every
        worker sees.
    shards, shard_size
        Exactly one: N partitions of about equal bytes, or partitions of at most
        ``shard_size`` file bytes (:class:`~packfs.write.shards.ShardCutter`).
    client
        The ``distributed.Client``; default: the current one.
    force
        Replace an existing set of the same name.
    xattrs
        Keep the files' (and directories') extended attributes.
    codecs
        Format 1.5's codec options for every shard, as :func:`pack_shards` takes them
        (``{"compress": "zstd", "dictionary": "auto"}``): each task compresses its
        shard, so compression runs on every worker.

    Returns
    -------
    ShardSetStats

    Raises
    ------
    PackError
        A file cannot be read or changed size, a path is given twice, the set exists
        (without ``force``), or a task failed (the set is then not written).
    """
    started = time.perf_counter()
    try:
        import distributed
    except ImportError:
        raise PackError("pack_on_dask needs Dask distributed: pip install 'packfs[dask]'") from None
    if (shards is None) == (shard_size is None):
        raise ValueError("pack_on_dask needs shards or shard_size (one of them)")
    if client is None:
        try:
            client = distributed.get_client()
        except ValueError:
            raise PackError("pack_on_dask needs a Dask client (client=..., or a distributed.Client "
                            "created before)") from None
    directory, stem = set_names(out)
    manifest = os.path.join(directory, stem + MANIFEST_SUFFIX)
    if not force and os.path.lexists(manifest):
        raise PackError(f"{manifest!r} already exists; use --force to replace it")
    remove_abandoned_temporaries(directory, stem)
    root_text = None if root is None else os.path.abspath(os.fsdecode(root))
    planned = _plan(items, root_text, client)
    total = sum(item.size for item in planned if item.kind == "file")
    partitions = list(cut_entries(planned, ShardCutter(shard_size=shard_size, shards=shards,  # type: ignore[arg-type]
                                                        total_bytes=total)))
    count = len(partitions)
    names = [shard_name(stem, number, count) for number in range(count)]
    if not force:
        for name in names:
            if os.path.lexists(os.path.join(directory, name)):
                raise PackError(f"{os.path.join(directory, name)!r} already exists; use --force to replace it")
    run = secrets.token_hex(6)
    futures = [client.submit(_pack_partition, root_text, Opaque(partition), xattrs, directory, stem, name, run,
                             codecs, key=f"packfs-shard-{run}-{name}", pure=False)
               for partition, name in zip(partitions, names)]
    try:
        try:
            records = client.gather(futures)
        except BaseException as error:
            _stop(client, futures)
            if isinstance(error, Exception):
                raise PackError(f"packing the set {manifest!r} on Dask failed: {error}") from error
            raise
        finally:
            # Once every task has ended, whatever is left of this run is an attempt's
            # debris, whichever host wrote it.
            distributed.wait([future for future in futures if not future.cancelled()])
            remove_abandoned_temporaries(directory, stem, everyone_gone=f"-{run}-")
        # The shards are in place already; publish_set renames each onto itself and
        # writes the manifest.
        written = [(os.path.join(directory, record.file), record) for record in records]
        records = publish_set(directory, stem, written, force=True)
    except BaseException:
        for name in names:
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass
        raise
    return ShardSetStats(
        manifest=manifest, shards=tuple(records), files=sum(1 for item in planned if item.kind == "file"),
        dirs=sum(1 for item in planned if item.kind == "dir"), symlinks=0, hardlinks=0, skipped=(),
        file_bytes=total, archive_bytes=sum(record.size for record in records),
        seconds=time.perf_counter() - started)

