"""Building the path table (format section 4) from the writer's entries."""

from __future__ import annotations

from array import array

import numpy as np

from ..format import S_IFDIR, S_IFMT, S_IFREG, SECTION_ALIGNMENT, SECTIONS, crc32

__all__ = ["TableRows", "build_tables", "table_image", "xattr_columns"]


class TableRows:
    """The writer's entries as compact columns: one bytes path and a few integers each,
    no object per entry (millions of entries are packed in bounded memory)."""

    def __init__(self) -> None:
        self.paths: list[bytes] = []
        self.row_of: dict[bytes, int] = {}
        self.mode = array("I")
        self.uid = array("I")
        self.gid = array("I")
        self.mtime_ns = array("q")
        self.size = array("Q")
        self.record = array("Q")
        # Extended attributes (format section 4c), encoded, of the few rows that have any.
        self.xattrs: dict[int, bytes] = {}

    def __len__(self) -> int:
        return len(self.paths)

    def __contains__(self, path: bytes) -> bool:
        return path in self.row_of

    def add(self, path: bytes, mode: int, uid: int, gid: int, mtime_ns: int, size: int, record: int) -> None:
        """Append a row, or replace the row of ``path`` if it has one."""
        values = (mode, uid, gid, mtime_ns, size, record)
        columns = (self.mode, self.uid, self.gid, self.mtime_ns, self.size, self.record)
        row = self.row_of.get(path)
        if row is None:
            self.row_of[path] = len(self.paths)
            self.paths.append(path)
            for column, value in zip(columns, values):
                column.append(value)
        else:
            for column, value in zip(columns, values):
                column[row] = value

    def file_type(self, path: bytes) -> int:
        """Row ``row``'s file type bits (S_IFDIR, S_IFREG or S_IFLNK)."""
        return self.mode[self.row_of[path]] & S_IFMT


def build_tables(rows: TableRows) -> dict[str, np.ndarray]:
    """Lay out the path table for ``rows``: one array per section, in section order.

    Every parent directory must be among the rows; the root is the row with path b"".
    """
    count = len(rows)
    # Breadth-first with siblings sorted bytewise is the order of (depth, components).
    # Comparing paths with "/" replaced by NUL compares them component by component,
    # because names contain no NUL; sorting each depth separately needs no key tuples.
    by_depth: list[list[bytes]] = []
    for path in rows.paths:
        depth = path.count(b"/") + 1 if path else 0
        while len(by_depth) <= depth:
            by_depth.append([])
        by_depth[depth].append(path)
    order: list[bytes] = []
    for level in by_depth:
        level.sort(key=lambda path: path.replace(b"/", b"\0"))
        order.extend(level)
        level.clear()
    del by_depth

    row_of = rows.row_of
    permutation = np.fromiter((row_of[path] for path in order), np.int64, count)
    position = np.empty(count, np.int64)
    position[permutation] = np.arange(count)
    parent = np.zeros(count, "<u4")
    names = bytearray()
    name_end = np.zeros(count, "<u8")
    hashes = np.zeros(count, np.uint32)
    for i, path in enumerate(order):
        head, _, name = path.rpartition(b"/")
        if i:
            parent[i] = position[row_of[head]]
        names += name
        name_end[i] = len(names)
        hashes[i] = crc32(path)
    del order

    columns: dict[str, np.ndarray] = {
        "parent": parent,
        "mode": np.frombuffer(rows.mode, np.uint32)[permutation].astype("<u4"),
        "uid": np.frombuffer(rows.uid, np.uint32)[permutation].astype("<u4"),
        "gid": np.frombuffer(rows.gid, np.uint32)[permutation].astype("<u4"),
        "mtime_ns": np.frombuffer(rows.mtime_ns, np.int64)[permutation].astype("<i8"),
        "size": np.frombuffer(rows.size, np.uint64)[permutation].astype("<u8"),
        "record": np.frombuffer(rows.record, np.uint64)[permutation].astype("<u8"),
        "name_end": name_end,
        "names": np.frombuffer(bytes(names), np.uint8),
    }
    # Breadth-first order makes parent[1:] non-decreasing, so each directory's children
    # are the run of entries naming it.
    child_count = np.bincount(parent[1:], minlength=count).astype("<u4")
    child_start = (np.searchsorted(parent[1:], np.arange(count), "left") + 1).astype("<u4")
    child_start[child_count == 0] = 0
    columns["child_start"] = child_start
    columns["child_count"] = child_count

    file_type = columns["mode"] & S_IFMT
    nlink = np.ones(count, "<u4")
    is_file = file_type == S_IFREG
    if is_file.any():
        records = columns["record"][is_file].astype(np.int64)
        sharing = np.bincount(records)
        nlink[is_file] = sharing[records]
    # Every name of a hard-linked file reports the first name's inode (format 4).
    first_link = np.zeros(count, "<u4")
    linked = np.flatnonzero(is_file & (nlink > 1))
    if len(linked):
        linked_records = columns["record"][linked].astype(np.int64)
        lowest = np.full(int(linked_records.max()) + 1, count, np.int64)
        np.minimum.at(lowest, linked_records, linked)
        first_link[linked] = lowest[linked_records]
    columns["first_link"] = first_link
    is_dir = file_type == S_IFDIR
    subdirs = np.bincount(parent[1:][is_dir[1:]], minlength=count)
    nlink[is_dir] = 2 + subdirs[is_dir]
    columns["nlink"] = nlink

    by_hash = np.argsort(hashes, kind="stable")  # ties keep entry order
    columns["path_hash"] = hashes[by_hash].astype("<u4")
    columns["path_entry"] = by_hash.astype("<u4")
    tables = {name: columns[name] for name, _ in SECTIONS}
    if rows.xattrs:
        tables.update(_xattr_sections(rows.xattrs, position, nlink, first_link))
    return tables


def _xattr_sections(encoded: dict[int, bytes], position: np.ndarray, nlink: np.ndarray,
                    first_link: np.ndarray) -> dict[str, np.ndarray]:
    """Format section 4c's three columns: each list under its file's inode entry (the
    first name of a hard-linked file, which breadth-first order may put elsewhere than
    the name the writer met first)."""
    by_owner: dict[int, bytes] = {}
    for row, attributes in encoded.items():
        entry = int(position[row])
        by_owner[int(first_link[entry]) if nlink[entry] > 1 and first_link[entry] else entry] = attributes
    return xattr_columns(by_owner)


def xattr_columns(by_owner: dict[int, bytes]) -> dict[str, np.ndarray]:
    """Section 4c's three columns from each inode entry's encoded attributes: the
    entries in order, where each one's list starts, and the lists one after another
    (also the writer's, :mod:`packfs.write.tablestream`)."""
    owners = sorted(by_owner)
    starts = [0]
    data = bytearray()
    for owner in owners:
        data += by_owner[owner]
        starts.append(len(data))
    return {"xattr_entry": np.array(owners, "<u4"), "xattr_start": np.array(starts, "<u8"),
            "xattr_data": np.frombuffer(bytes(data), np.uint8)}


def table_image(tables: dict[str, np.ndarray]) -> tuple[bytearray, dict[str, tuple[int, int]]]:
    """The sections laid out in memory as an archive lays them out in the file (each
    64-byte aligned), and each one's span: a table a reader can use without a file."""
    image = bytearray()
    spans: dict[str, tuple[int, int]] = {}
    for name, _ in SECTIONS:
        image += bytes(-len(image) % SECTION_ALIGNMENT)
        start = len(image)
        image += tables[name].data.cast("B")
        spans[name] = (start, len(image))
    return image, spans
