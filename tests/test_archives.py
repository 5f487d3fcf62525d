"""Packing from tar and zip archives, streamed, never extracted."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import zipfile
from pathlib import Path
from typing import BinaryIO

import pytest

import packfs
from packfs import PackedFolder
from tests.conftest import REPO, time_limit


@pytest.fixture
def tarball(tree: Path, tmp_path: Path) -> Path:
    out = tmp_path / "tree.tar"
    subprocess.run(["tar", "cf", str(out), "-C", str(tree), "."], check=True)
    return out


def _pack(source: Path | str, out: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "packfs", "pack", str(source), str(out)], input=stdin,
                          capture_output=True, cwd=REPO)


def test_a_tar_packs_to_the_same_bytes_as_its_extracted_tree(tarball: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("tar keeps the archived owners only when extracting as root")
    extracted = tmp_path / "x"
    extracted.mkdir()
    subprocess.run(["tar", "xf", str(tarball), "-C", str(extracted)], check=True)
    packfs.pack_folder(extracted, tmp_path / "from-dir.ffr")
    assert _pack(tarball, tmp_path / "from-tar.ffr").returncode == 0
    assert (tmp_path / "from-tar.ffr").read_bytes() == (tmp_path / "from-dir.ffr").read_bytes()


@pytest.mark.parametrize("compression", ["gz", "bz2", "xz", "stdin"])
def test_compressed_tars_and_stdin_keep_contents_and_attributes(tree: Path, tarball: Path, tmp_path: Path,
                                                                compression: str) -> None:
    reference = tmp_path / "reference.ffr"
    assert _pack(tarball, reference).returncode == 0
    out = tmp_path / "out.ffr"
    if compression == "stdin":
        result = _pack("-", out, stdin=tarball.read_bytes())
    else:
        source = tmp_path / f"tree.tar.{compression}"
        subprocess.run(["tar", "caf", str(source), "-C", str(tree), "."], check=True)
        source = source.rename(tmp_path / "no-telling-name")  # recognised by content
        result = _pack(source, out)
    assert result.returncode == 0, result.stderr
    with PackedFolder(reference) as expected, PackedFolder(out) as packed:
        assert packed.list(recursive=True) == expected.list(recursive=True)
        for path in expected.list(recursive=True):
            assert packed.stat(path).mode == expected.stat(path).mode
            assert packed.stat(path).mtime_ns == expected.stat(path).mtime_ns
            if expected.is_symlink(path):
                assert packed.readlink(path) == expected.readlink(path)
            elif expected.is_file(path):
                assert packed.read(path) == expected.read(path)
        assert packed.stat("hardlink.txt").nlink == 2
        assert packed.verify().ok


def test_a_zip_packs_its_files_and_directories(tmp_path: Path) -> None:
    source = tmp_path / "data.zip"
    with zipfile.ZipFile(source, "w") as archive:
        archive.writestr("train/cat/1.jpg", b"jpeg bytes")
        archive.writestr("train/dog/", b"")
        archive.writestr("labels.csv", b"a,b\n")
    assert _pack(source, tmp_path / "z.ffr").returncode == 0
    with PackedFolder(tmp_path / "z.ffr") as folder:
        assert folder.list(recursive=True) == ["labels.csv", "train", "train/cat", "train/cat/1.jpg", "train/dog"]
        assert folder.read("train/cat/1.jpg") == b"jpeg bytes"


def test_unsafe_and_special_members_are_skipped_or_normalised_with_a_warning(tmp_path: Path) -> None:
    source = tmp_path / "hostile.tar"
    with tarfile.open(source, "w") as tar:
        for name, data in (("../escape.txt", b"out"), ("/abs/file.txt", b"abs"), ("ok/a/../b.txt", b"dotdot"),
                           ("fine.txt", b"fine")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        device = tarfile.TarInfo("dev/null-ish")
        device.type = tarfile.CHRTYPE
        tar.addfile(device)
    result = _pack(source, tmp_path / "h.ffr")
    assert result.returncode == 0, result.stderr  # nothing failed: these are members no archive holds
    lines = result.stderr.decode().splitlines()
    assert lines[:-1] == ["skipped: ../escape.txt (a name with '..' would leave the tree)",
                          f"Warning: {source}: stored '/abs/file.txt' as 'abs/file.txt', without the leading '/'",
                          "skipped: ok/a/../b.txt (a name with '..' would leave the tree)",
                          "skipped: dev/null-ish (a device, FIFO or other special member)"]
    assert lines[-1].endswith("; skipped 3 paths, each listed above")
    with PackedFolder(tmp_path / "h.ffr") as folder:
        assert folder.list(recursive=True) == ["abs", "abs/file.txt", "fine.txt"]
    from packfs.write import pack_archive

    stats = pack_archive(str(source), tmp_path / "again.ffr")
    assert [(path, failed) for path, _, failed in stats.skipped] == [
        ("../escape.txt", False), ("ok/a/../b.txt", False), ("dev/null-ish", False)]


@pytest.mark.parametrize("compressed", [False, True])  # pack's order, and member order
def test_members_with_names_over_255_bytes_are_skipped_with_a_warning(tmp_path: Path, compressed: bool) -> None:
    """A tar stores names of any length (GNU long-name records); the format stores at
    most NAME_MAX (255) bytes a name, so such a member is skipped, as other members an
    archive cannot hold are, and the rest is packed.  255 bytes still pack."""
    long_300, long_1100, longest = "n" * 300, "m" * 1100, "k" * 255
    source = tmp_path / ("long.tar.gz" if compressed else "long.tar")
    with tarfile.open(source, "w:gz" if compressed else "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in ((f"dir/{long_300}", b"300"), (f"dir/{long_1100}", b"1100"), (f"dir/{longest}", b"255"),
                           (f"{long_300}/inside.txt", b"inside"), ("dir/ok.txt", b"ok")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    result = _pack(source, tmp_path / "l.ffr")
    assert result.returncode == 0, result.stderr
    reason = "expected at most 255 (NAME_MAX: no Linux file system holds a longer name)"
    skipped = {line for line in result.stderr.decode().splitlines() if line.startswith("skipped: ")}
    assert skipped == {f"skipped: dir/{long_300} (a name of 300 bytes, {reason})",
                       f"skipped: dir/{long_1100} (a name of 1100 bytes, {reason})",
                       f"skipped: {long_300}/inside.txt (a name of 300 bytes, {reason})"}
    with PackedFolder(tmp_path / "l.ffr") as folder:
        assert folder.list(recursive=True) == ["dir", f"dir/{longest}", "dir/ok.txt"]
        assert folder.read(f"dir/{longest}") == b"255" and folder.verify().ok


def test_zip_members_with_names_over_255_bytes_are_skipped(tmp_path: Path) -> None:
    from packfs.write import pack_archive

    source = tmp_path / "long.zip"
    with zipfile.ZipFile(source, "w") as archive:
        archive.writestr("a/" + "z" * 256, b"long")
        archive.writestr("a/b.txt", b"b")
    stats = pack_archive(str(source), tmp_path / "z.ffr")
    assert [(path, reason.split(",")[0]) for path, reason, _ in stats.skipped] == [
        ("a/" + "z" * 256, "a name of 256 bytes")]
    with PackedFolder(tmp_path / "z.ffr") as folder:
        assert folder.list(recursive=True) == ["a", "a/b.txt"]


def test_not_an_archive_is_a_clear_error(tmp_path: Path) -> None:
    source = tmp_path / "notes.txt"
    source.write_text("just text")
    result = _pack(source, tmp_path / "o.ffr")
    assert result.returncode == 1 and result.stderr.decode().startswith("Error: ")
    assert "neither a directory nor a tar or zip" in result.stderr.decode()
    assert not (tmp_path / "o.ffr").exists()


# -- a member of many GiB ----------------------------------------------------------------

_BIG = (2 << 30) + (1 << 20)  # just past 2**31 bytes, where a 32-bit size or offset would wrap
_CHUNK = 1 << 20
_PATTERN = bytes(range(256)) * (_CHUNK // 256)
_RSS_BOUND = 200 << 20


def _big_chunk(index: int) -> bytes:
    """Chunk ``index`` of the streamed member: numbered, so a chunk out of place shows."""
    return index.to_bytes(8, "little") + _PATTERN[8:]


def _big_header() -> bytes:
    info = tarfile.TarInfo("big/member.bin")
    info.size, info.mode, info.mtime = _BIG, 0o644, 1_600_000_000
    return info.tobuf()


def _feed_tar(pipe: BinaryIO, failures: list[BaseException]) -> None:
    """Write a tar holding the big member into ``pipe``, one chunk at a time."""
    try:
        pipe.write(_big_header())
        for index in range(_BIG // _CHUNK):
            pipe.write(_big_chunk(index))
        pipe.write(bytes(-_BIG % tarfile.BLOCKSIZE + 2 * tarfile.BLOCKSIZE))  # padding, end of archive
    except BrokenPipeError:
        pass  # the packer died: its exit status says why
    except BaseException as error:
        failures.append(error)
    finally:
        try:
            pipe.close()
        except BrokenPipeError:
            pass


# Runs `python -m packfs ARGS...` and, as it exits, writes its VmHWM: the peak RSS of this
# process image alone.  wait4's and getrusage's ru_maxrss would not do: across fork and
# exec a child inherits its parent's high-water mark, and pytest's may be GiBs.
_PEAK_RSS_WRAPPER = """
import atexit, runpy, sys

report = sys.argv.pop(1)


def write_peak():
    with open("/proc/self/status") as status:
        peak_kib = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    with open(report, "w") as out:
        out.write(peak_kib)


atexit.register(write_peak)
runpy.run_module("packfs", run_name="__main__", alter_sys=True)
"""


def _pack_measuring_peak_rss(source: str, out: Path, feed: bool) -> tuple[int, str, int]:
    """Run ``packfs pack SOURCE OUT`` (stdin fed the big tar if ``feed``); return its exit
    status, its stderr and its peak RSS in bytes."""
    report, log = out.parent / "peak-rss.txt", out.parent / "stderr.txt"
    with open(log, "wb") as stderr:
        process = subprocess.Popen([sys.executable, "-c", _PEAK_RSS_WRAPPER, str(report), "pack", "-q", source,
                                    str(out)], stdin=subprocess.PIPE if feed else subprocess.DEVNULL, stderr=stderr,
                                   cwd=REPO)
    failures: list[BaseException] = []
    feeder = threading.Thread(target=_feed_tar, args=(process.stdin, failures)) if feed else None
    if feeder is not None:
        feeder.start()
    try:
        process.wait(timeout=time_limit(600))  # a hang guard, not a speed check
    finally:
        process.kill()
        process.wait()
        if feeder is not None:
            feeder.join()
    assert not failures, failures
    peak = int(report.read_text()) << 10 if report.exists() else -1
    report.unlink(missing_ok=True)
    log_text = log.read_text()
    log.unlink()
    return process.returncode, log_text, peak


@pytest.mark.parametrize("source", ["stdin", "file"])
def test_a_member_of_over_2_gib_is_packed_in_bounded_memory(tmp_path: Path, source: str) -> None:
    """A tar member a little over 2 GiB packs with a peak RSS under 200 MiB, and reads
    back whole.  "stdin" streams the tar through a pipe from a thread: nothing of its
    size is held in memory or stored but the writer's spool and the output.  "file" is
    a sparse, uncompressed tar file (the member all zeros, a hole), packed by seeking.

    On a 2-core VM these took 15-22 s (stdin: spool, then copy) and 6 s (file), with a
    peak RSS of about 38 MiB for the packer either way."""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("the peak RSS is read as VmHWM from /proc/self/status, which is Linux's")
    free = shutil.disk_usage(tmp_path).free
    if free < 3 * _BIG:  # stdin: the spool beside the output, so twice the member, and a margin
        pytest.skip(f"needs {3 * _BIG >> 30} GiB free under {tmp_path}, has {free >> 30} GiB")
    out, tar = tmp_path / "big.ffr", tmp_path / "big.tar"
    try:
        _pack_and_read_back_the_big_member(source, out, tar)
    finally:  # pytest keeps the last runs' tmp_path: not GiBs of them
        out.unlink(missing_ok=True)
        tar.unlink(missing_ok=True)


def _pack_and_read_back_the_big_member(source: str, out: Path, tar: Path) -> None:
    """The test above, without the clean-up: pack, check the memory bound, read back, verify."""
    if source == "stdin":
        status, stderr, peak = _pack_measuring_peak_rss("-", out, feed=True)
        expected = _big_chunk
    else:
        with open(tar, "wb") as f:
            header = _big_header()
            f.write(header)
            f.truncate(len(header) + _BIG + 2 * tarfile.BLOCKSIZE)  # a hole: zeros, and the end of archive
        status, stderr, peak = _pack_measuring_peak_rss(str(tar), out, feed=False)
        zeros = bytes(_CHUNK)
        expected = lambda index: zeros  # noqa: E731
    assert status == 0 and peak > 0, stderr
    assert peak < _RSS_BOUND, f"peak RSS {peak >> 20} MiB packing a {_BIG >> 20} MiB member"
    assert sorted(os.listdir(out.parent)) == ["big.ffr"] + (["big.tar"] if source == "file" else [])  # no spool left
    with PackedFolder(out) as folder:
        assert folder.stat("big/member.bin").size == _BIG
        with folder.open("big/member.bin") as member:  # the CRC is checked here, once
            index = 0
            while chunk := member.read(_CHUNK):
                assert chunk == expected(index), f"chunk {index} differs"
                index += 1
        assert index * _CHUNK == _BIG
    result = subprocess.run([sys.executable, "-m", "packfs", "verify", str(out)], capture_output=True, text=True,
                            cwd=REPO)
    assert result.returncode == 0 and result.stdout.startswith("OK: "), result.stdout + result.stderr
