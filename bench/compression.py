"""packfs's compression (format 1.5: zstd per file, trained dictionaries, seekable frames,
deduplication, sparse files) against squashfs, EROFS and tar, side by side in one run:
archive sizes and pack times, and the goals of the compression issue, met or not.

    python bench/compression.py                # a few minutes on 2 cores
    python bench/compression.py --quick        # about a minute: smaller trees, 2 rounds
    python bench/compression.py --rounds 5 --cpus 0,1

The trees (generated once into ``--work``, seeded, and reused while their marker exists):

- text: generated source code, prose, CSV and JSON, plus real trees copied in: part of
  /usr/share/doc and the text files (no compiled extensions) of this Python's
  site-packages, each up to a byte budget, in sorted order;
- json: 100,000 JSON documents of 1-4 KB (--quick: 20,000), the same keys, varied values;
- jpeg: real JPEGs, all different (blurred noise written by OpenCV at quality 90, about
  65 KB each, as bench/compare.py's, whose tree repeats shifted copies of one image);
- dup: files of random bytes of which 30% of the bytes are copies of other files, and
  dup-unique, the same tree without the copies;
- sparse: one file of 100 GiB apparent size holding 1 MiB of data (in 16 extents), on a
  file system that keeps holes (checked with SEEK_HOLE; the tree is skipped otherwise).

Each tree is packed by every variant: packfs uncompressed (the baseline of every ratio),
``--compress zstd``, ``--compress zstd --dictionary auto``, ``mksquashfs -comp zstd``
(its defaults: level 15, 128 KiB blocks), ``mksquashfs -comp zstd -b 1M
-Xcompression-level 22``, ``mkfs.erofs -zlz4hc`` and ``tar --zstd -cf``; the text
tree also by ``--compress zstd:19 --dictionary auto`` (what packfs's default level, 9,
leaves; on the json tree it took 100 s a run here), the dup trees by ``--compress zstd --no-dedup`` and ``--dedup``
uncompressed, the sparse tree by ``--sparse`` uncompressed and ``tar --sparse``.  The
slowest peers are left out where no conclusion depends on them (said in the report;
``--all-peers`` runs them).  A tool that is missing is reported as skipped.  Every
command runs under ``taskset -c CPUS`` (default: the first two cores this process may use),
its wall time measured from outside (start-up included), on warm trees (every file read
once first); each variant once untimed (its archive's size is taken then), then
``--rounds`` rounds of every variant in turn (three times as many for the dup and sparse
trees, whose packs take about a second), medians, each variant's spread (slowest round
over fastest), CPU time, and a drift check: the first variant timed again after the
rounds, against its median.  The goals table is computed from these numbers.

Writes ``compression.json`` and ``compression.md`` into ``--out``.  The reads are
bench/compression_reads.py's.
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
import sysconfig
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pack_parallel import timed as timed_command  # noqa: E402
from pack_parallel import warm  # noqa: E402
from zstd_bindings import json_document  # noqa: E402

PACKFS = [sys.executable, "-m", "packfs"]
HERE = Path(__file__).resolve().parent
MIB = 1 << 20
GIB = 1 << 30

# -- the trees -------------------------------------------------------------------------


def _complete(root: Path, key: str) -> bool:
    """Whether ``root`` was generated whole with ``key``; if not, it is cleared for that."""
    if (root / f".complete-{key}").exists():
        return True
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    return False


def _vocabulary(rng: random.Random, size: int) -> List[str]:
    syllables = ["ka", "lo", "mi", "ne", "ra", "to", "su", "vi", "den", "tar", "ish", "ment", "ing", "pre",
                 "con", "al", "ex", "or", "um", "el", "qu", "st", "ph", "ble"]
    words = set()
    while len(words) < size:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))))
    return sorted(words)


class TextMaker:
    """Generated text files of four kinds, Zipf-distributed words, seeded."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.words = _vocabulary(self.rng, 3000)
        weights = [1 / (rank + 1) for rank in range(len(self.words))]
        total = 0.0
        self.cumulative = []
        for weight in weights:
            total += weight
            self.cumulative.append(total)

    def _words(self, count: int) -> List[str]:
        return self.rng.choices(self.words, cum_weights=self.cumulative, k=count)

    def prose(self, size: int) -> bytes:
        paragraphs, length = [], 0
        while length < size:
            sentences = []
            for _ in range(self.rng.randint(2, 7)):
                words = self._words(self.rng.randint(5, 20))
                sentences.append(" ".join(words).capitalize() + self.rng.choice(".......?!"))
            paragraph = " ".join(sentences)
            paragraphs.append(paragraph)
            length += len(paragraph) + 2
        return "\n\n".join(paragraphs).encode()[:size]

    def source(self, size: int) -> bytes:
        lines, length = [f'"""{" ".join(self._words(12))}."""', "", "from __future__ import annotations", ""], 0
        while length < size:
            name = "_".join(self._words(self.rng.randint(1, 3)))
            args = ", ".join(self._words(self.rng.randint(0, 4)))
            block = [f"def {name}({args}) -> int:", f'    """{" ".join(self._words(10)).capitalize()}."""']
            for _ in range(self.rng.randint(2, 12)):
                target, left, right = self._words(3)
                choice = self.rng.random()
                if choice < 0.3:
                    block.append(f"    # {' '.join(self._words(self.rng.randint(4, 12)))}")
                elif choice < 0.6:
                    block.append(f"    {target} = {left} + {right} * {self.rng.randint(0, 999)}")
                elif choice < 0.8:
                    block.append(f"    if {left} > {right}:\n        return {target}")
                else:
                    block.append(f"    {target} = {left}.{right}({self.rng.randint(0, 9)}, '{self._words(1)[0]}')")
            block += [f"    return {self._words(1)[0]}", "", ""]
            text = "\n".join(block)
            lines.append(text)
            length += len(text)
        return "\n".join(lines).encode()[:size]

    def csv(self, size: int) -> bytes:
        rows, length = ["date,id,name,city,amount,count,flag"], 0
        while length < size:
            row = (f"2026-{self.rng.randint(1, 12):02d}-{self.rng.randint(1, 28):02d},{self.rng.randint(1, 10**6)},"
                   f"{self._words(1)[0]},{self._words(1)[0].title()},{self.rng.uniform(0, 10_000):.2f},"
                   f"{self.rng.randint(0, 500)},{self.rng.choice('YN')}")
            rows.append(row)
            length += len(row) + 1
        return "\n".join(rows).encode()[:size]

    def json(self, size: int, index: int) -> bytes:
        return json_document(self.rng, index, size)


def _copy_budget(source: Path, target: Path, budget: int, suffixes: Optional[Tuple[str, ...]]) -> Tuple[int, int]:
    """Copy regular files of ``source`` (those ending in ``suffixes``, or all) into
    ``target`` in sorted order until ``budget`` bytes; (files, bytes) copied."""
    files = copied = 0
    for directory, subdirectories, names in os.walk(source):
        subdirectories.sort()
        if "__pycache__" in subdirectories:
            subdirectories.remove("__pycache__")
        for name in sorted(names):
            path = os.path.join(directory, name)
            if not os.path.isfile(path) or os.path.islink(path):
                continue
            if suffixes is not None and not name.endswith(suffixes):
                continue
            size = os.path.getsize(path)
            if copied + size > budget:
                continue
            destination = target / os.path.relpath(path, source)
            destination.parent.mkdir(parents=True, exist_ok=True)
            try:
                shutil.copyfile(path, destination)
            except OSError:
                continue
            files, copied = files + 1, copied + size
    return files, copied


TEXT_SUFFIXES = (".py", ".pyi", ".txt", ".md", ".rst", ".json", ".toml", ".cfg", ".ini", ".yaml", ".yml",
                 ".html", ".css", ".js", ".csv", ".c", ".h", ".pxd", ".pyx", "METADATA", "RECORD", "LICENSE",
                 ".typed", "WHEEL", ".xml", ".svg")


def make_text_tree(root: Path, generated_mib: int, doc_mib: int, site_mib: int) -> Dict[str, object]:
    key = f"{generated_mib}-{doc_mib}-{site_mib}"
    info_path = root / f".info-{key}.json"
    if _complete(root, key):
        return json.loads(info_path.read_text())
    maker = TextMaker(0)
    written = index = 0
    kinds = (("src", ".py", maker.source), ("doc", ".txt", maker.prose), ("data", ".csv", maker.csv))
    while written < generated_mib * MIB:
        size = int(2 ** maker.rng.uniform(11, 16))  # 2 KB .. 64 KB
        kind = index % 4
        folder = root / "generated" / f"d{index // 50:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        if kind == 3:
            data, name = maker.json(size, index), f"record{index:06d}.json"
        else:
            prefix, suffix, make = kinds[kind]
            data, name = make(size), f"{prefix}{index:06d}{suffix}"
        (folder / name).write_bytes(data)
        written += len(data)
        index += 1
    doc = _copy_budget(Path("/usr/share/doc"), root / "usr-share-doc", doc_mib * MIB, None)
    site = _copy_budget(Path(sysconfig.get_paths()["purelib"]), root / "site-packages", site_mib * MIB,
                        TEXT_SUFFIXES)
    info = {"generated": [index, written], "usr_share_doc": list(doc), "site_packages": list(site),
            "site_packages_from": sysconfig.get_paths()["purelib"]}
    info_path.write_text(json.dumps(info))
    (root / f".complete-{key}").touch()
    return info


def make_json_tree(root: Path, count: int) -> None:
    if _complete(root, f"{count}"):
        return
    rng = random.Random(1)
    for index in range(count):
        folder = root / f"d{index // 1000:03d}"
        if index % 1000 == 0:
            folder.mkdir()
        (folder / f"{index:06d}.json").write_bytes(json_document(rng, index, rng.randint(1024, 4096)))
    (root / f".complete-{count}").touch()


def make_dup_trees(with_copies: Path, unique: Path, unique_mib: int, share: float = 0.30) -> None:
    """``unique``: files of random bytes (4 KB .. 1 MB); ``with_copies``: the same files
    plus copies of some of them, elsewhere under other names, making ``share`` of its bytes."""
    key = f"{unique_mib}-{share}"
    if (with_copies / f".complete-{key}").exists() and (unique / f".complete-{key}").exists():
        return
    for root in (with_copies, unique):
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
    rng = random.Random(2)
    originals: List[Tuple[str, bytes]] = []
    total = 0
    while total < unique_mib * MIB:
        data = rng.randbytes(int(2 ** rng.uniform(12, 20)))
        relative = f"set{len(originals) % 20:02d}/file{len(originals):05d}.bin"
        originals.append((relative, data))
        total += len(data)
    for root in (with_copies, unique):
        for relative, data in originals:
            (root / relative).parent.mkdir(exist_ok=True)
            (root / relative).write_bytes(data)
    wanted = share / (1 - share) * total  # copies / (originals + copies) = share
    copied = 0
    for number in range(len(originals) * 10):
        if copied >= wanted:
            break
        relative, data = rng.choice(originals)
        if copied + len(data) > wanted * 1.01:
            continue
        target = with_copies / f"copies{number % 10}" / f"copy{number:05d}-{Path(relative).name}"
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(data)
        copied += len(data)
    for root in (with_copies, unique):
        (root / f".complete-{key}").touch()


def make_jpeg_tree(root: Path, count: int, folders: int = 20) -> None:
    """``count`` distinct JPEGs of about 65 KB (blurred noise, OpenCV, quality 90, as
    bench/compare.py's): no two alike, so neither dedup nor a long window finds repeats
    (compare.py's tree is shifted copies of one image)."""
    import cv2
    import numpy as np

    if _complete(root, f"{count}-{folders}"):
        return
    rng = np.random.default_rng(5)
    for index in range(count):
        folder = root / f"n{index % folders:08d}"
        folder.mkdir(exist_ok=True)
        image = cv2.GaussianBlur(rng.integers(0, 255, (360, 360, 3), dtype=np.uint8), (0, 0), 0.7)
        cv2.imwrite(str(folder / f"n{index % folders:08d}_{index:06d}.JPEG"), image, [cv2.IMWRITE_JPEG_QUALITY, 90])
    (root / f".complete-{count}-{folders}").touch()


def holes_supported(directory: Path) -> Tuple[bool, str]:
    probe = directory / ".hole-probe"
    with open(probe, "wb") as f:
        f.truncate(64 * MIB)
        f.seek(32 * MIB)
        f.write(b"x" * 4096)
    try:
        fd = os.open(probe, os.O_RDONLY)
        try:
            data = os.lseek(fd, 0, os.SEEK_DATA)
            hole = os.lseek(fd, data, os.SEEK_HOLE)
        finally:
            os.close(fd)
        blocks = os.stat(probe).st_blocks * 512
    except OSError as error:
        return False, f"SEEK_DATA/SEEK_HOLE failed: {error}"
    finally:
        probe.unlink()
    if data == 0 or hole >= 64 * MIB or blocks > MIB:
        return False, f"{directory} does not keep holes (SEEK_DATA {data}, SEEK_HOLE {hole}, {blocks} bytes allocated)"
    return True, ""


def make_sparse_tree(root: Path, apparent: int = 100 * GIB, data: int = MIB, extents: int = 16) -> None:
    if _complete(root, f"{apparent}-{data}-{extents}"):
        return
    rng = random.Random(3)
    with open(root / "sparse.img", "wb") as f:
        f.truncate(apparent)
        for k in range(extents):  # spread over the whole span, the last one at its very end
            offset = (apparent - data // extents) if k == extents - 1 else k * (apparent // extents) + 12345 * k
            f.seek(offset)
            f.write(rng.randbytes(data // extents))
    (root / f".complete-{apparent}-{data}-{extents}").touch()


def keeps_holes_uncompressed(work: Path) -> bool:
    """Whether packfs without --compress stores a sparse file's holes as holes: packing
    the 100 GiB file otherwise writes 100 GiB."""
    probe = work / "hole-probe"
    probe.mkdir(exist_ok=True)
    with open(probe / "sparse.img", "wb") as f:
        f.truncate(256 * MIB)
        f.write(b"x" * 4096)
    archive = work / "hole-probe.ffr"
    subprocess.run([*PACKFS, "pack", "-q", "-f", str(probe), str(archive)], check=True, cwd=HERE.parent,
                   capture_output=True)  # its warning about the holes is the point, not news
    small = archive.stat().st_size < MIB
    archive.unlink()
    shutil.rmtree(probe)
    return small


# -- the variants ----------------------------------------------------------------------


class Variant(NamedTuple):
    label: str
    command: List[str]
    output: Path
    src: Path


def packfs_variant(label: str, src: Path, output: Path, *options: str) -> Variant:
    return Variant(label, [*PACKFS, "pack", "-q", "-f", *options, str(src), str(output)], output, src)


PACKFS_PLAIN = "packfs"
PACKFS_ZSTD = "packfs --compress zstd"
PACKFS_DICT = "packfs --compress zstd --dictionary auto"
PACKFS_BEST = "packfs --compress zstd:19 --dictionary auto"
SQUASH = "mksquashfs -comp zstd"
SQUASH_22 = "mksquashfs -comp zstd -b 1M -Xcompression-level 22"
EROFS = "mkfs.erofs -zlz4hc"
TAR = "tar --zstd -cf"


def peers(src: Path, work: Path, name: str, which: Tuple[str, ...], skipped: Dict[str, str]) -> List[Variant]:
    variants = []
    mksquashfs, mkfs_erofs = shutil.which("mksquashfs"), shutil.which("mkfs.erofs")
    for label in which:
        if label in (SQUASH, SQUASH_22):
            if not mksquashfs:
                skipped[label] = "mksquashfs not installed (make bench-tools)"
                continue
            out = work / f"{name}{'-22' if label == SQUASH_22 else ''}.sqfs"
            extra = ["-b", "1M", "-Xcompression-level", "22"] if label == SQUASH_22 else []
            variants.append(Variant(label, [mksquashfs, str(src), str(out), "-noappend", "-quiet", "-no-progress",
                                            "-comp", "zstd", *extra], out, src))
        elif label == EROFS:
            if not mkfs_erofs:
                skipped[label] = "mkfs.erofs not installed (make bench-tools: erofs-utils)"
                continue
            out = work / f"{name}.erofs"
            variants.append(Variant(label, [mkfs_erofs, "-zlz4hc", str(out), str(src)], out, src))
        elif label == TAR:
            out = work / f"{name}.tar.zst"
            variants.append(Variant(label, ["tar", "--zstd", "-cf", str(out), "-C", str(src), "."], out, src))
        elif label == "tar --zstd --sparse -cf":
            out = work / f"{name}.tar.zst"
            variants.append(Variant(label, ["tar", "--zstd", "--sparse", "-cf", str(out), "-C", str(src), "."],
                                    out, src))
    return variants


def packfs_compresses() -> Tuple[bool, str]:
    """Whether this packfs's ``pack`` has --compress (format 1.5's writer)."""
    shown = subprocess.run([*PACKFS, "pack", "--help"], capture_output=True, text=True, cwd=HERE.parent)
    if "--compress" in shown.stdout:
        return True, ""
    return False, "this packfs's `pack` has no --compress (format 1.5's writer is not in this checkout)"


# -- measuring ---------------------------------------------------------------------------


def archive_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def run_once(variant: Variant, cpus: str) -> Tuple[float, float]:
    """(wall, CPU: user + system) seconds of one run, the output removed first."""
    if variant.output.exists():
        variant.output.unlink()
    return timed_command(variant.command, cpus, [])


def measure_tree(name: str, variants: List[Variant], cpus: str, rounds: int) -> Dict[str, object]:
    files = sum(warm(src) for src in {v.src for v in variants})
    sizes: Dict[str, int] = {}
    for variant in variants:  # once untimed: the tools' first-run costs; the sizes
        run_once(variant, cpus)
        sizes[variant.label] = archive_bytes(variant.output)
        variant.output.unlink()
    times: Dict[str, List[float]] = {v.label: [] for v in variants}
    cpu: Dict[str, List[float]] = {v.label: [] for v in variants}
    for _ in range(rounds):
        for variant in variants:
            wall, used = run_once(variant, cpus)
            times[variant.label].append(wall)
            cpu[variant.label].append(used)
            variant.output.unlink()
    first = variants[0]
    drift = run_once(first, cpus)[0]
    first.output.unlink()
    median = {label: statistics.median(values) for label, values in times.items()}
    return {"tree": name, "files_read_to_warm": files, "first": first.label,
            "commands": {v.label: " ".join(v.command) for v in variants},
            "src": {v.label: str(v.src) for v in variants},
            "bytes": sizes, "runs": times, "median": median, "rounds": rounds, "cpu_runs": cpu,
            "cpu_median": {label: statistics.median(values) for label, values in cpu.items()},
            "spread": {label: max(values) / min(values) for label, values in times.items()},
            "size_ratio": {label: size / sizes[first.label] for label, size in sizes.items()},
            "time_ratio": {label: value / median[first.label] for label, value in median.items()},
            "drift": drift / median[first.label]}


def tree_stats(root: Path) -> Dict[str, int]:
    files = apparent = allocated = 0
    for directory, _, names in os.walk(root):
        for name in names:
            if name.startswith(".complete-") or name.startswith(".info-"):
                continue
            st = os.lstat(os.path.join(directory, name))
            files += 1
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return {"files": files, "bytes": apparent, "allocated": allocated}


# -- the goals ---------------------------------------------------------------------------


def goals(trees: Dict[str, Dict]) -> List[Tuple[str, str, str, Optional[bool]]]:
    """(goal, target, what this run measured, met) for each row of the issue's table;
    met is None where this run could not measure it."""
    rows: List[Tuple[str, str, str, Optional[bool]]] = []

    def get(tree: str, kind: str, label: str) -> Optional[float]:
        group = trees.get(tree)
        if not group or label not in group["bytes"]:
            return None
        return group["bytes"][label] if kind == "bytes" else group["median"][label]

    def missing(goal: str, target: str, why: str) -> None:
        rows.append((goal, target, why, None))

    # text: the smaller of packfs's two compressed archives, named.
    target = "<= squashfs zstd defaults; <= 1.0x squashfs -b 1M -Xcompression-level 22"
    candidates = [(get("text", "bytes", label), label) for label in (PACKFS_ZSTD, PACKFS_DICT)]
    candidates = [(size, label) for size, label in candidates if size is not None]
    squash, squash22 = get("text", "bytes", SQUASH), get("text", "bytes", SQUASH_22)
    if candidates and squash and squash22:
        size, label = min(candidates)
        rows.append(("archive size, text-heavy tree", target,
                     f"`{label}` {size / MIB:.2f} MiB: {size / squash:.3f}x squashfs zstd defaults "
                     f"({squash / MIB:.2f} MiB), {size / squash22:.3f}x squashfs -b 1M level 22 "
                     f"({squash22 / MIB:.2f} MiB)", size <= squash and size <= squash22))
    else:
        missing("archive size, text-heavy tree", target, "not measured (see skipped)")

    target = "<= squashfs zstd; <= 0.5x per-file zstd without a dictionary"
    dictionary, plain_zstd, squash = (get("json", "bytes", PACKFS_DICT), get("json", "bytes", PACKFS_ZSTD),
                                      get("json", "bytes", SQUASH))
    count = trees.get("json", {}).get("stats", {}).get("files", 100_000)
    goal = f"{count:,} JSON 1-4 KB, --dictionary auto"
    if dictionary and plain_zstd and squash:
        rows.append((goal, target, f"{dictionary / MIB:.2f} MiB: {dictionary / squash:.3f}x squashfs zstd "
                                   f"({squash / MIB:.2f} MiB), {dictionary / plain_zstd:.3f}x `{PACKFS_ZSTD}` "
                                   f"({plain_zstd / MIB:.2f} MiB)",
                     dictionary <= squash and dictionary <= 0.5 * plain_zstd))
    else:
        missing(goal, target, "not measured (see skipped)")

    target = "within 0.5% of uncompressed size; pack time within 1.1x of uncompressed"
    size, plain = get("jpeg", "bytes", PACKFS_ZSTD), get("jpeg", "bytes", PACKFS_PLAIN)
    seconds, plain_seconds = get("jpeg", "time", PACKFS_ZSTD), get("jpeg", "time", PACKFS_PLAIN)
    if size and plain and seconds and plain_seconds:
        rows.append(("JPEG tree", target, f"`{PACKFS_ZSTD}` {size / plain:.4f}x the size "
                                          f"({size - plain:+,} bytes), {seconds / plain_seconds:.2f}x the pack time "
                                          f"({seconds:.2f} s against {plain_seconds:.2f} s)",
                     abs(size / plain - 1) <= 0.005 and seconds <= 1.1 * plain_seconds))
    else:
        missing("JPEG tree", target, "not measured (see skipped)")

    target = "archive <= 0.72x the tree without duplicates removed (packfs --no-dedup); dedup adds <= 5% pack time"
    findings, met = [], True
    for dedup, no_dedup in ((PACKFS_ZSTD, PACKFS_ZSTD + " --no-dedup"), (PACKFS_PLAIN + " --dedup", PACKFS_PLAIN)):
        size, size_without = get("dup", "bytes", dedup), get("dup", "bytes", no_dedup)
        seconds, seconds_without = get("dup", "time", dedup), get("dup", "time", no_dedup)
        if size and size_without and seconds and seconds_without:
            group = trees["dup"]
            findings.append(f"`{dedup}` {size / size_without:.3f}x the size of `{no_dedup}`, "
                            f"{seconds / seconds_without:.2f}x its pack time (CPU time "
                            f"{group['cpu_median'][dedup] / group['cpu_median'][no_dedup]:.2f}x; spreads "
                            f"{group['spread'][dedup]:.2f} and {group['spread'][no_dedup]:.2f})")
            met = met and size <= 0.72 * size_without and seconds <= 1.05 * seconds_without
    if findings:
        rows.append(("30% duplicates", target, "; ".join(findings), met))
    else:
        missing("30% duplicates", target, "not measured (see skipped)")

    target = "packs in <= 1 s into an archive < 2 MiB"
    findings, met = [], True
    for label in (PACKFS_ZSTD, "packfs --sparse"):
        size, seconds = get("sparse", "bytes", label), get("sparse", "time", label)
        if size is not None and seconds is not None:
            findings.append(f"`{label}` {seconds:.2f} s, {size / MIB:.3f} MiB")
            met = met and seconds <= 1.0 and size < 2 * MIB
    if findings:
        rows.append(("100 GiB sparse file with 1 MiB data", target, "; ".join(findings), met))
    else:
        missing("100 GiB sparse file with 1 MiB data", target, "not measured (see skipped)")

    target = ">= mksquashfs zstd defaults"
    seconds, squash_seconds = get("text", "time", PACKFS_ZSTD), get("text", "time", SQUASH)
    if seconds and squash_seconds:
        rows.append(("pack speed, text tree", target, f"`{PACKFS_ZSTD}` {seconds:.2f} s, mksquashfs "
                                                      f"{squash_seconds:.2f} s: {squash_seconds / seconds:.2f}x its "
                                                      "speed", seconds <= squash_seconds))
    else:
        missing("pack speed, text tree", target, "not measured (see skipped)")
    return rows


# -- the run -----------------------------------------------------------------------------


def tool_versions() -> Dict[str, str]:
    versions = {}
    for name, command in (("mksquashfs", ["mksquashfs", "-version"]), ("mkfs.erofs", ["mkfs.erofs", "-V"]),
                          ("tar", ["tar", "--version"]), ("zstd", ["zstd", "--version"])):
        if shutil.which(command[0]):
            shown = subprocess.run(command, capture_output=True, text=True)
            versions[name] = (shown.stdout or shown.stderr).strip().splitlines()[0] if (shown.stdout or
                                                                                       shown.stderr) else "?"
    return versions


def render_tree(name: str, group: Dict) -> List[str]:
    stats = group["stats"]
    lines = [f"**{name}**: {stats['files']:,} files, {stats['bytes'] / MIB:,.1f} MiB "
             f"({stats['allocated'] / MIB:,.1f} MiB allocated){group.get('note', '')}.  Medians of "
             f"{group['rounds']} rounds; ratios to `{group['first']}`; spread: slowest / fastest round; drift of "
             f"the first row after the rounds: {group['drift']:.2f}x.", "",
             "| variant | archive MiB | size ratio | pack s | time ratio | spread | CPU s (user+sys) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for label, size in group["bytes"].items():
        lines.append(f"| `{label}` | {size / MIB:,.2f} | {group['size_ratio'][label]:.3f} | "
                     f"{group['median'][label]:.2f} | {group['time_ratio'][label]:.2f} | "
                     f"{group['spread'][label]:.2f} | {group['cpu_median'][label]:.2f} |")
    return lines + [""]


def render(report: Dict) -> str:
    lines = [f"`{report['command']}` on {report['machine']}; every command under `taskset -c {report['cpus']}`; "
             f"{report['rounds']} rounds (3x that for dup and sparse), warm trees; load average {report['load_before']:.2f} before, "
             f"{report['load_after']:.2f} after; {report['minutes']:.1f} minutes.",
             "Tools: " + "; ".join(report["tools"].values()) + ".", ""]
    for name, group in report["trees"].items():
        lines += render_tree(name, group)
    lines += ["Goals (from this run's numbers):", "", "| goal | target | measured | met |", "|---|---|---|---|"]
    for goal, target, measured, met in report["goals"]:
        verdict = "not measured" if met is None else ("met" if met else "**not met**")
        lines.append(f"| {goal} | {target} | {measured} | {verdict} |")
    if report["skipped"]:
        lines += ["", "Skipped: " + "; ".join(f"{k}: {v}" for k, v in report["skipped"].items()) + "."]
    return "\n".join(lines) + "\n"


def progress(name: str, group: Dict) -> None:
    """Each tree's table on stderr as soon as it is measured (a full run takes minutes)."""
    print("\n".join(render_tree(name, group)), file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller trees and 2 rounds: about a minute")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 3; --quick: 2)")
    default_cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))[:2]))
    parser.add_argument("--cpus", default=default_cpus, help="taskset's CPU list for every command")
    parser.add_argument("--all-peers", action="store_true",
                        help="every peer on every tree (adds minutes: see the report's skipped line)")
    parser.add_argument("--trees", default="text,json,jpeg,dup,sparse", help="which trees, comma-separated")
    parser.add_argument("--work", type=Path, default=Path("/tmp/packfs-bench-compression"),
                        help="where the trees and archives go (its file system must keep holes for the sparse tree)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 3)
    quick = args.quick
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    skipped: Dict[str, str] = {}
    compresses, why = packfs_compresses()
    if not compresses:
        skipped["packfs --compress"] = why

    def packfs_variants(name: str, src: Path, dedup: bool = False, best: bool = False) -> List[Variant]:
        """packfs's variants; ``best`` adds level 19 with dictionaries (what the default
        level leaves on the table)."""
        out = work / f"{name}"
        variants = [packfs_variant(PACKFS_PLAIN, src, Path(f"{out}.ffr"))]
        if compresses:
            variants.append(packfs_variant(PACKFS_ZSTD, src, Path(f"{out}-zstd.ffr"), "--compress", "zstd"))
            if not dedup:
                variants.append(packfs_variant(PACKFS_DICT, src, Path(f"{out}-dict.ffr"), "--compress", "zstd",
                                               "--dictionary", "auto"))
                if best:
                    variants.append(packfs_variant(PACKFS_BEST, src, Path(f"{out}-best.ffr"), "--compress", "zstd:19",
                                                   "--dictionary", "auto"))
            else:  # --compress deduplicates by default; uncompressed packfs does not
                variants.append(packfs_variant(PACKFS_ZSTD + " --no-dedup", src, Path(f"{out}-zstd-nodedup.ffr"),
                                               "--compress", "zstd", "--no-dedup"))
                variants.append(packfs_variant(PACKFS_PLAIN + " --dedup", src, Path(f"{out}-dedup.ffr"), "--dedup"))
        return variants

    every_peer = (SQUASH, SQUASH_22, EROFS, TAR)
    # lz4hc on incompressible bytes took 13 s (JPEGs) and 46 s (random) a run here, and
    # level 22 a minute on the JSON: minutes of a run that would not change a conclusion.
    incompressible_peers = every_peer if args.all_peers else (SQUASH, TAR)
    json_peers = every_peer if args.all_peers else (SQUASH, EROFS, TAR)
    if not args.all_peers:
        skipped["peers left out"] = (f"`{EROFS}` and `{SQUASH_22}` on the jpeg and dup trees, `{SQUASH_22}` on the json "
                                     "tree (slow, no conclusion depends on them; --all-peers runs them)")
    short_rounds = rounds * 3  # the dup and sparse trees pack in about a second: more rounds, same cost
    trees: Dict[str, Dict] = {}
    selected = args.trees.split(",")
    if "text" in selected:
        src = work / "text"
        info = make_text_tree(src, *((4, 6, 10) if quick else (12, 20, 32)))
        variants = packfs_variants("text", src, best=True) + peers(src, work, "text", every_peer, skipped)
        trees["text"] = measure_tree("text", variants, args.cpus, rounds)
        trees["text"]["stats"] = tree_stats(src)
        trees["text"]["note"] = (f": {info['generated'][0]:,} generated files, {info['usr_share_doc'][0]:,} from "
                                 f"/usr/share/doc, {info['site_packages'][0]:,} from {info['site_packages_from']}")
        progress("text", trees["text"])
    if "json" in selected:
        src = work / "json"
        make_json_tree(src, 20_000 if quick else 100_000)
        variants = packfs_variants("json", src) + peers(src, work, "json", json_peers, skipped)
        trees["json"] = measure_tree("json", variants, args.cpus, rounds)
        trees["json"]["stats"] = tree_stats(src)
        progress("json", trees["json"])
    if "jpeg" in selected:
        src = work / "jpeg"
        make_jpeg_tree(src, 400 if quick else 2000)
        variants = packfs_variants("jpeg", src)[:2] + peers(src, work, "jpeg", incompressible_peers, skipped)
        trees["jpeg"] = measure_tree("jpeg", variants, args.cpus, rounds)
        trees["jpeg"]["stats"] = tree_stats(src)
        progress("jpeg", trees["jpeg"])
    if "dup" in selected:
        src, unique = work / "dup", work / "dup-unique"
        make_dup_trees(src, unique, 24 if quick else 96)
        variants = (packfs_variants("dup", src, dedup=True)
                    + [packfs_variant("packfs, the tree without the copies", unique, work / "dup-unique.ffr"),
                       packfs_variant(f"{PACKFS_ZSTD}, the tree without the copies", unique,
                                      work / "dup-unique-zstd.ffr", "--compress", "zstd")]
                    + peers(src, work, "dup", incompressible_peers, skipped))
        trees["dup"] = measure_tree("dup", variants, args.cpus, short_rounds)
        trees["dup"]["stats"] = tree_stats(src)
        progress("dup", trees["dup"])
    if "sparse" in selected:
        src = work / "sparse"
        src.mkdir(exist_ok=True)
        keeps, why = holes_supported(src)
        if not keeps:
            skipped["sparse"] = why
        else:
            make_sparse_tree(src)
            variants = [v for v in packfs_variants("sparse", src)[:2] if v.label != PACKFS_PLAIN or
                        keeps_holes_uncompressed(work)]
            if compresses:
                variants.append(packfs_variant("packfs --sparse", src, work / "sparse-holes.ffr", "--sparse"))
            if variants and variants[0].label != PACKFS_PLAIN:
                skipped[f"`{PACKFS_PLAIN}` on the sparse tree"] = (
                    "left out: without --compress or --sparse it stores holes as zeros (checked on a 256 MiB file), "
                    "here 100 GiB")
            variants += peers(src, work, "sparse", ("tar --zstd --sparse -cf",),
                                                                 skipped)
            trees["sparse"] = measure_tree("sparse", variants, args.cpus, short_rounds)
            trees["sparse"]["stats"] = tree_stats(src)
            progress("sparse", trees["sparse"])
            skipped["mksquashfs, mkfs.erofs on the sparse tree"] = (
                "left out: they read every byte of the 100 GiB, holes too (minutes a run; docs/performance.md), "
                "where tar --sparse seeks over them")

    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["python", *sys.argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "cpus": args.cpus, "rounds": rounds, "tools": tool_versions(),
        "load_before": load_before, "load_after": os.getloadavg()[0],
        "minutes": (time.perf_counter() - started) / 60,
        "trees": trees, "skipped": skipped,
    }
    report["goals"] = goals(trees)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compression.json").write_text(json.dumps(report, indent=2))
    markdown = render(report)
    (args.out / "compression.md").write_text(markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
