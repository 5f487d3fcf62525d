"""The disk cache's directory, private to the user who reads through it.

Whoever can write a cache directory decides the bytes its other readers get: a block's
CRC in its slot is not a secret (CRC-32 is linear: forged in milliseconds), and a link
planted where packfs creates a file makes it write, truncate or delete through it.  So
a cache directory is one user's: packfs uses it only if it (and each level below it
that packfs uses: ``v1/``, each archive's directory, ``tails-v1/``) is a real
directory, not a symlink, owned by the effective user and not writable by group or
others.  What packfs creates there is 0700 (directories) and 0600 (files); a
directory of its own that others may read (made by an older packfs, 0755) is made
0700.  Anything else (a directory owned by another user, group- or world-writable, a
symlink) and the archive is read without a disk cache, with one warning naming the
directory and why; ``packfs cache`` says so as an error.

The cache's directory is opened once per process (``O_DIRECTORY | O_NOFOLLOW``) and
every file below it opened relative to that descriptor, files with ``O_NOFOLLOW``:
a directory above it that others can write (``/tmp``, a shared scratch) may be renamed
or replaced, but what packfs opens is the directory it checked.  Below it, no other
user can create anything (every level is checked private), so the names packfs
resolves there are its own.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from typing import Dict, Optional, Tuple

__all__ = ["UnsafeCacheDir", "private_root", "private_subdir", "forget_root", "DIR_FLAGS", "FILE_FLAGS"]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeCacheDir(OSError):
    """A cache directory that is not this user's alone; its message says why."""


_ROOTS: Dict[str, Tuple[int, Tuple[int, int]]] = {}  # absolute path -> (descriptor, (st_dev, st_ino))
_ROOTS_LOCK = threading.Lock()


def _check(fd: int, where: str) -> None:
    """Raise UnsafeCacheDir unless the directory open as ``fd`` is this user's alone;
    one of its own that others may read or enter is made 0700."""
    info = os.fstat(fd)
    uid = os.geteuid()
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeCacheDir(f"{where!r} is not a directory")
    if info.st_uid != uid:
        raise UnsafeCacheDir(f"{where!r} is owned by uid {info.st_uid}, not by this user (uid {uid})")
    if info.st_mode & 0o022:
        who = {0o022: "group and others", 0o020: "group", 0o002: "others"}[info.st_mode & 0o022]
        raise UnsafeCacheDir(f"{where!r} is writable by {who} (mode {stat.S_IMODE(info.st_mode):04o})")
    if info.st_mode & 0o077:
        os.fchmod(fd, 0o700)  # ours, readable by others (an older packfs made it 0755)


def _open_dir(name: str, dir_fd: Optional[int], where: str, create: bool) -> int:
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=dir_fd)
        except FileExistsError:
            pass
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
            except OSError:
                link = False
            if link:
                raise UnsafeCacheDir(f"{where!r} is a symlink") from None
        raise
    try:
        _check(fd, where)
    except BaseException:
        os.close(fd)
        raise
    return fd


def private_root(directory: str, create: bool = True) -> int:
    """A descriptor of the cache directory ``directory`` (absolute), created 0700 (its
    missing parents too) when ``create``; kept open for the process (one per directory)
    and checked again when the directory at that path is another (removed, made
    again).  UnsafeCacheDir if it is not this user's alone; OSError if it cannot be
    made or opened."""
    with _ROOTS_LOCK:
        kept = _ROOTS.get(directory)
        if kept is not None:
            try:
                info = os.stat(directory, follow_symlinks=False)
                if (info.st_dev, info.st_ino) == kept[1]:
                    return kept[0]
            except OSError:
                pass
        parent = os.path.dirname(directory)
        if create and parent and not os.path.isdir(parent):
            os.makedirs(parent, 0o700, exist_ok=True)
        fd = _open_dir(directory, None, directory, create)
        info = os.fstat(fd)
        if kept is not None:
            try:
                os.close(kept[0])
            except OSError:
                pass
        _ROOTS[directory] = (fd, (info.st_dev, info.st_ino))
        return fd


def forget_root(directory: str) -> None:
    """Look ``directory`` up again at its next :func:`private_root` (it was removed)."""
    with _ROOTS_LOCK:
        kept = _ROOTS.pop(directory, None)
    if kept is not None:
        try:
            os.close(kept[0])
        except OSError:
            pass


def private_subdir(root_fd: int, relative: str, root: str, create: bool = True) -> None:
    """Make (when ``create``) and check each level of ``relative`` (as ``v1/<key>``)
    below the cache directory open as ``root_fd`` (named ``root`` in messages):
    UnsafeCacheDir if one is not this user's alone."""
    fd = root_fd
    where = root
    try:
        for name in relative.split("/"):
            where = os.path.join(where, name)
            inner = _open_dir(name, fd, where, create)
            if fd != root_fd:
                os.close(fd)
            fd = inner
    finally:
        if fd != root_fd:
            os.close(fd)

