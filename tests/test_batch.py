"""Batched reads (Archive.read_many, PackedFolder.read_many, read_batch and the datasets'
__getitems__) from archives at a URL, against nginx and moto_server on loopback: the
order asked, duplicates, paths and entries, a damaged file named, neighbours in one
GET (counted in the server's own log), failures retried through the proxy."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest

import packfs
from packfs import ChecksumError, NotAFileError, PackedFolder, PathNotFoundError
from packfs.core import Archive
from packfs.source import open_source
from packfs.source.remote import RemoteFile
from tests.conftest import damaged_copy, require_extra
from tests.remote_servers import Nginx
from tests.test_remote_source import FAST, moto, nginx, proxy, s3_env  # noqa: F401 (fixtures: real servers)

SMALL = 120  # small files, packed next to each other
SPREAD = 6  # files with 200 KB of filler between each two: each one GET of its own


def _contents(name: str, size: int) -> bytes:
    return (name.encode() + b":" + os.urandom(size))[:size]


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batches as the remote source sends them, each GET exactly the bytes asked:
    without the disk cache, whose 16 KiB blocks round each range (tests/test_cache.py
    tests batches through it)."""
    monkeypatch.setenv("PACKFS_CACHE_DIR", "off")


@pytest.fixture(scope="module")
def batch_tree(tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    """An archive of small files side by side, a few files far apart, a symlink and
    a directory: (its path, path -> contents)."""
    root = tmp_path_factory.mktemp("batch")
    source = root / "src"
    files: dict[str, bytes] = {}
    rng = random.Random(25)
    for i in range(SMALL):
        files[f"small/{i:04d}.bin"] = _contents(f"small/{i:04d}", rng.randint(1, 6000))
    for i in range(SPREAD):
        files[f"spread/{i}/file.bin"] = _contents(f"spread/{i}", 5000)
        files[f"spread/{i}/filler.bin"] = os.urandom(200_000)  # packed after file.bin
    # Packed last: the files above lie before the last 256 KiB that opening fetches.
    files["tail.bin"] = os.urandom(300_000)
    for path, contents in files.items():
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        (source / path).write_bytes(contents)
    os.symlink("small/0003.bin", source / "link")
    packfs.pack_folder(source, root / "batch.ffr")
    return root / "batch.ffr", files


@pytest.fixture
def served(nginx, batch_tree) -> str:  # noqa: F811
    nginx.put("batch.ffr", batch_tree[0].read_bytes())
    nginx.clear_log()
    return nginx.url("batch.ffr")


@pytest.fixture
def in_bucket(moto, s3_env, batch_tree) -> str:  # noqa: F811
    moto.client().put_object(Bucket="bucket", Key="batch.ffr", Body=batch_tree[0].read_bytes())
    return "s3://bucket/batch.ffr"


def _data_gets(server: Nginx) -> list:
    return [request for request in server.requests() if request.method == "GET"]


@pytest.mark.parametrize("where", ["http", "s3"])
def test_read_many_keeps_the_order_asked(where: str, request, batch_tree) -> None:
    url = request.getfixturevalue("served" if where == "http" else "in_bucket")
    _, files = batch_tree
    rng = random.Random(1)
    paths = rng.sample(sorted(files), 60) + ["small/0005.bin", "link", "small/0005.bin", "small/0003.bin"]
    expected = [files["small/0003.bin"] if path == "link" else files[path] for path in paths]
    with PackedFolder(url) as remote:
        assert remote.read_many(paths) == expected
        assert remote.read(paths) == expected  # a list to read() is the same batch
        entries = [remote.archive.lookup(path) for path in paths]
        assert remote.archive.read_many(entries) == expected
        assert remote.archive.read_many(np.array(entries)) == expected
        mixed = [entries[k] if k % 2 else paths[k] for k in range(len(paths))]
        assert remote.archive.read_many(mixed) == expected
        batch = dict(remote.archive.read_batch(np.array(entries)))
        assert [batch[k] for k in range(len(entries))] == expected
        assert remote.read_many([]) == []
    with PackedFolder(batch_tree[0]) as local:  # the same answers locally
        assert local.read_many(paths) == expected
        assert local.archive.read_many(entries) == expected


def test_neighbours_share_one_get_and_far_files_one_each(nginx, served: str) -> None:  # noqa: F811
    with PackedFolder(served) as folder:
        archive = folder.archive
        small = [f"small/{i:04d}.bin" for i in range(SMALL)]
        spread = [f"spread/{i}/file.bin" for i in range(SPREAD)]
        folder.read_many(small + spread)  # the table's pages the batch needs, now cached
        extents = sorted(archive.extent(archive.lookup(path)) for path in small)
        assert all(a[1] == b[0] for a, b in zip(extents, extents[1:]))  # side by side, as packed
        nginx.clear_log()
        shuffled = random.Random(2).sample(small, len(small))
        folder.read_many(shuffled)
        gets = _data_gets(nginx)
        assert len(gets) == 1, gets  # one ranged GET for 120 files
        assert gets[0].range == f"bytes={extents[0][0]}-{extents[-1][1] - 1}" and gets[0].if_match
        nginx.clear_log()
        folder.read_many(spread[::-1])
        gets = _data_gets(nginx)
        assert len(gets) == SPREAD  # 200 KB apart: more than the gap worth a shared GET
        assert all(int(get.range.split("-")[1]) - int(get.range[6:].split("-")[0]) + 1 == 5000 for get in gets)


def test_a_damaged_file_fails_its_check_naming_its_path(nginx, batch_tree, tmp_path: Path) -> None:  # noqa: F811
    archive_path, files = batch_tree
    nginx.put("damaged.ffr", damaged_copy(archive_path, tmp_path / "damaged.ffr", b"small/0042.bin", at=10).read_bytes())
    url = nginx.url("damaged.ffr")
    with PackedFolder(url) as folder:
        with pytest.raises(ChecksumError, match="small/0042.bin"):
            folder.read_many(["small/0001.bin", "small/0042.bin", "small/0002.bin"])
        with pytest.raises(ChecksumError, match="small/0042.bin"):
            folder.archive.read_many([folder.archive.lookup("small/0042.bin")])
        with pytest.raises(ChecksumError, match="small/0042.bin"):
            list(folder.archive.read_batch([folder.archive.lookup("small/0042.bin")]))
        assert folder.read_many(["small/0041.bin", "small/0043.bin"]) == [files["small/0041.bin"],
                                                                        files["small/0043.bin"]]
    with Archive(url, checksums="once") as once:
        for _ in range(2):  # checked once, remembered as failed
            with pytest.raises(ChecksumError, match="small/0042.bin"):
                once.read_many(["small/0042.bin"])
    with Archive(url, checksums="never") as unchecked:
        assert unchecked.read_many(["small/0042.bin"])[0] != files["small/0042.bin"]


def test_a_bad_item_is_refused_before_anything_is_fetched(nginx, served: str) -> None:  # noqa: F811
    with PackedFolder(served) as folder:
        folder.read_many(["small/0000.bin", "spread/1/file.bin"])  # table pages cached
        nginx.clear_log()
        for items, error in ((["small/0000.bin", "no/such.bin"], PathNotFoundError),
                             (["small/0000.bin", "small"], NotAFileError),
                             ([folder.archive.lookup("small/0000.bin"), 0], NotAFileError),
                             ([10**9], NotAFileError)):
            with pytest.raises(error):
                folder.archive.read_many(items)
        assert _data_gets(nginx) == []
        with pytest.raises(TypeError, match="one path"):
            folder.read_many("small/0000.bin")


def test_a_batch_is_fetched_in_groups_bounded_in_bytes(nginx, served: str, batch_tree, monkeypatch) -> None:  # noqa: F811
    """A batch larger than a quarter of the source's memory cap is fetched in groups of
    at most that (a single larger file is a group of its own)."""
    _, files = batch_tree
    calls: list[tuple[int, int]] = []  # (spans, bytes) of each call
    read_ranges = RemoteFile.read_ranges

    def counted(self, spans):
        calls.append((len(spans), sum(end - start for start, end in spans)))
        return read_ranges(self, spans)

    monkeypatch.setattr(RemoteFile, "read_ranges", counted)
    cap = 1 << 20
    paths = sorted(files)
    with Archive(open_source(served, memory_cap=cap)) as archive:
        assert archive.read_many(paths) == [files[path] for path in paths]
    total = sum(len(contents) for contents in files.values())
    assert sum(size for _, size in calls) == total and len(calls) >= total // (cap // 4)
    assert all(size <= cap // 4 or count == 1 for count, size in calls)  # groups, or one larger file alone


@pytest.mark.parametrize("fault", ["503", "kill", "truncate", "wrong_range", "longer"])
def test_a_failed_get_in_a_batch_is_tried_again(proxy, nginx, served: str, batch_tree, fault: str) -> None:  # noqa: F811
    _, files = batch_tree
    paths = [f"spread/{i}/file.bin" for i in range(SPREAD)] + [f"small/{i:04d}.bin" for i in range(0, SMALL, 7)]
    with PackedFolder(nginx.url("batch.ffr", port=proxy.port)) as folder:
        folder.read_many(paths)  # the table's pages cached
        before = folder.stats()["retries"]
        proxy.fault(fault, count=2)
        assert folder.read_many(paths[::-1]) == [files[path] for path in paths[::-1]]
        assert folder.stats()["retries"] - before == 2 and proxy.faults_injected == 2


def test_a_dataloader_batch_is_one_call_of_parallel_gets(nginx, served: str, batch_tree) -> None:  # noqa: F811
    """DataLoader hands each batch to __getitems__: a batch of neighbours is one GET."""
    require_extra("torch", "torch")
    import torch

    from packfs.torch import PackedDataset

    _, files = batch_tree
    dataset = PackedDataset(served, "small/*")
    nginx.clear_log()
    loader = torch.utils.data.DataLoader(dataset, batch_size=30, num_workers=2, collate_fn=list,
                                         multiprocessing_context="fork")
    batches = list(loader)
    assert [data for batch in batches for data in batch] == [files[f"small/{i:04d}.bin"] for i in range(SMALL)]
    gets = _data_gets(nginx)
    # Per worker: the open (a suffix GET), the table's pages, one GET per batch.
    assert len(gets) < 2 * 8 + len(batches), gets
    assert sum(1 for get in gets if get.range and not get.range.startswith("bytes=-")
               and int(get.range.split("-")[1]) - int(get.range[6:].split("-")[0]) + 1 > 30 * 1000) >= 1


@pytest.fixture(scope="module")
def many_url(nginx, tmp_path_factory) -> tuple[str, Path]:  # noqa: F811
    """An archive of 30,000 small files, each table column over several pages: its URL
    and its local copy."""
    out = tmp_path_factory.mktemp("many") / "many.ffr"
    packfs.pack_entries((packfs.Entry(f"{i // 1000:02d}/{i:05d}", b"%05d" % i) for i in range(30_000)), out,
                        count=30_000)
    nginx.put("many.ffr", out.read_bytes())
    return nginx.url("many.ffr"), out


@pytest.mark.parametrize("kind", ["entries", "paths"])
def test_a_cold_batch_fetches_its_table_pages_together(many_url, kind: str, monkeypatch) -> None:
    """A cold batch fetches the table pages it needs in a few read_ranges calls (their
    GETs in flight together), never one page at a time as each file is located."""
    calls: list[tuple[str, int]] = []
    read, read_ranges = RemoteFile.read, RemoteFile.read_ranges
    monkeypatch.setattr(RemoteFile, "read", lambda self, start, end: calls.append(("read", 1)) or read(self, start, end))
    monkeypatch.setattr(RemoteFile, "read_ranges",
                        lambda self, spans: calls.append(("read_ranges", len(spans))) or read_ranges(self, spans))
    numbers = random.Random(4).sample(range(30_000), 256)
    items: list = [f"{i // 1000:02d}/{i:05d}" for i in numbers]
    if kind == "entries":
        with PackedFolder(many_url[1]) as local:  # the same numbers as remotely, found without a page
            items = [local.archive.lookup(path) for path in items]
    with PackedFolder(many_url[0]) as folder:
        calls.clear()
        assert folder.archive.read_many(items) == [b"%05d" % i for i in numbers]
    # Pages fetched alone: at most the parent column's first, which the root's rules need
    # when the mode column's first or last page arrives (a batch of 256 among 30,000
    # needs pages of 5 columns, 3-4 pages each).
    assert len([call for call in calls if call[0] == "read"]) <= 1, calls
    batched = [count for kind, count in calls if kind == "read_ranges"]
    assert len(batched) <= 3 and sum(batched[:-1]) > 2 and batched[-1] == 256, calls  # pages, then the files


def test_https_batches_take_the_fast_path_and_single_reads_the_slow_one(nginx, batch_tree,  # noqa: F811
                                                                          monkeypatch) -> None:
    """Over TLS (nginx with a certificate the client trusts through SSL_CERT_FILE): a
    batch's GETs go out on the non-blocking connections of packfs.source.multiget,
    single reads through urllib3; both give the same checked bytes."""
    archive_path, files = batch_tree
    monkeypatch.setenv("SSL_CERT_FILE", str(nginx.certificate))
    nginx.put("batch.ffr", archive_path.read_bytes())
    paths = sorted(path for path in files if path.startswith("small/"))
    with PackedFolder(nginx.tls_url("batch.ffr")) as folder:
        assert folder.read(paths[5]) == files[paths[5]]
        nginx.clear_log()
        shuffled = random.Random(9).sample(paths, len(paths))
        assert folder.read_many(shuffled) == [files[path] for path in shuffled]
        stats = folder.stats()
    assert stats["retries"] == 0  # nothing was left to the slow path
    assert _data_gets(nginx)  # and it went out over TLS (the https server logs to the same file)


def test_an_untrusted_certificate_is_refused_on_both_paths(nginx, batch_tree, monkeypatch) -> None:  # noqa: F811
    archive_path, _ = batch_tree
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    nginx.put("batch.ffr", archive_path.read_bytes())
    with pytest.raises(packfs.RemoteArchiveError, match="(?i)certificate|TLS|SSL"):
        PackedFolder(nginx.tls_url("batch.ffr"))


def test_a_stalled_get_in_a_batch_is_given_up_and_tried_again(proxy, nginx, served: str, batch_tree) -> None:  # noqa: F811
    """A server that never answers one GET of a batch: the batch's other GETs finish,
    the stalled one is given up after the timeout and fetched again."""
    _, files = batch_tree
    paths = [f"spread/{i}/file.bin" for i in range(SPREAD)]
    with Archive(open_source(nginx.url("batch.ffr", port=proxy.port), timeout=1.0)) as archive:
        archive.read_many(paths)  # the table's pages cached
        proxy.fault("stall", count=1)
        assert archive.read_many(paths) == [files[path] for path in paths]
        assert archive.stats()["retries"] == 1


def test_client_options_come_with_the_storage_options(nginx, served: str, batch_tree) -> None:  # noqa: F811
    """in_flight, timeout, retries and memory_cap are taken from storage_options for any
    URL (an http one takes no other), so a dataset's workers re-open with them too."""
    _, files = batch_tree
    paths = sorted(path for path in files if path.startswith("small/"))
    options = {"in_flight": 3, "timeout": 5.0, "retries": 0, "memory_cap": 64 << 20}
    with PackedFolder(served, storage_options=options) as folder:
        source = folder.archive.source
        assert (source.in_flight, source.memory_cap) == (3, 64 << 20)
        assert folder.read_many(paths[::-1]) == [files[path] for path in paths[::-1]]
    for bad in ({"in_flight": 0}, {"timeout": "soon"}, {"retries": -1}, {"in_flight": True}):
        with pytest.raises(packfs.RemoteArchiveError, match=next(iter(bad))):
            PackedFolder(served, storage_options=bad)
