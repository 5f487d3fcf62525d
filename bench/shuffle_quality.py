"""Shuffle quality against requests (issue 36): what a block-aware epoch
(packfs.windows: windows of adjacent records, pools of windows shuffled together)
gives up against a uniform shuffle, next to shard-format shuffles, with the GETs per
epoch each implies.

    .venv/bin/python bench/shuffle_quality.py                  # the issue's layout, ~10 s
    .venv/bin/python bench/shuffle_quality.py --classes 1000 --per-class 100

The layout is an ImageFolder's as packed (classes stored one after another): by
default 100 classes x 100 files of 50-150 KB (about 1 GiB), the issue's table.  No
server and no archive: every order here is deterministic (packfs's is the very
WindowPlan the sampler uses, over the records' sizes), so nothing is timed and there
is no CPU placement to state.  Each mode runs 3 epochs of each of 3 seeds; the table
gives the median over those 9 epochs and, in brackets, their min-max.  The uniform
figure is also given analytically (drawing 64 of C classes x P files without
replacement); "drift" re-runs the first uniform epoch at the end and must match.

Columns:
  classes/batch   distinct classes in a batch of 64 (mean over the epoch's batches);
                  the goal is >= 0.9 x uniform
  |disp|/n        mean |position in the epoch - position in the archive| / n
                  (uniform: 1/3)
  GETs/epoch      ranged GETs an epoch implies from a URL with a node cache large
                  enough (packfs: 16 KiB cache blocks, GETs of at most 8 MiB, a batch's
                  files within 64 KiB of each other sharing one; shard formats: one GET
                  per shard or chunk)
  first batch MiB bytes fetched before the first batch can be made (packfs: the
                  windows the first batch touches; shard formats: the first shard or
                  chunk of each of 4 workers)

The shard-format models: litData (``FullShuffle``: chunks permuted per epoch, each of
4 workers reading its interval of chunks, samples shuffled within a chunk, a batch
from one worker: litdata/streaming/shuffle.py) with 64 MiB chunks; webdataset (shards
in a shuffled order, 4 workers each reading its shards in turn through a
``shuffle(1000)`` buffer, a batch from one worker) with shards of 100 files.
MosaicML streaming's py1e (what the issue measured at 47.6 classes and 130 GETs) is
not modelled here: its number is the issue's measurement.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from packfs.windows import WindowPlan  # noqa: E402

BATCH = 64
WORKERS = 4
BLOCK = 16 << 10  # packfs.source.cache.BLOCK_BYTES
CHUNK = 64 << 20  # packfs.source.cache.CHUNK_BYTES: a GET never crosses one
PART = 8 << 20  # RemoteFile.part_bytes: the largest GET
GAP = 64 << 10  # RemoteFile.coalesce_gap
SEEDS = (0, 1, 2)
EPOCHS = (0, 1, 2)


def layout(classes: int, per_class: int, seed: int = 36) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(class of each file, its record's offset, its size), in archive order."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(50_000, 150_001, classes * per_class).astype(np.int64)
    starts = np.cumsum(sizes) - sizes + 4096  # after a header
    return np.repeat(np.arange(classes), per_class), starts, sizes


def classes_per_batch(order: np.ndarray, labels: np.ndarray) -> float:
    full = len(order) // BATCH * BATCH
    batches = labels[order[:full]].reshape(-1, BATCH)
    batches = np.sort(batches, axis=1)
    return float(((np.diff(batches, axis=1) != 0).sum(axis=1) + 1).mean())


def uniform_expectation(classes: int, per_class: int) -> float:
    """E[distinct classes] in BATCH files drawn without replacement from classes x
    per_class: classes x (1 - P(a class gets none))."""
    total = classes * per_class
    none = 1.0
    for k in range(BATCH):
        none *= (total - per_class - k) / (total - k)
    return classes * (1 - none)


def displacement(order: np.ndarray) -> float:
    return float(np.abs(np.arange(len(order)) - order).mean() / len(order))


def window_gets(plan: WindowPlan, order: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> tuple[int, float]:
    """(GETs, first batch MiB) of an epoch in ``order`` read window by window through
    the node cache: each window's blocks not yet fetched, as runs cut at 64 MiB chunks
    and 8 MiB parts."""
    fetched = np.zeros(int((starts + sizes).max()) // BLOCK + 2, dtype=bool)
    gets = 0
    seen: set[int] = set()
    first_batch = {int(w) for w in plan.window_of[order[:BATCH]]}
    first_bytes = 0
    for window in plan.window_of[order]:
        window = int(window)
        if window in seen:
            continue
        seen.add(window)
        members = plan.members(window)
        low, high = int(starts[members].min()), int((starts[members] + sizes[members]).max())
        blocks = np.arange(low // BLOCK, (high - 1) // BLOCK + 1)
        missing = blocks[~fetched[blocks]]
        fetched[blocks] = True
        if window in first_batch:
            first_bytes += len(missing) * BLOCK
        run_start = None
        previous = None
        for block in missing.tolist():
            if (previous is None or block != previous + 1 or block // (CHUNK // BLOCK) != run_start // (CHUNK // BLOCK)
                    or block - run_start >= PART // BLOCK):
                gets += 1
                run_start = block
            previous = block
    return gets, first_bytes / 2 ** 20


def sample_gets(order: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> tuple[int, float]:
    """GETs of reading batch by batch as asked (today's PackedDataset): a batch's files
    in offset order, neighbours within 64 KiB sharing a GET."""
    gets = 0
    for at in range(0, len(order), BATCH):
        batch = np.sort(order[at:at + BATCH])
        gaps = starts[batch[1:]] - (starts[batch[:-1]] + sizes[batch[:-1]])
        gets += 1 + int((gaps >= GAP).sum())
    return gets, float(sizes[order[:BATCH]].sum()) / 2 ** 20


def shard_cut(sizes: np.ndarray, shard_bytes: int | None = None, shard_files: int | None = None) -> np.ndarray:
    """The shard of each file when cut in archive order by bytes or by count."""
    if shard_files is not None:
        return np.arange(len(sizes)) // shard_files
    return (np.cumsum(sizes) - sizes) // int(shard_bytes)


def litdata_order(shard: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Chunks permuted, split in WORKERS contiguous intervals, each worker's stream its
    chunks in turn with the samples of each shuffled; batches taken from the workers in
    turn, each whole from one."""
    chunks = rng.permutation(int(shard.max()) + 1)
    streams = []
    for interval in np.array_split(chunks, WORKERS):
        stream = [rng.permutation(np.flatnonzero(shard == chunk)) for chunk in interval]
        streams.append(np.concatenate(stream) if stream else np.zeros(0, np.int64))
    return _round_robin(streams)


def webdataset_order(shard: np.ndarray, rng: np.random.Generator, buffer: int = 1000) -> np.ndarray:
    """Shards shuffled, dealt to WORKERS in turn, each worker's stream through a
    shuffle buffer of ``buffer`` samples (webdataset's ``shuffle(n)``: a random one
    of the buffer out for each one in)."""
    shards = rng.permutation(int(shard.max()) + 1)
    streams = []
    for worker in range(WORKERS):
        source = np.concatenate([np.flatnonzero(shard == s) for s in shards[worker::WORKERS]]).tolist()
        pool: list[int] = []
        out = []
        for sample in source:
            pool.append(sample)
            if len(pool) >= buffer:
                k = int(rng.integers(len(pool)))
                pool[k], pool[-1] = pool[-1], pool[k]
                out.append(pool.pop())
        rng.shuffle(pool)
        out += pool
        streams.append(np.array(out, dtype=np.int64))
    return _round_robin(streams)


def _round_robin(streams: list[np.ndarray]) -> np.ndarray:
    batches = [[stream[at:at + BATCH] for at in range(0, len(stream), BATCH)] for stream in streams]
    out = []
    for turn in range(max(len(b) for b in batches)):
        for worker in batches:
            if turn < len(worker):
                out.append(worker[turn])
    return np.concatenate(out)


def first_shards_mib(shard: np.ndarray, sizes: np.ndarray, order: np.ndarray) -> float:
    """Bytes of the shards the first batch of each worker needs (each worker's first)."""
    needed = {int(shard[order[at]]) for at in range(0, min(len(order), WORKERS * BATCH), BATCH)}
    return float(sum(sizes[shard == s].sum() for s in needed)) / 2 ** 20


def run(name: str, make: Callable[[int, int], tuple[np.ndarray, int, float]], labels: np.ndarray) -> dict:
    classes, moved, gets, first = [], [], [], []
    for seed in SEEDS:
        for epoch in EPOCHS:
            order, epoch_gets, first_mib = make(seed, epoch)
            assert sorted(order.tolist()) == list(range(len(labels))), name  # every sample once
            classes.append(classes_per_batch(order, labels))
            moved.append(displacement(order))
            gets.append(epoch_gets)
            first.append(first_mib)
    return {"name": name, "classes": classes, "moved": moved, "gets": gets, "first": first}


def show(row: dict, uniform: float) -> str:
    def cell(values: list, digits: int) -> str:
        return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"
    ratio = statistics.median(row["classes"]) / uniform
    return (f"| {row['name']} | {cell(row['classes'], 1)} | {ratio:.2f} | {cell(row['moved'], 3)} | "
            f"{statistics.median(row['gets']):,.0f} | {statistics.median(row['first']):.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--windows", default="2,4,8,16", help="window sizes, MiB")
    parser.add_argument("--pools", default="4,8,16,32,64", help="windows per pool")
    parser.add_argument("--first-pools", default="0", help="windows in the first pool, a pool of its own (0: none)")
    options = parser.parse_args()
    labels, starts, sizes = layout(options.classes, options.per_class)
    n = len(labels)
    print(f"{options.classes} classes x {options.per_class} files, {sizes.sum() / 2 ** 30:.2f} GiB, "
          f"batches of {BATCH}; median [min-max] of {len(SEEDS)} seeds x {len(EPOCHS)} epochs")
    expected = uniform_expectation(options.classes, options.per_class)
    rows = []

    def uniform(seed: int, epoch: int) -> tuple[np.ndarray, int, float]:
        order = np.random.default_rng([seed, epoch]).permutation(n)
        return (order, *sample_gets(order, starts, sizes))

    rows.append(run("uniform shuffle (window_bytes=None)", uniform, labels))
    first_uniform = rows[0]["classes"][0]
    measured_uniform = statistics.median(rows[0]["classes"])
    for mib in [float(v) for v in options.windows.split(",")]:
        plan = WindowPlan(np.zeros(n, np.int64), starts, sizes, int(mib * 2 ** 20))
        for pool in [int(v) for v in options.pools.split(",")]:
            for first_pool in [int(v) for v in options.first_pools.split(",")]:
                def windowed(seed: int, epoch: int, plan: WindowPlan = plan, pool: int = pool,
                             first_pool: int = first_pool) -> tuple:
                    order = plan.epoch_order(seed, epoch, pool, first_pool)
                    return (order, *window_gets(plan, order, starts, sizes))
                ramp = f", the first {first_pool}" if first_pool else ""
                rows.append(run(f"windows of {mib:g} MiB, {pool} a pool{ramp} ({plan.windows} windows)", windowed,
                                labels))
    for name, shard in (("litData-style: 64 MiB chunks, shuffled within", shard_cut(sizes, shard_bytes=64 << 20)),
                        ("webdataset-style: shards of 100 files, shuffle(1000)", shard_cut(sizes, shard_files=100))):
        def model(seed: int, epoch: int, shard: np.ndarray = shard, name: str = name) -> tuple:
            rng = np.random.default_rng([seed, epoch, 7])
            order = litdata_order(shard, rng) if name.startswith("lit") else webdataset_order(shard, rng)
            return order, int(shard.max()) + 1, first_shards_mib(shard, sizes, order)
        rows.append(run(name, model, labels))
    print(f"\nuniform expectation (analytic): {expected:.2f} classes a batch; measured {measured_uniform:.2f}\n")
    print("| mode | classes/batch | x uniform | \\|disp\\|/n | GETs/epoch | first batch MiB |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(show(row, expected))
    drift = classes_per_batch(np.random.default_rng([SEEDS[0], EPOCHS[0]]).permutation(n), labels)
    print(f"\ndrift check: the first uniform epoch again gives {drift:.3f} classes a batch "
          f"({'same' if drift == first_uniform else 'DIFFERENT'} as the first run)")


if __name__ == "__main__":
    main()
