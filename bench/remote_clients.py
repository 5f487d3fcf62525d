"""Which HTTP client packfs's remote source uses, by measurement: random 64-256 KiB
ranged GETs (each with If-Match, as RemoteFile sends them) from nginx on loopback
through bench/proxy.py at RTT 20 ms, with 1, 8, 32 and 64 requests in flight.

Candidates (each in a process of its own, pinned to CPU 1; nginx and the proxy on
CPU 0): packfs (RemoteFile itself, urllib3 underneath: threads calling its read, each
GET's answer checked, the baseline of the ratios), urllib3 (bare: a pool and threads,
nothing checked), obstore (Rust's object_store; threads calling its blocking get, as
RemoteFile did before it moved to urllib3 for fork safety), aiohttp (asyncio).  A
candidate not installed is left out with a note (pip install obstore aiohttp).  boto3 and s3fs speak S3 only, and the
S3 server here (moto) is a Python process far slower than any client, so they appear
in the install-size table, not the timing one.

For each (client, in flight): requests/s and CPU seconds per request (the worker's
process CPU time, every thread, over the timed loop / requests), median of --rounds rounds; the
first round is run again as the last, and the drift (last / first, requests/s) says
whether the machine stayed the same.  Install size: what ``pip download`` fetches
for the package and its dependencies (wheels for this Python and platform).

    .venv/bin/python bench/remote_clients.py [--rounds 3] [--seconds 1.5] [--rtt-ms 20]
"""

from __future__ import annotations

import argparse
import json
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

OBJECT_SIZE = 256 << 20
IN_FLIGHT = (1, 8, 32, 64)
CLIENTS = ("packfs", "urllib3", "obstore", "aiohttp")
BASELINE = "packfs"
SIZE_PACKAGES = ("urllib3", "obstore", "aiohttp", "boto3", "s3fs")


def spans(count: int, seed: int) -> list:
    rng = random.Random(seed)
    found = []
    for _ in range(count):
        length = rng.randint(64 << 10, 256 << 10)
        start = rng.randrange(0, OBJECT_SIZE - length)
        found.append((start, start + length))
    return found


# -- the workers (run in their own process) --------------------------------------------


def worker(client: str, url: str, etag: str, in_flight: int, seconds: float) -> dict:
    os.sched_setaffinity(0, {1} if os.cpu_count() and os.cpu_count() > 1 else {0})
    fetch_all = {"packfs": packfs_run, "obstore": obstore_run, "urllib3": urllib3_run, "aiohttp": aiohttp_run}[client]
    fetch_all(url, etag, in_flight, spans(in_flight * 4, 0))  # warm up: connections, imports
    todo = spans(max(20, int(in_flight * 45 * seconds)), 1)  # about ``seconds`` at RTT 20 ms
    cpu, wall = time.process_time(), time.perf_counter()  # every thread's, Rust's included
    fetched = fetch_all(url, etag, in_flight, todo)
    wall, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
    assert fetched == sum(end - start for start, end in todo), (fetched, client)
    return {"requests_per_s": len(todo) / wall, "cpu_per_request_us": cpu_seconds / len(todo) * 1e6,
            "requests": len(todo)}


def packfs_run(url: str, etag: str, in_flight: int, todo: list) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from packfs.source.remote import RemoteFile

    source = RemoteFile(url, in_flight=in_flight, suffix_bytes=1024)  # its own If-Match: the same ETag

    def one(span):
        return len(source.read(*span))

    with ThreadPoolExecutor(in_flight) as pool:
        return sum(pool.map(one, todo))


def obstore_run(url: str, etag: str, in_flight: int, todo: list) -> int:
    from concurrent.futures import ThreadPoolExecutor

    import obstore
    from obstore.store import HTTPStore

    base, _, name = url.rpartition("/")
    store = HTTPStore.from_url(base, client_options={"allow_http": True}, retry_config={"max_retries": 0})

    def one(span):
        return len(obstore.get(store, name, options={"range": span, "if_match": etag}).bytes())

    with ThreadPoolExecutor(in_flight) as pool:
        return sum(pool.map(one, todo))


def urllib3_run(url: str, etag: str, in_flight: int, todo: list) -> int:
    from concurrent.futures import ThreadPoolExecutor

    import urllib3

    http = urllib3.PoolManager(maxsize=in_flight, retries=False)

    def one(span):
        response = http.request("GET", url, headers={"Range": f"bytes={span[0]}-{span[1] - 1}", "If-Match": etag})
        assert response.status == 206
        return len(response.data)

    with ThreadPoolExecutor(in_flight) as pool:
        return sum(pool.map(one, todo))


def aiohttp_run(url: str, etag: str, in_flight: int, todo: list) -> int:
    import asyncio

    import aiohttp

    async def main() -> int:
        limit = asyncio.Semaphore(in_flight)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=in_flight)) as session:
            async def one(span):
                async with limit:
                    async with session.get(url, headers={"Range": f"bytes={span[0]}-{span[1] - 1}",
                                                         "If-Match": etag}) as response:
                        assert response.status == 206
                        return len(await response.read())
            return sum(await asyncio.gather(*(one(span) for span in todo)))

    return asyncio.run(main())


# -- the driver ----------------------------------------------------------------------------


def install_sizes() -> dict:
    sizes = {}
    for package in SIZE_PACKAGES:
        with tempfile.TemporaryDirectory() as directory:
            done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d",
                                   directory, package], capture_output=True, text=True)
            files = list(Path(directory).iterdir())
            sizes[package] = {"bytes": sum(f.stat().st_size for f in files), "files": len(files),
                              "error": done.stderr.strip().splitlines()[-1:] if done.returncode else None}
    return sizes


def available(client: str) -> bool:
    module = "packfs.source.remote, urllib3" if client == "packfs" else client
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, cwd=REPO).returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.5, help="about how long each timed run lasts")
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--worker", nargs=5, metavar=("CLIENT", "URL", "ETAG", "IN_FLIGHT", "SECONDS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        client, url, etag, in_flight, seconds = args.worker
        print(json.dumps(worker(client, url, etag, int(in_flight), float(seconds))))
        return
    from tests.remote_servers import Nginx, http_get

    clients = [client for client in CLIENTS if available(client)]
    for client in set(CLIENTS) - set(clients):
        print(f"note: {client} is not installed; left out (pip install {client})")
    pin_servers = ["taskset", "-c", "0"] if (os.cpu_count() or 1) > 1 else []
    with tempfile.TemporaryDirectory() as directory, Nginx(Path(directory)) as nginx:
        nginx.put("object.bin", os.urandom(OBJECT_SIZE))
        subprocess.run(pin_servers + ["true"], check=True)
        if pin_servers:
            subprocess.run(["taskset", "-p", "-c", "0", str(nginx.process.pid)], capture_output=True, check=True)
        proxy = subprocess.Popen(pin_servers + [sys.executable, "-m", "bench.proxy", "--target", str(nginx.port),
                                                "--rtt-ms", str(args.rtt_ms)], stdout=subprocess.PIPE, text=True,
                                 cwd=REPO)
        try:
            port = int(proxy.stdout.readline())
            url = nginx.url("object.bin", port=port)
            etag = http_get(nginx.url("object.bin"), {"Range": "bytes=0-0"})[1]["ETag"]
            cells = [(client, n) for n in IN_FLIGHT for client in clients]
            results: dict = {cell: [] for cell in cells}
            plan = [cells] * args.rounds + [cells]  # the last round repeats the first: the drift check
            for number, round_cells in enumerate(plan):
                for client, n in round_cells:
                    done = subprocess.run([sys.executable, __file__, "--worker", client, url, etag, str(n),
                                           str(args.seconds)], capture_output=True, text=True, cwd=REPO)
                    if done.returncode:
                        raise SystemExit(f"{client} x{n} failed: {done.stderr[-2000:]}")
                    results[(client, n)].append(json.loads(done.stdout))
                print(f"round {number + 1}/{len(plan)} done", file=sys.stderr)
        finally:
            proxy.terminate()
            proxy.wait()
    print(f"ranged GETs of 64-256 KiB, RTT {args.rtt_ms:g} ms through bench/proxy.py to nginx; clients on CPU 1, "
          f"servers on CPU 0; median of {args.rounds} rounds (+1 repeating the first for drift)\n")
    print(f"{'client':10} {'in flight':>9} {'req/s':>8} {'CPU us/req':>11} {'req/s vs packfs':>16} "
          f"{'CPU vs packfs':>14} {'drift':>6}")
    for n in IN_FLIGHT:
        base = results.get((BASELINE, n))
        for client in clients:
            runs = results[(client, n)][:args.rounds]
            rate = statistics.median(r["requests_per_s"] for r in runs)
            cpu = statistics.median(r["cpu_per_request_us"] for r in runs)
            drift = results[(client, n)][-1]["requests_per_s"] / results[(client, n)][0]["requests_per_s"]
            base_rate = statistics.median(r["requests_per_s"] for r in base[:args.rounds]) if base else rate
            base_cpu = statistics.median(r["cpu_per_request_us"] for r in base[:args.rounds]) if base else cpu
            print(f"{client:10} {n:9d} {rate:8.0f} {cpu:11.0f} {rate / base_rate:16.2f} "
                  f"{cpu / max(base_cpu, 1e-9):14.2f} {drift:6.2f}")
    print("\ninstall size (pip download: the package and its dependencies, wheels)")
    for package, size in install_sizes().items():
        note = f"  ({size['error']})" if size["error"] else ""
        print(f"{package:10} {size['bytes'] / 2**20:7.1f} MiB in {size['files']} files{note}")


if __name__ == "__main__":
    main()
