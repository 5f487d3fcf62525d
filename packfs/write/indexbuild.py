"""Building format 1.4's lookup index and tail (format sections 4d and 4e) for the writer.

The tail's page size is chosen last, once every paged region's length is known: the
smallest power of two from TABLE_PAGE_MIN up whose page CRCs and index pages fit in
TAIL_MAX bytes, so one suffix read of 1 MiB opens an archive of any size.
"""

from __future__ import annotations

from array import array
from typing import Callable, Iterable, Protocol, Sequence

import numpy as np

from ..format import (FOOTER_SIZE, INDEX_PAGE, INDEX_ROW, NO_RECORD, S_IFDIR, S_IFMT, S_IFREG, TABLE_PAGE_MIN, TAIL_HEADER, TAIL_MAGIC,
                      TAIL_MAX, TAIL_SPAN, TAIL_SPAN_COUNT, crc32, section_count_for,
                      tail_span_count, INDEX_SINCE_MINOR, CODECS_SINCE_MINOR)

__all__ = ["LookupIndex", "PagedIndex", "build_lookup_index", "build_paged_tail", "build_tail", "page_crcs",
           "tail_page_size"]


class LookupIndex:
    """Section 21's bytes and, for paging them, each row's end and path hash."""

    def __init__(self, data: bytes, row_ends: np.ndarray, hashes: np.ndarray) -> None:
        self.data = data
        self.row_ends = row_ends
        self.hashes = hashes

    def page_crc(self, start: int, end: int) -> int:
        """The CRC of the index's bytes [start, end)."""
        return crc32(memoryview(self.data)[start:end])

    def pages(self, page_size: int) -> list[tuple[int, int, int]]:
        """(first_hash, start, end) of each page of at most ``page_size`` bytes (one
        longer row is a page alone), never splitting a run of equal hashes."""
        pages: list[tuple[int, int, int]] = []
        ends, hashes = self.row_ends.tolist(), self.hashes.tolist()
        start = 0
        first = 0  # the page's first row
        for row in range(len(ends)):
            if ends[row] - start > page_size and row > first and hashes[row] != hashes[row - 1]:
                pages.append((hashes[first], start, ends[row - 1]))
                start, first = ends[row - 1], row
        if ends:
            pages.append((hashes[first], start, ends[-1]))
        return pages


def build_lookup_index(tables: dict[str, np.ndarray], crcs: Sequence[int], offsets: Sequence[int],
                       data_records: int) -> LookupIndex:
    """Section 21 for a table (``tables``, as build_tables lays it out) whose data
    records have the CRCs and file offsets ``crcs`` and ``offsets``."""
    parent, names, name_end = tables["parent"], tables["names"].tobytes(), tables["name_end"]
    count = len(parent)
    paths: list[bytes] = [b""] * count
    parents, ends = parent.tolist(), name_end.tolist()
    for entry in range(1, count):  # breadth-first: a parent's path is built before its children's
        head = paths[parents[entry]]
        name = names[ends[entry - 1] : ends[entry]]
        paths[entry] = head + b"/" + name if head else name
    order = tables["path_entry"].astype(np.int64)
    mode = tables["mode"]
    record = tables["record"].astype(np.uint64)
    has_record = (mode & S_IFMT) != S_IFDIR
    record_index = np.where(has_record, record, 0).astype(np.int64)
    record_crcs = np.frombuffer(array("I", crcs[:data_records]).tobytes(), np.uint32) if data_records else np.zeros(1, np.uint32)
    record_offsets = np.frombuffer(array("q", offsets[:data_records]).tobytes(), np.int64) if data_records else np.zeros(1, np.int64)
    linked = ((mode & S_IFMT) == S_IFREG) & (tables["nlink"] > 1) & (tables["first_link"] > 0)
    inode = np.where(linked, tables["first_link"].astype(np.int64), np.arange(count)) + 1
    fixed = np.zeros(count, np.dtype([
        ("path_hash", "<u4"), ("entry", "<u4"), ("mode", "<u4"), ("uid", "<u4"), ("gid", "<u4"),
        ("nlink", "<u4"), ("inode", "<u4"), ("crc", "<u4"), ("mtime_ns", "<i8"), ("size", "<u8"),
        ("record", "<u8"), ("offset", "<u8"), ("path_length", "<u4")]))
    assert fixed.itemsize == INDEX_ROW.size
    fixed["path_hash"] = tables["path_hash"]
    fixed["entry"] = order
    for column in ("mode", "uid", "gid", "nlink", "mtime_ns", "size"):
        fixed[column] = tables[column][order]
    fixed["inode"] = inode[order]
    ordered_has_record = has_record[order]
    ordered_records = record_index[order]
    safe = np.minimum(ordered_records, max(data_records - 1, 0))
    fixed["crc"] = np.where(ordered_has_record, record_crcs[safe], 0)
    fixed["record"] = np.where(ordered_has_record, record[order], np.uint64(NO_RECORD))
    fixed["offset"] = np.where(ordered_has_record, record_offsets[safe], 0)
    ordered_paths = [paths[entry] for entry in order.tolist()]
    del paths
    lengths = np.fromiter((len(path) for path in ordered_paths), np.int64, count)
    fixed["path_length"] = lengths
    fixed_bytes = fixed.tobytes()
    size = INDEX_ROW.size
    pieces: list[bytes] = []
    for row, path in enumerate(ordered_paths):
        pieces.append(fixed_bytes[row * size : (row + 1) * size])
        pieces.append(path)
    row_ends = np.cumsum(lengths + size)
    return LookupIndex(b"".join(pieces), row_ends, fixed["path_hash"].astype(np.int64))


def page_crcs(data: bytes | memoryview, page_size: int) -> array:
    """The CRC of each ``page_size`` page of ``data`` (the last one possibly shorter)."""
    view = memoryview(data).cast("B")
    return array("I", (crc32(view[start : start + page_size]) for start in range(0, len(view), page_size)))


def tail_page_size(region_lengths: Sequence[int], index: PagedIndex, span_count: int = TAIL_SPAN_COUNT) -> int:
    """The smallest page size (a power of two from TABLE_PAGE_MIN) whose page CRCs of
    regions ``region_lengths`` long and pages of ``index`` fit a tail of TAIL_MAX."""
    page_size = TABLE_PAGE_MIN
    while True:
        crc_count = sum(-(-length // page_size) for length in region_lengths)
        size = (TAIL_HEADER.size + TAIL_SPAN.size * span_count + 4 * crc_count
                + INDEX_PAGE.size * len(index.pages(page_size)))
        if size <= TAIL_MAX:
            return page_size
        page_size *= 2


def build_tail(*, record_count: int, data_end: int, tail_start: int, spans: Sequence[tuple[int, int]],
               regions: Sequence[bytes | memoryview], index: LookupIndex) -> bytes:
    """Section 22, to be written at ``tail_start`` (the footer follows it at once):
    ``spans`` are sections 0 .. 21's (start, length); ``regions`` are the bytes the
    page CRCs cover, in the tail's order (the header's data-record CRCs and offsets,
    then sections 0 .. 20)."""
    return build_paged_tail(record_count=record_count, data_end=data_end, tail_start=tail_start, spans=spans,
                            region_lengths=[memoryview(region).nbytes for region in regions],
                            region_page_crcs=lambda page_size: [page_crcs(region, page_size).tobytes()
                                                                for region in regions],
                            index=index)


class PagedIndex(Protocol):
    """What the tail needs of a lookup index: its pages and their CRCs."""

    def pages(self, page_size: int) -> list[tuple[int, int, int]]:
        """(first_hash, start, end) of each page of at most ``page_size`` bytes."""

    def page_crc(self, start: int, end: int) -> int:
        """The CRC of the index's bytes [start, end)."""


def build_paged_tail(*, record_count: int, data_end: int, tail_start: int, spans: Sequence[tuple[int, int]],
                     region_lengths: Sequence[int], region_page_crcs: Callable[[int], Iterable[bytes]],
                     index: PagedIndex) -> bytes:
    """:func:`build_tail` for regions not held in memory: ``region_lengths`` are their
    lengths and ``region_page_crcs(page_size)`` their page CRCs (little-endian u32s),
    region by region."""
    allowed = (tail_span_count(section_count_for(INDEX_SINCE_MINOR)),
               tail_span_count(section_count_for(CODECS_SINCE_MINOR)))
    if len(spans) not in allowed:
        raise ValueError(f"a tail locates {' or '.join(map(str, allowed))} sections, got {len(spans)}")
    page_size = tail_page_size(region_lengths, index, len(spans))
    crc_count = sum(-(-length // page_size) for length in region_lengths)
    pages = index.pages(page_size)
    size = TAIL_HEADER.size + TAIL_SPAN.size * len(spans) + 4 * crc_count + INDEX_PAGE.size * len(pages)
    file_size = tail_start + size + FOOTER_SIZE
    parts = [TAIL_HEADER.pack(TAIL_MAGIC, page_size, len(spans), record_count, data_end, len(pages), file_size,
                              bytes(16))]
    parts += [TAIL_SPAN.pack(start, length) for start, length in spans]
    parts += list(region_page_crcs(page_size))
    parts += [INDEX_PAGE.pack(first_hash, index.page_crc(start, end), start) for first_hash, start, end in pages]
    tail = b"".join(parts)
    assert len(tail) == size
    return tail
