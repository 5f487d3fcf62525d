"""Piece CRCs of large records (format section 4b, version 1.2): written by pack, used by
both readers (the core's Archive and the compiled daemon) so that a read of a large file
checks only the 1 MiB pieces it covers, each once under "once"; checked whole by
verify; refused where hostile; and ignored by readers of 1.1 (FFRecord's too)."""

from __future__ import annotations

import errno
import os
import zlib
from pathlib import Path

import numpy as np
import pytest

import packfs
from packfs import ChecksumError, FormatError, RecordReader
from packfs.core import Archive
from packfs.format import PIECE_SIZE, piece_count
from tests.conftest import as_version_1_1, rewrite_section

SIZES = {"small.bin": 1000, "exact.bin": PIECE_SIZE, "one_more.bin": PIECE_SIZE + 1,
         "big.bin": 3 * PIECE_SIZE + 12345, "aligned.bin": 2 * PIECE_SIZE}


@pytest.fixture(scope="module")
def contents() -> dict[str, bytes]:
    rng = np.random.default_rng(7)
    return {name: rng.integers(0, 256, size, np.uint8).tobytes() for name, size in SIZES.items()}


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory, contents: dict[str, bytes]) -> Path:
    root = tmp_path_factory.mktemp("pieces")
    (root / "src").mkdir()
    for name, data in contents.items():
        (root / "src" / name).write_bytes(data)
    os.link(root / "src" / "big.bin", root / "src" / "big_link.bin")
    packfs.pack_folder(root / "src", root / "large.ffr")
    return root / "large.ffr"


def _piece_columns(archive: Path) -> tuple[list[int], list[int], list[int]]:
    with RecordReader(archive) as reader:
        records = reader[:]
    data_records = int.from_bytes(records[-1][24:32], "little")
    columns = [records[data_records + 2 * k + 1] for k in (15, 16, 17)]
    return (np.frombuffer(columns[0], "<u8").tolist(), np.frombuffer(columns[1], "<u8").tolist(),
            np.frombuffer(columns[2], "<u4").tolist())


def test_pack_writes_a_crc_per_mib_of_each_record_over_a_mib(large: Path, contents: dict[str, bytes]) -> None:
    records, starts, crcs = _piece_columns(large)
    with Archive(large) as archive:
        assert archive.version == "1.4"
        pieced = {name: archive._file_span(archive.find(name.encode()))[0]
                  for name in SIZES if SIZES[name] > PIECE_SIZE}
    assert records == sorted(pieced.values())  # hard links share the record: listed once
    expected: list[int] = []
    for record in records:
        name = next(name for name, r in pieced.items() if r == record)
        data = contents[name]
        expected += [zlib.crc32(data[at: at + PIECE_SIZE]) for at in range(0, len(data), PIECE_SIZE)]
        assert piece_count(len(data)) == -(-len(data) // PIECE_SIZE)
    assert crcs == expected and starts[0] == 0 and starts[-1] == len(crcs)


def test_ffrecords_reader_and_the_record_crcs_are_unchanged(large: Path, contents: dict[str, bytes]) -> None:
    """The record CRC still covers each whole file: FFRecord's FileReader checks it."""
    with RecordReader(large, check_data=True) as reader, Archive(large) as archive:
        for name, data in contents.items():
            record = archive._file_span(archive.find(name.encode()))[0]
            assert reader.read_one(record) == data


@pytest.mark.parametrize("checksums", ["always", "once"])
def test_every_part_of_a_large_file_reads_right(large: Path, contents: dict[str, bytes], checksums: str) -> None:
    rng = np.random.default_rng(3)
    with Archive(large, checksums=checksums) as archive:
        for name, data in contents.items():
            entry = archive.find(name.encode())
            spans = [(0, 10), (PIECE_SIZE - 5, 10), (PIECE_SIZE, PIECE_SIZE), (len(data) - 3, 100),
                     (len(data) + 5, 10), (0, len(data))]
            spans += [(int(rng.integers(0, len(data))), int(rng.integers(1, 3 * PIECE_SIZE))) for _ in range(20)]
            for offset, size in spans:
                assert archive.read(entry, offset, size) == data[offset: offset + size], (name, offset, size)


def _damaged(large: Path, out: Path, at: int) -> Path:
    """A copy of ``large`` with byte ``at`` of big.bin flipped."""
    with Archive(large) as archive:
        start, _ = archive.extent(archive.find(b"big.bin"))
    data = bytearray(large.read_bytes())
    data[start + at] ^= 0x40
    out.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize("checksums", ["always", "once"])
def test_a_damaged_piece_fails_only_the_reads_that_cover_it(large: Path, tmp_path: Path,
                                                          contents: dict[str, bytes], checksums: str) -> None:
    bad = _damaged(large, tmp_path / "bad.ffr", 2 * PIECE_SIZE + 7)  # in piece 2 of 4
    big = contents["big.bin"]
    with Archive(bad, checksums=checksums) as archive:
        entry = archive.find(b"big.bin")
        assert archive.read(entry, 0, 4096) == big[:4096]  # the first bytes need piece 0 only
        assert archive.read(entry, 3 * PIECE_SIZE, 100) == big[3 * PIECE_SIZE: 3 * PIECE_SIZE + 100]
        for offset, size in ((2 * PIECE_SIZE, 10), (PIECE_SIZE + 10, PIECE_SIZE)):
            for _ in range(2):  # a failed piece is never remembered as sound
                with pytest.raises(ChecksumError, match=r"big\.bin.*\[2097152, 3145728\)"):
                    archive.read(entry, offset, size)
        with pytest.raises(ChecksumError):
            archive.read(entry)  # all of it: the record CRC
    report = Archive(bad).verify()
    assert any("piece 2" in problem for problem in report.problems) and "big.bin" in report.bad_paths


def test_verify_checks_the_piece_crcs_against_the_bytes(large: Path, tmp_path: Path) -> None:
    with Archive(large) as archive:
        assert archive.verify().ok
        record, start, end = archive._file_span(archive.find(b"big.bin"))
        second = archive._pieces.first_piece(record, end - start) + 1
    # big.bin's second piece CRC disagrees with sound bytes (every record CRC still matches).
    wrong = rewrite_section(large, tmp_path / "wrong.ffr", "piece_crc",
                            lambda a: a.__setitem__(second, a[second] ^ 1))
    report = Archive(wrong).verify()
    assert not report.bad_records and any(f"record {record}: piece 1" in problem for problem in report.problems)
    with Archive(wrong, checksums="once") as archive:
        entry = archive.find(b"big.bin")
        assert archive.read(entry, 0, 10)
        with pytest.raises(ChecksumError):
            archive.read(entry, PIECE_SIZE, 10)


@pytest.mark.parametrize("section, mutate, refused", [
    ("piece_start", lambda a: a.__setitem__(1, a[1] + 1), "at read"),  # a count that is not the record's
    ("piece_start", lambda a: a.__setitem__(0, 1), "at open"),  # the first piece is not 0
    ("piece_record", lambda a: a.__setitem__(0, 2**63), None),  # not a record: hidden, checked whole
])
def test_hostile_piece_tables_are_refused_or_harmless(large: Path, tmp_path: Path, contents: dict[str, bytes],
                                                      section: str, mutate, refused: str | None) -> None:
    hostile = rewrite_section(large, tmp_path / "hostile.ffr", section, mutate)
    if refused == "at open":
        with pytest.raises(FormatError, match="piece CRCs"):
            Archive(hostile)
        return
    with Archive(hostile, checksums="once") as archive:
        entry = archive.find(b"big.bin")
        if refused == "at read":
            with pytest.raises(FormatError, match="piece CRCs"):
                archive.read(entry, PIECE_SIZE + 1, 10)
        else:
            assert archive.read(entry, PIECE_SIZE + 1, 10) == contents["big.bin"][PIECE_SIZE + 1: PIECE_SIZE + 11]
        assert not archive.verify().ok


def test_more_piece_crcs_than_the_data_can_have_is_refused_at_open(large: Path, tmp_path: Path) -> None:
    hostile = rewrite_section(large, tmp_path / "many.ffr", "piece_start",
                              lambda a: a.__setitem__(len(a) - 1, 2**40))
    with pytest.raises(FormatError, match="piece_crc"):
        Archive(hostile)


def test_a_1_1_archive_has_no_pieces_and_reads_the_same(large: Path, tmp_path: Path,
                                                        contents: dict[str, bytes]) -> None:
    old = as_version_1_1(large, tmp_path / "old.ffr")
    with Archive(old, checksums="once") as archive:
        assert archive.version == "1.1" and archive.piece_spans is None
        entry = archive.find(b"big.bin")
        assert archive.read(entry, PIECE_SIZE * 2, 99) == contents["big.bin"][PIECE_SIZE * 2: PIECE_SIZE * 2 + 99]
        assert archive.verify().ok


# -- the compiled daemon's reads ---------------------------------------------------------------


def _tree(archive: Archive):
    from packfs.fuse import tree_for, unavailable

    reason = unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the compiled daemon must be built under CI: {reason}")
        pytest.skip(reason)
    return tree_for(archive, log_fd=os.open(os.devnull, os.O_WRONLY))


def test_the_compiled_daemon_reads_large_files_piece_by_piece(large: Path, contents: dict[str, bytes]) -> None:
    rng = np.random.default_rng(5)
    with Archive(large, checksums="once") as archive:
        tree = _tree(archive)
        for name, data in contents.items():
            inode = archive.inode(archive.find(name.encode()))
            spans = [(0, 4096), (PIECE_SIZE - 1, 2), (PIECE_SIZE, PIECE_SIZE), (len(data) - 1, 4096)]
            spans += [(int(rng.integers(0, len(data))), int(rng.integers(1, PIECE_SIZE + 1))) for _ in range(30)]
            for offset, size in spans:
                assert tree.read(inode, offset, size) == data[offset: offset + size], (name, offset, size)


def test_the_compiled_daemon_answers_eio_only_where_a_piece_is_damaged(large: Path, tmp_path: Path,
                                                                     contents: dict[str, bytes]) -> None:
    bad = _damaged(large, tmp_path / "bad.ffr", 2 * PIECE_SIZE + 7)
    big = contents["big.bin"]
    with Archive(bad, checksums="once") as archive:
        tree = _tree(archive)
        inode = archive.inode(archive.find(b"big.bin"))
        assert tree.read(inode, 0, 4096) == big[:4096]
        assert tree.read(inode, 3 * PIECE_SIZE, 100) == big[3 * PIECE_SIZE: 3 * PIECE_SIZE + 100]
        for offset in (2 * PIECE_SIZE, 2 * PIECE_SIZE + PIECE_SIZE - 1, PIECE_SIZE + 10):
            for _ in range(2):
                with pytest.raises(OSError) as caught:
                    tree.read(inode, offset, PIECE_SIZE if offset == PIECE_SIZE + 10 else 1)
                assert caught.value.errno == errno.EIO


def test_the_compiled_daemon_refuses_a_piece_count_that_is_not_the_records(large: Path, tmp_path: Path) -> None:
    hostile = rewrite_section(large, tmp_path / "hostile.ffr", "piece_start", lambda a: a.__setitem__(1, a[1] + 1))
    with Archive(hostile, checksums="once") as archive:
        tree = _tree(archive)
        inode = archive.inode(archive.find(b"big.bin"))
        with pytest.raises(OSError) as caught:
            tree.read(inode, 0, 10)
        assert caught.value.errno == errno.EIO


def test_convert_upgrades_a_1_1_archive_keeping_links_and_adding_pieces(large: Path, tmp_path: Path,
                                                                        contents: dict[str, bytes]) -> None:
    old = as_version_1_1(large, tmp_path / "old.ffr")
    packfs.convert(old, tmp_path / "new.ffr")
    with Archive(tmp_path / "new.ffr") as new, Archive(large) as original:
        assert new.version == "1.4" and new.verify().ok and new.piece_spans is not None
        assert new.stat(new.find(b"big_link.bin")).inode == new.stat(new.find(b"big.bin")).inode
        for name, data in contents.items():
            entry = new.find(name.encode())
            assert new.read(entry) == data and new.stat(entry) == original.stat(original.find(name.encode()))
    with pytest.raises(packfs.PackError, match="already a packfs archive of format 1.4"):
        packfs.convert(large, tmp_path / "again.ffr")
