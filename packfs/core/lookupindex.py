"""Format 1.4's lookup index (format section 4d), read one checked page at a time.

A path's CRC-32 names the one index page that can hold it (the tail keeps each page's
first hash), and its row carries what stat and a read need: so a remote archive finds,
stats and reads a file with two requests, the page and the file, whatever its size.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import OrderedDict
from typing import Callable, Iterable, NamedTuple

from ..errors import FormatError
from ..format import INDEX_ROW, NO_RECORD, crc32
from .tail import FetchMany, PageCache, Tail

__all__ = ["IndexRow", "LookupIndex"]

_as_row = tuple.__new__  # a row's fields as an IndexRow, without NamedTuple's argument handling
_PARSED_PAGES = 64  # pages kept checked and sorted by hash, beside the byte cache


class IndexRow(NamedTuple):
    """One row of the lookup index: an entry and what stat and a read need."""

    entry: int
    mode: int
    uid: int
    gid: int
    nlink: int
    inode: int
    crc: int
    mtime_ns: int
    size: int
    record: int
    offset: int


class _Page(NamedTuple):
    """A checked index page: its bytes, and its rows' path hashes in order with where
    each row starts -- two arrays, not a Python object per row, so that the pages a
    process keeps (and each DataLoader worker forked from it copies as it touches
    them) cost bytes a row, not hundreds."""

    data: bytes
    hashes: array
    positions: array


class LookupIndex:
    """The lookup index of a 1.4 archive read through ``fetch(start, end)``, its pages
    checked against the tail and kept in ``cache``."""

    def __init__(self, tail: Tail, fetch: Callable[[int, int], bytes], cache: PageCache, where: str) -> None:
        self._tail = tail
        self._fetch = fetch
        self._cache = cache
        self._where = where
        self._parsed: OrderedDict[int, _Page] = OrderedDict()

    def find(self, key: bytes) -> IndexRow | None:
        """The row of the entry whose full path is ``key``, or None."""
        path_hash = crc32(key)
        page = self._tail.index_page_for(path_hash)
        if page < 0:
            return None
        data, hashes, positions = self._page(page)
        at = bisect_left(hashes, path_hash)
        while at < len(hashes) and hashes[at] == path_hash:
            fields = INDEX_ROW.unpack_from(data, positions[at])
            # The path, compared in place (its row was checked when the page was).
            if fields[-1] == len(key) and data.startswith(key, positions[at] + INDEX_ROW.size):
                return _as_row(IndexRow, fields[1:-1])
            at += 1
        return None

    def prefetch(self, keys: Iterable[bytes], fetch_many: FetchMany) -> None:
        """Fetch at once (one ``fetch_many`` call: GETs in flight together) the pages
        that can hold the paths ``keys`` and are not cached, each checked and cached as
        :meth:`find` would, up to half the cache's capacity."""
        pages = sorted({page for page in (self._tail.index_page_for(crc32(key)) for key in keys) if page >= 0
                        and page not in self._parsed and not self._cache.holds((-1, page))})
        if len(pages) < 2:
            return  # one page costs a round trip either way, when it is used
        pages = pages[:max(1, self._cache.capacity // 2 // self._tail.page_size)]
        spans = [(located.start, located.end) for located in (self._tail.index_page(page) for page in pages)]
        for page, data in zip(pages, fetch_many(spans)):
            self._tail.check_index_page(page, data)
            self._cache.put((-1, page), data)

    def _page(self, page: int) -> _Page:
        parsed = self._parsed.get(page)
        if parsed is not None:
            self._parsed.move_to_end(page)
            return parsed
        located = self._tail.index_page(page)
        data = self._cache.get((-1, page))
        if data is None:
            data = self._fetch(located.start, located.end)
            self._tail.check_index_page(page, data)
            self._cache.put((-1, page), data)
        parsed = self._parse(page, bytes(data))
        self._parsed[page] = parsed
        while len(self._parsed) > _PARSED_PAGES:
            self._parsed.popitem(last=False)
        return parsed

    def _parse(self, page: int, data: bytes) -> _Page:
        """Page ``page`` with every row checked: FormatError for the first one wrong."""
        found: list[tuple[int, int]] = []  # (path hash, where its row starts)
        position, size, end = 0, INDEX_ROW.size, len(data)
        entries = self._tail.entry_count
        while position < end:
            if end - position < size:
                self._fail(page, f"a row's fixed part is cut at byte {position}")
            (path_hash, entry, _, _, _, _, inode, _, _, _, record, _,
             path_length) = INDEX_ROW.unpack_from(data, position)
            found.append((path_hash, position))
            position += size + path_length
            if position > end:
                self._fail(page, f"row of entry {entry} runs past the page")
            if entry >= entries or not 0 < inode <= entries:
                self._fail(page, f"a row names entry {entry} (inode {inode}) of {entries}")
            if record != NO_RECORD and record >= self._tail.data_records:
                self._fail(page, f"entry {entry}'s record {record} is not a data record")
        found.sort()
        return _Page(data, array("I", [path_hash for path_hash, _ in found]),
                     array("Q", [position for _, position in found]))

    def _fail(self, page: int, problem: str) -> None:
        raise FormatError(f"{self._where}: invalid lookup index (format section 4d), page {page}: {problem}")
