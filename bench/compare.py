"""packfs against the alternatives, side by side in one run: `make bench`.

Generates an ImageNet-like tree (JPEGs written with OpenCV in class folders, plus a few
large files), packs it with packfs, tar and mksquashfs, mounts it with packfs (the compiled
lowlevel daemon, mfusepy and fusepy), squashfuse_ll and ratarmount, and reads it the same ways through each.
Every figure is also given as a ratio to the plain directory measured in the same run,
just before each system (the machines are shared: absolute times drift, ratios to an
adjacent baseline hold), as the median of ``--repeat`` runs, with a drift check (the
plain directory measured again at the end against the start).

    python bench/compare.py                       # small default: a few minutes
    python bench/compare.py --images 20000 --folders 200 --large-mib 256

Writes ``compare.json`` and ``compare.md`` into ``--out``.  Tools that are missing
(squashfuse_ll, mksquashfs, ratarmount) are reported as skipped, never guessed.
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
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import packfs  # noqa: E402

HERE = Path(__file__).resolve().parent
RATARMOUNT = os.environ.get("RATARMOUNT", str(HERE / ".ratarmount-venv" / "bin" / "ratarmount"))


# -- the data ------------------------------------------------------------------------


def make_tree(root: Path, images: int, folders: int, large_mib: int, large_count: int = 2) -> None:
    import cv2
    import numpy as np

    marker = root / f".complete-{images}-{folders}-{large_mib}"
    if marker.exists():
        return
    if root.exists():
        shutil.rmtree(root)
    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, (360, 360, 3), dtype=np.uint8)
    smooth = cv2.GaussianBlur(base, (0, 0), 0.7)  # about 65 KB per JPEG, like ImageNet's
    for i in range(images):
        folder = root / "train" / f"n{i % folders:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        image = np.roll(smooth, (i * 7) % 360, axis=1)
        cv2.imwrite(str(folder / f"n{i % folders:08d}_{i:06d}.JPEG"), image, [cv2.IMWRITE_JPEG_QUALITY, 90])
    (root / "large").mkdir()
    for k in range(large_count):
        with open(root / "large" / f"blob{k}.bin", "wb") as f:
            for _ in range(large_mib):
                f.write(rng.bytes(1 << 20))
    marker.touch()


def file_list(root: Path) -> tuple[list[str], list[str], list[str]]:
    images, large = [], []
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            relative = os.path.relpath(os.path.join(dirpath, name), root)
            if name.endswith(".JPEG"):
                images.append(relative)
            elif name.endswith(".bin"):
                large.append(relative)
    return sorted(images), sorted(large), sorted(images + large)


# -- mounting each system ------------------------------------------------------------


class Mount:
    """A FUSE daemon started in the foreground, so its pid is ours to watch."""

    def __init__(self, name: str, command: list[str], mountpoint: Path) -> None:
        self.name, self.command, self.mountpoint = name, command, mountpoint
        self.process: subprocess.Popen | None = None
        self.mount_seconds = float("nan")

    def __enter__(self) -> Mount:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        while not os.path.ismount(self.mountpoint):
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} failed to mount: {self.process.stderr.read().decode()[-500:]}")
            time.sleep(0.002)
        self.mount_seconds = time.perf_counter() - start
        return self

    def daemon_pids(self) -> list[int]:
        """The daemon and its children (ratarmount and packfs may fork helpers)."""
        assert self.process is not None
        pids = [self.process.pid]
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    if int(Path(f"/proc/{pid}/stat").read_text().split()[3]) == self.process.pid:
                        pids.append(int(pid))
                except (OSError, IndexError):
                    pass
        return pids

    def peak_rss_mib(self) -> float:
        total = 0
        for pid in self.daemon_pids():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                total += int(status.split("VmHWM:")[1].split()[0])
            except (OSError, IndexError):
                pass
        return total / 1024

    def pin(self, cpus: set[int]) -> None:
        for pid in self.daemon_pids():
            for task in os.listdir(f"/proc/{pid}/task"):
                try:
                    os.sched_setaffinity(int(task), cpus)
                except OSError:
                    pass

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["fusermount", "-u", str(self.mountpoint)], capture_output=True)
        if self.process is not None:
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                subprocess.run(["fusermount", "-u", "-z", str(self.mountpoint)], capture_output=True)


# -- the measurements -----------------------------------------------------------------


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def read_file(path: str) -> int:
    with open(path, "rb") as f:
        return len(f.read())


def read_file_unbuffered(path: str) -> int:
    # buffering=0 skips open()'s isatty() ioctl, which FUSE sends to the daemon.
    with open(path, "rb", buffering=0) as f:
        return len(f.read())


def timed(function: Callable[[], object]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def median_time(repeat: int, function: Callable[[], object]) -> float:
    return statistics.median(timed(function) for _ in range(repeat))


def measure(root: Path, images: list[str], large: list[str], everything: list[str], repeat: int,
            mount: Mount | None, all_cpus: set[int]) -> dict[str, float]:
    import cv2

    paths = [str(root / p) for p in everything]
    image_paths = [str(root / p) for p in images]
    figures: dict[str, float] = {}
    can_drop = drop_caches()
    figures["pass1_cold_s"] = timed(lambda: [read_file(p) for p in paths]) if can_drop else float("nan")
    # The first pass a training job makes: every file once, in shuffled order, 1 thread.
    shuffled = paths[:]
    random.Random(0).shuffle(shuffled)
    can_drop = drop_caches()
    figures["pass1_cold_shuffled_s"] = (timed(lambda: [read_file(p) for p in shuffled]) if can_drop
                                        else float("nan"))
    can_drop = drop_caches()  # also the kernel's dentries and inodes: the walk asks the daemon
    figures["walk_cold_s"] = timed(lambda: [None for _ in os.walk(root)]) if can_drop else float("nan")
    read_all = lambda: [read_file(p) for p in paths]  # noqa: E731
    read_all()
    # Walks and large reads of the small default tree take milliseconds: time several in
    # a row, or the ratio is timer noise.
    figures["walk_warm_s"] = median_time(repeat, lambda: [None for _ in range(10) for _ in os.walk(root)]) / 10
    figures["pass2_warm_1thread_s"] = median_time(repeat, read_all)
    figures["pass2_warm_unbuffered_s"] = median_time(repeat, lambda: [read_file_unbuffered(p) for p in paths])
    os.sched_setaffinity(0, {0})
    if mount:
        mount.pin({0})
    figures["pass2_warm_1thread_pinned_s"] = median_time(repeat, read_all)
    os.sched_setaffinity(0, all_cpus)
    if mount:
        mount.pin(all_cpus)
    with ThreadPoolExecutor(8) as pool:
        figures["pass2_warm_8threads_s"] = median_time(repeat, lambda: list(pool.map(read_file, paths, chunksize=64)))
    def imread_all() -> None:
        for p in image_paths:
            cv2.imread(p)  # each image dropped: a list of 20,000 decoded images held 6.8 GB

    figures["imread_s"] = median_time(repeat, imread_all)

    def sequential() -> None:
        for p in large:
            with open(root / p, "rb", buffering=0) as f:
                while f.read(1 << 20):
                    pass

    can_drop = drop_caches()
    figures["large_sequential_cold_s"] = timed(sequential) if can_drop else float("nan")
    sequential()
    figures["large_sequential_s"] = median_time(repeat, lambda: [sequential() for _ in range(5)]) / 5
    return figures


def api_rates(tmp: Path, size: int, count: int, repeat: int) -> dict[str, float]:
    """PackedFolder against open().read() and zipfile, warm, for files of ``size``."""
    src = tmp / f"api-{size}"
    rng = __import__("random").Random(size)
    paths = []
    for i in range(count):
        relative = f"c{i % 50:03d}/{i:06d}.bin"
        (src / relative).parent.mkdir(parents=True, exist_ok=True)
        (src / relative).write_bytes(rng.randbytes(size))
        paths.append(relative)
    archive = tmp / f"api-{size}.ffr"
    packfs.pack_folder(src, archive, force=True)
    zip_path = tmp / f"api-{size}.zip"
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_STORED) as z:
        for p in paths:
            z.write(src / p, p)

    def plain() -> None:
        for p in paths:
            with open(src / p, "rb") as f:
                f.read()

    results: dict[str, float] = {}
    with packfs.PackedFolder(archive) as checked, packfs.PackedFolder(archive, check_data=False) as unchecked, \
            zipfile.ZipFile(zip_path) as z:
        readers = {
            "PackedFolder.read, checks on": checked.read,
            "PackedFolder.read, checks off": unchecked.read,
            "PackedFolder.read_view, checks off": unchecked.read_view,
            "zipfile.ZipFile.read": z.read,
        }
        plain()
        base = median_time(repeat, plain)
        results["open().read() files/s"] = count / base
        for name, function in readers.items():
            def run(function=function) -> None:
                for p in paths:
                    function(p)  # each result dropped, as plain() does
            run()
            results[name] = base / median_time(repeat, run)
    return results


# -- the run ---------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--folders", type=int, default=40)
    parser.add_argument("--large-mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "packfs-compare")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    work = args.work
    src = work / "src"
    make_tree(src, args.images, args.folders, args.large_mib)
    images, large, everything = file_list(src)
    total_bytes = sum((src / p).stat().st_size for p in everything)
    all_cpus = os.sched_getaffinity(0)
    report: dict[str, object] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}",
        "command": " ".join(["python"] + sys.argv),
        "tree": {"images": len(images), "large_files": len(large), "bytes": total_bytes,
                 "mean_image_bytes": sum((src / p).stat().st_size for p in images) // max(1, len(images))},
        "skipped": {},
    }
    skipped: dict[str, str] = report["skipped"]  # type: ignore[assignment]

    # Pack times.
    pack: dict[str, float] = {}
    archive = work / "tree.ffr"
    pack["packfs"] = timed(lambda: packfs.pack_folder(src, archive, force=True))
    tar = work / "tree.tar"
    pack["tar"] = timed(lambda: subprocess.run(["tar", "cf", str(tar), "-C", str(src), "."], check=True))
    squash = work / "tree.sqsh"
    if shutil.which("mksquashfs"):
        pack["mksquashfs"] = timed(lambda: subprocess.run(
            ["mksquashfs", str(src), str(squash), "-noappend", "-quiet", "-no-progress"], check=True,
            stdout=subprocess.DEVNULL))
    else:
        skipped["mksquashfs"] = "mksquashfs not installed (apt-get install squashfs-tools)"
    report["pack_seconds"] = pack

    systems: dict[str, dict[str, float]] = {}
    systems["plain"] = measure(src, images, large, everything, args.repeat, None, all_cpus)
    mounts = [
        ("packfs (lowlevel)", [sys.executable, "-m", "packfs", "mount", "-f", "--binding", "lowlevel", str(archive),
                               str(work / "m-packfs0")], work / "m-packfs0"),
        ("packfs (mfusepy)", [sys.executable, "-m", "packfs", "mount", "-f", "--binding", "mfusepy", str(archive),
                              str(work / "m-packfs")], work / "m-packfs"),
        ("packfs (fusepy)", [sys.executable, "-m", "packfs", "mount", "-f", "--binding", "fusepy", str(archive),
                             str(work / "m-packfs2")], work / "m-packfs2"),
    ]
    if shutil.which("squashfuse_ll") and squash.exists():
        mounts.append(("squashfuse_ll", ["squashfuse_ll", "-f", str(squash), str(work / "m-squash")],
                       work / "m-squash"))
    else:
        skipped["squashfuse_ll"] = "squashfuse_ll not installed (apt-get install squashfuse)"
    if os.path.exists(RATARMOUNT):
        index = Path(str(tar) + ".index.sqlite")
        if index.exists():
            index.unlink()  # measure a first mount, as a new user sees it
        mounts.append(("ratarmount", [RATARMOUNT, "-f", str(tar), str(work / "m-rat")], work / "m-rat"))
    else:
        skipped["ratarmount"] = f"ratarmount not found at {RATARMOUNT} (make bench installs it)"
    baselines: dict[str, dict[str, float]] = {}
    for name, command, mountpoint in mounts:
        # The plain directory again, just before: each system's ratios are to the
        # baseline measured next to it, so the machine's drift during the run (the
        # plain directory alone moved by up to 2x between start and end) cancels out.
        baselines[name] = measure(src, images, large, everything, args.repeat, None, all_cpus)
        with Mount(name, command, mountpoint) as mount:
            figures = measure(mountpoint, images, large, everything, args.repeat, mount, all_cpus)
            figures["mount_s"] = mount.mount_seconds
            figures["daemon_peak_rss_mib"] = mount.peak_rss_mib()
            systems[name] = figures
    systems["plain (again, drift check)"] = measure(src, images, large, everything, args.repeat, None, all_cpus)
    report["systems"] = systems
    report["baselines"] = baselines
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        report["api_4KiB"] = api_rates(Path(tmp), 4096, 5000, max(args.repeat, 3))
        report["api_100KB"] = api_rates(Path(tmp), 100_000, 3000, max(args.repeat, 3))

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compare.json").write_text(json.dumps(report, indent=2))
    markdown = render(report)
    (args.out / "compare.md").write_text(markdown)
    print(markdown)
    return 0


def render(report: dict) -> str:
    tree = report["tree"]
    systems = report["systems"]
    plain = systems["plain"]
    lines = [
        f"Run {report['date']} on {report['machine']}: `{report['command']}`.",
        f"Tree: {tree['images']} JPEGs (mean {tree['mean_image_bytes'] / 1000:.0f} KB) and "
        f"{tree['large_files']} large files, {tree['bytes'] / 1e6:.0f} MB.",
        "",
        "Ratios to the plain directory measured just before each system (higher is better);",
        "time in parentheses.  The last column is the plain directory at the end against",
        "its first measurement: the machine's drift over the run.",
        "",
    ]
    rows = [("first read, page cache dropped", "pass1_cold_s"),
            ("first read, page cache dropped, shuffled, 1 thread", "pass1_cold_shuffled_s"),
            ("`os.walk`, cold (caches dropped)", "walk_cold_s"), ("`os.walk`, warm", "walk_warm_s"),
            ("read every file, warm, 1 thread", "pass2_warm_1thread_s"),
            ("the same, reader and daemon on one CPU", "pass2_warm_1thread_pinned_s"),
            ("the same with `open(..., buffering=0)` (no isatty ioctl)", "pass2_warm_unbuffered_s"),
            ("read every file, warm, 8 threads", "pass2_warm_8threads_s"),
            ("`cv2.imread` of every image", "imread_s"),
            ("large files, sequential, cold", "large_sequential_cold_s"),
            ("large files, sequential, warm", "large_sequential_s")]
    names = [n for n in systems if n != "plain"]
    lines.append("| what | " + " | ".join(names) + " |")
    lines.append("|---|" + "---|" * len(names))
    for label, key in rows:
        cells = []
        for name in names:
            value = systems[name][key]
            base = report.get("baselines", {}).get(name, plain)[key]
            cells.append("n/a" if value != value else f"{base / value:.2f} ({value:.3f} s)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for label, key, unit in (("mount time", "mount_s", "s"), ("daemon peak RSS", "daemon_peak_rss_mib", "MiB")):
        cells = [f"{systems[n][key]:.2f} {unit}" if key in systems[n] else "" for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "| pack | seconds | ratio to tar |", "|---|---|---|"]
    for name, seconds in report["pack_seconds"].items():
        lines.append(f"| {name} | {seconds:.2f} | {report['pack_seconds']['tar'] / seconds:.2f} |")
    for key in ("api_4KiB", "api_100KB"):
        lines += ["", f"| Python API, {key[4:]} files, warm | ratio to `open().read()` |", "|---|---|"]
        for name, value in report[key].items():
            lines.append(f"| {name} | {value:,.2f} |")
    if report["skipped"]:
        lines += ["", "Skipped: " + "; ".join(f"{k}: {v}" for k, v in report["skipped"].items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
