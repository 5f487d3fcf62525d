"""A disk cache of a remote archive's bytes, shared by every process on a node, and
the detection of sequential scans.

:class:`CachedSource` wraps a :class:`~packfs.source.remote.RemoteFile` and keeps its
interface.  Each read is served from fixed blocks of ``BLOCK_BYTES`` kept on disk; the
missing ones are fetched, nearby ones coalesced into one ranged GET, many in flight,
and written for the next reader: another DataLoader worker, another training process,
a mount, the next epoch.

On disk (``cache_dir``, by default ``$PACKFS_CACHE_DIR``, else
``$XDG_CACHE_HOME/packfs``, else ``~/.cache/packfs``)::

    cache_dir/v1/<key>/identity     the archive's URL, tag and size, for people
    cache_dir/v1/<key>/c<N>         chunk N: bytes [N * CHUNK_BYTES, (N + 1) * CHUNK_BYTES)
    cache_dir/v1/<key>/stats        the counters of every process that read it (cachestats)

``key`` hashes the archive's identity (URL, ETag or version id, size) *and* the bytes
its open fetched (the footer and the tail, which hold a CRC of every other page of
the archive): a server whose ETag does not change with the bytes (nginx's is the
modification second and the size) still never serves one archive's blocks for
another's.  A chunk file starts with a slot per block, (CRC-32, length) as two
little-endian u32 (the CRC starts from a value made of the archive's key and the
block's number, so a block is right only where it was written: bytes and slot copied
elsewhere fail the check there; blocks an older packfs wrote, CRCs from 0, fail too
and are fetched again); the block's bytes follow at ``SLOTS_BYTES + i * BLOCK_BYTES``
(a sparse file: blocks never fetched take no space).

Why it is safe with many processes at once, and after crashes:

- The cache is one user's: its directory and every level below it owned by that user
  and writable by nobody else, directories 0700 and files 0600, every file opened
  relative to the checked directory's descriptor and never through a link (see
  :mod:`packfs.source.cachedir`); a directory that is not (another user's, group- or
  world-writable, a symlink) is not used, with one warning.  A CRC is no defence
  against someone who can write the cache (it is linear, forged in milliseconds):
  nobody else can, so the checks below are against accidents.

- A block is written before its slot, and a slot says (CRC, length): a block whose
  writer died half-way has no slot, and one whose bytes did not reach the disk (a
  power cut) fails its CRC when read back.  Every block is checked against its slot
  each time it is served, not once: one that fails is fetched again (and written
  over).  A chunk that cannot be read (EIO, a stale NFS handle) is read around: its
  blocks come from the server (warned once, counted in ``cache_read_errors``).
- Blocks never change once written (the key fixes the bytes), so readers take no lock.
- Single flight: a process that misses blocks takes an open-file-description lock
  (``F_OFD_SETLK``, per descriptor, so threads of one process exclude each other too)
  on their byte range, looks again, and only then fetches.  Another process that
  misses the same blocks waits for the lock, finds them written and sends nothing.
  The kernel drops the lock of a process that dies.  A wait is bounded
  (``LOCK_WAIT``): a holder stopped in a debugger costs a duplicate GET, not a hang.
- The size is bounded: a process that has written an eighth of ``cache_size`` since
  it last looked adds up the cache (``st_blocks``), and removes the least recently used
  chunks until it is under 90% of the bound, and until 5% of the file system (at most
  1 GiB) is free.
  A chunk removed while another process writes to it loses those writes, nothing else.
- Nothing here fails a read: a cache that cannot be written (full disk, read-only) is
  read around, and the bytes come from the server.

Sequential scans: reads that continue where an earlier one ended (a whole archive in
order, a large file read in 128 KiB READs by a mount) make a stream, which fetches
ahead of its reader into the cache, in parts of ``part_bytes`` in parallel, a window
that doubles with each refill up to ``MAX_WINDOW``.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import hashlib
import logging
import os
import queue
import secrets
import stat
import struct
import sys
import threading
import time
import weakref
from bisect import bisect_right
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union
from ..format import crc32
from .cachedir import DIR_FLAGS, FILE_FLAGS, UnsafeCacheDir, forget_root, private_root, private_subdir
from .cachestats import COUNTERS, FLUSH_EVERY, add_counts

__all__ = ["CachedSource", "default_cache_dir", "default_cache_size", "parse_size", "DEFAULT_CACHE_SIZE", "BLOCK_BYTES",
           "CHUNK_BYTES"]

log = logging.getLogger("packfs.cache")

# 16 KiB: a shuffled read of a 110 KB file fetches about 1.15x its bytes (a block at
# each end, half-used on average), where 64 KiB blocks would fetch 1.6x; a block costs
# one CRC and one slot.
BLOCK_BYTES = 16 << 10
# A chunk file per 64 MiB of archive (4,096 blocks, a 32 KiB slot table): what
# eviction removes at once.
CHUNK_BYTES = 64 << 20
BLOCKS_PER_CHUNK = CHUNK_BYTES // BLOCK_BYTES
SLOT = struct.Struct("<II")  # (CRC-32 of the block, its length; 0: not there)
SLOTS_BYTES = BLOCKS_PER_CHUNK * SLOT.size
LAYOUT = "v1"  # a change of the layout above is a new directory, never a misread
DEFAULT_CACHE_SIZE = 32 << 30
# Room the cache leaves free on its file system, whatever its bound: 5% of it, but never
# more than 1 GiB (a large disk 95% full still has gigabytes to spare; CI's had 12 GiB
# free of 252 and the 5% rule alone cached nothing).
KEEP_FREE = 0.05
KEEP_FREE_MAX = 1 << 30
# How long a process waits for another's fetch of the same blocks before fetching them
# itself: longer than any one GET takes with its retries, so it happens only when the
# holder is stopped.
LOCK_WAIT = 120.0
# Streams: a window starts at FIRST_WINDOW and doubles up to MAX_WINDOW; a read that
# starts within STREAM_SLACK of where a stream's last read ended continues it (a mount's
# READs of one file arrive a few at a time, slightly out of order).
FIRST_WINDOW = 1 << 20
MAX_WINDOW = 64 << 20
# A window is fetched in parts of this size, each one GET in a thread of its own: a scan
# then keeps up to 16 GETs in flight (64 MiB), about what the best parallel download
# of the object keeps (bench/remote_train.py).
AHEAD_PART = 4 << 20
STREAM_SLACK = 256 << 10
STREAMS = 8
# Reads that must continue a stream before it reads ahead: shuffled reads of neighbours
# continue one by chance now and then, twice in a row almost never.
STREAM_CONFIRMED = 2

# Descriptors a thread holds a lock on, closed in a forked child: the child shares the
# descriptor (and so the lock) with its parent, and the thread that would have closed it
# does not exist there; left open, it would hold the lock for the child's lifetime.
_HELD: Dict[int, None] = {}


def _close_held_in_child() -> None:
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_held_in_child)


def default_cache_dir() -> Optional[str]:
    """The disk cache's directory when none is given: ``$PACKFS_CACHE_DIR`` (``off``: no
    disk cache), else ``$XDG_CACHE_HOME/packfs``, else ``~/.cache/packfs``."""
    chosen = os.environ.get("PACKFS_CACHE_DIR")
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "none", "0", "false") else chosen
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "packfs")


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from ``"20G"``, ``"512M"``, ``"1.5T"`` or a plain number (units of 1024);
    ValueError if it is none of those or not above 0."""
    cleaned = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = cleaned[-1:] if cleaned[-1:] in _UNITS else ""
    try:
        value = float(cleaned[:len(cleaned) - len(unit)]) * _UNITS[unit]
    except ValueError:
        value = 0
    if not value >= 1:
        raise ValueError(f"{text!r} is not a size: expected bytes, or a number with K, M, G or T (as 20G)")
    return int(value)


def default_cache_size() -> int:
    """The disk cache's bound when none is given: ``$PACKFS_CACHE_SIZE`` (as 20G), else
    DEFAULT_CACHE_SIZE."""
    chosen = os.environ.get("PACKFS_CACHE_SIZE")
    return parse_size(chosen) if chosen else DEFAULT_CACHE_SIZE


def cache_key(identity: object, suffix: bytes) -> str:
    """The directory name of one archive's blocks (see the module's docstring)."""
    digest = hashlib.sha256(repr(identity).encode("utf-8", "surrogateescape"))
    digest.update(hashlib.sha256(suffix).digest())
    return digest.hexdigest()[:40]


class _SpanWriter:
    """One span of a read ahead, written to its chunk's file piece by piece as it is
    received (:meth:`CachedSource._fill`), each block's CRC computed on the way; its
    slots written by :meth:`finish` once every byte is in.  A span received again from
    its start (the fast path gave up on it) starts again."""

    __slots__ = ("cache", "fd", "first", "at_file", "length", "got", "crc", "slots", "failed")

    def __init__(self, cache: "CachedSource", fd: int, first: int, length: int) -> None:
        self.cache, self.fd, self.first, self.length = cache, fd, first, length
        self.at_file = SLOTS_BYTES + (first % BLOCKS_PER_CHUNK) * BLOCK_BYTES
        self.got, self.crc, self.slots, self.failed = 0, 0, bytearray(), False

    def add(self, at: int, piece: memoryview) -> None:
        if at == 0:
            self.got, self.slots = 0, bytearray()
        if self.failed or at != self.got:
            return
        try:
            os.pwrite(self.fd, piece, self.at_file + at)
        except OSError as error:  # kept from the cache, like _store's
            self.failed = True
            self.cache._write_failed(error)
            return
        self.cache._note_written(len(piece))  # the bound looked at as the bytes land
        done = 0
        while done < len(piece):
            in_block = self.got % BLOCK_BYTES
            if in_block == 0:
                self.crc = self.cache._seed(self.first + self.got // BLOCK_BYTES)
            take = min(BLOCK_BYTES - in_block, len(piece) - done)
            self.crc = crc32(piece[done:done + take], self.crc)
            self.got += take
            done += take
            if self.got % BLOCK_BYTES == 0 or self.got == self.length:
                self.slots += SLOT.pack(self.crc, in_block + take)

    def finish(self) -> bool:
        """Write the slots if the whole span arrived and was written: whether it was."""
        if self.failed or self.got != self.length:
            return False
        try:
            os.pwrite(self.fd, bytes(self.slots), (self.first % BLOCKS_PER_CHUNK) * SLOT.size)
        except OSError as error:
            self.cache._write_failed(error)
            return False
        return True


class _Blocks:
    """The blocks of one run being served: (first byte, bytes or a view of bytes)
    segments sorted by start."""

    def __init__(self) -> None:
        self.starts: List[int] = []
        self.data: List[Union[bytes, memoryview]] = []

    def add(self, start: int, data: Union[bytes, memoryview]) -> None:
        self.starts.append(start)
        self.data.append(data)

    def sort(self) -> None:
        order = sorted(range(len(self.starts)), key=self.starts.__getitem__)
        self.starts = [self.starts[k] for k in order]
        self.data = [self.data[k] for k in order]

    def take(self, start: int, end: int) -> bytes:
        """Bytes [start, end), which the segments (bytes, or views of them) cover."""
        k = bisect_right(self.starts, start) - 1
        first, data = self.starts[k], self.data[k]
        if end <= first + len(data):
            if type(data) is bytes:
                return data[start - first:end - first] if (start, end) != (first, first + len(data)) else data
            return bytes(data[start - first:end - first])
        pieces = []
        at = start
        while at < end:
            k = bisect_right(self.starts, at) - 1
            first, data = self.starts[k], self.data[k]
            stop = min(end, first + len(data))
            pieces.append(data[at - first:stop - first])
            at = stop
        return b"".join(pieces)


class _Stream:
    """A sequential reader: where its next read should start, what is fetched ahead."""

    __slots__ = ("next", "ahead", "window", "used", "hits", "seen")

    def __init__(self, end: int, seen: int) -> None:
        self.hits = 0  # reads in a row that continued it
        self.seen = seen  # the number of the read that last did
        self.next = end
        self.ahead = end  # fetched (or asked for) up to here
        self.window = FIRST_WINDOW
        self.used = time.monotonic()


class CachedSource:
    """``remote``'s bytes through the disk cache in ``directory`` (None: no disk cache;
    streams then read ahead only through the remote's own parallel parts), bounded to
    ``cache_size`` bytes.  Every member it does not define is ``remote``'s."""

    mapping = None
    guarded = True

    def __init__(self, remote, directory: Optional[str], cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self.remote = remote
        self.cache_size = int(cache_size)
        self.cache_root: Optional[str] = None
        self.directory: Optional[str] = None
        # Every file below the cache's directory is opened relative to its descriptor
        # (see packfs.source.cachedir): ``_top`` is its path, ``_relative`` the
        # archive's directory below it (v1/<key>).
        self._top = ""
        self._top_fd = -1
        self._relative = ""
        self._read_warned = False
        self._key = cache_key(remote.identity, remote.suffix)
        self._salt = int(self._key[:8], 16)
        if directory is not None:
            top = os.path.abspath(os.path.expanduser(os.fspath(directory)))
            relative = f"{LAYOUT}/{self._key}"
            try:
                self._top_fd = private_root(top)
                private_subdir(self._top_fd, relative, top)
                self._top, self._relative = top, relative
                self._write_identity()
                self.cache_root, self.directory = os.path.join(top, LAYOUT), os.path.join(top, relative)
            except UnsafeCacheDir as error:
                _warn_once(top, f"packfs: not using the disk cache in {top!r}: {error}; reading without a disk "
                                f"cache (a cache directory must be this user's alone)")
            except OSError as error:
                _warn_once(top, f"packfs: the cache directory {top!r} cannot be used ({error.strerror or error}): "
                                f"reading without a disk cache")
        self._stats = {"cache_hits": 0, "cache_misses": 0, "cache_waits": 0, "readahead_bytes": 0,
                       "cache_read_errors": 0}
        self._written = 0  # since eviction last looked
        self._touched: Dict[int, float] = {}  # chunk -> when this process last marked it used
        self._warned = False
        self._streams: List[_Stream] = []
        # Set by the first prefetch_spans: a reader that says which spans come next (a
        # block-aware epoch's windows) reads them from the cache in its own order, and
        # runs of them that look sequential are no stream to fetch ahead (measured: a
        # DataLoader worker's read-ahead thread fetched nothing and cost 3-4 MiB).
        self._spans_planned = False
        # What is fetched ahead, in flight at once: at most a quarter of the memory cap
        # and an eighth of the cache (which must not evict what they fetch).
        self._max_window = max(AHEAD_PART, min(MAX_WINDOW, getattr(remote, "memory_cap", MAX_WINDOW * 4) // 4,
                                               self.cache_size // 8))
        self._reads = 0  # reads through read(), numbered for the streams
        self._own()
        if self.directory is not None:
            _LIVE.add(self)  # its counts written at exit too

    def _own(self) -> None:
        # As RemoteFile: threads and locks belong to the process that made them.
        self._lock = threading.Lock()
        self._parts: Optional[queue.SimpleQueue] = None  # the parts to fetch ahead, for the threads below
        self._workers = 0  # threads fetching ahead (daemons: exit never waits for them)
        self._in_flight = 0  # parts queued or being fetched
        # The node-wide counters (cachestats): what this process counted and has not yet
        # added to them; a forked child starts from nothing, its parent's counts its own.
        forked = "_pid" in self.__dict__  # (not hasattr: the remote has one)
        self._unflushed = dict.fromkeys(COUNTERS, 0)
        self._remote_counted = dict(self.remote.stats()) if forked else {}
        self._flushed_at = time.monotonic()
        self._pid = os.getpid()
        if forked:
            _flush_at_child_exit()

    def _locked(self) -> threading.Lock:
        if self._pid != os.getpid():
            self._own()
        return self._lock

    def _write_identity(self) -> None:
        """Write the archive's ``identity`` file unless it is there: to a temporary file
        of a name nobody can guess, created (O_EXCL, 0600) and renamed relative to the
        cache's descriptor."""
        path = f"{self._relative}/identity"
        try:
            os.stat(path, dir_fd=self._top_fd, follow_symlinks=False)
            return
        except FileNotFoundError:
            pass
        temporary = f"{path}.{secrets.token_hex(8)}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o600, dir_fd=self._top_fd)
        try:
            try:
                os.write(fd, f"{self.remote.identity!r}\n".encode("utf-8", "surrogateescape"))
            finally:
                os.close(fd)
            os.replace(temporary, path, src_dir_fd=self._top_fd, dst_dir_fd=self._top_fd)
        except OSError:
            try:
                os.unlink(temporary, dir_fd=self._top_fd)
            except OSError:
                pass
            raise

    def __getattr__(self, name: str) -> Any:  # the remote file's members, whatever their types
        if name.startswith("__") or name == "remote":
            raise AttributeError(name)
        return getattr(self.remote, name)

    # -- the source's interface ------------------------------------------------------------

    reads_ahead = True

    def read(self, start: int, end: int, limit: Optional[int] = None) -> bytes:
        """Bytes [start, end): from the cache, the missing blocks fetched.  A read that
        continues a stream has the stream's next bytes fetched ahead, up to ``limit``
        (the end of the file read) when given, else across files (a scan)."""
        remote = self.remote
        if start >= remote.suffix_start or end <= start or self.directory is None:
            return remote.read(start, end)
        remote.check_span(start, end)
        self._follow(start, end, remote.suffix_start if limit is None else min(limit, remote.suffix_start))
        return self._serve([(start, end)])[0]

    def readinto(self, buffer: memoryview, start: int, limit: Optional[int] = None) -> None:
        """Fill ``buffer`` with the bytes from ``start`` on, as :meth:`read`."""
        target = buffer.cast("B") if buffer.format != "B" else buffer
        target[:] = self.read(start, start + len(target), limit)

    def read_ranges(self, spans: Sequence[Tuple[int, int]]) -> List[bytes]:
        """The bytes of each (start, end) span, in the order given: from the cache, the
        missing blocks of all of them fetched at once (nearby ones coalesced, up to the
        remote's ``in_flight`` GETs in flight)."""
        if self.directory is None:
            return self.remote.read_ranges(spans)
        for start, end in spans:
            self.remote.check_span(start, end)
        return self._serve(spans)

    def node_cache(self) -> Optional[Tuple[int, str, int]]:
        """Where a compiled reader finds this archive's blocks itself, read as this class
        reads them (see the module's docstring): (the checked cache directory's
        descriptor, the archive's directory below it, the salt each block's CRC seed is
        made from); None without a disk cache."""
        if self.directory is None:
            return None
        return self._top_fd, self._relative, self._salt

    def stats(self) -> Dict[str, int]:
        """The remote's counters and the cache's: ``cache_hits`` and ``cache_misses``
        (blocks read from the disk cache, blocks fetched), ``cache_waits`` (blocks another
        thread or process was fetching, waited for rather than fetched again) and
        ``readahead_bytes`` (fetched ahead of a sequential reader)."""
        counters = dict(self.remote.stats())
        with self._locked():
            counters.update(self._stats)
        return counters

    def close(self) -> None:
        """Close the remote; fetches ahead in flight finish unread."""
        with self._locked():
            parts, self._parts = self._parts, None
            workers = self._workers
        for _ in range(workers if parts is not None else 0):
            parts.put(None)  # type: ignore[union-attr]  # each thread's last item
        self.flush_counts()
        self.remote.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self.remote.closed

    def __repr__(self) -> str:
        return f"CachedSource({self.remote!r}, {self.directory!r})"

    def __del__(self) -> None:
        # An archive's close() drops its source rather than closing it (see
        # packfs.core.Archive.close): its counts are written when it is freed.
        try:
            if "_unflushed" in self.__dict__:
                self.flush_counts()
        except Exception:
            pass

    # -- serving -----------------------------------------------------------------------------

    def _serve(self, spans: Sequence[Tuple[int, int]]) -> List[bytes]:
        """The bytes of ``spans``: each block they cover read from the disk (checked), the
        missing ones fetched and written."""
        needed = sorted({b for start, end in spans if end > start
                         for b in range(start // BLOCK_BYTES, (end - 1) // BLOCK_BYTES + 1)})
        blocks = _Blocks()
        missing = self._read_cached(needed, blocks)
        if missing:
            self._fetch(missing, blocks, cached=set(needed).difference(missing))
        blocks.sort()
        return [blocks.take(start, end) if end > start else b"" for start, end in spans]

    def _read_cached(self, needed: List[int], into: Optional[_Blocks]) -> List[int]:
        """Read the blocks of ``needed`` the cache holds into ``into`` (each checked;
        None: only look for their slots); the others, in order."""
        missing: List[int] = []
        hits = 0
        for chunk, members in _by_chunk(needed):
            fd = self._open_chunk(chunk, create=False)
            if fd < 0:
                missing += members
                continue
            try:
                found = self._read_chunk_blocks_or_none(fd, chunk, members, into)
            finally:
                os.close(fd)
            hits += len(found)
            if len(found) < len(members):
                missing += [b for b in members if b not in found]
            if found:
                self._touch(chunk)
        if hits and into is not None:
            self._count("cache_hits", hits)
        return missing

    def _read_chunk_blocks_or_none(self, fd: int, chunk: int, members: List[int], into: Optional[_Blocks]) -> set:
        """:meth:`_read_chunk_blocks`, none found when the chunk cannot be read (EIO, a
        stale NFS handle): those blocks are fetched from the server (warned once)."""
        try:
            return self._read_chunk_blocks(fd, chunk, members, into)
        except OSError as error:
            with self._locked():
                self._stats["cache_read_errors"] += 1
                warn, self._read_warned = not self._read_warned, True
            if warn:
                log.warning("packfs: the cache in %r cannot be read (%s): fetching from the server instead",
                            self.directory, error.strerror or error)
            return set()

    def _read_chunk_blocks(self, fd: int, chunk: int, members: List[int], into: Optional[_Blocks]) -> set:
        """The blocks of ``members`` (all in ``chunk``) whose slot is there and whose
        bytes match it, added to ``into`` (None: those whose slot is there, unread)."""
        base = chunk * BLOCKS_PER_CHUNK
        low, high = members[0] - base, members[-1] - base + 1
        table = os.pread(fd, (high - low) * SLOT.size, low * SLOT.size)
        found: set[int] = set()
        for run in _runs(members):
            first, last = run[0] - base, run[-1] - base + 1
            slots = []
            for i in range(first, last):
                at = (i - low) * SLOT.size
                slots.append(SLOT.unpack_from(table, at) if at + SLOT.size <= len(table) else (0, 0))
            # Read the stretch from the first block with a slot to the last one.
            present = [k for k, (_, length) in enumerate(slots) if length]
            if into is None:
                found.update(base + first + k for k in present)
                continue
            if not present:
                continue
            lo, hi = present[0], present[-1]
            data = os.pread(fd, (hi - lo) * BLOCK_BYTES + min(slots[hi][1], BLOCK_BYTES),
                            SLOTS_BYTES + (first + lo) * BLOCK_BYTES)
            view = memoryview(data)
            good = []
            for k in present:
                value, length = slots[k]
                piece = view[(k - lo) * BLOCK_BYTES:(k - lo) * BLOCK_BYTES + length]
                if length <= BLOCK_BYTES and len(piece) == length \
                        and crc32(piece, self._seed(base + first + k)) == value \
                        and length == self._block_length(base + first + k):
                    good.append(k)
            # Each stretch of good blocks joins ``into`` as a view of what was read (the
            # bytes are copied once, when the spans are cut from them).
            for stretch in _runs(good):
                at = (stretch[0] - lo) * BLOCK_BYTES
                stop = (stretch[-1] - lo) * BLOCK_BYTES + slots[stretch[-1]][1]
                into.add((base + first + stretch[0]) * BLOCK_BYTES, view[at:stop])
                found.update(base + first + k for k in stretch)
        return found

    def _seed(self, block: int) -> int:
        """Where block ``block``'s CRC starts: from its archive's key and its number, so
        that a block's bytes and slot copied to another place (another block, chunk or
        archive) fail their check there."""
        return (self._salt ^ (block * 0x9E3779B1)) & 0xFFFFFFFF

    def _block_length(self, block: int) -> int:
        return min(BLOCK_BYTES, self.remote.size - block * BLOCK_BYTES)

    def _fetch(self, missing: List[int], into: Optional[_Blocks], cached: Set[int]) -> None:
        """Fetch the blocks of ``missing`` (sorted) into ``into`` (None: a read ahead,
        which only writes them) and write them to the cache, once per node.

        The runs (see :meth:`_plan`) are locked, looked for again, and what is still
        missing is fetched with one batch of GETs.  A run whose lock another thread or
        process holds (most often for one block it shares with a neighbour the other
        is fetching) is locked block by block: the free blocks are fetched now with the
        others, and the rest waited for together, then looked for again and what is
        left fetched in one batch (never one GET after another)."""
        descriptors: Dict[int, int] = {}  # chunk -> its file, open for this call (-1: no cache)
        held: List[Tuple[List[int], int]] = []  # (run, its chunk's descriptor)
        busy: List[Tuple[List[int], int]] = []
        try:
            for run in self._plan(missing, cached):
                chunk = run[0] // BLOCKS_PER_CHUNK
                if chunk not in descriptors:
                    descriptors[chunk] = fd = self._open_chunk(chunk, create=True)
                    if fd >= 0:
                        _HELD[fd] = None
                fd = descriptors[chunk]
                if fd < 0 or self._try_lock(fd, run[0], run[-1] + 1):
                    held.append((run, fd))
                    continue
                free = [b for b in run if self._try_lock(fd, b, b + 1)]
                held += [(part, fd) for part in _runs(free)]
                busy += [(part, fd) for part in _runs(sorted(set(run).difference(free)))]
            try:
                self._fill(held, into, waited=False)
            finally:
                self._unlock(held)
            deadline, pause = time.monotonic() + LOCK_WAIT, 0.0005
            while busy:
                ready = [(run, fd) for run, fd in busy if self._try_lock(fd, run[0], run[-1] + 1)]
                if not ready and time.monotonic() < deadline:
                    time.sleep(pause)
                    pause = min(pause * 2, 0.01)
                    continue
                if not ready:
                    log.warning("packfs: waited %.0f s for another process's fetch of %s; fetching it here",
                                LOCK_WAIT, self.remote.name)
                    ready = busy
                busy = [item for item in busy if item not in ready]
                try:
                    self._fill(ready, into, waited=True)
                finally:
                    self._unlock(ready)
        finally:
            for fd in descriptors.values():
                if fd >= 0:
                    _HELD.pop(fd, None)
                    os.close(fd)  # drops whatever lock is left

    def _fill(self, runs: List[Tuple[List[int], int]], into: Optional[_Blocks], waited: bool) -> None:
        """Of ``runs`` (locked by this thread), read what another wrote meanwhile, and
        fetch the rest in one batch, each stretch still missing one GET; write it."""
        gets: List[Tuple[List[int], int]] = []
        for run, fd in runs:
            if fd < 0:
                if into is not None:  # no cache: fetched only to be served
                    gets.append((run, fd))
                continue
            found = self._read_chunk_blocks_or_none(fd, run[0] // BLOCKS_PER_CHUNK, run, into)
            if found and into is not None:
                self._count("cache_waits" if waited else "cache_hits", len(found))
            gets += [(left, fd) for left in (self._plan([b for b in run if b not in found], found) if found else [run])]
        if not gets:
            return
        size = self.remote.size
        spans = [(left[0] * BLOCK_BYTES, min(size, (left[-1] + 1) * BLOCK_BYTES)) for left, _ in gets]
        if into is None:
            # A read ahead only writes what it fetches: each piece written to its chunk as
            # it arrives, the blocks' slots once the span is in (a block without its slot
            # is not there), so this process holds a receive buffer, not the spans.
            writers = [_SpanWriter(self, fd, left[0], end - start) for (left, fd), (start, end) in zip(gets, spans)]
            arrived = False
            try:
                self.remote.read_ranges_to(spans, lambda k, at, piece: writers[k].add(at, piece))
                arrived = True
            finally:  # the spans that arrived whole are kept, even when another failed
                for writer in writers:
                    if writer.finish() or arrived:  # fetched (a write that failed was said once)
                        self._count("readahead_bytes", writer.length)
            return
        # Not joined across a gap: _plan did what was worth it, and a gap here may be
        # blocks the cache holds.
        for (left, fd), (start, _), data in zip(gets, spans, self.remote.read_ranges(spans, gap=0)):
            self._count("cache_misses", len(left))
            into.add(start, data)
            if fd >= 0:
                self._store(fd, left[0] // BLOCKS_PER_CHUNK * BLOCKS_PER_CHUNK, left[0], data)

    @staticmethod
    def _unlock(runs: List[Tuple[List[int], int]]) -> None:
        for run, fd in runs:
            if fd >= 0:
                fcntl.fcntl(fd, _SETLK, struct.pack("hhqqi4x", fcntl.F_UNLCK, os.SEEK_SET, run[0], run[-1] + 1 - run[0], 0))

    def _plan(self, missing: List[int], cached: Set[int]) -> List[List[int]]:
        """``missing`` (sorted) as runs, each fetched with one GET: blocks of one chunk,
        at most the remote's ``part_bytes``, joined across a gap of blocks nobody asked
        for when it is under the remote's ``coalesce_gap`` (one GET instead of two), but
        never across a block the cache holds (it would be fetched again)."""
        gap = max(0, getattr(self.remote, "coalesce_gap", 0)) // BLOCK_BYTES
        most = max(1, getattr(self.remote, "part_bytes", 8 << 20) // BLOCK_BYTES)
        runs: List[List[int]] = []
        for b in missing:
            if runs and b // BLOCKS_PER_CHUNK == runs[-1][0] // BLOCKS_PER_CHUNK \
                    and b - runs[-1][-1] <= gap + 1 and b - runs[-1][0] < most \
                    and not any(between in cached for between in range(runs[-1][-1] + 1, b)):
                runs[-1].append(b)
            else:
                runs.append([b])
        return runs

    def _store(self, fd: int, base: int, first: int, data: Union[bytes, memoryview]) -> None:
        """Write blocks from ``first`` on with ``data``: every block's bytes, then the slots
        (a block without its slot is not there)."""
        try:
            os.pwrite(fd, data, SLOTS_BYTES + (first - base) * BLOCK_BYTES)
            view = memoryview(data)
            slots = bytearray()
            for at in range(0, len(data), BLOCK_BYTES):
                piece = view[at:at + BLOCK_BYTES]
                slots += SLOT.pack(crc32(piece, self._seed(first + at // BLOCK_BYTES)), len(piece))
            os.pwrite(fd, bytes(slots), (first - base) * SLOT.size)
        except OSError as error:
            self._write_failed(error)
            return
        self._note_written(len(data))

    def _try_lock(self, fd: int, first: int, last: int) -> bool:
        """Lock blocks [first, last) of the chunk open as ``fd`` (bytes of the lock space,
        not of the file) if no other holds them; True if locked (or if the file system
        has no locks: then fetch)."""
        try:
            fcntl.fcntl(fd, _SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, first, last - first, 0))
            return True
        except OSError as error:
            return error.errno not in (errno.EAGAIN, errno.EACCES)

    def _open_chunk(self, chunk: int, create: bool) -> int:
        """Chunk ``chunk``'s file, opened relative to the cache's descriptor, never
        through a link, created 0600; -1 when there is none (or it cannot be opened)."""
        if self.directory is None:
            return -1
        path = f"{self._relative}/c{chunk}"
        flags = (os.O_RDWR | os.O_CREAT if create else os.O_RDONLY) | FILE_FLAGS
        try:
            return os.open(path, flags, 0o600, dir_fd=self._top_fd)
        except FileNotFoundError:
            if create:  # the directory was removed (a cache cleared by hand): make it again
                try:
                    self._make_again()
                    return os.open(path, flags, 0o600, dir_fd=self._top_fd)
                except OSError as error:
                    self._write_failed(error)
            return -1
        except OSError as error:
            self._write_failed(error)
            return -1

    def _make_again(self) -> None:
        """Make the archive's directory again (removed by ``packfs cache clear``, or by
        hand with the cache's directory), checked as at the open."""
        try:
            private_subdir(self._top_fd, self._relative, self._top)
        except FileNotFoundError:  # the cache's directory itself is gone
            forget_root(self._top)
            self._top_fd = private_root(self._top)
            private_subdir(self._top_fd, self._relative, self._top)

    def _write_failed(self, error: OSError) -> None:
        if not self._warned:
            self._warned = True
            log.warning("packfs: the cache in %r cannot be written (%s): reading around it", self.directory,
                        error.strerror or error)
        if error.errno == errno.ENOSPC:
            self._evict()

    def _count(self, name: str, value: int) -> None:
        with self._locked():
            self._stats[name] += value
            self._unflushed[name] += value
            due = time.monotonic() - self._flushed_at >= FLUSH_EVERY
        if due:
            self.flush_counts()

    def count_hits_elsewhere(self, hits: int) -> None:
        """Add ``hits`` blocks that another reader in this process served from this
        cache without this source: the compiled daemon reads cached blocks in C
        (``cformat/blockcache.c``); what it misses it reads through this source, which
        counts those itself."""
        if hits > 0:
            self._count("cache_hits", hits)

    def prefetch(self, progress: Optional[Callable[[int], None]] = None) -> int:
        """Fill the disk cache with every byte of the archive it does not hold (a
        whole-archive scan to come: ``packfs cache prefetch``), each byte once, a window
        at a time (up to a quarter of the remote's ``memory_cap``, at most a chunk): the
        missing blocks of each in ranged GETs of up to the remote's ``part_bytes``, all
        in flight at once.  The suffix the open fetched is not fetched again: a later
        open finds it kept beside the cache (:mod:`packfs.source.tails`).  ``progress``
        is called with the bytes of each window done, and of the suffix (``size`` in
        all).  Errors are raised (unlike a read ahead's).  Returns the bytes fetched;
        ValueError without a cache directory."""
        if self.directory is None:
            raise ValueError(f"{self.remote.name!r}: no disk cache to fetch into (cache_dir off, or not writable)")
        before = self.stats()["readahead_bytes"]
        end = self.remote.suffix_start
        step = max(BLOCK_BYTES, min(CHUNK_BYTES, getattr(self.remote, "memory_cap", CHUNK_BYTES * 4) // 4)
                   // BLOCK_BYTES * BLOCK_BYTES)
        for begin in range(0, end, step):
            stop = min(end, begin + step)
            wanted = list(range(begin // BLOCK_BYTES, (stop - 1) // BLOCK_BYTES + 1))
            missing = self._read_cached(wanted, None)
            if missing:
                self._fetch(missing, None, set(wanted).difference(missing))
            if progress is not None:
                progress(stop - begin)
        if progress is not None:
            progress(self.remote.size - end)  # the suffix, which the open fetched
        self.flush_counts()
        return self.stats()["readahead_bytes"] - before

    def prefetch_spans(self, spans: Sequence[Tuple[int, int]]) -> int:
        """Make the bytes of every (start, end) span present in the disk cache without
        reading them into this process's memory: what a reader about to read many
        records of one stretch of the archive (a window of a block-aware epoch) asks
        first, so the stretch costs one or a few large GETs instead of one per record.

        The missing blocks of all the spans are fetched at once: nearby ones joined into
        runs (:meth:`_plan`: up to the remote's ``part_bytes`` each, never across a block
        the cache holds, so no byte is fetched twice), every run one GET, up to the
        remote's ``in_flight`` at once, in groups of at most a quarter of the remote's
        ``memory_cap``, each written to the cache as it arrives (a read ahead's path:
        this process holds a receive buffer, not the bytes).  Another thread or
        process fetching the same blocks is waited for (the single flight of
        :meth:`_fetch`), not doubled.  Spans reaching into the suffix the open fetched
        stop at it.  From the first call on, reads start no stream (the reader plans
        what comes next).  Returns the bytes fetched by this call; 0 without a disk cache
        (there is nowhere to keep them: the records are then read as asked)."""
        if self.directory is None:
            return 0
        self._spans_planned = True
        end_of_data = self.remote.suffix_start
        wanted: Set[int] = set()
        for start, end in spans:
            self.remote.check_span(start, end)
            end = min(end, end_of_data)
            if start < end:
                wanted.update(range(start // BLOCK_BYTES, (end - 1) // BLOCK_BYTES + 1))
        if not wanted:
            return 0
        blocks = sorted(wanted)
        before = self.stats()["readahead_bytes"]
        missing = self._read_cached(blocks, None)
        cached = wanted.difference(missing)
        # In groups of whole GETs of at most a quarter of the remote's memory_cap (as
        # prefetch's windows): the blocks of a group stay locked until all of it is in,
        # and another process waiting for one of them should not wait for 64 windows.
        step = max(BLOCK_BYTES, min(CHUNK_BYTES, getattr(self.remote, "memory_cap", CHUNK_BYTES * 4) // 4))
        group: List[int] = []
        for run in self._plan(missing, cached):
            if group and (len(group) + len(run)) * BLOCK_BYTES > step:
                self._fetch(group, None, cached)
                group = []
            group += run
        if group:
            self._fetch(group, None, cached)
        return self.stats()["readahead_bytes"] - before

    def flush_counts(self) -> None:
        """Add what this process counted since it last did (its block hits, misses and
        waits, its remote's requests and bytes) to the counters every process using
        the cache adds to (:mod:`packfs.source.cachestats`); done at close, at exit and
        every FLUSH_EVERY seconds of reading."""
        if self.directory is None:
            return
        with self._locked():
            remote = self.remote.stats()
            counts = dict(self._unflushed)
            for name in ("requests", "bytes_fetched", "retries"):
                counts[name] += remote.get(name, 0) - self._remote_counted.get(name, 0)
            self._unflushed = dict.fromkeys(COUNTERS, 0)
            self._remote_counted = dict(remote)
            self._flushed_at = time.monotonic()
        if not any(counts.values()):
            return
        try:
            os.stat(f"{self._relative}/identity", dir_fd=self._top_fd, follow_symlinks=False)
        except OSError:  # cleared meanwhile
            try:
                self._make_again()
                self._write_identity()
            except OSError:
                pass
        if not add_counts(self._relative, counts, dir_fd=self._top_fd):
            with self._locked():  # kept for the next try
                for name, value in counts.items():
                    self._unflushed[name] += value

    def _submit_ahead(self, parts: List[Tuple[int, int]]) -> None:
        """Queue ``parts`` for the threads that fetch ahead, started as needed (up to one
        a part in flight)."""
        with self._locked():
            if self._parts is None:
                self._parts = queue.SimpleQueue()
            for part in parts:
                self._parts.put(part)
            while self._workers < min(self._in_flight, MAX_WINDOW // AHEAD_PART):
                self._workers += 1
                threading.Thread(target=_fetch_ahead, args=(weakref.ref(self), self._parts), daemon=True,
                                 name="packfs-ahead").start()

    # -- streams -----------------------------------------------------------------------------

    def _follow(self, start: int, end: int, limit: int) -> None:
        """Note a read of [start, end): one that continues a stream keeps its window
        ahead of it fetched, in parts of AHEAD_PART, each its own GET, as many in flight
        as the window holds; one that does not starts a stream.  Nothing once the
        reader plans its spans (prefetch_spans)."""
        if self._spans_planned:
            return
        with self._locked():
            self._reads += 1
            stream = next((s for s in self._streams if s.next - STREAM_SLACK <= start <= s.next + STREAM_SLACK), None)
            if stream is None:
                if len(self._streams) >= STREAMS:
                    self._streams.remove(min(self._streams, key=lambda s: s.used))
                self._streams.append(_Stream(end, self._reads))
                return
            stream.next, stream.used = max(stream.next, end), time.monotonic()
            stream.ahead = max(stream.ahead, end)
            # In a row: among the last few reads (several streams may interleave).
            stream.hits = stream.hits + 1 if self._reads - stream.seen <= STREAMS else 1
            stream.seen = self._reads
            if stream.hits < STREAM_CONFIRMED or stream.ahead >= min(limit, end + stream.window // 2):
                return
            # What is fetched ahead stays bounded: at most a window's worth of parts in
            # flight, whatever the number of streams.
            parts = []
            while self._in_flight < self._max_window // AHEAD_PART and stream.ahead < min(limit, end + stream.window):
                stop = min(limit, stream.ahead + AHEAD_PART)
                parts.append((stream.ahead, stop))
                stream.ahead = stop
                self._in_flight += 1
            stream.window = min(self._max_window, stream.window * 2)
        if parts:
            self._submit_ahead(parts)

    def _read_ahead(self, begin: int, stop: int) -> None:
        try:
            wanted = list(range(begin // BLOCK_BYTES, (stop - 1) // BLOCK_BYTES + 1))
            missing = self._read_cached(wanted, None)
            if missing:
                self._fetch(missing, None, set(wanted).difference(missing))
        except Exception as error:  # a read ahead that fails is only a read not saved
            log.debug("packfs: reading ahead in %s failed: %s", self.remote.name, error)

    # -- the bound -----------------------------------------------------------------------------

    def _touch(self, chunk: int) -> None:
        # What eviction reads as "last used": a chunk's mtime, set at most every 10 s.
        now = time.monotonic()
        if now - self._touched.get(chunk, -1e9) >= 10.0:
            self._touched[chunk] = now
            try:
                os.utime(f"{self._relative}/c{chunk}", dir_fd=self._top_fd, follow_symlinks=False)
            except OSError:
                pass

    def _note_written(self, count: int) -> None:
        with self._locked():
            self._written += count
            due = self._written >= self.cache_size // 8
            if due:
                self._written = 0
        if due:
            self._evict()

    def _evict(self) -> None:
        """Remove the least recently used chunks of every archive in the cache until it
        is under 90% of its bound and 5% of the file system (at most 1 GiB) is free.
        Nothing is followed: each directory is opened with O_NOFOLLOW, each chunk
        looked at and removed relative to its directory (a symlink is not a chunk)."""
        if self.cache_root is None:
            return
        chunks = []
        total = 0
        try:
            layout = os.open(LAYOUT, DIR_FLAGS, dir_fd=self._top_fd)
        except OSError:
            return
        try:
            try:
                keys = [entry.name for entry in os.scandir(layout) if entry.is_dir(follow_symlinks=False)]
            except OSError:
                return
            for key in keys:
                try:
                    fd = os.open(key, DIR_FLAGS, dir_fd=layout)
                except OSError:
                    continue
                try:
                    for entry in os.scandir(fd):
                        if entry.name[:1] == "c" and entry.name[1:].isdigit():
                            st = entry.stat(follow_symlinks=False)
                            if stat.S_ISREG(st.st_mode):
                                chunks.append((st.st_mtime, key, entry.name, st.st_blocks * 512))
                                total += st.st_blocks * 512
                except OSError:
                    continue
                finally:
                    os.close(fd)
            try:
                fs = os.fstatvfs(layout)
                keep = min(int(fs.f_blocks * fs.f_frsize * KEEP_FREE), KEEP_FREE_MAX)
                short = keep - fs.f_bavail * fs.f_frsize
            except OSError:
                short = 0
            excess = max(total - int(self.cache_size * 0.9) if total > self.cache_size else 0, short)
            for _, key, name, size in sorted(chunks):
                if excess <= 0:
                    break
                try:
                    fd = os.open(key, DIR_FLAGS, dir_fd=layout)
                except OSError:
                    continue
                try:
                    os.unlink(name, dir_fd=fd)
                except OSError:
                    continue
                finally:
                    os.close(fd)
                excess -= size
        finally:
            os.close(layout)


# The sources with a disk cache still open, whose counts are written at exit.
_LIVE: "weakref.WeakSet[CachedSource]" = weakref.WeakSet()


def _flush_at_exit() -> None:
    for source in list(_LIVE):
        try:
            source.flush_counts()
        except Exception:  # an exit is never failed by the counters
            pass


atexit.register(_flush_at_exit)
_EXIT_REGISTERED = [os.getpid()]


def _flush_at_child_exit() -> None:
    """In a child of multiprocessing (a DataLoader worker), which ends with os._exit and
    runs no atexit handler: write the counts through its own exit hook, once."""
    if _EXIT_REGISTERED[0] == os.getpid() or "multiprocessing.util" not in sys.modules:
        return
    _EXIT_REGISTERED[0] = os.getpid()
    sys.modules["multiprocessing.util"].Finalize(None, _flush_at_exit, exitpriority=0)


AHEAD_IDLE = 30.0  # seconds a thread that fetches ahead waits for work before it ends


def _fetch_ahead(ref, parts: queue.SimpleQueue) -> None:
    """A thread that fetches ahead the parts queued for the CachedSource ``ref`` refers
    to; it ends at close (a None), when idle for AHEAD_IDLE, or once the source is gone
    (it holds no reference between parts, so an archive never closed is still freed)."""
    while True:
        try:
            part = parts.get(timeout=AHEAD_IDLE)
        except queue.Empty:
            part = False
        source = ref()
        if source is None or part is None:
            return
        with source._locked():
            if part is False:
                if parts.empty():  # idle: end (a later part starts a thread again)
                    source._workers -= 1
                    return
                continue
        try:
            source._read_ahead(*part)
        finally:
            with source._locked():
                source._in_flight -= 1
        del source


def _by_chunk(blocks: List[int]):
    """(chunk, its blocks) for sorted ``blocks``."""
    start = 0
    while start < len(blocks):
        chunk = blocks[start] // BLOCKS_PER_CHUNK
        end = start
        while end < len(blocks) and blocks[end] // BLOCKS_PER_CHUNK == chunk:
            end += 1
        yield chunk, blocks[start:end]
        start = end


def _runs(blocks: List[int]) -> List[List[int]]:
    """Sorted ``blocks`` as runs of consecutive ones."""
    runs: List[List[int]] = []
    for b in blocks:
        if runs and b == runs[-1][-1] + 1:
            runs[-1].append(b)
        else:
            runs.append([b])
    return runs


_SETLK = getattr(fcntl, "F_OFD_SETLK", fcntl.F_SETLK)

_WARNED: Set[str] = set()  # cache directories this process warned it does not use


def _warn_once(directory: str, message: str) -> None:
    if directory not in _WARNED:
        _WARNED.add(directory)
        log.warning("%s", message)
