"""The first ``os.walk`` through a mount after the page cache is dropped, side by side in
one run: the plain directory, ``packfs mount --binding lowlevel`` (and, with ``--before
PYTHONPATH``, the same daemon from another packfs checkout, for an A/B), squashfuse_ll
and the kernel's squashfs.

Each run of each system: mount, drop the page cache, dentries and inodes, time one
``os.walk`` of the whole tree; the plain directory is timed the same way just before
each system, and the figure is the ratio plain time / system time (higher is better),
the median of ``--repeat`` runs, with the plain directory's first and last medians as a
drift check.  Needs root (drop_caches, mount -t squashfs), mksquashfs and squashfuse_ll;
what is missing is reported as skipped.  The daemons run pinned with ``taskset -c
--cpu``; the walk runs on the other CPUs.

    python bench/cold_walk.py --files 200000 --folders 400 --repeat 5
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import packfs  # noqa: E402
from compare import drop_caches  # noqa: E402


def make_tree(root: Path, files: int, folders: int) -> None:
    marker = root / f".complete-{files}-{folders}"
    if marker.exists():
        return
    if root.exists():
        shutil.rmtree(root)
    for i in range(files):
        folder = root / f"group{i % 8}" / f"d{i % folders:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:07d}.bin").write_bytes(b"x" * (i % 100))
    marker.touch()


def cold_walk(root: Path) -> float:
    drop_caches()
    start = time.perf_counter()
    count = sum(len(files) for _, _, files in os.walk(root))
    seconds = time.perf_counter() - start
    assert count > 0, root
    return seconds


def mounted(command: list[str], mountpoint: Path) -> subprocess.Popen | None:
    mountpoint.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not os.path.ismount(mountpoint):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{command} did not mount")
        time.sleep(0.005)
    return process


def unmount(mountpoint: Path, process: subprocess.Popen | None) -> None:
    if process is None:
        subprocess.run(["umount", str(mountpoint)], check=True)
    else:
        subprocess.run(["fusermount", "-u", str(mountpoint)], check=True)
        process.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--folders", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cpu", type=int, default=1, help="the CPU the daemons are pinned to")
    parser.add_argument("--before", help="PYTHONPATH of another packfs checkout, mounted as 'packfs (before)'")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "packfs-cold-walk")
    parser.add_argument("--threads-one", action="store_true",
                        help="also packfs with --threads 1 (one request at a time, as squashfuse_ll serves)")
    args = parser.parse_args()
    work = args.work
    src = work / "src"
    make_tree(src, args.files, args.folders)
    archive, squash = work / "tree.ffr", work / "tree.sqsh"
    if not archive.exists():
        packfs.pack_folder(src, archive)
    if not squash.exists() and shutil.which("mksquashfs"):
        subprocess.run(["mksquashfs", str(src), str(squash), "-noappend", "-quiet", "-no-progress"], check=True,
                       stdout=subprocess.DEVNULL)
    pin = ["taskset", "-c", str(args.cpu)]
    python = [sys.executable, "-m", "packfs", "mount", "-f", "--binding", "lowlevel", str(archive)]
    systems: dict[str, list[str] | None] = {"packfs (lowlevel)": pin + python}
    if args.threads_one:
        systems["packfs (lowlevel, --threads 1)"] = pin + python[:-1] + ["--threads", "1", python[-1]]
    if args.before:
        systems["packfs (before)"] = ["env", f"PYTHONPATH={args.before}"] + pin + python
    skipped = []
    if shutil.which("squashfuse_ll") and squash.exists():
        systems["squashfuse_ll"] = pin + ["squashfuse_ll", "-f", str(squash)]
    else:
        skipped.append("squashfuse_ll (not installed)")
    if squash.exists() and os.geteuid() == 0:
        systems["kernel squashfs"] = None
    else:
        skipped.append("kernel squashfs (not root, or no mksquashfs)")
    walk_cpus = sorted(os.sched_getaffinity(0) - {args.cpu}) or [args.cpu]
    os.sched_setaffinity(0, walk_cpus)
    plain_times: list[float] = []
    ratios: dict[str, list[float]] = {name: [] for name in systems}
    times: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(args.repeat):
        for name, command in systems.items():
            plain = cold_walk(src)
            plain_times.append(plain)
            mountpoint = work / ("m-" + "".join(c for c in name if c.isalnum()))
            if command is None:
                mountpoint.mkdir(parents=True, exist_ok=True)
                subprocess.run(["mount", "-t", "squashfs", "-o", "loop,ro", str(squash), str(mountpoint)], check=True)
                process = None
            else:
                process = mounted(command + [str(mountpoint)], mountpoint)
            try:
                seconds = cold_walk(mountpoint)
            finally:
                unmount(mountpoint, process)
            times[name].append(seconds)
            ratios[name].append(plain / seconds)
    first, last = plain_times[: len(systems)], plain_times[-len(systems):]
    print(f"`{' '.join(['python'] + sys.argv)}`: {args.files:,} files in {args.folders} folders; daemons pinned "
          f"to CPU {args.cpu}, the walk on CPUs {walk_cpus}; median of {args.repeat} runs.")
    print()
    print("| system | cold walk s | ratio plain/system (higher is better) |")
    print("|---|---|---|")
    print(f"| plain directory | {statistics.median(plain_times):.3f} | 1.00 |")
    for name in systems:
        print(f"| {name} | {statistics.median(times[name]):.3f} | {statistics.median(ratios[name]):.2f} |")
    print()
    print(f"Drift: the plain directory's first round {statistics.median(first):.3f} s, last round "
          f"{statistics.median(last):.3f} s.")
    if skipped:
        print("Skipped: " + "; ".join(skipped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
