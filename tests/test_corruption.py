"""Damage an archive every way we can think of; each read path reports it exactly."""

from __future__ import annotations

import contextlib
import re
import tempfile
from pathlib import Path

import pytest

import packfs
from packfs import ChecksumError, FormatError, PackedFolder, RecordReader, RecordWriter
from packfs.format import SECTIONS
from tests.conftest import BLUEPRINT, archive_layout, rewrite_section


def _flip(path: Path, offset: int, out: Path) -> Path:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    out.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize("offset", [0, 3, 4, 12, 40])
def test_header_damage_fails_at_open(archive: Path, tmp_path: Path, offset: int) -> None:
    bad = _flip(archive, offset, tmp_path / "bad.ffr")
    with pytest.raises(FormatError):  # ChecksumError, or the count no longer fits
        PackedFolder(bad)


def test_header_crc_damage_is_a_checksum_error(archive: Path, tmp_path: Path) -> None:
    n, offsets, _ = archive_layout(archive)
    bad = _flip(archive, 12 + 4 * n + 3, tmp_path / "bad.ffr")  # inside offsets[0]
    with pytest.raises(ChecksumError, match="header checksum mismatch"):
        PackedFolder(bad)


@pytest.mark.parametrize("section", range(len(SECTIONS)))
def test_table_damage_fails_at_open(archive: Path, tmp_path: Path, section: int) -> None:
    n, offsets, data_records = archive_layout(archive)
    record = data_records + 2 * section + 1
    bad = _flip(archive, offsets[record], tmp_path / "bad.ffr")
    with pytest.raises(ChecksumError, match=f"section '{SECTIONS[section][0]}'"):
        PackedFolder(bad)


def test_footer_damage_fails_at_open(archive: Path, tmp_path: Path) -> None:
    n, offsets, _ = archive_layout(archive)
    bad = _flip(archive, offsets[n - 1] + 20, tmp_path / "bad.ffr")
    with pytest.raises(ChecksumError, match="footer"):
        PackedFolder(bad)


def _damaged_file(archive: Path, tmp_path: Path, path: str) -> Path:
    folder = PackedFolder(archive)
    record = folder._table.record(folder._table.lookup(path.encode()))
    start, end = folder._container.record_span(record)
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

    with pytest.raises(FormatError, match="not a packfs archive"):
        PackedFolder(VECTORS / "records.ffr")
    with pytest.raises(FormatError, match="empty FFRecord container"):
        PackedFolder(VECTORS / "empty.ffr")


# -- structurally wrong tables with valid checksums ------------------------------------


def _entry(archive: Path, path: str) -> int:
    with PackedFolder(archive) as folder:
        return folder._table.lookup(path.encode())


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


# -- random damage: whatever happens, only PackfsError -----------------------------------


def _exercise(path: Path) -> None:
    """Every read path on a possibly damaged archive; anything but PackfsError fails."""
    for check_data in (True, False):
        try:
            folder = PackedFolder(path, check_data=check_data)
        except packfs.PackfsError:
            continue
        with folder:
            try:
                paths = folder.list(recursive=True)
            except packfs.PackfsError:
                paths = []
            for relative in paths:
                try:
                    # A damaged path index can make a listed name unfindable: that
                    # must be a PackfsError too (verify reports it).
                    folder.stat(relative)
                    folder.exists(relative)
                    if folder.is_file(relative):
                        folder.read(relative)
                        with folder.open(relative) as f:
                            f.read()
                    elif folder.is_symlink(relative):
                        folder.readlink(relative)
                except packfs.PackfsError:
                    pass
            folder.verify()
            with contextlib.suppress(packfs.PackfsError):
                list(folder.walk())
            with tempfile.TemporaryDirectory() as dest, contextlib.suppress(packfs.PackfsError):
                packfs.unpack(folder, Path(dest) / "out")


@pytest.mark.parametrize("seed", range(60))
def test_random_damage_only_ever_raises_packfs_errors(archive: Path, tmp_path: Path, seed: int) -> None:
    import random

    rng = random.Random(seed)
    original = archive.read_bytes()
    for case in range(5):
        data = bytearray(original)
        kind = rng.choice(["flip", "flips", "truncate", "extend", "zero", "garbage"])
        if kind == "flip":
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == "flips":
            for _ in range(rng.randint(2, 20)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == "truncate":
            del data[rng.randrange(len(data)):]
        elif kind == "extend":
            data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 100)))
        elif kind == "zero":
            start = rng.randrange(len(data))
            data[start : start + rng.randint(1, 4096)] = bytes(min(4096, len(data) - start))
        else:
            start = rng.randrange(len(data))
            data[start : start + 64] = bytes(rng.randrange(256) for _ in range(len(data[start : start + 64])))
        damaged = tmp_path / f"damaged-{case}.ffr"
        damaged.write_bytes(bytes(data))
        _exercise(damaged)


@pytest.mark.parametrize("seed", range(40))
def test_random_table_damage_with_valid_checksums(archive: Path, tmp_path: Path, seed: int) -> None:
    """Hostile tables that pass every CRC must still end in PackfsError, never a crash."""
    import random

    rng = random.Random(1000 + seed)
    n, _, data_records = archive_layout(archive)
    reader = RecordReader(archive)
    records = [reader.read_one(i) for i in range(n)]
    reader.close()
    for case in range(4):
        damaged_records = list(records)
        for _ in range(rng.randint(1, 4)):
            index = rng.choice([data_records + 2 * k + 1 for k in range(len(SECTIONS))] + [n - 1])
            raw = bytearray(damaged_records[index])
            if raw:
                position = rng.randrange(len(raw))
                raw[position] = rng.choice([0, 1, 0xFF, raw[position] ^ (1 << rng.randrange(8)), rng.randrange(256)])
            damaged_records[index] = bytes(raw)
        damaged = tmp_path / f"hostile-{case}.ffr"
        with RecordWriter(damaged, n) as writer:
            for record in damaged_records:
                writer.write_one(record)
        _exercise(damaged)
