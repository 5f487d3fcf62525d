"""packfs.ffrecord: FFRecord's API, checked against files FFRecord itself wrote."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

import packfs
from packfs.ffrecord import FileReader, FileWriter, PackedFolder, pack_folder
from tests.conftest import VECTORS


def _records() -> list[dict]:
    return json.loads((VECTORS / "records.json").read_text())["records"]


def test_file_reader_returns_uint8_arrays_as_ffrecord_does() -> None:
    with FileReader(VECTORS / "records.ffr") as reader:
        assert reader.n == 5
        for record in _records():
            data = reader.read_one(record["index"])
            assert data.dtype == np.uint8 and data.flags.writeable
            assert hashlib.sha256(data.tobytes()).hexdigest() == record["sha256"]
        batch = reader.read(list(range(5)))
        assert [hashlib.sha256(d.tobytes()).hexdigest() for d in batch] == [r["sha256"] for r in _records()]


def test_file_writer_writes_ffrecords_bytes_exactly(tmp_path: Path) -> None:
    with FileReader(VECTORS / "records.ffr") as reader:
        payloads = [reader.read_one(i).tobytes() for i in range(reader.n)]
    out = tmp_path / "records.ffr"
    with FileWriter(out, len(payloads)) as writer:
        for payload in payloads:
            writer.write_one(payload)
    assert out.read_bytes() == (VECTORS / "records.ffr").read_bytes()


def test_file_reader_takes_a_list_or_a_directory(tmp_path: Path) -> None:
    for name in ("a.ffr", "b.ffr"):
        with FileWriter(tmp_path / name, 2) as writer:
            writer.write_one(name.encode())
            writer.write_one(np.arange(3, dtype=np.int32))  # all 12 bytes, unlike FFRecord's 3
    for source in ([tmp_path / "a.ffr", tmp_path / "b.ffr"], tmp_path):
        with FileReader(source) as reader:
            assert reader.n == 4 and reader.read_one(2).tobytes() == b"b.ffr"
            assert reader.read_one(-1).view(np.int32).tolist() == [0, 1, 2]


def test_legacy_header_needs_the_explicit_flag() -> None:
    with pytest.raises(packfs.FormatError, match="allow_legacy_header"):
        FileReader(VECTORS / "zero_meta_checksum.ffr")
    with FileReader(VECTORS / "zero_meta_checksum.ffr", allow_legacy_header=True) as reader:
        assert [hashlib.sha256(reader.read_one(i).tobytes()).hexdigest() for i in range(reader.n)] == \
            [r["sha256"] for r in _records()]


def test_damaged_vectors_give_packfs_errors() -> None:
    with pytest.raises(packfs.ChecksumError):
        FileReader(VECTORS / "corrupt_header.ffr")
    with FileReader(VECTORS / "corrupt_payload.ffr") as reader:
        assert reader.read_one(1).tobytes() == b"a"
        with pytest.raises(packfs.ChecksumError):
            reader.read_one(2)
        with pytest.raises(packfs.ChecksumError):
            reader.read(list(range(5)))
    with FileReader(VECTORS / "truncated.ffr") as reader, pytest.raises(packfs.ChecksumError):
        reader.read_one(4)


def test_packed_folder_and_pack_folder(tmp_path: Path) -> None:
    with PackedFolder(VECTORS / "packed_folder.ffr") as folder:
        data = folder.read_one("sub/003.txt")
        assert data.dtype == np.uint8 and data.tobytes() == folder.read(["sub/003.txt"])[0].tobytes()
        assert folder.num_files() == 9
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "x.bin").write_bytes(b"xyz")
    pack_folder(src, tmp_path / "p.ffr")
    with PackedFolder(tmp_path / "p.ffr") as folder:
        assert folder.read_one("d/x.bin").tobytes() == b"xyz" and folder.list() == ["d"]
    with FileReader(tmp_path / "p.ffr") as reader:  # FFRecord's FileReader reads the records
        assert reader.read_one(0).tobytes() == b"xyz"


def test_offsets_and_checksums_as_ffrecord_reports_them() -> None:
    view = json.loads((VECTORS / "records.json").read_text())["ffrecord_reader_view"]
    with FileReader(VECTORS / "records.ffr") as reader:
        assert reader.get_offsets(0).tolist() == view["get_offsets(0)"]
        assert reader.get_checksums(0).tolist() == view["get_checksums(0)"]
        assert str(reader.read_one(0).dtype) == view["read_one_dtype"]


def test_info_names_a_legacy_archive() -> None:
    from tests.conftest import packfs_cli

    result = packfs_cli("info", VECTORS / "packed_folder.ffr")
    assert result.returncode == 0 and "FFRecord pack_folder (legacy" in result.stdout
