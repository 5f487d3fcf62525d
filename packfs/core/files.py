"""Reading files of an archive in more than one call: file objects over one record,
and a batch of records read in archive order (from a local file with joined preads,
from a URL with ranged GETs in flight at once)."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Iterator, List, NoReturn, Protocol, Sequence, Tuple

if TYPE_CHECKING:
    import numpy as np

    from .codecs import CodecRow, CodecTable, SparseLayout
    from .pathtable import PathTable

from ..errors import ClosedArchiveError, FormatError, NotAFileError, PackfsError
from ..format import CODEC_STORED, S_IFMT, S_IFREG
from ..source import ByteSource
from .codecs import check_in_memory
from .container import Container
from .recordreader import RecordReader

__all__ = ["PackedFile", "MemoryFile", "StreamFile", "DecodedFile", "SMALL_FILE_BYTES", "UNCHECKED_SMALL_FILE_BYTES",
           "STREAM_BUFFER_BYTES", "read_entries", "read_spans", "BATCH_GROUP_SHARE", "BatchOwner"]

# Archive.open reads a file of at most SMALL_FILE_BYTES whole, with one pread, checks
# those bytes and serves them from memory, where its CRC is checked at open ("always",
# and "once" the first time), which reads the whole record anyway.  Where it is not,
# a whole read pays off up to UNCHECKED_SMALL_FILE_BYTES: for a larger file, a caller
# who reads only its header (an image's size) would wait for the copy (900 KiB, warm
# page cache, side by side: open and read(16) took 43 us read whole, 9 us as a
# StreamFile; crossing near 256 KiB).  A larger file is read as it is read, so an open file holds
# at most SMALL_FILE_BYTES (or STREAM_BUFFER_BYTES) whatever its size.
SMALL_FILE_BYTES = 1 << 20
UNCHECKED_SMALL_FILE_BYTES = 256 << 10
# The buffer of a larger file: a read past it calls back into Python (one pread and
# the unchanged check, a few us), so sequential small reads pay that once per buffer,
# and a small read at a random offset pays it and a copy of the buffer.  Measured per
# read(4096) front to back / seek + read(16) at random: 8 KiB 1.24 / 2.7 us, 32 KiB
# 0.58 / 3.7 us, 64 KiB 0.49 / 4.9 us; a built-in file 0.56 / 0.9 us.
STREAM_BUFFER_BYTES = 32 << 10
# A batch read joins adjacent files into one pread while the run stays this small
# (packfs.dataset): that saves a system call per small file, but a large run is one
# large allocation, faulted in page by page and then copied again into the files'
# own bytes objects, which cost more than the calls saved (bench/dataloader.py).
_BATCH_RUN_BYTES = 64 << 10
# A batch from a source without a map (a URL) is fetched in groups of at most this
# share of the source's memory cap (a group's GETs all in flight at once), so a batch
# of huge files holds one group's bytes, not the batch's, while it is fetched; a file
# larger than that is a group of its own.
BATCH_GROUP_SHARE = 4


class PackedFile:
    """A read-only, seekable binary file over one file of an archive: what
    :meth:`Archive.open <packfs.core.Archive.open>` and ``PackedFolder.open`` return.

    Its CRC was checked at open under the archive's checksum policy; reads do not
    check it again.  The file object is one of two kinds, both C implementations of
    Python's io with this class's attributes (``name``, ``mode`` "rb"; ``writable()``
    is False and every write raises io.UnsupportedOperation):

    - :class:`MemoryFile` (an io.BytesIO) for a file of at most SMALL_FILE_BYTES
      (1 MiB) whose CRC is checked at open, or of at most UNCHECKED_SMALL_FILE_BYTES
      (256 KiB) otherwise: read whole at open, the bytes checked are the bytes served,
      and a small read or seek costs what it costs on a built-in file;
    - :class:`StreamFile` (an io.BufferedReader) for a larger one: read with pread as
      it is read, through a STREAM_BUFFER_BYTES buffer, so memory does not grow with
      the file; each pread checks that the archive was not changed in place
      (ArchiveChangedError otherwise, never the new file's bytes, never a SIGBUS).

    Both follow io.BytesIO's rules: ``seek`` to a negative position is ValueError and
    a relative seek before the start goes to 0; reads past the end return b"";
    ``fileno()`` raises io.UnsupportedOperation (no descriptor of its own); a closed
    file raises ValueError.
    """

    __slots__ = ()
    mode = "rb"

    def writable(self) -> bool:
        """False: the file is read-only."""
        return False

    def write(self, data: object) -> NoReturn:
        """Refused: io.UnsupportedOperation."""
        raise io.UnsupportedOperation("write: a packfs file is read-only")

    def writelines(self, lines: object) -> NoReturn:
        """Refused: io.UnsupportedOperation."""
        raise io.UnsupportedOperation("writelines: a packfs file is read-only")

    def truncate(self, size: int | None = None) -> NoReturn:
        """Refused: io.UnsupportedOperation."""
        raise io.UnsupportedOperation("truncate: a packfs file is read-only")

    def __repr__(self) -> str:
        return f"<packfs.{type(self).__name__} name={self.name!r}>"  # type: ignore[attr-defined]


class MemoryFile(PackedFile, io.BytesIO):
    """A :class:`PackedFile` small enough to be read whole at open: its checked bytes,
    shared (not copied) by io.BytesIO, whose C methods serve every read and seek."""

    def __init__(self, data: bytes, name: str) -> None:
        super().__init__(data)
        self.name = name

    def getbuffer(self) -> memoryview:
        """A read-only view of the contents (io.BytesIO's would be writable)."""
        return memoryview(self.getvalue())

    def peek(self, size: int = 0) -> bytes:
        """Bytes from the position on, without moving it (as io.BufferedReader's:
        ``size`` or, if 0, a buffer's worth; b"" at the end)."""
        position = self.tell()
        return self.getvalue()[position: position + (size if size > 0 else io.DEFAULT_BUFFER_SIZE)]


class StreamFile(PackedFile, io.BufferedReader):
    """A :class:`PackedFile` too large to hold: io.BufferedReader (C) over the record's
    preads, with a STREAM_BUFFER_BYTES buffer."""

    def __init__(self, container: Container, start: int, end: int, name: str) -> None:
        super().__init__(_RecordReader(container, start, end, name), STREAM_BUFFER_BYTES)


class DecodedFile(PackedFile, io.BufferedReader):
    """A :class:`PackedFile` over a large file of an archive with codecs (format 1.5,
    section 4f) whose record is zstd frames or a sparse file's extents: io.BufferedReader
    over reads that decode only the frames (or read only the extents) they cover, so a
    seek and a small read of a 10 GiB file decodes one frame.  It holds at most one
    decoded frame besides the buffer.  Each read is the archive's
    :class:`~packfs.core.recordreader.RecordReader`'s: a frame checked against its own
    CRCs as it is decoded; a sparse file's record was checked at open under the policy."""

    def __init__(self, container: Container, reader: RecordReader, record: int, start: int, end: int, size: int,
                 row: CodecRow, layout: SparseLayout | None, name: str, where: object) -> None:
        super().__init__(_DecodedReader(container, reader, record, start, end, size, row, layout, name, where),
                         STREAM_BUFFER_BYTES)


class _RecordReader(io.RawIOBase):
    """StreamFile's raw file: preads of one record of the archive file, not copies out
    of its memory map, each followed by the check that the archive is unchanged."""

    def __init__(self, container: Container, start: int, end: int, name: str) -> None:
        super().__init__()
        self._container: Container | None = container
        self._start = start
        self._length = end - start
        self._position = 0
        self.name = name
        self.mode = "rb"

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readall(self) -> bytes:
        container = self._open_container()
        start = min(self._position, self._length)
        try:
            data = container.pread(self._start + start, self._start + self._length, self._start + self._length)
        except PackfsError:
            container.changed_instead()
            raise
        container.check_unchanged()
        self._position = start + len(data)
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        container = self._container  # _open_container, inlined: this is a StreamFile's refill
        if container is None or container.closed:
            container = self._open_container()  # raises
        # io.BufferedReader passes a memoryview of bytes: used as it is (a cast and two
        # context managers cost more than the pread).
        if type(buffer) is not memoryview or buffer.format != "B":
            buffer = memoryview(buffer).cast("B")
        start = self._position
        count = min(self._length - start, len(buffer))
        if count <= 0:
            return 0
        try:
            container.readinto(buffer if count == len(buffer) else buffer[:count], self._start + start,
                               self._start + self._length)
        except PackfsError:
            container.changed_instead()
            raise
        container.check_unchanged()
        self._position = start + count
        return count

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if self._container is None:
            self._check_closed()
        if whence == io.SEEK_SET:
            if offset < 0:
                raise ValueError(f"negative seek value {offset}")
            position = offset
        elif whence == io.SEEK_CUR:
            position = max(0, self._position + offset)  # as io.BytesIO
        elif whence == io.SEEK_END:
            position = max(0, self._length + offset)
        else:
            raise ValueError(f"invalid whence ({whence}, should be 0, 1 or 2)")
        self._position = position
        return position

    def tell(self) -> int:
        self._check_closed()
        return self._position

    def close(self) -> None:
        # A closed file must not keep the archive's descriptor open after its folder
        # is closed.
        self._container = None
        super().close()

    def _open_container(self) -> Container:
        self._check_closed()
        container = self._container
        if container is None or container.closed:
            raise ClosedArchiveError("I/O operation on a closed archive")
        return container

    def _check_closed(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")


class _DecodedReader(_RecordReader):
    """DecodedFile's raw file: a position in the decoded contents, each read served by
    the archive's RecordReader (the one decoder), with this file's last decoded frame."""

    def __init__(self, container: Container, reader: RecordReader, record: int, start: int, end: int, size: int,
                 row: CodecRow, layout: SparseLayout | None, name: str, where: object) -> None:
        super().__init__(container, start, end, name)
        self._length = size  # the decoded size: seeks and reads are in its terms
        self._end = end
        self._reader, self._record, self._row, self._layout, self._where = reader, record, row, layout, where
        self._recent: dict = {}  # the frame last decoded: BufferedReader refills in smaller steps

    def readall(self) -> bytes:
        check_in_memory(self._length - min(self._position, self._length), self.name)
        parts: list[bytes] = []
        while True:
            part = self.read(1 << 20)
            if not part:
                return b"".join(parts)
            parts.append(part)

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        container = self._open_container()
        buffer = memoryview(buffer).cast("B")
        begin = self._position
        stop = min(self._length, begin + len(buffer))
        if stop <= begin:
            return 0
        try:
            data = self._reader.read_range(self._record, self._start, self._end, self._length, self._row,
                                           self._where, begin, stop, self._recent, self._layout,  # type: ignore[arg-type]
                                           record_checked=True)
        except PackfsError:
            container.changed_instead()
            raise
        container.check_unchanged()
        count = len(data)
        buffer[:count] = data
        self._position = begin + count
        return count


class BatchOwner(Protocol):
    """What :func:`read_entries` asks of the archive it reads for (an :class:`Archive
    <packfs.core.Archive>`): its name for messages and a read that raises the error a
    bad record deserves.  Named here, since archive.py imports this module and this
    module does not import it back."""

    path: str

    def read(self, entry: int, offset: int = 0, size: int = -1) -> bytes:
        """Bytes of file ``entry``."""


def read_entries(archive: BatchOwner, table: PathTable, container: Container, entries: Sequence[int] | np.ndarray,
                 reader: RecordReader, codecs: CodecTable | None = None) -> Iterator[tuple[int, bytes]]:
    """Archive.read_batch's work, for its ``table`` and ``container`` (which it checks
    around this call): each record read here (a run of small ones joined), checked and
    decoded by ``reader``; with ``codecs`` (an archive with codecs, format 1.5) each
    file's row is checked with the rest of the batch."""
    import numpy as np

    entries = np.asarray(entries, dtype=np.int64)
    if not len(entries):
        return
    if entries.min() < 0 or entries.max() >= table.entry_count:
        raise NotAFileError(f"{archive.path!r}: entry {int(entries.max())} is not in the table")
    # Compared while still unsigned: a hostile record or size of 2**63 or more would
    # turn negative as int64, and a negative record indexes from the end.
    records = table.column("record")[entries]
    declared = table.column("size")[entries]
    refused = ((table.column("mode")[entries] & S_IFMT) != S_IFREG) | (records >= table.data_records)
    if codecs is None:  # a compressed file may be larger than the archive
        refused |= declared > container.file_size
    rows: list = []
    if not refused.any():
        records, sizes = records.astype(np.int64), declared.astype(np.int64)
        starts = container.offsets[records]
        ends = container.offsets[records + 1]  # a data record is never the last record
        mismatch = ends - starts != sizes
        if codecs is not None:  # only a stored record's length is its file's size (format 4f)
            coded = codecs.codec_column()[records] != CODEC_STORED
            mismatch &= ~coded
        refused = mismatch | (ends < starts) | (starts < container.data_start) | (ends > container.data_end)
        if codecs is not None and not refused.any():
            rows = [None] * len(entries)
            # Python ints once (a numpy scalar costs a conversion at every use).
            record_list, size_list, entry_list = records.tolist(), declared.tolist(), entries.tolist()
            lengths = (ends - starts).tolist()
            file_row = codecs.file_row
            for k in np.flatnonzero(coded).tolist():  # each row held to its rules (section 4f)
                rows[k] = file_row(record_list[k], size_list[k], lengths[k], entry_list[k])
    if refused.any():
        bad = int(entries[np.argmax(refused)])
        archive.read(bad)  # raises, naming the rule
        raise FormatError(f"{archive.path!r}: entry {bad}'s record is not a valid data record")
    order = np.argsort(starts, kind="stable")
    starts_list, ends_list, order_list = starts[order].tolist(), ends[order].tolist(), order.tolist()
    record_list = records.tolist()
    size_list, entry_list = declared.tolist(), entries.tolist()
    decode_whole = reader.decode_whole
    i, count = 0, len(order_list)
    while i < count:
        run_start, run_end, j = starts_list[i], ends_list[i], i + 1
        while j < count and starts_list[j] == run_end and ends_list[j] - run_start <= _BATCH_RUN_BYTES:
            run_end, j = ends_list[j], j + 1
        block = container.pread(run_start, run_end)
        # Unchanged after the read: the block, and every table value used above,
        # are the archive's as it was opened.
        container.check_unchanged()
        view = memoryview(block)
        for k in range(i, j):
            position = order_list[k]
            data = block if j == i + 1 else bytes(view[starts_list[k] - run_start : ends_list[k] - run_start])
            yield position, decode_whole(record_list[position], data, size_list[position],
                                         rows[position] if rows else None, entry_list[position])
        view.release()
        i = j


def read_spans(source: ByteSource, spans: Sequence[Tuple[int, int]]) -> Iterator[Tuple[range, List[bytes]]]:
    """The bytes of ``spans`` (sorted by start) from a source without a map, in groups:
    (the group's indexes into ``spans``, each one's bytes).  A group is as many
    consecutive spans as add up to a BATCH_GROUP_SHARE-th of the source's memory cap,
    fetched with one ``read_ranges`` call (neighbours share a ranged GET, many in
    flight), or read one by one from a source without ``read_ranges``."""
    limit = max(1, getattr(source, "memory_cap", 256 << 20) // BATCH_GROUP_SHARE)
    read_ranges = getattr(source, "read_ranges", None)
    first, count = 0, len(spans)
    while first < count:
        last, total = first + 1, spans[first][1] - spans[first][0]
        while last < count and total + spans[last][1] - spans[last][0] <= limit:
            total += spans[last][1] - spans[last][0]
            last += 1
        group = spans[first:last]
        contents = read_ranges(group) if read_ranges is not None else [source.read(start, end) for start, end in group]
        yield range(first, last), contents
        first = last
