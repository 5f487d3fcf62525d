"""The compiled daemon's operations (packfs._lowlevel.Tree), called directly: each one
answers what the core's Archive answers for the same entry, or the errno a FUSE
request gets; damaged and hostile tables end in EIO, logged once, never in a crash.
Real mounts of it run in the behaviour suite, the mount tests and the fuzzer."""

from __future__ import annotations

import errno
import os
import random
import stat as stat_module
import threading
from pathlib import Path

import pytest

import packfs
from packfs.core import Archive
from packfs.format import S_IFDIR, S_IFLNK, S_IFMT, S_IFREG
from tests.conftest import BLUEPRINT, HARDLINK, SYMLINKS, damaged_copy


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
        assert (inode, mode) == (stored.inode, stored.mode), path
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


def _resident_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))) / 1024


@pytest.mark.fuse
def test_reads_answered_eio_after_the_archive_changed_keep_nothing(tmp_path: Path) -> None:
    """A READ that read its bytes and only then found the archive changed in place
    answers EIO and frees them: the compiled daemon kept each such buffer (up to 1 MiB
    a request, for as long as the mount stayed; found by make fuzz-c, whose replay of
    tests/fuzz_c/read-after-change.ffr shows it under LeakSanitizer)."""
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
