"""One behaviour suite, run against PackedFolder and against a real FUSE mount."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import packfs
from tests.conftest import BLUEPRINT, HARDLINK, MTIME_NS, NON_UTF8, SYMLINKS, make_tree, mounted


class FolderView:
    """The suite's view of an archive through PackedFolder."""

    def __init__(self, folder: packfs.PackedFolder) -> None:
        self.folder = folder

    def read(self, path: str) -> bytes:
        return self.folder.read(path)

    def listdir(self, path: str) -> list[str]:
        return self.folder.list(path)

    def lstat(self, path: str) -> tuple[int, int, int, int, int]:
        s = self.folder.stat(path)
        return s.mode, s.size, s.mtime_ns, s.uid, s.nlink

    def readlink(self, path: str) -> str:
        return self.folder.readlink(path)


class MountView:
    """The same view through the operating system, on a mounted directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, path: str) -> bytes:
        with open(self.root / path, "rb") as f:
            return f.read()

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(self.root / path), key=os.fsencode)

    def lstat(self, path: str) -> tuple[int, int, int, int, int]:
        s = os.lstat(self.root / path)
        return s.st_mode, s.st_size, s.st_mtime_ns, s.st_uid, s.st_nlink

    def readlink(self, path: str) -> str:
        return os.readlink(self.root / path)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return make_tree(tmp_path_factory.mktemp("behaviour") / "src")


@pytest.fixture(scope="module", params=["PackedFolder", "mfusepy", "fusepy"])
def view(request, source: Path, tmp_path_factory):
    out = tmp_path_factory.mktemp("archive") / "tree.ffr"
    packfs.pack_folder(source, out)
    if request.param == "PackedFolder":
        with packfs.PackedFolder(out) as folder:
            yield FolderView(folder)
    else:
        with mounted(out, tmp_path_factory.mktemp("mnt"), binding=request.param) as root:
            yield MountView(root)


pytestmark = pytest.mark.fuse


def test_every_file_byte_for_byte(view, source: Path) -> None:
    for path, contents in BLUEPRINT.items():
        if contents is not None:
            assert view.read(path) == contents == (source / path).read_bytes()
    assert view.read(HARDLINK[0]) == view.read(HARDLINK[1])


def test_listings(view, source: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(source):
        relative = os.path.relpath(dirpath, source)
        relative = "" if relative == "." else relative
        assert view.listdir(relative) == sorted(dirnames + filenames, key=os.fsencode)
    assert view.listdir("empty_dir") == [] and view.listdir("a/empty_nested") == []


def test_attributes(view, source: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(source):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            relative = str(path.relative_to(source))
            info = os.lstat(path)
            mode, size, mtime_ns, uid, nlink = view.lstat(relative)
            assert mode == info.st_mode and mtime_ns == info.st_mtime_ns == MTIME_NS, relative
            assert uid == info.st_uid
            if not stat.S_ISDIR(mode):
                assert size == info.st_size and nlink == info.st_nlink, relative


def test_symlinks(view) -> None:
    for link, target in SYMLINKS.items():
        assert view.readlink(link) == target
    assert view.read("link-to-hello") == b"hello world\n"
    assert view.read("a/link-up") == b"hello world\n"
    assert view.read("a/dirlink/c/deep.bin") == BLUEPRINT["a/b/c/deep.bin"]


def test_names(view) -> None:
    assert view.read(NON_UTF8) == b"\x00\x01\x02"
    assert view.read("données/été.txt") == BLUEPRINT["données/été.txt"]
    assert view.read("-leading-dash") == b"dash" and view.read("hash#percent%.txt") == b"#%"


def test_missing_and_wrong_kind(view) -> None:
    with pytest.raises(FileNotFoundError):
        view.read("missing")
    with pytest.raises(IsADirectoryError):
        view.read("a")
    with pytest.raises((NotADirectoryError, FileNotFoundError)):
        view.read("hello.txt/child")
