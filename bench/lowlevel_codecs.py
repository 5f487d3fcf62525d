"""The compiled daemon over format 1.5's codecs: the same tree packed stored and packed
with ``compress="zstd"`` (one zstd frame per small file, 1 MiB frames for the large
ones), side by side in one run with the plain directory.

For each system: a first sequential read of every large file through a fresh mount
(the daemon decodes each frame once; the archive's own bytes are in the host's page
cache, so this is the daemon's decoding, not the disk), a warm re-read (the kernel's
page cache of the mount: it must not depend on the codec), first reads of every small
file, and warm ones, all 1 MiB unbuffered reads, as medians of rounds that cycle
through the systems, ratios to the stored archive's (rates: higher is better), and a
drift check (the stored archive measured again at the end).

    taskset -c 0,1 python bench/lowlevel_codecs.py --mib 64 --small 2000 --rounds 3

No root needed (nothing drops the host's caches). CPU placement: the reader and the
daemon float over the CPUs this process may use (printed).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import packfs  # noqa: E402
from compare import Mount  # noqa: E402


def make_tree(root: Path, mib: int, small: int) -> tuple[list[str], list[str]]:
    """Two large log-like files of ``mib`` MiB (zstd takes them to about a fifth) and
    ``small`` JSON-like files of about 4 KiB, made once per size."""
    marker = root / f".complete-{mib}-{small}"
    large = ["logs/a.log", "logs/b.log"]
    smalls = [f"small/{k // 100:03d}/{k}.json" for k in range(small)]
    if not marker.exists():
        shutil.rmtree(root, ignore_errors=True)
        rng = random.Random(7)
        for name in large:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            with open(root / name, "wb") as f:
                while f.tell() < mib << 20:
                    f.write(b"".join(b"2026-11-25 00:%02d:%02d INFO request %d took %d ms from 10.0.%d.%d\n"
                                     % (rng.randrange(60), rng.randrange(60), rng.randrange(10**6),
                                        rng.randrange(500), rng.randrange(256), rng.randrange(256))
                                     for _ in range(2000)))
        for k, name in enumerate(smalls):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            fields = b", ".join(b'"field%d": %d' % (j, rng.randrange(10**6)) for j in range(260))
            (root / name).write_bytes(b'{"id": %d, %s}\n' % (k, fields))
        marker.touch()
    return large, smalls


def read_all(paths: list[Path]) -> float:
    start = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(1 << 20):
                pass
    return time.perf_counter() - start


def measure(root: Path, large: list[str], smalls: list[str]) -> dict[str, float]:
    large_paths, small_paths = [root / n for n in large], [root / n for n in smalls]
    figures = {"large_first_s": read_all(large_paths), "small_first_s": read_all(small_paths)}
    figures["large_warm_s"] = statistics.median(read_all(large_paths) for _ in range(3))
    figures["small_warm_s"] = statistics.median(read_all(small_paths) for _ in range(3))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--small", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "packfs-lowlevel-codecs")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    work = args.work
    src = work / "src"
    large, smalls = make_tree(src, args.mib, args.small)
    stored, compressed = work / "stored.ffr", work / "zstd.ffr"
    packfs.pack_folder(src, stored, force=True)
    packfs.pack_folder(src, compressed, force=True, compress="zstd")
    mount = [sys.executable, "-m", "packfs", "mount", "-f", "--binding", "lowlevel"]
    systems: list[tuple[str, list[str] | None, Path]] = [
        ("plain directory", None, src),
        ("lowlevel, stored", mount + [str(stored), str(work / "m-stored")], work / "m-stored"),
        ("lowlevel, zstd", mount + [str(compressed), str(work / "m-zstd")], work / "m-zstd"),
        ("lowlevel, zstd, checks off", mount + ["--no-check-data", str(compressed), str(work / "m-zstd-nocheck")],
         work / "m-zstd-nocheck"),
    ]
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in systems}
    for round_number in range(args.rounds):
        for name, command, root in systems:
            if command is None:
                rounds[name].append(measure(root, large, smalls))
                continue
            with Mount(name, command, root):  # a fresh mount: the kernel has none of its pages
                rounds[name].append(measure(root, large, smalls))
        print(f"round {round_number + 1}/{args.rounds} done", file=sys.stderr)
    with Mount("drift", systems[1][1], systems[1][2]):
        drift = measure(systems[1][2], large, smalls)
    medians = {name: {key: statistics.median(r[key] for r in results) for key in results[0]}
               for name, results in rounds.items()}
    base = medians["lowlevel, stored"]
    large_mib = len(large) * args.mib
    small_mib = sum((src / n).stat().st_size for n in smalls) / 2**20
    print(f"\n{len(large)} files x {args.mib} MiB and {args.small} files of about 4 KiB; archives: stored "
          f"{stored.stat().st_size / 2**20:.1f} MiB, zstd {compressed.stat().st_size / 2**20:.1f} MiB; CPUs "
          f"{sorted(os.sched_getaffinity(0))} shared by reader and daemon; medians of {args.rounds} rounds; "
          f"ratio = stored archive's time / this system's (>1: faster)\n")
    print("| system | large, first read | large, warm | small files, first read | small files, warm |")
    print("|---|---|---|---|---|")
    for name, figures in medians.items():
        cells = []
        for key, mib in (("large_first_s", large_mib), ("large_warm_s", large_mib), ("small_first_s", small_mib),
                         ("small_warm_s", small_mib)):
            cells.append(f"{mib / figures[key]:.0f} MiB/s ({base[key] / figures[key]:.2f})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\ndrift check: the stored archive again after the rounds: " + ", ".join(
        f"{key} {drift[key] / base[key]:.2f}x its median" for key in drift))
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"lowlevel_codecs-{stamp}.json").write_text(json.dumps(
        {"mib": args.mib, "small": args.small, "rounds": rounds, "medians": medians, "drift": drift,
         "cpus": sorted(os.sched_getaffinity(0))}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
