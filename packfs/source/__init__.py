"""Where an archive's bytes come from.

The format code (:mod:`packfs.core`) never opens a file, calls ``lseek`` or asks
whether a file changed: it asks its byte source.  A source is anything with the
interface of :class:`ByteSource`: :class:`LocalFile` (a descriptor and a memory map)
and :class:`RemoteFile` (``packfs.source.remote``: ranged GETs over HTTP or S3;
``identity`` is (URL, ETag or version, size), every GET carries If-Match, ``mapping``
is None); :func:`open_source` picks one for a path or URL, and puts a RemoteFile
behind :class:`CachedSource` (``packfs.source.cache``: a disk cache of fixed blocks
shared by every process on the node, which also reads ahead of sequential readers),
whose interface is the same.

The core reads the header and the path table through ``mapping`` where a source has
one (zero-copy), and otherwise through ``read``.
"""

from __future__ import annotations

import mmap
import os
from typing import Any, Hashable, Mapping, Optional, Protocol, Union

from ..errors import RemoteArchiveError
from .local import GUARDED, LocalFile, absolute_location, is_url, release_pages, shown_location, url_error

__all__ = ["ByteSource", "LocalFile", "RemoteFile", "GUARDED", "release_pages", "url_error", "is_url",
           "absolute_location", "shown_location", "open_source", "with_cache_dir", "settled_cache_dir"]

# The schemes RemoteFile reads (packfs.source.remote.REMOTE_SCHEMES, which imports
# nothing it does not need; repeated here so that a local open imports nothing remote).
_REMOTE_SCHEMES = ("s3", "http", "https")


# The storage options that any URL takes (not the server's): the client's, checked and
# passed to RemoteFile as keywords.
CLIENT_OPTIONS = {"in_flight": int, "timeout": float, "retries": int, "memory_cap": int}


def open_source(name: Union[str, "os.PathLike[str]"], storage_options: Optional[Mapping[str, Any]] = None,
                **remote_options: object) -> "ByteSource":
    """The byte source for ``name``: for an ``s3://``, ``http://`` or ``https://`` URL a
    RemoteFile (``storage_options`` and ``remote_options`` go to it) behind the disk
    cache, else a LocalFile.  Two storage options are the cache's: ``cache_dir`` (a
    directory; None or absent: :func:`packfs.source.cache.default_cache_dir`; False: no
    disk cache) and ``cache_size`` (bytes); those of CLIENT_OPTIONS (``in_flight``,
    ``timeout``, ``retries``, ``memory_cap``) are RemoteFile's, for any URL.  Another
    scheme (``gs://``, ``file://``, ...) that is no local path is a RemoteArchiveError
    naming what packfs reads."""
    options = dict(storage_options or {})
    cache_dir = options.pop("cache_dir", None)
    cache_size = options.pop("cache_size", None)
    for option, kind in CLIENT_OPTIONS.items():
        if option in options:
            value = options.pop(option)
            if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or value < (
                    0 if option == "retries" else 1):
                raise RemoteArchiveError(f"{os.fspath(name)!r}: {option}={value!r}: expected a number above 0")
            remote_options.setdefault(option, value)
    if isinstance(name, str) and is_url(name) and not os.path.exists(name):
        scheme = name.split(":", 1)[0].lower()
        if scheme in _REMOTE_SCHEMES:
            from .cache import CachedSource, default_cache_dir, default_cache_size
            from .remote import RemoteFile

            try:
                size = default_cache_size() if cache_size is None else _size(cache_size, name)
            except ValueError as error:  # $PACKFS_CACHE_SIZE
                raise RemoteArchiveError(f"{name!r}: PACKFS_CACHE_SIZE={os.environ.get('PACKFS_CACHE_SIZE')!r}: "
                                         f"{error}") from None
            if cache_dir is None:
                cache_dir = default_cache_dir()
            if cache_dir is False or cache_dir is None:
                return RemoteFile(name, storage_options=options or None, **remote_options)  # type: ignore[arg-type]
            from .tails import TailStore

            remote = RemoteFile(name, storage_options=options or None, tails=TailStore(os.fspath(cache_dir)),
                                **remote_options)  # type: ignore[arg-type]
            return CachedSource(remote, os.fspath(cache_dir), size)  # type: ignore[arg-type]
        raise url_error(name) or RemoteArchiveError(f"{name!r}: not a URL packfs reads")
    storage_options = options
    if storage_options:
        raise RemoteArchiveError(f"{os.fspath(name)!r}: storage_options are for s3:// URLs, not local paths")
    return LocalFile(name)


def with_cache_dir(storage_options: Optional[Mapping[str, Any]], cache_dir: object) -> Optional[Mapping[str, Any]]:
    """``storage_options`` with ``cache_dir`` among them (unchanged when it is None: the
    default directory): the front ends' ``cache_dir=`` travels with the storage options,
    which every worker process re-opens a URL with."""
    if cache_dir is None:
        return storage_options
    return {**(storage_options or {}), "cache_dir": cache_dir}


def settled_cache_dir(cache_dir: Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]", bool, None]
                      ) -> Union[str, bool]:
    """``cache_dir`` as it must be kept by a reader that opens URLs later, perhaps after
    the process changed directory (a mount's daemon serves from ``/``): a path made
    absolute now, the default (None) decided now (:func:`packfs.source.cache.default_cache_dir`,
    False when it is off), False kept."""
    if cache_dir is False:
        return False
    if cache_dir is None:
        from .cache import default_cache_dir

        cache_dir = default_cache_dir()
        if cache_dir is None:
            return False
    if cache_dir is True:
        raise TypeError("cache_dir=True: give a directory, None (the default) or False (none)")
    return os.path.abspath(os.fsdecode(cache_dir))


def _size(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise RemoteArchiveError(f"{name!r}: cache_size={value!r}: expected a number of bytes above 0")
    return value


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

    # Read-only here (properties): each source keeps them as it likes (attributes set at
    # open, or properties), and a narrower type (a tuple for ``identity``) still fits.
    @property
    def name(self) -> str:
        """The path or URL, for messages."""

    @property
    def size(self) -> int:
        """Bytes, at open."""

    @property
    def identity(self) -> Hashable:
        """Equal for two opens of the same bytes."""

    @property
    def owner(self) -> tuple[int, int, int]:
        """(uid, gid, mtime_ns) for entries without their own."""

    @property
    def mapping(self) -> Union[bytes, mmap.mmap, None]:
        """A zero-copy buffer of every byte, whose slices are bytes, or None."""

    @property
    def guarded(self) -> bool:
        """Reading ``mapping`` cannot kill the process (see packfs.source.local)."""

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
