"""Where an archive's bytes come from.

The format code (:mod:`packfs.core`) never opens a file, calls ``lseek`` or asks
whether a file changed: it asks its byte source.  A source is anything with the
interface of :class:`ByteSource`; :class:`LocalFile` (a descriptor and a memory map)
is the one packfs has today.  The next ones fit the same interface:

- a remote source (HTTP or S3 range requests): ``read`` is one ranged GET,
  ``identity`` is (URL, ETag, size), ``check_unchanged`` compares the ETag each
  response carries, and ``mapping`` is None;
- a block cache wrapping any source: ``read`` is served from fixed-size blocks kept
  in a bounded cache, and every other member is the wrapped source's.

The core reads the header and the path table through ``mapping`` where a source has
one (zero-copy), and otherwise through ``read``.
"""

from __future__ import annotations

import os
from typing import Any, Hashable, Mapping, Optional, Protocol, Union

from .local import GUARDED, LocalFile, release_pages, url_error

__all__ = ["ByteSource", "LocalFile", "GUARDED", "release_pages", "url_error", "is_url", "open_source",
           "REMOTE_SCHEMES"]

REMOTE_SCHEMES = ("s3", "http", "https")


def is_url(name: object) -> bool:
    """Whether ``name`` is a URL packfs reads remotely (``s3://``, ``http(s)://``)."""
    if not isinstance(name, str):
        return False
    scheme, separator, _ = name.partition("://")
    return bool(separator) and scheme.lower() in REMOTE_SCHEMES


def open_source(name: Union[str, "os.PathLike[str]"], storage_options: Optional[Mapping[str, Any]] = None,
                **remote_options: Any) -> "ByteSource":
    """The byte source for ``name``: a :class:`LocalFile` for a path, a
    :class:`packfs.source.remote.RemoteFile` for an ``s3://`` or ``http(s)://`` URL
    (``storage_options``: credentials and endpoint, as s3fs takes them; the client
    library is imported only then)."""
    if is_url(name):
        from .remote import RemoteFile

        return RemoteFile(str(name), storage_options=storage_options, **remote_options)
    return LocalFile(name)


class ByteSource(Protocol):
    """The bytes of one archive, fixed at open.

    A source frees what it holds (a descriptor, connections) when it is garbage
    collected, not only at :meth:`close`: an archive closed while another thread still
    reads drops its references and lets the last user free the source.

    Every read returns exactly the bytes asked for, or raises: ArchiveChangedError
    when the source no longer has them as they were at open (a shorter file, another
    ETag), ArchiveIOError when it cannot be read, ClosedArchiveError after
    :meth:`close`.
    """

    name: str  # the path or URL, for messages
    size: int  # bytes, at open
    identity: Hashable  # equal for two opens of the same bytes
    owner: tuple[int, int, int]  # (uid, gid, mtime_ns) for entries without their own
    mapping: Union[bytes, memoryview, object, None]  # a zero-copy buffer of every byte, or None
    guarded: bool  # reading ``mapping`` cannot kill the process (see packfs.source.local)

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end)."""

    def readinto(self, buffer: memoryview, start: int) -> None:
        """Fill ``buffer`` with the bytes from ``start`` on."""

    def release(self, start: int, end: int) -> None:
        """A hint: bytes [start, end) of ``mapping`` are not needed in memory now."""

    def check_before_map(self) -> None:
        """Raise ArchiveChangedError if reading ``mapping`` now could fault."""

    def check_unchanged(self) -> None:
        """Raise ArchiveChangedError if the bytes are no longer those of the open."""

    def close(self) -> None:
        """Release the source; later reads raise ClosedArchiveError."""

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
