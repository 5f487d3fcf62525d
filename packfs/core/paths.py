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
from typing import Union

from ..errors import PackError
from ..format import path_name_problem

__all__ = ["PathArg", "lookup_key", "archive_key"]

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
