"""Running mounts as an administrator does: unmount's refusal, stopping by signal,
libfuse's option errors, the thread limit, mount(8) and fstab, allow_other for users,
and the daemons' logs."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from packfs.fuse import MOUNT_HELPER, helper_script, is_mounted, is_stale, remove_old_logs, state_file
from tests.conftest import (REPO, daemon_pid, damaged_copy, force_unmount, mounted, packfs_cli, require_fuse,
                            require_python_as_nobody, wait_until, time_limit)

pytestmark = pytest.mark.fuse

BINDINGS = ["lowlevel", "mfusepy", "fusepy"]


def require_root(why: str) -> None:
    """Skip (a failure under CI, where tests run as root) unless running as root."""
    if os.geteuid() == 0:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI runs as root: {why} needs root")
    pytest.skip(f"{why} needs root")



def _gone(pid: int) -> bool:
    """The process has exited (a zombie of ours counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True



@contextlib.contextmanager
def cleared(*mountpoints: Path):
    """Whatever a test leaves mounted at ``mountpoints`` is unmounted, even on failure."""
    try:
        yield
    finally:
        for mountpoint in mountpoints:
            force_unmount(mountpoint)
            if is_mounted(str(mountpoint)):
                subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


# -- 3. unmount refuses what is not ours ------------------------------------------------------


def test_unmount_refuses_a_tmpfs(tmp_path: Path) -> None:
    require_fuse()
    require_root("mounting a tmpfs")
    target = tmp_path / "tmpfs"
    target.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "packfs-test-tmpfs", str(target)], check=True)
    try:
        (target / "precious").write_text("still here")
        result = packfs_cli("unmount", target)
        assert result.returncode == 1, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
        assert str(target) in lines[0] and "tmpfs" in lines[0] and "fuse.packfs" in lines[0]
        assert "Traceback" not in result.stderr
        assert is_mounted(str(target)) and (target / "precious").read_text() == "still here"
    finally:
        subprocess.run(["umount", str(target)], capture_output=True)
    assert not is_mounted(str(target))


# -- 4. a requested stop is no failure ---------------------------------------------------------


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_foreground_mount_stops_cleanly_on_signal(archive: Path, tmp_path: Path, binding: str,
                                                  sig: int) -> None:
    require_fuse(binding)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    with cleared(mountpoint):
        process = subprocess.Popen([sys.executable, "-m", "packfs", "mount", "-f", "--binding", binding,
                                    str(archive), str(mountpoint)], cwd=REPO, stderr=subprocess.PIPE,
                                   text=True)
        try:
            assert wait_until(lambda: is_mounted(str(mountpoint)) or process.poll() is not None)
            assert (mountpoint / "hello.txt").read_bytes() == b"hello world\n"
            process.send_signal(sig)
            _, stderr = process.communicate(timeout=time_limit(60))
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        assert process.returncode == 0, stderr
        assert "Error" not in stderr and "Ignoring invalid max threads" not in stderr, stderr
        assert not is_mounted(str(mountpoint))


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_background_daemon_stops_cleanly_on_signal(archive: Path, tmp_path: Path, binding: str,
                                                   sig: int) -> None:
    require_fuse(binding)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    log = Path(state_file(str(mountpoint), ".log"))
    with cleared(mountpoint):
        result = packfs_cli("mount", "--binding", binding, archive, mountpoint)
        assert result.returncode == 0, result.stderr
        pid = daemon_pid(mountpoint)
        os.kill(pid, sig)
        assert wait_until(lambda: not is_mounted(str(mountpoint)) and _gone(pid))
    # Only a daemon that ended with status 0 and logged nothing removes its log.
    assert not log.exists(), log.read_text()


# -- 5. options ------------------------------------------------------------------------------


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("foreground", [False, True])
def test_rejected_option_is_one_clear_line(archive: Path, tmp_path: Path, binding: str,
                                           foreground: bool) -> None:
    require_fuse(binding)
    mountpoint = tmp_path / "m"
    mountpoint.mkdir()
    with cleared(mountpoint):
        result = packfs_cli("mount", *(["-f"] if foreground else []), "--binding", binding,
                            "-o", "bogus", archive, mountpoint)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"Error: mounting {str(archive)!r} at {str(mountpoint)!r}: libfuse rejected option -o bogus: "
        f"unknown option"], result.stderr
    assert not is_mounted(str(mountpoint))


def test_libfuse2_mounting_before_it_rejects_an_option_is_not_success(archive: Path, tmp_path: Path) -> None:
    """libfuse2's fuse_setup mounts, then rejects an unknown option and unmounts: a parent
    that took "in the mount table" for "up" said "mounted" with exit 0 for a daemon that
    was already failing (3 times in 40 here).  The daemon now says when it serves."""
    require_fuse("fusepy")
    mountpoint = tmp_path / "m"
    mountpoint.mkdir()
    with cleared(mountpoint):
        outcomes = [packfs_cli("mount", "--binding", "fusepy", "-o", "bogus", archive, mountpoint).returncode
                    for _ in range(30)]
    assert outcomes == [1] * 30


@pytest.mark.parametrize("binding", BINDINGS)
def test_option_with_a_bad_value_is_one_line(archive: Path, tmp_path: Path, binding: str) -> None:
    require_fuse(binding)
    mountpoint = tmp_path / "m"
    mountpoint.mkdir()
    with cleared(mountpoint):
        result = packfs_cli("mount", "--binding", binding, "-o", "uid=abc", archive, mountpoint)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    # packfs checks the owner options itself, before any daemon: libfuse's high-level
    # API parsed uid= with %d and showed uid=-5 as 4294967291.
    assert lines == [f"Error: -o uid=abc: expected a number from 0 to {2**32 - 2}"], result.stderr


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("foreground", [False, True])
def test_owner_and_mode_options_are_checked_before_mounting(archive: Path, tmp_path: Path, binding: str,
                                                           foreground: bool) -> None:
    """Issue 23: `packfs mount -f -o uid=-5` printed a traceback (the compiled daemon's
    check), and the Python daemon mounted with uid 4294967291."""
    require_fuse(binding)
    mountpoint = tmp_path / "m"
    mountpoint.mkdir()
    largest = 2**32 - 2
    for option, said in (("uid=-5", f"expected a number from 0 to {largest}"),
                         ("gid=4294967295", f"expected a number from 0 to {largest}"),
                         ("uid", f"expected a number from 0 to {largest}"),
                         ("umask=999", "expected an octal mode from 0 to 7777"),
                         ("umask=10000", "expected an octal mode from 0 to 7777")):
        with cleared(mountpoint):
            result = packfs_cli("mount", *(["-f"] if foreground else []), "--binding", binding, "-o", option,
                                archive, mountpoint)
        assert result.returncode == 1 and result.stderr.splitlines() == [f"Error: -o {option}: {said}"], (
            option, result.stderr)
        assert not is_mounted(str(mountpoint))
    # (umask=0177 leaves hello.txt's 0600 whether a daemon masks the stored bits, as the
    # compiled one does, or sets the bits to 0777 & ~umask, as libfuse's high-level API does.)
    with mounted(archive, mountpoint, "-o", f"uid={largest},gid=0,umask=0177", binding=binding) as root:
        shown = os.stat(root / "hello.txt")
        assert (shown.st_uid, shown.st_gid, shown.st_mode & 0o777) == (largest, 0, 0o600)


@pytest.mark.parametrize("binding", BINDINGS)
def test_mounts_are_nosuid_and_nodev_whatever_the_options(archive: Path, tmp_path: Path, binding: str) -> None:
    """Issue 23: -o suid,dev took away the nosuid and nodev libfuse mounts with (as root),
    silently.  An archive from elsewhere must not give its programs another user's power
    through setuid bits, and holds no device nodes; suid and dev are mount(8)'s defaults
    (fuse3's mount.fuse3 adds them), so they are accepted and dropped, as rw is."""
    require_fuse(binding)
    for option in ("suid", "dev", "suid,dev,exec", "nosuid,nodev"):
        with mounted(archive, tmp_path / "m", "-o", option, binding=binding) as root:
            flags = os.statvfs(root).f_flag
            assert flags & os.ST_NOSUID and flags & os.ST_NODEV and flags & os.ST_RDONLY, option
            assert (root / "hello.txt").read_bytes() == b"hello world\n"
    with mounted(archive, tmp_path / "m", binding=binding) as root:
        assert os.statvfs(root).f_flag & os.ST_NOSUID and os.statvfs(root).f_flag & os.ST_NODEV


@pytest.mark.parametrize("binding", BINDINGS)
def test_nonempty_is_packfs_own_check(archive: Path, tmp_path: Path, binding: str) -> None:
    """A non-empty mount point needs -o nonempty with either binding (libfuse3 has no such
    option: packfs consumes it), and the hint names what works."""
    require_fuse(binding)
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    refused = packfs_cli("mount", "--binding", binding, archive, full)
    assert refused.returncode == 1 and "-o nonempty" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    with mounted(archive, full, "-o", "nonempty", binding=binding) as root:
        assert (root / "hello.txt").read_bytes() == b"hello world\n"
        assert not (root / "x").exists()
    assert (full / "x").read_text() == "x"


def test_mount8_options_are_accepted(archive: Path, tmp_path: Path) -> None:
    """What mount(8) and fstab pass never fails a mount; rw never makes it writable."""
    with mounted(archive, tmp_path / "m", "-o", "defaults,rw,dev,suid,exec,noatime,nofail,_netdev,"
                 "x-systemd.automount,relatime,auto") as root:
        assert (root / "hello.txt").read_bytes() == b"hello world\n"
        assert os.statvfs(root).f_flag & os.ST_RDONLY
        assert os.statvfs(root).f_flag & os.ST_NOSUID and os.statvfs(root).f_flag & os.ST_NODEV


# -- 11. threads --------------------------------------------------------------------------------


def _statfs_load(root: Path, stop: Path) -> subprocess.Popen:
    """A process calling statfs on the mount until ``stop`` exists: statfs always reaches
    the daemon (nothing caches it), so several of these keep its workers busy."""
    code = ("import os, sys\n"
            "root, stop = sys.argv[1], sys.argv[2]\n"
            "while not os.path.exists(stop):\n"
            "    for _ in range(200): os.statvfs(root)\n")
    return subprocess.Popen([sys.executable, "-c", code, str(root), str(stop)])


def _threads_under_load(root: Path, stop: Path, enough) -> list[int]:
    """The daemon's thread counts, sampled while 8 processes load it, until ``enough``
    says so (or 20 s)."""
    pid = daemon_pid(root)
    loaders = [_statfs_load(root, stop) for _ in range(8)]
    counts: list[int] = []
    try:
        wait_until(lambda: counts.append(len(os.listdir(f"/proc/{pid}/task"))) or enough(counts))
    finally:
        stop.touch()
        for loader in loaders:
            loader.wait(time_limit(60))
    return counts


def test_threads_limit_the_daemons_workers(archive: Path, tmp_path: Path) -> None:
    with mounted(archive, tmp_path / "m2", "--threads", "2") as root:
        counts = _threads_under_load(root, tmp_path / "stop2", lambda c: len(c) > 40)
        log = Path(state_file(str(root), ".log"))
        assert not log.exists() or "Ignoring invalid max threads" not in log.read_text()
    assert max(counts) <= 3, counts  # the main thread and at most 2 workers
    with mounted(archive, tmp_path / "m6", "--threads", "6") as root:
        counts = _threads_under_load(root, tmp_path / "stop6", lambda c: c[-1] > 3)
    assert 3 < max(counts) <= 7, counts
    with mounted(archive, tmp_path / "m1", "--threads", "1") as root:
        counts = _threads_under_load(root, tmp_path / "stop1", lambda c: len(c) > 40)
    assert max(counts) == 1, counts


def test_threads_need_libfuse3(archive: Path, tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    result = packfs_cli("mount", "--binding", "fusepy", "--threads", "4", archive, tmp_path / "m")
    assert result.returncode == 2 and "--binding mfusepy" in result.stderr


# -- 13. mount(8), fstab, umount(8) --------------------------------------------------------------


@pytest.fixture
def mount_helper_installed():
    """/sbin/mount.fuse.packfs running this checkout while the test runs (what `make
    install-mount-helper` installs); whatever was there before is put back."""
    require_fuse()
    require_root("installing /sbin/mount.fuse.packfs")
    helper = Path(MOUNT_HELPER)
    before = helper.read_bytes() if helper.exists() else None
    helper.write_text(helper_script())
    helper.chmod(0o755)
    try:
        yield helper
    finally:
        if before is None:
            helper.unlink()
        else:
            helper.write_bytes(before)


def _world_readable_archive(archive: Path) -> Path:
    """A copy of ``archive`` outside pytest's 0700 directories (for mount(8) and nobody)."""
    directory = Path(tempfile.mkdtemp(prefix="packfs-test-"))
    directory.chmod(0o755)
    copy = directory / "tree.ffr"
    shutil.copyfile(archive, copy)
    copy.chmod(0o644)
    return copy


def test_mount_t_fuse_packfs_and_umount(archive: Path, tmp_path: Path, mount_helper_installed) -> None:
    mountpoint = tmp_path / "m"
    mountpoint.mkdir()
    with cleared(mountpoint):
        result = subprocess.run(["mount", "-t", "fuse.packfs", "-o", "ro,noatime,threads=3", str(archive),
                                 str(mountpoint)], capture_output=True, text=True, timeout=time_limit(60))
        assert result.returncode == 0, result.stderr
        assert (mountpoint / "hello.txt").read_bytes() == b"hello world\n"
        source, point, fstype = next(line.split()[:3] for line in Path("/proc/self/mounts").read_text().splitlines()
                                     if line.split()[1] == str(mountpoint))
        assert (source, fstype) == (f"packfs:{archive}", "fuse.packfs")
        pid = daemon_pid(mountpoint)
        result = subprocess.run(["umount", str(mountpoint)], capture_output=True, text=True, timeout=time_limit(60))
        assert result.returncode == 0, result.stderr
        assert not is_mounted(str(mountpoint))
        assert wait_until(lambda: _gone(pid))  # the daemon exits once the kernel drops the mount


def test_fstab_line_mounts(archive: Path, tmp_path: Path, mount_helper_installed) -> None:
    """The documented fstab line, from a file of its own (the real /etc/fstab is never
    touched), with the options fstab users write."""
    mountpoint = tmp_path / "m"
    mountpoint.mkdir()
    fstab = tmp_path / "fstab"
    fstab.write_text(f"# packfs\n{archive}  {mountpoint}  fuse.packfs  "
                     f"defaults,ro,allow_other,nofail,_netdev,x-systemd.automount,noatime  0  0\n")
    with cleared(mountpoint):
        result = subprocess.run(["mount", "-T", str(fstab), str(mountpoint)], capture_output=True, text=True,
                                timeout=time_limit(60))
        assert result.returncode == 0, result.stderr
        assert (mountpoint / "a/b/c/deep.bin").stat().st_size == 768
        pid = daemon_pid(mountpoint)
        assert subprocess.run(["umount", str(mountpoint)], capture_output=True).returncode == 0
        assert wait_until(lambda: _gone(pid))
        # Also unmountable the packfs way, mounted with --fstab.
        result = subprocess.run(["mount", "--fstab", str(fstab), str(mountpoint)], capture_output=True,
                                text=True, timeout=time_limit(60))
        assert result.returncode == 0, result.stderr
        assert packfs_cli("unmount", mountpoint).returncode == 0


def test_mount_t_fuse_packfs_through_fuse3s_mount_helper(archive: Path, tmp_path: Path) -> None:
    """Without mount.fuse.packfs, mount(8) runs fuse3's mount.fuse3, which runs
    "packfs ARCHIVE DIR -o OPTIONS": packfs must take that form (it once said "No such
    command").  mount(8) resets PATH to the system directories, so packfs is linked
    into /usr/local/bin for the test, where a system-wide pip install puts it."""
    require_fuse()
    require_root("mount(8) and /usr/local/bin")
    helper = Path(MOUNT_HELPER)
    moved = helper.with_name(helper.name + ".moved-by-test")
    if helper.exists():
        helper.rename(moved)
    command = Path("/usr/local/bin/packfs")
    command_before = command.with_name("packfs.moved-by-test")
    if command.exists() or command.is_symlink():
        command.rename(command_before)
    command.symlink_to(Path(sys.executable).parent / "packfs")
    mountpoint = tmp_path / "m"
    mountpoint.mkdir()
    try:
        with cleared(mountpoint):
            result = subprocess.run(["mount", "-t", "fuse.packfs", "-o", "ro,noatime", str(archive), str(mountpoint)],
                                    capture_output=True, text=True, timeout=time_limit(60))
            assert result.returncode == 0, result.stderr
            assert (mountpoint / "hello.txt").read_bytes() == b"hello world\n"
            # mount.fuse3 adds dev and suid to what it runs; the mount stays nosuid, nodev.
            flags = os.statvfs(mountpoint).f_flag
            assert flags & os.ST_NOSUID and flags & os.ST_NODEV
            pid = daemon_pid(mountpoint)
            assert subprocess.run(["umount", str(mountpoint)], capture_output=True).returncode == 0
            assert wait_until(lambda: _gone(pid))
    finally:
        command.unlink()
        if command_before.exists() or command_before.is_symlink():
            command_before.rename(command)
        if moved.exists():
            moved.rename(helper)


def test_mount_helper_fake_mount_mounts_nothing(archive: Path, tmp_path: Path, mount_helper_installed) -> None:
    (tmp_path / "m").mkdir()
    result = subprocess.run(["mount", "-f", "-t", "fuse.packfs", str(archive), str(tmp_path / "m")],
                            capture_output=True, text=True, timeout=time_limit(60))
    assert result.returncode == 0, result.stderr
    assert not is_mounted(str(tmp_path / "m"))


# -- 14. allow_other for users --------------------------------------------------------------------


def _as_nobody(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *command],
                          capture_output=True, text=True, cwd="/", timeout=time_limit(60))


def test_allow_other_without_user_allow_other(archive: Path, tmp_path: Path) -> None:
    require_fuse()
    require_root("running the command line as user nobody")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    require_python_as_nobody()
    copy = _world_readable_archive(archive)
    mountpoint = copy.parent / "m"
    mountpoint.mkdir()
    os.chown(mountpoint, 65534, 65534)
    with cleared(mountpoint), _removed_after(copy.parent):
        result = _as_nobody(sys.executable, "-m", "packfs", "mount", "--allow-other", str(copy), str(mountpoint))
        assert result.returncode == 1, result.stderr
        assert result.stderr.strip().splitlines() == [
            "Error: --allow-other (-o allow_other) needs a line 'user_allow_other' in /etc/fuse.conf "
            "for users other than root (ask root to add it)"], result.stderr
        assert not is_mounted(str(mountpoint))
        # The check reads fuse.conf as fusermount does: an uncommented line of its own.
        conf = copy.parent / "fuse.conf"
        check = "import sys; from packfs.fuse import check_allow_other; check_allow_other(sys.argv[1])"
        for text, allowed in [("#user_allow_other\n", False), ("mount_max = 10\n", False),
                              ("  user_allow_other  # users may\n", True)]:
            conf.write_text(text)
            conf.chmod(0o644)
            done = _as_nobody(sys.executable, "-c", check, str(conf))
            assert (done.returncode == 0) == allowed, (text, done.stderr)


@contextlib.contextmanager
def _removed_after(directory: Path) -> Iterator[None]:
    try:
        yield
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- 18. logs, stale mounts, help -----------------------------------------------------------------


def test_old_logs_of_gone_daemons_are_removed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    directory = Path(state_file("/x", ".log")).parent
    old = time.time() - 8 * 86400
    dead = subprocess.Popen(["true"])
    dead.wait()
    cases = {"dead": (dead.pid, old), "no-pid": (None, old), "running": (os.getpid(), old),
             "recent": (None, time.time())}
    for name, (pid, mtime) in cases.items():
        log = directory / f"{name}.log"
        log.write_text("an error worth a look\n")
        os.utime(log, (mtime, mtime))
        if pid is not None:
            (directory / f"{name}.pid").write_text(str(pid))
    removed = sorted(Path(path).name for path in remove_old_logs())
    assert removed == ["dead.log", "no-pid.log"]
    assert sorted(p.name for p in directory.iterdir()) == ["recent.log", "running.log", "running.pid"]


def test_daemon_log_kept_only_when_it_says_something(archive: Path, tmp_path: Path) -> None:
    clean_log = Path(state_file(str(tmp_path / "clean"), ".log"))
    with mounted(archive, tmp_path / "clean") as root:
        assert (root / "hello.txt").read_bytes() == b"hello world\n"
        assert clean_log.exists() and clean_log.read_text() == ""
    assert wait_until(lambda: not clean_log.exists())
    bad = damaged_copy(archive, tmp_path / "bad.ffr", b"Zeta.txt")
    bad_log = Path(state_file(str(tmp_path / "bad"), ".log"))
    with mounted(bad, tmp_path / "bad") as root:
        with pytest.raises(OSError):
            (root / "Zeta.txt").read_bytes()
    assert "checksum mismatch" in bad_log.read_text()  # kept for a look
    bad_log.unlink()


def test_stale_mount_is_reported_after_root_was_looked_at(archive: Path, tmp_path: Path) -> None:
    """The kernel answers stat of the root from its cache after the daemon died; unmount
    must still see the mount is stale and say it cleared it."""
    require_fuse()
    mountpoint = tmp_path / "m"
    mountpoint.mkdir()
    with cleared(mountpoint):
        assert packfs_cli("mount", archive, mountpoint).returncode == 0
        os.stat(mountpoint)
        os.listdir(mountpoint)
        pid = daemon_pid(mountpoint)
        os.kill(pid, signal.SIGKILL)
        # The connection drops when the daemon's last thread has exited (after the
        # process already shows as a zombie).
        assert wait_until(lambda: is_stale(str(mountpoint)))
        os.stat(mountpoint)  # still answered from the kernel's cache: stat cannot tell
        result = packfs_cli("unmount", mountpoint)
        assert result.returncode == 0, result.stderr
        assert result.stderr.strip() == f"cleared stale mount {str(mountpoint)!r} (its daemon had died)"
        assert not is_mounted(str(mountpoint))


def test_mount_help_says_when_the_checksum_is_checked() -> None:
    text = " ".join(packfs_cli("mount", "--help").stdout.split())
    assert "at its first read" in text and "first open" not in text


# -- a daemon unmounts only its own mount ---------------------------------------------------------


@pytest.mark.parametrize("binding", ["lowlevel", "mfusepy"])
def test_a_daemon_stopped_after_a_lazy_unmount_leaves_the_next_mount_there_alone(
        archive: Path, tmp_path: Path, binding: str) -> None:
    """Issue 34: libfuse, run by root, ends a stopped daemon by detaching whatever is
    mounted at its mount point.  A daemon lazily unmounted while a file was open (so
    still serving it) and then stopped took down the next mount made there, another
    daemon's, in use by other readers; now it unmounts only its own."""
    require_fuse(binding)
    mountpoint = tmp_path / "m"
    mountpoint.mkdir()
    with cleared(mountpoint):
        assert packfs_cli("mount", "--binding", binding, archive, mountpoint).returncode == 0
        first = daemon_pid(mountpoint)
        held = open(mountpoint / "hello.txt", "rb")
        try:
            assert packfs_cli("unmount", "--lazy", mountpoint).returncode == 0
            result = packfs_cli("mount", "--binding", binding, archive, mountpoint)
            assert result.returncode == 0, result.stderr
            second = daemon_pid(mountpoint)
            assert second != first and not _gone(first)
            os.kill(first, signal.SIGTERM)
            assert wait_until(lambda: _gone(first))
        finally:
            held.close()
        assert is_mounted(str(mountpoint)), "the second daemon's mount was taken down by the first daemon"
        assert (mountpoint / "hello.txt").read_bytes() == b"hello world\n"
        assert not _gone(second)
        assert packfs_cli("unmount", mountpoint).returncode == 0
