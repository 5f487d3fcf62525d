"""RecordReader: the one place a file's record is read, checked under the checksum
policy and decoded (format 1.5, section 4f), for every read call and file object.

CPython's ``zipfile.ZipExtFile`` is the model: a member's bytes are decompressed and
checked in one place, whoever reads them.  Here every read of an archive
(``Archive.read``, ``read_path``, ``read_view``, ``read_many``, ``read_batch``,
``read_chunks``, ``read_extents``, and the :class:`~packfs.core.files.DecodedFile`
of ``Archive.open``) hands a located record (its span, its size and its checked codec
row) to one :class:`RecordReader` and gets back decoded, checked bytes: a range of a
frames file decodes only the frames it covers, a range of a sparse file reads only the
extents it covers (its holes are zeros), a range of a stored record checks just the
piece CRCs it covers where the record has them.

It is a module of its own, not part of :mod:`packfs.core.codecs`: codecs.py parses and
checks the codec sections and decodes bytes handed to it, and reads nothing but its
own sections and dictionaries; this module reads records from the container and asks
the :class:`~packfs.core.checkpolicy.ChecksumPolicy` when to check them, the layer
above.  The one exception, documented where it is: ``Archive.read_path`` reads a stored
file inline (the hottest path of all), with the policy's bitmaps.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator, Optional, Union

from ..format import CODEC_FRAMES, CODEC_STORED, CODEC_ZSTD, crc32
from .checkpolicy import ChecksumPolicy, Where
from .codecs import CodecRow, CodecTable, SparseLayout, check_in_memory
from .container import MAP_COPY_BYTES, Container
from .pieces import NO_PIECES, PieceTable

__all__ = ["RecordReader", "REMOTE_WINDOW"]

REMOTE_WINDOW = 64 << 20  # read-ahead of a chunked read from a remote source

# What a reader of one file keeps between reads: the frame it decoded last (a mount
# reads a 1 MiB frame in 128 KiB requests; each would decode all of it), as
# {"key": (record, frame), "bytes": decoded}; a zstd file is frame -1.
Recent = dict


class RecordReader:
    """Reads the records of one archive: stored, zstd, frames or sparse (section 4f),
    each byte checked under ``policy`` (a frame against its own CRCs whatever the
    record's state, but under "never"), never decoding a frame into more bytes than
    the archive declares.  The caller locates the record (its table values and codec
    row checked) and wraps the call in its container's unchanged checks."""

    __slots__ = ("_container", "_codecs", "_policy", "_pieces", "_label", "_recent")

    def __init__(self, container: Container, codecs: CodecTable, policy: ChecksumPolicy, pieces: PieceTable,
                 label: Callable[[Where], str]) -> None:
        self._container, self._codecs, self._policy, self._pieces = container, codecs, policy, pieces
        self._label = label
        # Per thread, the frame a part read decoded last (Recent).
        self._recent = threading.local()

    def recent(self) -> Recent:
        """This thread's last decoded frame, reused but under "always", where every read
        checks what it returns (an empty one then)."""
        return {} if self._policy.every_read else self._recent.__dict__

    # -- whole records and ranges --------------------------------------------------------

    def read_whole(self, record: int, start: int, end: int, size: int, row: CodecRow, where: Where) -> bytes:
        """A file's whole contents: its record read once (copied out of a guarded map
        when small), checked under the policy, and decoded."""
        container, policy = self._container, self._policy
        if container.guarded and end - start < MAP_COPY_BYTES:
            # A small copy out of the map: one call to the policy (a record that failed
            # before was copied again, which costs less than a second call would).
            stored = container.mapping[start:end]  # type: ignore[index]  # guarded: the source's mmap
            policy.check_if_due(record, stored, where)
        else:
            check = policy.must_check(record, where)  # one that failed before is not read again
            stored = container.pread(start, end)
            if check:
                policy.check(record, stored, where)
        return self._codecs.decode(row, record, stored, size, where) if row.codec else stored

    def decode_whole(self, record: int, stored: Union[bytes, memoryview], size: int, row: Optional[CodecRow],
                     where: Where) -> bytes:
        """A file's contents from its whole record ``stored``, read by the caller (a
        batch's joined read): checked under the policy, then decoded."""
        self._policy.check_if_due(record, stored, where)
        if row is None or not row.codec:
            return stored if type(stored) is bytes else bytes(stored)
        return self._codecs.decode(row, record, stored, size, where)

    def read_range(self, record: int, start: int, end: int, size: int, row: CodecRow, where: Where, begin: int,
                   stop: int, recent: Optional[Recent] = None, layout: Optional[SparseLayout] = None,
                   record_checked: bool = False) -> bytes:
        """Decoded bytes [begin, stop) of a file of ``size`` bytes (0 <= begin, stop <=
        size).  ``recent`` keeps the last decoded frame between calls (:meth:`recent`, or
        a file object's own); ``layout`` is a sparse file's extents if the caller holds
        them; ``record_checked`` says the caller checked the whole record under the
        policy already (a file object, at open), so a sparse file's extents are read
        unchecked."""
        codec = row.codec
        if codec == CODEC_STORED:
            return self.read_stored(record, start, end, begin, stop, where)
        if begin >= stop:
            return b""
        if recent is None:
            recent = {}
        if codec == CODEC_ZSTD:
            if recent.get("key") != (record, -1):
                recent["key"], recent["bytes"] = (record, -1), self.read_whole(record, start, end, size, row, where)
            data = recent["bytes"]
            return data if begin == 0 and stop == size else data[begin:stop]
        if begin == 0 and stop == size and not record_checked:
            return self.read_whole(record, start, end, size, row, where)
        codecs, container = self._codecs, self._container
        if codec == CODEC_FRAMES:
            check_in_memory(stop - begin, container.path)
            frame_size = 1 << row.frame_log2
            parts = []
            for k in range(begin // frame_size, (stop - 1) // frame_size + 1):
                if recent.get("key") == (record, k):
                    decoded = recent["bytes"]
                else:
                    low, high, stored_crc, decoded_crc = codecs.frame_span(row, k, end - start, where)
                    frame = container.pread(start + low, start + high, end)
                    decoded = codecs.decode_frame(row, size, k, frame, stored_crc, decoded_crc, where)
                    recent["key"], recent["bytes"] = (record, k), decoded
                at = k * frame_size
                parts.append(decoded[max(begin - at, 0): stop - at])
            return parts[0] if len(parts) == 1 else b"".join(parts)
        if layout is None:
            layout = codecs.sparse_layout(row, record, size, end - start, where)
        if record_checked:
            return codecs.sparse_range(layout, begin, stop,
                                       lambda low, high: container.pread(start + low, start + high, end))
        return codecs.sparse_range(layout, begin, stop,
                                   lambda low, high: self.read_stored(record, start, end, low, high, where))

    def read_stored(self, record: int, start: int, end: int, begin: int, stop: int, where: Where) -> bytes:
        """Bytes [begin, stop) (record-relative) of a record stored as it is, checked
        under the policy: the whole record first, or just the 1 MiB pieces the range
        covers where it has piece CRCs (format 1.2's records over 1 MiB)."""
        begin, stop = start + begin, start + stop
        policy = self._policy
        if policy.must_check(record, where):
            if begin == start and stop == end:
                # The whole record: one pread serves both the check and the reply.
                data = self._container.pread(start, end)
                policy.check(record, data, where)
                return data
            first = self._pieces.first_piece(record, end - start)
            if first != NO_PIECES:
                return policy.read_pieces(first, start, end, begin, stop, where)
            policy.check(record, None, where)
        return self._container.pread(begin, stop, end) if begin < stop else b""

    def check_record(self, record: int, start: int, end: int, size: int, row: CodecRow, where: Where) -> None:
        """Check a file's record as a read of all of it would under the policy, in
        bounded memory: a zstd file (at most 1 MiB) decoded and checked; a frames or
        sparse file's record checked (read in chunks) and a sparse file's extent list;
        a frame's own CRCs are checked when it is decoded."""
        if row.codec == CODEC_ZSTD:
            self.read_whole(record, start, end, size, row, where)
            return
        self._policy.check_if_due(record, None, where)
        if row.codec not in (CODEC_STORED, CODEC_FRAMES):
            self._codecs.sparse_layout(row, record, size, end - start, where)

    # -- in chunks, checked whatever the policy ------------------------------------------

    def _window(self, chunk_size: int) -> int:
        # From a source without a map (a remote one), read ahead in windows of several
        # chunks, which it fetches as ranged parts in parallel: one request per chunk would
        # cost a round trip each (1 MiB per 20 ms).  A quarter of its memory cap at most.
        container = self._container
        if container.zero_copy:
            return chunk_size
        return max(chunk_size, min(REMOTE_WINDOW, getattr(container.source, "memory_cap", REMOTE_WINDOW) // 4))

    def stored_chunks(self, record: int, start: int, end: int, where: Where, chunk_size: int) -> Iterator[bytes]:
        """Record ``record`` at [start, end) in chunks, its CRC computed as they go and
        compared after the last (ChecksumError then: a caller writing the chunks out
        publishes them only once the iterator is exhausted)."""
        container = self._container
        window = self._window(chunk_size)
        value, position = 0, start
        while position < end:
            block = container.pread(position, min(end, position + window))
            container.check_unchanged()
            for at in range(0, len(block), chunk_size):
                chunk = block if len(block) <= chunk_size else block[at: at + chunk_size]
                value = crc32(chunk, value)
                position += len(chunk)
                yield chunk
        if value != container.stored_crc(record):
            raise container.checksum_error(record, self._label(where))

    def extents(self, record: int, start: int, end: int, size: int, row: CodecRow, where: Where,
                chunk_size: int) -> Iterator[tuple[int, bytes]]:
        """(offset, bytes) of a file's contents, in order, in chunks of at most
        ``chunk_size`` bytes (a zstd file in one), leaving out a sparse file's holes.
        Every stored byte is checked whatever the policy (and every decoded one but
        under "never"); a stored or sparse record's CRC after its last chunk."""
        codec = row.codec
        container, codecs = self._container, self._codecs
        if codec == CODEC_ZSTD:
            stored = container.pread(start, end)
            container.check_unchanged()
            if crc32(stored) != container.stored_crc(record):
                raise container.checksum_error(record, self._label(where))
            yield 0, codecs.decode(row, record, stored, size, where)
            return
        if codec == CODEC_FRAMES:
            yield from self._frame_extents(record, start, end, size, row, where, chunk_size)
            return
        stored_chunks = self.stored_chunks(record, start, end, where, chunk_size)
        if codec == CODEC_STORED:
            position = 0
            for chunk in stored_chunks:
                yield position, chunk
                position += len(chunk)
            return
        layout = codecs.sparse_layout(row, record, size, end - start, where)
        j, within = 0, 0  # the extent the next stored byte belongs to, and how far into it
        for chunk in stored_chunks:
            at = 0
            while at < len(chunk):
                take = min(len(chunk) - at, layout.lengths[j] - within)
                yield layout.offsets[j] + within, chunk[at: at + take] if take < len(chunk) else chunk
                at += take
                within += take
                if within == layout.lengths[j]:
                    j, within = j + 1, 0

    def _frame_extents(self, record: int, start: int, end: int, size: int, row: CodecRow, where: Where,
                       chunk_size: int) -> Iterator[tuple[int, bytes]]:
        """:meth:`extents` of a frames file: frames read a window at a time (from a
        remote source, windows of parallel ranged parts: one GET per frame cost a round
        trip each), each checked against its stored CRC, then decoded."""
        container, codecs = self._container, self._codecs
        frame_size, count = 1 << row.frame_log2, -(-size >> row.frame_log2)
        window = self._window(chunk_size)
        k = 0
        while k < count:
            frames = [(k, *codecs.frame_span(row, k, end - start, where))]
            while k + len(frames) < count and frames[-1][2] - frames[0][1] < window:
                frames.append((k + len(frames), *codecs.frame_span(row, k + len(frames), end - start, where)))
            base = frames[0][1]
            block = memoryview(container.pread(start + base, start + frames[-1][2], end))
            container.check_unchanged()
            for index, low, high, stored_crc, decoded_crc in frames:
                frame = block[low - base: high - base]
                if crc32(frame) != stored_crc:
                    raise container.checksum_error(record, f"{self._label(where)}: frame {index}")
                decoded = codecs.decode_frame(row, size, index, frame, stored_crc, decoded_crc, where, False)
                for at in range(0, len(decoded), chunk_size):
                    yield (index * frame_size + at,
                           decoded[at: at + chunk_size] if len(decoded) > chunk_size else decoded)
            k += len(frames)
