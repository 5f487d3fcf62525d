"""What reading file contents with pread (safe when the archive is overwritten in place)
costs against copying them out of the memory map (SIGBUS when it is truncated).

    taskset -c 1 python bench/overwrite.py            # one CPU: fewer migrations
    python bench/overwrite.py --rounds 31 --out bench/results

For each file size (4 KiB, 80 KiB, 8 MiB), in the same run and interleaved round by
round, the time of one ``PackedFolder.read``:

- ``map``: the read path before this change, rebuilt from the same internals: one lseek
  (the size check), the lookup, a copy out of the map, the CRC;
- ``pread``: ``PackedFolder.read`` now: the lookup, pread into a new bytes object, the
  CRC, and the check after (fstat in C, with the SIGBUS guard);
- ``pread, no guard``: the same without the C extension (the check after is
  ``os.fstat`` in Python, plus the lseek before).

It also times the checks alone, and ``RecordReader.read_one`` (map vs pread) for 4 KiB
records.  Reported: the median over rounds of each per-call time, and ratios to ``map``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import packfs  # noqa: E402
from packfs import container as container_module  # noqa: E402
from packfs.format import crc32  # noqa: E402

SIZES = {"4 KiB": 4 << 10, "80 KiB": 80 << 10, "512 KiB": 512 << 10, "8 MiB": 8 << 20}


def read_through_map(folder: packfs.PackedFolder, path: str) -> bytes:
    """The read path before this change: lseek, lookup, a copy from the map, CRC."""
    container = folder._container
    if os.lseek(container.fd, 0, os.SEEK_END) < container.file_size:
        raise RuntimeError("shrank")
    record, start, end = folder._file_span(path)
    data = container._mm[start:end]
    if crc32(data) != container._crc_items[record]:
        raise RuntimeError("crc")
    return data


def read_with_pread(folder: packfs.PackedFolder, path: str) -> bytes:
    """PackedFolder.read with pread whatever the size (what it does unguarded)."""
    container = folder._container
    record, start, end = folder._file_span(path)
    data = container.pread(start, end)
    if crc32(data) != container._crc_items[record]:
        raise RuntimeError("crc")
    container.check_unchanged()
    return data


def record_through_map(reader: packfs.RecordReader, index: int) -> bytes:
    container, local = reader._locate(index)
    start, end = container.record_span(local)
    data = container._mm[start:end]
    container.check_crc(local, data, "record")
    return data


def record_with_pread(reader: packfs.RecordReader, index: int) -> bytes:
    container, local = reader._locate(index)
    start, end = container.record_span(local)
    data = container.pread(start, end)
    container.check_crc(local, data, "record")
    container.check_unchanged()
    return data


def per_call(function, argument_list: list) -> float:
    start = time.perf_counter()
    for argument in argument_list:
        function(argument)
    return (time.perf_counter() - start) / len(argument_list)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not container_module.GUARDED:
        sys.exit("packfs._sigbus is not built (or PACKFS_NO_SIGBUS_GUARD is set): nothing to compare")
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as work_name:
        work = Path(work_name)
        src = work / "src"
        paths: dict[str, list[str]] = {}
        for label, size in SIZES.items():
            count = 4 if size >= 1 << 20 else 40 if size >= 256 << 10 else 400
            paths[label] = []
            for i in range(count):
                relative = f"{label.replace(' ', '')}/d{i % 20:02d}/f{i:05d}.bin"
                (src / relative).parent.mkdir(parents=True, exist_ok=True)
                (src / relative).write_bytes(rng.randbytes(size))
                paths[label].append(relative)
        archive = work / "bench.ffr"
        packfs.pack_folder(src, archive)
        records = work / "bench.rec"
        with packfs.RecordWriter(records, 2000) as writer:
            for _ in range(2000):
                writer.write_one(rng.randbytes(4 << 10))

        guarded = packfs.PackedFolder(archive)
        container_module.GUARDED = False
        unguarded = packfs.PackedFolder(archive)
        container_module.GUARDED = True
        assert guarded._container.guarded and not unguarded._container.guarded
        reader = packfs.RecordReader(records)
        for label in SIZES:  # warm the page cache and the maps
            for path in paths[label]:
                assert read_through_map(guarded, path) == guarded.read(path) == unguarded.read(path)

        variants = {
            "map": lambda folder_paths: per_call(lambda p: read_through_map(guarded, p), folder_paths),
            "read": lambda folder_paths: per_call(guarded.read, folder_paths),
            "pread": lambda folder_paths: per_call(lambda p: read_with_pread(guarded, p), folder_paths),
            "pread, no guard": lambda folder_paths: per_call(unguarded.read, folder_paths),
        }
        times: dict[str, dict[str, list[float]]] = {label: {name: [] for name in variants} for label in SIZES}
        record_times: dict[str, list[float]] = {"map": [], "read_one": [], "pread": []}
        check_times: dict[str, list[float]] = {"lseek (before)": [], "check_unchanged, guarded": [],
                                               "check_unchanged, no guard": []}
        indices = list(range(2000))
        fd = guarded._container.fd
        for _ in range(args.rounds):
            for label in SIZES:
                order = list(variants.items())
                rng.shuffle(order)
                sample = paths[label] * (1 if SIZES[label] >= 256 << 10 else 5)
                for name, run in order:
                    times[label][name].append(run(sample))
            record_times["map"].append(per_call(lambda i: record_through_map(reader, i), indices))
            record_times["read_one"].append(per_call(reader.read_one, indices))
            record_times["pread"].append(per_call(lambda i: record_with_pread(reader, i), indices))
            check_times["lseek (before)"].append(per_call(lambda _: os.lseek(fd, 0, os.SEEK_END), indices))
            check_times["check_unchanged, guarded"].append(
                per_call(lambda _: guarded._container.check_unchanged(), indices))
            check_times["check_unchanged, no guard"].append(
                per_call(lambda _: unguarded._container.check_unchanged(), indices))

    def us(values: list[float]) -> float:
        return statistics.median(values) * 1e6

    cpus = sorted(os.sched_getaffinity(0))
    lines = [f"# PackedFolder.read: map vs pread ({args.rounds} rounds, medians; python {platform.python_version()}, "
             f"{platform.machine()}, CPUs {cpus} of {os.cpu_count()})", "",
             "| file size | before: lseek + map (us) | now: read (us) | read/before | pread + check (us) "
             "| pread/before | no guard: lseek + pread + fstat (us) | no guard/before |",
             "|---|---|---|---|---|---|---|---|"]
    result: dict[str, object] = {"rounds": args.rounds, "cpus": cpus, "read": {}, "records": {}, "checks": {}}
    for label in SIZES:
        row = {name: us(values) for name, values in times[label].items()}
        result["read"][label] = row  # type: ignore[index]
        lines.append(f"| {label} | {row['map']:.2f} | {row['read']:.2f} | {row['read'] / row['map']:.2f} | "
                     f"{row['pread']:.2f} | {row['pread'] / row['map']:.2f} | "
                     f"{row['pread, no guard']:.2f} | {row['pread, no guard'] / row['map']:.2f} |")
    record_row = {name: us(values) for name, values in record_times.items()}
    result["records"] = record_row
    lines += ["", f"RecordReader.read_one, 4 KiB records: before (map, no check) {record_row['map']:.2f} us, "
              f"now (guarded map + check) {record_row['read_one']:.2f} us "
              f"({record_row['read_one'] / record_row['map']:.2f}x), pread + check {record_row['pread']:.2f} us "
              f"({record_row['pread'] / record_row['map']:.2f}x)"]
    check_row = {name: us(values) for name, values in check_times.items()}
    result["checks"] = check_row
    lines += ["", "Checks alone (including the Python call): " + ", ".join(
        f"{name} {value:.2f} us" for name, value in check_row.items())]
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "overwrite.json").write_text(json.dumps(result, indent=2))
        (args.out / "overwrite.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
