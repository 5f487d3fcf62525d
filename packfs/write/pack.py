"""pack_folder() and pack_entries(): write a tree of entries into one archive."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import logging
import marshal
import os
import shutil
import stat as stat_module
import tempfile
import time
from array import array
from dataclasses import dataclass
from typing import (BinaryIO, Callable, ContextManager, Iterable, Iterator, Literal, Mapping, NoReturn, Optional,
                    Protocol, Sequence, Union)

from ..core.paths import PathArg, archive_key
from ..errors import PackError, PackSourceError
from ..format import (CODECS_SINCE_MINOR, INDEX_SINCE_MINOR, NO_RECORD, S_IFDIR, S_IFLNK, S_IFREG, SECTION_ALIGNMENT, SECTIONS,
                      XATTR_SECTIONS, crc32, pack_footer, record_count_for, section_count_for,
                      symlink_target_problem)
from .container import TEMP_MARKER, ContainerWriter
from .encode import SPARSE_MIN_HOLES, Compression, RecordEncoder, may_have_holes
from .encodeahead import EncodeAhead
from .packverify import verify_written
from .parallel import FileStamp, Placer, files_on_workers
from .exclude import ExcludePatterns
from .scan import Scanned, scan_tree
from .skips import SkipList, SkippedPath
from .treefile import CannotPack, TreeFile, read_stable
from .workers import available_cores

__all__ = ["Entry", "PackStats", "PackProgress", "SkippedPath", "SkipList", "pack_entries", "pack_folder"]

log = logging.getLogger("packfs")

_CHUNK = 1 << 20
# Bytes of memory the table's layout may hold (None: packfs.write.tablestream's default);
# more entries are sorted in runs on disk and merged.  Tests make it tiny so that small
# packs spill.
_TABLE_MEMORY: int | None = None

PathLike = PathArg
Data = Union[bytes, bytearray, memoryview, BinaryIO, Callable[[], BinaryIO], None]
# Extended attributes by name, the names all str or all bytes (a Mapping is invariant in
# its keys: Mapping[str | bytes, bytes] would refuse a dict of bytes names).
Xattrs = Union[Mapping[str, bytes], Mapping[bytes, bytes]]


class PackProgress(Protocol):
    """What pack_folder and pack_entries report progress to (the CLI draws a bar from it).

    ``start`` may be called again, with new totals, when a pack has a second phase
    (see :func:`pack_entries`); a total of 0 means unknown.
    """

    def start(self, total_files: int, total_bytes: int) -> None:
        """A pack (or its next phase) begins: ``total_files`` and ``total_bytes`` to come (0: unknown)."""

    def advance(self, files: int, nbytes: int) -> None:
        """``files`` more files and ``nbytes`` more bytes were written."""


@dataclass(frozen=True)
class Entry:
    """One entry for :func:`pack_entries`.

    Parameters
    ----------
    path
        Path inside the archive, ``/``-separated; a leading ``/`` is ignored.
    data
        File contents: bytes, a binary file object, or a callable returning one (opened
        only when the entry is written, so millions of entries need no open files).
    kind
        ``"file"``, ``"dir"``, ``"symlink"`` (``target`` is the link text) or
        ``"hardlink"`` (``target`` is the path of an earlier file entry: another name
        of that file, with its mode, owner, mtime and extended attributes; its own are
        ignored, as a file system has one set per file).
    mode
        Permission bits; default 0o644 for files, 0o755 for directories, 0o777 for
        symlinks.
    size
        Expected file size; when given, a different number of bytes read is an error.
    xattrs
        Extended attributes, name to value (format section 4c; names in the user.,
        security., trusted. or system. namespace).  A hard link has its file's.
    """

    path: PathLike
    data: Data = None
    kind: Literal["file", "dir", "symlink", "hardlink"] = "file"
    target: PathLike | None = None
    mode: int | None = None
    uid: int = 0
    gid: int = 0
    mtime_ns: int = 0
    size: int | None = None
    # Optional[...] rather than "X | None": dataclasses evaluate no annotation, but
    # typing.get_type_hints() on Python 3.9 would.
    xattrs: Optional[Xattrs] = None

    # The keys are worked out once, on first use, and kept with the entry (the cache is
    # the instance's __dict__, which a frozen dataclass leaves writable to
    # cached_property): every step of a pack (shards, the table, the codec's choice)
    # asks for them.  Not at construction: an Entry with a path the format forbids
    # is refused by pack_entries, as a PackError, not where it is made.
    @functools.cached_property
    def key(self) -> bytes:
        """``path`` as the archive stores it (:func:`packfs.core.archive_key`): bytes, no
        leading, trailing or doubled slashes; PackError for a path the format forbids."""
        return archive_key(self.path)

    @functools.cached_property
    def target_key(self) -> bytes:
        """For a hard link, the key of the file it names (``target`` as ``key`` is ``path``)."""
        return archive_key(self.target or b"")


@dataclass(frozen=True)
class PackStats:
    """What a pack wrote, and every path it left out (``skipped``, in the order met;
    paths left out by ``exclude`` are not listed)."""

    files: int
    dirs: int
    symlinks: int
    hardlinks: int
    skipped: tuple[SkippedPath, ...]
    file_bytes: int
    archive_bytes: int
    seconds: float
    # Files that changed while they were read, stored as a later read found them whole
    # (what GNU tar calls "file changed as we read it"; packfs pack then exits 3).
    changed: tuple[str, ...] = ()
    # Files stored as another file's record because their bytes are equal (format 4f).
    deduplicated: int = 0

    @property
    def failed(self) -> tuple[SkippedPath, ...]:
        """The skipped paths that could not be read whole (``packfs pack`` then exits 3)."""
        return tuple(path for path in self.skipped if path.failed)


_DEFAULT_MODE = {"file": 0o644, "dir": 0o755, "symlink": 0o777, "hardlink": 0o644}
_TYPE_BITS = {"file": S_IFREG, "dir": S_IFDIR, "symlink": S_IFLNK, "hardlink": S_IFREG}


class _ArchiveBuilder:
    """Streams data records into a ContainerWriter and collects the table rows."""

    def __init__(self, writer: ContainerWriter, data_slots: int, progress: PackProgress | None = None,
                 xattrs: bool = False, encoder: RecordEncoder | None = None) -> None:
        self.writer = writer
        self.encoder = encoder  # format 1.5: records compressed, shared or sparse
        self.data_slots = data_slots
        self.progress = progress
        self.with_xattrs = xattrs  # the writer's record count has room for section 4c
        # Imported here: the builder needs numpy, which readers (mount, cat) skip at start-up.
        from .tablestream import DEFAULT_BUDGET, TableStream

        self.rows = TableStream(str(writer.out.parent), DEFAULT_BUDGET if _TABLE_MEMORY is None else _TABLE_MEMORY)
        self.dirs = 0  # known once the table is laid out
        self.counts = {"file": 0, "dir": 0, "symlink": 0, "hardlink": 0}
        self.file_bytes = 0
        self.changed: list[str] = []  # files read again because they changed: the user's answer
        self.deduplicated = 0  # files stored as an earlier file's record (format 4f)
        self._buffer = bytearray(_CHUNK)
        self.placer: Placer | None = None  # with -j N: files read by worker processes
        self.ahead: EncodeAhead | None = None  # with -j N and codecs: files read and encoded by threads

    def _advance_bytes(self, nbytes: int) -> None:
        if self.progress is not None:  # by chunk: a large file moves the bar too
            self.progress.advance(0, nbytes)

    def _new_record(self) -> None:
        if self.writer.records_written >= self.data_slots:
            raise PackError(
                f"more files and symlinks than the {self.data_slots} declared "
                f"(pass a larger count)"
            )
        self.writer.begin_record()

    def add(self, entry: Entry | TreeFile) -> None:
        if isinstance(entry, TreeFile):
            self._add_tree_file(entry)
            return
        key = entry.key
        kind = entry.kind
        if kind not in _TYPE_BITS:
            raise ValueError(f"Entry.kind must be file, dir, symlink or hardlink, got {kind!r}")
        label = os.fsdecode(key)
        mode = (_DEFAULT_MODE[kind] if entry.mode is None else entry.mode) & 0o7777
        mode |= _TYPE_BITS[kind]
        uid, gid, mtime_ns = entry.uid, entry.gid, entry.mtime_ns
        link_to = b""
        if kind == "dir":
            record, size = NO_RECORD, 0
        elif kind == "symlink":
            if entry.target is None:
                raise PackError(f"symlink {label!r} has no target")
            target = os.fsencode(entry.target)
            # Readers refuse what the format does not allow (a long target: no kernel
            # makes one, and following it would cost time in proportion to its length).
            problem = symlink_target_problem(target)
            if problem:
                raise PackError(f"symlink {label!r} has {problem}")
            if self.placer is not None:  # written by a worker process, in its chunk
                record, size = self.placer.place_symlink(target), len(target)
            else:
                self._new_record()
                self.writer.write(target)
                record, size = self.writer.end_record(), len(target)
        elif kind == "hardlink":
            if entry.target is None:
                raise PackError(f"hard link {label!r} has no target")
            # Every name of a file has its attributes: readers show the first name's
            # (format section 4, first_link) under all of them.  The table takes them
            # from the file's entry, which must be an earlier one.
            link_to = entry.target_key
            record, size, mode = NO_RECORD, 0, S_IFREG
        else:
            record, size = self._write_file(entry, label)
            self.file_bytes += size
        self.counts[kind] += 1
        # A hard link has its file's extended attributes (format 4c).
        self._add_row(key, label, mode, uid, gid, mtime_ns, size, record,
                      None if kind == "hardlink" else entry.xattrs, link_to)

    def _add_row(self, key: bytes, label: str, mode: int, uid: int, gid: int, mtime_ns: int, size: int,
                 record: int, xattrs: Xattrs | None = None, link_to: bytes = b"") -> None:
        """Give the table an entry (with its record's CRC and offset)."""
        crc, offset = (0, 0) if record == NO_RECORD else self.writer.record_span(record)
        encoded = b""
        if xattrs:
            from .xattrs import encode_xattrs

            try:
                encoded = encode_xattrs({os.fsencode(name): bytes(value) for name, value in xattrs.items()})
            except ValueError as error:
                raise PackError(f"{label!r} has an extended attribute the format cannot store: {error}") from None
        self.rows.add(key, mode, uid, gid, mtime_ns, size, record, crc, offset, encoded, link_to)

    def _add_tree_file(self, source: TreeFile) -> None:
        key = archive_key(source.key)
        record, size, info = self._write_tree_file(source)
        self.file_bytes += size
        self.counts["file"] += 1
        self._add_row(key, source.path, S_IFREG | stat_module.S_IMODE(info.st_mode), info.st_uid, info.st_gid,
                      info.st_mtime_ns, size, record, source.xattrs)

    def _write_tree_file(self, source: TreeFile) -> tuple[int, int, os.stat_result | FileStamp]:
        """Copy a file of the tree into a record so that the bytes stored are one state
        of the file, read again while it changes; return (record, size, the stat of
        that state, which is what the entry stores).  A file that cannot be packed
        raises CannotPack, its record dropped."""
        if self.placer is not None:  # read by a worker process: placed in order here
            record, size, info, changed, nbytes = self.placer.place(source)
            if self.progress is not None:
                self.progress.advance(0, nbytes)
        else:
            ahead = self.ahead.take(source) if self.ahead is not None else None
            if ahead is not None:
                encoded, info, changed = ahead
                self._new_record()
                record, size = self.encoder.commit(encoded), len(encoded.raw)
                self._advance_bytes(size)
                if changed:
                    log.warning("%r changed while it was read; stored as read again", source.path)
                    self.changed.append(source.path)
                return record, size, info
            source.open()
            try:
                sparse = self._write_sparse(source) if self.encoder is not None else None
                if sparse is not None:
                    record, size, info = sparse
                    changed = False
                else:
                    sink = _RecordSink(self, _kind(source.key))
                    size, info, changed = read_stable(source, sink, self._buffer, self._advance_bytes)
            finally:
                source.close()
            if sparse is None:
                record = self.writer.end_record() if self.encoder is None else self.encoder.end()
        if changed:
            log.warning("%r changed while it was read; stored as read again", source.path)
            self.changed.append(source.path)
        return record, size, info

    def _write_sparse(self, source: TreeFile) -> tuple[int, int, os.stat_result] | None:
        """Write ``source`` without its holes if it has enough of them (format 4f,
        CODEC_SPARSE): (record, size, stat), or None to write it whole.  A file that
        changes meanwhile is written whole, by read_stable's rereads."""
        encoder = self.encoder
        if encoder is None or not encoder.compression.sparse:
            return None
        if not may_have_holes(source.scanned):
            return None  # too few blocks missing for holes that pay
        before = source.state()
        size = before[0].st_size
        extents = source.data_extents(size)
        if extents is None or size - sum(length for _, length in extents) < SPARSE_MIN_HOLES:
            source.reset_state(before)
            return None
        self._new_record()
        encoder.write_extents(extents, source.read_exactly, size)
        if source.change(before[0], size) is not None:  # read whole, by read_stable's rereads
            self.writer.discard_record()
            return None
        self._advance_bytes(size)
        return encoder.end_sparse(extents), size, before[0]

    def _write_file(self, entry: Entry, label: str) -> tuple[int, int]:
        data = entry.data
        self._new_record()
        encoder = self.encoder
        if encoder is not None:
            encoder.begin(_kind(entry.key))
            write = encoder.write
        else:
            write = self.writer.write
        if data is None:
            data = b""
        if isinstance(data, (bytes, bytearray, memoryview)):
            write(data)
            size = len(data)
            if self.progress is not None:
                self.progress.advance(0, size)
        else:
            source = data() if callable(data) else data
            size = 0
            try:
                while True:
                    got = source.readinto(self._buffer)  # type: ignore[attr-defined]
                    if not got:
                        break
                    write(memoryview(self._buffer)[:got])
                    size += got
                    if self.progress is not None:  # by chunk: a large file moves the bar too
                        self.progress.advance(0, got)
            finally:
                if callable(data):
                    source.close()
        if entry.size is not None and size != entry.size:
            raise PackError(
                f"{label!r} changed size while packing: {entry.size} bytes when scanned, "
                f"{size} bytes read"
            )
        return (self.writer.end_record() if encoder is None else encoder.end()), size

    def _write_section(self, chunks: Iterable[bytes | memoryview]) -> tuple[int, int]:
        """Write one section, given in chunks, behind its padding record (format
        section 2); its span."""
        writer = self.writer
        writer.write_record(bytes(-writer.position % SECTION_ALIGNMENT))
        start = writer.position
        writer.begin_record()
        for chunk in chunks:
            writer.write(chunk)
        writer.end_record()
        return start, writer.position

    def _page_crcs(self, start: int, length: int, page_size: int) -> bytes:
        """The CRC of each ``page_size`` page of the file's bytes [start, start + length)."""
        crcs = array("I")
        pages_a_read = max(1, _CHUNK // page_size)
        for at in range(start, start + length, page_size * pages_a_read):
            data = memoryview(self.writer.read_back(at, min(page_size * pages_a_read, start + length - at)))
            crcs.extend(crc32(data[page : page + page_size]) for page in range(0, len(data), page_size))
        return crcs.tobytes()

    def finish(self) -> int:
        """Write the table, the lookup index, the tail and the footer (the directories
        no entry named are added); return the entry count."""
        writer = self.writer
        while writer.records_written < self.data_slots:
            writer.write_record(b"")  # reserved slots the entries did not use
        from .indexbuild import build_paged_tail

        table = self.rows.finish()
        try:
            pieces = writer.piece_table()  # the records that follow (the table) have no pieces
            spans = [self._write_section(table.section(name)) for name, _ in SECTIONS]
            # Sections 4, 4b and 4c (4c empty without attributes: every 1.4 archive has it).
            spans += [self._write_section([memoryview(column).cast("B")]) for column in pieces]
            spans += [self._write_section(table.section(name)) for name, _ in XATTR_SECTIONS]
            # Sections 4d and 4e: the lookup index, then the tail that locates everything.
            data_end = writer.record_offset(self.data_slots)  # offset[D]: the padding before section 0
            regions = list(writer.header_regions(self.data_slots)) + [(start, end - start) for start, end in spans]
            spans.append(self._write_section(table.section("index")))
            if self.encoder is not None:  # format 1.5: sections 22 and 23, paged like 0 .. 20
                codec_spans = [self._write_section(chunks) for chunks in self.encoder.sections(self.data_slots)]
                spans += codec_spans
                regions += [(start, end - start) for start, end in codec_spans]
            tail_start = writer.position + (-writer.position % SECTION_ALIGNMENT)
            tail = build_paged_tail(
                record_count=writer.record_count, data_end=data_end, tail_start=tail_start,
                spans=[(start, end - start) for start, end in spans],
                region_lengths=[length for _, length in regions],
                region_page_crcs=lambda page_size: [self._page_crcs(start, length, page_size)
                                                    for start, length in regions],
                index=table)
            self._write_section([tail])
        finally:
            table.close()
        if writer.records_written + 1 < writer.record_count:
            writer.write_record(b"")  # the parity record (format section 2)
        minor = INDEX_SINCE_MINOR if self.encoder is None else CODECS_SINCE_MINOR
        writer.write_record(pack_footer(table.entry_count, self.data_slots, minor, tail))
        self.dirs = table.dir_count
        return table.entry_count


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
    builder = _write_archive(entries, out_path, count, force, progress, xattrs=xattrs, compression=compression,
                             dictionaries=dictionaries,
                             before_publish=(lambda temporary: verify_written(temporary, out_path)) if verify else None)
    return _stats(builder, (), out_path, started)


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
                    more = source.readinto(memoryview(buffer)[got:])  # type: ignore[attr-defined]
                    if not more:
                        break
                    got += more
            finally:
                source.close()
            return bytes(buffer[:got])
        return None

    return train_dictionaries([(_kind(entry.key), size_of(entry)) for entry in files], read,
                              compression.level or 3)


def _write_archive(entries: Iterable[Entry | TreeFile], out: str, data_slots: int, force: bool,
                   progress: PackProgress | None = None,
                   cannot_pack: Callable[[CannotPack], None] | None = None, xattrs: bool = False,
                   parallel: Callable[[ContainerWriter], ContextManager[Placer]] | None = None,
                   compression: Compression | None = None,
                   dictionaries: Sequence[tuple[str, bytes]] = (),
                   encode_ahead: Callable[[RecordEncoder], EncodeAhead] | None = None,
                   before_publish: Callable[[str], None] | None = None) -> _ArchiveBuilder:
    """Write ``entries`` and the table to ``out`` atomically; the one write path.  A
    file of a tree that cannot be packed is given to ``cannot_pack`` (which may raise),
    or, without it, ends the write.  ``xattrs``: room for section 4c (format 1.3).
    ``parallel``: the worker processes that read the files of a tree (``-j N``),
    started once the writer exists and ended before the table is written.
    ``compression``: format 1.5's codecs (section 4f), with ``dictionaries`` (kind,
    bytes) written as the first records; ``encode_ahead``: the threads that read and
    encode a tree's files ahead of the writer (``-j N`` with codecs);
    ``before_publish``: checks the complete archive under its temporary name (--verify)."""
    encoded = compression is not None and compression.used
    data_slots += len(dictionaries)
    sections = section_count_for(CODECS_SINCE_MINOR if encoded else INDEX_SINCE_MINOR)
    with ContainerWriter(out, record_count_for(data_slots, sections), force=force, pieces=True) as writer:
        encoder = None
        if encoded:
            written = {kind: (writer.write_record(data), data) for kind, data in dictionaries}
            encoder = RecordEncoder(writer, compression, written, str(writer.out.parent))
        builder = _ArchiveBuilder(writer, data_slots, progress, xattrs, encoder)
        try:
            with (parallel(writer) if parallel is not None else contextlib.nullcontext()) as placer, \
                    (encode_ahead(encoder) if encode_ahead is not None and encoder is not None
                     else contextlib.nullcontext()) as ahead:
                builder.placer = placer
                builder.ahead = ahead
                for entry in entries:
                    try:
                        builder.add(entry)  # reports the bytes as they are written
                    except CannotPack as failure:
                        if cannot_pack is None:
                            raise
                        cannot_pack(failure)
                        continue
                    if progress is not None and entry.kind == "file":
                        progress.advance(1, 0)
            builder.placer = builder.ahead = None
            builder.finish()  # the table's runs and columns are on disk too
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise PackError(f"cannot write {out!r}: {error.strerror}") from None
            raise PackError(f"packing into {out!r} failed: {error}") from None
        finally:
            if encoder is not None:
                builder.deduplicated = encoder.deduplicated
                encoder.close()
        writer.commit(before_publish)
    return builder


def _stats(builder: _ArchiveBuilder, skipped: Sequence[SkippedPath], out: str, started: float) -> PackStats:
    counts = builder.counts
    return PackStats(
        files=counts["file"] + counts["hardlink"],
        dirs=builder.dirs,
        symlinks=counts["symlink"],
        hardlinks=counts["hardlink"],
        skipped=tuple(skipped),
        file_bytes=builder.file_bytes,
        archive_bytes=os.path.getsize(out),
        seconds=time.perf_counter() - started,
        changed=tuple(builder.changed),
        deduplicated=builder.deduplicated,
    )


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
        for entry in entries:
            start = length = -1
            if entry.kind == "file":
                data = entry.data
                start = spool.tell()
                if data is None or isinstance(data, (bytes, bytearray, memoryview)):
                    spool.write(data or b"")
                else:
                    source = data() if callable(data) else data
                    try:
                        shutil.copyfileobj(source, spool, _CHUNK)
                    finally:
                        if callable(data):
                            source.close()
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


def _window_opener(spool: BinaryIO, start: int, length: int) -> Callable[[], BinaryIO]:
    def reopen() -> BinaryIO:
        return _Window(spool, start, length)  # type: ignore[return-value]

    return reopen


class _Window:
    """A read-only window [start, start+length) of an open file, read with pread."""

    def __init__(self, source: BinaryIO, start: int, length: int) -> None:
        self._fd = source.fileno()
        self._position = start
        self._end = start + length

    def readinto(self, buffer: bytearray) -> int:
        want = min(len(buffer), self._end - self._position)
        if want <= 0:
            return 0
        data = os.pread(self._fd, want, self._position)
        buffer[: len(data)] = data
        self._position += len(data)
        return len(data)

    def close(self) -> None:
        pass


# -- packing a directory ---------------------------------------------------------------


def _kind(key: bytes) -> str:
    """A file's kind for its dictionary: its lower-case extension (format 4f)."""
    name = key.rpartition(b"/")[2]
    dot = name.rfind(b".")
    return name[dot + 1 :].decode("ascii", "replace").lower() if 0 < dot < len(name) - 1 else ""


class _RecordSink:
    """The current record of an _ArchiveBuilder's writer (one process packing), through
    its encoder when the archive has codecs (format 1.5; ``kind`` picks the dictionary)."""

    def __init__(self, builder: _ArchiveBuilder, kind: str = "") -> None:
        self._builder = builder
        self._kind = kind
        self._encoder = builder.encoder
        # Bound once: called for every chunk of the file.
        self.write: Callable[[memoryview], None] = (builder.writer.write if self._encoder is None
                                                     else self._encoder.write)

    def begin(self, expected: int) -> None:
        self._builder._new_record()
        if self._encoder is not None:
            self._encoder.begin(self._kind)

    @property
    def crc(self) -> int:
        return self._builder.writer.record_crc if self._encoder is None else self._encoder.crc

    def discard(self) -> None:
        if self._encoder is not None:
            self._encoder.discard()
        self._builder.writer.discard_record()


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
            common = dict(
                mode=stat_module.S_IMODE(info.st_mode), uid=info.st_uid, gid=info.st_gid,
                mtime_ns=info.st_mtime_ns, xattrs=item.xattrs,
            )
            if item.kind == "hardlink" and item.target in failed_files:
                skips.add(os.fsdecode(root + b"/" + item.key), _link_to_failed(root, item.target), failed=True)
            elif item.kind in ("symlink", "hardlink"):
                yield Entry(item.key, None, item.kind, target=item.target, **common)  # type: ignore[arg-type]
            else:
                yield Entry(item.key, None, "dir", **common)

    def skip_file(failure: CannotPack) -> None:
        skips.add(failure.path, failure.reason, failed=True)
        failed_files.add(items[written - 1].key)

    files = sum(1 for item in items if item.kind == "file")
    # Encoded records have sizes the scan cannot know, which -j's workers place by:
    # with codecs, threads read and encode ahead of the writer instead.
    workers = 1 if compression.used else min(jobs, files)
    threads = min(jobs, files) if compression.used else 1

    def encode_ahead(encoder: RecordEncoder) -> EncodeAhead:
        return EncodeAhead(encoder, root, items, threads, _kind)
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
        builder = _write_archive(entries(), out_text, data_slots, force, progress,
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
    return _stats(builder, skips.paths, out_text, started)


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

    return train_dictionaries([(_kind(item.key), item.info.st_size) for item in files], read,
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
