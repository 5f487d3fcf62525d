"""unpack(): a faithful restore that never writes outside the destination."""

from __future__ import annotations

import filecmp
import os
from pathlib import Path

import pytest

import packfs
from packfs import PackedFolder, UnpackError, pack_entries, unpack
from tests.conftest import MTIME_NS


def _same_tree(left: Path, right: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(left):
        for name in dirnames + filenames:
            a = Path(dirpath) / name
            b = right / a.relative_to(left)
            sa, sb = os.lstat(a), os.lstat(b)
            assert (sa.st_mode, sa.st_mtime_ns, sa.st_uid, sa.st_gid) == (
                sb.st_mode, sb.st_mtime_ns, sb.st_uid, sb.st_gid), a
            if a.is_symlink():
                assert os.readlink(a) == os.readlink(b)
            elif a.is_file():
                assert filecmp.cmp(a, b, shallow=False)
                assert sa.st_nlink == sb.st_nlink
    assert sorted(p.relative_to(left) for p in left.rglob("*")) == sorted(
        p.relative_to(right) for p in right.rglob("*"))


def test_unpack_restores_the_tree(tree: Path, archive: Path, tmp_path: Path) -> None:
    with PackedFolder(archive) as folder:
        stats = unpack(folder, tmp_path / "out")
    _same_tree(tree, tmp_path / "out")
    assert os.stat(tmp_path / "out").st_mtime_ns == MTIME_NS
    assert stats.hardlinks == 1 and stats.symlinks == 5


def test_unpack_selected_paths(archive: Path, tmp_path: Path, tree: Path) -> None:
    with PackedFolder(archive) as folder:
        unpack(folder, tmp_path / "out", ["a/b", "hello.txt"])
    out = tmp_path / "out"
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "a", "a/b", "a/b/c", "a/b/c/deep.bin", "hello.txt"]
    assert (out / "a/b/c/deep.bin").read_bytes() == (tree / "a/b/c/deep.bin").read_bytes()


def test_unpack_never_overwrites(archive: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "hello.txt").write_bytes(b"mine")
    with PackedFolder(archive) as folder, pytest.raises(UnpackError, match="already exists"):
        unpack(folder, out, ["hello.txt"])
    assert (out / "hello.txt").read_bytes() == b"mine"


def test_unpack_does_not_follow_a_symlink_in_the_way(archive: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(outside, out / "a")  # a trap where the archive has the directory "a"
    with PackedFolder(archive) as folder, pytest.raises(UnpackError, match="non-directory is in the way"):
        unpack(folder, out, ["a"])
    assert list(outside.iterdir()) == []


def test_archive_symlinks_are_created_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    pack_entries([
        packfs.Entry("escape", kind="symlink", target=str(outside)),
        packfs.Entry("zz/file", b"data"),
    ], tmp_path / "s.ffr")
    with PackedFolder(tmp_path / "s.ffr") as folder:
        unpack(folder, tmp_path / "out")
    assert os.readlink(tmp_path / "out" / "escape") == str(outside)
    assert list(outside.iterdir()) == []


def test_read_only_directories_are_filled_before_their_mode_is_set(tmp_path: Path) -> None:
    pack_entries([packfs.Entry("ro", kind="dir", mode=0o555), packfs.Entry("ro/f", b"x")],
                 tmp_path / "r.ffr")
    with PackedFolder(tmp_path / "r.ffr") as folder:
        unpack(folder, tmp_path / "out")
    assert (tmp_path / "out/ro/f").read_bytes() == b"x"
    assert os.stat(tmp_path / "out/ro").st_mode & 0o777 == 0o555


@pytest.mark.parametrize("symlink_first", [True, False])
def test_a_hostile_archive_cannot_unpack_through_its_own_symlink(tmp_path: Path, symlink_first: bool) -> None:
    """A table (every CRC valid) with a symlink "a" -> outside and a directory "a" holding
    "x" in the same directory: unpack must neither follow the link it created nor write
    outside DEST, whichever of the two comes first."""
    from tests.conftest import rewrite_section

    outside = tmp_path / "outside"
    outside.mkdir()
    link, directory = ("a", "b") if symlink_first else ("b", "a")
    pack_entries([packfs.Entry(f"{directory}/x", b"payload"),
                  packfs.Entry(link, kind="symlink", target=str(outside))], tmp_path / "ok.ffr")
    # Root's children are named "a" and "b" (names section starts b"ab"); rename "b" to "a".
    bad = rewrite_section(tmp_path / "ok.ffr", tmp_path / "bad.ffr", "names",
                          lambda names: names.__setitem__(1, ord("a")))
    with PackedFolder(bad) as folder:
        with pytest.raises(UnpackError):
            unpack(folder, tmp_path / "out")
        assert not folder.verify().ok  # duplicate names, and a path hash that no longer matches
    assert list(outside.iterdir()) == []
