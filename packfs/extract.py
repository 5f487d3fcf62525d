"""unpack(): restore an archive's tree on disk, never writing outside the destination.

Every create is relative to an open directory descriptor and uses O_EXCL | O_NOFOLLOW
(mkdir, symlink and link never follow a final symlink), and names are single
components (the table forbids "/", ".", ".." and NUL).  So no symlink in the archive,
or already in the destination, can redirect a write elsewhere.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Callable, Sequence

from .errors import ChecksumError, UnpackError
from .format import crc32
from .pathtable import S_IFDIR, S_IFLNK
from .reader import PackedFolder, PathArg, _key

__all__ = ["unpack", "UnpackStats"]

_CHUNK = 1 << 20


@dataclass(frozen=True)
class UnpackStats:
    """What unpack wrote."""

    files: int
    dirs: int
    symlinks: int
    hardlinks: int
    bytes: int


class _Extractor:
    def __init__(self, folder: PackedFolder, dest_fd: int, dest: str,
                 progress: Callable[[int], None] | None) -> None:
        self.folder = folder
        self.table = folder._table
        self.container = folder._container
        self.dest_fd = dest_fd
        self.dest = dest
        self.progress = progress
        self.as_root = os.geteuid() == 0
        self.first_path: dict[int, bytes] = {}  # record -> where it was first written
        self.counts = {"files": 0, "dirs": 0, "symlinks": 0, "hardlinks": 0, "bytes": 0}

    def _error(self, relative: bytes, what: str) -> UnpackError:
        return UnpackError(f"cannot unpack {os.fsdecode(relative)!r} into {self.dest!r}: {what}")

    def _attributes(self, entry: int) -> tuple[int, int, int, int]:
        mode, uid, gid, mtime_ns, _, _ = self.table.attributes(entry)
        return mode & 0o7777, uid, gid, mtime_ns

    def open_dir(self, parent_fd: int, name: bytes, relative: bytes) -> int:
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            pass
        except OSError as error:
            raise self._error(relative, error.strerror) from None
        try:
            return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                           dir_fd=parent_fd)
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self._error(relative, "a non-directory is in the way") from None
            raise self._error(relative, error.strerror) from None

    def extract(self, entry: int, parent_fd: int, relative: bytes) -> None:
        table = self.table
        name = table.name(entry)
        kind = table.file_type(entry)
        mode, uid, gid, mtime_ns = self._attributes(entry)
        if kind == S_IFDIR:
            fd = self.open_dir(parent_fd, name, relative) if entry else os.dup(parent_fd)
            try:
                for child in table.children(entry):
                    child_name = table.name(child)
                    self.extract(child, fd, relative + b"/" + child_name if relative else child_name)
                # Attributes last: a read-only directory must not block its children.
                if self.as_root:
                    os.fchown(fd, uid, gid)
                os.fchmod(fd, mode)
                os.utime(fd, ns=(mtime_ns, mtime_ns))
            finally:
                os.close(fd)
            self.counts["dirs"] += 1
            return
        record = table.record(entry)
        try:
            if kind == S_IFLNK:
                target = self.folder._link_target(entry, repr(os.fsdecode(relative)), check=True)
                os.symlink(target, name, dir_fd=parent_fd)
                if self.as_root:
                    os.chown(name, uid, gid, dir_fd=parent_fd, follow_symlinks=False)
                os.utime(name, ns=(mtime_ns, mtime_ns), dir_fd=parent_fd, follow_symlinks=False)
                self.counts["symlinks"] += 1
            elif record in self.first_path:
                os.link(self.first_path[record], name, src_dir_fd=self.dest_fd,
                        dst_dir_fd=parent_fd, follow_symlinks=False)
                self.counts["hardlinks"] += 1
            else:
                self._write_file(record, name, parent_fd, relative, mode, uid, gid, mtime_ns)
                self.first_path[record] = relative
        except FileExistsError:
            raise self._error(relative, "it already exists (unpack never overwrites)") from None
        except OSError as error:
            raise self._error(relative, error.strerror) from None

    def _write_file(self, record: int, name: bytes, parent_fd: int, relative: bytes,
                    mode: int, uid: int, gid: int, mtime_ns: int) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o600, dir_fd=parent_fd)
        try:
            view = self.container.record_view(record)
            value = 0
            try:
                for start in range(0, len(view), _CHUNK):
                    chunk = view[start : start + _CHUNK]
                    value = crc32(chunk, value)
                    written = 0
                    while written < len(chunk):
                        written += os.write(fd, chunk[written:])
                    if self.progress is not None:
                        self.progress(len(chunk))
            finally:
                view.release()
            if value != self.container.stored_crc(record):
                raise ChecksumError(
                    f"{self.folder.path!r}: {os.fsdecode(relative)!r}: checksum mismatch; "
                    f"the damaged file was not unpacked"
                )
            if self.as_root:
                os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)
            os.utime(fd, ns=(mtime_ns, mtime_ns))
        except BaseException:
            os.close(fd)
            os.unlink(name, dir_fd=parent_fd)
            raise
        os.close(fd)
        self.counts["files"] += 1
        self.counts["bytes"] += self.container.record_length(record)


def unpack(
    folder: PackedFolder,
    dest: PathArg,
    paths: Sequence[PathArg] = (),
    progress: Callable[[int], None] | None = None,
) -> UnpackStats:
    """Extract ``paths`` (default: everything) from ``folder`` into ``dest``.

    Modes, mtimes, symlinks, hard links and empty directories are restored, and owners
    when running as root.  Existing files are never overwritten.

    Raises
    ------
    UnpackError
        Something is in the way, or the destination cannot be written.
    ChecksumError
        A file's contents fail their CRC (that file is removed again).
    """
    dest_text = os.fsdecode(dest)
    try:
        os.makedirs(dest_text, exist_ok=True)
        dest_fd = os.open(dest_text, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise UnpackError(f"cannot unpack into {dest_text!r}: {error.strerror}") from None
    try:
        extractor = _Extractor(folder, dest_fd, dest_text, progress)
        for path in paths or [""]:
            key = _key(path)
            entry = folder._find(key, follow=False)
            if entry == 0:
                extractor.extract(0, dest_fd, b"")
                continue
            # Create the leading directories (with their archived attributes left to
            # a full unpack), then the entry itself.
            parts = key.split(b"/")
            fd = os.dup(dest_fd)
            try:
                for depth in range(len(parts) - 1):
                    next_fd = extractor.open_dir(fd, parts[depth], b"/".join(parts[: depth + 1]))
                    os.close(fd)
                    fd = next_fd
                extractor.extract(entry, fd, key)
            finally:
                os.close(fd)
    finally:
        os.close(dest_fd)
    counts = extractor.counts
    return UnpackStats(counts["files"], counts["dirs"], counts["symlinks"], counts["hardlinks"], counts["bytes"])
