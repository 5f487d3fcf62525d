"""Fetching whole archives at URLs into the node's disk cache before they are read
(``packfs cache prefetch URL``; a job's first epoch, then served from the disk)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Union

from ..errors import RemoteArchiveError
from .archive import Archive
from .paths import PathArg
from .union import ShardSet, open_archive

__all__ = ["prefetch"]


def prefetch(target: Union[PathArg, Archive, ShardSet], cache_dir: Union[PathArg, bool, None] = None,
             storage_options: Optional[Mapping[str, Any]] = None,
             progress: Optional[Callable[[int], None]] = None) -> dict[str, int]:
    """Fetch every byte of the archive at ``target`` (a URL, or a shard set's manifest,
    list or glob; or an open :class:`Archive` or :class:`ShardSet`) into the disk cache
    in ``cache_dir`` (None: the default one), each byte once, in large ranged GETs, in
    bounded memory (:meth:`packfs.source.cache.CachedSource.prefetch`).  Blocks the
    cache holds already are not fetched again; a local archive (or shard) has nothing
    to fetch.  ``progress`` is called with byte counts as windows are done.

    Returns the sources' counters added up (``requests``, ``bytes_fetched``,
    ``readahead_bytes``, ...). RemoteArchiveError when there is no disk cache
    (``cache_dir=False``) to fetch into."""
    opened = isinstance(target, (Archive, ShardSet))
    archive = target if opened else open_archive(target, checksums="never", storage_options=storage_options,
                                                 cache_dir=cache_dir)
    try:
        shards = [archive] if isinstance(archive, Archive) else [archive.shard(k) for k in range(archive.shard_count)]
        totals: dict[str, int] = {}
        for shard in shards:
            source = shard.source
            if source.mapping is not None:
                continue  # a local archive: nothing to fetch
            fetch = getattr(source, "prefetch", None)
            try:
                if fetch is None:
                    raise ValueError("no disk cache")
                fetch(progress)
            except ValueError:
                raise RemoteArchiveError(f"{source.name!r}: no disk cache to prefetch into (cache_dir off): "
                                         f"expected a cache directory") from None
            for name, value in source.stats().items():
                totals[name] = totals.get(name, 0) + value
        return totals
    finally:
        if not opened:
            archive.close()
