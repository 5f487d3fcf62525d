"""A DataLoader epoch from a URL with and without block-aware reading (issue 36),
side by side in one run: requests and bytes counted at the server, classes per batch,
time to the first batch and the epoch's rate.

    .venv/bin/python bench/windowed_epoch.py                  # 3,000 files, ~300 MiB
    .venv/bin/python bench/windowed_epoch.py --files 10000    # the issue's 10,000 (~1 GiB)

The tree is an ImageFolder's, 100 classes stored one after another, files of 50-150 KB
of random bytes (no decode: the loader's cost is the reading).  nginx serves the
archive on loopback behind bench/proxy.py (20 ms a round trip, 100 MiB/s a
connection, as the issue's run).  Each mode runs in a fresh process with an empty disk
cache: ``PackedDataset(url)`` with a ``DataLoader`` of 4 workers and batches of 64,
one epoch, then a second epoch (the cache warm).  Modes:

  uniform    window_bytes=None, shuffle=True (a GET per file: today's default)
  windowed   the defaults: window_bytes="auto" (8 MiB), WindowedSampler (256 a pool)
  pool 32    8 MiB windows, 32 a pool (a smaller first batch, fewer classes)

Rounds interleave the modes (3 by default); each figure is the median of its rounds
[min-max].  Drift: the first mode's first round is run again at the end.  CPU
placement: the loader process and its workers on CPU 1 (``taskset -c 1``), the
proxy (in this process) and nginx where the scheduler puts them; on a 2-core machine
shared with other work, times are indicative and counts are exact.
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
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import packfs  # noqa: E402
from bench.proxy import Proxy  # noqa: E402
from tests.remote_servers import Nginx  # noqa: E402

CLASSES = 100
BATCH = 64

WORKER = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import torch
from packfs.torch import PackedDataset, WindowedSampler
url, mode = sys.argv[1], sys.argv[2]
if mode == "uniform":
    dataset = PackedDataset(url, "**/*.bin", window_bytes=None)
    sampler = None
else:
    dataset = PackedDataset(url, "**/*.bin")
    sampler = WindowedSampler(dataset, windows_per_pool=None if mode == "windowed" else int(mode.split()[1]))
classes = np.array([int(dataset.path(i).split("/")[0][1:]) for i in range(len(dataset))])
loader = torch.utils.data.DataLoader(dataset, batch_size=64, shuffle=sampler is None, sampler=sampler,
                                     num_workers=4, collate_fn=lambda batch: [len(b) for b in batch],
                                     persistent_workers=True,
                                     generator=torch.Generator().manual_seed(0))
out = {"first_batch": None, "epochs": []}
for epoch in range(2):
    if sampler is not None:
        sampler.set_epoch(epoch)
    start = time.perf_counter()
    seen = []
    count = 0
    order = iter(sampler if sampler is not None else [])
    for batch in loader:
        if out["first_batch"] is None:
            out["first_batch"] = time.perf_counter() - t0
        count += len(batch)
    out["epochs"].append({"seconds": time.perf_counter() - start, "samples": count})
    print("EPOCH", epoch, flush=True)
    sys.stdin.readline()  # the bench reads the server's log between epochs
if sampler is not None:
    sampler.set_epoch(0)
    order = np.array(list(sampler))
else:
    order = np.array(list(torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(0))))
full = len(order) // 64 * 64
batches = np.sort(classes[order[:full]].reshape(-1, 64), axis=1)
out["classes"] = float(((np.diff(batches, axis=1) != 0).sum(axis=1) + 1).mean())
print("RESULT " + json.dumps(out), flush=True)
"""


def build(work: Path, files: int) -> Path:
    rng = random.Random(36)
    src = work / "src"
    for i in range(files):
        path = src / f"c{i * CLASSES // files:03d}" / f"{i:06d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(rng.randint(50_000, 150_000)))
    packfs.pack_folder(src, work / "data.ffr")
    shutil.rmtree(src)
    return work / "data.ffr"


def gets(nginx: Nginx) -> tuple[int, int]:
    answered = [r for r in nginx.requests() if r.method == "GET"]
    return len(answered), sum(r.bytes_sent for r in answered)


def run_mode(url: str, mode: str, nginx: Nginx, cache: Path) -> dict:
    shutil.rmtree(cache, ignore_errors=True)
    nginx.clear_log()
    env = dict(os.environ, PACKFS_CACHE_DIR=str(cache))
    process = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", WORKER, url, mode], cwd=REPO, env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None
    counts = []
    result: dict = {}
    for line in process.stdout:
        if line.startswith("EPOCH"):
            counts.append(gets(nginx))
            nginx.clear_log()
            process.stdin.write("\n")
            process.stdin.flush()
        elif line.startswith("RESULT "):
            result = json.loads(line[7:])
    process.wait()
    if process.returncode != 0 or not result:
        raise RuntimeError(f"{mode}: the loader failed ({process.returncode})")
    epoch1, epoch2 = result["epochs"]
    return {"first_batch": result["first_batch"], "classes": result["classes"],
            "gets1": counts[0][0], "bytes1": counts[0][1], "gets2": counts[1][0], "bytes2": counts[1][1],
            "rate1": epoch1["samples"] / epoch1["seconds"], "rate2": epoch2["samples"] / epoch2["seconds"]}


def cell(values: list, digits: int = 1) -> str:
    return f"{statistics.median(values):,.{digits}f} [{min(values):,.{digits}f}-{max(values):,.{digits}f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rtt-ms", type=float, default=20)
    parser.add_argument("--bandwidth", type=float, default=100 * 2 ** 20, help="bytes/s a connection")
    options = parser.parse_args()
    modes = ["uniform", "windowed", "pool 32"]
    with tempfile.TemporaryDirectory(prefix="windowed-epoch-") as scratch:
        work = Path(scratch)
        archive = build(work, options.files)
        size = archive.stat().st_size
        with Nginx(work / "nginx") as nginx, Proxy(nginx.port, rtt=options.rtt_ms / 1000,
                                                   bandwidth=options.bandwidth) as proxy:
            nginx.put("data.ffr", archive.read_bytes())
            archive.unlink()
            url = nginx.url("data.ffr", port=proxy.port)
            results: dict = {mode: [] for mode in modes}
            for round_ in range(options.rounds):
                for mode in modes if round_ % 2 == 0 else modes[::-1]:
                    results[mode].append(run_mode(url, mode, nginx, work / "cache"))
                    print(f"round {round_ + 1} {mode}: {results[mode][-1]}", file=sys.stderr, flush=True)
            drift = run_mode(url, modes[0], nginx, work / "cache")
    print(f"{options.files} files in {CLASSES} classes, {size / 2 ** 20:.0f} MiB; DataLoader of 4 workers, batches "
          f"of {BATCH}; {options.rtt_ms:g} ms a round trip, {options.bandwidth / 2 ** 20:.0f} MiB/s a connection; "
          f"median [min-max] of {options.rounds} rounds\n")
    print("| mode | GETs epoch 1 | bytes epoch 1 / archive | GETs epoch 2 | first batch, s | epoch 1, samples/s | "
          "epoch 2, samples/s | classes/batch |")
    print("|---|---|---|---|---|---|---|---|")
    for mode in modes:
        rows = results[mode]
        print(f"| {mode} | {cell([r['gets1'] for r in rows], 0)} | {cell([r['bytes1'] / size for r in rows], 3)} | "
              f"{cell([r['gets2'] for r in rows], 0)} | {cell([r['first_batch'] for r in rows], 2)} | "
              f"{cell([r['rate1'] for r in rows], 0)} | {cell([r['rate2'] for r in rows], 0)} | "
              f"{cell([r['classes'] for r in rows], 1)} |")
    base = {key: statistics.median(r[key] for r in results["uniform"]) for key in ("gets1", "first_batch", "rate1")}
    for mode in modes[1:]:
        rows = results[mode]
        print(f"\n{mode} / uniform: GETs {statistics.median(r['gets1'] for r in rows) / base['gets1']:.3f}x, "
              f"first batch {statistics.median(r['first_batch'] for r in rows) / base['first_batch']:.2f}x, "
              f"epoch 1 rate {statistics.median(r['rate1'] for r in rows) / base['rate1']:.2f}x", end="")
    first = results[modes[0]][0]
    print(f"\n\ndrift: {modes[0]} again at the end: {drift['gets1']} GETs (first round {first['gets1']}), "
          f"epoch 1 {drift['rate1']:.0f} samples/s (first round {first['rate1']:.0f})")


if __name__ == "__main__":
    main()
