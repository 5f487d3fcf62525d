"""Reading files of an archive in more than one call: a file object over one record,
and a batch of records read in archive order."""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Iterator, Sequence

if TYPE_CHECKING:
    import numpy as np

    from .archive import Archive
    from .pathtable import PathTable

from ..errors import ClosedArchiveError, FormatError, NotAFileError
from ..format import S_IFMT, S_IFREG, crc32
from .container import Container

__all__ = ["PackedFile", "read_entries"]

# A batch read joins adjacent files into one pread while the run stays this small
# (packfs.dataset): that saves a system call per small file, but a large run is one
# large allocation, faulted in page by page and then copied again into the files'
# own bytes objects, which cost more than the calls saved (bench/dataloader.py).
_BATCH_RUN_BYTES = 64 << 10


class PackedFile(io.RawIOBase):
    """A read-only, seekable binary file over one record of an archive.

    Reads are preads of the archive file, not copies out of its memory map: an archive
    overwritten or truncated in place while the file is open gives ArchiveChangedError
    (a FormatError), never a SIGBUS, and never the new file's bytes.
    """

    def __init__(self, container: Container, start: int, end: int, name: str) -> None:
        super().__init__()
        self._container: Container | None = container
        self._start = start
        self._length = end - start
        self._position = 0
        self.name = name

    def readable(self) -> bool:
        """True: the file can be read."""
        return True

    def seekable(self) -> bool:
        """True: the file can seek."""
        return True

    def _span(self, size: int | None) -> tuple[int, int]:
        start = self._position
        end = self._length if size is None or size < 0 else min(self._length, start + size)
        return start, end

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes from the position (all that is left with -1 or None)."""
        container = self._open_container()
        start, end = self._span(size)
        if end <= start:
            return b""
        data = container.pread(self._start + start, self._start + end)
        container.check_unchanged()
        self._position = end
        return data

    def readall(self) -> bytes:
        """Everything from the position to the end."""
        return self.read(-1)

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        """Read into ``buffer``; return how many bytes were read."""
        container = self._open_container()
        with memoryview(buffer) as raw, raw.cast("B") as target:
            start, end = self._span(len(target))
            if end <= start:
                return 0
            container.source.readinto(target[: end - start], self._start + start)
        container.check_unchanged()
        self._position = end
        return end - start

    def readline(self, size: int | None = -1) -> bytes:
        """Bytes up to and including the next newline (at most ``size``)."""
        container = self._open_container()
        start, limit = self._span(size)
        parts, position = [], start
        while position < limit:
            chunk = container.pread(self._start + position, self._start + min(limit, position + 8192))
            newline = chunk.find(b"\n")
            if newline >= 0:
                parts.append(chunk[: newline + 1])
                position += newline + 1
                break
            parts.append(chunk)
            position += len(chunk)
        container.check_unchanged()
        self._position = position
        return b"".join(parts)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move to ``offset`` (from the start, the position or the end); return the position."""
        self._check_closed()
        if whence == io.SEEK_SET:
            position = offset
        elif whence == io.SEEK_CUR:
            position = self._position + offset
        elif whence == io.SEEK_END:
            position = self._length + offset
        else:
            raise ValueError(f"invalid whence {whence!r}")
        if position < 0:
            raise ValueError(f"negative seek position {position}")
        self._position = position
        return position

    def tell(self) -> int:
        """The position."""
        self._check_closed()
        return self._position

    def close(self) -> None:
        # A closed file must not keep the archive's descriptor open after its folder
        # is closed.
        """Close the file (the archive stays open); later reads raise ValueError."""
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



def read_entries(archive: Archive, table: PathTable, container: Container,
                 entries: Sequence[int] | np.ndarray) -> Iterator[tuple[int, bytes]]:
    """Archive.read_batch's work, for its ``table`` and ``container`` (which it checks
    around this call)."""
    import numpy as np

    entries = np.asarray(entries, dtype=np.int64)
    if not len(entries):
        return
    if entries.min() < 0 or entries.max() >= table.entry_count:
        raise NotAFileError(f"{archive.path!r}: entry {int(entries.max())} is not in the table")
    # Compared while still unsigned: a hostile record or size of 2**63 or more would
    # turn negative as int64, and a negative record indexes from the end.
    records = table.column("record")[entries]
    sizes = table.column("size")[entries]
    refused = (((table.column("mode")[entries] & S_IFMT) != S_IFREG) | (records >= table.data_records)
               | (sizes > container.file_size))
    if not refused.any():
        records, sizes = records.astype(np.int64), sizes.astype(np.int64)
        starts = container.offsets[records]
        ends = container.offsets[records + 1]  # a data record is never the last record
        refused = ((ends - starts != sizes) | (ends < starts) | (starts < container.data_start)
                   | (ends > container.data_end))
    if refused.any():
        bad = int(entries[np.argmax(refused)])
        archive.read(bad)  # raises, naming the rule
        raise FormatError(f"{archive.path!r}: entry {bad}'s record is not a valid data record")
    order = np.argsort(starts, kind="stable")
    starts_list, ends_list, order_list = starts[order].tolist(), ends[order].tolist(), order.tolist()
    # Checked under "once" as under "always": a batch reads its records whole, so a
    # check costs only the CRC.
    stored = container.crcs[records].tolist() if archive.checksums != "never" else None
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
            if stored is not None and crc32(data) != stored[position]:
                container.check_crc(int(records[position]), data,
                                    repr(os.fsdecode(table.full_path(int(entries[position])))))
            yield position, data
        view.release()
        i = j

