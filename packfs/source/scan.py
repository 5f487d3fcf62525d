"""A whole-archive scan of a source without a map (an archive at a URL): its bytes read
once, in order, in large windows, the next one fetched while the last is used.

Verify reads record after record.  Without a disk cache, each record was a request of
its own (a 10 KB file: one GET), and each piece of a large record another; with this,
a scan is a GET per ``part_bytes`` of the source (8 MiB, in parallel within a window),
each byte fetched once.  Memory stays bounded: two windows at most (the one read and
the one fetched ahead), each at most an eighth of the source's ``memory_cap``.

A scan serves reads in order; one that starts before the window in hand (out of order)
is read from the source directly, correct and only slower, and one that skips past
the window fetched ahead starts the windows again from where it reads.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterator, Optional, Tuple

from ..format import crc32

__all__ = ["SequentialScan", "SCAN_WINDOW"]

# The most a window holds: 4 of RemoteFile's 8 MiB parts, fetched in parallel.
SCAN_WINDOW = 32 << 20


class SequentialScan:
    """Bytes [start, end) of ``source`` served in order from windows of up to ``window``
    bytes, each filled with one ``readinto`` (a remote source's parallel ranged parts),
    the next filled on a thread while the current one is read.  A read behind the
    window in hand is sent to the source as it is; one past the window fetched ahead
    starts the windows again from there.  One reader at a time (a lock keeps threads
    from mixing windows)."""

    def __init__(self, source, start: int, end: int, window: Optional[int] = None) -> None:
        self.source = source
        cap = getattr(source, "memory_cap", 8 * SCAN_WINDOW)
        self.window = max(1 << 20, min(SCAN_WINDOW, cap // 8)) if window is None else max(1, window)
        self.end = end
        # Bytes from suffix_start on are in memory (a remote source's open fetched them):
        # a window never straddles that point, so none of them is fetched again.
        self._cut = getattr(source, "suffix_start", end)
        self._current: Tuple[int, int, memoryview] = (start, start, memoryview(b""))
        self._ahead: Optional[Tuple[int, int, Future]] = None
        self._pool: Optional[ThreadPoolExecutor] = None
        self._lock = threading.RLock()

    def _span(self, first: int) -> Tuple[int, int]:
        return first, min(self.end, first + self.window, self._cut if first < self._cut else self.end)

    def _fill(self, first: int, stop: int) -> memoryview:
        buffer = memoryview(bytearray(stop - first))
        if getattr(self.source, "reads_ahead", False):
            # The window is the source's read ahead: nothing past it is fetched for it.
            self.source.readinto(buffer, first, stop)
        else:
            self.source.readinto(buffer, first)
        return buffer

    def _advance(self, position: int) -> bool:
        """Make a window holding ``position`` current: the one fetched ahead when it
        holds it, else one starting there; False past the scan's end."""
        if position >= self.end:
            return False
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] <= position < ahead[1]:
            first, stop, buffer = ahead[0], ahead[1], ahead[2].result()
        else:
            first, stop = self._span(position)
            buffer = self._fill(first, stop)
        self._current = (first, stop, buffer)
        if stop < self.end:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="packfs-scan")
            following = self._span(stop)
            self._ahead = (following[0], following[1], self._pool.submit(self._fill, *following))
        return True

    def pieces(self, start: int, end: int) -> Iterator[memoryview]:
        """The bytes [start, end) as views, in order (valid until the next call)."""
        position = start
        while position < end:
            with self._lock:
                first, stop, buffer = self._current
                if position < first or (position >= stop and not self._advance(position)):
                    inside = False
                else:
                    inside = True
                    first, stop, buffer = self._current
            if not inside:  # behind the scan, or past its end: read as asked
                yield memoryview(self.source.read(position, end))
                return
            upto = min(end, stop)
            yield buffer[position - first:upto - first]
            position = upto

    def read(self, start: int, end: int, limit: Optional[int] = None) -> bytes:
        """Bytes [start, end), as a source's ``read`` (``limit`` is not needed: the scan
        reads ahead within its own bounds)."""
        views = list(self.pieces(start, end))
        return bytes(views[0]) if len(views) == 1 else b"".join(views)

    def readinto(self, buffer: memoryview, start: int, limit: Optional[int] = None) -> None:
        """Fill ``buffer`` with the bytes from ``start`` on, as :meth:`read`."""
        target = buffer.cast("B") if buffer.format != "B" else buffer
        at = 0
        for view in self.pieces(start, start + len(target)):
            target[at:at + len(view)] = view
            at += len(view)

    def crc(self, start: int, end: int, progress: Optional[Callable[[int], None]] = None, value: int = 0) -> int:
        """CRC-32 of bytes [start, end), continuing ``value``; ``progress`` called with
        byte counts as they are checked."""
        for piece in self.pieces(start, end):
            value = crc32(piece, value)
            if progress is not None:
                progress(len(piece))
        return value

    def close(self) -> None:
        """Drop the windows; a fetch ahead in flight finishes unread."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
        with self._lock:
            self._ahead = None
            self._current = (0, 0, memoryview(b""))

    def __enter__(self) -> "SequentialScan":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
