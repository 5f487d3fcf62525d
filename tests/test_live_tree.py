"""pack_folder on a live tree: files that change while they are read are read again or
refused, never stored torn."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Callable

import pytest

from packfs import PackError, PackedFolder, pack_folder
from packfs.core import Archive

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20


def _tree_with(tmp_path: Path, name: str, contents: bytes) -> tuple[Path, Path]:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "other.txt").write_bytes(b"unchanged")
    (src / name).write_bytes(contents)
    return src, src / name


def _change_during_reads(monkeypatch, target: Path, change: Callable[[int], None], times: int | None) -> list[int]:
    """Make os.preadv call ``change(n)`` after the first chunk of ``target`` is read, as
    another process writing to it would: the n-th time, for ``times`` reads (None: every
    read).  Returns the list of offsets at which it changed it."""
    inode = target.stat().st_ino
    real_preadv = os.preadv
    changes: list[int] = []

    def preadv(fd: int, buffers, offset: int, *flags: int) -> int:
        got = real_preadv(fd, buffers, offset, *flags)
        if offset > 0 and os.fstat(fd).st_ino == inode and (times is None or len(changes) < times):
            changes.append(offset)
            change(len(changes))
        return got

    monkeypatch.setattr(os, "preadv", preadv)
    return changes


def _rewrite(path: Path, pattern: bytes) -> None:
    """Overwrite ``path`` in place, at the same size (no truncation, same inode)."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.write(pattern * (size // len(pattern)))


def _stored_stat_matches(folder: PackedFolder, relative: str, path: Path) -> None:
    stat, info = folder.stat(relative), path.stat()
    assert (stat.size, stat.mtime_ns, stat.mode) == (info.st_size, info.st_mtime_ns, info.st_mode)


def test_a_file_changed_after_the_scan_is_stored_as_it_is_when_read(tmp_path: Path) -> None:
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

    pack_folder(src, tmp_path / "x.ffr", progress=Grow())
    with PackedFolder(tmp_path / "x.ffr") as folder:
        assert folder.read("grown.txt") == b"short and longer"
        _stored_stat_matches(folder, "grown.txt", grown)


def test_a_same_size_rewrite_during_the_read_is_read_again(tmp_path: Path, monkeypatch, caplog) -> None:
    src, live = _tree_with(tmp_path, "live.bin", b"A" * (3 * MIB))  # three 1 MiB chunks
    changes = _change_during_reads(monkeypatch, live, lambda n: _rewrite(live, b"B"), times=1)
    with caplog.at_level(logging.WARNING, logger="packfs"):
        pack_folder(src, tmp_path / "x.ffr")
    assert changes == [MIB]  # rewritten once, after the first chunk of the first read
    assert "live.bin' changed while it was read; stored as read again" in caplog.text
    with PackedFolder(tmp_path / "x.ffr") as folder:
        assert folder.read("live.bin") == b"B" * (3 * MIB)  # the new state whole, not A then B
        _stored_stat_matches(folder, "live.bin", live)
        assert folder.read("sub/other.txt") == b"unchanged"
    with Archive(tmp_path / "x.ffr") as archive:
        assert archive.verify().ok


def test_a_file_rewritten_at_every_read_is_an_error_naming_it(tmp_path: Path, monkeypatch) -> None:
    src, live = _tree_with(tmp_path, "live.bin", b"A" * (3 * MIB))
    changes = _change_during_reads(monkeypatch, live, lambda n: _rewrite(live, b"AB"[n % 2:n % 2 + 1]), times=None)
    out = tmp_path / "x.ffr"
    with pytest.raises(PackError, match=r"live.bin' kept changing while it was read \(3 reads; the last: "):
        pack_folder(src, out)
    assert len(changes) >= 3
    assert sorted(os.listdir(tmp_path)) == ["src"]  # no archive, no temporary file


@pytest.mark.parametrize("how", ["grows", "shrinks"])
def test_a_file_that_grows_or_shrinks_during_the_read(tmp_path: Path, monkeypatch, how: str) -> None:
    src, live = _tree_with(tmp_path, "live.bin", b"A" * (3 * MIB))

    def change(n: int) -> None:
        if how == "grows":
            with open(live, "ab") as f:
                f.write(b"C" * 100)
        else:
            os.truncate(live, live.stat().st_size - 100)

    _change_during_reads(monkeypatch, live, change, times=1)
    pack_folder(src, tmp_path / "x.ffr")
    with PackedFolder(tmp_path / "x.ffr") as folder:
        assert folder.read("live.bin") == live.read_bytes()
        _stored_stat_matches(folder, "live.bin", live)
    with Archive(tmp_path / "x.ffr") as archive:
        assert archive.verify().ok  # piece CRCs too: the first read's were dropped with its bytes

    _change_during_reads(monkeypatch, live, change, times=None)
    with pytest.raises(PackError, match=r"live.bin' kept changing while it was read .*bytes before the read"):
        pack_folder(src, tmp_path / "y.ffr")


def test_timestamps_too_coarse_to_show_a_rewrite_do_not_hide_it(tmp_path: Path, monkeypatch) -> None:
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
    pack_folder(src, tmp_path / "x.ffr")
    with PackedFolder(tmp_path / "x.ffr") as folder:
        assert folder.read("live.bin") == b"B" * (3 * MIB)


def test_a_file_rewritten_by_another_process_is_reported(tmp_path: Path) -> None:
    """End to end: `packfs pack` while another process rewrites a 32 MiB file at the same
    size, over and over, a different byte each time.  The pack fails naming the file, or,
    if the writer was descheduled long enough for a read that nothing changed, stores
    that read and says the file changed: never silently, as before (exit 0, torn bytes
    whose CRC verify accepts)."""
    src, live = _tree_with(tmp_path, "live.bin", b"\0" * (32 * MIB))
    # As root, the writer runs ahead of the packer, so that it is rarely off the CPU
    # for as long as a read takes (the machine may be busy with other work).
    favoured = os.geteuid() == 0
    writer = subprocess.Popen([sys.executable, "-c", _REWRITER, str(live)], stdout=subprocess.PIPE,
                              preexec_fn=(lambda: os.nice(-10)) if favoured else None)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"writing\n"
        result = subprocess.run([sys.executable, "-m", "packfs", "pack", str(src), str(tmp_path / "x.ffr")],
                                capture_output=True, text=True, cwd=REPO, timeout=300,
                                preexec_fn=(lambda: os.nice(10)) if favoured else None)
    finally:
        writer.kill()
        writer.wait()
    if result.returncode == 1:
        assert result.stderr.startswith(f"Error: {str(live)!r} kept changing while it was read (3 reads"), \
            result.stderr
        assert sorted(os.listdir(tmp_path)) == ["src"]
    else:
        assert result.returncode == 0, result.stderr
        assert result.stderr.startswith(f"Warning: {str(live)!r} changed while it was read; stored as read again"), \
            result.stderr


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
