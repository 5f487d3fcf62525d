"""The lookup index's kept pages (format 1.4, ``core/lookupindex.py``): warm ``find``
time and the memory of the parsed pages, this tree's against another commit's module
(default: before a09944c, which kept an ``IndexRow`` object per row).

    taskset -c 1 .venv/bin/python bench/lookup_index.py [--against REV] [--files N]

One archive of ``--files`` files (in 100 folders) is packed; each implementation
reads its index through a page cache and is warmed with 2,000 random paths (every
page they hold parsed and kept), then ``--rounds`` interleaved rounds time ``find``
of the same paths.  Reported: medians (ns a find), the ratio, a drift check, and the
bytes the parsed pages hold (tracemalloc, while parsing them).  The other commit's
module is loaded from ``git show REV:packfs/core/lookupindex.py`` into this package.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import packfs  # noqa: E402
from packfs.core import Archive  # noqa: E402
from packfs.core import lookupindex as this_module  # noqa: E402
from packfs.core.tail import PageCache  # noqa: E402


def other_module(rev: str, work: Path):
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:packfs/core/lookupindex.py"], check=True,
                            capture_output=True).stdout
    path = work / "other_lookupindex.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("packfs.core._other_lookupindex", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its relative imports resolve in packfs.core
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default="a09944c^")
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        names = [f"d{k % 100:02d}/{k:07d}.jpg" for k in range(args.files)]
        packfs.pack_entries((packfs.Entry(name, b"x" * 10) for name in names), work / "a.ffr")
        modules = {"other": other_module(args.against, work), "this": this_module}
        probe = [name.encode() for name in random.Random(1).sample(names, min(2000, len(names)))]
        with Archive(str(work / "a.ffr")) as archive, open(work / "a.ffr", "rb") as file:
            tail = archive._container.tail  # noqa: SLF001 (the index's pages, as a remote reader has them)

            def fetch(start: int, end: int) -> bytes:
                return os.pread(file.fileno(), end - start, start)

            indexes, held = {}, {}
            for name, module in modules.items():
                tracemalloc.start()
                index = module.LookupIndex(tail, fetch, PageCache(1 << 30), "bench")
                for key in probe:
                    assert index.find(key) is not None
                held[name] = tracemalloc.get_traced_memory()[0]
                tracemalloc.stop()
                indexes[name] = index
            times: dict[str, list] = {"other": [], "this": []}
            for _ in range(args.rounds):
                for name, index in indexes.items():
                    began = time.perf_counter()
                    for key in probe:
                        index.find(key)
                    times[name].append((time.perf_counter() - began) / len(probe) * 1e9)
    other, this = statistics.median(times["other"]), statistics.median(times["this"])
    print(f"{args.files:,} files, {len(probe):,} paths, {args.rounds} interleaved rounds, CPUs "
          f"{sorted(os.sched_getaffinity(0))}; {args.against} against this tree:")
    print(f"  warm find: {other:.0f} ns against {this:.0f} ns (this / other {this / other:.2f}; drift this "
          f"{times['this'][-1] / times['this'][0]:.2f}, other {times['other'][-1] / times['other'][0]:.2f})")
    print(f"  parsed pages held: {held['other'] / 2**20:.1f} MiB against {held['this'] / 2**20:.1f} MiB "
          f"(this / other {held['this'] / held['other']:.2f})")


if __name__ == "__main__":
    main()
