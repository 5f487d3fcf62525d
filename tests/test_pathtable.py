"""build_tables' layout and PathTable's lookups."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np
import pytest

import packfs
from packfs.core import Archive, PathTable
from packfs.format import NO_RECORD
from packfs.format import S_IFDIR, S_IFLNK, S_IFMT, S_IFREG
from packfs.core.tablebuild import TableRows, build_tables
from packfs.core.tablecheck import check_records, validate
from tests.conftest import BLUEPRINT, HARDLINK, SYMLINKS


def _rows(paths: dict[bytes, str]) -> TableRows:
    rows = TableRows()
    record = 0
    for path, kind in paths.items():
        if kind == "dir":
            rows.add(path, S_IFDIR | 0o755, 0, 0, 0, 0, NO_RECORD)
        else:
            rows.add(path, S_IFREG | 0o644, 0, 0, 0, 1, record)
            record += 1
    return rows


def _names(tables: dict[str, np.ndarray]) -> list[bytes]:
    names = tables["names"].tobytes()
    ends = [0] + [int(e) for e in tables["name_end"]]
    return [names[ends[i] : ends[i + 1]] for i in range(len(ends) - 1)]


def test_breadth_first_with_siblings_sorted_by_component() -> None:
    # "a-b" sorts before "a" as a path string ("-" < "/"), but as names "a" < "a-b":
    # the table must order by components, and the children of "a" come before those
    # of "a-b" because "a" does.
    tables = build_tables(_rows({
        b"": "dir", b"a-b": "dir", b"a-b/y": "file", b"a": "dir", b"a/x": "file",
        b"a/x-": "file", b"Z": "file", b"a/\xff": "file",
    }))
    assert _names(tables) == [b"", b"Z", b"a", b"a-b", b"x", b"x-", b"\xff", b"y"]
    assert list(tables["parent"]) == [0, 0, 0, 0, 2, 2, 2, 3]
    assert list(tables["child_start"]) == [1, 0, 4, 7, 0, 0, 0, 0]
    assert list(tables["child_count"]) == [3, 0, 3, 1, 0, 0, 0, 0]
    assert list(tables["nlink"][:4]) == [4, 1, 2, 2]


def test_path_index_is_sorted_and_complete() -> None:
    tables = build_tables(_rows({b"": "dir", b"d": "dir", b"d/f": "file", b"g": "file"}))
    assert list(tables["path_hash"]) == sorted(tables["path_hash"])
    assert sorted(tables["path_entry"]) == [0, 1, 2, 3]


def test_rows_replace_an_existing_path() -> None:
    rows = _rows({b"": "dir"})
    rows.add(b"", S_IFDIR | 0o700, 1, 2, 3, 0, NO_RECORD)
    assert len(rows) == 1 and rows.mode[0] == S_IFDIR | 0o700 and rows.mtime_ns[0] == 3


def test_listing_gives_children_names_and_modes_in_order(tmp_path) -> None:
    import packfs

    out = tmp_path / "t.ffr"
    packfs.pack_entries([packfs.Entry("d/b", b"1"), packfs.Entry("d/a", b"22"),
                         packfs.Entry("d/c/x", b"3"), packfs.Entry("e", kind="dir")], out)
    with packfs.PackedFolder(out) as folder:
        table = folder.archive._table
        children, names, modes = table.listing(table.lookup(b"d"))
        assert names == [b"a", b"b", b"c"]
        assert [table.name(child) for child in children] == names
        assert [mode & 0o170000 for mode in modes] == [S_IFREG, S_IFREG, S_IFDIR]
        assert table.listing(table.lookup(b"e")) == (range(table.children(table.lookup(b"e")).start,
                                                            table.children(table.lookup(b"e")).start), [], [])
        root_children, root_names, _ = table.listing(0)
        assert root_names == [b"d", b"e"] and list(root_children) == [1, 2]


# -- PathTable over the blueprint tree (tests/conftest.py) ---------------------------

# Two names with the same CRC-32: so do any two paths that differ only by one of them
# in place of the other (a CRC's state after the name is all that the rest depends on).
COLLIDING = (b"599430bd25", b"f7633dd321")


@pytest.fixture
def table(archive: Path):
    with Archive(archive) as opened:
        table = opened._table
        assert isinstance(table, PathTable)
        yield table


def _walk(table: PathTable, key: bytes) -> int:
    """The entry of ``key`` found one component at a time with lookup_child."""
    entry = 0
    for name in key.split(b"/") if key else []:
        entry = table.lookup_child(entry, name)
        if entry < 0:
            return -1
    return entry


def _source_keys(tree: Path) -> list[bytes]:
    keys = [b""]
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            keys.append(os.fsencode((Path(dirpath) / name).relative_to(tree)))
    return keys


def test_lookup_of_every_path_is_the_walk_from_the_root(table: PathTable, tree: Path) -> None:
    keys = _source_keys(tree)
    assert len(keys) == table.entry_count
    found = set()
    for key in keys:
        entry = table.lookup(key)
        assert entry >= 0 and entry == _walk(table, key), key
        found.add(entry)
    assert found == set(range(table.entry_count))
    # Again in reverse order: the directory cache filled by the first pass agrees.
    for key in reversed(keys):
        assert table.lookup(key) == _walk(table, key)


def test_lookup_of_missing_paths(table: PathTable) -> None:
    for key in (b"missing", b"a/missing", b"missing/x", b"hello.txt/x", b"a/b/c/deep.bin/x", b"HELLO.TXT",
                b"a/dirlink/c", b"a/dirlink/c/deep.bin", b"link-to-hello/x", b"/hello.txt", b"hello.txt/",
                b"a//b", b"a/./b", b"a/b/..", b"empty_dir/x", b"a/b/c/d", b"\xff", b"a/b/c/deep.bin\x00"):
        assert table.lookup(key) == -1, key
        assert _walk(table, key) == -1, key


def test_lookup_below_a_file_is_refused_even_with_a_matching_hash(tmp_path: Path) -> None:
    """``A/f`` has the hash of ``B/f``, which exists; A is a file, so nothing is below it."""
    a, b = COLLIDING
    assert zlib.crc32(a + b"/f") == zlib.crc32(b + b"/f")
    out = tmp_path / "t.ffr"
    packfs.pack_entries([packfs.Entry(a, b"a file"), packfs.Entry(b + b"/f", b"below a directory")], out)
    for warm in (False, True):
        with Archive(out) as opened:
            table = opened._table
            if warm:
                assert table.lookup(b) >= 0 and table.lookup(a) >= 0
            assert table.lookup(b + b"/f") == _walk(table, b + b"/f") > 0
            assert table.lookup(a + b"/f") == -1 and table.lookup_unchecked(a + b"/f") == -1
            assert _walk(table, a + b"/f") == -1


def test_colliding_paths_are_told_apart(tmp_path: Path) -> None:
    a, b = COLLIDING
    assert a != b and zlib.crc32(a) == zlib.crc32(b)
    assert zlib.crc32(b"d/" + a) == zlib.crc32(b"d/" + b)
    assert zlib.crc32(a + b"/f") == zlib.crc32(b + b"/f")
    # The table holds one of each pair; the other name of the pair is not found.
    one = tmp_path / "one.ffr"
    packfs.pack_entries([packfs.Entry(a, b"root"), packfs.Entry(b"d/" + a, b"in d"),
                         packfs.Entry(b"q/" + a + b"/f", b"below a"), packfs.Entry(b"q/" + b, kind="dir")], one)
    for warm in (False, True):
        with Archive(one) as opened:
            table = opened._table
            if warm:  # the colliding directory is in the directory cache first
                assert table.lookup(b"q/" + b) >= 0 and table.lookup(b"q/" + a) >= 0
            assert table.lookup(b) == -1
            assert table.lookup(b"d/" + b) == -1
            assert table.lookup(b"q/" + b + b"/f") == -1  # same name, same hash, other parent
            assert table.lookup(b"q/" + a + b"/f") == _walk(table, b"q/" + a + b"/f") > 0
            assert table.lookup(a) == _walk(table, a) > 0
            assert opened.read_path(b"q/" + a + b"/f") == b"below a"
            assert table.lookup_unchecked(b"q/" + b + b"/f") == -1
    # The table holds both: each is found as itself.
    both = tmp_path / "both.ffr"
    paths = [a, b, b"d/" + a, b"d/" + b, b"q/" + a + b"/f", b"q/" + b + b"/f"]
    packfs.pack_entries([packfs.Entry(path, path) for path in paths], both)
    with Archive(both) as opened:
        table = opened._table
        entries = [table.lookup(path) for path in paths]
        assert len(set(entries)) == len(paths) and min(entries) > 0
        for path, entry in zip(paths, entries):
            assert table.full_path(entry) == path and entry == _walk(table, path)
            assert opened.read(entry) == path
        hashes = table.column("path_hash")
        assert sum(int(h) == zlib.crc32(a) for h in hashes) == 2


def test_build_tables_keeps_colliding_hashes_adjacent_in_entry_order() -> None:
    a, b = COLLIDING
    tables = build_tables(_rows({b"": "dir", b: "file", a: "file", b"z": "file"}))
    names = _names(tables)
    digest = zlib.crc32(a)
    slots = [i for i, h in enumerate(tables["path_hash"]) if int(h) == digest]
    assert len(slots) == 2 and slots[1] == slots[0] + 1
    # Ties keep entry order (a sorts before b, so it is the lower entry).
    assert [names[int(tables["path_entry"][slot])] for slot in slots] == [a, b]


def test_names_and_full_paths_round_trip(table: PathTable) -> None:
    assert table.name(0) == b"" and table.full_path(0) == b"" and table.parent(0) == 0
    for entry in range(1, table.entry_count):
        path = table.full_path(entry)
        head, _, name = path.rpartition(b"/")
        assert table.name(entry) == name and name and b"/" not in name
        assert table.full_path(table.parent(entry)) == head
        assert table.lookup(path) == entry
    assert table.full_path(table.lookup(b"a/b/c/deep.bin")) == b"a/b/c/deep.bin"
    assert table.name(table.lookup(os.fsencode("données/été.txt"))) == "été.txt".encode()


def test_children_ranges_tile_the_table(table: PathTable) -> None:
    owner: dict[int, int] = {}
    for entry in range(table.entry_count):
        children = table.children(entry)
        if table.file_type(entry) != S_IFDIR:
            assert len(children) == 0
            continue
        assert len(children) == 0 or children.start > entry
        for child in children:
            assert child not in owner, child  # in exactly one range
            owner[child] = entry
    assert set(owner) == set(range(1, table.entry_count))  # every entry but the root
    for child, directory in owner.items():
        assert table.parent(child) == directory


def test_inodes_of_hard_links(table: PathTable) -> None:
    hello, other = (table.lookup(os.fsencode(name)) for name in HARDLINK)
    first = min(hello, other)
    assert table.inode(hello) == table.inode(other) == first + 1
    assert table.record(hello) == table.record(other)
    for entry in range(table.entry_count):
        if entry not in (hello, other):
            assert table.inode(entry) == entry + 1
    for directory in range(table.entry_count):
        if table.file_type(directory) == S_IFDIR:
            children, names, modes = table.listing(directory)
            assert table.inodes(children, modes) == [table.inode(child) for child in children]
            assert table.listing_with_inodes(directory) == (children, names, modes,
                                                            [table.inode(child) for child in children])


def test_listing_names_are_sorted_bytewise(table: PathTable, tree: Path) -> None:
    for directory in range(table.entry_count):
        if table.file_type(directory) != S_IFDIR:
            continue
        children, names, modes = table.listing(directory)
        assert names == [table.name(child) for child in children]
        assert all(left < right for left, right in zip(names, names[1:]))
        assert modes == [table.mode(child) for child in children]
        on_disk = os.listdir(tree / os.fsdecode(table.full_path(directory)))
        assert names == sorted(os.fsencode(name) for name in on_disk)
    root_names = table.listing(0)[1]
    assert root_names.index(b"Zeta.txt") < root_names.index(b"a")  # uppercase first, as bytes


def test_validate_and_check_records(table: PathTable) -> None:
    validate(table)
    expected = (sum(len(data) for data in BLUEPRINT.values() if data is not None)
                + sum(len(os.fsencode(target)) for target in SYMLINKS.values()))
    assert check_records(table) == expected


def test_lookups_work_after_release_pages(table: PathTable, tree: Path) -> None:
    before = {key: table.lookup(key) for key in _source_keys(tree)}
    listings = {entry: table.listing(entry) for entry in set(before.values())
                if table.file_type(entry) == S_IFDIR}
    for _ in range(2):
        table.release_pages()
        for key, entry in before.items():
            assert table.lookup(key) == entry == _walk(table, key)
        for entry, listing in listings.items():
            table.release_pages()
            assert table.listing(entry) == listing
    validate(table)


def test_items_and_lookup_unchecked_agree_with_the_checked_accessors(table: PathTable, tree: Path) -> None:
    parent, mode, size, record = (table.items(name) for name in ("parent", "mode", "size", "record"))
    name_end, nlink = table.items("name_end"), table.items("nlink")
    assert len(parent) == len(mode) == len(size) == table.entry_count
    for entry in range(table.entry_count):
        assert parent[entry] == table.parent(entry)
        assert mode[entry] == table.mode(entry) and mode[entry] & S_IFMT == table.file_type(entry)
        assert size[entry] == table.size(entry)
        shown = table.stat(entry)  # a hard link's later name shows its first name's
        assert (mode[entry], size[entry], nlink[entry]) == (shown[0], shown[4], shown[5])
        if table.file_type(entry) != S_IFDIR:
            assert record[entry] == table.record(entry)
        if entry:
            assert name_end[entry] - name_end[entry - 1] == len(table.name(entry))
    for column in ("parent", "mode", "size", "record", "nlink", "path_hash", "path_entry"):
        assert table.items(column).tolist() == table.column(column).tolist()
    for key in _source_keys(tree) + [b"missing", b"hello.txt/x", b"a/dirlink/c", COLLIDING[0]]:
        assert table.lookup_unchecked(key) == table.lookup(key)
    links = [entry for entry in range(table.entry_count) if table.file_type(entry) == S_IFLNK]
    assert len(links) == len(SYMLINKS)
