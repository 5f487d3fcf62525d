"""packfs.fsspec: files inside an archive by URL, through fsspec and pandas."""

from __future__ import annotations

from pathlib import Path

import pytest

import packfs
from tests.conftest import require_extra

fsspec = require_extra("fsspec", "fsspec")


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "train" / "cat").mkdir(parents=True)
    (src / "train" / "cat" / "1.jpg").write_bytes(b"\xff\xd8jpeg" * 1000)
    (src / "train" / "dog").mkdir()
    (src / "labels.csv").write_text("path,label\ntrain/cat/1.jpg,cat\n")
    (src / "link").symlink_to("labels.csv")
    out = tmp_path / "data.ffr"
    packfs.pack_folder(src, out)
    return out


def test_urls_and_the_file_system_api(dataset: Path) -> None:
    with fsspec.open("packfs://train/cat/1.jpg", fo=str(dataset)) as f:
        assert f.seekable() and f.read(6) == b"\xff\xd8jpeg"
        f.seek(-4, 2)
        assert f.read() == b"jpeg"
    fs = fsspec.filesystem("packfs", fo=str(dataset))
    assert fs.ls("", detail=False) == ["labels.csv", "link", "train"]
    assert fs.ls("train/cat", detail=False) == ["train/cat/1.jpg"]
    assert fs.glob("**/*.jpg") == ["train/cat/1.jpg"]
    assert fs.cat("labels.csv").startswith(b"path,label")
    assert fs.cat_file("train/cat/1.jpg", start=2, end=6) == b"jpeg"
    info = fs.info("train/cat/1.jpg")
    assert info["type"] == "file" and info["size"] == 6000
    assert fs.info("train/dog")["type"] == "directory" and fs.info("link")["destination"] == "labels.csv"
    assert fs.isdir("train") and fs.isfile("labels.csv") and not fs.exists("nope")
    with pytest.raises(FileNotFoundError):
        fs.info("nope")
    with pytest.raises(PermissionError):
        fs.open("new.txt", "wb")
    with pytest.raises(PermissionError):
        fs.rm("labels.csv")


def test_pandas_reads_a_csv_inside_an_archive(dataset: Path) -> None:
    pandas = require_extra("pandas", "test")
    frame = pandas.read_csv("packfs://labels.csv", storage_options={"fo": str(dataset)})
    assert list(frame.columns) == ["path", "label"] and frame.iloc[0]["label"] == "cat"


def test_packfs_itself_does_not_import_fsspec(dataset: Path) -> None:
    import subprocess
    import sys

    code = "import sys, packfs, packfs.cli; assert 'fsspec' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
