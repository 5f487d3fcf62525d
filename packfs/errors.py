"""The PackfsError hierarchy.

Every error packfs raises on purpose is a :class:`PackfsError`.  Where a built-in
exception already names the situation, the class derives from it too, so callers can
keep writing ``except FileNotFoundError`` (the pattern zarr uses).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .extract import UnpackStats
    from .write import SkippedPath

__all__ = [
    "PackfsError",
    "FormatError",
    "ChecksumError",
    "ArchiveChangedError",
    "ClosedArchiveError",
    "PathNotFoundError",
    "ArchiveIOError",
    "NotAFileError",
    "NotADirectoryPathError",
    "NotASymlinkError",
    "PackError",
    "PackSourceError",
    "UnpackError",
    "UnpackDamagedError",
    "MountError",
]


class PackfsError(Exception):
    """Raised for any error packfs reports on purpose; the base of all others."""


class FormatError(PackfsError, ValueError):
    """Raised when a file is not a valid archive: bad magic, unsupported version, truncation."""


class ChecksumError(FormatError):
    """Raised when a stored CRC-32 does not match the bytes it covers."""


class ArchiveChangedError(FormatError):
    """Raised when an open archive was overwritten or truncated in place (``cp`` over
    it): what it held can no longer be read.  Reopen it; replace archives with a
    rename, as packfs itself does."""


class ClosedArchiveError(PackfsError, ValueError):
    """Raised when a closed archive (or a dataset over one) is used, as a closed file
    raises ValueError."""


class PathNotFoundError(PackfsError, FileNotFoundError):
    """Raised when a path does not exist: in the archive, or the archive file itself."""


class ArchiveIOError(PackfsError, OSError):
    """Raised when the archive file cannot be opened or read (permissions, I/O errors)."""


class NotAFileError(PackfsError, IsADirectoryError):
    """Raised when file contents are asked of something that is not a regular file
    (a directory in the archive, or a directory given as the archive)."""


class NotADirectoryPathError(PackfsError, NotADirectoryError):
    """Raised when a directory operation is given a path that is not a directory."""


class NotASymlinkError(PackfsError, ValueError):
    """Raised when a symlink operation is given a path that is not a symlink."""


class PackError(PackfsError):
    """Raised when the writer rejects its input or cannot finish the archive."""


class PackSourceError(PackError):
    """Raised by pack_folder (without ``keep_going``) when paths in the tree cannot be
    packed: unreadable, vanished, or changing while read.  Nothing is written;
    ``failed`` lists every one found, as SkippedPath(path, reason, failed=True)."""

    def __init__(self, failed: Sequence[SkippedPath]) -> None:
        self.failed = tuple(failed)
        first = f"{failed[0].path!r}: {failed[0].reason}"
        text = first if len(failed) == 1 else f"{len(failed)} paths cannot be packed ({first}, and {len(failed) - 1} more)"
        super().__init__(f"{text}; nothing was written (--keep-going packs the rest)")


class UnpackError(PackfsError):
    """Raised when extraction cannot write an entry safely inside the destination."""


class UnpackDamagedError(UnpackError, ChecksumError):
    """Raised by unpack once everything intact has been unpacked, when some files were
    damaged and left out; ``stats`` (an UnpackStats) lists them in ``stats.damaged``,
    with what was written."""

    def __init__(self, message: str, stats: UnpackStats) -> None:
        super().__init__(message)
        self.stats = stats


class MountError(PackfsError):
    """Raised when FUSE is unavailable or a mount point cannot be mounted or unmounted."""
