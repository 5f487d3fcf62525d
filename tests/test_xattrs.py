"""Extended attributes (format 1.3, section 4c): packed from a directory, a tar or
entries, read by Archive and PackedFolder, served by both daemons, restored by unpack,
checked by verify, and refused where hostile."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

import packfs
from packfs import PackError, PackedFolder
from packfs.core import Archive
from packfs.errors import FormatError
from packfs.format import FOOTER, PIECE_SECTIONS, SECTION_COUNT, XATTR, XATTR_SECTIONS
from packfs.write.pack import Entry, pack_entries, pack_folder
from tests.conftest import mounted, packfs_cli, read_records, require_python_as_nobody, write_records, time_limit


def _set(path: Path, name: str, value: bytes, follow: bool = True) -> None:
    try:
        os.setxattr(path, name, value, follow_symlinks=follow)
    except OSError as error:
        if error.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            pytest.skip(f"{path.parent} keeps no extended attributes ({error.strerror})")
        raise


def _on_disk(path: Path) -> dict[str, bytes]:
    return {name: os.getxattr(path, name, follow_symlinks=False) for name in os.listxattr(path, follow_symlinks=False)}


@pytest.fixture
def labelled(tmp_path: Path) -> Path:
    """A tree whose files, directories, symlinks and hard links carry attributes of
    every namespace a root user can set."""
    root = tmp_path / "tree"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "sub" / "a.txt").write_bytes(b"alpha\n")
    (root / "plain.txt").write_bytes(b"no attributes\n")
    (root / "sub" / "deeper" / "linked").write_bytes(b"linked\n")
    os.link(root / "sub" / "deeper" / "linked", root / "alias")  # first in table order
    (root / "to-a").symlink_to("sub/a.txt")
    _set(root / "sub" / "a.txt", "user.color", b"blue")
    _set(root / "sub" / "a.txt", "user.empty", b"")
    _set(root / "sub", "user.dir", b"\x00\xff binary")
    _set(root / "sub" / "deeper" / "linked", "user.shared", b"by both names")
    if os.geteuid() == 0:
        _set(root / "sub" / "a.txt", "trusted.secret", b"root only")
        _set(root / "to-a", "trusted.link", b"on the symlink itself", follow=False)
        # A file capability (cap_net_bind_service, VFS_CAP_REVISION_2), as setcap writes it.
        _set(root / "sub" / "deeper" / "linked", "security.capability",
             bytes.fromhex("0000000200040000000000000000000000000000"))
    return root


_FIRST_XATTR_SECTION = SECTION_COUNT + len(PIECE_SECTIONS)  # format section 4c: sections 18-20


def _footer(archive: Path) -> tuple[int, int]:
    _, _, minor, _, _, _, sections, _ = FOOTER.unpack(read_records(archive)[-1])
    return minor, sections


def test_a_tree_without_attributes_packs_to_1_4_with_empty_attribute_sections(tmp_path: Path) -> None:
    # Since 1.4 every archive has the tail and the lookup index (format section 3), and
    # with them sections 18-20, empty here; the same entries always pack to these bytes.
    entries = [Entry("d", kind="dir", mode=0o750, uid=7, gid=8, mtime_ns=1_600_000_000_123_456_789),
               Entry("d/a.txt", b"alpha\n", mtime_ns=1_600_000_001_000_000_000),
               Entry("d/big.bin", bytes(range(256)) * 5000, mode=0o600, mtime_ns=5),
               Entry("link", kind="symlink", target="d/a.txt", mtime_ns=6),
               Entry("hard", kind="hardlink", target="d/a.txt", mtime_ns=1_600_000_001_000_000_000),
               Entry("empty", b"", mtime_ns=8)]
    out = tmp_path / "plain.ffr"
    pack_entries(entries, out)
    assert hashlib.sha256(out.read_bytes()).hexdigest() == (
        "e9f00b260d9ab4d8981857f985c5e7565689faae025dce56d2bfee68dc6d12e4")
    assert _footer(out) == (4, 23)
    with Archive(out) as archive:
        assert archive.version == "1.4" and archive.xattr_entries == 0
        assert all(archive.xattrs(entry) == [] for entry in range(archive.entry_count))


def test_pack_folder_keeps_every_attribute_the_os_lists(labelled: Path, tmp_path: Path) -> None:
    out = tmp_path / "labelled.ffr"
    pack_folder(labelled, out)
    assert _footer(out) == (4, 23)
    with PackedFolder(out) as folder:
        assert folder.archive.version == "1.4"
        for path in ("", "sub", "sub/a.txt", "plain.txt", "sub/deeper", "sub/deeper/linked", "alias", "to-a"):
            assert folder.xattrs(path, follow_symlinks=False) == _on_disk(labelled / path), path
        # os.listxattr follows a symlink unless told not to; so does PackedFolder.
        assert folder.xattrs("to-a") == _on_disk(labelled / "sub" / "a.txt")
        assert folder.xattrs("alias") == folder.xattrs("sub/deeper/linked") != {}
        assert folder.verify().ok
        assert folder.info()["xattrs"] == len([p for p in ("sub", "sub/a.txt", "alias", "to-a")
                                              if _on_disk(labelled / p)])


def test_a_hard_linked_file_lists_its_attributes_once_under_its_inode_entry(labelled: Path, tmp_path: Path) -> None:
    out = tmp_path / "labelled.ffr"
    pack_folder(labelled, out)
    with Archive(out) as archive:
        alias, linked = archive.find(b"alias"), archive.find(b"sub/deeper/linked")
        # Breadth-first order puts "alias" first though the scan met "linked" first.
        assert archive.inode(alias) == archive.inode(linked) == alias + 1
    records = read_records(out)
    _, _, _, _, _, data_records, sections, _ = FOOTER.unpack(records[-1])
    entries = np.frombuffer(records[data_records + 2 * _FIRST_XATTR_SECTION + 1], "<u4")
    assert alias in entries.tolist() and linked not in entries.tolist()


def test_no_xattrs_leaves_them_out(labelled: Path, tmp_path: Path) -> None:
    result = packfs_cli("pack", "--no-xattrs", labelled, tmp_path / "bare.ffr")
    assert result.returncode == 0, result.stderr
    assert _footer(tmp_path / "bare.ffr") == (4, 23)
    with PackedFolder(tmp_path / "bare.ffr") as folder:
        assert folder.xattrs("sub/a.txt") == {}


def test_pack_entries_takes_attributes_and_refuses_what_the_format_cannot_hold(tmp_path: Path) -> None:
    entries = [Entry("f", b"x", xattrs={"user.a": b"1", b"user.b": b"2"}), Entry("g", b"y")]
    pack_entries(entries, tmp_path / "e.ffr")
    with PackedFolder(tmp_path / "e.ffr") as folder:
        assert folder.xattrs("f") == {"user.a": b"1", "user.b": b"2"} and folder.xattrs("g") == {}
    # An iterator with a count (every 1.4 archive has room for attributes).
    pack_entries(iter(entries), tmp_path / "i.ffr", count=2)
    with PackedFolder(tmp_path / "i.ffr") as folder:
        assert folder.xattrs("f") == {"user.a": b"1", "user.b": b"2"}
    for bad, match in (({"color": b"x"}, "expected user., security."), ({"user.": b"x"}, "expected user."),
                       ({"user.x": bytes(65537)}, "at most 65536"), ({"user." + "n" * 300: b""}, "at most 255")):
        with pytest.raises(PackError, match=match):
            pack_entries([Entry("f", b"x", xattrs=bad)], tmp_path / "bad.ffr")
        assert not (tmp_path / "bad.ffr").exists()


def test_a_tar_keeps_the_attributes_of_its_pax_headers(tmp_path: Path) -> None:
    tar_path = tmp_path / "x.tar"
    binary = b"\x00\x80\xff not utf-8"
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, xattrs in (("a.txt", {"user.k": "v"}), ("b.bin", {"security.selinux": "system_u:object_r:x"})):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = 3, 1_600_000_000
            info.pax_headers = {f"SCHILY.xattr.{key}": value for key, value in xattrs.items()}
            tar.addfile(info, io.BytesIO(b"abc"))
        info = tarfile.TarInfo("c.bin")
        info.size = 1
        info.pax_headers = {"SCHILY.xattr.user.raw": binary.decode("utf-8", "surrogateescape")}
        tar.addfile(info, io.BytesIO(b"c"))
    for source in (tar_path, _gzipped(tar_path)):
        out = tmp_path / (source.name + ".ffr")
        result = packfs_cli("pack", source, out)
        assert result.returncode == 0, result.stderr
        with PackedFolder(out) as folder:
            assert folder.xattrs("a.txt") == {"user.k": b"v"}
            assert folder.xattrs("b.bin") == {"security.selinux": b"system_u:object_r:x"}
            assert folder.xattrs("c.bin") == {"user.raw": binary}
    assert packfs_cli("pack", "--no-xattrs", tar_path, tmp_path / "none.ffr").returncode == 0
    assert _footer(tmp_path / "none.ffr") == (4, 23)


def _gzipped(tar_path: Path) -> Path:
    import gzip

    out = tar_path.with_suffix(".tar.gz")
    out.write_bytes(gzip.compress(tar_path.read_bytes()))
    return out


# -- hostile attribute sections ----------------------------------------------------------------


def _xattr_archive(tmp_path: Path) -> Path:
    out = tmp_path / "x.ffr"
    pack_entries([Entry("a", b"1", xattrs={"user.a": b"A", "user.b": b"BB"}), Entry("b", b"2"),
                  Entry("c", b"3", xattrs={"user.c": b"C"})], out)
    return out


def _rewrite_data(archive: Path, out: Path, mutate) -> Path:
    records = read_records(archive)
    _, _, _, _, _, data_records, sections, _ = FOOTER.unpack(records[-1])
    index = data_records + 2 * (_FIRST_XATTR_SECTION + 2) + 1
    data = bytearray(records[index])
    mutate(data)
    records[index] = bytes(data)
    return write_records(out, records)


@pytest.mark.parametrize("damage, message", [
    (lambda d: d.__setitem__(slice(5, 9), b"nope"), "expected user., security."),  # name "nope.a"
    (lambda d: d.__setitem__(slice(5 + 6 + 1 + 5, 5 + 6 + 1 + 5 + 6), b"user.a"), "distinct and ascending"),
    (lambda d: XATTR.pack_into(d, 0, 6, 1000), "where"),  # a value past the span
    (lambda d: XATTR.pack_into(d, 0, 0, 1), "expected user., security."),  # an empty name
    (lambda d: XATTR.pack_into(d, 0, 6, 70000), "at most 65536"),
    (lambda d: d.__setitem__(slice(5, 6), b"\x00"), "no NUL"),
])
def test_a_broken_attribute_list_is_an_error_for_its_entry_everywhere(tmp_path: Path, damage, message: str) -> None:
    bad = _rewrite_data(_xattr_archive(tmp_path), tmp_path / "bad.ffr", damage)
    with Archive(bad) as archive:  # opening does no per-entry work
        a = archive.find(b"a")
        with pytest.raises(FormatError, match=message):
            archive.xattrs(a)
        assert archive.xattrs(archive.find(b"c")) == [(b"user.c", b"C")]  # the rest is served
        report = archive.verify()
        assert not report.ok and any("format section 4c" in problem for problem in report.problems)
        tree = _compiled_tree(archive)
        if tree is not None:
            for call in (lambda: tree.getxattr(a + 1, b"user.b"), lambda: tree.listxattr(a + 1)):
                with pytest.raises(OSError) as caught:
                    call()
                assert caught.value.errno == errno.EIO
            assert tree.getxattr(archive.find(b"c") + 1, b"user.c") == b"C"
    result = packfs_cli("verify", bad)
    assert result.returncode == 1 and "4c" in result.stdout + result.stderr


@pytest.mark.parametrize("section, mutate, message", [
    ("xattr_start", lambda a: a.__setitem__(0, 1), "expected 3 from 0"),
    ("xattr_start", lambda a: a.__setitem__(-1, a[-1] - 1), "expected 3 from 0"),
])
def test_attribute_sections_that_disagree_are_refused_at_open(tmp_path: Path, section, mutate, message) -> None:
    bad = _rewrite_xattr_section(_xattr_archive(tmp_path), tmp_path / "bad.ffr", section, mutate)
    with pytest.raises(FormatError, match=message):
        Archive(bad)
    result = packfs_cli("ls", bad)
    assert result.returncode == 1 and result.stderr.startswith("Error: ") and "4c" in result.stderr


def test_attributes_under_a_later_name_of_a_hard_link_fail_verify(tmp_path: Path) -> None:
    out = tmp_path / "h.ffr"
    pack_entries([Entry("a", b"1", xattrs={"user.a": b"A"}), Entry("b", kind="hardlink", target="a")], out)
    with Archive(out) as archive:
        later = archive.find(b"b")
    bad = _rewrite_xattr_section(out, tmp_path / "bad.ffr", "xattr_entry", lambda a: a.__setitem__(0, later))
    with Archive(bad) as archive:
        # Listed under the later name, the list belongs to no inode: both names answer alike.
        assert archive.xattrs(later) == archive.xattrs(archive.find(b"a")) == []
        problems = archive.verify().problems
        assert any("later name of a hard-linked file" in problem for problem in problems)


def _rewrite_xattr_section(archive: Path, out: Path, section: str, mutate) -> Path:
    records = read_records(archive)
    _, _, _, _, _, data_records, sections, _ = FOOTER.unpack(records[-1])
    names = [name for name, _ in XATTR_SECTIONS]
    index = data_records + 2 * (_FIRST_XATTR_SECTION + names.index(section)) + 1
    array = np.frombuffer(records[index], dict(XATTR_SECTIONS)[section]).copy()
    mutate(array)
    records[index] = array.tobytes()
    return write_records(out, records)


def _compiled_tree(archive: Archive):
    from packfs.fuse import tree_for, unavailable

    if unavailable() is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the compiled daemon must be built under CI: {unavailable()}")
        return None
    return tree_for(archive)


def test_the_compiled_daemon_answers_like_the_archive(labelled: Path, tmp_path: Path) -> None:
    out = tmp_path / "labelled.ffr"
    pack_folder(labelled, out)
    with Archive(out, checksums="once") as archive:
        tree = _compiled_tree(archive)
        if tree is None:
            pytest.skip("the compiled daemon is not built")
        for entry in range(archive.entry_count):
            inode = archive.inode(entry)
            pairs = archive.xattrs(entry)
            assert tree.listxattr(inode) == b"".join(name + b"\0" for name, _ in pairs)
            for name, value in pairs:
                assert tree.getxattr(inode, name) == value
            with pytest.raises(OSError) as caught:
                tree.getxattr(inode, b"user.missing")
            assert caught.value.errno == errno.ENODATA
    with Archive(_plain(tmp_path), checksums="once") as archive:
        tree = _compiled_tree(archive)
        assert tree.listxattr(1) == b""
        with pytest.raises(OSError) as caught:
            tree.getxattr(1, b"user.x")
        assert caught.value.errno == errno.ENOSYS  # the kernel then stops asking


def _plain(tmp_path: Path) -> Path:
    out = tmp_path / "plain.ffr"
    pack_entries([Entry("f", b"x")], out)
    return out


# -- through a mount -----------------------------------------------------------------------------


@pytest.mark.fuse
def test_a_mount_serves_the_attributes(labelled: Path, tmp_path: Path) -> None:
    out = tmp_path / "labelled.ffr"
    pack_folder(labelled, out)
    with mounted(out, tmp_path / "mnt") as mnt:
        for path in ("", "sub", "sub/a.txt", "plain.txt", "sub/deeper/linked", "alias", "to-a"):
            assert _on_disk(mnt / path) == _on_disk(labelled / path), path
        with pytest.raises(OSError) as caught:
            os.getxattr(mnt / "sub" / "a.txt", "user.missing")
        assert caught.value.errno == errno.ENODATA
        with pytest.raises(OSError) as caught:
            os.setxattr(mnt / "sub" / "a.txt", "user.new", b"x")
        assert caught.value.errno in (errno.EROFS, errno.EPERM)


@pytest.mark.fuse
def test_a_mount_of_an_archive_without_attributes_lists_none(tmp_path: Path) -> None:
    with mounted(_plain(tmp_path), tmp_path / "mnt") as mnt:
        assert os.listxattr(mnt / "f") == []
        with pytest.raises(OSError) as caught:
            os.getxattr(mnt / "f", "user.x")
        assert caught.value.errno in (errno.EOPNOTSUPP, errno.ENODATA)


# -- unpack ---------------------------------------------------------------------------------------


def test_unpack_restores_them(labelled: Path, tmp_path: Path) -> None:
    out = tmp_path / "labelled.ffr"
    pack_folder(labelled, out)
    result = packfs_cli("unpack", out, tmp_path / "restored")
    assert result.returncode == 0 and "not restored" not in result.stderr, result.stderr
    for path in ("sub", "sub/a.txt", "plain.txt", "sub/deeper/linked", "alias", "to-a"):
        assert _on_disk(tmp_path / "restored" / path) == _on_disk(labelled / path), path
    result = packfs_cli("unpack", "--no-xattrs", out, tmp_path / "bare")
    assert result.returncode == 0 and _on_disk(tmp_path / "bare" / "sub" / "a.txt") == {}


def test_unpack_as_a_user_restores_what_it_may_and_says_what_it_could_not(labelled: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run unpack as user nobody")
    if not _on_disk(labelled / "sub" / "a.txt").get("trusted.secret"):
        pytest.skip("no trusted.* attribute was set")
    require_python_as_nobody()
    shared = Path("/tmp") / f"packfs-xattr-{os.getpid()}"
    shared.mkdir(mode=0o777, exist_ok=True)
    try:
        os.chmod(shared, 0o777)
        archive = shared / "labelled.ffr"
        pack_folder(labelled, archive)
        os.chmod(archive, 0o644)
        dest = shared / "out"
        result = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                                 sys.executable, "-m", "packfs", "unpack", str(archive), str(dest)],
                                capture_output=True, text=True, timeout=time_limit(60), cwd="/",
                                env={**os.environ, "PYTHONPATH": str(Path(packfs.__file__).parents[1])})
        assert result.returncode == 0, result.stderr
        # security.capability, trusted.secret, trusted.link: refused, one warning for the reason.
        assert "3 extended attributes not restored" in result.stderr
        assert result.stderr.count("Warning:") == 1 and "Operation not permitted" in result.stderr
        assert _on_disk(dest / "sub" / "a.txt") == {"user.color": b"blue", "user.empty": b""}
    finally:
        shutil.rmtree(shared)


def _posix_acl(entries: list[tuple[int, int, int]]) -> bytes:
    """A system.posix_acl_access value as the kernel encodes it (version 2, then tag,
    permissions and id per entry)."""
    import struct

    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, ident) for tag, perm, ident in entries)


@pytest.mark.fuse
def test_stored_acls_are_enforced_through_the_compiled_daemon(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to read as other users")
    from tests.conftest import TEST_BINDING

    # The Python daemons cannot ask libfuse for POSIX ACLs: there the ACL is served as an
    # attribute and the kernel decides by the mode bits alone (stricter, never looser).
    enforced = TEST_BINDING in ("auto", "lowlevel")
    shared = Path("/tmp") / f"packfs-acl-{os.getpid()}"
    (shared / "src").mkdir(parents=True)
    try:
        os.chmod(shared, 0o755)
        secret = shared / "src" / "secret"
        secret.write_bytes(b"for nobody and root\n")
        os.chmod(secret, 0o640)
        anyone = 0xFFFFFFFF
        # user::rw- user:nobody:r-- group::r-- mask::r-- other::---
        acl = _posix_acl([(1, 6, anyone), (2, 4, 65534), (4, 4, anyone), (0x10, 4, anyone), (0x20, 0, anyone)])
        _set(secret, "system.posix_acl_access", acl)
        archive = shared / "acl.ffr"
        pack_folder(shared / "src", archive)
        os.chmod(archive, 0o644)

        def cat_as(user: str, group: str) -> subprocess.CompletedProcess:
            return subprocess.run(["setpriv", f"--reuid={user}", f"--regid={group}", "--clear-groups", "cat",
                                   str(shared / "mnt" / "secret")], capture_output=True, timeout=time_limit(30))

        with mounted(archive, shared / "mnt", "--allow-other") as mnt:
            assert os.getxattr(mnt / "secret", "system.posix_acl_access") == acl
            granted = cat_as("nobody", "nogroup")  # the ACL grants it; the mode alone does not
            if enforced:
                assert granted.stdout == b"for nobody and root\n", granted.stderr
            else:
                assert granted.returncode != 0 and b"Permission denied" in granted.stderr
            refused = cat_as("daemon", "daemon")  # "other": the ACL (and the mode) refuse it
            assert refused.returncode != 0 and b"Permission denied" in refused.stderr
    finally:
        subprocess.run(["fusermount3", "-u", str(shared / "mnt")], capture_output=True)
        shutil.rmtree(shared)


@pytest.mark.fuse
def test_listxattr_survives_the_archive_changing_between_its_reads(tmp_path: Path) -> None:
    """An archive rewritten in place under a mount, so that one file's attribute list
    grows and shrinks, while that list is asked for: the compiled daemon once sized a
    buffer from one read of the list and filled it from a second (ASan: a heap overflow;
    the plain build died within seconds).  The mount must answer every call and live."""
    import struct
    import time

    out = tmp_path / "race.ffr"
    names = {b"user.b%03d" % i + b"x" * 240: b"" for i in range(200)}
    pack_entries([Entry("f", b"x", xattrs={"user.a": b"1"}), Entry("g", b"y", xattrs=names)], out)
    with Archive(out) as archive:
        (_, _), (starts_at, _), _ = archive.xattr_spans
        starts = struct.unpack_from("<3Q", archive.source.mapping, starts_at)
    # f's list ends where g's starts, or where g's ends: one name, or 201.
    where, short, long_ = starts_at + 8, struct.pack("<Q", starts[1]), struct.pack("<Q", starts[2])
    with mounted(out, tmp_path / "mnt") as mnt:
        assert os.listxattr(mnt / "f") == ["user.a"]
        toggler = os.fork()
        if toggler == 0:  # pragma: no cover - the child only rewrites the archive
            fd = os.open(out, os.O_WRONLY)
            end = time.monotonic() + 3
            while time.monotonic() < end:
                os.pwrite(fd, long_, where)
                os.pwrite(fd, short, where)
            os._exit(0)
        answers: dict[str, int] = {}
        try:
            for _ in range(20000):
                try:
                    os.listxattr(mnt / "f")
                    answers["ok"] = answers.get("ok", 0) + 1
                except OSError as error:
                    answers[errno.errorcode[error.errno]] = answers.get(errno.errorcode[error.errno], 0) + 1
                    assert error.errno == errno.EIO, answers  # never ENOTCONN: the daemon lives
                if os.waitpid(toggler, os.WNOHANG) != (0, 0):
                    toggler = 0
                    break
        finally:
            if toggler:
                os.waitpid(toggler, 0)
        assert answers.get("EIO"), answers  # the change was seen, and answered as one
        with pytest.raises(OSError) as caught:
            os.listxattr(mnt / "f")
        assert caught.value.errno == errno.EIO  # the archive changed in place: EIO from then on
