"""pack -j N: worker processes read the files, and the archive has the same bytes
whatever N; files that change or cannot be read are reported the same; an interrupted
pack leaves no output, no temporary file and no worker behind."""

from __future__ import annotations

import errno
import logging
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from packfs import PackError, PackSourceError, PackedFolder, pack_folder
from packfs.core import Archive
from packfs.write.temporaries import process_alive
from tests.conftest import MTIME_NS, make_tree, packfs_cli, wait_until, time_limit

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20


def _xattrs_supported(path: Path) -> bool:
    try:
        os.setxattr(path, "user.packfs-probe", b"1")
        os.removexattr(path, "user.packfs-probe")
        return True
    except OSError:
        return False


def _mixed_tree(root: Path) -> Path:
    """Small files over several chunks, files over 1 MiB (piece CRCs) and of exactly
    2 MiB, empty files and directories, symlinks (one after the last file), hard links,
    extended attributes."""
    make_tree(root)  # the blueprint: symlinks, a hard link, a 3 MiB file, empty dirs
    rng = random.Random(26)  # the same tree every time
    many = root / "many"
    for index in range(300):
        folder = many / f"d{index % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{index:03d}.bin").write_bytes(rng.randbytes(index * 37 % 3000))
    (root / "pieces").mkdir()
    (root / "pieces" / "two.bin").write_bytes(rng.randbytes(2 * MIB))
    (root / "pieces" / "odd.bin").write_bytes(rng.randbytes(MIB + 1))
    os.link(root / "pieces" / "odd.bin", root / "many" / "odd-again.bin")
    (root / "zz-empty-dir").mkdir()
    os.symlink("many/d0", root / "zz-last-link")  # after every file: in the workers' last chunk
    if _xattrs_supported(root / "hello.txt"):
        os.setxattr(root / "hello.txt", "user.color", b"green")
        os.setxattr(root / "many" / "d3", "user.kind", b"a directory's")
    for path in [root, *root.rglob("*")]:
        os.utime(path, ns=(MTIME_NS, MTIME_NS), follow_symlinks=False)
    return root


def _packed_bytes(src: Path, out: Path, jobs: int, **options: object) -> bytes:
    pack_folder(src, out, jobs=jobs, **options)
    return out.read_bytes()


def test_the_archive_has_the_same_bytes_whatever_the_jobs(tmp_path: Path) -> None:
    src = _mixed_tree(tmp_path / "src")
    one = _packed_bytes(src, tmp_path / "j1.ffr", 1)
    for jobs in (2, 4):
        assert _packed_bytes(src, tmp_path / f"j{jobs}.ffr", jobs) == one, f"-j {jobs} differs from -j 1"
    with Archive(tmp_path / "j4.ffr") as archive:
        assert archive.verify().ok  # record and piece CRCs included
    with PackedFolder(tmp_path / "j4.ffr") as folder:
        assert folder.read("pieces/odd.bin") == (src / "pieces" / "odd.bin").read_bytes()
        assert folder.read("many/d5/f299.bin") == (src / "many" / "d5" / "f299.bin").read_bytes()
        assert folder.readlink("zz-last-link") == "many/d0"
        assert folder.stat("many/odd-again.bin").inode == folder.stat("pieces/odd.bin").inode


def test_default_jobs_are_the_cores_available(tmp_path: Path, monkeypatch) -> None:
    src = _mixed_tree(tmp_path / "src")
    seen = []
    import packfs.write.pack as pack_module

    real = pack_module.files_on_workers

    def spy(writer, root, items, jobs):
        seen.append(jobs)
        return real(writer, root, items, jobs)

    monkeypatch.setattr(pack_module, "files_on_workers", spy)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    pack_folder(src, tmp_path / "x.ffr")
    assert seen == [3]


@pytest.mark.parametrize("jobs", [0, -1, 1.5, True])
def test_jobs_below_one_or_not_whole_is_an_error(tmp_path: Path, jobs: object) -> None:
    with pytest.raises(ValueError, match="jobs must be a whole number >= 1"):
        pack_folder(_mixed_tree(tmp_path / "src"), tmp_path / "x.ffr", jobs=jobs)  # type: ignore[arg-type]
    assert not (tmp_path / "x.ffr").exists()


class _ChangeAfterTheScan:
    """Progress that changes the tree once the scan is done, before any file is read:
    files grow, shrink, vanish, so that records are not where the scanned sizes put them."""

    def __init__(self, src: Path) -> None:
        self.src = src

    def start(self, *args: int) -> None:
        many = self.src / "many"
        with open(many / "d1" / "f001.bin", "ab") as grown:
            grown.write(b"grown after the scan")
        os.truncate(many / "d2" / "f002.bin", 5)
        (many / "d4" / "f004.bin").unlink()
        (self.src / "pieces" / "two.bin").write_bytes(b"B" * (2 * MIB + 9))
        for path in (many / "d1" / "f001.bin", many / "d2" / "f002.bin", self.src / "pieces" / "two.bin"):
            os.utime(path, ns=(MTIME_NS, MTIME_NS))

    def advance(self, *args: int) -> None:
        pass


@pytest.mark.parametrize("chunk_files", [64, 3], ids=["chunks-of-64", "chunks-of-3"])
def test_a_tree_changed_after_the_scan_gives_the_same_bytes_whatever_the_jobs(tmp_path: Path, monkeypatch,
                                                                              chunk_files: int) -> None:
    """Records that moved (a file grew, shrank or vanished since the scan) are copied to
    their places: the bytes are those of -j 1.  With chunks of 3 files, most chunks are
    given out after the move, and read straight into the copy."""
    import packfs.write.parallel as parallel_module

    monkeypatch.setattr(parallel_module, "_CHUNK_FILES", chunk_files)
    packed = {}
    for jobs in (1, 2, 3):
        src = _mixed_tree(tmp_path / f"src{jobs}")
        stats = pack_folder(src, tmp_path / f"j{jobs}.ffr", jobs=jobs, keep_going=True,
                            progress=_ChangeAfterTheScan(src))
        assert [(Path(path).relative_to(src), reason) for path, reason, _ in stats.skipped] == [
            (Path("many/d4/f004.bin"), "vanished while packing")]
        packed[jobs] = (tmp_path / f"j{jobs}.ffr").read_bytes()
    assert packed[2] == packed[1] and packed[3] == packed[1]
    with PackedFolder(tmp_path / "j2.ffr") as folder:
        assert folder.read("many/d1/f001.bin").endswith(b"grown after the scan")
        assert folder.read("pieces/two.bin") == b"B" * (2 * MIB + 9)
        assert folder.verify().ok
    assert sorted(os.listdir(tmp_path)) == ["j1.ffr", "j2.ffr", "j3.ffr", "src1", "src2", "src3"]


def _fail_reads_of(monkeypatch, target: Path) -> None:
    """os.preadv of ``target`` fails with EIO, in this process and in the workers it forks."""
    inode = target.stat().st_ino
    real_preadv = os.preadv

    def preadv(fd: int, buffers, offset: int, *flags: int) -> int:
        if os.fstat(fd).st_ino == inode:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_preadv(fd, buffers, offset, *flags)

    monkeypatch.setattr(os, "preadv", preadv)


def test_an_unreadable_file_is_skipped_the_same_way(tmp_path: Path, monkeypatch, caplog) -> None:
    import packfs.write.parallel as parallel_module

    monkeypatch.setattr(parallel_module, "_CHUNK_FILES", 5)  # chunks given out after the move too
    src = _mixed_tree(tmp_path / "src")
    _fail_reads_of(monkeypatch, src / "many" / "d3" / "f010.bin")
    _fail_reads_of(monkeypatch, src / "pieces" / "odd.bin")  # and its other name with it
    packed = {}
    for jobs in (1, 2):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="packfs"):
            stats = pack_folder(src, tmp_path / f"x{jobs}.ffr", jobs=jobs, keep_going=True)
        assert [(path, reason) for path, reason, _ in stats.skipped] == [
            (f"{src}/many/d3/f010.bin", "cannot read: Input/output error"),
            (f"{src}/many/odd-again.bin", "cannot read: Input/output error"),  # its first name
            (f"{src}/pieces/odd.bin", f"a hard link to '{src}/many/odd-again.bin', which could not be packed"),
        ]
        assert f"skipped '{src}/many/d3/f010.bin': cannot read: Input/output error" in caplog.text
        packed[jobs] = (tmp_path / f"x{jobs}.ffr").read_bytes()
    assert packed[2] == packed[1]  # the records after the skipped ones moved back into place
    with PackedFolder(tmp_path / "x2.ffr") as folder:
        assert folder.verify().ok and not folder.exists("pieces/odd.bin")
        assert folder.read("many/d3/f017.bin") == (src / "many" / "d3" / "f017.bin").read_bytes()

    for jobs in (1, 2):
        with pytest.raises(PackSourceError) as raised:
            pack_folder(src, tmp_path / "y.ffr", jobs=jobs)
        assert [failed.path for failed in raised.value.failed] == [f"{src}/many/d3/f010.bin"]
        assert sorted(os.listdir(tmp_path)) == ["src", "x1.ffr", "x2.ffr"]


def test_a_file_changing_while_read_by_a_worker_is_read_again(tmp_path: Path, monkeypatch, caplog) -> None:
    src = _mixed_tree(tmp_path / "src")
    live = src / "pieces" / "two.bin"
    inode = live.stat().st_ino
    real_preadv = os.preadv
    marker = tmp_path / "changed-once"

    def preadv(fd: int, buffers, offset: int, *flags: int) -> int:
        got = real_preadv(fd, buffers, offset, *flags)
        if offset > 0 and os.fstat(fd).st_ino == inode and not marker.exists():
            marker.write_text(str(os.getpid()))
            with open(live, "r+b") as f:  # same size, other bytes: only the stat can tell
                f.write(b"C" * (2 * MIB))
        return got

    monkeypatch.setattr(os, "preadv", preadv)
    with caplog.at_level(logging.WARNING, logger="packfs"):
        stats = pack_folder(src, tmp_path / "x.ffr", jobs=2)
    assert int(marker.read_text()) != os.getpid()  # a worker read it
    assert stats.changed == (str(live),)
    assert f"{str(live)!r} changed while it was read; stored as read again" in caplog.text
    with PackedFolder(tmp_path / "x.ffr") as folder:
        assert folder.read("pieces/two.bin") == b"C" * (2 * MIB)
        assert folder.stat("pieces/two.bin").mtime_ns == live.stat().st_mtime_ns
        assert folder.verify().ok


def test_a_worker_that_dies_fails_the_pack_and_leaves_nothing(tmp_path: Path) -> None:
    src = _mixed_tree(tmp_path / "src")
    out_dir = tmp_path / "out"
    out_dir.mkdir()

    # Processes other tests left running (a Dask cluster's resource tracker) are not the pack's.
    others = set(_children(os.getpid()))

    class KillAWorker:
        def start(self, *args: int) -> None:
            pass

        def advance(self, files: int, nbytes: int) -> None:
            for pid in set(_children(os.getpid())) - others:
                os.kill(pid, signal.SIGKILL)

    with pytest.raises(PackError, match=r"a packing process ended unexpectedly \(killed by SIGKILL\)"):
        pack_folder(src, out_dir / "x.ffr", jobs=2, progress=KillAWorker())
    assert os.listdir(out_dir) == []
    assert set(_children(os.getpid())) - others == set()


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listing:
            return [int(child) for child in listing.read().split()]
    except FileNotFoundError:
        return []


# Packs with -j 2 through the CLI, and on its first report of progress (the workers
# busy) writes the workers' pids to argv[-1] and sends itself the signal.
_SIGNAL_MID_PARALLEL_PACK = """
import os, signal, sys
import packfs.cli
import packfs.cli.plumbing
pids_file = sys.argv.pop()
def advance(self, files, nbytes):
    with open(f"/proc/{{os.getpid()}}/task/{{os.getpid()}}/children") as listing:
        children = listing.read()
    with open(pids_file, "w") as f:
        f.write(children)
    os.kill(os.getpid(), {sig})
packfs.cli.plumbing.TerminalProgress.advance = advance
sys.argv = ["packfs"] + sys.argv[1:]
packfs.cli.main()
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_an_interrupted_parallel_pack_leaves_no_output_and_no_worker(tmp_path: Path, sig: int) -> None:
    src = _mixed_tree(tmp_path / "src")
    for index in range(2000):  # enough that the workers are busy when the signal lands
        (src / "many" / f"more{index:04d}.bin").write_bytes(os.urandom(4096))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    pids_file = tmp_path / "workers"
    result = subprocess.run([sys.executable, "-c", _SIGNAL_MID_PARALLEL_PACK.format(sig=int(sig)), "pack",
                             "-j", "2", str(src), str(out_dir / "x.ffr"), str(pids_file)],
                            capture_output=True, text=True, cwd=ROOT, timeout=time_limit(120))
    workers = [int(pid) for pid in pids_file.read_text().split()]
    assert len(workers) == 2
    assert wait_until(lambda: not any(process_alive(pid) for pid in workers), 10), "a worker outlived the packer"
    if sig == signal.SIGKILL:
        assert result.returncode == -signal.SIGKILL
        # Nothing can run in a process killed so: its temporary file stays, named with its
        # pid, as with -j 1, and the next pack removes it; the workers' files had no name.
        assert len(os.listdir(out_dir)) == 1 and ".x.ffr.packfs-tmp-" in os.listdir(out_dir)[0]
        pack_folder(tmp_path / "src" / "a", out_dir / "x.ffr", jobs=2)
        assert os.listdir(out_dir) == ["x.ffr"]
    else:
        assert result.returncode == 128 + sig, result.stderr
        assert f"Interrupted by {signal.Signals(sig).name}" in result.stderr
        assert "Traceback" not in result.stderr
        assert os.listdir(out_dir) == []


def test_the_command_line_takes_jobs(tmp_path: Path) -> None:
    src = _mixed_tree(tmp_path / "src")
    for jobs in ("1", "3"):
        result = packfs_cli("pack", "-q", "-j", jobs, src, tmp_path / f"j{jobs}.ffr")
        assert result.returncode == 0, result.stderr
    assert (tmp_path / "j1.ffr").read_bytes() == (tmp_path / "j3.ffr").read_bytes()
    result = packfs_cli("pack", "--jobs", "2", src, tmp_path / "j2.ffr")
    assert result.returncode == 0 and "packed 3" in result.stderr, result.stderr
    assert (tmp_path / "j2.ffr").read_bytes() == (tmp_path / "j1.ffr").read_bytes()


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_jobs_below_one_is_a_usage_error(tmp_path: Path, value: str) -> None:
    result = packfs_cli("pack", "-j", value, _mixed_tree(tmp_path / "src"), tmp_path / "x.ffr")
    assert result.returncode == 2
    assert "Invalid value for '-j' / '--jobs'" in result.stderr
    assert not (tmp_path / "x.ffr").exists()


def test_a_tar_is_packed_the_same_whatever_the_jobs(tmp_path: Path) -> None:
    """A tar is one stream, read by one process: -j is accepted and changes nothing."""
    src = _mixed_tree(tmp_path / "src")
    subprocess.run(["tar", "cf", str(tmp_path / "t.tar"), "-C", str(src), "."], check=True)
    for jobs in ("1", "2"):
        result = packfs_cli("pack", "-q", "-j", jobs, tmp_path / "t.tar", tmp_path / f"t{jobs}.ffr")
        assert result.returncode == 0, result.stderr
    assert (tmp_path / "t1.ffr").read_bytes() == (tmp_path / "t2.ffr").read_bytes()
