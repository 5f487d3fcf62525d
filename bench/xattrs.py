"""What extended attributes (format 1.3) cost: packing and warm `ls -lR` through a mount.

Side by side in one run, in rounds that cycle through the variants:

- pack: the same tree of small files packed with attributes read (a listxattr per
  entry; the tree has none, so the archive is byte for byte a 1.2 one), with
  ``--no-xattrs`` (the baseline, measured first and last in each round: the drift
  check), and a copy of the tree with a ``user.*`` attribute on every file and
  directory (one listxattr and one getxattr per entry, a 1.3 archive);
- ``ls -lR`` warm through the compiled daemon, of the archive without attributes (the
  daemon answers GETXATTR with ENOSYS once and the kernel stops asking) and of the
  labelled one (every GETXATTR ls sends is answered), with the plain directory as the
  baseline (first and last in each round).

Reports medians and ratios to the baseline.  Pin it as the numbers in
docs/performance.md were taken: ``taskset -c 1 python bench/xattrs.py`` (the daemon
inherits the CPU).

    python bench/xattrs.py --files 20000 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from compare import Mount  # noqa: E402

from packfs.write.pack import pack_folder  # noqa: E402


def make_tree(root: Path, files: int, labelled: bool) -> None:
    per_directory = 200
    for k in range(files):
        directory = root / f"d{k // per_directory:04d}"
        if k % per_directory == 0:
            directory.mkdir(parents=True)
            if labelled:
                os.setxattr(directory, "user.label", b"system_u:object_r:dataset_t:s0")
        path = directory / f"f{k:06d}.txt"
        path.write_bytes(os.urandom(1024))
        if labelled:
            os.setxattr(path, "user.label", b"system_u:object_r:dataset_t:s0")


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def ls_lr(path: Path) -> None:
    subprocess.run(["ls", "-lR", str(path)], stdout=subprocess.DEVNULL, check=True)


def report(title: str, results: dict[str, list[float]], baseline: str) -> None:
    base = statistics.median(results[baseline])
    print(f"\n{title} (median of {len(results[baseline]) // 2} rounds; ratio = time / {baseline}'s)")
    for name, times in results.items():
        print(f"  {name:<34} {statistics.median(times) * 1000:9.1f} ms   {statistics.median(times) / base:5.2f}x")
    firsts, lasts = results[baseline][0::2], results[baseline][1::2]
    drift = statistics.median(lasts) / statistics.median(firsts) - 1
    print(f"  drift: {baseline} moved {drift:+.1%} between the start and the end of the rounds")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"CPUs this process may use: {sorted(os.sched_getaffinity(0))}; {args.files} files of 1 KiB")
    work = Path(tempfile.mkdtemp(prefix="packfs-xattr-bench-", dir="/var/tmp"))
    try:
        plain, labelled = work / "plain", work / "labelled"
        make_tree(plain, args.files, False)
        make_tree(labelled, args.files, True)
        packed = {"no attributes": work / "plain.ffr", "user.* on every entry": work / "labelled.ffr"}
        pack_folder(plain, packed["no attributes"])
        pack_folder(labelled, packed["user.* on every entry"])

        out = work / "out.ffr"
        pack_variants = {
            "pack --no-xattrs (baseline)": lambda: pack_folder(plain, out, force=True, xattrs=False),
            "pack, tree without attributes": lambda: pack_folder(plain, out, force=True),
            "pack, user.* on every entry": lambda: pack_folder(labelled, out, force=True),
        }
        pack_times: dict[str, list[float]] = {name: [] for name in pack_variants}
        baseline = "pack --no-xattrs (baseline)"
        for _ in range(args.rounds):
            pack_times[baseline].append(timed(pack_variants[baseline]))
            for name, action in pack_variants.items():
                if name != baseline:
                    pack_times[name].append(timed(action))
            pack_times[baseline].append(timed(pack_variants[baseline]))
        for name in pack_times:
            if name != baseline:  # one sample per round, kept in pairs for the median's count
                pack_times[name] = pack_times[name] * 2
        report("packing", pack_times, baseline)

        ls_times: dict[str, list[float]] = {"plain directory (baseline)": []}
        mounts = []
        for name, archive in packed.items():
            mountpoint = work / f"mnt-{len(mounts)}"
            command = [sys.executable, "-m", "packfs", "mount", "-f", "--binding", "lowlevel", str(archive),
                       str(mountpoint)]
            mounts.append((f"ls -lR, mount, {name}", Mount(name, command, mountpoint)))
        for _, mount in mounts:
            mount.__enter__()
        try:
            for label, mount in mounts:  # warm: every inode and listing in the kernel's caches
                ls_lr(mount.mountpoint)
                ls_times[label] = []
            ls_lr(plain)
            for _ in range(args.rounds):
                ls_times["plain directory (baseline)"].append(timed(lambda: ls_lr(plain)))
                for label, mount in mounts:
                    ls_times[label] += [timed(lambda: ls_lr(mount.mountpoint))] * 2
                ls_times["plain directory (baseline)"].append(timed(lambda: ls_lr(plain)))
        finally:
            for _, mount in mounts:
                subprocess.run(["fusermount3", "-u", str(mount.mountpoint)], check=False)
                if mount.process is not None:
                    mount.process.wait(timeout=30)
        report("warm ls -lR", ls_times, "plain directory (baseline)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
