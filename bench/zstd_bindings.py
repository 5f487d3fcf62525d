"""The Python zstd bindings side by side: the cost of one small frame with a trained
dictionary, compressed and decompressed, in one run.

Format 1.5 stores each small file as its own zstd frame against the archive's trained
dictionary, so a read of a 2 KB file pays a binding's per-call cost once.  Measured here:

- ``zstandard`` (python-zstandard, packfs's dependency): a reused ``ZstdCompressor`` /
  ``ZstdDecompressor`` bound to the dictionary;
- ``pyzstd``: the module functions ``compress`` / ``decompress`` (what its documentation
  shows), a reused ``RichMemZstdCompressor`` / ``EndlessZstdDecompressor``, and the
  dictionary passed digested (``as_digested_dict``);
- ``backports.zstd`` (the standard library's ``compression.zstd`` of Python 3.14, also
  tried under that name): the module functions, a reused ``ZstdCompressor`` with
  ``FLUSH_FRAME``, and the digested dictionary.  Its ``ZstdDecompressor`` decodes one
  frame and is spent, so every frame needs a new one.

A binding that is not importable is skipped, and the report says so.  Install the other
two into a venv of their own, not into the project's (they are not its dependencies):

    python3 -m venv /tmp/zstd-bindings-venv
    /tmp/zstd-bindings-venv/bin/pip install zstandard pyzstd backports.zstd
    taskset -c 1 /tmp/zstd-bindings-venv/bin/python bench/zstd_bindings.py

The data: ``--frames`` JSON documents of about ``--size`` bytes (similar structure, varied
values, seeded), a ``--dict-kib`` dictionary trained on other documents of the same kind
(by the first importable binding; every variant uses the same dictionary bytes), level
``--level``.  Each round times every variant in turn over all the frames; medians of
``--rounds`` rounds, ratios to the first variant, and a drift check: the first variant
timed again after the rounds.  Every variant's frames are decoded by every binding and
compared with the input before any timing.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import random
import statistics
import sys
import time
import warnings
from typing import Callable, Dict, List, Optional, Tuple

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
         "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()
CITIES = ("Amsterdam Berlin Cairo Dakar Edinburgh Florence Geneva Helsinki Istanbul Jakarta Kyoto "
          "Lagos Madrid Nairobi Oslo Prague Quito Riga Seoul Tunis Utrecht Vienna Warsaw").split()


def json_document(rng: random.Random, index: int, size: int) -> bytes:
    """One JSON record of about ``size`` bytes: the same keys in every document, the values
    varied (ids, timestamps, names, numbers, free text), as an API's responses look."""
    record: Dict[str, object] = {
        "id": index,
        "uuid": "%032x" % rng.getrandbits(128),
        "created": "2026-%02d-%02dT%02d:%02d:%02dZ" % (rng.randint(1, 12), rng.randint(1, 28), rng.randint(0, 23),
                                                       rng.randint(0, 59), rng.randint(0, 59)),
        "user": {"name": rng.choice(WORDS).title() + " " + rng.choice(WORDS).title(),
                 "email": f"{rng.choice(WORDS)}.{rng.randint(1, 9999)}@example.org",
                 "city": rng.choice(CITIES), "score": round(rng.uniform(0, 100), 3),
                 "verified": rng.random() < 0.5},
        "tags": rng.sample(WORDS, rng.randint(1, 6)),
        "metrics": {f"m{k}": round(rng.gauss(0, 1000), 4) for k in range(rng.randint(3, 10))},
        "events": [],
    }
    events: List[object] = record["events"]  # type: ignore[assignment]
    length = len(json.dumps(record))  # kept up to date by hand: dumping each time is quadratic
    while length < size - 110:
        event = {"t": rng.randint(1_700_000_000, 1_800_000_000), "kind": rng.choice(WORDS),
                 "value": rng.randint(-10_000, 10_000),
                 "note": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8)))}
        length += len(json.dumps(event)) + (2 if events else 0)  # ", " between items
        events.append(event)
    encoded = json.dumps(record).encode()
    assert len(encoded) == length
    return encoded


def documents(seed: int, count: int, size: int) -> List[bytes]:
    rng = random.Random(seed)
    return [json_document(rng, index, size) for index in range(count)]


# -- the bindings ---------------------------------------------------------------------

Variant = Tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]  # (compress one, decompress one)


def try_import(*names: str) -> Tuple[Optional[object], str]:
    errors = []
    for name in names:
        try:
            return importlib.import_module(name), name
        except ImportError as error:
            errors.append(f"{name}: {error}")
    return None, "; ".join(errors)


def train(samples: List[bytes], size: int) -> Tuple[bytes, str]:
    """A dictionary trained by the first binding that imports (every variant then loads
    the same bytes)."""
    zstandard, _ = try_import("zstandard")
    if zstandard is not None:
        return zstandard.train_dictionary(size, samples).as_bytes(), "zstandard.train_dictionary"
    pyzstd, _ = try_import("pyzstd")
    if pyzstd is not None:
        return pyzstd.train_dict(samples, size).dict_content, "pyzstd.train_dict"
    stdlib, name = try_import("compression.zstd", "backports.zstd")
    if stdlib is not None:
        return stdlib.train_dict(samples, size).dict_content, f"{name}.train_dict"
    raise SystemExit("no zstd binding importable: install zstandard, pyzstd or backports.zstd")


def zstandard_variants(module, dictionary: bytes, level: int) -> Dict[str, Variant]:
    loaded = module.ZstdCompressionDict(dictionary)
    compressor = module.ZstdCompressor(level=level, dict_data=loaded)
    decompressor = module.ZstdDecompressor(dict_data=loaded)
    return {"reused ZstdCompressor / ZstdDecompressor": (compressor.compress, decompressor.decompress)}


def pyzstd_variants(module, dictionary: bytes, level: int) -> Dict[str, Variant]:
    loaded = module.ZstdDict(dictionary)
    digested = loaded.as_digested_dict
    with warnings.catch_warnings():  # deprecated in pyzstd 0.20, still the documented reusable one
        warnings.simplefilter("ignore", DeprecationWarning)
        rich = module.RichMemZstdCompressor(level, loaded)
        rich_digested = module.RichMemZstdCompressor(level, digested)
    endless = module.EndlessZstdDecompressor(zstd_dict=loaded)
    return {
        "compress() / decompress()": (lambda data: module.compress(data, level, loaded),
                                      lambda frame: module.decompress(frame, loaded)),
        "compress() / decompress(), digested dictionary": (
            lambda data: module.compress(data, level, digested), lambda frame: module.decompress(frame, digested)),
        "reused RichMemZstdCompressor / EndlessZstdDecompressor": (rich.compress, endless.decompress),
        "the same, digested dictionary": (rich_digested.compress, endless.decompress),
    }


def stdlib_variants(module, dictionary: bytes, level: int) -> Dict[str, Variant]:
    loaded = module.ZstdDict(dictionary)
    digested = loaded.as_digested_dict
    reused = module.ZstdCompressor(level, zstd_dict=digested)
    flush_frame = module.ZstdCompressor.FLUSH_FRAME
    return {
        "compress() / decompress()": (lambda data: module.compress(data, level, zstd_dict=loaded),
                                      lambda frame: module.decompress(frame, zstd_dict=loaded)),
        "compress() / decompress(), digested dictionary": (
            lambda data: module.compress(data, level, zstd_dict=digested),
            lambda frame: module.decompress(frame, zstd_dict=digested)),
        "reused ZstdCompressor (FLUSH_FRAME), digested; new ZstdDecompressor a frame": (
            lambda data: reused.compress(data, flush_frame),
            lambda frame: module.ZstdDecompressor(zstd_dict=digested).decompress(frame)),
    }


def all_variants(dictionary: bytes, level: int) -> Tuple[Dict[str, Variant], Dict[str, str], Dict[str, str]]:
    """(label -> variant, binding -> version, binding -> why skipped)."""
    variants: Dict[str, Variant] = {}
    versions: Dict[str, str] = {}
    skipped: Dict[str, str] = {}
    for binding, names, build in (("zstandard", ("zstandard",), zstandard_variants),
                                  ("pyzstd", ("pyzstd",), pyzstd_variants),
                                  ("compression.zstd", ("compression.zstd", "backports.zstd"), stdlib_variants)):
        module, name = try_import(*names)
        if module is None:
            skipped[binding] = f"not importable ({name})"
            continue
        version = getattr(module, "__version__", None) or getattr(sys.modules.get(name.split(".")[0]), "__version__",
                                                                  None)
        library = getattr(module, "ZSTD_VERSION", None) or getattr(module, "zstd_version", "?")
        if isinstance(library, tuple):
            library = ".".join(map(str, library))
        versions[name] = f"{version or 'stdlib'} (libzstd {library})"
        for label, variant in build(module, dictionary, level).items():
            variants[f"{name}: {label}"] = variant
    return variants, versions, skipped


# -- the run --------------------------------------------------------------------------


def per_frame_us(function: Callable[[bytes], bytes], inputs: List[bytes]) -> float:
    started = time.perf_counter()
    for item in inputs:
        function(item)
    return (time.perf_counter() - started) / len(inputs) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=1000, help="documents compressed and decompressed a round")
    parser.add_argument("--size", type=int, default=2048, help="bytes per JSON document (about)")
    parser.add_argument("--dict-kib", type=int, default=64)
    parser.add_argument("--level", type=int, default=19)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="500 frames, 3 rounds")
    args = parser.parse_args()
    if args.quick:
        args.frames, args.rounds = 500, 3
    cpus = sorted(os.sched_getaffinity(0))
    frames_in = documents(1, args.frames, args.size)
    dictionary, trainer = train(documents(2, 4000, args.size), args.dict_kib * 1024)
    variants, versions, skipped = all_variants(dictionary, args.level)

    # Every variant's frames decode, by every variant, to the input: the same format.
    compressed: Dict[str, List[bytes]] = {label: [c(d) for d in frames_in] for label, (c, _) in variants.items()}
    for label, frames in compressed.items():
        for other, (_, decompress) in variants.items():
            if [decompress(f) for f in frames[:50]] != frames_in[:50]:
                raise SystemExit(f"{other} does not decode {label}'s frames to the input")
    reference = next(iter(compressed.values()))

    compress_us: Dict[str, List[float]] = {label: [] for label in variants}
    decompress_us: Dict[str, List[float]] = {label: [] for label in variants}
    for label, (c, d) in variants.items():  # once untimed: contexts, dictionaries digested
        per_frame_us(c, frames_in[:100])
        per_frame_us(d, reference[:100])
    for _ in range(args.rounds):
        for label, (c, d) in variants.items():
            compress_us[label].append(per_frame_us(c, frames_in))
            decompress_us[label].append(per_frame_us(d, reference))
    first = next(iter(variants))
    drift_c = per_frame_us(variants[first][0], frames_in)
    drift_d = per_frame_us(variants[first][1], reference)
    median_c = {label: statistics.median(v) for label, v in compress_us.items()}
    median_d = {label: statistics.median(v) for label, v in decompress_us.items()}

    mean_in = sum(map(len, frames_in)) / len(frames_in)
    lines = [
        f"`{' '.join(['python'] + sys.argv)}` on {platform.machine()}, Python {platform.python_version()}, "
        f"CPU affinity {','.join(map(str, cpus))} (run it under `taskset -c N` to pin it); load average "
        f"{os.getloadavg()[0]:.2f}.",
        f"{args.frames} JSON documents of {mean_in:,.0f} bytes on average, level {args.level}, a "
        f"{len(dictionary) // 1024} KiB dictionary ({trainer}); medians of {args.rounds} rounds; ratios to the "
        f"first row.",
        "Bindings: " + "; ".join(f"{k} {v}" for k, v in versions.items()) + ".",
        "",
        "| binding: calls | compress us/frame | ratio | decompress us/frame | ratio | mean frame bytes |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label in variants:
        size = sum(map(len, compressed[label])) / len(frames_in)
        lines.append(f"| {label} | {median_c[label]:.2f} | {median_c[label] / median_c[first]:.2f} | "
                     f"{median_d[label]:.2f} | {median_d[label] / median_d[first]:.2f} | {size:,.0f} |")
    lines += ["", f"Drift check: the first row again after the rounds: compress {drift_c:.2f} us "
                  f"({drift_c / median_c[first]:.2f}x its median), decompress {drift_d:.2f} us "
                  f"({drift_d / median_d[first]:.2f}x)."]
    for binding, why in skipped.items():
        lines.append(f"Skipped {binding}: {why}.")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
