"""How packfs mounts scale with the number of entries, next to the alternatives, in one run.

Two measurements:

1. First ``ls -l`` of one directory holding 300,000 small files (``--files``).  The same
   tree is served by the plain directory, ``packfs mount --binding lowlevel``,
   ``packfs mount --binding mfusepy`` and ``squashfuse_ll``.  Each system is mounted
   fresh, the page cache, dentries and inodes are dropped, then ``ls -l MNT/dir`` is
   timed once (cold) and again (warm).  The plain directory is measured just before
   each system and every time is also given as a ratio to that adjacent baseline
   (time / plain time, so lower is better): absolute times drift on a shared machine,
   ratios to a neighbour hold.  Figures are medians of ``--repeat`` runs.

2. Mount time, ``find MNT`` time and the daemon's peak RSS at 10,000,000 entries
   (``--entries``), for the lowlevel and mfusepy daemons.  The archive is written
   with ``packfs.pack_entries`` from a generator, so no files are made on disk.
   Mount time is from starting the daemon to ``os.path.ismount``; peak RSS is
   ``VmHWM`` from ``/proc/PID/status`` of the daemon (and any children), read after
   ``find`` has visited every entry.

Needs root (to drop caches), /dev/fuse, ``mksquashfs`` and ``squashfuse_ll``; a missing
tool is reported as skipped.  Run from the repository root::

    python bench/mount_scale.py                               # 300k files, 10M entries
    python bench/mount_scale.py --files 20000 --entries 1000000 --repeat 1   # quick check
    python bench/mount_scale.py --parts ls --reuse-archives   # only the 300k-file part, archives kept

The source tree, archives and mountpoints live in ``--work`` and are reused when a
marker says they are complete.  Tables are printed as markdown and written, with the
raw figures as JSON, to ``--out`` (``mount_scale.md``, ``mount_scale.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import packfs  # noqa: E402
# Page cache, dentries and inodes dropped: what a first listing after boot would meet.
from compare import drop_caches  # noqa: E402  (bench/ is sys.path[0] when run as a script)

PYTHON = sys.executable
MOUNT_TIMEOUT_S = 1800.0  # a 10M-entry archive on a Python daemon may take a while


# -- helpers -------------------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return found


def status_kib(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


class Daemon:
    """A FUSE daemon started in the foreground, so its pid is ours to watch and time.

    stderr goes to a file, not a pipe: a chatty daemon could fill a pipe nobody reads
    and stall.  Unmounting is ``fusermount -u``, then waiting for the process, so a
    daemon that died or hung shows up in ``exit_code`` instead of being hidden.
    """

    def __init__(self, name: str, command: list[str], mountpoint: Path, log: Path) -> None:
        self.name, self.command, self.mountpoint, self.log = name, command, mountpoint, log
        self.process: subprocess.Popen | None = None
        self.mount_s = float("nan")
        self.exit_code: int | None = None
        self.died_while_mounted = False

    def __enter__(self) -> Daemon:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        if os.path.ismount(self.mountpoint):  # left over from an interrupted run
            subprocess.run(["fusermount", "-u", "-z", str(self.mountpoint)], capture_output=True)
        log = open(self.log, "wb")
        start = time.perf_counter()
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=log)
        log.close()
        while not os.path.ismount(self.mountpoint):
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode} before mounting: "
                                   f"{self.log_tail()}")
            if time.perf_counter() - start > MOUNT_TIMEOUT_S:
                self.process.kill()
                raise RuntimeError(f"{self.name} did not mount within {MOUNT_TIMEOUT_S:.0f} s")
            time.sleep(0.002)  # the polling step bounds the mount-time error
        self.mount_s = time.perf_counter() - start
        return self

    def log_tail(self) -> str:
        try:
            return self.log.read_bytes().decode(errors="replace")[-1000:]
        except OSError:
            return ""

    def pids(self) -> list[int]:
        assert self.process is not None
        return [self.process.pid] + children_of(self.process.pid)

    def peak_rss_mib(self) -> float:
        return sum(status_kib(pid, "VmHWM") or 0 for pid in self.pids()) / 1024

    def __exit__(self, *exc: object) -> None:
        assert self.process is not None
        self.died_while_mounted = self.process.poll() is not None
        subprocess.run(["fusermount", "-u", str(self.mountpoint)], capture_output=True)
        try:
            self.exit_code = self.process.wait(120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.exit_code = self.process.wait()
            subprocess.run(["fusermount", "-u", "-z", str(self.mountpoint)], capture_output=True)


def timed_command(command: list[str], timeout: float | None = None) -> tuple[float, int]:
    """Wall time of a command with stdout to /dev/null, and its exit code."""
    start = time.perf_counter()
    try:
        code = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return float("nan"), -1
    return time.perf_counter() - start, code


def median(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


# -- part 1: the first `ls -l` of a 300,000-file directory -------------------------


def make_flat_tree(src: Path, files: int, marker: Path) -> bool:
    """SRC/dir/f000000 ... with a few bytes each; True when built in this run."""
    if marker.exists():
        return False
    if src.exists():
        shutil.rmtree(src)
    directory = src / "dir"
    directory.mkdir(parents=True)
    for i in range(files):
        with open(directory / f"f{i:06d}", "wb") as f:
            f.write(b"%d\n" % i)
    # The marker sits next to SRC, not in it, so the archives hold only dir/.
    marker.touch()
    return True


def ls_cold_warm(directory: Path, files: int) -> dict[str, float | int | str]:
    can_drop = drop_caches()
    cold, cold_code = timed_command(["ls", "-l", str(directory)])
    warm, warm_code = timed_command(["ls", "-l", str(directory)])
    # Checked after both timings so the check cannot warm anything they measure.
    try:
        listed = len(os.listdir(directory))
    except OSError as error:
        listed = -1
        print(f"  listdir {directory} failed: {error}", file=sys.stderr)
    result: dict[str, float | int | str] = {"cold_s": cold if can_drop else float("nan"), "warm_s": warm,
                                            "listed": listed}
    if cold_code or warm_code:
        result["ls_exit_codes"] = f"{cold_code},{warm_code}"
    if listed != files:
        print(f"  WARNING: {directory} lists {listed} entries, expected {files}", file=sys.stderr)
    return result


def part_ls(args: argparse.Namespace, report: dict) -> None:
    work: Path = args.work
    src = work / f"flat-{args.files}"
    marker = work / f".flat-{args.files}-complete"
    started = time.perf_counter()
    built = make_flat_tree(src, args.files, marker)
    part: dict = {"files": args.files, "repeat": args.repeat,
                  "tree_built_s": time.perf_counter() - started if built else None}
    report["ls"] = part
    skipped = report["skipped"]

    # Packed (and timed) in every run unless --reuse-archives: then archives newer than
    # the tree's marker are kept, since mksquashfs of one huge directory takes many minutes.
    pack: dict[str, float] = {}
    ffr, sqsh = work / f"flat-{args.files}.ffr", work / f"flat-{args.files}.sqsh"

    def fresh(path: Path) -> bool:
        return args.reuse_archives and path.exists() and path.stat().st_mtime > marker.stat().st_mtime

    if not fresh(ffr):
        start = time.perf_counter()
        subprocess.run([PYTHON, "-m", "packfs", "pack", "-f", "-q", str(src), str(ffr)], check=True)
        pack["packfs pack"] = time.perf_counter() - start
    have_squash = bool(shutil.which("mksquashfs") and shutil.which("squashfuse_ll"))
    if not have_squash:
        skipped["squashfuse_ll"] = "mksquashfs or squashfuse_ll not installed (apt-get install squashfs-tools squashfuse)"
    elif not fresh(sqsh):
        start = time.perf_counter()
        subprocess.run(["mksquashfs", str(src), str(sqsh), "-noappend", "-quiet", "-no-progress"], check=True,
                       stdout=subprocess.DEVNULL)
        pack["mksquashfs"] = time.perf_counter() - start
    part["pack_s"] = pack
    part["archive_bytes"] = {"packfs": ffr.stat().st_size, **({"squashfs": sqsh.stat().st_size} if have_squash else {})}

    systems: list[tuple[str, list[str]]] = [
        ("packfs (lowlevel)", [PYTHON, "-m", "packfs", "mount", "-f", "--binding", "lowlevel", str(ffr)]),
        ("packfs (mfusepy)", [PYTHON, "-m", "packfs", "mount", "-f", "--binding", "mfusepy", str(ffr)]),
    ]
    if have_squash:
        systems.append(("squashfuse_ll", ["squashfuse_ll", "-f", str(sqsh)]))

    runs: dict[str, list[dict]] = {name: [] for name, _ in systems}
    baselines: dict[str, list[dict]] = {name: [] for name, _ in systems}
    events: list[str] = part.setdefault("events", [])
    for r in range(args.repeat):
        for name, command in systems:
            # The plain directory just before each system: its ratio is to a neighbour.
            baselines[name].append(ls_cold_warm(src / "dir", args.files))
            mountpoint = work / ("m-" + "".join(c for c in name if c.isalnum() or c == "_"))
            daemon = Daemon(name, command + [str(mountpoint)], mountpoint, work / "daemon.log")
            with daemon:
                figures = ls_cold_warm(mountpoint / "dir", args.files)
                figures["mount_s"] = daemon.mount_s
                figures["daemon_peak_rss_mib"] = daemon.peak_rss_mib()
            figures["exit_code"] = daemon.exit_code
            if daemon.died_while_mounted or daemon.exit_code:
                events.append(f"run {r + 1}, {name}: daemon died while mounted={daemon.died_while_mounted}, "
                              f"exit code {daemon.exit_code}: {daemon.log_tail()}")
            runs[name].append(figures)
            b, f = baselines[name][-1], figures
            print(f"  run {r + 1} {name}: plain {b['cold_s']:.3f}/{b['warm_s']:.3f} s, "
                  f"{f['cold_s']:.3f}/{f['warm_s']:.3f} s (cold/warm)", file=sys.stderr)

    summary: dict[str, dict[str, float]] = {}
    every_plain = [b for name in baselines for b in baselines[name]]
    summary["plain directory"] = {"cold_s": median([b["cold_s"] for b in every_plain]),
                                  "warm_s": median([b["warm_s"] for b in every_plain])}
    for name, _ in systems:
        row: dict[str, float] = {}
        for state in ("cold", "warm"):
            value = median([f[f"{state}_s"] for f in runs[name]])
            base = median([b[f"{state}_s"] for b in baselines[name]])
            row[f"{state}_s"], row[f"plain_{state}_s"], row[f"{state}_ratio"] = value, base, value / base
            # Also the median of the per-run ratios, to show the ratio of medians is not a fluke.
            row[f"{state}_ratio_median_of_runs"] = median(
                [f[f"{state}_s"] / b[f"{state}_s"] for f, b in zip(runs[name], baselines[name])])
        row["mount_s"] = median([f["mount_s"] for f in runs[name]])
        row["daemon_peak_rss_mib"] = median([f["daemon_peak_rss_mib"] for f in runs[name]])
        summary[name] = row
    part["summary"] = summary
    part["runs"] = runs
    part["baselines"] = baselines


# -- part 2: mount time and peak RSS at 10,000,000 entries --------------------------


def part_entries(args: argparse.Namespace, report: dict) -> None:
    work: Path = args.work
    n = args.entries
    archive = work / f"entries-{n}.ffr"
    part: dict = {"entries": n, "directories": min(n, 1000)}
    report["entries"] = part
    if not archive.exists():  # pack_entries writes atomically: an archive that exists is whole
        start = time.perf_counter()
        stats = packfs.pack_entries((packfs.Entry(f"d{i % 1000:03d}/f{i}", b"x") for i in range(n)),
                                    archive, count=n)
        part["pack_s"] = time.perf_counter() - start
        part["pack_stats"] = dataclasses.asdict(stats)
    else:
        part["pack_s"] = None  # reused from an earlier run
    part["archive_bytes"] = archive.stat().st_size

    rows: dict[str, dict] = {}
    for binding in args.bindings.split(","):
        name = f"packfs ({binding})"
        mountpoint = work / f"m-entries-{binding}"
        # Cold: the archive's pages out of memory, as at a first mount after boot.
        drop_caches()
        daemon = Daemon(name, [PYTHON, "-m", "packfs", "mount", "-f", "--binding", binding, str(archive),
                               str(mountpoint)], mountpoint, work / f"daemon-entries-{binding}.log")
        row: dict = {}
        try:
            with daemon:
                row["mount_s"] = daemon.mount_s
                row["rss_after_mount_mib"] = sum(status_kib(p, "VmRSS") or 0 for p in daemon.pids()) / 1024
                row["find_s"], row["find_exit_code"] = timed_command(["find", str(mountpoint)],
                                                                     timeout=args.find_timeout)
                # Read before the checks below, which could only add to it.
                row["daemon_peak_rss_mib"] = daemon.peak_rss_mib()
                # Cheap spot checks that find saw a whole tree: 1000 directories at the
                # top and N/1000 files in the first.
                row["top_level_entries"] = len(os.listdir(mountpoint))
                row["d000_entries"] = len(os.listdir(mountpoint / "d000"))
        except RuntimeError as error:
            row["error"] = str(error)
        row["exit_code"] = daemon.exit_code
        row["died_while_mounted"] = daemon.died_while_mounted
        if daemon.died_while_mounted or daemon.exit_code:
            row["log_tail"] = daemon.log_tail()
        rows[name] = row
        print(f"  {name}: {row}", file=sys.stderr)
    part["systems"] = rows


# -- part 3: mount time alone, archives side by side ---------------------------------


def part_mount(args: argparse.Namespace, report: dict) -> None:
    """Time from starting ``packfs mount -f`` (pinned with taskset to ``--cpu``) to the
    mountpoint being mounted, warm (the archive in the page cache, as a remount finds
    it), checks on, for the part-2 archive and each ``--also`` archive (for example one
    packed by an older packfs), in turns so that drift hits them alike."""
    n = args.entries
    archives = {"this packfs's archive": args.work / f"entries-{n}.ffr"}
    for path in args.also:
        archives[f"{path.name}"] = path
    for path in archives.values():
        if not path.exists():
            raise SystemExit(f"{path} does not exist: run --parts entries first, or pack it")
    times: dict[str, list[float]] = {name: [] for name in archives}
    versions = {}
    for name, path in archives.items():
        with packfs.core.Archive(path) as opened:
            versions[name] = opened.version
        path.read_bytes() if path.stat().st_size < (4 << 30) else None  # warm: in the page cache
    for _ in range(args.repeat):
        for name, path in archives.items():
            mountpoint = args.work / "m-mount-time"
            daemon = Daemon(name, ["taskset", "-c", str(args.cpu), PYTHON, "-m", "packfs", "mount", "-f",
                                   "--binding", "lowlevel", str(path), str(mountpoint)], mountpoint,
                            args.work / "daemon-mount-time.log")
            with daemon:
                times[name].append(daemon.mount_s)
    report["mount"] = {"entries": n, "cpu": args.cpu, "repeat": args.repeat,
                       "rows": {name: {"version": versions[name], "median_s": median(values), "runs_s": values}
                                for name, values in times.items()}}


# -- the report --------------------------------------------------------------------


def fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None or value != value else f"{value:.{digits}f}"


def render(report: dict) -> str:
    lines = [f"Run {report['date']} on {report['machine']}; CPU placement: {report['cpus']}.",
             f"Command: `{report['command']}`", ""]
    timing = report.get("mount")
    if timing:
        lines += [f"### `packfs mount` of {timing['entries']:,} entries, warm, checks on",
                  "",
                  f"From starting `taskset -c {timing['cpu']} python -m packfs mount -f --binding lowlevel` to "
                  f"the mountpoint being mounted; median of {timing['repeat']} runs, archives in turns.",
                  "",
                  "| archive | format | median s | runs s |", "|---|---|---|---|"]
        for name, row in timing["rows"].items():
            lines.append(f"| {name} | {row['version']} | {fmt(row['median_s'])} | "
                         f"{', '.join(fmt(v) for v in row['runs_s'])} |")
        lines.append("")
    ls = report.get("ls")
    if ls:
        lines += [f"### First `ls -l` of one directory of {ls['files']:,} files",
                  "",
                  f"Medians of {ls['repeat']} runs.  Each system freshly mounted, then page cache, dentries and "
                  "inodes dropped; cold = the first `ls -l MNT/dir > /dev/null`, warm = the next one.  "
                  "Ratio = time / time of the plain directory measured just before that system, "
                  "same state (lower is better; 1.00 = as fast as the plain directory).",
                  "",
                  "| system | cold s | plain cold s | cold ratio | warm s | plain warm s | warm ratio | mount s |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, row in ls["summary"].items():
            if name == "plain directory":
                lines.append(f"| {name} (all its runs) | {fmt(row['cold_s'])} | | 1.00 | {fmt(row['warm_s'])} | "
                             f"| 1.00 | |")
            else:
                lines.append(f"| {name} | {fmt(row['cold_s'])} | {fmt(row['plain_cold_s'])} | "
                             f"{fmt(row['cold_ratio'], 2)} | {fmt(row['warm_s'])} | {fmt(row['plain_warm_s'])} | "
                             f"{fmt(row['warm_ratio'], 2)} | {fmt(row['mount_s'])} |")
        lines += ["", "| pack | seconds | archive MB |", "|---|---|---|"]
        if not ls["pack_s"]:
            lines.append("| (archives reused from an earlier run, not timed) | | |")
        sizes = {"packfs pack": ls["archive_bytes"].get("packfs"), "mksquashfs": ls["archive_bytes"].get("squashfs")}
        for name, seconds in ls["pack_s"].items():
            lines.append(f"| {name} | {seconds:.2f} | {sizes[name] / 1e6:.1f} |")
        for event in ls.get("events", []):
            lines.append(f"\nNote: {event}")
        lines.append("")
    entries = report.get("entries")
    if entries:
        pack = entries["pack_s"]
        lines += [f"### {entries['entries']:,} entries in {entries['directories']:,} directories",
                  "",
                  f"Archive {entries['archive_bytes'] / 1e6:.0f} MB, written by `packfs.pack_entries` in "
                  f"{'an earlier run' if pack is None else f'{pack:.1f} s'}.  Page cache dropped before each "
                  "mount; mount = from starting the daemon to `os.path.ismount`; find = `find MNT > /dev/null`; "
                  "peak RSS = VmHWM of the daemon after find.",
                  "",
                  "| daemon | mount s | find s | RSS after mount MiB | peak RSS MiB | checks |",
                  "|---|---|---|---|---|---|"]
        for name, row in entries["systems"].items():
            if "error" in row:
                lines.append(f"| {name} | failed: {row['error'][:200]} | | | | |")
                continue
            checks = (f"{row['top_level_entries']} top-level, {row['d000_entries']:,} in d000"
                      + (f", find exit {row['find_exit_code']}" if row["find_exit_code"] else "")
                      + (", daemon died" if row["died_while_mounted"] else "")
                      + (f", daemon exit {row['exit_code']}" if row["exit_code"] else ""))
            lines.append(f"| {name} | {fmt(row['mount_s'])} | {fmt(row['find_s'], 1)} | "
                         f"{fmt(row['rss_after_mount_mib'], 0)} | {fmt(row['daemon_peak_rss_mib'], 0)} | {checks} |")
        lines.append("")
    if report["skipped"]:
        lines.append("Skipped: " + "; ".join(f"{k}: {v}" for k, v in report["skipped"].items()))
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=300_000, help="files in the one directory of part 1")
    parser.add_argument("--entries", type=int, default=10_000_000, help="entries in the archive of part 2")
    parser.add_argument("--repeat", type=int, default=3, help="runs of part 1 (medians are reported)")
    parser.add_argument("--parts", default="ls,entries",
                        help="which parts to run: ls, entries, mount (comma-separated)")
    parser.add_argument("--also", type=Path, action="append", default=[],
                        help="part mount: another archive to time beside part 2's (repeatable)")
    parser.add_argument("--cpu", type=int, default=1, help="part mount: the CPU the daemon is pinned to")
    parser.add_argument("--reuse-archives", action="store_true",
                        help="keep part 1's archives when newer than its tree (no pack times then)")
    parser.add_argument("--bindings", default="lowlevel,mfusepy", help="packfs bindings for part 2")
    parser.add_argument("--find-timeout", type=float, default=7200.0, help="seconds before a find is abandoned")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "packfs-mount-scale")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "mount-scale-out")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    cpus = sorted(os.sched_getaffinity(0))
    report: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
                   f"Python {platform.python_version()}",
        # Nothing is pinned: the reader, ls/find and the daemons share whatever CPUs we have.
        "cpus": f"unpinned, {len(cpus)} CPUs available ({','.join(map(str, cpus))})",
        "locale": os.environ.get("LC_ALL") or os.environ.get("LANG") or "unset",
        "command": " ".join(["python"] + sys.argv),
        "skipped": {},
    }
    if os.geteuid() != 0:
        report["skipped"]["cold"] = "not root: caches cannot be dropped, cold figures are n/a"
    parts = set(args.parts.split(","))
    wall = time.perf_counter()
    if "ls" in parts:
        part_ls(args, report)
    if "entries" in parts:
        part_entries(args, report)
    if "mount" in parts:
        part_mount(args, report)
    report["wall_s"] = time.perf_counter() - wall
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mount_scale.json").write_text(json.dumps(report, indent=2))
    markdown = render(report)
    (args.out / "mount_scale.md").write_text(markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
