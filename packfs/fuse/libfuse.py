"""Running libfuse: fuse_main's steps, done by packfs (a requested stop told from a
failure, libfuse's own error messages kept, the loop's thread limit set)."""

from __future__ import annotations

import ctypes.util
import os
import signal
import re
import sys
import tempfile
import threading
import warnings
from types import ModuleType
from typing import Any, Callable

from ..errors import (
    MountError,
)

from .common import BINDINGS

#
# Both bindings end in libfuse's fuse_main, which hides three things packfs must know:
# why mounting failed (it prints the reason to stderr and returns a bare number, the
# daemon's log holding the only copy), whether the loop ended by a requested stop
# (libfuse3 turns SIGINT/SIGTERM into the same error 8 as a failure), and, on libfuse3,
# it cannot take a thread limit (3.14 never sets max_threads, and passes UINT_MAX as
# max_idle_threads, which logs "Ignoring invalid max threads value 4294967295").
# So packfs runs fuse_main's few steps itself, through the same public libfuse calls, in
# place of the binding's fuse_main_real; everything else stays the binding's.


def load_binding(binding: str) -> ModuleType:
    """Import a FUSE binding; a missing package or libfuse is a MountError."""
    if binding not in BINDINGS:
        raise ValueError(f"binding must be one of {sorted(BINDINGS)}, got {binding!r}")
    if binding == "mfusepy" and "FUSE_LIBRARY_NAME" not in os.environ and ctypes.util.find_library("fuse3"):
        # mfusepy loads libfuse2 when both are installed; libfuse3 is the reason to use it.
        os.environ["FUSE_LIBRARY_NAME"] = "fuse3"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = __import__(BINDINGS[binding])
    except ImportError:
        raise MountError(
            f"the FUSE binding {binding!r} is not installed (pip install {binding})"
        ) from None
    except OSError as error:  # fusepy/mfusepy raise this when libfuse cannot be found
        raise MountError(
            f"libfuse is not available for {binding!r} ({error}); install fuse3 and libfuse2"
        ) from None
    _install_main(module)
    return module


class _FuseArgs(ctypes.Structure):
    _fields_ = [("argc", ctypes.c_int), ("argv", ctypes.POINTER(ctypes.c_char_p)), ("allocated", ctypes.c_int)]


class LoopRun:
    """One mount's request to the loop and how it ended (read back by mount())."""

    def __init__(self, threads: int) -> None:
        self.threads = threads  # 0: libfuse's default; 1 never gets here (the binding's -s)
        self.error: str | None = None  # why mounting or serving failed, in libfuse's words
        self.stop_signal = 0  # the signal that ended a requested stop
        # Called once the mount is set up and about to serve: libfuse2 mounts before it
        # checks the options, so "in the mount table" does not yet mean "accepted".
        self.serving: Callable[[], None] = lambda: None


# The LoopRun of the mount in progress on this thread: the bindings call fuse_main_real
# with a fixed signature, so the settings travel beside the call.
current = threading.local()

_STOP_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)  # libfuse's exit_handler


class CapturedStderr:
    """Send fd 2 (where libfuse and fusermount write) to a file while setting up.

    fd 2 belongs to the process: one capture at a time (mounts set up in several
    threads take turns), and what other threads write meanwhile is captured too, then
    replayed, or part of the reason for a failure."""

    text = ""
    _one_at_a_time = threading.Lock()

    def __enter__(self) -> CapturedStderr:
        self._one_at_a_time.acquire()
        sys.stderr.flush()
        self._file = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *_: Any) -> None:
        try:
            os.dup2(self._saved, 2)
            os.close(self._saved)
            self._file.seek(0)
            self.text = self._file.read().decode(errors="replace")
            self._file.close()
        finally:
            self._one_at_a_time.release()

    def replay(self) -> None:
        """Show what was said after all (debug output, warnings) where it would have gone."""
        if self.text:
            os.write(2, self.text.encode())

    def reason(self) -> str:
        """libfuse's message as one line, without its "fuse: " prefixes."""
        lines = [line.strip().removeprefix("fuse: ") for line in self.text.splitlines() if line.strip()]
        return "; ".join(lines)


def options_error(said: CapturedStderr) -> str:
    """What libfuse said about a rejected option, as one line naming the option."""
    # libfuse3: "fuse: unknown option(s): `-o bogus'"; libfuse2: "fuse: unknown option `bogus'"
    unknown = re.search(r"unknown option(?:\(s\))?:? `([^']*)'", said.text)
    if unknown:
        option = unknown.group(1)
        option = option if option.startswith("-") else f"-o {option}"
        return f"libfuse rejected option {option}: unknown option"
    return f"libfuse rejected the options: {said.reason() or 'no reason given'}"


def _loop_outcome(run: LoopRun, result: int) -> int:
    """0 for an unmount or a requested stop, else a failure (with run.error set)."""
    if result in _STOP_SIGNALS:  # libfuse3 >= 3.12 returns the signal that stopped it
        run.stop_signal = result
        return 0
    if result:
        reason = os.strerror(-result) if result < 0 else f"error {result}"
        run.error = f"serving failed: libfuse's loop ended with {reason}"
        return 8
    return 0


def mount_device(path: bytes | str) -> str | None:
    """The device ("major:minor") of the topmost mount at ``path`` (/proc/self/mountinfo,
    whose later lines are later mounts), or None: how a daemon tells its own mount from
    one made over it, or at its mount point after its own was detached."""
    target = os.fsencode(path)
    found = None
    try:
        with open("/proc/self/mountinfo", "rb") as lines:
            for line in lines:
                fields = line.split(b" ", 5)
                if len(fields) > 5 and _unescape_mount_field(fields[4]) == target:
                    found = fields[2].decode()
    except OSError:
        return None
    return found


def _unescape_mount_field(field: bytes) -> bytes:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    return re.sub(rb"\\([0-3][0-7][0-7])", lambda m: bytes([int(m.group(1), 8)]), field)


def _libfuse3_main(lib: ctypes.CDLL, run: LoopRun, argv: list[bytes], operations: Any, size: int) -> int:
    """fuse_main_real of libfuse 3.14 (lib/helper.c), step by step, with the loop's
    thread limit set and each failure's reason kept."""
    # The bindings pass: name, [-f] [-d] [-s], -o OPTIONS, MOUNTPOINT.
    foreground, debug, single = (flag in argv for flag in (b"-f", b"-d", b"-s"))
    options, mountpoint = argv[argv.index(b"-o") + 1], argv[-1]
    # The loop's own options, which fuse_main's command-line parsing takes out before
    # fuse_new (which would call them unknown): applied to the loop's config below.
    loop_options: dict[bytes, bytes] = {}
    rest = []
    for item in options.split(b","):
        key, _, value = item.partition(b"=")
        if key in (b"clone_fd", b"max_idle_threads", b"max_threads"):
            loop_options[key] = value
        else:
            rest.append(item)
    options = b",".join(rest)
    try:
        idle = int(loop_options[b"max_idle_threads"]) if b"max_idle_threads" in loop_options else None
        most = int(loop_options[b"max_threads"]) if b"max_threads" in loop_options else run.threads
    except ValueError:
        run.error = "libfuse rejected the options: max_threads and max_idle_threads take a number"
        return 3
    kept = [argv[0], b"-o", options] + ([b"-d"] if debug else [])
    args = _FuseArgs(len(kept), (ctypes.c_char_p * len(kept))(*kept), 0)
    with CapturedStderr() as said:
        fuse = lib.fuse_new(ctypes.byref(args), operations, size, None)
    try:
        if not fuse:
            run.error = options_error(said)
            return 3
        said.replay()
        resolved = os.path.realpath(mountpoint)  # before mounting: after, it would ask this daemon
        with CapturedStderr() as said:
            failed = lib.fuse_mount(fuse, mountpoint)
        if failed:
            run.error = said.reason() or "libfuse could not mount (no reason given)"
            return 4
        said.replay()
        device = mount_device(resolved)
        try:
            if lib.fuse_daemonize(int(foreground)):
                run.error = "libfuse could not daemonize"
                return 5
            session = lib.fuse_get_session(fuse)
            if lib.fuse_set_signal_handlers(session):
                run.error = "libfuse could not set its signal handlers"
                return 6
            run.serving()
            try:
                if single:
                    result = lib.fuse_loop(fuse)
                else:
                    config = lib.fuse_loop_cfg_create()
                    try:
                        # max_idle_threads keeps the config's default (-1: idle workers
                        # stay), which is what fuse_main means by UINT_MAX.
                        if most:
                            lib.fuse_loop_cfg_set_max_threads(config, most)
                        if idle is not None:
                            lib.fuse_loop_cfg_set_idle_threads(config, idle)
                        if b"clone_fd" in loop_options:
                            lib.fuse_loop_cfg_set_clone_fd(config, 1)
                        result = lib.fuse_loop_mt(fuse, config)
                    finally:
                        lib.fuse_loop_cfg_destroy(config)
            finally:
                lib.fuse_remove_signal_handlers(session)
            return _loop_outcome(run, result)
        finally:
            # Only our own mount: libfuse, run by root, detaches whatever is mounted there
            # (the compiled daemon's end_session says when that took another's down).
            if device is None or mount_device(resolved) == device:
                lib.fuse_unmount(fuse)
    finally:
        if fuse:
            lib.fuse_destroy(fuse)
        lib.fuse_opt_free_args(ctypes.byref(args))


def _libfuse2_main(lib: ctypes.CDLL, run: LoopRun, argv: list[bytes], operations: Any, size: int) -> int:
    """fuse_main_real of libfuse 2.9: fuse_setup (parse, mount, signals), loop, teardown."""
    mountpoint, multithreaded = ctypes.c_char_p(), ctypes.c_int()
    with CapturedStderr() as said:
        fuse = lib.fuse_setup(len(argv), (ctypes.c_char_p * len(argv))(*argv), operations, size,
                              ctypes.byref(mountpoint), ctypes.byref(multithreaded), None)
    if not fuse:
        # fuse_setup parses and mounts in one call: name the options only when they were it.
        run.error = options_error(said) if "option" in said.text else (
            said.reason() or "libfuse could not mount (no reason given)")
        return 1
    said.replay()
    run.serving()
    try:
        result = lib.fuse_loop_mt(fuse) if multithreaded.value else lib.fuse_loop(fuse)
    finally:
        lib.fuse_teardown(fuse, mountpoint)  # also removes the signal handlers and unmounts
    return _loop_outcome(run, result)  # libfuse2 returns 0 after a signal


_P, _INT, _UINT = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
# name: (restype, argtypes) of the libfuse calls above; pointers must not pass as C int.
_LIBFUSE3_CALLS = {
    "fuse_new": (_P, [_P, _P, ctypes.c_size_t, _P]), "fuse_mount": (_INT, [_P, ctypes.c_char_p]),
    "fuse_daemonize": (_INT, [_INT]), "fuse_get_session": (_P, [_P]),
    "fuse_set_signal_handlers": (_INT, [_P]), "fuse_remove_signal_handlers": (None, [_P]),
    "fuse_loop": (_INT, [_P]), "fuse_loop_mt": (_INT, [_P, _P]), "fuse_loop_cfg_create": (_P, []),
    "fuse_loop_cfg_set_max_threads": (None, [_P, _UINT]), "fuse_loop_cfg_destroy": (None, [_P]),
    "fuse_loop_cfg_set_idle_threads": (None, [_P, _UINT]), "fuse_loop_cfg_set_clone_fd": (None, [_P, _UINT]),
    "fuse_unmount": (None, [_P]), "fuse_destroy": (None, [_P]), "fuse_opt_free_args": (None, [_P]),
}
_LIBFUSE2_CALLS = {
    "fuse_setup": (_P, [_INT, _P, _P, ctypes.c_size_t, _P, _P, _P]), "fuse_loop": (_INT, [_P]),
    "fuse_loop_mt": (_INT, [_P]), "fuse_teardown": (None, [_P, ctypes.c_char_p]),
}


class _LibraryWith:
    """A CDLL with some functions replaced (fusepy looks fuse_main_real up on its CDLL)."""

    def __init__(self, library: ctypes.CDLL, **replaced: Any) -> None:
        self._library = library
        self.__dict__.update(replaced)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._library, name)


def has_own_main(binding: ModuleType) -> bool:
    """Whether mounts through ``binding`` run packfs's own fuse_main (libfuse 3.12 or
    later, or libfuse2): what thread limits and telling a signal from a failure need."""
    return bool(getattr(binding, "_packfs_main", False))


def _install_main(binding: ModuleType) -> None:
    """Route the binding's fuse_main_real to packfs' own for the mounts mount() makes
    (which set current.run); any other caller still gets libfuse's."""
    if hasattr(binding, "_packfs_main"):
        return
    # The binding's module is patched (setattr: its attributes are not declared for the
    # type checker, and this is the one place they are set).
    setattr(binding, "_packfs_main", False)  # packfs' main is not in use (libfuse lacks a call)
    shared = getattr(binding, "_libfuse")
    major = getattr(binding, "fuse_version_major", 2)
    ours, calls = (_libfuse3_main, _LIBFUSE3_CALLS) if major == 3 else (_libfuse2_main, _LIBFUSE2_CALLS)
    lib = ctypes.CDLL(shared._name)  # its own function objects: these types stay here
    if not all(hasattr(lib, name) for name in calls):  # e.g. libfuse3 before 3.12
        return
    for name, (restype, argtypes) in calls.items():
        getattr(lib, name).restype, getattr(lib, name).argtypes = restype, argtypes
    original = shared.fuse_main_real

    def fuse_main_real(argc: int, argv: Any, operations: Any, size: int, user_data: Any) -> int:
        run = getattr(current, "run", None)
        if run is None:
            return original(argc, argv, operations, size, user_data)
        return ours(lib, run, [argv[i] for i in range(argc)], operations, size)

    if major == 3 or hasattr(binding, "fuse_main_real"):  # mfusepy calls its module's name
        setattr(binding, "fuse_main_real", fuse_main_real)
    else:  # fusepy calls _libfuse.fuse_main_real
        setattr(binding, "_libfuse", _LibraryWith(shared, fuse_main_real=fuse_main_real))
    setattr(binding, "_packfs_main", True)

