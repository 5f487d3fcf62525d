"""PackfsOperations called directly: the FUSE translation without /dev/fuse."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

import packfs
import packfs.core

from packfs import PackedFolder
from packfs.fuse.common import FuseError
from packfs.fuse.pathdaemon import PackfsOperations
from tests.conftest import (BLUEPRINT, MTIME_NS, NON_UTF8, bytes_read_by_this_thread, damaged_copy,
                            damaged_unpieced_archive, rewrite_section)


@pytest.fixture
def ops(folder: PackedFolder) -> PackfsOperations:
    return PackfsOperations(folder)


def _errno(call) -> int:
    with pytest.raises(OSError) as caught:
        call()
    assert isinstance(caught.value.errno, int)  # fusepy needs a real errno
    return caught.value.errno


def test_getattr(ops: PackfsOperations, tree: Path) -> None:
    attrs = ops.getattr("/a/b/c/deep.bin")
    info = os.lstat(tree / "a/b/c/deep.bin")
    assert attrs["st_mode"] == info.st_mode and attrs["st_size"] == 768
    assert attrs["st_mtime"] == MTIME_NS and attrs["st_blocks"] == 2
    assert attrs["st_nlink"] == 1
    assert ops.getattr("/")["st_mode"] & stat.S_IFDIR and ops.getattr("/")["st_ino"] == 1
    assert stat.S_ISLNK(ops.getattr("/link-to-hello")["st_mode"])
    assert ops.getattr("/hardlink.txt")["st_nlink"] == 2
    assert ops.getattr("/a")["st_nlink"] == 2 + 2  # a/b and a/empty_nested
    assert ops.getattr("/" + NON_UTF8)["st_size"] == 3
    # Inode numbers are stable and distinct.
    assert ops.getattr("/hello.txt")["st_ino"] != ops.getattr("/Zeta.txt")["st_ino"]


def test_errors_map_to_errno(ops: PackfsOperations) -> None:
    assert _errno(lambda: ops.getattr("/missing")) == errno.ENOENT
    assert _errno(lambda: ops.getattr("/hello.txt/x")) == errno.ENOENT
    assert _errno(lambda: ops.readdir("/hello.txt", 0)) == errno.ENOTDIR
    assert _errno(lambda: ops.open("/a", os.O_RDONLY)) == errno.EISDIR
    assert _errno(lambda: ops.readlink("/hello.txt")) == errno.EINVAL
    assert _errno(lambda: ops.read("/x", 10, 0, 10**9)) == errno.EBADF
    assert _errno(lambda: ops.read("/missing", 10, 0, 0)) == errno.ENOENT
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC):
        assert _errno(lambda: ops.open("/hello.txt", flags)) == errno.EROFS
    for call in (lambda: ops.write("/hello.txt", b"x", 0, 0), lambda: ops.unlink("/hello.txt"),
                 lambda: ops.mkdir("/new", 0o755), lambda: ops.rename("/a", "/b"),
                 lambda: ops.chmod("/hello.txt", 0o777), lambda: ops.create("/n", 0o644),
                 lambda: ops.truncate("/hello.txt", 0), lambda: ops.symlink("/l", "t"),
                 lambda: ops.access("/hello.txt", os.W_OK)):
        assert _errno(call) == errno.EROFS


def test_readdir_lists_everything_with_types(ops: PackfsOperations, folder: PackedFolder) -> None:
    listing = ops.readdir("/", 0)
    names = [name for name, _, _ in listing]
    assert names[:2] == [".", ".."]
    assert names[2:] == folder.list()
    types = {name: attrs["st_mode"] & stat.S_IFMT(0o170000) for name, attrs, _ in listing[2:]}
    assert types["a"] == stat.S_IFDIR and types["hello.txt"] == stat.S_IFREG
    assert types["link-to-hello"] == stat.S_IFLNK


def test_open_and_read(ops: PackfsOperations) -> None:
    fh = ops.open("/big/large.bin", os.O_RDONLY)
    data = BLUEPRINT["big/large.bin"]
    assert ops.read("/big/large.bin", 4096, 0, fh) == data[:4096]
    assert ops.read("/big/large.bin", 1 << 20, len(data) - 10, fh) == data[-10:]
    assert ops.read("/big/large.bin", 100, len(data) + 5, fh) == b""
    assert ops.readlink("/a/link-up") == "../hello.txt"
    assert ops.access("/hello.txt", os.R_OK) is None


def test_no_open_moves_the_work_to_read(folder: PackedFolder) -> None:
    ops = PackfsOperations(folder, no_open=True)
    assert _errno(lambda: ops.open("/hello.txt", os.O_RDONLY)) == errno.ENOSYS
    assert _errno(lambda: ops.open("/hello.txt", os.O_WRONLY)) == errno.EROFS
    assert ops.read("/hello.txt", 100, 0, 0) == b"hello world\n"  # no handle: by path
    assert ops.read("/big/large.bin", 10, 5, 0) == BLUEPRINT["big/large.bin"][5:15]


def test_statfs(ops: PackfsOperations, archive: Path) -> None:
    info = ops.statfs("/")
    assert info["f_files"] == ops.archive.entry_count
    assert info["f_blocks"] * info["f_bsize"] >= archive.stat().st_size


def test_checksum_failure_is_eio_once_logged(archive: Path, tmp_path: Path, caplog) -> None:
    damaged_copy(archive, tmp_path / "bad.ffr", b"Zeta.txt")
    with PackedFolder(tmp_path / "bad.ffr") as folder:
        ops = PackfsOperations(folder)
        for _ in range(3):
            assert _errno(lambda: ops.open("/Zeta.txt", os.O_RDONLY)) == errno.EIO
        assert caplog.text.count("checksum mismatch") == 1
        ops.open("/hello.txt", os.O_RDONLY)  # the others still open
        no_open = PackfsOperations(folder, no_open=True)  # the check happens at read
        for _ in range(2):
            assert _errno(lambda: no_open.read("/Zeta.txt", 4096, 0, 0)) == errno.EIO
            assert _errno(lambda: no_open.read("/Zeta.txt", 10, 5, 0)) == errno.EIO
        assert no_open.read("/hello.txt", 4096, 0, 0) == b"hello world\n"
        assert no_open.read("/hello.txt", 4096, 0, 0) == b"hello world\n"  # checked once
    with packfs.core.Archive(tmp_path / "bad.ffr", checksums="never") as unchecked:
        assert PackfsOperations(unchecked).open("/Zeta.txt", os.O_RDONLY) >= 0


def test_a_damaged_large_file_is_read_once_then_eio_at_once(tmp_path: Path) -> None:
    """The mount's "once" policy: a damaged file over 1 MiB without piece CRCs (format
    1.1) is read and checked at its first READ, and every later READ is EIO without
    reading it again (it used to read and check it whole each time)."""
    bad = damaged_unpieced_archive(tmp_path, size=16 << 20, small_files=3)
    with packfs.core.Archive(bad, checksums="once") as archive:
        ops = PackfsOperations(archive, no_open=True)
        assert _errno(lambda: ops.read("/big.bin", 131072, 0, 0)) == errno.EIO
        for offset in (0, 8 << 20):
            before = bytes_read_by_this_thread()
            assert _errno(lambda: ops.read("/big.bin", 131072, offset, 0)) == errno.EIO
            assert bytes_read_by_this_thread() - before < 4096
        assert ops.read("/s002", 4096, 0, 0) == b"small file 2\n"


def test_a_hostile_entry_is_eio_and_the_rest_is_served(archive: Path, tmp_path: Path) -> None:
    """Open checks the table in O(1); an entry that breaks the format where it is used
    (here a device node's file type, with every CRC valid) is EIO, never served."""
    with PackedFolder(archive) as folder:
        entry = folder.archive.find(b"a/b/c/deep.bin")
    bad = rewrite_section(archive, tmp_path / "bad.ffr", "mode",
                          lambda mode: mode.__setitem__(entry, stat.S_IFCHR | 0o666))
    with PackedFolder(bad) as folder:
        ops = PackfsOperations(folder, no_open=True)
        assert _errno(lambda: ops.getattr("/a/b/c/deep.bin")) == errno.EIO
        assert _errno(lambda: ops.readdir("/a/b/c", 0)) == errno.EIO
        assert ops.read("/hello.txt", 4096, 0, 0) == b"hello world\n"
        assert stat.S_ISDIR(ops.getattr("/a/b")["st_mode"])
        assert not folder.verify().ok


def test_unexpected_errors_become_eio(ops: PackfsOperations, monkeypatch) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(ops.archive, "find", broken)
    assert _errno(lambda: ops.getattr("/hello.txt")) == errno.EIO


def test_call_dispatch_for_fusepy(ops: PackfsOperations) -> None:
    assert ops("getattr", "/hello.txt")["st_size"] == 12
    assert _errno(lambda: ops("bmap", "/x")) == errno.ENOSYS
    assert isinstance(FuseError(errno.EIO), OSError)


def test_archive_shrinking_under_the_daemon_is_eio(archive: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.ffr"
    copy.write_bytes(archive.read_bytes())
    with PackedFolder(copy) as folder:
        ops = PackfsOperations(folder, check_data=False)
        fh = ops.open("/big/large.bin", os.O_RDONLY)
        start, _ = folder.archive.extent(folder.archive.find(b"big/large.bin"))
        os.truncate(copy, start + 10)  # pread, unlike the map, cannot raise SIGBUS
        assert _errno(lambda: ops.read("/big/large.bin", 4096, 0, fh)) == errno.EIO
        # Changed in place: every later request is EIO too (the daemon logs "archive
        # changed in place; remount"), even for bytes still in the file.
        assert _errno(lambda: ops.read("/big/large.bin", 10, 0, fh)) == errno.EIO
