"""What reading a compressed file costs in Python over the decompression itself (format
1.5's codecs, section 4f; packfs/core/codecs.py), and per-thread decompressors against
one shared behind a lock.

Files of ``--size`` bytes (JSON-like text, 2 KiB by default) are packed with
``compress="zstd:3", dictionary="auto"`` and read, side by side in alternating rounds:

- ``raw``: python-zstandard's ``decompress`` of each stored frame, from a list of the
  frames' bytes, with the file's dictionary: the decompression itself, the floor;
- ``decode``: ``CodecTable.decode`` of the same frames (row checks, the bomb check of
  the frame's declared size, the length and decoded-CRC checks, this thread's
  decompressor looked up);
- ``decode_local`` and ``decode_locked``: decode's zstd path written out in the bench,
  finding this thread's decompressor (what codecs.py does) or taking one shared
  decompressor per dictionary behind a lock: the two ways to be thread-safe, alone;
- ``read_path``: ``Archive.read_path`` of each file of the compressed archive (lookup,
  the stored record's CRC, decode), against ``read_path_plain`` + ``raw``: the same files
  packed uncompressed, read, plus the raw decompression;
- ``read_batch`` against ``read_batch_plain`` + ``raw``: the datasets' path, batches of
  256 entries (an uncompressed batch joins adjacent small files into one pread; a
  compressed one reads and decodes each file).

Prints each variant's median (and best) per-file time, the overheads (``decode - raw``,
``read_path - (read_path_plain + raw)``), ratios, and a drift check (the first and last
rounds of ``raw`` must agree within 10%).  Threads: ``--threads N`` runs ``decode_local``,
``decode_locked`` and ``decode`` from N threads at once as well (per-file time of the
whole pass; python-zstandard releases the GIL while it decompresses, so with more than
one CPU the lock is what serialises).

    taskset -c 1 python bench/codec_decode.py --files 20000 --rounds 7
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import zstandard  # noqa: E402

import packfs  # noqa: E402
from packfs.core import Archive  # noqa: E402
from packfs.format import NO_RECORD, crc32  # noqa: E402


def make_tree(root: Path, files: int, size: int) -> list[str]:
    generator = random.Random(1)
    names = []
    for i in range(files):
        name = f"d{i % 100:02d}/f{i:06d}.json"
        record = {"id": i, "label": generator.choice(["cat", "dog", "bird"]), "box": [generator.random() for _ in range(4)]}
        text = (json.dumps(record) + "\n") * (size // 80 + 1)
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(text.encode()[:size])
        names.append(name)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    print(f"CPUs this process may use: {sorted(os.sched_getaffinity(0))}")
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory) / "src"
        names = make_tree(root, args.files, args.size)
        coded_path, plain_path = Path(directory) / "coded.ffr", Path(directory) / "plain.ffr"
        packfs.pack_folder(root, coded_path, compress="zstd:3", dictionary="auto")
        packfs.pack_folder(root, plain_path)
        coded, plain = Archive(coded_path), Archive(plain_path)
        codecs = coded._codecs  # the module measured: its internals are the subject
        items = []  # (row, record, stored, size)
        for name in names:
            entry = coded.lookup(name)
            record, start, end, size, row = coded._coded_span(entry, entry)
            items.append((row, record, coded._container.pread(start, end), size))
        dictionaries = {row.aux for row, *_ in items}
        print(f"{len(items)} files of {args.size} bytes, stored {sum(len(i[2]) for i in items) / len(items):.0f} bytes "
              f"each on average, codecs {sorted({row.codec for row, *_ in items})}, dictionaries "
              f"{sorted(d for d in dictionaries if d != NO_RECORD)}")
        shared = {aux: zstandard.ZstdDecompressor(dict_data=codecs._dictionary(aux, 0)) if aux != NO_RECORD
                  else zstandard.ZstdDecompressor() for aux in dictionaries}
        locks = {aux: threading.Lock() for aux in dictionaries}
        raw_calls = [(shared[row.aux].decompress, stored, size) for row, _, stored, size in items]

        def raw(part=raw_calls) -> None:
            for decompress, stored, size in part:
                decompress(stored, size, False, False)

        decode = codecs.decode

        def decoded(part=items) -> None:
            for row, record, stored, size in part:
                decode(row, record, stored, size, 0)

        local = threading.local()
        frame_content_size = zstandard.frame_content_size

        def mirrored(part, locked: bool) -> None:
            # decode's zstd path written out twice, differing only in how the decompressor
            # is found: this thread's (what codecs.py does) or one shared behind a lock.
            for row, record, stored, size in part:
                declared = frame_content_size(stored)
                if declared != size and declared != -1:
                    raise AssertionError("bomb")
                if locked:
                    with locks[row.aux]:
                        data = shared[row.aux].decompress(stored, size, False, False)
                else:
                    decoders = local.__dict__.get("decoders")
                    if decoders is None:
                        decoders = local.decoders = {aux: (zstandard.ZstdDecompressor(dict_data=codecs._dictionary(aux, 0))
                                                           if aux != NO_RECORD else zstandard.ZstdDecompressor()
                                                           ).decompress for aux in dictionaries}
                    data = decoders[row.aux](stored, size, False, False)
                if len(data) != size or crc32(data) != row.check:
                    raise AssertionError("damaged")

        def decoded_locked(part=items) -> None:
            mirrored(part, True)

        def decoded_local(part=items) -> None:
            mirrored(part, False)

        coded_read, plain_read = coded.read_path, plain.read_path

        def read_coded() -> None:
            for name in names:
                coded_read(name)

        def read_plain() -> None:
            for name in names:
                plain_read(name)

        coded_entries = [coded.lookup(name) for name in names]
        plain_entries = [plain.lookup(name) for name in names]

        def batch_coded() -> None:
            for start in range(0, len(coded_entries), 256):
                for _ in coded.read_batch(coded_entries[start : start + 256]):
                    pass

        def batch_plain() -> None:
            for start in range(0, len(plain_entries), 256):
                for _ in plain.read_batch(plain_entries[start : start + 256]):
                    pass

        pool = ThreadPoolExecutor(args.threads)
        slices = [items[k :: args.threads] for k in range(args.threads)]

        def threaded(function) -> None:
            list(pool.map(function, slices))

        variants = {"raw": raw, "decode": decoded, "decode_local": decoded_local, "decode_locked": decoded_locked,
                    "read_path": read_coded,
                    "read_path_plain": read_plain, "read_batch": batch_coded, "read_batch_plain": batch_plain,
                    f"decode_x{args.threads}_threads": lambda: threaded(lambda part: decoded(part)),
                    f"local_x{args.threads}_threads": lambda: threaded(lambda part: decoded_local(part)),
                    f"locked_x{args.threads}_threads": lambda: threaded(lambda part: decoded_locked(part))}
        for function in variants.values():
            function()  # warm: page cache, decompressors, dictionaries
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, function in variants.items():
                start = time.perf_counter()
                function()
                times[name].append((time.perf_counter() - start) / len(items) * 1e6)
        median = {name: statistics.median(values) for name, values in times.items()}
        best = {name: min(values) for name, values in times.items()}
        for name, value in median.items():
            print(f"{name:>22}: median {value:7.3f}, best {best[name]:7.3f} us/file "
                  f"(rounds: {', '.join(f'{v:.2f}' for v in times[name])})")
        print(f"best rounds: decode - raw {best['decode'] - best['raw']:+.3f} us/file; read_path - (plain + raw) "
              f"{best['read_path'] - best['read_path_plain'] - best['raw']:+.3f} us/file")
        print(f"decode overhead over raw:            {median['decode'] - median['raw']:+.3f} us/file "
              f"(decode/raw {median['decode'] / median['raw']:.2f}x)")
        print(f"lock instead of per-thread (1 thread): {median['decode_locked'] - median['decode_local']:+.3f} us/file "
              f"(locked/per-thread {median['decode_locked'] / median['decode_local']:.2f}x)")
        baseline = median["read_path_plain"] + median["raw"]
        print(f"read_path over plain read + raw:     {median['read_path'] - baseline:+.3f} us/file "
              f"(read_path/(plain+raw) {median['read_path'] / baseline:.2f}x)")
        baseline = median["read_batch_plain"] + median["raw"]
        print(f"read_batch over plain batch + raw:   {median['read_batch'] - baseline:+.3f} us/file "
              f"(read_batch/(plain+raw) {median['read_batch'] / baseline:.2f}x; batches of 256 entries)")
        threads_decode, threads_locked = (median[f"local_x{args.threads}_threads"],
                                          median[f"locked_x{args.threads}_threads"])
        print(f"{args.threads} threads: per-thread decompressors {threads_decode:.3f} us/file, one behind a lock "
              f"{threads_locked:.3f} us/file (locked/per-thread {threads_locked / threads_decode:.2f}x)")
        first, last = times["raw"][0], times["raw"][-1]
        drift = abs(last - first) / first
        print(f"drift check (raw, first vs last round): {drift:.1%} {'OK' if drift < 0.10 else 'DRIFTED: rerun'}")
        pool.shutdown()
        coded.close()
        plain.close()


if __name__ == "__main__":
    main()
