"""Extended attributes (format section 4c, version 1.3), read in place.

An archive lists the attributes of the few entries that have any, sorted by entry, so a
lookup is a binary search and an archive without attributes costs nothing.  Archives
before 1.3 have none.  The writer's side is :mod:`packfs.write.xattrs` (one entry's
attributes encoded) and :mod:`packfs.write.tablestream` (the sections laid out).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Callable, NoReturn

from ..errors import FormatError
from ..format import (PIECE_SECTIONS, SECTION_COUNT, XATTR, XATTR_LIST_MAX, XATTR_SECTIONS, XATTR_SIZE_MAX,
                      XATTRS_SINCE_MINOR, Footer, xattr_name_problem)
from .container import Container
from .tail import Column, PagedColumn
from .sections import open_sections

__all__ = ["XattrTable", "decode_xattrs"]


def decode_xattrs(data: bytes | memoryview) -> list[tuple[bytes, bytes]] | str:
    """One entry's encoded attributes as (name, value) pairs in name order, or what
    breaks section 4c's rules: every length is checked before it is used."""
    pairs: list[tuple[bytes, bytes]] = []
    position, end, listed = 0, len(data), 0
    previous = b""
    while position < end:
        if end - position < XATTR.size:
            return f"{end - position} bytes left, too few for an attribute's {XATTR.size}-byte header"
        name_length, value_length = XATTR.unpack_from(data, position)
        position += XATTR.size
        if value_length > XATTR_SIZE_MAX:
            return f"a value of {value_length} bytes, expected at most {XATTR_SIZE_MAX}"
        if name_length + value_length > end - position:
            return f"an attribute of {name_length + value_length} bytes where {end - position} are left"
        name = bytes(data[position: position + name_length])
        problem = xattr_name_problem(name)
        if problem:
            return problem
        if pairs and name <= previous:
            return f"the name {name!r} after {previous!r}: names must be distinct and ascending"
        listed += name_length + 1
        if listed > XATTR_LIST_MAX:
            return f"names of more than {XATTR_LIST_MAX} bytes"
        position += name_length
        pairs.append((name, bytes(data[position: position + value_length])))
        position += value_length
        previous = name
    return pairs


class XattrTable:
    """Sections 18..20 of an archive: which entries have extended attributes, and theirs.

    Opening checks the sections' geometry (section 5's open rules); :meth:`attributes`
    checks an entry's list before it is used.  An archive without the sections (before
    1.3, or packed from a tree without attributes) has an empty table."""

    def __init__(self, container: Container, footer: Footer | None) -> None:
        self.path = container.path
        self.entry_count = 0  # X: entries with attributes
        self.data_bytes = 0  # section 20's length
        self.spans: tuple[tuple[int, int], ...] | None = None
        empty = memoryview(b"")
        self._entries: Column = empty.cast("I")
        self._starts: Column = empty.cast("Q")
        self._data: Column = empty
        if footer is None or footer.version_minor < XATTRS_SINCE_MINOR:
            return
        first = SECTION_COUNT + len(PIECE_SECTIONS)
        views, spans = open_sections(container, footer, first, XATTR_SECTIONS, self.fail)
        entries, starts, data = views
        count = len(entries)
        if count > footer.entry_count:
            self.fail(f"{count} entries with attributes, more than the table's {footer.entry_count}")
        # Read page by page (a remote 1.4 archive): only the geometry now (attributes()
        # keeps every use in bounds, verify checks the rest).
        paged = isinstance(starts, PagedColumn)
        if len(starts) != count + 1 or (not paged and (starts[0] != 0 or starts[count] != len(data))):
            self.fail(f"section 'xattr_start' has {len(starts)} items from {starts[0] if len(starts) else None} "
                      f"to {starts[len(starts) - 1] if len(starts) else None}, expected {count + 1} from 0 "
                      f"to {len(data)}")
        self._entries, self._starts, self._data = entries, starts, data
        self.entry_count, self.data_bytes, self.spans = count, len(data), spans

    def fail(self, problem: str) -> NoReturn:
        """Raise FormatError for malformed attribute sections."""
        raise FormatError(f"{self.path!r}: invalid extended attributes (format section 4c): {problem}")

    def attributes(self, owner: int) -> list[tuple[bytes, bytes]]:
        """The (name, value) pairs of the file whose inode's entry is ``owner`` (its
        first name, format section 4c), in name order; [] if it has none."""
        if not self.entry_count:
            return []
        entries = self._entries
        j = bisect_left(entries, owner)
        if j == self.entry_count or entries[j] != owner:
            return []
        start, end = self._starts[j], self._starts[j + 1]
        if not start <= end <= len(self._data):
            self.fail(f"entry {owner}'s attributes span [{start}, {end}) of {len(self._data)} bytes")
        pairs = decode_xattrs(self._data[start:end])
        if isinstance(pairs, str):
            self.fail(f"entry {owner}: {pairs}")
        return pairs

    def problems(self, entry_count: int, inode_of: Callable[[int], int]) -> list[str]:
        """Every rule of section 4c that verify checks; [] if all hold.  ``inode_of``
        gives an entry's inode number (a hard-linked file's later names report their
        first name's)."""
        found: list[str] = []
        previous = -1
        for j in range(self.entry_count):
            entry = self._entries[j]
            if entry <= previous or entry >= entry_count:
                found.append(f"xattr_entry[{j}] = {entry}: not ascending or not an entry")
                continue
            previous = entry
            if inode_of(entry) != entry + 1:
                found.append(f"entry {entry} is a later name of a hard-linked file but has attributes of its own")
            try:
                self.attributes(entry)
            except FormatError as error:
                found.append(str(error))
        return found

    def close(self) -> None:
        """Release the views of the map."""
        for view in (self._entries, self._starts, self._data):
            view.release()
