"""Block-aware epochs: a selection of files cut into windows of adjacent records, and
an epoch's order that reads them a pool of windows at a time (torch-free; the sampler
is :class:`packfs.torch.WindowedSampler`).

Why: from a URL, a uniformly shuffled epoch reads one file per ranged GET (a batch's
files are scattered over the whole archive), about 75 times the requests of a shard
format for the same epoch (issue 36).  Shard formats (MosaicML streaming, litData,
webdataset) fetch whole shards and shuffle within a few of them, giving up random
access.  Here the archive stays random access, and only the *order* of an epoch is
made block-aware:

1. The selection, in archive order (per object: a shard set's shards are objects of
   their own), is cut into *windows* of about ``window_bytes`` of records each
   (fixed for the run: each window is one stretch of the object, fetched with one or a
   few large GETs into the node's disk cache, and found there in every later epoch).
2. Each epoch (seeded by ``seed`` and the epoch) permutes the windows, takes them
   ``windows_per_pool`` at a time (a *pool*), shuffles the samples of each pool
   together and emits pool after pool.

What was taken from the peers, and what not: MosaicML streaming's ``py1br`` permutes
shard spans per epoch with ``seed + epoch`` and shuffles samples within blocks of
about ``shuffle_block_size`` samples (``streaming/base/shuffle/py1br.py``); its
``py1e`` spreads each shard's samples over a range of that size
(``streaming/base/shuffle/py1e.py``).  litData's ``FullShuffle`` permutes chunks per
epoch and shuffles within each worker's interval of chunks
(``litdata/streaming/shuffle.py``).  The pool here is py1br's block, made of whole
windows permuted over the whole selection, so a batch of a pool draws from
``windows_per_pool`` random stretches of the archive (the quality measured against a
uniform shuffle in ``bench/shuffle_quality.py`` and docs/remote.md).  Unlike both,
the windows are cut by bytes, not samples (a GET's cost is its bytes), and do not
depend on the number of ranks or workers: ranks take every world-th sample of one
order (:class:`packfs.torch.WindowedSampler`), so all the ranks of a node read the
same pool at the same time and each window is fetched once per node.

Memory: the plan is a few int64 arrays of one value per sample (the archive order,
each sample's window, the windows' bounds), an epoch's order one more; nothing per
sample is a Python object.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["WindowPlan", "DEFAULT_WINDOW_BYTES", "DEFAULT_WINDOWS_PER_POOL", "DEFAULT_FIRST_POOL", "plan_windows"]

# Chosen by measurement (bench/shuffle_quality.py; the tables in docs/remote.md): 8 MiB
# is RemoteFile's largest GET (part_bytes), so ~1 GiB of 50-150 KB JPEGs is 120
# windows and ~180 GETs an epoch (MosaicML streaming: 130); 4 MiB windows make ~250.
# A batch's classes are bounded by the distinct windows it draws from, so the pool
# must be several times the batch: with 1,000 classes of 100 files, a batch of 64
# from pools of 256 windows has 0.93 of a uniform shuffle's classes, from 128 0.85,
# from 64 0.74 (on the 100 classes, 128 and more are the whole dataset: 1.00).
# What the first batch of a pool waits for is the windows it touches, at most one a
# sample whatever the pool (~460 MiB here, fetched in parallel); what a pool costs is
# node-cache space (2 GiB of the default 32), never memory.
DEFAULT_WINDOW_BYTES = 8 << 20
DEFAULT_WINDOWS_PER_POOL = 256
# An epoch's first pool: its first batch waits for the windows it touches, and with a
# full pool that is about one a sample (~450 MiB of 8 MiB windows for a batch of 64).
# A first pool of 8 windows (64 MiB) is fetched in well under a second at a shard
# format's request count, and the next pool is fetched while it is read
# (packfs.dataset.PoolsAhead); its batches draw from 8 windows, which costs an epoch
# of 120 windows (the 10,000 JPEGs) about 5% of its classes per batch
# (bench/shuffle_quality.py).
DEFAULT_FIRST_POOL = 8


class WindowPlan:
    """A selection's samples (positions 0..n-1) cut into windows of adjacent records.

    Parameters
    ----------
    objects
        Per sample, which object its record lies in (a shard set's shard; all 0 for one
        archive).
    starts, sizes
        Per sample, its record's offset in that object and its stored size.
    window_bytes
        About how many bytes of records a window holds: the records that start within
        one stretch of that many bytes (counting only the selection's records), so a
        window holds under ``window_bytes`` plus its last record; a record of
        ``window_bytes`` or more is a window of its own.

    Raises
    ------
    ValueError
        ``window_bytes`` under 1, or arrays of different lengths.
    """

    def __init__(self, objects: Any, starts: Any, sizes: Any, window_bytes: int) -> None:
        if int(window_bytes) < 1:
            raise ValueError(f"window_bytes must be at least 1, not {window_bytes}")
        objects = np.asarray(objects, dtype=np.int64)
        starts = np.asarray(starts, dtype=np.int64)
        sizes = np.asarray(sizes, dtype=np.int64)
        if not objects.shape == starts.shape == sizes.shape or objects.ndim != 1:
            raise ValueError("objects, starts and sizes must be 1-d arrays of one length")
        self.window_bytes = int(window_bytes)
        # Archive order: by object, then offset (a stable sort keeps equal offsets,
        # deduplicated records, in selection order).
        order = np.lexsort((starts, objects)).astype(np.int64)
        sorted_objects, sorted_sizes = objects[order], sizes[order]
        # A record of a window's size or more is a window of its own (joined to its
        # neighbours it would make theirs as large): it, the record after it and each
        # object's first record start a segment, and within a segment a window is every
        # record that starts in one window_bytes-long stretch of the bytes before it.
        before = np.cumsum(sorted_sizes) - sorted_sizes
        alone = sorted_sizes >= self.window_bytes
        segment = np.ones(len(order), dtype=bool)
        segment[1:] = (sorted_objects[1:] != sorted_objects[:-1]) | alone[1:] | alone[:-1]
        base = np.maximum.accumulate(np.where(segment, before, 0)) if len(order) else before
        slot = (before - base) // self.window_bytes
        new_window = segment.copy()
        new_window[1:] |= slot[1:] != slot[:-1]
        window_of_sorted = np.cumsum(new_window) - 1
        #: positions of the samples in archive order
        self.order = order
        #: bounds[w]:bounds[w + 1] is window w's slice of ``order``
        self.bounds = np.append(np.flatnonzero(new_window), len(order)).astype(np.int64)
        #: each sample's (position's) window
        self.window_of = np.empty(len(order), dtype=np.int64)
        self.window_of[order] = window_of_sorted
        #: bytes of records in each window
        self.window_sizes = np.add.reduceat(sorted_sizes, self.bounds[:-1]) if len(order) else np.zeros(0, np.int64)
        for array in (self.order, self.bounds, self.window_of, self.window_sizes):
            array.setflags(write=False)

    def __len__(self) -> int:
        """The number of samples."""
        return len(self.order)

    @property
    def windows(self) -> int:
        """The number of windows."""
        return len(self.bounds) - 1

    def members(self, window: int) -> np.ndarray:
        """Window ``window``'s samples (positions), in archive order."""
        return self.order[self.bounds[window]:self.bounds[window + 1]]

    def epoch_order(self, seed: int, epoch: int, windows_per_pool: int, first_pool: int = 0) -> np.ndarray:
        """Every sample once, in epoch ``epoch``'s order (:meth:`epoch_pools`'s)."""
        return self.epoch_pools(seed, epoch, windows_per_pool, first_pool)[0]

    def epoch_pools(self, seed: int, epoch: int, windows_per_pool: int,
                    first_pool: int = 0) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """Epoch ``epoch``'s order, where each pool starts in it, and each pool's windows.

        The windows are permuted and dealt in that order into pools: the first
        ``first_pool`` of them (0: none apart) make a pool of their own, so that the
        epoch's first batch waits for a few windows, not for every window a batch of
        a full pool touches; the rest are dealt into pools of at most
        ``windows_per_pool`` (as equal as they divide).  Each pool's samples are
        shuffled together, pool after pool.  The same arguments give the same order on
        every rank and process.

        Raises
        ------
        ValueError
            ``windows_per_pool`` under 1, or ``first_pool`` under 0."""
        if int(windows_per_pool) < 1:
            raise ValueError(f"windows_per_pool must be at least 1, not {windows_per_pool}")
        if int(first_pool) < 0:
            raise ValueError(f"first_pool must be 0 or more, not {first_pool}")
        rng = np.random.default_rng([int(seed) & (2 ** 63 - 1), int(epoch)])
        permuted = rng.permutation(self.windows)
        lengths = np.diff(self.bounds)[permuted]
        # The samples laid out window after window in the permuted order ...
        starts = self.bounds[:-1][permuted]
        offsets = np.arange(len(self.order), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        laid = self.order[np.repeat(starts, lengths) + offsets]
        # ... then shuffled within each pool: sorted by (pool, a random key).  The
        # windows after the first pool are dealt into pools of equal counts (at most
        # windows_per_pool each): 120 windows by 96 are two pools of 60, not 96 and a
        # last of 24, whose batches would mix a quarter as well.
        first = min(int(first_pool), self.windows) if int(first_pool) < self.windows else 0
        rest = self.windows - first
        pools = -(-rest // int(windows_per_pool))
        window_pool = np.arange(rest, dtype=np.int64) * pools // max(1, rest) + (1 if first else 0)
        window_pool = np.concatenate([np.zeros(first, dtype=np.int64), window_pool])
        pool = np.repeat(window_pool, lengths)
        order = laid[np.lexsort((rng.random(len(laid)), pool))]
        counts = np.bincount(pool, minlength=int(window_pool[-1]) + 1 if len(window_pool) else 0)
        pool_starts = (np.cumsum(counts) - counts).astype(np.int64)
        edges = np.flatnonzero(np.diff(window_pool)) + 1
        return order, pool_starts, np.split(permuted.astype(np.int64), edges)


def plan_windows(archive: Any, entries: Sequence[int] | np.ndarray, window_bytes: int) -> WindowPlan:
    """The :class:`WindowPlan` of files ``entries`` (positions in that sequence) of an
    archive or shard set opened by :func:`packfs.core.open_archive`: each file's record
    located through the core's public interface (``extents_of``, the table's values
    checked for all files at once; for a set, its shard from ``bases``)."""
    entries = np.asarray(entries, dtype=np.int64)
    bases = getattr(archive, "bases", None)  # a ShardSet's first entry of each shard
    objects = (np.searchsorted(np.asarray(bases[:-1], dtype=np.int64), entries, side="right") - 1
               if bases is not None else np.zeros(len(entries), dtype=np.int64))
    spans = archive.extents_of(entries)
    return WindowPlan(objects, spans[:, 0], spans[:, 1] - spans[:, 0], window_bytes)
