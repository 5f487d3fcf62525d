"""``packfs cache prefetch`` against a training-like read (issue 33, item 5).

moto_server (tests/remote_servers.py) holds an archive of ``--files`` files of 100-120
KB; optionally behind bench/proxy.py at ``--rtt-ms`` (a GET then costs about that).
Each step runs in a fresh process; GETs are counted from moto's own log:

1. cold epoch: every file read once, shuffled, one at a time (PackedFolder.read), with
   an empty cache;
2. the same again (the cache the first filled);
3. ``packfs cache prefetch URL`` into another empty cache;
4. an epoch after it (the prefetched cache).

    .venv/bin/python bench/cache_prefetch.py --files 1500 --rtt-ms 60
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.proxy import Proxy  # noqa: E402
from packfs import pack_folder  # noqa: E402
from tests.remote_servers import S3_KEY, S3_REGION, S3_SECRET, MotoServer  # noqa: E402

EPOCH = """
import random, sys, time
from packfs import PackedFolder
url, cache_dir = sys.argv[1], sys.argv[2]
started = time.monotonic()
with PackedFolder(url, cache_dir=cache_dir) as folder:
    names = [f"{top}/{name}" if top else name for top, _, files in folder.walk() for name in files]
    random.Random(0).shuffle(names)
    for name in names:
        folder.read(name)
print(time.monotonic() - started)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1500)
    parser.add_argument("--rtt-ms", type=float, default=0.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="packfs-prefetch-"))
    rng = random.Random(33)
    tree = work / "tree"
    for k in range(args.files):
        path = tree / f"train/{k % 16:02d}/{k:06d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.randint(100_000, 120_000)))
    pack_folder(tree, work / "train.ffr")
    size = (work / "train.ffr").stat().st_size
    with MotoServer(work / "moto") as moto:
        client = moto.client()
        client.create_bucket(Bucket="bench")
        client.upload_file(str(work / "train.ffr"), "bench", "train.ffr")
        with Proxy(moto.port, rtt=args.rtt_ms / 1000) as proxy:
            endpoint = f"http://127.0.0.1:{proxy.port}"
            env = {**os.environ, "AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET,
                   "AWS_REGION": S3_REGION, "AWS_ENDPOINT_URL_S3": endpoint}
            url = "s3://bench/train.ffr"
            gets = lambda: sum(1 for r in moto.requests() if r.method == "GET")  # noqa: E731

            def step(label: str, command: list) -> dict:
                before = gets()
                started = time.monotonic()
                result = subprocess.run(command, env=env, capture_output=True, text=True)
                elapsed = time.monotonic() - started
                if result.returncode:
                    raise SystemExit(f"{label}: {result.stderr}")
                time.sleep(0.5)
                row = {"step": label, "seconds": round(elapsed, 2), "gets": gets() - before,
                       "stdout": result.stdout.strip().splitlines()[-1:]}
                print(json.dumps(row), flush=True)
                return row

            epoch = [sys.executable, "-c", EPOCH, url]
            first = str(work / "cache-epochs")
            second = str(work / "cache-prefetched")
            rows = [step("cold epoch", epoch + [first]), step("second epoch", epoch + [first]),
                    step("packfs cache prefetch", [sys.executable, "-m", "packfs", "cache", "prefetch", url,
                                                   "--cache-dir", second]),
                    step("epoch after prefetch", epoch + [second])]
            listing = subprocess.run([sys.executable, "-m", "packfs", "cache", "--cache-dir", second], env=env,
                                     capture_output=True, text=True).stdout
    print(f"\narchive: {args.files} files, {size / 2**20:.1f} MiB; moto behind bench/proxy.py at rtt "
          f"{args.rtt_ms:.0f} ms\n")
    print("| step | seconds | GETs (moto's log) |\n|---|---|---|")
    for row in rows:
        print(f"| {row['step']} | {row['seconds']} | {row['gets']} |")
    print("\n" + listing)


if __name__ == "__main__":
    main()
