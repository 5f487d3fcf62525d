"""Walking the directory tree pack_folder packs: what is in it, in pack's order.

The scan lists each directory through its parent's descriptor, so neither depth nor
path length has a limit, and stats and reads the extended attributes of every entry;
``packfs.write.pack`` then writes the files (each read through :func:`open_beneath`).
"""

from __future__ import annotations

import errno
import logging
import os
import stat as stat_module
from dataclasses import dataclass
from typing import Iterator, Tuple

from ..errors import PackError
from .exclude import ExcludePatterns
from .skips import SkipList

__all__ = ["Scanned", "open_beneath", "read_xattrs", "scan_tree"]

log = logging.getLogger("packfs")

# (name, key, stat, symlink text, extended attributes) of a directory's child.
_Child = Tuple[bytes, bytes, os.stat_result, "bytes | None", "dict[bytes, bytes] | None"]

# Errors that mean "this file system keeps no extended attributes", not a problem.
_NO_XATTR_SUPPORT = (errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS)


def read_xattrs(path: bytes, follow_symlinks: bool, label: str) -> dict[bytes, bytes] | None:
    """The extended attributes of ``path`` (None for none), as the OS lists them for
    this user (an unprivileged one sees no trusted.* names).  A name the format cannot
    store, or one that cannot be read, is left out with a warning."""
    try:
        names = os.listxattr(path, follow_symlinks=follow_symlinks)
    except OSError as error:
        if error.errno not in _NO_XATTR_SUPPORT:
            log.warning("%r: cannot list extended attributes (%s), packed without them", label, error.strerror)
        return None
    if not names:
        return None
    from ..format import XATTR_SIZE_MAX, xattr_name_problem

    found: dict[bytes, bytes] = {}
    for name in names:
        raw = os.fsencode(name)
        problem = xattr_name_problem(raw)
        if problem:
            log.warning("%r: extended attribute with %s not packed", label, problem)
            continue
        try:
            value = os.getxattr(path, name, follow_symlinks=follow_symlinks)
        except OSError as error:
            if error.errno != errno.ENODATA:  # removed since it was listed: nothing to keep
                log.warning("%r: cannot read extended attribute %r (%s), not packed", label, name, error.strerror)
            continue
        if len(value) > XATTR_SIZE_MAX:
            log.warning("%r: extended attribute %r of %d bytes not packed (at most %d)", label, name,
                        len(value), XATTR_SIZE_MAX)
            continue
        found[raw] = value
    return found or None


@dataclass
class Scanned:
    """One entry of the tree, as the scan met it."""

    key: bytes
    kind: str
    info: os.stat_result
    target: bytes | None = None  # symlink text, or the first path of a hard link
    xattrs: dict[bytes, bytes] | None = None


# Paths longer than this are opened in pieces (PATH_MAX is 4,096 on Linux; a tree
# 10,000 levels deep has 20,000-byte paths).
_PATH_PIECE = 2048
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def open_beneath(root: bytes, key: bytes, flags: int, relative_to: int | None = None) -> int:
    """Open ``root/key`` however long the path (or ``key`` relative to the directory
    descriptor ``relative_to``): in pieces shorter than PATH_MAX, each opened
    relative to the directory the previous piece reached."""
    if relative_to is None:
        if len(root) + len(key) < _PATH_PIECE:
            return os.open(root + b"/" + key if key else root, flags)
        fd = os.open(root, _DIRECTORY_FLAGS)
    elif len(key) < _PATH_PIECE:
        return os.open(key, flags, dir_fd=relative_to)
    else:
        fd = os.dup(relative_to)
    try:
        position = 0
        while True:
            if len(key) - position < _PATH_PIECE:
                return os.open(key[position:], flags, dir_fd=fd)
            cut = key.rfind(b"/", position, position + _PATH_PIECE)
            if cut <= position:  # a single name longer than a piece: the OS refuses it
                return os.open(key[position:], flags, dir_fd=fd)
            below = os.open(key[position:cut], _DIRECTORY_FLAGS, dir_fd=fd)
            os.close(fd)
            fd, position = below, cut + 1
    finally:
        os.close(fd)


# At most this many directory descriptors stay open while scanning (one per level of
# the current path); a level whose descriptor was closed is reopened if it is needed.
_HELD_DIRECTORIES = 256


def scan_tree(
    src: bytes, follow_symlinks: bool, exclude: ExcludePatterns, skip: set[tuple[int, int]],
    temp_files: tuple[tuple[int, int], bytes], skips: SkipList, xattrs: bool = True,
) -> list[Scanned]:
    """Depth-first listing of ``src``, names sorted bytewise.  What cannot be listed or
    stat'ed below ``src`` goes to ``skips`` (a directory that cannot be listed stays, as
    an empty directory with its own attributes), and so do special files.

    Iterative, and each directory is opened relative to its parent's descriptor and
    its children stat'ed relative to its own, so neither depth nor path length has a
    limit and a tree of depth d costs O(d), not O(d**2), path resolution."""
    items: list[Scanned] = []
    first_link: dict[tuple[int, int], bytes] = {}
    root_info = os.stat(src) if follow_symlinks else os.lstat(src)
    items.append(Scanned(b"", "dir", root_info, None, read_xattrs(src, True, os.fsdecode(src)) if xattrs else None))
    root_identity = (root_info.st_dev, root_info.st_ino)
    # The directories on the current path, to recognise a symlink loop (-L).
    on_path = {root_identity}
    # A directory's own name is opened without following a symlink swapped in for it.
    open_flags = _DIRECTORY_FLAGS | (0 if follow_symlinks else os.O_NOFOLLOW)

    def path_of(key: bytes) -> str:
        return os.fsdecode(src + b"/" + key)

    def attributes(fd: int, name: bytes, child_key: bytes, info: os.stat_result) -> dict[bytes, bytes] | None:
        path = src + b"/" + child_key
        if len(path) >= _PATH_PIECE:  # too long to name: through the directory's descriptor
            path = b"/proc/self/fd/%d/%s" % (fd, name)
        follow = follow_symlinks and not stat_module.S_ISLNK(info.st_mode)
        return read_xattrs(path, follow, path_of(child_key))

    def children(fd: int, key: bytes, identity: tuple[int, int]) -> list[_Child]:
        """(name, key, info, symlink text, attributes) of each child of directory ``key`` to pack."""
        try:
            # listdir of a descriptor gives str: back to the names' exact bytes.
            names = sorted(map(os.fsencode, os.listdir(fd)))
        except OSError as error:
            if not key:
                raise PackError(f"cannot list {os.fsdecode(src)!r}: {error.strerror}") from None
            skips.add(path_of(key), f"cannot list: {error.strerror}", failed=True)
            return []
        found = []
        for name in names:
            child_key = key + b"/" + name if key else name
            if identity == temp_files[0] and name.startswith(temp_files[1]):
                continue  # a packer's temporary file for this same output
            if exclude and exclude.excludes(child_key, name):
                continue
            try:
                info = os.lstat(name, dir_fd=fd)
                if follow_symlinks and stat_module.S_ISLNK(info.st_mode):
                    try:
                        info = os.stat(name, dir_fd=fd)
                    except OSError:
                        log.warning("%r: dangling symlink kept as a symlink", path_of(child_key))
                target = os.readlink(name, dir_fd=fd) if stat_module.S_ISLNK(info.st_mode) else None
            except FileNotFoundError:
                skips.add(path_of(child_key), "vanished while packing", failed=True)
                continue
            except OSError as error:
                skips.add(path_of(child_key), f"cannot stat: {error.strerror}", failed=True)
                continue
            if exclude and stat_module.S_ISDIR(info.st_mode) and exclude.excludes(child_key, name, directory=True):
                continue
            found.append((name, child_key, info, target, attributes(fd, name, child_key, info) if xattrs else None))
        return found

    def open_directory(name: bytes, parent: _Frame) -> int:
        if parent.fd < 0:  # closed to stay under the descriptor budget
            parent.fd = open_beneath(src, parent.key, open_flags)
        return os.open(name, open_flags, dir_fd=parent.fd)

    try:
        root_fd = os.open(src, _DIRECTORY_FLAGS)
    except OSError as error:
        raise PackError(f"cannot list {os.fsdecode(src)!r}: {error.strerror}") from None
    stack = [_Frame(b"", root_identity, root_fd, iter(children(root_fd, b"", root_identity)))]
    try:
        while stack:
            frame = stack[-1]
            child_item = next(frame.pending, None)
            if child_item is None:
                stack.pop()
                frame.close()
                on_path.discard(frame.identity)
                continue
            name, child_key, info, target, child_xattrs = child_item
            child = (info.st_dev, info.st_ino)
            if child in skip:
                continue  # the output archive itself
            mode = info.st_mode
            if stat_module.S_ISDIR(mode):
                if child in on_path:
                    skips.add(path_of(child_key), "a symlink loop")
                    continue
                items.append(Scanned(child_key, "dir", info, None, child_xattrs))
                try:
                    fd = open_directory(name, frame)
                except FileNotFoundError:
                    items.pop()
                    skips.add(path_of(child_key), "vanished while packing", failed=True)
                    continue
                except OSError as error:
                    # As tar, the contents are left out; the directory itself is kept.
                    skips.add(path_of(child_key), f"cannot list: {error.strerror}", failed=True)
                    continue
                on_path.add(child)
                stack.append(_Frame(child_key, child, fd, iter(())))
                stack[-1].pending = iter(children(fd, child_key, child))
                if len(stack) > _HELD_DIRECTORIES:
                    stack[-1 - _HELD_DIRECTORIES].close()
            elif stat_module.S_ISREG(mode):
                if info.st_nlink > 1 and child in first_link:
                    items.append(Scanned(child_key, "hardlink", info, first_link[child]))
                else:
                    if info.st_nlink > 1:
                        first_link[child] = child_key
                    items.append(Scanned(child_key, "file", info, None, child_xattrs))
            elif stat_module.S_ISLNK(mode):
                items.append(Scanned(child_key, "symlink", info, target, child_xattrs))
            else:
                kind = (
                    "a FIFO" if stat_module.S_ISFIFO(mode) else
                    "a socket" if stat_module.S_ISSOCK(mode) else "a device file"
                )
                skips.add(path_of(child_key), kind)
    finally:
        for frame in stack:
            frame.close()
    return items


@dataclass
class _Frame:
    """One directory on the scan's current path: its descriptor (-1 once closed) and
    the children still to visit."""

    key: bytes
    identity: tuple[int, int]
    fd: int
    pending: Iterator[_Child]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
