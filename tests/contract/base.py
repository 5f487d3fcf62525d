"""The reader contract, written once: :class:`ReaderContract`'s tests ask a reader
(``reader``, or ``kind`` to open it another way) what :class:`packfs.core.ArchiveReader`
promises, and compare every answer with the tree on disk it was packed from.  A test
module runs it by subclassing it (tests/contract/test_readers.py), as zarr's
``StoreTests`` is run."""

from __future__ import annotations

import io
import os
import stat as stat_module
import traceback
from pathlib import Path
from typing import Any, Callable

import pytest

from packfs.core import ArchiveReader
from packfs.errors import (ChecksumError, ClosedArchiveError, FormatError, NotADirectoryPathError, NotAFileError,
                           PackfsError, PathNotFoundError)
from packfs.format import S_IFDIR, S_IFLNK, S_IFREG
from tests.contract.readers import ReaderKind, damaged, flip_byte, stored_span
from tests.contract.trees import BIG, FILES, HARDLINK, NOISE, SPARSE, SPARSE_DATA, SPARSE_SIZE, SYMLINKS, TEXT

# A stored file (incompressible: stored even with codecs) and one compressed with them.
STORED_FILE, CODED_FILE = b"noise.bin", b"text.txt"


def on_disk(tree: Path) -> dict[bytes, os.stat_result]:
    """Every path of the tree (the root as b""), lstat'ed."""
    found = {b"": os.lstat(tree)}
    for directory, names, files in os.walk(tree):
        for name in names + files:
            full = os.path.join(directory, name)
            found[os.fsencode(os.path.relpath(full, tree))] = os.lstat(full)
    return found


def contents(tree: Path, path: bytes) -> bytes:
    return (tree / os.fsdecode(path)).read_bytes()


def _raised(operation: Callable[[], object]) -> BaseException:
    """What ``operation`` raises (it must)."""
    try:
        operation()
    except Exception as error:  # noqa: BLE001 (what it is, is the point)
        return error
    raise AssertionError("expected an error")


def files_of(tree: Path) -> list[bytes]:
    return sorted(path for path, st in on_disk(tree).items() if stat_module.S_ISREG(st.st_mode))


def _error_of(kind: ReaderKind) -> type[Exception]:
    """What a CRC mismatch raises in this reader."""
    return FormatError if "checksum error" in kind.unanswered else ChecksumError


class ReaderContract:
    """What every reader answers alike; see :mod:`packfs.core.interface`."""

    # -- lookups ------------------------------------------------------------------------

    def test_find_is_exact(self, reader: ArchiveReader, kind: ReaderKind) -> None:
        for path, st in on_disk(kind.packed.tree).items():
            entry = reader.find(path)
            assert entry >= 0, path
            assert reader.file_type(entry) == stat_module.S_IFMT(st.st_mode), path
        assert reader.find(b"") == 0
        for missing in (b"nope", b"a/nope", b"hello.txt/x", b"a/dirlink/c"):  # the last through a symlink
            assert reader.find(missing) == -1, missing
        for not_canonical in (b"/hello.txt", b"a//b", b"a/b/", b"./hello.txt", b"a/../hello.txt"):
            assert reader.find(not_canonical) == -1, not_canonical

    def test_lookup_follows_symlinks(self, reader: ArchiveReader) -> None:
        hello = reader.inode(reader.lookup("hello.txt"))
        for path in ("link-to-hello", "a/link-up", "/hello.txt", "./a/../hello.txt", "a//link-up"):
            assert reader.inode(reader.lookup(path)) == hello, path
        assert reader.file_type(reader.lookup("link-to-hello", follow=False)) == S_IFLNK
        assert reader.lookup("a/dirlink/c/deep.bin") == reader.lookup("a/b/c/deep.bin")
        assert reader.lookup("m/link-back") == reader.lookup("text.txt")  # in another shard of the layered set
        assert reader.file_type(reader.lookup("a/dirlink")) == S_IFDIR
        for path in ("", "/", "..", "a/b/../..", "a/../../.."):  # ".." stops at the root
            assert reader.lookup(path) == 0, path
        assert reader.lookup("../hello.txt") == reader.lookup("hello.txt")
        assert reader.lookup("m/two/../one.txt") == reader.lookup("m/one.txt")

    @pytest.mark.parametrize("path", ["nope", "a/nope", "dangling", "loop-1", "absolute", "a/dirlink/nope"])
    def test_lookup_of_nothing(self, reader: ArchiveReader, path: str) -> None:
        with pytest.raises(PathNotFoundError):
            reader.lookup(path)
        with pytest.raises(PathNotFoundError):
            reader.read_path(path)

    def test_lookup_through_a_file(self, reader: ArchiveReader) -> None:
        for path in ("hello.txt/x", "link-to-hello/x", "a/b/c/deep.bin/y/z"):
            with pytest.raises(NotADirectoryPathError):
                reader.lookup(path)

    def test_lookup_kind_and_child(self, reader: ArchiveReader) -> None:
        with pytest.raises(NotAFileError):
            reader.lookup_kind("a", S_IFREG)
        with pytest.raises(NotADirectoryPathError):
            reader.lookup_kind("hello.txt", S_IFDIR)
        assert reader.lookup_kind("link-to-hello", S_IFREG) == reader.lookup("hello.txt")
        a = reader.lookup("a")
        assert reader.lookup_child(0, b"a") == a
        assert reader.lookup_child(a, b"b") == reader.lookup("a/b")
        assert reader.lookup_child(a, b"nope") == -1
        assert reader.lookup_child(0, "données".encode()) == reader.lookup("données")

    def test_a_number_that_is_no_entry(self, reader: ArchiveReader, kind: ReaderKind) -> None:
        kind.require("no entry")
        count = reader.entry_count
        calls = ("stat", "file_type", "inode", "name", "path_of", "parent", "xattrs", "children", "listing",
                 "listing_with_inodes", "read", "readlink", "open")
        for entry in (-1, count, count + 1000, 1 << 40):
            for call in calls:
                with pytest.raises(NotAFileError, match="entry"):
                    getattr(reader, call)(entry)
            with pytest.raises(NotAFileError):
                reader.lookup_child(entry, b"a")
        # Columns past the table: what each entry's stat says, never a listing cut short.
        for part in (range(count - 1, count + 1), range(count, count + 3), [count], range(-1, 1)):
            with pytest.raises(NotAFileError, match="entry"):
                reader.listing_columns(part)

    # -- stat -----------------------------------------------------------------------------

    def test_stat_every_field(self, reader: ArchiveReader, kind: ReaderKind) -> None:
        inodes: dict[int, bytes] = {}
        for path, st in on_disk(kind.packed.tree).items():
            entry = reader.lookup(path, follow=False)
            got = reader.stat(entry)
            assert got.mode == st.st_mode, path
            assert (got.uid, got.gid, got.mtime_ns) == (st.st_uid, st.st_gid, st.st_mtime_ns), path
            assert got.nlink == st.st_nlink, path  # a directory's: 2 and its subdirectories
            if not stat_module.S_ISDIR(st.st_mode):
                assert got.size == st.st_size, path  # a sparse file's: with its holes
            assert got.inode == reader.inode(entry), path
            if path != HARDLINK[0].encode():  # its inode is its first name's, checked below
                assert inodes.setdefault(got.inode, path) == path, f"{path!r} has the inode of {inodes[got.inode]!r}"
        assert reader.stat(reader.lookup(HARDLINK[0])).inode == reader.stat(reader.lookup(HARDLINK[1])).inode

    def test_names_paths_and_parents(self, reader: ArchiveReader, kind: ReaderKind) -> None:
        for path in on_disk(kind.packed.tree):
            if path == HARDLINK[0].encode():
                continue  # test_hard_links_are_names_of_their_own
            entry = reader.lookup(path, follow=False)
            assert reader.path_of(entry) == path
            assert reader.name(entry) == path.rpartition(b"/")[2]
            assert reader.parent(entry) == reader.lookup(path.rpartition(b"/")[0])
        assert reader.parent(0) == 0

    def test_hard_links_are_names_of_their_own(self, reader: ArchiveReader, kind: ReaderKind) -> None:
        kind.require("entry per name")
        link, first = reader.lookup(HARDLINK[0]), reader.lookup(HARDLINK[1])
        assert link != first
        assert reader.path_of(link) == HARDLINK[0].encode()
        assert reader.inode(link) == reader.inode(first)
        assert reader.read(link) == reader.read(first) == FILES[HARDLINK[1]]

    # -- listings -------------------------------------------------------------------------

    def test_listings(self, reader: ArchiveReader, kind: ReaderKind) -> None:
        tree = kind.packed.tree
        for path, st in on_disk(tree).items():
            entry = reader.lookup(path, follow=False)
            if not stat_module.S_ISDIR(st.st_mode):
                assert list(reader.children(entry)) == [], path
                continue
            names = sorted(os.fsencode(name) for name in os.listdir(tree / os.fsdecode(path)))
            children, listed, modes = reader.listing(entry)
            assert listed == names, path  # bytewise name order, "." and ".." left out
            assert list(reader.children(entry)) == list(children)
            # (A reader whose entries are inodes names a hard link's entry by its first name.)
            shared = {name.encode() for name in HARDLINK} if "entry per name" in kind.unanswered else set()
            assert [reader.name(child) for child, name in zip(children, names) if name not in shared] == [
                name for name in names if name not in shared]
            assert modes == [reader.stat(child).mode for child in children]
            assert modes == [os.lstat(tree / os.fsdecode(path) / os.fsdecode(name)).st_mode for name in names]
            with_inodes = reader.listing_with_inodes(entry)
            assert list(with_inodes[0]) == list(children) and with_inodes[1:3] == (listed, modes)
            assert with_inodes[3] == [reader.inode(child) for child in children]

    def test_listing_columns(self, reader: ArchiveReader) -> None:
        for directory in ("", "a", "a/b", "m"):
            children = reader.children(reader.lookup(directory))
            # a slice of children(), and (as the interface's Sequence[int] allows) a list
            # of some of them, out of order
            for part in (children, children[1:3], list(children)[::-2]):
                names, modes, uids, gids, mtimes, sizes, nlinks = reader.listing_columns(part)
                assert names == [reader.name(child) for child in part]
                assert list(zip(modes, uids, gids, mtimes, sizes, nlinks)) == [
                    tuple(reader.stat(child))[:6] for child in part]

    # -- reads ----------------------------------------------------------------------------

    def test_read_and_read_path(self, reader: ArchiveReader, kind: ReaderKind) -> None:
        tree = kind.packed.tree
        for path in files_of(tree):
            expected = contents(tree, path)
            entry = reader.lookup(path)
            assert reader.read(entry) == expected, path
            assert reader.read_path(path) == expected, path
            assert reader.read_path(os.fsdecode(path)) == expected, path
            assert bytes(reader.read_view(path)) == expected, path
            reader.check(entry)
        assert reader.read_path("link-to-hello") == FILES["hello.txt"]
        assert reader.read_path("m/link-back") == TEXT  # a symlink in one shard of the layered set to another

    @pytest.mark.parametrize("path, offset, size", [
        ("hello.txt", 0, 5), ("hello.txt", 6, -1), ("hello.txt", 11, 100), ("hello.txt", 12, 5), ("hello.txt", 99, 1),
        ("empty.txt", 0, 10), ("text.txt", 1000, 3000), ("noise.bin", 19_990, 100),
        ("big.bin", (1 << 20) - 5, 10), ("big.bin", 3, (1 << 20) + 7), ("big.bin", len(BIG) - 2, -1),
        (SPARSE, 4090, 12), (SPARSE, 8000, 4000), (SPARSE, (512 << 10) - 3, 10),
        (SPARSE, SPARSE_SIZE - 1, 5),
    ])
    def test_read_a_range(self, reader: ArchiveReader, kind: ReaderKind, path: str, offset: int, size: int) -> None:
        expected = contents(kind.packed.tree, path.encode())
        wanted = expected[offset:] if size < 0 else expected[offset:offset + size]
        assert reader.read(reader.lookup(path), offset, size) == wanted

    def test_open(self, reader: ArchiveReader, kind: ReaderKind) -> None:
        for path in (b"hello.txt", b"big.bin", b"text.txt", SPARSE.encode(), b"empty.txt"):
            expected = contents(kind.packed.tree, path)
            with reader.open(reader.lookup(path), os.fsdecode(path)) as opened:
                assert opened.readable() and opened.seekable() and opened.name == os.fsdecode(path)
                assert opened.read() == expected
                assert opened.read() == b""
                assert opened.seek(0) == 0
                assert opened.read(5) == expected[:5] and opened.tell() == min(5, len(expected))
                assert opened.seek(-3, io.SEEK_END) == max(len(expected) - 3, 0)
                assert opened.read() == expected[-3:]
                opened.seek((1 << 20) - 2)
                buffer = bytearray(7)
                count = opened.readinto(buffer)
                assert bytes(buffer[:count]) == expected[(1 << 20) - 2:(1 << 20) + 5]

    def test_read_many_and_read_batch(self, reader: ArchiveReader, kind: ReaderKind) -> None:
        tree = kind.packed.tree
        paths = files_of(tree)
        items: list[Any] = [path if k % 2 else reader.lookup(path) for k, path in enumerate(paths)]
        items += [items[0], "link-to-hello", items[3]]  # duplicates and a symlink
        expected = [contents(tree, path) for path in paths] + [contents(tree, paths[0]), FILES["hello.txt"],
                                                                contents(tree, paths[3])]
        assert reader.read_many(items) == expected
        with pytest.raises(TypeError):
            reader.read_many("hello.txt")  # type: ignore[arg-type]
        entries = [reader.lookup(path) for path in reversed(paths)]
        batch = dict(reader.read_batch(entries))
        assert sorted(batch) == list(range(len(entries)))
        assert [batch[k] for k in range(len(entries))] == [contents(tree, path) for path in reversed(paths)]
        with pytest.raises((PathNotFoundError, NotAFileError)):
            reader.read_many(["hello.txt", "a"])

    def test_prefetch_makes_files_present_without_reading_them(self, reader: ArchiveReader, kind: ReaderKind,
                                                              tmp_path: Path) -> None:
        kind.require("prefetch")
        tree = kind.packed.tree
        paths = files_of(tree)
        expected = [contents(tree, path) for path in paths]
        if kind.name == "url":  # through a disk cache of its own: the first call fetches
            reader = kind.open("once", cache_dir=tmp_path / "cache")
        try:
            entries = [reader.lookup(path) for path in paths]
            first = reader.prefetch(entries)
            assert first > 0 if kind.name == "url" else first == 0  # a local archive has nothing to fetch
            assert reader.prefetch(entries) == 0 and reader.prefetch([]) == 0  # each byte once
            requests = reader.stats().get("requests", 0)
            assert reader.read_many(entries) == expected
            assert reader.stats().get("requests", 0) == requests  # read from the cache
        finally:
            if kind.name == "url":
                reader.close()

    def test_extents_of_is_extent_of_each_at_once(self, reader: ArchiveReader, kind: ReaderKind) -> None:
        kind.require("window plans")
        entries = [reader.lookup(path) for path in files_of(kind.packed.tree)]
        spans = reader.extents_of(entries)
        assert spans.shape == (len(entries), 2) and str(spans.dtype) == "int64"
        assert [tuple(span) for span in spans.tolist()] == [reader.extent(entry) for entry in entries]
        assert reader.extents_of(entries[::-1]).tolist() == spans[::-1].tolist()  # any order, as asked
        assert reader.extents_of([]).shape == (0, 2)
        for wrong in (reader.entry_count, -1):
            with pytest.raises(NotAFileError):
                reader.extents_of([entries[0], wrong])
        with pytest.raises(type(_raised(lambda: reader.extent(reader.lookup("a"))))):  # as extent: a directory
            reader.extents_of([entries[0], reader.lookup("a")])

    @pytest.mark.parametrize("chunk_size", [1, 4096, 1 << 20])
    def test_read_chunks(self, reader: ArchiveReader, kind: ReaderKind, chunk_size: int) -> None:
        for path in (b"big.bin", SPARSE.encode(), b"text.txt", b"empty.txt") if chunk_size > 1 else (b"hello.txt",):
            chunks = list(reader.read_chunks(reader.lookup(path), chunk_size))
            assert all(0 < len(chunk) <= chunk_size for chunk in chunks), path
            assert b"".join(chunks) == contents(kind.packed.tree, path), path

    def test_read_extents(self, reader: ArchiveReader, kind: ReaderKind) -> None:
        kind.require("extents")
        for path in (b"big.bin", SPARSE.encode(), b"text.txt", b"hello.txt"):
            expected = contents(kind.packed.tree, path)
            rebuilt = bytearray(len(expected))
            covered = 0
            for offset, data in reader.read_extents(reader.lookup(path), 4096):
                assert 0 < len(data) <= 4096 or len(expected) > 4096 and kind.coded, path
                rebuilt[offset:offset + len(data)] = data
                covered += len(data)
            assert bytes(rebuilt) == expected, path
            if path == SPARSE.encode() and kind.coded:
                # The holes left out (the data is in whole blocks of the file system it was on).
                assert sum(len(data) for data in SPARSE_DATA.values()) <= covered < SPARSE_SIZE // 8
            else:
                assert covered == len(expected), path

    def test_readlink_and_xattrs(self, reader: ArchiveReader, kind: ReaderKind) -> None:
        tree = kind.packed.tree
        for path, target in SYMLINKS.items():
            assert reader.readlink(reader.lookup(path, follow=False)) == target.encode()
        with pytest.raises(NotAFileError):
            reader.readlink(reader.lookup("hello.txt"))
        for path in on_disk(tree):
            full = tree / os.fsdecode(path)
            expected = sorted((os.fsencode(name), os.getxattr(full, name, follow_symlinks=False))
                              for name in os.listxattr(full, follow_symlinks=False))
            assert reader.xattrs(reader.lookup(path, follow=False)) == expected, path
        assert reader.xattrs(reader.lookup(HARDLINK[0])) == reader.xattrs(reader.lookup(HARDLINK[1])) != []

    def test_reads_refuse_what_is_not_a_file(self, reader: ArchiveReader) -> None:
        directory, link = reader.lookup("a"), reader.lookup("link-to-hello", follow=False)
        for call in (lambda: reader.read(directory), lambda: reader.read(link), lambda: reader.read_path("a"),
                     lambda: reader.open(directory), lambda: list(reader.read_chunks(directory)),
                     lambda: reader.read_many([directory]), lambda: list(reader.read_batch([link]))):
            with pytest.raises(NotAFileError):
                call()

    # -- checksum policies ----------------------------------------------------------------

    @pytest.mark.parametrize("path", [STORED_FILE, CODED_FILE])
    @pytest.mark.parametrize("policy", ["always", "once"])
    def test_a_damaged_record_fails_every_read(self, kind: ReaderKind, policy: str, path: bytes) -> None:
        copy = damaged(kind, path, lambda start, end: (start + end) // 2)
        error = _error_of(kind)
        for call in _read_calls(path):
            reader = kind.open(policy, copy)
            with pytest.raises(error):
                call(reader)
            with pytest.raises(error):  # under "once": the failure remembered, not read again
                call(reader)
        reader = kind.open(policy, copy)
        for _ in range(2):
            with pytest.raises(error):
                reader.check(reader.lookup(path))

    def test_once_checks_a_record_once(self, kind: ReaderKind) -> None:
        copy = kind.copy()
        file, start, end = stored_span(copy, STORED_FILE)
        once = kind.open("once", copy, cache_dir=False)
        always = None if "always" in kind.unanswered else kind.open("always", copy, cache_dir=False)
        assert once.read_path(STORED_FILE) == NOISE
        if always is not None:
            assert always.read_path(STORED_FILE) == NOISE
        flip_byte(file, start + 7, keep_mtime=True)  # a change the readers cannot see: only a CRC tells
        changed = once.read_path(STORED_FILE)
        assert changed != NOISE and len(changed) == len(NOISE)  # not checked again
        if always is not None:
            with pytest.raises(ChecksumError):
                always.read_path(STORED_FILE)

    def test_never_returns_the_bytes(self, kind: ReaderKind) -> None:
        copy = damaged(kind, STORED_FILE, lambda start, end: start + 7)
        expected = bytearray(NOISE)
        expected[7] ^= 0xFF
        for call in _read_calls(STORED_FILE):
            if call is _chunks:
                continue  # read_chunks checks whatever the policy (test_read_chunks_checks_under_never)
            assert call(kind.open("never", copy)) == bytes(expected)

    def test_read_chunks_checks_under_never(self, kind: ReaderKind) -> None:
        kind.require("checked chunks")
        copy = damaged(kind, STORED_FILE)
        with pytest.raises(ChecksumError):
            _chunks(kind.open("never", copy))

    def test_never_decodes_within_bounds(self, kind: ReaderKind) -> None:
        """A damaged compressed record under "never": garbage or a FormatError, never
        another exception or bytes past the file's size."""
        copy = damaged(kind, CODED_FILE, lambda start, end: (start + end) // 2)
        for call in _read_calls(CODED_FILE):
            if call is _chunks and "checked chunks" in kind.unanswered:
                continue
            try:
                data = call(kind.open("never", copy))
            except FormatError:
                continue
            assert len(data) == len(TEXT)

    # -- damaged archives -----------------------------------------------------------------

    @pytest.mark.parametrize("policy", ["always", "once"])
    def test_a_flipped_byte_is_a_packfs_error(self, kind: ReaderKind, policy: str) -> None:
        if policy == "always":
            kind.require("always")
        copy = damaged(kind, b"big.bin", lambda start, end: end - 100)
        problems = _exercise(lambda: kind.open(policy, copy), kind.packed.tree)
        assert any("big.bin" in problem for problem in problems), problems

    @pytest.mark.parametrize("keep", [0.5, 0.999, 100])
    def test_a_truncated_archive_is_a_packfs_error(self, kind: ReaderKind, keep: float) -> None:
        copy = kind.copy()
        file = stored_span(copy, STORED_FILE)[0]
        size = file.stat().st_size
        os.truncate(file, int(size * keep) if keep < 1 else keep)
        assert _exercise(lambda: kind.open("once", copy), kind.packed.tree)

    # -- closed ---------------------------------------------------------------------------

    @pytest.mark.parametrize("used", [True, False])
    def test_every_call_after_close_raises(self, kind: ReaderKind, used: bool) -> None:
        kind.require("close")
        reader = kind.open("once")
        entries = {name: reader.lookup(name, follow=False) for name in ("hello.txt", "a", "link-to-hello", "m")}
        if used:
            for path in files_of(kind.packed.tree):
                reader.read_path(path)
        reader.close()
        assert reader.closed
        reader.close()  # twice: nothing
        file, directory, link = entries["hello.txt"], entries["a"], entries["link-to-hello"]
        calls: list[Callable[[], object]] = [
            lambda: reader.find(b"hello.txt"), lambda: reader.find(b""), lambda: reader.lookup("hello.txt"),
            lambda: reader.lookup(""), lambda: reader.lookup_kind("a", S_IFDIR),
            lambda: reader.lookup_child(0, b"a"), lambda: reader.lookup_child(entries["m"], b"one.txt"),
            lambda: reader.stat(file), lambda: reader.stat(0), lambda: reader.file_type(file),
            lambda: reader.inode(directory), lambda: reader.name(file), lambda: reader.path_of(file),
            lambda: reader.parent(file), lambda: reader.xattrs(file), lambda: reader.children(directory),
            lambda: reader.children(0), lambda: reader.listing(directory), lambda: reader.listing(0),
            lambda: reader.listing_with_inodes(directory), lambda: reader.listing_columns(range(1, 2)),
            lambda: reader.read(file), lambda: reader.read(file, 1, 2), lambda: reader.read_path("hello.txt"),
            lambda: reader.read_view("hello.txt"), lambda: reader.open(file),
            lambda: reader.read_many([file, "hello.txt"]), lambda: list(reader.read_batch([file])),
            lambda: list(reader.read_chunks(file)), lambda: reader.readlink(link), lambda: reader.check(file),
        ]
        answered = []
        for k, call in enumerate(calls):
            with pytest.raises(ClosedArchiveError, match="^I/O operation on a closed"):
                call()
                answered.append(k)
                raise ClosedArchiveError("I/O operation on a closed (no: noted above)")
        assert not answered, f"calls {answered} answered on a closed reader"


def _read(reader: ArchiveReader, path: bytes) -> bytes:
    return reader.read(reader.lookup(path))


def _part(reader: ArchiveReader, path: bytes) -> bytes:
    entry = reader.lookup(path)
    return b"".join(reader.read(entry, at, 4096) for at in range(0, reader.stat(entry).size, 4096))


def _opened(reader: ArchiveReader, path: bytes) -> bytes:
    with reader.open(reader.lookup(path)) as opened:
        return opened.read()


def _chunks(reader: ArchiveReader, path: bytes = STORED_FILE) -> bytes:
    return b"".join(reader.read_chunks(reader.lookup(path), 4096))


def _read_calls(path: bytes) -> list[Callable[[ArchiveReader], bytes]]:
    """Every read call, each reading all of file ``path``."""
    return [lambda reader: _read(reader, path), lambda reader: reader.read_path(path),
            lambda reader: bytes(reader.read_view(path)), lambda reader: _opened(reader, path),
            lambda reader: reader.read_many([path])[0], lambda reader: reader.read_many([reader.lookup(path)])[0],
            lambda reader: dict(reader.read_batch([reader.lookup(path)]))[0], lambda reader: _part(reader, path),
            _chunks if path == STORED_FILE else (lambda reader: b"".join(reader.read_chunks(reader.lookup(path))))]


def _exercise(open_reader: Callable[[], ArchiveReader], tree: Path) -> list[str]:
    """Open a (damaged) reader and ask it everything about every path of ``tree``: every
    failure must be a PackfsError; returns them (what was asked: the error)."""
    problems: list[str] = []

    def ask(what: str, call: Callable[[], object]) -> object:
        try:
            return call()
        except PackfsError as error:
            problems.append(f"{what}: {type(error).__name__}: {error}")
        except Exception:  # noqa: BLE001  (the contract: nothing but PackfsError)
            pytest.fail(f"{what} raised something other than a PackfsError:\n{traceback.format_exc()}")
        return None

    reader = ask("open", open_reader)
    if reader is None:
        return problems
    for path, st in on_disk(tree).items():
        entry = ask(f"lookup {path!r}", lambda: reader.lookup(path, follow=False))
        if entry is None:
            continue
        ask(f"stat {path!r}", lambda: reader.stat(entry))
        ask(f"xattrs {path!r}", lambda: reader.xattrs(entry))
        if stat_module.S_ISDIR(st.st_mode):
            ask(f"listing {path!r}", lambda: reader.listing_with_inodes(entry))
        elif stat_module.S_ISLNK(st.st_mode):
            ask(f"readlink {path!r}", lambda: reader.readlink(entry))
        else:
            for k, call in enumerate(_read_calls(path)):
                ask(f"read call {k} of {path!r}", lambda: call(reader))
    return problems
