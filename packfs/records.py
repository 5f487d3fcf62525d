"""RecordWriter and RecordReader: the FFRecord container as a sequence of records."""

from __future__ import annotations

import glob
import os
from bisect import bisect_right
from typing import Any, Callable, Iterable, Mapping, Sequence, Union, overload

from .core import Container, VerifyReport
from .core import recordfile
from .errors import ClosedArchiveError, PackError
from .source import is_url
from .write import ContainerWriter

__all__ = ["RecordWriter", "RecordReader", "record_file_info", "verify_record_file"]

PathArg = Union[str, "os.PathLike[str]"]


class RecordWriter:
    """Write ``n`` records to an FFRecord container, atomically.

    Like FFRecord's FileWriter, but the file appears only at :meth:`close` (written to
    a temporary file until then), a wrong count is an error that leaves nothing
    behind, and ``write_one`` stores all ``nbytes`` of a buffer (FFRecord stores only
    ``shape[0]`` bytes of a numpy array).

    Parameters
    ----------
    path
        The file to write.
    n
        Exactly how many records will be written.
    force
        Replace ``path`` if it exists.
    """

    def __init__(self, path: PathArg, n: int, force: bool = False) -> None:
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        self.path = os.fspath(path)
        self.n = n
        self._writer: ContainerWriter | None = ContainerWriter(self.path, n, force=force)

    def write_one(self, data: bytes | bytearray | memoryview) -> None:
        """Append one record (any object with the buffer protocol)."""
        if self._writer is None:
            raise ValueError(f"RecordWriter for {self.path!r} is closed")
        view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        self._writer.write_record(view)

    def close(self) -> None:
        """Write the header and publish the file; fewer records than ``n`` is a PackError."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        if writer.records_written != self.n:
            writer.abort()
            raise PackError(
                f"{self.path!r}: {writer.records_written} records written, {self.n} declared; "
                f"nothing was written"
            )
        writer.commit()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None and self._writer is not None:
            self._writer.abort()
            self._writer = None
        else:
            self.close()

    def __del__(self) -> None:
        if getattr(self, "_writer", None) is not None:
            self._writer.abort()  # never leave a temporary file behind


def _expand(paths: PathArg | Sequence[PathArg]) -> list[str]:
    if isinstance(paths, (str, os.PathLike)):
        text = os.fspath(paths)
        if is_url(text):  # a URL is one file (its "?" is a query, not a glob)
            return [text]
        if os.path.isdir(text):
            return sorted(glob.glob(os.path.join(glob.escape(text), "*.ffr")))
        if glob.has_magic(text) and not os.path.exists(text):
            return sorted(glob.glob(text))
        return [text]
    return [os.fspath(p) for p in paths]


class RecordReader:
    """Read records from one or several FFRecord containers as one sequence.

    Records are their stored bytes: a packfs archive with codecs (format 1.5) holds a
    compressed file's zstd frames in its record; read such files by path
    (``PackedFolder``, ``PackedFiles``) for their contents.

    Parameters
    ----------
    paths
        A file, a list of files, a glob, or a directory (all its ``*.ffr``, sorted); a
        file may be an ``s3://`` or ``http(s)://`` URL.
    check_data
        Check the header CRC at open and each record's CRC when read.  Every
        offset is checked at open either way.
    allow_legacy_header
        Accept FFRecord's "legacy" files, whose header CRC is 0 (also what an aborted
        FFRecord writer leaves): their header goes unchecked, their records do not.
    storage_options
        For URLs: credentials, endpoint and client options (:mod:`packfs.source.remote`).

    Raises
    ------
    FormatError
        A file is missing or malformed; ChecksumError for a header CRC mismatch.
    """

    def __init__(self, paths: PathArg | Sequence[PathArg], check_data: bool = True,
                 allow_legacy_header: bool = False, storage_options: Mapping[str, Any] | None = None) -> None:
        self.paths = _expand(paths)
        if not self.paths:
            raise ValueError(f"no record files match {paths!r}")
        self.check_data = check_data
        self._containers: list[Container] = []
        try:
            for path in self.paths:
                self._containers.append(Container(path, check_data=check_data,
                                                  allow_legacy_header=allow_legacy_header,
                                                  storage_options=storage_options))
                # A record sequence is read by index, often all of it: check every
                # offset once here (a fast pass), as FFRecord's FileReader should.
                self._containers[-1].check_offsets()
        except BaseException:
            self.close()
            raise
        self._starts = [0]
        for container in self._containers:
            self._starts.append(self._starts[-1] + container.record_count)
        self.n = self._starts[-1]

    def __len__(self) -> int:
        return self.n

    def _locate(self, index: int) -> tuple[Container, int]:
        containers = self._containers
        if not containers:
            raise ClosedArchiveError(f"{self.paths[0]!r}: I/O operation on a closed archive")
        if not isinstance(index, int):
            raise TypeError(f"record index must be an int, got {type(index).__name__}")
        if index < 0:
            index += self.n
        if not 0 <= index < self.n:
            raise IndexError(f"record index out of range for {self.n} records")
        if len(containers) == 1:
            return containers[0], index
        shard = bisect_right(self._starts, index) - 1
        return containers[shard], index - self._starts[shard]

    def read_one(self, index: int) -> bytes:
        """Record ``index`` (negative counts from the end)."""
        container, local = self._locate(index)
        # Container.read_record: an archive overwritten in place under this read is an
        # ArchiveChangedError from the check after it, never a SIGBUS or the new file's
        # bytes (bench/overwrite.py measures how it reads).
        return container.read_record(local, self.check_data, f"record {index}")

    def read(self, indices: Iterable[int]) -> list[bytes]:
        """Records ``indices``, in the order given."""
        return [self.read_one(i) for i in indices]

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            return self.read(range(*index.indices(self.n)))
        return self.read_one(index)

    @property
    def shards(self) -> tuple[Container, ...]:
        """The open record files, in order (their ``offsets``, ``crcs`` and ``file_size``
        are what FFRecord's ``get_offsets`` and ``get_checksums`` return)."""
        if not self._containers:
            raise ClosedArchiveError(f"{self.paths[0]!r}: I/O operation on a closed archive")
        return tuple(self._containers)

    def record_length(self, index: int) -> int:
        """The length of record ``index`` in bytes, without reading it."""
        container, local = self._locate(index)
        return container.checked(container.record_length, local)

    def close(self) -> None:
        """Close the reader: later calls raise ClosedArchiveError.  Calls already running
        in other threads finish with the right bytes; each file's descriptor and map are
        released when nothing uses them any more (at once, when nothing runs), so a
        descriptor is never closed under a read, where its number could meanwhile name
        another file."""
        self._containers = []

    def __enter__(self) -> RecordReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RecordReader({self.paths!r}, check_data={self.check_data!r})"

    def __getstate__(self) -> dict[str, object]:
        return {"paths": self.paths, "check_data": self.check_data}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["paths"], state["check_data"])  # type: ignore[misc, arg-type]


def record_file_info(path: PathArg) -> dict[str, object]:
    """Describe one FFRecord record file (what ``packfs info`` shows of one).

    A legacy header (checksum 0) is accepted and reported in ``header_checksum``.

    Returns
    -------
    dict
        ``path``, ``kind`` ("FFRecord record file", or "aborted FFRecord write"),
        ``records``, ``record_bytes``, ``smallest_record``, ``largest_record``,
        ``archive_bytes``, ``header_checksum``, ``read_with``.

    Raises
    ------
    FormatError
        The file is not a well-formed container (its offsets included).
    ChecksumError
        The header CRC does not match.
    """
    container = Container(path, check_data=True, allow_legacy_header=True)
    try:
        return recordfile.record_file_info(container)
    finally:
        container.close()


def verify_record_file(path: PathArg, progress: Callable[[int], None] | None = None) -> VerifyReport:
    """Check every CRC of one FFRecord record file (what ``packfs verify`` does to one).

    The header CRC, every offset, every record's CRC and that every byte after the
    header belongs to a record.  A legacy header (checksum 0) cannot be checked, and
    is reported as a problem.  Any container is checked this way, a packfs archive too
    (without its path table's rules: :meth:`packfs.PackedFolder.verify` checks those).

    Parameters
    ----------
    path
        The record file.
    progress
        Called with byte counts as records are checked.

    Returns
    -------
    VerifyReport
        ``bad_records`` are the records that fail; ``problems`` has one line for each
        finding (each failing record included); ``bad_paths`` is empty.

    Raises
    ------
    FormatError
        The file is not a container at all.
    ChecksumError
        The header CRC does not match.
    """
    container = Container(path, check_data=True, allow_legacy_header=True)
    try:
        return recordfile.verify_record_file(container, progress)
    finally:
        container.close()
