"""What checking each cached block at every serve costs (issue 34): a 64 MiB file of an
archive served by nginx on loopback (tests/remote_servers.py), read from a warm disk
cache in 128 KiB reads (a mount's READs) through ``CachedSource.read``, against the
CRC-32 of the same bytes alone.  Run it with the packfs to measure first on
PYTHONPATH (a checkout of main, then this branch) to compare two versions.

    python bench/cache_serve_check.py [--rounds 7]

Prints the median seconds of a whole warm read of the file, its rate, and the share of
it the CRCs of its 16 KiB blocks take (the CRC of 16 KiB blocks timed alone)."""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.remote_servers

from packfs import PackedFolder, pack_folder  # noqa: E402
from packfs.format import crc32  # noqa: E402
from packfs.source import open_source  # noqa: E402
from tests.remote_servers import Nginx  # noqa: E402

READ = 128 << 10
BLOCK = 16 << 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args()
    import packfs

    root = Path(tempfile.mkdtemp(prefix="packfs-bench-"))
    source_dir = root / "src"
    source_dir.mkdir()
    data = random.Random(1).randbytes(args.mib << 20)
    (source_dir / "big.bin").write_bytes(data)
    pack_folder(source_dir, root / "a.ffr")
    with Nginx(root / "nginx") as nginx:
        nginx.put("a.ffr", (root / "a.ffr").read_bytes())
        url = nginx.url("a.ffr")
        cache = root / "cache"
        with PackedFolder(url, cache_dir=cache) as folder:
            entry = folder.archive.lookup("big.bin")
            start, end = folder.archive.extent(entry)[:2]
        source = open_source(url, storage_options={"cache_dir": cache})
        try:
            assert source.read(start, end) == data  # fills the cache
            times = []
            for _ in range(args.rounds):
                began = time.perf_counter()
                for at in range(start, end, READ):
                    source.read(at, min(end, at + READ))
                times.append(time.perf_counter() - began)
            assert source.stats()["cache_misses"] * BLOCK <= (end - start) + 2 * BLOCK
        finally:
            source.close()
    view = memoryview(data)
    crcs = []
    for _ in range(args.rounds):
        began = time.perf_counter()
        for at in range(0, len(data), BLOCK):
            crc32(view[at:at + BLOCK], at)
        crcs.append(time.perf_counter() - began)
    read, crc = statistics.median(times), statistics.median(crcs)
    print(f"packfs {Path(packfs.__file__).parent}")
    print(f"warm read of {args.mib} MiB in 128 KiB reads: median {read:.3f} s over {args.rounds} "
          f"({args.mib / read:.0f} MiB/s); min {min(times):.3f} s, max {max(times):.3f} s")
    print(f"CRC-32 of its 16 KiB blocks alone: median {crc:.4f} s ({crc / read:.1%} of the read)")


if __name__ == "__main__":
    main()
