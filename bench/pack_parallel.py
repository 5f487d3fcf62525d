"""Packing on every core (`packfs pack -j N`) against tar and mksquashfs, side by side in
one run.

Two trees, read warm (every file read once before the timings, so the page cache holds
them and reading is not disk-bound):

- the 20,000-JPEG tree of bench/compare.py (``make_tree``: about 65 KB per file):
  ``tar c`` into a file, ``tar c`` followed by an fsync of that file (packfs fsyncs the
  archive before publishing it), and ``packfs pack -j 1``;
- ``--small`` files of 1 KiB in 200 folders: ``packfs pack -j 1``, ``-j 2`` and
  ``mksquashfs SRC OUT -noappend -processors 2`` (its default: gzip; and, for
  reference, with compression off).

Every command runs under ``taskset -c CPUS`` (default: the first two cores this process
may use), its wall time measured from outside (start-up included), the variants in
turn within a round, ``--repeat`` rounds; medians, ratios to the first variant of each
tree, files/s, and a drift check: the first variant timed again after the rounds.  The
-j 1 and -j 2 archives are compared byte for byte.

    python bench/pack_parallel.py                         # 20,000 JPEGs, 20,000 small files
    python bench/pack_parallel.py --small 100000 --repeat 7 --cpus 0,1

Writes ``pack_parallel.json`` and ``pack_parallel.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import make_tree  # noqa: E402

PACKFS = [sys.executable, "-m", "packfs"]
REPO = Path(__file__).resolve().parent.parent


def make_small_tree(root: Path, count: int) -> None:
    marker = root / f".complete-{count}"
    if marker.exists():
        return
    if root.exists():
        shutil.rmtree(root)
    block = bytes(range(256)) * 4
    for index in range(count):
        folder = root / f"d{index % 200:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{index:07d}.bin").write_bytes(block[:1016] + index.to_bytes(8, "little"))
    marker.touch()


def warm(root: Path) -> int:
    """Read every file once; the number of files."""
    files = 0
    for directory, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(directory, name), "rb") as f:
                while f.read(1 << 20):
                    pass
            files += 1
    return files


def timed(command: list[str], cpus: str, clean: list[Path]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system of the command and the processes it
    waited for, such as packfs's workers) of one run."""
    for path in clean:
        if path.exists():
            path.unlink()
    full = ["taskset", "-c", cpus, *command]
    started = time.perf_counter()
    process = subprocess.Popen(full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    assert process.stderr is not None
    errors = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    for path in clean:  # at most one output on the disk at a time (the JPEG tree's is 1.4 GB)
        path.unlink(missing_ok=True)
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(full)} failed: {errors.decode()[-500:]}")
    return seconds, usage.ru_utime + usage.ru_stime


def run_group(name: str, files: int, variants: dict[str, tuple[list[str], list[Path]]], cpus: str,
              repeat: int) -> dict:
    times: dict[str, list[float]] = {label: [] for label in variants}
    cpu: dict[str, list[float]] = {label: [] for label in variants}
    for label, (command, clean) in variants.items():  # once untimed: caches, first-run costs
        timed(command, cpus, clean)
    for _ in range(repeat):
        for label, (command, clean) in variants.items():
            wall, used = timed(command, cpus, clean)
            times[label].append(wall)
            cpu[label].append(used)
    first = next(iter(variants))
    drift = timed(variants[first][0], cpus, variants[first][1])[0]
    medians = {label: statistics.median(values) for label, values in times.items()}
    base = medians[first]
    return {
        "tree": name, "files": files, "first": first,
        "runs": times, "median": medians, "cpu_runs": cpu,
        "cpu_median": {label: statistics.median(values) for label, values in cpu.items()},
        "ratio_to_first": {label: value / base for label, value in medians.items()},
        "files_per_second": {label: files / value for label, value in medians.items()},
        "drift": drift / base,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--small", type=int, default=20000, help="1 KiB files in the second tree")
    parser.add_argument("--repeat", type=int, default=5)
    default_cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))[:2]))
    parser.add_argument("--cpus", default=default_cpus, help="taskset's CPU list for every command")
    parser.add_argument("--work", type=Path, default=Path("/tmp/packfs-bench-parallel"))
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    cpus_count = len(args.cpus.split(","))
    load_before = os.getloadavg()
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    jpegs, small = work / "jpeg", work / "small"
    make_tree(jpegs, args.images, 200, 0, 0)
    make_small_tree(small, args.small)
    groups = []

    jpeg_files = warm(jpegs)
    tar_out, tar_synced, packed = work / "jpeg.tar", work / "jpeg-synced.tar", work / "jpeg-j1.ffr"
    groups.append(run_group("JPEG", jpeg_files, {
        "tar c": (["tar", "cf", str(tar_out), "-C", str(jpegs), "."], [tar_out]),
        "tar c + fsync": (["sh", "-c", f"tar cf {tar_synced} -C {jpegs} . && sync {tar_synced}"], [tar_synced]),
        "packfs pack -j 1": ([*PACKFS, "pack", "-q", "-j", "1", str(jpegs), str(packed)], [packed]),
    }, args.cpus, args.repeat))

    small_files = warm(small)
    one, two, squash, plain = (work / "small-j1.ffr", work / "small-j2.ffr", work / "small.sqfs",
                               work / "small-plain.sqfs")
    variants = {
        "packfs pack -j 1": ([*PACKFS, "pack", "-q", "-j", "1", str(small), str(one)], [one]),
        "packfs pack -j 2": ([*PACKFS, "pack", "-q", "-j", "2", str(small), str(two)], [two]),
    }
    mksquashfs = shutil.which("mksquashfs")
    if mksquashfs:
        variants["mksquashfs -processors 2"] = (
            [mksquashfs, str(small), str(squash), "-noappend", "-processors", "2", "-quiet"], [squash])
        variants["mksquashfs -processors 2, no compression"] = (
            [mksquashfs, str(small), str(plain), "-noappend", "-processors", "2", "-quiet",
             "-noI", "-noD", "-noF", "-noX"], [plain])
    groups.append(run_group(f"{small_files} files of 1 KiB", small_files, variants, args.cpus, args.repeat))
    for jobs, path in ((1, one), (2, two)):
        subprocess.run([*PACKFS, "pack", "-q", "-j", str(jobs), str(small), str(path)], check=True, cwd=REPO)
    identical = filecmp.cmp(one, two, shallow=False)
    for path in (one, two):
        path.unlink()

    result = {
        "machine": {"cpus_given": args.cpus, "cores": cpus_count, "platform": platform.platform(),
                    "python": platform.python_version(), "load_before": load_before,
                    "load_after": os.getloadavg()},
        "repeat": args.repeat, "groups": groups, "j1_equals_j2": identical,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pack_parallel.json").write_text(json.dumps(result, indent=2))
    lines = [f"CPU placement: `taskset -c {args.cpus}` for every command; medians of {args.repeat} runs, "
             f"warm page cache; -j 1 and -j 2 archives identical: {identical}; load average before "
             f"{load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}", "",
             "| tree | command | median s | files/s | ratio to first | CPU s (user+sys) | drift of first |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for group in groups:
        for label, median in group["median"].items():
            drift = f"{group['drift']:.2f}" if label == group["first"] else ""
            lines.append(f"| {group['tree']} | `{label}` | {median:.2f} | {group['files_per_second'][label]:,.0f} | "
                         f"{group['ratio_to_first'][label]:.2f} | {group['cpu_median'][label]:.2f} | {drift} |")
    table = "\n".join(lines)
    (args.out / "pack_parallel.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
