"""Format 1.4's lookup index (format section 4d), read one checked page at a time.

A path's CRC-32 names the one index page that can hold it (the tail keeps each page's
first hash), and its row carries what stat and a read need: so a remote archive finds,
stats and reads a file with two requests, the page and the file, whatever its size.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterable, NamedTuple

from ..errors import FormatError
from ..format import INDEX_ROW, NO_RECORD, crc32
from .tail import FetchMany, PageCache, Tail

__all__ = ["IndexRow", "LookupIndex"]

_PARSED_PAGES = 64  # pages kept parsed (hash -> rows), beside the byte cache


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


class LookupIndex:
    """The lookup index of a 1.4 archive read through ``fetch(start, end)``, its pages
    checked against the tail and kept in ``cache``."""

    def __init__(self, tail: Tail, fetch: Callable[[int, int], bytes], cache: PageCache, where: str) -> None:
        self._tail = tail
        self._fetch = fetch
        self._cache = cache
        self._where = where
        self._parsed: OrderedDict[int, dict[int, list[tuple[bytes, IndexRow]]]] = OrderedDict()

    def find(self, key: bytes) -> IndexRow | None:
        """The row of the entry whose full path is ``key``, or None."""
        page = self._tail.index_page_for(crc32(key))
        if page < 0:
            return None
        for path, row in self._rows(page).get(crc32(key), ()):
            if path == key:
                return row
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

    def _rows(self, page: int) -> dict[int, list[tuple[bytes, IndexRow]]]:
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
        parsed = self._parse(page, data)
        self._parsed[page] = parsed
        while len(self._parsed) > _PARSED_PAGES:
            self._parsed.popitem(last=False)
        return parsed

    def _parse(self, page: int, data: bytes) -> dict[int, list[tuple[bytes, IndexRow]]]:
        rows: dict[int, list[tuple[bytes, IndexRow]]] = {}
        position, size, end = 0, INDEX_ROW.size, len(data)
        entries = self._tail.entry_count
        while position < end:
            if end - position < size:
                self._fail(page, f"a row's fixed part is cut at byte {position}")
            (path_hash, entry, mode, uid, gid, nlink, inode, crc, mtime_ns, length, record, offset,
             path_length) = INDEX_ROW.unpack_from(data, position)
            path_start = position + size
            position = path_start + path_length
            if position > end:
                self._fail(page, f"row of entry {entry} runs past the page")
            if entry >= entries or not 0 < inode <= entries:
                self._fail(page, f"a row names entry {entry} (inode {inode}) of {entries}")
            if record != NO_RECORD and record >= self._tail.data_records:
                self._fail(page, f"entry {entry}'s record {record} is not a data record")
            path = data[path_start:position]
            rows.setdefault(path_hash, []).append(
                (path, IndexRow(entry, mode, uid, gid, nlink, inode, crc, mtime_ns, length, record, offset)))
        return rows

    def _fail(self, page: int, problem: str) -> None:
        raise FormatError(f"{self._where}: invalid lookup index (format section 4d), page {page}: {problem}")
