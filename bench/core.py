"""Core benchmark: pack rate, open cost at scale, and Python API read rates.

Every figure is measured side by side in one run and reported as a ratio where there
is an alternative (the machines are shared: ratios hold, absolute times drift).

    python bench/core.py                 # defaults: 20,000 files, 1,000,000 entries
    python bench/core.py --files 2000 --entries 100000 --out bench/results

Writes ``core.json`` and ``core.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import packfs  # noqa: E402


def best_of(runs: int, function) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def make_tree(root: Path, count: int, size: int, folders: int = 100) -> list[str]:
    rng = random.Random(0)
    paths = []
    for i in range(count):
        relative = f"class{i % folders:04d}/{i:08d}.bin"
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(size))
        paths.append(relative)
    return paths


def bench_pack(work: Path, files: int) -> dict[str, float]:
    src = work / "pack-src"
    make_tree(src, files, 16 << 10)
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    subprocess.run(["sync"], check=False)
    packfs_time = best_of(3, lambda: packfs.pack_folder(src, work / "p.ffr", force=True))
    tar_time = best_of(3, lambda: subprocess.run(["tar", "cf", str(work / "p.tar"), "-C", str(src), "."], check=True))
    return {
        "files": files,
        "bytes": total,
        "packfs_seconds": packfs_time,
        "packfs_files_per_s": files / packfs_time,
        "packfs_MB_per_s": total / packfs_time / 1e6,
        "tar_seconds": tar_time,
        "tar_over_packfs_time_ratio": tar_time / packfs_time,
    }


_OPEN_PROBE = r"""
import json, sys, time, random
sys.path.insert(0, sys.argv[2])
def rss():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024
import packfs
before, _ = rss()
start = time.perf_counter()
folder = packfs.PackedFolder(sys.argv[1], check_data=sys.argv[3] == "1")
opened = time.perf_counter() - start
after, peak_open = rss()
count = folder.entry_count
rng = random.Random(0)
names = []
for _ in range(20000):
    i = rng.randrange(count - 1001)
    names.append(f"d{i % 1000:03d}/f{i:08d}")
start = time.perf_counter()
found = sum(folder.exists(n) for n in names)
lookups = len(names) / (time.perf_counter() - start)
final, peak = rss()
print(json.dumps({"open_s": opened, "rss_before": before, "rss_after_open": after,
                  "rss_after_lookups": final, "peak_rss_open": peak_open, "peak_rss": peak, "lookups_per_s": lookups,
                  "found": found}))
"""


def _mount_probe(archive: Path, mountpoint: Path) -> dict[str, float]:
    """Mount time (command start to return), daemon RSS, and `find | wc -l` through it."""
    from packfs.mount import state_file

    mountpoint.mkdir(exist_ok=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "packfs", "mount", str(archive), str(mountpoint)],
                   check=True, capture_output=True)
    mount_s = time.perf_counter() - start
    pid = int(Path(state_file(str(mountpoint), ".pid")).read_text())
    try:
        def rss_kib() -> int:
            return int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0])

        rss_mounted = rss_kib()
        start = time.perf_counter()
        found = subprocess.run(f"find {mountpoint} | wc -l", shell=True, check=True,
                               capture_output=True, text=True).stdout.strip()
        find_s = time.perf_counter() - start
        peak = int(Path(f"/proc/{pid}/status").read_text().split("VmHWM:")[1].split()[0])
        return {"mount_s": mount_s, "daemon_rss_mounted_MiB": rss_mounted / 1024,
                "find_wc_s": find_s, "find_count": int(found), "daemon_peak_rss_MiB": peak / 1024}
    finally:
        subprocess.run([sys.executable, "-m", "packfs", "unmount", str(mountpoint)], check=False)


def bench_scale(work: Path, entries: int) -> dict[str, object]:
    results: dict[str, object] = {}
    for count in (1000, entries):
        out = work / f"scale-{count}.ffr"

        def generate():
            for i in range(count):
                yield packfs.Entry(f"d{i % 1000:03d}/f{i:08d}", b"")

        start = time.perf_counter()
        packfs.pack_entries(generate(), out, count=count)
        pack_seconds = time.perf_counter() - start
        row: dict[str, object] = {"pack_s": pack_seconds, "archive_bytes": out.stat().st_size}
        row["mount"] = _mount_probe(out, work / f"mnt-{count}")
        for check in ("1", "0"):
            probe = subprocess.run(
                [sys.executable, "-c", _OPEN_PROBE, str(out), str(Path(__file__).resolve().parent.parent), check],
                capture_output=True, text=True, check=True,
            )
            row[f"check_data={check == '1'}"] = json.loads(probe.stdout)
        results[str(count)] = row
        if count != entries:
            out.unlink()
    return results


def bench_api(work: Path, size: int, count: int = 5000) -> dict[str, float]:
    src = work / f"api-{size}"
    paths = make_tree(src, count, size)
    archive = work / f"api-{size}.ffr"
    packfs.pack_folder(src, archive, force=True)
    checked = packfs.PackedFolder(archive)
    unchecked = packfs.PackedFolder(archive, check_data=False)

    def plain():
        for p in paths:
            with open(src / p, "rb") as f:
                f.read()

    def reader(function):
        # Drop each result as plain() does: keeping them all would time page faults on
        # fresh memory, not reads.
        def run():
            for p in paths:
                function(p)
        return run

    for function in (plain, reader(checked.read)):  # warm the page cache
        function()
    baseline = best_of(5, plain)
    rows = {
        "open().read() files/s": count / baseline,
        "read check_data=True": baseline / best_of(5, reader(checked.read)),
        "read check_data=False": baseline / best_of(5, reader(unchecked.read)),
        "read_view check_data=False": baseline / best_of(5, reader(unchecked.read_view)),
    }
    baseline_end = best_of(5, plain)
    rows["drift (plain at end / start)"] = baseline_end / baseline
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="packfs-bench-", dir=args.work))
    try:
        results = {
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
            "command": " ".join(["python"] + sys.argv),
            "pack": bench_pack(work, args.files),
            "scale": bench_scale(work, args.entries),
            "api_4KiB": bench_api(work, 4096),
            "api_100KB": bench_api(work, 100_000),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "core.json").write_text(json.dumps(results, indent=2))
    lines = [f"# packfs core benchmark, {results['date']}", "",
             f"Machine: {results['machine']}. Command: `{results['command']}`.", ""]
    pack = results["pack"]
    lines += ["| pack | value |", "|---|---|",
              f"| files, bytes | {pack['files']}, {pack['bytes'] / 1e6:.0f} MB |",
              f"| packfs files/s | {pack['packfs_files_per_s']:,.0f} |",
              f"| packfs MB/s | {pack['packfs_MB_per_s']:,.0f} |",
              f"| tar time / packfs time | {pack['tar_over_packfs_time_ratio']:.2f} |", ""]
    lines += ["| entries | check_data | open ms | RSS growth at open | peak RSS growth during open | RSS after 20k lookups | lookups/s |",
              "|---|---|---|---|---|---|---|"]
    for count, row in results["scale"].items():
        for check in ("True", "False"):
            probe = row[f"check_data={check}"]
            lines.append(
                f"| {int(count):,} | {check} | {probe['open_s'] * 1000:.1f} | "
                f"{(probe['rss_after_open'] - probe['rss_before']) / 2**20:.1f} MiB | "
                f"{(probe['peak_rss_open'] - probe['rss_before']) / 2**20:.1f} MiB | "
                f"{(probe['rss_after_lookups'] - probe['rss_before']) / 2**20:+.1f} MiB | "
                f"{probe['lookups_per_s']:,.0f} |")
    lines += ["", "| entries | mount time | daemon RSS mounted | `find | wc -l` | daemon peak RSS after find |",
              "|---|---|---|---|---|"]
    for count, row in results["scale"].items():
        m = row["mount"]
        lines.append(f"| {int(count):,} | {m['mount_s']:.2f} s | {m['daemon_rss_mounted_MiB']:.1f} MiB | "
                     f"{m['find_wc_s']:.2f} s ({m['find_count']:,} lines) | {m['daemon_peak_rss_MiB']:.1f} MiB |")
    lines.append("")
    for key in ("api_4KiB", "api_100KB"):
        lines += [f"| {key}: ratio to open().read() (higher is faster) | value |", "|---|---|"]
        lines += [f"| {name} | {value:,.2f} |" for name, value in results[key].items()]
        lines.append("")
    (args.out / "core.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
