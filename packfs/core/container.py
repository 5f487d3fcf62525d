"""The FFRecord container, read from any byte source (:mod:`packfs.source`).

The byte layout is documented in :mod:`packfs.format`, section 1.  The writer's side
is :mod:`packfs.write.container`.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shlex
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional, TypeVar, Union

if TYPE_CHECKING:
    import numpy as np

from ..errors import ChecksumError, ClosedArchiveError, FormatError, PackfsError
from ..format import FOOTER_SIZE, HEADER_PREFIX, MAGIC, SNIFF_BYTES, crc32, foreign_format, header_size, unpack_footer
from ..source import ByteSource, open_source
from ..source.scan import SequentialScan
from .tail import HEADER_CRCS, HEADER_OFFSETS, Column, PageCache, PagedColumn, Tail, has_tail

__all__ = ["Container", "explain_foreign"]

# Large enough to amortise per-call overhead, small enough that validation of a huge
# header never holds more than this many pages in the process at once.
_SCAN_CHUNK = 8 << 20
_COPY_CHUNK = 1 << 20
# Smaller records are copied out of the (guarded) map, larger ones read with pread.
MAP_COPY_BYTES = 1 << 20
# Offsets are signed 64-bit (format section 1): no container is larger.
_LARGEST_FILE = (1 << 63) - 1

ProgressCallback = Callable[[int], None]
_T = TypeVar("_T")


def explain_foreign(source: ByteSource, error: FormatError) -> FormatError:
    """``error``, or, when the file is a format packfs recognises (a tar, a zip, gzip,
    empty, ...), an error saying so: its bytes parsed as a header mean nothing."""
    path = source.name
    try:
        kind = foreign_format(source.read(0, min(SNIFF_BYTES, source.size)))
    except (OSError, PackfsError):
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
    """An FFRecord container read from a byte source.

    Opening checks the header in O(1) (and its CRC when checking data); each record's
    offsets are checked when the record is used, so opening costs the same for any
    number of records.  ``check_offsets`` checks them all (``verify`` does).

    Parameters
    ----------
    source
        The container: a path (opened as a :class:`packfs.source.LocalFile`), an
        ``s3://`` or ``http(s)://`` URL (a :class:`packfs.source.remote.RemoteFile`), or
        any :class:`packfs.source.ByteSource`, which the container then owns.
    check_data
        Check the header CRC at open (record CRCs are checked by the callers).
    allow_legacy_header
        Accept a header checksum of 0 (FFRecord's legacy files).
    use_tail
        Open a packfs archive of format 1.4 or later from its tail (format section 4e):
        nothing of the header is read or checked until it is used.
    storage_options
        For a URL: credentials, endpoint and client options (see
        :mod:`packfs.source.remote`).

    Raises
    ------
    FormatError
        The file is not a well-formed container.
    ChecksumError
        The header CRC does not match.

    Attributes
    ----------
    crc_items, offset_items
        The header's CRC and offset columns as memoryviews: unchecked item access for
        hot read paths, which check each value before they use it.
    mapping
        The source's zero-copy buffer (slices are bytes), or None.
    """

    mapping: Union[bytes, mmap.mmap, None]

    def __init__(self, source: Union[str, "os.PathLike[str]", ByteSource], check_data: bool = True,
                 allow_legacy_header: bool = False, use_tail: bool = False,
                 storage_options: Optional[Mapping[str, Any]] = None) -> None:
        self.source: ByteSource = (open_source(source, storage_options) if isinstance(source, (str, os.PathLike))
                                   else source)
        self.path = self.source.name
        self.file_size = self.source.size
        # Reads copy small records out of a guarded map; a source without a map (a
        # remote one, whose reads cannot fault) is read through ``read``.
        self.guarded = self.source.guarded and self.source.mapping is not None
        # A source that reads ahead of sequential readers takes the end of the file read.
        self.reads_ahead = bool(getattr(self.source, "reads_ahead", False))
        self._scan: Optional[SequentialScan] = None  # while scanning(): reads served from its windows
        self.check_data = check_data
        self.allow_legacy_header = allow_legacy_header
        self.use_tail = use_tail
        self.tail: Tail | None = None
        self.footer_bytes = b""
        try:
            if self.file_size < HEADER_PREFIX.size:
                raise FormatError(f"{self.path!r}: truncated: {self.file_size} bytes, a container header "
                                  f"needs at least {HEADER_PREFIX.size}")
            self._open_header()
        except FormatError as error:
            explained = explain_foreign(self.source, error)
            self.close()
            raise explained from None
        except BaseException:
            self.close()
            raise

    def _open_header(self) -> None:
        source = self.source
        # Zero-copy where the source has a map; otherwise the header is read into
        # memory once (a remote source), and records are read with source.read.
        self.zero_copy = source.mapping is not None
        tail = self._read_tail() if self.use_tail else None
        if tail is not None:
            self._open_with_tail(tail)
            return
        mapping = source.mapping
        prefix = mapping if mapping is not None else source.read(0, HEADER_PREFIX.size)
        checksum_meta, n = HEADER_PREFIX.unpack_from(prefix, 0)
        if n < 0 or header_size(n) > _LARGEST_FILE:
            # Offsets are int64: no file holds such a header.  Text, or random bytes,
            # not an archive (a truncated one still has its record count).
            raise FormatError(f"{self.path!r}: not a packfs archive (no FFRecord header: its first 12 bytes give "
                              f"a record count that no file could hold)")
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
        self.header_checksum = checksum_meta
        if self.check_data:
            if checksum_meta == 0 and not self.allow_legacy_header:
                raise self.legacy_header_error()
            actual = self.crc_of_span(4, self.data_start)
            if checksum_meta and actual != checksum_meta:
                raise ChecksumError(
                    f"{self.path!r}: header checksum mismatch: stored {checksum_meta:#010x}, "
                    f"computed {actual:#010x}: the header (record count, CRCs and offsets) is damaged"
                )
        header = mapping if mapping is not None else source.read(0, self.data_start)
        self.mapping = header
        # memoryview item access is several times faster than numpy scalar indexing,
        # and the hot read path does a handful of them per call.
        self.view = memoryview(header)
        self.crc_items: Column = self.view[12 : 12 + 4 * n].cast("I")
        self.offset_items: Column = self.view[12 + 4 * n : self.data_start].cast("q")

    def _read_tail(self) -> Tail | None:
        """The archive's tail (format section 4e), checked, or None where it has none."""
        size = self.file_size
        if size < HEADER_PREFIX.size + FOOTER_SIZE:
            return None
        footer_bytes = self.source.read(size - FOOTER_SIZE, size)
        if footer_bytes[:8] != MAGIC:
            return None
        footer = unpack_footer(footer_bytes, repr(self.path))
        if not has_tail(footer):
            return None
        if footer.tail_size > size - FOOTER_SIZE - HEADER_PREFIX.size:
            raise FormatError(f"{self.path!r}: truncated: its footer gives a tail of {footer.tail_size} bytes, "
                              f"more than the archive holds")
        tail_start = size - FOOTER_SIZE - footer.tail_size
        tail = Tail(self.source.read(tail_start, size - FOOTER_SIZE), footer, footer_bytes, size,
                    repr(self.path), self.check_data)
        mapping = self.source.mapping
        if mapping is not None:
            # The header is at hand: it must agree (a remote reader need not fetch it:
            # the tail's page CRCs check whatever of it is used).
            checksum_meta, n = HEADER_PREFIX.unpack_from(mapping, 0)
            if n != tail.record_count:
                raise FormatError(f"{self.path!r}: its header lists {n} records, its tail {tail.record_count}")
            if not checksum_meta and self.check_data:
                raise self.legacy_header_error()
        self.footer = footer
        self.footer_bytes = footer_bytes
        return tail

    def _open_with_tail(self, tail: Tail) -> None:
        """Open with the tail: nothing of the header is read or checked now.  The data
        records' CRCs and offsets are checked against the tail's page CRCs when first
        used: all at once through the map (:meth:`__getattr__`), or page by page from a
        source without one (:class:`PagedColumn`)."""
        self.tail = tail
        self.record_count = n = tail.record_count
        self.data_start = header_size(n)
        self.header_checksum = None  # not read: the tail's page CRCs check the header
        self.data_records, self.data_end = tail.data_records, tail.data_end
        mapping = self.source.mapping
        if mapping is not None:
            self.mapping = mapping
            self.view = memoryview(mapping)
            self._header_lock = threading.Lock()
            self._unchecked_items = (self.view[12 : 12 + 4 * n].cast("I"),
                                     self.view[12 + 4 * n : self.data_start].cast("q"))
            if not self.check_data:
                self._accept_header_items()
        else:
            self.mapping = None
            self.view = memoryview(b"")  # marks the container open (see closed)
            self.page_cache = PageCache(max(getattr(self.source, "memory_cap", 256 << 20) // 2, 1 << 20))
            self.crc_items = PagedColumn(tail, HEADER_CRCS, "I", 4, self.source.read, self.page_cache)
            self.offset_items = PagedColumn(tail, HEADER_OFFSETS, "q", 8, self.source.read, self.page_cache)

    def _accept_header_items(self) -> None:
        with self._header_lock:  # threads that meet the views unchecked wait for one check
            if "crc_items" in self.__dict__:
                return
            items = self.__dict__.get("_unchecked_items")
            if items is None:
                raise ClosedArchiveError("I/O operation on a closed archive")
            if self.check_data:  # a damaged page fails this use and every later one
                self.check_region(HEADER_CRCS)
                self.check_region(HEADER_OFFSETS)
            self.crc_items, self.offset_items = items
            self.__dict__.pop("_unchecked_items", None)

    def check_region(self, region: int) -> None:
        """Check every page of the tail's region ``region`` through the map (an archive
        opened with its tail, from a source with a map): ChecksumError if one is damaged."""
        tail = self.tail
        assert tail is not None and self.zero_copy
        self.checked(tail.check_region, region, lambda start, end: self.view[start:end])

    @property
    def legacy_header(self) -> bool:
        """Whether the header's checksum is 0, FFRecord's legacy marker: the header
        cannot be checked (an old FFRecord file, or one whose writer was aborted)."""
        return self.header_checksum == 0  # None: opened with a tail (format 1.4), never legacy

    def legacy_header_error(self) -> FormatError:
        """The error for a legacy header where a checked one is required."""
        return FormatError(
            f"{self.path!r}: metadata checksum is 0 (FFRecord's legacy marker: an old FFRecord "
            f"file, or one whose writer was aborted), so its header cannot be checked; "
            f"allow_legacy_header=True reads it with only the per-record checks, as FFRecord does"
        )

    def stored_header_checksum(self) -> int:
        """The header's ``checksum_meta`` as stored (read now where the open did not)."""
        if self.header_checksum is not None:
            return self.header_checksum
        return HEADER_PREFIX.unpack(self.pread(0, HEADER_PREFIX.size))[0]

    def _whole_header(self) -> Union[bytes, mmap.mmap]:
        """The header's bytes: the map's, or a copy read once (for whole-archive checks
        of an archive opened page by page)."""
        if self.mapping is not None:
            return self.mapping
        copy = self.__dict__.get("_header_copy")
        if copy is None:
            copy = self._header_copy = self.pread(0, self.data_start)
        return copy

    @property
    def crcs(self) -> np.ndarray:
        """Every record's stored CRC, as a numpy view (numpy is imported on first use)."""
        import numpy as np

        return np.frombuffer(self._whole_header(), dtype="<u4", count=self.record_count, offset=12)

    @property
    def offsets(self) -> np.ndarray:
        """Every record's start offset, as a numpy view."""
        import numpy as np

        return np.frombuffer(self._whole_header(), dtype="<i8", count=self.record_count,
                             offset=12 + 4 * self.record_count)

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
                self.source.release(12 + 4 * n + 8 * start, 12 + 4 * n + 8 * (start + step))
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
        the offsets it reads, so opening need not check all of them.  With a tail, the
        records after the data are located by the tail, not the header.
        """
        if self.tail is not None and index >= self.data_records:
            return self._tail_record_span(index)
        offsets = self.offset_items
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

    def _tail_record_span(self, index: int) -> tuple[int, int]:
        tail = self.tail
        assert tail is not None
        k, is_section = divmod(index - self.data_records, 2)
        if k < len(tail.spans):
            if is_section:
                return tail.spans[k]
            return (tail.spans[k - 1][1] if k else self.data_end), tail.spans[k][0]
        tail_end = self.file_size - FOOTER_SIZE
        if index == self.record_count - 1:
            return tail_end, self.file_size
        if k == len(tail.spans) and not is_section:  # the tail's padding
            return tail.spans[-1][1], tail_end - self.footer.tail_size
        if k == len(tail.spans):  # the tail
            return tail_end - self.footer.tail_size, tail_end
        return tail_end, tail_end  # the parity record

    def record_length(self, index: int) -> int:
        """The length of record ``index`` in bytes, its offsets checked."""
        start, end = self.record_span(index)
        return end - start

    def stored_crc(self, index: int) -> int:
        """The CRC-32 the header stores for record ``index`` (``index`` already range-checked)."""
        return self.crc_items[index]

    def record_bytes(self, index: int) -> bytes:
        """A copy of record ``index``, unchecked (read with pread: a truncated file is a
        FormatError here, never a SIGBUS)."""
        start, end = self.record_span(index)
        return self.pread(start, end)

    def check_crc(self, index: int, data: bytes | memoryview, label: str) -> None:
        """Raise ChecksumError naming ``label`` if ``data`` is not record ``index``'s bytes."""
        stored = self.crc_items[index]
        actual = crc32(data)
        if actual != stored:
            raise ChecksumError(
                f"{self.path!r}: {label}: checksum mismatch: stored {stored:#010x}, "
                f"computed {actual:#010x}"
            )

    def checksum_error(self, index: int, label: str) -> ChecksumError:
        """The error for record ``index`` failing its CRC, naming ``label``."""
        return ChecksumError(f"{self.path!r}: {label}: checksum mismatch")

    def record_crc_ok(self, index: int, progress: ProgressCallback | None = None) -> bool:
        """Check record ``index`` (any size) through :meth:`crc_of_span`."""
        start, end = self.record_span(index)
        # With a tail, the header's entries past the data records are not paged.
        stored = self.crc_items[index] if self.tail is None or index < self.data_records else int(self.crcs[index])
        return self.crc_of_span(start, end, progress) == stored

    def crc_of_span(self, start: int, end: int, progress: ProgressCallback | None = None) -> int:
        """CRC-32 of bytes [start, end), read from the source into one reused buffer.

        Not through the map: mapped pages count in this process's RSS until released,
        so checking a large table at open added its size to every process that opened
        the archive (8.9 MiB at 100,000 entries; DataLoader workers each paid it)."""
        buffer = memoryview(bytearray(min(_COPY_CHUNK, max(end - start, 0))))
        value, position = 0, start
        while position < end:
            part = buffer[: min(len(buffer), end - position)]
            self.source.readinto(part, position)
            value = crc32(part, value)
            position += len(part)
            if progress is not None:
                progress(len(part))
        return value

    def read_record(self, index: int, check: bool, label: str) -> bytes:
        """Record ``index``'s bytes, CRC-checked if ``check`` (ChecksumError naming
        ``label``), with the checks that the source is unchanged around the read.

        Small records are copied from the map when the SIGBUS guard covers it (a
        truncation under the copy reads zeros, and the check after it raises); larger
        ones, and any record of an unguarded map, are read with pread: a short read or
        other bytes, never a SIGBUS, and no page of a large record stays in RSS.
        bench/overwrite.py: the copy and the guard's check cost 4 KiB reads about what
        an lseek does; pread costs 0.5 us more (and is faster from 1 MiB up)."""
        source = self.source
        if not self.guarded:
            source.check_before_map()  # the offsets are read through the map
        try:
            start, end = self.record_span(index)
            mapping = self.mapping  # a guarded map, when guarded
            if self.guarded and end - start < MAP_COPY_BYTES and mapping is not None:
                data = mapping[start:end]
            else:
                data = (self._scan or source).read(start, end)
            if check and crc32(data) != self.crc_items[index]:
                self.check_crc(index, data, label)  # raises, with details
        except PackfsError:
            self.changed_instead()
            raise
        source.check_unchanged()
        return data

    # -- the archive changing under its readers ---------------------------------------
    #
    # The source (packfs.source.local explains the local file's case) makes each read
    # safe; these are the calls the format code makes around an operation.

    def check_size(self) -> None:
        """Before a use of the map: ArchiveChangedError if reading it could fault."""
        self.source.check_before_map()

    def check_unchanged(self) -> None:
        """After an operation: ArchiveChangedError if the archive changed since it was
        opened, so nothing read from a changed archive is returned."""
        self.source.check_unchanged()

    def checked(self, read: Callable[..., _T], *args: object) -> _T:
        """``read(*args)``, an operation that reads the map, with what every such use
        needs: the size check first where no guard catches a fault, and afterwards
        :meth:`check_unchanged`; a PackfsError it raised becomes ArchiveChangedError
        when the archive changed meanwhile (the failure is its consequence).  The
        hottest read paths (Archive.read_path and its kin) inline the same steps."""
        if not self.guarded:
            self.source.check_before_map()
        try:
            result = read(*args)
        except PackfsError:
            self.changed_instead()
            raise
        self.source.check_unchanged()
        return result

    def changed_instead(self) -> None:
        """Called where an operation failed (with any PackfsError): if the archive
        changed meanwhile, raise that instead, since the failure is its consequence."""
        if not self.closed:
            self.source.check_unchanged()

    @contextlib.contextmanager
    def scanning(self) -> Iterator[None]:
        """A whole-archive scan in archive order (unpack): from a source without a map
        and without read-ahead of its own (an archive at a URL, no disk cache), reads
        are served from large windows read ahead (:class:`SequentialScan`), each byte
        fetched once rather than a request per file; anything else reads as before."""
        if self.zero_copy or self.reads_ahead or self._scan is not None:
            yield
            return
        self._scan = scan = SequentialScan(self.source, 0, self.file_size)
        try:
            yield
        finally:
            self._scan = None
            scan.close()

    def pread(self, start: int, end: int, limit: Optional[int] = None) -> bytes:
        """Bytes [start, end) from the source (pread for a local file: no page joins
        this process's RSS).  ``limit``: the end of the file being read, past which a
        source that reads ahead of sequential readers does not (a mount reading one
        large file); without it a stream reads ahead across files (a scan)."""
        scan = self._scan
        if scan is not None:
            return scan.read(start, end)
        if limit is not None and self.reads_ahead:
            return self.source.read(start, end, limit)  # type: ignore[call-arg]
        return self.source.read(start, end)

    def readinto(self, buffer: memoryview, start: int, limit: Optional[int] = None) -> None:
        """Fill ``buffer`` from ``start`` on, as :meth:`pread`."""
        scan = self._scan
        if scan is not None:
            scan.readinto(buffer, start)
        elif limit is not None and self.reads_ahead:
            self.source.readinto(buffer, start, limit)  # type: ignore[call-arg]
        else:
            self.source.readinto(buffer, start)

    def release(self, start: int, end: int) -> None:
        """Drop mapped pages of [start, end) from this process (a memory hint)."""
        if self.zero_copy:
            self.source.release(start, end)

    def close(self) -> None:
        """Release the header's views and close the source."""
        for view in self.__dict__.pop("_unchecked_items", ()):
            view.release()
        for name in ("crc_items", "offset_items", "view"):
            view = self.__dict__.pop(name, None)
            if view is not None:
                view.release()
        self.__dict__.pop("mapping", None)
        source = self.__dict__.get("source")
        if source is not None:
            source.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return "view" not in self.__dict__

    def __getattr__(self, name: str) -> object:
        # The header's item views of an archive opened with its tail, checked on first use.
        if name in ("crc_items", "offset_items") and "_unchecked_items" in self.__dict__:
            self._accept_header_items()
            return self.__dict__[name]
        if name in ("crc_items", "offset_items") and "path" in self.__dict__:
            # Missing only once close() took them (it may still be taking the rest): the
            # words of the archive's own stand-in (packfs.core.archive.CLOSED).
            raise ClosedArchiveError("I/O operation on a closed archive")
        # Only for attributes that are missing: after close(), the views.  A closed
        # container is then a ClosedArchiveError, as a closed PackedFolder is, not an
        # AttributeError.
        if name != "view" and "view" not in self.__dict__ and "path" in self.__dict__:
            raise ClosedArchiveError(f"{self.path!r}: I/O operation on a closed archive")
        raise AttributeError(name)
