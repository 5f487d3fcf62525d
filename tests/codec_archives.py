"""Format 1.5 archives (codecs, format section 4f) laid out here, byte by byte, for the
compiled daemon's tests and the fuzzer's seeds: every codec, a dictionary, a frame
table, an extent list and shared records, each placed where the test wants it, and
hostile variants (a damaged frame table, a frame that decodes to more than it says)
that pass every other checksum.

:func:`codec_archive` packs the tree with ``packfs.pack_entries`` (format 1.4: the
table, the attributes), then encodes each file's record as its :class:`Codec` says,
adds the dictionaries after the data records, and lays the archive out again as 1.5:
sections 0-21, ``record_codec`` (22), ``codec_data`` (23), the tail (24) with its page
CRCs over sections 0-20, 22 and 23, and the footer with ``FLAG_CODECS``.
"""

from __future__ import annotations

import array
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import zstandard

import packfs
from packfs import RecordWriter
from packfs.write.indexbuild import build_lookup_index, page_crcs
from packfs.format import (CODEC_DICTIONARY, CODEC_FRAMES, CODEC_ROW, CODEC_SPARSE, CODEC_STORED, CODEC_ZSTD,
                           EXTENT, EXTENT_COUNT, FOOTER_SIZE, FRAME_ROW, INDEX_PAGE, NO_RECORD, PIECE_SIZE,
                           SECTION_ALIGNMENT, SECTIONS, SEEKABLE_MAGIC, SKIPPABLE_SEEK_TABLE_MAGIC, TABLE_PAGE_MIN,
                           TAIL_HEADER, TAIL_MAGIC, TAIL_SPAN, crc32, header_size, pack_footer, record_count_for,
                           section_count_for, tail_span_count)

SECTION_COUNT_1_5 = section_count_for(5)  # 25
_PAGED = list(range(21)) + [22, 23]  # the sections the tail's page CRCs cover (4e, 4f)


@dataclass
class Codec:
    """How one file's record is stored: ``kind`` "stored", "zstd", "frames" or
    "sparse"; ``dictionary`` names a dictionary of :func:`codec_archive` (zstd);
    ``frame_log2`` the frame size (frames); ``level`` zstd's; ``block`` the size of
    the blocks whose runs make a sparse file's extents."""

    kind: str = "zstd"
    dictionary: Optional[str] = None
    frame_log2: int = 16
    level: int = 3
    block: int = 4096  # sparse: the extents are the runs of blocks of this size that are not all zero
    # frames: frame k's bytes to compress in place of the file's (a frame that decodes
    # to more or fewer bytes than its place in the file)
    frame_override: Dict[int, bytes] = field(default_factory=dict)


@dataclass
class Layout:
    """What :func:`codec_archive` laid out, before the index, tail and CRCs: tests may
    change it (``tamper``) so that only the rule they test is broken."""

    data: List[bytes]                      # the data records, dictionaries last
    record_codec: bytearray
    codec_data: bytearray
    record_of: Dict[str, int]              # each file's record
    aux_of: Dict[str, int]                 # a frames or sparse file's table, in codec_data
    dictionary_record: Dict[str, int]
    sections: List[bytes]                  # sections 0 .. 20 (the table, pieces, attributes)


def _row(codec: int, frame_log2: int = 0, check: int = 0, aux: int = 0) -> bytes:
    return struct.pack("<BBHIQ", codec, frame_log2, 0, check, aux)


def _frames(contents: bytes, codec: Codec, compressor: zstandard.ZstdCompressor) -> tuple[bytes, bytes]:
    """A frames record (frames, then zstd's seekable-format seek table) and its frame table."""
    size = 1 << codec.frame_log2
    stored, table, seek = [], [], []
    end = 0
    for k, at in enumerate(range(0, len(contents), size)):
        chunk = contents[at : at + size]
        frame = compressor.compress(codec.frame_override.get(k, chunk))
        end += len(frame)
        stored.append(frame)
        table.append(FRAME_ROW.pack(end, crc32(frame), crc32(chunk)))
        seek.append(struct.pack("<II", len(frame), len(chunk)))
    seek_body = b"".join(seek) + struct.pack("<IBI", len(seek), 0, SEEKABLE_MAGIC)
    stored.append(struct.pack("<II", SKIPPABLE_SEEK_TABLE_MAGIC, len(seek_body)) + seek_body)
    return b"".join(stored), b"".join(table)


def sparse_extents(contents: bytes, block: int = 4096) -> list[tuple[int, int]]:
    """The data extents of ``contents``: its runs of ``block``-sized blocks that are not all zero."""
    extents: list[tuple[int, int]] = []
    zero = bytes(block)
    for at in range(0, len(contents), block):
        chunk = contents[at : at + block]
        if chunk == zero[: len(chunk)]:
            continue
        if extents and extents[-1][0] + extents[-1][1] == at:
            extents[-1] = (extents[-1][0], extents[-1][1] + len(chunk))
        else:
            extents.append((at, len(chunk)))
    return extents


def train_dictionary(samples: list[bytes], size: int = 4096) -> bytes:
    """A zstd dictionary (with its magic) trained on ``samples``."""
    return zstandard.train_dictionary(size, samples).as_bytes()


def codec_archive(out: Path, entries: list[packfs.Entry], codecs: dict[str, Codec], *,
                  dictionaries: Optional[dict[str, bytes]] = None, shared: Optional[dict[str, str]] = None,
                  tamper: Optional[Callable[[Layout], None]] = None) -> Path:
    """A format 1.5 archive of ``entries`` at ``out``: each file named in ``codecs``
    stored as its Codec says (the others stored as they are); ``dictionaries`` (name ->
    bytes) become dictionary records; ``shared`` (path -> path) makes a file name the
    other's record (its own left empty: section 4f's shared records)."""
    dictionaries = dictionaries or {}
    shared = shared or {}
    packed = out.with_name(out.name + ".1_4")
    packfs.pack_entries(entries, packed)
    with packfs.RecordReader(packed) as reader:
        records = reader[:]
    packed.unlink()
    footer = records[-1]
    entry_count, data_count = struct.unpack_from("<QQ", footer, 16)
    sections = [records[data_count + 2 * k + 1] for k in range(21)]
    table = {name: np.frombuffer(sections[k], dtype).copy() for k, (name, dtype) in enumerate(SECTIONS)}
    paths = _paths(table)
    entry_of = {path: entry for entry, path in enumerate(paths)}

    data = list(records[:data_count])
    record_codec = bytearray(_row(CODEC_STORED) * data_count)
    codec_data = bytearray()
    record_of = {path: int(table["record"][entry]) for path, entry in entry_of.items()
                 if table["record"][entry] != NO_RECORD}
    aux_of: dict[str, int] = {}
    dictionary_record: dict[str, int] = {}
    for name, dictionary in dictionaries.items():
        dictionary_record[name] = len(data)
        data.append(dictionary)
        record_codec += _row(CODEC_DICTIONARY)
    for path, codec in codecs.items():
        record = record_of[path]
        contents = records[record]
        at = CODEC_ROW.size * record
        if codec.kind == "stored":
            continue
        if codec.kind == "zstd":
            dictionary = None
            aux = NO_RECORD
            if codec.dictionary is not None:
                dictionary = zstandard.ZstdCompressionDict(dictionaries[codec.dictionary])
                aux = dictionary_record[codec.dictionary]
            compressor = zstandard.ZstdCompressor(level=codec.level, dict_data=dictionary)
            data[record] = compressor.compress(contents)
            record_codec[at : at + CODEC_ROW.size] = _row(CODEC_ZSTD, 0, crc32(contents), aux)
        elif codec.kind == "frames":
            compressor = zstandard.ZstdCompressor(level=codec.level)
            data[record], frame_table = _frames(contents, codec, compressor)
            codec_data += bytes(-len(codec_data) % 8)
            aux_of[path] = len(codec_data)
            codec_data += frame_table
            record_codec[at : at + CODEC_ROW.size] = _row(CODEC_FRAMES, codec.frame_log2, 0, aux_of[path])
        elif codec.kind == "sparse":
            extents = sparse_extents(contents, codec.block)
            data[record] = b"".join(contents[o : o + n] for o, n in extents)
            codec_data += bytes(-len(codec_data) % 8)
            aux_of[path] = len(codec_data)
            codec_data += EXTENT_COUNT.pack(len(extents)) + b"".join(EXTENT.pack(o, n) for o, n in extents)
            record_codec[at : at + CODEC_ROW.size] = _row(CODEC_SPARSE, 0, 0, aux_of[path])
        else:
            raise ValueError(f"unknown codec {codec.kind!r}")
    for path, other in shared.items():
        entry = entry_of[path]
        data[int(table["record"][entry])] = b""  # no entry names it now: empty (format section 2)
        table["record"][entry] = record_of[other]
        record_of[path] = record_of[other]
    sections[6] = table["record"].tobytes()
    layout = Layout(data, record_codec, codec_data, record_of, aux_of, dictionary_record, sections)
    if tamper is not None:
        tamper(layout)
    return _write(out, layout, entry_count)


def _paths(table: dict[str, np.ndarray]) -> list[str]:
    names, ends, parents = table["names"].tobytes(), table["name_end"].tolist(), table["parent"].tolist()
    paths = [""] * len(parents)
    for entry in range(1, len(parents)):
        name = names[ends[entry - 1] : ends[entry]].decode("utf-8", "surrogateescape")
        paths[entry] = f"{paths[parents[entry]]}/{name}" if parents[entry] else name
    return paths


def _piece_sections(data: list[bytes]) -> list[bytes]:
    listed = [r for r, record in enumerate(data) if len(record) > PIECE_SIZE]
    starts, crcs = [0], []
    for r in listed:
        view = memoryview(data[r])
        crcs += [crc32(view[at : at + PIECE_SIZE]) for at in range(0, len(view), PIECE_SIZE)]
        starts.append(len(crcs))
    return [array.array("Q", listed).tobytes(), array.array("Q", starts).tobytes(), array.array("I", crcs).tobytes()]


def _write(out: Path, layout: Layout, entry_count: int) -> Path:
    data = layout.data
    data_count = len(data)
    n = record_count_for(data_count, SECTION_COUNT_1_5)
    sections: list[bytes] = list(layout.sections)
    sections[15:18] = _piece_sections(data)
    sections += [b"", bytes(layout.record_codec), bytes(layout.codec_data)]  # 21 (the index) is made below
    crcs = array.array("I", (crc32(record) for record in data))
    offsets = array.array("q")
    position = header_size(n)
    for record in data:
        offsets.append(position)
        position += len(record)
    data_end = position
    tables = {name: np.frombuffer(sections[k], dtype) for k, (name, dtype) in enumerate(SECTIONS)}
    index = build_lookup_index(tables, crcs, offsets, data_count)
    sections[21] = index.data
    starts = []
    for section in sections:
        position += -position % SECTION_ALIGNMENT
        starts.append(position)
        position += len(section)
    tail_start = position + (-position % SECTION_ALIGNMENT)
    page_size = TABLE_PAGE_MIN
    regions = [crcs.tobytes(), (offsets.tobytes() + struct.pack("<q", data_end))]
    regions += [sections[k] for k in _PAGED]
    pages = index.pages(page_size)
    spans = [TAIL_SPAN.pack(start, len(section)) for start, section in zip(starts, sections)]
    parts = [b"".join(spans)] + [page_crcs(region, page_size).tobytes() for region in regions]
    parts += [INDEX_PAGE.pack(first, index.page_crc(start, end), start) for first, start, end in pages]
    body = b"".join(parts)
    size = TAIL_HEADER.size + len(body)
    tail = TAIL_HEADER.pack(TAIL_MAGIC, page_size, tail_span_count(SECTION_COUNT_1_5), n, data_end, len(pages),
                            tail_start + size + FOOTER_SIZE, bytes(16)) + body
    records: list[bytes] = list(data)
    position = header_size(n) + sum(len(record) for record in data)
    for section in sections + [tail]:
        padding = -position % SECTION_ALIGNMENT
        records += [bytes(padding), section]
        position += padding + len(section)
    records += [b""] * (n - len(records) - 1)
    records.append(pack_footer(entry_count, data_count, 5, tail))
    with RecordWriter(out, len(records), force=True) as writer:
        for record in records:
            writer.write_one(record)
    return out
