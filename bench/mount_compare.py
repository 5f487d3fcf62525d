"""Read a tree of small images through packfs mounts (fusepy and mfusepy) next to the
plain directory and PackedFolder, in one run; report files/s and ratios.

    python bench/mount_compare.py --files 20000          # about 65 KB JPEGs in 200 folders

Each configuration: the page cache is dropped (when allowed), pass 1 reads every file
once (cold), pass 2 again (warm).  "pinned" runs the reader and the daemon on CPU 0.
Writes ``mount_compare.json`` and ``.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import packfs  # noqa: E402
from packfs.mount import state_file  # noqa: E402


def make_images(root: Path, count: int, folders: int) -> list[str]:
    import cv2
    import numpy as np

    marker = root / f".complete-{count}-{folders}"
    paths = [f"class{i % folders:03d}/{i:06d}.jpg" for i in range(count)]
    if marker.exists():
        return paths
    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, (256, 256, 3), dtype=np.uint8)
    for i, relative in enumerate(paths):
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        image = np.roll(base, i, axis=1)  # noise compresses badly: about 65 KB at q=75
        cv2.imwrite(str(path), image[:160], [cv2.IMWRITE_JPEG_QUALITY, 75])
    marker.touch()
    return paths


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def read_all(root: Path, paths: list[str]) -> float:
    start = time.perf_counter()
    for relative in paths:
        with open(root / relative, "rb") as f:
            f.read()
    return time.perf_counter() - start


def passes(root: Path, paths: list[str], cold: bool) -> dict[str, float]:
    dropped = drop_caches() if cold else False
    first = read_all(root, paths)
    second = min(read_all(root, paths) for _ in range(2))
    return {"pass1_files_per_s": len(paths) / first, "pass2_files_per_s": len(paths) / second,
            "cache_dropped": dropped}


def pin(pid: int | None, cpus: set[int]) -> None:
    os.sched_setaffinity(0, cpus)
    if pid:
        for task in os.listdir(f"/proc/{pid}/task"):  # every thread of the daemon
            os.sched_setaffinity(int(task), cpus)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--folders", type=int, default=200)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "packfs-bench-images")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    src = args.work / "src"
    paths = make_images(src, args.files, args.folders)
    archive = args.work / f"images-{args.files}.ffr"
    if not archive.exists():
        packfs.pack_folder(src, archive)
    size = sum((src / p).stat().st_size for p in paths)
    all_cpus = os.sched_getaffinity(0)
    results: dict[str, dict[str, object]] = {}
    for pinned in (False, True):
        suffix = " pinned" if pinned else ""
        pin(None, {0} if pinned else all_cpus)
        results["plain" + suffix] = passes(src, paths, cold=True)
        with packfs.PackedFolder(archive) as folder:
            drop_caches()
            start = time.perf_counter()
            for p in paths:
                folder.read(p)
            first = time.perf_counter() - start
            start = time.perf_counter()
            for p in paths:
                folder.read(p)
            results["PackedFolder.read" + suffix] = {
                "pass1_files_per_s": len(paths) / first,
                "pass2_files_per_s": len(paths) / (time.perf_counter() - start)}
        for binding in ("fusepy", "mfusepy"):
            mountpoint = args.work / f"mnt-{binding}"
            mountpoint.mkdir(exist_ok=True)
            subprocess.run([sys.executable, "-m", "packfs", "mount", "--binding", binding,
                            str(archive), str(mountpoint)], check=True, capture_output=True)
            try:
                pid = int(Path(state_file(str(mountpoint), ".pid")).read_text())
                if pinned:
                    pin(pid, {0})
                results[f"mount {binding}{suffix}"] = passes(mountpoint, paths, cold=True)
                status = Path(f"/proc/{pid}/status").read_text()
                results[f"mount {binding}{suffix}"]["daemon_peak_rss_MiB"] = int(
                    status.split("VmHWM:")[1].split()[0]) / 1024
            finally:
                subprocess.run([sys.executable, "-m", "packfs", "unmount", str(mountpoint)], check=False)
        pin(None, all_cpus)
    report = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
              "files": len(paths), "bytes": size, "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mount_compare.json").write_text(json.dumps(report, indent=2))
    lines = [f"{len(paths)} JPEGs, {size / len(paths) / 1000:.0f} KB average, {report['date']}, {report['machine']}",
             "", "| reader | pass 1 (cold) files/s | ratio | pass 2 (warm) files/s | ratio |", "|---|---|---|---|---|"]
    for name, row in results.items():
        base = results["plain pinned" if "pinned" in name else "plain"]
        lines.append(
            f"| {name} | {row['pass1_files_per_s']:,.0f} | {row['pass1_files_per_s'] / base['pass1_files_per_s']:.2f} | "
            f"{row['pass2_files_per_s']:,.0f} | {row['pass2_files_per_s'] / base['pass2_files_per_s']:.2f} |")
    (args.out / "mount_compare.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print({k: v.get("daemon_peak_rss_MiB") for k, v in results.items() if "mount" in k})
    return 0


if __name__ == "__main__":
    sys.exit(main())
