"""Mounts as processes: the mount table, the checks made before anything detaches,
mount() and its background daemon, pid and log files, unmount, and mount(8)'s helper."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import logging
import os
import shutil
import shlex
import signal
import stat as stat_module
import subprocess
import sys
import tempfile
import time
import warnings
from types import ModuleType
from typing import Any, Callable

from ..core import Archive, ShardSet, open_archive
from ..errors import MountError
from ..folder import PackedFolder
from ..source import shown_location
from .common import DAEMONS, DEFAULT_BINDING, NAME_CODEC, PYTHON_FALLBACK, log
from .inodedaemon import LOWLEVEL, CompiledView, compiled_view, serve
from .libfuse import LoopRun, current, has_own_main, load_binding
from .checks import (FSNAME_PREFIX, FSTYPE, check_allow_other, check_fuse, check_mountpoint, check_options,
                     fuse_options, is_mounted, mount_entry)
from .pathdaemon import PackfsOperations, fuse_class

__all__ = ["mount", "MountPlan", "plan_mount", "choose_binding", "mount_in_background", "open_for_mount", "unmount", "is_stale", "state_file", "state_directory",
           "remove_old_logs", "mount_helper", "helper_script", "MOUNT_HELPER", "hide_command_line_secrets"]

@dataclasses.dataclass
class MountPlan:
    """A mount with everything decided that can be decided before it serves, once
    (:func:`plan_mount`): the archive opened, the mount point checked, the daemon
    chosen and, for the compiled one, what it serves from.  The CLI makes the plan in
    its own process, so that every mistake fails there before anything detaches; the
    background daemon, forked from it, serves the same plan and checks nothing again."""

    served: Archive | ShardSet
    path: str  # the mount point, absolute
    mountpoint: str  # as the caller named it, for messages
    binding: str  # LOWLEVEL or a Python binding's name
    notice: str | None  # why "auto" fell back to the Python daemon
    compiled: CompiledView | None  # what the compiled daemon serves (binding LOWLEVEL)
    fuse: ModuleType | None  # the Python binding's module (any other binding)
    options: dict[str, Any]  # libfuse's mount options (checks.fuse_options)
    threads: int = 0
    debug: bool = False
    foreground: bool = True  # the Python bindings' own daemonizing (False) is kept for old callers


def plan_mount(
    archive: str | Archive | ShardSet | PackedFolder,
    mountpoint: str,
    *,
    foreground: bool = True,
    debug: bool = False,
    threads: int = 0,
    check_data: bool = True,
    allow_other: bool = False,
    options: dict[str, Any] | None = None,
    binding: str = DEFAULT_BINDING,
) -> MountPlan:
    """The checks made before a mount, each once, and what they decided (see
    :func:`mount` for the arguments).

    Raises
    ------
    FormatError, ChecksumError
        The archive cannot be opened.
    MountError
        FUSE is unavailable, the mount point or an option is unusable, or the daemon
        asked for cannot serve the archive.
    """
    if isinstance(threads, bool):
        threads = 0 if threads else 1
    extra = dict(options or {})
    check_options(extra)
    if allow_other or extra.get("allow_other"):
        check_allow_other()
    fuse = check_fuse(binding)
    path = check_mountpoint(mountpoint, nonempty=bool(extra.get("nonempty")))
    served = open_for_mount(archive, check_data)
    chosen, notice, compiled = _choose(binding, served)
    if chosen != LOWLEVEL:
        if fuse is None:  # "auto" fell back: the device was checked above, the module not yet
            fuse = load_binding(chosen)
        if threads > 1 and not (getattr(fuse, "fuse_version_major", 2) == 3 and has_own_main(fuse)):
            raise MountError(f"a thread limit (threads={threads}) needs libfuse 3.12 or later through "
                             f"the mfusepy binding; libfuse2 always uses up to 10 threads")
    return MountPlan(served, path, mountpoint, chosen, notice, compiled, fuse,
                     fuse_options(served.path, allow_other, extra, chosen), threads, debug, foreground)


def mount(
    archive: str | Archive | ShardSet | PackedFolder | MountPlan,
    mountpoint: str | None = None,
    *,
    foreground: bool = True,
    debug: bool = False,
    threads: int = 0,
    check_data: bool = True,
    allow_other: bool = False,
    options: dict[str, Any] | None = None,
    binding: str = DEFAULT_BINDING,
) -> None:
    """Serve ``archive`` (a path, or an open Archive or PackedFolder that this takes over) at
    ``mountpoint`` until it is unmounted (blocks); or serve a :class:`MountPlan` (whose
    settings were given to :func:`plan_mount`).

    ``threads``: 0 for libfuse's default (at most 10 worker threads), 1 to serve one
    request at a time, N for at most N worker threads (libfuse 3.12 or later).  For
    compatibility True means 0 and False means 1.

    SIGINT, SIGTERM and SIGHUP unmount and return normally (libfuse handles them); an
    ``umount`` of the mount point does too.

    Raises
    ------
    FormatError, ChecksumError
        The archive cannot be opened.
    MountError
        FUSE is unavailable, the mount point or an option is unusable, or serving failed.
    """
    if isinstance(archive, MountPlan):
        plan = archive
    else:
        if mountpoint is None:
            raise TypeError("mount() needs a mountpoint with an archive")
        plan = plan_mount(archive, mountpoint, foreground=foreground, debug=debug, threads=threads, check_data=check_data,
                          allow_other=allow_other, options=options, binding=binding)
        if plan.notice:
            log.warning("%s", plan.notice)
    # How a background daemon's parent learns the mount is up (mount_in_background).
    announce = getattr(current, "announce", lambda _how: None)
    pidfile = state_file(plan.path, ".pid")
    if plan.compiled is not None:
        announce(MOUNT_TABLE_TELLS)  # fuse_session_new checks the options before it mounts
        _serve_compiled(plan.compiled, plan.path, pidfile=pidfile, threads=plan.threads, debug=plan.debug,
                        options=plan.options)
        return
    fuse = plan.fuse
    assert fuse is not None  # a Python binding's module (plan_mount loaded it)
    served = plan.served
    operations = PackfsOperations(served, no_open=True)
    with os.fdopen(_open_state_file(pidfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as f:
        f.write(str(os.getpid()))
    run = current.run = LoopRun(plan.threads)
    if has_own_main(fuse):
        run.serving = lambda: announce(SERVING)
    else:  # libfuse3 before 3.12, whose fuse_main checks the options before it mounts
        announce(MOUNT_TABLE_TELLS)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            fuse_class(fuse)(
                operations, plan.path, foreground=plan.foreground, debug=plan.debug, nothreads=plan.threads == 1,
                encoding=NAME_CODEC, **plan.options,
            )
    except RuntimeError as error:
        reason = run.error or f"failed (libfuse error {error})"
        raise MountError(f"mounting {served.path!r} at {plan.mountpoint!r}: {reason}") from None
    finally:
        current.run = None
        served.close()
        try:
            os.unlink(pidfile)
        except OSError:
            pass
    if run.stop_signal:
        log.debug("unmounted on %s", signal.Signals(run.stop_signal).name)


# What a background daemon writes to its parent (mount_in_background): "serving" once
# set up, or "the mount table tells" where appearing there already means accepted.
SERVING, MOUNT_TABLE_TELLS = b"s", b"t"


def choose_binding(binding: str, archive: Archive | ShardSet) -> tuple[str, str | None]:
    """The daemon that serves ``archive`` for ``--binding binding``, and the one-line
    notice to show when "auto" falls back to the Python daemon.

    Raises
    ------
    MountError
        ``binding`` is "lowlevel" and the compiled daemon cannot serve this archive.
    """
    chosen, notice, _compiled = _choose(binding, archive)
    return chosen, notice


def _choose(binding: str, archive: Archive | ShardSet) -> tuple[str, str | None, CompiledView | None]:
    """choose_binding's answer, and what the compiled daemon serves when it is chosen."""
    if binding not in DAEMONS:
        raise ValueError(f"binding must be one of {', '.join(DAEMONS)}, got {binding!r}")
    if binding not in ("auto", LOWLEVEL):
        return binding, None, None
    view = compiled_view(archive)
    if not isinstance(view, str):
        return LOWLEVEL, None, view
    if binding == LOWLEVEL:
        raise MountError(f"the compiled daemon (--binding {LOWLEVEL}) cannot serve {archive.path!r}: {view}")
    return (PYTHON_FALLBACK, f"serving with the Python daemon ({PYTHON_FALLBACK}), not the compiled one: {view}",
            None)


def _serve_compiled(view: CompiledView, path: str, pidfile: str, threads: int, debug: bool,
                    options: dict[str, Any]) -> None:
    """mount()'s work for the compiled daemon: the pid file, serving, cleaning up."""
    with os.fdopen(_open_state_file(pidfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as f:
        f.write(str(os.getpid()))
    try:
        status = serve(view, path, options, threads=threads, debug=debug)
    finally:
        view.archive.close()
        try:
            os.unlink(pidfile)
        except OSError:
            pass
    if status > 0:
        log.debug("unmounted on %s", signal.Signals(status).name)


def state_directory() -> str:
    """Where daemons keep their pid files and logs: $TMPDIR/packfs-<uid>, which must be
    a real directory of this user's, private to them.

    Raises
    ------
    MountError
        Something else has that name (another user may have made it first, in a shared
        /tmp, with links planted in it for root to write through)."""
    directory = os.path.join(tempfile.gettempdir(), f"packfs-{os.getuid()}")
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise MountError(f"cannot create the state directory {directory!r}: {error.strerror}") from None
    info = os.lstat(directory)
    if (not stat_module.S_ISDIR(info.st_mode) or info.st_uid != os.getuid()
            or stat_module.S_IMODE(info.st_mode) & 0o077):
        raise MountError(
            f"the state directory {directory!r} is not a private directory of this user's "
            f"(expected a directory owned by uid {os.getuid()} with mode 0700): remove it, or "
            f"set TMPDIR to a directory of your own"
        )
    return directory


def _open_state_file(path: str, flags: int) -> int:
    """Open a pid or log file in the state directory without following a symlink."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def state_file(mountpoint: str, suffix: str) -> str:
    """Where the daemon serving ``mountpoint`` keeps its pid (".pid") and log (".log")."""
    name = hashlib.sha256(os.fsencode(os.path.abspath(mountpoint))).hexdigest()[:16]
    return os.path.join(state_directory(), name + suffix)


# Logs of daemons that are gone are removed this long after their last line.
LOG_DAYS = 7


def _running(pidfile: str) -> bool:
    try:
        with open(pidfile) as f:
            os.kill(int(f.read().strip()), 0)
    except (OSError, ValueError):
        return False  # no pid file, unreadable, or no such process
    return True


def remove_old_logs(days: float = LOG_DAYS) -> list[str]:
    """Remove the state directory's logs (and pid files) of daemons no longer running
    whose last line is older than ``days``; return the logs removed.

    The policy for logs: a daemon that ends cleanly removes its log when nothing was
    written to it (see mount_in_background); one with something in it (an error, a
    checksum mismatch) or from a daemon that died stays ``days`` days for a look, and
    the next background mount sweeps it."""
    directory = state_directory()
    cutoff = time.time() - days * 86400
    removed = []
    for name in os.listdir(directory):
        if not name.endswith(".log"):
            continue
        log_path = os.path.join(directory, name)
        pidfile = log_path[: -len(".log")] + ".pid"
        try:
            if os.stat(log_path).st_mtime >= cutoff or _running(pidfile):
                continue
            os.unlink(log_path)
            removed.append(log_path)
            if os.path.exists(pidfile):
                os.unlink(pidfile)
        except OSError:
            continue  # gone meanwhile, or not ours to remove
    return removed


def _wait_for_exit(pid: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            return  # not ours to watch
        time.sleep(0.02)


def hide_command_line_secrets() -> bool:
    """Rewrite this process's command line, as ``/proc/PID/cmdline`` and ``ps`` show it
    to every user of the machine, with each URL argument as :func:`shown_location`
    shows it (no user, password or query string); True if anything changed.

    A mount serves for days: its daemon (forked, so its command line is the ``packfs
    mount`` one) and a foreground mount would show ``http://user:password@host/...``
    all that time.  Only called once the archive is open: what is needed to read it
    is already held.  The arguments' memory is rewritten in place (as setproctitle
    does), at the addresses /proc/self/stat gives; where that cannot be done (no /proc,
    an unusual layout) nothing changes."""
    import ctypes

    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end: fields 48 and 49
        with open("/proc/self/cmdline", "rb") as f:
            current = f.read()
    except (OSError, ValueError, IndexError):
        return False
    if not 0 < end - start == len(current) or not current.endswith(b"\0"):
        return False  # already rewritten by someone else (setproctitle): not ours to touch
    arguments = current[:-1].split(b"\0")
    shown = [os.fsencode(shown_location(os.fsdecode(argument))) for argument in arguments]
    if shown == arguments:
        return False
    text = b"\0".join(shown) + b"\0"
    ctypes.memmove(start, text.ljust(len(current), b"\0"), len(current))
    return True


def open_for_mount(archive: str | Archive | ShardSet | PackedFolder, check_data: bool = True) -> Archive | ShardSet:
    """The Archive a mount serves: a path opened with the "once" checksum policy (each
    file checked at its first read; "never" without ``check_data``), an Archive as it
    is, a PackedFolder's own archive."""
    if isinstance(archive, (Archive, ShardSet)):
        return archive
    if isinstance(archive, PackedFolder):
        opened = archive.archive
    else:
        opened = open_archive(archive, checksums="once" if check_data else "never")
    assert isinstance(opened, (Archive, ShardSet))  # what open_archive opens: one archive, or a set
    return opened


def mount_in_background(plan: MountPlan, log_path: str, timeout: float = 30.0) -> int:
    """Fork a daemon serving ``plan`` (:func:`plan_mount`); return its pid once the mount
    works.  Forking, rather than starting a new interpreter, reuses the imports, the
    already validated archive and every decision the plan holds, so mounting costs no
    second start-up, open or check.

    A daemon that ends cleanly (unmounted, or stopped by SIGTERM/SIGINT/SIGHUP) removes
    its log if it is the default one (state_file) and empty; logs of daemons gone for
    LOG_DAYS days are removed here.

    Raises
    ------
    MountError
        The daemon exited or did not mount within ``timeout`` (its last log line says why).
    """
    path, mountpoint, folder = plan.path, plan.mountpoint, plan.served
    own_log = os.path.abspath(log_path) == state_file(path, ".log")
    remove_old_logs()
    log_flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    # A log file the user named is theirs to point anywhere; ours never follows a link.
    log_fd = (_open_state_file(log_path, log_flags) if os.path.dirname(os.path.abspath(log_path)) == state_directory()
              else os.open(log_path, log_flags | os.O_CLOEXEC, 0o644))
    up_read, up_write = os.pipe()  # the daemon says here how to know it is up
    with os.fdopen(log_fd, "ab") as log_file:
        pid = os.fork()
        if pid == 0:  # the daemon
            status = 1
            try:
                os.close(up_read)
                current.announce = _say_once(up_write)
                os.setsid()
                hide_command_line_secrets()  # the parent's command line, a URL's password in it
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.dup2(log_file.fileno(), 1)
                os.dup2(log_file.fileno(), 2)
                handler = logging.StreamHandler()
                handler.setFormatter(logging.Formatter("%(asctime)s packfs: %(message)s"))
                daemon_log = logging.getLogger("packfs.mount")
                daemon_log.addHandler(handler)
                daemon_log.propagate = False
                mount(plan)
                status = 0
                if own_log and os.fstat(log_file.fileno()).st_size == 0:
                    os.unlink(log_path)  # nothing worth keeping
            except BaseException as error:  # report, never return into the caller's code
                print(f"Error: {error}", file=sys.stderr, flush=True)
            finally:
                os._exit(status)
    folder.close()  # the daemon has its own reference to the map
    os.close(up_write)
    try:
        _wait_until_up(pid, up_read, path, folder, mountpoint, log_path, timeout)
    finally:
        os.close(up_read)
    return pid


def _say_once(fd: int) -> Callable[[bytes], None]:
    """The daemon's one word to its parent, through ``fd``, which it then closes (a second
    word would go to whatever file reused the number); a parent gone is no failure."""
    left = [fd]

    def say(how: bytes) -> None:
        if left:
            try:
                os.write(left[0], how)
            except OSError:
                pass
            os.close(left.pop())

    return say


def _wait_until_up(pid: int, up_read: int, path: str, folder: Archive | ShardSet, mountpoint: str,
                   log_path: str, timeout: float) -> None:
    """Wait for a background daemon to serve, or raise MountError with its reason."""
    os.set_blocking(up_read, False)
    how = b""
    deadline = time.monotonic() + timeout
    while True:
        if not how:
            try:
                how = os.read(up_read, 1)
            except BlockingIOError:
                pass
        if how == SERVING or (how == MOUNT_TABLE_TELLS and is_mounted(path)):
            return
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            lines = open(log_path, "rb").read().decode(errors="replace").strip().splitlines()
            if lines and lines[-1].startswith("Error: "):  # the daemon's own one-line reason
                raise MountError(lines[-1].removeprefix("Error: "))
            reason = lines[-1] if lines else f"exit status {status}"
            raise MountError(f"mounting {folder.path!r} at {mountpoint!r} failed: {reason}")
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            raise MountError(f"mounting {folder.path!r} at {mountpoint!r} timed out (log: {log_path})")
        time.sleep(0.005)


def _check_ours(mountpoint: str) -> None:
    """Raise MountError unless a packfs mount is at ``mountpoint``: unmounting runs as
    whoever asks, root included, and must never take down another file system."""
    entry = mount_entry(mountpoint)
    if entry is None:
        raise MountError(f"{mountpoint!r} is not mounted")
    source, fstype = entry
    if fstype != FSTYPE or not source.startswith(FSNAME_PREFIX):
        raise MountError(f"{mountpoint!r} is a {fstype} mount of {source!r}, not a packfs mount "
                         f"(expected type {FSTYPE}); not unmounting it")


def unmount(mountpoint: str, lazy: bool = False, timeout: float = 10.0) -> None:
    """Unmount a packfs mount and wait until it is gone.

    Raises
    ------
    MountError
        Not mounted, not a packfs mount, busy (use ``lazy``), or the unmount failed.
    """
    path = os.path.abspath(mountpoint)
    _check_ours(path)
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool is not None:
        command = [tool, "-u"] + (["-z"] if lazy else []) + [path]
    else:
        command = ["umount"] + (["-l"] if lazy else []) + [path]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        message = (result.stderr or result.stdout).strip().splitlines()
        text = message[-1] if message else f"exit status {result.returncode}"
        if "busy" in text.lower():
            raise MountError(f"{mountpoint!r} is busy (a process is using it); retry, or use --lazy")
        raise MountError(f"cannot unmount {mountpoint!r}: {text}")
    deadline = time.monotonic() + timeout
    while is_mounted(path):
        if time.monotonic() > deadline:
            raise MountError(f"{mountpoint!r} is still mounted {timeout:.0f} s after unmounting")
        time.sleep(0.02)
    pidfile = state_file(path, ".pid")
    try:
        with open(pidfile) as f:
            pid = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return
    if pid and not lazy:
        _wait_for_exit(pid, deadline)


def is_stale(mountpoint: str) -> bool:
    """True when the mount's daemon is gone ("Transport endpoint is not connected").

    statfs, not stat: the kernel answers stat of the mount's root from its attribute
    cache (CACHE_SECONDS) without asking the daemon, so a dead daemon looked alive once
    anything had looked at the root; statfs always goes to the daemon."""
    if not is_mounted(mountpoint):
        return False
    try:
        os.statvfs(mountpoint)
    except OSError as error:
        return error.errno == errno.ENOTCONN
    return False


# -- mount(8) --------------------------------------------------------------------------------

MOUNT_HELPER = "/sbin/mount.fuse.packfs"

# packfs settings an fstab line can only give as -o options: option -> CLI flag.
_HELPER_SETTINGS = {"threads": "--threads", "binding": "--binding", "log_file": "--log-file"}


def mount_helper(argv: list[str]) -> int:
    """``mount.fuse.packfs SOURCE TARGET [-sfnvrw] [-N NS] [-t TYPE] [-o OPTIONS]``, as
    mount(8) runs it for ``mount -t fuse.packfs`` and fstab lines of that type: a
    background ``packfs mount``.  mount(8)'s flags and options never fail it: -f (fake)
    mounts nothing, -r adds ro, the rest are ignored; -o threads=N, binding=NAME,
    log_file=PATH and nocheck_data set what the packfs mount flags of those names do.

    The fstab line:  /data/train.ffr  /mnt/train  fuse.packfs  ro,allow_other,nofail  0  0
    """
    from ..cli import main  # the command line's parsing, checks and one-line errors

    if len(argv) < 2:
        print("usage: mount.fuse.packfs ARCHIVE MOUNTPOINT [-o OPTIONS]", file=sys.stderr)
        return 1  # mount(8) helpers exit 1 for usage errors too
    source, target, rest = argv[0], argv[1], argv[2:]
    options: list[str] = []
    flags: list[str] = []
    fake = False
    words = iter(rest)
    for word in words:
        if word == "-o":
            options.extend(item for item in next(words, "").split(",") if item)
        elif word in ("-t", "-N"):
            next(words, None)  # the type (ours) or a mount namespace: nothing to do
        elif word.startswith("-") and not word.startswith("--"):
            fake = fake or "f" in word
            if "r" in word:
                options.append("ro")
    if fake:
        return 0
    kept = []
    for item in options:
        key, _, value = item.partition("=")
        if key in _HELPER_SETTINGS and value:
            flags += [_HELPER_SETTINGS[key], value]
        elif key == "nocheck_data":
            flags.append("--no-check-data")
        else:
            kept.append(item)
    arguments = ["mount", source, target, *flags] + (["-o", ",".join(kept)] if kept else [])
    try:
        main.main(arguments, prog_name="mount.fuse.packfs", standalone_mode=True)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else 1
    return 0


def helper_script(python: str | None = None) -> str:
    """The text of MOUNT_HELPER: runs mount_helper with this interpreter (so this
    installation serves the mount, whatever is on root's PATH at boot)."""
    python = python or sys.executable
    # -I: root runs this from any directory (mount -a, a user's home): with -c, Python
    # would import a packfs/ found in the working directory, or on PYTHONPATH, first.
    code = "import sys; from packfs.fuse import mount_helper; sys.exit(mount_helper(sys.argv[1:]))"
    return ("#!/bin/sh\n"
            "# mount(8) runs this for file systems of type fuse.packfs (packfs.fuse.mount_helper).\n"
            f"exec {shlex.quote(python)} -I -c {shlex.quote(code)} \"$@\"\n")
