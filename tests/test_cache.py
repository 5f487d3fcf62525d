"""The disk cache of archives at URLs (packfs.source.cache), against nginx on loopback:
what a second reader fetches, single flight across processes, crash safety, the
bound, a replaced object, sequential reads fetched ahead.  Requests and bytes are
counted from nginx's own log."""

from __future__ import annotations

import errno
import logging
import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import pytest

from packfs import PackedFolder
from packfs.core import Archive
from packfs.source import cache as cache_module
from packfs.source import open_source
from packfs.source.cache import BLOCK_BYTES, SLOT, CachedSource
from packfs import pack_folder
from tests.conftest import mounted, require_extra, require_fuse, time_limit
from tests.remote_servers import bytes_asked_twice
from tests.test_remote_source import moto, nginx, s3_env  # noqa: F401 (fixtures: real servers, stopped at the end)

FORK = multiprocessing.get_context("fork")


def _make_archive(directory: Path, files: dict, name: str = "data.ffr") -> Path:
    source = directory / f"{name}.src"
    for path, contents in files.items():
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        (source / path).write_bytes(contents)
    out = directory / name
    pack_folder(source, out)
    return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple:
    """An archive of 300 files of 1-150 KB and one of 24 MiB, and its files."""
    rng = random.Random(25)
    files = {f"train/{k:04d}.bin": rng.randbytes(rng.randint(1000, 150_000)) for k in range(300)}
    files["big/weights.bin"] = rng.randbytes(24 << 20)
    return _make_archive(tmp_path_factory.mktemp("dataset"), files), files


@pytest.fixture
def served(nginx, dataset) -> str:  # noqa: F811
    nginx.put("data.ffr", dataset[0].read_bytes())
    nginx.clear_log()
    return nginx.url("data.ffr")


def _data_gets(nginx) -> list:  # noqa: F811
    """The ranged GETs after the opens' suffix requests, as (start, end) byte spans."""
    spans = []
    for request in nginx.requests():
        if request.method == "GET" and request.range.startswith("bytes=") and "=-" not in request.range:
            first, last = request.range[len("bytes="):].split("-")
            spans.append((int(first), int(last) + 1))
    return spans


def _cached_bytes(directory: Path) -> int:
    total = 0
    for path in directory.rglob("c*"):
        try:
            total += path.stat().st_blocks * 512
        except FileNotFoundError:  # evicted meanwhile
            pass
    return total


def test_a_second_reader_is_served_from_the_cache(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    _, files = dataset
    names = sorted(files)
    random.Random(1).shuffle(names)
    with PackedFolder(served, cache_dir=tmp_path / "cache") as folder:
        assert isinstance(folder.archive.source, CachedSource)
        for name in names:
            assert folder.read(name) == files[name]
        first = folder.archive.stats()
    assert first["cache_misses"] > 0 and bytes_asked_twice(_data_gets(nginx)) == 0
    nginx.clear_log()
    with PackedFolder(served, cache_dir=tmp_path / "cache") as folder:
        for name in reversed(names):
            assert folder.read(name) == files[name]
        again = folder.archive.stats()
    assert _data_gets(nginx) == []  # only the open's suffix request went out
    assert again["cache_misses"] == 0 and again["cache_hits"] > 0 and again["bytes_fetched"] <= 256 << 10
    assert (tmp_path / "cache" / "v1").is_dir()


def test_without_a_cache_directory_nothing_is_written(nginx, served, dataset, tmp_path, monkeypatch) -> None:  # noqa: F811
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PACKFS_CACHE_DIR", "off")
    with PackedFolder(served) as folder:
        assert folder.read("train/0001.bin") == dataset[1]["train/0001.bin"]
        assert "cache_hits" not in folder.archive.stats()
    with PackedFolder(served, cache_dir=False) as folder:
        assert folder.read("train/0002.bin") == dataset[1]["train/0002.bin"]
    assert not (tmp_path / "home").exists()


def test_the_default_directory_is_the_users_cache(nginx, served, tmp_path, monkeypatch) -> None:  # noqa: F811
    monkeypatch.delenv("PACKFS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with PackedFolder(served) as folder:
        folder.read("train/0003.bin")
    assert _cached_bytes(tmp_path / "xdg" / "packfs") > 0


def test_a_cache_that_cannot_be_written_is_read_around(nginx, served, dataset, tmp_path, caplog) -> None:  # noqa: F811
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="packfs.cache"), \
            PackedFolder(served, cache_dir=blocker / "cache") as folder:
        assert folder.read("train/0004.bin") == dataset[1]["train/0004.bin"]
    assert "cannot be used" in caplog.text and "without a disk cache" in caplog.text


def _read_all(url: str, cache_dir: str, names: list, seed: int, start, results) -> None:
    """A process reading ``names`` shuffled by ``seed``, after ``start`` (a barrier)."""
    try:
        order = list(names)
        random.Random(seed).shuffle(order)
        with PackedFolder(url, cache_dir=cache_dir) as folder:
            start.wait(time_limit(30))
            digests = {name: hash(folder.read(name)) for name in order}
            results.put((seed, digests, folder.archive.stats()))
    except BaseException as error:  # reported to the test, which fails on it
        results.put((seed, repr(error), {}))


def test_processes_missing_the_same_blocks_send_one_get(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    from bench.proxy import Proxy

    _, files = dataset
    names = [name for name in sorted(files) if name.startswith("train/")]
    with Proxy(nginx.port, rtt=0.02) as proxy:
        url = served.replace(f":{nginx.port}/", f":{proxy.port}/")
        start, results = FORK.Barrier(4), FORK.Queue()
        workers = [FORK.Process(target=_read_all, args=(url, str(tmp_path / "cache"), names, seed, start, results))
                   for seed in range(4)]
        for worker in workers:
            worker.start()
        try:
            outcomes = [results.get(timeout=time_limit(120)) for _ in workers]
        finally:
            for worker in workers:
                worker.join(time_limit(10))
                if worker.is_alive():
                    worker.kill()
    expected = {name: hash(files[name]) for name in names}
    for seed, digests, _ in outcomes:
        assert digests == expected, seed
    spans = _data_gets(nginx)
    assert bytes_asked_twice(spans) == 0  # no block fetched twice, across four processes
    assert sum(stats["cache_waits"] for _, _, stats in outcomes) > 0  # they did miss the same blocks at once
    total = sum(len(files[name]) for name in names)
    assert sum(stop - start for start, stop in spans) < 1.3 * total


def test_torn_and_damaged_blocks_are_fetched_again(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    """What a writer killed mid-write leaves (bytes without their slot), what a power
    cut leaves (a slot whose bytes did not reach the disk) and a slot that lies."""
    _, files = dataset
    with PackedFolder(served, cache_dir=tmp_path / "cache") as folder:
        folder.read("big/weights.bin")
        entry = folder.archive.lookup("big/weights.bin")
        start = folder.archive.extent(entry)[0]
    [chunk_file] = [path for path in (tmp_path / "cache").rglob("c*")
                    if path.stat().st_size > start % cache_module.CHUNK_BYTES]
    first = start // BLOCK_BYTES + 1  # a block wholly inside the file
    local = first % cache_module.BLOCKS_PER_CHUNK
    with open(chunk_file, "r+b") as out:
        out.seek(local * SLOT.size)  # torn: the slot gone, the bytes there
        out.write(bytes(SLOT.size))
        out.seek(cache_module.SLOTS_BYTES + (local + 1) * BLOCK_BYTES + 100)  # bytes that changed under their slot
        out.write(b"\xff\x00\xff")
        out.seek((local + 2) * SLOT.size)  # a slot that claims a block longer than blocks are
        out.write(SLOT.pack(0, BLOCK_BYTES + 1))
    nginx.clear_log()
    with PackedFolder(served, cache_dir=tmp_path / "cache") as folder:
        assert folder.read("big/weights.bin") == files["big/weights.bin"]
        assert folder.archive.stats()["cache_misses"] == 3
    assert sorted(_data_gets(nginx)) == [(first * BLOCK_BYTES, (first + 3) * BLOCK_BYTES)]
    with PackedFolder(served, cache_dir=tmp_path / "cache") as folder:  # repaired
        assert folder.read("big/weights.bin") == files["big/weights.bin"]
        assert folder.archive.stats()["cache_misses"] == 0


@pytest.mark.parametrize("fault", ["kill", "truncate"])
def test_a_fetch_into_the_cache_cut_mid_body_is_fetched_again_whole(nginx, served, dataset, tmp_path,  # noqa: F811
                                                                    fault) -> None:
    """A read ahead writes each piece to its chunk as it arrives and the slots at the
    end: a GET cut after half its body leaves its bytes without slots, and the span is
    fetched again from its start, so the cache ends up as whole and right as after a
    fetch nothing cut."""
    from bench.proxy import Proxy

    _, files = dataset
    names = sorted(name for name in files if name.startswith("train/"))
    left = {}  # what a second reader fetches (the files in the suffix the open fetched)
    with Proxy(nginx.port) as proxy:
        url = served.replace(f":{nginx.port}/", f":{proxy.port}/")
        for cut in (None, fault):
            cache = tmp_path / f"cache-{cut}"
            with Archive(url, cache_dir=cache) as archive:
                entries = [archive.lookup(name) for name in names]
                proxy.fault(cut, count=2, when=lambda head: b"=-" not in head)  # not the open's suffix
                assert archive.prefetch(entries) > 0
                assert proxy.faults_injected == (2 if cut else 0)
                assert archive.stats()["retries"] >= (2 if cut else 0)
            nginx.clear_log()
            with Archive(url, cache_dir=cache) as archive:  # the same URL: the same cache (no faults now)
                for name, entry in zip(names, entries):
                    assert archive.read(entry) == files[name]
                left[cut] = (archive.stats()["cache_misses"], _data_gets(nginx))
    assert left[fault] == left[None]
    assert left[None][0] <= 1  # the block the header is in, read at the open


def _read_forever(url: str, cache_dir: str, names: list, seed: int, wrong) -> None:
    rng = random.Random(seed)
    choices = sorted(names)
    with PackedFolder(url, cache_dir=cache_dir) as folder:
        while True:
            name = rng.choice(choices)
            data = folder.read(name)
            if hash(data) != names[name]:
                wrong.put(name)


def test_a_process_killed_mid_write_leaves_no_wrong_bytes(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    """Four processes share a cache through a slow link; one is killed with SIGKILL
    again and again while it fetches and writes.  Nobody is ever served a wrong byte,
    nobody waits for the dead one's lock, and the cache then reads back right."""
    from bench.proxy import Proxy

    _, files = dataset
    expected = {name: hash(contents) for name, contents in files.items()}
    wrong = FORK.Queue()
    cache_dir = str(tmp_path / "cache")
    with Proxy(nginx.port, rtt=0.004, bandwidth=64 << 20) as proxy:
        url = served.replace(f":{nginx.port}/", f":{proxy.port}/")
        readers = [FORK.Process(target=_read_forever, args=(url, cache_dir, expected, seed, wrong), daemon=True)
                   for seed in range(3)]
        for reader in readers:
            reader.start()
        try:
            for round_ in range(8):
                victim = FORK.Process(target=_read_forever, args=(url, cache_dir, expected, 100 + round_, wrong),
                                      daemon=True)
                victim.start()
                time.sleep(0.3 + 0.1 * round_)
                os.kill(victim.pid, signal.SIGKILL)
                victim.join(time_limit(10))
            time.sleep(0.5)
            assert all(reader.is_alive() for reader in readers)  # no reader died, none is stuck (below)
        finally:
            for reader in readers:
                reader.kill()
                reader.join(time_limit(10))
    assert wrong.empty()
    with PackedFolder(url.replace(f":{proxy.port}/", f":{nginx.port}/"), cache_dir=cache_dir) as folder:
        for name, contents in files.items():
            assert folder.read(name) == contents


def test_the_cache_stays_within_its_bound(nginx, served, dataset, tmp_path, monkeypatch) -> None:  # noqa: F811
    # Chunks of 1 MiB, so that the bound acts on this small archive as on a large one.
    monkeypatch.setattr(cache_module, "CHUNK_BYTES", 1 << 20)
    monkeypatch.setattr(cache_module, "BLOCKS_PER_CHUNK", (1 << 20) // BLOCK_BYTES)
    monkeypatch.setattr(cache_module, "SLOTS_BYTES", (1 << 20) // BLOCK_BYTES * SLOT.size)
    _, files = dataset
    bound = 4 << 20
    names = sorted(name for name in files if name.startswith("train/"))
    random.Random(3).shuffle(names)
    assert sum(len(files[name]) for name in names) > 4 * bound
    with PackedFolder(served, cache_dir=tmp_path / "cache", storage_options={"cache_size": bound}) as folder:
        for name in names:
            assert folder.read(name) == files[name]
            # An eighth of the bound written between looks, a chunk removed at a time.
            assert _cached_bytes(tmp_path / "cache") <= bound + bound // 8 + (1 << 20)
        assert folder.read("train/0000.bin") == files["train/0000.bin"]  # evicted or not: right
    assert _cached_bytes(tmp_path / "cache") > 0


def test_a_bad_cache_size_is_refused(nginx, served) -> None:  # noqa: F811
    with pytest.raises(ValueError, match="cache_size"):
        open_source(served, storage_options={"cache_size": -1})


def test_a_replaced_object_with_the_same_etag_is_not_served_from_the_cache(nginx, tmp_path) -> None:  # noqa: F811
    """nginx's ETag is the modification second and the size: an archive replaced by
    another of the same size within the same second keeps it.  The cache's key holds
    the bytes the open fetched (the tail's CRCs of everything), so it changes."""
    rng = random.Random(7)
    first = {f"f{k}.bin": rng.randbytes(40_000) for k in range(20)}
    second = {name: rng.randbytes(40_000) for name in first}
    a = _make_archive(tmp_path, first, "a.ffr")
    b = _make_archive(tmp_path, second, "b.ffr")
    assert a.stat().st_size == b.stat().st_size
    nginx.put("same.ffr", a.read_bytes())
    os.utime(nginx.data / "same.ffr", (1_700_000_000, 1_700_000_000))
    with PackedFolder(nginx.url("same.ffr"), cache_dir=tmp_path / "cache") as folder:
        etag = folder.archive.identity
        assert all(folder.read(name) == contents for name, contents in first.items())
    nginx.put("same.ffr", b.read_bytes())
    os.utime(nginx.data / "same.ffr", (1_700_000_000, 1_700_000_000))
    with PackedFolder(nginx.url("same.ffr"), cache_dir=tmp_path / "cache") as folder:
        assert folder.archive.identity == etag  # what the server says did not change
        assert all(folder.read(name) == contents for name, contents in second.items())


def test_a_sequential_read_is_fetched_ahead_in_growing_windows(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    _, files = dataset
    contents = files["big/weights.bin"]
    with Archive(served, cache_dir=tmp_path / "cache") as archive:
        entry = archive.lookup("big/weights.bin")
        nginx.clear_log()
        step = 128 << 10  # as a mount's READs come
        data = b"".join(archive.read(entry, offset, step) for offset in range(0, len(contents), step))
        stats = archive.stats()
    assert data == contents
    spans = _data_gets(nginx)
    assert stats["readahead_bytes"] > len(contents) // 2
    assert len(spans) < len(contents) // step // 4  # not one GET per READ
    assert max(stop - start for start, stop in spans) >= 4 << 20  # the window grew
    fetched = sum(stop - start for start, stop in spans)
    assert bytes_asked_twice(spans) == 0 and fetched <= 1.05 * len(contents) + (64 << 20) // 16


def test_a_reader_that_prefetches_its_spans_has_nothing_fetched_ahead(nginx, served, dataset,  # noqa: F811
                                                                       tmp_path) -> None:
    """Once a reader says which spans come next (a block-aware epoch's windows), reads
    that look sequential start no stream: the same READs as above fetch what they read."""
    _, files = dataset
    contents = files["big/weights.bin"]
    with Archive(served, cache_dir=tmp_path / "cache") as archive:
        entry = archive.lookup("big/weights.bin")
        assert archive.prefetch([archive.lookup("train/0000.bin")]) > 0
        prefetched = archive.stats()["readahead_bytes"]
        nginx.clear_log()
        step = 128 << 10
        data = b"".join(archive.read(entry, offset, step) for offset in range(0, 4 << 20, step))
        ahead = archive.stats()["readahead_bytes"] - prefetched
    assert data == contents[:4 << 20]
    assert ahead == 0
    spans = _data_gets(nginx)
    assert sum(stop - start for start, stop in spans) <= (4 << 20) + 2 * BLOCK_BYTES  # what was read, no more


def test_a_batch_through_the_cache_is_coalesced_and_then_served_from_it(nginx, served, dataset,  # noqa: F811
                                                                          tmp_path) -> None:
    _, files = dataset
    names = [name for name in sorted(files) if name.startswith("train/")][:40]  # neighbours in the archive
    with PackedFolder(served, cache_dir=tmp_path / "cache") as folder:
        folder.read_many(names[:1])  # the table's pages
        nginx.clear_log()
        shuffled = random.Random(4).sample(names, len(names))
        assert folder.read_many(shuffled) == [files[name] for name in shuffled]
        gets = _data_gets(nginx)
        total = sum(len(files[name]) for name in names)
        # 40 side by side: a few GETs (runs end at a chunk's edge, or at part_bytes), each
        # block once.
        assert len(gets) <= 3 and bytes_asked_twice(gets) == 0
        assert sum(stop - start for start, stop in gets) <= total + 2 * BLOCK_BYTES
        nginx.clear_log()
        assert folder.read_many(shuffled[::-1]) == [files[name] for name in shuffled[::-1]]
        assert _data_gets(nginx) == []


def test_dataloader_workers_share_the_cache_and_epoch_two_fetches_nothing(nginx, served, dataset,  # noqa: F811
                                                                           tmp_path) -> None:
    torch = require_extra("torch", "torch")
    from packfs.torch import PackedDataset

    _, files = dataset
    data = PackedDataset(served, "train/**", cache_dir=tmp_path / "cache")
    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True, num_workers=4,
                                         collate_fn=lambda batch: [hash(item) for item in batch],
                                         multiprocessing_context="fork",
                                         generator=torch.Generator().manual_seed(0))
    expected = sorted(hash(files[name]) for name in files if name.startswith("train/"))
    nginx.clear_log()
    assert sorted(h for batch in loader for h in batch) == expected
    first = _data_gets(nginx)
    assert first and bytes_asked_twice(first) == 0  # four workers, no block fetched twice
    nginx.clear_log()
    assert sorted(h for batch in loader for h in batch) == expected
    assert _data_gets(nginx) == []  # epoch 2: the workers' opens only
    # torch's default re-creates the workers each epoch: their opens fetch the footer,
    # not the tail again (packfs.source.tails).
    opens = [r for r in nginx.requests() if r.range.startswith("bytes=-")]
    assert len(opens) == 4 and {r.range for r in opens} == {"bytes=-64"}
    data.close()


@pytest.mark.fuse
def test_a_mount_reads_a_large_file_ahead(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    """A mount of a URL (either daemon; PACKFS_TEST_BINDING picks) reading a 24 MiB file in the kernel's
    128 KiB READs: the stream is fetched ahead in growing windows, not one GET per
    READ, and nothing past the file."""
    require_fuse()
    _, files = dataset
    contents = files["big/weights.bin"]
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    with mounted(served, mountpoint):  # type: ignore[arg-type]
        os.stat(mountpoint / "big" / "weights.bin")
        nginx.clear_log()
        with open(mountpoint / "big" / "weights.bin", "rb", buffering=0) as file:
            data = b"".join(iter(lambda: file.read(128 << 10), b""))
        assert data == contents
        gets = _data_gets(nginx)
    print(f"\n24 MiB through the mount: {len(gets)} GETs, {sum(b - a for a, b in gets) / len(contents):.3f}x its size")
    assert len(gets) < len(contents) // (128 << 10) // 4, len(gets)
    assert bytes_asked_twice(gets) == 0 and sum(stop - start for start, stop in gets) <= 1.1 * len(contents)


def test_a_closed_or_replaced_archive_is_not_served_from_the_cache(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    from packfs import ArchiveChangedError, ClosedArchiveError

    _, files = dataset
    source = open_source(served, storage_options={"cache_dir": tmp_path / "cache"})
    archive = Archive(source)
    archive.read_path("train/0007.bin")
    start, end = archive.extent(archive.lookup("train/0007.bin"))
    assert source.read(start, end) == files["train/0007.bin"]  # cached
    source.close()
    with pytest.raises(ClosedArchiveError):
        source.read(start, end)
    with pytest.raises(ClosedArchiveError):
        source.read_ranges([(start, end)])
    archive.close()
    # Replaced: the first GET that shows it makes every later read, cached or not, fail.
    with Archive(served, cache_dir=tmp_path / "cache") as archive:
        archive.read_path("train/0007.bin")
        _replace_keeping_size(nginx, dataset[0])
        with pytest.raises(ArchiveChangedError):
            archive.read_path("train/0100.bin")  # not cached: its GET says so
        with pytest.raises(ArchiveChangedError):
            archive.read_path("train/0007.bin")  # cached, still refused


def _replace_keeping_size(nginx, archive: Path) -> None:  # noqa: F811
    data = bytearray(archive.read_bytes())
    data[100] ^= 1
    time.sleep(1.05 - time.time() % 1)  # nginx's ETag: the modification second and the size
    nginx.put("data.ffr", bytes(data))


@pytest.mark.fuse
def test_a_mount_with_the_cache_serves_the_archive_as_mounted_or_eio(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    """An object replaced under a mount: a file the cache holds is served as the archive
    was when mounted (its blocks are keyed by that archive's bytes), one it does not is
    EIO (its GET says the object changed): never the new object's bytes."""
    require_fuse()
    _, files = dataset
    mountpoint = tmp_path / "mnt"
    with mounted(served, mountpoint):  # type: ignore[arg-type]
        assert (mountpoint / "train" / "0005.bin").read_bytes() == files["train/0005.bin"]
        _replace_keeping_size(nginx, dataset[0])
        for name in ("train/0005.bin", "train/0200.bin"):
            try:
                data = (mountpoint / name).read_bytes()
            except OSError as error:
                assert error.errno == errno.EIO
            else:
                assert data == files[name]


_OPEN_AND_READ = r"""
import json, sys, zlib
from packfs import PackedFolder
url, cache_dir, name = sys.argv[1:4]
with PackedFolder(url, cache_dir=cache_dir) as folder:
    data = folder.read(name)
    print(json.dumps({"stats": folder.archive.stats(), "crc": zlib.crc32(data)}))
"""


def _in_a_fresh_process(url: str, cache_dir: Path, name: str) -> dict:
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _OPEN_AND_READ, url, str(cache_dir), name], capture_output=True,
                          text=True, check=True, timeout=time_limit(120))
    return json.loads(done.stdout)


def test_a_second_process_opening_a_cached_archive_fetches_no_tail(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    """Issue 33 (6): the open of an archive the cache holds fetches its footer (64
    bytes), compared with the kept tail's, not the tail again; the file comes from
    the cache.  A replaced object (a new ETag) is fetched whole again, never served
    from what was kept."""
    import zlib

    _, files = dataset
    name = "train/0007.bin"
    first = _in_a_fresh_process(served, tmp_path / "cache", name)
    assert first["crc"] == zlib.crc32(files[name])
    opened = [r for r in nginx.requests(2) if r.range.startswith("bytes=-")]
    assert [r.range for r in opened] == ["bytes=-262144"]
    nginx.clear_log()
    second = _in_a_fresh_process(served, tmp_path / "cache", name)
    assert second["crc"] == zlib.crc32(files[name])
    logged = nginx.requests(1)
    assert [(r.status, r.range) for r in logged] == [(206, "bytes=-64")]  # nothing else: the rest is cached
    assert logged[0].bytes_sent < 1024 and second["stats"]["bytes_fetched"] == 64
    assert second["stats"]["requests"] == 1
    # Replaced (another modification second: another ETag) by an archive of other bytes.
    rng = random.Random(12)
    other = {"train/0007.bin": rng.randbytes(30_000), "x.bin": rng.randbytes(5_000)}
    replacement = _make_archive(tmp_path, other, "other.ffr")
    time.sleep(1.05 - time.time() % 1)
    nginx.put("data.ffr", replacement.read_bytes())
    nginx.clear_log()
    third = _in_a_fresh_process(served, tmp_path / "cache", name)
    assert third["crc"] == zlib.crc32(other[name])
    assert [r.range for r in nginx.requests(2) if r.range.startswith("bytes=-")] == ["bytes=-64", "bytes=-262144"]


def test_a_second_process_opening_a_cached_archive_in_s3_fetches_no_tail(moto, s3_env, dataset,  # noqa: F811
                                                                        tmp_path) -> None:
    import zlib

    archive, files = dataset
    client = moto.client()
    client.create_bucket(Bucket="tails")
    client.put_object(Bucket="tails", Key="data.ffr", Body=archive.read_bytes())
    url, name = "s3://tails/data.ffr", "train/0011.bin"
    before = len(moto.requests())
    first = _in_a_fresh_process(url, tmp_path / "cache", name)
    assert first["crc"] == zlib.crc32(files[name]) and first["stats"]["bytes_fetched"] >= 256 << 10
    middle = len(moto.requests(before + first["stats"]["requests"]))
    second = _in_a_fresh_process(url, tmp_path / "cache", name)
    assert second["crc"] == zlib.crc32(files[name])
    assert second["stats"]["requests"] == 1 and second["stats"]["bytes_fetched"] == 64
    time.sleep(0.3)
    assert [r.method for r in moto.requests()[middle:]] == ["GET"]  # the server saw one request
    # A new object under the key (another ETag): its tail is fetched, its bytes read.
    other = {name: random.Random(3).randbytes(20_000)}
    client.put_object(Bucket="tails", Key="data.ffr", Body=_make_archive(tmp_path, other, "o.ffr").read_bytes())
    third = _in_a_fresh_process(url, tmp_path / "cache", name)
    assert third["crc"] == zlib.crc32(other[name]) and third["stats"]["bytes_fetched"] > 64


def test_a_damaged_kept_tail_is_not_used(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    """A kept tail that fails its CRC (a torn write, a bad disk) is not there: the open
    fetches the tail again and reads right."""
    _, files = dataset
    with PackedFolder(served, cache_dir=tmp_path / "cache") as folder:
        assert folder.read("train/0001.bin") == files["train/0001.bin"]
    (kept,) = (tmp_path / "cache" / "tails-v1").iterdir()
    data = bytearray(kept.read_bytes())
    data[-1000] ^= 0x40
    kept.write_bytes(bytes(data))
    nginx.clear_log()
    with PackedFolder(served, cache_dir=tmp_path / "cache") as folder:
        assert folder.read("train/0002.bin") == files["train/0002.bin"]
        assert folder.archive.stats()["bytes_fetched"] >= 256 << 10
    assert [r.range for r in nginx.requests(1) if r.range.startswith("bytes=-")] == ["bytes=-262144"]
