"""Whole-archive scans of an archive at a URL (issue 33): the GETs and bytes of
``verify``, ``unpack`` and ``prefetch``, with and without the disk cache, against
nginx and moto_server on loopback.

Counts come from the servers' own logs (nginx: each request's Range and bytes sent;
moto: each request), bytes for moto from the client's counters.  Each run is a fresh
process.  Also: what a second process's open of an archive the cache holds fetches.

    .venv/bin/python bench/remote_scan.py [--mib 80] [--packfs-path DIR]

``--packfs-path`` runs the scans with another checkout's packfs (before/after).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.remote_servers import S3_KEY, S3_REGION, S3_SECRET, MotoServer, Nginx  # noqa: E402

_RUN = r"""
import json, sys, time
mode, url, cache, out = sys.argv[1:5]
cache_dir = False if cache == "off" else cache
started = time.perf_counter()
if mode == "prefetch":
    from packfs.core import prefetch
    stats = prefetch(url, cache_dir=cache_dir)
elif mode == "unpack":
    from packfs import PackedFolder, unpack
    with PackedFolder(url, cache_dir=cache_dir) as folder:
        unpack(folder, out)
        stats = folder.archive.stats()
else:
    from packfs.core import Archive
    with Archive(url, cache_dir=cache_dir) as archive:
        if mode == "verify":
            assert archive.verify().ok
        stats = archive.stats()
print(json.dumps({"seconds": time.perf_counter() - started, **stats}))
"""


def make_tree(root: Path, mib: int) -> None:
    rng = random.Random(33)
    total, k = 0, 0
    while total < mib << 20:
        size = rng.randint(4 << 20, 12 << 20) if k % 400 == 399 else rng.randint(2_000, 40_000)
        path = root / f"d{k % 50:02d}" / f"f{k:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(size))
        total += size
        k += 1


def run(mode: str, url: str, cache: str, out: str, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", _RUN, mode, url, cache, out], env=env, capture_output=True, cwd="/",
                          text=True)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=80)
    parser.add_argument("--packfs-path", default=str(REPO))
    parser.add_argument("--modes", default="verify,unpack,prefetch")
    parser.add_argument("--servers", default="nginx,moto")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": args.packfs_path, "AWS_ACCESS_KEY_ID": S3_KEY,
           "AWS_SECRET_ACCESS_KEY": S3_SECRET, "AWS_REGION": S3_REGION,
           "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent"}
    sys.path.insert(0, args.packfs_path)
    from packfs import pack_folder

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        make_tree(root / "tree", args.mib)
        archive = root / "a.ffr"
        pack_folder(root / "tree", archive)
        size = archive.stat().st_size
        print(f"archive: {size / 1e6:.1f} MB, packfs from {args.packfs_path}\n")
        print("| server | scan | cache | GETs | bytes fetched / archive | seconds |")
        print("|---|---|---|---|---|---|")
        with Nginx(root / "nginx") as nginx, MotoServer(root / "moto") as moto:
            nginx.put("a.ffr", archive.read_bytes())
            moto.client().create_bucket(Bucket="bench")
            moto.client().put_object(Bucket="bench", Key="a.ffr", Body=archive.read_bytes())
            env["AWS_ENDPOINT_URL"] = moto.endpoint
            for server, url in (("nginx", nginx.url("a.ffr")), ("moto", "s3://bench/a.ffr")):
                if server not in args.servers.split(","):
                    continue
                for mode in args.modes.split(","):
                    for cache in ("off", "on"):
                        if mode == "prefetch" and cache == "off":
                            continue
                        cache_dir = "off" if cache == "off" else str(root / f"cache-{server}-{mode}")
                        out = root / f"out-{server}-{mode}-{cache}"
                        before = len(nginx.requests()) if server == "nginx" else len(moto.requests())
                        result = run(mode, url, cache_dir, str(out), env)
                        time.sleep(0.3)
                        logged = (nginx.requests() if server == "nginx" else moto.requests())[before:]
                        gets = [r for r in logged if r.method == "GET"]
                        if server == "nginx":
                            fetched = sum(r.bytes_sent for r in gets)
                        else:
                            fetched = result.get("bytes_fetched", -1)
                        note = result.get("error", f"{result.get('seconds', 0):.1f}")
                        print(f"| {server} | {mode} | {cache} | {len(gets)} | {fetched / size:.3f} | {note} |")


if __name__ == "__main__":
    main()
