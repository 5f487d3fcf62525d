"""The one builder of an archive: every driver (a directory, entries, a tar or a zip,
a shard, convert, append, Dask; :mod:`.pack` and the modules beside it) hands
:func:`write_archive` its entries, and :class:`ArchiveBuilder` lays them out: each
file's or symlink's data record (through the codecs' encoder with format 1.5), the
table's rows, then the sections, the lookup index, the tail and the footer (format
sections 2-4f), published atomically by the container writer."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat as stat_module
import time
from array import array
from typing import Callable, ContextManager, Iterable, Sequence

from ..core.paths import archive_key
from ..errors import PackError
from ..format import (CODECS_SINCE_MINOR, INDEX_SINCE_MINOR, NO_RECORD, S_IFDIR, S_IFLNK, S_IFREG, SECTION_ALIGNMENT,
                      SECTIONS, XATTR_SECTIONS, crc32, pack_footer, record_count_for, section_count_for,
                      symlink_target_problem)
from .container import ContainerWriter
from .encode import SPARSE_MIN_HOLES, Compression, RecordEncoder, may_have_holes
from .encodeahead import EncodeAhead
from .entry import Entry, PackProgress, PackStats, Xattrs, close_stream, readinto_of
from .parallel import FileStamp, Placer
from .skips import SkippedPath
from .treefile import CannotPack, TreeFile, read_stable

__all__ = ["ArchiveBuilder", "write_archive", "pack_stats", "file_kind", "CHUNK"]

log = logging.getLogger("packfs")

CHUNK = 1 << 20  # bytes read from a source at a time (and CRC'd back a page run at a time)
# Bytes of memory the table's layout may hold (None: packfs.write.tablestream's default);
# more entries are sorted in runs on disk and merged.  Tests make it tiny so that small
# packs spill.
_TABLE_MEMORY: int | None = None


_DEFAULT_MODE = {"file": 0o644, "dir": 0o755, "symlink": 0o777, "hardlink": 0o644}
_TYPE_BITS = {"file": S_IFREG, "dir": S_IFDIR, "symlink": S_IFLNK, "hardlink": S_IFREG}


class ArchiveBuilder:
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
        self._buffer = bytearray(CHUNK)
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
        """Write ``entry``'s record (a file's or a symlink's; a tree's file read as it
        stands) and give the table its row."""
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
        info: os.stat_result | FileStamp
        if self.placer is not None:  # read by a worker process: placed in order here
            record, size, info, changed, nbytes = self.placer.place(source)
            if self.progress is not None:
                self.progress.advance(0, nbytes)
        else:
            ahead = self.ahead.take(source) if self.ahead is not None else None
            if ahead is not None and self.encoder is not None:  # encoded ahead: only with codecs
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
                    sink = _RecordSink(self, file_kind(source.key))
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
            encoder.begin(file_kind(entry.key))
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
            readinto = readinto_of(source)
            size = 0
            try:
                while True:
                    got = readinto(self._buffer)
                    if not got:
                        break
                    write(memoryview(self._buffer)[:got])
                    size += got
                    if self.progress is not None:  # by chunk: a large file moves the bar too
                        self.progress.advance(0, got)
            finally:
                if callable(data):
                    close_stream(source)
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
        pages_a_read = max(1, CHUNK // page_size)
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


def write_archive(entries: Iterable[Entry | TreeFile], out: str, data_slots: int, force: bool,
                   progress: PackProgress | None = None,
                   cannot_pack: Callable[[CannotPack], None] | None = None, xattrs: bool = False,
                   parallel: Callable[[ContainerWriter], ContextManager[Placer]] | None = None,
                   compression: Compression | None = None,
                   dictionaries: Sequence[tuple[str, bytes]] = (),
                   encode_ahead: Callable[[RecordEncoder], EncodeAhead] | None = None,
                   before_publish: Callable[[str], None] | None = None) -> ArchiveBuilder:
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
        if compression is not None and compression.used:
            written = {kind: (writer.write_record(data), data) for kind, data in dictionaries}
            encoder = RecordEncoder(writer, compression, written, str(writer.out.parent))
        builder = ArchiveBuilder(writer, data_slots, progress, xattrs, encoder)
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


def pack_stats(builder: ArchiveBuilder, skipped: Sequence[SkippedPath], out: str, started: float) -> PackStats:
    """What ``builder`` wrote into ``out`` since ``started`` (perf_counter), with ``skipped``."""
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


def file_kind(key: bytes) -> str:
    """A file's kind for its dictionary: its lower-case extension (format 4f)."""
    name = key.rpartition(b"/")[2]
    dot = name.rfind(b".")
    return name[dot + 1 :].decode("ascii", "replace").lower() if 0 < dot < len(name) - 1 else ""


class _RecordSink:
    """The current record of an ArchiveBuilder's writer (one process packing), through
    its encoder when the archive has codecs (format 1.5; ``kind`` picks the dictionary)."""

    def __init__(self, builder: ArchiveBuilder, kind: str = "") -> None:
        self._builder = builder
        self.file_kind = kind
        self._encoder = builder.encoder
        # Bound once: called for every chunk of the file.
        self.write: Callable[[memoryview], None] = (builder.writer.write if self._encoder is None
                                                     else self._encoder.write)

    def begin(self, expected: int) -> None:
        self._builder._new_record()
        if self._encoder is not None:
            self._encoder.begin(self.file_kind)

    @property
    def crc(self) -> int:
        return self._builder.writer.record_crc if self._encoder is None else self._encoder.crc

    def discard(self) -> None:
        if self._encoder is not None:
            self._encoder.discard()
        self._builder.writer.discard_record()
