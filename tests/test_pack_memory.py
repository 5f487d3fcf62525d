"""The table is laid out in bounded memory: entries sorted in runs spilled to disk and
merged give the same bytes as the table laid out in memory."""

from __future__ import annotations

import os
import random
import tracemalloc
from pathlib import Path
from typing import Iterator

import pytest

import packfs.write.builder as builder_module
from packfs import Entry, PackedFolder, pack_entries, pack_folder
from packfs.write import spill
from packfs.write.indexbuild import build_lookup_index
from packfs.core.tablebuild import TableRows, build_tables
from packfs.write.tablestream import TableStream
from packfs.write.xattrs import encode_xattrs
from packfs.errors import PackError
from packfs.format import NO_RECORD, S_IFDIR, S_IFLNK, S_IFREG, SECTIONS

# Small enough that a few hundred entries fill a run (packfs.write.tablestream's costs).
TINY = 200_000


@pytest.fixture
def tiny_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(builder_module, "_TABLE_MEMORY", TINY)
    monkeypatch.setattr(spill, "FAN_IN", 3)  # runs merged in two levels too


def _entries(seed: int = 1, count: int = 3000) -> list[Entry]:
    """A tree of files, symlinks, hard links (chains too), attributes, explicit and
    implicit directories, deep paths, in a shuffled order (hard links after their file)."""
    rng = random.Random(seed)
    entries: list[Entry] = [Entry("", kind="dir", mode=0o700, mtime_ns=5)]
    files: list[str] = []
    for i in range(count):
        depth = rng.choice([1, 1, 2, 2, 3, 6])
        parts = [f"d{rng.randrange(12)}" for _ in range(depth - 1)] + [f"n{i:05d}-{rng.randrange(100)}"]
        path = "/".join(parts)
        kind = rng.random()
        if kind < 0.6:
            xattrs = {"user.k": b"v%d" % i} if rng.random() < 0.05 else None
            entries.append(Entry(path, b"x" * rng.randrange(5), mtime_ns=i, uid=i % 7, xattrs=xattrs))
            files.append(path)
        elif kind < 0.7:
            entries.append(Entry(path, kind="symlink", target=f"t{i}"))
        elif kind < 0.8:
            entries.append(Entry(path, kind="dir", mode=0o750, gid=3))
        elif files:
            entries.append(Entry(path, kind="hardlink", target=rng.choice(files)))
            if rng.random() < 0.3:
                files.append(path)  # a link to this link later
        else:
            entries.append(Entry(path, b""))
    # Shuffle, keeping every hard link after the entry it names.
    order = list(range(len(entries)))
    rng.shuffle(order)
    position = {entries[i].path: rank for rank, i in enumerate(order)}
    shuffled = sorted(range(len(entries)), key=lambda i: position[entries[i].path])
    placed: set[str] = set()
    result: list[Entry] = []
    waiting: dict[str, list[Entry]] = {}

    def place(entry: Entry) -> None:
        result.append(entry)
        placed.add(str(entry.path))
        for later in waiting.pop(str(entry.path), []):
            place(later)

    for i in shuffled:
        entry = entries[i]
        if entry.kind == "hardlink" and str(entry.target) not in placed:
            waiting.setdefault(str(entry.target), []).append(entry)
        else:
            place(entry)
    assert len(result) == len(entries)
    return result


def test_spilled_table_gives_the_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entries = _entries()
    pack_entries(entries, tmp_path / "memory.ffr")
    monkeypatch.setattr(builder_module, "_TABLE_MEMORY", TINY)
    monkeypatch.setattr(spill, "FAN_IN", 3)  # runs merged in two levels too
    stats = pack_entries(entries, tmp_path / "spilled.ffr")
    assert (tmp_path / "memory.ffr").read_bytes() == (tmp_path / "spilled.ffr").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["memory.ffr", "spilled.ffr"]  # no spill file left
    with PackedFolder(tmp_path / "spilled.ffr") as folder:
        some = next(entry for entry in entries if entry.kind == "file" and entry.data)
        assert folder.read_view(some.path) == some.data
    assert stats.dirs == sum(1 for _ in _directories(entries))


def _directories(entries: list[Entry]) -> set[str]:
    found = {""}
    for entry in entries:
        parts = str(entry.path).split("/")
        found.update("/".join(parts[:n]) for n in range(1, len(parts)))
        if entry.kind == "dir":
            found.add(str(entry.path))
    return found


def test_spilled_folder_pack_gives_the_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    for i in range(700):
        directory = src / f"c{i % 9}" / f"s{i % 4}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"f{i}").write_bytes(b"%d" % i)
    os.link(src / "c0" / "s0" / "f0", src / "linked")
    os.symlink("c0", src / "link")
    pack_folder(src, tmp_path / "memory.ffr")
    monkeypatch.setattr(builder_module, "_TABLE_MEMORY", TINY)
    pack_folder(src, tmp_path / "spilled.ffr")
    assert (tmp_path / "memory.ffr").read_bytes() == (tmp_path / "spilled.ffr").read_bytes()


def test_streamed_table_is_what_build_tables_lays_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Section by section, against the in-memory builders, for trees in random order."""
    for seed in range(4):
        monkeypatch.setattr(spill, "FAN_IN", 3 if seed % 2 else 128)
        rng = random.Random(seed)
        rows = TableRows()
        stream = TableStream(str(tmp_path), TINY)
        crcs, offsets = [], []
        for entry in _entries(seed, 800):
            key = str(entry.path).encode()
            if key in rows:
                continue
            if entry.kind == "hardlink":
                other = rows.row_of[str(entry.target).encode()]
                rows.add(key, rows.mode[other], rows.uid[other], rows.gid[other], rows.mtime_ns[other],
                         rows.size[other], rows.record[other])
                stream.add(key, S_IFREG, 0, 0, 0, 0, NO_RECORD, link_to=str(entry.target).encode())
                continue
            mode = {"file": S_IFREG | 0o644, "dir": S_IFDIR | 0o755, "symlink": S_IFLNK | 0o777}[entry.kind]
            record, crc, offset = NO_RECORD, 0, 0
            if entry.kind != "dir":
                record, crc, offset = len(crcs), rng.getrandbits(32), rng.getrandbits(40)
                crcs.append(crc)
                offsets.append(offset)
            encoded = encode_xattrs({b"user.k": b"v"}) if entry.xattrs else b""
            rows.add(key, mode, entry.uid, entry.gid, entry.mtime_ns, 3, record)
            if encoded:
                rows.xattrs[rows.row_of[key]] = encoded
            stream.add(key, mode, entry.uid, entry.gid, entry.mtime_ns, 3, record, crc, offset, encoded)
        for key in list(rows.paths):
            head = key.rpartition(b"/")[0]
            while key and head not in rows:
                rows.add(head, S_IFDIR | 0o755, 0, 0, 0, 0, NO_RECORD)
                key, head = head, head.rpartition(b"/")[0]
        tables = build_tables(rows)
        index = build_lookup_index(tables, crcs, offsets, len(crcs))
        streamed = stream.finish()
        try:
            for name, _ in SECTIONS:
                assert b"".join(streamed.section(name)) == tables[name].tobytes(), (seed, name)
            for name in ("xattr_entry", "xattr_start", "xattr_data"):
                assert b"".join(streamed.section(name)) == tables[name].tobytes(), (seed, name)
            assert b"".join(streamed.section("index")) == index.data
            for page_size in (64, 1 << 10, 1 << 16):
                assert streamed.pages(page_size) == index.pages(page_size)
            start, end = streamed.pages(1 << 10)[1][1:]
            assert streamed.page_crc(start, end) == index.page_crc(start, end)
        finally:
            streamed.close()
        assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("entries, message", [
    ([Entry("a", b"1"), Entry("b", b"2"), Entry("a", b"3")], "duplicate path 'a'"),
    ([Entry("a", b"1"), Entry("a/b/c", b"2")], "'a/b' is inside 'a', which is not a directory"),
    ([Entry("a", b"1"), Entry("a/c", b"2")], "'a/c' is inside 'a', which is not a directory"),
    ([Entry("l", kind="hardlink", target="f"), Entry("f", b"1")], "hard link 'l' points to 'f', which is not an earlier"),
    ([Entry("d", kind="dir"), Entry("l", kind="hardlink", target="d")], "hard link 'l' points to 'd', which is not an"),
    ([Entry("l", kind="hardlink", target="nowhere")], "hard link 'l' points to 'nowhere', which is not an earlier"),
])
def test_bad_entries_are_refused_when_spilled_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  entries: list[Entry], message: str) -> None:
    padding = [Entry(f"p/{i:04d}", b"") for i in range(600)]  # enough to spill
    for budget in (None, TINY):
        monkeypatch.setattr(builder_module, "_TABLE_MEMORY", budget)
        with pytest.raises(PackError, match=message):
            pack_entries(padding + entries, tmp_path / "out.ffr")
        assert os.listdir(tmp_path) == []


def test_root_given_twice_keeps_the_last(tmp_path: Path, tiny_budget: None) -> None:
    entries = [Entry("", kind="dir", mode=0o700)] + [Entry(f"f{i}", b"") for i in range(500)]
    entries.append(Entry("/", kind="dir", mode=0o711, uid=9))
    pack_entries(entries, tmp_path / "out.ffr")
    with PackedFolder(tmp_path / "out.ffr") as folder:
        info = folder.stat("")
        assert (info.mode & 0o7777, info.uid) == (0o711, 9)


def test_hard_links_share_their_file_when_spilled(tmp_path: Path, tiny_budget: None) -> None:
    entries = [Entry(f"a/{i:04d}", b"%d" % i) for i in range(500)]
    entries += [Entry("z/one", kind="hardlink", target="a/0007"), Entry("b/two", kind="hardlink", target="z/one")]
    pack_entries(entries, tmp_path / "out.ffr")
    with PackedFolder(tmp_path / "out.ffr") as folder:
        inodes = {folder.stat(path).inode for path in ("a/0007", "z/one", "b/two")}
        assert len(inodes) == 1
        assert folder.stat("b/two").nlink == 3
        assert folder.read_view("b/two") == b"7"


def test_no_entries(tmp_path: Path, tiny_budget: None) -> None:
    pack_entries([], tmp_path / "out.ffr")
    with PackedFolder(tmp_path / "out.ffr") as folder:
        assert folder.entry_count == 1


def test_spill_files_have_no_name(tmp_path: Path, tiny_budget: None) -> None:
    """Runs spilled while entries are added are unnamed files: a pack killed by any
    signal leaves nothing of them (the writer's own temporary file is the only name)."""
    seen: set[str] = set()

    class Watch:
        def start(self, total_files: int, total_bytes: int) -> None:
            pass

        def advance(self, files: int, nbytes: int) -> None:
            seen.update(os.listdir(tmp_path))

    pack_entries([Entry(f"d{i % 7}/f{i}", b"x") for i in range(2000)], tmp_path / "out.ffr", progress=Watch())
    assert seen and all(name.startswith(".out.ffr.packfs-tmp-") for name in seen)


def test_an_iterator_of_unknown_length_is_spooled_in_bounded_memory(tmp_path: Path, tiny_budget: None) -> None:
    """pack_entries of a generator spools the entries too, not a list of them: the
    same bytes as the list gives, and what an entry holds besides its row (here a
    symlink's target) is not kept in memory."""

    def entries(count: int, padding: int = 0) -> Iterator[Entry]:
        for i in range(count):
            yield Entry(f"d{i % 50}/f{i:06d}", b"%d" % i, mtime_ns=i, xattrs={"user.n": b"1"} if i == 7 else None)
            yield Entry(f"d{i % 50}/s{i:06d}", kind="symlink", target=f"{i}" + "t" * padding)
        yield Entry("d1/link", kind="hardlink", target="d0/f000000")

    pack_entries(list(entries(2000)), tmp_path / "list.ffr")
    pack_entries(entries(2000), tmp_path / "iterator.ffr")
    assert (tmp_path / "list.ffr").read_bytes() == (tmp_path / "iterator.ffr").read_bytes()
    tracemalloc.start()
    pack_entries(entries(10_000, 4000), tmp_path / "long.ffr")  # 40 MB of targets
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 25 << 20


def test_a_tar_stream_is_packed_without_its_member_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tarfile keeps every member it reads (about 1 KiB each); a streamed tar's are let
    go as they are packed."""
    import io
    import tarfile

    from packfs.write import archives

    source = tmp_path / "t.tar"
    with tarfile.open(source, "w") as tar:
        for i in range(3000):
            info = tarfile.TarInfo(f"d{i % 20}/f{i:06d}")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
        link = tarfile.TarInfo("d0/link")
        link.type, link.linkname = tarfile.LNKTYPE, "d0/f000000"
        tar.addfile(link)
    held: list[int] = []
    original = archives._tar_entry

    def watched(tar: tarfile.TarFile, *args: object) -> Iterator[Entry]:
        held.append(len(tar.members))
        return original(tar, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(archives, "_tar_entry", watched)
    with open(source, "rb") as stream:
        archives.pack_archive("-", tmp_path / "out.ffr", stdin=stream)
    assert len(held) == 3001 and max(held) <= 1
    with PackedFolder(tmp_path / "out.ffr") as folder:
        assert folder.stat("d0/link").nlink == 2
        assert folder.read_view("d19/f002999") == b"x"


def test_long_paths_are_laid_out_alike(tmp_path: Path) -> None:
    """A tree 300 deep with long names (paths of 12 KB: gathered as whole slices)."""
    rows = TableRows()
    stream = TableStream(str(tmp_path), TINY)
    path = b""
    crcs: list[int] = []
    offsets: list[int] = []
    for depth in range(300):
        path = (path + b"/" if path else b"") + b"n%03d" % depth + b"x" * 37
        for name, mode in ((path, S_IFDIR | 0o755), (path + b"-file", S_IFREG | 0o600)):
            record = NO_RECORD if mode & S_IFDIR == S_IFDIR else len(crcs)
            if record != NO_RECORD:
                crcs.append(depth)
                offsets.append(1000 + depth)
            rows.add(name, mode, 1, 2, depth, 0, record)
            stream.add(name, mode, 1, 2, depth, 0, record, *((depth, 1000 + depth) if record != NO_RECORD else (0, 0)))
    rows.add(b"", S_IFDIR | 0o755, 0, 0, 0, 0, NO_RECORD)
    tables = build_tables(rows)
    index = build_lookup_index(tables, crcs, offsets, len(crcs))
    streamed = stream.finish()
    try:
        for name, _ in SECTIONS:
            assert b"".join(streamed.section(name)) == tables[name].tobytes(), name
        assert b"".join(streamed.section("index")) == index.data
    finally:
        streamed.close()
