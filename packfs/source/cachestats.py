"""What a node's disk cache holds, and what every process that used it counted: the
per-archive counters file, the listing, and clearing (``packfs cache``).

Each archive's directory in the cache (``cache_dir/v1/<key>/``, see
:mod:`packfs.source.cache`) holds, next to its chunk files and ``identity``::

    cache_dir/v1/<key>/stats    the counters of every process that read it

``stats`` is two slots of ``COUNTS`` (magic, layout, sequence number, the counters, when
first and last used, a CRC).  A process adds what it counted since it last did (at
close, at exit, and at most every ``FLUSH_EVERY`` seconds while it reads): it locks the
file (an open-file-description lock, as the chunks' blocks), reads the slot with the
highest sequence number whose CRC matches, and writes the sum into the *other* slot with
the next number.  A writer killed mid-write, or a write torn by a power cut, leaves the
older slot whole: its counts are lost, never garbled.  Readers take no lock.  A process
killed by SIGKILL loses what it counted since its last write (at most ``FLUSH_EVERY``
seconds of it); the file never grows, whatever the number of processes.

Clearing removes an archive's files relative to its directory's descriptor, opened
with ``O_NOFOLLOW``: a symlink in the cache is removed as a link, never followed (the
cache is one user's: see :mod:`packfs.source.cachedir`).  Each chunk is removed while
holding the lock on all its blocks, so a fetch in progress in another process
finishes first; a process that reads it later finds it gone and fetches again (never
other bytes: the blocks it held are checked by CRC).
"""

from __future__ import annotations

import ast
import errno
import fcntl
import os
import stat
import struct
import time
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

from ..format import crc32

__all__ = ["COUNTERS", "CachedArchive", "add_counts", "read_counts", "cached_archives", "clear_cached",
           "FLUSH_EVERY"]

# What each process adds up (CachedSource's counters and its remote's).
COUNTERS = ("cache_hits", "cache_misses", "cache_waits", "readahead_bytes", "requests", "bytes_fetched", "retries")
# magic, layout, sequence, the counters, first and last use (seconds since the epoch), CRC-32 of what precedes it
COUNTS = struct.Struct("<4sIQ7QddI4x")
COUNTS_MAGIC = b"PFCS"
COUNTS_LAYOUT = 1
STATS_NAME = "stats"
# Seconds between a reading process's writes of its counts.
FLUSH_EVERY = 10.0
# How long a writer waits for another's lock on the counters before trying later.
COUNTS_LOCK_WAIT = 2.0
# How long clearing waits for a fetch in progress in a chunk before removing it anyway.
CLEAR_LOCK_WAIT = 10.0
IDENTITY_MAX = 4096  # bytes of an identity file read (a URL, a tag and a size)

_SETLK = getattr(fcntl, "F_OFD_SETLK", fcntl.F_SETLK)
_LOCK = struct.Struct("hhqqi4x")


class CachedArchive(NamedTuple):
    """One archive in a node's disk cache: what it is, what the cache holds of it, and the
    counters of every process that read it (blocks of 16 KiB for hits, misses and waits)."""

    url: str  # as opened (no user, password or query); "" if its identity file is missing
    tag: str  # its ETag or version id
    size: int  # the archive's size in bytes (0: unknown)
    key: str  # its directory's name
    path: str  # its directory
    cached_bytes: int  # the chunk files' blocks on disk
    chunks: int
    cache_hits: int
    cache_misses: int
    cache_waits: int
    readahead_bytes: int
    requests: int  # GETs (retries included) of every process that read it
    bytes_fetched: int
    retries: int
    first_used: float  # seconds since the epoch (0: unknown)
    last_used: float


def _lock(fd: int, kind: int, wait: float) -> bool:
    """Lock all of ``fd`` (F_WRLCK or F_UNLCK), waiting up to ``wait`` seconds; True if
    done (or if the file system has no locks)."""
    deadline, pause = time.monotonic() + wait, 0.001
    while True:
        try:
            fcntl.fcntl(fd, _SETLK, _LOCK.pack(kind, os.SEEK_SET, 0, 0, 0))
            return True
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.EACCES):
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _newest(data: bytes) -> Tuple[int, int, Dict[str, int], float, float]:
    """(slot, sequence, counters, first, last) of the newest whole slot in ``data``;
    slot -1 and zeros when there is none."""
    best: Tuple[int, int, Dict[str, int], float, float] = (-1, 0, dict.fromkeys(COUNTERS, 0), 0.0, 0.0)
    for slot in (0, 1):
        piece = data[slot * COUNTS.size:(slot + 1) * COUNTS.size]
        if len(piece) < COUNTS.size:
            continue
        magic, layout, sequence, *rest = COUNTS.unpack(piece)
        if magic != COUNTS_MAGIC or layout != COUNTS_LAYOUT or rest[-1] != crc32(piece[:COUNTS.size - 8]):
            continue
        if best[0] < 0 or sequence > best[1]:
            best = (slot, sequence, dict(zip(COUNTERS, rest[:len(COUNTERS)])), rest[-3], rest[-2])
    return best


def add_counts(directory: str, counts: Dict[str, int], now: Optional[float] = None,
               dir_fd: Optional[int] = None) -> bool:
    """Add ``counts`` (names of COUNTERS) to the counters file of the archive whose
    cache directory is ``directory`` (relative to ``dir_fd`` when given), and mark it
    used now; False if it could not be written (the caller keeps them for its next
    try)."""
    now = time.time() if now is None else now
    try:
        fd = os.open(os.path.join(directory, STATS_NAME), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=dir_fd)
    except OSError:
        return False
    try:
        if not _lock(fd, fcntl.F_WRLCK, COUNTS_LOCK_WAIT):
            return False
        _, sequence, totals, first, _ = _newest(os.pread(fd, 2 * COUNTS.size, 0))
        for name in COUNTERS:
            totals[name] = min(totals[name] + max(0, int(counts.get(name, 0))), (1 << 64) - 1)
        body = COUNTS.pack(COUNTS_MAGIC, COUNTS_LAYOUT, sequence + 1, *(totals[n] for n in COUNTERS),
                           first or now, now, 0)[:COUNTS.size - 8]
        record = body + struct.pack("<I4x", crc32(body))
        os.pwrite(fd, record, ((sequence + 1) % 2) * COUNTS.size)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # drops the lock


def read_counts(directory: str, dir_fd: Optional[int] = None) -> Tuple[Dict[str, int], float, float]:
    """(counters, first use, last use) of the archive whose cache directory is
    ``directory`` (relative to ``dir_fd`` when given): zeros if nothing was counted (or
    the file is damaged)."""
    try:
        fd = os.open(os.path.join(directory, STATS_NAME), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return dict.fromkeys(COUNTERS, 0), 0.0, 0.0
    try:
        _, _, totals, first, last = _newest(os.pread(fd, 2 * COUNTS.size, 0))
    except OSError:
        return dict.fromkeys(COUNTERS, 0), 0.0, 0.0
    finally:
        os.close(fd)
    return totals, first, last


def _identity(directory: str, dir_fd: Optional[int] = None) -> Tuple[str, str, int]:
    """(URL, tag, size) from an archive's identity file (written as the repr of
    RemoteFile.identity); ("", "", 0) if it is missing or not that."""
    try:
        fd = os.open(os.path.join(directory, "identity"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return "", "", 0
    try:
        text = os.read(fd, IDENTITY_MAX).decode("utf-8", "surrogateescape")
    except OSError:
        return "", "", 0
    finally:
        os.close(fd)
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return "", "", 0
    if isinstance(value, tuple) and len(value) == 3 and isinstance(value[0], str) and isinstance(value[2], int):
        return value[0], str(value[1]), value[2]
    return "", "", 0


def _archive_directories(root: int) -> Iterator[os.DirEntry]:
    """The archives' directories in the directory open as ``root`` (the layout's): real
    directories whose name is a key (40 hex digits); a symlink or anything else is left
    alone."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        if len(entry.name) == 40 and all(c in "0123456789abcdef" for c in entry.name) \
                and entry.is_dir(follow_symlinks=False):
            yield entry


def _chunks(directory: str, dir_fd: int) -> Tuple[int, int, float]:
    """(bytes on disk, chunk files, latest mtime) of an archive's chunk files."""
    total = count = 0
    latest = 0.0
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return 0, 0, 0.0
    try:
        for entry in os.scandir(fd):  # (its entries' stat is relative to fd)
            if entry.name[:1] == "c" and entry.name[1:].isdigit():
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # evicted meanwhile
                if stat.S_ISREG(st.st_mode):
                    total += st.st_blocks * 512
                    count += 1
                    latest = max(latest, st.st_mtime)
    except OSError:
        return 0, 0, 0.0
    finally:
        os.close(fd)
    return total, count, latest


def _open_layout(root: str, dir_fd: Optional[int]) -> int:
    """The layout's directory ``root`` (relative to ``dir_fd`` when given), opened
    without following a link; -1 if there is none."""
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return -1


def cached_archives(root: str, dir_fd: Optional[int] = None, shown: Optional[str] = None) -> List[CachedArchive]:
    """Every archive in the cache whose layout directory is ``root`` (``cache_dir/v1``;
    relative to ``dir_fd`` when given, then named ``shown``), by URL then first use; []
    for none (or no such directory)."""
    found: List[CachedArchive] = []
    layout = _open_layout(root, dir_fd)
    if layout < 0:
        return found
    try:
        for entry in _archive_directories(layout):
            url, tag, size = _identity(entry.name, layout)
            cached, count, touched = _chunks(entry.name, layout)
            counts, first, last = read_counts(entry.name, layout)
            if not first:
                try:
                    first = os.stat(entry.name, dir_fd=layout, follow_symlinks=False).st_mtime
                except OSError:
                    continue  # removed meanwhile
            found.append(CachedArchive(url, tag, size, entry.name, os.path.join(shown or root, entry.name), cached,
                                       count, counts["cache_hits"], counts["cache_misses"], counts["cache_waits"],
                                       counts["readahead_bytes"], counts["requests"], counts["bytes_fetched"],
                                       counts["retries"], first, max(last, touched)))
    finally:
        os.close(layout)
    return sorted(found, key=lambda a: (a.url, a.first_used))


def clear_cached(root: str, url: Optional[str] = None, dir_fd: Optional[int] = None) -> Tuple[int, int]:
    """Remove every archive (``url`` given: every version of that one) from the cache
    whose layout directory is ``root`` (relative to ``dir_fd`` when given); (archives
    removed, bytes freed).  Safe while other processes read: see the module's
    docstring."""
    removed = freed = 0
    layout = _open_layout(root, dir_fd)
    if layout < 0:
        return removed, freed
    try:
        for entry in _archive_directories(layout):
            if url is not None and _identity(entry.name, layout)[0] != url:
                continue
            freed += _remove_archive(layout, entry.name)
            removed += 1
    finally:
        os.close(layout)
    return removed, freed


def _remove_archive(root: int, name: str) -> int:
    """Remove the files of one archive's directory ``name`` in the directory open as
    ``root`` (chunks under their lock), then the directory if it is empty; the bytes
    freed.  Nothing is followed: the directory is opened with O_NOFOLLOW and its files
    removed relative to it."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
    except OSError:
        return 0
    freed = 0
    try:
        for child in os.listdir(fd):
            try:
                st = os.stat(child, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                continue  # not the layout's: left alone
            chunk = -1
            if stat.S_ISREG(st.st_mode) and child[:1] == "c" and child[1:].isdigit():
                try:
                    chunk = os.open(child, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                    _lock(chunk, fcntl.F_WRLCK, CLEAR_LOCK_WAIT)  # a fetch in progress finishes first
                except OSError:
                    chunk = -1
            try:
                os.unlink(child, dir_fd=fd)  # a symlink is removed, never followed
                freed += st.st_blocks * 512 if stat.S_ISREG(st.st_mode) else 0
            except OSError:
                pass
            finally:
                if chunk >= 0:
                    os.close(chunk)
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=root)
    except OSError:
        pass  # not empty (a reader wrote meanwhile) or not ours
    return freed
