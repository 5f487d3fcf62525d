"""Packing a directory on every core (``packfs pack -j N``).

The scan fixes the order of the records, so the place of each in the archive follows
from the scanned sizes.  Worker processes read the files, chunk by chunk, each into its
place in the output (pwrite), and report its CRCs and stat; the packer takes the
reports in order and counts each record where -j 1 would have written it: the same
bytes whatever N.  A file whose size is not the scanned one any more, or that cannot
be read, moves every record after it: those are then copied into their places, from a
copy of the rest of the output and the workers' side files (rare: a tree that changes
while packed).
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from array import array
from typing import BinaryIO, Callable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from ..errors import PackError
from ..format import PIECE_SIZE, crc32
from .container import ContainerWriter, carry_piece_crcs
from .scan import Scanned
from .treefile import CannotPack, TreeFile, read_stable
from .workers import Workers

__all__ = ["FileStamp", "Placer", "files_on_workers"]

_CHUNK = 1 << 20  # a worker's read buffer

# A chunk (what a worker is given at a time) ends after this many files or bytes.
_CHUNK_FILES = 64
_CHUNK_BYTES = 8 << 20


def _layout(items: Sequence[Scanned], start: int) -> tuple[array, list[tuple[int, int]], array]:
    """Where each file and symlink of ``items`` goes if its scanned size holds (the
    records begin at ``start``), the chunks of ``items`` to read, and where each
    chunk's places end."""
    offsets = array("q", bytes(8 * len(items)))
    chunks: list[tuple[int, int]] = []
    ends = array("q")
    position, chunk_start, chunk_files, chunk_bytes = start, 0, 0, 0
    for index, item in enumerate(items):
        if item.kind == "file":
            offsets[index] = position
            position += item.info.st_size
            chunk_files += 1
            chunk_bytes += item.info.st_size
            if chunk_files >= _CHUNK_FILES or chunk_bytes >= _CHUNK_BYTES:
                chunks.append((chunk_start, index + 1))
                ends.append(position)
                chunk_start, chunk_files, chunk_bytes = index + 1, 0, 0
        elif item.kind == "symlink":
            offsets[index] = position
            position += len(item.target or b"")
    if chunk_start < len(items):
        chunks.append((chunk_start, len(items)))
        ends.append(position)
    return offsets, chunks, ends


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


class _PlaceSink:
    """A worker's sink: a file's bytes written at its place in the output when its size
    is the scanned one, else appended to the worker's side file; with the record's CRC
    and, past PIECE_SIZE, its piece CRCs (format section 4b).  Bytes for adjacent places
    are gathered and written together (one pwrite per chunk of small files, not one per
    file: writes to one file from several processes take turns on its lock)."""

    def __init__(self, out_fd: int, side_fd: int) -> None:
        self._out_fd, self._side_fd = out_fd, side_fd
        self._shift = 0
        self._side_end = 0
        self._offset = self._scanned = 0
        self._in_place = True
        self._base = self._written = self._crc = self._piece_crc = 0
        self._pieces: list[int] = []
        self._gathered = bytearray()
        self._gathered_at = 0

    def put(self, data: memoryview | bytes, offset: int) -> None:
        """Write ``data`` at ``offset`` of the output (by :meth:`flush` at the latest)."""
        gathered = self._gathered
        if gathered and offset == self._gathered_at + len(gathered) and len(gathered) + len(data) <= _CHUNK_BYTES:
            gathered += data
            return
        self.flush()
        if len(data) >= _CHUNK:
            _pwrite_all(self._out_fd, memoryview(data), offset - self._shift)
        else:
            self._gathered_at = offset
            gathered += data

    def target(self, fd: int, shift: int) -> None:
        """Write what :meth:`put` is given from now on to ``fd``, ``shift`` bytes before
        the place given (the output, or the copy of its end once records moved)."""
        self.flush()
        self._out_fd, self._shift = fd, shift

    def flush(self) -> None:
        """Write what :meth:`put` gathered."""
        if self._gathered:
            _pwrite_all(self._out_fd, memoryview(self._gathered), self._gathered_at - self._shift)
            del self._gathered[:]

    def place(self, offset: int, scanned_size: int) -> None:
        """The next file's place and scanned size."""
        self._offset, self._scanned = offset, scanned_size

    def begin(self, expected: int) -> None:
        self._in_place = expected == self._scanned
        self._base = self._offset if self._in_place else self._side_end
        self._written = self._crc = self._piece_crc = 0
        self._pieces = []

    def write(self, data: memoryview) -> None:
        if self._in_place:  # past the scanned size (the file grew): the read is repeated
            room = self._scanned - self._written
            if room > 0:  # a read repeated overwrites the same place
                self.put(data[:room], self._base + self._written)
        else:
            _pwrite_all(self._side_fd, data, self._base + self._written)
        if self._written + len(data) > PIECE_SIZE:
            self._add_to_pieces(data)
        self._crc = crc32(data, self._crc)
        self._written += len(data)

    def _add_to_pieces(self, data: memoryview) -> None:
        self._piece_crc = carry_piece_crcs(self._pieces, self._piece_crc, self._crc, data, self._written)

    @property
    def crc(self) -> int:
        return self._crc

    def discard(self) -> None:
        self._written = 0  # the next begin() starts over, at the same place

    def end(self) -> tuple[int, list[int]]:
        """Finish the file read: (where in the side file it is, or -1 when in place;
        its piece CRCs)."""
        if self._written > PIECE_SIZE and self._written % PIECE_SIZE:
            self._pieces.append(self._piece_crc)
        if self._in_place:
            return -1, self._pieces
        self._side_end += self._written
        return self._base, self._pieces


# What a worker reports of one file: (its item's index, then either (size, CRC, piece
# CRCs, (mode, uid, gid, mtime_ns), whether it changed while read, the worker, where in
# the worker's side file it is or -1) and None, or None and why it cannot be packed).
FileReport = Tuple[int, Optional[Tuple[int, int, List[int], Tuple[int, int, int, int], bool, int, int]], Optional[str]]


def _read_chunks(root: bytes, items: Sequence[Scanned], offsets: array, out_fd: int, moved_fd: int,
                 side_fds: Sequence[int]) -> Callable[[int, int, int, int], list[FileReport]]:
    """What a worker does with a chunk: read each file into its place (in the output,
    or, for a chunk given with a tag T >= 0, at place - T in the copy of the output's
    end that records moved to: see Placer); report per file
    (index, (size, crc, piece CRCs, (mode, uid, gid, mtime_ns), changed, worker, side offset
    or -1), None),
    or (index, None, why it cannot be packed)."""
    state: dict[str, object] = {}  # per worker process, made on its first chunk

    def read(worker: int, start: int, stop: int, moved_from: int) -> list[FileReport]:
        if not state:
            state["sink"], state["buffer"] = _PlaceSink(out_fd, side_fds[worker]), bytearray(_CHUNK)
        sink: _PlaceSink = state["sink"]  # type: ignore[assignment]
        buffer: bytearray = state["buffer"]  # type: ignore[assignment]
        sink.target(*((out_fd, 0) if moved_from < 0 else (moved_fd, moved_from)))
        reports: list[FileReport] = []
        for index in range(start, stop):
            item = items[index]
            if item.kind == "symlink":
                sink.put(item.target or b"", offsets[index])
            if item.kind != "file":
                continue
            source = TreeFile(root, item.key, item.info)
            sink.place(offsets[index], item.info.st_size)
            try:
                source.open()
                try:
                    size, before, changed = read_stable(source, sink, buffer, None)
                finally:
                    source.close()
            except CannotPack as failure:
                reports.append((index, None, failure.reason))
                continue
            side_offset, pieces = sink.end()
            stamp = (before.st_mode, before.st_uid, before.st_gid, before.st_mtime_ns)
            reports.append((index, (size, sink.crc, pieces, stamp, changed, worker, side_offset), None))
        sink.flush()
        return reports

    return read


class FileStamp(NamedTuple):
    """What an entry stores of a file's stat, as a worker process reports it."""

    st_mode: int
    st_uid: int
    st_gid: int
    st_mtime_ns: int


class Placer:
    """The packer's side of -j N: counts each record the workers wrote, in order, and
    moves the records once one is not where the scanned sizes put it.

    From the first such record on, the chunks still to give out are read into
    ``moved_fd`` (at place - where the move began) instead of the output, the chunks
    already given finish, and what they wrote past that point is copied there too; the
    output is cut there, and each record that follows is copied back to where it now
    goes.  What is held and copied does not grow with the tree: a few chunks."""

    def __init__(self, writer: ContainerWriter, workers: Workers[FileReport], offsets: array, chunk_ends: array,
                 out_fd: int, moved_fd: int, side_fds: Sequence[int]) -> None:
        self._writer, self._workers = writer, workers
        self._reports = workers.results()
        self._offsets, self._chunk_ends = offsets, chunk_ends
        self._out_fd, self._moved_fd, self._side_fds = out_fd, moved_fd, side_fds
        self._moved_from = -1  # where the records stopped being in their places
        self._move_due = -1  # the same, for a file that failed: moved at the next record

    def place(self, source: TreeFile) -> tuple[int, int, FileStamp, bool, int]:
        """``source``'s record (read by a worker): (record, size, stat, whether it
        changed while read, bytes read); CannotPack if it could not be packed."""
        index, report, reason = next(self._reports)
        if index != source.index:
            raise AssertionError(f"worker report for item {index}, expected {source.index}")
        if report is None:  # the records after it move back (unless the pack fails here)
            if self._move_due < 0:
                self._move_due = self._offsets[index]
            raise CannotPack(source.path, reason or "")  # a report without a record has its reason
        size, crc, pieces, stamp, changed, worker, side_offset = report
        writer = self._writer
        self._move_if_due()
        if side_offset >= 0:
            self._move_the_rest(self._offsets[index])
            _copy_range(self._side_fds[worker], side_offset, self._out_fd, writer.position, size)
        elif self._moved_from >= 0:
            _copy_range(self._moved_fd, self._offsets[index] - self._moved_from, self._out_fd, writer.position,
                        size)
        return writer.add_written_record(size, crc, pieces), size, FileStamp(*stamp), changed, size

    def place_symlink(self, target: bytes) -> int:
        """A symlink's record (written by a worker where the scan put it, unless the
        records moved: then here)."""
        self._move_if_due()
        if self._moved_from < 0:
            return self._writer.add_written_record(len(target), crc32(target))
        return self._writer.write_record(target)

    def finish(self) -> None:
        """Wait for the workers' last chunks (symlinks after the last file included)."""
        self._workers.finish()

    def _move_if_due(self) -> None:
        if self._move_due >= 0:
            self._move_the_rest(self._move_due)

    def _move_the_rest(self, offset: int) -> None:
        """Records from ``offset`` on are no longer in their places: see the class."""
        if self._moved_from >= 0:
            return
        workers = self._workers
        workers.tag = offset  # chunks given from now on: into the moved file
        given = workers.given()
        workers.finish(before=given)
        end = self._chunk_ends[given - 1]
        if os.fstat(self._out_fd).st_size < end:  # places no worker wrote (files that failed)
            os.ftruncate(self._out_fd, end)
        _copy_range(self._out_fd, offset, self._moved_fd, 0, end - offset)
        os.ftruncate(self._out_fd, offset)
        self._moved_from = offset


def _copy_range(source: int, source_offset: int, target: int, target_offset: int, length: int) -> None:
    """Copy ``length`` bytes between two files, in the kernel where it can."""
    try:
        while length:
            copied = os.copy_file_range(source, target, length, source_offset, target_offset)
            if not copied:
                raise PackError(f"a temporary file of the pack ended {length} bytes early")
            source_offset, target_offset, length = source_offset + copied, target_offset + copied, length - copied
    except OSError as error:
        if error.errno not in (errno.ENOSYS, errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP):
            raise
        while length:  # no copy_file_range here: through this process
            data = os.pread(source, min(length, _CHUNK), source_offset)
            if not data:
                raise PackError(f"a temporary file of the pack ended {length} bytes early") from None
            _pwrite_all(target, memoryview(data), target_offset)
            source_offset, target_offset, length = (source_offset + len(data), target_offset + len(data),
                                                    length - len(data))


@contextlib.contextmanager
def files_on_workers(writer: ContainerWriter, root: bytes, items: Sequence[Scanned],
                     jobs: int) -> Iterator[Placer]:
    """Worker processes reading the files of ``items`` into ``writer``'s file, from
    before the first record is written until the last is counted."""
    offsets, chunks, chunk_ends = _layout(items, writer.position)
    out_fd = os.open(writer.temp_path, os.O_RDWR | os.O_CLOEXEC)
    temporaries: list[BinaryIO] = []
    try:
        for _ in range(jobs + 1):  # nameless where the file system allows (O_TMPFILE): no debris
            temporaries.append(tempfile.TemporaryFile(dir=os.path.dirname(writer.temp_path),
                                                      prefix=writer.temp_path.name + "-part-"))
        moved_fd, *side_fds = [temporary.fileno() for temporary in temporaries]
        work = _read_chunks(root, items, offsets, out_fd, moved_fd, side_fds)
        with Workers(jobs, chunks, work) as workers:
            placer = Placer(writer, workers, offsets, chunk_ends, out_fd, moved_fd, side_fds)
            yield placer
            placer.finish()
    finally:
        for temporary in temporaries:
            temporary.close()
        os.close(out_fd)
