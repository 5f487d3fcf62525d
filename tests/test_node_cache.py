"""``packfs cache``: what the node's disk cache holds and what every process that used
it counted, clearing it and filling it ahead, against nginx on loopback; each reader a
process of its own, every count compared with the server's access log."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import packfs
from packfs import PackedFolder
from packfs.source import cachestats
from tests.remote_servers import bytes_asked_twice
from tests.test_cache import _data_gets, _make_archive, dataset, served  # noqa: F401 (fixtures)
from tests.test_remote_source import nginx  # noqa: F401 (the fixture: a real server, stopped at the end)

from tests.conftest import time_limit

FORK = multiprocessing.get_context("fork")

def _packfs(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "packfs", *args], capture_output=True, text=True, timeout=time_limit(300))
    if check:
        assert result.returncode == 0, result.stderr
    return result


def _read_in_a_process(url: str, cache_dir: Path, names: list, seed: int = 0) -> dict:
    script = (
        "import json, random, sys\n"
        "from packfs import PackedFolder\n"
        "names = json.loads(sys.stdin.read())\n"
        "random.Random(int(sys.argv[3])).shuffle(names)\n"
        "with PackedFolder(sys.argv[1], cache_dir=sys.argv[2]) as folder:\n"
        "    for name in names:\n"
        "        folder.read(name)\n"
        "    print(json.dumps(folder.stats()))\n"
    )
    result = subprocess.run([sys.executable, "-c", script, url, str(cache_dir), str(seed)], input=json.dumps(names),
                            capture_output=True, text=True, timeout=time_limit(300))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _listing(cache_dir: Path) -> dict:
    return json.loads(_packfs("cache", "list", "--json", "--cache-dir", str(cache_dir)).stdout)


def _gets(nginx) -> int:  # noqa: F811
    return sum(1 for request in nginx.requests() if request.method == "GET")


def test_an_empty_cache_lists_nothing(tmp_path) -> None:
    for args in (("cache",), ("cache", "list")):
        result = _packfs(*args, "--cache-dir", str(tmp_path / "never-made"))
        assert result.stdout.splitlines()[0] == "nothing cached"
        assert result.stdout.splitlines()[-1].startswith("0 archives, 0 B cached in ")
    assert _listing(tmp_path / "never-made")["archives"] == []
    assert packfs.cache_stats(cache_dir=tmp_path / "never-made").archives == []


def test_the_listing_adds_up_every_process_and_matches_the_servers_log(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    _, files = dataset
    names = sorted(name for name in files if name.startswith("train/"))
    first = _read_in_a_process(served, tmp_path / "cache", names[:200], seed=1)
    second = _read_in_a_process(served, tmp_path / "cache", names[100:], seed=2)  # half of it cached by the first
    assert first["cache_misses"] > 0 and second["cache_hits"] > 0 and second["cache_misses"] > 0
    listing = _listing(tmp_path / "cache")
    assert listing["directory"] == str(tmp_path / "cache") and listing["bound"] == 32 << 30
    [archive] = listing["archives"]
    assert archive["url"] == served and archive["size"] == dataset[0].stat().st_size
    for counter in ("cache_hits", "cache_misses", "requests", "bytes_fetched"):
        assert archive[counter] == first[counter] + second[counter], counter
    assert archive["requests"] == _gets(nginx)  # every GET the server saw, the two opens' included
    assert archive["cached_bytes"] >= sum(len(files[name]) for name in names) - (256 << 10)  # not the open's suffix
    assert archive["first_used"] <= archive["last_used"]
    text = _packfs("cache", "--cache-dir", str(tmp_path / "cache")).stdout.splitlines()
    assert text[0].split() == ["URL", "CACHED", "SIZE", "HITS", "MISSES", "GETS", "FETCHED", "LAST", "USED", "AGE"]
    assert text[1].startswith(served + " ") and f" {archive['requests']} " in text[1]
    assert text[2].startswith("1 archive, ") and str(tmp_path / "cache") in text[2] and "bound 32.0 GiB" in text[2]


def _read_half(url: str, folder: PackedFolder, names: list, results) -> None:
    for name in names:
        folder.read(name)
    results.put(folder.stats())
    # and exit as a DataLoader worker does (os._exit, no atexit handlers), never closing


def test_forked_workers_counts_are_added_once(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    """A DataLoader-like parent opens, forked children read and exit without closing:
    each child's counts are its own (not its parent's again) and reach the file."""
    _, files = dataset
    names = sorted(name for name in files if name.startswith("train/"))
    with PackedFolder(served, cache_dir=tmp_path / "cache") as folder:
        results = FORK.Queue()
        workers = [FORK.Process(target=_read_half, args=(served, folder, part, results))
                   for part in (names[::2], names[1::2])]
        for worker in workers:
            worker.start()
        counted = [results.get(timeout=time_limit(120)) for _ in workers]
        for worker in workers:
            worker.join(time_limit(30))
    [archive] = _listing(tmp_path / "cache")["archives"]
    assert archive["requests"] == _gets(nginx)
    assert archive["cache_misses"] == sum(c["cache_misses"] for c in counted) > 0


def test_clear_one_url_keeps_the_other_and_its_reads_fetch_again(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    archive, files = dataset
    nginx.put("other.ffr", archive.read_bytes())
    other = nginx.url("other.ffr")
    names = sorted(name for name in files if name.startswith("train/"))[:50]
    for url in (served, other):
        _read_in_a_process(url, tmp_path / "cache", names)
    assert sorted(a["url"] for a in _listing(tmp_path / "cache")["archives"]) == sorted([served, other])
    # named as the cache names it: without a user and password
    result = _packfs("cache", "clear", served.replace("http://", "http://user:secret@"), "--cache-dir",
                     str(tmp_path / "cache"))
    assert result.stdout.startswith("removed 1 archive, ")
    [kept] = _listing(tmp_path / "cache")["archives"]
    assert kept["url"] == other and kept["cached_bytes"] > 0
    nginx.clear_log()
    _read_in_a_process(other, tmp_path / "cache", names)
    assert _data_gets(nginx) == []  # still cached
    again = _read_in_a_process(served, tmp_path / "cache", names)
    assert again["cache_misses"] > 0 and _data_gets(nginx) != []  # fetched again
    assert list((tmp_path / "cache" / "tails-v1").iterdir())  # each URL's tail, kept beside the blocks
    assert _packfs("cache", "clear", "--cache-dir", str(tmp_path / "cache")).stdout.startswith("removed 2 archives, ")
    assert _listing(tmp_path / "cache")["archives"] == []
    assert list((tmp_path / "cache" / "tails-v1").iterdir()) == []  # everything cleared: the tails too


def test_clear_while_another_process_reads_serves_right_bytes(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    _, files = dataset
    names = sorted(name for name in files if name.startswith("train/"))
    with PackedFolder(served, cache_dir=tmp_path / "cache") as folder:
        order = list(names)
        for round_ in range(3):
            random.Random(round_).shuffle(order)
            for k, name in enumerate(order):
                if k % 60 == 0:
                    packfs.cache_clear(served, cache_dir=tmp_path / "cache")
                assert folder.read(name) == files[name]


def test_clear_follows_no_symlink(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    _, files = dataset
    _read_in_a_process(served, tmp_path / "cache", sorted(files)[:5])
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "c0").write_bytes(b"keep me")
    (outside / "identity").write_text(repr((served, "x", 1)))
    [entry] = [p for p in (tmp_path / "cache" / "v1").iterdir()]
    (entry / "c99").symlink_to(outside / "c0")  # planted by another user of a shared cache
    (tmp_path / "cache" / "v1" / ("e" * 40)).symlink_to(outside, target_is_directory=True)
    _packfs("cache", "clear", "--cache-dir", str(tmp_path / "cache"))
    assert (outside / "c0").read_bytes() == b"keep me" and (outside / "identity").exists()
    assert not entry.exists()


def test_prefetch_then_a_whole_read_sends_no_data_get(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    archive, files = dataset
    result = _packfs("cache", "prefetch", served, "--progress", "--cache-dir", str(tmp_path / "cache"))
    assert result.stdout.startswith(f"prefetched {served}: fetched ")
    last = result.stderr.splitlines()[-1]  # progress as verify's: the whole run's line last
    assert last.startswith("prefetching 100.0%") and " in " in last and "requests)" in last, result.stderr
    spans = _data_gets(nginx)
    size = archive.stat().st_size
    assert bytes_asked_twice(spans) == 0 and spans
    assert len(spans) <= size // (8 << 20) + 2 * (size // (64 << 20) + 1)  # parts of 8 MiB, cut at chunks
    [listed] = _listing(tmp_path / "cache")["archives"]
    assert listed["requests"] == _gets(nginx) and listed["cached_bytes"] >= size - (256 << 10)
    nginx.clear_log()
    _read_in_a_process(served, tmp_path / "cache", sorted(files))
    _packfs("verify", served, "--cache-dir", str(tmp_path / "cache"))
    assert _data_gets(nginx) == []  # the opens' suffix GETs only
    again = _packfs("cache", "prefetch", served, "--cache-dir", str(tmp_path / "cache"))
    assert "in 1 request," in again.stdout  # the open's; everything else was cached


def test_prefetch_of_a_shard_set_fills_every_shard(nginx, tmp_path) -> None:  # noqa: F811
    rng = random.Random(3)
    names = []
    for shard in range(2):
        files = {f"s{shard}/{k}.bin": rng.randbytes(20_000) for k in range(20)}
        names += sorted(files)
        path = _make_archive(tmp_path, files, f"part-{shard}.ffr")
        nginx.put(path.name, path.read_bytes())
    _packfs("set", str(tmp_path / "all.ffrset"), *(str(tmp_path / f"part-{k}.ffr") for k in range(2)))
    nginx.put("all.ffrset", (tmp_path / "all.ffrset").read_bytes())
    _packfs("cache", "prefetch", nginx.url("all.ffrset"), "--cache-dir", str(tmp_path / "cache"))
    assert sorted(a["url"] for a in _listing(tmp_path / "cache")["archives"]) == sorted(
        nginx.url(f"part-{k}.ffr") for k in range(2))
    nginx.clear_log()
    _read_in_a_process(nginx.url("all.ffrset"), tmp_path / "cache", names)
    assert _data_gets(nginx) == []
    # Clearing the set's manifest URL clears its shards, which are cached under their own URLs.
    cleared = _packfs("cache", "clear", nginx.url("all.ffrset"), "--cache-dir", str(tmp_path / "cache"))
    assert cleared.stdout.startswith("removed 2 archives"), cleared.stdout
    assert _listing(tmp_path / "cache")["archives"] == []


@pytest.mark.parametrize("args", [("cache", "prefetch", "not-a-url.ffr"),
                                  ("cache", "prefetch", "http://127.0.0.1:9/nothing-listens.ffr"),
                                  ("cache", "clear", "/etc/passwd")])
def test_errors_are_one_line(args, tmp_path) -> None:
    result = _packfs(*args, "--cache-dir", str(tmp_path / "cache"), check=False)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error: "), result.stderr


def test_a_torn_counters_slot_leaves_the_previous_counts(tmp_path) -> None:
    directory = str(tmp_path)
    assert cachestats.add_counts(directory, {"cache_hits": 5, "requests": 2}, now=100.0)
    assert cachestats.add_counts(directory, {"cache_hits": 1}, now=200.0)
    counts, first, last = cachestats.read_counts(directory)
    assert (counts["cache_hits"], counts["requests"], first, last) == (6, 2, 100.0, 200.0)
    # The newest slot torn (a writer killed mid-write, a power cut): the older one stands.
    with open(tmp_path / "stats", "r+b") as f:
        f.seek(0)  # two writes: sequence 2 is in slot 0
        f.write(b"\xff" * 20)
    counts, first, last = cachestats.read_counts(directory)
    assert (counts["cache_hits"], last) == (5, 100.0)
    assert cachestats.add_counts(directory, {"cache_hits": 10}, now=300.0)
    counts, _, last = cachestats.read_counts(directory)
    assert (counts["cache_hits"], last) == (15, 300.0)
    assert os.path.getsize(tmp_path / "stats") == 2 * cachestats.COUNTS.size  # never grows
