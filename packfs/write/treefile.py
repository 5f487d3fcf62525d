"""Reading a file of the tree being packed so that the bytes stored are one state of
it: the fstat before the read must equal the fstat after it, a file whose ctime is too
recent for that to prove anything is read twice, and a file that changed is read again
(what GNU tar reports as "file changed as we read it", except that nothing torn is
stored).  Used by :mod:`packfs.write.pack` (one process) and :mod:`packfs.write.parallel`
(worker processes, ``-j N``) alike.
"""

from __future__ import annotations

import errno
import os
import stat as stat_module
import time
from typing import Callable, Protocol

from ..errors import PackError
from ..format import crc32
from .scan import open_beneath

__all__ = ["CannotPack", "FileSink", "TreeFile", "read_stable"]


# A file that changed while it was read is read again, from its start, its record cut
# back; after this many reads that each saw it change, it is not packed.
_READ_ATTEMPTS = 3
# How recent a file's ctime must be for an unchanged stat to prove nothing.  A write is
# stamped with the kernel's coarse clock (up to a tick behind: 10 ms at HZ=100),
# truncated to the file system's granularity (1 ns on ext4, xfs, btrfs and tmpfs; whole
# seconds on Lustre and on ext4 with 128-byte inodes; 2 s on FAT), so a write during the
# read may carry the stamp of the write just before it, and leave the stat as it was.
_FINE_STAMPS_WINDOW_NS = 50_000_000
_SECOND_STAMPS_WINDOW_NS = 3_000_000_000


def _stamps_may_hide_a_write(info: os.stat_result, started_ns: int) -> bool:
    """Whether ``info``, taken at ``started_ns``, is too recent a change for an
    unchanged stat after the read to prove that nothing was written during it."""
    whole_seconds = info.st_ctime_ns % 1_000_000_000 == 0
    window = _SECOND_STAMPS_WINDOW_NS if whole_seconds else _FINE_STAMPS_WINDOW_NS
    return info.st_ctime_ns >= started_ns - window


def _stat_change(before: os.stat_result, after: os.stat_result, copied: int) -> str | None:
    """How the file changed between two fstat calls around a read of ``copied`` bytes,
    or None.  (Its identity cannot change: both come from one descriptor.)"""
    if not before.st_size == copied == after.st_size:
        return f"{before.st_size} bytes before the read, {copied} read, {after.st_size} after it"
    if after.st_mtime_ns != before.st_mtime_ns:
        return "its mtime changed during the read"
    if after.st_ctime_ns != before.st_ctime_ns:
        return "its ctime changed during the read"
    return None


class FileSink(Protocol):
    """Where :func:`read_stable` copies a file: a record of the archive, begun per read."""

    def begin(self, expected: int) -> None:
        """A read of a file of ``expected`` bytes (its fstat) begins."""

    def write(self, data: memoryview) -> None:
        """The next bytes read."""

    @property
    def crc(self) -> int:
        """The CRC-32 of the bytes written since :meth:`begin`."""

    def discard(self) -> None:
        """Forget the bytes written since :meth:`begin`: the read is repeated or given up."""


def read_stable(source: TreeFile, sink: FileSink, buffer: bytearray,
                on_bytes: Callable[[int], None] | None = None) -> tuple[int, os.stat_result, bool]:
    """Copy the opened ``source`` into ``sink`` so that the bytes are one state of the
    file, read again while it changes; return (size, the stat of that state, whether
    it changed while read).  A file that kept changing raises CannotPack, the sink's
    bytes discarded."""
    change = None
    for attempt in range(1, _READ_ATTEMPTS + 1):
        before, started = source.state()
        sink.begin(before.st_size)
        try:
            size = _copy(source, before.st_size, sink, buffer, on_bytes)
            change = source.change(before, size)
            if change is None and _stamps_may_hide_a_write(before, started):
                change = source.second_read_change(before, sink.crc, size, buffer)
        except CannotPack:
            sink.discard()
            raise
        if change is None:
            return size, before, attempt > 1
        sink.discard()
    raise CannotPack(source.path, f"kept changing while it was read ({_READ_ATTEMPTS} reads; "
                                   f"the last: {change})")


def _copy(source: TreeFile, expected: int, sink: FileSink, buffer: bytearray,
          on_bytes: Callable[[int], None] | None) -> int:
    """Copy ``source`` from its start into ``sink``; return the bytes copied.  At most
    one byte past ``expected`` is read: that one already says the file changed, and a
    file growing as fast as it is read would never end."""
    view = memoryview(buffer)
    copied = 0
    while True:
        got = source.read_at(view[: min(len(view), expected + 1 - copied)], copied)
        if not got:
            return copied
        sink.write(view[:got])
        copied += got
        if on_bytes is not None:
            on_bytes(got)


# A file with more data extents than this is stored whole (the list is held while written).
MAX_EXTENTS = 1 << 16


class CannotPack(PackError):
    """A file of the tree cannot be packed: ``path`` and ``reason``."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path!r}: {reason}")
        self.path = path
        self.reason = reason


class TreeFile:
    """A regular file of the tree being packed, opened when its entry is written.

    Its bytes and the attributes stored with them come from one descriptor, and the
    fstat before the read must equal the fstat after it (size, mtime, ctime), or the
    read is repeated: what GNU tar reports as "file changed as we read it", except that
    nothing torn is stored."""

    kind = "file"

    def __init__(self, root: bytes, key: bytes, scanned: os.stat_result,
                 xattrs: dict[bytes, bytes] | None = None, index: int = -1) -> None:
        self.index = index  # in the scan's list: where a worker process reports it (-j N)
        self.root = root
        self.key = key
        self.scanned = scanned
        self.xattrs = xattrs  # read by the scan, with the file's other metadata
        self._fd = -1
        self._opened: tuple[os.stat_result, int] | None = None  # open's fstat: the first read's "before"

    @property
    def path(self) -> str:
        """The file's path, for messages (made when one needs it: most files need none)."""
        return os.fsdecode(self.root + b"/" + self.key)

    def open(self) -> None:
        """Open the file; CannotPack says why it cannot be packed."""
        # O_NONBLOCK: if the file was swapped for a FIFO since the scan, open must not hang.
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
        try:
            self._fd = open_beneath(self.root, self.key, flags)
        except FileNotFoundError:
            raise CannotPack(self.path, "vanished while packing") from None
        except OSError as error:
            raise CannotPack(self.path, f"cannot open: {error.strerror}") from None
        started = time.time_ns()
        info = os.fstat(self._fd)
        if not stat_module.S_ISREG(info.st_mode):
            self.close()
            raise CannotPack(self.path, "no longer a regular file")
        scanned = self.scanned
        if scanned.st_nlink > 1 and (info.st_dev, info.st_ino) != (scanned.st_dev, scanned.st_ino):
            # Its other names in the tree are stored as hard links to what this one holds.
            self.close()
            raise CannotPack(self.path, "replaced while packing, and it has hard links")
        self._opened = info, started

    def state(self) -> tuple[os.stat_result, int]:
        """The file's stat before a read, and the time it was taken."""
        if self._opened is not None:  # nothing was read since open's fstat: it serves
            opened, self._opened = self._opened, None
            return opened
        started = time.time_ns()
        return os.fstat(self._fd), started

    def reset_state(self, before: tuple[os.stat_result, int]) -> None:
        """Give ``before`` (what :meth:`state` returned, nothing read since) to the next
        :meth:`state`, as if it had not been taken."""
        self._opened = before

    def data_extents(self, size: int) -> list[tuple[int, int]] | None:
        """The file's data extents in its first ``size`` bytes, as (offset, length),
        found with SEEK_DATA and SEEK_HOLE; None where the file system cannot say, or
        when there are more than MAX_EXTENTS."""
        extents: list[tuple[int, int]] = []
        offset = 0
        try:
            while offset < size:
                try:
                    start = os.lseek(self._fd, offset, os.SEEK_DATA)
                except OSError as error:
                    if error.errno == errno.ENXIO:  # nothing but a hole to the end
                        break
                    raise
                if start >= size:
                    break
                end = min(os.lseek(self._fd, start, os.SEEK_HOLE), size)
                extents.append((start, end - start))
                if len(extents) > MAX_EXTENTS:
                    return None
                offset = end
        except OSError:
            return None
        return extents

    def read_exactly(self, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` (fewer only at the end of the file)."""
        try:
            return os.pread(self._fd, length, offset)
        except OSError as error:
            raise CannotPack(self.path, f"cannot read: {error.strerror}") from None

    def read_at(self, buffer: memoryview, offset: int) -> int:
        """Read into ``buffer`` from ``offset``; return the bytes read (0 at the end)."""
        try:
            return os.preadv(self._fd, [buffer], offset)
        except OSError as error:
            raise CannotPack(self.path, f"cannot read: {error.strerror}") from None

    def change(self, before: os.stat_result, copied: int) -> str | None:
        """How the file changed since ``before`` (a read of ``copied`` bytes), or None."""
        return _stat_change(before, os.fstat(self._fd), copied)

    def second_read_change(self, before: os.stat_result, crc: int, size: int, buffer: bytearray) -> str | None:
        """Read the file again: None if it gives the same ``size`` bytes with CRC ``crc``
        and the stat is still ``before``, else how it changed."""
        view = memoryview(buffer)
        again, offset = 0, 0
        while offset <= size:
            got = self.read_at(view[: min(len(view), size + 1 - offset)], offset)
            if not got:
                break
            again = crc32(view[:got], again)
            offset += got
        if offset != size or again != crc:
            return "a second read gave other bytes"
        return self.change(before, offset)

    def close(self) -> None:
        """Close the file (if open)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
