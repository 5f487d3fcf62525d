"""A shard set against one archive of the same tree, in-process (issue 26's goals):
opening, a warm walk, random reads by path (PackedFolder.read) and by entry
(PackedFiles, as a DataLoader reads), random lookups and stats; and a set of many
shards: its open and a random stat against one archive.

    taskset -c 1 .venv/bin/python bench/shard_sets.py               # 64 shards of 20,000 files
    taskset -c 1 .venv/bin/python bench/shard_sets.py --many 1000 --per-shard 10000

The set and the archive are timed alternately, several rounds, and each figure is the
median of its rounds; ratios are set / archive in speed (above 1: the set is faster).
Drift: the archive's first round timed again at the end.  Mount figures (compiled
daemon) are bench/mount_sets.py's.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import packfs  # noqa: E402
from packfs.core import open_archive  # noqa: E402
from packfs.core.manifest import depth_first_key  # noqa: E402
from packfs.dataset import PackedFiles  # noqa: E402
from packfs.write import Entry, pack_entries  # noqa: E402
from packfs.write.sets import make_set  # noqa: E402


def tree(files: int, size: int, classes: int) -> list[tuple[str, bytes]]:
    rng = random.Random(0)
    items = [(f"train/n{i % classes:05d}/{i:08d}.bin", rng.randbytes(size)) for i in range(files)]
    return sorted(items, key=lambda item: depth_first_key(item[0].encode()))


def pack(items: list[tuple[str, bytes]], out: Path) -> None:
    pack_entries([Entry(path, data, mtime_ns=1) for path, data in items], out, force=True)


def shards(items: list[tuple[str, bytes]], directory: Path, count: int) -> Path:
    size = -(-len(items) // count)
    names = []
    for index in range(count):
        name = directory / f"set-{index:05d}-of-{count:05d}.ffr"
        pack(items[index * size:(index + 1) * size], name)
        names.append(str(name))
    manifest = directory / "set.ffrset"
    if manifest.exists():
        manifest.unlink()
    make_set(str(manifest), names)
    return manifest


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def compare(label: str, unit_count: int, unit: str, one, many, rounds: int) -> dict:
    a, b = [], []
    first = timed(one)
    a.append(first)
    b.append(timed(many))
    for _ in range(rounds - 1):
        a.append(timed(one))
        b.append(timed(many))
    drift = timed(one) / first - 1
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"| {label} | {unit_count / ma:,.0f} {unit}/s | {unit_count / mb:,.0f} {unit}/s | {ma / mb:.2f}x "
          f"| {drift:+.0%} |", flush=True)
    return {"label": label, "one": ma, "set": mb, "ratio": ma / mb, "drift": drift}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--many", type=int, default=0, help="also a set of this many shards")
    parser.add_argument("--per-shard", type=int, default=10_000, help="entries per shard of --many")
    parser.add_argument("--work", default=None)
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="packfs-sets-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {sorted(os.sched_getaffinity(0))}; {args.files} files of {args.size} B; {args.shards} shards; "
          f"{args.rounds} rounds", flush=True)
    items = tree(args.files, args.size, 100)
    pack(items, work / "one.ffr")
    manifest = shards(items, work, args.shards)
    paths = [path for path, _ in items]
    rng = random.Random(1)
    shuffled = paths[:]
    rng.shuffle(shuffled)
    print("\n| figure | one archive | shard set | set/one | drift |\n|---|---|---|---|---|")
    one, many = packfs.PackedFolder(work / "one.ffr"), packfs.PackedFolder(manifest)
    compare("open + close", 20, "opens", lambda: [packfs.PackedFolder(work / "one.ffr").close() for _ in range(20)],
            lambda: [packfs.PackedFolder(manifest).close() for _ in range(20)], args.rounds)
    compare("walk (warm)", len(paths), "files", lambda: sum(len(f) for _, _, f in one.walk()),
            lambda: sum(len(f) for _, _, f in many.walk()), args.rounds)
    compare("read by path, shuffled", len(paths), "files", lambda: [one.read(p) for p in shuffled],
            lambda: [many.read(p) for p in shuffled], args.rounds)
    compare("lookup, shuffled", len(paths), "lookups", lambda: [one.archive.lookup(p) for p in shuffled],
            lambda: [many.archive.lookup(p) for p in shuffled], args.rounds)
    compare("stat, shuffled", len(paths), "stats", lambda: [one.stat(p) for p in shuffled],
            lambda: [many.stat(p) for p in shuffled], args.rounds)
    files_one, files_many = PackedFiles(work / "one.ffr"), PackedFiles(manifest)
    order = list(range(len(files_one)))
    rng.shuffle(order)
    compare("PackedFiles[i], shuffled", len(order), "files", lambda: [files_one[i] for i in order],
            lambda: [files_many[i] for i in order], args.rounds)
    if args.many:
        print(f"\n{args.many} shards of {args.per_shard} entries each:", flush=True)
        big = work / "many"
        big.mkdir(exist_ok=True)
        big_items = [(f"d{i // 1000:06d}/f{i:09d}", b"x") for i in range(args.many * args.per_shard)]
        pack(big_items, big / "one.ffr")
        big_manifest = shards(big_items, big, args.many)
        sample = [path for path, _ in random.Random(2).sample(big_items, 20_000)]
        print("\n| figure | one archive | shard set | set/one | drift |\n|---|---|---|---|---|")
        compare("open + close", 5, "opens", lambda: [open_archive(str(big / "one.ffr")).close() for _ in range(5)],
                lambda: [open_archive(str(big_manifest)).close() for _ in range(5)], args.rounds)
        with open_archive(str(big / "one.ffr")) as a, open_archive(str(big_manifest)) as b:
            [b.stat(b.lookup(p)) for p in sample]  # every shard opened once
            compare("random stat", len(sample), "stats", lambda: [a.stat(a.lookup(p)) for p in sample],
                    lambda: [b.stat(b.lookup(p)) for p in sample], args.rounds)


if __name__ == "__main__":
    main()
