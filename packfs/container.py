"""The FFRecord container on its own: a memory-mapped reader and an atomic writer.

The byte layout is documented in :mod:`packfs.format`, section 1.
"""

from __future__ import annotations

import mmap
import os
import secrets
import shlex
import stat as stat_module
import sys
import weakref
from array import array
from pathlib import Path
from typing import TypeVar, TYPE_CHECKING, BinaryIO, Callable

if TYPE_CHECKING:
    import numpy as np

from .errors import (ArchiveChangedError, ArchiveIOError, ChecksumError, ClosedArchiveError, FormatError, NotAFileError, PackError,
                     PackfsError, PathNotFoundError)
from .format import HEADER_PREFIX, SNIFF_BYTES, crc32, foreign_format, header_size

__all__ = ["Container", "ContainerWriter", "TEMP_MARKER", "GUARDED"]

# The SIGBUS guard (packfs/_sigbus.c, built where a C compiler is found): with it, an
# archive truncated under its map is an ArchiveChangedError from the next check, not a
# dead process.  Without it, readers check the file's size before they touch the map,
# which leaves a window (a truncation between that check and the access) that kills.
try:
    from . import _sigbus
except ImportError:  # not built: no compiler or no Python headers at install time
    _sigbus = None  # type: ignore[assignment]
GUARDED = _sigbus is not None and not os.environ.get("PACKFS_NO_SIGBUS_GUARD")
_CHANGED_WHY = {1: "it was truncated under its memory map", 2: "its size or mtime differ from when it was opened",
                3: "it can no longer be examined (fstat failed)"}

# Large enough to amortise per-call overhead, small enough that validation of a huge
# header never holds more than this many pages in the process at once.
_SCAN_CHUNK = 8 << 20
_COPY_CHUNK = 1 << 20
# Scans of ranges at least this large drop their pages from the process afterwards.
_RELEASE_THRESHOLD = 1 << 20

# Temporary files are named ".<out>.packfs-tmp-<pid>-<random>" so that a killed packer's
# leftovers are recognisable.
TEMP_MARKER = ".packfs-tmp-"

ProgressCallback = Callable[[int], None]
_T = TypeVar("_T")


def release_pages(mm: mmap.mmap, start: int, end: int) -> None:
    """Drop our mapping of [start, end) so one-off scans do not stay in RSS."""
    page = mmap.PAGESIZE
    start -= start % page
    end = min(end, len(mm))
    if end > start:
        try:
            mm.madvise(mmap.MADV_DONTNEED, start, end - start)
        except (AttributeError, OSError, ValueError):
            pass  # only a memory hint; correctness does not depend on it


def explain_foreign(fd: int, error: FormatError, path: str) -> FormatError:
    """``error``, or, when the file is a format packfs recognises (a tar, a zip, gzip,
    empty, ...), an error saying so: its bytes parsed as a header mean nothing."""
    try:
        kind = foreign_format(os.pread(fd, SNIFF_BYTES, 0))
    except OSError:
        return error
    if kind is None:
        return error
    if kind == "empty":
        return FormatError(f"{path!r} is empty (0 bytes), not a packfs archive")
    hint = ""
    if kind.startswith(("a tar", "a zip", "gzip", "bzip2", "xz")):
        hint = f"; to make one from it: packfs pack {shlex.quote(path)} OUT.ffr"
    return FormatError(f"{path!r} is {kind}, not a packfs archive{hint}")


class Container:
    """A memory-mapped FFRecord container.

    Opening checks the header in O(1) (and its CRC when checking data); each record's
    offsets are checked when the record is used, so opening costs the same for any
    number of records.  ``check_offsets`` checks them all (``verify`` does).

    Parameters
    ----------
    path
        The container file.
    check_data
        Check the header CRC at open (record CRCs are checked by the callers).

    Raises
    ------
    FormatError
        The file is not a well-formed container.
    ChecksumError
        The header CRC does not match.
    """

    def __init__(self, path: str | os.PathLike[str], check_data: bool = True,
                 allow_legacy_header: bool = False) -> None:
        self.path = os.fspath(path)
        self.check_data = check_data
        self.allow_legacy_header = allow_legacy_header
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise PathNotFoundError(f"{self.path!r}: no such file, expected an archive") from None
        except IsADirectoryError:
            raise NotAFileError(f"{self.path!r} is a directory, expected an archive file") from None
        except OSError as error:
            raise ArchiveIOError(error.errno, f"{self.path!r}: cannot open: {error.strerror}") from None
        try:
            info = os.fstat(fd)
            if stat_module.S_ISDIR(info.st_mode):
                raise NotAFileError(f"{self.path!r} is a directory, expected an archive file")
            if not stat_module.S_ISREG(info.st_mode):
                raise FormatError(f"{self.path!r}: not a regular file, expected an archive file")
            self.file_size = info.st_size
            if self.file_size < HEADER_PREFIX.size:
                raise explain_foreign(fd, FormatError(
                    f"{self.path!r}: truncated: {self.file_size} bytes, a container header "
                    f"needs at least {HEADER_PREFIX.size}"
                ), self.path)
            # What a write or truncation changes (ctime is not compared: unlinking the
            # file, or a rename over its name, changes it too, and the contents stay).
            self._identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
            self._mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            self._guard = _sigbus.register(self._mm, fd) if GUARDED else -1
        except BaseException:
            os.close(fd)
            raise
        # Unguarded (no extension, or every slot taken): check the size before each use
        # of the map, and compare fstat after; guarded, the handler makes the map safe.
        self.guarded = self._guard >= 0
        self._changed = ""
        if self.guarded:
            # Unregistered when the map itself goes (it may outlive this object: a
            # read_view, a numpy column), or by close().
            self._unguard = weakref.finalize(self._mm, _sigbus.unregister, self._guard)
        # Kept open for pread(): readers that must not grow RSS (the FUSE daemon) read
        # through it instead of the map.  Closed with the object if nobody calls close()
        # (datasets are dropped, not closed), as the map itself is.
        self.fd = fd
        self._close_fd = weakref.finalize(self, os.close, fd)
        try:
            self._open_header()
        except FormatError as error:
            explained = explain_foreign(fd, error, self.path)
            self.close()
            raise explained from None
        except BaseException:
            self.close()
            raise

    def _open_header(self) -> None:
        mm = self._mm
        checksum_meta, n = HEADER_PREFIX.unpack_from(mm, 0)
        if n < 0:
            raise FormatError(f"{self.path!r}: not a packfs or FFRecord archive: its header "
                              f"claims {n} records")
        if header_size(n) > self.file_size:
            raise FormatError(
                f"{self.path!r}: truncated, or not an archive: {self.file_size} bytes, but its "
                f"header claims {n} records, so it must be at least {header_size(n)} bytes"
            )
        self.record_count = n
        self.data_start = header_size(n)
        # Records below data_records are data and must end by data_end (format section
        # 5); a plain container is all data.  set_data_area narrows both.
        self.data_records = n
        self.data_end = self.file_size
        if self.check_data:
            if checksum_meta == 0 and not self.allow_legacy_header:
                raise FormatError(
                    f"{self.path!r}: metadata checksum is 0 (an FFRecord legacy or aborted "
                    f"file); expected a CRC-32 of the header (allow_legacy_header=True "
                    f"reads it with only the per-record checks, as FFRecord does)"
                )
            actual = self.crc_of_span(4, self.data_start)
            if checksum_meta and actual != checksum_meta:
                raise ChecksumError(
                    f"{self.path!r}: header checksum mismatch: stored {checksum_meta:#010x}, "
                    f"computed {actual:#010x}"
                )
        # memoryview item access is several times faster than numpy scalar indexing,
        # and the hot read path does a handful of them per call.
        self._view = memoryview(mm)
        self._crc_items = self._view[12 : 12 + 4 * n].cast("I")
        self._offset_items = self._view[12 + 4 * n : self.data_start].cast("q")

    @property
    def crcs(self) -> np.ndarray:
        """Every record's stored CRC, as a numpy view (numpy is imported on first use)."""
        import numpy as np

        return np.frombuffer(self._mm, dtype="<u4", count=self.record_count, offset=12)

    @property
    def offsets(self) -> np.ndarray:
        """Every record's start offset, as a numpy view."""
        import numpy as np

        return np.frombuffer(self._mm, dtype="<i8", count=self.record_count, offset=12 + 4 * self.record_count)

    def check_offsets(self) -> None:
        """Check every offset at once (format section 1), in bounded memory."""
        import numpy as np

        n = self.record_count
        offsets = self.offsets
        previous = self.data_start
        step = _SCAN_CHUNK // 64  # 128 Ki offsets: 1 MiB of map, a few MiB of temporaries
        for start in range(0, n, step):
            chunk = offsets[start : start + step]
            if chunk[0] < previous or np.any(chunk[1:] < chunk[:-1]):
                bad = start + int(np.argmax(np.diff(chunk, prepend=previous) < 0))
                low = previous if bad == start else int(offsets[bad - 1])
                raise FormatError(
                    f"{self.path!r}: record {bad} starts at offset {int(offsets[bad])}, "
                    f"expected >= {low} (offsets must be non-decreasing from the header end)"
                )
            previous = int(chunk[-1])
            if n > step:
                release_pages(self._mm, 12 + 4 * n + 8 * start, 12 + 4 * n + 8 * (start + step))
        if n and previous > self.file_size:
            raise FormatError(
                f"{self.path!r}: record {n - 1} starts at offset {previous}, past the end "
                f"of the file ({self.file_size} bytes)"
            )

    # -- records ---------------------------------------------------------------------

    def set_data_area(self, data_records: int) -> None:
        """Records below ``data_records`` (< record_count) are data: from now on each
        use of one checks that it ends by ``data_end``, the start of record
        ``data_records`` (format section 5), so no data record reads table bytes."""
        start, _ = self.record_span(data_records)
        self.data_records, self.data_end = data_records, start

    def record_span(self, index: int) -> tuple[int, int]:
        """(start, end) file offsets of record ``index`` (``index`` already range-checked).

        Raises FormatError if the offset table puts the record outside the data area
        (a data record: past ``data_end``) or ends it before it starts: each use checks
        the offsets it reads, so opening need not check all of them.
        """
        offsets = self._offset_items
        start = offsets[index]
        end = offsets[index + 1] if index + 1 < self.record_count else self.file_size
        limit = self.data_end if index < self.data_records else self.file_size
        if not self.data_start <= start <= end <= limit:
            what = "data records end where the path table begins, and " if limit != self.file_size else ""
            raise FormatError(
                f"{self.path!r}: record {index} spans [{start}, {end}), expected a range "
                f"within [{self.data_start}, {limit}] ({what}offsets must be "
                f"non-decreasing from the header end)"
            )
        return start, end

    def record_length(self, index: int) -> int:
        start, end = self.record_span(index)
        return end - start

    def stored_crc(self, index: int) -> int:
        return self._crc_items[index]

    def record_bytes(self, index: int) -> bytes:
        """A copy of record ``index``, unchecked (read with pread: a truncated file is a
        FormatError here, never a SIGBUS)."""
        start, end = self.record_span(index)
        return self.pread(start, end)

    def record_view(self, index: int) -> memoryview:
        """A zero-copy read-only view of record ``index``, unchecked."""
        start, end = self.record_span(index)
        return self._view[start:end]

    def check_crc(self, index: int, data: bytes | memoryview, label: str) -> None:
        """Raise ChecksumError naming ``label`` if ``data`` is not record ``index``'s bytes."""
        stored = self._crc_items[index]
        actual = crc32(data)
        if actual != stored:
            raise ChecksumError(
                f"{self.path!r}: {label}: checksum mismatch: stored {stored:#010x}, "
                f"computed {actual:#010x}"
            )

    def record_crc_ok(self, index: int, progress: ProgressCallback | None = None) -> bool:
        """Check record ``index`` (any size) through :meth:`crc_of_span`."""
        start, end = self.record_span(index)
        return self.crc_of_span(start, end, progress) == self._crc_items[index]

    def crc_of_span(self, start: int, end: int, progress: ProgressCallback | None = None) -> int:
        """CRC-32 of bytes [start, end), read with pread() into one reused buffer.

        Not through the map: mapped pages count in this process's RSS until released,
        so checking a large table at open added its size to every process that opened
        the archive (8.9 MiB at 100,000 entries; DataLoader workers each paid it)."""
        buffer = memoryview(bytearray(min(_COPY_CHUNK, max(end - start, 0))))
        value, position = 0, start
        while position < end:
            got = os.preadv(self.fd, [buffer[: min(len(buffer), end - position)]], position)
            if got <= 0:
                if not self._changed:
                    self._changed = f"nothing to read at offset {position}, expected {end - position} more bytes"
                raise self._changed_error(self._changed)
            value = crc32(buffer[:got], value)
            position += got
            if progress is not None:
                progress(got)
        return value

    def checked_record_bytes(self, index: int, label: str) -> bytes:
        data = self.record_bytes(index)
        self.check_crc(index, data, label)
        return data

    # -- the archive changing under its readers ---------------------------------------
    #
    # ``cp new.ffr data.ffr`` truncates data.ffr and writes it again, in place.  Reading
    # a mapped page past the file's new end is SIGBUS; reading one the writer already
    # rewrote gives the new archive's bytes.  So every reader (1) reads file contents
    # with pread, never the map; (2) reads the header and the path table through the
    # map, guarded by packfs._sigbus when it is built (a fault there maps zeros over
    # the map and counts); (3) calls check_unchanged() after each operation, which
    # raises ArchiveChangedError if the map faulted or fstat shows another size or
    # mtime than at open, before anything read is returned.  (A write or truncation
    # sets mtime before it changes a byte.  Not detected: a rewrite that leaves size
    # and mtime as they were, e.g. one within the same clock tick as the archive's own
    # last write on a file system with coarse timestamps, or a `cp -p` of a file of
    # the same size and mtime.)  Every value read from
    # the map is checked before it indexes anything, so zeros read in between are
    # harmless.  Once changed, always changed: the folder must be reopened.

    def check_size(self) -> None:
        """The check before a use of the map, for an unguarded container: raise
        ArchiveChangedError if the file is now shorter than when it was opened (one
        lseek, about 0.2 us).  Touching a mapped page past a file's new end is SIGBUS;
        a truncation between this check and the access still is, which the guard closes.
        """
        if self._changed:
            raise self._changed_error(self._changed)
        if self.guarded:
            return
        size = os.lseek(self.fd, 0, os.SEEK_END)
        if size < self.file_size:
            self._changed = f"it shrank to {size} bytes (it had {self.file_size})"
            raise self._changed_error(self._changed)

    def check_unchanged(self) -> None:
        """The check after an operation that read the archive: raise ArchiveChangedError
        if it was truncated or rewritten since it was opened (a fault on the map, or
        another size or mtime), so nothing read from a changed archive is
        returned.  About 0.2 us (one fstat, in C) when guarded."""
        if self.guarded:
            reason = _sigbus.check(self._guard)
            if reason:
                self._changed = _CHANGED_WHY.get(reason, f"reason {reason}")
        elif not self._changed:
            info = os.fstat(self.fd)
            if (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns) != self._identity:
                self._changed = _CHANGED_WHY[2]
        if self._changed:
            raise self._changed_error(self._changed)

    def checked(self, read: Callable[..., _T], *args: object) -> _T:
        """``read(*args)``, an operation that reads the map, with what every such use
        needs: the size check first where no guard catches a fault, and afterwards
        :meth:`check_unchanged`; a PackfsError it raised becomes ArchiveChangedError
        when the archive changed meanwhile (the failure is its consequence).  The
        hottest read paths (PackedFolder.read_one and its kin) inline the same steps."""
        if not self.guarded:
            self.check_size()
        try:
            result = read(*args)
        except PackfsError:
            self.changed_instead()
            raise
        self.check_unchanged()
        return result

    def changed_instead(self) -> None:
        """Called where an operation failed (with any PackfsError): if the archive
        changed meanwhile, raise that instead, since the failure is its consequence."""
        if not self.closed:
            self.check_unchanged()

    def _changed_error(self, why: str) -> ArchiveChangedError:
        return ArchiveChangedError(
            f"{self.path!r}: the archive changed while open (overwritten or truncated in place: "
            f"{why}): reopen it; replace archives with a rename (packfs does), not by writing "
            f"over them"
        )

    def pread(self, start: int, end: int) -> bytes:
        """Bytes [start, end) read with pread(): no page joins this process's RSS."""
        data = os.pread(self.fd, end - start, start)
        if len(data) != end - start:
            # Linux returns at most 2 GiB - 4 KiB per call: a larger record comes in parts.
            parts = [data]
            got = len(data)
            while data and got < end - start:
                data = os.pread(self.fd, end - start - got, start + got)
                parts.append(data)
                got += len(data)
            if got != end - start:
                if not self._changed:
                    self._changed = f"{got} bytes at offset {start}, expected {end - start}"
                raise self._changed_error(self._changed)
            data = b"".join(parts)
        return data

    @property
    def mmap(self) -> mmap.mmap:
        return self._mm

    def close(self) -> None:
        for name in ("_crc_items", "_offset_items", "_view"):
            view = self.__dict__.pop(name, None)
            if view is not None:
                view.release()
        self.__dict__.pop("crcs", None)
        self.__dict__.pop("offsets", None)
        mm = self.__dict__.pop("_mm", None)
        if mm is not None:
            if self.guarded:
                # Before the unmap, never after: a slot over addresses that are no longer
                # this map would take another mapping's SIGBUS for its own.
                self._unguard()
            try:
                mm.close()
            except BufferError:
                # A caller still holds a read_view(): the map closes when it is released,
                # so guard it again until then.
                if self.guarded and "fd" in self.__dict__:
                    self._guard = _sigbus.register(mm, self.fd)
                    if self._guard >= 0:
                        self._unguard = weakref.finalize(mm, _sigbus.unregister, self._guard)
        if self.__dict__.pop("fd", None) is not None:
            self._close_fd()

    @property
    def closed(self) -> bool:
        return "_mm" not in self.__dict__

    def __getattr__(self, name: str) -> object:
        # Only for attributes that are missing: after close(), those of the map and
        # the descriptor.  A closed container is then a ClosedArchiveError, as a
        # closed PackedFolder is, not an AttributeError.
        if name != "_mm" and "_mm" not in self.__dict__ and "path" in self.__dict__:
            raise ClosedArchiveError(f"{self.path!r}: I/O operation on a closed archive")
        raise AttributeError(name)


# Temporary files of this process's writers that are neither published nor removed yet.
_UNFINISHED: set[Path] = set()


def remove_unfinished() -> None:
    """Remove every temporary file this process's writers have not finished: for a
    signal handler's last step, whichever point of a write the signal interrupted."""
    for path in list(_UNFINISHED):
        try:
            os.unlink(path)
        except OSError:
            pass
        _UNFINISHED.discard(path)


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
        if pid_text.isdigit() and not _process_alive(int(pid_text)):
            try:
                os.unlink(out.parent / name)
            except OSError:
                pass


def _process_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs.  A killed process that has not been reaped
    (a zombie) or is being torn down no longer writes: it counts as gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            state = stat_file.read().rpartition(b")")[2].split()[:1]
        return state not in ([b"Z"], [b"X"], [b"x"])
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # alive, someone else's
        return True


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

    Raises
    ------
    PackError
        ``out`` exists (without ``force``) or cannot be created.
    """

    def __init__(self, out: str | os.PathLike[str], record_count: int, force: bool = False) -> None:
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
        try:
            fd = os.open(self.temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except OSError as error:
            raise PackError(
                f"cannot create {str(self.temp_path)!r} next to the output: {error.strerror}"
            ) from None
        # Registered at once: whatever interrupts from here on (a signal turned into an
        # exception before the caller's `with` is entered, say), remove_unfinished()
        # finds the file.
        _UNFINISHED.add(self.temp_path)
        self._file: BinaryIO = os.fdopen(fd, "wb", buffering=_COPY_CHUNK)
        try:
            self._crcs = array("I")
            self._offsets = array("q")
            self.position = header_size(record_count)
            self._file.seek(self.position)
        except BaseException:
            self.abort()
            raise
        self._record_start = -1
        self._record_crc = 0

    def __enter__(self) -> ContainerWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()

    @property
    def records_written(self) -> int:
        return len(self._offsets)

    def begin_record(self) -> None:
        if len(self._offsets) >= self.record_count:
            raise PackError(
                f"{str(self.out)!r}: more records written than the {self.record_count} declared"
            )
        self._record_start = self.position
        self._record_crc = 0

    def write(self, data: bytes | memoryview) -> None:
        """Append ``data`` to the record begun with :meth:`begin_record`."""
        self._file.write(data)
        self._record_crc = crc32(data, self._record_crc)
        self.position += len(data)

    def end_record(self) -> int:
        """Finish the current record and return its index."""
        self._offsets.append(self._record_start)
        self._crcs.append(self._record_crc)
        return len(self._offsets) - 1

    def write_record(self, data: bytes | memoryview) -> int:
        self.begin_record()
        self.write(data)
        return self.end_record()

    def commit(self) -> None:
        """Write the header, fsync, and rename the temporary file to ``out``."""
        if len(self._offsets) != self.record_count:
            raise PackError(
                f"{str(self.out)!r}: {len(self._offsets)} records written, "
                f"{self.record_count} declared"
            )
        header = HEADER_PREFIX.pack(0, self.record_count)[4:] + self._crcs.tobytes()
        header += self._offsets.tobytes()
        checksum_meta = crc32(header)
        try:
            self._file.seek(0)
            self._file.write(checksum_meta.to_bytes(4, "little") + header)
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._publish()
            _UNFINISHED.discard(self.temp_path)
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
        _UNFINISHED.discard(self.temp_path)

