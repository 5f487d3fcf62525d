"""Where an archive's bytes come from.

The format code (:mod:`packfs.core`) never opens a file, calls ``lseek`` or asks
whether a file changed: it asks its byte source.  A source is anything with the
interface of :class:`ByteSource`: :class:`LocalFile` (a descriptor and a memory map)
and :class:`RemoteFile` (``packfs.source.remote``: ranged GETs over HTTP or S3;
``identity`` is (URL, ETag or version, size), every GET carries If-Match, ``mapping``
is None); :func:`open_source` picks one for a path or URL.  The next one fits the same
interface:

- a block cache wrapping any source: ``read`` is served from fixed-size blocks kept
  in a bounded cache, and every other member is the wrapped source's.

The core reads the header and the path table through ``mapping`` where a source has
one (zero-copy), and otherwise through ``read``.
"""

from __future__ import annotations

import os
from typing import Hashable, Optional, Protocol, Union

from ..errors import RemoteArchiveError
from .local import GUARDED, LocalFile, is_url, release_pages, url_error

__all__ = ["ByteSource", "LocalFile", "RemoteFile", "GUARDED", "release_pages", "url_error", "is_url", "open_source"]

# The schemes RemoteFile reads (packfs.source.remote.REMOTE_SCHEMES, which imports
# nothing it does not need; repeated here so that a local open imports nothing remote).
_REMOTE_SCHEMES = ("s3", "http", "https")


def open_source(name: Union[str, "os.PathLike[str]"], storage_options: Optional[dict] = None,
                **remote_options: object) -> "ByteSource":
    """The byte source for ``name``: a RemoteFile for an ``s3://``, ``http://`` or
    ``https://`` URL (``storage_options`` and ``remote_options`` go to it), else a
    LocalFile.  Another scheme (``gs://``, ``file://``, ...) that is no local path is a
    RemoteArchiveError naming what packfs reads."""
    if isinstance(name, str) and is_url(name) and not os.path.exists(name):
        scheme = name.split(":", 1)[0].lower()
        if scheme in _REMOTE_SCHEMES:
            from .remote import RemoteFile

            return RemoteFile(name, storage_options=storage_options, **remote_options)  # type: ignore[arg-type]
        raise url_error(name) or RemoteArchiveError(f"{name!r}: not a URL packfs reads")
    if storage_options:
        raise RemoteArchiveError(f"{os.fspath(name)!r}: storage_options are for s3:// URLs, not local paths")
    return LocalFile(name)


def __getattr__(name: str) -> object:
    # RemoteFile on first use: importing packfs.source (every local open) imports
    # neither packfs.source.remote nor its client library.
    if name == "RemoteFile":
        from .remote import RemoteFile

        return RemoteFile
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
