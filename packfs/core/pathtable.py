"""The path table (format section 4), read in place from the memory map.

Opening needs no numpy (it costs a tenth of a second of start-up, and ``packfs mount``
or ``cat`` should not pay it): items are read through memoryviews, and numpy views of
whole columns are made on first use, for validation and summaries.  The writer's side
is ``tablebuild``."""

from __future__ import annotations

import mmap

from bisect import bisect_left
from typing import TYPE_CHECKING, Any, Callable, Iterable, Union

from .container import Container
from .lookupindex import LookupIndex
from .tail import Column, FetchMany, ItemCode, PagedColumn, prefetch_pages, section_region

from ..errors import ChecksumError, ClosedArchiveError, FormatError
from ..format import (CODEC_STORED, NO_RECORD, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, SECTION_ALIGNMENT, SECTIONS, Footer, crc32,
                      symlink_length_problem)

if TYPE_CHECKING:
    import numpy as np

    from .codecs import CodecTable

__all__ = ["PathTable"]

# "_names" and "_mm" (the names' bytes) -> section 12, and so on: what __getattr__ opens.
_SECTION_OF = {"_" + name: k for k, (name, _) in enumerate(SECTIONS)}
_SECTION_OF["_mm"] = _SECTION_OF["_names"]


_VALID_TYPES = (S_IFDIR, S_IFREG, S_IFLNK)
# The sections' numpy dtypes as memoryview item codes and sizes (the format is
# little-endian, like every machine packfs runs on).
_ITEM_CODE: dict[str, ItemCode] = {"<u4": "I", "<i8": "q", "<u8": "Q", "u1": "B"}
_ITEM_SIZE = {"<u4": 4, "<i8": 8, "<u8": 8, "u1": 1}
_SLASH = ord("/")
# Directory path -> entry, so a lookup checks one name instead of walking up the table.
# Bounded in bytes of keys (each counted with a dict slot's overhead), so memory is
# independent of the archive's size and of how long its paths are.
_DIRECTORY_CACHE_BYTES = 4 << 20
_MAX_CANDIDATES = 64
_CACHE_ITEM_OVERHEAD = 100
# Table pages that lookups and listings fault in stay mapped, and count in RSS, until
# released: a find through a mount of 10M entries left 290 MiB of them in the daemon.
# Releasing them after every so many entries used keeps that flat (24-36 MiB after the
# same find, at the same speed); the pages stay in the page cache.  Random lookups are
# another matter: a fault can map a whole large folio, so RSS approaches the size of
# the columns a lookup reads (about 30 bytes per entry) whatever the release rate.
_RELEASE_AFTER_ENTRIES = 1 << 13


class PathTable:
    """The path table of an open archive, as views into the memory map.

    Opening checks the sections' geometry (and CRCs when checking data): O(1) work
    apart from the CRCs, whatever the number of entries.  The tree rules of format
    section 5 are checked where a value is used: every accessor below checks what it
    reads before anything indexes with it, so a hostile table ends in FormatError,
    never in IndexError, a loop or a path outside the tree.
    :func:`packfs.core.tablecheck.validate` checks them all at once (``verify`` does),
    from above: this module does not import it, so the two are not one circle.
    """

    # Each section's items, as a memoryview set in __init__ (format.SECTIONS): unchecked
    # access; every accessor below checks a value before anything indexes with it.
    _parent: memoryview
    _mode: memoryview
    _uid: memoryview
    _gid: memoryview
    _mtime_ns: memoryview
    _size: memoryview
    _record: memoryview
    _child_start: memoryview
    _child_count: memoryview
    _name_end: memoryview
    _nlink: memoryview
    _first_link: memoryview
    _names: memoryview
    _path_hash: memoryview
    _path_entry: memoryview
    # Format 1.5's codec rows (section 4f), set by the archive when its footer has
    # FLAG_CODECS: a file's size is then held to its record's row, not its length.
    codecs: CodecTable | None = None

    def __init__(self, container: Container, footer: Footer,
                 image: tuple[bytes | bytearray, dict[str, tuple[int, int]]] | None = None) -> None:
        """``image``, for a table that is not in the archive (an FFRecord packed folder's,
        built at open): the sections laid out in memory, and each one's span there."""
        self.container = container
        self.path = container.path
        self.entry_count = footer.entry_count
        self.data_records = footer.data_records
        self._section_span: dict[str, tuple[int, int]] = {}
        self._arrays: dict[str, np.ndarray] | None = None
        self._directory_cache: dict[bytes, int] = {}
        self._directory_cache_bytes = 0
        self._derived_first_link: dict[int, int] | None = None
        self._entries_used = 0
        # From here every use of a data record checks it ends before the table.
        container.set_data_area(footer.data_records)
        self._in_memory = image is not None
        self._tail = container.tail if image is None else None
        self._paged = False  # read page by page from a source without a map (a 1.4 archive's)
        mm: Union[bytes, bytearray, memoryview, mmap.mmap, None]
        if image is not None:
            mm, self._section_span = image[0], dict(image[1])
        else:
            self._find_sections(container, footer)
            mm = container.mapping
            if not container.zero_copy and self._tail is None:
                # A source without a map (a remote one) and an archive without a tail: the
                # table is read into memory once, and its sections' spans are shifted to
                # where they are in that copy.
                low = self._section_span[SECTIONS[0][0]][0]
                mm = container.pread(low, self._section_span[SECTIONS[-1][0]][1])
                self._section_span = {name: (start - low, end - low)
                                      for name, (start, end) in self._section_span.items()}
                self._in_memory = True
        self._table_span = (self._section_span[SECTIONS[0][0]][0], self._section_span[SECTIONS[-1][0]][1])
        self._views: list[Column] = []
        self._names_start, names_end = self._section_span["names"]
        self._names_size = names_end - self._names_start
        if self._tail is not None:
            # Format 1.4: each section is checked (and, remotely, read) when first used;
            # __getattr__ makes its view then, and checks the root's rules it holds.
            self._paged = not container.zero_copy
            if self._paged:
                self._names_start = 0
                self._index = LookupIndex(self._tail, container.source.read, container.page_cache, repr(self.path))
            return
        # Item access through memoryviews is several times faster than numpy scalars.
        assert mm is not None  # a map, a table read whole, or an image: not paged
        view = memoryview(mm)
        for name, dtype in SECTIONS:
            start, end = self._section_span[name]
            item_view = view[start:end].cast(_ITEM_CODE[dtype])
            self._views.append(item_view)
            setattr(self, "_" + name, item_view)
        view.release()
        # The names' bytes: a map, a table read whole, an image, or (paged) a column of
        # bytes; each slices to bytes (a test's memoryview-mapped source to a memoryview,
        # which compares and searches alike).
        self._mm: Any = mm
        self._check_root("_mode")
        self._check_root("_name_end")

    def _check_root(self, attribute: str) -> None:
        """The rules of format section 5 about the root and the names section's length
        that section ``attribute`` holds (checked at open, or where it is first used)."""
        if attribute in ("_mode", "_parent"):
            if self._mode[0] & S_IFMT != S_IFDIR or self._parent[0] != 0:
                self.fail("entry 0 must be the root directory with parent 0 and an empty name")
        elif attribute == "_name_end":
            if self._name_end[0] != 0:
                self.fail("entry 0 must be the root directory with parent 0 and an empty name")
            last_end = self._name_end[self.entry_count - 1]
            if last_end != self._names_size:
                self.fail(f"names end at {last_end} but the names section has {self._names_size} bytes")

    def __getattr__(self, attribute: str) -> object:
        # Only for attributes not set yet: a 1.4 table's sections, on first use.
        tail = self.__dict__.get("_tail")
        if tail is None or not attribute.startswith("_") or attribute not in _SECTION_OF:
            raise AttributeError(attribute)
        section = _SECTION_OF[attribute]
        name, dtype = SECTIONS[section]
        container = self.container
        if container.closed:  # a call that met the archive as it was being closed
            raise ClosedArchiveError("I/O operation on a closed archive")
        region = section_region(section)
        if self._paged:
            # The root's rules are checked when the pages holding them arrive.
            checks_root = attribute in ("_mode", "_parent", "_name_end")
            last_page = (self.entry_count - 1) * _ITEM_SIZE[dtype] // tail.page_size
            def check_root(page: int) -> None:
                if page in (0, last_page):
                    self._check_root(attribute)

            view: Column = PagedColumn(tail, region, _ITEM_CODE[dtype], _ITEM_SIZE[dtype], container.source.read,
                                       container.page_cache, on_fetch=check_root if checks_root else None)
        else:
            if container.check_data:
                container.check_region(region)
            start, end = self._section_span[name]
            view = container.view[start:end].cast(_ITEM_CODE[dtype])
        self._views.append(view)
        self.__dict__["_" + name] = view
        if name == "names":
            self.__dict__["_mm"] = view if self._paged else container.mapping
        if "_" + name in ("_mode", "_parent", "_name_end") and not self._paged:
            self._check_root("_" + name)
        return self.__dict__[attribute]

    def _find_sections(self, container: Container, footer: Footer) -> None:
        for k, (name, dtype) in enumerate(SECTIONS):
            record = footer.data_records + 2 * k + 1
            start, end = container.record_span(record)
            if start % SECTION_ALIGNMENT:
                raise FormatError(
                    f"{self.path!r}: section {name!r} starts at offset {start}, expected a "
                    f"multiple of {SECTION_ALIGNMENT}"
                )
            expected = None if name == "names" else self.entry_count * _ITEM_SIZE[dtype]
            if expected is not None and end - start != expected:
                raise FormatError(
                    f"{self.path!r}: section {name!r} is {end - start} bytes, expected "
                    f"{expected} for {self.entry_count} entries"
                )
            if container.check_data and container.tail is None:  # with a tail: when first used
                for checked, what in ((record - 1, f"the padding before path table section {name!r}"),
                                      (record, f"path table section {name!r}")):
                    if not container.record_crc_ok(checked):
                        raise ChecksumError(f"{self.path!r}: {what} (record {checked}): checksum mismatch")
            self._section_span[name] = (start, end)
        parity = footer.data_records + 2 * footer.section_count
        if container.check_data and container.tail is None and parity < container.record_count - 1 and not container.record_crc_ok(parity):
            raise ChecksumError(f"{self.path!r}: the parity record (record {parity}): checksum mismatch")

    @property
    def section_spans(self) -> tuple[tuple[int, int], ...] | None:
        """(start, end) of each column (format section 4's order) in the archive's own
        bytes; None where the table is not read in place (a legacy archive's, built at
        open, or one read into memory from a source without a map)."""
        if self._in_memory or self._paged:
            return None
        return tuple(self._section_span[name] for name, _ in SECTIONS)

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """numpy views of the whole sections, by name (numpy is imported on first use)."""
        if self._arrays is None:
            import numpy as np

            views = {name: getattr(self, "_" + name) for name, _ in SECTIONS}  # checks each, with a tail
            if self._paged:
                self._arrays = {name: np.frombuffer(memoryview(views[name][:]).cast("B"), dtype)
                                for name, dtype in SECTIONS}
                return self._arrays
            self._arrays = {
                name: np.frombuffer(self._mm, dtype, (end - start) // _ITEM_SIZE[dtype], start)
                for name, dtype in SECTIONS
                for start, end in [self._section_span[name]]
            }
        return self._arrays

    def close(self) -> None:
        """Release the item views and the caches; the container is its owner's to close."""
        self._directory_cache.clear()
        self._directory_cache_bytes = 0
        for item_view in self.__dict__.pop("_views", []):
            item_view.release()
        self._arrays = None

    # -- validation ------------------------------------------------------------------

    def fail(self, message: str) -> None:
        """Raise FormatError: the table breaks a rule, as ``message`` says; or
        ArchiveChangedError if the archive changed in place since it was opened, since a
        broken rule read from a rewritten map is that change's consequence."""
        self.container.changed_instead()
        raise FormatError(f"{self.path!r}: invalid path table: {message}")

    def release_pages(self) -> None:
        """Unmap the table's and the header's pages from this process (they stay in the
        page cache): mapped pages count in RSS, so a full scan (validation, or a daemon
        serving ``find``) would otherwise leave RSS at the table's size.  Later accesses
        fault back in only what they touch."""
        if self._in_memory or self._paged:
            return
        self.container.release(*self._table_span)
        self.container.release(0, self.container.data_start)

    # -- access ----------------------------------------------------------------------

    def lookup(self, key: bytes) -> int:
        """Entry index of full path ``key`` (no leading or trailing slash), or -1;
        ArchiveChangedError if the archive changed in place (Container.check_unchanged)."""
        return self.container.checked(self.lookup_unchecked, key)

    def lookup_unchecked(self, key: bytes) -> int:
        """:meth:`lookup` without the checks that the archive is unchanged, for a hot
        path that makes them once after everything it reads (Archive.read_path).

        One CRC and a binary search find the candidates; the parent directory (from a
        small cache, or by walking up the table) and the last name confirm one.  No
        recursion and no per-component hashing, so a path 10,000 levels deep costs
        one pass over its bytes."""
        if not key:
            return 0
        if self._paged:
            return self._find_in_index(key)
        self._note_use(1)
        hashes = self._path_hash
        digest = crc32(key)
        j = bisect_left(hashes, digest)
        count = self.entry_count
        if j == count or hashes[j] != digest:
            return -1
        slash = key.rfind(b"/")
        head, name = (b"", key) if slash < 0 else (key[:slash], key[slash + 1 :])
        parent = 0 if slash < 0 else self._directory_cache.get(head, -1)
        parents, entries, name_end, mm = self._parent, self._path_entry, self._name_end, self._mm
        base = self._names_start
        # Different paths may share a CRC, but a table that gives thousands of entries
        # one hash is hostile: each candidate costs a walk up the table, so their
        # number is capped (a sound table has a handful at most).
        last = min(count, j + _MAX_CANDIDATES)
        while j < last and hashes[j] == digest:
            entry = entries[j]
            if entry >= count:
                self.fail(f"path index slot {j} names entry {entry}, beyond the {count} entries")
            if entry and (parents[entry] == parent or parent < 0):
                start, end = name_end[entry - 1], name_end[entry]
                if mm[base + start : base + end] == name:
                    if not start < end <= self._names_size:
                        self.name(entry)  # raises, saying what is wrong
                    if parent < 0:
                        # The head is not cached: confirm it by walking up from the
                        # candidate's parent, then remember it.
                        if not self._path_is(self.parent(entry), head):
                            j += 1
                            continue
                        self._remember_directory(head, parents[entry])
                    if self._mode[entry] & S_IFMT == S_IFDIR:
                        # A walk looks up this directory's children next.
                        self._remember_directory(key, entry)
                    return entry
            j += 1
        return -1

    def prefetch_paths(self, keys: Iterable[bytes], fetch_many: FetchMany) -> None:
        """Before looking up ``keys`` one by one: fetch the lookup-index pages they need
        at once, with ``fetch_many`` (a remote 1.4 table's; nothing for any other)."""
        if self.__dict__.get("_paged"):
            self._index.prefetch(keys, fetch_many)

    def _find_in_index(self, key: bytes) -> int:
        """A remote 1.4 table's lookup: one page of the lookup index (format 4d), whose
        row also tells the columns and the header what a stat or a read of the entry
        needs, so neither fetches a page of its own."""
        row = self._index.find(key)
        if row is None:
            return -1
        entry = row.entry
        for name in ("mode", "uid", "gid", "mtime_ns", "size", "record", "nlink"):
            _paged(getattr(self, "_" + name)).hint(entry, getattr(row, name))
        linked = row.mode & S_IFMT == S_IFREG and row.nlink > 1
        _paged(self._first_link).hint(entry, row.inode - 1 if linked else 0)
        if row.record != NO_RECORD:
            container = self.container
            _paged(container.crc_items).hint(row.record, row.crc)
            _paged(container.offset_items).hint(row.record, row.offset)
            # The row gives the record's end only where its length is the size: with
            # codecs (format 4f) a record stored as it is; others read their end's page.
            codecs = self.codecs
            if codecs is not None:
                fetch_many = getattr(container.source, "read_ranges", None)
                if fetch_many is not None:  # both pages cold: fetched together, one round trip
                    prefetch_pages([(codecs.row_items(), [row.record << 4]),
                                    (container.offset_items, [row.record + 1])], fetch_many)
            if codecs is None or codecs.row(row.record, entry).codec == CODEC_STORED:
                _paged(container.offset_items).hint(row.record + 1, row.offset + row.size)
        return entry

    def _path_is(self, entry: int, key: bytes) -> bool:
        """Whether directory ``entry``'s full path is ``key``: names compared from the end
        up, each parent checked to come before its child (so the walk ends) and to be
        a directory (so no path resolves below a file or a symlink)."""
        names, name_end, base, mode = self._mm, self._name_end, self._names_start, self._mode
        end_of_key = len(key)
        while entry:
            if mode[entry] & S_IFMT != S_IFDIR:
                return False
            start, end = name_end[entry - 1], name_end[entry]
            if not start < end <= self._names_size:
                self.name(entry)  # raises, saying what is wrong
            length = end - start
            begin = end_of_key - length
            if begin < 0 or names[base + start : base + end] != key[begin:end_of_key]:
                return False
            if begin:
                if key[begin - 1] != _SLASH:
                    return False
                begin -= 1
            end_of_key = begin
            entry = self.parent(entry)
            if not entry and end_of_key:
                return False
        return end_of_key == 0

    def _remember_directory(self, key: bytes, entry: int) -> None:
        # Bounded in bytes, not keys: a key is a whole path, and a hostile archive's
        # paths can each be megabytes long.
        if self._directory_cache_bytes + len(key) > _DIRECTORY_CACHE_BYTES:
            self._directory_cache.clear()
            self._directory_cache_bytes = 0
            if len(key) > _DIRECTORY_CACHE_BYTES // 4:
                return
        self._directory_cache[key] = entry
        self._directory_cache_bytes += len(key) + _CACHE_ITEM_OVERHEAD

    def lookup_child(self, directory: int, name: bytes) -> int:
        """Entry index of ``name`` in directory entry ``directory``, or -1: a binary
        search of its children, which are sorted by name (format section 4)."""
        return self.container.checked(self._lookup_child, directory, name)

    def _lookup_child(self, directory: int, name: bytes) -> int:
        start, count = self._child_start[directory], self._child_count[directory]
        if self._mode[directory] & S_IFMT != S_IFDIR or not count:
            return -1
        if not directory < start <= self.entry_count - count:
            self.children(directory)  # raises, saying what is wrong
        names, name_end, base = self._mm, self._name_end, self._names_start
        low, high = start, start + count
        while low < high:
            middle = (low + high) // 2
            candidate = names[base + name_end[middle - 1] : base + name_end[middle]]
            if candidate < name:
                low = middle + 1
            elif candidate > name:
                high = middle
            else:
                if self._parent[middle] != directory:
                    self.children(directory)  # raises: a child naming another parent
                self.name(middle)  # checks the name is one a path can hold
                return middle
        return -1

    def inode(self, entry: int) -> int:
        """The inode number of ``entry``: entry + 1, except that every name of a
        hard-linked file reports its first name's, as on any POSIX file system."""
        if self._nlink[entry] > 1 and self._mode[entry] & S_IFMT == S_IFREG:
            return self._first_link_of(entry) + 1
        return entry + 1

    def inodes(self, children: range, modes: list[int]) -> list[int]:
        """:meth:`inode` of each entry in ``children`` (whose modes are ``modes``)."""
        inodes = list(range(children.start + 1, children.stop + 1))
        for i, nlink in enumerate(self._nlink[children.start : children.stop].tolist()):
            if nlink > 1 and modes[i] & S_IFMT == S_IFREG:
                inodes[i] = self._first_link_of(children.start + i) + 1
        return inodes

    def _first_link_of(self, entry: int) -> int:
        """The first (lowest) entry sharing file ``entry``'s record (format section 4,
        ``first_link``); derived once from the columns for a version 1.0 table."""
        first = self._first_link[entry]
        if first == 0:  # not recorded: a 1.0 archive (entry 0 is the root, never a file)
            if self._derived_first_link is None:
                self._derived_first_link = self._derive_first_links()
            first = self._derived_first_link.get(self._record[entry], entry)
        if first > entry or self._mode[first] & S_IFMT != S_IFREG or self._record[first] != self._record[entry]:
            self.fail(f"entry {entry}'s first link {first} is not an earlier name of the same file")
        return first

    def _derive_first_links(self) -> dict[int, int]:
        """record -> lowest entry, for hard-linked files only (version 1.0 tables)."""
        import numpy as np

        mode, nlink, record = self.column("mode"), self.column("nlink"), self.column("record")
        linked = np.flatnonzero(((mode & S_IFMT) == S_IFREG) & (nlink > 1))
        first: dict[int, int] = {}
        for entry, rec in zip(linked.tolist(), record[linked].tolist()):
            first.setdefault(rec, entry)  # ascending entries: the first seen is the lowest
        return first

    def name(self, entry: int) -> bytes:
        """Entry ``entry``'s name (the root's is empty), checked: non-empty, no '/' or NUL, not '.' or '..'."""
        if entry == 0:
            return b""
        start, end = self._name_end[entry - 1], self._name_end[entry]
        if not start < end <= self._names_size:
            self.fail(f"entry {entry} has an empty name or one outside the names section")
        name: bytes = self._mm[self._names_start + start : self._names_start + end]
        if b"/" in name or b"\0" in name or name == b"." or name == b"..":
            self.fail(f"entry {entry} has the name {name!r}: a name contains '/' or a NUL byte, or is '.' or '..'")
        return name

    def full_path(self, entry: int) -> bytes:
        """Entry ``entry``'s path from the root, names joined by '/'."""
        parts = []
        while entry:
            parts.append(self.name(entry))
            entry = self.parent(entry)
        return b"/".join(reversed(parts))

    def file_type(self, entry: int) -> int:
        """Entry ``entry``'s file type bits (S_IFDIR, S_IFREG or S_IFLNK), checked."""
        kind = self._mode[entry] & S_IFMT
        if kind != S_IFREG and kind != S_IFDIR and kind != S_IFLNK:
            self.fail(f"entry {entry} has file type {kind:#o}")
        return kind

    def mode(self, entry: int) -> int:
        """Entry ``entry``'s st_mode, its file type checked."""
        self.file_type(entry)
        return self._mode[entry]

    def stat(self, entry: int) -> tuple[int, int, int, int, int, int, int]:
        """(mode, uid, gid, mtime_ns, size, nlink, inode) of ``entry``, held to the rules
        of the data they describe (format section 5), so that no front end hands out a
        size its reads would refuse: a file's or symlink's size is its record's length,
        a symlink's 1 to 4,095 bytes.  A hard-linked file's attributes are its inode's
        (its first name's) under every name, and each name's own size is checked too:
        the kernel keeps one set of attributes per inode, the last one it was given."""
        return self.container.checked(self._stat, entry)

    def _stat(self, entry: int) -> tuple[int, int, int, int, int, int, int]:
        kind = self.file_type(entry)
        inode = entry + 1
        if kind != S_IFDIR:
            self.record(entry)  # the size is the record's length, the rule reads rely on
            if kind == S_IFLNK:
                problem = symlink_length_problem(self._size[entry])
                if problem:
                    self.fail(f"entry {entry} is a symlink with {problem}")
            else:
                inode = self.inode(entry)
                if inode != entry + 1:
                    entry = inode - 1
                    self.record(entry)
        return (self._mode[entry], self._uid[entry], self._gid[entry], self._mtime_ns[entry],
                self._size[entry], self._nlink[entry], inode)

    def record_spans(self, entries: Any, one: Callable[[int], tuple[int, int]]) -> np.ndarray:
        """(start, end) of the data record of each file or symlink of ``entries``, an
        (n, 2) int64 array: what ``one(entry)`` gives (:meth:`record` and the container's
        ``record_span``) with their checks made on the whole array at once -- a window
        plan over millions of files, 35 us a file one at a time.  An entry that fails
        any of them, or whose size a codec row holds (format 1.5, checked row by row),
        goes through ``one``, which raises what is wrong."""
        import numpy as np

        entries = np.asarray(entries, dtype=np.int64).reshape(-1)
        spans = np.empty((len(entries), 2), dtype=np.int64)
        if not len(entries):
            return spans
        container = self.container
        good = (entries >= 0) & (entries < self.entry_count)
        safe = np.where(good, entries, 0)
        records = _items(self._record, safe)  # compared while unsigned, as record() does
        good &= records < self.data_records
        records = np.where(good, records, 0).astype(np.int64)
        offsets = container.offset_items
        count = len(offsets)
        following = np.minimum(records + 1, count - 1)
        starts, ends = _items(offsets, records).astype(np.int64), _items(offsets, following).astype(np.int64)
        ends = np.where(records + 1 < count, ends, container.file_size)
        good &= (container.data_start <= starts) & (starts <= ends) & (ends <= container.data_end)
        if self.codecs is None:
            good &= _items(self._size, safe).astype(np.int64) == ends - starts
        else:
            good[:] = False
        spans[:, 0], spans[:, 1] = starts, ends
        for at in np.flatnonzero(~good):
            spans[at] = one(int(entries[at]))
        return spans

    def record(self, entry: int) -> int:
        """The data record of file or symlink ``entry``: one that exists and is as long
        as the entry's size."""
        record = self._record[entry]
        if record >= self.data_records:
            self.fail(f"entry {entry} names record {record}, outside the {self.data_records} data records")
        start, end = self.container.record_span(record)
        codecs = self.codecs
        if codecs is not None:
            # Format 1.5: the size is the decoded length, held to the record's codec row.
            row = codecs.file_row(record, self._size[entry], end - start, entry)
            if row.codec != CODEC_STORED and self.file_type(entry) != S_IFREG:
                self.fail(f"entry {entry} is a symlink whose record {record} is not stored as it is")
        elif end - start != self._size[entry]:
            self.fail(f"entry {entry}'s size differs from the length of its record {record}")
        return record

    def size(self, entry: int) -> int:
        """Entry ``entry``'s size as stored (files: bytes; symlinks: the target's length)."""
        return self._size[entry]

    def parent(self, entry: int) -> int:
        """Entry ``entry``'s parent directory, checked to come before it (so walks up end)."""
        parent = self._parent[entry]
        if entry and parent >= entry:
            self.fail(f"entry {entry}'s parent {parent} does not come before it")
        return parent

    def children(self, entry: int) -> range:
        """Directory ``entry``'s children as a range of entries, checked (format section 5)."""
        # Checked on its own: a walk may outlive the lookup that began it.
        return self.container.checked(self._children, entry)

    def _children(self, entry: int) -> range:
        start, count = self._child_start[entry], self._child_count[entry]
        # Children come after their directory (walks move forward and end) and name it
        # as their parent (each entry is reached from one directory only: without this,
        # overlapping ranges make a walk of N entries visit up to 2**N paths).
        if count and not entry < start <= self.entry_count - count:
            self.fail(f"directory entry {entry} has children [{start}, {start + count}), "
                       f"expected a range within ({entry}, {self.entry_count})")
        if count and self._parent[start : start + count].tolist().count(entry) != count:
            self.fail(f"directory entry {entry} has children [{start}, {start + count}) "
                       f"that name another parent")
        return range(start, start + count)

    def listing(self, entry: int) -> tuple[range, list[bytes], list[int]]:
        """A directory's children, their names and their modes, read in three slices
        rather than three lookups per child (a readdir of a large directory)."""
        children, names, modes, _ = self._listing(entry, inodes=False)
        return children, names, modes

    def listing_with_inodes(self, entry: int) -> tuple[range, list[bytes], list[int], list[int]]:
        """:meth:`listing` and the children's inode numbers (what readdir hands on)."""
        return self._listing(entry, inodes=True)

    def _listing(self, entry: int, inodes: bool) -> tuple[range, list[bytes], list[int], list[int]]:
        children = self.children(entry)
        if not children:
            return children, [], [], []
        names, modes, numbers = self.container.checked(self._read_listing, children, inodes)
        self._note_use(len(children))
        return children, names, modes, numbers

    def _read_listing(self, children: range, inodes: bool) -> tuple[list[bytes], list[int], list[int]]:
        names, modes = self._names_and_modes(children)
        return names, modes, (self.inodes(children, modes) if inodes else [])

    def _note_use(self, entries: int) -> None:
        """Count entries whose table pages were just read; past _RELEASE_AFTER_ENTRIES,
        release the pages, right after the read that crossed the line (so a walk ends
        with little of the table mapped, whatever the size of the page cache's folios:
        releasing before the next read left the last ones, 12-20 MiB at 1M entries)."""
        self._entries_used += entries
        if self._entries_used >= _RELEASE_AFTER_ENTRIES:
            self._entries_used = 0
            self.release_pages()

    def listing_columns(self, part: range) -> tuple[list[bytes], list[int], list[int], list[int], list[int],
                                                     list[int], list[int]]:
        """(names, modes, uids, gids, mtimes_ns, sizes, nlinks) of the entries in
        ``part``, a slice of a range from :meth:`children`: each column read as one
        slice, names and file types checked as :meth:`listing` checks them.  A long
        listing reads its directory a part at a time, so its memory stays bounded."""
        start, stop = part.start, part.stop
        if start >= stop:
            return [], [], [], [], [], [], []
        columns = self.container.checked(self._read_columns, part)
        self._note_use(stop - start)
        return columns

    def _read_columns(self, part: range) -> tuple[list[bytes], list[int], list[int], list[int], list[int],
                                                  list[int], list[int]]:
        start, stop = part.start, part.stop
        names, modes = self._names_and_modes(part)
        return (names, modes, self._uid[start:stop].tolist(), self._gid[start:stop].tolist(),
                self._mtime_ns[start:stop].tolist(), self._size[start:stop].tolist(),
                self._nlink[start:stop].tolist())

    def _names_and_modes(self, part: range) -> tuple[list[bytes], list[int]]:
        """Names and modes of the (non-empty) run of siblings ``part``, each read as one
        slice, with the per-entry rules of name() and file_type() checked at once."""
        start, stop = part.start, part.stop
        # Children are never the root, so the name before the first child's exists.
        ends = self._name_end[start - 1 : stop].tolist()
        first = ends[0]
        blob = bytes(self._mm[self._names_start + first : self._names_start + ends[-1]])
        names = [blob[a - first : b - first] for a, b in zip(ends, ends[1:])]
        modes = self._mode[start:stop].tolist()
        if (ends[-1] > self._names_size or any(a >= b for a, b in zip(ends, ends[1:]))
                or b"/" in blob or b"\0" in blob or b"." in names or b".." in names
                or any(mode & S_IFMT not in _VALID_TYPES for mode in modes)):
            for child in part:
                self.name(child), self.file_type(child)  # raises, naming the entry
        return names, modes

    def items(self, name: str) -> memoryview:
        """Section ``name`` as a memoryview of its items: unchecked access for hot paths,
        which check every value before they index with it."""
        return getattr(self, "_" + name)

    def column(self, name: str) -> np.ndarray:
        """Section ``name`` as a numpy array (numpy is imported on first use)."""
        return self.arrays[name]


def _items(column: Column, indices: np.ndarray) -> np.ndarray:
    """Items ``indices`` of ``column`` as a numpy array: from a URL, only the pages they
    are in (not the whole section, which ``arrays`` would read and keep)."""
    import numpy as np

    if isinstance(column, PagedColumn):
        return column.take(indices)
    return np.asarray(column)[indices]


def _paged(column: Column) -> PagedColumn:
    """``column`` as the paged column it is where a lookup index row hints it (an
    archive read page by page from a source without a map: the only one looked up
    through its index)."""
    assert isinstance(column, PagedColumn)
    return column
