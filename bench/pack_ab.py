"""pack_folder of two checkouts side by side: the same trees packed by OLD and NEW in
alternating rounds (OLD, NEW, OLD, NEW, ...), each pack in a fresh process pinned to
one CPU, timed inside it (imports excluded).  Prints each case's median for each side,
NEW/OLD, each side's spread (max/min over its rounds) and the drift (OLD's last round
over its first): a ratio inside the spread is noise.

    git worktree add /tmp/packfs-old 892465d
    python bench/pack_ab.py /tmp/packfs-old . --rounds 7 --cpu 1

Cases: 20,000 files of 4 KiB in 100 directories (the per-file cost: opens, fstats,
reads), the same with three --exclude patterns, and one 512 MiB file (the copy loop).
The trees are made, then left for 4 s, so that no file's ctime is recent enough for the
second read a just-written file gets (that costs what the read costs, for those only).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import packfs
src, out, exclude = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
start = time.perf_counter()
packfs.pack_folder(src, out, exclude=exclude, force=True)
print(time.perf_counter() - start)
"""

CASES = {
    "20,000 x 4 KiB": ("small", []),
    "20,000 x 4 KiB, 3 excludes": ("small", ["*.tmp", "./class0042/", "/nothing/here"]),
    "1 x 512 MiB": ("large", []),
}


def make_trees(work: Path) -> None:
    small = work / "small"
    for i in range(20_000):
        directory = small / f"class{i % 100:04d}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{i:08d}.bin").write_bytes(os.urandom(4096))
    large = work / "large"
    large.mkdir()
    with open(large / "big.bin", "wb") as f:
        for _ in range(512):
            f.write(os.urandom(1 << 20))
    subprocess.run(["sync"], check=False)
    time.sleep(4)


def pack_once(repo: Path, src: Path, out: Path, exclude: list[str], cpu: int) -> float:
    result = subprocess.run(["taskset", "-c", str(cpu), sys.executable, "-c", _CHILD, str(repo), str(src), str(out),
                             json.dumps(exclude)], capture_output=True, text=True, check=True)
    return float(result.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cpu", type=int, default=1)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="packfs-pack-ab-"))
    try:
        make_trees(work)
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for case, (tree, exclude) in CASES.items():
                for side, repo in (("old", args.old), ("new", args.new)):
                    elapsed = pack_once(repo.resolve(), work / tree, work / "out.ffr", exclude, args.cpu)
                    times.setdefault((case, side), []).append(elapsed)
        print(f"taskset -c {args.cpu}, {args.rounds} rounds; old={args.old} new={args.new}")
        print(f"{'case':28} {'old s':>8} {'new s':>8} {'new/old':>8} {'old spread':>11} {'new spread':>11} "
              f"{'old drift':>10}")
        for case in CASES:
            old, new = times[(case, "old")], times[(case, "new")]
            print(f"{case:28} {statistics.median(old):8.3f} {statistics.median(new):8.3f} "
                  f"{statistics.median(new) / statistics.median(old):8.3f} {max(old) / min(old):11.3f} "
                  f"{max(new) / min(new):11.3f} {old[-1] / old[0]:10.3f}")
    finally:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
