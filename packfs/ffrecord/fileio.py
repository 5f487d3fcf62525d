"""FFRecord's ``ffrecord.fileio``: ``FileReader``, ``FileWriter`` and ``checkFsAlign``.

FFRecord implements these in C++ (libaio for batches); here they are Python over
:class:`packfs.RecordReader` / :class:`packfs.RecordWriter`, with FFRecord's names,
arguments, attributes and return types.  How they differ, on purpose, is listed in
:mod:`packfs.ffrecord`.
"""

from __future__ import annotations

import fcntl
import operator
import os
import sys
from bisect import bisect_right
from itertools import accumulate
from pathlib import Path
from typing import Any, Iterable, Sequence, Union

import numpy as np

from ..core import Container
from ..errors import (ChecksumError, ClosedArchiveError, FormatError, NotAFileError, PackError,
                      PathNotFoundError)
from ..format import crc32
from ..source import is_url, url_error
from ..records import RecordReader, RecordWriter

__all__ = ["FileReader", "FileWriter", "checkFsAlign", "ffr_paths", "writable_ffr_name"]

PathArg = Union[str, "os.PathLike[str]"]

# A run of adjacent records is read with one preadv into their arrays; the kernel
# takes at most IOV_MAX buffers a call.  Runs stop growing at _RUN_BYTES, so that each
# record's CRC is computed while its bytes are still in the CPU cache: one preadv of
# 128 adjacent 1 MiB records, then 128 CRCs, was 19% slower than a preadv and a CRC
# per record (bench/ffrecord_batch.py).
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
_RUN_BYTES = 1 << 18

# FFRecord's ioctl for "this file system wants O_DIRECT-aligned reads" (HFAiLab's own
# file system answers it; others fail it): _IOR('f', 100, u32).
_FS_IOCNUM_CHECK_FS_ALIGN = 2147772004


def ffr_paths(fname: PathArg | Sequence[PathArg]) -> list[str]:
    """The files FFRecord's ``FileReader(fname)`` opens: ``fname`` itself, the files of a
    list or tuple, or a directory's ``*.ffr`` sorted by path; each must exist, be a
    regular file and end in ``.ffr``.

    Raises
    ------
    TypeError
        ``fname`` is not a str, an os.PathLike, a list or a tuple.
    PathNotFoundError
        A file does not exist, or a directory holds no ``*.ffr``.
    NotAFileError
        A name in a list is a directory.
    FormatError
        A name does not end in ``.ffr``.
    ValueError
        The list is empty.
    """
    if isinstance(fname, (str, os.PathLike)):
        text = str(fname)  # str(), not fspath: FFRecord's fnames, byte for byte
        if Path(text).is_dir():
            paths = sorted(str(path) for path in Path(text).glob("*.ffr"))
            if not paths:
                raise PathNotFoundError(f"{text!r}: no .ffr file in this directory")
        else:
            paths = [text]
    elif isinstance(fname, (list, tuple)):
        paths = [str(path) for path in fname]
        if not paths:
            raise ValueError("FileReader needs at least one .ffr file, got an empty list")
    else:
        raise TypeError(f"fname must be str, os.PathLike, list or tuple, not {type(fname).__name__}")
    for path in paths:
        if is_url(path):  # read with ranged requests (packfs.source.remote)
            if not path.split("?")[0].endswith(".ffr"):
                raise FormatError(f"{path!r} does not end with .ffr (FFRecord's FileReader reads only .ffr files)")
            continue
        if not os.path.exists(path):
            raise url_error(path) or PathNotFoundError(f"{path!r} does not exist")
        if not os.path.isfile(path):
            raise NotAFileError(f"{path!r} is not a file")
        if Path(path).suffix != ".ffr":
            raise FormatError(f"{path!r} does not end with .ffr (FFRecord's FileReader reads only .ffr files)")
    return paths


def writable_ffr_name(fname: PathArg) -> str:
    """``fname`` as FFRecord's ``FileWriter`` takes it: a str or os.PathLike ending in
    ``.ffr``, returned as str.

    Raises
    ------
    TypeError
        ``fname`` is not a str or os.PathLike.
    PackError
        It does not end in ``.ffr``.
    """
    if not isinstance(fname, (str, os.PathLike)):
        raise TypeError(f"fname must be str or os.PathLike, not {type(fname).__name__}")
    path = str(fname)
    if Path(path).suffix != ".ffr":
        raise PackError(f"{path!r} does not end with .ffr (FFRecord writes only .ffr files)")
    return path


def _index_list(indices: Iterable[Any]) -> list[int]:
    if isinstance(indices, (str, bytes)) or not hasattr(indices, "__iter__"):
        raise TypeError(f"indices must be a sequence of ints, not {type(indices).__name__}")
    return [operator.index(index) for index in indices]


class FileReader:
    """``FileReader(fname, check_data=True)``: one ``.ffr`` file, a list or tuple of
    them, or a directory (its ``*.ffr``, sorted), read as one sequence of ``n`` records.

    Reads return fresh, writable numpy ``uint8`` arrays, as FFRecord's do.  A batch
    (:meth:`read`) is read in archive order, each run of adjacent records with one
    ``preadv`` straight into the arrays (``bench/ffrecord_batch.py``).

    Records are read as stored, as FFRecord's own reader reads them: in a packfs
    archive with codecs (format 1.5, section 4f) a compressed file's record is its zstd
    frames, a sparse file's its data extents, and one record may hold the contents of
    several equal files.  Read files of such an archive by path (``packfs.PackedFolder``,
    ``packfs.ffrecord.package``'s reader) to get their contents.

    Parameters
    ----------
    fname
        What to read (see :func:`ffr_paths`).
    check_data
        Check each file's header CRC at open and each record's CRC as it is read.
        Every offset is checked at open either way.
    allow_legacy_header
        Accept FFRecord's "legacy" files, whose header CRC is 0 (also what an aborted
        FFRecord writer leaves); a packfs addition, off by default.

    Attributes
    ----------
    n
        The number of records, all files together.
    fnames
        The files, in order (a list of str).
    check_data
        As given.

    Raises
    ------
    PathNotFoundError, NotAFileError, FormatError
        See :func:`ffr_paths`; FormatError also for a malformed file.
    ChecksumError
        A header CRC does not match (``check_data``).
    """

    def __init__(self, fname: PathArg | Sequence[PathArg], check_data: bool = True,
                 allow_legacy_header: bool = False) -> None:
        self.fnames = ffr_paths(fname)
        self.check_data = bool(check_data)
        self.allow_legacy_header = bool(allow_legacy_header)
        self._records = RecordReader(self.fnames, check_data=self.check_data,
                                     allow_legacy_header=self.allow_legacy_header)
        self.n = self._records.n
        self._starts = [0, *accumulate(shard.record_count for shard in self._records.shards)]

    def _locate(self, index: int) -> tuple[int, int]:
        """(file number, record in that file) of global record ``index``."""
        if index < 0:
            index += self.n
        if not 0 <= index < self.n:
            raise IndexError(f"record index {index} out of range for {self.n} records")
        shard = bisect_right(self._starts, index) - 1
        return shard, index - self._starts[shard]

    def read_one(self, index: int) -> np.ndarray:
        """Record ``index`` (negative counts from the end) as a uint8 numpy array."""
        shards = self._records.shards  # ClosedArchiveError once closed
        index = operator.index(index)
        shard, local = self._locate(index)
        result: list[Any] = [None]
        shards[shard].checked(self._read_shard, shards[shard], [(local, 0)], [index], result)
        return result[0]

    def read(self, indices: Sequence[int]) -> list[np.ndarray]:
        """Records ``indices`` (any sequence of ints, repeats allowed), as uint8 numpy
        arrays in the order given."""
        shards = self._records.shards  # ClosedArchiveError once closed, as FFRecord raises
        wanted = _index_list(indices)
        groups: dict[int, list[tuple[int, int]]] = {}
        locate = self._locate
        for position, index in enumerate(wanted):
            shard, local = locate(index)
            if shard in groups:
                groups[shard].append((local, position))
            else:
                groups[shard] = [(local, position)]
        results: list[Any] = [None] * len(wanted)
        for shard, items in groups.items():
            # checked(): offsets read through the map safely, and anything read from a
            # file overwritten in place meanwhile is an ArchiveChangedError, never data.
            shards[shard].checked(self._read_shard, shards[shard], items, wanted, results)
        return results

    def _read_shard(self, container: Container, items: list[tuple[int, int]], wanted: list[int],
                    results: list[Any]) -> None:
        """Fill ``results[position]`` for each (record, position) of one file, reading in
        archive order: each run of adjacent records is one preadv into fresh arrays."""
        spans = sorted([(*container.record_span(local), local, position) for local, position in items])
        source = container.source
        fd = source.fileno()
        stored = container.crc_items if self.check_data else None
        count, i = len(spans), 0
        while i < count:
            run_start, run_end = spans[i][0], spans[i][1]
            j = i + 1
            while (j < count and spans[j][0] == run_end and spans[j][1] - run_start <= _RUN_BYTES
                   and j - i < _IOV_MAX):
                run_end = spans[j][1]
                j += 1
            run = spans[i:j]
            arrays = [np.empty(end - start, np.uint8) for start, end, _, _ in run]
            got = os.preadv(fd, arrays, run_start) if run_end > run_start else 0
            if got < run_end - run_start:
                # Short: a read over 2 GiB comes in parts, or the file shrank (then
                # readinto raises ArchiveChangedError).
                for array, (start, _, _, _) in zip(arrays, run):
                    done = min(max(got - (start - run_start), 0), len(array))
                    if done < len(array):
                        source.readinto(memoryview(array)[done:], start + done)
            for array, (_, _, local, position) in zip(arrays, run):
                if stored is not None and crc32(array) != stored[local]:
                    container.check_crc(local, array, f"record {wanted[position]}")
                results[position] = array
            i = j

    def get_offsets(self, file_index: int = 0) -> np.ndarray:
        """File ``file_index``'s record offsets (int64), plus its size as an (n+1)-th
        offset, as FFRecord keeps them (each record's length is a difference)."""
        container = self._records.shards[file_index]
        return np.append(container.offsets, np.int64(container.file_size))

    def get_checksums(self, file_index: int = 0) -> np.ndarray:
        """File ``file_index``'s stored record CRCs (uint32)."""
        return self._records.shards[file_index].crcs.copy()

    def validate(self) -> None:
        """Check every file's header CRC again (FFRecord's ``validate``).

        Raises
        ------
        ChecksumError
            A header CRC does not match.
        FormatError
            A header CRC is 0 (a legacy file) without ``allow_legacy_header``.
        """
        for container in self._records.shards:
            stored = int.from_bytes(container.pread(0, 4), "little")
            if stored == 0:
                if self.allow_legacy_header:
                    continue  # FFRecord warns and skips these
                raise FormatError(f"{container.path!r}: metadata checksum is 0 (an FFRecord legacy "
                                  f"or aborted file); allow_legacy_header=True accepts it")
            computed = container.crc_of_span(4, container.data_start)
            if computed != stored:
                raise ChecksumError(f"{container.path!r}: header checksum mismatch: stored "
                                    f"{stored:#010x}, computed {computed:#010x}")

    def close(self) -> None:
        """Close the files: later reads raise ClosedArchiveError; ``n`` and ``fnames``
        stay, and the reader still pickles (and re-opens)."""
        self._records.close()

    def __enter__(self) -> FileReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        # As FFRecord's: a reader pickles as its file names and re-opens them wherever
        # it is unpickled (a DataLoader worker under spawn), even after close().
        return (FileReader, (self.fnames, self.check_data, self.allow_legacy_header))

    def __repr__(self) -> str:
        return f"FileReader({self.fnames!r}, check_data={self.check_data!r}): {self.n} records"


class FileWriter:
    """``FileWriter(fname, n)``: write exactly ``n`` records with :meth:`write_one`, then
    :meth:`close` (or use ``with``).

    As FFRecord's, an existing ``fname`` is overwritten; unlike it, the records go to
    a temporary file next to ``fname`` that replaces it in one rename at ``close``, so
    ``fname`` is never a half-written file.

    Attributes
    ----------
    n
        The number of records declared.
    count
        How many have been written so far.

    Raises
    ------
    TypeError
        ``fname`` is not a str or os.PathLike.
    PackError
        ``fname`` does not end in ``.ffr``, is a directory, or its directory is not
        writable.
    """

    def __init__(self, fname: PathArg, n: int) -> None:
        self._path = writable_ffr_name(fname)
        self.n = operator.index(n)
        self.count = 0
        self._writer: RecordWriter | None = RecordWriter(self._path, self.n, force=True)

    def write_one(self, data: bytes | bytearray | memoryview | np.ndarray) -> None:
        """Append one record: any buffer, all of its bytes (a numpy array's ``nbytes``).

        Raises
        ------
        PackError
            ``n`` records were written already.
        ClosedArchiveError
            The writer is closed.
        """
        if self._writer is None:
            raise ClosedArchiveError(f"{self._path!r}: FileWriter is closed")
        if isinstance(data, np.ndarray):
            data = memoryview(np.ascontiguousarray(data)).cast("B")
        self._writer.write_one(data)
        self.count += 1

    def close(self) -> None:
        """Write the header and publish the file (a second call does nothing).

        Raises
        ------
        PackError
            Fewer than ``n`` records were written: nothing is published, and an
            existing ``fname`` is left as it was.
        """
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    def __enter__(self) -> FileWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.__exit__(exc_type, exc, tb)  # an exception discards the file

    def __del__(self) -> None:
        # FFRecord's destructor finishes a file whose records are all written, so
        # scripts that never call close() still get it.
        if getattr(self, "_writer", None) is not None and self.count == self.n:
            self.close()

    def __repr__(self) -> str:
        return f"FileWriter({self._path!r}, {self.n}): {self.count} written"


def checkFsAlign(fd: int) -> bool:  # noqa: N802 (FFRecord's name)
    """Whether the file system of open descriptor ``fd`` asks for O_DIRECT-aligned reads.

    FFRecord's check, unchanged: the ioctl ``_IOR('f', 100, u32)`` (2147772004), which
    HFAiLab's own file system answers with 1; everywhere else it fails, and the answer
    is False.  FFRecord then reads batches with O_DIRECT; packfs never uses O_DIRECT,
    so the answer changes nothing here.
    """
    buffer = bytearray(4)
    try:
        fcntl.ioctl(fd, _FS_IOCNUM_CHECK_FS_ALIGN, buffer, True)
    except OSError:
        return False
    return int.from_bytes(buffer, sys.byteorder) == 1
