"""Training from object storage: packfs against MosaicML streaming, webdataset, litData
and plain objects, side by side (issue 36).

Setup (all on loopback, started and stopped by this script, even on failure):

- Data: an ImageFolder of real JPEGs (PIL, quality 85, noise over a gradient, sides
  chosen to give 50-150 KB each): 100 classes x 100 = 10,000 images (``--quick``: 100
  x 10 = 1,000), made once and kept under ``--work`` (default
  /var/tmp/packfs-remote-peers).  For the serial endpoint, a second one of 100 x 30
  (``--quick``: the same 1,000).
- Each system written by its own recommended writer, from the images in ImageFolder
  order (class by class: what each reader's shuffle makes of it is what the "classes
  per batch" row shows), timed as "convert time" (a fresh process on CPU 1):
  packfs ``packfs pack DIR OUT.ffr`` (defaults: one archive); MosaicML ``MDSWriter``
  (columns image: bytes, label: int; its default shard size limit, 64 MiB
  (``1 << 26``), no compression); webdataset ``ShardWriter`` (``maxsize`` 100 MB: the
  100 MB-1 GB its docs recommend; the smallest, as the data set is 1 GB; jpg and cls
  per sample); litData ``optimize`` (``chunk_bytes="64MB"``, as its README's examples,
  one worker: the job's one core); plain objects: each JPEG its own object (no convert).
- One S3 server: moto_server (bench/remote_peers_moto.py: moto, with a ranged GET that
  reads only its range; moto's own reads the whole object for every GET), in front of
  it bench/proxy.py (in this process, its threads on CPU 0): 20 ms per round trip
  (``--rtt-ms``), 100 MiB/s per connection (``--bandwidth-mib``).  The proxy counts
  requests and response bytes (heads and bodies); uploads go to moto directly, not
  counted.
- Each peer in its own venv, installed by this script under ``--work``/venvs (reused
  when present): ``torch==2.13.0`` (the CPU wheel in /opt/wheels; a constraints file
  pins it so that no peer's resolution swaps it), pillow, boto3 and the peer
  (``mosaicml-streaming``, ``webdataset``, ``litdata``).  packfs and plain objects run
  in the repository's .venv.
- The run, per system: a fresh process (bench/remote_peers_job.py) with an empty cache
  directory, a DataLoader with 4 workers (litData: its StreamingDataLoader), batches of
  64, PIL decode and resize to 64x64, 2 epochs, workers not persistent.  3 interleaved
  rounds (ABCDE ABCDE ABCDE, ``--rounds``): medians, and min-max as the spread; drift:
  the first system's last round over its first.
- Metrics: time to first batch (from the job's start after its imports: the dataset's
  making included); epoch 1 samples/s (the same clock: a cold start included) and
  epoch 2 samples/s; requests and bytes at the proxy in epoch 1 (from the job's start)
  and in epoch 2; bytes fetched in epoch 1 over the JPEGs' bytes; peak memory of the
  job: the largest sum over the job's process tree (parent and DataLoader workers) of
  PSS (``/proc/PID/smaps_rollup``: shared pages counted once), sampled every 0.2 s, with
  the same sum of RSS in the JSON; classes per full batch of 64 in epoch 1 (the
  expectation of a uniform shuffle beside it, from the hypergeometric law).
- Then epoch 1 alone against a serial slow endpoint: a second proxy that answers one
  request at a time across all connections, 60 ms per round trip (``--serial-ms``),
  the same 100 MiB/s per connection: epoch-1 time and requests per system, once.

CPU placement (2 cores): moto_server, the proxy and this script on CPU 0
(``sched_setaffinity``, inherited by moto); every job and writer, and the DataLoader's
workers (which inherit it), on CPU 1 (``taskset -c 1``).

    .venv/bin/python bench/remote_peers.py --quick     # 1,000 images, 3 rounds: ~15 min
    .venv/bin/python bench/remote_peers.py             # 10,000 images, 3 rounds: ~70 min
    .venv/bin/python bench/remote_peers.py --packfs-mode windowed   # block-aware reading (issue 36)
    .venv/bin/python bench/remote_peers.py --render results.json    # the tables again, from a JSON

``--packfs-mode``: ``uniform`` (today's default: a uniform shuffle, one GET per
sample), ``windowed`` (packfs.torch.WindowedSampler, from branch i36-sampler), or
``both`` (two packfs rows).  Results: a markdown table on stdout (each row's median,
min-max, and the ratio to the best peer) and the raw figures as JSON (``--out``).
The last runs' tables, and what they show, are in docs/performance.md ("Training from
object storage against the peers").
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import io
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

S3_KEY, S3_SECRET, S3_REGION = "testing-key-id", "testing-secret-key", "us-east-1"  # moto takes any
BUCKET = "bench"
PEERS = {"mds": "mosaicml-streaming", "wds": "webdataset", "litdata": "litdata"}
NAMES = {"packfs": "packfs", "packfs-windowed": "packfs (windowed)", "mds": "MosaicML streaming",
         "wds": "webdataset", "litdata": "litData", "plain": "plain objects"}
JOB_CPU, SERVER_CPU = 1, 0


# -- data --------------------------------------------------------------------------------

def make_images(root: Path, classes: int, per_class: int, seed: int = 0) -> int:
    """An ImageFolder of real JPEGs of 50-150 KB under ``root/train``, made once (a
    stamp file says it is complete); returns the JPEGs' total bytes."""
    stamp = root / ".complete"
    if stamp.exists():
        return int(stamp.read_text())
    import numpy as np
    from PIL import Image

    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(seed)
    total = 0
    for c in range(classes):
        directory = root / "train" / f"c{c:03d}"
        directory.mkdir(parents=True)
        for i in range(per_class):
            target = rng.uniform(52_000, 148_000)
            side = int(math.sqrt(target / 0.565))  # ~0.565 bytes per pixel at this noise and quality
            for _ in range(4):  # one or two corrections bring it inside 50-150 KB
                noise = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
                ramp = np.linspace(0, 255, side, dtype=np.float32)
                tint = rng.uniform(0.2, 1.0, 3).astype(np.float32)
                image = ((ramp[None, :, None] * 0.5 + ramp[:, None, None] * 0.5) * tint * 0.5 + noise * 0.5)
                out = io.BytesIO()
                Image.fromarray(image.astype(np.uint8)).save(out, "JPEG", quality=85)
                if 50_000 <= out.tell() <= 150_000:
                    break
                side = int(side * math.sqrt(target / out.tell()))
            (directory / f"{i:05d}.jpg").write_bytes(out.getvalue())
            total += out.tell()
    stamp.write_text(str(total))
    return total


def uniform_classes(classes: int, per_class: int, batch: int) -> float:
    """Expected distinct classes in a batch drawn uniformly without replacement."""
    n = classes * per_class
    absent = 1.0
    for i in range(batch):
        absent *= (n - per_class - i) / (n - i)
    return classes * (1 - absent)


# -- venvs -------------------------------------------------------------------------------

def ensure_venv(work: Path, peer: str) -> Path:
    """The peer's venv under ``work/venvs``, made and installed once (a stamp says so)."""
    root = work / "venvs"
    venv = root / PEERS[peer]
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if stamp.exists():
        return python
    root.mkdir(parents=True, exist_ok=True)
    constraints = root / "constraints.txt"
    constraints.write_text("torch==2.13.0\n")  # the CPU wheel; any other pulls GBs of CUDA
    base = getattr(sys, "_base_executable", sys.executable)
    print(f"installing {PEERS[peer]} into {venv} ...", flush=True)
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-c", str(constraints), "torch==2.13.0",
                    "pillow", "boto3", PEERS[peer]], check=True)
    stamp.write_text("ok\n")
    return python


def python_for(system: str, work: Path) -> Path:
    if system in PEERS:
        return ensure_venv(work, system)
    return Path(sys.executable)


# -- writing and uploading ------------------------------------------------------------------

def convert(system: str, python: Path, images: Path, out: Path) -> float:
    """Write ``images`` with the system's own writer into ``out``; seconds taken."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if system == "plain":
        return 0.0
    if system == "packfs":
        command = [str(python), "-m", "packfs", "pack", str(images), str(out / "data.ffr")]
    else:
        command = [str(python), str(HERE / "remote_peers_job.py"), "--write", system, str(images), str(out)]
    scratch = out.parent / f".tmp-{system}"  # litData's optimize works in $TMPDIR/chunks
    scratch.mkdir(exist_ok=True)
    began = time.perf_counter()
    subprocess.run(["taskset", "-c", str(JOB_CPU)] + command, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "TMPDIR": str(scratch)})
    shutil.rmtree(scratch, ignore_errors=True)
    return time.perf_counter() - began


def upload(client, source: Path, prefix: str) -> list:
    """Every file under ``source`` as ``prefix/relative path``; the keys, sorted."""
    files = sorted(path for path in source.rglob("*") if path.is_file())
    keys = [f"{prefix}/{path.relative_to(source).as_posix()}" for path in files]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda pair: client.upload_file(str(pair[0]), BUCKET, pair[1]), zip(files, keys)))
    return keys


# -- one job ------------------------------------------------------------------------------

def tree_memory(pid: int, detail: list | None = None) -> tuple:
    """(PSS, RSS) in bytes summed over ``pid`` and its descendants; with ``detail``, each
    process's PSS of anonymous, file and shared-memory pages appended to it (MiB)."""
    pids, queue = [], [pid]
    while queue:
        current = queue.pop()
        pids.append(current)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    queue += [int(child) for child in children.read().split()]
    pss = rss = 0
    for current in pids:
        with contextlib.suppress(OSError, ValueError):
            parts = {}
            with open(f"/proc/{current}/smaps_rollup") as rollup:
                for line in rollup:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
                    elif line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith(("Pss_Anon:", "Pss_File:", "Pss_Shmem:")):
                        parts[line.split(":")[0][4:].lower()] = round(int(line.split()[1]) / 1024, 1)
            if detail is not None:
                detail.append(parts)
    return pss, rss


def run_job(job: dict, python: Path, proxy, env: dict, timeout: float, log: Path) -> dict:
    """Run one job (bench/remote_peers_job.py) in a fresh process on CPU 1, reading the
    proxy's counters at each of its marks; its figures, per epoch."""
    command = ["taskset", "-c", str(JOB_CPU), str(python), str(HERE / "remote_peers_job.py"), json.dumps(job)]
    result: dict = {"epochs": [], "peak_pss": 0, "peak_rss": 0}
    with open(log, "ab") as stderr:
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                   env=env, start_new_session=True)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            detail: list = []
            pss, rss = tree_memory(process.pid, detail)
            if pss > result["peak_pss"]:  # where the peak's pages are, per process
                result["peak_detail"] = detail
            result["peak_pss"] = max(result["peak_pss"], pss)
            result["peak_rss"] = max(result["peak_rss"], rss)

    def watchdog() -> None:
        if not done.wait(timeout):
            result["error"] = f"timed out after {timeout:.0f} s"
            with contextlib.suppress(OSError):
                os.killpg(process.pid, 9)

    threading.Thread(target=sample, daemon=True).start()
    threading.Thread(target=watchdog, daemon=True).start()
    before = None
    try:
        for line in process.stdout:
            if not line.startswith(b"@@MARK "):
                continue
            mark = json.loads(line[7:])
            counters = (proxy.requests, proxy.response_bytes, len(proxy.heads))
            if mark["kind"] == "start":
                before = counters
            elif mark["kind"] == "epoch":
                mark["requests"], mark["bytes"] = counters[0] - before[0], counters[1] - before[1]
                # What the epoch asked, by request line (method and path, query left out), for the JSON.
                asked: dict = {}
                for head in proxy.heads[before[2]:counters[2]]:
                    line = head.split(b"\r\n", 1)[0].decode(errors="replace").split("?")[0]
                    asked[line] = asked.get(line, 0) + 1
                mark["asked"] = dict(sorted(asked.items(), key=lambda item: -item[1])[:20])
                result["epochs"].append(mark)
                before = counters
            process.stdin.write(b"\n")
            process.stdin.flush()
        process.wait()
    finally:
        done.set()
        if process.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(process.pid, 9)
            process.wait()
        with contextlib.suppress(OSError):  # workers left behind, should any be
            os.killpg(process.pid, 9)
    if process.returncode != 0 and "error" not in result:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        result["error"] = f"exit status {process.returncode} ({log}): " + " / ".join(lines[-3:])
    return result


# -- the whole run ------------------------------------------------------------------------

def stored_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def prepare(system: str, work: Path, data: str, images: Path, client, convert_times: dict) -> dict:
    """Write and upload one system's copy of data set ``data``; what its job needs."""
    python = python_for(system.split("-")[0], work)
    writer = system.split("-")[0]
    out = work / "written" / data / writer
    prefix = f"{data}/{writer}"
    seconds = convert(writer, python, images / "train" if writer == "plain" else images, out)
    if writer == "plain":
        keys = upload(client, images / "train", prefix)
    else:
        keys = upload(client, out, prefix)
    convert_times.setdefault(data, {})[writer] = {"seconds": seconds, "stored_bytes": stored_bytes(out),
                                                   "objects": len(keys)}
    spec = {"system": writer, "bucket": BUCKET, "prefix": prefix}
    if writer == "packfs":
        spec["url"] = f"s3://{BUCKET}/{prefix}/data.ffr"
    if writer == "wds":
        spec["shards"] = [key for key in keys if key.endswith(".tar")]
    return spec


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 images (100 classes x 10): a few minutes")
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/packfs-remote-peers"),
                        help="images, venvs, written copies and caches (kept: images and venvs are reused)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--systems", default="packfs,mds,wds,litdata,plain",
                        help="comma-separated, in round order: packfs, mds, wds, litdata, plain")
    parser.add_argument("--packfs-mode", choices=("uniform", "windowed", "both"), default="uniform")
    parser.add_argument("--window-bytes", type=int, default=0, help="windowed mode: window size (0: its default)")
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--bandwidth-mib", type=float, default=100.0)
    parser.add_argument("--serial-ms", type=float, default=60.0)
    parser.add_argument("--no-serial", action="store_true", help="skip the serial slow endpoint")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per job, seconds")
    parser.add_argument("--out", type=Path, default=None, help="JSON of the raw figures (default: WORK/results.json)")
    parser.add_argument("--render", type=Path, default=None, help="print the tables of a JSON this wrote, and stop")
    args = parser.parse_args(argv)
    if args.render:
        print(render(json.loads(args.render.read_text())))
        return 0

    import boto3

    from bench.proxy import Proxy

    os.sched_setaffinity(0, {SERVER_CPU})  # moto (a child) inherits it; jobs are placed by taskset
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    classes, per_class = (100, 10) if args.quick else (100, 100)
    serial_per_class = per_class if args.quick else 30
    main_name = f"images-{classes}x{per_class}"
    serial_name = f"images-{classes}x{serial_per_class}"
    print(f"making {classes * per_class:,} JPEGs under {work / main_name} (once) ...", flush=True)
    datasets = {main_name: make_images(work / main_name, classes, per_class)}
    if not args.no_serial and serial_name != main_name:
        datasets[serial_name] = make_images(work / serial_name, classes, serial_per_class, seed=1)

    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if "packfs" in systems and args.packfs_mode != "uniform":
        at = systems.index("packfs")
        systems[at:at + 1] = ["packfs-windowed"] if args.packfs_mode == "windowed" else ["packfs", "packfs-windowed"]
    for system in systems:
        python_for(system.split("-")[0], work)  # install venvs before anything is timed

    results: dict = {"setup": {"quick": args.quick, "images": classes * per_class, "classes": classes,
                               "dataset_bytes": datasets[main_name], "rtt_ms": args.rtt_ms,
                               "bandwidth_mib": args.bandwidth_mib, "serial_ms": args.serial_ms,
                               "workers": args.workers, "batch": args.batch, "epochs": args.epochs,
                               "rounds": args.rounds, "systems": systems,
                               "uniform_classes_per_batch": uniform_classes(classes, per_class, args.batch),
                               "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                                        capture_output=True, text=True).stdout.strip()},
                     "convert": {}, "runs": [], "serial": []}
    out_json = args.out or work / "results.json"
    moto_root = work / "moto"
    shutil.rmtree(moto_root, ignore_errors=True)
    try:
        with _moto(moto_root) as (moto_port, moto_client):
            moto_client.create_bucket(Bucket=BUCKET)
            specs: dict = {}
            for data in datasets:
                for system in systems:
                    writer = system.split("-")[0]
                    if (data, writer) not in specs:
                        print(f"writing and uploading {data} for {writer} ...", flush=True)
                        specs[(data, writer)] = prepare(writer, work, data, work / data, moto_client,
                                                        results["convert"])
            endpoint_env = lambda port: {  # noqa: E731
                **os.environ, "AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET,
                "AWS_REGION": S3_REGION, "AWS_DEFAULT_REGION": S3_REGION,
                "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}",
                "S3_ENDPOINT_URL": f"http://127.0.0.1:{port}",  # MosaicML streaming's
                "AWS_ALLOW_HTTP": "true",  # litData's obstore (a plain-http endpoint is refused without it)
                "TMPDIR": str(scratch)}  # whatever a job leaves there goes with the run

            def job_for(system: str, data: str, port: int, epochs: int, cache: Path) -> dict:
                spec = dict(specs[(data, system.split("-")[0])])
                shutil.rmtree(cache, ignore_errors=True)
                cache.mkdir(parents=True)
                spec.update({"cache_dir": str(cache), "epochs": epochs, "batch": args.batch, "workers": args.workers,
                             "seed": 0, "packfs_mode": "windowed" if system == "packfs-windowed" else "uniform",
                             "window_bytes": args.window_bytes,
                             "storage_options": {"endpoint_url": f"http://127.0.0.1:{port}",
                                                 "aws_access_key_id": S3_KEY, "aws_secret_access_key": S3_SECRET,
                                                 "region_name": S3_REGION}})
                if "shards" in spec:  # webdataset reads URLs with curl: presigned ones, for the proxy's port
                    signer = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id=S3_KEY,
                                          aws_secret_access_key=S3_SECRET, region_name=S3_REGION)
                    spec["urls"] = [signer.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": key},
                                                                  ExpiresIn=6 * 3600) for key in spec.pop("shards")]
                return spec

            scratch = work / "tmp"
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir()
            logs = work / "logs"  # each job's stderr
            shutil.rmtree(logs, ignore_errors=True)
            logs.mkdir()
            proxy = Proxy(moto_port, rtt=args.rtt_ms / 1000, bandwidth=args.bandwidth_mib * 2**20)
            try:
                for round_ in range(args.rounds):
                    for system in systems:
                        cache = work / "cache" / system
                        job = job_for(system, main_name, proxy.port, args.epochs, cache)
                        figures = run_job(job, python_for(system.split("-")[0], work), proxy,
                                          endpoint_env(proxy.port), args.timeout, logs / f"{system}-{round_ + 1}.log")
                        shutil.rmtree(cache, ignore_errors=True)
                        figures.update({"system": system, "round": round_})
                        results["runs"].append(figures)
                        out_json.write_text(json.dumps(results, indent=1))  # so far: a stopped run keeps its figures
                        print(_one_line(figures), flush=True)
            finally:
                proxy.close()
            if not args.no_serial:
                slow = Proxy(moto_port, rtt=args.serial_ms / 1000, bandwidth=args.bandwidth_mib * 2**20, serial=True)
                try:
                    for system in systems:
                        cache = work / "cache" / system
                        job = job_for(system, serial_name, slow.port, 1, cache)
                        figures = run_job(job, python_for(system.split("-")[0], work), slow,
                                          endpoint_env(slow.port), args.timeout, logs / f"{system}-serial.log")
                        shutil.rmtree(cache, ignore_errors=True)
                        figures.update({"system": system, "data": serial_name})
                        results["serial"].append(figures)
                        out_json.write_text(json.dumps(results, indent=1))
                        print("serial " + _one_line(figures), flush=True)
                finally:
                    slow.close()
    finally:
        for scratch in ("written", "tmp"):  # the written copies (GBs, remade each run) and the jobs' TMPDIR
            shutil.rmtree(work / scratch, ignore_errors=True)
    out_json.write_text(json.dumps(results, indent=1))
    print(render(results))
    print(f"\nraw figures: {out_json}")
    return 0


@contextlib.contextmanager
def _moto(root: Path):
    """bench/remote_peers_moto.py on a free port (CPU 0, inherited), stopped at the end
    whatever happens; (port, a boto3 client straight to it, not through the proxy)."""
    import boto3

    from tests.remote_servers import free_port, stop, wait_for_port

    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = root / "moto.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, str(HERE / "remote_peers_moto.py"), "-H", "127.0.0.1",
                                    "-p", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_for_port(port, process, log, seconds=60)
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id=S3_KEY,
                              aws_secret_access_key=S3_SECRET, region_name=S3_REGION)
        yield port, client
    finally:
        stop(process)


# -- reporting ----------------------------------------------------------------------------

def _one_line(figures: dict) -> str:
    if "error" in figures:
        return f"{figures['system']}: ERROR {figures['error'][:300]}"
    parts = [f"{figures['system']}:"]
    for epoch in figures["epochs"]:
        parts.append(f"epoch {epoch['epoch']} {epoch['samples'] / epoch['seconds']:.0f}/s "
                     f"({epoch['seconds']:.1f} s, first batch {epoch['first_batch']:.2f} s, "
                     f"{epoch['requests']} requests, {epoch['bytes'] / 2**20:.1f} MiB)")
    parts.append(f"peak PSS {figures['peak_pss'] / 2**20:.0f} MiB")
    return " ".join(parts)


ROWS = [  # (label, function of one run's figures, best is "low"/"high", format)
    ("time to first batch, s", lambda r: r["epochs"][0]["first_batch"], "low", "{:.2f}"),
    ("epoch 1, samples/s", lambda r: r["epochs"][0]["samples"] / r["epochs"][0]["seconds"], "high", "{:.0f}"),
    ("epoch 2, samples/s", lambda r: r["epochs"][1]["samples"] / r["epochs"][1]["seconds"], "high", "{:.0f}"),
    ("requests in epoch 1", lambda r: r["epochs"][0]["requests"], "low", "{:,.0f}"),
    ("requests in epoch 2", lambda r: r["epochs"][1]["requests"], "low", "{:,.0f}"),
    ("bytes fetched in epoch 1 / dataset bytes", lambda r: r["epochs"][0]["bytes"] / DATASET_BYTES[0], "low", "{:.3f}"),
    ("bytes fetched in epoch 2, MiB", lambda r: r["epochs"][1]["bytes"] / 2**20, "low", "{:.1f}"),
    ("peak memory of the job (PSS, parent + workers), MiB", lambda r: r["peak_pss"] / 2**20, "low", "{:,.0f}"),
    ("classes per batch of 64 (uniform: {uniform:.1f})", lambda r: r["epochs"][0]["classes_per_batch"], "high",
     "{:.1f}"),
]
DATASET_BYTES = [1]


def _cell(values: list, fmt: str) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    median = statistics.median(values)
    low, high = min(values), max(values)
    if fmt.format(low) == fmt.format(high):
        return fmt.format(median)
    return f"{fmt.format(median)} ({fmt.format(low)}-{fmt.format(high)})"


def _ratio(value, best) -> str:
    """``value`` over the best peer's, bold for the best peer itself."""
    if value is None or best is None:
        return ""
    if best == value:
        return " **1.00x**"
    if best == 0:
        return " (best peer: 0)"
    return f" {value / best:.2f}x"


def render(results: dict) -> str:
    setup = results["setup"]
    DATASET_BYTES[0] = setup["dataset_bytes"]
    systems = setup["systems"]
    ok = {s: [r for r in results["runs"] if r["system"] == s and "error" not in r
              and len(r["epochs"]) >= setup["epochs"]] for s in systems}
    lines = [f"{setup['images']:,} JPEGs ({setup['dataset_bytes'] / 2**20:,.0f} MiB), {setup['classes']} classes; "
             f"moto_server behind bench/proxy.py at {setup['rtt_ms']:g} ms per round trip and "
             f"{setup['bandwidth_mib']:g} MiB/s per connection; {setup['workers']} workers, batches of "
             f"{setup['batch']}, {setup['epochs']} epochs; medians of {setup['rounds']} interleaved rounds "
             f"(min-max); servers and proxy on CPU 0, the job on CPU 1; commit {setup['commit']}. "
             "Each cell: median (min-max), then the ratio of the median to the best peer's (packfs "
             "rows left out of \"best\"; bold: the best peer).", "",
             "| | " + " | ".join(NAMES[s] for s in systems) + " |", "|---" * (len(systems) + 1) + "|"]
    for label, get, kind, fmt in ROWS:
        if setup["epochs"] < 2 and "epoch 2" in label:
            continue
        medians = {}
        cells = {}
        for s in systems:
            values = []
            for r in ok[s]:
                with contextlib.suppress(KeyError, IndexError, TypeError, ZeroDivisionError):
                    values.append(get(r))
            values = [v for v in values if v is not None]
            medians[s] = statistics.median(values) if values else None
            cells[s] = _cell(values, fmt)
        present = [m for s, m in medians.items() if m is not None and not s.startswith("packfs")]
        best = (min(present) if kind == "low" else max(present)) if present else None
        row = [cells[s] + _ratio(medians[s], best) for s in systems]
        lines.append(f"| {label.format(uniform=setup['uniform_classes_per_batch'])} | " + " | ".join(row) + " |")
    convert = results["convert"]
    data = next(iter(convert), None)
    if data:
        lines.append("| convert time, s | " + " | ".join(
            f"{convert[data][s.split('-')[0]]['seconds']:.1f}" if s.split("-")[0] != "plain" else "-"
            for s in systems) + " |")
        lines.append("| objects stored | " + " | ".join(
            f"{convert[data][s.split('-')[0]]['objects']:,}" for s in systems) + " |")
    failed = [r for r in results["runs"] if "error" in r]
    if failed:
        lines.append("")
        lines += [f"- failed: {NAMES[r['system']]} round {r['round'] + 1}: {r['error'][:300]}" for r in failed]
    first = systems[0]
    runs = [r for r in ok[first]]
    if len(runs) >= 2:
        rate = ROWS[1][1]
        lines.append("")
        lines.append(f"Drift: {NAMES[first]}'s epoch 1 samples/s, last round / first: "
                     f"{rate(runs[-1]) / rate(runs[0]):.2f}.")
    if results["serial"]:
        lines += ["", f"Serial slow endpoint (one request at a time, {setup['serial_ms']:g} ms per round trip), "
                  "epoch 1 once:", "",
                  "| | " + " | ".join(NAMES[r["system"]] for r in results["serial"]) + " |",
                  "|---" * (len(results["serial"]) + 1) + "|"]
        times = {r["system"]: (r["epochs"][0]["seconds"] if "error" not in r and r["epochs"] else None)
                 for r in results["serial"]}
        best = min((t for s, t in times.items() if t is not None and not s.startswith("packfs")), default=None)
        lines.append("| images | " + " | ".join(
            f"{r['epochs'][0]['samples']:,}" if r.get("epochs") else "-" for r in results["serial"]) + " |")
        lines.append("| epoch 1, s | " + " | ".join(
            (f"{times[r['system']]:.1f}" + _ratio(times[r['system']], best)) if times[r["system"]] else
            f"error: {r.get('error', '')[:80]}" for r in results["serial"]) + " |")
        lines.append("| requests in epoch 1 | " + " | ".join(
            f"{r['epochs'][0]['requests']:,}" if r.get("epochs") else "-" for r in results["serial"]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
