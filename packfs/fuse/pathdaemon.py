"""The path daemon: FUSE callbacks by path, through libfuse's high-level API (fusepy or
mfusepy).  Each callback looks its path up in the archive and answers from the Archive's
public interface; no state is kept per file.
"""

from __future__ import annotations

import ctypes
import errno
import os
from types import ModuleType
from typing import Any

from ..core import ArchiveReader
from ..folder import PackedFolder
from ..format import NAME_MAX, S_IFDIR, S_IFLNK, name_length_problem, path_name_problem
from .common import FuseError, LogOnce, kernel_attributes, read_only, translated

__all__ = ["PackfsOperations", "fuse_class"]


class PackfsOperations:
    """FUSE callbacks for one archive.  Each looks the path up in the table and
    returns what the kernel needs; no state is kept per file.

    Parameters
    ----------
    archive
        The open archive: an :class:`packfs.core.ArchiveReader` (an Archive or a ShardSet; a mount opens one with the
        ``"once"`` checksum policy: each file is checked the first time it is read), or
        a PackedFolder, whose archive is used with its own policy.
    check_data
        Unused (the archive's policy decides); kept for callers that pass it.
    no_open
        Answer OPEN with ENOSYS: the kernel (Linux >= 4.19 for libfuse2 and 3 alike)
        then opens files without asking, keeps their pages cached, and sends no
        RELEASE; the CRC check moves to the first read.
    """

    use_ns = True  # st_*time as integer nanoseconds

    def __init__(self, archive: ArchiveReader | PackedFolder, check_data: bool = True, no_open: bool = False) -> None:
        self.archive = archive.archive if isinstance(archive, PackedFolder) else archive
        self.no_open = no_open
        self.log_once = LogOnce()
        archive = self.archive
        self._statfs = {
            "f_bsize": 4096, "f_frsize": 4096,
            "f_blocks": (archive.size + 4095) // 4096, "f_bfree": 0, "f_bavail": 0,
            "f_files": archive.entry_count, "f_ffree": 0, "f_favail": 0,
            "f_namemax": 255,
        }

    def __call__(self, operation: str, *args: Any) -> Any:
        # fusepy dispatches every callback through the operations object's __call__.
        method = getattr(self, operation, None)
        if method is None:
            raise FuseError(errno.ENOSYS)
        return method(*args)

    def _entry(self, path: str) -> int:
        # FUSE hands us canonical absolute paths, so the table key is the path minus "/".
        key = os.fsencode(path)[1:]
        if path_name_problem(key):
            # As a disk's file system answers (format section 5): such a name is never
            # listed, and the kernel passes names of up to 1,024 bytes or more.
            raise FuseError(errno.ENAMETOOLONG)
        entry = self.archive.find(key)
        if entry < 0:
            raise FuseError(errno.ENOENT)
        return entry

    @translated
    def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
        """GETATTR: the entry's attributes, with values the kernel cannot take clamped."""
        return kernel_attributes(self.archive.stat(self._entry(path)))

    @translated
    def listing(self, path: bytes) -> tuple[int, list[int], list[bytes], list[int]]:
        """Directory ``path`` (as FUSE passes it, bytes): its entry, and its children's
        inode numbers, names and modes; every table value used is checked here, where
        a damaged table becomes EIO."""
        entry = self.archive.find(path[1:])
        if entry < 0:
            raise FuseError(errno.ENOENT)
        if self.archive.file_type(entry) != S_IFDIR:
            raise FuseError(errno.ENOTDIR)
        _, names, modes, inodes = self.archive.listing_with_inodes(entry)
        if names and max(map(len, names)) > NAME_MAX:
            names, modes, inodes = self._without_long_names(path, names, modes, inodes)
        return entry, inodes, names, modes

    def _without_long_names(self, path: bytes, names: list[bytes], modes: list[int],
                            inodes: list[int]) -> tuple[list[bytes], list[int], list[int]]:
        """A listing without its names over NAME_MAX bytes (format section 5), each
        logged once: one such name must not cost the directory its listing."""
        kept = [k for k, name in enumerate(names) if len(name) <= NAME_MAX]
        for name in names:
            problem = name_length_problem(name)
            if problem:
                # The name last: the log keeps the first 1,000 characters of a message.
                self.log_once(f"{os.fsdecode(path)!r}: {problem} (NAME_MAX), left out of the listing: "
                              f"{os.fsdecode(name)!r}")
        return [names[k] for k in kept], [modes[k] for k in kept], [inodes[k] for k in kept]

    def readdir(self, path: str, fh: int) -> list[Any]:
        """The listing in the bindings' generic form.  Mounts use the faster readdir of
        :func:`fuse_class`, which hands the same entries straight to libfuse."""
        entry, inodes, names, modes = self.listing(os.fsencode(path))
        listing: list[Any] = [(".", {"st_mode": S_IFDIR, "st_ino": entry + 1}, 0),
                              ("..", None, 0)]
        for inode, name, mode in zip(inodes, names, modes):
            # The file type lets find and os.walk skip a getattr per entry (d_type).
            listing.append((os.fsdecode(name), {"st_mode": mode, "st_ino": inode}, 0))
        return listing

    @translated
    def readlink(self, path: str) -> str:
        """READLINK: the target, checked like every reader's; EINVAL for a non-symlink."""
        entry = self._entry(path)
        if self.archive.file_type(entry) != S_IFLNK:
            raise FuseError(errno.EINVAL)
        return os.fsdecode(self.archive.readlink(entry))

    def _file(self, path: str) -> int:
        entry = self._entry(path)
        if self.archive.file_type(entry) == S_IFDIR:
            raise FuseError(errno.EISDIR)
        return entry

    @translated
    def open(self, path: str, flags: int) -> int:
        """OPEN: EROFS for writes; ENOSYS for files with ``no_open`` (the kernel then stops asking)."""
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & (os.O_TRUNC | os.O_CREAT):
            raise FuseError(errno.EROFS)
        entry = self._entry(path)
        if self.no_open and self.archive.file_type(entry) != S_IFDIR:
            # ENOSYS tells the kernel to stop sending OPEN and RELEASE (and to keep pages
            # cached), so a warm read never enters Python.  read() then resolves the path
            # itself, and the archive checks the CRC at the first read.
            raise FuseError(errno.ENOSYS)
        if self.archive.file_type(entry) == S_IFDIR:
            raise FuseError(errno.EISDIR)
        self.archive.check(entry)
        # The handle is entry + 1 (0 means "no handle"): nothing to track or leak.
        return entry + 1

    @translated
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        """READ: up to ``size`` bytes at ``offset``, with pread; the archive checks the
        file's CRC under its policy (a mount's: once, at the first read)."""
        if fh:
            entry = fh - 1
            if not 0 <= entry < self.archive.entry_count:
                raise FuseError(errno.EBADF)
        else:
            entry = self._file(path)
        return self.archive.read(entry, offset, size)

    @translated
    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        """GETXATTR: the attribute's value, ENODATA for one the entry lacks.  An archive
        without attributes answers ENOSYS, so the kernel stops asking (ls asks for
        security.selinux of every file it lists) and getxattr(2) says EOPNOTSUPP."""
        archive = self.archive
        if not archive.xattr_entries:
            raise FuseError(errno.ENOSYS)
        wanted = os.fsencode(name)
        for attribute, value in archive.xattrs(self._entry(path)):
            if attribute == wanted:
                return value
        raise FuseError(errno.ENODATA)

    @translated
    def listxattr(self, path: str) -> list[str]:
        """LISTXATTR: the entry's attribute names (none, for an archive without any)."""
        entry = self._entry(path)
        return [os.fsdecode(name) for name, _ in self.archive.xattrs(entry)] if self.archive.xattr_entries else []

    @translated
    def statfs(self, path: str) -> dict[str, int]:
        """STATFS: the archive's size in blocks and the entry count; nothing free."""
        return self._statfs

    @translated
    def access(self, path: str, mode: int) -> None:
        """ACCESS: ENOENT for a missing path, EROFS when asked for write access."""
        self._entry(path)
        if mode & os.W_OK:
            raise FuseError(errno.EROFS)

    # Every change fails with EROFS (the kernel already refuses most on an "ro" mount).
    chmod = chown = create = link = mkdir = mknod = rename = rmdir = symlink = read_only
    truncate = unlink = utimens = write = setxattr = removexattr = read_only


# libfuse's fuse_fill_dir_t called without ctypes' per-argument type checks: every
# argument below is already a ctypes object of the exact C type.
_UNCHECKED_FILLER = ctypes.CFUNCTYPE(ctypes.c_int)


def fuse_class(binding: ModuleType) -> type:
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
        address = ctypes.cast(filler, ctypes.c_void_p).value
        if address is None:  # libfuse always passes its filler; a NULL one is an I/O error, not a crash
            return -errno.EIO
        add = _UNCHECKED_FILLER(address)
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

