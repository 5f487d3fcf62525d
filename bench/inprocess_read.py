"""Random reads of small files in-process: the compiled read path
(``packfs._lowlevel.Tree.read_file``: lookup, read, check and decode in one C call)
against ``open(path, "rb").read()`` of the same files in a plain directory, side by
side in one run, with ``PackedFolder.read`` (packfs.core's Python path) for context.

Each round reads every file once in a fresh random order through each system in turn
(all warm: the files and the archives are in the page cache after the first round,
which is not counted); medians of the rounds, ratios to ``open().read()`` (files/s:
higher is better), and a drift check (``open().read()`` again at the end).  The
archives: the tree stored, with ``compress="zstd"`` (one zstd frame per file), and with
a dictionary too (``dictionary="auto"``, trained from the files).

    taskset -c 1 python bench/inprocess_read.py --files 20000 --size 4096 --rounds 5

CPU placement: whatever the command gives it (``taskset -c 1``: one CPU, printed).
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

import packfs  # noqa: E402
from packfs.core import Archive  # noqa: E402
from packfs.fuse.inodedaemon import tree_for  # noqa: E402


def make_tree(root: Path, files: int, size: int) -> list[str]:
    names = [f"d{k // 500:03d}/f{k:06d}.json" for k in range(files)]
    marker = root / f".complete-{files}-{size}"
    if not marker.exists():
        shutil.rmtree(root, ignore_errors=True)
        rng = random.Random(1)
        for name in names:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            text = b"".join(b'"k%d": %d, ' % (j, rng.randrange(10**9)) for j in range(size // 8))
            (root / name).write_bytes((b"{" + text)[: size - 2] + b"}\n")
        marker.touch()
    return names


def timed(read, keys: list) -> float:
    start = time.perf_counter()
    for key in keys:
        read(key)
    return len(keys) / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "packfs-inprocess")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    src = args.work / "src"
    names = make_tree(src, args.files, args.size)
    stored, compressed, with_dictionary = (args.work / "stored.ffr", args.work / "zstd.ffr",
                                           args.work / "zstd-dictionary.ffr")
    packfs.pack_folder(src, stored, force=True)
    packfs.pack_folder(src, compressed, force=True, compress="zstd")
    packfs.pack_folder(src, with_dictionary, force=True, compress="zstd", dictionary="auto")
    devnull = os.open(os.devnull, os.O_WRONLY)
    opened = [Archive(path, checksums="once") for path in (stored, compressed, with_dictionary)]
    tree_stored, tree_zstd, tree_dictionary = (tree_for(archive, devnull) for archive in opened)
    folder = packfs.PackedFolder(stored)
    plain_paths = {name: str(src / name) for name in names}
    keys = {name: name.encode() for name in names}
    for name in names[:3]:
        expected = (src / name).read_bytes()
        assert (tree_stored.read_file(keys[name]) == tree_zstd.read_file(keys[name])
                == tree_dictionary.read_file(keys[name]) == expected)

    def plain(name: str) -> bytes:
        with open(plain_paths[name], "rb") as f:
            return f.read()

    systems = {
        "open(path, 'rb').read(), plain files": plain,
        "Tree.read_file, stored archive": lambda name: tree_stored.read_file(keys[name]),
        "Tree.read_file, zstd archive": lambda name: tree_zstd.read_file(keys[name]),
        "Tree.read_file, zstd archive with a dictionary": lambda name: tree_dictionary.read_file(keys[name]),
        "PackedFolder.read, stored archive": folder.read,
    }
    rng = random.Random(2)
    rounds: dict[str, list[float]] = {name: [] for name in systems}
    for round_number in range(args.rounds + 1):
        order = names[:]
        rng.shuffle(order)
        for name, read in systems.items():
            rate = timed(read, order)
            if round_number:  # the first round warms the page cache and the check bitmaps
                rounds[name].append(rate)
    drift = timed(plain, names)
    medians = {name: statistics.median(rates) for name, rates in rounds.items()}
    base = medians["open(path, 'rb').read(), plain files"]
    print(f"\n{args.files} files of {args.size} bytes, random order, warm; CPUs {sorted(os.sched_getaffinity(0))}; "
          f"medians of {args.rounds} rounds; ratio = files/s / open().read()'s\n")
    print("| reader | files/s | ratio | spread (max/min) |")
    print("|---|---|---|---|")
    for name, rates in rounds.items():
        print(f"| {name} | {medians[name]:,.0f} | {medians[name] / base:.2f} | {max(rates) / min(rates):.2f} |")
    print(f"\ndrift check: open().read() again after the rounds: {drift / base:.2f}x its median")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"inprocess_read-{stamp}.json").write_text(json.dumps(
        {"files": args.files, "size": args.size, "rounds": rounds, "medians": medians, "drift": drift,
         "cpus": sorted(os.sched_getaffinity(0))}, indent=1))
    folder.close()
    for archive in opened:
        archive.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
