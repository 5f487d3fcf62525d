"""Mutation fuzzing: damaged and hostile archives end in PackfsError, never worse.

    python -m tests.fuzz --cases 100000        # make fuzz; prints the counts
    python -m tests.fuzz --cases 300 --seed 7  # what CI runs (tests/test_fuzz.py)

Each case damages a small but complete archive (every kind of entry) one way — a
flipped bit, several random bytes, a truncation, an extension, random garbage, a zeroed
region, or a table section changed with every CRC recomputed (a hostile archive) — and
then drives everything a user can: open with and without checks, list, stat, read,
``open()``, ``read_view``, walk, verify, unpack, packfs.dataset's reads by index and
batched, and the FUSE callbacks.

What counts as a failure (any one stops the run with the case's seed):
- crash: any exception other than a PackfsError (an OSError errno from the FUSE
  callbacks), or a hang (the case's own timeout);
- undetected: with checks on, the archive opens, every read succeeds and ``verify``
  says it is sound, yet its bytes differ from the original in a way that changes what
  a reader sees (every byte of an archive is covered by a CRC, so this must be 0);
- wrong bytes: with checks on, a read returns contents other than the original's
  without an error (a hostile table with valid CRCs may point a path at another
  file's record; that is counted separately, as "hostile remaps", and ``verify``
  must still flag the table when the remap breaks a rule);
- escape: unpack writes anything outside its destination.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import packfs  # noqa: E402
from packfs import PackedFolder  # noqa: E402
from packfs.dataset import PackedFiles  # noqa: E402
from packfs.format import PIECE_SIZE  # noqa: E402
from packfs.fuse import PackfsOperations  # noqa: E402
from tests.conftest import read_records, write_records  # noqa: E402
from tests.deep_tables import chain_archive, long_target_archive, wide_long_names_archive  # noqa: E402
from tests.hostile import HOSTILE_KINDS, hostile_structure  # noqa: E402

# The errnos a FUSE callback may answer with on a damaged archive.
_FUSE_ERRNOS = {errno.ENOENT, errno.EIO, errno.ENOTDIR, errno.EISDIR, errno.EINVAL, errno.ENOSYS, errno.ENODATA}
# The seed's extended attributes (format 1.3, section 4c), by path; a hard link has its file's.
SEED_XATTRS = {
    "hello.txt": {"user.greeting": b"hi", "security.selinux": b"system_u:object_r:x_t:s0"},
    "a/b/deep.bin": {"user.a": b"", "user.b": bytes(range(200)), "trusted.c": b"\xff" * 3},
    "a": {"user.dir": b"yes"},
}
SEED_XATTRS["a/hard"] = SEED_XATTRS["hello.txt"]
_KINDS = ("flip", "flips", "truncate", "extend", "garbage", "zero", "hostile")
# Every STRUCTURE_EVERY-th case is instead a hostile structure built whole (not a mutation
# of the seed): a deep chain of long names, many long-named directories, a long symlink
# target, records aliasing each other.  Each operation on it must stay within a time and
# memory budget: these are the shapes that once cost quadratic time or memory.
STRUCTURE_EVERY = 32
_STRUCTURES = ("deep_chain", "long_names", "long_target") + HOSTILE_KINDS
# Generous: each operation takes milliseconds here; the attacks took 20 s to minutes and
# gigabytes.  The time budget is a hang and complexity detector, not a speed test.
OPERATION_SECONDS = 5.0
MEMORY_BASE = 64 << 20  # plus MEMORY_PER_ARCHIVE_BYTE times the archive's size
MEMORY_PER_ARCHIVE_BYTE = 8


def build_seed(path: Path) -> dict[str, bytes]:
    """A small archive with every kind of entry; returns path -> contents of its files."""
    files = {
        "empty.txt": b"",
        "hello.txt": b"hello world\n",
        "a/b/deep.bin": bytes(range(256)) * 20,
        "a/b/c/tiny": b"x",
        "names/\u00e9t\u00e9.txt": "\u00fcn\u00efc\u00f6d\u00e9".encode(),
        os.fsdecode(b"names/bytes-\xff.bin"): b"\x00\x01\x02",
        "big.bin": random.Random(1).randbytes(70_000),
        # Over 1 MiB: piece CRCs (format 4b), read in part by both daemons' reads below.
        "pieces.bin": random.Random(2).randbytes(2 * PIECE_SIZE + 3000),
    }
    entries = [packfs.Entry(p, c, xattrs=SEED_XATTRS.get(p)) for p, c in files.items()]
    entries += [
        packfs.Entry("a", kind="dir", xattrs=SEED_XATTRS["a"]),
        packfs.Entry("empty_dir", kind="dir"),
        packfs.Entry("link", kind="symlink", target="hello.txt"),
        packfs.Entry("a/up", kind="symlink", target="../hello.txt"),
        packfs.Entry("a/absolute", kind="symlink", target="/etc/passwd"),
        packfs.Entry("a/hard", kind="hardlink", target="hello.txt"),
    ]
    packfs.pack_entries(entries, path)
    files["a/hard"] = files["hello.txt"]
    return files


def build_compressed_seed(path: Path, work: Path) -> dict[str, bytes]:
    """A small format 1.5 archive (section 4f) with every codec: zstd files with and
    without a trained dictionary (a dictionary record), a file of several frames
    (a frame table and zstd's seek table), a sparse file (an extent list), files
    sharing a record (dedup), stored files, a symlink and a hard link; returns path
    -> contents of its files."""
    rng = random.Random(3)
    words = [b"alpha", b"beta", b"gamma", b"delta", b"{\"id\": ", b"\"name\": ", b"\n"]
    files = {f"json/{i:02}.json": b" ".join(rng.choice(words) for _ in range(rng.randint(40, 120)))
             for i in range(48)}
    files["frames.txt"] = b"".join(b"line %d of a file of several frames\n" % i for i in range(80_000))
    files["noise.bin"] = rng.randbytes(5000)
    files["copy-a.txt"] = files["copy-b.txt"] = b"the same bytes twice " * 50
    files["empty.txt"] = b""
    tree = work / "compressed-seed"
    shutil.rmtree(tree, ignore_errors=True)
    for name, data in files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(data)
    with open(tree / "sparse.img", "wb") as handle:  # holes of 64 KiB and more: stored sparse
        handle.truncate(400_000)
        handle.write(b"head" * 1000)
        handle.seek(300_000)
        handle.write(b"tail" * 1000)
    files["sparse.img"] = (tree / "sparse.img").read_bytes()
    os.symlink("frames.txt", tree / "link")
    os.link(tree / "noise.bin", tree / "hard.bin")
    files["hard.bin"] = files["noise.bin"]
    packfs.pack_folder(tree, path, compress="zstd:3", dictionary="auto", jobs=1)
    return files


def _records(archive: Path) -> tuple[list[bytes], int]:
    records = read_records(archive)
    data_records = int.from_bytes(records[-1][24:32], "little")
    return records, data_records


def mutate(original: bytes, records: list[bytes], data_records: int, rng: random.Random,
           kind: str) -> bytes:
    data = bytearray(original)
    if kind == "flip":
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == "flips":
        for _ in range(rng.randint(2, 20)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif kind == "truncate":
        del data[rng.randrange(len(data)):]
    elif kind == "extend":
        data += rng.randbytes(rng.randint(1, 200))
    elif kind == "garbage":
        start = rng.randrange(len(data))
        data[start : start + 64] = rng.randbytes(len(data[start : start + 64]))
    elif kind == "zero":
        start = rng.randrange(len(data))
        end = min(len(data), start + rng.randint(1, 4096))
        data[start:end] = bytes(end - start)
    else:  # hostile: a table section (or the footer) changed, every CRC recomputed
        changed = list(records)
        for _ in range(rng.randint(1, 3)):
            sections = int.from_bytes(records[-1][32:36], "little")  # the table's and the piece CRCs'
            index = rng.choice([data_records + 2 * k + 1 for k in range(sections)] + [len(records) - 1])
            raw = bytearray(changed[index])
            if raw:
                position = rng.randrange(len(raw))
                raw[position] = rng.choice([0, 1, 0xFF, raw[position] ^ (1 << rng.randrange(8)),
                                            rng.randrange(256)])
            changed[index] = bytes(raw)
        return _rewrite_records(changed)
    return bytes(data)


def _rewrite_records(records: list[bytes]) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        return write_records(Path(tmp) / "hostile.ffr", records).read_bytes()


@dataclass
class Counts:
    cases: int = 0
    unchanged: int = 0
    refused_at_open: int = 0
    detected_at_use: int = 0
    detected_by_verify_only: int = 0
    benign: int = 0  # hostile changes that break no rule (an mtime, a uid): not damage
    hostile_remaps: int = 0
    undetected: int = 0
    wrong_bytes: int = 0
    crashes: int = 0
    escapes: int = 0
    structures: int = 0
    slowest_operation: float = 0.0  # seconds, over the structure cases
    largest_peak: int = 0  # bytes traced, over the structure cases
    by_kind: dict[str, int] = field(default_factory=dict)

    def failures(self) -> int:
        return self.undetected + self.wrong_bytes + self.crashes + self.escapes


class Failure(Exception):
    pass


def _use_everything(folder: PackedFolder, files: dict[str, bytes], sandbox: Path) -> tuple[int, int]:
    """Drive every reader path; returns (PackfsErrors raised, wrong reads)."""
    errors = wrong = 0

    def attempt(function, *args):
        nonlocal errors
        try:
            return function(*args)
        except packfs.PackfsError:
            errors += 1
            return None

    listed = attempt(folder.list, "", True) or []
    for relative in listed:
        attempt(folder.stat, relative)
        attempt(folder.exists, relative)
    for relative, contents in files.items():
        for reader in (folder.read, lambda p: bytes(folder.read_view(p))):
            data = attempt(reader, relative)
            if data is not None and data != contents:
                wrong += 1
        with contextlib.suppress(packfs.PackfsError):
            with folder.open(relative) as f:
                f.seek(1)
                f.read()
    selection = attempt(PackedFiles, folder)  # packfs.dataset: by index, and batched
    if selection is not None:
        count = len(selection)
        paths = [attempt(selection.path, i) for i in range(count)]
        for order in ([[i] for i in range(count)], [list(range(count)), list(range(count))[::-1]]):
            for batch in order:
                contents = attempt(selection.read_batch, batch) or [None] * len(batch)
                for i, data in zip(batch, contents):
                    if data is not None and paths[i] in files and data != files[paths[i]]:
                        wrong += 1
    for link in ("link", "a/up", "a/absolute"):
        attempt(folder.readlink, link)
    for relative in list(files) + ["a", "link", "empty_dir"]:
        found = attempt(folder.xattrs, relative, False)
        if found is not None and found != SEED_XATTRS.get(relative, {}):
            wrong += 1
    attempt(lambda: list(folder.walk()))
    dest = sandbox / "dest"
    attempt(packfs.unpack, folder, dest)
    # dest itself may be gone: unpack removes a DEST it created if an error left it empty.
    if sorted(os.listdir(sandbox)) not in ([], ["dest"]):
        raise Failure(f"unpack wrote outside its destination: {sorted(os.listdir(sandbox))}")
    shutil.rmtree(dest, ignore_errors=True)
    operations = PackfsOperations(folder, check_data=folder.check_data, no_open=True)
    for path in ["/" + p for p in list(files) + ["", "a", "a/b", "empty_dir", "link", "missing"]]:
        for call in (lambda: _kernel_attributes(path, operations.getattr(path)), lambda: operations.readdir(path, 0),
                     lambda: operations.read(path, 1 << 20, 0, 0), lambda: operations.read(path, 4096, PIECE_SIZE + 5, 0),
                     lambda: operations.readlink(path),
                     lambda: operations.open(path, os.O_RDONLY),
                     lambda: operations.listxattr(path), lambda: operations.getxattr(path, "user.b")):
            try:
                call()
            except OSError as error:
                if error.errno not in _FUSE_ERRNOS:
                    raise Failure(f"FUSE callback answered errno {error.errno}") from error
    tree = compiled_tree(folder.archive)
    if tree is not None:
        wrong += use_compiled(tree, files)
    return errors, wrong


_DEVNULL = os.open(os.devnull, os.O_WRONLY)


def compiled_tree(archive: packfs.core.Archive):
    """The compiled daemon's operations over ``archive`` (its problems logged to
    /dev/null: a damaged table gives thousands of lines), or None where it is not built
    or cannot serve this archive (a legacy one)."""
    from packfs.fuse import tree_for, unavailable

    if unavailable(archive) is not None:
        return None
    return tree_for(archive, _DEVNULL)


def use_compiled(tree, files: dict[str, bytes], budget: int = 20000) -> int:
    """Drive the compiled daemon's operations over everything its listings reach (at
    most ``budget`` entries): readdir, lookup of each name, getattr, read, readlink.
    Every failure must be an errno a FUSE request may get; returns the reads whose
    bytes differ from ``files`` without an error."""
    wrong = 0
    pending = [(1, "")]
    visited = 0

    def answered(call):
        try:
            return call()
        except OSError as error:
            if error.errno not in _FUSE_ERRNOS:
                raise Failure(f"compiled daemon answered errno {error.errno}") from error
            return None

    while pending and visited < budget:
        inode, prefix = pending.pop()
        for name, child, mode, _ in answered(lambda: tree.readdir(inode)) or []:
            visited += 1
            if name in (b".", b"..") or visited > budget:
                continue
            path = prefix + os.fsdecode(name)
            found = answered(lambda: tree.lookup(inode, name))
            attributes = answered(lambda: tree.getattr(child))
            for stat in (found, attributes):
                if stat is not None:
                    _kernel_attributes(path, dict(stat, st_mtime=stat["st_mtime_ns"] // 10**9))
            if mode & 0o170000 == 0o040000:
                pending.append((child, path + "/"))
            data = answered(lambda: tree.read(child, 0, 1 << 20))
            answered(lambda: tree.read(child, 1, 4096))
            later = answered(lambda: tree.read(child, PIECE_SIZE + 5, 4096))
            if later is not None and path in files and later != files[path][PIECE_SIZE + 5: PIECE_SIZE + 4101]:
                wrong += 1
            answered(lambda: tree.readlink(child))
            listed = answered(lambda: tree.listxattr(child))
            expected = SEED_XATTRS.get(path, {})
            if listed is not None and path in files and listed != b"".join(
                    os.fsencode(name) + b"\0" for name in sorted(expected, key=os.fsencode)):
                wrong += 1
            for name in [n for n in (listed or b"").split(b"\0") if n][:8] + [b"user.missing"]:
                value = answered(lambda: tree.getxattr(child, name))
                if value is not None and path in files and value != expected.get(os.fsdecode(name)):
                    wrong += 1
            if data is not None and path in files and data != files[path][:1 << 20]:
                wrong += 1
    return wrong


def _kernel_attributes(path: str, attributes: dict[str, int]) -> None:
    """A getattr answer the kernel takes: it refuses a whole stat (EIO) whose size is
    above 2**63 - 1, and (uid_t)-1 means no owner (a hostile table's values are clamped)."""
    if not (0 <= attributes["st_size"] <= 2**63 - 1 and 0 <= attributes["st_uid"] <= 2**32 - 2
            and 0 <= attributes["st_gid"] <= 2**32 - 2 and -(2**63) <= attributes["st_mtime"] < 2**63):
        raise Failure(f"getattr {path}: attributes the kernel cannot represent: {attributes}")


def run_case(damaged: bytes, original: bytes, files: dict[str, bytes], kind: str, work: Path,
             counts: Counts) -> None:
    counts.cases += 1
    counts.by_kind[kind] = counts.by_kind.get(kind, 0) + 1
    if damaged == original:
        counts.unchanged += 1
        return
    path = work / "case.ffr"
    path.write_bytes(damaged)
    sandbox = work / "sandbox"
    sandbox.mkdir(exist_ok=True)
    outcome = None
    for check_data in (True, False):
        try:
            folder = PackedFolder(path, check_data=check_data)
        except packfs.PackfsError:
            if check_data:
                outcome = "refused_at_open"
            continue
        with folder:
            errors, wrong = _use_everything(folder, files, sandbox)
            report = folder.verify()
        if not check_data:
            continue
        if kind == "hostile" and wrong:
            counts.hostile_remaps += 1  # valid CRCs: a table may legally point elsewhere
        elif wrong:
            counts.wrong_bytes += 1
            raise Failure("a checked read returned wrong bytes without an error")
        if errors:
            outcome = "detected_at_use"
        elif not report.ok:
            outcome = "detected_by_verify_only"
        elif kind == "hostile":
            outcome = "benign"
        else:
            counts.undetected += 1
            raise Failure("damage passed open, every read and verify")
    setattr(counts, outcome, getattr(counts, outcome) + 1)


def build_structure(kind: str, rng: random.Random, work: Path) -> tuple[Path, list[str]]:
    """A hostile structure and the paths worth asking for in it."""
    path = work / f"{kind}.ffr"
    path.unlink(missing_ok=True)
    if kind in HOSTILE_KINDS:  # records aliasing each other, or running over the table
        return path, hostile_structure(kind, path, rng)
    if kind == "deep_chain":
        # Mostly past Python's recursion limit (about 1,000 levels), sometimes far past it.
        depth = rng.randint(2, 1200) if rng.random() < 0.9 else rng.randint(1200, 3000)
        length = rng.choice([1, 2, 16, 255, rng.randint(1, 255)])
        chain_archive(path, depth, length)
        top = "/".join(["d" * length] * depth)
        middle = "/".join(["d" * length] * (depth // 2))
        return path, [top, top + "/" + "f" * length, middle, top + "/../" + "d" * length]
    if kind == "long_names":
        count, length = rng.randint(1, 600), rng.randint(9, 255)
        wide_long_names_archive(path, count, length)
        return path, [f"{i:08d}{'n' * (length - 8)}/f" for i in range(count)]
    # long_target: a symlink whose text runs past Linux's 4,095 bytes, walking up and
    # down ("d/.." repeated) so that following it would cost time proportional to it.
    length = rng.choice([4096, 5000, 100_000, 1_000_000])
    target = (b"d/.." * (length // 4 + 1))[: length - 4] + b"/d/x"
    long_target_archive(path, target)
    return path, ["s", "d/x"]


def _bytes_under(directory: Path) -> int:
    """Bytes of the regular files under ``directory``, each inode once (find: it walks
    a tree of any depth, which a recursive Python walk does not)."""
    if not directory.exists():
        return 0
    result = subprocess.run(["find", str(directory), "-type", "f", "-printf", "%i %s\\n"], capture_output=True,
                            text=True, check=True)
    sizes = dict(line.split() for line in result.stdout.splitlines())  # inode -> size
    return sum(int(size) for size in sizes.values())


def run_structure(kind: str, path: Path, paths: list[str], work: Path, counts: Counts) -> None:
    """Drive every reader over a hostile structure; each operation must end in a result
    or a PackfsError (an errno from the FUSE callbacks) within the time budget, and the
    whole case within the memory budget."""
    import tracemalloc

    counts.structures += 1
    budget = MEMORY_BASE + MEMORY_PER_ARCHIVE_BYTE * path.stat().st_size
    sandbox = work / "sandbox"
    sandbox.mkdir(exist_ok=True)

    def bounded(name: str, function, *args):
        started = time.perf_counter()
        try:
            return function(*args)
        except packfs.PackfsError:
            return None
        except OSError as error:  # only FUSE callbacks answer with an errno
            if getattr(function, "__self__", None).__class__ is not PackfsOperations:
                raise
            if error.errno not in _FUSE_ERRNOS:
                raise Failure(f"{name}: FUSE callback answered errno {error.errno}") from error
            return None
        finally:
            seconds = time.perf_counter() - started
            counts.slowest_operation = max(counts.slowest_operation, seconds)
            if seconds > OPERATION_SECONDS:
                raise Failure(f"{kind}: {name} took {seconds:.1f} s (budget {OPERATION_SECONDS} s)")

    tracemalloc.start()
    try:
        for check_data in (True, False):
            folder = bounded("open", PackedFolder, path, check_data)
            if folder is None:
                continue
            with folder:
                bounded("verify", folder.verify)
                bounded("walk", lambda: sum(1 for _ in folder.walk()))
                bounded("list_attributes", lambda: sum(1 for _ in folder.list_attributes("", True)))
                bounded("select files", lambda: len(PackedFiles(folder)))
                for relative in paths:
                    bounded("stat", folder.stat, relative)
                    bounded("is_dir", folder.is_dir, relative)
                    bounded("read", folder.read, relative)
                    bounded("readlink", folder.readlink, relative)
                dest = sandbox / "dest"
                bounded("unpack", packfs.unpack, folder, dest)
                if sorted(os.listdir(sandbox)) not in ([], ["dest"]):
                    raise Failure(f"unpack wrote outside its destination: {sorted(os.listdir(sandbox))}")
                # No bomb: what unpack writes is bounded by the archive (hard links it
                # cannot make are copied, within the archive's size again).
                written = _bytes_under(dest)
                if written > 2 * path.stat().st_size:
                    raise Failure(f"{kind}: unpack wrote {written:,} bytes from a {path.stat().st_size:,}-byte archive")
                # rm -rf, not shutil.rmtree: it recurses per level.
                subprocess.run(["rm", "-rf", str(dest)], check=True)
                operations = PackfsOperations(folder, check_data=check_data, no_open=True)
                for relative in paths[:8]:
                    fuse_path = "/" + relative
                    bounded("getattr", operations.getattr, fuse_path)
                    bounded("readdir", operations.readdir, fuse_path, 0)
                    bounded("fuse read", operations.read, fuse_path, 1 << 17, 0, 0)
                    bounded("fuse readlink", operations.readlink, fuse_path)
                tree = bounded("compiled daemon", compiled_tree, folder.archive)
                if tree is not None:
                    bounded("compiled daemon", use_compiled, tree, {}, 2000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    counts.largest_peak = max(counts.largest_peak, peak)
    if peak > budget:
        raise Failure(f"{kind}: {peak / 2**20:.0f} MiB traced (budget {budget / 2**20:.0f} MiB for a "
                      f"{path.stat().st_size:,}-byte archive)")


def fuzz(cases: int, seed: int, work: Path, progress: bool = False) -> Counts:
    # The FUSE callbacks log each damaged file once; here that is thousands of lines.
    mount_log = logging.getLogger("packfs.mount")
    level = mount_log.level
    mount_log.setLevel(logging.CRITICAL)
    try:
        return _fuzz(cases, seed, work, progress)
    finally:
        mount_log.setLevel(level)


def _fuzz(cases: int, seed: int, work: Path, progress: bool) -> Counts:
    seeds = []  # every other case mutates the compressed one (format 1.5)
    for name, build in (("seed.ffr", lambda path: build_seed(path)),
                        ("compressed.ffr", lambda path: build_compressed_seed(path, work))):
        seed_archive = work / name
        files = build(seed_archive)
        seeds.append((files, seed_archive.read_bytes(), *_records(seed_archive)))
    counts = Counts()
    started = time.monotonic()
    for case in range(cases):
        rng = random.Random(seed * 1_000_003 + case)
        structure = case % STRUCTURE_EVERY == STRUCTURE_EVERY - 1
        kind = _STRUCTURES[(case // STRUCTURE_EVERY) % len(_STRUCTURES)] if structure else _KINDS[case % len(_KINDS)]
        signal.alarm(60)  # a hang is a failure too
        try:
            if structure:
                counts.cases += 1
                counts.by_kind[kind] = counts.by_kind.get(kind, 0) + 1
                run_structure(kind, *build_structure(kind, rng, work), work, counts)
            else:
                files, original, records, data_records = seeds[(case // len(_KINDS)) % len(seeds)]
                run_case(mutate(original, records, data_records, rng, kind), original, files, kind, work,
                         counts)
        except Failure as failure:
            raise Failure(f"case {case} (seed {seed}, {kind}): {failure}") from failure
        except Exception as error:
            counts.crashes += 1
            raise Failure(f"case {case} (seed {seed}, {kind}): {type(error).__name__}: {error}") from error
        finally:
            signal.alarm(0)
        if progress and case % 1000 == 999:
            rate = (case + 1) / (time.monotonic() - started)
            print(f"  {case + 1:,} cases, {rate:.0f}/s", file=sys.stderr, flush=True)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            counts = fuzz(args.cases, args.seed, Path(tmp), progress=True)
        except Failure as failure:
            print(f"FAILED: {failure}", file=sys.stderr)
            return 1
    seconds = time.monotonic() - started
    print(f"fuzz: {counts.cases:,} cases (seed {args.seed}) in {seconds:.0f} s")
    for name in ("unchanged", "refused_at_open", "detected_at_use", "detected_by_verify_only", "benign",
                 "hostile_remaps", "undetected", "wrong_bytes", "crashes", "escapes", "structures"):
        print(f"  {name.replace('_', ' ')}: {getattr(counts, name):,}")
    print(f"  structures: slowest operation {counts.slowest_operation:.2f} s (budget {OPERATION_SECONDS} s), "
          f"largest traced peak {counts.largest_peak / 2**20:.1f} MiB")
    print("  by kind: " + ", ".join(f"{k} {v:,}" for k, v in counts.by_kind.items()))
    return 0 if counts.failures() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
