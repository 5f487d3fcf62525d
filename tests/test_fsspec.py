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


# -- the three ways a URL names its archive ---------------------------------------------


def test_the_archive_in_the_urls_path(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    absolute = f"packfs://{dataset}/train/cat/1.jpg"  # packfs:///tmp/.../data.ffr/train/cat/1.jpg
    assert absolute.startswith("packfs:///")
    with fsspec.open(absolute) as f:
        assert f.read(6) == b"\xff\xd8jpeg"
    monkeypatch.chdir(dataset.parent)
    with fsspec.open("packfs://data.ffr/labels.csv", "rt") as f:
        assert f.readline() == "path,label\n"
    # glob and walk give back paths that open, each starting with the archive's.
    files = fsspec.open_files("packfs://data.ffr/train/**/*.jpg")
    assert [f.path for f in files] == ["data.ffr/train/cat/1.jpg"]
    with files[0] as f:
        assert len(f.read()) == 6000
    fs, path = fsspec.core.url_to_fs("packfs://data.ffr/train")
    assert path == "data.ffr/train" and fs.ls(path, detail=False) == ["data.ffr/train/cat", "data.ffr/train/dog"]
    assert fs.info("data.ffr")["type"] == "directory" and fs.find("data.ffr/train") == ["data.ffr/train/cat/1.jpg"]
    with pytest.raises(FileNotFoundError, match="is not in the archive 'data.ffr'"):
        fs.info("train")


def test_pandas_reads_a_csv_by_url_alone(dataset: Path) -> None:
    pandas = require_extra("pandas", "test")
    frame = pandas.read_csv(f"packfs://{dataset}/labels.csv")
    assert frame.iloc[0]["label"] == "cat"


def test_the_chained_form(dataset: Path) -> None:
    with fsspec.open(f"packfs://train/cat/1.jpg::{dataset}") as f:
        assert f.read(6) == b"\xff\xd8jpeg"
    with fsspec.open(f"packfs://labels.csv::file://{dataset}", "rt") as f:
        assert f.readline() == "path,label\n"


def test_fo_wins_over_a_local_file_named_like_the_inner_path(dataset: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "labels.csv").write_text("a local file, not the archive's\n")
    with fsspec.open("packfs://labels.csv", "rt", fo=str(dataset)) as f:
        assert f.readline() == "path,label\n"


def test_a_url_without_an_archive_names_the_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for url in ("packfs://missing.ffr/labels.csv", "packfs://labels.csv"):
        with pytest.raises(ValueError) as raised:
            fsspec.open(url).open()
        message = str(raised.value)
        for form in ("packfs://ARCHIVE/PATH", "packfs://PATH::ARCHIVE", "fo=ARCHIVE"):
            assert form in message


def test_a_remote_archive_chained_is_not_supported_yet() -> None:
    with pytest.raises(packfs.RemoteArchiveError, match="'memory:///a.ffr': memory:// URLs are not supported"):
        fsspec.open("packfs://labels.csv::memory://a.ffr").open()
