"""LOOKUPs in large directories through the compiled daemon: its RSS and their time, for
two or more packfs trees side by side (issue 23: 20,000 missing names in a directory
of 1,000,000 took the daemon from 14 to 115 MiB).

    taskset -c 1 python bench/mount_lookups.py --tree old=/tmp/packfs-old --tree new=. \\
        [--entries 1000000] [--directories 1] [--name-length 10] [--lookups 20000] [--rounds 5]

A tree is a packfs checkout with its C extension built in place (``python setup.py
build_ext --inplace``; ``git archive OLD | tar -x -C DIR`` makes one of a commit).  The
archive (``--entries`` empty files in ``--directories`` directories) is packed once; then, round by
round and tree by tree (interleaved, so that a machine's drift hits every tree alike),
each tree's daemon is mounted and ``os.stat`` is called on ``--lookups`` names that are
not there, then (a new mount) on as many that are, each name once (the kernel keeps
both answers).  Reported per tree: the daemon's VmRSS before and after, the time of one
``stat`` (medians over rounds), the ratio of each median to the first tree's, and each
tree's spread (max/min of its rounds: a ratio inside it is noise).  The client and the
daemon run on the CPUs this is started on (``taskset`` them together).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def pack(out: Path, entries: int, directories: int, name_length: int) -> None:
    """``entries`` empty files f<9 digits><padding>, spread over directories d0, d1, ..."""
    script = ("import sys, packfs; n, k, pad = int(sys.argv[2]), int(sys.argv[3]), 'x' * (int(sys.argv[4]) - 10); "
              "packfs.pack_entries((packfs.Entry(f'd{i % k}/f{i:09d}{pad}') for i in range(n)), sys.argv[1], "
              "count=n)")
    subprocess.run([sys.executable, "-c", script, str(out), str(entries), str(directories), str(name_length)],
                   check=True, env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent)))


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line.split()[1] for line in status if line.startswith("VmRSS"))) / 1024


def one_run(tree: str, archive: Path, mountpoint: Path, names: list[str], directories: int
            ) -> tuple[float, float, float]:
    """(RSS before, RSS after, µs per stat) of one mount of ``archive`` by ``tree``."""
    env = dict(os.environ, PYTHONPATH=tree)
    subprocess.run([sys.executable, "-m", "packfs", "mount", str(archive), str(mountpoint), "--binding", "lowlevel"],
                   env=env, check=True, capture_output=True, cwd="/")
    try:
        where = subprocess.run([sys.executable, "-c", f"from packfs.fuse import state_file; "
                                f"print(state_file({str(mountpoint)!r}, '.pid'))"],
                               env=env, check=True, capture_output=True, text=True, cwd="/").stdout.strip()
        pid = int(Path(where).read_text())
        for directory in range(directories):
            os.stat(mountpoint / f"d{directory}")
        before = rss_mib(pid)
        paths = [os.path.join(mountpoint, name) for name in names]
        start = time.perf_counter()
        for path in paths:
            try:
                os.stat(path)
            except FileNotFoundError:
                pass
        elapsed = time.perf_counter() - start
        return before, rss_mib(pid), elapsed / len(paths) * 1e6
    finally:
        subprocess.run([sys.executable, "-m", "packfs", "unmount", str(mountpoint)], env=env, capture_output=True,
                       cwd="/")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", required=True, metavar="LABEL=PATH")
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--directories", type=int, default=1)
    parser.add_argument("--name-length", type=int, default=10)
    parser.add_argument("--lookups", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    trees = dict(item.split("=", 1) for item in args.tree)
    trees = {label: str(Path(path).resolve()) for label, path in trees.items()}
    work = Path(tempfile.mkdtemp(dir=args.work))
    archive = work / "wide.ffr"
    pack(archive, args.entries, args.directories, args.name_length)
    k = args.directories
    padding = "x" * (args.name_length - 10)
    results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    print(f"{args.entries:,} entries in {k:,} directories, names of {args.name_length} bytes, {args.lookups:,} "
          f"lookups; CPUs {sorted(os.sched_getaffinity(0))}", flush=True)
    for round_ in range(args.rounds):
        rng = random.Random(round_)
        missing = (rng.randrange(10**9) for _ in range(args.lookups))
        kinds = {"missing": [f"d{i % k}/f{i:09d}{padding}.not" for i in missing],
                 "present": [f"d{i % k}/f{i:09d}{padding}" for i in rng.sample(range(args.entries), args.lookups)]}
        for kind, names in kinds.items():
            for label, tree in trees.items():
                mountpoint = work / f"m-{label}"
                mountpoint.mkdir(exist_ok=True)
                results.setdefault((kind, label), []).append(one_run(tree, archive, mountpoint, names, k))
    first = next(iter(trees))
    for kind in ("missing", "present"):
        base = statistics.median(us for *_, us in results[(kind, first)])
        for label in trees:
            rows = results[(kind, label)]
            times = [us for *_, us in rows]
            print(f"{kind:8} {label:>6}: daemon RSS {statistics.median(b for b, _, _ in rows):6.1f} -> "
                  f"{statistics.median(a for _, a, _ in rows):6.1f} MiB; stat {statistics.median(times):5.1f} us "
                  f"(x{statistics.median(times) / base:.2f} of {first}; spread {max(times) / min(times):.2f}; "
                  f"rounds {', '.join(f'{t:.1f}' for t in times)})")


if __name__ == "__main__":
    main()
