"""External sorting for the table builder: rows sorted in runs held under a budget,
spilled to unnamed temporary files, and merged.

Temporary files are made with :func:`tempfile.TemporaryFile` in the output's directory:
on Linux they are ``O_TMPFILE`` files that never have a name, so a pack killed by any
signal (``kill -9`` included) leaves nothing behind; the space is returned when the
process's descriptors close.
"""

from __future__ import annotations

import heapq
import marshal
import tempfile
from typing import BinaryIO, Iterable, Iterator

import numpy as np

__all__ = ["RowRuns", "KeyedRuns", "gather", "ranges", "temporary_file"]

# Rows read back from a run at a time while merging (each run holds this many in memory).
_READ_BLOCK = 1024
# Runs merged at once: more are first merged into longer runs, this many at a time, so
# that the blocks held while merging are bounded whatever the number of rows.
FAN_IN = 128


def temporary_file(directory: str | None) -> BinaryIO:
    """An unnamed read-write temporary file in ``directory``."""
    return tempfile.TemporaryFile(dir=directory, prefix=".packfs-spill-")  # type: ignore[return-value]


class RowRuns:
    """Tuples sorted by their natural order, held ``run_rows`` at a time: a full run is
    sorted and spilled; :meth:`sorted` merges the runs.  Rows are plain tuples of
    bytes and integers (marshal writes and reads them at C speed)."""

    def __init__(self, directory: str | None, run_rows: int, run_bytes: int | None = None) -> None:
        self.directory = directory
        self.run_rows = max(1, run_rows)
        self.run_bytes = run_bytes  # a run also ends when the sizes given to add() reach this
        self.rows: list[tuple] = []
        self.runs: list[BinaryIO] = []
        self._held_bytes = 0

    def add(self, row: tuple, nbytes: int = 0) -> None:
        """Add ``row`` (holding about ``nbytes`` of strings); a full run is sorted and
        spilled."""
        self.rows.append(row)
        self._held_bytes += nbytes
        if len(self.rows) >= self.run_rows or (self.run_bytes is not None and self._held_bytes >= self.run_bytes):
            self._spill()

    def _spill(self) -> None:
        rows = self.rows
        rows.sort()
        self.rows = []
        self._held_bytes = 0
        self.runs.append(self._write_run(rows))

    def _write_run(self, rows: Iterable[tuple]) -> BinaryIO:
        run = temporary_file(self.directory)
        block: list[tuple] = []
        for row in rows:
            block.append(row)
            if len(block) >= _READ_BLOCK:
                _write_block(run, block)
                block = []
        _write_block(run, block)
        run.flush()
        return run

    def sorted(self) -> Iterator[tuple]:
        """Every row added, in order (once: the runs are consumed)."""
        if not self.runs:
            rows, self.rows = self.rows, []
            rows.sort(reverse=True)
            return _popped(rows)
        if self.rows:
            self._spill()
        while len(self.runs) > FAN_IN:
            merged = self._write_run(heapq.merge(*(_read_run(run) for run in self.runs[:FAN_IN])))
            self.runs = self.runs[FAN_IN:] + [merged]
        return heapq.merge(*(_read_run(run) for run in self.runs))

    def close(self) -> None:
        """Drop the runs."""
        for run in self.runs:
            run.close()
        self.runs = []
        self.rows = []


def _write_block(run: BinaryIO, block: list[tuple]) -> None:
    # Length-prefixed: marshal.load() from a file reads it a few bytes a call.
    if block:
        data = marshal.dumps(block)
        run.write(len(data).to_bytes(8, "little"))
        run.write(data)


def _popped(rows: list[tuple]) -> Iterator[tuple]:
    """``rows`` from the last one, each let go as it is given (the walk that takes them
    holds rows of its own)."""
    while rows:
        yield rows.pop()


def _read_run(run: BinaryIO) -> Iterator[tuple]:
    run.seek(0)
    try:
        while True:
            length = run.read(8)
            if not length:
                return
            yield from marshal.loads(run.read(int.from_bytes(length, "little")))
    finally:
        run.close()


class KeyedRuns:
    """Fixed-size rows (a numpy structured dtype) with a uint64 sort key each, and
    optionally a byte string each, sorted in runs held under ``run_rows`` rows and merged
    block by block with numpy: no Python work per row.  Keys must be unique."""

    def __init__(self, directory: str | None, dtype: np.dtype, run_rows: int, with_bytes: bool = False) -> None:
        self.directory = directory
        self.dtype = np.dtype(dtype)
        self.run_rows = max(1, run_rows)
        self.with_bytes = with_bytes
        self._held: list[tuple[np.ndarray, np.ndarray, np.ndarray, bytes]] = []
        self._held_rows = 0
        self._held_bytes = 0
        # Gathering a run's strings takes an 8-byte index a byte: runs end at this many.
        self.run_bytes = max(1 << 16, self.run_rows * 32)
        self.runs: list[tuple[BinaryIO, int, int]] = []  # (file, rows, bytes)

    def add(self, keys: np.ndarray, rows: np.ndarray, lengths: np.ndarray | None = None, data: bytes = b"") -> None:
        """Add rows with ``keys`` (and, with bytes, each row's ``lengths`` of ``data``)."""
        lengths = np.zeros(len(keys), np.int64) if lengths is None else lengths.astype(np.int64)
        self._held.append((keys.astype(np.uint64), rows.astype(self.dtype), lengths, data))
        self._held_rows += len(keys)
        self._held_bytes += len(data)
        if self._held_rows >= self.run_rows or self._held_bytes >= self.run_bytes:
            self._spill()

    def _take_held(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        keys = np.concatenate([held[0] for held in self._held])
        rows = np.concatenate([held[1] for held in self._held])
        lengths = np.concatenate([held[2] for held in self._held])
        data = np.frombuffer(b"".join(held[3] for held in self._held), np.uint8)
        self._held, self._held_rows, self._held_bytes = [], 0, 0
        order = np.argsort(keys, kind="stable")
        return _gathered(keys, rows, lengths, data, order)

    def _spill(self) -> None:
        if not self._held:
            return
        keys, rows, lengths, data = self._take_held()
        run = temporary_file(self.directory)
        # One file a run: keys, then rows, then lengths, then the bytes.
        for array in (keys, rows, lengths, data):
            run.write(np.ascontiguousarray(array).data.cast("B"))
        run.flush()
        self.runs.append((run, len(keys), len(data)))

    def merged(self, block_rows: int = 1 << 16) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """(keys, rows, lengths, bytes) blocks of every row added, in key order."""
        if not self.runs:
            if self._held:
                yield self._take_held()
            return
        self._spill()
        # The blocks held, one a run, fit in what one run takes.
        block_rows = max(256, min(block_rows, self.run_rows // (2 * len(self.runs))))
        readers = [_RunReader(run, count, nbytes, self.dtype, block_rows) for run, count, nbytes in self.runs]
        self.runs = []
        try:
            while True:
                live = [reader for reader in readers if reader.ensure()]
                if not live:
                    return
                # Every row up to the smallest of the blocks' last keys can be output:
                # no run has a smaller key still unread.
                limit = min(reader.keys[-1] for reader in live)
                parts = [reader.take_until(limit) for reader in live]
                keys = np.concatenate([part[0] for part in parts])
                rows = np.concatenate([part[1] for part in parts])
                lengths = np.concatenate([part[2] for part in parts])
                data = np.concatenate([part[3] for part in parts])
                yield _gathered(keys, rows, lengths, data, np.argsort(keys, kind="stable"))
        finally:
            for reader in readers:
                reader.close()

    def close(self) -> None:
        """Drop the runs."""
        for run, _, _ in self.runs:
            run.close()
        self.runs = []
        self._held = []


def _gathered(keys: np.ndarray, rows: np.ndarray, lengths: np.ndarray, data: np.ndarray,
              order: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows (and their byte strings) in ``order``."""
    starts = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    lengths = lengths[order]
    if len(data):
        data = gather(data, starts[:-1][order], lengths)
    return keys[order], rows[order], lengths, data


def gather(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The slices [start, start + length) of ``data``, concatenated."""
    if len(starts) <= 64 or int(lengths.sum()) > 64 * len(starts):
        # Few or long slices (the paths of a deep tree): copied whole, not indexed a byte at a time.
        return np.concatenate([data[start : start + length] for start, length in
                               zip(starts.tolist(), lengths.tolist())] or [data[:0]])
    return data[ranges(starts, lengths)]


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indexes start .. start + length - 1 of each (start, length), concatenated."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    ends = np.cumsum(lengths)
    nonempty = lengths > 0
    steps = np.ones(total, np.int64)
    firsts = (ends - lengths)[nonempty]
    steps[firsts[1:]] = starts[nonempty][1:] - (starts[nonempty][:-1] + lengths[nonempty][:-1] - 1)
    steps[0] = starts[nonempty][0]
    return np.cumsum(steps)


class _RunReader:
    """Reads one spilled KeyedRuns run a block at a time."""

    def __init__(self, run: BinaryIO, count: int, nbytes: int, dtype: np.dtype, block_rows: int) -> None:
        self.run, self.count, self.dtype, self.block_rows = run, count, dtype, block_rows
        self.keys_at = 0
        self.rows_at = 8 * count
        self.lengths_at = self.rows_at + dtype.itemsize * count
        self.data_at = self.lengths_at + 8 * count
        self.next_row = 0  # the first row not yet read
        self.next_byte = 0
        self.keys = np.zeros(0, np.uint64)
        self.rows = np.zeros(0, dtype)
        self.lengths = np.zeros(0, np.int64)
        self.data = np.zeros(0, np.uint8)

    def _read(self, at: int, nbytes: int) -> bytes:
        self.run.seek(at)
        return self.run.read(nbytes)

    def ensure(self) -> bool:
        """Whether rows are held (a new block read if none are)."""
        if len(self.keys):
            return True
        if self.next_row >= self.count:
            return False
        first, n = self.next_row, min(self.block_rows, self.count - self.next_row)
        self.keys = np.frombuffer(self._read(self.keys_at + 8 * first, 8 * n), np.uint64)
        size = self.dtype.itemsize
        self.rows = np.frombuffer(self._read(self.rows_at + size * first, size * n), self.dtype)
        self.lengths = np.frombuffer(self._read(self.lengths_at + 8 * first, 8 * n), np.int64)
        nbytes = int(self.lengths.sum())
        self.data = np.frombuffer(self._read(self.data_at + self.next_byte, nbytes), np.uint8)
        self.next_row += n
        self.next_byte += nbytes
        return True

    def take_until(self, limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The held rows whose key is at most ``limit``, no longer held."""
        cut = int(np.searchsorted(self.keys, np.uint64(limit), "right"))
        cut_bytes = int(self.lengths[:cut].sum())
        part = (self.keys[:cut], self.rows[:cut], self.lengths[:cut], self.data[:cut_bytes])
        self.keys, self.rows, self.lengths = self.keys[cut:], self.rows[cut:], self.lengths[cut:]
        self.data = self.data[cut_bytes:]
        return part

    def close(self) -> None:
        self.run.close()
