"""Archives at a URL (issue 24): requests, bytes and time to open, stat and read, and a
fault-injection run, against nginx on loopback behind bench/proxy.py.

Request counts and bytes come from nginx's own access log (what it answered: status,
Range, If-Match, bytes sent), which does not depend on the machine.  Times go through
the proxy at a round-trip time r (``--rtt-ms``, 20 by default; no bandwidth cap) and
are reported as multiples of r; the proxy runs in a process of its own on CPU 0, the
measured client on CPU 1 (``taskset``), nginx on CPU 0.

1. Open an archive of ``--entries`` entries (1,000,000: small files, and ``--large``
   files of 64-256 KiB), checks on, in a fresh process: requests and bytes.
2. Then, in the same fresh process, ``stat`` and read one random file: requests, and
   the time from starting the stat to having the file's bytes, in r.  Both over
   ``--fresh`` processes; medians.
3. One process reads ``--random-files`` random large files: bytes fetched over the
   files' own bytes, with and without the lookup-index pages it fetched.
4. A fault-injection run of ``--faults`` reads, with the proxy (in this process, no
   delay) injecting every fault kind it has (503, killed and truncated answers, a bit
   flipped in a body, Range ignored, another Content-Range, a longer body, a stall)
   into a random tenth of the requests, and the object replaced now and then: every
   read must return the file's own bytes or raise a packfs error (a PackfsError
   subclass), within its timeout; wrong bytes and hangs are counted.

    .venv/bin/python bench/remote.py [--entries 1000000] [--rtt-ms 20] [--faults 10000]
    .venv/bin/python bench/remote.py --entries 20000 --fresh 3 --faults 500   # quick

Results are printed as markdown and written with the raw figures as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.remote_servers import Nginx  # noqa: E402 (the servers the tests use)

_FRESH_SCRIPT = r"""
import json, sys, time
from packfs.core import Archive
url, path = sys.argv[1], sys.argv[2]
started = time.perf_counter()
archive = Archive(url)
opened = time.perf_counter()
entry = archive.lookup(path)
stat = archive.stat(entry)
data = archive.read(entry, 0, stat.size)
done = time.perf_counter()
assert len(data) == stat.size
print(json.dumps({"open_s": opened - started, "stat_read_s": done - opened, "size": stat.size}))
"""


def large_size(i: int) -> int:
    return (64 << 10) + (i * 7919) % (192 << 10)


def entries(count: int, large: int):
    """``count`` entries: ``large`` files of 64-256 KiB spread among small ones."""
    import packfs

    every = max(1, count // max(large, 1))
    for i in range(count):
        if large and i % every == 0 and i // every < large:
            yield packfs.Entry(f"d{i // 1000:05d}/large{i:07d}.bin", bytes([i % 251]) * large_size(i))
        else:
            yield packfs.Entry(f"d{i // 1000:05d}/f{i:07d}.bin", b"%07d" % i)


def build(work: Path, count: int, large: int) -> Path:
    import packfs

    path = work / f"remote-{count}-{large}.ffr"
    if not path.exists():
        packfs.pack_entries(entries(count, large), path, count=count)
    return path


def large_paths(count: int, large: int) -> list[str]:
    every = max(1, count // max(large, 1))
    return [f"d{i // 1000:05d}/large{i:07d}.bin" for i in range(0, count, every)][:large]


def start_proxy(target: int, rtt_ms: float) -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-m", "bench.proxy", "--target", str(target),
                                "--rtt-ms", str(rtt_ms)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    return process, int(line.split()[-1])


def gets(nginx: Nginx) -> list:
    return [request for request in nginx.requests() if request.method in ("GET", "HEAD")]


def fresh(nginx: Nginx, url: str, path: str) -> dict:
    nginx.clear_log()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(["taskset", "-c", "1", sys.executable, "-c", _FRESH_SCRIPT, url, path],
                            capture_output=True, text=True, env=env, timeout=120)
    if result.returncode:
        raise RuntimeError(result.stderr)
    figures = json.loads(result.stdout)
    logged = nginx.requests(3)
    suffix = [r for r in logged if r.range.startswith("bytes=-")]
    figures["open_requests"] = len(suffix) + len([r for r in logged if r.method == "HEAD"])
    figures["open_bytes"] = sum(r.bytes_sent for r in suffix)
    figures["stat_read_requests"] = len(logged) - figures["open_requests"]
    figures["all_if_match"] = all(r.if_match for r in logged if not r.range.startswith("bytes=-"))
    return figures


def random_reads(nginx: Nginx, url: str, paths: list[str], count: int) -> dict:
    from packfs.core import Archive

    rng = random.Random(1)
    chosen = rng.sample(paths, min(count, len(paths)))
    with Archive(url) as archive:
        tail = archive._container.tail  # noqa: SLF001 (where the lookup index lies: its pages are not files)
        index_start, index_end = tail.index_span
        nginx.clear_log()
        own = 0
        for path in chosen:
            own += len(archive.read_path(path))
    logged = gets(nginx)
    fetched = sum(r.bytes_sent for r in logged)
    pages = [r for r in logged if index_start <= _range_start(r.range) < index_end]
    page_bytes = sum(r.bytes_sent for r in pages)
    return {"files": len(chosen), "file_bytes": own, "requests": len(logged), "fetched_bytes": fetched,
            "index_page_requests": len(pages), "index_page_bytes": page_bytes,
            "ratio": fetched / own, "ratio_without_pages": (fetched - page_bytes) / own}


def _range_start(header: str) -> int:
    if not header.startswith("bytes=") or header.startswith("bytes=-"):
        return -1
    return int(header[6:].partition("-")[0])


def _fault_file(i: int, version: int) -> bytes:
    # The versions differ in size: nginx's ETag is mtime (whole seconds) and size, so
    # two objects of one size put within a second would share it (S3's is an MD5).
    return bytes([(i + version) % 251]) * (1000 + (i * 131) % 70000 + version)


def fault_run(nginx: Nginx, work: Path, reads: int, seed: int = 7) -> dict:
    """Every read gives the right bytes or a packfs error, within its timeout."""
    import packfs
    from bench.proxy import FAULTS, Proxy
    from packfs.core import Archive
    from packfs.errors import PackfsError
    from packfs.source.remote import RemoteFile

    rng = random.Random(seed)
    versions = []
    for version in range(2):
        path = work / f"faults-{version}.ffr"
        if not path.exists():
            packfs.pack_entries((packfs.Entry(f"d{i // 100:03d}/f{i:05d}.bin", _fault_file(i, version))
                                 for i in range(3000)), path, count=3000)
        versions.append(path)
    expected = [{f"d{i // 100:03d}/f{i:05d}.bin": _fault_file(i, v) for i in range(3000)} for v in range(2)]
    current = 0
    nginx.put("faults.ffr", versions[current].read_bytes())
    counts = {"reads": 0, "right": 0, "wrong_bytes": 0, "hangs": 0, "errors": {}, "faults": {},
              "non_packfs_errors": 0, "replaced": 0}
    options = {"timeout": 1.0, "retries": 3, "backoff": 0.005}
    with Proxy(nginx.port) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/data/faults.ffr"
        archive = None
        served = current
        for read in range(reads):
            if rng.random() < 0.002:  # the object replaced under the reader
                current = 1 - current
                nginx.put("faults.ffr", versions[current].read_bytes())
                counts["replaced"] += 1
            if rng.random() < 0.1:
                kind = rng.choice(FAULTS)
                proxy.fault(kind, 1)
                counts["faults"][kind] = counts["faults"].get(kind, 0) + 1
            else:
                proxy.fault(None)
            path = f"d{(k := rng.randrange(3000)) // 100:03d}/f{k:05d}.bin"
            result: dict = {}

            def attempt() -> None:
                nonlocal archive, served
                try:
                    if archive is None:
                        served = current
                        archive = Archive(RemoteFile(url, **options))
                    result["data"] = archive.read_path(path)
                except PackfsError as error:
                    result["error"] = error
                    if archive is not None and isinstance(error, packfs.ArchiveChangedError):
                        archive.close()
                        archive = None
                except BaseException as error:  # noqa: BLE001 (counted: must not happen)
                    result["other"] = error

            worker = threading.Thread(target=attempt, daemon=True)
            worker.start()
            worker.join(30)
            counts["reads"] += 1
            if worker.is_alive():
                counts["hangs"] += 1
                archive = None
                continue
            if "data" in result:
                if result["data"] == expected[served][path]:
                    counts["right"] += 1
                else:
                    counts["wrong_bytes"] += 1
            elif "error" in result:
                name = type(result["error"]).__name__
                counts["errors"][name] = counts["errors"].get(name, 0) + 1
            else:
                counts["non_packfs_errors"] += 1
                counts["errors"][repr(result.get("other"))[:80]] = 1
        proxy.fault(None)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--large", type=int, default=2000, help="files of 64-256 KiB among the entries")
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--fresh", type=int, default=9, help="fresh processes for figures 1 and 2")
    parser.add_argument("--random-files", type=int, default=1000)
    parser.add_argument("--faults", type=int, default=10_000)
    parser.add_argument("--work", type=Path, default=Path("/tmp/packfs-bench-remote"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/packfs-bench-remote/remote"),
                        help="where the .md and .json of the results go")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    archive = build(args.work, args.entries, args.large)
    paths = large_paths(args.entries, args.large)
    results: dict = {"entries": args.entries, "archive_bytes": archive.stat().st_size, "rtt_ms": args.rtt_ms,
                     "cpu": "client on CPU 1; proxy and nginx on CPU 0", "bandwidth_cap": None}
    server_root = args.work / "nginx"
    shutil.rmtree(server_root, ignore_errors=True)
    with Nginx(server_root) as nginx:
        os.link(archive, nginx.data / "tree.ffr") if archive.stat().st_dev == nginx.data.stat().st_dev else \
            shutil.copyfile(archive, nginx.data / "tree.ffr")
        proxy, port = start_proxy(nginx.port, args.rtt_ms)
        try:
            url = f"http://127.0.0.1:{port}/data/tree.ffr"
            rng = random.Random(2)
            runs = [fresh(nginx, url, rng.choice(paths)) for _ in range(args.fresh)]
            r = args.rtt_ms / 1000
            results["fresh"] = runs
            results["open_requests_max"] = max(run["open_requests"] for run in runs)
            results["open_bytes_max"] = max(run["open_bytes"] for run in runs)
            results["stat_read_requests_max"] = max(run["stat_read_requests"] for run in runs)
            results["open_in_r_median"] = statistics.median(run["open_s"] for run in runs) / r
            results["stat_read_in_r_median"] = statistics.median(run["stat_read_s"] for run in runs) / r
            results["stat_read_in_r_max"] = max(run["stat_read_s"] for run in runs) / r
            results["if_match_on_every_ranged_get"] = all(run["all_if_match"] for run in runs)
            results["random_reads"] = random_reads(nginx, url, paths, args.random_files)
        finally:
            proxy.kill()
            proxy.wait()
        started = time.perf_counter()
        results["faults"] = fault_run(nginx, args.work, args.faults)
        results["faults"]["seconds"] = time.perf_counter() - started
    report = render(results)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(report)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str))


def render(results: dict) -> str:
    reads = results["random_reads"]
    faults = results["faults"]
    lines = [
        f"Archive: {results['entries']:,} entries, {results['archive_bytes'] / 2**20:.0f} MiB, served by nginx "
        f"through the proxy at r = {results['rtt_ms']:g} ms ({results['cpu']}; no bandwidth cap).",
        "",
        "| figure | goal | measured |",
        "|---|---|---|",
        f"| open, checks on, fresh process (max of {len(results['fresh'])}) | 1 request, at most 2; at most 1 MiB | "
        f"{results['open_requests_max']} request, {results['open_bytes_max'] / 1024:.1f} KiB; "
        f"{results['open_in_r_median']:.1f} r (median, with the connection's handshake) |",
        f"| then stat and read one random file | at most 1 page + 1 file; first byte within 3 r | "
        f"{results['stat_read_requests_max']} requests at most; {results['stat_read_in_r_median']:.1f} r median, "
        f"{results['stat_read_in_r_max']:.1f} r max |",
        f"| bytes fetched for {reads['files']:,} random files of 64-256 KiB | at most 1.25x the files' bytes plus "
        f"the table pages | {reads['ratio_without_pages']:.3f}x without the {reads['index_page_requests']} index "
        f"pages, {reads['ratio']:.3f}x with them ({reads['requests']} requests) |",
        f"| fault injection, {faults['reads']:,} reads | 0 wrong bytes, 0 hangs | {faults['wrong_bytes']} wrong, "
        f"{faults['hangs']} hangs, {faults['non_packfs_errors']} errors outside PackfsError; {faults['right']:,} "
        f"right; errors {faults['errors']}; faults injected {faults['faults']}; object replaced "
        f"{faults['replaced']} times |",
        "",
        f"Every ranged GET after the open carried If-Match: {results['if_match_on_every_ranged_get']}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
