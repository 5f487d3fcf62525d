"""pack_folder on live trees and trees it cannot all read: files that change while they
are read are read again or refused, never stored torn; paths that cannot be read are
all listed, and with keep_going (--keep-going) the rest is packed."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Callable

import pytest

from packfs import PackError, PackedFolder, PackSourceError, SkippedPath, pack_folder
from packfs.core import Archive
from tests.conftest import require_python_as_nobody, time_limit

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20


def _tree_with(tmp_path: Path, name: str, contents: bytes) -> tuple[Path, Path]:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "other.txt").write_bytes(b"unchanged")
    (src / name).write_bytes(contents)
    return src, src / name


class _Changes:
    """The offsets at which a file was changed, kept in a file: the reads may happen in
    the worker processes of pack -j N."""

    def __init__(self, log: Path) -> None:
        self._log = log
        # A fresh count: pytest gives a passing test's directory name to the next test
        # once it has removed it (tmp_path_retention_policy), and this log is beside it.
        log.unlink(missing_ok=True)

    def add(self, offset: int) -> None:
        with open(self._log, "a") as f:
            f.write(f"{offset}\n")

    def offsets(self) -> list[int]:
        return [int(line) for line in self._log.read_text().split()] if self._log.exists() else []

    def __len__(self) -> int:
        return len(self.offsets())

    def __eq__(self, other: object) -> bool:
        return self.offsets() == other


def _change_during_reads(monkeypatch, target: Path, change: Callable[[int], None], times: int | None) -> _Changes:
    """Make os.preadv call ``change(n)`` after the first chunk of ``target`` is read, as
    another process writing to it would: the n-th time, for ``times`` reads (None: every
    read).  Returns the offsets at which it changed it."""
    inode = target.stat().st_ino
    real_preadv = os.preadv
    test_directory = target.parent.parent  # beside it, not in it: tests list what a pack left there
    changes = _Changes(test_directory.parent / f"{test_directory.name}-{target.name}.changes")

    def preadv(fd: int, buffers, offset: int, *flags: int) -> int:
        got = real_preadv(fd, buffers, offset, *flags)
        if offset > 0 and os.fstat(fd).st_ino == inode and (times is None or len(changes) < times):
            changes.add(offset)
            change(len(changes))
        return got

    monkeypatch.setattr(os, "preadv", preadv)
    return changes


@pytest.fixture(params=[1, 2], ids=lambda jobs: f"j{jobs}")
def jobs(request) -> int:
    """The tests that change a file while it is read run with one process reading the
    files, and with two worker processes (pack -j 2)."""
    return request.param


def _rewrite(path: Path, pattern: bytes) -> None:
    """Overwrite ``path`` in place, at the same size (no truncation, same inode)."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.write(pattern * (size // len(pattern)))


def _stored_stat_matches(folder: PackedFolder, relative: str, path: Path) -> None:
    stat, info = folder.stat(relative), path.stat()
    assert (stat.size, stat.mtime_ns, stat.mode) == (info.st_size, info.st_mtime_ns, info.st_mode)


def test_a_file_changed_after_the_scan_is_stored_as_it_is_when_read(tmp_path: Path, jobs: int) -> None:
    """The scan's size and mtime are not stored for a file: those of the state whose
    bytes are stored are (it was an error, "changed size while packing", before)."""
    src, grown = _tree_with(tmp_path, "grown.txt", b"short")

    class Grow:
        def start(self, *args: int) -> None:  # after the scan, before any file is read
            with open(grown, "ab") as f:
                f.write(b" and longer")
            os.utime(grown, ns=(5, 1_700_000_000_000_000_001))

        def advance(self, *args: int) -> None:
            pass

    pack_folder(src, tmp_path / "x.ffr", jobs=jobs, progress=Grow())
    with PackedFolder(tmp_path / "x.ffr") as folder:
        assert folder.read("grown.txt") == b"short and longer"
        _stored_stat_matches(folder, "grown.txt", grown)


def test_a_same_size_rewrite_during_the_read_is_read_again(tmp_path: Path, monkeypatch, caplog, jobs: int) -> None:
    src, live = _tree_with(tmp_path, "live.bin", b"A" * (3 * MIB))  # three 1 MiB chunks
    changes = _change_during_reads(monkeypatch, live, lambda n: _rewrite(live, b"B"), times=1)
    with caplog.at_level(logging.WARNING, logger="packfs"):
        stats = pack_folder(src, tmp_path / "x.ffr", jobs=jobs)
    assert changes == [MIB]  # rewritten once, after the first chunk of the first read
    assert "live.bin' changed while it was read; stored as read again" in caplog.text
    assert stats.changed == (str(live),)
    with PackedFolder(tmp_path / "x.ffr") as folder:
        assert folder.read("live.bin") == b"B" * (3 * MIB)  # the new state whole, not A then B
        _stored_stat_matches(folder, "live.bin", live)
        assert folder.read("sub/other.txt") == b"unchanged"
    with Archive(tmp_path / "x.ffr") as archive:
        assert archive.verify().ok


def test_a_file_rewritten_at_every_read_is_an_error_naming_it(tmp_path: Path, monkeypatch, jobs: int) -> None:
    src, live = _tree_with(tmp_path, "live.bin", b"A" * (3 * MIB))
    changes = _change_during_reads(monkeypatch, live, lambda n: _rewrite(live, b"AB"[n % 2:n % 2 + 1]), times=None)
    out = tmp_path / "x.ffr"
    with pytest.raises(PackError, match=r"live.bin': kept changing while it was read \(3 reads; the last: "):
        pack_folder(src, out, jobs=jobs)
    assert len(changes) >= 3
    assert sorted(os.listdir(tmp_path)) == ["src"]  # no archive, no temporary file


@pytest.mark.parametrize("how", ["grows", "shrinks"])
def test_a_file_that_grows_or_shrinks_during_the_read(tmp_path: Path, monkeypatch, how: str, jobs: int) -> None:
    src, live = _tree_with(tmp_path, "live.bin", b"A" * (3 * MIB))

    def change(n: int) -> None:
        if how == "grows":
            with open(live, "ab") as f:
                f.write(b"C" * 100)
        else:
            os.truncate(live, live.stat().st_size - 100)

    _change_during_reads(monkeypatch, live, change, times=1)
    pack_folder(src, tmp_path / "x.ffr", jobs=jobs)
    with PackedFolder(tmp_path / "x.ffr") as folder:
        assert folder.read("live.bin") == live.read_bytes()
        _stored_stat_matches(folder, "live.bin", live)
    with Archive(tmp_path / "x.ffr") as archive:
        assert archive.verify().ok  # piece CRCs too: the first read's were dropped with its bytes

    _change_during_reads(monkeypatch, live, change, times=None)
    with pytest.raises(PackError, match=r"live.bin': kept changing while it was read .*bytes before the read"):
        pack_folder(src, tmp_path / "y.ffr", jobs=jobs)


def test_timestamps_too_coarse_to_show_a_rewrite_do_not_hide_it(tmp_path: Path, monkeypatch, jobs: int) -> None:
    """On a file system with whole-second timestamps (Lustre, ext4 with small inodes), a
    rewrite in the same second leaves the stat as it was; a second read catches it."""
    src, live = _tree_with(tmp_path, "live.bin", b"A" * (3 * MIB))
    inode = live.stat().st_ino
    real_fstat = os.fstat

    def fstat(fd: int) -> os.stat_result:
        info = real_fstat(fd)
        if info.st_ino != inode:
            return info
        fields = {name: getattr(info, name) for name in dir(info) if name.startswith("st_")}
        second = (time.time_ns() // 1_000_000_000) * 1_000_000_000  # the stamp of any write this second
        fields.update(st_mtime_ns=second, st_ctime_ns=second)
        return types.SimpleNamespace(**fields)  # type: ignore[return-value]

    monkeypatch.setattr(os, "fstat", fstat)
    _change_during_reads(monkeypatch, live, lambda n: _rewrite(live, b"B"), times=1)
    pack_folder(src, tmp_path / "x.ffr", jobs=jobs)
    with PackedFolder(tmp_path / "x.ffr") as folder:
        assert folder.read("live.bin") == b"B" * (3 * MIB)


def test_a_file_rewritten_by_another_process_is_reported(tmp_path: Path) -> None:
    """End to end: `packfs pack` while another process rewrites a 32 MiB file at the same
    size, over and over, a different byte each time.  The pack fails naming the file, or,
    if the writer was off the CPU long enough for a read in which nothing changed, stores
    that read, saying the file changed if an earlier read saw it.  Before, it stored
    torn bytes silently (exit 0), and verify accepted their CRC.

    A writer off the CPU for a whole read (the machine may be busy with other work)
    leaves nothing to see, so the pack is run up to five times: at least one run must
    report the file, and every report must be one of the two above."""
    src, live = _tree_with(tmp_path, "live.bin", b"\0" * (32 * MIB))
    favoured = os.geteuid() == 0  # as root, the writer runs at a higher priority than the packer
    writer = subprocess.Popen([sys.executable, "-c", _REWRITER, str(live)], stdout=subprocess.PIPE,
                              preexec_fn=(lambda: os.nice(-10)) if favoured else None)
    reports = []
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"writing\n"
        for _ in range(5):
            out = tmp_path / "x.ffr"
            result = subprocess.run([sys.executable, "-m", "packfs", "pack", "-f", str(src), str(out)],
                                    capture_output=True, text=True, cwd=REPO, timeout=time_limit(300),
                                    preexec_fn=(lambda: os.nice(10)) if favoured else None)
            if result.returncode == 1:
                assert result.stderr.startswith(f"Error: {str(live)!r}: kept changing while it was read (3 reads"), \
                    result.stderr
                assert not out.exists() and sorted(os.listdir(tmp_path)) == ["src"]
                reports.append(result.stderr)
            else:
                if "changed while it was read" in result.stderr:
                    # Stored whole as a later read found it, and said so: exit 3, as GNU
                    # tar's "file changed as we read it" is not a silent 0 either.
                    assert result.returncode == 3, result.stderr
                    assert result.stderr.startswith(f"Warning: {str(live)!r} changed while it was read; "
                                                    f"stored as read again"), result.stderr
                    assert "1 file changed while read, stored as read again" in result.stderr
                    reports.append(result.stderr)
                else:
                    assert result.returncode == 0, result.stderr
                out.unlink()
            if reports:
                break
    finally:
        writer.kill()
        writer.wait()
    assert reports, "five packs beside a writer rewriting the file, and none saw it change"


# Rewrites the file in place, 1 MiB at a time, with byte 1, 2, 3, ... in turn.
_REWRITER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
size = os.fstat(fd).st_size
print("writing", flush=True)
n = 0
while True:
    n = n % 255 + 1
    chunk = bytes([n]) * (1 << 20)
    for offset in range(0, size, len(chunk)):
        os.pwrite(fd, chunk, offset)
"""


# -- paths that cannot be read: all listed; with keep_going, the rest packed ---------------


def test_a_file_that_keeps_changing_is_skipped_with_keep_going(tmp_path: Path, monkeypatch, caplog, jobs: int) -> None:
    src, live = _tree_with(tmp_path, "live.bin", b"A" * (3 * MIB))
    os.link(live, src / "sub" / "same-as-live.bin")  # its other name goes with it
    _change_during_reads(monkeypatch, live, lambda n: _rewrite(live, b"AB"[n % 2:n % 2 + 1]), times=None)
    with caplog.at_level(logging.WARNING, logger="packfs"):
        stats = pack_folder(src, tmp_path / "x.ffr", jobs=jobs, keep_going=True)
    reason = "kept changing while it was read (3 reads; the last: "
    assert [(path, failed) for path, _, failed in stats.skipped] == [
        (str(live), True), (str(src / "sub" / "same-as-live.bin"), True)]
    assert stats.skipped[0].reason.startswith(reason)
    assert stats.skipped[1].reason == f"a hard link to {str(live)!r}, which could not be packed"
    assert stats.failed == stats.skipped
    assert f"skipped {str(live)!r}: {reason}" in caplog.text
    with PackedFolder(tmp_path / "x.ffr") as folder:
        assert folder.list(recursive=True) == ["sub", "sub/other.txt"]
        assert folder.read("sub/other.txt") == b"unchanged"
    with Archive(tmp_path / "x.ffr") as archive:
        assert archive.verify().ok  # the three dropped copies left nothing behind


@pytest.fixture
def unreadable_tree():
    """A tree with every kind of path the packer may not read, outside pytest's 0700
    directories so that user nobody can reach it; the paths it cannot pack, and the
    reasons."""
    work = Path(tempfile.mkdtemp(prefix="packfs-unreadable-"))
    src = work / "src"
    (src / "d").mkdir(parents=True)
    (src / "ok.txt").write_bytes(b"fine")
    (src / "d" / "a.txt").write_bytes(b"readable")
    (src / "d" / "secret.bin").write_bytes(b"hidden")
    (src / "hl").mkdir()
    os.link(src / "d" / "secret.bin", src / "hl" / "secret-again")
    (src / "locked").mkdir()
    (src / "locked" / "inner.txt").write_bytes(b"out of reach")
    (src / "noexec").mkdir()
    (src / "noexec" / "child.txt").write_bytes(b"listed, not stat'ed")
    os.mkfifo(src / "fifo")
    out = work / "out"
    out.mkdir()
    for path in (work, src, src / "d", src / "hl", out):
        os.chmod(path, 0o777 if path == out else 0o755)
    os.chmod(src / "d" / "secret.bin", 0o000)
    os.chmod(src / "locked", 0o000)
    os.chmod(src / "noexec", 0o644)  # names can be listed, but not stat'ed
    failures = {
        f"{src}/locked": "cannot list: Permission denied",
        f"{src}/noexec/child.txt": "cannot stat: Permission denied",
        f"{src}/d/secret.bin": "cannot open: Permission denied",
        f"{src}/hl/secret-again": f"a hard link to '{src}/d/secret.bin', which could not be packed",
    }
    try:
        yield src, out, failures
    finally:
        for path in (src / "locked", src / "noexec"):
            if path.exists():
                os.chmod(path, 0o755)
        shutil.rmtree(work)


def _as_unprivileged(*command: str) -> subprocess.CompletedProcess:
    """Run ``command`` as user nobody when the tests run as root (root reads anything)."""
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv (util-linux) is not installed")
        require_python_as_nobody()
        command = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command)
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=time_limit(120))


# Packs argv[1] into argv[2] as the library does, and prints what came back as JSON.
_PACK_AND_REPORT = """
import json, sys
from packfs import PackSourceError, pack_folder
try:
    stats = pack_folder(sys.argv[1], sys.argv[2], keep_going=sys.argv[3] == "keep")
    print(json.dumps({"skipped": stats.skipped, "failed": stats.failed, "files": stats.files}))
except PackSourceError as error:
    print(json.dumps({"error": str(error), "failed": error.failed}))
"""


def test_every_unreadable_path_is_listed_and_nothing_written(unreadable_tree) -> None:
    """Without keep_going, one run names every path that cannot be packed (found by the
    scan, and by opening each file), not the first only, and writes nothing."""
    src, out, failures = unreadable_tree
    result = _as_unprivileged(sys.executable, "-c", _PACK_AND_REPORT, str(src), str(out / "x.ffr"), "stop")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert {path: reason for path, reason, failed in report["failed"] if failed} == failures
    assert report["error"] == (f"4 paths cannot be packed ('{src}/locked': cannot list: Permission denied, "
                               f"and 3 more); nothing was written (--keep-going packs the rest)")
    assert os.listdir(out) == []
    assert result.stderr.splitlines() == [f"skipped '{src}/fifo': a FIFO"]  # the failures were not skipped


def test_keep_going_packs_the_rest_and_lists_every_skipped_path(unreadable_tree) -> None:
    src, out, failures = unreadable_tree
    result = _as_unprivileged(sys.executable, "-c", _PACK_AND_REPORT, str(src), str(out / "x.ffr"), "keep")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    skipped = {path: (reason, failed) for path, reason, failed in report["skipped"]}
    assert skipped == {**{path: (reason, True) for path, reason in failures.items()},
                       f"{src}/fifo": ("a FIFO", False)}
    assert len(report["failed"]) == 4 and report["files"] == 2
    with PackedFolder(out / "x.ffr") as folder:
        assert folder.list(recursive=True) == ["d", "d/a.txt", "hl", "locked", "noexec", "ok.txt"]
        assert folder.read("d/a.txt") == b"readable" and folder.read("ok.txt") == b"fine"
        assert folder.stat("locked").permissions == 0o000  # kept, with its own attributes, empty
        assert folder.list("locked") == [] and folder.list("noexec") == []
        assert folder.verify().ok


def test_a_file_unreadable_when_its_turn_comes_is_listed_with_the_others(tmp_path: Path, unreadable_tree) -> None:
    """A failure met while writing (the scan found none): the files not yet read are
    opened to find the others, and every one is listed."""
    src, out, _ = unreadable_tree
    for path in ("locked", "noexec", "hl", "fifo"):
        target = src / path
        if target.is_dir():
            os.chmod(target, 0o755)
            shutil.rmtree(target)
        else:
            target.unlink()
    (src / "z-late.bin").write_bytes(b"also hidden")
    os.chmod(src / "z-late.bin", 0o000)
    result = _as_unprivileged(sys.executable, "-c", _PACK_AND_REPORT, str(src), str(out / "x.ffr"), "stop")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["failed"] == [[f"{src}/d/secret.bin", "cannot open: Permission denied", True],
                                                   [f"{src}/z-late.bin", "cannot open: Permission denied", True]]
    assert os.listdir(out) == []


def test_the_command_line_lists_skipped_paths_and_exits_3(unreadable_tree) -> None:
    src, out, failures = unreadable_tree
    result = _as_unprivileged(sys.executable, "-m", "packfs", "pack", "-k", str(src), str(out / "x.ffr"))
    assert result.returncode == 3, result.stderr
    lines = result.stderr.splitlines()
    expected = {f"skipped: {path} ({reason})" for path, reason in failures.items()} | {f"skipped: {src}/fifo (a FIFO)"}
    assert set(lines[:-1]) == expected and len(lines) == 6, result.stderr
    assert lines[-1].startswith("packed 2 files, 5 dirs, 0 symlinks")
    assert lines[-1].endswith("; skipped 5 paths, each listed above (4 could not be read)")
    assert PackedFolder(out / "x.ffr").read("ok.txt") == b"fine"

    quiet = _as_unprivileged(sys.executable, "-m", "packfs", "pack", "-k", "-q", str(src), str(out / "q.ffr"))
    assert quiet.returncode == 3 and set(quiet.stderr.splitlines()) == expected  # no summary, still the list

    result = _as_unprivileged(sys.executable, "-m", "packfs", "pack", str(src), str(out / "y.ffr"))
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == f"skipped: {src}/fifo (a FIFO)"
    assert set(lines[1:-1]) == {f"cannot pack: {path} ({reason})" for path, reason in failures.items()}
    assert lines[-1].startswith("Error: 4 paths cannot be packed (") and "Traceback" not in result.stderr
    assert not (out / "y.ffr").exists()
