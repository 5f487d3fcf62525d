"""The record API against FFRecord's own files (tests/vectors/ffrecord)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from packfs import ChecksumError, FormatError, PackError, RecordReader, RecordWriter
from tests.conftest import VECTORS

RECORDS = json.loads((VECTORS / "records.json").read_text())


def test_reads_every_record_of_ffrecords_file() -> None:
    with RecordReader(VECTORS / "records.ffr") as reader:
        assert reader.n == len(reader) == 5
        for record in RECORDS["records"]:
            data = reader.read_one(record["index"])
            assert len(data) == record["length"]
            assert hashlib.sha256(data).hexdigest() == record["sha256"]
            assert reader.record_length(record["index"]) == record["length"]
        assert reader.read([1, 2]) == [b"a", b"hello world"]
        assert reader[-3] == b"hello world"
        assert reader[1:3] == [b"a", b"hello world"]
        assert reader[::-2][0] == reader[4]
        with pytest.raises(IndexError):
            reader[5]
        with pytest.raises(IndexError):
            reader[-6]


def test_header_fields_match_ffrecords_view() -> None:
    from packfs.core import Container

    container = Container(VECTORS / "records.ffr")
    assert list(container.offsets) == RECORDS["header"]["offsets"]
    assert list(container.crcs) == RECORDS["header"]["checksums"]
    container.close()


def test_writer_output_is_byte_identical_to_ffrecords(tmp_path: Path) -> None:
    with RecordReader(VECTORS / "records.ffr") as reader:
        payloads = reader[:]
    out = tmp_path / "records.ffr"
    with RecordWriter(out, len(payloads)) as writer:
        for payload in payloads:
            writer.write_one(payload)
    assert out.read_bytes() == (VECTORS / "records.ffr").read_bytes()


def test_empty_container_matches_ffrecord(tmp_path: Path) -> None:
    out = tmp_path / "empty.ffr"
    RecordWriter(out, 0).close()
    assert out.read_bytes() == (VECTORS / "empty.ffr").read_bytes()
    assert len(RecordReader(out)) == 0


def test_write_one_stores_all_bytes_of_a_buffer(tmp_path: Path) -> None:
    import numpy as np

    array = np.arange(4, dtype=np.int32)
    with RecordWriter(tmp_path / "x.ffr", 1) as writer:
        writer.write_one(array)
    assert RecordReader(tmp_path / "x.ffr")[0] == array.tobytes()


def test_wrong_count_leaves_no_file(tmp_path: Path) -> None:
    out = tmp_path / "short.ffr"
    writer = RecordWriter(out, 3)
    writer.write_one(b"one")
    with pytest.raises(PackError, match="1 records written, 3 declared"):
        writer.close()
    assert os.listdir(tmp_path) == []
    writer = RecordWriter(out, 1)
    writer.write_one(b"x")
    with pytest.raises(PackError, match="more records"):
        writer.write_one(b"y")
    del writer
    assert os.listdir(tmp_path) == []


def test_exception_inside_with_leaves_no_file(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with RecordWriter(tmp_path / "x.ffr", 2) as writer:
            writer.write_one(b"x")
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_existing_output_needs_force(tmp_path: Path) -> None:
    out = tmp_path / "x.ffr"
    out.write_bytes(b"keep me")
    with pytest.raises(PackError, match="already exists"):
        RecordWriter(out, 1)
    assert out.read_bytes() == b"keep me"
    with RecordWriter(out, 1, force=True) as writer:
        writer.write_one(b"new")
    assert RecordReader(out)[0] == b"new"


def _shards(tmp_path: Path) -> list[Path]:
    paths = []
    for shard, items in enumerate([[b"a", b"b"], [], [b"c"], [b"d", b"e", b"f"]]):
        path = tmp_path / f"part-{shard}.ffr"
        with RecordWriter(path, len(items)) as writer:
            for item in items:
                writer.write_one(item)
        paths.append(path)
    return paths


@pytest.mark.parametrize("form", ["list", "directory", "glob"])
def test_several_files_read_as_one_sequence(tmp_path: Path, form: str) -> None:
    paths = _shards(tmp_path)
    source = {"list": paths, "directory": tmp_path, "glob": str(tmp_path / "part-*.ffr")}[form]
    with RecordReader(source) as reader:
        assert len(reader) == 6
        assert reader[:] == [b"a", b"b", b"c", b"d", b"e", b"f"]
        assert reader[-1] == b"f"
        assert reader.read([5, 0, 2]) == [b"f", b"a", b"c"]


def test_reader_pickles_as_its_paths(tmp_path: Path) -> None:
    import pickle

    paths = _shards(tmp_path)
    reader = RecordReader(paths)
    clone = pickle.loads(pickle.dumps(reader))
    assert clone[:] == reader[:]
    assert len(pickle.dumps(reader)) < 1000


def test_corrupt_payload_fails_only_that_record() -> None:
    reader = RecordReader(VECTORS / "corrupt_payload.ffr")
    for index in (0, 1, 3, 4):
        reader.read_one(index)
    with pytest.raises(ChecksumError, match="record 2: checksum mismatch"):
        reader.read_one(2)
    with pytest.raises(ChecksumError):
        reader.read([0, 1, 2, 3, 4])
    # Unchecked, FFRecord returns the damaged bytes; so do we.
    assert RecordReader(VECTORS / "corrupt_payload.ffr", check_data=False)[2] == b"iello world"


def test_corrupt_header_fails_at_open() -> None:
    with pytest.raises(ChecksumError, match="header checksum mismatch"):
        RecordReader(VECTORS / "corrupt_header.ffr")


def test_corrupt_header_unchecked_still_validates_offsets(tmp_path: Path) -> None:
    # FFRecord trusts this header blindly with check_data=False; the offsets are still
    # monotonic here, so it opens, but record 2 then fails nothing -- it is unchecked.
    reader = RecordReader(VECTORS / "corrupt_header.ffr", check_data=False)
    assert reader[2] == b"hello world" + bytes([0])


def test_truncated_file_fails_the_last_record() -> None:
    reader = RecordReader(VECTORS / "truncated.ffr")
    for index in range(4):
        reader.read_one(index)
    with pytest.raises(ChecksumError, match="record 4"):
        reader.read_one(4)


def test_zero_meta_checksum_is_refused() -> None:
    with pytest.raises(FormatError, match="metadata checksum is 0"):
        RecordReader(VECTORS / "zero_meta_checksum.ffr")


@pytest.mark.parametrize("length", [0, 5, 11, 40, 71, 1000])
def test_truncations_are_format_errors_at_open(tmp_path: Path, length: int) -> None:
    path = tmp_path / "cut.ffr"
    path.write_bytes((VECTORS / "records.ffr").read_bytes()[:length])
    with pytest.raises(FormatError):
        RecordReader(path, check_data=False)


def test_offsets_going_backwards_are_refused(tmp_path: Path) -> None:
    import struct
    import zlib

    data = bytearray((VECTORS / "records.ffr").read_bytes())
    struct.pack_into("<q", data, 32 + 8 * 3, 60)  # offsets[3] before the header end
    struct.pack_into("<I", data, 0, zlib.crc32(bytes(data[4:72])))
    path = tmp_path / "bad.ffr"
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="record 3 starts at offset 60"):
        RecordReader(path)


def test_negative_or_huge_count_refused_before_allocating(tmp_path: Path) -> None:
    import struct

    for n, message in ((-1, "not a packfs archive"), (2**62, "not a packfs archive"), (2**40, "header claims")):
        path = tmp_path / f"n{n}.ffr"
        path.write_bytes(struct.pack("<Iq", 0, n) + bytes(100))
        with pytest.raises(FormatError, match=message):
            RecordReader(path, check_data=False)


def test_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        RecordReader(tmp_path / "missing.ffr")
