"""Archives at a URL, end to end: every reader and CLI command over nginx (HTTP) and
moto_server (S3) on loopback, request counts from the servers' own logs."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import packfs
from packfs import ArchiveChangedError, PackedFolder
from tests.conftest import (BLUEPRINT, HARDLINK, as_version_1_1, assert_same_tree, mounted, packfs_cli,
                            require_extra, require_fuse, wait_until, time_limit)
from tests.remote_servers import S3_KEY, S3_REGION, S3_SECRET
from tests.test_remote_source import moto, nginx, s3_env  # noqa: F401 (fixtures: real servers, stopped at the end)

FILES = {path: contents for path, contents in BLUEPRINT.items() if contents is not None}


@pytest.fixture
def served(nginx, archive: Path) -> str:  # noqa: F811
    nginx.put("tree.ffr", archive.read_bytes())
    nginx.clear_log()
    return nginx.url("tree.ffr")


@pytest.fixture
def in_bucket(moto, s3_env, archive: Path) -> str:  # noqa: F811
    moto.client().put_object(Bucket="bucket", Key="tree.ffr", Body=archive.read_bytes())
    return "s3://bucket/tree.ffr"


def _next_second() -> None:
    """Wait for the clock's next second: nginx's ETag is the file's mtime in whole
    seconds and its size, so a replacement of the same size within the same second
    would keep the ETag (S3's is the content's MD5)."""
    time.sleep(1.05 - time.time() % 1)


def _gets(nginx, at_least: int = 0) -> list:  # noqa: F811
    return [request for request in nginx.requests(at_least) if request.method == "GET"]


def test_one_request_opens_and_one_more_finds_and_reads_a_file(nginx, served: str) -> None:  # noqa: F811
    # Without the disk cache, whose blocks would round each range (test_cache.py).
    with PackedFolder(served, cache_dir=False) as folder:
        opened = _gets(nginx, 1)
        assert len(opened) == 1 and opened[0].range.startswith("bytes=-")  # a suffix request, no HEAD
        nginx.clear_log()
        # A file before the 3 MiB one: not in the last 256 KiB the open fetched (nor is
        # the lookup index page, in a table this small).
        path = "a/b/c/deep.bin"
        assert folder.stat(path).size == len(FILES[path])
        assert folder.read(path) == FILES[path]
        requests = _gets(nginx, 1)
        assert len(requests) == 1 and requests[0].bytes_sent < len(FILES[path]) + 1024  # the file's bytes
        assert all(request.if_match for request in requests)  # every ranged GET names the ETag
        for path, contents in FILES.items():
            assert folder.read(path) == contents
        assert folder.verify().ok


def test_stats_count_what_the_server_answered(nginx, served: str, archive: Path) -> None:  # noqa: F811
    with PackedFolder(served) as folder:
        assert folder.stats()["requests"] == 1 and 0 < folder.stats()["bytes_fetched"] <= 256 << 10
        for path in FILES:
            folder.read(path)
        stats = folder.stats()
        assert stats["requests"] == len(_gets(nginx, stats["requests"]))
        # A read that reaches into the last 256 KiB fetched at open fetches that part again.
        assert stats["bytes_fetched"] <= archive.stat().st_size + (256 << 10) and stats["retries"] == 0
        assert {"page_cache_hits", "page_cache_misses", "page_cache_bytes"} <= set(stats)
    with PackedFolder(archive) as local:
        assert local.stats() == {}
    info = packfs_cli("info", served)
    assert "requests" in info.stdout and "fetched bytes" in info.stdout


def test_info_prints_the_disk_caches_counters_when_there_is_one(served: str) -> None:
    counters = ("cache hits ", "cache misses ", "cache waits ", "readahead bytes ")
    cached = packfs_cli("info", served)  # through the test's own cache directory
    assert cached.returncode == 0, cached.stderr
    lines = cached.stdout.splitlines()
    assert all(any(line.startswith(counter) for line in lines) for counter in counters), cached.stdout
    uncached = subprocess.run([sys.executable, "-m", "packfs", "info", served], capture_output=True, text=True,
                              env={**os.environ, "PACKFS_CACHE_DIR": "off"}, timeout=time_limit(60))
    assert uncached.returncode == 0 and "fetched bytes" in uncached.stdout
    assert not any(counter in uncached.stdout for counter in counters), uncached.stdout


def test_an_archive_in_s3_reads_as_a_local_one(moto, in_bucket: str, archive: Path) -> None:  # noqa: F811
    with PackedFolder(in_bucket) as remote, PackedFolder(archive) as local:
        for path, contents in FILES.items():
            assert remote.read(path) == contents
            assert remote.stat(path) == local.stat(path)
        assert list(remote.walk("")) == list(local.walk(""))
        assert remote.stat(HARDLINK[0]).inode == remote.stat(HARDLINK[1]).inode
    # storage_options instead of the environment
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.pop(name)
    options = {"key": S3_KEY, "secret": S3_SECRET, "region": S3_REGION, "endpoint_url": moto.endpoint}
    with PackedFolder(in_bucket, storage_options=options) as remote:
        assert remote.read("hello.txt") == FILES["hello.txt"]


def test_an_object_replaced_under_a_reader_is_archive_changed(nginx, served: str, tree: Path,  # noqa: F811
                                                              tmp_path: Path) -> None:
    with PackedFolder(served) as folder:
        assert folder.read("hello.txt") == FILES["hello.txt"]
        _next_second()
        (tree / "hello.txt").write_bytes(b"other contents")
        packfs.pack_folder(tree, tmp_path / "new.ffr")
        nginx.put("tree.ffr", (tmp_path / "new.ffr").read_bytes())
        with pytest.raises(ArchiveChangedError):
            for path in FILES:  # some page or file not fetched yet: never a mix of the two
                folder.read(path)
    with PackedFolder(served) as folder:  # opened again: the new archive
        assert folder.read("hello.txt") == b"other contents"


def test_an_archive_without_a_tail_reads_remotely_with_more_requests(nginx, archive: Path,  # noqa: F811
                                                                     tmp_path: Path) -> None:
    nginx.put("old.ffr", as_version_1_1(archive, tmp_path / "old.ffr").read_bytes())
    nginx.clear_log()
    with PackedFolder(nginx.url("old.ffr")) as folder:
        assert folder.archive.version == "1.1"
        for path, contents in FILES.items():
            assert folder.read(path) == contents
        assert folder.verify().ok
    # packfs convert reads it from the URL and writes a local 1.4 copy.
    converted = packfs_cli("convert", nginx.url("old.ffr"), tmp_path / "new.ffr")
    assert converted.returncode == 0, converted.stderr
    with PackedFolder(tmp_path / "new.ffr") as folder:
        assert folder.archive.version == "1.4" and folder.read("hello.txt") == FILES["hello.txt"]


def test_every_reading_api_takes_a_url(nginx, served: str, tmp_path: Path) -> None:  # noqa: F811
    from packfs.ffrecord import FileReader
    from packfs.ffrecord import PackedFolder as FFRecordFolder

    with packfs.RecordReader(served) as reader, PackedFolder(served) as folder:
        assert len(reader) == folder.archive.record_count
        entry = folder.archive.find(b"hello.txt")
        first, _ = folder.archive.extent(entry)
        assert FILES["hello.txt"] in [bytes(reader.read_one(i)) for i in range(folder.archive.data_records)]
    reader = FileReader(served)
    assert reader.n == len(packfs.RecordReader(served))
    reader.close()
    with FFRecordFolder(served) as folder:
        assert bytes(folder.read_one("hello.txt")) == FILES["hello.txt"]  # FFRecord's API gives arrays
    require_extra("fsspec", "fsspec")
    import fsspec

    # fo= names the archive; the chained form (packfs://hello.txt::https://...) also works
    # where fsspec's own file system for the target is installed (fsspec loads it to
    # parse the chain).
    with fsspec.filesystem("packfs", fo=served).open("hello.txt", "rb") as file:
        assert file.read() == FILES["hello.txt"]


def test_a_dataloader_reads_a_url_in_worker_processes(nginx, served: str) -> None:  # noqa: F811
    require_extra("torch", "torch")
    import torch

    from packfs.torch import PackedDataset

    dataset = PackedDataset(served, "**/*.txt")
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    got = sorted(bytes(item) for item in loader)
    expected = [FILES[path] for path in FILES if path.endswith(".txt")] + [FILES[HARDLINK[1]]]  # and the hard link
    assert got == sorted(expected)


@pytest.mark.parametrize("where", ["http", "s3"])
def test_cli_commands_take_a_url(where: str, request, tmp_path: Path, archive: Path) -> None:
    url = request.getfixturevalue("served" if where == "http" else "in_bucket")
    env = dict(os.environ)
    listing = packfs_cli("ls", url, "a")
    assert listing.returncode == 0, listing.stderr
    assert "b" in listing.stdout.split()
    found = [subprocess.run([sys.executable, "-m", "packfs", "find", str(where_)], capture_output=True).stdout
             for where_ in (url, archive)]  # bytes: a name is not UTF-8
    assert found[0] == found[1] and found[0]
    assert packfs_cli("cat", url, "hello.txt").stdout == FILES["hello.txt"].decode()
    info = packfs_cli("info", url)
    assert info.returncode == 0 and "format version  1.4" in info.stdout
    assert S3_SECRET not in info.stdout + info.stderr and env.get("AWS_SECRET_ACCESS_KEY", "-") not in info.stdout
    assert packfs_cli("verify", url).returncode == 0
    unpacked = packfs_cli("unpack", url, tmp_path / "out")
    assert unpacked.returncode == 0, unpacked.stderr
    local = packfs_cli("unpack", archive, tmp_path / "local")
    assert local.returncode == 0
    assert_same_tree(tmp_path / "local", tmp_path / "out")
    assert packfs_cli("convert", url, tmp_path / "copy.ffr").returncode == 1  # already native: says so


def test_unpack_and_verify_of_a_url_show_progress_and_what_they_fetched(nginx, served: str,  # noqa: F811
                                                                        tmp_path: Path) -> None:
    """--progress into a pipe: lines, the last with the rate and the bytes and requests
    the command fetched, which are what nginx answered."""
    units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for args in (("verify", served), ("unpack", served, tmp_path / "out")):
        plain = packfs_cli(*args[:2], *[f"{arg}-plain" for arg in args[2:]])
        assert plain.returncode == 0 and "%" not in plain.stderr  # a pipe: progress only when asked
        nginx.clear_log()
        result = packfs_cli(args[0], "--progress", *args[1:])
        assert result.returncode == 0, result.stderr
        assert "\r" not in result.stderr
        label = "verifying" if args[0] == "verify" else "unpacking"
        last = [line for line in result.stderr.splitlines() if line.startswith(label)][-1]
        assert last.startswith(f"{label} 100.0%") and "/s  in " in last, result.stderr
        fetched, _, requests = last.rpartition("(fetched ")[2].rstrip(")").partition(" in ")
        gets = _gets(nginx, int(requests.split()[0]))
        assert requests == f"{len(gets)} request{'s' if len(gets) > 1 else ''}"
        number, unit = fetched.split()
        sent = sum(request.bytes_sent for request in gets)  # bodies and heads (under 1 KiB each)
        assert sent - 1024 * len(gets) - units[unit] / 10 <= float(number) * units[unit] <= sent + units[unit] / 10


def test_cli_errors_name_what_is_wrong(nginx, moto, s3_env) -> None:  # noqa: F811
    missing = packfs_cli("ls", nginx.url("nothing.ffr"))
    assert missing.returncode == 1 and missing.stderr.startswith("Error: ") and "not found" in missing.stderr.lower()
    assert "Traceback" not in missing.stderr
    denied = packfs_cli("ls", nginx.url("tree.ffr", location="denied"))
    assert denied.returncode == 1 and denied.stderr.startswith("Error: ")
    assert "403" in denied.stderr or "denied" in denied.stderr.lower()
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=moto.endpoint, AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
               AWS_CONFIG_FILE="/nonexistent", AWS_REGION=S3_REGION)
    no_credentials = subprocess.run([sys.executable, "-m", "packfs", "ls", "s3://bucket/tree.ffr"],
                                    capture_output=True, text=True, env=env, timeout=time_limit(60))
    assert no_credentials.returncode == 1 and no_credentials.stderr.startswith("Error: ")
    assert "credentials" in no_credentials.stderr.lower() and "Traceback" not in no_credentials.stderr


@pytest.mark.fuse
def test_mount_a_url(nginx, served: str, tmp_path: Path, tree: Path) -> None:  # noqa: F811
    require_fuse()
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    # Without the disk cache: its read-ahead may already hold big/large.bin (then served
    # as the archive was when mounted, which is right too), and this is about the GET.
    with mounted(served, mountpoint, "--cache-dir", "off"):  # type: ignore[arg-type]
        for path, contents in FILES.items():
            if path != "big/large.bin":
                assert (mountpoint / path).read_bytes() == contents
        assert sorted(os.listdir(mountpoint / "a")) == sorted(os.listdir(tree / "a"))
        assert os.stat(mountpoint / HARDLINK[0]).st_ino == os.stat(mountpoint / HARDLINK[1]).st_ino
        # The object replaced under the mount: what was not read yet is EIO, never new bytes.
        _next_second()
        (tree / "big" / "large.bin").write_bytes(b"replaced")
        packfs.pack_folder(tree, tmp_path / "new.ffr")
        nginx.put("tree.ffr", (tmp_path / "new.ffr").read_bytes())
        with pytest.raises(OSError) as raised:
            (mountpoint / "big" / "large.bin").read_bytes()
        assert raised.value.errno == errno.EIO


def test_cache_options_of_the_commands(nginx, served: str, tmp_path: Path) -> None:  # noqa: F811
    """--cache-dir puts the disk cache where it says ('off': none), for the command and
    a mount's daemon alike; --cache-size and $PACKFS_CACHE_SIZE are checked."""
    cache = tmp_path / "cache"
    # A file before the 3 MiB one: not in the last 256 KiB that opening fetched.
    done = subprocess.run([sys.executable, "-m", "packfs", "cat", "--cache-dir", str(cache), served, "a/b/c/deep.bin"],
                          capture_output=True)
    assert done.returncode == 0 and done.stdout == FILES["a/b/c/deep.bin"]
    assert any(path.name.startswith("c") for path in (cache / "v1").rglob("c*"))
    off = tmp_path / "off-home"
    done = subprocess.run([sys.executable, "-m", "packfs", "cat", "--cache-dir", "off", served, "a/b/c/deep.bin"],
                          capture_output=True, env={**os.environ, "HOME": str(off), "XDG_CACHE_HOME": str(off)})
    assert done.returncode == 0 and not off.exists()
    done = packfs_cli("info", "--cache-size", "lots", served)
    assert done.returncode == 2 and "--cache-size" in done.stderr and "not a size" in done.stderr
    done = subprocess.run([sys.executable, "-m", "packfs", "info", served], capture_output=True, text=True,
                          env={**os.environ, "PACKFS_CACHE_SIZE": "-3"})
    assert done.returncode == 1 and done.stderr.startswith("Error: ") and "PACKFS_CACHE_SIZE='-3'" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
