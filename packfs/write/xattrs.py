"""Extended attributes (format section 4c, version 1.3) on the writing side: one entry's
attributes encoded as the archive stores them.  The reading side, which checks the same
rules on every value it reads, is :mod:`packfs.core.xattrs`."""

from __future__ import annotations

from ..format import XATTR, XATTR_LIST_MAX, XATTR_SIZE_MAX, xattr_name_problem

__all__ = ["encode_xattrs"]


def encode_xattrs(attributes: dict[bytes, bytes]) -> bytes:
    """One entry's attributes as section 20 stores them: sorted by name, each an
    ``XATTR`` header, the name, the value.  ValueError for a name or value the format
    does not allow (the writer's half of section 4c's rules)."""
    out = bytearray()
    listed = 0
    for name in sorted(attributes):
        value = attributes[name]
        problem = xattr_name_problem(name)
        if problem:
            raise ValueError(problem)
        if len(value) > XATTR_SIZE_MAX:
            raise ValueError(f"the value of {name!r} is {len(value)} bytes, expected at most {XATTR_SIZE_MAX}")
        listed += len(name) + 1
        out += XATTR.pack(len(name), len(value)) + name + value
    if listed > XATTR_LIST_MAX:
        raise ValueError(f"the names take {listed} bytes, expected at most {XATTR_LIST_MAX}")
    return bytes(out)
