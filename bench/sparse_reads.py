"""READs at the start and at the end of a sparse file of many extents, through the
compiled daemon: a READ finds its extents by a binary search (issue 34), so the end of
the file costs what its start does.  Before, every READ walked the extent list from
the first extent, and the last MiB of a file of a million extents cost several times
its first.

The file: ``--extents`` extents of 16 bytes, each followed by a 16-byte hole (32 MiB
for a million), in a format 1.5 archive built by tests/codec_archives.py.  Mounted with
``-o direct_io`` (every read reaches the daemon; the kernel cuts a 1 MiB read into
128 KiB READs), each round reads the first and the last MiB with one pread each;
medians of ``--rounds``, and the ratio last / first.

    taskset -c 0,1 python bench/sparse_reads.py --extents 1000000 --rounds 15
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import packfs  # noqa: E402
from tests.codec_archives import Codec, codec_archive  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--extents", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    contents = b"".join(bytes([1 + k % 251]) * 16 + bytes(16) for k in range(args.extents))
    with tempfile.TemporaryDirectory(prefix="packfs-bench-") as work:
        work_path = Path(work)
        archive = codec_archive(work_path / "sparse.ffr", [packfs.Entry("sparse.bin", contents)],
                                {"sparse.bin": Codec("sparse", block=16)})
        mountpoint = work_path / "m"
        mountpoint.mkdir()
        subprocess.run([sys.executable, "-m", "packfs", "mount", "--binding", "lowlevel", "-o", "direct_io",
                        str(archive), str(mountpoint)], check=True, capture_output=True)
        times: dict[str, list[float]] = {"first": [], "last": []}
        try:
            fd = os.open(mountpoint / "sparse.bin", os.O_RDONLY)
            try:
                at = {"first": 0, "last": len(contents) - (1 << 20)}
                assert os.pread(fd, 1 << 20, at["last"]) == contents[at["last"]:]  # warm-up, and right
                for _ in range(args.rounds):
                    for name in ("first", "last"):
                        started = time.perf_counter()
                        data = os.pread(fd, 1 << 20, at[name])
                        times[name].append(time.perf_counter() - started)
                        assert data == contents[at[name] : at[name] + (1 << 20)]
            finally:
                os.close(fd)
        finally:
            subprocess.run([sys.executable, "-m", "packfs", "unmount", str(mountpoint)], capture_output=True)
    first, last = statistics.median(times["first"]), statistics.median(times["last"])
    print(json.dumps({"extents": args.extents, "size_mib": round(len(contents) / (1 << 20), 1),
                      "rounds": args.rounds, "first_mib_ms": round(first * 1e3, 2), "last_mib_ms": round(last * 1e3, 2),
                      "last_over_first": round(last / first, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
