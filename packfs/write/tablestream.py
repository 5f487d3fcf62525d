"""Building the path table and the lookup index (format sections 4, 4c and 4d) from
the writer's entries in bounded memory, whatever their number.

The entries are sorted in runs by their path with ``/`` replaced by NUL (names hold no
NUL, so this compares paths component by component: depth-first order, siblings sorted
bytewise) and merged (:mod:`packfs.write.spill`).  Walking that order with a stack of
the open directories gives each entry its parent and each directory its children (they
follow it, and every entry of the same depth after them follows them), and adds the
directories no entry named.  Breadth-first order is depth-first order stably sorted by
depth, so each entry is appended to its depth's chunks and the depths, concatenated,
are the table's order: numpy then lays out the columns a chunk at a time, into
temporary files the writer copies into the archive.  The hash-sorted columns and the
lookup index, sorted by (path hash, entry), are sorted in runs and merged by numpy.

What stays in memory grows with the number of hard links and of entries with extended
attributes only.  The output is byte for byte what :func:`packfs.core.tablebuild.
build_tables` and :func:`packfs.write.indexbuild.build_lookup_index` lay out.
"""

from __future__ import annotations

import os
from typing import BinaryIO, Iterator

import numpy as np

from ..errors import PackError
from ..format import INDEX_ROW, NO_RECORD, S_IFDIR, S_IFMT, S_IFREG, SECTIONS, crc32
from ..core.tablebuild import xattr_columns
from .spill import KeyedRuns, RowRuns, gather, ranges, temporary_file

__all__ = ["TableStream", "StreamedTable", "DEFAULT_BUDGET"]

DEFAULT_BUDGET = 1 << 29
# Bytes of memory a row held costs, by where it is held (Python tuples while sorting by
# path, numpy rows after): the budget divided by these gives the rows held at a time.
_SORT_ROW_COST = 1000
_LEVEL_ROW_COST = 2000  # a fifth of the budget: the walk's rows wait beside the merge's
_INDEX_ROW_COST = 1000
_COPY_CHUNK = 1 << 20
_INDEX_BLOCK = 1 << 14  # index rows laid out at a time
_INDEX_BYTES = 1 << 22  # and at most this many bytes of their paths

# A depth's entries as the walk leaves them, before their places are known.
_LEVEL_ROW = np.dtype([
    ("parent", "<u4"), ("mode", "<u4"), ("uid", "<u4"), ("gid", "<u4"), ("mtime_ns", "<i8"),
    ("size", "<u8"), ("record", "<u8"), ("crc", "<u4"), ("offset", "<u8"), ("first_child", "<u4"),
    ("child_count", "<u4"), ("subdirs", "<u4"), ("hash", "<u4"), ("name_length", "<u4"),
    ("path_length", "<u4")])
# Section 21's fixed part of a row (format section 4d).
_INDEX_FIXED = np.dtype([
    ("path_hash", "<u4"), ("entry", "<u4"), ("mode", "<u4"), ("uid", "<u4"), ("gid", "<u4"),
    ("nlink", "<u4"), ("inode", "<u4"), ("crc", "<u4"), ("mtime_ns", "<i8"), ("size", "<u8"),
    ("record", "<u8"), ("offset", "<u8"), ("path_length", "<u4")])
assert _INDEX_FIXED.itemsize == INDEX_ROW.size

# The fields of a row given to TableStream.add, after its sort key and sequence number.
_MODE, _UID, _GID, _MTIME, _SIZE, _RECORD, _CRC, _OFFSET, _XATTRS, _LINK = range(2, 12)


class TableStream:
    """Collects the entries of an archive being written, in any order, and lays out
    its table and lookup index in temporary files in ``directory``, holding about
    ``budget`` bytes."""

    def __init__(self, directory: str | None, budget: int = DEFAULT_BUDGET) -> None:
        self.directory = directory
        self.budget = budget
        # Paths count twice: the row's key and, once walked, its path.
        self._runs = RowRuns(directory, budget // _SORT_ROW_COST, budget // 4)
        self._added = 0
        self._link_targets: set[bytes] = set()

    def add(self, path: bytes, mode: int, uid: int, gid: int, mtime_ns: int, size: int, record: int,
            crc: int = 0, offset: int = 0, xattrs: bytes = b"", link_to: bytes = b"") -> None:
        """Add an entry: ``path`` (archive key), its attributes, its data record and
        that record's CRC and offset; ``xattrs`` encoded (format 4c); ``link_to``, for a
        hard link, the path of an earlier file entry whose attributes it takes (its own
        are ignored).  A duplicate path is an error when the table is laid out (the
        root directory may be given again: the last one is kept)."""
        link_key = link_to.replace(b"/", b"\0")
        if link_to:
            self._link_targets.add(link_key)
        self._runs.add((path.replace(b"/", b"\0"), self._added, mode, uid, gid, mtime_ns, size, record,
                        crc, offset, xattrs, link_key), len(path) + len(xattrs))
        self._added += 1

    def finish(self) -> StreamedTable:
        """Lay out the table and the index (once)."""
        try:
            walk = _Walk(self.directory, self.budget, self._link_targets)
            walk.run(self._runs.sorted())
        finally:
            self._runs.close()
        return walk.lay_out()


# An entry of the walk whose descendants may still come, as a list (the walk's inner
# loop runs once an entry): its key, the prefix its descendants' keys start with, depth,
# place among its depth's entries, its parent's place, its row, whether it is a
# directory, and its children's count, subdirectories' count and the first one's place.
_KEY, _PREFIX, _DEPTH, _LOCAL, _PARENT, _ROW, _IS_DIR, _CHILDREN, _SUBDIRS, _FIRST_CHILD = range(10)


def _implicit_directory(key: bytes) -> tuple:
    return (key, -1, S_IFDIR | 0o755, 0, 0, 0, 0, NO_RECORD, 0, 0, b"", b"")


def _label(key: bytes) -> str:
    return os.fsdecode(key.replace(b"\0", b"/"))


class _Walk:
    """The depth-first walk of the sorted entries: each entry's place in its depth, and
    its depth's chunks of rows in a temporary file."""

    def __init__(self, directory: str | None, budget: int, link_targets: set[bytes]) -> None:
        self.directory = directory
        self.budget = budget
        self.counts: list[int] = []  # entries of each depth so far
        self.held: list[list[tuple]] = []  # each depth's rows not yet written
        self.held_paths: list[list[bytes]] = []
        self.held_rows = 0
        self.held_bytes = 0
        self.hold_limit = max(1, budget // _LEVEL_ROW_COST)
        self.hold_bytes = max(1 << 16, budget // 16)  # long paths: 20 KiB in a tree 10,000 deep
        self.chunks: list[list[tuple[int, int, int]]] = []  # each depth's (file offset, rows, path bytes)
        self.levels = temporary_file(directory)
        self.levels_end = 0
        self.xattrs: dict[tuple[int, int], bytes] = {}
        self.link_targets = link_targets
        self.targets: dict[bytes, tuple] = {}  # path -> (row, depth, local) of entries hard links name
        self.links: list[tuple] = []  # (row, depth, local) of hard links
        self.dirs = 0

    def run(self, rows: Iterator[tuple]) -> None:
        stack: list[list] = []
        previous: tuple | None = None
        close = self._close
        counts = self.counts
        for row in rows:
            key = row[0]
            if previous is not None and key == previous[0]:
                if key == b"" and row[_MODE] & S_IFMT == S_IFDIR and previous[_MODE] & S_IFMT == S_IFDIR:
                    stack[0][_ROW] = row  # the root given again: the last one counts
                    previous = row
                    continue
                raise PackError(f"duplicate path {_label(key)!r}")
            previous = row
            if not key:
                stack.append(self._open(None, b"", 0, row))
                continue
            if not stack:
                stack.append(self._open(None, b"", 0, _implicit_directory(b"")))
            top = stack[-1]
            while not key.startswith(top[_PREFIX]) and len(stack) > 1:
                close(stack.pop())
                top = stack[-1]
            depth = key.count(b"\0") + 1
            if top[_DEPTH] + 1 < depth:  # directories no entry named: made with mode 0o755
                parts = key.split(b"\0")
                for level in range(top[_DEPTH] + 1, depth):
                    self._check_directory(top, b"\0".join(parts[:level]))
                    top = self._open(top, b"\0".join(parts[:level]), level, _implicit_directory(b"\0".join(parts[:level])))
                    stack.append(top)
            if not top[_IS_DIR]:
                self._check_directory(top, key)
            # self._open(top, key, depth, row), inline: this loop runs once an entry.
            if len(counts) <= depth:
                self._add_depths(depth)
            local = counts[depth]
            counts[depth] = local + 1
            is_dir = row[_MODE] & S_IFMT == S_IFDIR
            top[_CHILDREN] += 1
            if top[_CHILDREN] == 1:
                top[_FIRST_CHILD] = local
            if is_dir:
                top[_SUBDIRS] += 1
            stack.append([key, key + b"\0", depth, local, top[_LOCAL], row, is_dir, 0, 0, 0])
        while stack:
            close(stack.pop())
        if previous is None:  # no entry at all: the root alone
            close(self._open(None, b"", 0, _implicit_directory(b"")))

    @staticmethod
    def _check_directory(top: list, child: bytes) -> None:
        if not top[_IS_DIR]:
            raise PackError(f"{_label(child)!r} is inside {_label(top[_KEY])!r}, which is not a directory")

    def _add_depths(self, depth: int) -> None:
        """Make the lists of every depth down to ``depth``."""
        while len(self.counts) <= depth:
            self.counts.append(0)
            self.held.append([])
            self.held_paths.append([])
            self.chunks.append([])

    def _open(self, parent: list | None, key: bytes, depth: int, row: tuple) -> list:
        counts = self.counts
        if len(counts) <= depth:
            self._add_depths(depth)
        local = counts[depth]
        counts[depth] = local + 1
        is_dir = row[_MODE] & S_IFMT == S_IFDIR
        if parent is None:
            return [key, b"", depth, local, 0, row, is_dir, 0, 0, 0]
        parent[_CHILDREN] += 1
        if parent[_CHILDREN] == 1:
            parent[_FIRST_CHILD] = local
        if is_dir:
            parent[_SUBDIRS] += 1
        return [key, key + b"\0", depth, local, parent[_LOCAL], row, is_dir, 0, 0, 0]

    def _close(self, node: list) -> None:
        """Append ``node`` to its depth's rows: a depth's entries are closed in the order
        they were opened, as the walk leaves one before it meets the next."""
        key, _, depth, local, parent, row, is_dir, children, subdirs, first_child = node
        path = key.replace(b"\0", b"/")
        if is_dir:
            self.dirs += 1
        if row[_XATTRS]:
            self.xattrs[(depth, local)] = row[_XATTRS]
        if row[_LINK]:
            self.links.append((row, depth, local))
        if key in self.link_targets:
            self.targets[key] = (row, depth, local)
        self.held[depth].append((
            parent, row[2], row[3], row[4], row[5], row[6], row[7], row[8], row[9], first_child, children,
            subdirs, crc32(path), len(key) - key.rfind(b"\0") - 1, len(path)))
        self.held_paths[depth].append(path)
        self.held_rows += 1
        self.held_bytes += len(path)
        if self.held_rows >= self.hold_limit or self.held_bytes >= self.hold_bytes:
            for level in range(len(self.held)):
                self._write_level(level)
            self.held_rows = self.held_bytes = 0

    def _write_level(self, depth: int) -> None:
        rows = self.held[depth]
        if not rows:
            return
        data = np.array(rows, _LEVEL_ROW).tobytes()
        paths = b"".join(self.held_paths[depth])
        self.levels.write(data)
        self.levels.write(paths)
        self.chunks[depth].append((self.levels_end, len(rows), len(paths)))
        self.levels_end += len(data) + len(paths)
        self.held[depth] = []
        self.held_paths[depth] = []

    def _resolve_links(self) -> dict[tuple[int, int], dict[str, object]]:
        """Each hard link's attributes from its file (an earlier file entry), and the
        link count and first name of every name of a linked file, by (depth, place)."""
        patches: dict[tuple[int, int], dict[str, object]] = {}
        resolved: dict[bytes, tuple] = {}
        names: dict[int, list[tuple[int, int]]] = {}  # record -> its names
        for row, depth, local in sorted(self.links, key=lambda link: link[0][1]):
            target = self.targets.get(row[_LINK])
            target_row = None if target is None else resolved.get(row[_LINK], target[0])
            if target_row is None or target_row[1] > row[1] or target_row[_MODE] & S_IFMT != S_IFREG:
                raise PackError(f"hard link {_label(row[0])!r} points to {_label(row[_LINK])!r}, "
                                f"which is not an earlier file entry")
            own = (row[0], row[1]) + target_row[2:_XATTRS] + (b"", b"")
            resolved[row[0]] = own
            patches[(depth, local)] = dict(zip(("mode", "uid", "gid", "mtime_ns", "size", "record", "crc", "offset"),
                                               own[_MODE:_XATTRS]))
            record = own[_RECORD]
            if record not in names:
                original = self.targets[row[_LINK]]
                while original[0][_LINK]:  # a link to a link: the file is the first one's
                    original = self.targets[original[0][_LINK]]
                names[record] = [(original[1], original[2])]
            names[record].append((depth, local))
        for record_names in names.values():
            first = min(record_names)
            for place in record_names:
                patches.setdefault(place, {}).update(nlink=len(record_names), first_link=first)
        self.links, self.targets = [], {}
        return patches

    def lay_out(self) -> StreamedTable:
        for level in range(len(self.held)):
            self._write_level(level)
        self.levels.flush()
        patches = self._resolve_links()
        by_depth: dict[int, list[tuple[int, dict[str, object]]]] = {}
        for (depth, local), patch in sorted(patches.items()):
            by_depth.setdefault(depth, []).append((local, patch))
        starts = [0]
        for count in self.counts:
            starts.append(starts[-1] + count)
        table = StreamedTable(self.directory, starts[-1], self.dirs)
        index = KeyedRuns(self.directory, _INDEX_FIXED, self.budget // _INDEX_ROW_COST, with_bytes=True)
        try:
            for depth, chunks in enumerate(self.chunks):
                local = 0
                for at, count, path_bytes in chunks:
                    self.levels.seek(at)
                    rows = np.frombuffer(self.levels.read(count * _LEVEL_ROW.itemsize), _LEVEL_ROW).copy()
                    paths = np.frombuffer(self.levels.read(path_bytes), np.uint8)
                    table.add_rows(depth, local, rows, paths, starts, by_depth.get(depth, ()), index)
                    local += count
            self.levels.close()
            table.add_xattrs(self.xattrs, starts)
            table.add_index(index)
        except BaseException:
            table.close()
            raise
        finally:
            index.close()
        return table


_COLUMNS = [name for name, _ in SECTIONS if name not in ("path_hash", "path_entry")]


class StreamedTable:
    """A table and lookup index laid out in temporary files: what the writer copies
    into the archive (:meth:`section` for each of sections 4, 4c, and the index)."""

    def __init__(self, directory: str | None, entry_count: int, dir_count: int) -> None:
        self.entry_count = entry_count
        self.dir_count = dir_count
        self._files: dict[str, BinaryIO] = {}
        self._directory = directory
        self._names_end = 0
        self.xattr_columns: dict[str, np.ndarray] = {}
        self._page_cache: dict[int, list[tuple[int, int, int]]] = {}
        self.index_length = 0
        for name in _COLUMNS + ["path_hash", "path_entry", "index", "index_ends"]:
            self._files[name] = temporary_file(directory)

    def add_rows(self, depth: int, first: int, rows: np.ndarray, paths: np.ndarray, starts: list[int],
                 patches: object, index: KeyedRuns) -> None:
        """Lay out the entries ``first`` .. of depth ``depth`` (``starts``: where each
        depth begins in breadth-first order)."""
        count = len(rows)
        entry = starts[depth] + first + np.arange(count, dtype=np.int64)
        nlink = np.ones(count, np.uint32)
        first_link = np.zeros(count, np.uint32)
        for local, patch in patches:  # type: ignore[attr-defined]
            if first <= local < first + count:
                at = local - first
                for name, value in patch.items():
                    if name == "nlink":
                        nlink[at] = value
                    elif name == "first_link":
                        link_depth, link_local = value  # type: ignore[misc]
                        first_link[at] = starts[link_depth] + link_local
                    else:
                        rows[name][at] = value
        mode = rows["mode"]
        is_dir = mode & S_IFMT == S_IFDIR
        nlink = np.where(is_dir, 2 + rows["subdirs"], nlink).astype("<u4")
        parent = (rows["parent"].astype(np.int64) + starts[depth - 1]) if depth else np.zeros(count, np.int64)
        child_count = rows["child_count"]
        below = starts[depth + 1] if depth + 1 < len(starts) else 0
        child_start = np.where(child_count > 0, rows["first_child"].astype(np.int64) + below, 0)
        path_ends = np.cumsum(rows["path_length"].astype(np.int64))
        names = gather(paths, path_ends - rows["name_length"], rows["name_length"].astype(np.int64))
        name_end = self._names_end + np.cumsum(rows["name_length"].astype(np.int64))
        if count:
            self._names_end = int(name_end[-1])
        columns = {
            "parent": parent.astype("<u4"), "mode": mode, "uid": rows["uid"], "gid": rows["gid"],
            "mtime_ns": rows["mtime_ns"], "size": rows["size"], "record": rows["record"],
            "child_start": child_start.astype("<u4"), "child_count": child_count,
            "name_end": name_end.astype("<u8"), "nlink": nlink, "first_link": first_link, "names": names,
        }
        for name in _COLUMNS:
            self._files[name].write(np.ascontiguousarray(columns[name]).data.cast("B"))
        has_record = ~is_dir
        linked = (mode & S_IFMT == S_IFREG) & (nlink > 1) & (first_link > 0)
        fixed = np.zeros(count, _INDEX_FIXED)
        fixed["path_hash"] = rows["hash"]
        fixed["entry"] = entry
        for name in ("mode", "uid", "gid", "mtime_ns", "size"):
            fixed[name] = rows[name]
        fixed["nlink"] = nlink
        fixed["inode"] = np.where(linked, first_link.astype(np.int64), entry) + 1
        fixed["crc"] = np.where(has_record, rows["crc"], 0)
        fixed["record"] = np.where(has_record, rows["record"], np.uint64(NO_RECORD))
        fixed["offset"] = np.where(has_record, rows["offset"], 0)
        fixed["path_length"] = rows["path_length"]
        keys = (rows["hash"].astype(np.uint64) << np.uint64(32)) | entry.astype(np.uint64)
        index.add(keys, fixed, rows["path_length"], paths.tobytes())

    def add_xattrs(self, xattrs: dict[tuple[int, int], bytes], starts: list[int]) -> None:
        """Section 4c's columns: each list under its file's inode entry."""
        if not xattrs:
            return
        by_entry = {starts[depth] + local: data for (depth, local), data in xattrs.items()}
        nlink_file, first_file = self._files["nlink"], self._files["first_link"]
        by_owner: dict[int, bytes] = {}
        for entry, data in by_entry.items():
            nlink_file.seek(4 * entry)
            first_file.seek(4 * entry)
            nlink = int.from_bytes(nlink_file.read(4), "little")
            first = int.from_bytes(first_file.read(4), "little")
            by_owner[first if nlink > 1 and first else entry] = data
        nlink_file.seek(0, os.SEEK_END)
        first_file.seek(0, os.SEEK_END)
        self.xattr_columns = xattr_columns(by_owner)

    def add_index(self, index: KeyedRuns) -> None:
        """Merge the index rows: sections path_hash, path_entry and 21."""
        size = _INDEX_FIXED.itemsize
        row_end = 0
        for _keys, block, block_lengths, block_data in index.merged():
            block_ends = np.cumsum(block_lengths)
            at = 0
            while at < len(block):  # a part at a time: bounds the index arrays made below
                data_start = int(block_ends[at - 1]) if at else 0
                end = min(at + _INDEX_BLOCK, int(np.searchsorted(block_ends, data_start + _INDEX_BYTES, "right")))
                end = max(end, at + 1)
                fixed, lengths = block[at:end], block_lengths[at:end]
                data = block_data[data_start : int(block_ends[end - 1])]
                at = end
                self._files["path_hash"].write(np.ascontiguousarray(fixed["path_hash"]).data.cast("B"))
                self._files["path_entry"].write(np.ascontiguousarray(fixed["entry"]).data.cast("B"))
                row_lengths = lengths + size
                ends = np.cumsum(row_lengths)
                starts = ends - row_lengths
                out = np.empty(int(ends[-1]), np.uint8)
                out[(starts[:, None] + np.arange(size)).ravel()] = fixed.view(np.uint8).reshape(-1)
                out[ranges(starts + size, lengths)] = data
                self._files["index"].write(out.data.cast("B"))
                self._files["index_ends"].write((ends + row_end).astype("<u8").data.cast("B"))
                row_end += int(ends[-1])
        self.index_length = row_end
        for file in self._files.values():
            file.flush()

    def section(self, name: str) -> Iterator[bytes]:
        """The bytes of section ``name`` (a table column, or "index"), a chunk at a time."""
        if name in self.xattr_columns:
            yield self.xattr_columns[name].tobytes()
            return
        if name.startswith("xattr_"):
            yield (bytes(8) if name == "xattr_start" else b"")  # no attributes: one start, 0
            return
        file = self._files[name]
        file.seek(0)
        while True:
            chunk = file.read(_COPY_CHUNK)
            if not chunk:
                return
            yield chunk

    def pages(self, page_size: int) -> list[tuple[int, int, int]]:
        """(first_hash, start, end) of each page of the index of at most ``page_size``
        bytes (one longer row is a page alone), never splitting a run of equal hashes:
        what :meth:`packfs.write.indexbuild.LookupIndex.pages` gives."""
        if page_size not in self._page_cache:
            self._page_cache[page_size] = self._pages(page_size)
        return self._page_cache[page_size]

    def _pages(self, page_size: int) -> list[tuple[int, int, int]]:
        ends_file, hash_file = self._files["index_ends"], self._files["path_hash"]
        ends_file.seek(0)
        hash_file.seek(0)
        block = 1 << 16  # rows read at a time (read() allocates what it is asked for)
        ends = np.zeros(0, np.int64)
        hashes = np.zeros(0, np.int64)
        base = 0  # the row ends[0] is
        exhausted = False
        pages: list[tuple[int, int, int]] = []
        start, first = 0, 0

        def more() -> bool:
            nonlocal ends, hashes, base, exhausted
            if exhausted:
                return False
            new_ends = np.frombuffer(ends_file.read(8 * block), "<u8").astype(np.int64)
            new_hashes = np.frombuffer(hash_file.read(4 * block), "<u4").astype(np.int64)
            if not len(new_ends):
                exhausted = True
                return False
            keep = max(first - 1 - base, 0)  # row first - 1 is still looked at
            ends = np.concatenate([ends[keep:], new_ends])
            hashes = np.concatenate([hashes[keep:], new_hashes])
            base += keep
            return True

        more()
        while True:
            # The first row past the page: its end is past start + page_size, it is not
            # the page's first row, and its hash differs from the row before it's.
            at = max(int(np.searchsorted(ends, start + page_size, "right")), first + 1 - base)
            while at >= len(ends) and more():
                at = max(int(np.searchsorted(ends, start + page_size, "right")), first + 1 - base)
            if at < len(ends) and hashes[at] == hashes[at - 1]:
                run_hash = hashes[at]  # the page cannot end inside a run of equal hashes
                at = int(np.searchsorted(hashes, run_hash, "right"))
                while at >= len(ends) and more():
                    at = int(np.searchsorted(hashes, run_hash, "right"))
            if at >= len(ends):
                if len(ends) and base + len(ends) > first:
                    pages.append((int(hashes[first - base]), start, int(ends[-1])))
                return pages
            pages.append((int(hashes[first - base]), start, int(ends[at - 1])))
            start, first = int(ends[at - 1]), base + at

    def page_crc(self, start: int, end: int) -> int:
        """The CRC of the index's bytes [start, end)."""
        index = self._files["index"]
        index.seek(start)
        crc = 0
        while start < end:
            chunk = index.read(min(_COPY_CHUNK, end - start))
            crc = crc32(chunk, crc)
            start += len(chunk)
        return crc

    def close(self) -> None:
        """Drop the temporary files."""
        for file in self._files.values():
            file.close()
        self._files = {}
