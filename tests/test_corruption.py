"""Damage an archive every way we can think of; each read path reports it exactly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import packfs
from packfs import ChecksumError, FormatError, PackedFolder, RecordFileError
from packfs.format import SECTIONS
from tests.conftest import BLUEPRINT, archive_layout, as_version_1_1, read_records, rewrite_section, write_records


def _flip(path: Path, offset: int, out: Path) -> Path:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    out.write_bytes(bytes(data))
    return out


@pytest.fixture
def archive_1_1(archive: Path, tmp_path: Path) -> Path:
    """The blueprint's archive as 1.1 wrote it: no tail, so the header and the table are
    checked whole at open."""
    return as_version_1_1(archive, tmp_path / "v11.ffr")


def _use_all_of(folder: PackedFolder) -> None:
    """Every kind of access: walk, stat and read every entry (every section is used)."""
    for path, contents in BLUEPRINT.items():
        folder.stat(path)
        if contents is not None:
            assert folder.read(path) == contents
    list(folder.walk(""))


@pytest.mark.parametrize("offset", [0, 3, 4, 12, 40])
def test_header_damage_fails_at_open_without_a_tail(archive_1_1: Path, tmp_path: Path, offset: int) -> None:
    bad = _flip(archive_1_1, offset, tmp_path / "bad.ffr")
    with pytest.raises(FormatError):  # ChecksumError, or the count no longer fits
        PackedFolder(bad)


@pytest.mark.parametrize("offset", [4, 12, 40])
def test_header_damage_in_a_1_4_archive_fails_where_used_and_in_verify(archive: Path, tmp_path: Path,
                                                                        offset: int) -> None:
    # The tail's page CRCs cover the header's entries of the data records; the record
    # count must agree with the tail's (format section 4e).
    bad = _flip(archive, offset, tmp_path / "bad.ffr")
    if offset == 4:
        with pytest.raises(FormatError, match="records"):
            PackedFolder(bad)
        return
    with PackedFolder(bad) as folder:  # O(1): nothing of the header is checked yet
        with pytest.raises(ChecksumError, match="the header's record CRCs is damaged"):
            _use_all_of(folder)
        assert not folder.verify().ok


def test_a_damaged_header_checksum_is_found_by_verify(archive: Path, tmp_path: Path) -> None:
    # A 1.4 reader never needs checksum_meta (FFRecord's readers do): verify reports it.
    bad = _flip(archive, 0, tmp_path / "bad.ffr")
    with PackedFolder(bad) as folder:
        _use_all_of(folder)
        assert "header checksum mismatch" in folder.verify().problems


def test_header_crc_damage_is_a_checksum_error(archive: Path, archive_1_1: Path, tmp_path: Path) -> None:
    n, offsets, _ = archive_layout(archive_1_1)
    bad = _flip(archive_1_1, 12 + 4 * n + 3, tmp_path / "bad.ffr")  # inside offsets[0]
    with pytest.raises(ChecksumError, match="header checksum mismatch"):
        PackedFolder(bad)
    n, offsets, _ = archive_layout(archive)
    bad = _flip(archive, 12 + 4 * n + 3, tmp_path / "bad14.ffr")
    with PackedFolder(bad) as folder, pytest.raises(ChecksumError, match="the header's record offsets is damaged"):
        _use_all_of(folder)


@pytest.mark.parametrize("section", range(len(SECTIONS)))
def test_table_damage_fails_at_open_without_a_tail(archive_1_1: Path, tmp_path: Path, section: int) -> None:
    n, offsets, data_records = archive_layout(archive_1_1)
    record = data_records + 2 * section + 1
    bad = _flip(archive_1_1, offsets[record], tmp_path / "bad.ffr")
    with pytest.raises(ChecksumError, match=f"section '{SECTIONS[section][0]}'"):
        PackedFolder(bad)


@pytest.mark.parametrize("section", range(len(SECTIONS)))
def test_table_damage_in_a_1_4_archive_fails_where_used(archive: Path, tmp_path: Path, section: int) -> None:
    n, offsets, data_records = archive_layout(archive)
    record = data_records + 2 * section + 1
    bad = _flip(archive, offsets[record], tmp_path / "bad.ffr")
    with PackedFolder(bad) as folder:  # opening checks no table bytes (format 1.4)
        with pytest.raises(ChecksumError, match=f"section '{SECTIONS[section][0]}' is damaged"):
            _use_all_of(folder)
        assert not folder.verify().ok


def test_footer_damage_fails_at_open(archive: Path, tmp_path: Path) -> None:
    n, offsets, _ = archive_layout(archive)
    bad = _flip(archive, offsets[n - 1] + 20, tmp_path / "bad.ffr")
    with pytest.raises(ChecksumError, match="footer"):
        PackedFolder(bad)


def _damaged_file(archive: Path, tmp_path: Path, path: str) -> Path:
    folder = PackedFolder(archive)
    start, end = folder.archive.extent(folder.archive.find(path.encode()))
    folder.close()
    return _flip(archive, start + (end - start) // 2, tmp_path / "bad.ffr")


@pytest.mark.parametrize("path", ["hello.txt", "big/large.bin"])
def test_file_damage_is_caught_by_every_read_path(archive: Path, tmp_path: Path, path: str) -> None:
    bad = _damaged_file(archive, tmp_path, path)
    with PackedFolder(bad) as folder:
        message = f"'{path}': checksum mismatch"
        with pytest.raises(ChecksumError, match=message):
            folder.read_one(path)
        with pytest.raises(ChecksumError, match=message):
            folder.read([path])
        with pytest.raises(ChecksumError, match=message):
            folder.read_view(path)
        with pytest.raises(ChecksumError, match=message):
            folder.open(path)
        # Everything else still reads.
        for other, contents in BLUEPRINT.items():
            if contents is not None and other != path and not (path == "hello.txt" and other == "hardlink.txt"):
                assert folder.read(other) == contents
        report = folder.verify()
        assert not report.ok
        assert path in report.bad_paths
        if path == "hello.txt":
            assert "hardlink.txt" in report.bad_paths  # same record
        with pytest.raises(ChecksumError):
            packfs.unpack(folder, tmp_path / "out")
    # Unchecked reads return the damaged bytes, as FFRecord does.
    with PackedFolder(bad, check_data=False) as folder:
        assert folder.read(path) != BLUEPRINT[path]
        assert not folder.verify().ok  # verify checks regardless


def test_damaged_file_is_not_left_behind_by_unpack(archive: Path, tmp_path: Path) -> None:
    bad = _damaged_file(archive, tmp_path, "big/large.bin")
    with PackedFolder(bad) as folder, pytest.raises(ChecksumError):
        packfs.unpack(folder, tmp_path / "out", ["big/large.bin"])
    assert not (tmp_path / "out" / "big" / "large.bin").exists()


@pytest.mark.parametrize("keep", [0, 11, 12, 100, 1000, -65, -64, -63, -1])
@pytest.mark.parametrize("check_data", [True, False])
def test_truncation_fails_at_open(archive: Path, tmp_path: Path, keep: int, check_data: bool) -> None:
    data = archive.read_bytes()
    bad = tmp_path / "cut.ffr"
    bad.write_bytes(data[:keep] if keep >= 0 else data[: len(data) + keep])
    with pytest.raises(FormatError):
        PackedFolder(bad, check_data=check_data)


def test_extension_fails_at_open(archive: Path, tmp_path: Path) -> None:
    bad = tmp_path / "long.ffr"
    bad.write_bytes(archive.read_bytes() + b"\0")
    with pytest.raises(FormatError, match="truncated or extended"):
        PackedFolder(bad)


def test_plain_container_is_not_a_packed_folder(tmp_path: Path) -> None:
    from tests.conftest import VECTORS

    with pytest.raises(RecordFileError, match="not a packfs archive") as raised:
        PackedFolder(VECTORS / "records.ffr")
    assert raised.value.record_count == 5
    with pytest.raises(RecordFileError, match="FFRecord record file of 0 records"):
        PackedFolder(VECTORS / "empty.ffr")


# -- structurally wrong tables with valid checksums ------------------------------------


def _entry(archive: Path, path: str) -> int:
    with PackedFolder(archive) as folder:
        return folder.archive.find(path.encode())


@pytest.mark.parametrize(
    "section, mutate, message",
    [
        ("parent", lambda a: a.__setitem__(3, 3), "parent does not come before it"),
        ("parent", lambda a: a.__setitem__(len(a) - 1, 1), "outside its parent's child range|parent is not a directory"),
        ("mode", lambda a: a.__setitem__(0, 0o100644), "root directory"),
        ("mode", lambda a: a.__setitem__(2, 0o060644), "file type"),
        ("child_count", lambda a: a.__setitem__(0, a[0] + 1), "outside its parent's child range|children for"),
        ("child_start", lambda a: a.__setitem__(0, 0), "child range"),
        ("record", lambda a: a.__setitem__(len(a) - 1, 10**6), "outside the"),
        ("size", lambda a: a.__setitem__(len(a) - 1, a[-1] + 1), "size differs"),
        ("names", lambda a: a.__setitem__(0, ord("/")), "'/' or a NUL"),
        ("names", lambda a: a.__setitem__(0, 0), "'/' or a NUL"),
        ("name_end", lambda a: a.__setitem__(1, 0), "empty name"),
        # Slot 0 holds the root (CRC-32 of b"" is 0), which lookups never consult.
        ("path_entry", lambda a: a.__setitem__(1, 10**6), "path index names an entry"),
        ("path_hash", lambda a: a.__setitem__(0, 2**32 - 1), "not sorted"),
    ],
)
def test_inconsistent_tables_are_refused_where_used_and_by_verify(
    archive: Path, tmp_path: Path, section: str, mutate, message: str
) -> None:
    """Open checks the table in O(1); each rule is checked where a value is used (so
    using the broken part raises FormatError) and all of them by verify."""
    bad = rewrite_section(archive, tmp_path / "bad.ffr", section, mutate)
    for check_data in (True, False):
        try:
            folder = PackedFolder(bad, check_data=check_data)
        except FormatError as error:  # the root's own entry is checked at open
            assert re.search(message, str(error)), error
            continue
        with folder:
            report = folder.verify()
            assert not report.ok and any(re.search(message, problem) for problem in report.problems), report
            if section == "path_hash":
                # An unsorted hash index only hides paths from the hash lookup; the
                # slow path then finds each one by name, one directory at a time, so
                # reads still give the right bytes (a verify-only rule, format 5).
                _use_everything(folder, tmp_path / f"unpacked-{check_data}")
                continue
            with pytest.raises(packfs.PackfsError):
                _use_everything(folder, tmp_path / f"unpacked-{check_data}")


def _use_everything(folder: PackedFolder, dest: Path) -> None:
    """Every path through the reader, raising the first error."""
    for relative in folder.list(recursive=True):
        folder.stat(relative)
        if folder.is_file(relative):
            folder.read(relative)
        elif folder.is_symlink(relative):
            folder.readlink(relative)
    list(folder.walk())
    packfs.unpack(folder, dest)


def test_dot_names_are_refused(tmp_path: Path) -> None:
    packfs.pack_entries([packfs.Entry("ab", b"x")], tmp_path / "a.ffr")
    bad = rewrite_section(tmp_path / "a.ffr", tmp_path / "dots.ffr", "names",
                   lambda a: a.__setitem__(slice(0, 2), ord(".")))
    with PackedFolder(bad) as folder:
        with pytest.raises(FormatError, match="'.' or '..'"):
            folder.list()
        with pytest.raises(FormatError, match="'.' or '..'"):
            list(folder.walk())
        assert any("'.' or '..'" in problem for problem in folder.verify().problems)


# Random damage of every kind, hostile tables included, is tests/fuzz.py's job
# (tests/test_fuzz.py runs it briefly, `make fuzz` at length).


# -- the archive changing under an open reader -----------------------------------------

_SHRINK_SCRIPT = """
import os, sys, packfs
path, keep = sys.argv[1], int(sys.argv[2])
folder = packfs.PackedFolder(path)
f = folder.open("big/large.bin")
os.truncate(path, keep)
failures = []
for name, call in [("read", lambda: folder.read("hello.txt")), ("stat", lambda: folder.stat("a")),
                   ("list", lambda: folder.list("", recursive=True)), ("walk", lambda: list(folder.walk())),
                   ("exists", lambda: folder.exists("a/b")), ("open", lambda: folder.open("hello.txt")),
                   ("file read", lambda: f.read()), ("readlink", lambda: folder.readlink("link-to-hello"))]:
    try:
        call()
        failures.append(name + " did not raise")
    except packfs.FormatError as error:
        assert "changed while open" in str(error), error
print("survived", failures)
"""


@pytest.mark.parametrize("keep", ["zero", "half", "table"])
def test_an_archive_truncated_under_an_open_folder_is_an_error_not_sigbus(
    archive: Path, tmp_path: Path, keep: str
) -> None:
    """The map would SIGBUS (and kill the process) on pages past the new end; every
    reader path checks the size first.  Run in a child, so a SIGBUS fails the test
    instead of killing the test run."""
    import subprocess
    import sys

    copy = tmp_path / "copy.ffr"
    copy.write_bytes(archive.read_bytes())
    size = copy.stat().st_size
    length = {"zero": 0, "half": size // 2, "table": size - 100}[keep]
    result = subprocess.run([sys.executable, "-c", _SHRINK_SCRIPT, str(copy), str(length)],
                            capture_output=True, text=True)
    assert result.returncode == 0, (result.returncode, result.stderr)
    assert result.stdout.strip() == "survived []", result.stdout


@pytest.mark.parametrize("field, value, message", [
    (16, 2**60, "section 'parent' is"),  # entry_count: sections would need exabytes
    (24, 2**60, "data records"),  # data_records
    (32, 2**31, "records, but the footer"),  # section_count
])
def test_absurd_footer_counts_with_valid_checksums_are_refused_at_open(
    archive: Path, tmp_path: Path, field: int, value: int, message: str
) -> None:
    import struct

    records = read_records(archive)
    footer = bytearray(records[-1])
    struct.pack_into("<Q" if field != 32 else "<I", footer, field, value)
    records[-1] = bytes(footer)
    bad = write_records(tmp_path / "absurd.ffr", records)
    with pytest.raises(FormatError, match=message):
        PackedFolder(bad)


def test_a_symlink_target_with_a_nul_byte_is_refused_everywhere(tmp_path: Path) -> None:
    """Found by the fuzzer: a target no symlink can hold (valid CRCs) reached os.symlink
    as a ValueError.  Every reader now refuses it with a FormatError (EIO when mounted)."""
    import errno

    from packfs.fuse import PackfsOperations

    packfs.pack_entries([packfs.Entry("l", kind="symlink", target="aXb"), packfs.Entry("f", b"data")],
                        tmp_path / "ok.ffr")
    records = read_records(tmp_path / "ok.ffr")
    records[records.index(b"aXb")] = b"a\0b"
    bad = write_records(tmp_path / "bad.ffr", records)
    for check_data in (True, False):
        with PackedFolder(bad, check_data=check_data) as folder:
            with pytest.raises(FormatError, match="NUL"):
                folder.readlink("l")
            with pytest.raises(FormatError, match="NUL"):
                folder.read("l/x")
            with pytest.raises(FormatError, match="NUL"):
                packfs.unpack(folder, tmp_path / f"out-{check_data}")
            with pytest.raises(OSError) as caught:
                PackfsOperations(folder, check_data=check_data).readlink("/l")
            assert caught.value.errno == errno.EIO
            assert any("NUL" in problem or "\\x00" in problem for problem in folder.verify().problems)


def test_an_archive_overwritten_in_place_or_deleted_while_open(archive: Path, tmp_path: Path) -> None:
    """Overwritten with other bytes of the same size: the map shows them at once, and
    every read ends in a PackfsError (CRCs and the checks where values are used).
    Deleted: the open file lives on, and reads go on working."""
    copy = tmp_path / "copy.ffr"
    copy.write_bytes(archive.read_bytes())
    with PackedFolder(copy) as folder:
        assert folder.read("hello.txt") == b"hello world\n"
        with open(copy, "r+b") as f:
            f.write(bytes(copy.stat().st_size))  # zeros over everything, same size
        for call in (lambda: folder.read("hello.txt"), lambda: folder.read("a/b/c/deep.bin"),
                     lambda: folder.list("", recursive=True), lambda: folder.stat("hello.txt")):
            with pytest.raises(packfs.PackfsError):
                call()
        assert not folder.verify().ok
    copy.write_bytes(archive.read_bytes())
    with PackedFolder(copy) as folder:
        copy.unlink()
        assert folder.read("a/b/c/deep.bin") == BLUEPRINT["a/b/c/deep.bin"]
        assert folder.verify().ok
