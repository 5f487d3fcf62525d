"""Soak test: a mount and PackedFolder under mixed, hostile load for a while.

    python -m tests.soak --seconds 300      # make soak
    python -m tests.soak --seconds 8        # what CI runs (tests/test_soak.py)

For the whole run, at once:
- 8 threads reading random files through the mount and checking every byte;
- 4 processes doing the same through the mount and through their own PackedFolder;
- files opened and never closed (their descriptors kept until the end);
- clients killed with SIGKILL in the middle of a read;
- `ls -R` storms over the whole mount;
- `packfs unmount` attempts while it is busy, which must fail with "busy".

Reports reads done, errors (must be 0), wrong bytes (must be 0), and the daemon's RSS
and open file descriptors at the start and at the end (flat: no leak).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import packfs  # noqa: E402
from packfs.fuse import is_mounted, state_file  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def build_archive(out: Path, files: int = 3000) -> dict[str, int]:
    """An archive of files of varied sizes; returns path -> CRC-32 of the contents."""
    rng = random.Random(5)
    expected: dict[str, int] = {}

    def entries():
        for i in range(files):
            size = rng.choice([0, 1, 100, 4096, 30_000, 200_000]) + rng.randrange(64)
            data = rng.randbytes(size)
            path = f"d{i % 40:02d}/s{i % 7}/f{i:05d}.bin"
            expected[path] = zlib.crc32(data)
            yield packfs.Entry(path, data)

    packfs.pack_entries(entries(), out, count=files)
    return expected


def _daemon_status(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    return {
        "rss_kib": int(status.split("VmRSS:")[1].split()[0]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


def _reader_process(root: str, archive: str, paths: list[str], expected: dict[str, int], seconds: float,
                    results: multiprocessing.Queue, seed: int) -> None:
    rng = random.Random(seed)
    reads = errors = wrong = 0
    folder = packfs.PackedFolder(archive)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        path = rng.choice(paths)
        try:
            if rng.random() < 0.5:
                with open(os.path.join(root, path), "rb") as f:
                    data = f.read()
            else:
                data = folder.read(path)
            reads += 1
            wrong += zlib.crc32(data) != expected[path]
        except (OSError, packfs.PackfsError):
            errors += 1
    results.put((reads, errors, wrong))


def _killed_client(root: str, path: str) -> None:
    """Read a large file slowly, to be killed in the middle."""
    with open(os.path.join(root, path), "rb", buffering=0) as f:
        while f.read(4096):
            time.sleep(0.001)


def soak(seconds: float, work: Path, every_action: bool = False, longest: float = 600) -> dict[str, object]:
    """The load for ``seconds``; with ``every_action``, longer if need be (at most
    ``longest`` s), until the chaos thread has killed a client, run a storm and been
    refused an unmount at least once: a loaded machine may not get to each in a short
    run (tests/test_soak.py had none of its kills in 8 s beside other suites)."""
    archive = work / "soak.ffr"
    expected = build_archive(archive)
    paths = sorted(expected)
    large = [p for p in paths if int(p[-9:-4]) % 6 == 5] or paths
    mountpoint = work / "mnt"
    mountpoint.mkdir()
    command = [sys.executable, "-m", "packfs", "mount", str(archive), str(mountpoint)]
    subprocess.run(command, check=True, capture_output=True, cwd=REPO)
    pid = int(Path(state_file(str(mountpoint), ".pid")).read_text())
    report: dict[str, object] = {"files": len(paths), "seconds": seconds}
    held_open: list[object] = []
    try:
        root = str(mountpoint)
        # Warm up, so "start" is the daemon serving, not the daemon just forked.
        for path in paths[:200]:
            with open(os.path.join(root, path), "rb") as f:
                f.read()
        report["start"] = _daemon_status(pid)
        counters = {"reads": 0, "errors": 0, "wrong": 0, "kills": 0, "storms": 0, "busy_unmounts": 0}
        lock = threading.Lock()
        deadline = time.monotonic() + seconds
        stop = threading.Event()  # set when the chaos thread ends: the readers stop with it
        failures: list[str] = []

        def reader(seed: int) -> None:
            rng = random.Random(seed)
            reads = errors = wrong = 0
            while not stop.is_set():
                path = rng.choice(paths)
                try:
                    with open(os.path.join(root, path), "rb") as f:
                        if rng.random() < 0.2:
                            f.seek(rng.randrange(1 + os.fstat(f.fileno()).st_size))
                            f.read(rng.randrange(1, 65536))
                            data = None
                        else:
                            data = f.read()
                    reads += 1
                    if data is not None and zlib.crc32(data) != expected[path]:
                        wrong += 1
                except OSError as error:
                    errors += 1
                    failures.append(f"{path}: {error}")
            with lock:
                counters["reads"] += reads
                counters["errors"] += errors
                counters["wrong"] += wrong

        def more_chaos() -> bool:
            now = time.monotonic()
            if now < deadline:
                return True
            seen = counters["kills"] and counters["storms"] and counters["busy_unmounts"]
            return every_action and not seen and now < deadline + longest

        def chaos() -> None:
            try:
                chaos_until_done()
            finally:
                stop.set()

        def chaos_until_done() -> None:
            rng = random.Random(99)
            while more_chaos():
                action = rng.choice(["hold", "kill", "storm", "unmount"])
                if action == "hold" and len(held_open) < 200:
                    held_open.append(open(os.path.join(root, rng.choice(paths)), "rb"))
                elif action == "kill":
                    child = multiprocessing.get_context("fork").Process(
                        target=_killed_client, args=(root, rng.choice(large)))
                    child.start()
                    time.sleep(rng.uniform(0.005, 0.05))
                    os.kill(child.pid, signal.SIGKILL)
                    child.join()
                    counters["kills"] += 1
                elif action == "storm":
                    listed = subprocess.run(["ls", "-R", root], capture_output=True, text=True)
                    with lock:
                        if listed.returncode != 0:
                            failures.append(f"ls -R: {listed.stderr.strip()}")
                            counters["errors"] += 1
                        counters["storms"] += 1
                else:
                    result = subprocess.run([sys.executable, "-m", "packfs", "unmount", root],
                                            capture_output=True, text=True, cwd=REPO)
                    if result.returncode == 0 or not is_mounted(root):
                        with lock:
                            failures.append("unmount succeeded while files were open")
                            counters["errors"] += 1
                        return
                    if "busy" in result.stderr:
                        counters["busy_unmounts"] += 1
                time.sleep(0.01)

        # The unmount attempts need an open file from the start.
        held_open.append(open(os.path.join(root, paths[0]), "rb"))
        queue: multiprocessing.Queue = multiprocessing.get_context("spawn").Queue()
        processes = [
            multiprocessing.get_context("spawn").Process(
                target=_reader_process, args=(root, str(archive), paths, expected, seconds, queue, seed))
            for seed in range(4)
        ]
        for process in processes:
            process.start()
        threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(8)]
        threads.append(threading.Thread(target=chaos))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for _ in processes:
            reads, errors, wrong = queue.get(timeout=seconds + longest + 120)
            counters["reads"] += reads
            counters["errors"] += errors
            counters["wrong"] += wrong
        for process in processes:
            process.join()
        for f in held_open:
            f.close()  # type: ignore[attr-defined]
        held_open.clear()
        time.sleep(0.2)  # let the kernel send the last RELEASEs
        report["end"] = _daemon_status(pid)
        report.update(counters)
        report["failures"] = failures[:10]
    finally:
        for f in held_open:
            f.close()  # type: ignore[attr-defined]
        subprocess.run([sys.executable, "-m", "packfs", "unmount", str(mountpoint)], capture_output=True, cwd=REPO)
        if is_mounted(str(mountpoint)):
            subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = soak(args.seconds, Path(tmp))
    print(json.dumps(report, indent=2))
    ok = report["errors"] == 0 and report["wrong"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
