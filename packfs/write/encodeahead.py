"""``pack -j N`` with format 1.5's codecs: the tree's files read and compressed ahead
of the writer on N threads.

Compressed records have sizes the scan cannot know, so -j's worker processes, which
write each file at the offset its scanned size gives, cannot place them.  Compression
is what costs, though, and zstd (python-zstandard) and the reads release the GIL, so
threads share it out: each reads a file whole (as read_stable reads, so a file that
changes is read again) and encodes it with :meth:`RecordEncoder.encode`; the packer
takes the results in scan order and writes them, deciding dedup as it goes.  The
archive has the same bytes whatever N.

What is held ahead is bounded: files of at most ``AHEAD_FILE_MAX`` bytes (larger ones
are streamed by the packer, frame by frame), at most ``4 N`` of them and
``AHEAD_BYTES`` in all.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

from .encode import Encoded, RecordEncoder, may_have_holes
from .scan import Scanned
from .treefile import TreeFile, read_stable

__all__ = ["EncodeAhead", "AHEAD_FILE_MAX", "AHEAD_BYTES"]

AHEAD_FILE_MAX = 4 << 20
AHEAD_BYTES = 64 << 20
_BUFFER = 1 << 20


class _MemorySink:
    """read_stable's sink for a file read whole into memory."""

    def __init__(self) -> None:
        self.data = bytearray()

    def begin(self, expected: int) -> None:
        self.data.clear()

    def write(self, data: memoryview) -> None:
        self.data += data

    @property
    def crc(self) -> int:
        from ..format import crc32

        return crc32(self.data)

    def discard(self) -> None:
        self.data.clear()


class EncodeAhead:
    """Reads and encodes the files of ``items`` (a scan of ``root``) ahead of the
    packer, on ``threads`` threads.  A context manager: leaving it stops the threads."""

    def __init__(self, encoder: RecordEncoder, root: bytes, items: Sequence[Scanned], threads: int,
                 kind_of) -> None:
        self._encoder = encoder
        self._root = root
        self._items = items
        self._kind_of = kind_of
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="packfs-encode")
        self._window = 4 * threads
        self._futures: dict[int, tuple[Future, int]] = {}
        self._held_bytes = 0
        self._next = 0
        self._local = threading.local()

    def __enter__(self) -> EncodeAhead:
        self._encoder.frame_pool = self._pool  # a large file's frames, compressed at once
        return self

    def __exit__(self, *exc: object) -> None:
        self._encoder.frame_pool = None
        for future, _ in self._futures.values():
            future.cancel()
        self._pool.shutdown(wait=True)
        self._futures.clear()

    def take(self, source: TreeFile) -> tuple[Encoded, os.stat_result, bool] | None:
        """``source`` read and encoded: (encoded, its stat, whether it changed while
        read), or None when it is not read ahead (the packer streams it); CannotPack
        if it cannot be packed."""
        self._fill(source.index)
        found = self._futures.pop(source.index, None)
        if found is None:
            return None
        future, size = found
        self._held_bytes -= size
        try:
            return future.result()
        finally:
            self._fill(source.index + 1)

    def _fill(self, at: int) -> None:
        self._next = max(self._next, at)
        items = self._items
        while (self._next < len(items) and len(self._futures) < self._window
               and self._held_bytes < AHEAD_BYTES):
            index = self._next
            self._next += 1
            item = items[index]
            if item.kind != "file" or not _ahead(item.info):
                continue
            size = item.info.st_size
            self._futures[index] = (self._pool.submit(self._read_and_encode, index), size)
            self._held_bytes += size

    def _read_and_encode(self, index: int) -> tuple[Encoded, os.stat_result, bool]:
        item = self._items[index]
        source = TreeFile(self._root, item.key, item.info, item.xattrs, index)
        buffer = getattr(self._local, "buffer", None)
        if buffer is None:
            buffer = self._local.buffer = bytearray(_BUFFER)
        sink = _MemorySink()
        source.open()
        try:
            _, info, changed = read_stable(source, sink, buffer)
        finally:
            source.close()
        return self._encoder.encode(bytes(sink.data), self._kind_of(item.key)), info, changed


def _ahead(info: os.stat_result) -> bool:
    """Whether a file is read ahead: small, and not one that may have holes (those are
    the packer's, which looks for them)."""
    return info.st_size <= AHEAD_FILE_MAX and not may_have_holes(info)
