"""Format 1.5's codecs (format section 4f), read in place: the one place where codec
rows, frame tables and extent lists are parsed, checked and decoded.

An archive whose footer sets ``FLAG_CODECS`` has a row per data record (section 22)
saying how its stored bytes become a file's contents: as they are (stored), one zstd
frame (with or without a dictionary record), independent zstd frames of ``F`` bytes
each (a frame table in section 23, so a read at any offset decodes only the frames it
covers), or the data extents of a file with holes (an extent list in section 23).  An
archive without the flag has no table here (:attr:`CodecTable.active` is False) and
every record is stored.

Every value is checked where it is used (section 4f, "Where used"): a row before its
codec is trusted, a table or list before it is indexed, and every frame is decoded into
exactly the bytes it must give (its declared size checked before anything is
allocated; zstd stops at the expected size), so a decompression bomb costs no more
than an honest frame of that size.  Damage is a FormatError or ChecksumError naming
the archive and the file.

Decoding uses python-zstandard, one ``ZstdDecompressor`` per dictionary per thread
(its decompressors must not be used by two threads at once; a lock would serialise
a DataLoader's threads on one context).  bench/codec_decode.py measures the per-file
cost over the decompression itself.
"""

from __future__ import annotations

import functools
import io
import os
import struct
import threading
from array import array
from bisect import bisect_right
from typing import TYPE_CHECKING, Callable, Iterator, NamedTuple, NoReturn, Protocol, Union

import zstandard

from ..errors import ChecksumError, FormatError, TooLargeToReadError
from ..format import (CODEC_DICTIONARY, CODEC_FRAMES, CODEC_NAMES, CODEC_ROW, CODEC_SECTIONS, CODEC_SPARSE,
                      CODEC_STORED, CODEC_ZSTD, DICTIONARY_MAX, EXTENT, EXTENT_COUNT, FLAG_CODECS, FRAME_LOG2_MAX,
                      FRAME_LOG2_MIN, FRAME_ROW, NO_RECORD, RECORD_CODEC_SECTION, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG,
                      ZSTD_SIZE_MAX, Footer, crc32)
from .container import Container
from .sections import open_sections
from .tail import Column

if TYPE_CHECKING:
    import numpy as np

__all__ = ["CodecTable", "CodecRow", "SparseLayout", "SIZE_MAX", "STORED_ROW", "TableColumns"]


class TableColumns(Protocol):
    """What ``verify``'s and ``info``'s codec checks read of a path table: its columns
    whole (a :class:`packfs.core.PathTable` is one).  Named here so that this module,
    which the path table uses, does not import it back."""

    def column(self, name: str) -> np.ndarray:
        """Section ``name`` as a numpy array."""

SIZE_MAX = 2**63 - 1  # section 4f: the largest size a frames or sparse file may declare



def check_in_memory(length: int, path: str, label: str = "a read") -> None:
    """Raise TooLargeToReadError if ``length`` decoded bytes, asked for at once, are
    more than whole_read_limit(): the one rule for reads of framed and sparse files."""
    if length > whole_read_limit():
        raise TooLargeToReadError(f"{path!r}: {label} would decode {length:,} bytes at once, more than half "
                                  f"this machine's memory: read it in parts (open(), read_chunks)")


@functools.lru_cache(maxsize=None)
def whole_read_limit() -> int:
    """The most a whole-file read of a framed or sparse file decodes into memory: half
    the machine's memory (a hostile 1.5 archive may declare a sparse file of 2**62
    bytes in a few hundred; a file that size is read in parts)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError):
        return 1 << 32

class CodecRow(NamedTuple):
    """A record's row of section 22 (``CODEC_ROW``'s fields), checked (section 4f's row rules)."""

    codec: int
    frame_log2: int
    reserved: int
    check: int
    aux: int


STORED_ROW = CodecRow(CODEC_STORED, 0, 0, 0, 0)  # every record of an archive without codecs
_as_row = tuple.__new__  # a checked row's tuple as a CodecRow, without NamedTuple's argument handling
_KINDS_MAX = 4096  # extensions counted apart in info's summary; the rest as "(other)"
_CACHED_DICTIONARIES = 64  # dictionaries (at most 1 MiB each) kept per archive, and decompressors per thread

# Where a label comes from: an entry number or the path a caller gave, made into a
# quoted name only when an error needs it (a path costs O(depth) to build).
Where = Union[int, str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

_frame_content_size = zstandard.frame_content_size
_ZstdError = zstandard.ZstdError
_U64 = struct.Struct("<Q")


class _OneBuffer:
    """A whole file's decoded bytes written in place into one zeroed ``bytes`` object,
    handed back by ``getvalue`` without a copy: a whole read of a frames or sparse file
    peaks at its size (plus one decoded frame), where joining parts peaked at twice it.

    CPython's BytesIO shares a ``bytes`` it is given while it holds the only reference,
    writes into it through ``getbuffer`` without copying, and returns it from
    ``getvalue`` once no view is left (elsewhere: one copy, as before)."""

    def __init__(self, size: int) -> None:
        self.out = io.BytesIO(bytes(size))  # zeroed pages, taken from the OS as they are written

    def __enter__(self) -> tuple[io.BytesIO, memoryview]:
        self.view = self.out.getbuffer()
        return self.out, self.view

    def __exit__(self, *exc: object) -> None:
        self.view.release()


class SparseLayout:
    """A sparse file's data extents (section 4f, ``CODEC_SPARSE``), every rule checked
    once, with where each extent's bytes start in the record: a read at any offset
    finds its extents by binary search.  16 bytes per extent."""

    __slots__ = ("size", "offsets", "lengths", "stored")

    def __init__(self, size: int, offsets: array, lengths: array, stored: array) -> None:
        self.size = size
        self.offsets, self.lengths, self.stored = offsets, lengths, stored

    def __len__(self) -> int:
        return len(self.offsets)

    def overlapping(self, begin: int, stop: int) -> range:
        """The extents that hold bytes of [begin, stop)."""
        offsets, lengths = self.offsets, self.lengths
        first = bisect_right(offsets, begin) - 1
        if first < 0 or offsets[first] + lengths[first] <= begin:
            first += 1
        last = bisect_right(offsets, stop - 1) if stop > begin else first
        return range(first, max(first, last))

    def data_bytes(self) -> int:
        """The bytes the extents hold (the record's length)."""
        return sum(self.lengths)


class CodecTable:
    """Sections 22 and 23 of an archive with codecs; empty (``active`` False) otherwise.

    Opening reads nothing: the sections are located (and, through the tail, checked
    or read page by page) when first used.

    Parameters
    ----------
    container
        The archive's container.
    footer
        Its footer (None for an FFRecord packed folder: no codecs).
    label
        Makes a quoted file name from an entry number or a path, for messages.
    check_data
        Check the CRCs of stored and decoded bytes (the checksum policy is not "never").
    """

    def __init__(self, container: Container, footer: Footer | None, label: Callable[[Where], str],
                 check_data: bool) -> None:
        self.path = container.path
        self.active = footer is not None and bool(footer.flags & FLAG_CODECS)
        self.spans: tuple[tuple[int, int], ...] | None = None
        self._container = container
        self._footer = footer
        self._label = label
        self._check = check_data
        self._data_records = footer.data_records if footer is not None else 0
        self._rows: Column = memoryview(b"")  # section 22's items, once opened
        self._data: object = None
        self._data_length = 0
        self._row_at: Callable[[int], tuple] | None = None
        self._open_lock = threading.Lock()
        # Per thread: dictionary record (NO_RECORD for none) -> a decompressor's bound
        # decompress.  Dictionaries themselves are shared (read and checked once).
        self._local = threading.local()
        self._dictionaries: dict[int, zstandard.ZstdCompressionDict] = {}
        self._dictionary_rows: set[int] = set()  # records whose row was checked to be a dictionary's

    # -- the sections --------------------------------------------------------------------

    def _open(self) -> None:
        with self._open_lock:
            if self._row_at is not None:
                return
            if not self.active:
                raise AssertionError("an archive without codecs has no codec rows")
            footer = self._footer
            assert footer is not None
            views, spans = open_sections(self._container, footer, RECORD_CODEC_SECTION, CODEC_SECTIONS,
                                         self._fail_section)
            rows, data = views
            if len(rows) != CODEC_ROW.size * self._data_records:
                self._fail_section(f"section 'record_codec' is {len(rows)} bytes, expected {CODEC_ROW.size} for "
                                   f"each of the {self._data_records} data records")
            self._rows, self._data, self._data_length, self.spans = rows, data, len(data), spans
            if isinstance(rows, memoryview):
                # A partial, not a lambda: one Python frame less on every read of a row.
                self._row_at = functools.partial(CODEC_ROW.unpack_from, rows)
            else:  # a remote archive's section, read page by page
                unpack = CODEC_ROW.unpack
                self._row_at = lambda at: unpack(rows[at : at + CODEC_ROW.size])  # type: ignore[index]

    def row_items(self) -> Column:
        """Section 22's bytes as the archive reads them (a memoryview, or from a source
        without a map a :class:`~packfs.core.tail.PagedColumn`): record ``r``'s row is
        items ``[16 r, 16 r + 16)``.  For prefetching its pages with others."""
        if self._row_at is None:
            self._open()
        return self._rows

    def _fail_section(self, problem: str) -> NoReturn:
        raise FormatError(f"{self.path!r}: invalid codec sections (format section 4f): {problem}")

    def _data_bytes(self, start: int, end: int) -> Union[bytes, memoryview]:
        """Bytes [start, end) of section 23 (the caller checked they lie inside it)."""
        return self._data[start:end]  # type: ignore[index]

    def section_bytes(self) -> tuple[int, int]:
        """(the rows' bytes, the frame tables' and extent lists' bytes): what the codec
        sections take."""
        if not self.active:
            return 0, 0
        if self._row_at is None:
            self._open()
        return len(self._rows), self._data_length

    # -- rows ----------------------------------------------------------------------------

    def fail(self, where: Where, problem: str) -> NoReturn:
        """FormatError: file ``where``'s codec data breaks section 4f's rules (or
        ArchiveChangedError, if the archive changed in place under the read)."""
        self._container.changed_instead()
        raise FormatError(f"{self.path!r}: {self._label(where)}: {problem} (format section 4f)")

    def row(self, record: int, where: Where) -> CodecRow:
        """Record ``record``'s row (below the data record count), checked: a known
        codec whose fields obey it, a dictionary it names a dictionary record."""
        if not self.active:
            return STORED_ROW
        row_at = self._row_at
        if row_at is None:
            self._open()
            row_at = self._row_at
        fields = row_at(record << 4)  # type: ignore[misc]
        problem = self._row_problem(*fields)
        if problem:
            self.fail(where, f"record {record}'s codec row has {problem}")
        return _as_row(CodecRow, fields)

    def _row_problem(self, codec: int, frame_log2: int, reserved: int, check: int, aux: int) -> str | None:
        if codec > CODEC_DICTIONARY:
            return f"an unknown codec {codec}"
        if reserved:
            return "non-zero reserved bytes"
        if codec == CODEC_FRAMES:
            if not FRAME_LOG2_MIN <= frame_log2 <= FRAME_LOG2_MAX:
                return f"a frame size of 2**{frame_log2}, expected 2**{FRAME_LOG2_MIN} to 2**{FRAME_LOG2_MAX}"
        elif frame_log2:
            return f"frame_log2 {frame_log2} for codec {CODEC_NAMES[codec]!r}, expected 0"
        if check and codec != CODEC_ZSTD:
            return f"a check {check:#010x} for codec {CODEC_NAMES[codec]!r}, expected 0"
        if codec in (CODEC_FRAMES, CODEC_SPARSE):
            if aux % 8 or aux >= self._data_length:
                return f"its table at {aux}, expected a multiple of 8 inside section 'codec_data' " \
                       f"({self._data_length} bytes)"
        elif codec == CODEC_ZSTD:
            if aux != NO_RECORD:
                if aux >= self._data_records:
                    return f"dictionary record {aux}, beyond the {self._data_records} data records"
                if aux not in self._dictionary_rows:
                    if self._row_at(aux << 4) != (CODEC_DICTIONARY, 0, 0, 0, 0):  # type: ignore[misc]
                        return f"dictionary record {aux}, whose own row is not a dictionary's"
                    if len(self._dictionary_rows) >= 1 << 12:
                        self._dictionary_rows.clear()
                    self._dictionary_rows.add(aux)
        elif aux:
            return f"aux {aux} for codec {CODEC_NAMES[codec]!r}, expected 0"
        return None

    def file_row(self, record: int, size: int, length: int, where: Where) -> CodecRow:
        """The row of record ``record`` (``length`` stored bytes) named by a file of
        ``size`` bytes, with section 4f's size rules checked: what every read and stat
        relies on before it hands out a size or decodes a byte."""
        row_at = self._row_at
        if row_at is not None:
            # The hot path (a small compressed file, or a stored one), checked inline:
            # per file, every call saved is a tenth of a microsecond.
            fields = row_at(record << 4)
            codec, frame_log2, reserved, check, aux = fields
            if not (frame_log2 or reserved):
                if codec == CODEC_ZSTD:
                    if size <= ZSTD_SIZE_MAX and (aux == NO_RECORD or aux in self._dictionary_rows):
                        return _as_row(CodecRow, fields)
                elif codec == CODEC_STORED and not (check or aux) and size == length:
                    return _as_row(CodecRow, fields)
        row = self.row(record, where)
        codec = row.codec
        if codec == CODEC_STORED:
            if size != length:
                self.fail(where, f"its size {size} differs from the length of its stored record {record} ({length})")
        elif codec == CODEC_ZSTD:
            if size > ZSTD_SIZE_MAX:
                self.fail(where, f"a zstd file of {size} bytes, expected at most {ZSTD_SIZE_MAX}")
        elif codec == CODEC_DICTIONARY:
            self.fail(where, f"it names record {record}, a dictionary")
        elif size > SIZE_MAX:
            self.fail(where, f"a size of {size}, expected at most {SIZE_MAX}")
        elif codec == CODEC_FRAMES:
            count = -(-size >> row.frame_log2)
            if row.aux + FRAME_ROW.size * count > self._data_length:
                self.fail(where, f"its frame table of {count} frames at {row.aux} runs past section "
                                 f"'codec_data' ({self._data_length} bytes)")
        else:  # CODEC_SPARSE
            count = self._extent_count(row.aux, where)
            if count > length:  # each extent holds at least a byte of the record
                self.fail(where, f"{count} extents for a record of {length} bytes")
        return row

    def _extent_count(self, aux: int, where: Where) -> int:
        if aux + EXTENT_COUNT.size > self._data_length:
            self.fail(where, f"its extent list at {aux} runs past section 'codec_data'")
        (count,) = EXTENT_COUNT.unpack(self._data_bytes(aux, aux + EXTENT_COUNT.size))
        if count > (self._data_length - aux - EXTENT_COUNT.size) // EXTENT.size:
            self.fail(where, f"its extent list of {count} extents at {aux} runs past section 'codec_data' "
                             f"({self._data_length} bytes)")
        return count

    def codec_column(self) -> np.ndarray:
        """Every row's codec byte as a numpy array (one per data record), for summaries
        (``packfs info``) and whole-archive checks; rows are not checked here."""
        import numpy as np

        if not self.active:
            return np.zeros(self._data_records, np.uint8)
        if self._row_at is None:
            self._open()
        rows = self._rows
        data = rows if isinstance(rows, memoryview) else rows[:]  # type: ignore[index]  # a paged one: fetched
        return np.frombuffer(data, np.uint8)[::CODEC_ROW.size]

    # -- decoding ------------------------------------------------------------------------

    def _decompressor(self, dictionary: int, where: Where) -> Callable[..., bytes]:
        """This thread's decompress for ``dictionary`` (a record, or NO_RECORD)."""
        local = self._local
        decoders = local.__dict__.setdefault("decoders", {})
        decompress = decoders.get(dictionary)
        if decompress is None:
            if dictionary == NO_RECORD:
                decompressor = zstandard.ZstdDecompressor()
            else:
                decompressor = zstandard.ZstdDecompressor(dict_data=self._dictionary(dictionary, where))
            if len(decoders) >= _CACHED_DICTIONARIES:
                decoders.clear()
            decompress = decoders[dictionary] = decompressor.decompress
        return decompress

    def _dictionary(self, record: int, where: Where) -> zstandard.ZstdCompressionDict:
        dictionary = self._dictionaries.get(record)
        if dictionary is not None:
            return dictionary
        container = self._container
        start, end = container.record_span(record)
        if end - start > DICTIONARY_MAX:
            self.fail(where, f"its dictionary (record {record}) is {end - start} bytes, expected at most "
                             f"{DICTIONARY_MAX}")
        data = container.pread(start, end)
        if self._check and crc32(data) != container.stored_crc(record):
            container.changed_instead()
            raise ChecksumError(f"{self.path!r}: {self._label(where)}: its zstd dictionary (record {record}) is "
                                f"damaged: checksum mismatch")
        try:
            dictionary = zstandard.ZstdCompressionDict(data)
        except _ZstdError as error:
            self.fail(where, f"its dictionary (record {record}) is not a zstd dictionary: {error}")
        if len(self._dictionaries) >= _CACHED_DICTIONARIES:
            self._dictionaries.clear()  # a hostile archive's many dictionaries: memory stays bounded
        self._dictionaries[record] = dictionary
        return dictionary

    def _inflate(self, decompress: Callable[..., bytes], stored: Union[bytes, memoryview], size: int,
                 where: Where, what: str) -> bytes:
        """One zstd frame that must decode to exactly ``size`` bytes: a frame header
        declaring another size is refused before anything is allocated, and zstd stops
        at ``size`` bytes where the header declares none."""
        try:
            declared = _frame_content_size(stored)
            if declared != size and declared != -1:
                self.fail(where, f"{what} declares {declared} decoded bytes, expected {size}")
            data = decompress(stored, size or 1, False, False)
        except _ZstdError as error:
            self.fail(where, f"{what} is not a zstd frame that decodes to {size} bytes: {error}")
        if len(data) != size:
            self.fail(where, f"{what} decodes to {len(data)} bytes, expected {size}")
        return data

    def decode(self, row: CodecRow, record: int, stored: Union[bytes, memoryview], size: int,
               where: Where) -> bytes:
        """File contents of ``size`` bytes from its whole record ``stored`` (already
        checked against the record's CRC under the policy), per ``row`` (from
        :meth:`file_row`).  FormatError or ChecksumError naming ``where``."""
        codec = row.codec
        if codec == CODEC_ZSTD:
            # The hot path (small compressed files): the decompressor looked up inline.
            decoders = self._local.__dict__.get("decoders")
            decompress = decoders.get(row.aux) if decoders is not None else None
            if decompress is None:
                decompress = self._decompressor(row.aux, where)
            try:
                declared = _frame_content_size(stored)
                if declared != size and declared != -1:
                    self.fail(where, f"its zstd frame declares {declared} decoded bytes, expected {size}")
                data = decompress(stored, size or 1, False, False)
            except _ZstdError as error:
                self.fail(where, f"its record is not a zstd frame that decodes to {size} bytes: {error}")
            if len(data) != size:
                self.fail(where, f"its zstd frame decodes to {len(data)} bytes, expected {size}")
            if self._check and crc32(data) != row.check:
                self._checksum(where, "its decoded contents")
            return data
        if codec == CODEC_STORED:
            return stored if type(stored) is bytes else bytes(stored)
        check_in_memory(size, self.path, self._label(where))
        if codec == CODEC_FRAMES:
            count = -(-size >> row.frame_log2)
            if count == 1:
                return self.frame_from(row, stored, size, 0, where, False)
            frame_size = 1 << row.frame_log2
            with _OneBuffer(size) as (out, view):
                for k in range(count):
                    view[k * frame_size : k * frame_size + min(frame_size, size - k * frame_size)] = (
                        self.frame_from(row, stored, size, k, where, False))
            return out.getvalue()
        layout = self.sparse_layout(row, record, size, len(stored), where)
        source = memoryview(stored)
        with _OneBuffer(size) as (out, view):  # the holes: the buffer's zeros
            for offset, extent_length, at in zip(layout.offsets, layout.lengths, layout.stored):
                view[offset : offset + extent_length] = source[at : at + extent_length]
        return out.getvalue()

    def _checksum(self, where: Where, what: str) -> NoReturn:
        self._container.changed_instead()
        raise ChecksumError(f"{self.path!r}: {self._label(where)}: {what}: checksum mismatch")

    # -- frames (CODEC_FRAMES) ------------------------------------------------------------

    def frame_span(self, row: CodecRow, k: int, length: int, where: Where) -> tuple[int, int, int, int]:
        """Frame ``k`` (below the file's frame count) of a frames file whose record is ``length`` bytes:
        (its stored start and end in the record, stored_crc, decoded_crc), checked."""
        at = row.aux + FRAME_ROW.size * k
        if k:
            (begin,) = _U64.unpack(self._data_bytes(at - FRAME_ROW.size, at - FRAME_ROW.size + 8))
        else:
            begin = 0
        end, stored_crc, decoded_crc = FRAME_ROW.unpack(self._data_bytes(at, at + FRAME_ROW.size))
        if not begin < end <= length:
            self.fail(where, f"frame {k} at [{begin}, {end}) of its {length}-byte record (frames must be "
                             f"non-empty, ascending and inside the record)")
        return begin, end, stored_crc, decoded_crc

    def frame_from(self, row: CodecRow, stored: Union[bytes, memoryview], size: int, k: int, where: Where,
                   check_stored: bool = True) -> bytes:
        """Frame ``k``'s decoded bytes, cut from the whole record ``stored`` (its record
        CRC checked by the caller, so ``check_stored`` is False then)."""
        begin, end, stored_crc, decoded_crc = self.frame_span(row, k, len(stored), where)
        return self.decode_frame(row, size, k, stored[begin:end], stored_crc, decoded_crc, where, check_stored)

    def decode_frame(self, row: CodecRow, size: int, k: int, frame: Union[bytes, memoryview], stored_crc: int,
                     decoded_crc: int, where: Where, check_stored: bool = True) -> bytes:
        """Frame ``k``'s stored bytes ``frame`` decoded and checked: stored_crc before
        (if ``check_stored``), the exact size and decoded_crc after."""
        if self._check and check_stored and crc32(frame) != stored_crc:
            self._checksum(where, f"frame {k} of its record")
        frame_size = 1 << row.frame_log2
        expected = min(frame_size, size - k * frame_size)
        decompress = self._decompressor(NO_RECORD, where)
        data = self._inflate(decompress, frame, expected, where, f"frame {k}")
        if self._check and crc32(data) != decoded_crc:
            self._checksum(where, f"frame {k}'s decoded bytes")
        return data

    # -- holes (CODEC_SPARSE) --------------------------------------------------------------

    def sparse_layout(self, row: CodecRow, record: int, size: int, length: int, where: Where) -> SparseLayout:
        """A sparse file's extents, every rule checked (ascending, non-empty, not
        overlapping, inside [0, size), their lengths adding up to the record's
        ``length``).  O(extents) time and 16 bytes each."""
        count = self._extent_count(row.aux, where)
        offsets, lengths, stored = array("Q"), array("Q"), array("Q")
        position, previous_end, total = row.aux + EXTENT_COUNT.size, 0, 0
        chunk = 4096  # extents parsed per slice of the section (a remote one is paged)
        for first in range(0, count, chunk):
            items = min(chunk, count - first)
            data = self._data_bytes(position, position + EXTENT.size * items)
            position += EXTENT.size * items
            for offset, extent_length in EXTENT.iter_unpack(data):
                if not extent_length or offset < previous_end or offset + extent_length > size:
                    self.fail(where, f"its extent [{offset}, {offset + extent_length}) is empty, out of order, "
                                     f"overlapping or past its size {size}")
                offsets.append(offset)
                lengths.append(extent_length)
                stored.append(total)
                total += extent_length
                previous_end = offset + extent_length
        if total != length:
            self.fail(where, f"its extents hold {total} bytes, its record {record} {length}")
        return SparseLayout(size, offsets, lengths, stored)

    @staticmethod
    def _sparse_parts(layout: SparseLayout, stored: Union[bytes, memoryview], stored_base: int, begin: int,
                      stop: int) -> Iterator[bytes]:
        """Bytes [begin, stop) of a sparse file as parts, holes as zeros; ``stored``
        holds the record's bytes from ``stored_base`` on, at least those of the extents
        the range covers."""
        position = begin
        offsets, lengths, starts = layout.offsets, layout.lengths, layout.stored
        for j in layout.overlapping(begin, stop):
            offset = offsets[j]
            if offset > position:
                yield bytes(offset - position)
                position = offset
            end = min(stop, offset + lengths[j])
            at = starts[j] + position - offset - stored_base
            yield bytes(stored[at : at + end - position])
            position = end
        if position < stop:
            yield bytes(stop - position)

    def sparse_range(self, layout: SparseLayout, begin: int, stop: int,
                     read_stored: Callable[[int, int], bytes]) -> bytes:
        """Bytes [begin, stop) of a sparse file, reading only the stored bytes of the
        extents they cover with ``read_stored(start, end)`` (record-relative, checked
        by the caller under the policy)."""
        check_in_memory(stop - begin, self.path)
        covered = layout.overlapping(begin, stop)
        if not len(covered):
            return bytes(max(0, stop - begin))
        first, last = covered[0], covered[-1]
        low = layout.stored[first] + max(0, begin - layout.offsets[first])
        high = layout.stored[last] + min(layout.lengths[last], stop - layout.offsets[last])
        stored = read_stored(low, high)
        return b"".join(self._sparse_parts(layout, stored, low, begin, stop))

    # -- verify ----------------------------------------------------------------------------

    def problems(self, table: TableColumns, limit: int = 20) -> list[str]:
        """Every rule of section 4f that ``verify`` checks, [] if all hold: every row; each
        file's size against its row; every file decoded whole (a frames file frame by
        frame, in bounded memory) and its CRCs checked, whatever the checksum policy; a
        symlink's record stored as it is; data records no file names are dictionaries
        or empty.  At most ``limit`` findings."""
        import numpy as np

        if not self.active:
            return []
        try:
            if self._row_at is None:
                self._open()
        except FormatError as error:
            return [str(error)]
        found: list[str] = []
        container = self._container
        count = self._data_records
        named = np.zeros(count, bool)
        decoded = np.zeros(count, bool)  # a shared record decoded once (its names' sizes are checked each)
        kinds = table.column("mode") & S_IFMT
        records, sizes = table.column("record"), table.column("size")
        saved, self._check = self._check, True  # verify checks every CRC, whatever the policy
        try:
            for entry in np.flatnonzero(kinds != S_IFDIR).tolist():
                if len(found) >= limit:
                    break
                record = int(records[entry])
                if record >= count:
                    continue  # the path table's own rules report it
                named[record] = True
                try:
                    start, end = container.record_span(record)
                    if kinds[entry] == S_IFLNK:
                        if self.row(record, entry).codec != CODEC_STORED:
                            self.fail(entry, f"a symlink whose record {record} is not stored as it is")
                        continue
                    size = int(sizes[entry])
                    row = self.file_row(record, size, end - start, entry)
                    if not decoded[record]:
                        decoded[record] = True
                        self._decode_whole(row, record, start, end, size, entry)
                except FormatError as error:
                    found.append(str(error))
            for record in np.flatnonzero(~named).tolist():
                if len(found) >= limit:
                    break
                codec, frame_log2, reserved, check, aux = self._row_at(record << 4)  # type: ignore[misc]
                problem = self._row_problem(codec, frame_log2, reserved, check, aux)
                if problem is None and codec != CODEC_DICTIONARY and container.record_length(record):
                    problem = f"codec {CODEC_NAMES[codec]!r}, but no file names it (expected a dictionary or empty)"
                if problem is None and codec == CODEC_DICTIONARY and container.record_length(record) > DICTIONARY_MAX:
                    problem = f"a dictionary of {container.record_length(record)} bytes, expected at most " \
                              f"{DICTIONARY_MAX}"
                if problem:
                    found.append(f"{self.path!r}: data record {record} has {problem} (format section 4f)")
        finally:
            self._check = saved
        return found

    def _decode_whole(self, row: CodecRow, record: int, start: int, end: int, size: int, where: Where) -> None:
        codec = row.codec
        container = self._container
        if codec == CODEC_ZSTD:
            self.decode(row, record, container.pread(start, end), size, where)
        elif codec == CODEC_FRAMES:
            for k in range(-(-size >> row.frame_log2)):
                low, high, stored_crc, decoded_crc = self.frame_span(row, k, end - start, where)
                self.decode_frame(row, size, k, container.pread(start + low, start + high, end), stored_crc,
                                  decoded_crc, where)
        elif codec == CODEC_SPARSE:
            self.sparse_layout(row, record, size, end - start, where)

    # -- summary (packfs info) ----------------------------------------------------------------

    def summary(self, table: TableColumns, top: int = 5) -> dict[str, object]:
        """What the codecs did to an archive's regular files, for ``packfs info``:
        ``stored_bytes`` (the data records its files name, each once) against
        ``file_bytes`` (their sizes, each hard-linked file once: what an unpack
        writes), ``files_by_codec``, ``dedup_saved_bytes`` (the sizes of files that
        share another's record, hard links aside), ``dictionaries`` and their bytes, and
        the ``top`` kinds of file (by extension) with the most bytes.  Reads the table's
        columns whole (numpy): a summary, not a hot path.  Rows are taken as stored
        (``verify`` checks them)."""
        import numpy as np

        container = self._container
        count = self._data_records
        mode, records, sizes = table.column("mode"), table.column("record"), table.column("size")
        nlink, first_link = table.column("nlink"), table.column("first_link")
        entries = np.flatnonzero((mode & S_IFMT) == S_IFREG)
        records, sizes = records[entries], sizes[entries].astype(np.float64)
        entries, records, sizes = entries[records < count], records[records < count].astype(np.int64), \
            sizes[records < count]
        # One name per file: a hard link's other names are links, not copies.
        primary = (nlink[entries] <= 1) | (first_link[entries] == 0) | (first_link[entries] == entries)
        entries, records, sizes = entries[primary], records[primary], sizes[primary]
        offsets = container.offsets
        lengths = (offsets[records + 1] - offsets[records]).astype(np.float64)
        codes = self.codec_column()[records] if self.active else np.zeros(len(records), np.uint8)
        unique, first = np.unique(records, return_index=True)
        stored_bytes = int(lengths[first].sum())
        # Shared records (format 4f): every name but one is a copy the record saved.
        per_record_total = np.bincount(np.searchsorted(unique, records), weights=sizes, minlength=len(unique))
        dedup_saved = int(per_record_total.sum() - sizes[first].sum())
        by_codec = {CODEC_NAMES[code]: int((codes == code).sum()) for code in np.unique(codes).tolist()
                    if code < len(CODEC_NAMES)}
        all_codes = self.codec_column() if self.active else np.zeros(0, np.uint8)
        dictionary_records = np.flatnonzero(all_codes == CODEC_DICTIONARY)
        dictionary_bytes = int((offsets[dictionary_records + 1] - offsets[dictionary_records]).sum()) \
            if len(dictionary_records) else 0
        # Kinds by extension: each file's bytes, and its record's share of the stored ones.
        # The names are read a chunk of entries at a time (a copy of the chunk's names).
        names, name_end = table.column("names"), table.column("name_end")
        position = np.searchsorted(unique, records)
        shares = np.bincount(position, minlength=len(unique))[position]
        kinds: dict[str, list[float]] = {}
        chunk = 1 << 16
        for low in range(0, len(entries), chunk):
            part = entries[low : low + chunk]
            base = int(name_end[part[0] - 1]) if part[0] else 0
            text = names[base : int(name_end[part[-1]])].tobytes()
            for entry, size, length, share in zip(part.tolist(), sizes[low : low + chunk].tolist(),
                                                  lengths[low : low + chunk].tolist(),
                                                  shares[low : low + chunk].tolist()):
                name = text[(int(name_end[entry - 1]) if entry else 0) - base : int(name_end[entry]) - base]
                dot = name.rfind(b".")
                kind = name[dot:].decode("utf-8", "replace").lower() if 0 < dot < len(name) - 1 else "(none)"
                if kind not in kinds and len(kinds) >= _KINDS_MAX:
                    kind = "(other)"  # a hostile or odd tree's many extensions: the summary stays bounded
                totals = kinds.setdefault(kind, [0, 0.0, 0.0])
                totals[0] += 1
                totals[1] += size
                totals[2] += length / share
        ranked = sorted(kinds.items(), key=lambda item: -item[1][1])[:top]
        file_bytes = int(sizes.sum())
        return {
            "compression": "format 1.5 codecs (zstd)" if self.active else "uncompressed",
            "stored_bytes": stored_bytes,
            "original_bytes": file_bytes,
            "ratio": round(file_bytes / stored_bytes, 2) if stored_bytes else 1.0,
            "files_by_codec": by_codec,
            "dedup_saved_bytes": dedup_saved,
            "dictionaries": len(dictionary_records),
            "dictionary_bytes": dictionary_bytes,
            "kinds": [{"kind": kind, "files": int(files), "original_bytes": int(original),
                       "stored_bytes": int(round(stored))} for kind, (files, original, stored) in ranked],
        }
