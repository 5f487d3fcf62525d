"""Paths: how a user's path becomes the key the path table stores (format section 4).

A stored path is bytes: names joined by single slashes, no leading or trailing slash,
no empty, ``.`` or ``..`` component and no NUL (the root is the empty path); a writer
stores no name longer than NAME_MAX bytes either.  Every module turns paths into keys
here: readers with :func:`lookup_key`, which resolves ``.`` and ``..`` as a shell does
in a path it has not seen, and writers with :func:`archive_key`, which refuses them.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Union

from ..errors import NotADirectoryPathError, PackError, PathNotFoundError
from ..format import MAX_SYMLINK_TARGET, S_IFDIR, S_IFLNK, path_name_problem

__all__ = ["PathArg", "lookup_key", "archive_key", "resolve_path"]

PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

_FS_ENCODING = sys.getfilesystemencoding()


def lookup_key(path: PathArg) -> bytes:
    """The table key a reader looks ``path`` up by: bytes without leading, trailing or
    doubled slashes, ``.`` dropped and ``..`` taken back (never above the root)."""
    # str.encode directly: os.fsencode's own type dispatch costs more than the lookup.
    key = path.encode(_FS_ENCODING, "surrogateescape") if type(path) is str else os.fsencode(path)
    if key[:1] == b"/" or key[-1:] == b"/":
        key = key.strip(b"/")
    if b"/." in key or b"//" in key or key[:1] == b".":
        parts: list[bytes] = []
        for part in key.split(b"/"):
            if part in (b"", b"."):
                continue
            if part == b"..":
                if parts:
                    parts.pop()
                continue
            parts.append(part)
        key = b"/".join(parts)
    return key


def archive_key(path: PathArg) -> bytes:
    """The key a writer stores ``path`` under: bytes, no leading, trailing or doubled
    slashes.

    Raises PackError for components the format forbids (``.``, ``..``, NUL, longer
    than NAME_MAX bytes).
    """
    raw = os.fsencode(path)
    key = raw.strip(b"/")
    if b"//" in key:
        key = b"/".join(part for part in key.split(b"/") if part)
    # Searched for in the whole path at once: a per-component loop costs O(depth) in
    # Python for every entry of a deep tree.
    wrapped = b"/" + key + b"/"
    if b"/./" in wrapped or b"/../" in wrapped or b"\0" in key:
        for part in key.split(b"/"):
            if part in (b".", b"..") or b"\0" in part:
                raise PackError(f"invalid path {os.fsdecode(raw)!r}: component {os.fsdecode(part)!r}")
    problem = path_name_problem(key)
    if problem:
        raise PackError(f"invalid path {os.fsdecode(raw)!r}: {problem} (NAME_MAX: no Linux file system "
                        f"holds a longer name)")
    return key


_MAX_SYMLINK_HOPS = 40  # as Linux's MAXSYMLINKS
# One resolution expands at most this many bytes of symlink targets (40 targets of at
# most 4,095 bytes: about 82,000 components), so a hostile archive cannot make one
# lookup walk megabytes of "d/../d/..": the bound holds even if a target's own length
# check were bypassed.
_MAX_EXPANDED_BYTES = _MAX_SYMLINK_HOPS * MAX_SYMLINK_TARGET


def resolve_path(key: bytes, follow: bool, shown: str, where: str, file_type: Callable[[int], int],
                 lookup_child: Callable[[int, bytes], int], path_of: Callable[[int], bytes],
                 link_target: Callable[[int], bytes]) -> int:
    """The entry ``key`` names in a tree (an archive or a shard set, through its
    callables), walked a component at a time from the root (entry 0), symlinks in its
    directories expanded (and in its last component when ``follow``), as a shell does.
    Each step is a binary search in one directory, so depth costs nothing extra.

    Raises PathNotFoundError (nothing there, a loop, a target outside the tree) or
    NotADirectoryPathError, naming ``shown``.
    """
    pending = key.split(b"/") if key else []
    pending.reverse()
    current = 0
    hops = expanded = 0
    trail: list[int] = []  # the directories above ``current``, for ".."
    while pending:
        part = pending.pop()
        if part in (b"", b"."):
            continue
        if part == b"..":
            current = trail.pop() if trail else 0
            continue
        if file_type(current) != S_IFDIR:
            raise NotADirectoryPathError(f"{shown!r}: {os.fsdecode(path_of(current))!r} is not a directory")
        candidate = lookup_child(current, part)
        if candidate < 0:
            raise PathNotFoundError(f"{shown!r}: no such file or directory in {where!r}")
        if file_type(candidate) == S_IFLNK and (pending or follow):
            hops += 1
            if hops > _MAX_SYMLINK_HOPS:
                raise PathNotFoundError(f"{shown!r}: too many levels of symbolic links")
            target = link_target(candidate)
            expanded += len(target)
            if expanded > _MAX_EXPANDED_BYTES:
                raise PathNotFoundError(
                    f"{shown!r}: too many levels of symbolic links (their targets "
                    f"add up to more than {_MAX_EXPANDED_BYTES} bytes)"
                )
            if target.startswith(b"/"):
                raise PathNotFoundError(f"{shown!r}: symlink to {os.fsdecode(target)!r} points outside the archive")
            pending.extend(reversed(target.split(b"/")))
            continue
        trail.append(current)
        current = candidate
    return current
