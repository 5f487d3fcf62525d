"""What a block-aware epoch's window plan costs to make (issue 36): every file's extent
at once (``Archive.extents_of``, the table's columns checked as arrays) against one
``Archive.extent`` call a file, the way ``plan_windows`` located records before.

    taskset -c 1 .venv/bin/python bench/window_plan.py                 # 200,000 files
    taskset -c 1 .venv/bin/python bench/window_plan.py --files 1000000 --rounds 7

One archive of ``--files`` files of 64 bytes (in 1,000 folders) is packed from memory;
then ``--rounds`` interleaved rounds time each way over every file (one process, the
archive's pages warm).  Reported: medians, the ratio, and a drift check (the last
round's time of the bulk way over the first's).  Both ways give the same spans (checked).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import packfs
from packfs.core import open_archive
from packfs.windows import plan_windows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(36)
    with tempfile.TemporaryDirectory() as work:
        archive_path = Path(work) / "plan.ffr"
        entries = (packfs.Entry(f"d{k % 1000:03d}/{k:08d}.bin", rng.randbytes(64)) for k in range(args.files))
        packfs.pack_entries(entries, archive_path)
        with open_archive(str(archive_path)) as archive:
            files = np.flatnonzero((archive.column("mode") & 0o170000) == 0o100000)
            archive.extents_of(files)  # warm: the columns' pages faulted in, numpy's code loaded
            bulk, single = [], []
            for _ in range(args.rounds):
                began = time.perf_counter()
                spans = archive.extents_of(files)
                plan_windows(archive, files, 8 << 20)
                bulk.append(time.perf_counter() - began)
                began = time.perf_counter()
                one_by_one = np.array([archive.extent(int(entry)) for entry in files], dtype=np.int64)
                single.append(time.perf_counter() - began)
                assert (spans == one_by_one).all()
    affinity = sorted(os.sched_getaffinity(0))
    print(f"{len(files):,} files, {args.rounds} interleaved rounds, CPUs {affinity}:")
    print(f"  extents_of + plan_windows: median {statistics.median(bulk) * 1e3:.1f} ms "
          f"({statistics.median(bulk) / len(files) * 1e9:.0f} ns a file)")
    print(f"  extent() a file:           median {statistics.median(single) * 1e3:.1f} ms "
          f"({statistics.median(single) / len(files) * 1e9:.0f} ns a file)")
    print(f"  ratio (one at a time / at once): {statistics.median(single) / statistics.median(bulk):.1f}x; "
          f"drift (last / first round, at once): {bulk[-1] / bulk[0]:.2f}")


if __name__ == "__main__":
    main()
