"""Memory of processes reading an archive at a URL (nginx on loopback): with 1,000
files open at once, and in each of a DataLoader's 8 worker processes, every process
stays under the remote source's memory cap (256 MiB by default) while the archive
is larger than the cap; fetching the whole archive into the disk cache holds a
receive buffer, not what it fetches.  Measured in processes of their own
(tests/remote_memory.py)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import packfs
from packfs.source.remote import RemoteFile
from tests.conftest import require_extra, time_limit
from tests.test_remote_source import nginx  # noqa: F401 (fixture: a real server)

REPO = Path(__file__).resolve().parent.parent
FILES = 1000
CAP = RemoteFile.__init__.__kwdefaults__["memory_cap"]  # the default: 256 MiB


@pytest.fixture(scope="module")
def large_url(nginx, tmp_path_factory) -> tuple[str, int]:  # noqa: F811
    """1,000 files of about 110 KB (an image dataset's) and 40 of 4 MiB: an archive
    larger than the cap (its URL, its size)."""
    root = tmp_path_factory.mktemp("memory")
    rng = random.Random(3)
    for number in range(FILES):
        path = root / "src" / f"{number % 10}" / f"{number:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(rng.randint(90_000, 130_000)))
    for number in range(40):
        (root / "src" / "large").mkdir(exist_ok=True)
        (root / "src" / "large" / f"{number:02d}.bin").write_bytes(os.urandom(4 << 20))
    packfs.pack_folder(root / "src", root / "large.ffr")
    nginx.put("large.ffr", (root / "large.ffr").read_bytes())
    return nginx.url("large.ffr"), (root / "large.ffr").stat().st_size


def _measure(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.remote_memory", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=time_limit(300))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_thousand_files_open_stay_under_the_cap(large_url) -> None:
    url, size = large_url
    assert size > CAP
    found = _measure("open", url)
    print(f"\n1,040 files open: rss {found['rss'] >> 20} MiB, peak {found['peak'] >> 20} MiB, "
          f"own {found['own'] >> 20} MiB (before opening: {found['start_rss'] >> 20} MiB), "
          f"{found['bytes_fetched'] >> 20} MiB fetched, archive {size >> 20} MiB")
    assert found["open"] == FILES + 40
    assert found["peak"] < CAP


def test_each_of_8_dataloader_workers_stays_under_the_cap(large_url) -> None:
    require_extra("torch", "torch")
    url, size = large_url
    found = _measure("loader", url)
    assert found["samples"] == FILES + 40
    workers = found["workers"]
    assert len(workers) == 8
    for worker in workers:
        print(f"\nworker {worker['pid']}: rss {worker['rss'] >> 20} MiB (at start {worker['start_rss'] >> 20}), "
              f"peak {worker['peak'] >> 20} MiB, own {worker['own'] >> 20} MiB")
        # A forked worker's RSS counts the pages it shares with its parent (torch's
        # own, about 220 MB, before any read): its own pages, and what its RSS grew
        # by while reading, are what packfs holds.
        assert worker["own"] < CAP and worker["peak"] - worker["start_rss"] < CAP
    print(f"parent: rss {found['parent']['rss'] >> 20} MiB, own {found['parent']['own'] >> 20} MiB")


def test_fetching_into_the_cache_holds_none_of_what_it_fetches(large_url, tmp_path) -> None:
    # The windows of a block-aware epoch are fetched in groups of 64 MiB of GETs in
    # flight at once: written to the cache as they arrive, none of it held here.
    url, size = large_url
    found = _measure("prefetch", url, str(tmp_path / "cache"))
    print(f"\nprefetch of {size >> 20} MiB: peak {found['peak'] >> 20} MiB, "
          f"grew {(found['peak'] - found['start_rss']) >> 20} MiB, {found['requests']} requests")
    assert found["fetched"] >= size - (1 << 20)
    assert found["peak"] - found["start_rss"] < 16 << 20
