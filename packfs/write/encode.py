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
from dataclasses import dataclass
from typing import Iterator, Sequence

import zstandard

from ..errors import PackError
from ..format import (CODEC_DICTIONARY, CODEC_FRAMES, CODEC_ROW, CODEC_SPARSE, CODEC_STORED, CODEC_ZSTD, EXTENT,
                      EXTENT_COUNT, FRAME_ROW, NO_RECORD, SEEKABLE_MAGIC, SKIPPABLE_SEEK_TABLE_MAGIC, ZSTD_SIZE_MAX,
                      crc32)
from .container import ContainerWriter

__all__ = ["Compression", "RecordEncoder", "parse_compress", "DEFAULT_LEVEL", "FRAME_LOG2", "FRAME_SIZE",
           "MIN_SAVING", "DEDUP_INDEX_MAX"]

FRAME_LOG2 = 20
FRAME_SIZE = 1 << FRAME_LOG2  # decoded bytes a frame; a file up to this size is one frame
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
        self._by_record: dict[int, zstandard.ZstdCompressor] = {}
        self._dictionary_of_kind: dict[str, int] = {}
        self._dictionary_bytes: dict[int, bytes] = {}
        level = compression.level
        if level is not None:
            self._plain = zstandard.ZstdCompressor(level=level, write_checksum=False, write_content_size=True,
                                                   write_dict_id=False)
            for kind, (record, data) in (dictionaries or {}).items():
                self._dictionary_of_kind[kind] = record
                self._dictionary_bytes[record] = data
                prepared = zstandard.ZstdCompressionDict(data, dict_type=zstandard.DICT_TYPE_AUTO)
                self._by_record[record] = zstandard.ZstdCompressor(
                    level=level, dict_data=prepared, write_checksum=False, write_content_size=True,
                    write_dict_id=False)
                self.set_row(record, CODEC_DICTIONARY)
        self._decompressors: dict[int, zstandard.ZstdDecompressor] = {}
        self.deduplicated = 0
        self.saved_by_dedup = 0
        # The file being written: raw bytes not yet encoded, the frames so far.
        self._pending = bytearray()
        self._kind = ""
        self._size = 0
        self._raw_crc = 0
        self._frames: list[tuple[int, int, int, int]] = []  # (stored_end, stored_crc, decoded_crc, decoded)
        self._stored_as_is = False

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

    def begin(self, kind: str = "") -> None:
        """A file's bytes follow (``kind``: its lower-case extension, for the dictionary);
        the builder has begun its record in the writer."""
        self._pending.clear()
        self._frames.clear()
        self._kind = kind
        self._size = 0
        self._raw_crc = 0
        self._stored_as_is = self.compression.level is None

    def write(self, data: bytes | memoryview) -> None:
        """The file's next bytes."""
        self._raw_crc = crc32(data, self._raw_crc)
        self._size += len(data)
        if self._stored_as_is:
            self.writer.write(data)
            return
        pending = self._pending
        pending += data
        while len(pending) > FRAME_SIZE:  # one more byte: the file is framed
            self._flush_frame(memoryview(pending)[:FRAME_SIZE])
            del pending[:FRAME_SIZE]
            if self._stored_as_is:
                self.writer.write(pending)
                pending.clear()

    @property
    def crc(self) -> int:
        """The CRC-32 of the file's bytes written since :meth:`begin` (not what is stored)."""
        return self._raw_crc

    def discard(self) -> None:
        """Forget the file's bytes (the builder discards its record)."""
        self._pending.clear()
        self._frames.clear()

    def _flush_frame(self, raw: memoryview) -> None:
        if not self._frames and not _worth_trying(raw):
            self._store_as_is(raw)
            return
        stored = self._plain.compress(raw)
        if not self._frames and not _pays(len(stored), len(raw)):
            self._store_as_is(raw)  # a file that does not compress at its start is stored
            return
        end = (self._frames[-1][0] if self._frames else 0) + len(stored)
        self._frames.append((end, crc32(stored), crc32(raw), len(raw)))
        self.writer.write(stored)

    def _store_as_is(self, raw: memoryview) -> None:
        self._stored_as_is = True
        self.writer.write(raw)

    def end(self) -> int:
        """Finish the file: its record (a new one, or an earlier one with equal bytes)."""
        writer = self.writer
        size, raw_crc = self._size, self._raw_crc
        pending = self._pending
        if self._frames and not self._stored_as_is:
            self._flush_frame(memoryview(pending))
            pending.clear()
        candidate = self._dedup.get(size << 32 | raw_crc) if self.compression.dedup and size else None
        if candidate is not None and not self._frames and not self._stored_as_is:
            # A small file not yet written: compare its bytes with the candidate's.
            if _equal_chunks(self.decoded_chunks(candidate, size), iter((bytes(pending),))):
                return self._shared(candidate, size)
        if self._stored_as_is:
            codec_row: tuple[int, int, int, int] = (CODEC_STORED, 0, 0, 0)
        elif self._frames:
            frames = self._frames
            table = b"".join(FRAME_ROW.pack(end, stored_crc, decoded_crc) for end, stored_crc, decoded_crc, _ in frames)
            previous = 0
            sizes = []
            for end, _, _, decoded in frames:
                sizes.append((end - previous, decoded))
                previous = end
            writer.write(_seek_table(sizes))
            codec_row = (CODEC_FRAMES, FRAME_LOG2, 0, -1)  # the table is added once the record is kept
            self._frame_table = table
        else:
            raw = memoryview(pending)
            record_dictionary = self._dictionary_of_kind.get(self._kind, self._dictionary_of_kind.get(""))
            compressor = self._plain if record_dictionary is None else self._by_record[record_dictionary]
            stored = compressor.compress(raw) if _worth_trying(raw) else b""
            if stored and _pays(len(stored), len(raw)):
                writer.write(stored)
                codec_row = (CODEC_ZSTD, 0, raw_crc, NO_RECORD if record_dictionary is None else record_dictionary)
            else:
                writer.write(raw)
                codec_row = (CODEC_STORED, 0, 0, 0)
        if candidate is not None and (self._frames or self._stored_as_is):
            # A large file, written already: compare what was just stored, decoded.
            if _equal_chunks(self.decoded_chunks(candidate, size), self._current_chunks(codec_row)):
                return self._shared(candidate, size)
        record = writer.end_record()
        codec, frame_log2, check, aux = codec_row
        if codec == CODEC_FRAMES:
            aux = self._add_table(self._frame_table)
        if codec != CODEC_STORED:
            self.set_row(record, codec, frame_log2, check, aux)
        if self.compression.dedup and size and len(self._dedup) < DEDUP_INDEX_MAX:
            self._dedup.setdefault(size << 32 | raw_crc, record)
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

    def _current_chunks(self, codec_row: tuple[int, int, int, int]) -> Iterator[bytes]:
        start = self.writer.current_record_start()
        read_back = self.writer.read_back
        if codec_row[0] == CODEC_STORED:
            end = self.writer.position
            for at in range(start, end, FRAME_SIZE):
                yield read_back(at, min(FRAME_SIZE, end - at))
            return
        plain = self._decompressor(NO_RECORD)
        previous = 0
        for stored_end, _, _, _ in self._frames:
            yield plain.decompress(read_back(start + previous, stored_end - previous))
            previous = stored_end


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
