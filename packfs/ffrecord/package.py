"""FFRecord's ``ffrecord.package``: ``PackedFolder`` and ``pack_folder``.

``PackedFolder`` is :class:`packfs.PackedFolder` (which reads both FFRecord's packed
folders, without unpickling their metadata, and packfs archives) with FFRecord's
constructor, return types and attributes.  ``pack_folder`` writes a packfs archive.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..core import ShardSet
from ..core.union import is_shard_set_spec
from ..folder import PackedFolder as FolderBase
from ..folder import PathArg
from ..format import S_IFDIR, S_IFMT, S_IFREG
from ..write import pack_folder as pack_archive_folder
from .fileio import FileReader, ffr_paths, writable_ffr_name

__all__ = ["PackedFolder", "pack_folder"]

def _array(data: bytes) -> np.ndarray:
    # FFRecord hands out fresh, writable arrays; a view of immutable bytes would not be.
    return np.frombuffer(data, np.uint8).copy()


class PackedFolder(FolderBase):
    """``PackedFolder(ffr_file, check_data=True)``: FFRecord's packed folder reader
    (``ffr_file`` may also be a shard set: a manifest, a list or a glob).

    FFRecord's methods (``num_files``, ``read_one``, ``read``, ``list``, ``exists``,
    ``is_file``, ``is_dir``) with its return types: contents as uint8 numpy arrays,
    ``list(recursive=True)`` giving top-level names as str and deeper ones as
    ``pathlib.Path``; and its attributes ``reader`` (a :class:`FileReader` of the
    same file) and ``structure`` (the tree as nested ``OrderedDict`` of names to
    record indices), both built on first use.  Everything else of
    :class:`packfs.PackedFolder` is there too.

    Raises
    ------
    PathNotFoundError, NotAFileError, FormatError
        As FileReader's for ``ffr_file``; FormatError (a ValueError, as FFRecord's
        "is not a packed folder") for a file that is neither an FFRecord packed
        folder nor a packfs archive.
    """

    def __init__(self, ffr_file: PathArg, check_data: bool = True) -> None:
        if (isinstance(ffr_file, (str, os.PathLike)) and not os.path.isdir(ffr_file)
                and not is_shard_set_spec(ffr_file)):
            ffr_paths(ffr_file)  # FFRecord's checks: exists, a file, named *.ffr
        super().__init__(ffr_file, check_data)
        self._reader: FileReader | None = None
        self._structure: OrderedDict[str, Any] | None = None

    def read_one(self, path: PathArg) -> np.ndarray:  # type: ignore[override]
        """File ``path``'s contents as a uint8 numpy array."""
        return _array(super().read_one(path))

    def read(self, fnames: Sequence[PathArg]) -> list[np.ndarray]:  # type: ignore[override]
        """The contents of each of ``fnames`` (a list or tuple) as uint8 numpy arrays."""
        if not isinstance(fnames, (list, tuple)):
            raise TypeError(f"fnames must be a list or tuple of paths, not {type(fnames).__name__}")
        return [self.read_one(path) for path in fnames]

    def list(self, path: PathArg | None = None, list_file: bool = True, list_dir: bool = True,  # type: ignore[override]
             recursive: bool = False) -> list[Any]:
        """Names in directory ``path`` (the root by default); with ``recursive``, the
        entries below too, depth first, as ``pathlib.Path`` relative to ``path`` (FFRecord
        returns them so)."""
        names = super().list(path, list_file, list_dir, recursive)
        return [Path(name) if "/" in name else name for name in names] if recursive else names

    @property
    def reader(self) -> FileReader:
        """A :class:`FileReader` of the archive's records (opened on first use)."""
        if self._reader is None:
            archive = self.archive
            # A shard set's records are numbered over its shards in order, as FileReader
            # numbers a list of files (and as ``structure`` gives them).
            files = archive.shard_locations if isinstance(archive, ShardSet) else self.path
            self._reader = FileReader(files, self.check_data)
        return self._reader

    @property
    def structure(self) -> OrderedDict[str, Any]:
        """The tree as FFRecord's metadata holds it: name -> record index (a file) or a
        nested OrderedDict (a directory), names in sorted order.  Symlinks, which
        FFRecord's packed folders never hold, are left out.  Built on first use, in
        memory proportional to the number of entries."""
        if self._structure is None:
            archive = self.archive
            records = archive.column("record")
            root: OrderedDict[str, Any] = OrderedDict()
            pending = [(0, root)]
            while pending:  # a stack, not recursion: any depth
                directory, node = pending.pop()
                children, names, modes = archive.listing(directory)
                for child, name, mode in zip(children, names, modes):
                    kind = mode & S_IFMT
                    if kind == S_IFREG:
                        node[os.fsdecode(name)] = int(records[child])
                    elif kind == S_IFDIR:
                        node[os.fsdecode(name)] = OrderedDict()
                        pending.append((child, node[os.fsdecode(name)]))
            self._structure = root
        return self._structure

    def close(self) -> None:
        """Close the archive (and :attr:`reader`, if it was opened)."""
        if self._reader is not None:
            self._reader.close()
        super().close()


class _PrintProgress:
    """FFRecord's ``verbose`` output: a line per file written, ``index/total``."""

    def __init__(self) -> None:
        self.total = self.done = 0

    def start(self, total_files: int, total_bytes: int) -> None:
        self.total = total_files

    def advance(self, files: int, nbytes: int) -> None:
        width = len(str(self.total))
        for _ in range(files):
            print(f"{self.done:0{width}d}/{self.total}", flush=True)
            self.done += 1


def pack_folder(folder: PathArg, out_file: PathArg, verbose: bool = False) -> None:
    """Pack directory ``folder`` into ``out_file`` (a ``.ffr``), replacing it if it
    exists, as FFRecord's does.

    The result is a packfs archive: :class:`PackedFolder` (this one or
    ``packfs.PackedFolder``) and FFRecord's ``FileReader`` read it, FFRecord's own
    ``PackedFolder`` does not.  As FFRecord's, symlinks are stored as what they point
    to.  ``verbose`` prints a line per file written.

    Raises
    ------
    PackError
        ``folder`` is not a directory, ``out_file`` does not end in ``.ffr``, or
        writing failed (``out_file`` is then left as it was).
    """
    pack_archive_folder(folder, writable_ffr_name(out_file), follow_symlinks=True, force=True,
                        progress=_PrintProgress() if verbose else None)
