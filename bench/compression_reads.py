"""Reading compressed packfs archives (format 1.5) against the uncompressed archive, the
plain files and the kernel's EROFS, side by side in one run: medians, ratios, drift.

    python bench/compression_reads.py               # a few minutes on 2 cores; root for the cold rounds
    python bench/compression_reads.py --quick --rounds 3

Four measurements:

1. in-process random reads of 4 KiB text files, warm: ``PackedFolder(...).read(path)``
   on the compressed archives (``--compress zstd``, and with ``--dictionary auto``) and on
   the uncompressed one, against ``open(path, 'rb').read()`` of the plain files (same
   disk); every reader reads the same shuffled list, rounds alternate the readers;
2. cold shuffled reads of bench/compression.py's text tree (every file once, shuffled, one
   thread; the page cache dropped before each reader's round, which needs root):
   ``packfs mount`` (the compiled lowlevel daemon, or mfusepy where the compiled one
   refuses an archive, as the report says; restarted each round so no cache of its own
   survives) of the compressed and of the uncompressed archive, the kernel's EROFS
   mount of the ``mkfs.erofs -zlz4hc`` image over a loop device, and the plain tree;
3. the same reads warm (the page cache left as the previous read of the same files left it);
4. one random 4 KiB read inside a 1 GiB file: ``PackedFile.seek`` + ``read(4096)``
   in-process, and ``os.pread`` through the mount, at distinct random offsets (a new
   frame each time, almost surely), compressed against uncompressed; median latency,
   and, for scale, what zstandard alone takes to decode one frame of 64 KiB, 256 KiB
   and 1 MiB of the file (the latency over that is about the frames a read decoded).

The archive and image are made once (untimed) with the same commands as
bench/compression.py.  The readers run in this process, pinned by ``--cpus`` (default:
the first two cores this process may use), and the daemons with them (they are started
under ``taskset -c CPUS``).  Writes ``compression_reads.json`` and ``.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import packfs  # noqa: E402
from compare import Mount, drop_caches  # noqa: E402
from compression import MIB, PACKFS, TextMaker, make_text_tree, packfs_compresses  # noqa: E402

HERE = Path(__file__).resolve().parent


def make_small_text_files(root: Path, count: int, size: int = 4096) -> List[str]:
    """``count`` text files of exactly ``size`` bytes (source, prose, CSV, JSON in turn)."""
    paths = [f"d{i // 500:03d}/f{i:06d}.txt" for i in range(count)]
    marker = root / f".complete-{count}-{size}"
    if marker.exists():
        return paths
    if root.exists():
        shutil.rmtree(root)
    maker = TextMaker(7)
    for i, relative in enumerate(paths):
        kind = i % 4
        data = (maker.source(size), maker.prose(size), maker.csv(size), maker.json(size + 200, i))[kind][:size]
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.ljust(size, b"\n"))
    marker.touch()
    return paths


def make_large_file(root: Path, size: int) -> str:
    """One ``size``-byte text file: 8 MiB of generated text, repeated (each frame of at
    most 1 MiB holds no repeat, so it compresses as text does)."""
    marker = root / f".complete-{size}"
    if marker.exists():
        return "large.txt"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    maker = TextMaker(8)
    block = b"".join(maker.prose(MIB) if k % 2 else maker.source(MIB) for k in range(8))
    with open(root / "large.txt", "wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
        f.write(block[: size % len(block)])
    marker.touch()
    return "large.txt"


def pack(src: Path, out: Path, *options: str) -> Path:
    """Packed each run (untimed): the trees change with --quick, and so does packfs."""
    subprocess.run([*PACKFS, "pack", "-q", "-f", *options, str(src), str(out)], check=True, cwd=HERE.parent)
    return out


def readable(archives: Dict[str, Path], skipped: Dict[str, str]) -> Dict[str, Path]:
    """The archives this packfs's reader opens; the others are reported as skipped."""
    kept = {}
    for label, archive in archives.items():
        try:
            packfs.PackedFolder(archive).close()
            kept[label] = archive
        except packfs.PackfsError as error:
            skipped[f"reading {archive.name}"] = f"this packfs cannot read it: {error}"
    return kept


def file_list(root: Path) -> List[str]:
    paths = []
    for directory, _, names in os.walk(root):
        for name in names:
            if not name.startswith(".complete-") and not name.startswith(".info-"):
                paths.append(os.path.relpath(os.path.join(directory, name), root))
    return sorted(paths)


def read_plain(path: str) -> int:
    with open(path, "rb", buffering=0) as f:  # buffering=0: no isatty() ioctl to the daemon
        return len(f.read())


def timed(function: Callable[[], object]) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


class ErofsMount:
    """The kernel's EROFS over a loop device (``mount -o loop`` frees it at unmount)."""

    def __init__(self, image: Path, mountpoint: Path) -> None:
        self.image, self.mountpoint = image, mountpoint

    def __enter__(self) -> ErofsMount:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "erofs", "-o", "loop,ro", str(self.image), str(self.mountpoint)], check=True,
                       capture_output=True)
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["umount", str(self.mountpoint)], check=True)


BINDINGS: Dict[Path, str] = {}  # archive -> the binding that serves it


def packfs_mount(archive: Path, mountpoint: Path, cpus: str, skipped: Dict[str, str]) -> Mount:
    """A foreground ``packfs mount`` by the compiled daemon, or, if it cannot serve the
    archive, by mfusepy (what ``--binding auto`` would pick; said in the report)."""
    def command(binding: str) -> List[str]:
        return ["taskset", "-c", cpus, *PACKFS, "mount", "-f", "--binding", binding, str(archive), str(mountpoint)]

    if archive not in BINDINGS:
        try:
            with Mount("probe", command("lowlevel"), mountpoint):
                BINDINGS[archive] = "lowlevel"
        except RuntimeError as error:
            BINDINGS[archive] = "mfusepy"
            reason = str(error).split("Error: ", 1)[-1].strip()
            skipped[f"the compiled daemon for {archive.name}"] = f"it refused it, so mfusepy served it: {reason}"
    return Mount(f"packfs {archive.name}", command(BINDINGS[archive]), mountpoint)


def same_binding_twin(archives: Dict[str, Path], uncompressed: str, twin_label: str, mountpoint: Path, cpus: str,
                      skipped: Dict[str, str]) -> None:
    """If the compiled daemon refuses a compressed archive (mfusepy then serves it), add
    the uncompressed archive served by mfusepy too (a hard link, so a path of its own):
    the codec's cost apart from the binding's."""
    for label, archive in list(archives.items()):
        if label == uncompressed:
            continue
        packfs_mount(archive, mountpoint, cpus, skipped)  # learns the binding; mounts nothing
        if BINDINGS[archive] == "mfusepy":
            twin = archives[uncompressed].with_name(archives[uncompressed].stem + "-mfusepy.ffr")
            twin.unlink(missing_ok=True)
            os.link(archives[uncompressed], twin)
            BINDINGS[twin] = "mfusepy"
            archives[twin_label] = twin
            return


# -- 1. in-process ------------------------------------------------------------------------

PASSES = 5  # over the files a timing: one pass of 2,000 takes 20 ms, too short to time alone


def in_process(work: Path, count: int, rounds: int, compresses: bool, skipped: Dict[str, str]) -> Dict[str, object]:
    src = work / "small-text"
    paths = make_small_text_files(src, count)
    order = paths[:]
    random.Random(0).shuffle(order)
    archives = {"uncompressed": pack(src, work / "small-text.ffr")}
    if compresses:
        archives["--compress zstd"] = pack(src, work / "small-text-zstd.ffr", "--compress", "zstd")
        archives["--compress zstd --dictionary auto"] = pack(src, work / "small-text-dict.ffr", "--compress", "zstd",
                                                             "--dictionary", "auto")
    archives = readable(archives, skipped)
    readers: Dict[str, Callable[[], object]] = {}
    plain_paths = [str(src / p) for p in order]

    def plain() -> None:
        for _ in range(PASSES):
            for p in plain_paths:
                with open(p, "rb") as f:
                    f.read()

    readers["open(path, 'rb').read()"] = plain
    folders = []
    for label, archive in archives.items():
        folder = packfs.PackedFolder(archive)
        folders.append(folder)

        def run(read=folder.read) -> None:
            for _ in range(PASSES):
                for p in order:
                    read(p)

        readers[f"PackedFolder.read, {label}"] = run
    try:
        times: Dict[str, List[float]] = {label: [] for label in readers}
        for function in readers.values():  # once untimed: the page cache, the archives opened
            function()
        for _ in range(rounds):
            for label, function in readers.items():
                times[label].append(timed(function))
        drift = timed(plain)
    finally:
        for folder in folders:
            folder.close()
    median = {label: statistics.median(v) for label, v in times.items()}
    base = median["open(path, 'rb').read()"]
    return {"files": count, "bytes_each": 4096, "median_s": median, "runs": times,
            "us_per_file": {label: value / count / PASSES * 1e6 for label, value in median.items()},
            "ratio_to_plain": {label: value / base for label, value in median.items()},
            "drift": drift / base,
            "archive_bytes": {label: archive.stat().st_size for label, archive in archives.items()}}


# -- 2, 3. through mounts ---------------------------------------------------------------------


def mounted_reads(work: Path, quick: bool, rounds: int, cpus: str, compresses: bool,
                  skipped: Dict[str, str]) -> Dict[str, object]:
    src = work / "text"
    make_text_tree(src, *((4, 6, 10) if quick else (12, 20, 32)))
    paths = file_list(src)
    order = paths[:]
    random.Random(1).shuffle(order)
    archives = {"packfs mount, uncompressed": pack(src, work / "reads-text.ffr")}
    if compresses:
        archives["packfs mount, --compress zstd"] = pack(src, work / "reads-text-zstd.ffr", "--compress", "zstd")
    archives = readable(archives, skipped)
    same_binding_twin(archives, "packfs mount, uncompressed", "packfs mount, uncompressed, mfusepy", work / "m-packfs",
                      cpus, skipped)
    erofs_image: Optional[Path] = None
    if shutil.which("mkfs.erofs"):
        erofs_image = work / "reads-text.erofs"
        erofs_image.unlink(missing_ok=True)
        subprocess.run(["mkfs.erofs", "-zlz4hc", str(erofs_image), str(src)], check=True, capture_output=True)
    else:
        skipped["EROFS"] = "mkfs.erofs not installed (make bench-tools: erofs-utils)"
    can_drop = drop_caches()
    if not can_drop:
        skipped["cold rounds"] = "cannot write /proc/sys/vm/drop_caches (needs root)"

    def read_all(root: Path) -> float:
        listed = [str(root / p) for p in order]
        return timed(lambda: [read_plain(p) for p in listed])

    systems: List[str] = ["plain directory", *archives]
    if erofs_image is not None:
        systems.append("EROFS (kernel, loop), mkfs.erofs -zlz4hc")
    cold: Dict[str, List[float]] = {s: [] for s in systems}
    warm: Dict[str, List[float]] = {s: [] for s in systems}
    mount_binding: Dict[str, str] = {}

    def one_round(system: str, record_cold: bool) -> None:
        """Cold (after a cache drop) then warm reads of every file, for one system."""
        def measure(root: Path) -> None:
            if record_cold and can_drop:
                drop_caches()
                cold[system].append(read_all(root))
            else:
                read_all(root)
            warm[system].append(read_all(root))

        if system == "plain directory":
            measure(src)
        elif system in archives:
            with packfs_mount(archives[system], work / "m-packfs", cpus, skipped):
                mount_binding[system] = BINDINGS[archives[system]]
                measure(work / "m-packfs")
        else:
            assert erofs_image is not None
            with ErofsMount(erofs_image, work / "m-erofs"):
                measure(work / "m-erofs")

    os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    for system in systems:  # once, untimed: first-run costs
        one_round(system, record_cold=False)
    for system in systems:
        warm[system].clear()
    for _ in range(rounds):
        for system in systems:
            one_round(system, record_cold=True)
    drift_warm: List[float] = []
    drift_cold: List[float] = []
    # The drift check: the plain directory again.
    if can_drop:
        drop_caches()
        drift_cold.append(read_all(src))
    drift_warm.append(read_all(src))

    def summary(times: Dict[str, List[float]]) -> Dict[str, object]:
        median = {s: statistics.median(v) for s, v in times.items() if v}
        base = median.get("plain directory")
        return {"median_s": median, "runs": times,
                "ratio_to_plain": {s: v / base for s, v in median.items()} if base else {}}

    result = {"files": len(paths), "bytes": sum((src / p).stat().st_size for p in paths),
              "cold": summary(cold), "warm": summary(warm), "binding": mount_binding,
              "archive_bytes": {s: a.stat().st_size for s, a in archives.items()}}
    if erofs_image is not None:
        result["archive_bytes"]["EROFS (kernel, loop), mkfs.erofs -zlz4hc"] = erofs_image.stat().st_size
    if cold["plain directory"] and drift_cold:
        result["cold"]["drift"] = drift_cold[0] / statistics.median(cold["plain directory"])
    result["warm"]["drift"] = drift_warm[0] / statistics.median(warm["plain directory"])
    return result


# -- 4. one 4 KiB read in a 1 GiB file --------------------------------------------------------


def one_frame_decode_us(path: Path, rounds: int) -> Dict[str, float]:
    """What decoding one frame of this file costs in zstandard alone, by frame size (the
    format's frames are 64 KiB to 1 MiB, 4f): a read's latency over this is about how
    many frames it decoded.  Level 9, packfs's default."""
    import zstandard

    with open(path, "rb") as f:
        sample = f.read(MIB)
    result = {}
    for size in (64 * 1024, 256 * 1024, MIB):
        frame = zstandard.ZstdCompressor(level=9).compress(sample[:size])
        decompressor = zstandard.ZstdDecompressor()
        times = []
        for _ in range(max(rounds, 5) * 4):
            started = time.perf_counter()
            decompressor.decompress(frame)
            times.append(time.perf_counter() - started)
        result[f"{size // 1024} KiB"] = statistics.median(times) * 1e6
    return result


def large_file_reads(work: Path, size: int, reads: int, rounds: int, cpus: str, compresses: bool,
                     skipped: Dict[str, str]) -> Dict[str, object]:
    src = work / "large"
    name = make_large_file(src, size)
    archives = {"uncompressed": pack(src, work / "large.ffr")}
    if compresses:
        archives["--compress zstd"] = pack(src, work / "large-zstd.ffr", "--compress", "zstd")
    archives = readable(archives, skipped)
    same_binding_twin(archives, "uncompressed", "uncompressed, mfusepy", work / "m-large", cpus, skipped)
    for archive in archives.values():  # into the page cache: the decoding is measured, not the disk
        with open(archive, "rb") as f:
            while f.read(8 * MIB):
                pass
    rng = random.Random(4)
    latencies: Dict[str, List[float]] = {}
    for _ in range(rounds):
        for label, archive in archives.items():
            offsets = [rng.randrange(0, size // 4096) * 4096 for _ in range(reads)]
            kind = label.split(", ")[0]  # the twin (", mfusepy") is the same file
            if not label.endswith(", mfusepy"):
                with packfs.PackedFolder(archive) as folder, folder.open(name) as f:
                    samples = latencies.setdefault(f"PackedFile seek + read(4096), {kind}", [])
                    for offset in offsets:
                        started = time.perf_counter()
                        f.seek(offset)
                        data = f.read(4096)
                        samples.append(time.perf_counter() - started)
                        assert len(data) == 4096
            with packfs_mount(archive, work / "m-large", cpus, skipped):
                fd = os.open(work / "m-large" / name, os.O_RDONLY)
                try:
                    samples = latencies.setdefault(f"os.pread(4096) through packfs mount ({BINDINGS[archive]}), {kind}",
                                                   [])
                    for offset in offsets:
                        started = time.perf_counter()
                        data = os.pread(fd, 4096, offset)
                        samples.append(time.perf_counter() - started)
                        assert len(data) == 4096
                finally:
                    os.close(fd)
    median_us = {label: statistics.median(v) * 1e6 for label, v in latencies.items()}
    frame_us = one_frame_decode_us(src / name, rounds)
    ratio = {}
    for label, value in median_us.items():  # to the uncompressed archive read the same way (and binding)
        way = label.rsplit(", ", 1)[0]
        base = f"{way}, uncompressed"
        ratio[label] = value / median_us[base] if base in median_us else float("nan")
    return {"file_bytes": size, "reads_per_round": reads, "median_us": median_us, "ratio_to_uncompressed": ratio,
            "one_frame_decode_us": frame_us,
            "archive_bytes": {label: a.stat().st_size for label, a in archives.items()}}


# -- the run ----------------------------------------------------------------------------------


def render(report: Dict) -> str:
    lines = [f"`{report['command']}` on {report['machine']}; reader pinned to CPUs {report['cpus']}, "
             f"daemons under `taskset -c {report['cpus']}`; medians of {report['rounds']} rounds; load average "
             f"{report['load_before']:.2f} before, {report['load_after']:.2f} after; {report['minutes']:.1f} minutes.",
             ""]
    small = report["in_process"]
    lines += [f"**In-process reads**, {small['files']:,} text files of 4 KiB, shuffled, warm; ratio to "
              f"`open().read()` of the plain files (lower is faster); drift of `open().read()` after the rounds: "
              f"{small['drift']:.2f}x.", "",
              "| reader | us per file | ratio | archive MiB |", "|---|---:|---:|---:|"]
    for label, value in small["us_per_file"].items():
        kind = label.split(", ", 1)[1] if ", " in label else None
        size = f"{small['archive_bytes'][kind] / MIB:.2f}" if kind in small["archive_bytes"] else ""
        lines.append(f"| `{label}` | {value:.2f} | {small['ratio_to_plain'][label]:.2f} | {size} |")
    mounted = report["mounted"]
    lines += ["", f"**Through mounts**, bench/compression.py's text tree ({mounted['files']:,} files, "
                  f"{mounted['bytes'] / MIB:.1f} MiB), every file once, shuffled, one thread; seconds (ratio to the "
                  "plain directory; lower is faster).", "",
              "| system | cold s (page cache dropped) | warm s | archive MiB |", "|---|---:|---:|---:|"]
    for system, value in mounted["warm"]["median_s"].items():
        cold = mounted["cold"]["median_s"].get(system)
        binding = mounted["binding"].get(system)
        shown = f"{system} ({binding})" if binding and binding not in system else system
        cold_cell = f"{cold:.3f} ({mounted['cold']['ratio_to_plain'][system]:.2f})" if cold is not None else "n/a"
        size = mounted["archive_bytes"].get(system)
        lines.append(f"| {shown} | {cold_cell} | {value:.3f} ({mounted['warm']['ratio_to_plain'][system]:.2f}) | "
                     f"{size / MIB:.2f} |" if size else f"| {shown} | {cold_cell} | {value:.3f} (1.00) | |")
    lines.append(f"\nDrift of the plain directory after the rounds: cold {mounted['cold'].get('drift', float('nan')):.2f}x, "
                 f"warm {mounted['warm']['drift']:.2f}x.")
    large = report["large"]
    lines += ["", f"**One random 4 KiB read inside a {large['file_bytes'] / MIB:,.0f} MiB file**, "
                  f"{large['reads_per_round']} distinct random offsets a round, archive in the page cache; median "
                  "latency (ratio to the uncompressed archive's).", "",
              "| read | median us | ratio |", "|---|---:|---:|"]
    for label, value in large["median_us"].items():
        lines.append(f"| {label} | {value:.1f} | {large['ratio_to_uncompressed'][label]:.2f} |")
    lines.append("Archives: " + ", ".join(f"{k} {v / MIB:,.1f} MiB" for k, v in large["archive_bytes"].items()) + ".")
    lines.append("For scale, zstandard alone decodes one frame of this file (level 9) in: " + ", ".join(
        f"{k} {v:,.0f} us" for k, v in large["one_frame_decode_us"].items()) + ".")
    if report["skipped"]:
        lines += ["", "Skipped: " + "; ".join(f"{k}: {v}" for k, v in report["skipped"].items()) + "."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller trees, a 256 MiB large file, 2 rounds")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5; --quick: 2)")
    default_cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))[:2]))
    parser.add_argument("--cpus", default=default_cpus, help="CPUs for the reader and the daemons")
    parser.add_argument("--work", type=Path, default=Path("/tmp/packfs-bench-compression"))
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 5)
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    args.work.mkdir(parents=True, exist_ok=True)
    skipped: Dict[str, str] = {}
    compresses, why = packfs_compresses()
    if not compresses:
        skipped["packfs --compress"] = why
    report: Dict[str, object] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["python", *sys.argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "cpus": args.cpus, "rounds": rounds, "load_before": load_before, "skipped": skipped,
    }
    os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    report["in_process"] = in_process(args.work, 2000 if args.quick else 10_000, rounds, compresses, skipped)
    report["mounted"] = mounted_reads(args.work, args.quick, rounds, args.cpus, compresses, skipped)
    report["large"] = large_file_reads(args.work, (256 if args.quick else 1024) * MIB, 200, rounds, args.cpus,
                                       compresses, skipped)
    report["load_after"] = os.getloadavg()[0]
    report["minutes"] = (time.perf_counter() - started) / 60
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compression_reads.json").write_text(json.dumps(report, indent=2))
    markdown = render(report)
    (args.out / "compression_reads.md").write_text(markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
