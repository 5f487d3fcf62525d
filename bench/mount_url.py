"""A URL mount next to a local one, side by side in one run (issue 35): ``tar`` of a tree of
~21,000 small files through

- ``local``: ``packfs mount --binding lowlevel`` of the archive file;
- ``url C``: the compiled daemon on the archive at a URL (nginx on loopback), every byte
  already in the node cache (blocks read and checked by C, packfs/cformat/blockcache.c);
- ``url C, reads via Python``: the same daemon with the node cache hidden from C
  (CachedSource.node_cache answers None in the daemon), so every data read calls into
  Python's CachedSource under the GIL: the alternative design, measured;
- ``url Python``: the Python daemon (``--binding mfusepy``) on the same URL and cache.

Each round mounts each system afresh (the kernel's caches of the mount start empty; the
archive file and the cache's chunk files stay in the page cache: a warm node) and
times ``tar -cf - -C MOUNT . | cat > /dev/null`` (GNU tar writing to /dev/null itself
reads no file); the figure per system is the median over ``--rounds`` rounds, and its
ratio to ``local``.  Drift: ``local``'s first and last rounds.  The daemons run pinned to
``--cpu`` with taskset; tar, nginx and the proxy on the other CPU.

Then the cold walk: an empty node cache, the server behind bench/proxy.py adding
``--rtt-ms`` per request, the same tar through the compiled and the Python daemons
(``--cold-rounds`` rounds each, a new cache each time).

    python bench/mount_url.py --files 21205 --rounds 5 --cold-rounds 3 --rtt-ms 5
"""

from __future__ import annotations

import argparse
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
from tests.remote_servers import Nginx  # noqa: E402

# The daemon with the node cache hidden from C: every data read goes through Python.
HIDE_CACHE = ("import sys; import packfs.source.cache as c; c.CachedSource.node_cache = lambda self: None; "
              "from packfs.cli import main; sys.argv[0] = 'packfs'; main()")


def make_tree(root: Path, files: int) -> None:
    """``files`` files of 100 B - 32 KiB (log-uniform), cut from the standard library's
    sources (text, as a code tree is), in folders of about 100."""
    marker = root / f".complete-{files}"
    if marker.exists():
        return
    if root.exists():
        shutil.rmtree(root)
    corpus = b"".join(path.read_bytes() for path in sorted(Path(os.__file__).parent.glob("*.py")))
    rng = random.Random(0)
    for i in range(files):
        size = int(2 ** rng.uniform(6.6, 15))
        start = rng.randrange(0, len(corpus) - size)
        folder = root / f"d{i // 100:03d}" / f"s{i % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:05d}.py").write_bytes(corpus[start:start + size])
    marker.touch()


def mount(command: list[str], mountpoint: Path, env: dict) -> subprocess.Popen:
    mountpoint.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(command + [str(mountpoint)], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not os.path.ismount(mountpoint):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{command} did not mount: {process.stderr.read().decode() if process.stderr else ''}")
        time.sleep(0.01)
    return process


def unmount(mountpoint: Path, process: subprocess.Popen) -> None:
    subprocess.run(["fusermount3", "-u", str(mountpoint)], check=True)
    process.wait(60)


def tar_seconds(mountpoint: Path, cpus: str) -> float:
    start = time.perf_counter()
    subprocess.run(f"taskset -c {cpus} tar -cf - -C {mountpoint} . | cat > /dev/null", shell=True, check=True)
    return time.perf_counter() - start


def timed(command: list[str], mountpoint: Path, env: dict, cpus: str) -> float:
    process = mount(command, mountpoint, env)
    try:
        return tar_seconds(mountpoint, cpus)
    finally:
        unmount(mountpoint, process)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=21205)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cold-rounds", type=int, default=3)
    parser.add_argument("--rtt-ms", type=float, default=5.0)
    parser.add_argument("--compress", default=None, help="pack with --compress (e.g. zstd)")
    parser.add_argument("--cpu", type=int, default=1, help="the CPU the daemons are pinned to")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "packfs-mount-url")
    args = parser.parse_args()
    work = args.work
    src = work / "src"
    make_tree(src, args.files)
    archive = work / f"tree-{args.compress or 'stored'}.ffr"
    if not archive.exists():
        packfs.pack_folder(src, archive, compress=args.compress)
    others = sorted(os.sched_getaffinity(0) - {args.cpu}) or [args.cpu]
    other_cpus = ",".join(map(str, others))
    pin = ["taskset", "-c", str(args.cpu)]
    packfs_cli = [sys.executable, "-m", "packfs", "mount", "-f"]
    cache = work / "cache"
    env = {**os.environ, "PACKFS_CACHE_DIR": str(cache)}
    with Nginx(work / "nginx") as nginx:
        subprocess.run(["taskset", "-a", "-p", "-c", other_cpus, str(nginx.process.pid)],  # type: ignore[union-attr]
                       check=True, stdout=subprocess.DEVNULL)
        nginx.put(archive.name, archive.read_bytes())
        url = nginx.url(archive.name)
        systems = {
            "local": pin + packfs_cli + ["--binding", "lowlevel", str(archive)],
            "url C": pin + packfs_cli + ["--binding", "lowlevel", url],
            "url C, reads via Python": pin + [sys.executable, "-c", HIDE_CACHE, "mount", "-f", "--binding",
                                              "lowlevel", url],
            "url Python": pin + packfs_cli + ["--binding", "mfusepy", url],
        }
        # Every byte into the node cache first (untimed).
        shutil.rmtree(cache, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "packfs", "cache", "prefetch", url], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        nginx.clear_log()
        times: dict[str, list[float]] = {name: [] for name in systems}
        for _ in range(args.rounds):
            for name, command in systems.items():
                times[name].append(timed(command, work / "mnt", env, other_cpus))
        warm_gets = sum(1 for request in nginx.requests() if request.method == "GET")
        # Cold: an empty cache each time, through the latency proxy.
        proxy = subprocess.Popen(["taskset", "-c", other_cpus, sys.executable, "-m", "bench.proxy", "--target",
                                  str(nginx.port), "--rtt-ms", str(args.rtt_ms)], cwd=REPO, stdout=subprocess.PIPE,
                                 text=True)
        try:
            port = int(proxy.stdout.readline().split()[-1])  # type: ignore[union-attr]
            slow = nginx.url(archive.name, port=port)
            cold_systems = {"url C, cold": pin + packfs_cli + ["--binding", "lowlevel", slow],
                            "url Python, cold": pin + packfs_cli + ["--binding", "mfusepy", slow]}
            cold: dict[str, list[float]] = {name: [] for name in cold_systems}
            for _ in range(args.cold_rounds):
                for name, command in cold_systems.items():
                    shutil.rmtree(cache, ignore_errors=True)
                    cold[name].append(timed(command, work / "mnt", env, other_cpus))
        finally:
            proxy.kill()
            proxy.wait()
    shutil.rmtree(cache, ignore_errors=True)
    local = statistics.median(times["local"])
    print(f"`{' '.join(['python'] + sys.argv)}`: {args.files:,} files, archive {archive.stat().st_size / 1e6:.1f} MB "
          f"({args.compress or 'stored'}); daemons pinned to CPU {args.cpu}, tar, nginx and the proxy on CPU "
          f"{other_cpus}; median of {args.rounds} rounds (cold: {args.cold_rounds}).")
    print()
    print("| system | tar s (median) | min-max | vs local |")
    print("|---|---|---|---|")
    for name, values in {**times, **cold}.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.3f} | {min(values):.3f}-{max(values):.3f} | {median / local:.2f}x |")
    print()
    print(f"Drift: local's first round {times['local'][0]:.3f} s, last {times['local'][-1]:.3f} s.  GETs nginx "
          f"logged during the warm rounds (opens included): {warm_gets}.  Cold: {args.rtt_ms:g} ms per request "
          f"added by bench/proxy.py.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
