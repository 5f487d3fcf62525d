"""The node's disk cache of remote archives, as a whole: what it holds and what every
process counted (:func:`cache_stats`), emptying it (:func:`cache_clear`) and filling it
ahead of a job (:func:`cache_prefetch`); ``packfs cache`` calls these.

The cache itself is :mod:`packfs.source.cache`; its counters file and the listing,
:mod:`packfs.source.cachestats`.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, List, Mapping, NamedTuple, Optional, Union

from .core import ShardSet, open_archive
from .core.union import is_shard_set_spec
from .errors import RemoteArchiveError
from .source import is_url
from .source.cache import LAYOUT, default_cache_dir, default_cache_size
from .source.cachedir import UnsafeCacheDir, private_root
from .source.tails import TailStore
from .source.cachestats import CachedArchive, cached_archives, clear_cached

__all__ = ["CacheReport", "CachedArchive", "cache_stats", "cache_clear", "cache_prefetch", "cache_location"]

log = logging.getLogger("packfs.cache")


class CacheReport(NamedTuple):
    """A node's disk cache: where, its bound (this process's setting), and each archive."""

    directory: str
    bound: int
    archives: List[CachedArchive]

    @property
    def cached_bytes(self) -> int:
        """The bytes every archive's chunk files take on disk."""
        return sum(a.cached_bytes for a in self.archives)


def cache_location(cache_dir: Union[os.PathLike, str, bool, None] = None) -> str:
    """The cache's directory: ``cache_dir``, else the default
    (:func:`packfs.source.cache.default_cache_dir`); RemoteArchiveError if the cache is
    turned off (``PACKFS_CACHE_DIR=off``, ``cache_dir=False``), or if it is not this
    user's alone (see :mod:`packfs.source.cachedir`)."""
    if cache_dir is False:
        raise RemoteArchiveError("the disk cache is off (cache_dir=False): give a cache directory")
    chosen = os.fspath(cache_dir) if cache_dir is not None else default_cache_dir()  # type: ignore[arg-type]
    if chosen is None or chosen.strip().lower() in ("", "off", "none", "0", "false"):
        raise RemoteArchiveError("the disk cache is off (PACKFS_CACHE_DIR=off): give --cache-dir DIR")
    directory = os.path.abspath(os.path.expanduser(chosen))
    try:
        private_root(directory, create=False)
    except FileNotFoundError:
        pass  # nothing cached yet
    except UnsafeCacheDir as error:
        raise RemoteArchiveError(f"the disk cache {directory!r} is not used: {error} (a cache directory must be "
                                 f"this user's alone)") from None
    except OSError as error:
        raise RemoteArchiveError(f"the disk cache {directory!r} cannot be used: {error.strerror or error}") from None
    return directory


def cache_stats(url: Optional[str] = None, cache_dir: Optional[os.PathLike | str] = None) -> CacheReport:
    """What the node's disk cache holds, by archive, with the counters every process
    that used it added up (hits, misses and waits in 16 KiB blocks; requests and bytes
    fetched): of every archive, or of the versions of ``url``.  A process adds its own
    counts at close, at exit and every 10 s of reading."""
    directory = cache_location(cache_dir)
    try:
        top = private_root(directory, create=False)
    except FileNotFoundError:
        archives = []
    else:
        archives = cached_archives(LAYOUT, top, os.path.join(directory, LAYOUT))
    if url is not None:
        _check_url(url)
        archives = [a for a in archives if a.url == _as_named(url)]
    return CacheReport(directory, default_cache_size(), archives)


def cache_clear(url: Optional[str] = None, cache_dir: Optional[os.PathLike | str] = None) -> tuple[int, int]:
    """Remove every archive from the node's disk cache, or every version of ``url`` (a
    shard set's manifest: of each of its shards): (archives removed, bytes freed).  Safe
    while other processes read: they fetch again what they need."""
    if url is not None:
        _check_url(url)
    directory = cache_location(cache_dir)
    try:
        top = private_root(directory, create=False)
    except FileNotFoundError:
        return 0, 0
    if url is None:  # the tails kept beside the blocks too (a URL's are small, and checked when used: kept)
        removed, freed = clear_cached(LAYOUT, None, top)
        return removed, freed + TailStore(directory).clear()
    removed = freed = 0
    for each in _archive_urls(url):
        counts = clear_cached(LAYOUT, _as_named(each), top)
        removed, freed = removed + counts[0], freed + counts[1]
    return removed, freed


def _archive_urls(url: str) -> List[str]:
    """The archives ``url`` names: itself, or a manifest's shards (the manifest read,
    no shard opened: a set's shards are cached under their own URLs)."""
    if not is_shard_set_spec(url):
        return [url]
    with open_archive(url, cache_dir=False) as opened:
        return list(opened.shard_locations) if isinstance(opened, ShardSet) else [url]


def cache_prefetch(url: str, progress: Optional[Callable[[int], None]] = None,
                   cache_dir: Optional[os.PathLike | str] = None, storage_options: Optional[Mapping[str, Any]] = None,
                   opened: Optional[Callable[[Any], None]] = None) -> dict[str, int]:
    """Fill the node's disk cache with the whole archive at ``url`` (a shard set: every
    shard), in large ranged GETs, so that the reads of a job that follows send none.
    ``progress`` is called with byte counts; ``opened`` with the archive once open (its
    ``size``, its ``stats``).  Returns what this process fetched (``stats()``)."""
    _check_url(url)
    location = cache_location(cache_dir)
    with open_archive(url, storage_options=storage_options, cache_dir=location) as archive:
        if opened is not None:
            opened(archive)
        shards = [archive.shard(i) for i in range(archive.shard_count)] if isinstance(archive, ShardSet) else [archive]
        for shard in shards:
            source = shard.source
            if getattr(source, "directory", None) is None or not hasattr(source, "prefetch"):
                raise RemoteArchiveError(f"{url!r}: the disk cache in {location!r} cannot be written "
                                         f"(or the archive is not at a URL): nothing prefetched")
            if shard.size > source.cache_size:
                log.warning("packfs: %s (%d bytes) is larger than the cache's bound (%d bytes): only its end will stay",
                            source.name, shard.size, source.cache_size)
            source.prefetch(progress)
        return archive.stats()


def _check_url(url: str) -> None:
    if not is_url(url):
        raise RemoteArchiveError(f"{url!r}: not a URL (the disk cache holds archives at s3://, http:// or "
                                 f"https:// URLs)")


def _as_named(url: str) -> str:
    """``url`` as the cache names it: without a user, password or query (RemoteFile.name)."""
    from .source.remote import public_url

    return public_url(url)
