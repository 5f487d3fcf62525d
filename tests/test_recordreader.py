"""The one reader of records (packfs/core/recordreader.py): every read call of an
archive with codecs (format 1.5, section 4f) and the file object of ``Archive.open``
decode and check through it, so each answers a damaged frame, a frame that decodes to
the wrong length, a shared (dedup'd) record and a sparse file's holes the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import zstandard

from packfs import ChecksumError, FormatError
from packfs.core import Archive, Container
from packfs.format import FRAME_ROW, crc32
from tests.conftest import bytes_read_by_this_thread
# The archive of every kind of file section 4f stores, as test_codecs packs it.
from tests.test_codecs import FRAME, _flipped, _rewritten, _row, _section_start
from tests.test_codecs import codec_tree, coded, files  # noqa: F401  (fixtures)

BIG = "logs/big.log"  # 3 frames of 1 MiB and a short fourth
SHARED = ("same/one.txt", "same/two.txt", "other/three.txt")  # three files, one record
SPARSE = "disk.img"  # 20 MiB: data at 1 MiB, 9 MiB and its last 5 bytes; holes between


def _every_read(archive: Archive, path: str, offset: int = 0, size: int = -1) -> dict[str, Callable[[], object]]:
    """Every read call of ``path``, reading bytes [offset, offset + size) where a call
    can read a range, and all of the file where it cannot."""
    entry = archive.lookup(path)

    def through_open() -> bytes:
        with archive.open(entry) as f:
            f.seek(offset)
            return f.read(size)

    return {
        "read": lambda: archive.read(entry, offset, size),
        "open": through_open,
        "read whole": lambda: archive.read(entry),
        "read_path": lambda: archive.read_path(path),
        "read_view": lambda: bytes(archive.read_view(path)),
        "read_many": lambda: archive.read_many([path, entry]),
        "read_batch": lambda: list(archive.read_batch([entry])),
        "read_chunks": lambda: b"".join(archive.read_chunks(entry, 1 << 18)),
        "read_extents": lambda: list(archive.read_extents(entry, 1 << 18)),
    }


def _frame_span(archive: Archive, coded: Path, path: str, k: int) -> tuple[int, int]:
    """Where frame ``k`` of frames file ``path`` lies in the archive file."""
    aux = _row(archive, path)[4]
    with open(coded, "rb") as f:
        f.seek(_section_start(coded, 23) + aux + FRAME_ROW.size * (k - 1))
        previous_end = FRAME_ROW.unpack(f.read(FRAME_ROW.size))[0] if k else 0
        end = FRAME_ROW.unpack(f.read(FRAME_ROW.size))[0]
    start, _ = archive.extent(archive.lookup(path))
    return start + previous_end, start + end


@pytest.mark.parametrize("checksums", ["always", "once"])
def test_a_damaged_frame_fails_every_read_that_covers_it_and_no_other(coded: Path, tmp_path: Path,
                                                                    files: dict[str, bytes], checksums: str) -> None:
    with Archive(coded) as archive:
        low, high = _frame_span(archive, coded, BIG, 1)
    damaged = _flipped(coded, tmp_path / "frame.ffr", (low + high) // 2)
    contents = files[BIG]
    with Archive(damaged, checksums=checksums) as archive:
        for _ in range(2):  # and again: a failure is never remembered as a success
            for how, read in _every_read(archive, BIG, FRAME + 10, 100).items():
                with pytest.raises(ChecksumError, match="big.log") as caught:
                    read()
                assert "checksum mismatch" in str(caught.value), how
            # Frames 0, 2 and 3 are sound: a read of them alone decodes only them.
            for how, read in _every_read(archive, BIG, 2 * FRAME + 5, 5000).items():
                if how in ("read", "open"):
                    assert read() == contents[2 * FRAME + 5 : 2 * FRAME + 5005], how
            assert archive.read(archive.lookup(BIG), 10, FRAME - 20) == contents[10 : FRAME - 10]
        assert not archive.verify().ok


def test_never_decodes_a_damaged_frame_to_its_declared_size_or_refuses_it(coded: Path, tmp_path: Path,
                                                                         files: dict[str, bytes]) -> None:
    with Archive(coded) as archive:
        low, high = _frame_span(archive, coded, BIG, 1)
    damaged = _flipped(coded, tmp_path / "frame.ffr", (low + high) // 2)
    with Archive(damaged, checksums="never") as archive:
        entry = archive.lookup(BIG)
        try:
            data = archive.read(entry, FRAME, FRAME)
        except FormatError as error:  # what zstd made of the damage, named
            assert "big.log" in str(error) and "frame 1" in str(error)
        else:
            assert len(data) == FRAME  # never more, never fewer bytes than declared
        assert archive.read(entry, 0, 100) == files[BIG][:100]


def test_a_frame_that_decodes_to_the_wrong_length_is_refused_by_every_read(coded: Path, tmp_path: Path,
                                                                          files: dict[str, bytes]) -> None:
    """Frame 1 replaced by a frame of FRAME - 1 bytes (its size not declared), every CRC
    made to match: each read that decodes it says what it decoded to."""
    contents = files[BIG]
    short = contents[FRAME : 2 * FRAME - 1]
    frame = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(short)
    with Archive(coded) as archive:
        record = int(archive.column("record")[archive.lookup(BIG)])
        aux = _row(archive, BIG)[4]

    def plant(records: list[bytes], data_records: int) -> None:
        table = bytearray(records[data_records + 2 * 23 + 1])
        ends = [FRAME_ROW.unpack_from(table, aux + FRAME_ROW.size * k) for k in range(4)]
        old = records[record]
        begin, end = ends[0][0], ends[1][0]
        records[record] = old[:begin] + frame + old[end:]
        shift = len(frame) - (end - begin)
        for k in range(1, 4):
            stored_end, stored_crc, decoded_crc = ends[k]
            if k == 1:
                stored_crc, decoded_crc = crc32(frame), crc32(short)
            FRAME_ROW.pack_into(table, aux + FRAME_ROW.size * k, stored_end + shift, stored_crc, decoded_crc)
        records[data_records + 2 * 23 + 1] = bytes(table)

    hostile = _rewritten(coded, tmp_path / "short.ffr", plant)
    with Archive(hostile) as archive:
        for how, read in _every_read(archive, BIG, FRAME + 10, 100).items():
            with pytest.raises(FormatError, match=f"big.log.*frame 1 decodes to {FRAME - 1} bytes, expected {FRAME}"):
                read()
        assert archive.read(archive.lookup(BIG), 3 * FRAME, 100) == contents[3 * FRAME : 3 * FRAME + 100]


def test_a_shared_record_is_checked_once_for_all_its_names_and_fails_under_each(
        coded: Path, tmp_path: Path, files: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    import packfs.core.checkpolicy as policy_module

    with Archive(coded, checksums="once") as archive:
        assert len({archive.extent(archive.lookup(path)) for path in SHARED}) == 1
        computed: list[int] = []
        real = policy_module.crc32
        monkeypatch.setattr(policy_module, "crc32", lambda data, value=0: computed.append(len(data)) or real(data, value))
        for path in SHARED:
            for how, read in _every_read(archive, path, 100, 50).items():
                result = read()
                if how in ("read", "open"):
                    assert result == files[path][100:150], how
        assert len(computed) == 1  # the first name's read checked the record for all three
        start, end = archive.extent(archive.lookup(SHARED[0]))
    monkeypatch.undo()
    damaged = _flipped(coded, tmp_path / "shared.ffr", (start + end) // 2)
    with Archive(damaged, checksums="once") as archive:
        for _ in range(2):
            for path in SHARED:
                for how, read in _every_read(archive, path).items():
                    with pytest.raises(ChecksumError, match=path.split("/")[-1]):
                        read()


def test_a_sparse_files_holes_read_as_zeros_through_every_call_without_reading_the_record(
        coded: Path, files: dict[str, bytes]) -> None:
    sparse = files[SPARSE]
    with Archive(coded, checksums="once") as archive:
        entry = archive.lookup(SPARSE)
        archive.check(entry)  # the record checked: a read inside a hole needs no byte of it
        for offset, size in ((0, 4096), (3 << 20, 1 << 20), ((9 << 20) + 1_500_000, 100_000)):
            before = bytes_read_by_this_thread()
            assert archive.read(entry, offset, size) == bytes(size)
            assert bytes_read_by_this_thread() - before < 4096, (offset, size)
            with archive.open(entry) as f:
                f.seek(offset)
                assert f.read(size) == bytes(size)
        for offset, size in (((1 << 20) - 10, 100), ((9 << 20) - 5, 1_500_010), ((20 << 20) - 8, 100)):
            assert archive.read(entry, offset, size) == sparse[offset : offset + size]
        extents = list(archive.read_extents(entry, 1 << 18))
        assert sum(len(data) for _, data in extents) == archive.extent(entry)[1] - archive.extent(entry)[0]
        rebuilt = bytearray(len(sparse))
        for offset, data in extents:  # the holes left out, the data where it belongs
            rebuilt[offset : offset + len(data)] = data
        assert bytes(rebuilt) == sparse
        assert b"".join(archive.read_chunks(entry, 1 << 20)) == sparse
        assert archive.read(entry) == archive.read_path(SPARSE) == sparse
        assert dict(archive.read_batch([entry])) == {0: sparse}


def test_a_file_objects_reads_check_nothing_again_but_frames(coded: Path, files: dict[str, bytes],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``Archive.open`` checks a sparse file's record once (at open, under "always"); its
    reads go through the same reader without checking the record again."""
    checks: list[int] = []
    real = Container.record_crc_ok
    with Archive(coded, checksums="always") as archive:
        entry = archive.lookup(SPARSE)
        monkeypatch.setattr(Container, "record_crc_ok",
                            lambda self, index, progress=None: checks.append(index) or real(self, index, progress))
        with archive.open(entry) as f:
            assert len(checks) == 1
            for offset in (0, 1 << 20, 9 << 20, (20 << 20) - 5):
                f.seek(offset)
                assert f.read(70_000) == files[SPARSE][offset : offset + 70_000]
        assert len(checks) == 1
        archive.read(entry, 1 << 20, 100)  # a read call under "always" checks (the pieces it covers)
