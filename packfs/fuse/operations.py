"""The FUSE callbacks: a thin translation of FUSE requests onto the archive's table and
records, each table value checked where it is used, every error mapped to an errno.

Only this subpackage imports a FUSE binding, and lazily: fusepy raises OSError at import
when libfuse is missing, and ``packfs ls`` must work without it.
"""

from __future__ import annotations

import codecs
import ctypes.util
import errno
import functools
import logging
import os
from types import ModuleType
from typing import Any, Callable, TypeVar

from ..errors import (
    ArchiveChangedError,
    ChecksumError,
    NotADirectoryPathError,
    NotAFileError,
    PackfsError,
    PathNotFoundError,
)
from ..format import crc32
from ..pathtable import S_IFDIR, S_IFLNK, S_IFMT, S_IFREG
from ..reader import PackedFolder

__all__ = ["PackfsOperations", "BINDINGS", "DEFAULT_BINDING", "CACHE_SECONDS"]

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

