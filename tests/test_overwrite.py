"""An archive overwritten in place under its readers, as users do it: ``cp new.ffr
data.ffr`` or ``shutil.copyfile`` (open with O_TRUNC, then write) while 8 threads read.

Reading a mapped page past a truncated file's end is SIGBUS, which killed the reading
process (and a mount's daemon).  Now no process dies: PackedFolder, RecordReader and
the datasets raise ArchiveChangedError (a FormatError), the daemon answers EIO; and no
read returns anything but the bytes the archive held when it was opened.

The in-process readers run in a child process (``python -m tests.test_overwrite``), so
a regression, a real SIGBUS, fails the test instead of killing pytest.  No timing is
asserted: each round overwrites at some point during the reads, wherever that falls.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import packfs
from packfs.errors import ArchiveChangedError, FormatError
from tests.conftest import time_limit

REPO = Path(__file__).resolve().parent.parent
THREADS = 8
ROUNDS = 4
COPIERS = ("cp", "copyfile")


# -- the archives -----------------------------------------------------------------------

def _sizes(rng: random.Random) -> list[int]:
    """Many small files, some of 80 KiB, a few large: a few MiB in all, so a copy over
    the archive takes long enough to be met by reads."""
    return [rng.choice((1 << 20, 3 << 20)) if i % 97 == 5 else 80 << 10 if i % 13 == 0
            else rng.randrange(1, 8 << 10) for i in range(320)]


def contents(seed: int, scale: float) -> dict[str, bytes]:
    """path -> contents; the same paths for every seed, sizes times ``scale``."""
    rng = random.Random(0)
    paths = [f"d{i % 10:02d}/f{i:04d}.bin" for i in range(320)]
    sizes = _sizes(rng)
    data = random.Random(seed)
    return {path: data.randbytes(max(1, int(size * scale))) for path, size in zip(paths, sizes)}


def make_archive(out: Path, files: dict[str, bytes]) -> Path:
    src = out.with_suffix(".src")
    for path, data in files.items():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (src / path).write_bytes(data)
    packfs.pack_folder(src, out, force=True)
    shutil.rmtree(src)
    return out


def make_records(out: Path, records: list[bytes]) -> Path:
    with packfs.RecordWriter(out, len(records), force=True) as writer:
        for record in records:
            writer.write_one(record)
    return out


# The original: seed 1.  Replacements: larger (the copy passes the old end late) and
# smaller (the file stays shorter than the map).
ORIGINAL = (1, 1.0)
REPLACEMENTS = ((2, 1.5), (3, 0.5))


def fresh_copy(original: Path, target: Path) -> None:
    """``target`` as a new file with the original's bytes, published by a rename."""
    temporary = target.with_name(target.name + ".new")
    shutil.copyfile(original, temporary)
    os.replace(temporary, target)


def overwrite(copier: str, replacement: Path, target: Path) -> None:
    """What users do: write over the archive in place."""
    if copier == "cp":
        subprocess.run(["cp", str(replacement), str(target)], check=True)
    else:
        shutil.copyfile(replacement, target)


# -- the readers (in the child process) ------------------------------------------------

class Tally:
    """What the reader threads saw, counted under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok = 0
        self.changed = 0
        self.problems: list[str] = []

    def add(self, ok: int = 0, changed: int = 0, problem: str | None = None) -> None:
        with self.lock:
            self.ok += ok
            self.changed += changed
            if problem is not None and len(self.problems) < 20:
                self.problems.append(problem)


def overwrite_under_readers(read, keys, expected, tally, copier: str, replacement: Path, target: Path) -> None:
    """Readers running, ``target`` overwritten in place by ``copier`` a moment in, the
    readers stopped a moment after."""
    stop = threading.Event()
    threads = run_readers(read, keys, expected, tally, stop)
    time.sleep(0.05 + 0.05 * random.random())
    overwrite(copier, replacement, target)
    time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join()


def run_readers(read, keys: list, expected: dict, tally: Tally, stop: threading.Event) -> list[threading.Thread]:
    def work(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            key = rng.choice(keys)
            try:
                data = read(key)
            except ArchiveChangedError:
                tally.add(changed=1)
            except Exception as error:  # noqa: BLE001 - anything else is the finding
                tally.add(problem=f"{key!r}: {error!r}")
            else:
                if data == expected[key]:
                    tally.add(ok=1)
                else:
                    tally.add(problem=f"{key!r}: wrong bytes without an error ({len(data)} bytes)")

    threads = [threading.Thread(target=work, args=(seed,), daemon=True) for seed in range(THREADS)]
    for thread in threads:
        thread.start()
    return threads


def open_reader(mode: str, path: Path, files: dict[str, bytes]):
    """(reader, read(key), keys, expected, close) for one way of reading ``path``."""
    if mode == "folder":
        folder = packfs.PackedFolder(path)
        keys = list(files)
        return folder.read, keys, files, folder.close
    if mode == "open":
        folder = packfs.PackedFolder(path)

        def read_file(key: str) -> bytes:
            with folder.open(key) as handle:
                return handle.read()
        return read_file, list(files), files, folder.close
    if mode == "records":
        reader = packfs.RecordReader(path)
        records = list(files.values())
        return reader.read_one, list(range(len(records))), dict(enumerate(records)), reader.close
    if mode in ("dataset", "dataset_batch"):
        from packfs.dataset import PackedFiles

        dataset = PackedFiles(str(path), "**/*")
        expected = {i: files[dataset.path(i)] for i in range(len(dataset))}
        if mode == "dataset":
            return dataset.__getitem__, list(expected), expected, dataset.close
        batches = [tuple(range(i, min(i + 16, len(dataset)))) for i in range(0, len(dataset), 16)]
        expected_batches = {batch: [expected[i] for i in batch] for batch in batches}
        return (lambda batch: dataset.read_batch(list(batch))), batches, expected_batches, dataset.close
    raise ValueError(mode)


def child(mode: str, work: Path, rounds: int) -> dict:
    """Rounds of: open a fresh copy of the original, start 8 reader threads, overwrite
    the file (cp or copyfile, larger or smaller) while they read, stop them, and check
    a read after the overwrite raises ArchiveChangedError."""
    original_files = contents(*ORIGINAL)
    summary = {"ok": 0, "changed": 0, "problems": [], "final": []}
    for round_number in range(rounds):
        copier = COPIERS[round_number % 2]
        replacement = work / f"replacement{(round_number // 2) % 2}{mode_suffix(mode)}"
        original = work / f"original{mode_suffix(mode)}"
        target = work / f"data{mode_suffix(mode)}"
        fresh_copy(original, target)
        read, keys, expected, close = open_reader(mode, target, original_files)
        tally = Tally()
        overwrite_under_readers(read, keys, expected, tally, copier, replacement, target)
        try:
            read(keys[0])
        except ArchiveChangedError as error:
            summary["final"].append(type(error).__name__)
        except Exception as error:  # noqa: BLE001
            summary["final"].append(repr(error))
        else:
            summary["final"].append("read succeeded after the overwrite")
        close()
        summary["ok"] += tally.ok
        summary["changed"] += tally.changed
        summary["problems"] += tally.problems
    return summary


def mode_suffix(mode: str) -> str:
    return ".rec" if mode == "records" else ".ffr"


def prepare(work: Path, mode: str) -> None:
    """The original and both replacements for ``mode``, in ``work``."""
    suffix = mode_suffix(mode)
    for name, (seed, scale) in [("original", ORIGINAL)] + [(f"replacement{i}", r) for i, r in enumerate(REPLACEMENTS)]:
        files = contents(seed, scale)
        if mode == "records":
            make_records(work / f"{name}{suffix}", list(files.values()))
        else:
            make_archive(work / f"{name}{suffix}", files)


# -- the tests --------------------------------------------------------------------------

def require_guard() -> None:
    """The guarantees need packfs._sigbus (built by pip where a C compiler and the
    Python headers are found); without it a truncation can still kill (docs/reliability.md,
    "An archive changing under a reader")."""
    from packfs.source import GUARDED

    if GUARDED:
        return
    if os.environ.get("CI") == "true":
        pytest.fail("packfs._sigbus must be built under CI")
    pytest.skip("packfs._sigbus is not built (no C compiler or Python headers at install time)")



@pytest.mark.parametrize("mode", ["folder", "open", "records", "dataset", "dataset_batch"])
def test_overwrite_in_place_under_readers(tmp_path: Path, mode: str) -> None:
    require_guard()
    prepare(tmp_path, mode)
    result = subprocess.run([sys.executable, "-m", "tests.test_overwrite", mode, str(tmp_path), str(ROUNDS)],
                            cwd=REPO, capture_output=True, text=True, timeout=time_limit(600))
    assert result.returncode == 0, (
        f"the reading process died (exit {result.returncode}; -7 is SIGBUS): {result.stderr[-3000:]}")
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["problems"] == [], summary["problems"]
    assert summary["final"] == ["ArchiveChangedError"] * ROUNDS, summary["final"]
    assert summary["ok"] > 0  # the readers did read before the overwrite


@pytest.mark.fuse
def test_overwrite_under_a_mount(tmp_path: Path) -> None:
    """8 threads read through ``packfs mount`` while cp / copyfile write over the
    archive: the daemon answers EIO (never dies, never a wrong byte), also later."""
    from packfs.fuse import is_mounted, is_stale
    from tests.conftest import mounted

    require_guard()
    prepare(tmp_path, "folder")
    files = contents(*ORIGINAL)
    keys = list(files)
    held_back = keys[-20:]  # never read by the threads: the check after the overwrite
    for round_number in range(ROUNDS):
        copier = COPIERS[round_number % 2]
        replacement = tmp_path / f"replacement{(round_number // 2) % 2}.ffr"
        target = tmp_path / "data.ffr"
        fresh_copy(tmp_path / "original.ffr", target)
        with mounted(target, tmp_path / "mnt", "-o", "direct_io") as root:
            tally = Tally()
            eio = Tally()

            def read(key: str) -> bytes:
                # Through the daemon every time: the listing (readdir is never cached)
                # reads the path table, and the file's cached pages are dropped first.
                try:
                    listed = os.listdir(root / key.partition("/")[0])
                    if key.rpartition("/")[2] not in listed:
                        return b"listing without " + key.encode()
                    with open(root / key, "rb") as handle:
                        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                        return handle.read()
                except OSError as error:
                    if error.errno == errno.EIO:
                        eio.add(changed=1)
                        raise ArchiveChangedError("EIO") from None
                    raise

            overwrite_under_readers(read, keys[:-20], files, tally, copier, replacement, target)
            if os.environ.get("PACKFS_TEST_VERBOSE"):
                print(f"round {round_number} ({copier}): {tally.ok} reads, {eio.changed} EIO")
            assert tally.problems == [], tally.problems
            assert is_mounted(str(root)) and not is_stale(str(root)), "the daemon died"
            for key in held_back[:3]:  # the daemon is alive and still refuses
                with pytest.raises(OSError) as caught:
                    (root / key).read_bytes()
                assert caught.value.errno == errno.EIO, caught.value
            assert not is_stale(str(root)), "the daemon died"


def test_changed_is_sticky_and_a_format_error(tmp_path: Path) -> None:
    """A same-size rewrite (no SIGBUS at all) is detected too, and stays detected."""
    prepare(tmp_path, "folder")
    target = tmp_path / "data.ffr"
    fresh_copy(tmp_path / "original.ffr", target)
    files = contents(*ORIGINAL)
    key = next(iter(files))
    with packfs.PackedFolder(target) as folder:
        assert folder.read(key) == files[key]
        with open(target, "r+b") as handle:  # same size, same bytes: only the times change
            data = handle.read()
            handle.seek(0)
            handle.write(data)
        for _ in range(2):
            with pytest.raises(ArchiveChangedError) as caught:
                folder.read(key)
            assert isinstance(caught.value, FormatError)
            assert "reopen" in str(caught.value)
        with pytest.raises(ArchiveChangedError):
            folder.stat(key)
    with packfs.PackedFolder(target) as folder:  # reopened: fine again
        assert folder.read(key) == files[key]


FOREIGN_FAULT = """
import faulthandler, mmap, os, sys
import packfs
folder = packfs.PackedFolder(sys.argv[1])      # registers the guard's handler
if sys.argv[2] == "faulthandler":
    faulthandler.enable()                      # installed after ours: chained to, not lost
    packfs.PackedFolder(sys.argv[1]).close()   # ours goes back in front
path = sys.argv[1] + ".other"
with open(path, "wb") as handle:
    handle.write(b"x" * 65536)
fd = os.open(path, os.O_RDWR)
other = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
os.ftruncate(fd, 0)
print("touching", flush=True)
other[40000]                                   # not an archive's map: SIGBUS as ever
print("survived", flush=True)
"""


@pytest.mark.parametrize("previous", ["default", "faulthandler"])
def test_other_maps_still_get_sigbus(tmp_path: Path, previous: str) -> None:
    """The guard only covers archives' maps: a fault in any other map goes to the
    handler before it (faulthandler's here) or the default action, as before."""
    require_guard()
    prepare(tmp_path, "folder")
    result = subprocess.run([sys.executable, "-c", FOREIGN_FAULT, str(tmp_path / "original.ffr"), previous],
                            capture_output=True, text=True, timeout=time_limit(60))
    assert "touching" in result.stdout and "survived" not in result.stdout, result
    assert result.returncode == -7, result  # SIGBUS
    if previous == "faulthandler":
        assert "Bus error" in result.stderr


if __name__ == "__main__":
    print(json.dumps(child(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))))
