"""A pack stopped by any catchable signal exits 128 + signal, leaves no partial output
and no temporary file; a killed packer's leftover is removed by the next pack."""

from __future__ import annotations

import os
import signal
import stat as stat_module
import subprocess
import sys
from pathlib import Path

import pytest

import packfs
from tests.conftest import BLUEPRINT, assert_same_tree, packfs_cli, require_python_as_nobody, tree_snapshot, time_limit

ROOT = Path(__file__).resolve().parent.parent

# The CLI runs for real; its progress display sends the signal in the middle of the
# data, so the signal lands while the temporary file is half written.
_SIGNAL_MID_PACK = """
import os, signal, sys
import packfs.cli
import packfs.cli.plumbing
sent = []
def advance(self, files, nbytes):
    if not sent:
        sent.append(1)
        os.kill(os.getpid(), {sig})
packfs.cli.plumbing.TerminalProgress.advance = advance
sys.argv = ["packfs"] + sys.argv[1:]
packfs.cli.main()
"""

CATCHABLE = [signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGALRM]


@pytest.mark.parametrize("sig", CATCHABLE, ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize("source", ["dir", "tar", "dir-compressed"])
def test_a_signal_mid_pack_exits_128_plus_it_and_leaves_nothing(tree: Path, tmp_path: Path, sig: int,
                                                                  source: str) -> None:
    src = tree
    if source == "tar":
        src = tmp_path / "t.tar"
        subprocess.run(["tar", "cf", str(src), "-C", str(tree), "."], check=True)
    # Compressed with -j 2: threads read and encode ahead when the signal lands.
    options = ["--compress", "zstd", "--dictionary", "auto", "-j", "2"] if source == "dir-compressed" else []
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    result = subprocess.run([sys.executable, "-c", _SIGNAL_MID_PACK.format(sig=int(sig)), "pack", *options, str(src),
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
import packfs.cli.plumbing
sent = []
def add_bytes(self, nbytes):
    if not sent:
        sent.append(1)
        os.kill(os.getpid(), signal.SIGTERM)
packfs.cli.plumbing.TerminalProgress.add_bytes = add_bytes
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


# -- an unpack interrupted anywhere, then resumed, equals an unpack never interrupted ----------

# 30 directories of 80 small files each, with symlinks, hard links across directories,
# a read-only directory, three 8 MiB files (a temporary file lives while each is
# written), a root whose mode is not what mkdir gives, and a different mtime for every
# entry: enough to interrupt at chosen points, and to see any attribute left unset.
_DIRS, _FILES_PER_DIR = 30, 80


def _make_interruptible_tree(root: Path) -> Path:
    root.mkdir()
    for d in range(_DIRS):
        directory = root / f"d{d:02}"
        directory.mkdir()
        for f in range(_FILES_PER_DIR):
            (directory / f"f{f:03}").write_bytes(os.urandom(100 + 37 * f))
        os.symlink(f"f{d:03}", directory / "link")
        os.symlink(f"../d{(d + 1) % _DIRS:02}/f000", directory / "link-out")
        if d:
            os.link(root / "d00" / f"f{d:03}", directory / "hard")
    for n in range(3):
        (root / "d10" / f"big{n}").write_bytes(os.urandom(8 << 20))
    (root / "d20" / "sub").mkdir()
    (root / "d20" / "sub" / "inside").write_bytes(b"read-only directory")
    os.chmod(root / "d05" / "f001", 0o604)
    os.chmod(root / "d20" / "sub", 0o555)
    os.chmod(root / "d07", 0o700)
    stamp = 1_500_000_000_000_000_000
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in sorted(dirnames + filenames):
            stamp += 1_000_003
            os.utime(os.path.join(dirpath, name), ns=(stamp, stamp), follow_symlinks=False)
    os.utime(root, ns=(stamp + 7, stamp + 7))
    os.chmod(root, 0o750)  # mkdir (umask 022) gives 0755: a DEST left so would show
    return root


@pytest.fixture(scope="module")
def interruptible(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the archive, an uninterrupted unpack of it)."""
    work = tmp_path_factory.mktemp("interruptible")
    archive = work / "tree.ffr"
    packfs.pack_folder(_make_interruptible_tree(work / "src"), archive)
    with packfs.PackedFolder(archive) as folder:
        packfs.unpack(folder, work / "clean")
    return archive, work / "clean"


def _temporaries(root: Path) -> list[str]:
    return [os.path.join(dirpath, name) for dirpath, dirnames, filenames in os.walk(root)
            for name in dirnames + filenames if ".packfs-unpack-" in name]


def _reached(point: str, dest: Path, process: subprocess.Popen) -> bool:
    """Poll DEST until ``point`` holds (a path exists, or, "tmp:DIR", a temporary file is
    being written in DIR): True; False if the unpack ended first."""
    directory, _, prefix = point.partition(":")
    while process.poll() is None:
        if directory == "tmp":
            try:
                if any(name.startswith(".packfs-unpack-") for name in os.listdir(dest / prefix)):
                    return True
            except FileNotFoundError:
                pass
        elif os.path.lexists(dest / point):
            return True
    return False


# The poller must see a point while the unpack is there, which a busy machine can make
# it miss (an 8 MiB file is written in milliseconds): the unpack runs at a lower
# priority, and is started again on a fresh DEST until a run is caught at the point.
_ATTEMPTS = 5


def _unpack_reaching(point: str, command: list[str], dest: Path, **popen: object) -> subprocess.Popen:
    """An unpack (``command``, writing ``dest``) caught at ``point``, still running."""
    for _ in range(_ATTEMPTS):
        process = subprocess.Popen(command, cwd=ROOT, preexec_fn=lambda: os.nice(10), **popen)  # type: ignore[call-overload]
        if _reached(point, dest, process):
            return process
        process.communicate()
        subprocess.run(["rm", "-rf", str(dest)], check=True)  # a read-only directory too, as root or its owner
    pytest.fail(f"{_ATTEMPTS} unpacks each ended before {point!r} was seen")


def _check_interrupted(dest: Path, clean: Path) -> None:
    """No temporary file anywhere, and everything that is not a directory already
    exactly as in the uninterrupted unpack (nothing half-written, no attribute unset)."""
    assert _temporaries(dest) == []
    want, got = tree_snapshot(clean), tree_snapshot(dest)
    for path, value in got.items():
        assert path in want, path
        if not stat_module.S_ISDIR(value[0]):
            assert value == want[path], path


# Points in the order unpack reaches them: the k-th file of a directory written, or a
# temporary file being written (the first 8 MiB file of d10).
POINTS = ["d01/f005", "tmp:d10", "d14/f040", "d24/f000"]


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: signal.Signals(s).name)
def test_an_unpack_interrupted_and_resumed_equals_one_never_interrupted(
        interruptible: tuple[Path, Path], tmp_path: Path, sig: int, point: str) -> None:
    archive, clean = interruptible
    dest = tmp_path / "dest"
    process = _unpack_reaching(point, [sys.executable, "-m", "packfs", "unpack", "-q", str(archive), str(dest)],
                               dest, stderr=subprocess.PIPE, text=True)
    try:
        process.send_signal(sig)
        stderr = process.communicate(timeout=time_limit(60))[1]
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 128 + sig, stderr
    assert f"Interrupted by {signal.Signals(sig).name}" in stderr and "Traceback" not in stderr
    _check_interrupted(dest, clean)
    resumed = packfs_cli("unpack", "-q", "--skip-existing", archive, dest)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_tree(clean, dest)


def test_a_hangup_mid_unpack_too(interruptible: tuple[Path, Path], tmp_path: Path) -> None:
    archive, clean = interruptible
    dest = tmp_path / "dest"
    process = _unpack_reaching("d12/f010", [sys.executable, "-m", "packfs", "unpack", "-q", str(archive), str(dest)],
                               dest, stderr=subprocess.PIPE, text=True)
    try:
        process.send_signal(signal.SIGHUP)
        stderr = process.communicate(timeout=time_limit(60))[1]
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 128 + signal.SIGHUP, stderr
    _check_interrupted(dest, clean)
    assert packfs_cli("unpack", "-q", "--skip-existing", archive, dest).returncode == 0
    assert_same_tree(clean, dest)


def test_a_killed_unpacks_temporary_file_goes_with_the_resume(interruptible: tuple[Path, Path],
                                                               tmp_path: Path) -> None:
    """kill -9 cannot be caught: it leaves the file being written under its temporary
    name, which the resume removes (its process is gone) rather than keep."""
    archive, clean = interruptible
    dest = tmp_path / "dest"
    process = _unpack_reaching("tmp:d10", [sys.executable, "-m", "packfs", "unpack", "-q", str(archive), str(dest)],
                               dest)
    try:
        process.kill()
    finally:
        process.kill()
        process.wait()
    left = _temporaries(dest)
    assert len(left) == 1 and f".packfs-unpack-{process.pid}-" in left[0], left
    resumed = packfs_cli("unpack", "-q", "--skip-existing", archive, dest)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_tree(clean, dest)


# The CLI for real, with one system call of unpack's wrapped: right after the call that
# touches its N-th temporary file, the process signals itself, so the handler runs at
# exactly that point (as it does when a signal arrives during that system call).
_SIGNAL_AFTER_CALL = """
import os, sys
import packfs.cli
import packfs.cli.plumbing
call, nth, sig = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
real_open, real_call = os.open, getattr(os, call)
temporary_fds, hits = set(), []
def is_temporary(name):
    return isinstance(name, bytes) and name.startswith(b".packfs-unpack-")
def tracking_open(path, *args, **kwargs):
    fd = real_open(path, *args, **kwargs)
    if is_temporary(path):
        temporary_fds.add(fd)
    return fd
def wrapped(first, *args, **kwargs):
    result = (tracking_open if call == "open" else real_call)(first, *args, **kwargs)
    name = args[0] if call == "symlink" else first  # symlink(target, name)
    if (first in temporary_fds) if call in ("pwrite", "close") else is_temporary(name):
        if call == "close":
            temporary_fds.discard(first)
        hits.append(1)
        if len(hits) == nth:
            os.kill(os.getpid(), sig)
    return result
os.open = tracking_open
setattr(os, call, wrapped)
sys.argv = ["packfs"] + sys.argv[4:]
packfs.cli.main()
"""


@pytest.mark.parametrize("call, sig", [
    ("open", signal.SIGINT),      # the temporary file exists; the `try` that removes it is not entered yet
    ("pwrite", signal.SIGTERM),   # half of it written (at each piece's offset: a sparse file's holes skipped)
    ("close", signal.SIGINT),     # closed, its descriptor not yet forgotten
    ("link", signal.SIGHUP),      # published under its name, the temporary name not yet removed
    ("symlink", signal.SIGTERM),  # a symlink under its temporary name, its mtime not yet set
])
def test_a_signal_right_after_any_call_on_a_temporary_file_leaves_nothing(
        interruptible: tuple[Path, Path], tmp_path: Path, call: str, sig: int) -> None:
    archive, clean = interruptible
    dest = tmp_path / "dest"
    nth = 20 if call == "symlink" else 300
    result = subprocess.run([sys.executable, "-c", _SIGNAL_AFTER_CALL, call, str(nth), str(int(sig)),
                             "unpack", "-q", str(archive), str(dest)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 128 + sig, result.stderr
    assert "Traceback" not in result.stderr and "Error" not in result.stderr, result.stderr
    _check_interrupted(dest, clean)
    resumed = packfs_cli("unpack", "-q", "--skip-existing", archive, dest)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_tree(clean, dest)


def test_a_resume_into_a_read_only_dest_left_by_an_interrupted_unpack(tmp_path: Path) -> None:
    """The archive's root is read-only (0555): the interrupted unpack leaves DEST so, as
    an uninterrupted one would; the resume, as a user without root's rights (nobody,
    when the tests run as root), opens it up to fill it and puts its mode back."""
    import shutil
    import tempfile

    as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"] if os.geteuid() == 0 else []
    if as_user and shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to run the unpack as nobody")
    if as_user:
        require_python_as_nobody()
    work = Path(tempfile.mkdtemp(prefix="packfs-read-only-dest-"))  # pytest's tmp_path is root's only
    try:
        os.chmod(work, 0o777)
        src = _make_interruptible_tree(tmp_path / "src")
        os.chmod(src, 0o555)
        archive = work / "tree.ffr"
        packfs.pack_folder(src, archive)
        os.chmod(archive, 0o644)

        def packfs_as_user(*args: str) -> list[str]:
            return [*as_user, sys.executable, "-m", "packfs", *args]

        clean = subprocess.run(packfs_as_user("unpack", "-q", str(archive), str(work / "clean")),
                               capture_output=True, text=True, cwd=ROOT)
        assert clean.returncode == 0, clean.stderr
        dest = work / "dest"
        process = _unpack_reaching("d12/f010", packfs_as_user("unpack", "-q", str(archive), str(dest)), dest,
                                   stderr=subprocess.PIPE, text=True)
        try:
            process.send_signal(signal.SIGINT)
            stderr = process.communicate(timeout=time_limit(60))[1]
        finally:
            process.kill()
            process.wait()
        assert process.returncode == 128 + signal.SIGINT, stderr
        assert os.stat(dest).st_mode & 0o7777 == 0o555
        _check_interrupted(dest, work / "clean")
        resumed = subprocess.run(packfs_as_user("unpack", "-q", "--skip-existing", str(archive), str(dest)),
                                 capture_output=True, text=True, cwd=ROOT)
        assert resumed.returncode == 0, resumed.stderr
        assert_same_tree(work / "clean", dest)
    finally:
        for dirpath, dirnames, _ in os.walk(work):
            os.chmod(dirpath, 0o755)
        shutil.rmtree(work)
