"""How many GETs a batched read keeps in flight, by measurement: ``Archive.read_many``
of batches of 256 shuffled files of about 110 KB from nginx on loopback, through
bench/proxy.py at RTT 20 ms (no bandwidth cap unless --bandwidth), with 16, 32, 64 and
128 requests in flight (RemoteFile's ``in_flight``).

Each configuration opens the archive once and reads one untimed batch (the table's
pages then are cached), then --batches timed batches; the configurations take turns
round by round, and the first configuration is run again at the end: the drift (last
/ first, files/s) says whether the machine stayed the same.  Reported per
configuration: files/s, requests/s (the source's own count, checked against nginx's
log), CPU seconds per file of this process, medians over --rounds, and the ratio to
IN_FLIGHT's (the default).  The client is pinned to CPU 1, nginx and the proxy to
CPU 0 (``taskset``) where there are two.

    .venv/bin/python bench/batch_inflight.py [--files 3000] [--rounds 3] [--batches 8] [--rtt-ms 20]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import packfs  # noqa: E402
from packfs.core import Archive  # noqa: E402
from packfs.source import open_source  # noqa: E402
from packfs.source.remote import IN_FLIGHT  # noqa: E402
from tests.remote_servers import Nginx  # noqa: E402

BATCH = 256
CONFIGURATIONS = (16, 32, 64, 128, 256)


def make_archive(directory: Path, count: int) -> Path:
    source = directory / "src"
    rng = random.Random(25)
    for i in range(count):
        path = source / f"{i // 1000:03d}" / f"{i:06d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(rng.randint(90_000, 130_000)))
    packfs.pack_folder(source, directory / "train.ffr")
    return directory / "train.ffr"


def start_proxy(target: int, rtt_ms: float, bandwidth: float) -> tuple[subprocess.Popen, int]:
    command = [sys.executable, "-m", "bench.proxy", "--target", str(target), "--rtt-ms", str(rtt_ms),
               "--bandwidth", str(bandwidth)]
    if (os.cpu_count() or 1) > 1:
        command = ["taskset", "-c", "0"] + command
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()  # type: ignore[union-attr]
    return process, int(line.split()[-1])


def run(url: str, in_flight: int, batches: list, files: int) -> dict:
    # Without the disk cache: every round fetches (a cache would serve the later ones).
    with Archive(open_source(url, storage_options={"cache_dir": False}, in_flight=in_flight)) as archive:
        entries = [archive.lookup(f"{i // 1000:03d}/{i:06d}.jpg") for i in range(files)]
        archive.read_many([entries[k] for k in batches[0]])  # untimed: the pages the batches need
        before = archive.stats()["requests"]
        cpu, wall = time.process_time(), time.perf_counter()
        count = 0
        for batch in batches[1:]:
            count += len(archive.read_many([entries[k] for k in batch]))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        requests = archive.stats()["requests"] - before
    return {"files/s": count / wall, "requests/s": requests / wall, "cpu us/file": cpu / count * 1e6,
            "requests": requests}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--bandwidth", type=float, default=0.0, help="bytes/s per connection (0: no cap)")
    options = parser.parse_args()
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})
    with tempfile.TemporaryDirectory() as temporary:
        directory = Path(temporary)
        archive = make_archive(directory, options.files)
        with Nginx(directory / "nginx") as nginx:
            if (os.cpu_count() or 1) > 1:
                subprocess.run(["taskset", "-a", "-p", "-c", "0", str(nginx.process.pid)],  # type: ignore[union-attr]
                               check=True, stdout=subprocess.DEVNULL)
            nginx.put("train.ffr", archive.read_bytes())
            proxy, port = start_proxy(nginx.port, options.rtt_ms, options.bandwidth)
            try:
                url = nginx.url("train.ffr", port=port)
                rng = random.Random(1)
                results: dict = {k: [] for k in CONFIGURATIONS}
                order = list(CONFIGURATIONS)
                first = None
                for _ in range(options.rounds):
                    for in_flight in order:
                        batches = [rng.sample(range(options.files), BATCH) for _ in range(options.batches + 1)]
                        nginx.clear_log()
                        result = run(url, in_flight, batches, options.files)
                        logged = sum(1 for request in nginx.requests() if request.method == "GET")
                        assert logged >= result["requests"], (logged, result)
                        results[in_flight].append(result)
                        first = first or (in_flight, result["files/s"])
                batches = [rng.sample(range(options.files), BATCH) for _ in range(options.batches + 1)]
                again = run(url, first[0], batches, options.files)["files/s"]  # type: ignore[index]
            finally:
                proxy.terminate()
                proxy.wait()
    print(f"read_many, batches of {BATCH} shuffled files of 90-130 KB out of {options.files}, RTT "
          f"{options.rtt_ms:g} ms, bandwidth {'unlimited' if not options.bandwidth else f'{options.bandwidth:g} B/s'}"
          f" per connection, medians of {options.rounds} rounds of {options.batches} batches")
    base = statistics.median(r["files/s"] for r in results[IN_FLIGHT])
    print(f"{'in flight':>10} {'files/s':>9} {'requests/s':>11} {'cpu us/file':>12} {'vs ' + str(IN_FLIGHT):>7}")
    for in_flight in CONFIGURATIONS:
        rows = results[in_flight]
        files = statistics.median(r["files/s"] for r in rows)
        print(f"{in_flight:>10} {files:>9.0f} {statistics.median(r['requests/s'] for r in rows):>11.0f} "
              f"{statistics.median(r['cpu us/file'] for r in rows):>12.0f} {files / base:>7.2f}")
    print(f"drift (in flight {first[0]}: last / first, files/s): {again / first[1]:.2f}")  # type: ignore[index]


if __name__ == "__main__":
    main()
