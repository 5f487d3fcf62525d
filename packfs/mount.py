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
import signal
import stat as stat_module
import subprocess
import sys
import tempfile
import time
import warnings
from types import ModuleType
from typing import Any, Callable, TypeVar

from .errors import (
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

__all__ = ["PackfsOperations", "mount", "mount_in_background", "unmount", "check_mountpoint", "check_fuse", "BINDINGS"]

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
            return __import__(BINDINGS[binding])
    except ImportError:
        raise MountError(
            f"the FUSE binding {binding!r} is not installed (pip install {binding})"
        ) from None
    except OSError as error:  # fusepy/mfusepy raise this when libfuse cannot be found
        raise MountError(
            f"libfuse is not available for {binding!r} ({error}); install fuse3 and libfuse2"
        ) from None


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
            return method(self, *args)
        except _FuseError:
            raise
        except PathNotFoundError:
            raise _FuseError(errno.ENOENT) from None
        except NotADirectoryPathError:
            raise _FuseError(errno.ENOTDIR) from None
        except NotAFileError:
            raise _FuseError(errno.EISDIR) from None
        except PackfsError as error:
            self._log_once(f"{method.__name__} {args[0] if args else ''}: {error}")
            raise _FuseError(errno.EIO) from None
        except Exception as error:  # a bug must not take the daemon down
            log.exception("unexpected error in %s %s", method.__name__, args[0] if args else "")
            self._log_once(f"{method.__name__}: {error!r}")
            raise _FuseError(errno.EIO) from None

    return wrapper  # type: ignore[return-value]


def _read_only(self: PackfsOperations, *args: Any) -> None:
    raise _FuseError(errno.EROFS)


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
        return self._attributes(self._entry(path))

    @_translated
    def listing(self, path: bytes) -> tuple[int, range, list[bytes], list[int]]:
        """Directory ``path`` (as FUSE passes it, bytes): its entry, its children's
        entries, names and modes."""
        entry = self.table.lookup(path[1:])
        if entry < 0:
            raise _FuseError(errno.ENOENT)
        if self.table.file_type(entry) != S_IFDIR:
            raise _FuseError(errno.ENOTDIR)
        return (entry, *self.table.listing(entry))

    def readdir(self, path: str, fh: int) -> list[Any]:
        """The listing in the bindings' generic form.  Mounts use the faster readdir of
        ``_fuse_class``, which hands the same entries straight to libfuse."""
        entry, children, names, modes = self.listing(os.fsencode(path))
        listing: list[Any] = [(".", {"st_mode": S_IFDIR, "st_ino": entry + 1}, 0),
                              ("..", None, 0)]
        for inode, name, mode in zip(self.table.inodes(children, modes), names, modes):
            # The file type lets find and os.walk skip a getattr per entry (d_type).
            listing.append((os.fsdecode(name), {"st_mode": mode, "st_ino": inode}, 0))
        return listing

    @_translated
    def readlink(self, path: str) -> str:
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
            sound = self.container.pread_crc_ok(record)
        else:
            sound = crc32(data) == self.container.stored_crc(record)
        if not sound:
            raise ChecksumError(f"{self.folder.path!r}: {path!r}: checksum mismatch")
        self._checked[record >> 3] |= 1 << (record & 7)

    @_translated
    def open(self, path: str, flags: int) -> int:
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
        return self._statfs

    @_translated
    def access(self, path: str, mode: int) -> None:
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
        entry, children, names, modes = self.operations.listing(path)
        add = _UNCHECKED_FILLER(ctypes.cast(filler, ctypes.c_void_p).value)
        buffer = ctypes.c_void_p(buf)
        attributes = binding.c_stat()
        attributes_ref = ctypes.byref(attributes)
        extra = (zero_offset, no_flags) if libfuse3 else (zero_offset,)
        attributes.st_mode, attributes.st_ino = S_IFDIR, entry + 1
        add(buffer, b".", attributes_ref, *extra)
        add(buffer, b"..", None, *extra)
        # The mode gives readers d_type, so find and os.walk need no getattr per entry.
        for inode, name, mode in zip(self.operations.table.inodes(children, modes), names, modes):
            attributes.st_mode, attributes.st_ino = mode, inode
            if add(buffer, name, attributes_ref, *extra):
                break
        return 0

    # mfusepy names the callback after the libfuse version; fusepy has one readdir.
    name = f"readdir_fuse_{binding.fuse_version_major}" if hasattr(binding, "fuse_version_major") else "readdir"
    return type("FUSE", (binding.FUSE,), {name: direct_readdir})


# -- mounting ------------------------------------------------------------------------------


def _mount_table() -> list[tuple[str, str]]:
    """(mountpoint, fstype) from /proc/self/mounts, unescaping octal escapes."""
    entries = []
    try:
        with open("/proc/self/mounts", "rb") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) >= 3:
                    point = fields[1].decode("unicode_escape").encode("latin-1")
                    entries.append((os.fsdecode(point), fields[2].decode()))
    except OSError:
        pass
    return entries


def is_mounted(mountpoint: str) -> bool:
    """True if ``mountpoint`` is in the mount table (also when its daemon is dead)."""
    target = os.path.abspath(mountpoint)
    return any(point == target for point, _ in _mount_table())


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


def check_mountpoint(mountpoint: str, nonempty: bool = False) -> str:
    """Raise MountError unless ``mountpoint`` is an existing, empty directory that is
    not already a mount; return its absolute path."""
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
        raise MountError(f"mount point {mountpoint!r} is not empty (use -o nonempty to mount over it)")
    return path


def fuse_options(archive: str, allow_other: bool, extra: dict[str, Any], binding: str) -> dict[str, Any]:
    """The mount options: read-only, long caches, our inode numbers."""
    options: dict[str, Any] = {
        "ro": True,
        "fsname": f"packfs:{os.path.abspath(archive)}".replace(",", "_"),
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
    options.update(extra)
    return options


def mount(
    archive: str | PackedFolder,
    mountpoint: str,
    *,
    foreground: bool = True,
    debug: bool = False,
    threads: bool = True,
    check_data: bool = True,
    allow_other: bool = False,
    options: dict[str, Any] | None = None,
    binding: str = DEFAULT_BINDING,
) -> None:
    """Serve ``archive`` (a path, or an open PackedFolder that this takes over) at
    ``mountpoint`` until it is unmounted (blocks).

    SIGINT and SIGTERM unmount cleanly (libfuse handles them).

    Raises
    ------
    FormatError, ChecksumError
        The archive cannot be opened.
    MountError
        FUSE is unavailable or the mount point is unusable.
    """
    fuse = check_fuse(binding)
    extra = dict(options or {})
    path = check_mountpoint(mountpoint, nonempty=bool(extra.get("nonempty")))
    folder = archive if isinstance(archive, PackedFolder) else PackedFolder(archive, check_data=check_data)
    archive = folder.path
    operations = PackfsOperations(folder, check_data=check_data, no_open=True)
    pidfile = state_file(path, ".pid")
    with open(pidfile, "w") as f:
        f.write(str(os.getpid()))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            _fuse_class(fuse)(
                operations, path, foreground=foreground, debug=debug, nothreads=not threads,
                encoding=_CODEC, **fuse_options(archive, allow_other, extra, binding),
            )
    except RuntimeError as error:
        raise MountError(f"mounting {archive!r} at {mountpoint!r} failed (libfuse error {error})") from None
    finally:
        folder.close()
        try:
            os.unlink(pidfile)
        except OSError:
            pass


def state_file(mountpoint: str, suffix: str) -> str:
    """Where the daemon serving ``mountpoint`` keeps its pid (".pid") and log (".log")."""
    directory = os.path.join(tempfile.gettempdir(), f"packfs-{os.getuid()}")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    name = hashlib.sha256(os.fsencode(os.path.abspath(mountpoint))).hexdigest()[:16]
    return os.path.join(directory, name + suffix)


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

    Raises
    ------
    MountError
        The daemon exited or did not mount within ``timeout`` (its last log line says why).
    """
    path = os.path.abspath(mountpoint)
    with open(log_path, "ab") as log_file:
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
                mount(folder, path, **settings)
                status = 0
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
            reason = lines[-1].removeprefix("Error: ") if lines else f"exit status {status}"
            raise MountError(f"mounting {folder.path!r} at {mountpoint!r} failed: {reason}")
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            raise MountError(f"mounting {folder.path!r} at {mountpoint!r} timed out (log: {log_path})")
        time.sleep(0.005)
    return pid


def unmount(mountpoint: str, lazy: bool = False, timeout: float = 10.0) -> None:
    """Unmount a packfs mount and wait until it is gone.

    Raises
    ------
    MountError
        Not mounted, busy (use ``lazy``), or the unmount command failed.
    """
    path = os.path.abspath(mountpoint)
    if not is_mounted(path):
        raise MountError(f"{mountpoint!r} is not mounted")
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
    """True when the mount's daemon is gone ("Transport endpoint is not connected")."""
    try:
        os.stat(mountpoint)
    except OSError as error:
        return error.errno == errno.ENOTCONN
    return False

