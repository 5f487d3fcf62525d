"""A shard set through the compiled daemon next to one archive of the same tree, in one run.

    python bench/mount_sets.py                                 # both parts, defaults below
    python bench/mount_sets.py --parts walk --shards 64 --files 64000
    python bench/mount_sets.py --parts scale --large-shards 1000 --large-entries 10000

Part "walk": ``--files`` small files in 250 folders, packed once as one archive and once
as ``--shards`` shards of consecutive files (as ``packfs pack --shards`` would cut
them).  Each round mounts each (``packfs mount -f --binding lowlevel``, the daemon
pinned to CPU ``--daemon-cpu``, this reader to ``--reader-cpu``), in alternating
order, and on the fresh mount times: ``stat`` of 2,000 random files (LOOKUPs), a read
of 2,000 other random files (their first READ), ``os.walk`` of the whole tree twice
(the second is warm: the kernel keeps the listings).  The archives stay in the page
cache: this measures the daemon, not the disk.

Part "scale": ``--large-shards`` shards of ``--large-entries`` entries each, and one
archive of the same tree; mount time (starting ``packfs mount -f`` to the mountpoint
being mounted, the archives in the page cache), the latency of ``stat`` of random
files on a fresh mount and the daemon's RSS after them, alternating set and archive
each round.

Every figure is the median over ``--rounds``; the ratios are set / one archive (a
time ratio: below 1 the set is faster), computed per round then the median.  The drift
check runs the first round's first system again at the end.  Writes ``mount_sets.json``
and ``.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import packfs  # noqa: E402

PYTHON = sys.executable
MOUNT_TIMEOUT_S = 600
FOLDERS = 250
SAMPLE = 2000


class Tree:
    """``count`` files in ``folders`` folders, path by index, in depth-first order (what
    a shard's range follows): no list of millions of paths is kept."""

    def __init__(self, count: int, folders: int) -> None:
        self.count, self.per = count, -(-count // folders)

    def path(self, index: int) -> str:
        return f"c{index // self.per:05d}/f{index:08d}.bin"

    def sample(self, rng: random.Random, size: int) -> list[str]:
        return [self.path(index) for index in rng.sample(range(self.count), size)]


def _pack(tree: Tree, start: int, stop: int, out: Path, size: int) -> None:
    def entries():
        for index in range(start, stop):
            path = tree.path(index)
            yield packfs.Entry(path, (path.encode() * (size // len(path) + 1))[:size])

    packfs.pack_entries(entries(), out, count=stop - start, force=True)


def pack_tree(tree: Tree, shards: int, work: Path, name: str, size: int) -> tuple[Path, str]:
    """One archive and a set of ``shards`` of the same tree (reused when complete), the
    two packed side by side in two processes."""
    one = work / f"{name}-one.ffr"
    set_dir = work / f"{name}-set"
    marker = work / f".{name}-complete"
    if marker.exists():
        return one, str(set_dir / "s*.ffr")
    started = time.perf_counter()
    set_dir.mkdir(parents=True, exist_ok=True)
    for stale in set_dir.glob("s*.ffr"):
        stale.unlink()
    child = os.fork()
    if child == 0:
        try:
            _pack(tree, 0, tree.count, one, size)
        finally:
            os._exit(0)
    per = -(-tree.count // shards)
    for index in range(shards):
        if index * per < tree.count:
            _pack(tree, index * per, min((index + 1) * per, tree.count), set_dir / f"s{index:05d}.ffr", size)
    os.waitpid(child, 0)
    if not one.exists():
        raise SystemExit(f"packing {one} failed")
    print(f"  packed {name}: {tree.count} files, one archive and {shards} shards, "
          f"{time.perf_counter() - started:.0f} s", file=sys.stderr)
    marker.touch()
    return one, str(set_dir / "s*.ffr")


class Mount:
    """``packfs mount -f`` pinned to a CPU; its mount time; unmounted at exit."""

    def __init__(self, spec: str, mountpoint: Path, cpu: int, log: Path) -> None:
        self.spec, self.mountpoint, self.cpu, self.log = spec, mountpoint, cpu, log
        self.mount_s = float("nan")

    def __enter__(self) -> Mount:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        if os.path.ismount(self.mountpoint):
            subprocess.run(["fusermount", "-u", "-z", str(self.mountpoint)], capture_output=True)
        with open(self.log, "wb") as log:
            start = time.perf_counter()
            self.process = subprocess.Popen(["taskset", "-c", str(self.cpu), PYTHON, "-m", "packfs", "mount", "-f",
                                             "--binding", "lowlevel", self.spec, str(self.mountpoint)],
                                            stdout=subprocess.DEVNULL, stderr=log)
        while not os.path.ismount(self.mountpoint):
            if self.process.poll() is not None:
                raise RuntimeError(f"mount of {self.spec} exited with {self.process.returncode}: "
                                   f"{self.log.read_text()[-1000:]}")
            if time.perf_counter() - start > MOUNT_TIMEOUT_S:
                self.process.kill()
                raise RuntimeError(f"mount of {self.spec} did not finish in {MOUNT_TIMEOUT_S} s")
            time.sleep(0.002)
        self.mount_s = time.perf_counter() - start
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["fusermount", "-u", str(self.mountpoint)], capture_output=True)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            subprocess.run(["fusermount", "-u", "-z", str(self.mountpoint)], capture_output=True)


def resident_mib(pid: int) -> float:
    """The daemon's VmRSS (``taskset`` execs it: the pid is the daemon's)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))) / 1024


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def walk_count(root: Path) -> int:
    return sum(len(files) + len(directories) for _, directories, files in os.walk(root))


def one_walk_round(spec: str, mountpoint: Path, args: argparse.Namespace, tree: Tree, seed: int) -> dict:
    rng = random.Random(seed)
    stats, reads = tree.sample(rng, SAMPLE), tree.sample(rng, SAMPLE)
    with Mount(spec, mountpoint, args.daemon_cpu, args.work / "daemon.log") as mounted:
        root = mounted.mountpoint
        row = {"mount_s": mounted.mount_s}
        row["stat_s"] = timed(lambda: [os.stat(root / p) for p in stats])
        row["read_s"] = timed(lambda: [(root / p).read_bytes() for p in reads])
        counted = []
        row["walk_first_s"] = timed(lambda: counted.append(walk_count(root)))
        row["walk_warm_s"] = timed(lambda: counted.append(walk_count(root)))
        if counted[0] != counted[1] or counted[0] < tree.count:
            raise RuntimeError(f"{spec}: the walks saw {counted}, expected {tree.count} files and their folders")
    return row


def alternate(systems: dict[str, str], rounds: int, measure) -> tuple[dict[str, list[dict]], dict]:
    """Each round measures every system, in an order alternating round by round; the
    first round's first system again at the end (the drift check)."""
    runs: dict[str, list[dict]] = {name: [] for name in systems}
    names = list(systems)
    for number in range(rounds):
        for name in (names if number % 2 == 0 else names[::-1]):
            runs[name].append(measure(systems[name], number))
            print(f"  round {number + 1} {name}: {runs[name][-1]}", file=sys.stderr)
    again = measure(systems[names[0]], 0)
    return runs, {"system": names[0], "first": runs[names[0]][0], "again": again}


def summarise(runs: dict[str, list[dict]], keys: list[str]) -> dict:
    one, shards = runs["one archive"], runs["shard set"]
    out = {}
    for key in keys:
        out[key] = {"one_median": statistics.median(r[key] for r in one),
                    "set_median": statistics.median(r[key] for r in shards),
                    "ratio_median": statistics.median(s[key] / o[key] for s, o in zip(shards, one))}
    return out


def part_walk(args: argparse.Namespace, report: dict) -> None:
    tree = Tree(args.files, FOLDERS)
    one, spec = pack_tree(tree, args.shards, args.work, f"walk-{args.files}-{args.shards}", 1024)
    mountpoint = args.work / "m-walk"
    systems = {"one archive": str(one), "shard set": spec}
    runs, drift = alternate(systems, args.rounds,
                            lambda s, n: one_walk_round(s, mountpoint, args, tree, 1000 + n))
    keys = ["mount_s", "stat_s", "read_s", "walk_first_s", "walk_warm_s"]
    report["walk"] = {"files": args.files, "shards": args.shards, "rounds": args.rounds, "runs": runs,
                      "summary": summarise(runs, keys), "drift": drift}


def one_scale_round(spec: str, mountpoint: Path, args: argparse.Namespace, tree: Tree, seed: int) -> dict:
    sample = tree.sample(random.Random(seed), SAMPLE)
    with Mount(spec, mountpoint, args.daemon_cpu, args.work / "daemon.log") as mounted:
        root = mounted.mountpoint
        latencies = []
        for path in sample:
            start = time.perf_counter()
            os.stat(root / path)
            latencies.append(time.perf_counter() - start)
        return {"mount_s": mounted.mount_s, "stat_median_us": statistics.median(latencies) * 1e6,
                "stat_mean_us": statistics.fmean(latencies) * 1e6, "rss_mib": resident_mib(mounted.process.pid)}


def part_scale(args: argparse.Namespace, report: dict) -> None:
    # A shard's entries: its files, its folders (4) and their ancestors (the root).
    tree = Tree(args.large_shards * (args.large_entries - 5), args.large_shards * 4)
    one, spec = pack_tree(tree, args.large_shards, args.work, f"scale-{args.large_shards}-{args.large_entries}", 16)
    for path in [one, *Path(spec).parent.glob("s*.ffr")]:
        with open(path, "rb") as warm:  # in the page cache, as a remount finds them
            while warm.read(1 << 24):
                pass
    with packfs.core.open_archive(spec) as shards:
        entries = shards.entry_count
    mountpoint = args.work / "m-scale"
    systems = {"one archive": str(one), "shard set": spec}
    runs, drift = alternate(systems, args.rounds,
                            lambda s, n: one_scale_round(s, mountpoint, args, tree, 2000 + n))
    report["scale"] = {"shards": args.large_shards, "set_entries": entries, "rounds": args.rounds, "runs": runs,
                       "summary": summarise(runs, ["mount_s", "stat_median_us", "stat_mean_us", "rss_mib"]),
                       "drift": drift}


def render(report: dict) -> str:
    lines = [f"Run {report['date']} on {report['machine']}; CPU placement: {report['cpus']}.", ""]
    labels = {"mount_s": "mount (s)", "stat_s": f"stat of {SAMPLE} random files, fresh mount (s)",
              "read_s": f"first read of {SAMPLE} random files (s)", "walk_first_s": "os.walk, first (s)",
              "walk_warm_s": "os.walk, warm (s)", "stat_median_us": "stat of a random file, median (us)",
              "stat_mean_us": "stat of a random file, mean (us)",
              "rss_mib": f"daemon RSS after the {SAMPLE} stats (MiB)"}
    for part, title in (("walk", "shard set vs one archive, same tree"), ("scale", "a large set vs one archive")):
        if part not in report:
            continue
        data = report[part]
        size = (f"{data['files']:,} files, {data['shards']} shards" if part == "walk"
                else f"{data['shards']:,} shards, {data['set_entries']:,} entries")
        lines += [f"### {title} ({size}; medians of {data['rounds']} rounds)", "",
                  "| measure | one archive | shard set | set / one (time) |", "|---|---:|---:|---:|"]
        for key, row in data["summary"].items():
            lines.append(f"| {labels[key]} | {row['one_median']:.4g} | {row['set_median']:.4g} | "
                         f"{row['ratio_median']:.2f} |")
        drift = data["drift"]
        key = next(iter(data["summary"]))
        lines += ["", f"Drift check ({drift['system']}, {labels[key]}): first round {drift['first'][key]:.4g}, "
                      f"again at the end {drift['again'][key]:.4g} (x{drift['again'][key] / drift['first'][key]:.2f}); "
                      + ", ".join(f"{labels[k]} x{drift['again'][k] / drift['first'][k]:.2f}"
                                  for k in data["summary"] if k != key), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="walk,scale")
    parser.add_argument("--files", type=int, default=64000)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--large-shards", type=int, default=1000)
    parser.add_argument("--large-entries", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--daemon-cpu", type=int, default=1)
    parser.add_argument("--reader-cpu", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/packfs-bench-sets"))
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    os.sched_setaffinity(0, {args.reader_cpu})
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
                         f"Python {platform.python_version()}",
              "cpus": f"reader on CPU {args.reader_cpu}, daemon on CPU {args.daemon_cpu} (taskset)"}
    for part in args.parts.split(","):
        {"walk": part_walk, "scale": part_scale}[part](args, report)
    text = render(report)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mount_sets.json").write_text(json.dumps(report, indent=1))
    (args.out / "mount_sets.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
