"""Writing a container: records appended to a temporary file next to the output,
the header written last, and the file published under its name in one rename.

The byte layout is documented in :mod:`packfs.format`, section 1.  The reader's side
is :mod:`packfs.core.container`.
"""

from __future__ import annotations

import os
import secrets
import sys
from array import array
from pathlib import Path
from typing import BinaryIO, Callable, MutableSequence, Sequence

from ..errors import PackError
from ..format import HEADER_PREFIX, PIECE_SIZE, crc32, header_size
from .temporaries import abandoned, register, unregister

__all__ = ["ContainerWriter", "TEMP_MARKER", "carry_piece_crcs"]

# Temporary files are named ".<out>.packfs-tmp-<pid>-<random>" so that a killed packer's
# leftovers are recognisable.
TEMP_MARKER = ".packfs-tmp-"
_COPY_CHUNK = 1 << 20
# Records whose CRC and offset are held before they are written into the header: the
# header's arrays (12 bytes a record) are filled in batches, never held whole.
_HEADER_BATCH = 1 << 16
_HEADER_CRCS = 12  # where the header's CRC array starts (format section 1)


def _remove_stale_temporaries(out: Path) -> None:
    """Delete temporary files that a killed writer of ``out`` left behind (their pid is
    in the name, and that process is gone); live writers' files are left alone."""
    prefix = f".{out.name}{TEMP_MARKER}"
    try:
        names = os.listdir(out.parent)
    except OSError:
        return
    for name in names:
        if not name.startswith(prefix):
            continue
        pid_text = name[len(prefix) :].partition("-")[0]
        if pid_text.isdigit() and abandoned(int(pid_text), out.parent / name):
            try:
                os.unlink(out.parent / name)
            except OSError:
                pass


def carry_piece_crcs(pieces: MutableSequence[int], piece_crc: int, record_crc: int, data: memoryview, written: int) -> int:
    """Carry a record's piece CRCs (format section 4b) over ``data``, which starts
    ``written`` bytes into the record, whose CRC so far is ``record_crc``, and reaches
    past its first PIECE_SIZE bytes: every piece ``data`` completes is appended to
    ``pieces``; returns the CRC of the piece left unfinished (``piece_crc`` is the one
    carried in).  A small record costs nothing, a large one a second CRC pass past its
    first piece (whose CRC is the record's so far).  The one place the rule is written:
    the packer's writer and -j's workers both call it."""
    if written <= PIECE_SIZE:  # the first piece ends here: its CRC is the record's so far
        head = PIECE_SIZE - written
        pieces.append(crc32(data[:head], record_crc))
        data, written, piece_crc = data[head:], PIECE_SIZE, 0
    while data:
        head = PIECE_SIZE - written % PIECE_SIZE
        piece_crc = crc32(data[:head], piece_crc)
        written += min(head, len(data))
        if written % PIECE_SIZE == 0:
            pieces.append(piece_crc)
            piece_crc = 0
        data = data[head:]
    return piece_crc


class ContainerWriter:
    """Writes a container with a known record count to a temporary file next to ``out``.

    Records are appended in order; :meth:`commit` writes the header, fsyncs and
    publishes the file under its final name in one rename.  Until then ``out`` is
    untouched; :meth:`abort` (or leaving a ``with`` block with an exception) removes
    the temporary file.

    Parameters
    ----------
    out
        Final path of the container.
    record_count
        Exactly how many records will be written.
    force
        Replace ``out`` if it exists; otherwise an existing ``out`` is an error.
    pieces
        Also compute the CRC of each PIECE_SIZE piece of every record longer than
        PIECE_SIZE (format section 4b), for :meth:`piece_table`.

    Raises
    ------
    PackError
        ``out`` exists (without ``force``) or cannot be created.
    """

    def __init__(self, out: str | os.PathLike[str], record_count: int, force: bool = False,
                 pieces: bool = False) -> None:
        if record_count < 0:
            raise ValueError(f"record_count must be >= 0, got {record_count!r}")
        if sys.byteorder != "little":
            # array.tobytes() below writes native order and the format is little-endian.
            raise PackError("packfs can only write archives on a little-endian machine")
        self.out = Path(out)
        self.force = force
        self.record_count = record_count
        if not force and os.path.lexists(self.out):
            raise PackError(f"{str(self.out)!r} already exists; use --force to replace it")
        if self.out.is_dir():
            raise PackError(f"{str(self.out)!r} is a directory, expected an archive file path")
        _remove_stale_temporaries(self.out)
        self.temp_path = self.out.parent / (
            f".{self.out.name}{TEMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}"
        )
        # Registered before it exists: whatever interrupts from here on (a signal that
        # lands as open() returns, or before the caller's `with` is entered),
        # remove_unfinished() finds the file.
        register(self.temp_path)
        try:
            # Read and write: the header's CRCs are read back for its checksum.
            fd = os.open(self.temp_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except OSError as error:
            unregister(self.temp_path)
            raise PackError(
                f"cannot create {str(self.temp_path)!r} next to the output: {error.strerror}"
            ) from None
        self._file: BinaryIO = os.fdopen(fd, "wb", buffering=_COPY_CHUNK)
        try:
            # The CRCs and offsets of records _flushed .. _flushed + len(_offsets) - 1.
            self._crcs = array("I")
            self._offsets = array("q")
            self._flushed = 0
            self._finished = 0  # records finished (what records_written says; read once a record)
            self.position = header_size(record_count)
            self._file.seek(self.position)
        except BaseException:
            self.abort()
            raise
        self._record_start = -1
        self._record_crc = 0
        self._behind = False  # the file's position is not yet self.position
        # Section 4b's columns, and the current record's finished pieces past its first
        # (a record's first piece CRC is its record CRC until it grows past PIECE_SIZE).
        self._pieces = pieces
        self._piece_records = array("Q")
        self._piece_starts = array("Q", [0])
        self._piece_crcs = array("I")
        self._record_pieces = array("I")
        self._piece_crc = 0

    def __enter__(self) -> ContainerWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()

    @property
    def records_written(self) -> int:
        """How many records were finished so far."""
        return self._finished

    def begin_record(self) -> None:
        """Start a record; its bytes follow with :meth:`write`."""
        if self._finished >= self.record_count:
            raise PackError(
                f"{str(self.out)!r}: more records written than the {self.record_count} declared"
            )
        if len(self._offsets) >= _HEADER_BATCH:
            self._flush_header_batch()
        self._record_start = self.position
        self._record_crc = 0
        del self._record_pieces[:]

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append ``data`` to the record begun with :meth:`begin_record`."""
        if self._behind:  # records were added by add_written_record: one seek past them all
            self._file.seek(self.position)
            self._behind = False
        self._file.write(data)
        written = self.position - self._record_start
        if self._pieces and written + len(data) > PIECE_SIZE:
            self._add_to_pieces(memoryview(data).cast("B"), written)
        self._record_crc = crc32(data, self._record_crc)
        self.position += len(data)

    def _add_to_pieces(self, data: memoryview, written: int) -> None:
        self._piece_crc = carry_piece_crcs(self._record_pieces, self._piece_crc, self._record_crc, data, written)

    @property
    def record_crc(self) -> int:
        """The CRC-32 of the bytes written so far to the record begun with :meth:`begin_record`."""
        return self._record_crc

    def discard_record(self) -> None:
        """Drop the record begun with :meth:`begin_record`: the output is cut back to
        where the record began, so that it can be begun again and written anew (a
        file that changed while it was copied in) or another record take its place.

        Raises
        ------
        ValueError
            No record is begun.
        """
        if self._record_start < 0:
            raise ValueError("discard_record() needs a record begun with begin_record()")
        self._file.seek(self._record_start)
        self._file.truncate()  # a shorter second copy must not leave the first one's tail
        self.position = self._record_start
        self._record_start = -1
        self._record_crc = 0
        self._piece_crc = 0
        del self._record_pieces[:]

    def current_record_start(self) -> int:
        """Where the record begun with :meth:`begin_record` starts in the file."""
        if self._record_start < 0:
            raise ValueError("current_record_start() needs a record begun with begin_record()")
        return self._record_start

    def end_record(self) -> int:
        """Finish the current record and return its index."""
        self._offsets.append(self._record_start)
        self._crcs.append(self._record_crc)
        record = self._finished
        self._finished += 1
        length = self.position - self._record_start
        if self._pieces and length > PIECE_SIZE:
            if length % PIECE_SIZE:
                self._record_pieces.append(self._piece_crc)
            self._piece_records.append(record)
            self._piece_crcs.extend(self._record_pieces)
            self._piece_starts.append(len(self._piece_crcs))
            del self._record_pieces[:]
        self._record_start = -1
        return record

    def piece_table(self) -> tuple[array, array, array]:
        """Format section 4b's three columns for the records written so far (with
        ``pieces``): piece_record, piece_start and piece_crc.  Tracking stops here: the
        records that follow (the table) have no pieces."""
        self._pieces = False
        return self._piece_records, self._piece_starts, self._piece_crcs

    def _flush_header_batch(self) -> None:
        """Write the held CRCs and offsets into their places in the header."""
        fd = self._file.fileno()
        first = self._flushed
        os.pwrite(fd, self._crcs.tobytes(), _HEADER_CRCS + 4 * first)
        os.pwrite(fd, self._offsets.tobytes(), _HEADER_CRCS + 4 * self.record_count + 8 * first)
        self._flushed += len(self._offsets)
        del self._crcs[:], self._offsets[:]

    def _header_values(self, start: int, count: int, offsets: bool) -> array:
        """The CRCs (or offsets) of records start .. start + count - 1, all finished."""
        values = array("q" if offsets else "I")
        on_disk = min(count, max(0, self._flushed - start))
        if on_disk:
            where = (_HEADER_CRCS + 4 * self.record_count + 8 * start) if offsets else _HEADER_CRCS + 4 * start
            values.frombytes(os.pread(self._file.fileno(), on_disk * values.itemsize, where))
        held = max(0, min(start + count, self.records_written) - max(start, self._flushed))
        if held:
            first = max(start - self._flushed, 0)
            values.extend((self._offsets if offsets else self._crcs)[first : first + held])
        return values

    def data_record_spans(self, data_records: int) -> tuple[array, array]:
        """The CRCs and file offsets of records 0 .. ``data_records`` - 1, all written
        (what format 1.4's lookup index and tail record of them).  They are read back
        from the header, 12 bytes of memory a record: :meth:`record_span` asks for one."""
        if data_records > self.records_written:
            raise ValueError(f"{data_records} data records asked for, {self.records_written} written")
        return self._header_values(0, data_records, False), self._header_values(0, data_records, True)

    def record_span(self, record: int) -> tuple[int, int]:
        """The CRC and file offset of record ``record``, already written."""
        if not 0 <= record < self.records_written:
            raise ValueError(f"record {record} asked for, {self.records_written} written")
        if record >= self._flushed:
            return self._crcs[record - self._flushed], self._offsets[record - self._flushed]
        return self._header_values(record, 1, False)[0], self._header_values(record, 1, True)[0]

    def record_offset(self, record: int) -> int:
        """Where record ``record``, already written, starts in the file."""
        return self.record_span(record)[1]

    def header_regions(self, data_records: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """(file offset, length) of the header's CRCs of records 0 .. ``data_records`` - 1
        and of its offsets of records 0 .. ``data_records`` (the last: where the record
        after them starts): what format 1.4's tail covers with page CRCs."""
        return ((_HEADER_CRCS, 4 * data_records),
                (_HEADER_CRCS + 4 * self.record_count, 8 * (data_records + 1)))

    def read_back(self, start: int, length: int) -> bytes:
        """``length`` bytes of the file from ``start``, as written so far (the header's
        arrays hold the records finished so far)."""
        self._file.flush()
        if len(self._offsets):
            self._flush_header_batch()
        return os.pread(self._file.fileno(), length, start)

    def add_written_record(self, length: int, crc: int, piece_crcs: Sequence[int] = ()) -> int:
        """Count a record of ``length`` bytes that another descriptor of
        :attr:`temp_path` (a packing process) already wrote at :attr:`position`: its CRC
        ``crc`` and, for a record longer than PIECE_SIZE, the CRC of each of its pieces
        (with ``pieces``).  Return its index; the next record starts after it."""
        self.begin_record()
        if self._pieces and length > PIECE_SIZE:
            if len(piece_crcs) != -(-length // PIECE_SIZE):
                raise ValueError(f"a record of {length} bytes has {-(-length // PIECE_SIZE)} pieces, "
                                 f"{len(piece_crcs)} CRCs given")
            self._record_pieces.extend(piece_crcs)
            self._piece_crc = self._record_pieces.pop()
            if length % PIECE_SIZE == 0:  # end_record adds an unfinished last piece only
                self._record_pieces.append(self._piece_crc)
        self._record_crc = crc
        self.position += length
        self._behind = True  # what this writer writes next goes after it: see write()
        return self.end_record()

    def write_record(self, data: bytes | memoryview) -> int:
        """Append a whole record; return its index."""
        self.begin_record()
        self.write(data)
        return self.end_record()

    def commit(self, before_publish: Callable[[str], None] | None = None) -> None:
        """Write the header, fsync, and rename the temporary file to ``out``;
        ``before_publish(temporary path)`` may check the complete file first (an
        exception it raises leaves nothing)."""
        if self.records_written != self.record_count:
            raise PackError(
                f"{str(self.out)!r}: {self.records_written} records written, "
                f"{self.record_count} declared"
            )
        try:
            if len(self._offsets):
                self._flush_header_batch()
            self._file.flush()
            fd = self._file.fileno()
            prefix = HEADER_PREFIX.pack(0, self.record_count)[4:]
            checksum_meta = crc32(prefix)
            end = header_size(self.record_count)
            for start in range(HEADER_PREFIX.size, end, _COPY_CHUNK):
                checksum_meta = crc32(os.pread(fd, min(_COPY_CHUNK, end - start), start), checksum_meta)
            os.pwrite(fd, checksum_meta.to_bytes(4, "little") + prefix, 0)
            os.fsync(fd)
            self._file.close()
            if before_publish is not None:
                try:
                    before_publish(str(self.temp_path))
                except BaseException:
                    self.abort()
                    raise
            self._publish()
            unregister(self.temp_path)
        except OSError as error:
            self.abort()
            raise PackError(f"cannot write {str(self.out)!r}: {error.strerror}") from None

    def _publish(self) -> None:
        if self.force:
            os.replace(self.temp_path, self.out)
        else:
            # link() fails if out appeared meanwhile, so nothing is ever clobbered.
            try:
                os.link(self.temp_path, self.out)
            except FileExistsError:
                self.abort()
                raise PackError(
                    f"{str(self.out)!r} already exists; use --force to replace it"
                ) from None
            except OSError:
                # Some file systems have no hard links; fall back to a plain rename.
                if os.path.lexists(self.out):
                    self.abort()
                    raise PackError(
                        f"{str(self.out)!r} already exists; use --force to replace it"
                    ) from None
                os.replace(self.temp_path, self.out)
            else:
                os.unlink(self.temp_path)
        directory = os.open(self.out.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        # Again at the end: a killed writer that was still exiting when this one began
        # is gone now, and its leftover need not wait for the next pack.
        _remove_stale_temporaries(self.out)

    def abort(self) -> None:
        """Close and remove the temporary file; ``out`` is left as it was."""
        try:
            self._file.close()
        except OSError:
            pass
        try:
            os.unlink(self.temp_path)
        except FileNotFoundError:
            pass
        unregister(self.temp_path)

