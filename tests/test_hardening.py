"""What a second review found in this release's new code, each kept from coming back:
root running code from the working directory, root writing through another user's
links, a chained SIGBUS handler that recovers, a closed RecordReader, options packfs
owns, libfuse loop options."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import packfs
from packfs.fuse import helper_script
from tests.conftest import mounted, packfs_cli, require_fuse

ROOT = Path(__file__).resolve().parent.parent


def test_the_mount_helper_never_imports_from_the_working_directory(tmp_path: Path) -> None:
    """mount(8) runs the helper as root from wherever root is (mount -a in a user's
    home): a packfs/ there, or on PYTHONPATH, must not be what runs."""
    helper = tmp_path / "mount.fuse.packfs"
    helper.write_text(helper_script())
    helper.chmod(0o755)
    trap = tmp_path / "cwd" / "packfs"
    trap.mkdir(parents=True)
    (trap / "__init__.py").write_text("open(__file__ + '.ran', 'w').close()\n")
    (trap / "mount.py").write_text("def mount_helper(argv):\n    return 0\n")
    result = subprocess.run([str(helper), "x.ffr", "m", "-f"], cwd=tmp_path / "cwd", capture_output=True,
                            text=True, env=dict(os.environ, PYTHONPATH=str(tmp_path / "cwd")))
    assert not (trap / "__init__.py.ran").exists(), result.stderr
    assert result.returncode == 0  # -f: a fake mount, done by the real helper


def test_a_state_directory_that_is_not_ours_is_refused(tmp_path: Path) -> None:
    """Another user makes $TMPDIR/packfs-<uid> first and plants links in it: refused."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    planted = shared / f"packfs-{os.getuid()}"
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)
    code = "from packfs.fuse import state_directory; state_directory()"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                            env=dict(os.environ, TMPDIR=str(shared)))
    assert result.returncode != 0 and "not a private directory" in result.stderr
    planted.rmdir()
    planted.symlink_to(tmp_path)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                            env=dict(os.environ, TMPDIR=str(shared)))
    assert result.returncode != 0 and "not a private directory" in result.stderr


def test_a_recovering_sigbus_handler_before_ours_keeps_working() -> None:
    """A handler installed before packfs's that recovers (a Python one here) gets every
    SIGBUS that is not an archive map's, not just the first."""
    pytest.importorskip("packfs._sigbus", reason="the SIGBUS guard extension is not built")
    code = (
        "import mmap, os, signal, tempfile\n"
        "from packfs import _sigbus\n"
        "seen = []\n"
        "signal.signal(signal.SIGBUS, lambda number, frame: seen.append(number))\n"
        "with tempfile.TemporaryFile() as f:\n"
        "    f.write(b'x' * 4096); f.flush()\n"
        "    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n"
        "    slot = _sigbus.register(m, f.fileno())\n"
        "    for _ in range(3):\n"
        "        os.kill(os.getpid(), signal.SIGBUS)\n"
        "    _sigbus.unregister(slot)\n"
        "print(len(seen))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0 and result.stdout.strip() == "3", (result.returncode, result.stderr)


def test_a_closed_record_reader_raises_closed_archive_error(tmp_path: Path) -> None:
    with packfs.RecordWriter(tmp_path / "r.ffr", 2) as writer:
        writer.write_one(b"a")
        writer.write_one(b"b")
    reader = packfs.RecordReader(tmp_path / "r.ffr")
    reader.close()
    for use in (lambda: reader.read_one(0), lambda: reader.record_length(1)):
        with pytest.raises(packfs.ClosedArchiveError):
            use()


def test_fsname_and_subtype_are_packfs_own(tmp_path: Path) -> None:
    packfs.pack_entries([packfs.Entry("a", b"x")], tmp_path / "a.ffr")
    (tmp_path / "m").mkdir()
    for option in ("fsname=mine", "subtype=other"):
        result = packfs_cli("mount", tmp_path / "a.ffr", tmp_path / "m", "-o", option)
        assert result.returncode == 1 and "is set by packfs itself" in result.stderr, result.stderr


@pytest.mark.fuse
@pytest.mark.parametrize("option", ["clone_fd", "max_idle_threads=4", "max_threads=3,clone_fd"])
def test_libfuse_loop_options_are_accepted(tmp_path: Path, option: str) -> None:
    """fuse_main took these out before fuse_new; packfs's own loop does the same."""
    require_fuse()
    packfs.pack_entries([packfs.Entry("a", b"x")], tmp_path / "a.ffr")
    with mounted(tmp_path / "a.ffr", tmp_path / "m", "-o", option) as root:
        assert (root / "a").read_bytes() == b"x"


def test_closing_a_record_reader_under_concurrent_reads(tmp_path: Path) -> None:
    """Readers in flight finish with the right bytes or get ClosedArchiveError; the
    descriptors are released once nothing reads (none is closed under a read)."""
    import threading

    records = [os.urandom(1000 + i) for i in range(200)]
    with packfs.RecordWriter(tmp_path / "r.ffr", len(records)) as writer:
        for record in records:
            writer.write_one(record)
    fds_before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        reader = packfs.RecordReader(tmp_path / "r.ffr")
        problems: list[str] = []
        start = threading.Barrier(5)

        def read() -> None:
            start.wait()
            for i in range(2000):
                try:
                    if reader.read_one(i % len(records)) != records[i % len(records)]:
                        problems.append("wrong bytes")
                except packfs.ClosedArchiveError:
                    return
                except Exception as error:  # anything else is the bug
                    problems.append(repr(error))
                    return

        threads = [threading.Thread(target=read) for _ in range(4)]
        for thread in threads:
            thread.start()
        start.wait()
        reader.close()
        for thread in threads:
            thread.join()
        assert problems == []
        reader = None  # the last reference: its descriptors go now
    assert len(os.listdir("/proc/self/fd")) <= fds_before
