"""What every packfs FUSE daemon shares: the bindings, the name codec, the mapping of
errors to errno values, and the conversion of an entry's attributes to what the kernel
takes.  A daemon's callbacks go through :func:`translated`, so no exception ever
escapes into a binding.

Only this subpackage imports a FUSE binding, and lazily: fusepy raises OSError at import
when libfuse is missing, and ``packfs ls`` must work without it.
"""

from __future__ import annotations

import codecs
import errno
import functools
import logging
import os
from typing import Any, Callable, Protocol, TypeVar

from ..core import ArchiveReader, EntryStat
from ..errors import ArchiveChangedError, NotADirectoryPathError, NotAFileError, PackfsError, PathNotFoundError
from ..format import S_IFMT, S_IFREG

__all__ = ["BINDINGS", "DAEMONS", "DEFAULT_BINDING", "PYTHON_FALLBACK", "CACHE_SECONDS", "NAME_CODEC", "FuseError", "LogOnce", "translated",
           "kernel_attributes", "read_only", "log"]

log = logging.getLogger("packfs.mount")

# The Python path daemon runs on a binding: fusepy (libfuse2) is the one users asked
# for; mfusepy is its API-compatible, maintained successor on libfuse3.
BINDINGS = {"fusepy": "fuse", "mfusepy": "mfusepy"}
# The daemons ``--binding`` chooses between: "lowlevel" is the compiled inode daemon
# (packfs._lowlevel, fuse/inodedaemon.py); "auto" takes it where it can serve the
# archive and mfusepy otherwise, saying why in one line (process.choose_binding).
DAEMONS = ("auto", "lowlevel", "mfusepy", "fusepy")
DEFAULT_BINDING = "auto"
PYTHON_FALLBACK = "mfusepy"

# The archive never changes while mounted, so the kernel may cache everything for long.
CACHE_SECONDS = 86400

# fusepy decodes and encodes names with a fixed codec and strict errors, but POSIX names
# are bytes; this codec round-trips any byte through surrogateescape, as os.fsdecode does.
NAME_CODEC = "packfs_utf8_surrogateescape"


def _codec_search(name: str) -> codecs.CodecInfo | None:
    if name != NAME_CODEC:
        return None
    return codecs.CodecInfo(
        name=NAME_CODEC,
        encode=lambda text, errors="strict": codecs.utf_8_encode(text, "surrogateescape"),
        decode=lambda data, errors="strict": codecs.utf_8_decode(data, "surrogateescape", True),
    )


codecs.register(_codec_search)


Callback = TypeVar("Callback", bound=Callable[..., Any])


class FuseError(OSError):
    """An errno-carrying error for the binding (its FuseOSError is not importable here)."""

    def __init__(self, code: int) -> None:
        super().__init__(code, os.strerror(code))


_LOGGED_CHARACTERS = 1000


class LogOnce:
    """Logs each distinct message once, as an error.  Bounded in bytes: a message names
    a path, and a hostile archive's paths can be megabytes long (10,000 of them would
    be gigabytes); at most 10,000 messages of at most 1,000 characters are kept."""

    def __init__(self) -> None:
        self.messages: set[str] = set()

    def __call__(self, message: str) -> None:
        if len(message) > _LOGGED_CHARACTERS:
            message = message[: _LOGGED_CHARACTERS - 25] + f"... ({len(message)} characters)"
        if message not in self.messages and len(self.messages) < 10000:
            self.messages.add(message)
            log.error("%s", message)


class Daemon(Protocol):
    """What :func:`translated` needs of a daemon's callbacks object."""

    archive: ArchiveReader
    log_once: LogOnce


def translated(method: Callback) -> Callback:
    """Map every exception to an errno, so nothing escapes into the binding (fusepy's
    wrapper mishandles an OSError whose errno is None).

    | Error | errno |
    |---|---|
    | not found | ENOENT |
    | not a directory | ENOTDIR |
    | a file expected, not there | EISDIR |
    | a damaged or changed archive, or a bug | EIO, logged once |
    """

    @functools.wraps(method)
    def wrapper(self: Daemon, *args: Any) -> Any:
        try:
            result = method(self, *args)
            # Nothing read from an archive changed in place (cp over it) is answered:
            # the table and header are read through the map, which the SIGBUS guard
            # keeps from killing the daemon; this check turns what was read into EIO.
            self.archive.check_unchanged()
            return result
        except FuseError:
            raise
        except PathNotFoundError:
            raise FuseError(errno.ENOENT) from None
        except NotADirectoryPathError:
            raise FuseError(errno.ENOTDIR) from None
        except NotAFileError:
            raise FuseError(errno.EISDIR) from None
        except ArchiveChangedError as error:
            self.log_once(f"archive changed in place; remount: {error}")
            raise FuseError(errno.EIO) from None
        except PackfsError as error:
            self.log_once(f"{method.__name__} {args[0] if args else ''}: {error}")
            raise FuseError(errno.EIO) from None
        except Exception as error:  # a bug must not take the daemon down
            log.exception("unexpected error in %s %s", method.__name__, args[0] if args else "")
            self.log_once(f"{method.__name__}: {error!r}")
            raise FuseError(errno.EIO) from None

    return wrapper  # type: ignore[return-value]


def read_only(self: object, *args: Any) -> None:
    """Every change: EROFS (the kernel already refuses most on an "ro" mount)."""
    raise FuseError(errno.EROFS)


# The largest st_size (loff_t) and st_uid/st_gid ((uid_t)-1 means "none") a kernel takes.
_MAX_SIZE = 2**63 - 1
_MAX_ID = 2**32 - 2


def kernel_attributes(stat: EntryStat) -> dict[str, int]:
    """An entry's attributes as the bindings' ``st_*`` dict, clamped to what the kernel
    represents: it answers EIO for a whole stat whose size exceeds 2**63 - 1 (a hostile
    table's, which would hide even a directory), and 2**32 - 1 is (uid_t)-1, "no
    owner".  mtime needs nothing: any i64 of nanoseconds is a (seconds, nanoseconds)
    pair the kernel and libfuse accept."""
    mode, uid, gid, mtime, size, nlink, inode = stat
    if size > _MAX_SIZE:
        size = _MAX_SIZE
    if uid > _MAX_ID:
        uid = _MAX_ID
    if gid > _MAX_ID:
        gid = _MAX_ID
    return {
        "st_mode": mode,
        "st_ino": inode,  # hard links share their first name's
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
