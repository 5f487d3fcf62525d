"""pack_entries of N tiny entries: entries/s and the packing process's peak RSS, for
one or two checkouts side by side, and for the largest archive its open time, lookups/s
(``Archive.lookup`` over random existing paths) and how long ``packfs mount`` (the
compiled daemon) takes to be ready.

Each pack runs in a fresh process pinned to one CPU (``--cpu``), timed inside it; the
peak RSS is that process's VmHWM.  Paths are ``d{i//1000:05d}/f{i:08d}`` (1,000 files a
directory), each file 4 bytes, given as a list in depth-first order.

    python bench/pack_scale.py --quick                       # 20,000 and 200,000
    python bench/pack_scale.py --sizes 1000000 10000000 --old /tmp/packfs-main --old-sizes 1000000
    python bench/pack_scale.py --sizes 100000000 --dir /tmp --keep-none

``--old CHECKOUT`` packs the sizes in ``--old-sizes`` with that checkout too (alternating
with this one, ``--rounds`` times each): its medians beside this one's, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_PACK = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import packfs
from packfs import Entry
n, out = int(sys.argv[2]), sys.argv[3]

class Tiny:
    # A sequence of N entries made on demand: the input itself holds nothing per entry.
    def __len__(self):
        return n
    def __getitem__(self, i):
        if not 0 <= i < n:
            raise IndexError(i)
        return Entry("d%05d/f%08d" % (i // 1000, i), b"%04d" % (i % 10000))
    def __iter__(self):
        for i in range(n):
            yield Entry("d%05d/f%08d" % (i // 1000, i), b"%04d" % (i % 10000))

start = time.perf_counter()
packfs.pack_entries(Tiny(), out, count=n, force=True)
seconds = time.perf_counter() - start
hwm = 0
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        hwm = int(line.split()[1]) * 1024
print(json.dumps({"seconds": seconds, "peak_rss": hwm}))
"""

_OPEN = r"""
import json, random, sys, time
sys.path.insert(0, sys.argv[1])
from packfs.core import Archive
path, n = sys.argv[2], int(sys.argv[3])
start = time.perf_counter()
archive = Archive(path)
opened = time.perf_counter() - start
rng = random.Random(1)
keys = ["d%05d/f%08d" % (i // 1000, i) for i in (rng.randrange(n) for _ in range(200000))]
start = time.perf_counter()
for key in keys:
    if archive.lookup(key) is None:
        raise SystemExit("missing " + key)
lookup = time.perf_counter() - start
print(json.dumps({"open_seconds": opened, "lookups_per_s": len(keys) / lookup}))
"""


def _pinned(cpu: str | None) -> list[str]:
    return ["taskset", "-c", cpu] if cpu else []


def pack(checkout: Path, n: int, out: Path, cpu: str | None) -> dict:
    python = checkout / ".venv" / "bin" / "python"
    result = subprocess.run(_pinned(cpu) + [str(python), "-c", _PACK, str(checkout), str(n), str(out)],
                            check=True, capture_output=True, text=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def serve(checkout: Path, n: int, out: Path, cpu: str | None) -> dict:
    python = checkout / ".venv" / "bin" / "python"
    result = subprocess.run(_pinned(cpu) + [str(python), "-c", _OPEN, str(checkout), str(out), str(n)],
                            check=True, capture_output=True, text=True)
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    figures["mount_seconds"] = mount_time(checkout, out)
    return figures


def mount_time(checkout: Path, archive: Path) -> float:
    """Seconds from ``packfs mount`` starting to the mount answering a stat of a file."""
    packfs = checkout / ".venv" / "bin" / "packfs"
    with tempfile.TemporaryDirectory() as mountpoint:
        start = time.perf_counter()
        process = subprocess.Popen([str(packfs), "mount", str(archive), mountpoint, "--foreground"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            probe = os.path.join(mountpoint, "d00000", "f00000000")
            while True:
                try:
                    os.stat(probe)
                    break
                except OSError:
                    if process.poll() is not None:
                        raise SystemExit("packfs mount failed: " + process.stderr.read().decode())
                    if time.perf_counter() - start > 60:
                        raise SystemExit("packfs mount not ready after 60 s")
                    time.sleep(0.002)
            ready = time.perf_counter() - start
        finally:
            subprocess.run(["fusermount3", "-u", mountpoint], check=False, capture_output=True)
            process.wait(timeout=30)
    return ready


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--quick", action="store_true", help="20,000 and 200,000 entries")
    parser.add_argument("--old", type=Path, help="another checkout (its .venv) to run side by side")
    parser.add_argument("--old-sizes", type=int, nargs="*", default=[1_000_000])
    parser.add_argument("--rounds", type=int, default=1, help="packs per side and size (median)")
    parser.add_argument("--cpu", default="1", help="taskset CPU list for each pack ('' for none)")
    parser.add_argument("--dir", type=Path, default=None, help="where archives are written")
    args = parser.parse_args()
    sizes = [20_000, 200_000] if args.quick else args.sizes
    cpu = args.cpu or None
    work = Path(tempfile.mkdtemp(prefix="pack-scale-", dir=args.dir))
    print(f"CPU placement: {'taskset -c ' + cpu if cpu else 'none'}; archives in {work}")
    sides = [("new", ROOT)] + ([("old", args.old.resolve())] if args.old else [])
    try:
        for n in sizes:
            figures: dict[str, list[dict]] = {}
            for _ in range(args.rounds):
                for name, checkout in sides:
                    if name == "old" and n not in args.old_sizes:
                        continue
                    out = work / f"{name}-{n}.ffr"
                    figures.setdefault(name, []).append(pack(checkout, n, out, cpu))
                    if name == "old":
                        out.unlink()
            medians = {}
            for name, runs in figures.items():
                seconds = statistics.median(run["seconds"] for run in runs)
                rss = max(run["peak_rss"] for run in runs)
                spread = max(run["seconds"] for run in runs) / min(run["seconds"] for run in runs)
                drift = runs[-1]["seconds"] / runs[0]["seconds"]
                medians[name] = seconds
                print(f"{name:>3} N={n:>11,}: {seconds:8.1f} s  {n / seconds:>9,.0f} entries/s  "
                      f"peak RSS {rss / 2**20:7.0f} MiB ({rss / n:6.1f} B/entry)  "
                      f"spread {spread:.2f}  drift {drift:.2f}", flush=True)
            if "old" in medians:
                print(f"    N={n:,}: new/old time {medians['new'] / medians['old']:.2f}", flush=True)
        largest = max(sizes)
        served = serve(ROOT, largest, work / f"new-{largest}.ffr", cpu)
        print(f"N={largest:,} archive: {os.path.getsize(work / f'new-{largest}.ffr') / 2**30:.2f} GiB, "
              f"opens in {served['open_seconds'] * 1000:.1f} ms, "
              f"{served['lookups_per_s']:,.0f} lookups/s, mount ready in {served['mount_seconds']:.3f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
