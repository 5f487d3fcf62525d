"""packfs.fsspec: files inside an archive by URL, through fsspec and pandas."""

from __future__ import annotations

from pathlib import Path

import pytest

import packfs
from tests.conftest import require_extra, time_limit
from tests.test_remote_source import moto, nginx  # noqa: F401 (fixtures: real servers on loopback)

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


def test_an_archive_chained_from_a_scheme_packfs_does_not_read() -> None:
    with pytest.raises(packfs.RemoteArchiveError, match="'memory:///a.ffr': memory:// URLs are not supported"):
        fsspec.open("packfs://labels.csv::memory://a.ffr").open()


# -- a remote archive, read by packfs itself: no s3fs, no aiohttp ----------------------

# Run in a process of its own where s3fs and aiohttp cannot be imported even if they are
# installed: what fsspec needs from them is only to parse a chained URL.
_WITHOUT_S3FS = """
import importlib.abc, json, os, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("s3fs", "aiohttp"):
            raise ImportError(f"blocked for this test: {name}")
        return None

sys.meta_path.insert(0, Block())
import fsspec
import packfs.fsspec

so = json.loads(os.environ["TEST_STORAGE_OPTIONS"])
http = os.environ["TEST_HTTP_URL"]
read = {}
read["storage_options"] = fsspec.filesystem("packfs", fo="s3://bucket/data.ffr", storage_options=so).cat("labels.csv")
read["target_options"] = fsspec.filesystem("packfs", fo="s3://bucket/data.ffr", target_options=so).cat("labels.csv")
read["target_protocol"] = fsspec.filesystem("packfs", fo="bucket/data.ffr", target_protocol="s3",
                                            target_options=so).cat("labels.csv")
with fsspec.open("packfs://labels.csv::s3://bucket/data.ffr", s3=so) as f:
    read["chained s3"] = f.read()
with fsspec.open("packfs://train/cat/1.jpg::s3://bucket/data.ffr", s3=so) as f:
    f.seek(-4, 2)
    read["chained s3, seek"] = f.read()
with fsspec.open(f"packfs://labels.csv::{http}") as f:
    read["chained http"] = f.read()
read["pandas"] = None
try:
    import pandas
except ImportError:
    pass
else:
    frame = pandas.read_csv("packfs://labels.csv", storage_options={"fo": "s3://bucket/data.ffr", "target_options": so})
    read["pandas"] = frame.iloc[0]["label"]
try:
    fsspec.open("s3://bucket/data.ffr").open()  # s3 on its own: fsspec's own error, as ever
except ImportError as error:
    read["s3 alone"] = str(error)
print(json.dumps({key: value.decode() if isinstance(value, bytes) else value for key, value in read.items()}))
"""


def test_a_remote_archive_by_every_spelling_without_s3fs(dataset: Path, moto, nginx, tmp_path: Path) -> None:  # noqa: F811
    import importlib.util
    import json
    import os
    import subprocess
    import sys

    from tests.remote_servers import S3_KEY, S3_REGION, S3_SECRET

    data = dataset.read_bytes()
    moto.client().put_object(Bucket="bucket", Key="data.ffr", Body=data)
    nginx.put("data.ffr", data)
    options = {"key": S3_KEY, "secret": S3_SECRET, "region": S3_REGION, "endpoint_url": moto.endpoint}
    # No credentials in the environment: the options given are the only ones.
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               TEST_STORAGE_OPTIONS=json.dumps(options), TEST_HTTP_URL=nginx.url("data.ffr"))
    result = subprocess.run([sys.executable, "-c", _WITHOUT_S3FS], capture_output=True, text=True, env=env,
                            timeout=time_limit(120))
    assert result.returncode == 0, result.stderr
    read = json.loads(result.stdout)
    labels = "path,label\ntrain/cat/1.jpg,cat\n"
    for spelling in ("storage_options", "target_options", "target_protocol", "chained s3", "chained http"):
        assert read[spelling] == labels, spelling
    assert read["chained s3, seek"] == "jpeg"
    assert read["pandas"] == ("cat" if importlib.util.find_spec("pandas") else None)
    assert read["s3 alone"].startswith("Install s3fs to access S3")
