"""One behaviour suite, run against every front end: PackedFolder, packfs.core.Archive
directly, the fsspec file system, and real FUSE mounts (mfusepy and fusepy)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import packfs
from packfs.core import Archive
from packfs.dataset import PackedFiles
from packfs.format import S_IFDIR
from tests.conftest import BLUEPRINT, HARDLINK, MTIME_NS, NON_UTF8, SYMLINKS, make_tree, mounted, require_extra


class View:
    """What every view shares: mtimes in integer nanoseconds."""

    @staticmethod
    def mtime(ns: int) -> int | float:
        """What ``lstat`` reports for an mtime of ``ns`` nanoseconds."""
        return ns


class FolderView(View):
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


class ArchiveView(View):
    """The same view through packfs.core.Archive's entry-level interface."""

    def __init__(self, archive: Archive) -> None:
        self.archive = archive

    def read(self, path: str) -> bytes:
        return self.archive.read_path(path)

    def listdir(self, path: str) -> list[str]:
        _, names, _ = self.archive.listing(self.archive.lookup_kind(path, S_IFDIR))
        return sorted((os.fsdecode(name) for name in names), key=os.fsencode)

    def lstat(self, path: str) -> tuple[int, int, int, int, int]:
        s = self.archive.stat(self.archive.lookup(path, follow=False))
        return s.mode, s.size, s.mtime_ns, s.uid, s.nlink

    def readlink(self, path: str) -> str:
        return os.fsdecode(self.archive.readlink(self.archive.lookup(path, follow=False)))


class FsspecView(View):
    """The same view through the fsspec file system (packfs.fsspec.PackfsFileSystem)."""

    def __init__(self, fs) -> None:
        self.fs = fs

    def read(self, path: str) -> bytes:
        data = self.fs.cat_file(path)
        with self.fs.open(path, "rb") as f:  # the seekable file agrees with cat_file
            assert f.read() == data
        return data

    def listdir(self, path: str) -> list[str]:
        prefix = f"{path}/" if path else ""
        names = self.fs.ls(path, detail=False)
        assert all(name.startswith(prefix) for name in names)
        return sorted((name[len(prefix) :] for name in names), key=os.fsencode)

    def lstat(self, path: str) -> tuple[int, int, float, int, int]:
        info = self.fs.info(path)
        return info["mode"], info["size"], info["mtime"], info["uid"], info["nlink"]

    @staticmethod
    def mtime(ns: int) -> float:
        # fsspec's info() gives mtime as float seconds, as packfs.fsspec computes it.
        return ns / 1e9

    def readlink(self, path: str) -> str:
        return self.fs.info(path)["destination"]


class MountView(View):
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


@pytest.fixture(scope="module", params=["PackedFolder", "Archive", "fsspec", "lowlevel", "mfusepy", "fusepy"])
def view(request, source: Path, tmp_path_factory):
    out = tmp_path_factory.mktemp("archive") / "tree.ffr"
    packfs.pack_folder(source, out)
    if request.param == "PackedFolder":
        with packfs.PackedFolder(out) as folder:
            yield FolderView(folder)
    elif request.param == "Archive":
        with Archive(out) as archive:
            yield ArchiveView(archive)
    elif request.param == "fsspec":
        require_extra("fsspec", "fsspec")
        from packfs.fsspec import PackfsFileSystem

        fs = PackfsFileSystem(fo=str(out), skip_instance_cache=True)
        try:
            yield FsspecView(fs)
        finally:
            fs.folder.close()
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
            assert mode == info.st_mode, relative
            assert mtime_ns == view.mtime(info.st_mtime_ns) == view.mtime(MTIME_NS), relative
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


def test_dataset_reads_what_packed_folder_reads(source: Path, tmp_path: Path) -> None:
    """packfs.dataset.PackedFiles (no torch): every selected file, by index and by batch,
    is what PackedFolder.read gives for its path, symlinks to files included."""
    out = tmp_path / "tree.ffr"
    packfs.pack_folder(source, out)
    files = PackedFiles(out, "**/*")
    try:
        with packfs.PackedFolder(out) as folder:
            paths = [files.path(i) for i in range(len(files))]
            for i, path in enumerate(paths):
                assert files[i] == folder.read(path), path
            assert files.read_batch(list(range(len(files)))[::-1]) == [folder.read(p) for p in paths[::-1]]
            for path in ("link-to-hello", "a/link-up"):
                # Listed under the symlink's path, read as the file it names.
                i = paths.index(path)
                assert folder.is_symlink(path) and files[i] == b"hello world\n"
                assert int(files.entries[i]) == folder.archive.lookup(path) == folder.archive.find(b"hello.txt")
    finally:
        files.close()
    with pytest.raises(packfs.ClosedArchiveError):
        files[0]
    # Regular files and the symlinks that resolve to one inside the archive; not the
    # dangling or absolute links, nor files reached through a symlinked directory.
    regular = {str(p.relative_to(source)) for p in source.rglob("*") if p.is_file() and not p.is_symlink()}
    assert set(paths) == regular | {"link-to-hello", "a/link-up"}
    assert len(paths) == len(set(paths)) and paths == sorted(paths)
