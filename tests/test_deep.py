"""Trees 10,000 levels deep: pack, list, read, verify, unpack and mount.

Paths this deep are about 20,000 bytes, far past PATH_MAX (4,096), and past Python's
recursion limit in levels: everything has to walk iteratively and open relative to a
directory descriptor."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

import packfs
from packfs import PackedFolder
from tests.conftest import deep_scratch, mounted, packfs_cli

DEPTH = 10_000


def _make_deep_tree(root: Path, depth: int) -> bytes:
    """root/d/d/.../d (depth levels) with a file and a symlink at the bottom; returns
    the bottom directory's path relative to root."""
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        leaf = os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(leaf, b"at the bottom\n")
        os.close(leaf)
        os.symlink("leaf.txt", "link", dir_fd=fd)
    finally:
        os.close(fd)
    return b"/".join([b"d"] * depth)


def _read_beneath(root: Path, relative: bytes) -> bytes:
    """Read root/relative one component at a time (the path is too long for open())."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    parts = relative.split(b"/")
    try:
        for part in parts[:-1]:
            below = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        leaf = os.open(parts[-1], os.O_RDONLY, dir_fd=fd)
        try:
            return os.read(leaf, 1 << 16)
        finally:
            os.close(leaf)
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def deep() -> Iterator[tuple[Path, bytes, Path]]:
    # Not under pytest's tmp_path: removing a tree this deep there cost 50-60 s (and
    # shutil.rmtree, pytest's, recursed per level before Python 3.12).
    with deep_scratch("packfs-deep-") as base:
        bottom = _make_deep_tree(base / "src", DEPTH)
        archive = base / "deep.ffr"
        packfs.pack_folder(base / "src", archive)
        yield archive, bottom, base


def test_a_deep_tree_packs_lists_reads_and_verifies(deep: tuple[Path, bytes, Path]) -> None:
    archive, bottom, _ = deep
    with PackedFolder(archive) as folder:
        paths = folder.list(recursive=True)
        assert len(paths) == DEPTH + 2
        assert os.fsencode(paths[-1]) in (bottom + b"/leaf.txt", bottom + b"/link")
        assert folder.read(bottom + b"/leaf.txt") == b"at the bottom\n"
        assert folder.read(bottom + b"/link") == b"at the bottom\n"  # resolved level by level
        assert folder.readlink(bottom + b"/link") == "leaf.txt"
        assert folder.stat(bottom).kind == "dir"
        assert len(list(folder.walk())) == DEPTH + 1
        assert folder.verify().ok


def test_a_deep_tree_through_the_cli(deep: tuple[Path, bytes, Path]) -> None:
    archive, bottom, _ = deep
    for command in (["verify", archive], ["find", archive], ["ls", "-R", archive], ["info", archive]):
        result = packfs_cli(*command)
        assert result.returncode == 0, result.stderr[-500:]


def test_a_deep_tree_unpacks(deep: tuple[Path, bytes, Path]) -> None:
    archive, bottom, base = deep
    out = base / "out"
    with PackedFolder(archive) as folder:
        packfs.unpack(folder, out)
    assert _read_beneath(out, bottom + b"/leaf.txt") == b"at the bottom\n"
    assert _read_beneath(out, bottom + b"/link") == b"at the bottom\n"


@pytest.mark.fuse
def test_a_deep_tree_mounts(deep: tuple[Path, bytes, Path]) -> None:
    archive, bottom, base = deep
    with mounted(archive, base / "mnt") as root:
        assert _read_beneath(root, bottom + b"/leaf.txt") == b"at the bottom\n"
        assert _read_beneath(root, bottom + b"/link") == b"at the bottom\n"
        found = subprocess.run(["find", str(root)], capture_output=True, check=True).stdout
        assert found.count(b"\n") == DEPTH + 3
