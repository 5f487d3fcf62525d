"""A damaged large file under load, through a real mount: how long a small file's read,
a listing and a stat wait while readers keep reading the damaged file.

Issue 23: a record over 1 MiB without piece CRCs (any 1.0 or 1.1 archive) that fails
its CRC was read and checked whole again at every READ, under a lock shared with
1/256 of all records, each check holding a worker thread; with 12 readers of a
damaged 1 GiB file a small file waited 8.15 s.  Now a failed check is remembered (EIO
at once from then on), a check holds no lock other records need, and the READs waiting
for it are parked without a worker thread.

The archive: ``big.bin`` (``--size-mib``, one byte damaged in its middle) beside
``--samples`` directories ``dNNN``, each with a small file, a file to stat and a
directory of 10 files to list, written as format 1.1 (no piece CRCs).  For each side,
OLD (``--old``, a git revision, built in a scratch copy) and NEW (this checkout),
alternating over ``--rounds``: mount it afresh (``packfs mount -f --binding
lowlevel``, or ``--binding mfusepy``), start ``--readers`` threads (another process)
reading ``big.bin`` at random offsets, each getting EIO, and for ``--seconds`` sample,
every ``--interval`` seconds, the latency of one small file's read (``open`` +
``read``), one directory's listing (``os.listdir``) and one file's ``os.stat``, each on
paths this mount has not seen (so the kernel asks the daemon).  The first samples fall
in the first check of ``big.bin`` (about 1 s for 1 GiB).  Reported: per side, the median and the largest
latency of each over all rounds, and OLD/NEW ratios; a drift check measures NEW's
latencies without readers at the start and at the end.

    python bench/damaged_stall.py                           # 1 GiB, 12 readers, 3 rounds
    taskset -c 0,1 python bench/damaged_stall.py --size-mib 256 --rounds 5

CPU placement: the daemon, the readers and the sampler float over the CPUs this process
may use (printed); run it under taskset to pin them all.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import packfs  # noqa: E402
from compare import Mount  # noqa: E402

OPS = ("read", "listdir", "stat")
# The commit before issue 23's fix of the compiled daemon.
BEFORE_FIX = "0e7c12b"


def make_archive(work: Path, size_mib: int, samples: int) -> Path:
    """The damaged format-1.1 archive (made once per size and sample count)."""
    from tests.conftest import as_version_1_1, damaged_copy

    archive = work / f"damaged-{size_mib}-{samples}.ffr"
    if archive.exists():
        return archive
    source = work / "src"
    source.mkdir(parents=True, exist_ok=True)
    with open(source / "big.bin", "wb") as big:
        block = random.Random(0).randbytes(1 << 20)
        for _ in range(size_mib):
            big.write(block)
    for k in range(samples):
        directory = source / f"d{k:03d}"
        (directory / "list").mkdir(parents=True, exist_ok=True)
        (directory / "small.txt").write_bytes(b"small %d\n" % k)
        (directory / "stat.txt").write_bytes(b"stat %d\n" % k)
        for j in range(10):
            (directory / "list" / f"f{j}").write_bytes(b"%d" % j)
    packfs.pack_folder(source, work / "sound.ffr", force=True)
    old = as_version_1_1(work / "sound.ffr", work / "sound-1.1.ffr")
    damaged_copy(old, archive, b"big.bin", at=(size_mib << 20) // 2)
    for leftover in (work / "sound.ffr", old):
        leftover.unlink()
    return archive


def build_old(revision: str, work: Path) -> Path:
    """A scratch copy of ``revision``'s tree (git archive: no worktree), its C
    extensions built in place."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{revision}^{{commit}}"],
                            capture_output=True, text=True, check=True).stdout.strip()
    copy = work / f"old-{commit[:12]}"
    if not (copy / ".built").exists():
        copy.mkdir(parents=True, exist_ok=True)
        tree = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True).stdout
        tar_path = work / "old.tar"
        tar_path.write_bytes(tree)
        with tarfile.open(tar_path) as tar:
            tar.extractall(copy)
        tar_path.unlink()
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=copy, check=True,
                       capture_output=True)
        (copy / ".built").touch()
    return copy


def read_forever(path: str, threads: int) -> None:
    """The readers (run in their own process): ``threads`` threads reading ``path`` at
    random offsets until killed, each read's EIO ignored."""
    size = os.stat(path).st_size

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        fd = os.open(path, os.O_RDONLY)
        while True:
            try:
                os.pread(fd, 131072, rng.randrange(0, size, 4096))
            except OSError:
                pass

    for k in range(threads):
        threading.Thread(target=reader, args=(k,), daemon=True).start()
    threading.Event().wait()


def sample(root: Path, k: int) -> dict[str, float]:
    """The three latencies on sample directory ``k`` (its paths unseen by this mount)."""
    directory = root / f"d{k:03d}"
    timings = {}
    start = time.perf_counter()
    with open(directory / "small.txt", "rb") as small:
        small.read()
    timings["read"] = time.perf_counter() - start
    start = time.perf_counter()
    os.listdir(directory / "list")
    timings["listdir"] = time.perf_counter() - start
    start = time.perf_counter()
    os.stat(directory / "stat.txt")
    timings["stat"] = time.perf_counter() - start
    return timings


def one_round(side: str, code: Path, archive: Path, mountpoint: Path, args: argparse.Namespace,
              loaded: bool = True) -> list[dict[str, float]]:
    """Mount with ``code`` (a packfs tree), start the readers (if ``loaded``), sample."""
    # Run from the side's tree: ``python -m`` puts the working directory first on sys.path.
    command = ["env", "-C", str(code), f"PYTHONPATH={code}", sys.executable, "-m", "packfs", "mount", "-f",
               "--binding", args.binding, str(archive), str(mountpoint)]
    samples = []
    with Mount(side, command, mountpoint):
        readers = None
        if loaded:
            readers = subprocess.Popen([sys.executable, __file__, "--read-forever", str(mountpoint / "big.bin"),
                                        "--readers", str(args.readers)])
            time.sleep(args.interval)  # the readers' first READs are in
        try:
            deadline = time.monotonic() + args.seconds
            k = 0
            while (time.monotonic() < deadline or len(samples) < 3) and k < args.samples:
                samples.append(sample(mountpoint, k))
                k += 1
                time.sleep(args.interval)
        finally:
            if readers is not None:
                readers.send_signal(signal.SIGKILL)
                readers.wait()
    return samples


def summary(samples: list[dict[str, float]]) -> dict[str, tuple[float, float]]:
    return {op: (statistics.median(s[op] for s in samples), max(s[op] for s in samples)) for op in OPS}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", default=BEFORE_FIX, help=f"the revision to compare with (default {BEFORE_FIX}, "
                                                          "the commit before the fix)")
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--readers", type=int, default=12)
    parser.add_argument("--binding", default="lowlevel", choices=("lowlevel", "mfusepy"),
                        help="the daemon (both sides)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="sampling per round and side")
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--samples", type=int, default=80, help="sample directories (at most one per sample)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "packfs-damaged-stall")
    parser.add_argument("--read-forever", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read_forever:
        read_forever(args.read_forever, args.readers)
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    archive = make_archive(args.work, args.size_mib, args.samples)
    sides = {"old": build_old(args.old, args.work), "new": ROOT}
    for side, code in sides.items():
        where = subprocess.run(["env", "-C", str(code), f"PYTHONPATH={code}", sys.executable, "-c",
                                "import packfs._lowlevel as m; print(m.__file__)"],
                               capture_output=True, text=True, check=True).stdout.strip()
        print(f"{side}: the daemon runs {where}")
    mountpoint = args.work / "mnt"
    results: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    baseline = summary(one_round("new", ROOT, archive, mountpoint, args, loaded=False))
    for round_number in range(1, args.rounds + 1):
        for side, code in sides.items():
            got = one_round(side, code, archive, mountpoint, args)
            results[side] += got
            worst = summary(got)
            print(f"round {round_number}, {side}: {len(got)} samples; largest " +
                  ", ".join(f"{op} {worst[op][1] * 1000:.1f} ms" for op in OPS), flush=True)
    drift = summary(one_round("new", ROOT, archive, mountpoint, args, loaded=False))
    table = {side: summary(samples) for side, samples in results.items()}
    print(f"\n{args.binding}: {args.readers} readers of a damaged {args.size_mib} MiB file without piece CRCs "
          f"(format 1.1); old = {args.old}, new = this checkout; {args.rounds} rounds of {args.seconds:.0f} s per "
          f"side, alternating; CPUs {sorted(os.sched_getaffinity(0))} shared by the daemon, the readers and the "
          f"sampler")
    print(f"{'':>8} {'old median':>12} {'new median':>12} {'ratio':>8} {'old largest':>12} {'new largest':>12} "
          f"{'ratio':>8}")
    for op in OPS:
        (old_median, old_max), (new_median, new_max) = table["old"][op], table["new"][op]
        print(f"{op:>8} {old_median * 1000:>9.2f} ms {new_median * 1000:>9.2f} ms {old_median / new_median:>8.0f} "
              f"{old_max * 1000:>9.1f} ms {new_max * 1000:>9.1f} ms {old_max / new_max:>8.0f}")
    print("samples: old " + str(len(results["old"])) + ", new " + str(len(results["new"])))
    print("drift check, new without readers (median at the end / at the start): " + ", ".join(
        f"{op} {drift[op][0] / baseline[op][0]:.2f}" for op in OPS) + "; unloaded medians " + ", ".join(
        f"{op} {baseline[op][0] * 1000:.2f} ms" for op in OPS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
