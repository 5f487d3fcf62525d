"""A local archive file as a byte source: a descriptor for ``pread``, a read-only
memory map for zero-copy access, and the checks that the file has not changed.

``cp new.ffr data.ffr`` truncates data.ffr and writes it again, in place.  Reading a
mapped page past the file's new end is SIGBUS; reading one the writer already rewrote
gives the new archive's bytes.  So (1) file contents are read with ``pread``, or
copied from the map only while the SIGBUS guard covers it; (2) the header and the
path table are read through the map, guarded by :mod:`packfs._sigbus` when it is
built (a fault there maps zeros over the map and is counted); (3) every operation
ends with :meth:`LocalFile.check_unchanged`, which raises ArchiveChangedError if the
map faulted or fstat shows another size or mtime than at open, before anything read
is returned.  (A write or truncation sets mtime before it changes a byte.  Not
detected: a rewrite that leaves size and mtime as they were, e.g. one within the
same clock tick as the archive's own last write on a file system with coarse
timestamps, or a ``cp -p`` of a file of the same size and mtime.)  Every value read
from the map is checked by the format code before it indexes anything, so zeros read
in between are harmless.  Once changed, always changed: the archive must be reopened.
"""

from __future__ import annotations

import mmap
import os
import re
import stat as stat_module
import weakref
from urllib.parse import unquote, urlsplit

from ..errors import (ArchiveChangedError, ArchiveIOError, ClosedArchiveError, FormatError, NotAFileError,
                      PathNotFoundError, RemoteArchiveError)

__all__ = ["LocalFile", "GUARDED", "release_pages", "url_error", "is_url"]

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(name: str) -> bool:
    """Whether ``name`` has the shape of a URL (``scheme://...``), and no local path of
    that shape exists (its directory does not)."""
    return isinstance(name, str) and bool(_URL.match(name)) and not os.path.isdir(os.path.dirname(name))


def absolute_location(name: str) -> str:
    """``name`` as it stays valid whatever the working directory later: a URL as it is,
    a local path (or pattern) made absolute.  What a reader that opens or re-opens a
    file later (a shard on first use, a DataLoader worker, a mount's daemon, which
    serves from ``/``) keeps."""
    return name if is_url(name) else os.path.abspath(name)


def shown_location(name: str) -> str:
    """``name`` as it may be shown, logged or kept where others see it (messages,
    ``repr``, ``/proc/mounts``, a daemon's command line): a URL without its user,
    password, query string or fragment (:func:`packfs.source.remote.public_url`), a
    local path as it is.  What opens the archive keeps ``name`` itself."""
    if not is_url(name):
        return name
    from .remote import public_url

    return public_url(name)


def url_error(name: str) -> RemoteArchiveError | None:
    """The error for ``name``, a path that does not exist, when it is a URL
    (``scheme://...``) that a local open was given: a URL, not a missing file.  None
    for anything else, a local path of that shape included (its directory exists)."""
    if not is_url(name):
        return None
    parts = urlsplit(name)
    scheme = parts.scheme.lower()
    if scheme == "file" and parts.netloc in ("", "localhost"):
        return RemoteArchiveError(f"{name!r} is a file:// URL: give the path itself, {unquote(parts.path)!r}")
    if scheme not in ("s3", "http", "https"):
        return RemoteArchiveError(f"{name!r}: {scheme}:// URLs are not supported: packfs reads archives at s3://, "
                                  f"http:// and https:// URLs and local paths")
    # A URL packfs reads archives at, given where only a local file will do (pack's SRC).
    return RemoteArchiveError(
        f"{name!r}: a URL, where a local path is expected (packfs reads archives at URLs, but packs local "
        f"directories, tars and zips: download it first)"
    )

# The SIGBUS guard (packfs/_sigbus.c, built where a C compiler is found): with it, an
# archive truncated under its map is an ArchiveChangedError from the next check, not a
# dead process.  Without it, readers check the file's size before they touch the map,
# which leaves a window (a truncation between that check and the access) that kills.
try:
    from .. import _sigbus
except ImportError:  # not built: no compiler or no Python headers at install time
    _sigbus = None  # type: ignore[assignment]
GUARDED = _sigbus is not None and not os.environ.get("PACKFS_NO_SIGBUS_GUARD")
_CHANGED_WHY = {1: "it was truncated under its memory map", 2: "its size or mtime differ from when it was opened",
                3: "it can no longer be examined (fstat failed)"}


def release_pages(mm: mmap.mmap, start: int, end: int) -> None:
    """Drop our mapping of [start, end) so one-off scans do not stay in RSS."""
    page = mmap.PAGESIZE
    start -= start % page
    end = min(end, len(mm))
    if end > start:
        try:
            mm.madvise(mmap.MADV_DONTNEED, start, end - start)
        except (AttributeError, OSError, ValueError):
            pass  # only a memory hint; correctness does not depend on it


class LocalFile:
    """A local file's bytes, as they were when it was opened.

    Parameters
    ----------
    path
        The file.

    Attributes
    ----------
    name
        The path, for messages.
    size
        The file's size at open.
    identity
        (device, inode, size, mtime_ns) at open: equal for two opens of the same bytes.
    owner
        The file's (uid, gid, mtime_ns): what entries without their own show.
    mapping
        A read-only memory map of the whole file (slicing it gives bytes).  Reading it
        needs :meth:`check_before_map` first where the map is not :attr:`guarded`.
    guarded
        Whether the SIGBUS guard covers the map.

    Raises
    ------
    PathNotFoundError, NotAFileError, ArchiveIOError
        The file is missing, a directory, or cannot be opened.
    FormatError
        It is not a regular file.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.name = os.fspath(path)
        try:
            fd = os.open(self.name, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise url_error(self.name) or PathNotFoundError(f"{self.name!r}: no such file, expected an archive") from None
        except IsADirectoryError:
            raise NotAFileError(f"{self.name!r} is a directory, expected an archive file") from None
        except OSError as error:
            raise ArchiveIOError(error.errno, f"{self.name!r}: cannot open: {error.strerror}") from None
        try:
            info = os.fstat(fd)
            if stat_module.S_ISDIR(info.st_mode):
                raise NotAFileError(f"{self.name!r} is a directory, expected an archive file")
            if not stat_module.S_ISREG(info.st_mode):
                raise FormatError(f"{self.name!r}: not a regular file, expected an archive file")
            self.size = info.st_size
            # What a write or truncation changes (ctime is not compared: unlinking the
            # file, or a rename over its name, changes it too, and the contents stay).
            self.identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
            self.owner = (info.st_uid, info.st_gid, info.st_mtime_ns)
            # An empty file cannot be mapped; it is no archive either, which the format
            # code says after reading its (missing) header.
            mapping = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if self.size else b""
            self.mapping = mapping
            self._guard = _sigbus.register(mapping, fd) if GUARDED and isinstance(mapping, mmap.mmap) else -1
        except BaseException:
            os.close(fd)
            raise
        # Unguarded (no extension, or every slot taken): check the size before each use
        # of the map, and compare fstat after; guarded, the handler makes the map safe.
        self.guarded = self._guard >= 0
        self._changed = ""
        if self.guarded:
            # Unregistered when the map itself goes (it may outlive this object: a
            # read_view, a numpy column), or by close().
            self._unguard = weakref.finalize(self.mapping, _sigbus.unregister, self._guard)
        # Closed with the object if nobody calls close() (datasets are dropped, not
        # closed), as the map itself is.
        self._fd = fd
        self._close_fd = weakref.finalize(self, os.close, fd)

    def fileno(self) -> int:
        """The open file's descriptor (for a compiled reader that preads it itself)."""
        return self._fd

    @property
    def guard_slot(self) -> int:
        """The map's packfs._sigbus slot (-1 when not :attr:`guarded`): a compiled reader
        of the map checks it after each operation, as :meth:`check_unchanged` does."""
        return self._guard

    # -- reading -----------------------------------------------------------------------

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end) read with pread(): no page joins this process's RSS.
        ArchiveChangedError if fewer are there (the file shrank)."""
        data = os.pread(self._fd, end - start, start)
        if len(data) != end - start:
            # Linux returns at most 2 GiB - 4 KiB per call: a larger read comes in parts.
            parts = [data]
            got = len(data)
            while data and got < end - start:
                data = os.pread(self._fd, end - start - got, start + got)
                parts.append(data)
                got += len(data)
            if got != end - start:
                self._note_change(f"{got} bytes at offset {start}, expected {end - start}")
            data = b"".join(parts)
        return data

    def readinto(self, buffer: memoryview, start: int) -> None:
        """Fill ``buffer`` (a byte-format memoryview) with the bytes from ``start`` on;
        ArchiveChangedError if fewer are there."""
        got = 0
        while got < len(buffer):
            count = os.preadv(self._fd, [buffer[got:]], start + got)
            if count <= 0:
                self._note_change(f"nothing to read at offset {start + got}, expected {len(buffer) - got} more bytes")
            got += count

    def release(self, start: int, end: int) -> None:
        """Drop mapped pages of [start, end) from this process (a memory hint)."""
        if self.size:
            release_pages(self.mapping, start, end)  # type: ignore[arg-type]

    # -- the file changing under its readers -----------------------------------------

    def check_before_map(self) -> None:
        """The check before a use of the map, for an unguarded map: raise
        ArchiveChangedError if the file is now shorter than when it was opened (one
        lseek, about 0.2 us).  Touching a mapped page past a file's new end is SIGBUS;
        a truncation between this check and the access still is, which the guard closes.
        """
        if self._changed:
            raise self._changed_error()
        if self.guarded:
            return
        size = os.lseek(self._fd, 0, os.SEEK_END)
        if size < self.size:
            self._note_change(f"it shrank to {size} bytes (it had {self.size})")

    def check_unchanged(self) -> None:
        """The check after an operation that read the file: raise ArchiveChangedError if
        it was truncated or rewritten since it was opened (a fault on the map, or
        another size or mtime), so nothing read from a changed file is returned.
        About 0.2 us (one fstat, in C) when guarded."""
        if self.guarded:
            reason = _sigbus.check(self._guard)
            if reason:
                self._changed = _CHANGED_WHY.get(reason, f"reason {reason}")
        elif not self._changed:
            info = os.fstat(self._fd)
            if (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns) != self.identity:
                self._changed = _CHANGED_WHY[2]
        if self._changed:
            raise self._changed_error()

    def _note_change(self, why: str) -> None:
        if not self._changed:
            self._changed = why
        raise self._changed_error()

    def _changed_error(self) -> ArchiveChangedError:
        return ArchiveChangedError(
            f"{self.name!r}: the archive changed while open (overwritten or truncated in place: "
            f"{self._changed}): reopen it; replace archives with a rename (packfs does), not by writing "
            f"over them"
        )

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Unmap and close; a map still exported (a caller's memoryview) is unmapped,
        and its guard dropped, when the last view of it is released."""
        mm = self.__dict__.pop("mapping", None)
        if isinstance(mm, mmap.mmap):
            if self.guarded:
                # Before the unmap, never after: a slot over addresses that are no longer
                # this map would take another mapping's SIGBUS for its own.
                self._unguard()
            try:
                mm.close()
            except BufferError:
                # A caller still holds a view: the map closes when it is released, so
                # guard it again until then.
                if self.guarded and "_fd" in self.__dict__:
                    self._guard = _sigbus.register(mm, self._fd)
                    if self._guard >= 0:
                        self._unguard = weakref.finalize(mm, _sigbus.unregister, self._guard)
        if self.__dict__.pop("_fd", None) is not None:
            self._close_fd()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return "mapping" not in self.__dict__

    def __getattr__(self, name: str) -> object:
        # Only for attributes that are missing: after close(), the map and the
        # descriptor.  A closed source is a ClosedArchiveError, not an AttributeError.
        if "mapping" not in self.__dict__ and "name" in self.__dict__:
            raise ClosedArchiveError(f"{self.name!r}: I/O operation on a closed archive")
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"LocalFile({self.name!r})"
