"""The file objects of ``PackedFolder.open()`` against a built-in ``open()`` of the same
files, side by side in one run.

    taskset -c 1 .venv/bin/python bench/file_objects.py            # one CPU: fewer migrations
    .venv/bin/python bench/file_objects.py --images 780 --rounds 7 --out bench/results

It generates a tree of small images (PNG, JPEG, GIF, BMP and TIFF, 16 to 320 pixels a
side, made with Pillow) and one 8 MiB file, writes it as plain files and packs it
(``check_data=True``, the default), then times, round by round, each way of reading:

- ``built-in``: ``open(path, "rb")`` of the plain files (the baseline);
- ``packfs``: ``PackedFolder.open(path)`` (a MemoryFile up to 1 MiB, else a StreamFile);
- ``packfs, check_data=False``: the same without CRCs (a MemoryFile up to 256 KiB);
- ``unbuffered``: the raw pread file object that ``open()`` returned before (issue 22,
  item 8), which a StreamFile now buffers: ``packfs.core.files._RecordReader``;
- ``BufferedReader(unbuffered)``: ``io.BufferedReader`` over that raw object, the
  workaround of the issue.

Patterns: ``seek(k)`` + ``read(16)`` on one open 50 KB file (per call);
``Image.open(f).load()`` of every image (per image, including the open); a PNG chunk
walk of every PNG (read 8, then per chunk read 8 and seek past it: the small reads and
seeks of a parser, without the decoding); an open and ``read(16)`` of a 900 KiB file
(a header read, per file); on the 8 MiB file, ``seek`` + ``read(16)`` at random
offsets and ``read(4096)`` front to back (per call).

After a warm-up pass, each round measures every pattern every way, starting each round
with another way.  Reported: the median over rounds of each time, its ratio to the
built-in baseline's median, each way's spread (max/min over rounds), and the drift: the
baseline is measured once more at the very end, and the ratio of that to its median says
how far the machine moved during the run.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, BinaryIO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import packfs  # noqa: E402
from packfs.core.files import _RecordReader  # noqa: E402

FORMATS = ("PNG", "JPEG", "GIF", "BMP", "TIFF")
WAYS = ("built-in", "packfs", "packfs, check_data=False", "unbuffered", "BufferedReader(unbuffered)")


def make_tree(root: Path, images: int, seed: int) -> list[str]:
    """The images (and ``seek.bin``, ``large.bin``) under ``root``; their paths."""
    from PIL import Image

    rng = random.Random(seed)
    paths = []
    for index in range(images):
        kind = FORMATS[index % len(FORMATS)]
        width, height = rng.randint(16, 320), rng.randint(16, 320)
        # Noise compresses badly and gradients too well: a mix, as photos and icons are.
        image = Image.effect_noise((width, height), rng.uniform(10, 120)).convert("RGB")
        image = Image.blend(image, Image.linear_gradient("L").resize((width, height)).convert("RGB"), 0.5)
        if kind == "GIF":
            image = image.convert("P")
        relative = f"d{index % 20:02}/img{index:05}.{kind.lower()}"
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        image.save(root / relative, kind)
        paths.append(relative)
    (root / "seek.bin").write_bytes(os.urandom(50_000))
    (root / "header.bin").write_bytes(os.urandom(900 << 10))
    (root / "large.bin").write_bytes(os.urandom(8 << 20))
    return paths


def openers(root: Path, folder: packfs.PackedFolder,
            unchecked: packfs.PackedFolder) -> dict[str, Callable[[str], BinaryIO]]:
    archive = folder.archive

    def raw(path: str) -> BinaryIO:
        start, end = archive.extent(archive.lookup(path))
        # The record's raw reader, as Archive.open built it before (its CRC checked
        # here, as open checked it).
        archive.check(archive.lookup(path))
        return _RecordReader(archive._container, start, end, path)  # type: ignore[return-value]

    return {
        "built-in": lambda path: open(root / path, "rb"),
        "packfs": folder.open,
        "packfs, check_data=False": unchecked.open,
        "unbuffered": raw,
        "BufferedReader(unbuffered)": lambda path: io.BufferedReader(raw(path)),  # type: ignore[arg-type]
    }


def seek_read(opener: Callable[[str], BinaryIO], calls: int) -> float:
    """Seconds per seek(k) + read(16) on one open 50 KB file."""
    offsets = [(i * 7919) % 49_984 for i in range(calls)]
    with opener("seek.bin") as f:
        started = time.perf_counter()
        for offset in offsets:
            f.seek(offset)
            f.read(16)
        return (time.perf_counter() - started) / calls


def decode(opener: Callable[[str], BinaryIO], paths: list[str]) -> float:
    """Seconds per image: open, Image.open(f).load(), close."""
    from PIL import Image

    started = time.perf_counter()
    for path in paths:
        with opener(path) as f, Image.open(f) as image:
            image.load()
    return (time.perf_counter() - started) / len(paths)


def chunk_walk(opener: Callable[[str], BinaryIO], paths: list[str]) -> float:
    """Seconds per PNG: its chunks walked with read(8) and a relative seek each."""
    pngs = [path for path in paths if path.endswith(".png")]
    started = time.perf_counter()
    for path in pngs:
        with opener(path) as f:
            f.read(8)
            while True:
                header = f.read(8)
                if len(header) < 8:
                    break
                f.seek(int.from_bytes(header[:4], "big") + 4, io.SEEK_CUR)
    return (time.perf_counter() - started) / len(pngs)


def header(opener: Callable[[str], BinaryIO], files: int) -> float:
    """Seconds per open + read(16) of the 900 KiB file."""
    started = time.perf_counter()
    for _ in range(files):
        with opener("header.bin") as f:
            f.read(16)
    return (time.perf_counter() - started) / files


def large_random(opener: Callable[[str], BinaryIO], calls: int) -> float:
    """Seconds per seek + read(16) at random offsets of the 8 MiB file."""
    rng = random.Random(1)
    offsets = [rng.randrange(8 << 20) for _ in range(calls)]
    with opener("large.bin") as f:
        started = time.perf_counter()
        for offset in offsets:
            f.seek(offset)
            f.read(16)
        return (time.perf_counter() - started) / calls


def large_sequential(opener: Callable[[str], BinaryIO]) -> float:
    """Seconds per read(4096) of the 8 MiB file, front to back."""
    with opener("large.bin") as f:
        started = time.perf_counter()
        calls = 0
        while f.read(4096):
            calls += 1
        return (time.perf_counter() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=780, help="images to generate and decode (Pillow's test suite has 780)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100_000, help="seek + read(16) calls per measurement")
    parser.add_argument("--work", type=Path, default=None, help="where to write the tree and the archive")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here too")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="packfs-file-objects-", dir=args.work))
    root = work / "tree"
    paths = make_tree(root, args.images, seed=22)
    packfs.pack_folder(root, work / "tree.ffr")
    patterns: dict[str, Callable[[Callable[[str], BinaryIO]], float]] = {
        "seek + read(16), 50 KB file (us/call)": lambda opener: seek_read(opener, args.calls) * 1e6,
        "Image.open(f).load() (us/image)": lambda opener: decode(opener, paths) * 1e6,
        "PNG chunk walk (us/file)": lambda opener: chunk_walk(opener, paths) * 1e6,
        "open + read(16), 900 KiB file (us/file)": lambda opener: header(opener, 2000) * 1e6,
        "8 MiB file: random seek + read(16) (us/call)": lambda opener: large_random(opener, args.calls // 5) * 1e6,
        "8 MiB file: sequential read(4096) (us/call)": lambda opener: large_sequential(opener) * 1e6,
    }
    times: dict[str, dict[str, list[float]]] = {pattern: {way: [] for way in WAYS} for pattern in patterns}
    drift: dict[str, float] = {}
    with packfs.PackedFolder(work / "tree.ffr") as folder, \
            packfs.PackedFolder(work / "tree.ffr", check_data=False) as unchecked:
        ways = openers(root, folder, unchecked)
        for pattern, measure in patterns.items():  # warm-up: page cache, imports, caches
            for way in WAYS:
                measure(ways[way])
        for round_number in range(args.rounds):
            # Each round starts with another way, so that a slow stretch of the machine
            # does not always fall on the same one.
            order = WAYS[round_number % len(WAYS):] + WAYS[:round_number % len(WAYS)]
            for pattern, measure in patterns.items():
                for way in order:
                    times[pattern][way].append(measure(ways[way]))
                if round_number == args.rounds - 1:  # the baseline again, after all the others
                    drift[pattern] = measure(ways["built-in"])
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        cpus = []
    print(f"{args.images} images ({', '.join(FORMATS)}), {args.rounds} rounds, medians; CPUs allowed: {cpus} "
          f"({'pinned' if len(cpus) == 1 else 'not pinned: run under taskset -c N'}); Python "
          f"{platform.python_version()}, Pillow {__import__('PIL').__version__}")
    results = {}
    for pattern in patterns:
        base = statistics.median(times[pattern]["built-in"])
        moved = drift[pattern] / base
        print(f"\n{pattern}   (baseline drift: last/median {moved:.2f})")
        results[pattern] = {"drift": moved}
        for way in WAYS:
            value = statistics.median(times[pattern][way])
            spread = max(times[pattern][way]) / min(times[pattern][way])
            print(f"  {way:26s} {value:10.3f}   {value / base:5.2f}x built-in   (spread {spread:.2f})")
            results[pattern][way] = {"median": value, "ratio": value / base, "all": times[pattern][way]}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "file_objects.json").write_text(json.dumps(results, indent=1))
    import shutil

    shutil.rmtree(work)


if __name__ == "__main__":
    main()
