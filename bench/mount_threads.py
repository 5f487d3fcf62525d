"""Warm reads from 8 threads through the compiled daemon: buffered against unbuffered,
and where the time goes.

Issue 16's "8 threads warm" row (0.38 of the plain directory) is buffered ``open()``:
each open sends the daemon one IOCTL (Python's ``isatty()``), the only request of a warm
pass.  This runs, side by side, the plain directory and the mount, each read by 8
threads with ``open()`` and with ``open(..., buffering=0)`` (no request at all), as
medians of rounds alternating the two trees, with ratios (plain time / mount time,
higher is better) and a drift check.  ``--perf`` also records a system-wide profile of
one buffered 8-thread pass through the mount and prints where the CPU time went, by
process and by function (needs perf).

    python bench/mount_threads.py --files 20000 --rounds 5 --perf

CPU placement: reader threads and daemon threads float over the CPUs this process may
use (printed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import packfs  # noqa: E402
from compare import Mount, read_file as read_buffered, read_file_unbuffered as read_unbuffered  # noqa: E402


def make_tree(root: Path, files: int, size: int) -> list[str]:
    marker = root / f".complete-{files}-{size}"
    names = [f"d{i % 200:03d}/f{i:06d}.bin" for i in range(files)]
    if not marker.exists():
        shutil.rmtree(root, ignore_errors=True)
        for name in names:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(os.urandom(size))
        marker.touch()
    return names


def one_pass(pool: ThreadPoolExecutor, reader, paths: list[str]) -> float:
    start = time.perf_counter()
    list(pool.map(reader, paths, chunksize=64))
    return time.perf_counter() - start


def measure(pool: ThreadPoolExecutor, root: Path, names: list[str]) -> dict[str, float]:
    paths = [str(root / name) for name in names]
    one_pass(pool, read_unbuffered, paths)  # warm: the page cache, dentries, attributes
    return {"buffered_s": one_pass(pool, read_buffered, paths), "unbuffered_s": one_pass(pool, read_unbuffered, paths)}


def profile(pool: ThreadPoolExecutor, root: Path, names: list[str], out: Path) -> None:
    """A system-wide perf profile of one buffered pass; prints the top of its report."""
    paths = [str(root / name) for name in names]
    one_pass(pool, read_unbuffered, paths)
    data = out / "mount_threads.perf.data"
    recorder = subprocess.Popen(["perf", "record", "-a", "-g", "-o", str(data), "--", "sleep", "60"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    for _ in range(3):
        one_pass(pool, read_buffered, paths)
    recorder.send_signal(2)
    recorder.wait()
    # By process: the readers and the daemon are both "python"; the daemon is the mount's pid.
    for sort in ("pid", "pid,dso,sym"):
        report = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", sort, "--stdio",
                                 "--percent-limit", "1.5", "-g", "none"], capture_output=True, text=True)
        lines = [line for line in report.stdout.splitlines() if line.strip() and not line.startswith("#")]
        print(f"\nperf report --sort {sort} (>= 1.5% of samples):")
        print("\n".join(lines[:30]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--size", type=int, default=65536)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--perf", action="store_true")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "packfs-threads")
    args = parser.parse_args()
    src = args.work / "src"
    names = make_tree(src, args.files, args.size)
    archive = args.work / "tree.ffr"
    if not archive.exists():
        packfs.pack_folder(src, archive)
    mountpoint = args.work / "mnt"
    command = [sys.executable, "-m", "packfs", "mount", "-f", "--binding", "lowlevel", str(archive), str(mountpoint)]
    results: dict[str, list[dict[str, float]]] = {"plain": [], "mount": []}
    with Mount("packfs", command, mountpoint) as mounted, ThreadPoolExecutor(args.threads) as pool:
        for _ in range(args.rounds):
            results["plain"].append(measure(pool, src, names))
            results["mount"].append(measure(pool, mountpoint, names))
        drift = measure(pool, src, names)
        if args.perf:
            print(f"reader pid {os.getpid()}, daemon pid {mounted.process.pid}")
            profile(pool, mountpoint, names, args.work)
    medians = {name: {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
               for name, rounds in results.items()}
    print(f"\n{args.files} files of {args.size} bytes, {args.threads} reader threads, CPUs "
          f"{sorted(os.sched_getaffinity(0))} shared by readers and daemon; medians of {args.rounds} rounds")
    for key in ("buffered_s", "unbuffered_s"):
        plain, mount = medians["plain"][key], medians["mount"][key]
        print(f"{key[:-2]:>10}: plain {plain:.3f} s, mount {mount:.3f} s, ratio {plain / mount:.2f}")
    print("drift check: plain again at the end: " + ", ".join(
        f"{key[:-2]} {drift[key] / medians['plain'][key]:.2f}x its median" for key in drift))
    return 0


if __name__ == "__main__":
    sys.exit(main())
