"""The sections after the path table (format sections 4b and 4c), opened in place.

Each is a record behind its padding record, 64-byte aligned, an array of one item
type; opening checks that geometry and, when checking data, the two records' CRCs
(format section 5's open rules), and does no per-item work.  With a tail (format 1.4)
a section is checked through its page CRCs instead, or, from a source without a map,
read and checked page by page as it is used.
"""

from __future__ import annotations

from typing import Callable, NoReturn

from ..errors import ChecksumError
from ..format import SECTION_ALIGNMENT, Footer
from .container import Container
from .tail import Column, ItemCode, PagedColumn, section_region

__all__ = ["open_sections"]

# numpy dtype -> (memoryview format, item size)
_ITEM: dict[str, tuple[ItemCode, int]] = {"<u8": ("Q", 8), "<u4": ("I", 4), "u1": ("B", 1)}


def open_sections(container: Container, footer: Footer, first: int, sections: tuple[tuple[str, str], ...],
                  fail: Callable[[str], NoReturn]) -> tuple[list[Column], tuple[tuple[int, int], ...]]:
    """Sections ``first``, ``first + 1``, ... (named and typed by ``sections``) as
    memoryviews of their items, and their spans in the source's bytes; ``fail`` is
    called with what is wrong with a malformed one."""
    views: list[Column] = []
    spans = []
    for k, (name, dtype) in enumerate(sections):
        record = footer.data_records + 2 * (first + k) + 1
        start, end = container.record_span(record)
        if start % SECTION_ALIGNMENT:
            fail(f"section {name!r} starts at offset {start}, expected a multiple of {SECTION_ALIGNMENT}")
        code, size = _ITEM[dtype]
        if (end - start) % size:
            fail(f"section {name!r} is {end - start} bytes, not a whole number of {size}-byte items")
        tail = container.tail
        if tail is not None and not container.zero_copy:
            # Format 1.4 from a source without a map: read and checked page by page.
            views.append(PagedColumn(tail, section_region(first + k), code, size, container.source.read,
                                     container.page_cache))
            spans.append((start, end))
            continue
        if tail is not None and container.check_data:
            # Format 1.4: these sections are small; checked through the tail's pages.
            container.check_region(section_region(first + k))
        elif container.check_data:
            for checked, what in ((record - 1, f"the padding before section {name!r}"),
                                  (record, f"section {name!r}")):
                if not container.record_crc_ok(checked):
                    raise ChecksumError(f"{container.path!r}: {what} (record {checked}): checksum mismatch")
        mapping = container.mapping
        if container.zero_copy and mapping is not None:
            views.append(memoryview(mapping)[start:end].cast(code))
        else:
            views.append(memoryview(container.pread(start, end)).cast(code))
        spans.append((start, end))
    return views, tuple(spans)
