"""`packfs ls` / `packfs find` on one directory of many files, timed as whole processes.

Builds an archive holding ``big/`` with N files (default 300,000) with
``packfs.pack_entries`` from generated entries (no tree on disk is needed for that),
then writes the same tree to disk for GNU ``ls -l``, and times each command as a
separate process (Python start-up included), output to /dev/null.  Reports the median
of ``--runs`` runs and each command's ratio to GNU ``ls -l`` of the tree on disk, which
stays stable on a noisy shared machine where absolute times drift.

    python bench/cli_listing.py                       # 300,000 files, 5 runs
    python bench/cli_listing.py --files 30000 --runs 3
    python bench/cli_listing.py --cpu 1               # pin every process to CPU 1 (taskset)

The archive and the tree are kept in ``--work`` (default: a directory under /tmp named
after N) and reused by later runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import packfs  # noqa: E402

MTIME_NS = 1_700_000_000 * 10**9


def name_of(i: int) -> str:
    return f"file-{i:07d}.dat"


def build(work: Path, files: int) -> tuple[Path, Path]:
    archive, tree = work / "listing.ffr", work / "tree"
    done = work / "done"
    if done.exists():
        return archive, tree
    shutil.rmtree(work, ignore_errors=True)
    (tree / "big").mkdir(parents=True)
    # Sizes and mtimes vary per file (mtimes across a few hours), as in a real folder.
    sizes = [(i * 7919) % 4096 for i in range(files)]
    mtimes = [MTIME_NS + (i * 104729 % 20000) * 10**9 + 123 for i in range(files)]
    entries = [packfs.Entry("big", kind="dir", mtime_ns=MTIME_NS)]
    for i in range(files):
        entries.append(packfs.Entry(f"big/{name_of(i)}", data=b"x" * sizes[i], uid=0, gid=0,
                                    mtime_ns=mtimes[i]))
    packfs.pack_entries(entries, archive)
    for i in range(files):
        path = tree / "big" / name_of(i)
        with open(path, "wb") as f:
            f.write(b"x" * sizes[i])
        os.utime(path, ns=(mtimes[i], mtimes[i]))
    done.touch()
    return archive, tree


def time_command(argv: list[str], runs: int, env: dict[str, str]) -> float | None:
    """Median seconds of ``runs`` runs, or None if the command fails (an option that
    an older packfs lacks, when measuring a baseline)."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        if subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env).returncode:
            return None
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cpu", type=int, default=None, help="pin each process to this CPU with taskset")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path("/tmp") / f"packfs-bench-listing-{args.files}"
    archive, tree = build(work, args.files)
    pin = ["taskset", "-c", str(args.cpu)] if args.cpu is not None else []
    env = {**os.environ, "LC_ALL": "C", "TZ": "UTC"}
    packfs_cmd = pin + [sys.executable, "-m", "packfs"]
    commands = {
        "GNU ls -l (disk)": pin + ["ls", "-l", str(tree / "big")],
        "GNU ls (disk)": pin + ["ls", str(tree / "big")],
        "packfs ls -l": packfs_cmd + ["ls", "-l", str(archive), "big"],
        "packfs ls -ln": packfs_cmd + ["ls", "-ln", str(archive), "big"],
        "packfs ls": packfs_cmd + ["ls", str(archive), "big"],
        "packfs ls -lR": packfs_cmd + ["ls", "-lR", str(archive)],
        "packfs find": packfs_cmd + ["find", str(archive)],
        "packfs find --type f": packfs_cmd + ["find", str(archive), "--type", "f"],
        "packfs find --name": packfs_cmd + ["find", str(archive), "--name", "*7.dat"],
        "python -c pass": pin + [sys.executable, "-c", "pass"],
    }
    # Warm the page cache (and the tree's dentries) before timing anything.
    for argv in commands.values():
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    medians = {label: time_command(argv, args.runs, env) for label, argv in commands.items()}
    reference = medians["GNU ls -l (disk)"]
    assert reference is not None
    print(f"{args.files:,} files in one directory; median of {args.runs} runs"
          f"{f', pinned to CPU {args.cpu} (taskset)' if pin else ''}; LC_ALL=C, output to /dev/null")
    print(f"{'command':24s} {'seconds':>8s} {'us/entry':>9s} {'x GNU ls -l':>12s}")
    for label, seconds in medians.items():
        if seconds is None:
            print(f"{label:24s} {'failed':>8s}")
            continue
        print(f"{label:24s} {seconds:8.3f} {seconds / args.files * 1e6:9.2f} {seconds / reference:12.2f}")


if __name__ == "__main__":
    main()
