"""The FUSE file system: a thin translation of FUSE callbacks onto PackedFolder.

This is the only module that imports a FUSE binding, and it does so lazily, because
fusepy raises OSError at import when libfuse is missing and ``packfs ls`` must work
without it.
"""

from __future__ import annotations

import codecs
import ctypes.util
import errno
import functools
import hashlib
import logging
import os
import shutil
import shlex
import signal
import stat as stat_module
import re
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from types import ModuleType
from typing import Any, Callable, TypeVar

from .errors import (
    ArchiveChangedError,
    ChecksumError,
    MountError,
    NotADirectoryPathError,
    NotAFileError,
    PackfsError,
    PathNotFoundError,
)
from .format import crc32
from .pathtable import S_IFDIR, S_IFLNK, S_IFMT, S_IFREG
from .reader import PackedFolder

__all__ = ["PackfsOperations", "mount", "mount_in_background", "unmount", "check_mountpoint", "check_fuse",
           "check_allow_other", "is_stale", "remove_old_logs", "mount_helper", "BINDINGS"]

log = logging.getLogger("packfs.mount")

# fusepy (libfuse2) is the binding users asked for; mfusepy is its API-compatible,
# maintained successor on libfuse3.  mfusepy is the default because libfuse3's no-open
# support takes warm reads out of Python (bench/mount_compare.py; README, "Mounting").
BINDINGS = {"fusepy": "fuse", "mfusepy": "mfusepy"}
DEFAULT_BINDING = "mfusepy"

# The archive never changes while mounted, so the kernel may cache everything for long.
CACHE_SECONDS = 86400

# fusepy decodes and encodes names with a fixed codec and strict errors, but POSIX names
# are bytes; this codec round-trips any byte through surrogateescape, as os.fsdecode does.
_CODEC = "packfs_utf8_surrogateescape"


def _codec_search(name: str) -> codecs.CodecInfo | None:
    if name != _CODEC:
        return None
    return codecs.CodecInfo(
        name=_CODEC,
        encode=lambda text, errors="strict": codecs.utf_8_encode(text, "surrogateescape"),
        decode=lambda data, errors="strict": codecs.utf_8_decode(data, "surrogateescape", True),
    )


codecs.register(_codec_search)

Callback = TypeVar("Callback", bound=Callable[..., Any])


def _load_binding(binding: str) -> ModuleType:
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


class _FuseError(OSError):
    """An errno-carrying error for the binding (its FuseOSError is not importable here)."""

    def __init__(self, code: int) -> None:
        super().__init__(code, os.strerror(code))


def _translated(method: Callback) -> Callback:
    """Map every exception to an errno, so nothing escapes into the binding (fusepy's
    wrapper mishandles an OSError whose errno is None)."""

    @functools.wraps(method)
    def wrapper(self: PackfsOperations, *args: Any) -> Any:
        try:
            result = method(self, *args)
            # Nothing read from an archive changed in place (cp over it) is answered:
            # the table and header are read through the map, which the SIGBUS guard
            # keeps from killing the daemon; this check turns what was read into EIO.
            self.container.check_unchanged()
            return result
        except _FuseError:
            raise
        except PathNotFoundError:
            raise _FuseError(errno.ENOENT) from None
        except NotADirectoryPathError:
            raise _FuseError(errno.ENOTDIR) from None
        except NotAFileError:
            raise _FuseError(errno.EISDIR) from None
        except ArchiveChangedError as error:
            self._log_once(f"archive changed in place; remount: {error}")
            raise _FuseError(errno.EIO) from None
        except PackfsError as error:
            self._log_once(f"{method.__name__} {args[0] if args else ''}: {error}")
            raise _FuseError(errno.EIO) from None
        except Exception as error:  # a bug must not take the daemon down
            log.exception("unexpected error in %s %s", method.__name__, args[0] if args else "")
            self._log_once(f"{method.__name__}: {error!r}")
            raise _FuseError(errno.EIO) from None

    return wrapper  # type: ignore[return-value]


# The largest st_size (loff_t) and st_uid/st_gid ((uid_t)-1 means "none") a kernel takes.
_MAX_SIZE = 2**63 - 1
_MAX_ID = 2**32 - 2


def _read_only(self: PackfsOperations, *args: Any) -> None:
    raise _FuseError(errno.EROFS)


_LOGGED_CHARACTERS = 1000


class PackfsOperations:
    """FUSE callbacks for one archive.  Each looks the path up in the table and
    returns what the kernel needs; no state is kept per file.

    Parameters
    ----------
    folder
        The open archive.
    check_data
        Check a file's CRC the first time it is opened; a mismatch is EIO.
    no_open
        Answer OPEN with ENOSYS: the kernel (Linux >= 4.19 for libfuse2 and 3 alike)
        then opens files without asking, keeps their pages cached, and sends no
        RELEASE; the CRC check moves to the first read.
    """

    use_ns = True  # st_*time as integer nanoseconds

    def __init__(self, folder: PackedFolder, check_data: bool = True, no_open: bool = False) -> None:
        self.folder = folder
        self.no_open = no_open
        self.table = folder._table
        self.container = folder._container
        self.check_data = check_data
        # One bit per data record: checked and sound.  Bounded by the archive's size
        # (an eighth of a byte per file), unlike a set of file handles.
        self._checked = bytearray((folder.footer.data_records + 7) // 8)
        self._logged: set[str] = set()
        archive = os.stat(folder.path)
        self._statfs = {
            "f_bsize": 4096, "f_frsize": 4096,
            "f_blocks": (archive.st_size + 4095) // 4096, "f_bfree": 0, "f_bavail": 0,
            "f_files": folder.entry_count, "f_ffree": 0, "f_favail": 0,
            "f_namemax": 255,
        }

    def __call__(self, operation: str, *args: Any) -> Any:
        # fusepy dispatches every callback through the operations object's __call__.
        method = getattr(self, operation, None)
        if method is None:
            raise _FuseError(errno.ENOSYS)
        return method(*args)

    def _log_once(self, message: str) -> None:
        # Bounded in bytes: a message names a path, and a hostile archive's paths can be
        # megabytes long (10,000 of them would be gigabytes).  At most 10,000 messages
        # of at most _LOGGED_CHARACTERS each are kept: under 10 MB.
        if len(message) > _LOGGED_CHARACTERS:
            message = message[: _LOGGED_CHARACTERS - 25] + f"... ({len(message)} characters)"
        if message not in self._logged and len(self._logged) < 10000:
            self._logged.add(message)
            log.error("%s", message)

    def _entry(self, path: str) -> int:
        # FUSE hands us canonical absolute paths, so the table key is the path minus "/".
        entry = self.table.lookup(os.fsencode(path)[1:])
        if entry < 0:
            raise _FuseError(errno.ENOENT)
        return entry

    def _attributes(self, entry: int) -> dict[str, int]:
        mode, uid, gid, mtime, size, nlink = self.table.attributes(entry)
        # Clamped to what the kernel represents: it answers EIO for a whole stat whose
        # size exceeds 2**63 - 1 (a hostile table's, which would hide even a directory),
        # and 2**32 - 1 is (uid_t)-1, "no owner".  mtime needs nothing: any i64 of
        # nanoseconds is a (seconds, nanoseconds) pair the kernel and libfuse accept.
        if size > _MAX_SIZE:
            size = _MAX_SIZE
        if uid > _MAX_ID:
            uid = _MAX_ID
        if gid > _MAX_ID:
            gid = _MAX_ID
        return {
            "st_mode": mode,
            "st_ino": self.table.inode(entry),  # hard links share their first name's
            "st_nlink": nlink,
            "st_uid": uid,
            "st_gid": gid,
            "st_size": size,
            # 512-byte units, rounded up, as du expects of real files.
            "st_blocks": (size + 511) // 512 if mode & S_IFMT == S_IFREG else 0,
            "st_blksize": 128 * 1024,
            "st_atime": mtime,
            "st_mtime": mtime,
            "st_ctime": mtime,
        }

    @_translated
    def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
        """GETATTR: the entry's attributes, with values the kernel cannot take clamped."""
        return self._attributes(self._entry(path))

    @_translated
    def listing(self, path: bytes) -> tuple[int, list[int], list[bytes], list[int]]:
        """Directory ``path`` (as FUSE passes it, bytes): its entry, and its children's
        inode numbers, names and modes; every table value used is checked here, where
        a damaged table becomes EIO."""
        entry = self.table.lookup(path[1:])
        if entry < 0:
            raise _FuseError(errno.ENOENT)
        if self.table.file_type(entry) != S_IFDIR:
            raise _FuseError(errno.ENOTDIR)
        _, names, modes, inodes = self.table.listing_with_inodes(entry)
        return entry, inodes, names, modes

    def readdir(self, path: str, fh: int) -> list[Any]:
        """The listing in the bindings' generic form.  Mounts use the faster readdir of
        ``_fuse_class``, which hands the same entries straight to libfuse."""
        entry, inodes, names, modes = self.listing(os.fsencode(path))
        listing: list[Any] = [(".", {"st_mode": S_IFDIR, "st_ino": entry + 1}, 0),
                              ("..", None, 0)]
        for inode, name, mode in zip(inodes, names, modes):
            # The file type lets find and os.walk skip a getattr per entry (d_type).
            listing.append((os.fsdecode(name), {"st_mode": mode, "st_ino": inode}, 0))
        return listing

    @_translated
    def readlink(self, path: str) -> str:
        """READLINK: the target, checked like every reader's; EINVAL for a non-symlink."""
        entry = self._entry(path)
        if self.table.file_type(entry) != S_IFLNK:
            raise _FuseError(errno.EINVAL)
        return os.fsdecode(self.folder._link_target(entry, repr(path), self.check_data))

    def _file_record(self, entry: int) -> int:
        if self.table.file_type(entry) == S_IFDIR:
            raise _FuseError(errno.EISDIR)
        return self.table.record(entry)

    def _needs_check(self, record: int) -> bool:
        # Checked once per mount, not on every read of a large file.
        return self.check_data and not self._checked[record >> 3] & (1 << (record & 7))

    def _check(self, path: str, record: int, data: bytes | None = None) -> None:
        """Check record's CRC (over ``data`` if it is the whole record) and remember it."""
        if data is None:
            sound = self.container.record_crc_ok(record)
        else:
            sound = crc32(data) == self.container.stored_crc(record)
        if not sound:
            raise ChecksumError(f"{self.folder.path!r}: {path!r}: checksum mismatch")
        self._checked[record >> 3] |= 1 << (record & 7)

    @_translated
    def open(self, path: str, flags: int) -> int:
        """OPEN: EROFS for writes; ENOSYS for files with ``no_open`` (the kernel then stops asking)."""
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & (os.O_TRUNC | os.O_CREAT):
            raise _FuseError(errno.EROFS)
        entry = self._entry(path)
        if self.no_open and self.table.file_type(entry) != S_IFDIR:
            # ENOSYS tells the kernel to stop sending OPEN and RELEASE (and to keep pages
            # cached), so a warm read never enters Python.  read() then resolves the path
            # itself and does the CRC check.
            raise _FuseError(errno.ENOSYS)
        record = self._file_record(entry)
        if self._needs_check(record):
            self._check(path, record)
        # The handle is record + 1 (0 means "no handle"): nothing to track or leak.
        return record + 1

    @_translated
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        """READ: up to ``size`` bytes at ``offset``, with pread; the file's CRC is checked once, at its first read."""
        if fh:
            record = fh - 1
            if record >= self.folder.footer.data_records:
                raise _FuseError(errno.EBADF)
            start, end = self.container.record_span(record)
        else:
            record = self._file_record(self._entry(path))
            start, end = self.container.record_span(record)
            if self._needs_check(record):
                if end - start <= size and not offset:
                    # A small file's first read: one pread serves both the check and
                    # the reply, instead of reading the file twice.
                    data = self.container.pread(start, end)
                    self._check(path, record, data)
                    return data
                self._check(path, record)
        begin = start + offset
        # pread, not the map: served pages stay in the page cache, not in the daemon's
        # RSS, which would otherwise grow to the size of everything ever read.
        return self.container.pread(begin, min(end, begin + size)) if begin < end else b""

    @_translated
    def statfs(self, path: str) -> dict[str, int]:
        """STATFS: the archive's size in blocks and the entry count; nothing free."""
        return self._statfs

    @_translated
    def access(self, path: str, mode: int) -> None:
        """ACCESS: ENOENT for a missing path, EROFS when asked for write access."""
        self._entry(path)
        if mode & os.W_OK:
            raise _FuseError(errno.EROFS)

    # Every change fails with EROFS (the kernel already refuses most on an "ro" mount).
    chmod = chown = create = link = mkdir = mknod = rename = rmdir = symlink = _read_only
    truncate = unlink = utimens = write = setxattr = removexattr = _read_only


# libfuse's fuse_fill_dir_t called without ctypes' per-argument type checks: every
# argument below is already a ctypes object of the exact C type.
_UNCHECKED_FILLER = ctypes.CFUNCTYPE(ctypes.c_int)


def _fuse_class(binding: ModuleType) -> type:
    """The binding's FUSE class with readdir handing entries straight to libfuse.

    The bindings' own readdir turns every entry into a dict, fills a c_stat from it
    field by field and makes a type-checked ctypes call: py-spy put 60% of a warm
    ``os.walk``'s time there.  It matters because every walk lists every directory
    again: libfuse's high-level API (3.14 here) does not pass ``cache_readdir`` on, so
    the kernel cannot keep listings.  Here an entry costs two field stores and one
    unchecked call into libfuse's filler.
    """
    libfuse3 = getattr(binding, "fuse_version_major", 2) == 3
    zero_offset, no_flags = ctypes.c_int64(0), ctypes.c_int(0)

    def direct_readdir(self: Any, path: bytes, buf: int | None, filler: Any, *_: Any) -> int:
        entry, inodes, names, modes = self.operations.listing(path)
        add = _UNCHECKED_FILLER(ctypes.cast(filler, ctypes.c_void_p).value)
        buffer = ctypes.c_void_p(buf)
        attributes = binding.c_stat()
        attributes_ref = ctypes.byref(attributes)
        extra = (zero_offset, no_flags) if libfuse3 else (zero_offset,)
        attributes.st_mode, attributes.st_ino = S_IFDIR, entry + 1
        add(buffer, b".", attributes_ref, *extra)
        add(buffer, b"..", None, *extra)
        # The mode gives readers d_type, so find and os.walk need no getattr per entry.
        for inode, name, mode in zip(inodes, names, modes):
            attributes.st_mode, attributes.st_ino = mode, inode
            if add(buffer, name, attributes_ref, *extra):
                break
        return 0

    # mfusepy names the callback after the libfuse version; fusepy has one readdir.
    name = f"readdir_fuse_{binding.fuse_version_major}" if hasattr(binding, "fuse_version_major") else "readdir"
    return type("FUSE", (binding.FUSE,), {name: direct_readdir})


# -- running libfuse -------------------------------------------------------------------------
#
# Both bindings end in libfuse's fuse_main, which hides three things packfs must know:
# why mounting failed (it prints the reason to stderr and returns a bare number, the
# daemon's log holding the only copy), whether the loop ended by a requested stop
# (libfuse3 turns SIGINT/SIGTERM into the same error 8 as a failure), and, on libfuse3,
# it cannot take a thread limit (3.14 never sets max_threads, and passes UINT_MAX as
# max_idle_threads, which logs "Ignoring invalid max threads value 4294967295").
# So packfs runs fuse_main's few steps itself, through the same public libfuse calls, in
# place of the binding's fuse_main_real; everything else stays the binding's.


class _FuseArgs(ctypes.Structure):
    _fields_ = [("argc", ctypes.c_int), ("argv", ctypes.POINTER(ctypes.c_char_p)), ("allocated", ctypes.c_int)]


class _Run:
    """One mount's request to the loop and how it ended (read back by mount())."""

    def __init__(self, threads: int) -> None:
        self.threads = threads  # 0: libfuse's default; 1 never gets here (the binding's -s)
        self.error: str | None = None  # why mounting or serving failed, in libfuse's words
        self.stop_signal = 0  # the signal that ended a requested stop


# The _Run of the mount in progress on this thread: the bindings call fuse_main_real
# with a fixed signature, so the settings travel beside the call.
_current = threading.local()

_STOP_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)  # libfuse's exit_handler


class _CapturedStderr:
    """Send fd 2 (where libfuse and fusermount write) to a file while setting up.

    fd 2 belongs to the process: one capture at a time (mounts set up in several
    threads take turns), and what other threads write meanwhile is captured too, then
    replayed, or part of the reason for a failure."""

    text = ""
    _one_at_a_time = threading.Lock()

    def __enter__(self) -> _CapturedStderr:
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


def _options_error(said: _CapturedStderr) -> str:
    # libfuse3: "fuse: unknown option(s): `-o bogus'"; libfuse2: "fuse: unknown option `bogus'"
    unknown = re.search(r"unknown option(?:\(s\))?:? `([^']*)'", said.text)
    if unknown:
        option = unknown.group(1)
        option = option if option.startswith("-") else f"-o {option}"
        return f"libfuse rejected option {option}: unknown option"
    return f"libfuse rejected the options: {said.reason() or 'no reason given'}"


def _loop_outcome(run: _Run, result: int) -> int:
    """0 for an unmount or a requested stop, else a failure (with run.error set)."""
    if result in _STOP_SIGNALS:  # libfuse3 >= 3.12 returns the signal that stopped it
        run.stop_signal = result
        return 0
    if result:
        reason = os.strerror(-result) if result < 0 else f"error {result}"
        run.error = f"serving failed: libfuse's loop ended with {reason}"
        return 8
    return 0


def _libfuse3_main(lib: ctypes.CDLL, run: _Run, argv: list[bytes], operations: Any, size: int) -> int:
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
    with _CapturedStderr() as said:
        fuse = lib.fuse_new(ctypes.byref(args), operations, size, None)
    try:
        if not fuse:
            run.error = _options_error(said)
            return 3
        said.replay()
        with _CapturedStderr() as said:
            failed = lib.fuse_mount(fuse, mountpoint)
        if failed:
            run.error = said.reason() or "libfuse could not mount (no reason given)"
            return 4
        said.replay()
        try:
            if lib.fuse_daemonize(int(foreground)):
                run.error = "libfuse could not daemonize"
                return 5
            session = lib.fuse_get_session(fuse)
            if lib.fuse_set_signal_handlers(session):
                run.error = "libfuse could not set its signal handlers"
                return 6
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
            lib.fuse_unmount(fuse)
    finally:
        if fuse:
            lib.fuse_destroy(fuse)
        lib.fuse_opt_free_args(ctypes.byref(args))


def _libfuse2_main(lib: ctypes.CDLL, run: _Run, argv: list[bytes], operations: Any, size: int) -> int:
    """fuse_main_real of libfuse 2.9: fuse_setup (parse, mount, signals), loop, teardown."""
    mountpoint, multithreaded = ctypes.c_char_p(), ctypes.c_int()
    with _CapturedStderr() as said:
        fuse = lib.fuse_setup(len(argv), (ctypes.c_char_p * len(argv))(*argv), operations, size,
                              ctypes.byref(mountpoint), ctypes.byref(multithreaded), None)
    if not fuse:
        # fuse_setup parses and mounts in one call: name the options only when they were it.
        run.error = _options_error(said) if "option" in said.text else (
            said.reason() or "libfuse could not mount (no reason given)")
        return 1
    said.replay()
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


def _install_main(binding: ModuleType) -> None:
    """Route the binding's fuse_main_real to packfs' own for the mounts mount() makes
    (which set _current.run); any other caller still gets libfuse's."""
    if hasattr(binding, "_packfs_main"):
        return
    binding._packfs_main = False  # packfs' main is not in use (libfuse lacks a call)
    shared = binding._libfuse
    major = getattr(binding, "fuse_version_major", 2)
    ours, calls = (_libfuse3_main, _LIBFUSE3_CALLS) if major == 3 else (_libfuse2_main, _LIBFUSE2_CALLS)
    lib = ctypes.CDLL(shared._name)  # its own function objects: these types stay here
    if not all(hasattr(lib, name) for name in calls):  # e.g. libfuse3 before 3.12
        return
    for name, (restype, argtypes) in calls.items():
        getattr(lib, name).restype, getattr(lib, name).argtypes = restype, argtypes
    original = shared.fuse_main_real

    def fuse_main_real(argc: int, argv: Any, operations: Any, size: int, user_data: Any) -> int:
        run = getattr(_current, "run", None)
        if run is None:
            return original(argc, argv, operations, size, user_data)
        return ours(lib, run, [argv[i] for i in range(argc)], operations, size)

    if major == 3 or hasattr(binding, "fuse_main_real"):  # mfusepy calls its module's name
        binding.fuse_main_real = fuse_main_real
    else:  # fusepy calls _libfuse.fuse_main_real
        binding._libfuse = _LibraryWith(shared, fuse_main_real=fuse_main_real)
    binding._packfs_main = True


# -- mounting ------------------------------------------------------------------------------

# What our mounts look like in the mount table (fuse_options sets both).
FSTYPE = "fuse.packfs"
FSNAME_PREFIX = "packfs:"


def _unescape(field: bytes) -> str:
    # /proc/self/mounts writes space, tab, newline and backslash as octal escapes.
    return os.fsdecode(field.decode("unicode_escape").encode("latin-1"))


def _mount_table() -> list[tuple[str, str, str]]:
    """(source, mountpoint, fstype) from /proc/self/mounts, in mount order."""
    entries = []
    try:
        with open("/proc/self/mounts", "rb") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) >= 3:
                    entries.append((_unescape(fields[0]), _unescape(fields[1]), fields[2].decode()))
    except OSError:
        pass
    return entries


def mount_entry(mountpoint: str) -> tuple[str, str] | None:
    """(source, fstype) of what is mounted at ``mountpoint`` (the topmost of stacked
    mounts), or None."""
    target = os.path.abspath(mountpoint)
    found = None
    for source, point, fstype in _mount_table():
        if point == target:
            found = (source, fstype)
    return found


def is_mounted(mountpoint: str) -> bool:
    """True if ``mountpoint`` is in the mount table (also when its daemon is dead)."""
    return mount_entry(mountpoint) is not None


def check_fuse(binding: str = DEFAULT_BINDING) -> ModuleType:
    """Raise MountError naming what is missing unless FUSE can work here."""
    if not os.path.exists("/dev/fuse"):
        raise MountError("FUSE is not available: /dev/fuse does not exist (load the fuse module)")
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as error:
        raise MountError(f"FUSE is not available: cannot open /dev/fuse: {error.strerror}") from None
    if not (shutil.which("fusermount3") or shutil.which("fusermount")):
        raise MountError("FUSE is not available: no fusermount or fusermount3 (install fuse3)")
    return _load_binding(binding)


FUSE_CONF = "/etc/fuse.conf"


def check_allow_other(conf: str = FUSE_CONF) -> None:
    """Raise MountError unless the caller may mount with allow_other: root always; other
    users only when ``conf`` has a ``user_allow_other`` line (fusermount's rule, which it
    would otherwise report in words of its own, after the daemon has started)."""
    if os.geteuid() == 0:
        return
    try:
        with open(conf, encoding="utf-8", errors="replace") as lines:
            if any(line.split("#", 1)[0].strip() == "user_allow_other" for line in lines):
                return
    except OSError:
        pass
    raise MountError(f"--allow-other (-o allow_other) needs a line 'user_allow_other' in {conf} "
                     f"for users other than root (ask root to add it)")


def check_mountpoint(mountpoint: str, nonempty: bool = False) -> str:
    """Raise MountError unless ``mountpoint`` is an existing, empty directory that is
    not already a mount; return its absolute path.

    A non-empty directory needs ``nonempty`` (``-o nonempty``): what is in it is hidden
    while mounted, which is seldom meant.  packfs makes this check for both bindings, so
    the option works the same on libfuse3 (which has no such option and mounts over
    anything) as on libfuse2."""
    path = os.path.abspath(mountpoint)
    if is_mounted(path):
        raise MountError(f"{mountpoint!r} is already a mount point (packfs unmount it first)")
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise MountError(f"mount point {mountpoint!r} does not exist, expected a directory") from None
    except OSError as error:
        raise MountError(f"mount point {mountpoint!r}: {error.strerror}") from None
    if not stat_module.S_ISDIR(info.st_mode):
        raise MountError(f"mount point {mountpoint!r} is not a directory")
    if not nonempty and os.listdir(path):
        raise MountError(f"mount point {mountpoint!r} is not empty (add -o nonempty to mount over "
                         f"its contents, which stay hidden while mounted)")
    return path


# Options mount(8), fstab and mount.fuse3 pass that mean nothing to a read-only FUSE
# mount or to libfuse (which rejects what it does not know): accepted and dropped.
# "rw" is among them: the archive is read-only, and mount(8) adds "rw" unless told "ro".
_IGNORED_OPTIONS = {
    "defaults", "rw", "auto", "noauto", "user", "nouser", "users", "owner", "group", "nofail",
    "_netdev", "relatime", "norelatime", "strictatime", "nostrictatime", "lazytime", "nolazytime",
    "diratime", "nodiratime", "iversion", "noiversion", "mand", "nomand", "loud", "silent",
}


def _ignored(key: str) -> bool:
    return key in _IGNORED_OPTIONS or key.startswith(("x-", "comment="))


# Options packfs sets itself: unmount (and `mount`'s output) recognise packfs mounts by them.
_RESERVED_OPTIONS = ("fsname", "subtype")


def check_options(extra: dict[str, Any]) -> None:
    """Raise MountError for a -o option the user may not set."""
    for key in _RESERVED_OPTIONS:
        if key in extra:
            raise MountError(f"-o {key} is set by packfs itself (packfs unmount recognises its "
                             f"mounts by it); leave it out")


def fuse_options(archive: str, allow_other: bool, extra: dict[str, Any], binding: str) -> dict[str, Any]:
    """The mount options: read-only, long caches, our inode numbers, then ``extra``
    (the user's -o) without what only mount(8) or packfs itself uses."""
    options: dict[str, Any] = {
        "ro": True,
        "fsname": f"{FSNAME_PREFIX}{os.path.abspath(archive)}".replace(",", "_"),
        "subtype": "packfs",
        "default_permissions": True,  # the kernel checks mode bits; no access() round trips
        "use_ino": True,
        "kernel_cache": True,  # the archive is immutable: keep pages across opens
        "entry_timeout": CACHE_SECONDS,
        "attr_timeout": CACHE_SECONDS,
        "negative_timeout": CACHE_SECONDS,
    }
    if binding == "fusepy":
        options["max_read"] = 131072  # libfuse2's largest read request
    if allow_other:
        options["allow_other"] = True
    check_options(extra)
    for key, value in extra.items():
        if _ignored(key):
            continue
        if key == "nonempty" and binding != "fusepy":
            continue  # check_mountpoint made the check; libfuse3 has no such option
        options[key] = value
    return options


def mount(
    archive: str | PackedFolder,
    mountpoint: str,
    *,
    foreground: bool = True,
    debug: bool = False,
    threads: int = 0,
    check_data: bool = True,
    allow_other: bool = False,
    options: dict[str, Any] | None = None,
    binding: str = DEFAULT_BINDING,
) -> None:
    """Serve ``archive`` (a path, or an open PackedFolder that this takes over) at
    ``mountpoint`` until it is unmounted (blocks).

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
    if isinstance(threads, bool):
        threads = 0 if threads else 1
    extra = dict(options or {})
    if allow_other or extra.get("allow_other"):
        check_allow_other()
    fuse = check_fuse(binding)
    if threads > 1 and not (getattr(fuse, "fuse_version_major", 2) == 3 and fuse._packfs_main):
        raise MountError(f"a thread limit (threads={threads}) needs libfuse 3.12 or later through "
                         f"the mfusepy binding; libfuse2 always uses up to 10 threads")
    path = check_mountpoint(mountpoint, nonempty=bool(extra.get("nonempty")))
    folder = archive if isinstance(archive, PackedFolder) else PackedFolder(archive, check_data=check_data)
    archive = folder.path
    operations = PackfsOperations(folder, check_data=check_data, no_open=True)
    pidfile = state_file(path, ".pid")
    with os.fdopen(_open_state_file(pidfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as f:
        f.write(str(os.getpid()))
    run = _current.run = _Run(threads)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            _fuse_class(fuse)(
                operations, path, foreground=foreground, debug=debug, nothreads=threads == 1,
                encoding=_CODEC, **fuse_options(archive, allow_other, extra, binding),
            )
    except RuntimeError as error:
        reason = run.error or f"failed (libfuse error {error})"
        raise MountError(f"mounting {archive!r} at {mountpoint!r}: {reason}") from None
    finally:
        _current.run = None
        folder.close()
        try:
            os.unlink(pidfile)
        except OSError:
            pass
    if run.stop_signal:
        log.debug("unmounted on %s", signal.Signals(run.stop_signal).name)


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


def mount_in_background(folder: PackedFolder, mountpoint: str, log_path: str, timeout: float = 30.0,
                        **settings: Any) -> int:
    """Fork a daemon serving ``folder`` at ``mountpoint``; return its pid once the mount
    works.  Forking, rather than starting a new interpreter, reuses the imports and the
    already validated archive, so mounting costs no second start-up or open.

    A daemon that ends cleanly (unmounted, or stopped by SIGTERM/SIGINT/SIGHUP) removes
    its log if it is the default one (state_file) and empty; logs of daemons gone for
    LOG_DAYS days are removed here.

    Raises
    ------
    MountError
        The daemon exited or did not mount within ``timeout`` (its last log line says why).
    """
    path = os.path.abspath(mountpoint)
    own_log = os.path.abspath(log_path) == state_file(path, ".log")
    remove_old_logs()
    log_flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    # A log file the user named is theirs to point anywhere; ours never follows a link.
    log_fd = (_open_state_file(log_path, log_flags) if os.path.dirname(os.path.abspath(log_path)) == state_directory()
              else os.open(log_path, log_flags | os.O_CLOEXEC, 0o644))
    with os.fdopen(log_fd, "ab") as log_file:
        pid = os.fork()
        if pid == 0:  # the daemon
            status = 1
            try:
                os.setsid()
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.dup2(log_file.fileno(), 1)
                os.dup2(log_file.fileno(), 2)
                handler = logging.StreamHandler()
                handler.setFormatter(logging.Formatter("%(asctime)s packfs: %(message)s"))
                daemon_log = logging.getLogger("packfs.mount")
                daemon_log.addHandler(handler)
                daemon_log.propagate = False
                mount(folder, mountpoint, **settings)  # the caller's words in messages
                status = 0
                if own_log and os.fstat(log_file.fileno()).st_size == 0:
                    os.unlink(log_path)  # nothing worth keeping
            except BaseException as error:  # report, never return into the caller's code
                print(f"Error: {error}", file=sys.stderr, flush=True)
            finally:
                os._exit(status)
    folder.close()  # the daemon has its own reference to the map
    deadline = time.monotonic() + timeout
    while not is_mounted(path):
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
    return pid


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
    from .cli import main  # the command line's parsing, checks and one-line errors

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
    code = "import sys; from packfs.mount import mount_helper; sys.exit(mount_helper(sys.argv[1:]))"
    return ("#!/bin/sh\n"
            "# mount(8) runs this for file systems of type fuse.packfs (packfs.mount.mount_helper).\n"
            f"exec {shlex.quote(python)} -I -c {shlex.quote(code)} \"$@\"\n")
