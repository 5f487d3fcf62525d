"""build_tables' layout and PathTable's lookups."""

from __future__ import annotations

import numpy as np

from packfs.format import NO_RECORD
from packfs.format import S_IFDIR, S_IFREG
from packfs.core.tablebuild import TableRows, build_tables


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
