"""The compiled daemon's operations (packfs._lowlevel.Tree), called directly: each one
answers what the core's Archive answers for the same entry, or the errno a FUSE
request gets; damaged and hostile tables end in EIO, logged once, never in a crash.
Real mounts of it run in the behaviour suite, the mount tests and the fuzzer."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import random
import stat as stat_module
import threading
from pathlib import Path

import pytest

import packfs
from packfs.core import Archive
from packfs.format import S_IFDIR, S_IFLNK, S_IFMT, S_IFREG
from tests.conftest import (BLUEPRINT, HARDLINK, SYMLINKS, bytes_read_by_this_thread, column_changed, damaged_copy,
                            damaged_unpieced_archive, wait_until, time_limit)


def _compiled():
    from packfs.fuse import unavailable

    reason = unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the compiled daemon must be built under CI: {reason}")
        pytest.skip(reason)
    from packfs.fuse import tree_for

    return tree_for


@pytest.fixture
def opened(archive: Path):
    with Archive(archive, checksums="once") as served:
        yield served


@pytest.fixture
def compiled(opened: Archive):
    return _compiled()(opened)


def errno_of(call) -> int:
    with pytest.raises(OSError) as caught:
        call()
    return caught.value.errno


def walk(tree, inode: int = 1, prefix: str = ""):
    """(path, inode, mode) of every entry below ``inode``, from readdir alone."""
    for name, child, mode, _ in tree.readdir(inode):
        if name in (b".", b".."):
            continue
        path = prefix + os.fsdecode(name)
        yield path, child, mode
        if mode & S_IFMT == S_IFDIR:
            yield from walk(tree, child, path + "/")


def test_every_entry_agrees_with_the_archive(compiled, opened: Archive) -> None:
    seen = 0
    for path, inode, mode in walk(compiled):
        entry = opened.lookup(path, follow=False)
        stored = opened.stat(entry)
        assert (inode, mode) == (stored.inode, stored.mode & S_IFMT), path  # READDIR carries the type alone
        attributes = compiled.getattr(inode)
        assert attributes == compiled.lookup(opened.inode(opened.parent(entry)), os.fsencode(path.rpartition("/")[2]))
        assert (attributes["st_mode"], attributes["st_nlink"], attributes["st_uid"], attributes["st_gid"],
                attributes["st_mtime_ns"]) == (stored.mode, stored.nlink, stored.uid, stored.gid, stored.mtime_ns)
        kind = stored.mode & S_IFMT
        assert attributes["st_size"] == (stored.size if kind != S_IFDIR else 0)
        if kind == S_IFREG:
            assert attributes["st_blocks"] == (stored.size + 511) // 512
            assert compiled.read(inode, 0, 1 << 20) == opened.read(entry, 0, 1 << 20) == (BLUEPRINT.get(path) or
                                                                                      opened.read(entry))[:1 << 20]
        if kind == S_IFLNK:
            assert compiled.readlink(inode) == os.fsencode(SYMLINKS[path])
        seen += 1
    assert seen == opened.entry_count - 1


def test_reads_at_any_offset_and_size(compiled, opened: Archive) -> None:
    contents = BLUEPRINT["big/large.bin"]
    inode = opened.inode(opened.find(b"big/large.bin"))
    rng = random.Random(1)
    for _ in range(50):
        offset, size = rng.randrange(len(contents) + 10), rng.randrange(1 << 20)
        assert compiled.read(inode, offset, size) == contents[offset:offset + size]
    assert compiled.read(inode, len(contents), 4096) == b""
    assert compiled.read(inode, 0, 0) == b""
    assert errno_of(lambda: compiled.read(inode, 0, (1 << 20) + 1)) == errno.EINVAL


def test_listings_resume_at_any_offset(compiled, opened: Archive) -> None:
    whole = compiled.readdir(1)
    assert [item[0] for item in whole[:2]] == [b".", b".."] and whole[0][1] == whole[1][1] == 1
    assert [item[0] for item in whole[2:]] == opened.listing(0)[1]
    for offset in range(len(whole) + 1):
        assert compiled.readdir(1, offset) == whole[offset:]
    assert [item[3] for item in whole] == list(range(1, len(whole) + 1))


def test_hard_links_share_an_inode_and_names_resolve(compiled, opened: Archive) -> None:
    first, second = (compiled.lookup(1, os.fsencode(name)) for name in HARDLINK)
    assert first["st_ino"] == second["st_ino"] and first["st_nlink"] == 2
    assert compiled.getattr(first["st_ino"]) == first
    a = compiled.lookup(1, b"a")
    deep = compiled.lookup(compiled.lookup(compiled.lookup(a["st_ino"], b"b")["st_ino"], b"c")["st_ino"], b"deep.bin")
    assert stat_module.S_IMODE(deep["st_mode"]) == 0o755


def test_errnos(compiled, opened: Archive) -> None:
    hello = compiled.lookup(1, b"hello.txt")["st_ino"]
    a = compiled.lookup(1, b"a")["st_ino"]
    link = compiled.lookup(1, b"link-to-hello")["st_ino"]
    assert errno_of(lambda: compiled.lookup(1, b"missing")) == errno.ENOENT
    assert errno_of(lambda: compiled.lookup(1, b"")) == errno.ENOENT
    assert errno_of(lambda: compiled.lookup(hello, b"x")) == errno.ENOTDIR
    assert errno_of(lambda: compiled.readdir(hello)) == errno.ENOTDIR
    assert errno_of(lambda: compiled.read(a, 0, 10)) == errno.EISDIR
    assert errno_of(lambda: compiled.read(link, 0, 10)) == errno.EINVAL
    assert errno_of(lambda: compiled.readlink(hello)) == errno.EINVAL
    for inode in (0, opened.entry_count + 1, 2**63):
        assert errno_of(lambda: compiled.getattr(inode)) == errno.EIO  # never handed out


def test_a_damaged_file_is_eio_logged_once_and_the_rest_serves(tmp_path: Path, archive: Path) -> None:
    bad = damaged_copy(archive, tmp_path / "bad.ffr", b"big/large.bin", at=2 << 20)
    with Archive(bad, checksums="once") as opened:
        log_path = tmp_path / "bad.log"
        with open(log_path, "wb") as log:
            tree = _compiled()(opened, log.fileno())
            inode = opened.inode(opened.find(b"big/large.bin"))
            for _ in range(3):  # a check failed is never marked: asked again, EIO again
                assert errno_of(lambda: tree.read(inode, 2 << 20, 4096)) == errno.EIO
            # Its other pieces (format 1.2) and the other files serve.
            assert len(tree.read(inode, 0, 4096)) == 4096
            assert tree.read(opened.inode(opened.find(b"hello.txt")), 0, 100) == b"hello world\n"
        lines = log_path.read_text().splitlines()
        assert len(lines) == 1 and "checksum mismatch" in lines[0] and str(bad) in lines[0], lines
    with Archive(bad, checksums="never") as opened:
        tree = _compiled()(opened)
        assert len(tree.read(opened.inode(opened.find(b"big/large.bin")), 0, 4096)) == 4096


def test_a_size_that_is_not_its_records_length_is_eio_for_that_entry(tmp_path: Path, archive: Path) -> None:
    """Issue 23: the size column reached the kernel unchecked, and the kernel never sends
    a READ at or past st_size, so READ's own check never ran: a 12-byte file whose size
    said 0 was served as empty, one of 2**62 made open().read() fail with MemoryError.
    Now LOOKUP and GETATTR answer EIO for the entry (logged once), READDIRPLUS hands its
    name, type and inode without attributes (the kernel then LOOKUPs it: EIO), and the
    rest of the directory serves."""
    broken = {b"with space.txt": 0, b"-leading-dash": 2**62, b"link-to-hello": 4}
    bad = column_changed(archive, tmp_path / "bad.ffr", "size", broken)
    with Archive(bad, checksums="once") as opened:
        log_path = tmp_path / "bad.log"
        with open(log_path, "wb") as log:
            tree = _compiled()(opened, log.fileno())
            plus = {item[0]: item for item in tree.readdir(1, plus=True)}
            # A plain READDIR gives the file type only (all the kernel uses of its mode).
            assert ([(name, ino, stat.S_IFMT(mode), offset) for name, ino, mode, offset, _ in plus.values()]
                    == tree.readdir(1))
            for name in broken:
                entry = opened.find(name)
                assert errno_of(lambda: tree.lookup(1, name)) == errno.EIO
                assert errno_of(lambda: tree.getattr(entry + 1)) == errno.EIO
                assert plus[name][1:] == (entry + 1, opened.file_type(entry), plus[name][3], None)
            assert errno_of(lambda: tree.read(opened.find(b"with space.txt") + 1, 0, 100)) == errno.EIO
            assert plus[b"hello.txt"][4] == tree.lookup(1, b"hello.txt")
            assert plus[b"."][4] is None and plus[b".."][4] is None  # as the kernel gets them
            assert tree.read(tree.lookup(1, b"hello.txt")["st_ino"], 0, 100) == b"hello world\n"
        lines = log_path.read_text().splitlines()
        assert len(lines) == 3 and all("has a size that is not its record's length" in line for line in lines), lines


def test_every_name_of_a_hard_link_reports_its_inodes_attributes(tmp_path: Path, archive: Path) -> None:
    """Issue 23: the kernel keeps one set of attributes per inode, the last it got, so a
    hard link whose size column was wrong, once stat'ed, cut the file short under its
    sound name too (b'hello' for b'hello world\n').  Every name now reports its inode's
    entry's (first_link's) attributes, each name's own size checked too."""
    first, second = (name.encode() for name in HARDLINK)
    with Archive(archive) as opened:
        assert opened.inode(opened.find(second)) == opened.find(first) + 1  # the first name is the inode's entry
    # The second name's size is wrong: that name is EIO, the first reads whole.
    with Archive(column_changed(archive, tmp_path / "second.ffr", "size", {second: 5}), checksums="once") as opened:
        tree = _compiled()(opened)
        assert errno_of(lambda: tree.lookup(1, second)) == errno.EIO
        sound = tree.lookup(1, first)
        assert sound["st_size"] == 12 and tree.read(sound["st_ino"], 0, 4096) == b"hello world\n"
        assert tree.getattr(sound["st_ino"]) == sound
    # The inode's own entry is wrong: every name is EIO.
    with Archive(column_changed(archive, tmp_path / "first.ffr", "size", {first: 5}), checksums="once") as opened:
        tree = _compiled()(opened)
        assert errno_of(lambda: tree.lookup(1, first)) == errno.EIO
        assert errno_of(lambda: tree.lookup(1, second)) == errno.EIO
    # Names that disagree in a column no rule covers: every name shows the inode's.
    with Archive(column_changed(archive, tmp_path / "owner.ffr", "uid", {second: 4242}), checksums="once") as opened:
        tree = _compiled()(opened)
        assert tree.lookup(1, first) == tree.lookup(1, second) and tree.lookup(1, second)["st_uid"] != 4242
        plus = {item[0]: item[4] for item in tree.readdir(1, plus=True)}
        assert plus[first] == plus[second] == tree.lookup(1, first)


# Large directories are searched with pread (past 1 MiB of name_end values and names),
# their first levels kept for the 8 searched last, each name's first 32 bytes with it.
_LARGE_DIRECTORIES, _CHILDREN = 9, 12_000
_SAME_START = "n" * 40  # longer than the 32 bytes kept: those names are compared whole


def _large_directories(out: Path) -> Path:
    entries = [packfs.Entry(f"big{d}/{_SAME_START}{i * 2:06d}" + "z" * 54) for d in range(_LARGE_DIRECTORIES)
               for i in range(_CHILDREN)]
    entries += [packfs.Entry(f"big{d}/short{i * 2:05d}") for d in range(_LARGE_DIRECTORIES) for i in range(100)]
    # Shorter than the 32 bytes kept, and where the kept names go on: it comes first.
    entries += [packfs.Entry(f"big{d}/{_SAME_START[:20]}") for d in range(_LARGE_DIRECTORIES)]
    entries += [packfs.Entry(f"small/{name}") for name in ("a", "b", "c")]
    packfs.pack_entries(entries, out)
    return out


@pytest.fixture(scope="module")
def large_directories(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _large_directories(tmp_path_factory.mktemp("large") / "large.ffr")


def _probes(directory: int) -> list[bytes]:
    """Names present and absent: before, between and after them, prefixes of them, and
    them with a byte more, across the 32 bytes kept."""
    rng = random.Random(directory)
    probes = []
    for i in rng.sample(range(_CHILDREN), 60) + [0, _CHILDREN - 1]:
        present = f"{_SAME_START}{i * 2:06d}" + "z" * 54
        probes += [present, f"{_SAME_START}{i * 2 + 1:06d}" + "z" * 54, present[:-1], present + "z",
                   present[:32], present[:33]]
    probes += ["", "a", "short00004", "short00005", "short", "zzz", _SAME_START, "n" * 200, "\xff", "n" * 20,
               "n" * 19, "n" * 21, "n" * 31]
    return [os.fsencode(probe) for probe in probes]


def test_lookups_in_large_directories_find_what_the_archive_finds(large_directories: Path) -> None:
    """Issue 23: a large directory's search reads with pread, through kept first levels
    (8 directories' worth: 9 here, searched in turn, take them over from each other),
    and answers exactly what the core's binary search answers, from many threads too."""
    with Archive(large_directories, checksums="once") as opened:
        tree = _compiled()(opened)
        directories = [opened.find(f"big{d}".encode()) for d in range(_LARGE_DIRECTORIES)]
        directories.append(opened.find(b"small"))
        expected = {(directory, probe): opened.lookup_child(directory, probe)
                    for directory in directories for probe in _probes(directory)}
        assert sum(found >= 0 for found in expected.values()) > 500

        def answer(directory: int, probe: bytes) -> int:
            try:
                return tree.lookup(directory + 1, probe)["st_ino"] - 1
            except FileNotFoundError:
                return -1

        for _ in range(2):  # the second pass through kept levels, or taken over again
            for directory in directories:
                for probe in _probes(directory):
                    assert answer(directory, probe) == expected[(directory, probe)], (directory, probe)
        failures: list[tuple[int, bytes, int]] = []

        def worker(seed: int) -> None:
            rng = random.Random(seed)
            for directory, probe in rng.sample(sorted(expected), 600):
                got = answer(directory, probe)
                if got != expected[(directory, probe)]:
                    failures.append((directory, probe, got))

        threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures[:5]


def test_a_broken_name_in_a_large_directory_is_eio(tmp_path: Path, large_directories: Path) -> None:
    """The search with pread checks each name it reads as the search through the map
    does (format section 5: inside the names section)."""
    from tests.conftest import rewrite_section

    with Archive(large_directories) as opened:
        directory = opened.find(b"big0")
        middle = opened.children(directory)[len(opened.children(directory)) // 2]
    bad = rewrite_section(large_directories, tmp_path / "bad.ffr", "name_end",
                          lambda ends: ends.__setitem__(middle, 2**60))
    with Archive(bad, checksums="once") as opened:
        log_path = tmp_path / "bad.log"
        with open(log_path, "wb") as log:
            tree = _compiled()(opened, log.fileno())
            assert errno_of(lambda: tree.lookup(directory + 1, b"anything")) == errno.EIO
            assert errno_of(lambda: tree.lookup(directory + 1, b"anything else")) == errno.EIO
            assert tree.lookup(opened.find(b"small") + 1, b"a")["st_size"] == 0
        assert "has a name outside the names section" in log_path.read_text()


def test_first_reads_of_a_large_file_together_get_the_right_bytes(tmp_path: Path) -> None:
    """Threads reading a large file's first pieces at once (readahead does): one checks
    the record, the others wait for it; every read gets its bytes."""
    contents = os.urandom(24 << 20)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "big.bin").write_bytes(contents)
    packfs.pack_folder(tmp_path / "src", tmp_path / "big.ffr")
    with Archive(tmp_path / "big.ffr", checksums="once") as opened:
        tree = _compiled()(opened)
        inode = opened.inode(opened.find(b"big.bin"))
        start = threading.Barrier(8)
        results: dict[int, bytes] = {}

        def read(part: int) -> None:
            start.wait()
            results[part] = tree.read(inode, part << 20, 1 << 20)

        threads = [threading.Thread(target=read, args=(part,)) for part in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(results[part] == contents[part << 20:(part + 1) << 20] for part in range(8))


def test_an_archive_written_over_in_place_answers_eio_from_then_on(tmp_path: Path, archive: Path) -> None:
    target = tmp_path / "target.ffr"
    target.write_bytes(archive.read_bytes())
    with Archive(target, checksums="once") as opened:
        log_path = tmp_path / "changed.log"
        with open(log_path, "wb") as log:
            tree = _compiled()(opened, log.fileno())
            hello = tree.lookup(1, b"hello.txt")["st_ino"]
            assert not tree.changed()
            with open(target, "r+b") as rewrite:
                rewrite.write(bytes(target.stat().st_size))
            before = target.stat()
            os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))  # a new mtime for certain
            for call in (lambda: tree.getattr(1), lambda: tree.lookup(1, b"hello.txt"), lambda: tree.readdir(1),
                         lambda: tree.read(hello, 0, 100)):
                assert errno_of(call) == errno.EIO
            assert tree.changed()
        assert "archive changed in place" in log_path.read_text()


def test_the_remount_notice_is_written_past_the_log_cap(tmp_path: Path) -> None:
    """Issue 23: after 10,000 logged problems the one notice that tells an operator what
    to do ("archive changed in place; remount") was dropped with the rest."""
    from tests.conftest import rewrite_section

    count = 12_000  # 10,000 distinct problems logged, whatever the log's hash collisions
    packfs.pack_entries([packfs.Entry(f"f{i:05d}") for i in range(count)], tmp_path / "empty.ffr")
    target = rewrite_section(tmp_path / "empty.ffr", tmp_path / "target.ffr", "size",
                             lambda size: size.__setitem__(slice(1, None), 1))  # each 1 byte, its record 0
    log_path = tmp_path / "full.log"
    with Archive(target, checksums="once") as opened, open(log_path, "wb") as log:
        tree = _compiled()(opened, log.fileno())
        for entry in range(1, count + 1):
            assert errno_of(lambda: tree.read(entry + 1, 0, 1)) == errno.EIO
        assert len(log_path.read_text().splitlines()) == 10_000  # the cap
        with open(target, "r+b") as rewrite:
            rewrite.write(b"\0" * 64)
        before = target.stat()
        os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
        for _ in range(3):
            assert errno_of(lambda: tree.getattr(1)) == errno.EIO
    lines = log_path.read_text().splitlines()
    assert len(lines) == 10_001 and "archive changed in place (overwritten or replaced); remount" in lines[-1]


def test_mtimes_at_the_ends_of_the_column(tmp_path: Path) -> None:
    """Issue 23: the Tree's attributes computed tv_sec * 10**9 + tv_nsec, a signed
    overflow (undefined behaviour, which UBSan reports) for mtimes near INT64_MIN."""
    stored = {"past": -(2**63), "past-1": -(2**63) + 1, "future": 2**63 - 1, "before-1970": -1, "epoch": 0,
              "half": -1_500_000_000}
    packfs.pack_entries([packfs.Entry(name, b"x", mtime_ns=mtime) for name, mtime in stored.items()],
                        tmp_path / "times.ffr")
    with Archive(tmp_path / "times.ffr") as opened:
        tree = _compiled()(opened)
        for name, mtime in stored.items():
            attributes = tree.lookup(1, name.encode())
            assert attributes["st_mtime_ns"] == mtime == opened.stat(opened.find(name.encode())).mtime_ns, name
            assert tree.getattr(attributes["st_ino"]) == attributes
        listed = {item[0]: item[4] for item in tree.readdir(1, plus=True)}
        assert all(listed[name.encode()]["st_mtime_ns"] == mtime for name, mtime in stored.items())


_FAILED_TREE = """
import sys
from packfs.core import Archive
from packfs._lowlevel import Tree

with Archive(sys.argv[1]) as opened:
    source = opened.source
    tree = Tree.__new__(Tree)
    try:  # the header's values are sound, the sections are not: __init__ fails half-way
        tree.__init__(source.mapping, source.fileno(), -1, opened.record_count, opened.data_records,
                      opened.entry_count, [], True)
    except ValueError as error:
        print("init:", error)
    calls = {"getattr": lambda: tree.getattr(1), "lookup": lambda: tree.lookup(1, b"hello.txt"),
             "readdir": lambda: tree.readdir(1), "read": lambda: tree.read(2, 0, 10),
             "readlink": lambda: tree.readlink(2), "getxattr": lambda: tree.getxattr(1, b"user.a"),
             "listxattr": lambda: tree.listxattr(1), "changed": lambda: tree.changed(),
             "override": lambda: tree.override(uid=1), "mount": lambda: tree.mount("/nonexistent", "ro"),
             "run": lambda: tree.run()}
    for name, call in calls.items():
        try:
            call()
            print(name, "answered")
        except ValueError as error:
            print(name, "ValueError:", error)
    try:
        tree.__init__(source.mapping, source.fileno(), -1, opened.record_count, opened.data_records,
                      opened.entry_count, opened.section_spans, True)
    except TypeError as error:
        print("again:", error)
"""


def test_a_tree_whose_construction_failed_refuses_every_call(archive: Path) -> None:
    """Issue 23: a Tree whose __init__ failed after taking the map could still be called,
    and read its unset columns: a crash.  Every method now raises ValueError."""
    import subprocess
    import sys

    from tests.conftest import REPO

    _compiled()
    result = subprocess.run([sys.executable, "-c", _FAILED_TREE, str(archive)], capture_output=True, text=True,
                            cwd=REPO, timeout=time_limit(60))
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    lines = result.stdout.splitlines()
    assert lines[0] == "init: expected 15 sections" and lines[-1] == "again: a Tree is initialised once"
    assert all(line.endswith("ValueError: the Tree is not initialised") for line in lines[1:-1]), lines
    assert len(lines) == 13


def test_options_for_the_low_level_api() -> None:
    from packfs.errors import MountError
    from packfs.fuse.inodedaemon import lowlevel_options

    text, overrides, loop = lowlevel_options({"ro": True, "fsname": "packfs:/a", "use_ino": True,
                                              "kernel_cache": True, "entry_timeout": 86400, "uid": "1000",
                                              "umask": "022", "max_threads": "3", "clone_fd": True,
                                              "allow_other": True})
    assert text == f"ro,fsname=packfs:/a,allow_other,max_read={1 << 20}"
    assert overrides == {"uid": 1000, "umask": 0o22} and loop == {"max_threads": 3, "clone_fd": 1}
    with pytest.raises(MountError, match="uid=abc"):
        lowlevel_options({"uid": "abc"})


def test_owner_and_mode_overrides(compiled, opened: Archive) -> None:
    compiled.override(uid=1234, gid=99, umask=0o077)
    hello = compiled.lookup(1, b"hello.txt")
    assert (hello["st_uid"], hello["st_gid"], stat_module.S_IMODE(hello["st_mode"])) == (1234, 99, 0o600)
    assert stat_module.S_IMODE(compiled.getattr(compiled.lookup(1, b"a")["st_ino"])["st_mode"]) == 0o700
    with pytest.raises(ValueError):
        compiled.override(uid=2**32 - 1)


def test_what_the_compiled_daemon_cannot_serve_is_said(tmp_path: Path) -> None:
    from packfs.fuse import choose_binding, unavailable
    from tests.conftest import REPO

    _compiled()
    legacy = REPO / "tests" / "vectors" / "ffrecord" / "packed_folder.ffr"
    with Archive(legacy) as opened:
        assert "FFRecord packed folder" in unavailable(opened)
        binding, notice = choose_binding("auto", opened)
        assert binding == "mfusepy" and "Python daemon" in notice and "FFRecord" in notice
        with pytest.raises(packfs.errors.MountError, match="cannot serve"):
            choose_binding("lowlevel", opened)
    packfs.pack_entries([packfs.Entry("a", b"x")], tmp_path / "a.ffr")
    with Archive(tmp_path / "a.ffr") as opened:
        assert choose_binding("auto", opened) == ("lowlevel", None)
        assert choose_binding("fusepy", opened) == ("fusepy", None)


@pytest.mark.fuse
def test_the_cli_says_which_daemon_serves(tmp_path: Path) -> None:
    """`packfs info` names the daemon a mount would use; `packfs mount` of an archive the
    compiled daemon cannot serve says so in one line, then serves it with mfusepy."""
    from tests.conftest import REPO, packfs_cli, require_fuse

    require_fuse("auto")
    _compiled()
    legacy = REPO / "tests" / "vectors" / "ffrecord" / "packed_folder.ffr"
    packfs.pack_entries([packfs.Entry("a", b"x")], tmp_path / "a.ffr")
    assert "mount daemon    lowlevel (compiled, libfuse 3." in packfs_cli("info", tmp_path / "a.ffr").stdout
    assert "mount daemon    mfusepy (Python): the archive is an FFRecord" in packfs_cli("info", legacy).stdout
    (tmp_path / "m").mkdir()
    result = packfs_cli("mount", legacy, tmp_path / "m")
    try:
        lines = result.stderr.splitlines()
        assert result.returncode == 0 and len(lines) == 2, result.stderr
        assert lines[0].startswith("note: serving with the Python daemon (mfusepy)") and "FFRecord" in lines[0]
        assert lines[1].startswith("mounted ")
        assert os.listdir(tmp_path / "m")
    finally:
        assert packfs_cli("unmount", tmp_path / "m").returncode == 0


def test_without_the_extension_auto_falls_back_and_lowlevel_says_why(tmp_path: Path, monkeypatch) -> None:
    """Where pip could not build packfs._lowlevel (no compiler or headers), packfs still
    works: auto serves with mfusepy and says why; lowlevel is a one-line error."""
    import sys

    from packfs.fuse import check_fuse, choose_binding, unavailable

    monkeypatch.setitem(sys.modules, "packfs._lowlevel", None)  # an import of it now fails, as unbuilt
    monkeypatch.delattr(packfs, "_lowlevel", raising=False)  # (the package keeps what was imported)
    assert "packfs._lowlevel is not built" in unavailable()
    packfs.pack_entries([packfs.Entry("a", b"x")], tmp_path / "a.ffr")
    with Archive(tmp_path / "a.ffr") as opened:
        binding, notice = choose_binding("auto", opened)
        assert binding == "mfusepy" and "not built" in notice
        with pytest.raises(packfs.errors.MountError, match="not built"):
            choose_binding("lowlevel", opened)
    if os.path.exists("/dev/fuse"):
        with pytest.raises(packfs.errors.MountError, match="compiled daemon .* is not available"):
            check_fuse("lowlevel")


@pytest.mark.fuse
def test_the_mount_reads_ahead_1_mib(tmp_path: Path) -> None:
    """As root the compiled daemon raises its mount's read_ahead_kb from FUSE's 128 to
    READ_AHEAD_KB, so a large file read cold keeps several 1 MiB READs in flight."""
    from packfs.fuse.inodedaemon import READ_AHEAD_KB
    from tests.conftest import mounted, wait_until

    _compiled()
    if os.geteuid() != 0:
        pytest.skip("only root may write /sys/class/bdi/*/read_ahead_kb")
    packfs.pack_entries([packfs.Entry("a", b"x")], tmp_path / "a.ffr")
    with mounted(tmp_path / "a.ffr", tmp_path / "m", binding="lowlevel") as root:
        device = os.stat(root).st_dev
        setting = Path(f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb")
        assert wait_until(lambda: setting.read_text().strip() == str(READ_AHEAD_KB), 10), setting.read_text()


def test_a_damaged_large_file_is_checked_once_then_eio_at_once(tmp_path: Path) -> None:
    """A record over 1 MiB without piece CRCs (format 1.1) that fails its check is read
    whole once; every later READ of it answers EIO without reading it again."""
    bad = damaged_unpieced_archive(tmp_path, size=16 << 20, small_files=3)
    with Archive(bad, checksums="once") as opened:
        log_path = tmp_path / "bad.log"
        with open(log_path, "wb") as log:
            tree = _compiled()(opened, log.fileno())
            inode = opened.inode(opened.find(b"big.bin"))
            before = bytes_read_by_this_thread()
            assert errno_of(lambda: tree.read(inode, 0, 4096)) == errno.EIO
            first = bytes_read_by_this_thread() - before
            assert 16 << 20 <= first < 17 << 20  # the whole record, once
            for offset in (0, 8 << 20, (16 << 20) - 1):
                before = bytes_read_by_this_thread()
                assert errno_of(lambda: tree.read(inode, offset, 4096)) == errno.EIO
                assert bytes_read_by_this_thread() - before < 4096  # nothing read again
            assert tree.read(opened.inode(opened.find(b"s000")), 0, 100) == b"small file 0\n"
        lines = log_path.read_text().splitlines()
        assert len(lines) == 1 and "checksum mismatch" in lines[0], lines


def test_a_check_in_progress_blocks_only_readers_of_its_own_record(tmp_path: Path) -> None:
    """While a damaged large file is being checked (held there by the test hook), a
    small file whose record shares its old lock stripe (record r + 256) reads, and so do
    listings and attributes; a second reader of the large file waits for that one
    check instead of reading it again, and both get EIO."""
    bad = damaged_unpieced_archive(tmp_path)
    with Archive(bad, checksums="once") as opened:
        tree = _compiled()(opened)
        big = opened.find(b"big.bin")
        record = opened._file_span(big)[0]
        same_stripe = next(entry for entry in opened.children(0)
                           if entry != big and opened._file_span(entry)[0] == record + 256)
        name = opened.name(same_stripe)
        answers: list[int] = []

        def read_big() -> None:
            answers.append(errno_of(lambda: tree.read(opened.inode(big), 0, 4096)))

        tree.hold_checks(True)
        readers = [threading.Thread(target=read_big) for _ in range(2)]
        try:
            readers[0].start()
            assert wait_until(lambda: tree.checking() == (1, 0))
            readers[1].start()
            # The check holds its claim on record r; everything else is served.
            assert tree.read(opened.inode(same_stripe), 0, 100) == b"small file %d\n" % int(name[1:])
            assert tree.lookup(1, name)["st_ino"] == opened.inode(same_stripe)
            assert len(tree.readdir(1)) == 2 + len(opened.children(0))
            assert tree.getattr(opened.inode(big))["st_size"] == 16 << 20
            assert tree.checking() == (1, 0) and answers == []
        finally:
            tree.hold_checks(False)
            for reader in readers:
                reader.join()
        assert answers == [errno.EIO, errno.EIO] and tree.checking() == (0, 0)


@pytest.mark.fuse
def test_reads_waiting_for_a_check_are_parked_holding_no_worker_thread(tmp_path: Path) -> None:
    """Through a real mount served (in this process) by two worker threads: while one
    holds the check of a damaged large file (the test hook), six more READs of that file
    are parked, not waiting in a worker, so the other worker serves a small file, a
    listing and a stat; when the check ends, every READ of the large file gets EIO."""
    import subprocess

    from packfs import _lowlevel
    from packfs.fuse.inodedaemon import lowlevel_options
    from tests.conftest import require_fuse

    require_fuse("lowlevel")
    if _lowlevel.FUSE_VERSION < 312:
        pytest.skip("a thread limit needs libfuse 3.12")
    bad = damaged_unpieced_archive(tmp_path, size=16 << 20, small_files=3)
    mountpoint = tmp_path / "m"
    mountpoint.mkdir()
    answers: list[int] = []

    def read_big(offset: int) -> None:
        descriptor = os.open(mountpoint / "big.bin", os.O_RDONLY)
        try:
            answers.append(errno_of(lambda: os.pread(descriptor, 4096, offset)))
        finally:
            os.close(descriptor)

    served: dict[str, object] = {}

    def use_the_rest() -> None:
        served["read"] = (mountpoint / "s001").read_bytes()
        served["listing"] = sorted(os.listdir(mountpoint))
        served["size"] = os.stat(mountpoint / "s002").st_size

    with Archive(bad, checksums="once") as opened:
        tree = _compiled()(opened)
        tree.mount(str(mountpoint), lowlevel_options({"ro": True, "fsname": "packfs-test"})[0])
        server = threading.Thread(target=tree.run, kwargs={"threads": 2})
        server.start()
        readers = [threading.Thread(target=read_big, args=(k << 20,)) for k in range(7)]
        try:
            tree.hold_checks(True)
            readers[0].start()
            assert wait_until(lambda: tree.checking()[0] == 1)
            for reader in readers[1:]:
                reader.start()
            assert wait_until(lambda: tree.checking()[1] >= 6), tree.checking()
            rest = threading.Thread(target=use_the_rest, daemon=True)
            rest.start()
            rest.join(time_limit(60))  # only a deadlock lasts that long: the test fails, it does not hang
            assert served == {"read": b"small file 1\n", "listing": ["big.bin", "s000", "s001", "s002"],
                              "size": 13}
            assert answers == []
        finally:
            tree.hold_checks(False)
            for reader in readers:
                if reader.is_alive() or reader.ident is not None:
                    reader.join()
            subprocess.run(["fusermount", "-u", str(mountpoint)], capture_output=True)
            server.join()
    assert answers == [errno.EIO] * 7


@pytest.mark.fuse
def test_the_session_ends_only_after_the_reads_parked_on_another_threads_check(tmp_path: Path) -> None:
    """A READ parked on a check that a Python thread runs (Tree.read) is answered by that
    thread: run() must not end the session (and free it) before then, even when asked
    to stop (a stress campaign saw the reply go to a destroyed session)."""
    import signal
    import subprocess

    from packfs.fuse.inodedaemon import lowlevel_options
    from tests.conftest import require_fuse

    require_fuse("lowlevel")
    bad = damaged_unpieced_archive(tmp_path, size=16 << 20, small_files=3)
    mountpoint = tmp_path / "m"
    mountpoint.mkdir()
    results: dict[str, object] = {}
    with Archive(bad, checksums="once") as opened:
        tree = _compiled()(opened)
        inode = opened.inode(opened.find(b"big.bin"))
        tree.mount(str(mountpoint), lowlevel_options({"ro": True, "fsname": "packfs-test"})[0])
        server = threading.Thread(target=lambda: results.setdefault("run", tree.run(threads=2)))
        server.start()

        def python_read() -> None:
            results["python"] = errno_of(lambda: tree.read(inode, 0, 4096))

        def fuse_read() -> None:
            descriptor = os.open(mountpoint / "big.bin", os.O_RDONLY)
            try:
                results["fuse"] = errno_of(lambda: os.pread(descriptor, 4096, 0))
            finally:
                # The session may be gone by now: close answers ENOTCONN then, which is fine.
                with contextlib.suppress(OSError):
                    os.close(descriptor)

        checker = threading.Thread(target=python_read)
        reader = threading.Thread(target=fuse_read, daemon=True)
        try:
            tree.hold_checks(True)
            checker.start()  # claims the record from a thread that is no libfuse worker
            assert wait_until(lambda: tree.checking()[0] == 1)
            reader.start()
            assert wait_until(lambda: tree.checking()[1] == 1), tree.checking()  # the READ is parked
            signal.pthread_kill(server.ident, signal.SIGTERM)  # libfuse's handler ends the loop
            server.join(2)
            assert server.is_alive(), "the session ended with a READ still parked on it"
        finally:
            tree.hold_checks(False)
            checker.join(time_limit(30))
            reader.join(time_limit(30))
            server.join(time_limit(30))
            subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True)
        assert not server.is_alive() and tree.checking() == (0, 0)
        # The FUSE READ got its answer, not a reply into a freed session: EIO, or, the
        # mount being torn down by then, the kernel's word that the connection went.
        assert results["python"] == errno.EIO, results
        assert results["fuse"] in (errno.EIO, errno.ENOTCONN, errno.ECONNABORTED), results


def _resident_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))) / 1024


@pytest.mark.fuse
def test_reads_answered_eio_after_the_archive_changed_keep_nothing(tmp_path: Path) -> None:
    """A READ that read its bytes and only then found the archive changed in place
    answers EIO and frees them: the compiled daemon kept each such buffer (up to 1 MiB
    a request, for as long as the mount stayed; found by a libFuzzer harness under
    LeakSanitizer)."""
    from tests.conftest import daemon_pid, mounted

    _compiled()
    archive = tmp_path / "a.ffr"
    contents = random.Random(5).randbytes(1 << 20)
    packfs.pack_entries([packfs.Entry("big", contents)], archive)
    # direct_io: every read(2) is a READ to the daemon, none from the page cache.
    with mounted(archive, tmp_path / "mnt", "-o", "direct_io", binding="lowlevel") as root:
        pid = daemon_pid(root)
        fd = os.open(root / "big", os.O_RDONLY)
        try:
            assert os.pread(fd, 1 << 20, 0) == contents  # checked once; later reads just read
            with open(archive, "ab") as grow:  # changed in place; the file's bytes are all still there
                grow.write(b"x")
            before = _resident_mib(pid)
            for _ in range(64):
                with pytest.raises(OSError) as caught:
                    os.pread(fd, 1 << 20, 0)
                assert caught.value.errno == errno.EIO
            grown = _resident_mib(pid) - before
        finally:
            os.close(fd)
    # 64 MiB when each READ's buffer was kept; a few MiB of allocator slack otherwise.
    assert grown < 24, f"the daemon grew {grown:.0f} MiB over 64 reads answered EIO"


def test_the_oldest_and_newest_mtimes_come_back_exactly(tmp_path: Path) -> None:
    """Tree.getattr and Tree.lookup give the stored mtime_ns back for any int64: for times
    before 1678 the seconds times 10^9 overflowed (undefined behaviour; found by make
    fuzz-c under UBSan, whose replay of tests/fuzz_c/mtime-before-1678.ffr fails
    without the fix; a build without UBSan happened to wrap to the right value)."""
    times = {"oldest": -2**63, "before-1678": -2**63 + 10**9 - 1, "newest": 2**63 - 1, "just-before-1970": -1}
    path = tmp_path / "times.ffr"
    packfs.pack_entries([packfs.Entry(name, b"x", mtime_ns=value) for name, value in times.items()], path)
    with Archive(path, checksums="once") as opened:
        tree = _compiled()(opened)
        for name, value in times.items():
            found = tree.lookup(1, name.encode())
            assert found["st_mtime_ns"] == tree.getattr(found["st_ino"])["st_mtime_ns"] == value, name
