"""An independent reading of format 1.5 (packfs/format.py, section 4f), written from
the specification alone and sharing no code with packfs' readers: the writer's tests
decode archives with it, so a writer and a reader that agree on a misreading of the
spec do not pass together."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import zstandard

from packfs.format import (CODEC_DICTIONARY, CODEC_FRAMES, CODEC_ROW, CODEC_SPARSE, CODEC_STORED, CODEC_ZSTD, EXTENT,
                           EXTENT_COUNT, FRAME_ROW, NO_RECORD, S_IFMT, S_IFREG, SECTIONS, SEEKABLE_MAGIC,
                           SKIPPABLE_SEEK_TABLE_MAGIC, TAIL_HEADER, TAIL_SPAN, unpack_footer)


class Spec15:
    """A 1.5 (or 1.4) archive read straight from its bytes."""

    def __init__(self, path) -> None:
        self.data = data = open(path, "rb").read()
        n = struct.unpack_from("<q", data, 4)[0]
        self.offsets = np.frombuffer(data, "<i8", n, 12 + 4 * n)
        self.crcs = np.frombuffer(data, "<u4", n, 12)
        self.footer = footer = unpack_footer(data[self.offsets[n - 1]:], str(path))
        tail = data[len(data) - 64 - footer.tail_size: len(data) - 64]
        _, _, spans, _, _, _, _, _ = TAIL_HEADER.unpack_from(tail)
        assert spans == footer.section_count - 1
        self.spans = [TAIL_SPAN.unpack_from(tail, 64 + 16 * k) for k in range(spans)]
        column = {name: np.frombuffer(self.section(k), kind) for k, (name, kind) in enumerate(SECTIONS)}
        self.size, self.record, self.mode = column["size"], column["record"], column["mode"]
        self.name_end, self.parent, self.names = column["name_end"], column["parent"], self.section(12)
        self.codecs = footer.flags & 1
        self.rows = self.section(22) if self.codecs else b""
        self.codec_data = self.section(23) if self.codecs else b""
        if self.codecs:
            assert len(self.rows) == CODEC_ROW.size * footer.data_records

    def section(self, k: int) -> bytes:
        start, length = self.spans[k]
        return self.data[start: start + length]

    def stored(self, record: int) -> bytes:
        data = self.data[self.offsets[record]: self.offsets[record + 1]]
        assert zlib.crc32(data) == self.crcs[record]
        return data

    def row(self, record: int) -> tuple[int, int, int, int, int]:
        return CODEC_ROW.unpack_from(self.rows, CODEC_ROW.size * record) if self.codecs else (0, 0, 0, 0, 0)

    def decode(self, record: int, size: int) -> tuple[bytes, str]:
        """The file's bytes and the codec's name."""
        codec, frame_log2, reserved, check, aux = self.row(record)
        assert reserved == 0
        stored = self.stored(record)
        if codec == CODEC_STORED:
            assert len(stored) == size
            return stored, "stored"
        if codec == CODEC_ZSTD:
            if aux == NO_RECORD:
                decompressor = zstandard.ZstdDecompressor()
            else:
                assert self.row(aux)[0] == CODEC_DICTIONARY
                decompressor = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(self.stored(aux)))
            out = decompressor.decompress(stored, max_output_size=size)
            assert len(out) == size and zlib.crc32(out) == check
            return out, "zstd" if aux == NO_RECORD else "zstd+dictionary"
        if codec == CODEC_FRAMES:
            frame = 1 << frame_log2
            previous, out = 0, []
            for k in range(-(-size // frame)):
                end, stored_crc, decoded_crc = FRAME_ROW.unpack_from(self.codec_data, aux + FRAME_ROW.size * k)
                piece = stored[previous:end]
                assert zlib.crc32(piece) == stored_crc
                decoded = zstandard.ZstdDecompressor().decompress(piece, max_output_size=frame)
                assert zlib.crc32(decoded) == decoded_crc and len(decoded) == min(frame, size - k * frame)
                out.append(decoded)
                previous = end
            seek_table = stored[previous:]  # zstd's seekable format, after the frames
            assert struct.unpack_from("<I", seek_table)[0] == SKIPPABLE_SEEK_TABLE_MAGIC
            assert struct.unpack_from("<I", seek_table, len(seek_table) - 4)[0] == SEEKABLE_MAGIC
            return b"".join(out), "frames"
        if codec == CODEC_SPARSE:
            (count,) = EXTENT_COUNT.unpack_from(self.codec_data, aux)
            out, at = bytearray(size), 0
            for k in range(count):
                offset, length = EXTENT.unpack_from(self.codec_data, aux + 8 + EXTENT.size * k)
                out[offset: offset + length] = stored[at: at + length]
                at += length
            assert at == len(stored)
            return bytes(out), "sparse"
        raise AssertionError(f"codec {codec}")

    def path(self, entry: int) -> bytes:
        parts = []
        while entry:
            parts.append(self.names[self.name_end[entry - 1]: self.name_end[entry]])
            entry = self.parent[entry]
        return b"/".join(reversed(parts))

    def files(self) -> dict[bytes, tuple[bytes, str, int]]:
        """Every regular file: path -> (bytes, codec name, record)."""
        found = {}
        for entry in range(1, self.footer.entry_count):
            if self.mode[entry] & S_IFMT == S_IFREG:
                record = int(self.record[entry])
                data, codec = self.decode(record, int(self.size[entry]))
                found[self.path(entry)] = (data, codec, record)
        return found
