"""FFRecord batch reads: how packfs.ffrecord.FileReader.read should read a batch.

FFRecord reads a batch (``FileReader.read(indices)``) with Linux AIO; packfs has no
libaio and reads with ``pread``.  This measures the ways to do that, on two workloads:

- ``small``: 128 random indices per batch over 20,000 records of 2-16 KiB in 4 files
  (a folder of ``.ffr``, as FFRecord's ImageNet example reads), and ``small,
  consecutive``: the same records in batches of 128 consecutive indices (an unshuffled
  loader);
- ``ffrecord``: FFRecord's ``benchs/bench_io.py`` setting, scaled to one process:
  1 MiB records, batches of 128 consecutive indices (theirs: 100,000 records,
  batch sizes 64-128, 128 processes).

Variants, each returning what ``FileReader.read`` returns (fresh uint8 arrays):

- ``bytes+copy``: ``RecordReader.read`` (one pread per record, as bytes), then a numpy
  copy of each: packfs.ffrecord's implementation before this benchmark;
- ``pread loop``: one pread per record into its array, in the order given;
- ``archive order``: ``FileReader.read`` as shipped: sorted by offset, one preadv per
  run of adjacent records (up to 256 KiB) straight into the arrays, each record's CRC
  right after its run is read;
- ``read_one each``: ``FileReader.read_one`` per index (the per-call overhead);
- ``threads xK``: ``FileReader.read`` on K slices of the batch in a thread pool.

Everything is read from the page cache (the files are read once first): these are
CPU costs, not disk costs.  Each round times every variant once, in turn, so drift
hits all alike; the first variant is timed again at the end to show the drift.

    python bench/ffrecord_batch.py              # about 20 seconds
    python bench/ffrecord_batch.py --rounds 11
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from bisect import bisect_right
from concurrent.futures import ThreadPoolExecutor
from itertools import accumulate
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from packfs import RecordReader  # noqa: E402
from packfs.ffrecord import FileReader, FileWriter  # noqa: E402
from packfs.format import crc32  # noqa: E402

# FFRecord's README (every version in its history, up to 3f6380c) publishes no batch
# read figure; benchs/bench_io.py only plots GB/s for its setting.
FFRECORD_PUBLISHED = ("none: FFRecord's README (all 15 versions, up to 3f6380c) records no batch-read "
                      "figures; benchs/bench_io.py plots GB/s (1 MiB records, batches of 64-128, "
                      "128 processes) without publishing numbers")


def write_files(directory: Path, sizes: list[int], files: int, rng: random.Random) -> list[str]:
    per_file = -(-len(sizes) // files)
    names = []
    for part in range(files):
        chunk = sizes[part * per_file : (part + 1) * per_file]
        name = directory / f"PART_{part:05d}.ffr"
        with FileWriter(name, len(chunk)) as writer:
            for size in chunk:
                writer.write_one(rng.randbytes(size))
        names.append(str(name))
    return names


def variants(reader: FileReader, records: RecordReader, pool: ThreadPoolExecutor,
             threads: int) -> dict[str, Callable[[list[int]], list[np.ndarray]]]:
    shards = records.shards
    starts = [0, *accumulate(shard.record_count for shard in shards)]

    def bytes_copy(batch: list[int]) -> list[np.ndarray]:
        return [np.frombuffer(data, np.uint8).copy() for data in records.read(batch)]

    def pread_loop(batch: list[int]) -> list[np.ndarray]:
        # The plain alternative: one pread per record, in the order given, no sorting
        # and no runs (and none of FileReader.read's checks around the reads).
        arrays = []
        for index in batch:
            shard = bisect_right(starts, index) - 1
            container, local = shards[shard], index - starts[shard]
            start, end = container.record_span(local)
            array = np.empty(end - start, np.uint8)
            container.source.readinto(memoryview(array), start)
            if crc32(array) != container.stored_crc(local):
                raise ValueError(f"record {index}: checksum mismatch")
            arrays.append(array)
        return arrays

    def threaded(batch: list[int]) -> list[np.ndarray]:
        step = -(-len(batch) // threads)
        parts = pool.map(reader.read, [batch[i : i + step] for i in range(0, len(batch), step)])
        return [array for part in parts for array in part]

    return {"bytes+copy": bytes_copy, "pread loop": pread_loop, "archive order": reader.read,
            "read_one each": lambda batch: [reader.read_one(index) for index in batch],
            f"threads x{threads}": threaded}


def time_batches(read: Callable[[list[int]], list[np.ndarray]], batches: list[list[int]]) -> float:
    start = time.perf_counter()
    for batch in batches:
        read(batch)
    return (time.perf_counter() - start) / len(batches)


def run(name: str, paths: list[str], batches: list[list[int]], rounds: int, threads: int) -> dict[str, object]:
    reader, records = FileReader(paths), RecordReader(paths)
    with ThreadPoolExecutor(threads) as pool:
        ways = variants(reader, records, pool, threads)
        expected = [array.tobytes() for array in reader.read(batches[0])]
        for way, read in ways.items():  # same results, and warm
            assert [array.tobytes() for array in read(batches[0])] == expected, way
            time_batches(read, batches)
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(rounds):
            for way, read in ways.items():
                times[way].append(time_batches(read, batches))
        first = next(iter(ways))
        again = statistics.median(time_batches(ways[first], batches) for _ in range(3))
    batch_bytes = statistics.mean(sum(len(array) for array in reader.read(batch)) for batch in batches)
    reader.close()
    records.close()
    medians = {way: statistics.median(values) for way, values in times.items()}
    best = min(medians, key=medians.get)  # type: ignore[arg-type]
    return {
        "workload": name,
        "batch": len(batches[0]),
        "mean batch MiB": round(batch_bytes / 2**20, 3),
        "us per batch (median)": {way: round(value * 1e6, 1) for way, value in medians.items()},
        "GB/s": {way: round(batch_bytes / value / 1e9, 2) for way, value in medians.items()},
        "ratio to archive order": {way: round(value / medians["archive order"], 3) for way, value in medians.items()},
        "fastest": best,
        "drift": f"{first} again at the end: {again * 1e6:.1f} us against its median "
                 f"{medians[first] * 1e6:.1f} us ({again / medians[first] - 1:+.1%})",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    rng = random.Random(20261201)
    cpu = "?"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    results = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as work_name:
        work = Path(work_name)
        (work / "small").mkdir()
        (work / "ffrecord").mkdir()
        small = write_files(work / "small", [rng.randint(2048, 16384) for _ in range(20000)], 4, rng)
        big = write_files(work / "ffrecord", [1 << 20] * 512, 1, rng)
        for path in small + big:  # into the page cache
            with open(path, "rb") as f:
                while f.read(1 << 24):
                    pass
        small_batches = [rng.sample(range(20000), 128) for _ in range(100)]
        in_order = [list(range(start, start + 128)) for start in range(0, 12800, 128)]
        big_batches = [list(range(start, start + 128)) for start in (0, 128, 256, 384)]
        results.append(run("small", small, small_batches, args.rounds, args.threads))
        results.append(run("small, consecutive", small, in_order, args.rounds, args.threads))
        results.append(run("ffrecord", big, big_batches, args.rounds, args.threads))
    print(json.dumps({
        "python": platform.python_version(),
        "cpu": cpu,
        "cpus allowed (sched_getaffinity)": sorted(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "rounds": args.rounds,
        "results": results,
        "FFRecord's published figures (other hardware, libaio, 128 processes)": FFRECORD_PUBLISHED,
    }, indent=2))


if __name__ == "__main__":
    main()
