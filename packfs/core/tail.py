"""Format 1.4's tail (format section 4e), and the table read and checked page by page.

An archive with a tail opens from its last bytes alone: the tail locates every section
and holds a CRC for each page of the header's data-record arrays and of sections 0-20
(and, in a 1.5 archive with codecs, sections 22-23: format section 4f), and each
lookup-index page's first hash and CRC.  A reader then checks what it uses
when it first uses it:

- a local archive (a map) checks a whole section, through its page CRCs, the first
  time the section is used (:meth:`Tail.check_region`), so an open does no work per
  entry and the hot paths keep reading plain memoryviews;
- a remote archive (no map) reads and checks one page at a time (:class:`PagedColumn`,
  which stands in for a section's memoryview), kept in a cache bounded in bytes
  (:class:`PageCache`), so a lookup fetches the pages it touches and no others.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from typing import Any, Callable, Iterable, List, Literal, NamedTuple, Sequence, Tuple, Union, overload

from ..errors import ChecksumError, FormatError
from ..format import (FOOTER_SIZE, INDEX_PAGE, INDEX_SINCE_MINOR, SECTION_ALIGNMENT, TABLE_PAGE_MIN, TAIL_HEADER,
                      TAIL_MAGIC, TAIL_SPAN, TAIL_SPAN_COUNT, Footer, crc32, header_size, tail_crc, tail_span_count,
                      CODECS_SINCE_MINOR, FLAG_CODECS, section_count_for)

__all__ = ["Tail", "PageCache", "PagedColumn", "IndexPage", "HEADER_CRCS", "HEADER_OFFSETS", "section_region",
           "region_section", "has_tail", "prefetch_pages", "FetchMany"]

# A source's read_ranges: the bytes of each (start, end) span, in the order given.
FetchMany = Callable[[Sequence[Tuple[int, int]]], List[bytes]]

# The tail's paged regions: the header's two arrays, then sections 0 .. 20, then the
# sections after the lookup index but the tail (22 and 23 in a 1.5 archive, format 4f).
HEADER_CRCS = 0
HEADER_OFFSETS = 1
_PAGED_SECTIONS = TAIL_SPAN_COUNT - 1  # sections 0 .. 20; 21, the index, has pages of its own
LOOKUP_INDEX_SECTION = TAIL_SPAN_COUNT - 1
_MAX_HINTS = 1 << 12  # items per column known from index rows (a lookup's stat and read follow it at once)


def section_region(section: int) -> int:
    """The tail region holding section ``section``'s page CRCs (0 .. 20, and from 22 on
    the sections a 1.5 archive adds before its tail; 21, the lookup index, has none)."""
    if section == LOOKUP_INDEX_SECTION:
        raise ValueError("the lookup index (section 21) is paged by its own page table")
    return section + 2 if section < LOOKUP_INDEX_SECTION else section + 1


def region_section(region: int) -> int:
    """The section whose page CRCs region ``region`` (2 and up) holds: section_region's inverse."""
    return region - 2 if region - 2 < LOOKUP_INDEX_SECTION else region - 1


def has_tail(footer: Footer) -> bool:
    """Whether an archive with ``footer`` has a tail (version 1.4 and later)."""
    return footer.version_minor >= INDEX_SINCE_MINOR


class IndexPage(NamedTuple):
    """One page of the lookup index: its first hash, CRC and span in the file."""

    first_hash: int
    crc: int
    start: int
    end: int


class Tail:
    """A parsed and checked tail.

    Parameters
    ----------
    data
        The tail's bytes.
    footer, footer_bytes
        The decoded footer and its 64 bytes (``tail_crc`` covers them too).
    file_size
        The archive's size.
    where
        The archive's name, for messages.
    check
        Check ``tail_crc`` (the archive's checksum policy is not "never").

    Raises
    ------
    ChecksumError
        The tail or the footer is damaged.
    FormatError
        The tail's geometry does not fit the archive.
    """

    def __init__(self, data: bytes, footer: Footer, footer_bytes: bytes, file_size: int, where: str,
                 check: bool) -> None:
        self.where = where
        if len(data) != footer.tail_size:
            raise FormatError(f"{where}: truncated: the tail is {len(data)} bytes, the footer says {footer.tail_size}")
        if check:
            actual = tail_crc(data, footer_bytes)
            if actual != footer.tail_crc:
                raise ChecksumError(f"{where}: the tail or the footer is damaged: checksum mismatch (stored "
                                    f"{footer.tail_crc:#010x}, computed {actual:#010x})")
        (magic, page_size, span_count, record_count, data_end, index_pages, stated_size,
         _reserved) = TAIL_HEADER.unpack_from(data, 0)
        if magic != TAIL_MAGIC:
            raise FormatError(f"{where}: the tail does not start with {TAIL_MAGIC!r}")
        if page_size < TABLE_PAGE_MIN or page_size & (page_size - 1):
            raise FormatError(f"{where}: the tail's page size is {page_size}, expected a power of two "
                              f">= {TABLE_PAGE_MIN}")
        # Every section but the tail: 22 in 1.4, 24 with codecs (format section 4f).  (A
        # footer whose section count disagrees is refused by the record count.)
        expected_spans = tail_span_count(section_count_for(
            CODECS_SINCE_MINOR if footer.flags & FLAG_CODECS else INDEX_SINCE_MINOR))
        if span_count != expected_spans:
            raise FormatError(f"{where}: the tail locates {span_count} sections, expected {expected_spans}")
        if stated_size != file_size:
            raise FormatError(f"{where}: {file_size} bytes, but its tail says the archive is {stated_size} "
                              f"(truncated or extended)")
        data_records, entries = footer.data_records, footer.entry_count
        if record_count < data_records:
            raise FormatError(f"{where}: the tail's {record_count} records cannot hold the footer's {data_records} "
                              f"data records")
        if header_size(record_count) > file_size:
            raise FormatError(f"{where}: the tail's record count {record_count} does not fit the archive")
        start_of_data = header_size(record_count)
        if not start_of_data <= data_end <= file_size:
            raise FormatError(f"{where}: the tail puts the end of the data at {data_end}, expected within "
                              f"[{start_of_data}, {file_size}]")
        self.page_size = page_size
        self.record_count = record_count
        self.data_records = data_records
        self.data_start = start_of_data
        self.data_end = data_end
        self.file_size = file_size
        position = TAIL_HEADER.size
        tail_start = file_size - FOOTER_SIZE - len(data)
        self.spans: list[tuple[int, int]] = []  # (start, end) of sections 0 .. K - 1
        previous_end = data_end
        for k in range(span_count):
            start, length = TAIL_SPAN.unpack_from(data, position)
            position += TAIL_SPAN.size
            end = start + length
            if start % SECTION_ALIGNMENT or not previous_end <= start <= end <= tail_start:
                raise FormatError(f"{where}: the tail puts section {k} at [{start}, {end}), expected it "
                                  f"64-byte aligned, after the previous section and before the tail")
            self.spans.append((start, end))
            previous_end = end
        # Paged regions: (start, end) in the file.
        self.regions: list[tuple[int, int]] = [
            (12, 12 + 4 * data_records),
            (12 + 4 * record_count, 12 + 4 * record_count + 8 * (data_records + 1)),
        ] + self.spans[:_PAGED_SECTIONS] + self.spans[LOOKUP_INDEX_SECTION + 1:]
        self._first_crc: list[int] = []
        count = 0
        for start, end in self.regions:
            self._first_crc.append(count)
            count += -(-(end - start) // page_size)
        expected = TAIL_HEADER.size + TAIL_SPAN.size * span_count + 4 * count + INDEX_PAGE.size * index_pages
        if expected != len(data):
            raise FormatError(f"{where}: the tail is {len(data)} bytes, its geometry needs {expected}")
        self._crcs = memoryview(data)[position : position + 4 * count].cast("B").cast("I")
        position += 4 * count
        self.index_span = self.spans[LOOKUP_INDEX_SECTION]
        index_start, index_end = self.index_span
        self.index_first_hashes = array("I")
        self.index_crcs = array("I")
        self.index_starts = array("Q")
        previous = -1
        for _ in range(index_pages):
            first_hash, crc, start = INDEX_PAGE.unpack_from(data, position)
            position += INDEX_PAGE.size
            if not previous < start < index_end - index_start if previous >= 0 else start != 0:
                raise FormatError(f"{where}: the lookup index's pages are not ascending from 0")
            previous = start
            self.index_first_hashes.append(first_hash)
            self.index_crcs.append(crc)
            self.index_starts.append(start)
        if entries and not index_pages:
            raise FormatError(f"{where}: the lookup index has no pages for {entries} entries")
        self.entry_count = entries

    # -- fixed pages (the header's arrays and sections 0 .. 20) -------------------------

    def page_count(self, region: int) -> int:
        """How many pages region ``region`` has."""
        start, end = self.regions[region]
        return -(-(end - start) // self.page_size)

    @property
    def page_crcs(self) -> memoryview:
        """Every page CRC of the paged regions, u32 items, region after region (for a
        reader that takes them whole: the compiled daemon)."""
        return self._crcs

    def page_crc(self, region: int, page: int) -> int:
        """The stored CRC of page ``page`` of region ``region``."""
        return self._crcs[self._first_crc[region] + page]

    def page_span(self, region: int, page: int) -> tuple[int, int]:
        """Page ``page`` of region ``region`` as a (start, end) span of the file."""
        start, end = self.regions[region]
        page_start = start + page * self.page_size
        return page_start, min(page_start + self.page_size, end)

    def check_page(self, region: int, page: int, data: Union[bytes, memoryview]) -> None:
        """Raise ChecksumError if ``data`` is not page ``page`` of region ``region``."""
        stored = self.page_crc(region, page)
        actual = crc32(data)
        if actual != stored:
            start, end = self.page_span(region, page)
            raise ChecksumError(f"{self.where}: {self.region_name(region)} is damaged: checksum mismatch in "
                                f"bytes [{start}, {end}) (stored {stored:#010x}, computed {actual:#010x})")

    def check_region(self, region: int, read: Callable[[int, int], Union[bytes, memoryview]]) -> None:
        """Check every page of region ``region``, read with ``read(start, end)``."""
        for page in range(self.page_count(region)):
            self.check_page(region, page, read(*self.page_span(region, page)))

    def region_name(self, region: int) -> str:
        """What region ``region`` is, for messages."""
        from ..format import PIECE_SECTIONS, SECTIONS, XATTR_SECTIONS

        if region == HEADER_CRCS:
            return "the header's record CRCs"
        if region == HEADER_OFFSETS:
            return "the header's record offsets"
        from ..format import CODEC_SECTIONS, INDEX_SECTIONS

        names = [name for name, _ in SECTIONS + PIECE_SECTIONS + XATTR_SECTIONS + INDEX_SECTIONS[:1] + CODEC_SECTIONS]
        section = region_section(region)
        return f"section {names[section]!r}" if section < len(names) else f"section {section}"

    def section_span(self, section: int) -> tuple[int, int]:
        """Section ``section``'s (start, end) in the file (0 .. K - 1)."""
        return self.spans[section]

    # -- the lookup index's pages ---------------------------------------------------

    @property
    def index_page_count(self) -> int:
        """How many pages the lookup index has."""
        return len(self.index_starts)

    def index_page_for(self, path_hash: int) -> int:
        """The one page that can hold rows with ``path_hash`` (format section 4d), or -1."""
        from bisect import bisect_right

        return bisect_right(self.index_first_hashes, path_hash) - 1

    def index_page(self, page: int) -> IndexPage:
        """Page ``page`` of the lookup index, located in the file."""
        base, end = self.index_span
        start = self.index_starts[page]
        stop = self.index_starts[page + 1] if page + 1 < len(self.index_starts) else end - base
        return IndexPage(self.index_first_hashes[page], self.index_crcs[page], base + start, base + stop)

    def check_index_page(self, page: int, data: Union[bytes, memoryview]) -> None:
        """Raise ChecksumError if ``data`` is not lookup-index page ``page``."""
        stored = self.index_crcs[page]
        actual = crc32(data)
        if actual != stored:
            located = self.index_page(page)
            raise ChecksumError(f"{self.where}: the lookup index is damaged: checksum mismatch in bytes "
                                f"[{located.start}, {located.end}) (stored {stored:#010x}, computed {actual:#010x})")


class PageCache:
    """Checked pages of one remote archive, least recently used first out, bounded in
    bytes: the table of an archive of any size is served in bounded memory."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.size = 0
        self._pages: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: tuple[int, int]) -> bytes | None:
        """The page under ``key``, or None."""
        with self._lock:
            page = self._pages.get(key)
            if page is not None:
                self._pages.move_to_end(key)
                self.hits += 1
            else:
                self.misses += 1
            return page

    def holds(self, key: tuple[int, int]) -> bool:
        """Whether a page is kept under ``key`` (not counted as a hit or a miss)."""
        with self._lock:
            return key in self._pages

    def put(self, key: tuple[int, int], page: bytes) -> None:
        """Keep ``page`` under ``key``, dropping the least recently used beyond capacity."""
        with self._lock:
            if key in self._pages:
                return
            self._pages[key] = page
            self.size += len(page)
            while self.size > self.capacity and len(self._pages) > 1:
                _, dropped = self._pages.popitem(last=False)
                self.size -= len(dropped)


# A struct code of a column's items, as memoryview.cast takes it (named, so that the
# type checker knows each cast's item type).
ItemCode = Literal["B", "I", "Q", "q"]


class PagedColumn:
    """A section (or one of the header's arrays) of a remote archive, standing in for its
    memoryview: items and slices are read from pages fetched and checked on first use.

    ``column[i]`` is one item; ``column[a:b]`` is a memoryview of items (its ``tolist``
    and ``tobytes`` work as on the section's own view), or bytes for a section of bytes
    (as a slice of a map is); ``len(column)`` is its item count.
    """

    def __init__(self, tail: Tail, region: int, code: ItemCode, itemsize: int,
                 fetch: Callable[[int, int], bytes], cache: PageCache,
                 on_fetch: Callable[[int], None] | None = None) -> None:
        self._tail = tail
        self._region = region
        self._code = code
        self._fetch = fetch
        self._cache = cache
        start, end = tail.regions[region]
        self._length = (end - start) // itemsize
        self._per_page = tail.page_size // itemsize  # page_size is a multiple of every item size
        self._on_fetch = on_fetch  # told each page fetched, once it is checked and cached
        # Items known from elsewhere, as checked as the pages (the lookup index's rows):
        # a stat or a read after a lookup fetches no page of the table.
        self._hints: dict[int, int] = {}

    def hint(self, index: int, value: int) -> None:
        """Item ``index`` is ``value`` (read from a checked lookup-index row)."""
        if len(self._hints) >= _MAX_HINTS:
            self._hints.clear()
        self._hints[index] = value

    def __len__(self) -> int:
        return self._length

    def _page(self, page: int) -> memoryview:
        key = (self._region, page)
        data = self._cache.get(key)
        if data is None:
            start, end = self._tail.page_span(self._region, page)
            data = self._fetch(start, end)
            self._tail.check_page(self._region, page, data)
            self._cache.put(key, data)
            if self._on_fetch is not None:
                self._on_fetch(page)
        return memoryview(data).cast(self._code) if self._code != "B" else memoryview(data)

    def _missing_pages(self, indices: Iterable[int]) -> set[int]:
        """The pages holding items ``indices`` (those in range and not hinted) that the
        cache does not hold."""
        hints, length, per_page = self._hints, self._length, self._per_page
        pages = {index // per_page for index in indices if 0 <= index < length and index not in hints}
        return {page for page in pages if not self._cache.holds((self._region, page))}

    def _accept(self, page: int, data: bytes) -> None:
        """Page ``page``, fetched elsewhere: checked, then kept as :meth:`_page` keeps one."""
        self._tail.check_page(self._region, page, data)
        self._cache.put((self._region, page), data)
        if self._on_fetch is not None:
            self._on_fetch(page)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> Union[memoryview, bytes]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[int, memoryview, bytes]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._length)
            if step != 1:
                raise ValueError("a paged column is sliced with step 1 only")
            return self._span(start, max(start, stop))
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("index out of range")
        if self._hints:
            hinted = self._hints.get(index)
            if hinted is not None:
                return hinted
        page, within = divmod(index, self._per_page)
        return self._page(page)[within]

    def _span(self, start: int, stop: int) -> Union[memoryview, bytes]:
        if start == stop:
            return memoryview(b"").cast(self._code) if self._code != "B" else b""
        first, last = start // self._per_page, (stop - 1) // self._per_page
        if first == last:
            base = first * self._per_page
            view = self._page(first)[start - base : stop - base]
            return view.tobytes() if self._code == "B" else view
        parts = bytearray()
        for page in range(first, last + 1):
            base = page * self._per_page
            view = self._page(page)
            parts += view[max(start - base, 0) : min(stop - base, len(view))].cast("B")
        return memoryview(bytes(parts)).cast(self._code) if self._code != "B" else bytes(parts)

    def take(self, indices: Any) -> Any:
        """Items ``indices`` (a numpy array of indices in range) as a numpy array: each
        page they touch read once, not the whole column."""
        import numpy as np

        pages = indices // self._per_page
        taken = np.empty(len(indices), dtype=np.dtype(self._code).newbyteorder("<"))
        for page in np.unique(pages).tolist():
            mine = pages == page
            items = np.frombuffer(self._page(page).cast("B"), dtype=taken.dtype)
            taken[mine] = items[indices[mine] - page * self._per_page]
        return taken

    def tolist(self) -> list:
        """Every item (what the memoryview's tolist gives)."""
        items = self._span(0, self._length)
        return list(items) if isinstance(items, bytes) else items.tolist()

    def release(self) -> None:
        """Nothing to release (a memoryview's method, called when a table closes)."""


# A column of the header or the table as the readers index it: a memoryview of the map
# (or of the bytes read), or, from a source without one, a PagedColumn standing in.
Column = Union[memoryview, PagedColumn]


def prefetch_pages(wanted: Sequence[Tuple[Column, Iterable[int]]], fetch_many: FetchMany) -> None:
    """Fetch at once the pages holding the items a batch will use: for each (column,
    item indexes) in ``wanted``, the pages of a :class:`PagedColumn` (other columns, in
    memory already, are skipped) that are neither cached nor hinted, with one
    ``fetch_many`` call (a remote source's read_ranges: its GETs in flight together),
    each checked and cached as a use would.  Up to half the page cache's capacity: a
    batch whose pages need more leaves the rest to be fetched as they are used."""
    jobs: List[Tuple[PagedColumn, int]] = []
    budget = None
    for column, indices in wanted:
        if not isinstance(column, PagedColumn):
            continue
        if budget is None:
            budget = max(1, column._cache.capacity // 2 // column._tail.page_size)
        jobs += [(column, page) for page in sorted(column._missing_pages(indices))]
    if len(jobs) < 2:
        return  # one page costs a round trip either way, when it is used
    jobs = jobs[:budget]
    spans = [column._tail.page_span(column._region, page) for column, page in jobs]
    for (column, page), data in zip(jobs, fetch_many(spans)):
        column._accept(page, data)
