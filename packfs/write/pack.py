"""The drivers of the builder for a directory and for entries: :func:`pack_folder`
walks a tree (scan, then each file read, by this process, by -j worker processes, or
encoded ahead by threads) and :func:`pack_entries` takes entries from the caller (an
iterator of unknown length spooled to disk first); both hand them to
:func:`.builder.write_archive`, the one place an archive is laid out.  The tar, zip,
shard, convert and Dask drivers are in the modules beside this one and feed
:func:`pack_entries`."""

from __future__ import annotations

import dataclasses
import logging
import marshal
import os
import stat as stat_module
import tempfile
import time
from typing import BinaryIO, Callable, ContextManager, Iterable, Iterator, Literal, NoReturn, Sequence

from ..errors import PackError, PackSourceError
from .builder import CHUNK, file_kind, pack_stats, write_archive
from .container import TEMP_MARKER, ContainerWriter
from .encode import Compression, RecordEncoder, may_have_holes
from .encodeahead import EncodeAhead
from .entry import Data, Entry, PackProgress, PackStats, PathLike, Readable, close_stream, readinto_of
from .exclude import ExcludePatterns
from .packverify import verify_written
from .parallel import Placer, files_on_workers
from .scan import Scanned, scan_tree
from .skips import SkipList, SkippedPath
from .treefile import CannotPack, TreeFile
from .workers import available_cores

# Entry, PackProgress, PackStats, SkippedPath and SkipList are importable from here, as
# before the builder and the types had modules of their own.
__all__ = ["Entry", "PackStats", "PackProgress", "SkippedPath", "SkipList", "pack_entries", "pack_folder"]

log = logging.getLogger("packfs")

def pack_entries(
    entries: Iterable[Entry],
    out: PathLike,
    *,
    count: int | None = None,
    force: bool = False,
    progress: PackProgress | None = None,
    xattrs: bool | None = None,
    compress: str | None = None,
    dictionary: str | None = None,
    dedup: bool | None = None,
    sparse: bool | None = None,
    verify: bool = False,
) -> PackStats:
    """Write an archive from entries instead of a directory on disk.

    Parameters
    ----------
    entries
        The entries, in any order; parents missing from them are created as
        directories with mode 0o755 and mtime 0.  Give them in depth-first order,
        names sorted bytewise, for the same bytes as :func:`pack_folder` writes.
    out
        Archive path; written atomically.
    count
        An upper bound on the number of file and symlink entries.  Defaults to
        ``len(entries)``; for an iterator without a length the data is spooled to a
        temporary file first and copied.
    force
        Replace ``out`` if it exists.
    progress
        Told ``advance(0, n)`` for every chunk of file data written and
        ``advance(1, 0)`` after each file entry (hard links, symlinks and directories
        are not reported).  Only the caller knows the totals, so it calls
        ``start`` itself.  When ``count`` is unknown, nothing is reported while the data
        is spooled (a caller reading a stream can report its input), then ``start`` is
        called with the spooled file count and bytes before they are written.
    xattrs
        Ignored (kept for callers of older versions): since format 1.4 every archive
        has room for extended attributes.
    compress, dictionary, dedup, sparse
        Format 1.5's codecs, as for :func:`pack_folder`.  Dictionaries are trained on
        the entries' data when ``entries`` is a sequence or its data is spooled (an
        iterator without ``count``); an iterator with ``count`` is packed without.
    verify
        Before the archive is moved into place, open it and check it whole (every
        CRC, every rule, every file decoded), as ``packfs verify`` does.

    Returns
    -------
    PackStats

    Raises
    ------
    PackError
        Invalid or duplicate paths, a short read, or an I/O error while writing.
    """
    return _pack_entries(entries, out, count, force, progress, xattrs,
                         Compression.from_options(compress, dictionary, dedup, sparse), verify)


def _pack_entries(entries: Iterable[Entry], out: PathLike, count: int | None, force: bool,
                  progress: PackProgress | None, xattrs: bool | None, compression: Compression,
                  verify: bool = False) -> PackStats:
    """pack_entries, its codec options read."""
    if count is None and isinstance(entries, Sequence):
        count = len(entries)
    if count is None:
        return _pack_spooled(entries, out, force=force, progress=progress, compression=compression, verify=verify)
    if xattrs is None:
        xattrs = isinstance(entries, Sequence) and any(entry.xattrs for entry in entries)
    started = time.perf_counter()
    out_path = os.fsdecode(out)
    dictionaries: list[tuple[str, bytes]] = []
    if compression.dictionary:
        if isinstance(entries, Sequence):
            dictionaries = _entry_dictionaries(entries, compression)
        else:
            log.warning("%r: no dictionaries trained: the entries are an iterator with a count "
                        "(give a sequence, or no count, to sample them)", out_path)
    builder = write_archive(entries, out_path, count, force, progress, xattrs=xattrs, compression=compression,
                             dictionaries=dictionaries,
                             before_publish=(lambda temporary: verify_written(temporary, out_path)) if verify else None)
    return pack_stats(builder, (), out_path, started)


def _entry_dictionaries(entries: Sequence[Entry], compression: Compression) -> list[tuple[str, bytes]]:
    """Format 1.5's dictionaries for ``entries`` (their small files sampled)."""
    from .dictionaries import SMALL_FILE_MAX, train_dictionaries

    files = [entry for entry in entries if entry.kind == "file"]

    def size_of(entry: Entry) -> int:
        data = entry.data
        if isinstance(data, (bytes, bytearray, memoryview)):
            return len(data)
        return entry.size if entry.size is not None else SMALL_FILE_MAX  # read to find out

    def read(index: int) -> bytes | None:
        data = files[index].data
        if isinstance(data, (bytes, bytearray, memoryview)):
            return bytes(data)
        if callable(data):  # a stream given as such cannot be read twice: not sampled
            source = data()
            buffer = bytearray(SMALL_FILE_MAX + 1)
            got = 0
            try:  # readinto, the one read a Data source must have
                while got < len(buffer):
                    more = readinto_of(source)(memoryview(buffer)[got:])
                    if not more:
                        break
                    got += more
            finally:
                close_stream(source)
            return bytes(buffer[:got])
        return None

    return train_dictionaries([(file_kind(entry.key), size_of(entry)) for entry in files], read,
                              compression.level or 3)


def _pack_spooled(entries: Iterable[Entry], out: PathLike, *, force: bool,
                  progress: PackProgress | None, compression: Compression, verify: bool = False) -> PackStats:
    """pack_entries for an iterator of unknown length: spool file data, then pack.  The
    entries themselves are spooled too, a block at a time, so that an iterator of any
    length is packed in bounded memory."""
    started = time.perf_counter()
    directory = os.path.dirname(os.path.abspath(os.fsdecode(out)))
    prefix = "." + TEMP_MARKER.strip(".-")
    with tempfile.TemporaryFile(dir=directory, prefix=prefix) as spool, \
            tempfile.TemporaryFile(dir=directory, prefix=prefix) as staged:
        block: list[tuple] = []
        count = files = 0
        buffer = bytearray(CHUNK)
        for entry in entries:
            start = length = -1
            if entry.kind == "file":
                data = entry.data
                start = spool.tell()
                if data is None or isinstance(data, (bytes, bytearray, memoryview)):
                    spool.write(data or b"")
                else:
                    source = data() if callable(data) else data
                    readinto = readinto_of(source)
                    try:  # readinto, the one read a Data source must have (the builder's too)
                        while True:
                            got = readinto(buffer)
                            if not got:
                                break
                            spool.write(memoryview(buffer)[:got])
                    finally:
                        if callable(data):
                            close_stream(source)
                length = spool.tell() - start
                files += 1
            block.append(_staged_fields(entry, start, length))
            count += 1
            if len(block) >= _STAGED_BLOCK:
                _stage(staged, block)
                block = []
        _stage(staged, block)
        spool.flush()  # _Window reads with pread, below the file object's buffer
        if progress is not None:
            progress.start(files, spool.tell())
        # count: every entry, as len() of a list of them gives (the same bytes).
        unstaged: Iterable[Entry] = _unstaged(staged, spool)
        if compression.dictionary:  # sampled from the spool, which a sequence can read twice
            unstaged = list(unstaged)
        stats = _pack_entries(unstaged, out, count, force, progress, None, compression, verify)
    return dataclasses.replace(stats, seconds=time.perf_counter() - started)  # both phases


_STAGED_BLOCK = 256  # entries spooled at a time by _pack_spooled (each may hold a 4 KiB target)


def _staged_fields(entry: Entry, start: int, length: int) -> tuple:
    """``entry`` as plain values marshal can write (its data: ``length`` bytes of the
    spool from ``start``, or none)."""
    xattrs = None if not entry.xattrs else {name: bytes(value) for name, value in entry.xattrs.items()}
    target = None if entry.target is None else os.fspath(entry.target)
    return (os.fspath(entry.path), entry.kind, target, entry.mode, entry.uid, entry.gid, entry.mtime_ns,
            entry.size, xattrs, start, length)


def _stage(staged: BinaryIO, block: list[tuple]) -> None:
    if block:
        data = marshal.dumps(block)
        staged.write(len(data).to_bytes(8, "little"))
        staged.write(data)


def _unstaged(staged: BinaryIO, spool: BinaryIO) -> Iterator[Entry]:
    """The entries _pack_spooled spooled, in order, their data read from ``spool``."""
    staged.seek(0)
    while True:
        length = staged.read(8)
        if not length:
            return
        for path, kind, target, mode, uid, gid, mtime_ns, size, xattrs, start, data_length in \
                marshal.loads(staged.read(int.from_bytes(length, "little"))):
            data: Data = None
            if start >= 0:
                data, size = _window_opener(spool, start, data_length), data_length
            yield Entry(path, data, kind, target=target, mode=mode, uid=uid, gid=gid, mtime_ns=mtime_ns,
                        size=size, xattrs=xattrs)


def _window_opener(spool: BinaryIO, start: int, length: int) -> Callable[[], Readable]:
    def reopen() -> Readable:
        return _Window(spool, start, length)

    return reopen


class _Window:
    """A read-only window [start, start+length) of an open file, read with pread."""

    def __init__(self, source: BinaryIO, start: int, length: int) -> None:
        self._fd = source.fileno()
        self._position = start
        self._end = start + length

    def readinto(self, buffer: bytearray | memoryview) -> int:
        want = min(len(buffer), self._end - self._position)
        if want <= 0:
            return 0
        data = os.pread(self._fd, want, self._position)
        buffer[: len(data)] = data
        self._position += len(data)
        return len(data)

    def close(self) -> None:
        pass




def pack_folder(
    src: PathLike,
    out: PathLike,
    *,
    follow_symlinks: bool = False,
    exclude: Sequence[str] = (),
    force: bool = False,
    progress: PackProgress | None = None,
    keep_going: bool = False,
    xattrs: bool = True,
    jobs: int | None = None,
    compress: str | None = None,
    dictionary: str | None = None,
    dedup: bool | None = None,
    sparse: bool | None = None,
    verify: bool = False,
) -> PackStats:
    """Pack the directory tree ``src`` into the archive ``out``.

    Regular files, directories (empty ones too) and symlinks are kept with their mode
    bits, uid, gid, mtime in nanoseconds and extended attributes; hard-linked files are
    stored once.  FIFOs, sockets and devices are skipped with a warning on the
    ``packfs`` logger.

    A file's bytes and the attributes stored with them are one state of the file: its
    fstat before and after the read must agree (size, mtime, ctime), and a file whose
    ctime is too recent for that to prove anything is read twice and must give the same
    bytes.  A file that changed while it was read is read again (a warning says so),
    up to three reads in all.

    A path below ``src`` that cannot be packed (a file or directory that cannot be
    opened, listed or stat'ed, that vanished, or a file that kept changing) fails the
    pack, and nothing is written; the error lists every such path in the tree, not
    only the first: once one is found, the files not yet read are only opened, to find
    the others.  With ``keep_going`` the rest is packed and each is in
    ``PackStats.skipped`` with ``failed`` set (an unreadable directory is stored
    empty, with its own attributes, its contents left out, as tar does).

    Parameters
    ----------
    src
        The directory to pack.
    out
        The archive to write, atomically: until it is complete, ``out`` is untouched.
    follow_symlinks
        Store what symlinks point to instead of the links.
    exclude
        Glob patterns; an entry is left out when its path relative to ``src`` or its
        name matches one.  ``./PATTERN``, ``/PATTERN`` and absolute paths inside
        ``src`` match from its top only, ``PATTERN/`` directories only (see
        :class:`packfs.write.ExcludePatterns`); a pattern that excluded nothing
        is logged as a warning after the pack.
    force
        Replace ``out`` if it exists.
    progress
        Told the totals after the scan, then each file as it is written.
    keep_going
        Pack the rest when paths cannot be packed, and list them in the result.
    xattrs
        Keep extended attributes (those this user can read: trusted.* needs root).
    jobs
        Files read at once (default: the cores this process may run on,
        ``os.sched_getaffinity``).  With more than one, worker processes read, check
        and write the files into their places while this one counts them in order;
        with ``compress``, ``dedup`` or ``sparse`` (encoded sizes, which the scan
        cannot know, so no place to write at) ``jobs`` threads read and encode the
        files ahead of this one (those of at most ``AHEAD_FILE_MAX``, 4 MiB; larger
        ones this one encodes as it streams them).  Either way the archive has the
        same bytes whatever ``jobs`` is, and files that change, vanish or cannot be
        read are reported the same.  The scan and the table are written by this
        process.
    compress
        ``"zstd"`` or ``"zstd:LEVEL"`` (1-22; default level DEFAULT_LEVEL): each file
        stored as zstd where that saves at least 1/16 of it, else as it is (format
        1.5, section 4f).  ``None`` or ``"none"``: stored as they are.
    dictionary
        ``"auto"``: train zstd dictionaries on a sample of the tree's small files,
        one per kind (extension) where that pays, each stored as a record and used
        for the small files of its kind.  Needs ``compress``.
    dedup
        Store files with equal bytes once (each name keeps its own metadata and
        inode); default: on with ``compress``.
    sparse
        Store files with holes without them (SEEK_DATA/SEEK_HOLE); default: on with
        ``compress``.
    verify
        Before the archive is moved into place, open it, check it whole (as
        ``packfs verify`` does) and compare every file and symlink with ``src``,
        read again: a file that changed since it was packed fails the pack.

    Returns
    -------
    PackStats

    Raises
    ------
    PackSourceError
        Without ``keep_going``: paths below ``src`` cannot be packed (all are listed).
    PackError
        ``src`` is not a directory or cannot be listed, ``out`` exists, or writing
        failed.
    ValueError
        An ``exclude`` pattern names ``src`` itself, or ``jobs`` is below 1.
    """
    started = time.perf_counter()
    compression = Compression.from_options(compress, dictionary, dedup, sparse)
    if jobs is None:
        jobs = available_cores()
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a whole number >= 1, got {jobs!r}")
    src_bytes = os.fsencode(src)
    out_text = os.fsdecode(out)
    if not os.path.isdir(src_bytes):
        raise PackError(f"{os.fsdecode(src_bytes)!r} is not a directory")
    if not force and os.path.lexists(out_text):
        raise PackError(f"{out_text!r} already exists; use --force to replace it")
    skip: set[tuple[int, int]] = set()
    try:
        existing = os.stat(out_text)
        skip.add((existing.st_dev, existing.st_ino))
    except OSError:
        pass
    try:
        out_directory = os.stat(os.path.dirname(os.path.abspath(out_text)))
    except OSError as error:
        raise PackError(f"cannot write {out_text!r}: {error.strerror}") from None
    temp_files = (
        (out_directory.st_dev, out_directory.st_ino),
        os.fsencode("." + os.path.basename(out_text) + TEMP_MARKER),
    )
    root = src_bytes.rstrip(b"/") or b"/"
    patterns = ExcludePatterns(exclude, root)
    skips = SkipList(keep_going)
    items = scan_tree(root, follow_symlinks, patterns, skip, temp_files, skips, xattrs)
    if skips.failures and not keep_going:
        _fail_listing_every_path(root, items, skips)
    data_slots = sum(1 for item in items if item.kind in ("file", "symlink"))
    if progress is not None:
        progress.start(
            sum(1 for item in items if item.kind == "file"),
            sum(item.info.st_size for item in items if item.kind == "file"),
        )

    failed_files: set[bytes] = set()  # for their hard links (only with keep_going)
    written = 0  # how many items were given to the writer

    def entries() -> Iterator[Entry | TreeFile]:
        nonlocal written
        for item in items:
            written += 1
            info = item.info
            if item.kind == "file":
                yield TreeFile(root, item.key, info, item.xattrs, written - 1)  # stored with the stat it has when read
                continue
            mode, uid, gid, mtime_ns = stat_module.S_IMODE(info.st_mode), info.st_uid, info.st_gid, info.st_mtime_ns
            if item.kind == "hardlink" and item.target in failed_files:
                skips.add(os.fsdecode(root + b"/" + item.key), _link_to_failed(root, item.target), failed=True)
            elif item.kind == "symlink" or item.kind == "hardlink":
                link: Literal["symlink", "hardlink"] = "symlink" if item.kind == "symlink" else "hardlink"
                yield Entry(item.key, None, link, target=item.target, mode=mode, uid=uid, gid=gid,
                            mtime_ns=mtime_ns, xattrs=item.xattrs)
            else:
                yield Entry(item.key, None, "dir", mode=mode, uid=uid, gid=gid, mtime_ns=mtime_ns, xattrs=item.xattrs)

    def skip_file(failure: CannotPack) -> None:
        skips.add(failure.path, failure.reason, failed=True)
        failed_files.add(items[written - 1].key)

    files = sum(1 for item in items if item.kind == "file")
    # Encoded records have sizes the scan cannot know, which -j's workers place by:
    # with codecs, threads read and encode ahead of the writer instead.
    workers = 1 if compression.used else min(jobs, files)
    threads = min(jobs, files) if compression.used else 1

    def encode_ahead(encoder: RecordEncoder) -> EncodeAhead:
        return EncodeAhead(encoder, root, items, threads, file_kind)
    dictionaries = _tree_dictionaries(root, items, compression) if compression.dictionary else []
    if not compression.sparse:
        holey = [item for item in items if item.kind == "file" and may_have_holes(item.info)]
        if holey:  # a 5 GiB disk image of 1 MiB of data would take 5 GiB
            log.warning("%d files with holes (the largest: %r, %d bytes) are stored whole, holes as zeros; "
                        "--sparse (or --compress) leaves the holes out", len(holey),
                        os.fsdecode(max(holey, key=lambda item: item.info.st_size).key),
                        max(item.info.st_size for item in holey))

    def parallel(writer: ContainerWriter) -> ContextManager[Placer]:
        return files_on_workers(writer, root, items, workers)
    try:
        builder = write_archive(entries(), out_text, data_slots, force, progress,
                                 skip_file if keep_going else None, any(item.xattrs for item in items),
                                 parallel if workers > 1 else None, compression, dictionaries,
                                 encode_ahead if threads > 1 else None,
                                 (lambda temporary: verify_written(temporary, out_text, root, items)) if verify else None)
    except CannotPack as failure:  # the writer is gone: what else cannot be packed?
        skips.add(failure.path, failure.reason, failed=True)
        failed_files.add(items[written - 1].key)
        _fail_listing_every_path(root, items[written:], skips, failed_files)
    for pattern in patterns.unused():
        log.warning("exclude pattern %r excluded nothing in %r", pattern, os.fsdecode(root))
    return pack_stats(builder, skips.paths, out_text, started)


def _tree_dictionaries(root: bytes, items: Sequence[Scanned], compression: Compression) -> list[tuple[str, bytes]]:
    """Format 1.5's dictionaries for the files of a scanned tree (a sample read)."""
    from .dictionaries import SMALL_FILE_MAX, train_dictionaries

    files = [item for item in items if item.kind == "file"]

    def read(index: int) -> bytes | None:
        source = TreeFile(root, files[index].key, files[index].info)
        try:
            source.open()
            return source.read_exactly(0, SMALL_FILE_MAX + 1)
        except CannotPack:
            return None  # reported when the file is packed
        finally:
            source.close()

    return train_dictionaries([(file_kind(item.key), item.info.st_size) for item in files], read,
                              compression.level or 3)


def _link_to_failed(root: bytes, target: bytes | None) -> str:
    return f"a hard link to {os.fsdecode(root + b'/' + (target or b''))!r}, which could not be packed"


def _fail_listing_every_path(root: bytes, items: Sequence[Scanned], skips: SkipList,
                             failed_files: set[bytes] | None = None) -> NoReturn:
    """Raise PackSourceError listing every path that cannot be packed: those in
    ``skips``, and those among ``items`` (not yet written) that cannot be opened, or are
    hard links to files that cannot be (in ``failed_files`` or found here).  Opening
    costs a small part of reading, so all are found in one run, not one per run."""
    failed_files = set() if failed_files is None else failed_files
    for item in items:
        path = os.fsdecode(root + b"/" + item.key)
        if item.kind == "file":
            source = TreeFile(root, item.key, item.info)
            try:
                source.open()
            except CannotPack as failure:
                skips.add(path, failure.reason, failed=True)
                failed_files.add(item.key)
            else:
                source.close()
        elif item.kind == "hardlink" and item.target in failed_files:
            skips.add(path, _link_to_failed(root, item.target), failed=True)
    raise PackSourceError(skips.failures)
