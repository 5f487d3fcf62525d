"""The PackfsError hierarchy.

Every error packfs raises on purpose is a :class:`PackfsError`.  Where a built-in
exception already names the situation, the class derives from it too, so callers can
keep writing ``except FileNotFoundError`` (the pattern zarr uses).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

__all__ = [
    "PackfsError",
    "FormatError",
    "TooLargeToReadError",
    "ChecksumError",
    "RecordFileError",
    "ArchiveChangedError",
    "ClosedArchiveError",
    "PathNotFoundError",
    "ArchiveIOError",
    "RemoteArchiveError",
    "RemoteNotFoundError",
    "RemoteAccessError",
    "RemoteCredentialsError",
    "RemoteTimeoutError",
    "RemoteProtocolError",
    "RemoteIOError",
    "NotAFileError",
    "NotADirectoryPathError",
    "NotASymlinkError",
    "PackError",
    "PackSourceError",
    "UnpackError",
    "UnpackDamagedError",
    "MountError",
    "missing_dependency",
    "SkippedPath",
    "UnpackStats",
]


# The values two errors carry.  They live here, at the bottom, so that this module
# imports nothing of packfs: packfs.write and packfs.extract re-export them.

class SkippedPath(NamedTuple):
    """A path a pack left out of the archive, and why.

    ``failed`` is True for a path that was to be packed but could not be read whole
    (unreadable, vanished, or changing while it was read: only with ``keep_going``),
    False for what an archive does not hold (FIFOs, sockets, devices, symlink loops,
    unsafe tar or zip members).
    """

    path: str
    reason: str
    failed: bool = False


@dataclass(frozen=True)
class UnpackStats:
    """What unpack wrote, and what it left out."""

    files: int
    dirs: int
    symlinks: int
    hardlinks: int
    bytes: int
    existing: int = 0  # files and symlinks already in the destination (skip_existing), left as they were
    damaged: tuple[tuple[str, str], ...] = ()  # (path, why) of each entry left out because of damage
    xattrs: int = 0  # extended attributes restored
    xattrs_not_restored: int = 0  # refused by DEST (not permitted, or not supported), each warned about

    @property
    def skipped(self) -> int:
        """How many entries were left out as damaged."""
        return len(self.damaged)


class PackfsError(Exception):
    """Raised for any error packfs reports on purpose; the base of all others."""


class FormatError(PackfsError, ValueError):
    """Raised when a file is not a valid archive: bad magic, unsupported version, truncation."""


class TooLargeToReadError(PackfsError, MemoryError):
    """Raised when a whole file is asked for in memory and its decoded size (a sparse
    or compressed file, format 1.5, may declare far more than the archive holds) is
    over half this machine's memory: read it in parts (``open``, ``read_chunks``)."""


class ChecksumError(FormatError):
    """Raised when a stored CRC-32 does not match the bytes it covers."""


class RecordFileError(FormatError):
    """Raised when an archive of files is expected and the file is an FFRecord record
    file: a container of numbered records with no path table (what FFRecord's
    ``FileWriter`` and :class:`packfs.RecordWriter` write), read with
    :class:`packfs.RecordReader`.  ``path`` and ``record_count`` say which file and
    how many records it holds, ``description`` what it is, in words."""

    def __init__(self, message: str, path: str, record_count: int, description: str) -> None:
        super().__init__(message)
        self.path = path
        self.record_count = record_count
        self.description = description


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


class RemoteArchiveError(PackfsError, ValueError):
    """Raised when an archive named by a URL cannot be read: a scheme packfs does not
    read (packfs reads ``s3://``, ``http://`` and ``https://``), a URL given where only a
    local path will do (what to pack), or, through its subclasses, a server's refusal
    or failure.  No message carries a credential or a URL's query string."""


class RemoteNotFoundError(RemoteArchiveError, FileNotFoundError):
    """Raised when the server says the object at a URL does not exist (HTTP 404, S3
    NoSuchKey or NoSuchBucket)."""


class RemoteAccessError(RemoteArchiveError, PermissionError):
    """Raised when the server refuses access to the object at a URL (HTTP 401 or 403,
    S3 AccessDenied, credentials it does not accept)."""


class RemoteCredentialsError(RemoteAccessError):
    """Raised when an ``s3://`` URL is opened and no credentials are found: none in the
    ``storage_options``, the AWS environment variables or the shared files
    (``~/.aws/credentials``, ``~/.aws/config``), and no ``anon=True`` for a public bucket."""


class RemoteTimeoutError(RemoteArchiveError, TimeoutError):
    """Raised when a server did not answer, or did not finish an answer, within the
    timeout, on every try."""


class RemoteProtocolError(RemoteArchiveError):
    """Raised when a server's answer is not the one asked for, on every try: the whole
    object for a range request (a server that ignores ``Range``), another
    ``Content-Range`` than asked, a body shorter or longer than the range."""


class RemoteIOError(RemoteArchiveError, OSError):
    """Raised when a server kept failing (5xx, 429 or 503 SlowDown, connections reset
    or killed) until the retries ran out."""


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


def missing_dependency(error: ImportError, module: str, needed_by: str, extra: str, package: str = "") -> ImportError:
    """What to raise for ``error`` from importing the optional dependency ``module``
    (the distribution ``package``, if named otherwise): when ``module`` itself is not
    installed, a ModuleNotFoundError saying what needs it and the packfs extra that
    installs it (``extra``: ``"torch"``); any other failure (a broken install, a
    missing shared library) as it was."""
    if not isinstance(error, ModuleNotFoundError) or (error.name or "").split(".")[0] != module:
        return error
    what = f"{package} ({module})" if package else module
    return ModuleNotFoundError(
        f"{needed_by} needs {what}, which is not installed: pip install \"packfs[{extra}]\" "
        f"(in a clone of packfs: pip install -e \".[{extra}]\")", name=module)
