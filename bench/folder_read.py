"""PackedFolder.read with the C format library (packfs.core._format: find, read, check
and decode in one C call, the GIL released, straight into the bytes returned) against
the pure-Python path it replaces (the same folder with the library turned off:
``folder._compiled = None``) and ``open(path, "rb").read()`` of the same files in a
plain directory, side by side in one run, at 4 KiB and 100 KB.  The library reads files
of any size (up to the whole-read limit, half the machine's memory), so the 100 KB row
is its own rate; "Archive.read_path" is the same read through the core's entry point.

``--compress zstd`` (or ``zstd+dictionary``) packs the same files compressed (the 4 KiB
files are JSON-like text) and adds a row for the decompression alone: zstandard's
ZstdDecompressor (with the archive's own dictionary) over the files' stored frames,
taken from the archive before the rounds, i.e. the floor under any reader of them.

Each round reads every file once in a fresh random order through each reader in turn
(all warm: the first round, not counted, fills the page cache); checks on
(``check_data=True``: every read checks its record's CRC, the "always" policy);
medians of the rounds, ratios to ``open().read()`` (files/s: higher is better), the
spread of each reader's rounds, and a drift check (``open().read()`` again at the end).

    taskset -c 1 python bench/folder_read.py --files 20000 --rounds 5
    taskset -c 1 python bench/folder_read.py --files 20000 --rounds 5 --sizes 4096 --compress zstd+dictionary

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
from packfs.format import CODEC_ZSTD, NO_RECORD, crc32  # noqa: E402


def stored_frames(folder: packfs.PackedFolder, names: list[str]) -> tuple[dict[str, bytes], bytes | None]:
    """Each file's stored zstd frame, and the dictionary they name (or None), read from
    the archive's map (the core's own record spans and codec rows)."""
    archive = folder.archive
    frames, dictionary = {}, None
    for name in names:
        entry = archive.find(name.encode())
        record = archive._table.record(entry)
        row = archive._codecs.row(record, entry)
        if row.codec != CODEC_ZSTD:
            raise SystemExit(f"{name}: stored as codec {row.codec}, not one zstd frame")
        start, end = archive.extent(entry)
        frames[name] = bytes(archive._container.mapping[start:end])
        if row.aux != NO_RECORD and dictionary is None:
            start, end = archive._container.record_span(row.aux)
            dictionary = bytes(archive._container.mapping[start:end])
    return frames, dictionary


def measure(work: Path, files: int, size: int, rounds_wanted: int, compress: str) -> dict:
    src = work / f"src-{size}"
    names = make_tree(src, files, size)
    archive = work / f"tree-{size}-{compress}.ffr"
    options = {} if compress == "none" else {"compress": "zstd",
                                             "dictionary": "auto" if compress == "zstd+dictionary" else None}
    packfs.pack_folder(src, archive, force=True, **options)
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

    readers = {"open(path, 'rb').read(), plain files": plain,
               "PackedFolder.read, C format library": compiled.read,
               "PackedFolder.read, pure Python": python.read,
               "Archive.read_path, C format library": compiled.archive.read_path}
    if compress == "none":
        # The floor under any reader that returns checked bytes: the copy out of the map
        # alone, and with the CRC (zlib-ng's, vectorised as the library's is), over the
        # same records, found before the rounds.
        mapping = compiled.archive._container.mapping
        spans = {name: compiled.archive.extent(compiled.archive.find(name.encode())) for name in names}
        readers["copy out of the map alone (no lookup, no check)"] = lambda name: mapping[slice(*spans[name])]
        readers["copy + CRC-32 alone (zlib-ng; no lookup)"] = lambda name: crc32(mapping[slice(*spans[name])])
    if compress != "none":
        import zstandard

        frames, dictionary = stored_frames(compiled, names)
        decompressor = (zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(dictionary))
                        if dictionary is not None else zstandard.ZstdDecompressor())
        decompress = decompressor.decompress
        assert all(decompress(frames[name]) == plain(name) for name in names[:5])
        readers["zstd decompress alone (zstandard, stored frames in memory)"] = lambda name: decompress(frames[name])
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
    return {"files": files, "size": size, "compress": compress, "rounds": rounds, "drift": drift}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 100_000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compress", choices=["none", "zstd", "zstd+dictionary"], default="none",
                        help="pack the files compressed (format 1.5) and time zstd's decompression alone too")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "packfs-folder-read")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    results = []
    for size in args.sizes:
        files = args.files if size <= 16384 else max(args.files // 10, 100)  # 100 KB files: a tenth as many
        result = measure(args.work, files, size, args.rounds, args.compress)
        results.append(result)
        medians = {name: statistics.median(rates) for name, rates in result["rounds"].items()}
        base = medians["open(path, 'rb').read(), plain files"]
        python = medians["PackedFolder.read, pure Python"]
        print(f"\n{files} files of {size} bytes, packed with --compress {args.compress}, random order, warm, checks on; CPUs "
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
