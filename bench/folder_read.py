"""PackedFolder.read with the C format library (packfs.core._format: find, read, check
and decode in one C call, the GIL released) against the pure-Python path it replaces
(the same folder with the library turned off) and ``open(path, "rb").read()`` of the
same files in a plain directory, side by side in one run, at 4 KiB and 100 KB.
PackedFolder.read takes the library for files up to 16 KiB (folder.py's
_COMPILED_MAX_SIZE); a larger one is refused by it before any byte is read and read by
the Python path, so the 100 KB row shows that detour's cost, and the "Tree.read_file"
row the library's own rate without the limit.

Each round reads every file once in a fresh random order through each reader in turn
(all warm: the first round, not counted, fills the page cache); checks on
(``check_data=True``: every read checks its record's CRC, the "always" policy);
medians of the rounds, ratios to ``open().read()`` (files/s: higher is better), the
spread of each reader's rounds, and a drift check (``open().read()`` again at the end).

    taskset -c 1 python bench/folder_read.py --files 20000 --rounds 5

CPU placement: whatever the command gives it (``taskset -c 1``: one CPU, printed).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import packfs  # noqa: E402
from bench.inprocess_read import make_tree, timed  # noqa: E402  (the same files and timing)


def measure(work: Path, files: int, size: int, rounds_wanted: int) -> dict:
    src = work / f"src-{size}"
    names = make_tree(src, files, size)
    archive = work / f"tree-{size}.ffr"
    packfs.pack_folder(src, archive, force=True)
    compiled = packfs.PackedFolder(archive)
    python = packfs.PackedFolder(archive)
    if compiled._compiled is None:
        raise SystemExit("packfs.core._format is not built (python setup.py build_ext --inplace)")
    python._compiled = None  # the pure-Python path, as where the library is not built
    plain_paths = {name: str(src / name) for name in names}
    for name in names[:5]:
        assert compiled.read(name) == python.read(name) == (src / name).read_bytes()

    def plain(name: str) -> bytes:
        with open(plain_paths[name], "rb") as f:
            return f.read()

    tree = compiled._compiled
    keys = {name: name.encode() for name in names}
    readers = {"open(path, 'rb').read(), plain files": plain,
               "PackedFolder.read, C format library": compiled.read,
               "PackedFolder.read, pure Python": python.read,
               "Tree.read_file (packfs.core._format), no size limit": lambda name: tree.read_file(keys[name])}
    rng = random.Random(2)
    rounds: dict[str, list[float]] = {name: [] for name in readers}
    for round_number in range(rounds_wanted + 1):
        order = names[:]
        rng.shuffle(order)
        for name, read in readers.items():
            rate = timed(read, order)
            if round_number:  # the first round warms the page cache
                rounds[name].append(rate)
    drift = timed(plain, names)
    compiled.close()
    python.close()
    return {"files": files, "size": size, "rounds": rounds, "drift": drift}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 100_000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "packfs-folder-read")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    results = []
    for size in args.sizes:
        files = args.files if size <= 16384 else max(args.files // 10, 100)  # 100 KB files: a tenth as many
        result = measure(args.work, files, size, args.rounds)
        results.append(result)
        medians = {name: statistics.median(rates) for name, rates in result["rounds"].items()}
        base = medians["open(path, 'rb').read(), plain files"]
        python = medians["PackedFolder.read, pure Python"]
        print(f"\n{files} files of {size} bytes, random order, warm, checks on; CPUs "
              f"{sorted(os.sched_getaffinity(0))}; medians of {args.rounds} rounds\n")
        print("| reader | files/s | vs open().read() | vs pure Python | spread (max/min) |")
        print("|---|---|---|---|---|")
        for name, rates in result["rounds"].items():
            print(f"| {name} | {medians[name]:,.0f} | {medians[name] / base:.2f} | {medians[name] / python:.2f} | "
                  f"{max(rates) / min(rates):.2f} |")
        print(f"\ndrift check: open().read() again after the rounds: {result['drift'] / base:.2f}x its median")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"folder_read-{stamp}.json").write_text(json.dumps(
        {"results": results, "cpus": sorted(os.sched_getaffinity(0))}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
