"""A pack stopped by any catchable signal exits 128 + signal, leaves no partial output
and no temporary file; a killed packer's leftover is removed by the next pack."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import packfs
from tests.conftest import BLUEPRINT

ROOT = Path(__file__).resolve().parent.parent

# The CLI runs for real; its progress display sends the signal in the middle of the
# data, so the signal lands while the temporary file is half written.
_SIGNAL_MID_PACK = """
import os, signal, sys
import packfs.cli
sent = []
def advance(self, files, nbytes):
    if not sent:
        sent.append(1)
        os.kill(os.getpid(), {sig})
packfs.cli._TerminalProgress.advance = advance
sys.argv = ["packfs"] + sys.argv[1:]
packfs.cli.main()
"""

CATCHABLE = [signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGALRM]


@pytest.mark.parametrize("sig", CATCHABLE, ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize("source", ["dir", "tar"])
def test_a_signal_mid_pack_exits_128_plus_it_and_leaves_nothing(tree: Path, tmp_path: Path, sig: int,
                                                                  source: str) -> None:
    src = tree
    if source == "tar":
        src = tmp_path / "t.tar"
        subprocess.run(["tar", "cf", str(src), "-C", str(tree), "."], check=True)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    result = subprocess.run([sys.executable, "-c", _SIGNAL_MID_PACK.format(sig=int(sig)), "pack", str(src),
                             str(out_dir / "x.ffr")], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 128 + sig, result.stderr
    assert "Traceback" not in result.stderr and "Aborted" not in result.stderr
    assert f"Interrupted by {signal.Signals(sig).name}" in result.stderr
    assert os.listdir(out_dir) == []  # no output, no temporary file


def test_an_ignored_signal_stays_ignored(tree: Path, tmp_path: Path) -> None:
    """nohup's SIGHUP: the pack goes on and completes."""
    script = "import signal; signal.signal(signal.SIGHUP, signal.SIG_IGN)\n" + _SIGNAL_MID_PACK.format(
        sig=int(signal.SIGHUP))
    result = subprocess.run([sys.executable, "-c", script, "pack", str(tree), str(tmp_path / "x.ffr")],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert packfs.PackedFolder(tmp_path / "x.ffr").read("hello.txt") == BLUEPRINT["hello.txt"]


def test_a_killed_packers_leftover_goes_even_if_it_had_not_exited(tree: Path, tmp_path: Path) -> None:
    """A zombie (killed, not yet reaped) no longer writes: its temporary file is removed."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        # Wait until it is a zombie (it has exited; we have not reaped it).
        while open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0] != "Z":
            pass
        leftover = tmp_path / f".x.ffr.packfs-tmp-{pid}-abcd1234"
        leftover.write_bytes(b"half an archive")
        packfs.pack_folder(tree, tmp_path / "x.ffr")
        assert not leftover.exists()
    finally:
        os.waitpid(pid, 0)


def test_a_leftover_of_a_writer_that_dies_during_a_pack_goes_at_its_end(tree: Path, tmp_path: Path) -> None:
    """The writer still runs when the pack starts and dies before it ends: the pack's
    end removes its file, so it need not wait for the next pack."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        leftover = tmp_path / f".x.ffr.packfs-tmp-{child.pid}-abcd1234"
        leftover.write_bytes(b"half an archive")

        class KillMidway:
            def start(self, *args: int) -> None:
                child.kill()
                child.wait()

            def advance(self, *args: int) -> None:
                pass

        packfs.pack_folder(tree, tmp_path / "x.ffr", progress=KillMidway())
        assert not leftover.exists()
    finally:
        child.kill()
        child.wait()


def test_a_writer_interrupted_before_its_with_block_leaves_nothing(tmp_path: Path) -> None:
    """A signal between a writer's creation and the `with` that would clean up after it
    (the window a Ctrl-C hit in CI): the CLI's last step removes the file anyway."""
    from packfs.write import ContainerWriter, remove_unfinished

    writer = ContainerWriter(tmp_path / "x.ffr", 3)
    assert [name for name in os.listdir(tmp_path) if ".packfs-tmp-" in name]
    remove_unfinished()
    assert os.listdir(tmp_path) == []
    del writer


def test_a_finished_writer_is_not_touched_by_the_clean_up(tmp_path: Path) -> None:
    from packfs.write import remove_unfinished

    packfs.pack_entries([packfs.Entry("a", b"x")], tmp_path / "x.ffr")
    remove_unfinished()
    assert os.listdir(tmp_path) == ["x.ffr"]


_SIGNAL_MID_UNPACK = """
import os, signal, sys
import packfs.cli
sent = []
def add_bytes(self, nbytes):
    if not sent:
        sent.append(1)
        os.kill(os.getpid(), signal.SIGTERM)
packfs.cli._TerminalProgress.add_bytes = add_bytes
sys.argv = ["packfs"] + sys.argv[1:]
packfs.cli.main()
"""


def test_a_signal_mid_unpack_leaves_no_partial_file(tmp_path: Path) -> None:
    """SIGTERM while a large file is being written: exit 143, no temporary file and no
    partial file in DEST; a rerun with --skip-existing finishes the job."""
    big = bytes(range(256)) * 40_000  # 10 MB: several chunks, the signal lands in the first
    packfs.pack_entries([packfs.Entry("a/small", b"small"), packfs.Entry("b/big", big)], tmp_path / "x.ffr")
    dest = tmp_path / "dest"
    result = subprocess.run([sys.executable, "-c", _SIGNAL_MID_UNPACK, "unpack", str(tmp_path / "x.ffr"), str(dest)],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert "Interrupted by SIGTERM" in result.stderr and "Traceback" not in result.stderr
    left = [str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()]
    assert all(".packfs-unpack-" not in name for name in left), left
    assert "b/big" not in left or (dest / "b" / "big").read_bytes() == big
    done = subprocess.run([sys.executable, "-m", "packfs", "unpack", "--skip-existing", str(tmp_path / "x.ffr"),
                           str(dest)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert (dest / "b" / "big").read_bytes() == big and (dest / "a" / "small").read_bytes() == b"small"
