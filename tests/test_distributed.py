"""Training from a URL on several nodes: ranks as separate OS processes
(tests/distributed_rank.py), each a PackedDataset over nginx with a
ResumableDistributedSampler and a DataLoader of 2 worker processes."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import packfs
from tests.conftest import require_extra, time_limit
from tests.test_remote_source import nginx  # noqa: F401 (fixture: a real server)

REPO = Path(__file__).resolve().parent.parent
SAMPLES = 480  # a multiple of 2, 3 and 4: every rank's share is whole, with no padding
SEED = 7


@pytest.fixture(scope="module")
def samples_url(nginx, tmp_path_factory) -> tuple[str, int]:  # noqa: F811
    """The URL of an archive of SAMPLES files of 20-60 KB, each starting with its
    number in 8 digits, and the bytes of all of them."""
    root = tmp_path_factory.mktemp("samples")
    rng = random.Random(SEED)
    total = 0
    for number in range(SAMPLES):
        path = root / "src" / f"{number % 7}" / f"{number:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = b"%08d" % number + os.urandom(rng.randint(20_000, 60_000))
        path.write_bytes(data)
        total += len(data)
    packfs.pack_folder(root / "src", root / "samples.ffr")
    nginx.put("samples.ffr", (root / "samples.ffr").read_bytes())
    return nginx.url("samples.ffr"), total


def _run_ranks(url: str, world: int, epochs: int, out: Path, *extra_per_rank, cache: str = "off") -> list[dict]:
    """Run ``world`` ranks; ``cache``: "off" (nodes without a disk cache: what each rank
    fetches is what it reads) or "shared" (the ranks of one node, one cache)."""
    processes = []
    for rank in range(world):
        extra = list(extra_per_rank[rank]) if extra_per_rank else []
        env = dict(os.environ, PACKFS_CACHE_DIR="off" if cache == "off" else str(out / "cache"))
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "tests.distributed_rank", url, str(rank), str(world), str(SEED), str(epochs),
             str(out / f"rank{rank}.json"), *extra], cwd=REPO, stderr=subprocess.PIPE, text=True, env=env))
    for process in processes:
        _, errors = process.communicate(timeout=time_limit(120))
        assert process.returncode == 0, errors[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world)]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_sample_once_per_epoch_across_ranks(samples_url, tmp_path: Path, world: int) -> None:
    require_extra("torch", "torch")
    url, total = samples_url
    first = _run_ranks(url, world, 2, tmp_path)
    for epoch in ("0", "1"):
        seen = [number for result in first for number in result["epochs"][epoch]]
        assert sorted(seen) == list(range(SAMPLES))  # each sample exactly once, across the ranks
    assert all(result["epochs"]["0"] != result["epochs"]["1"] for result in first)  # set_epoch reshuffles
    for result in first:
        assert result["workers"] == 2
        # Each rank fetched about its share of two epochs, not the whole dataset each
        # epoch: the share, plus what opening and the table's pages cost, plus the
        # gaps a shared GET takes between neighbours.
        share = 2 * total / world
        print(f"world {world}: fetched {result['bytes_fetched']} bytes, {result['bytes_fetched'] / share:.3f} x the share")
        assert 0.9 * share <= result["bytes_fetched"] <= 1.5 * share, (result["bytes_fetched"], share)
    (tmp_path / "again").mkdir()
    again = _run_ranks(url, world, 2, tmp_path / "again")
    assert [result["epochs"] for result in again] == [result["epochs"] for result in first]  # deterministic


def test_a_run_stopped_mid_epoch_resumes_with_exactly_the_rest(samples_url, tmp_path: Path) -> None:
    require_extra("torch", "torch")
    url, _ = samples_url
    world, stop = 2, 5
    whole = _run_ranks(url, world, 2, tmp_path)
    (tmp_path / "stopped").mkdir()
    states = [tmp_path / f"state{rank}.json" for rank in range(world)]
    stopped = _run_ranks(url, world, 2, tmp_path / "stopped",
                         *[("--stop-after", str(stop), "--state", str(states[rank])) for rank in range(world)])
    (tmp_path / "resumed").mkdir()
    resumed = _run_ranks(url, world, 2, tmp_path / "resumed", *[("--resume", str(states[rank])) for rank in range(world)])
    for rank in range(world):
        before, after, expected = stopped[rank]["epochs"], resumed[rank]["epochs"], whole[rank]["epochs"]
        assert len(before["0"]) == stop * 8  # 8 a batch
        assert before["0"] + after["0"] == expected["0"]  # the rest of the epoch, in the same order
        assert after["1"] == expected["1"]  # and the next epoch as if never stopped


def test_a_state_from_another_world_is_refused() -> None:
    require_extra("torch", "torch")
    from packfs.torch import ResumableDistributedSampler

    saved = ResumableDistributedSampler(range(12), num_replicas=2, rank=1, seed=3)
    saved.set_epoch(4)
    state = saved.state_dict(2)
    resumed = ResumableDistributedSampler(range(12), num_replicas=2, rank=1)  # another seed: the state's is taken
    resumed.load_state_dict(state)
    assert list(resumed) == list(saved)[2:] and len(resumed) == 4
    resumed.set_epoch(5)
    assert len(list(resumed)) == 6  # other epochs whole
    for other, key in ((ResumableDistributedSampler(range(12), num_replicas=3, rank=1), "num_replicas"),
                       (ResumableDistributedSampler(range(12), num_replicas=2, rank=0), "rank"),
                       (ResumableDistributedSampler(range(10), num_replicas=2, rank=1), "dataset_size")):
        with pytest.raises(ValueError, match=key):
            other.load_state_dict(state)
    with pytest.raises(ValueError, match="starts at sample 7"):
        ResumableDistributedSampler(range(12), num_replicas=2, rank=1).load_state_dict({**state, "start": 7})


def test_the_ranks_of_one_node_share_one_cache(samples_url, tmp_path: Path) -> None:
    """Four ranks on one node, two epochs, one cache directory: the dataset is fetched
    about once in all (each block by one rank; the second epoch from the cache)."""
    require_extra("torch", "torch")
    url, total = samples_url
    results = _run_ranks(url, 4, 2, tmp_path, cache="shared")
    for epoch in ("0", "1"):
        assert sorted(number for result in results for number in result["epochs"][epoch]) == list(range(SAMPLES))
    fetched = sum(result["bytes_fetched"] for result in results)
    print(f"4 ranks, 2 epochs, one cache: fetched {fetched / total:.3f} x the dataset")
    assert fetched <= 1.15 * total + 4 * (1 << 20)  # + each rank's open and table pages
