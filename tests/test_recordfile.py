"""FFRecord record files (containers of records without a path table) are recognised,
described and checked, by the Python API and the CLI, over FFRecord's own vectors."""

from __future__ import annotations

import json
import re
import shutil
import zlib
from pathlib import Path

import pytest

from packfs import ffrecord
from packfs import (ChecksumError, FormatError, PackedFolder, RecordFileError, RecordReader, convert,
                    record_file_info, verify_record_file)
from packfs.cli import main
from packfs.core import Archive, Container
from tests.conftest import REPO, VECTORS, cli_runner, write_records

RECORD_FILES = ["records.ffr", "corrupt_payload.ffr", "truncated.ffr", "zero_meta_checksum.ffr", "empty.ffr"]


def _cli(*args: object):
    return cli_runner().invoke(main, [str(a) for a in args])


def _one_line_error(result, *fragments: str) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# -- the Python API ----------------------------------------------------------------------


@pytest.mark.parametrize("name", RECORD_FILES)
@pytest.mark.parametrize("checksums", ["always", "never"])
def test_archive_says_it_is_a_record_file(name: str, checksums: str) -> None:
    expected = json.loads((VECTORS / "records.json").read_text())["header"]["n"] if name != "empty.ffr" else 0
    with pytest.raises(RecordFileError) as raised:
        Archive(VECTORS / name, checksums=checksums)
    error = raised.value
    assert isinstance(error, FormatError) and isinstance(error, ValueError)
    assert error.record_count == expected and error.path.endswith(name)
    message = str(error)
    assert f"FFRecord record file of {expected} records without a path table" in message
    assert "packfs.RecordReader" in message and "not a packfs archive" in message
    legacy = name == "zero_meta_checksum.ffr"
    assert ("legacy marker" in message and "allow_legacy_header=True" in message) == legacy


def test_packed_folder_and_the_ffrecord_api_say_it_too() -> None:
    with pytest.raises(RecordFileError, match="FFRecord record file of 5 records"):
        PackedFolder(VECTORS / "records.ffr")
    with pytest.raises(RecordFileError, match="FFRecord record file of 5 records"):
        ffrecord.PackedFolder(str(VECTORS / "records.ffr"))


def test_the_records_it_points_to_read_as_they_are() -> None:
    with RecordReader(VECTORS / "records.ffr") as reader:
        assert [len(r) for r in reader] == [0, 1, 11, 1000, 70000]
    with RecordReader(VECTORS / "zero_meta_checksum.ffr", allow_legacy_header=True) as reader:
        assert len(reader[4]) == 70000


def test_record_file_info_matches_the_vector() -> None:
    described = json.loads((VECTORS / "records.json").read_text())
    lengths = [record["length"] for record in described["records"]]
    info = record_file_info(VECTORS / "records.ffr")
    assert info == {
        "path": str(VECTORS / "records.ffr"),
        "kind": "FFRecord record file",
        "records": described["header"]["n"],
        "record_bytes": sum(lengths),
        "smallest_record": min(lengths),
        "largest_record": max(lengths),
        "archive_bytes": described["file"]["size"],
        "header_checksum": described["header"]["checksum_meta_hex"],
        "read_with": "packfs.RecordReader or packfs.ffrecord.FileReader",
    }
    legacy = record_file_info(VECTORS / "zero_meta_checksum.ffr")
    assert legacy["header_checksum"].startswith("0 (") and "allow_legacy_header=True" in legacy["read_with"]
    assert record_file_info(VECTORS / "empty.ffr")["records"] == 0


def test_verify_record_file_over_the_vectors() -> None:
    sound = verify_record_file(VECTORS / "records.ffr")
    # Every byte of the file, its header too (what --progress counts up to: 100%)
    assert sound.ok and sound.records_checked == 5 and sound.bytes_checked == 71084 == (VECTORS / "records.ffr").stat().st_size
    assert verify_record_file(VECTORS / "empty.ffr").ok

    payload = verify_record_file(VECTORS / "corrupt_payload.ffr")
    assert not payload.ok and payload.bad_records == (2,) and payload.problems == ("record 2 fails its checksum",)

    truncated = verify_record_file(VECTORS / "truncated.ffr")
    assert truncated.bad_records == (4,)
    assert "the last record" in truncated.problems[0] and "truncated or extended" in truncated.problems[0]

    # FFRecord's legacy marker: every record is sound, the header cannot be checked.
    legacy = verify_record_file(VECTORS / "zero_meta_checksum.ffr")
    assert not legacy.ok and legacy.bad_records == ()
    assert len(legacy.problems) == 1 and "checksum is 0" in legacy.problems[0]

    with pytest.raises(ChecksumError, match="header checksum mismatch.*damaged"):
        verify_record_file(VECTORS / "corrupt_header.ffr")


def test_verify_record_file_reports_progress() -> None:
    seen: list[int] = []
    verify_record_file(VECTORS / "records.ffr", seen.append)
    assert sum(seen) == 71084 == (VECTORS / "records.ffr").stat().st_size  # the header too: 100%


def test_an_aborted_ffrecord_write(tmp_path: Path) -> None:
    # What FFRecord's writer leaves when fewer records than declared were written: the
    # header stays zeros (0 records, checksum 0), the records' bytes follow unindexed.
    aborted = tmp_path / "aborted.ffr"
    aborted.write_bytes(bytes(12 + 12 * 3) + b"payload" * 10)
    with pytest.raises(RecordFileError, match="aborted FFRecord write") as raised:
        PackedFolder(aborted)
    assert "write the file again" in str(raised.value)
    report = verify_record_file(aborted)
    assert not report.ok and any("belong to no record" in p and "aborted" in p for p in report.problems)
    assert record_file_info(aborted)["kind"] == "aborted FFRecord write"


def test_convert_refuses_a_record_file_and_says_what_to_use(tmp_path: Path) -> None:
    out = tmp_path / "out.ffr"
    with pytest.raises(RecordFileError) as raised:
        convert(VECTORS / "records.ffr", out)
    message = str(raised.value)
    assert "nothing to convert" in message and "packfs.RecordReader" in message and "pack_entries" in message
    assert not out.exists()


def test_what_convert_suggests_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The recipe in docs/ffrecord.md, as written: each record becomes a file named by its index.
    page = (REPO / "docs" / "ffrecord.md").read_text()
    recipe = re.search(r"<!-- recipe: records-as-files -->\n```python\n(.*?)```", page, re.DOTALL)
    assert recipe, "docs/ffrecord.md has no recipe records-as-files"
    shutil.copy(VECTORS / "records.ffr", tmp_path / "records.ffr")
    monkeypatch.chdir(tmp_path)
    exec(compile(recipe.group(1), "docs/ffrecord.md", "exec"), {})
    with PackedFolder(tmp_path / "as_files.ffr") as folder, RecordReader(VECTORS / "records.ffr") as reader:
        assert [folder.read(f"{index}.bin") for index in range(len(reader))] == reader[:]
        assert len(folder.list("")) == len(reader)


# -- what is and is not a record file ----------------------------------------------------


@pytest.mark.parametrize("cut", [1, 7, 57, 63, 64])
def test_a_packfs_archive_cut_in_its_footer_is_not_called_a_record_file(archive: Path, tmp_path: Path,
                                                                         cut: int) -> None:
    bad = tmp_path / "cut.ffr"
    bad.write_bytes(archive.read_bytes()[:-cut])
    with pytest.raises(FormatError) as raised:
        Archive(bad)
    assert not isinstance(raised.value, RecordFileError), raised.value


def test_an_extended_packfs_archive_is_not_called_a_record_file(archive: Path, tmp_path: Path) -> None:
    bad = tmp_path / "long.ffr"
    bad.write_bytes(archive.read_bytes() + b"\0" * 100)
    with pytest.raises(FormatError, match="truncated or extended") as raised:
        Archive(bad)
    assert not isinstance(raised.value, RecordFileError)


def test_a_packfs_archive_with_a_damaged_footer_is_not_called_a_record_file(archive: Path, tmp_path: Path) -> None:
    data = bytearray(archive.read_bytes())
    data[-64] ^= 0xFF  # the footer's magic
    bad = tmp_path / "footer.ffr"
    bad.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match="footer: checksum mismatch"):
        Archive(bad)


def test_a_packfs_archive_with_a_legacy_header_is_refused_as_before(archive: Path, tmp_path: Path) -> None:
    bad = tmp_path / "zeroed.ffr"
    bad.write_bytes(bytes(4) + archive.read_bytes()[4:])
    with pytest.raises(FormatError, match="metadata checksum is 0") as raised:
        Archive(bad)
    assert not isinstance(raised.value, RecordFileError)


@pytest.mark.parametrize("last", [b"", b"\x93", b"\x93PACK", b"PACKFS", b"x" * 64])
def test_record_files_whose_last_record_looks_like_part_of_a_footer(tmp_path: Path, last: bytes) -> None:
    # An empty last record, or one that is a prefix of the footer's magic, with its CRC
    # sound, is a record, not a footer cut short.
    path = write_records(tmp_path / "r.ffr", [b"first", last])
    with pytest.raises(RecordFileError, match="of 2 records"):
        Archive(path)
    assert verify_record_file(path).ok


def test_the_last_record_is_not_read_whole_to_tell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_records(tmp_path / "big.ffr", [b"a", bytes(8 << 20)])
    spans: list[int] = []
    pread = Container.pread

    def recording(self: Container, start: int, end: int, limit: int | None = None) -> bytes:
        spans.append(end - start)
        return pread(self, start, end, limit)

    monkeypatch.setattr(Container, "pread", recording)
    with pytest.raises(RecordFileError):
        Archive(path)
    assert spans and max(spans) <= 16


def test_a_record_file_cut_before_its_last_record_is_truncated(tmp_path: Path) -> None:
    path = write_records(tmp_path / "r.ffr", [b"first", b"second record"])
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(FormatError, match="truncated") as raised:
        Archive(path)
    assert not isinstance(raised.value, RecordFileError)


def test_bytes_between_the_header_and_record_0_are_reported(tmp_path: Path) -> None:
    records = [b"abc", b"defg"]
    header_end = 12 + 12 * len(records)
    gap = 5
    offsets = [header_end + gap, header_end + gap + 3]
    body = (len(records).to_bytes(8, "little") + b"".join(zlib.crc32(r).to_bytes(4, "little") for r in records)
            + b"".join(o.to_bytes(8, "little") for o in offsets))
    path = tmp_path / "gap.ffr"
    path.write_bytes(zlib.crc32(body).to_bytes(4, "little") + body + b"\0" * gap + b"".join(records))
    report = verify_record_file(path)
    assert report.bad_records == () and report.problems == ("5 bytes between the header and record 0 belong to no record",)


# -- the command line ----------------------------------------------------------------------


def test_cli_info_describes_a_record_file() -> None:
    result = _cli("info", VECTORS / "records.ffr")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "kind            FFRecord record file" in lines
    assert "records         5" in lines
    assert "largest record  68.4 KiB (70000 bytes)" in lines
    assert "read with       packfs.RecordReader or packfs.ffrecord.FileReader" in lines
    assert "no path table" in lines[-1]
    as_json = json.loads(_cli("info", "--json", VECTORS / "records.ffr").stdout)
    assert as_json["records"] == 5 and as_json["kind"] == "FFRecord record file"
    legacy = _cli("info", VECTORS / "zero_meta_checksum.ffr")
    assert legacy.exit_code == 0 and "legacy marker" in legacy.stdout


def test_cli_verify_sound_record_files() -> None:
    result = _cli("verify", VECTORS / "records.ffr")
    assert result.exit_code == 0, result.output
    assert result.stdout == "OK: an FFRecord record file of 5 records (no path table), 69.4 KiB checked\n"
    assert _cli("verify", VECTORS / "empty.ffr").exit_code == 0


@pytest.mark.parametrize("name, damage", [
    ("corrupt_payload.ffr", "damaged: record 2 fails its checksum"),
    ("truncated.ffr", "damaged: record 4 fails its checksum (the last record"),
    ("zero_meta_checksum.ffr", "damaged: header: its checksum is 0, FFRecord's legacy marker"),
])
def test_cli_verify_damaged_record_files(name: str, damage: str) -> None:
    result = _cli("verify", VECTORS / name)
    assert result.exit_code == 1
    assert result.stdout.startswith(damage), result.stdout
    error = result.stderr.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"Error: {str(VECTORS / name)!r} is damaged: 1 problem")


def test_cli_verify_a_damaged_header() -> None:
    _one_line_error(_cli("verify", VECTORS / "corrupt_header.ffr"), "header checksum mismatch", "damaged")


@pytest.mark.parametrize("args", [("ls",), ("find",), ("cat", "x"), ("unpack", "{tmp}/dest")])
def test_cli_commands_of_files_say_what_it_is(args: tuple[str, ...], tmp_path: Path) -> None:
    command, *rest = args
    rest = [arg.format(tmp=tmp_path) for arg in rest]
    line = _one_line_error(_cli(command, VECTORS / "records.ffr", *rest),
                           "is an FFRecord record file of 5 records without a path table",
                           "packfs.RecordReader or packfs.ffrecord.FileReader")
    assert "64-byte footer" not in line
    assert not (tmp_path / "dest").exists()


def test_cli_mount_says_what_it_is(tmp_path: Path) -> None:
    (tmp_path / "mnt").mkdir()
    result = _cli("mount", VECTORS / "truncated.ffr", tmp_path / "mnt")
    if "FUSE is not available" in result.stderr:
        pytest.skip(result.stderr.strip())
    _one_line_error(result, "is an FFRecord record file of 5 records")


def test_cli_convert_refuses_and_says_what_to_use(tmp_path: Path) -> None:
    out = tmp_path / "out.ffr"
    _one_line_error(_cli("convert", VECTORS / "records.ffr", out), "nothing to convert", "packfs.RecordReader",
                    "packfs.pack_entries")
    assert not out.exists()
