"""Block-aware reading (issue 36): the window plan (packfs/windows.py), the
WindowedSampler, and an epoch from a URL through real DataLoaders (2 ranks as OS
processes, 2 workers each, one node cache), GETs counted from nginx's log."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import packfs
from packfs.windows import WindowPlan
from packfs.write.shards import pack_shards
from tests.conftest import require_extra, time_limit
from tests.remote_servers import bytes_asked_twice
from tests.test_remote_source import nginx  # noqa: F401 (fixture: a real server)

torch = require_extra("torch", "torch")
from packfs.torch import PackedDataset, PackedImageFolder, ResumableDistributedSampler, WindowedSampler  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SAMPLES = 600
WINDOW = 1 << 20  # ~24 windows of the ~24 MiB below
POOL = 4


def _plan(sizes: list[int], window: int, objects: list[int] | None = None) -> WindowPlan:
    sizes_array = np.array(sizes, dtype=np.int64)
    starts = np.cumsum(sizes_array) - sizes_array
    return WindowPlan(np.zeros(len(sizes), np.int64) if objects is None else objects, starts, sizes_array, window)


# -- the plan -----------------------------------------------------------------------------

def test_windows_are_runs_of_adjacent_records_of_about_the_size_asked() -> None:
    rng = np.random.default_rng(1)
    sizes = rng.integers(1_000, 9_000, 5_000).tolist() + [250_000] + rng.integers(1_000, 9_000, 500).tolist()
    plan = _plan(sizes, 64_000)
    assert sorted(plan.order.tolist()) == list(range(len(sizes)))
    biggest = max(sizes)
    for window in range(plan.windows):
        members = plan.members(window)
        # Adjacent records, in archive order (here, selection order), and every one of
        # them in this window.
        assert members.tolist() == list(range(members[0], members[-1] + 1))
        assert (plan.window_of[members] == window).all()
        total = sum(sizes[i] for i in members)
        assert total == plan.window_sizes[window]
        # Records that start within one 64,000-byte stretch: under the size plus the
        # last one's; the record larger than a window is alone.
        assert total < 64_000 + biggest and (len(members) == 1 or total < 64_000 + 9_000)
        if window < plan.windows - 1 and plan.window_sizes[window + 1] < 64_000:
            assert total > 64_000 - 9_000  # none cut short but the last and the one before the large record
    assert plan.windows == pytest.approx(sum(sizes) / 64_000, abs=2)


def test_windows_never_join_records_of_two_objects_and_follow_archive_order() -> None:
    # Three shards, the selection listed out of archive order.
    rng = np.random.default_rng(2)
    objects = np.repeat([2, 0, 1], 300)
    sizes = rng.integers(5_000, 15_000, 900)
    starts = np.concatenate([np.cumsum(sizes[k:k + 300]) - sizes[k:k + 300] for k in (0, 300, 600)])
    shuffle = rng.permutation(900)
    plan = WindowPlan(objects[shuffle], starts[shuffle], sizes[shuffle], 100_000)
    for window in range(plan.windows):
        members = plan.members(window)
        assert len(set(objects[shuffle][members].tolist())) == 1
        assert (np.diff(starts[shuffle][members]) > 0).all()
    # windows in object order: shard 0's first
    assert set(objects[shuffle][plan.members(0)].tolist()) == {0}


def test_an_epoch_is_every_sample_once_deterministic_and_differs_by_epoch_and_seed() -> None:
    plan = _plan([10_000 + i % 7 * 1_000 for i in range(3_000)], 200_000)
    first = plan.epoch_order(5, 0, 8)
    assert sorted(first.tolist()) == list(range(3_000))
    assert (first == plan.epoch_order(5, 0, 8)).all()
    assert not (first == plan.epoch_order(5, 1, 8)).all()
    assert not (first == plan.epoch_order(6, 0, 8)).all()
    # Pool after pool: the samples of the first pool's windows come first, all of them.
    lengths = np.diff(plan.bounds)
    windows_in_order = plan.window_of[first]
    first_pool = set(windows_in_order[:1].tolist())
    count = 0
    for window in windows_in_order:
        if len(first_pool) == 8 and int(window) not in first_pool:
            break
        first_pool.add(int(window))
        count += 1
    assert len(first_pool) == 8 and count == sum(lengths[list(first_pool)])
    # Within a pool the samples are mixed: not window after window.
    assert (np.diff(windows_in_order[:count]) != 0).sum() > count // 2
    # One pool of all windows is a uniform shuffle's coverage of the whole selection.
    assert sorted(plan.epoch_order(5, 0, plan.windows).tolist()) == list(range(3_000))
    with pytest.raises(ValueError, match="windows_per_pool"):
        plan.epoch_order(5, 0, 0)
    with pytest.raises(ValueError, match="window_bytes"):
        _plan([1, 2], 0)


# -- the sampler --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory) -> PackedDataset:
    out = tmp_path_factory.mktemp("windows") / "w.ffr"
    rng = random.Random(4)
    packfs.pack_entries([packfs.Entry(f"{i % 5}/{i:05d}.bin", b"%08d" % i + bytes(rng.randint(2_000, 6_000)))
                         for i in range(1_003)], out)
    dataset = PackedDataset(out, "**/*.bin")
    assert dataset.window_bytes is None  # local: read as asked, by default
    return dataset


def test_a_first_pool_of_its_own_then_pools_of_equal_counts() -> None:
    sizes = np.full(1_000, 100)
    plan = WindowPlan(np.zeros(1_000), np.arange(1_000) * 100, sizes, 1_000)  # 100 windows of 10
    for first in (0, 8, 99, 100, 150):
        order, starts, pools = plan.epoch_pools(3, 1, 40, first)
        assert sorted(order.tolist()) == list(range(1_000))
        assert (order == plan.epoch_order(3, 1, 40, first)).all()
        counts = [len(pool) for pool in pools]
        # A first pool short of every window stands alone; then pools of at most 40.
        expected = ([first] if 0 < first < 100 else []) + [len(part) for part in np.array_split(
            np.arange(100 - (first if 0 < first < 100 else 0)), -(-(100 - (first if 0 < first < 100 else 0)) // 40))]
        assert counts == expected, (first, counts)
        assert sorted(np.concatenate(pools).tolist()) == list(range(100))
        bounds = list(starts) + [1_000]
        for k, pool in enumerate(pools):  # each pool's samples are its windows' samples
            assert set(plan.window_of[order[bounds[k]:bounds[k + 1]]].tolist()) == set(pool.tolist())
    # No first pool apart: the order of a plain pooled epoch.
    assert (plan.epoch_pools(3, 1, 40, 0)[0] == plan.epoch_order(3, 1, 40)).all()
    with pytest.raises(ValueError, match="first_pool"):
        plan.epoch_pools(3, 1, 40, -1)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_take_every_sample_once_with_equal_counts(local_dataset: PackedDataset, world: int) -> None:
    samplers = [WindowedSampler(local_dataset, window_bytes=40_000, windows_per_pool=3, num_replicas=world,
                                rank=rank, seed=9) for rank in range(world)]
    for epoch in (0, 1):
        shares = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            shares.append(list(sampler))
            assert len(shares[-1]) == len(sampler) == sampler.num_samples
        assert len({len(share) for share in shares}) == 1
        together = [index for share in shares for index in share]
        # Padded as DistributedSampler pads: each sample once, a few of the first again.
        assert set(together) == set(range(len(local_dataset)))
        assert len(together) - len(local_dataset) == (-len(local_dataset)) % world
        # Rank r's i-th sample is the order's (i * world + r)-th: all ranks in one pool.
        plan = samplers[0].plan
        order = np.resize(plan.epoch_order(9, epoch, 3, samplers[0].first_pool), len(together))
        assert [share[i] for i in range(len(shares[0])) for share in shares] == order.tolist()
    alone = WindowedSampler(local_dataset, window_bytes=40_000)  # no process group: a world of one
    assert (alone.num_replicas, alone.rank) == (1, 0) and sorted(alone) == list(range(len(local_dataset)))
    dropped = WindowedSampler(local_dataset, window_bytes=40_000, num_replicas=2, rank=1, drop_last=True)
    assert len(list(dropped)) == len(local_dataset) // 2


def test_a_windowed_epoch_resumes_mid_way_with_exactly_the_rest(local_dataset: PackedDataset) -> None:
    sampler = WindowedSampler(local_dataset, window_bytes=30_000, windows_per_pool=2, num_replicas=2, rank=1, seed=4)
    sampler.set_epoch(3)
    whole = list(sampler)
    state = sampler.state_dict(100)
    resumed = WindowedSampler(local_dataset, window_bytes=30_000, windows_per_pool=2, num_replicas=2, rank=1, seed=4)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert list(resumed) == whole[100:] and len(resumed) == len(whole) - 100
    # Stopped again in the resumed epoch: the count adds up.
    again = WindowedSampler(local_dataset, window_bytes=30_000, windows_per_pool=2, num_replicas=2, rank=1, seed=4)
    again.load_state_dict(resumed.state_dict(50))
    assert list(again) == whole[150:]
    again.set_epoch(4)
    assert len(list(again)) == len(whole)  # the next epoch whole
    # Another pool size, first pool, window size or kind of sampler is another order: refused.
    for other in (WindowedSampler(local_dataset, window_bytes=30_000, windows_per_pool=3, num_replicas=2, rank=1),
                  WindowedSampler(local_dataset, window_bytes=30_000, windows_per_pool=2, num_replicas=2, rank=1,
                                  first_pool=3),
                  WindowedSampler(local_dataset, window_bytes=20_000, windows_per_pool=2, num_replicas=2, rank=1),
                  ResumableDistributedSampler(local_dataset, num_replicas=2, rank=1)):
        with pytest.raises(ValueError):
            other.load_state_dict(state)
    with pytest.raises(ValueError, match="no window_bytes"):
        sampler.load_state_dict(ResumableDistributedSampler(local_dataset, num_replicas=2, rank=1).state_dict(0))
    with pytest.raises(ValueError, match="windows_per_pool"):
        WindowedSampler(local_dataset, windows_per_pool=0, num_replicas=1, rank=0)


# -- from a URL ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def windows_url(nginx, tmp_path_factory) -> tuple[str, Path]:  # noqa: F811
    """An archive of SAMPLES files of 20-60 KB (about 24 MiB), each starting with its
    number in 8 digits, on nginx; and the local copy."""
    root = tmp_path_factory.mktemp("windows-url")
    rng = random.Random(36)
    for number in range(SAMPLES):
        path = root / "src" / f"{number % 6}" / f"{number:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"%08d" % number + os.urandom(rng.randint(20_000, 60_000)))
    packfs.pack_folder(root / "src", root / "w.ffr")
    nginx.put("w.ffr", (root / "w.ffr").read_bytes())
    return nginx.url("w.ffr"), root / "w.ffr"


def _data_gets(nginx, with_paths: bool = False) -> list:  # noqa: F811
    """(start, end) of each ranged GET for data in nginx's log (with its path first:
    (path, (start, end))): all but the suffix requests (``bytes=-N``) of opens, which
    every process makes for itself."""
    spans: list = []
    for request in nginx.requests():
        if request.method == "GET" and request.range and not request.range.startswith("bytes=-"):
            first, last = request.range.split("=", 1)[1].split("-")
            span = (int(first), int(last) + 1)
            spans.append((request.path, span) if with_paths else span)
    return spans


@pytest.mark.parametrize("persistent", [True, False])
def test_two_ranks_of_two_workers_fetch_each_window_once_and_epoch_2_nothing(
        nginx, windows_url, tmp_path: Path, persistent: bool) -> None:  # noqa: F811
    url, local = windows_url
    sync = tmp_path / "sync"
    sync.mkdir()
    env = dict(os.environ, PACKFS_CACHE_DIR=str(tmp_path / "cache"))  # one node: one cache
    nginx.clear_log()
    ranks = [subprocess.Popen([sys.executable, "-m", "tests.windowed_rank", url, str(rank), "2", str(WINDOW),
                               str(POOL), str(tmp_path / f"rank{rank}.json"), "1" if persistent else "0",
                               "--sync", str(sync)], cwd=REPO, stderr=subprocess.PIPE, text=True, env=env)
             for rank in range(2)]
    try:
        deadline = time_limit(120)
        import time
        start = time.monotonic()
        while not all((sync / f"done{rank}").exists() for rank in range(2)):
            assert time.monotonic() - start < deadline and all(rank.poll() is None for rank in ranks), \
                [rank.stderr.read()[-3000:] for rank in ranks if rank.poll() is not None]
            time.sleep(0.02)
        epoch1 = _data_gets(nginx)
        all_epoch1 = [r for r in nginx.requests() if r.method == "GET"]
        nginx.clear_log()
        (sync / "go").write_bytes(b"")
        for rank in ranks:
            _, errors = rank.communicate(timeout=time_limit(120))
            assert rank.returncode == 0, errors[-3000:]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait()
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    windows = results[0]["windows"]
    assert 15 < windows < 40
    for epoch in ("0", "1"):
        assert sorted(n for result in results for n in result["epochs"][epoch]) == list(range(SAMPLES))
        assert len(results[0]["epochs"][epoch]) == len(results[1]["epochs"][epoch])
        assert all(len(result["workers"][epoch]) == 2 for result in results)
    # Epoch 1: GETs by window, not by sample (600 samples), each byte fetched once on
    # the node although 4 workers and 2 ranks read the windows at the same time.  A
    # window is one GET; it may be split around blocks another process was fetching
    # (those are waited for, not fetched again), hence up to 2 a window.
    print(f"epoch 1: {len(epoch1)} data GETs for {windows} windows, {len(all_epoch1)} GETs in all")
    assert 0 < len(epoch1) <= 2 * windows
    assert bytes_asked_twice(epoch1) == 0
    data_start, data_end = _data_area(local)
    fetched = sum(end - start for start, end in epoch1)
    assert fetched <= data_end - data_start + 2 * windows * (16 << 10)
    # Epoch 2: nothing fetched.  Workers that start again (persistent_workers=False)
    # each open the archive again: that costs its 64-byte footer (the same-object
    # check, packfs.source.tails), no data.
    epoch2 = [r for r in nginx.requests() if r.method == "GET"]
    assert _data_gets(nginx) == []
    if persistent:
        assert epoch2 == []
    else:
        assert len(epoch2) <= 4 and all(r.range.startswith("bytes=-") and r.bytes_sent < 1024 for r in epoch2), epoch2


def _data_area(local: Path) -> tuple[int, int]:
    with packfs.PackedFolder(local) as folder:
        return folder.archive.data_area


def test_a_window_is_fetched_whole_at_its_first_read_and_rss_stays_flat(nginx, windows_url) -> None:  # noqa: F811
    url, _ = windows_url
    nginx.clear_log()
    dataset = PackedDataset(url, "**/*.bin", window_bytes=WINDOW)
    plan = dataset.window_plan()
    assert dataset.window_plan(WINDOW) is plan
    with pytest.raises(ValueError, match="fetch windows of"):
        dataset.window_plan(2 * WINDOW)
    nginx.clear_log()
    order = plan.epoch_order(0, 0, 2)
    rss = []
    for at in range(0, len(order), 16):
        batch = order[at:at + 16]
        for index, data in zip(batch, dataset[batch]):
            assert int(data[:8]) == int(dataset.path(int(index)).rsplit("/", 1)[1][:5])
        with open("/proc/self/statm") as statm:
            rss.append(int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    gets = _data_gets(nginx)
    assert len(gets) <= plan.windows and bytes_asked_twice(gets) == 0
    # About 24 MiB of windows went through this process: it holds none of them.
    growth = max(rss[len(rss) // 4:]) - rss[len(rss) // 4]
    assert growth < (6 << 20), f"RSS grew by {growth / 2 ** 20:.1f} MiB over {plan.windows} windows"
    # Read again: the cache has every window.
    nginx.clear_log()
    assert dataset[list(range(0, SAMPLES, 7))]
    assert _data_gets(nginx) == []


def test_default_is_windows_for_a_url_and_none_locally(nginx, windows_url) -> None:  # noqa: F811
    url, local = windows_url
    assert PackedDataset(url).window_bytes == 8 << 20
    assert PackedDataset(url, window_bytes=None).window_bytes is None
    assert PackedDataset(local).window_bytes is None
    assert PackedDataset(local, window_bytes=1 << 20).window_bytes == 1 << 20
    with pytest.raises(ValueError, match="window_bytes"):
        PackedDataset(local, window_bytes="big")
    sampler = PackedDataset(url, "**/*.bin").sampler(num_replicas=1, rank=0)
    assert isinstance(sampler, WindowedSampler) and sampler.plan.window_bytes == 8 << 20
    assert sorted(sampler) == list(range(SAMPLES))


def test_without_a_disk_cache_a_windowed_dataset_reads_as_asked(nginx, windows_url, tmp_path) -> None:  # noqa: F811
    url, _ = windows_url
    dataset = PackedDataset(url, "**/*.bin", window_bytes=WINDOW, cache_dir=False)
    assert dataset.files.folder.archive.prefetch(dataset.files.entries[:10]) == 0
    assert [int(data[:8]) for data in dataset[[0, 1, 2]]] == [int(dataset.path(i).rsplit("/", 1)[1][:5])
                                                               for i in range(3)]


def test_a_shard_set_at_urls_has_windows_per_shard(nginx, tmp_path: Path) -> None:  # noqa: F811
    src = tmp_path / "src"
    rng = random.Random(5)
    for number in range(300):
        path = src / f"c{number // 60}" / f"{number:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"%08d" % number + os.urandom(rng.randint(10_000, 30_000)))
    (tmp_path / "out").mkdir()
    stats = pack_shards(src, tmp_path / "out" / "s.ffr", shards=3)
    urls = []
    for record in stats.shards:
        nginx.put(record.file, (tmp_path / "out" / record.file).read_bytes())
        urls.append(nginx.url(record.file))
    dataset = PackedImageFolder(urls, root="", loader=lambda data: int(data[:8]), window_bytes=256 << 10)
    plan = dataset.window_plan()
    bases = dataset.files.folder.archive.bases
    shard_of = np.searchsorted(np.asarray(bases[:-1]), dataset.files.entries, side="right") - 1
    assert len(set(shard_of.tolist())) == 3
    for window in range(plan.windows):
        assert len(set(shard_of[plan.members(window)].tolist())) == 1  # one object a window
    nginx.clear_log()
    sampler = dataset.sampler(windows_per_pool=2, num_replicas=1, rank=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=10, sampler=sampler, num_workers=2,
                                         multiprocessing_context="fork")
    seen = [int(number) for numbers, _ in loader for number in numbers]
    assert sorted(seen) == list(range(300))
    by_shard: dict[str, list[tuple[int, int]]] = {}
    for path, span in _data_gets(nginx, with_paths=True):
        by_shard.setdefault(path, []).append(span)
    gets = sum(len(spans) for spans in by_shard.values())
    print(f"a set of 3 shards at URLs: {gets} data GETs for {plan.windows} windows of 300 files")
    assert 3 <= plan.windows and gets <= 2 * plan.windows and gets < 60
    assert all(bytes_asked_twice(spans) == 0 for spans in by_shard.values())


def test_a_prefetch_holds_at_most_a_quarter_of_memory_cap_at_once(nginx, windows_url, tmp_path: Path) -> None:  # noqa: F811
    """A process's peak RSS while it prefetches the rest of the 24 MiB archive in one
    call, with memory_cap 8 MiB: the windows go through the process 2 MiB at a time (a
    fresh process, warmed up by a first small prefetch; its peak, VmHWM, reset before
    the call through /proc/self/clear_refs)."""
    url, _ = windows_url
    script = (
        "import sys\n"
        "from packfs.dataset import PackedFiles\n"
        "files = PackedFiles(sys.argv[1], '**/*.bin', window_bytes=1 << 20,\n"
        "                    storage_options={'memory_cap': 8 << 20}, cache_dir=sys.argv[2])\n"
        "archive = files.folder.archive\n"
        "def kib(name):\n"
        "    with open('/proc/self/status') as status:\n"
        "        return next(int(line.split()[1]) for line in status if line.startswith(name + ':'))\n"
        "archive.prefetch(files.entries[:20])  # connections and threads made, modules imported\n"
        "with open('/proc/self/clear_refs', 'w') as clear:\n"
        "    clear.write('5')  # the peak is now the current RSS\n"
        "now = kib('VmRSS')\n"
        "fetched = archive.prefetch(files.entries)\n"
        "print(fetched, (kib('VmHWM') - now) * 1024)\n")
    done = subprocess.run([sys.executable, "-c", script, url, str(tmp_path / "cache")], cwd=REPO,
                          capture_output=True, text=True, timeout=time_limit(120))
    assert done.returncode == 0, done.stderr[-3000:]
    fetched, growth = map(int, done.stdout.split())
    print(f"prefetched {fetched / 2 ** 20:.1f} MiB, peak RSS grew {growth / 2 ** 20:.1f} MiB")
    assert fetched > 20 << 20
    # Held at once, the 22 MiB would all be resident (measured: 21.9 MiB).  In groups,
    # the peak rises by about 8 MiB whatever memory_cap (8 and 32 MiB measured): not
    # the windows' bytes, which is what this tells apart.
    assert growth < fetched // 2


def test_auto_windows_are_fetched_whole_only_under_a_windowed_sampler(nginx, windows_url) -> None:  # noqa: F811
    """A dataset at a URL made with the default window_bytes="auto" reads file by file
    under any other order (a uniform shuffle fetching whole windows would fetch every
    window in its first batches, and a dataset larger than the cache over and over);
    a WindowedSampler over it switches whole windows on."""
    url, _ = windows_url
    dataset = PackedDataset(url, "**/*.bin")
    assert dataset.window_bytes == 8 << 20 and not dataset.files.fetch_windows
    nginx.clear_log()
    scattered = [3, 170, 333, 480]
    assert [int(data[:8]) for data in dataset[scattered]] == [
        int(dataset.path(index).rsplit("/", 1)[1][:5]) for index in scattered]
    gets = _data_gets(nginx)
    files = [(start, end) for start, end in gets if start > 0]  # less the header's page of record offsets
    assert len(files) == 4 and max(end - start for start, end in files) < 100_000 and len(gets) <= 5
    sampler = dataset.sampler(num_replicas=1, rank=0, fetch_ahead=False)
    assert dataset.files.fetch_windows
    nginx.clear_log()
    dataset[[10]]
    assert sum(end - start for start, end in _data_gets(nginx)) > 1 << 20  # its window, whole
    assert len(list(sampler)) == SAMPLES


def test_the_sampler_fetches_each_pool_ahead_of_its_reads(nginx, windows_url) -> None:  # noqa: F811
    """The process that draws the order fetches the next pool's windows while the
    current pool is read: once the order is drawn (a DataLoader draws it ahead of its
    workers), every window arrives in the cache, each byte once, and the reads fetch
    nothing more."""
    import time

    url, local = windows_url
    dataset = PackedDataset(url, "**/*.bin", window_bytes=WINDOW)
    sampler = WindowedSampler(dataset, windows_per_pool=POOL, first_pool=2, num_replicas=1, rank=0)
    plan = sampler.plan
    order, starts, pools = plan.epoch_pools(sampler.seed, 0, POOL, 2)
    assert len(pools[0]) == 2 and len(pools) > 2
    nginx.clear_log()
    drawn = iter(sampler)
    first = [next(drawn) for _ in range(int(starts[1]))]  # the first pool: it and the next are asked
    deadline = time.monotonic() + time_limit(60)
    wanted = set(np.concatenate(pools[:2]).tolist())
    while not all(dataset.files._fetched is not None and dataset.files._fetched[w] for w in wanted):
        assert time.monotonic() < deadline, "the first two pools were not fetched ahead"
        time.sleep(0.02)
    assert dataset.files._fetched is not None and not dataset.files._fetched.all()  # no further yet
    rest = list(drawn)  # every later pool asked as its predecessor starts
    assert first + rest == order.tolist()
    while not dataset.files._fetched.all():
        assert time.monotonic() < deadline, "not every pool was fetched ahead"
        time.sleep(0.02)
    fetched = _data_gets(nginx)
    assert bytes_asked_twice(fetched) == 0 and len(fetched) <= 2 * plan.windows
    nginx.clear_log()
    for at in range(0, SAMPLES, 64):
        dataset[order[at:at + 64]]
    assert _data_gets(nginx) == []
