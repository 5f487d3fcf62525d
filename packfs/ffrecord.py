"""FFRecord's Python API on packfs: change ``from ffrecord import ...`` to
``from packfs.ffrecord import ...`` and the rest of the code stays as it is.

``FileWriter``, ``FileReader``, ``PackedFolder`` and ``pack_folder`` keep FFRecord's
names, signatures and return types (reads return numpy ``uint8`` arrays).  Where packfs
differs, it does so on purpose:

- errors are ``PackfsError`` subclasses (``FormatError``, ``ChecksumError``,
  ``PathNotFoundError``, ...), not ``RuntimeError``/``AssertionError``;
- readers check what FFRecord trusts: every offset (``12 + 12n <= offsets[0] <= ... <=
  file size``), ``n`` before anything is allocated, and index ranges; negative indices
  count from the end, as in Python;
- FFRecord's "legacy" files (``checksum_meta == 0``, also what an aborted FileWriter
  leaves) open only with ``allow_legacy_header=True``: otherwise they are a FormatError;
- ``FileWriter.write_one`` stores every byte of the buffer (FFRecord stores
  ``shape[0]`` bytes, which truncates arrays with itemsize > 1);
- ``PackedFolder`` reads both FFRecord's packed folders (without unpickling their
  metadata) and packfs archives, and resolves ``.``, ``..`` and a leading ``/`` as a
  file system does;
- ``pack_folder`` writes a packfs archive: FFRecord's ``FileReader`` reads its records,
  FFRecord's own ``PackedFolder`` does not (``packfs.PackedFolder`` reads both).
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from .folder import PackedFolder as _PackedFolder
from .folder import PathArg as _PathArg
from .records import RecordReader, RecordWriter
from .write import pack_folder as _pack_folder

__all__ = ["FileWriter", "FileReader", "PackedFolder", "pack_folder"]


def _array(data: bytes) -> np.ndarray:
    # FFRecord hands out fresh, writable arrays; a view of immutable bytes would not be.
    return np.frombuffer(data, np.uint8).copy()


class FileWriter:
    """``FileWriter(fname, n)``: write exactly ``n`` records with ``write_one``, then
    ``close()`` (or use ``with``).  The file appears only when all ``n`` are written."""

    def __init__(self, fname: str | os.PathLike[str], n: int) -> None:
        self._writer = RecordWriter(fname, n)

    def write_one(self, data: bytes | bytearray | memoryview | np.ndarray) -> None:
        """Append one record: FFRecord's ``write_one`` (any buffer; all its bytes are stored)."""
        self._writer.write_one(memoryview(data).cast("B") if isinstance(data, np.ndarray) else data)

    def close(self) -> None:
        """Write the header and publish the file; fewer records than ``n`` is a PackError."""
        self._writer.close()

    def __enter__(self) -> FileWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._writer.__exit__(*exc)


class FileReader:
    """``FileReader(fnames, check_data=True)``: one ``.ffr`` file, a list of them, or a
    directory (its ``*.ffr`` files sorted by name), read as one sequence of ``n`` records."""

    def __init__(self, fnames: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                 check_data: bool = True, allow_legacy_header: bool = False) -> None:
        self._reader = RecordReader(fnames, check_data=check_data, allow_legacy_header=allow_legacy_header)
        self.n = self._reader.n

    def read_one(self, index: int) -> np.ndarray:
        """Record ``index`` as a uint8 numpy array, as FFRecord returns it."""
        return _array(self._reader.read_one(index))

    def read(self, indices: Sequence[int]) -> list[np.ndarray]:
        """Records ``indices`` as uint8 numpy arrays."""
        return [_array(data) for data in self._reader.read(indices)]

    def get_offsets(self, file_index: int = 0) -> np.ndarray:
        """File ``file_index``'s record offsets, plus its size as a last offset (FFRecord
        keeps n + 1 offsets so that every record's length is a difference)."""
        container = self._reader.shards[file_index]
        return np.append(container.offsets, np.int64(container.file_size))

    def get_checksums(self, file_index: int = 0) -> np.ndarray:
        """File ``file_index``'s stored record CRCs."""
        return self._reader.shards[file_index].crcs.copy()

    def close(self) -> None:
        """Close the record files."""
        self._reader.close()

    def __enter__(self) -> FileReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PackedFolder(_PackedFolder):
    """``PackedFolder(fname, check_data=True)`` with FFRecord's return types."""

    def read_one(self, path: _PathArg) -> np.ndarray:  # type: ignore[override]
        """File ``path``'s contents as a uint8 numpy array, as FFRecord returns them."""
        return _array(super().read_one(path))

    def read(self, paths: Sequence[_PathArg]) -> list[np.ndarray]:  # type: ignore[override]
        """The contents of ``paths`` as uint8 numpy arrays."""
        return [self.read_one(path) for path in paths]


def pack_folder(folder: str | os.PathLike[str], out_file: str | os.PathLike[str]) -> None:
    """Pack directory ``folder`` into ``out_file`` (a packfs archive; see the module doc)."""
    _pack_folder(folder, out_file)
