"""Hard links keep their identity: every name of one file reports one inode number,
through PackedFolder, through a mount (stat, readdir, tar, cp -a) and after unpack."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

import packfs
from packfs import PackedFolder
from tests.conftest import mounted, rewrite_section


@pytest.fixture
def linked_archive(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a").write_bytes(b"shared bytes\n")
    os.link(src / "a", src / "b")
    os.link(src / "a", src / "sub" / "c")
    (src / "lone").write_bytes(b"alone\n")
    (src / "x").write_bytes(b"second group\n")
    os.link(src / "x", src / "sub" / "y")
    archive = tmp_path / "links.ffr"
    packfs.pack_folder(src, archive)
    return archive


def test_every_name_of_a_file_has_one_inode(linked_archive: Path) -> None:
    with PackedFolder(linked_archive) as folder:
        a, b, c = (folder.stat(p) for p in ("a", "b", "sub/c"))
        assert a.nlink == b.nlink == c.nlink == 3
        assert a.inode == b.inode == c.inode
        x, y = folder.stat("x"), folder.stat("sub/y")
        assert x.inode == y.inode != a.inode
        inodes = [folder.stat(p).inode for p in folder.list(recursive=True)]
        # Distinct files keep distinct numbers: 7 entries below the root, 4 files in 2 groups.
        assert len(set(inodes)) == len(inodes) - 3


def test_a_version_1_0_archive_derives_the_first_link(linked_archive: Path, tmp_path: Path) -> None:
    """1.0 wrote zeros in section 11: the reader derives the same numbers."""
    old = rewrite_section(linked_archive, tmp_path / "old.ffr", "first_link", lambda a: a.__setitem__(slice(None), 0))
    with PackedFolder(linked_archive) as new, PackedFolder(old) as folder:
        for path in ("a", "b", "sub/c", "x", "sub/y", "lone", "sub"):
            assert folder.stat(path).inode == new.stat(path).inode
        assert folder.verify().ok


@pytest.mark.parametrize("linked, first", [("b", "x"), ("sub/y", "lone"), ("sub/y", "sub")])
def test_a_hostile_first_link_is_refused(linked_archive: Path, tmp_path: Path, linked: str, first: str) -> None:
    """A later entry, another file's record, a directory: each named as a first link."""
    with PackedFolder(linked_archive) as folder:
        entry, other = folder.archive.find(linked.encode()), folder.archive.find(first.encode())
    bad = rewrite_section(linked_archive, tmp_path / "bad.ffr", "first_link", lambda a: a.__setitem__(entry, other))
    with PackedFolder(bad) as folder:
        with pytest.raises(packfs.FormatError, match="first link"):
            folder.stat(linked)
        assert any("first link" in problem for problem in folder.verify().problems)


@pytest.mark.fuse
@pytest.mark.parametrize("binding", ["mfusepy", "fusepy"])
def test_a_mount_shows_hard_links_as_one_file(linked_archive: Path, tmp_path: Path, binding: str) -> None:
    with mounted(linked_archive, tmp_path / "mnt", binding=binding) as root:
        stats = [os.stat(root / p) for p in ("a", "b", "sub/c")]
        assert len({s.st_ino for s in stats}) == 1 and stats[0].st_nlink == 3
        out = subprocess.run(["stat", "-c", "%i", str(root / "a"), str(root / "b")],
                             capture_output=True, text=True, check=True).stdout.split()
        assert out[0] == out[1]
        # readdir's d_ino agrees with stat's st_ino.
        with os.scandir(root) as entries:
            by_name = {entry.name: entry.inode() for entry in entries}
        assert by_name["a"] == by_name["b"] == stats[0].st_ino
        # tar stores the second name as a link to the first, and cp -a makes one file.
        subprocess.run(["tar", "cf", str(tmp_path / "t.tar"), "-C", str(root), "."], check=True)
        with tarfile.open(tmp_path / "t.tar") as tar:
            links = {m.name: m.linkname for m in tar.getmembers() if m.islnk()}
        assert len(links) == 3, links
        subprocess.run(["cp", "-a", str(root), str(tmp_path / "copy")], check=True)
        copy = tmp_path / "copy"
        assert os.stat(copy / "a").st_ino == os.stat(copy / "sub" / "c").st_ino
        assert os.stat(copy / "a").st_nlink == 3


def test_unpack_restores_one_file(linked_archive: Path, tmp_path: Path) -> None:
    with PackedFolder(linked_archive) as folder:
        packfs.unpack(folder, tmp_path / "out")
    out = tmp_path / "out"
    assert os.stat(out / "a").st_ino == os.stat(out / "b").st_ino == os.stat(out / "sub" / "c").st_ino
