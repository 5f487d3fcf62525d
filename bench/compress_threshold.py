"""How much must zstd save before a file is worth storing compressed?  (The
threshold of packfs/write/encode.py, MIN_SAVING.)

For every file of some real trees, compress it alone (zstd level 9, as pack
--compress does) and time its decompression; group the files by the share of bytes
zstd saves, and report per group what decoding costs per byte saved, next to what
reading those bytes costs instead (from the page cache: a copy; from a disk or a
network at a given speed).  A file belongs compressed when decoding it costs less
than reading the bytes it saves would.

    python bench/compress_threshold.py [TREE ...]    (default: /usr/share/doc, this
                                                      Python's site-packages, /usr/lib)
CPU placement: run under taskset -c 1 for steady numbers.
"""

from __future__ import annotations

import os
import statistics
import sys
import sysconfig
import time

import zstandard

BUCKETS = [(0.0, 0.02), (0.02, 0.0625), (0.0625, 0.125), (0.125, 0.25), (0.25, 0.5), (0.5, 1.0)]


def files(trees, limit=20000):
    count = 0
    for tree in trees:
        for directory, _, names in os.walk(tree):
            for name in names:
                path = os.path.join(directory, name)
                if os.path.isfile(path) and not os.path.islink(path) and 64 <= os.path.getsize(path) <= 1 << 20:
                    yield path
                    count += 1
                    if count >= limit:
                        return


def main() -> None:
    trees = sys.argv[1:] or ["/usr/share/doc", sysconfig.get_paths()["purelib"], "/usr/lib/x86_64-linux-gnu"]
    compressor = zstandard.ZstdCompressor(level=9, write_checksum=False)
    decompressor = zstandard.ZstdDecompressor()
    rows = {bucket: [] for bucket in BUCKETS}
    for path in files(trees):
        try:
            raw = open(path, "rb").read()
        except OSError:
            continue
        stored = compressor.compress(raw)
        saving = 1 - len(stored) / len(raw)
        started = time.perf_counter_ns()
        for _ in range(5):
            decompressor.decompress(stored, max_output_size=len(raw))
        decode_ns = (time.perf_counter_ns() - started) / 5
        for low, high in BUCKETS:
            if low <= saving < high:
                rows[(low, high)].append((len(raw), len(raw) - len(stored), decode_ns))
                break
    print(f"trees: {', '.join(trees)}")
    print("saving        files   median size   decode ns/KiB   ns per KiB saved   "
          "break-even read speed (saved bytes / decode time)")
    for (low, high), found in rows.items():
        if not found:
            continue
        per_kib = statistics.median(ns / (size / 1024) for size, _, ns in found)
        saved = sum(s for _, s, _ in found)
        decode = sum(ns for _, _, ns in found)
        per_saved = decode / max(saved / 1024, 1e-9)
        speed = saved / max(decode, 1) * 1e9 / 2**20
        print(f"{low:5.1%}-{high:5.1%}  {len(found):6d}  {statistics.median(s for s, _, _ in found):10.0f} B"
              f"  {per_kib:12.0f}  {per_saved:14.0f}        {speed:8.0f} MiB/s")


if __name__ == "__main__":
    main()
