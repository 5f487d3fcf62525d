"""``verify``'s checks of format 1.4's tail and lookup index (format sections 4d, 4e):
every page CRC, the tail's spans against the header, and every index row against the
table, so that a reader that trusts a row or a page trusts what the table says."""

from __future__ import annotations

import hashlib

from ..format import INDEX_ROW, NO_RECORD, S_IFMT, S_IFREG, crc32
from .container import Container
from .pathtable import PathTable
from .tail import Tail

__all__ = ["tail_problems"]

_MAX_REPORTED = 10


def tail_problems(container: Container, table: PathTable, tail: Tail) -> list[str]:
    """Every rule of sections 4d and 4e that verify checks; [] if all hold."""
    problems: list[str] = []
    offsets = container.offsets
    data_records = tail.data_records
    for k, (start, end) in enumerate(tail.spans):
        record = data_records + 2 * k + 1
        stated = (int(offsets[record]), int(offsets[record + 1]))
        if stated != (start, end):
            problems.append(f"tail: section {k} at [{start}, {end}), the header says {list(stated)}")
    if int(offsets[data_records]) != tail.data_end:
        problems.append(f"tail: the data ends at {tail.data_end}, the header says {int(offsets[data_records])}")
    for region in range(len(tail.regions)):
        for page in range(tail.page_count(region)):
            start, end = tail.page_span(region, page)
            if crc32(container.pread(start, end)) != tail.page_crc(region, page):
                problems.append(f"tail: {tail.region_name(region)}: page {page} (bytes [{start}, {end})) fails "
                                f"its checksum")
    problems.extend(_index_problems(container, table, tail))
    return problems


def _index_problems(container: Container, table: PathTable, tail: Tail) -> list[str]:
    problems: list[str] = []
    columns = table.arrays
    count = table.entry_count
    import numpy as np  # here, not at import: a mount, which never verifies, does not load numpy

    seen = np.zeros(count, bool)
    # A row's path is checked without building the table's path of each entry, which
    # costs its depth (a tree 10,000 levels deep took minutes): the row's last name must
    # be the entry's, and what comes before it the path in the row of the entry's
    # parent.  Each row leaves a digest of its path as a directory ("a/b/") and of the
    # prefix it claims ("a/"); the second pass matches every prefix with its parent's
    # row, so by induction from the root every row names its entry's path.
    as_directory = np.zeros(count, np.uint64)
    claimed_prefix = np.zeros(count, np.uint64)
    crcs, offsets = container.crcs, container.offsets
    previous_hash = -1
    rows = 0
    for page in range(tail.index_page_count):
        located = tail.index_page(page)
        data = container.pread(located.start, located.end)
        if crc32(data) != located.crc:
            problems.append(f"lookup index: page {page} fails its checksum")
            continue
        position = 0
        first = True
        while position < len(data) and len(problems) < _MAX_REPORTED:
            if len(data) - position < INDEX_ROW.size:
                problems.append(f"lookup index: page {page} ends inside a row")
                break
            (path_hash, entry, mode, uid, gid, nlink, inode, crc, mtime_ns, size, record, offset,
             path_length) = INDEX_ROW.unpack_from(data, position)
            path = data[position + INDEX_ROW.size : position + INDEX_ROW.size + path_length]
            position += INDEX_ROW.size + path_length
            rows += 1
            if first and path_hash != located.first_hash:
                problems.append(f"lookup index: page {page} starts with hash {path_hash:#010x}, the tail says "
                                f"{located.first_hash:#010x}")
            if first and path_hash == previous_hash:
                problems.append(f"lookup index: hash {path_hash:#010x} is split between pages {page - 1} and {page}")
            if path_hash < previous_hash:
                problems.append(f"lookup index: rows are not sorted by hash on page {page}")
            previous_hash, first = path_hash, False
            if len(path) != path_length or entry >= count or seen[entry]:
                problems.append(f"lookup index: page {page}: a row of entry {entry} is cut, beyond the table "
                                f"or repeated")
                continue
            seen[entry] = True
            name = table.name(entry)
            prefix = path[: len(path) - len(name)]
            if not path.endswith(name) or (prefix and not prefix.endswith(b"/")) or (entry == 0 and path):
                problems.append(f"lookup index: the row of entry {entry} names {path!r}, not a path ending in "
                                f"its name {name!r}")
                continue
            as_directory[entry] = _digest(path + b"/" if entry else b"")
            claimed_prefix[entry] = _digest(prefix)
            linked = (int(columns["mode"][entry]) & S_IFMT == S_IFREG and int(columns["nlink"][entry]) > 1
                      and int(columns["first_link"][entry]))
            expected = (crc32(path), int(columns["mode"][entry]), int(columns["uid"][entry]),
                        int(columns["gid"][entry]), int(columns["nlink"][entry]),
                        (int(columns["first_link"][entry]) if linked else entry) + 1, int(columns["mtime_ns"][entry]),
                        int(columns["size"][entry]), int(columns["record"][entry]))
            if (path_hash, mode, uid, gid, nlink, inode, mtime_ns, size, record) != expected:
                problems.append(f"lookup index: the row of {path!r} does not match the table")
                continue
            if record != NO_RECORD:
                if record >= tail.data_records or (crc, offset) != (int(crcs[record]), int(offsets[record])):
                    problems.append(f"lookup index: the row of {path!r} does not match its record")
    if rows != count or not seen.all():
        problems.append(f"lookup index: {rows} rows for {count} entries")
    elif count > 1:
        parents = columns["parent"][1:].astype(np.int64)
        wrong = np.flatnonzero(claimed_prefix[1:] != as_directory[parents]) + 1
        for entry in wrong[: _MAX_REPORTED].tolist():
            problems.append(f"lookup index: the row of {table.full_path(entry)!r} does not name its directory's "
                            f"path")
    return problems[:_MAX_REPORTED]


def _digest(path: bytes) -> int:
    """64 bits of BLAKE2b: unlike a CRC, no row can be made to match another's path."""
    return int.from_bytes(hashlib.blake2b(path, digest_size=8).digest(), "little")
