"""Format 1.5's codecs on the writing side (format section 4f): what a record stores.

A :class:`RecordEncoder` stands between the packer and its :class:`ContainerWriter`.
Each file's bytes come in as read; what is written is

- one zstd frame (``CODEC_ZSTD``) for a file of at most ``FRAME_SIZE`` bytes, with the
  dictionary trained for its kind when there is one (:mod:`packfs.write.dictionaries`);
- independent frames of ``FRAME_SIZE`` decoded bytes (``CODEC_FRAMES``) for a larger
  file, followed by zstd's seekable-format seek table, each frame's CRCs in the frame
  table, so a read anywhere decodes one frame;
- the bytes as they are (``CODEC_STORED``) when zstd saves less than ``MIN_SAVING`` of
  them (JPEGs, archives): reading them costs nothing more than before;
- the data extents of a file with holes (``CODEC_SPARSE``), found with SEEK_DATA and
  SEEK_HOLE by :meth:`RecordEncoder.write_sparse`;
- nothing, for a file whose bytes equal an earlier file's (``dedup``): it names that
  record.  Candidates are found by size and CRC-32 and confirmed by comparing the
  bytes with the earlier record *decoded from the output*, so what is shared is
  what is stored.

The codec rows and frame tables are spilled to unnamed temporary files as records
end (16 bytes a record), so memory does not grow with the file count; the dedup index
is bounded (``DEDUP_INDEX_MAX`` files).
"""

from __future__ import annotations

import os
import struct
import tempfile
import threading
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple, Sequence

import zstandard

from ..errors import PackError
from ..format import (CODEC_DICTIONARY, CODEC_FRAMES, CODEC_ROW, CODEC_SPARSE, CODEC_STORED, CODEC_ZSTD, EXTENT,
                      EXTENT_COUNT, FRAME_ROW, NO_RECORD, SEEKABLE_MAGIC, SKIPPABLE_SEEK_TABLE_MAGIC, ZSTD_SIZE_MAX,
                      crc32)
from .container import ContainerWriter

__all__ = ["Compression", "RecordEncoder", "Encoded", "may_have_holes", "SPARSE_MIN_HOLES", "parse_compress", "DEFAULT_LEVEL", "FRAME_LOG2", "FRAME_SIZE",
           "MIN_SAVING", "DEDUP_INDEX_MAX"]

FRAME_LOG2 = 20
FRAME_SIZE = 1 << FRAME_LOG2  # decoded bytes a frame; a file up to this size is one frame
FRAME_BATCH = 8  # frames of a large file compressed at once by frame_pool's threads
assert FRAME_SIZE <= ZSTD_SIZE_MAX
DEFAULT_LEVEL = 9
# A file is stored compressed only when that saves at least this share of its bytes
# (and MIN_SAVED_BYTES): below it, the archive hardly shrinks while every read pays
# for decoding.  JPEGs, PNGs and archives save nothing and are stored as they are.
MIN_SAVING = 1 / 16
MIN_SAVED_BYTES = 16
# At most this many files are remembered for dedup (about 100 bytes of memory each):
# duplicates among more distinct files are stored again.
DEDUP_INDEX_MAX = 1 << 20
# A file with holes is stored sparse when they add up to at least this much.
SPARSE_MIN_HOLES = 1 << 16
_SEEK_ENTRY = struct.Struct("<II")
_SEEK_FOOTER = struct.Struct("<IBI")
_SKIPPABLE_HEADER = struct.Struct("<II")
# Formats that are compressed already, by the bytes that start them: zstd is not tried.
_COMPRESSED_MAGIC = (b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"PK\x03\x04", b"\x1f\x8b", b"\x28\xb5\x2f\xfd",
                     b"\xfd7zXZ\x00", b"BZh", b"OggS", b"fLaC", b"\x1aE\xdf\xa3")


@dataclass(frozen=True)
class Compression:
    """How a pack stores files (format 1.5): zstd at ``level`` (None: as they are),
    with trained ``dictionary``-ies, ``dedup`` of equal files and ``sparse`` files
    without their holes.  An archive with none of them is written as 1.4."""

    level: int | None = None
    dictionary: bool = False
    dedup: bool = False
    sparse: bool = False

    def __post_init__(self) -> None:
        if self.level is not None and not 1 <= self.level <= 22:
            raise ValueError(f"a zstd level is 1 to 22, got {self.level}")
        if self.dictionary and self.level is None:
            raise ValueError("dictionaries need compression (--compress zstd)")

    @property
    def used(self) -> bool:
        """Whether the archive needs format 1.5."""
        return self.level is not None or self.dedup or self.sparse

    @classmethod
    def from_options(cls, compress: str | None = None, dictionary: str | None = None, dedup: bool | None = None,
                     sparse: bool | None = None) -> Compression:
        """The one reading of the packers' options: ``compress`` "zstd[:LEVEL]" or
        "none"; ``dictionary`` "auto" or "none"; ``dedup`` and ``sparse`` default to
        on with compression and off without."""
        level = parse_compress(compress)
        if dictionary not in (None, "none", "auto"):
            raise ValueError(f"dictionary must be auto or none, got {dictionary!r}")
        return cls(level, dictionary == "auto", level is not None if dedup is None else dedup,
                   level is not None if sparse is None else sparse)


def parse_compress(text: str | None) -> int | None:
    """The zstd level of a ``--compress`` value ("zstd", "zstd:LEVEL", "none")."""
    if text is None or text == "none":
        return None
    name, _, level = text.partition(":")
    if name != "zstd":
        raise ValueError(f"unknown compression {text!r}: expected zstd, zstd:LEVEL (1-22) or none")
    if not level:
        return DEFAULT_LEVEL
    if not level.isdigit() or not 1 <= int(level) <= 22:
        raise ValueError(f"zstd level must be 1 to 22, got {level!r}")
    return int(level)


def _seek_table(frames: Sequence[tuple[int, int]]) -> bytes:
    """zstd's seekable format's seek table for frames of (stored, decoded) sizes."""
    entries = b"".join(_SEEK_ENTRY.pack(stored, decoded) for stored, decoded in frames)
    footer = _SEEK_FOOTER.pack(len(frames), 0, SEEKABLE_MAGIC)
    return _SKIPPABLE_HEADER.pack(SKIPPABLE_SEEK_TABLE_MAGIC, len(entries) + len(footer)) + entries + footer


class RecordEncoder:
    """Encodes the records of one pack and keeps their codec rows (format section 4f).

    Parameters
    ----------
    writer
        Where records go.
    compression
        What to do.
    dictionaries
        Trained dictionaries by kind (a file's lower-case extension, or "" for
        every other small file), each already written as a record: (record, bytes).
    spill_directory
        Where the rows and tables are spilled (unnamed files).
    """

    def __init__(self, writer: ContainerWriter, compression: Compression,
                 dictionaries: dict[str, tuple[int, bytes]] | None = None, spill_directory: str | None = None) -> None:
        self.writer = writer
        self.compression = compression
        self._rows = tempfile.TemporaryFile(dir=spill_directory)
        self._tables = tempfile.TemporaryFile(dir=spill_directory)
        self._rows_written = 0
        self.tables_length = 0
        self._dedup: dict[int, int] = {}
        self._dictionary_of_kind: dict[str, int] = {}
        self._dictionary_bytes: dict[int, bytes] = {}
        self._prepared: dict[int, zstandard.ZstdCompressionDict] = {}
        for kind, (record, data) in (dictionaries or {}).items():
            self._dictionary_of_kind[kind] = record
            self._dictionary_bytes[record] = data
            self._prepared[record] = zstandard.ZstdCompressionDict(data, dict_type=zstandard.DICT_TYPE_AUTO)
            self.set_row(record, CODEC_DICTIONARY)
        self._decompressors: dict[int, zstandard.ZstdDecompressor] = {}
        self._local = threading.local()
        self._state: _FileEncoding | None = None
        self.frame_pool: Executor | None = None  # threads compressing a large file's frames (-j N)
        self.deduplicated = 0
        self.saved_by_dedup = 0

    # -- rows ------------------------------------------------------------------------

    def set_row(self, record: int, codec: int, frame_log2: int = 0, check: int = 0, aux: int = 0) -> None:
        """Record ``record``'s codec row; records skipped since the last row are stored."""
        if record < self._rows_written:
            raise ValueError(f"codec row of record {record} given after record {self._rows_written - 1}'s")
        self._rows.seek(CODEC_ROW.size * self._rows_written)
        if record > self._rows_written:
            self._rows.write(bytes(CODEC_ROW.size * (record - self._rows_written)))
        self._rows.write(CODEC_ROW.pack(codec, frame_log2, 0, check, aux))
        self._rows_written = record + 1

    def _row(self, record: int) -> tuple[int, int, int, int, int]:
        if record >= self._rows_written:
            return (CODEC_STORED, 0, 0, 0, 0)
        self._rows.flush()
        return CODEC_ROW.unpack(os.pread(self._rows.fileno(), CODEC_ROW.size, CODEC_ROW.size * record))

    def _add_table(self, data: bytes) -> int:
        start = self.tables_length
        self._tables.seek(start)
        self._tables.write(data)
        self.tables_length += len(data)
        return start

    def sections(self, data_records: int) -> tuple[Iterator[bytes], Iterator[bytes]]:
        """Sections 22 and 23 (``record_codec`` for ``data_records`` records, and
        ``codec_data``), as chunks read back from the spill files."""
        if self._rows_written < data_records:
            self._rows.seek(CODEC_ROW.size * self._rows_written)
            self._rows.write(bytes(CODEC_ROW.size * (data_records - self._rows_written)))
            self._rows_written = data_records
        return (_chunks(self._rows, CODEC_ROW.size * data_records), _chunks(self._tables, self.tables_length))

    def close(self) -> None:
        """Drop the spill files."""
        self._rows.close()
        self._tables.close()

    # -- a file's record ---------------------------------------------------------------

    def _compressors(self) -> dict[int | None, zstandard.ZstdCompressor]:
        """This thread's compressors, by dictionary record (None: none): a
        ZstdCompressor may not be used by two threads at once."""
        found = getattr(self._local, "compressors", None)
        if found is None:
            level = self.compression.level
            assert level is not None  # asked for only when files are compressed
            found = {None: zstandard.ZstdCompressor(level=level, write_checksum=False, write_content_size=True,
                                                    write_dict_id=False)}
            for record, prepared in self._prepared.items():
                found[record] = zstandard.ZstdCompressor(level=level, dict_data=prepared, write_checksum=False,
                                                         write_content_size=True, write_dict_id=False)
            self._local.compressors = found
        return found

    def _file(self, kind: str, out: Callable[[bytes | bytearray | memoryview], None],
              compress_many: Callable[[list], list] | None = None) -> _FileEncoding:
        dictionary = self._dictionary_of_kind.get(kind, self._dictionary_of_kind.get(""))
        return _FileEncoding(None if self.compression.level is None else self._compressors(), dictionary, out,
                             compress_many)

    def compress_frame(self, raw: bytes | memoryview) -> bytes:
        """One frame compressed without a dictionary (any thread)."""
        return self._compressors()[None].compress(raw)

    def encode(self, raw: bytes, kind: str = "") -> Encoded:
        """Encode a whole file's bytes (any thread): what :meth:`commit` writes."""
        parts: list[bytes | bytearray | memoryview] = []
        state = self._file(kind, parts.append)
        state.write(raw)
        return Encoded(raw, state.crc, state.finish(), parts)

    def commit(self, encoded: Encoded) -> int:
        """Write a file encoded by :meth:`encode` into the record the builder has begun
        (or share an earlier one's); return its record."""
        size, crc = len(encoded.raw), encoded.crc
        candidate = self._candidate(size, crc)
        if candidate is not None and _equal_chunks(self.decoded_chunks(candidate, size), iter((encoded.raw,))):
            return self._shared(candidate, size)
        for part in encoded.parts:
            self.writer.write(part)
        return self._ended(encoded.row, size, crc)

    def begin(self, kind: str = "") -> None:
        """A file's bytes follow, streamed (``kind``: its lower-case extension, for the
        dictionary); the builder has begun its record in the writer."""
        pool = self.frame_pool
        self._state = self._file(kind, self.writer.write,
                                 None if pool is None else lambda raws: list(pool.map(self.compress_frame, raws)))

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """The file's next bytes."""
        self._begun().write(data)

    @property
    def crc(self) -> int:
        """The CRC-32 of the file's bytes written since :meth:`begin` (not what is stored)."""
        return self._begun().crc

    def _begun(self) -> _FileEncoding:
        """The file begun by :meth:`begin` (the builder never writes one it did not begin)."""
        state = self._state
        if state is None:
            raise RuntimeError("RecordEncoder: no file begun")
        return state

    def discard(self) -> None:
        """Forget the file's bytes (the builder discards its record)."""
        self._state = None

    def end(self) -> int:
        """Finish the streamed file: its record (a new one, or an earlier one with equal
        bytes)."""
        state, self._state = self._begun(), None
        size, crc = state.size, state.crc
        candidate = self._candidate(size, crc)
        small = state.held()  # a file of one frame is encoded at its end: not written yet
        if candidate is not None and small is not None:
            if _equal_chunks(self.decoded_chunks(candidate, size), iter((bytes(small),))):
                return self._shared(candidate, size)
        row = state.finish()
        if candidate is not None and small is None:
            # A large file, written already: compare what was just stored, decoded.
            if _equal_chunks(self.decoded_chunks(candidate, size), self._current_chunks(row, state.frames)):
                return self._shared(candidate, size)
        return self._ended(row, size, crc)

    def _candidate(self, size: int, crc: int) -> int | None:
        return self._dedup.get(size << 32 | crc) if self.compression.dedup and size else None

    def _ended(self, row: tuple[int, int, int, int, bytes], size: int, crc: int) -> int:
        record = self.writer.end_record()
        codec, frame_log2, check, aux, table = row
        if codec == CODEC_FRAMES:
            aux = self._add_table(table)
        if codec != CODEC_STORED:
            self.set_row(record, codec, frame_log2, check, aux)
        if self.compression.dedup and size and len(self._dedup) < DEDUP_INDEX_MAX:
            self._dedup.setdefault(size << 32 | crc, record)
        return record

    def _shared(self, record: int, size: int) -> int:
        self.writer.discard_record()
        self.deduplicated += 1
        self.saved_by_dedup += size
        return record

    def write_extents(self, extents: Sequence[tuple[int, int]], read_at, size: int) -> None:
        """Write a file's data ``extents`` ((offset, length), ascending), read with
        ``read_at(offset, length)``, into the record the builder has begun."""
        for offset, length in extents:
            done = 0
            while done < length:
                chunk = read_at(offset + done, min(FRAME_SIZE, length - done))
                if not chunk:
                    raise PackError(f"a sparse file ended at {offset + done} bytes, {size} expected")
                self.writer.write(chunk)
                done += len(chunk)

    def end_sparse(self, extents: Sequence[tuple[int, int]]) -> int:
        """End the record of :meth:`write_extents` as ``CODEC_SPARSE``; return it."""
        record = self.writer.end_record()
        table = EXTENT_COUNT.pack(len(extents)) + b"".join(EXTENT.pack(offset, length) for offset, length in extents)
        self.set_row(record, CODEC_SPARSE, 0, 0, self._add_table(table))
        return record

    # -- reading back what was written (dedup's confirmation) ------------------------

    def _decompressor(self, dictionary: int) -> zstandard.ZstdDecompressor:
        found = self._decompressors.get(dictionary)
        if found is None:
            if dictionary == NO_RECORD:
                found = zstandard.ZstdDecompressor()
            else:
                found = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(
                    self._dictionary_bytes[dictionary], dict_type=zstandard.DICT_TYPE_AUTO))
            self._decompressors[dictionary] = found
        return found

    def _stored_span(self, record: int) -> tuple[int, int]:
        _, start = self.writer.record_span(record)
        _, end = self.writer.record_span(record + 1) if record + 1 < self.writer.records_written else (0, -1)
        if end < 0:
            end = self.writer.current_record_start()
        return start, end

    def decoded_chunks(self, record: int, size: int) -> Iterator[bytes]:
        """Record ``record``'s contents (``size`` bytes), decoded from the output, in chunks."""
        codec, _, _, _, aux = self._row(record)
        start, end = self._stored_span(record)
        read_back = self.writer.read_back
        if codec == CODEC_STORED:
            for at in range(start, end, FRAME_SIZE):
                yield read_back(at, min(FRAME_SIZE, end - at))
        elif codec == CODEC_ZSTD:
            yield self._decompressor(aux).decompress(read_back(start, end - start))
        elif codec == CODEC_FRAMES:
            self._tables.flush()
            table = os.pread(self._tables.fileno(), FRAME_ROW.size * -(-size // FRAME_SIZE), aux)
            plain = self._decompressor(NO_RECORD)
            previous = 0
            for stored_end, _, _ in FRAME_ROW.iter_unpack(table):
                yield plain.decompress(read_back(start + previous, stored_end - previous))
                previous = stored_end
        else:
            raise ValueError(f"record {record} cannot be compared (codec {codec})")

    def _current_chunks(self, row: tuple[int, int, int, int, bytes],
                        frames: Sequence[tuple[int, int, int, int]]) -> Iterator[bytes]:
        start = self.writer.current_record_start()
        read_back = self.writer.read_back
        if row[0] == CODEC_STORED:
            end = self.writer.position
            for at in range(start, end, FRAME_SIZE):
                yield read_back(at, min(FRAME_SIZE, end - at))
            return
        plain = self._decompressor(NO_RECORD)
        previous = 0
        for stored_end, _, _, _ in frames:
            yield plain.decompress(read_back(start + previous, stored_end - previous))
            previous = stored_end


class Encoded(NamedTuple):
    """A file encoded by :meth:`RecordEncoder.encode`: its bytes (for dedup's
    comparison), their CRC, its codec row (codec, frame_log2, check, aux, frame
    table) and the stored bytes."""

    raw: bytes
    crc: int
    row: tuple[int, int, int, int, bytes]
    parts: list


class _FileEncoding:
    """One file's bytes becoming its stored bytes, given to ``out`` as they are
    decided: the one statement of which codec a file gets, whether it is streamed
    into the writer or encoded whole by a thread (the same bytes either way)."""

    def __init__(self, compressors: dict[int | None, zstandard.ZstdCompressor] | None, dictionary: int | None,
                 out: Callable[[bytes | bytearray | memoryview], None],
                 compress_many: Callable[[list], list] | None = None) -> None:
        # None: files stored as they are (dedup or sparse without --compress).
        self.compressors: dict[int | None, zstandard.ZstdCompressor] = compressors or {}
        self.compress_many = compress_many  # frames compressed by several threads at once
        self.dictionary = dictionary
        self.out = out
        self.pending = bytearray()
        self.frames: list[tuple[int, int, int, int]] = []  # (stored_end, stored_crc, decoded_crc, decoded)
        self.as_is = compressors is None
        self.size = 0
        self.crc = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.crc = crc32(data, self.crc)
        self.size += len(data)
        if self.as_is:
            self.out(data)
            return
        pending = self.pending
        pending += data
        if self.compress_many is not None and self.frames and len(pending) > FRAME_BATCH * FRAME_SIZE:
            count = (len(pending) - 1) // FRAME_SIZE  # the last frame waits: it may be the file's last
            view = memoryview(pending)
            raws = [view[k * FRAME_SIZE: (k + 1) * FRAME_SIZE] for k in range(count)]
            for raw, stored in zip(raws, self.compress_many(raws)):
                self._add_frame(raw, stored)
            del raws, view
            del pending[: count * FRAME_SIZE]
        while len(pending) > FRAME_SIZE:  # one byte more than a frame: the file is framed
            self._frame(memoryview(pending)[:FRAME_SIZE])
            del pending[:FRAME_SIZE]
            if self.as_is:
                self.out(bytes(pending))
                pending.clear()

    def held(self) -> bytearray | None:
        """The file's bytes if none is written yet (a file of one frame), else None."""
        return None if self.as_is or self.frames else self.pending

    def _frame(self, raw: memoryview) -> None:
        first = not self.frames
        if first and not _worth_trying(raw):
            self._as_is(raw)
            return
        stored = self.compressors[None].compress(raw)
        if first and not _pays(len(stored), len(raw)):
            self._as_is(raw)  # a file that does not compress at its start is stored as it is
            return
        self._add_frame(raw, stored)

    def _add_frame(self, raw: memoryview, stored: bytes) -> None:
        end = (self.frames[-1][0] if self.frames else 0) + len(stored)
        self.frames.append((end, crc32(stored), crc32(raw), len(raw)))
        self.out(stored)

    def _as_is(self, raw: memoryview) -> None:
        self.as_is = True
        self.out(bytes(raw))

    def finish(self) -> tuple[int, int, int, int, bytes]:
        """Write what is held; the codec row (codec, frame_log2, check, aux, frame table)."""
        pending = self.pending
        if self.as_is:
            return (CODEC_STORED, 0, 0, 0, b"")
        if self.frames:
            self._frame(memoryview(pending))
            pending.clear()
            sizes, previous = [], 0
            for end, _, _, decoded in self.frames:
                sizes.append((end - previous, decoded))
                previous = end
            self.out(_seek_table(sizes))
            table = b"".join(FRAME_ROW.pack(end, stored_crc, decoded_crc)
                             for end, stored_crc, decoded_crc, _ in self.frames)
            return (CODEC_FRAMES, FRAME_LOG2, 0, 0, table)
        raw = bytes(pending)
        pending.clear()
        dictionary = self.dictionary
        stored = self.compressors[dictionary].compress(raw) if _worth_trying(raw) else b""
        if stored and _pays(len(stored), len(raw)):
            self.out(stored)
            return (CODEC_ZSTD, 0, self.crc, NO_RECORD if dictionary is None else dictionary, b"")
        self.out(raw)
        return (CODEC_STORED, 0, 0, 0, b"")


def may_have_holes(info: os.stat_result) -> bool:
    """Whether a file's allocated blocks fall short of its size by SPARSE_MIN_HOLES:
    only then are its holes looked for (the one statement of the rule)."""
    return info.st_blocks * 512 + SPARSE_MIN_HOLES <= info.st_size


def _worth_trying(raw: memoryview | bytes) -> bool:
    head = bytes(raw[:8])
    return len(raw) >= MIN_SAVED_BYTES and not head.startswith(_COMPRESSED_MAGIC)


def _pays(stored: int, raw: int) -> bool:
    saved = raw - stored
    return saved >= MIN_SAVED_BYTES and saved >= raw * MIN_SAVING


def _equal_chunks(left: Iterator[bytes], right: Iterator[bytes]) -> bool:
    """Whether two streams of chunks hold the same bytes (chunked differently)."""
    a = b = b""
    while True:
        if not a:
            a = next(left, b"")
        if not b:
            b = next(right, b"")
        if not a or not b:
            return not a and not b and next(left, b"") == b"" and next(right, b"") == b""
        n = min(len(a), len(b))
        if a[:n] != b[:n]:
            return False
        a, b = a[n:], b[n:]


def _chunks(spill, length: int) -> Iterator[bytes]:
    spill.flush()
    for at in range(0, length, 1 << 20):
        yield os.pread(spill.fileno(), min(1 << 20, length - at), at)
