"""Large files through a mount: format 1.2's piece CRCs against 1.1's whole-record CRC.

A 1.1 archive's daemon checks a large file's whole record before it answers the first
READ, so the first 4 KiB of a cold 256 MiB file wait for 256 MiB to be read and
checked; 1.2 checks each 1 MiB piece as reads reach it.  This runs, side by side in one
run, the plain directory, the compiled daemon over the same tree packed as 1.2 and as
1.1 (the same bytes without the piece sections), the compiled daemon with checks off
(the ceiling), and squashfuse_ll where installed, and reports for each: the first 4 KiB
of a cold file, a cold sequential read of every large file, and a warm one (1 MiB
unbuffered reads), as medians of rounds that cycle through the systems, with ratios to
the plain directory (read rates: higher is better) and a drift check (the plain
directory measured again at the end).

    python bench/large_files.py --mib 256 --files 2 --rounds 3

Needs root (drop_caches). CPU placement: reader and daemons float over the CPUs this
process may use (printed).
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import packfs  # noqa: E402
from compare import Mount, drop_caches  # noqa: E402
from tests.conftest import as_version_1_1  # noqa: E402  (the 1.1 layout of a 1.2 archive)


def make_tree(root: Path, files: int, mib: int) -> list[Path]:
    marker = root / f".complete-{files}-{mib}"
    paths = [root / f"blob{k}.bin" for k in range(files)]
    if not marker.exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        for path in paths:
            with open(path, "wb") as f:
                for _ in range(mib):
                    f.write(os.urandom(1 << 20))
        marker.touch()
    return paths


def first_bytes(paths: list[Path]) -> float:
    drop_caches()
    start = time.perf_counter()
    with open(paths[0], "rb", buffering=0) as f:
        f.read(4096)
    return time.perf_counter() - start


def sequential(paths: list[Path], cold: bool) -> float:
    if cold:
        drop_caches()
    start = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(1 << 20):
                pass
    return time.perf_counter() - start


def measure(paths: list[Path]) -> dict[str, float]:
    figures = {"first_4k_cold_s": first_bytes(paths), "sequential_cold_s": sequential(paths, True)}
    sequential(paths, False)
    figures["sequential_warm_s"] = statistics.median(sequential(paths, False) for _ in range(3))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=2)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "packfs-large")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    if not drop_caches():
        print("needs root: cold reads drop the page cache", file=sys.stderr)
        return 2
    work = args.work
    src = work / "src"
    make_tree(src, args.files, args.mib)
    names = sorted(p.name for p in src.glob("blob*.bin"))
    new, old = work / "large-1.2.ffr", work / "large-1.1.ffr"
    packfs.pack_folder(src, new, force=True)
    old.unlink(missing_ok=True)
    as_version_1_1(new, old)
    mount = [sys.executable, "-m", "packfs", "mount", "-f", "--binding", "lowlevel"]
    systems: list[tuple[str, list[str] | None, Path]] = [
        ("plain", None, src),
        ("packfs 1.2 (piece CRCs)", mount + [str(new), str(work / "m-new")], work / "m-new"),
        ("packfs 1.1 (record CRC)", mount + [str(old), str(work / "m-old")], work / "m-old"),
        ("packfs 1.2, checks off", mount + ["--no-check-data", str(new), str(work / "m-nocheck")], work / "m-nocheck"),
    ]
    skipped = {}
    squash = work / f"large-{args.files}x{args.mib}.squashfs"  # of this tree, not an earlier size's
    if shutil.which("mksquashfs") and shutil.which("squashfuse_ll"):
        if not squash.exists():
            subprocess.run(["mksquashfs", str(src), str(squash), "-noappend", "-quiet", "-no-progress"], check=True)
        systems.append(("squashfuse_ll", ["squashfuse_ll", "-f", str(squash), str(work / "m-squash")],
                        work / "m-squash"))
    else:
        skipped["squashfuse_ll"] = "squashfs-tools or squashfuse not installed"
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in systems}
    for round_number in range(args.rounds):
        for name, command, root in systems:
            paths = [root / n for n in names]
            if command is None:
                rounds[name].append(measure(paths))
                continue
            with Mount(name, command, root):
                rounds[name].append(measure(paths))
        print(f"round {round_number + 1}/{args.rounds} done", file=sys.stderr)
    drift = measure([src / n for n in names])
    medians = {name: {key: statistics.median(r[key] for r in results) for key in results[0]}
               for name, results in rounds.items()}
    plain = medians["plain"]
    total_mib = args.files * args.mib
    print(f"\n{args.files} files x {args.mib} MiB; CPUs {sorted(os.sched_getaffinity(0))} shared by reader "
          f"and daemon; medians of {args.rounds} rounds; ratio = plain time / system time (>1: faster)\n")
    print(f"| system | first 4 KiB, cold | sequential cold | sequential warm |")
    print("|---|---|---|---|")
    for name, figures in medians.items():
        cells = []
        for key in ("first_4k_cold_s", "sequential_cold_s", "sequential_warm_s"):
            value = figures[key]
            shown = f"{value * 1000:.1f} ms" if key.startswith("first") else f"{total_mib / value:.0f} MiB/s"
            cells.append(f"{shown} ({plain[key] / value:.2f})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\ndrift check: plain again after the rounds: " + ", ".join(
        f"{key} {drift[key] / plain[key]:.2f}x its median" for key in drift))
    for name, reason in skipped.items():
        print(f"skipped {name}: {reason}")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"large_files-{stamp}.json").write_text(json.dumps(
        {"files": args.files, "mib": args.mib, "rounds": rounds, "medians": medians, "drift": drift,
         "skipped": skipped, "cpus": sorted(os.sched_getaffinity(0))}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
