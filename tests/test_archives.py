"""Packing from tar and zip archives, streamed, never extracted."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import packfs
from packfs import PackedFolder
from tests.conftest import REPO


@pytest.fixture
def tarball(tree: Path, tmp_path: Path) -> Path:
    out = tmp_path / "tree.tar"
    subprocess.run(["tar", "cf", str(out), "-C", str(tree), "."], check=True)
    return out


def _pack(source: Path | str, out: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "packfs", "pack", str(source), str(out)], input=stdin,
                          capture_output=True, cwd=REPO)


def test_a_tar_packs_to_the_same_bytes_as_its_extracted_tree(tarball: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("tar keeps the archived owners only when extracting as root")
    extracted = tmp_path / "x"
    extracted.mkdir()
    subprocess.run(["tar", "xf", str(tarball), "-C", str(extracted)], check=True)
    packfs.pack_folder(extracted, tmp_path / "from-dir.ffr")
    assert _pack(tarball, tmp_path / "from-tar.ffr").returncode == 0
    assert (tmp_path / "from-tar.ffr").read_bytes() == (tmp_path / "from-dir.ffr").read_bytes()


@pytest.mark.parametrize("compression", ["gz", "bz2", "xz", "stdin"])
def test_compressed_tars_and_stdin_keep_contents_and_attributes(tree: Path, tarball: Path, tmp_path: Path,
                                                                compression: str) -> None:
    reference = tmp_path / "reference.ffr"
    assert _pack(tarball, reference).returncode == 0
    out = tmp_path / "out.ffr"
    if compression == "stdin":
        result = _pack("-", out, stdin=tarball.read_bytes())
    else:
        source = tmp_path / f"tree.tar.{compression}"
        subprocess.run(["tar", "caf", str(source), "-C", str(tree), "."], check=True)
        source = source.rename(tmp_path / "no-telling-name")  # recognised by content
        result = _pack(source, out)
    assert result.returncode == 0, result.stderr
    with PackedFolder(reference) as expected, PackedFolder(out) as packed:
        assert packed.list(recursive=True) == expected.list(recursive=True)
        for path in expected.list(recursive=True):
            assert packed.stat(path).mode == expected.stat(path).mode
            assert packed.stat(path).mtime_ns == expected.stat(path).mtime_ns
            if expected.is_symlink(path):
                assert packed.readlink(path) == expected.readlink(path)
            elif expected.is_file(path):
                assert packed.read(path) == expected.read(path)
        assert packed.stat("hardlink.txt").nlink == 2
        assert packed.verify().ok


def test_a_zip_packs_its_files_and_directories(tmp_path: Path) -> None:
    source = tmp_path / "data.zip"
    with zipfile.ZipFile(source, "w") as archive:
        archive.writestr("train/cat/1.jpg", b"jpeg bytes")
        archive.writestr("train/dog/", b"")
        archive.writestr("labels.csv", b"a,b\n")
    assert _pack(source, tmp_path / "z.ffr").returncode == 0
    with PackedFolder(tmp_path / "z.ffr") as folder:
        assert folder.list(recursive=True) == ["labels.csv", "train", "train/cat", "train/cat/1.jpg", "train/dog"]
        assert folder.read("train/cat/1.jpg") == b"jpeg bytes"


def test_unsafe_and_special_members_are_skipped_or_normalised_with_a_warning(tmp_path: Path) -> None:
    source = tmp_path / "hostile.tar"
    with tarfile.open(source, "w") as tar:
        for name, data in (("../escape.txt", b"out"), ("/abs/file.txt", b"abs"), ("ok/a/../b.txt", b"dotdot"),
                           ("fine.txt", b"fine")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        device = tarfile.TarInfo("dev/null-ish")
        device.type = tarfile.CHRTYPE
        tar.addfile(device)
    result = _pack(source, tmp_path / "h.ffr")
    assert result.returncode == 0, result.stderr
    warnings = result.stderr.decode()
    assert "escape.txt" in warnings and "without the leading '/'" in warnings and "null-ish" in warnings
    with PackedFolder(tmp_path / "h.ffr") as folder:
        assert folder.list(recursive=True) == ["abs", "abs/file.txt", "fine.txt"]


def test_not_an_archive_is_a_clear_error(tmp_path: Path) -> None:
    source = tmp_path / "notes.txt"
    source.write_text("just text")
    result = _pack(source, tmp_path / "o.ffr")
    assert result.returncode == 1 and result.stderr.decode().startswith("Error: ")
    assert "neither a directory nor a tar or zip" in result.stderr.decode()
    assert not (tmp_path / "o.ffr").exists()
