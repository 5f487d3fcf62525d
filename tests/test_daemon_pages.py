"""Format 1.4 through the compiled daemon: nothing checks the header or the table at
open, so the daemon checks each page of them against the tail's CRCs at the first use
of a value in it.  A damaged page is EIO for what uses it (logged once, with its region
and bytes), the rest serves; the Python daemon answers EIO too.

The damaged archives here pass every check an archive before 1.4 had: the byte is
changed, then the CRC of the record holding it and the header's checksum_meta are
computed again; only the tail's page CRC is left as it was."""

from __future__ import annotations

import errno
import os
import struct
import zlib
from pathlib import Path

import pytest

import packfs
from packfs.core import Archive
from tests.conftest import assert_same_tree, bytes_read_by_this_thread, mounted, require_fuse
from tests.test_inodedaemon import _compiled

pytestmark = pytest.mark.fuse

ENTRIES = 40_000  # four pages of a 4-byte column at the smallest page size (64 KiB)
DIRECTORIES = 40


def _name(i: int) -> str:
    return f"d{i % DIRECTORIES:02d}/f{i:05d}"


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pages") / "many.ffr"
    packfs.pack_entries((packfs.Entry(_name(i), f"{i}\n".encode()) for i in range(ENTRIES)), out)
    return out


def resealed_damage(archive: Path, out: Path, at: int, mask: int = 0x01) -> Path:
    """A copy of ``archive`` with byte ``at`` XORed with ``mask``, and the CRC of the
    record holding it (if any) and checksum_meta computed again: sound by every check
    but the tail's page CRC of that byte."""
    data = bytearray(archive.read_bytes())
    data[at] ^= mask
    n = struct.unpack_from("<q", data, 4)[0]
    offsets = struct.unpack_from(f"<{n}q", data, 12 + 4 * n)
    header_end = 12 + 12 * n
    if at >= header_end:
        record = max(i for i in range(n) if offsets[i] <= at)
        end = offsets[record + 1] if record + 1 < n else len(data)
        struct.pack_into("<I", data, 12 + 4 * record, zlib.crc32(data[offsets[record]:end]))
    struct.pack_into("<I", data, 0, zlib.crc32(data[4:header_end]))
    out.write_bytes(bytes(data))
    return out


def _contents(name: str) -> bytes:
    return f"{int(name.split('/f')[1])}\n".encode()


def _spans(archive: Path) -> tuple[int, list[tuple[int, int]]]:
    with Archive(archive) as opened:
        page_size, regions, _, _ = opened.page_checks
        return page_size, list(regions)


def _names_with_entries(archive: Path) -> dict[int, str]:
    with Archive(archive) as opened:
        return {opened.find(_name(i).encode()): _name(i) for i in range(ENTRIES)}


def test_a_sound_archive_serves_everything_with_checks_on(tmp_path: Path, tree: Path, archive: Path) -> None:
    require_fuse("lowlevel")
    with Archive(archive) as opened:
        assert opened.version == "1.4" and opened.page_checks is not None
    with mounted(archive, tmp_path / "mnt", "--binding", "lowlevel") as mnt:
        assert_same_tree(tree, mnt)


def test_page_checks_are_none_before_1_4(tmp_path: Path, archive: Path) -> None:
    from tests.conftest import as_version_1_1

    with Archive(as_version_1_1(archive, tmp_path / "old.ffr")) as opened:
        assert opened.page_checks is None


def test_a_damaged_table_page_is_eio_for_its_entries_logged_once_and_the_rest_serves(tmp_path: Path,
                                                                                     many: Path) -> None:
    page_size, regions = _spans(many)
    mode_start, _ = regions[2 + 1]  # section 1, mode: 4 bytes per entry
    per_page = page_size // 4
    victim = per_page + 5  # an entry in the mode column's second page
    bad = resealed_damage(many, tmp_path / "bad.ffr", mode_start + 4 * victim)  # a permission bit
    entries = _names_with_entries(many)
    with Archive(bad, checksums="once") as opened, open(tmp_path / "log", "wb") as log:
        tree = _compiled()(opened, log.fileno())
        assert tree.getattr(victim + 1 - per_page)  # an earlier page serves
        for entry in (victim, per_page, 2 * per_page - 1):
            assert _errno(lambda: tree.getattr(entry + 1)) == errno.EIO
        read_before = bytes_read_by_this_thread()
        assert _errno(lambda: tree.getattr(victim + 2)) == errno.EIO  # at once: nothing read again
        assert bytes_read_by_this_thread() - read_before < 4096  # /proc's own line, no page
        sound = next(e for e in entries if e >= 2 * per_page)  # and a later one
        assert tree.read(sound + 1, 0, 100) == _contents(entries[sound])
    lines = (tmp_path / "log").read_text().splitlines()
    start = mode_start + page_size
    assert len(lines) == 1 and "section 'mode' is damaged" in lines[0] and f"[{start}, {start + page_size})" in lines[0]
    with Archive(bad, checksums="never") as opened:  # checks off: served as stored
        assert _compiled()(opened).getattr(victim + 1)["st_mode"] & 0o7777 != 0


def _errno(call) -> int:
    with pytest.raises(OSError) as caught:
        call()
    return caught.value.errno


def test_a_listing_over_a_damaged_page_is_eio(tmp_path: Path, many: Path) -> None:
    page_size, regions = _spans(many)
    uid_start, _ = regions[2 + 2]
    victim = page_size // 4 + 7
    bad = resealed_damage(many, tmp_path / "bad.ffr", uid_start + 4 * victim)
    with Archive(bad, checksums="once") as opened:
        tree = _compiled()(opened)
        parent = opened.parent(victim)
        assert _errno(lambda: tree.readdir(parent + 1, plus=True)) == errno.EIO
        # A plain listing (names, types, inodes) does not need the attributes: it lists.
        assert len(tree.readdir(parent + 1)) == len(opened.children(parent)) + 2
        # A directory whose children all lie elsewhere lists.
        others = [d for d in range(1, DIRECTORIES + 1) if d != parent]
        listed = 0
        for directory in others:
            children = opened.children(directory)
            if children.stop - 1 < page_size // 4 or children.start >= 2 * page_size // 4:
                listed += len(tree.readdir(directory + 1)) - 2
        assert listed


@pytest.mark.parametrize("binding", ["lowlevel", "mfusepy"])
def test_through_a_mount_a_damaged_table_page_is_eio(tmp_path: Path, many: Path, binding: str) -> None:
    require_fuse(binding)
    page_size, regions = _spans(many)
    size_start, _ = regions[2 + 5]  # section 5, size: 8 bytes per entry
    per_page = page_size // 8
    victim = per_page + 3
    bad = resealed_damage(many, tmp_path / "bad.ffr", size_start + 8 * victim + 6)  # a size of 2**48 and more
    entries = _names_with_entries(many)
    with mounted(bad, tmp_path / "mnt", "--binding", binding) as mnt:
        with pytest.raises(OSError) as caught:
            os.stat(mnt / entries[victim])
        assert caught.value.errno == errno.EIO
        if binding == "lowlevel":  # the Python daemon checks a section whole, at its first use
            sound = next(e for e in entries if e >= 2 * per_page)
            assert (mnt / entries[sound]).read_bytes() == _contents(entries[sound])
            assert os.stat(mnt / entries[next(e for e in entries if e < per_page)]).st_size > 0
    from packfs.fuse import state_file

    log = Path(state_file(str(tmp_path / "mnt"), ".log"))
    if log.exists():
        text = log.read_text()
        assert "section 'size'" in text and "damaged" in text, text


@pytest.mark.parametrize("region", ["crcs", "offsets"])
def test_a_damaged_header_page_is_eio_for_the_records_it_holds(tmp_path: Path, many: Path, region: str) -> None:
    page_size, regions = _spans(many)
    with Archive(many) as opened:
        n = opened.record_count
        per_page = page_size // (4 if region == "crcs" else 8)
        damaged_record = per_page + 1
        at = 12 + 4 * damaged_record if region == "crcs" else 12 + 4 * n + 8 * damaged_record
        # Files whose record's CRC (offset) lies on the same page, and one that does not.
        by_record = {opened.column("record")[e].item(): e for e in range(opened.entry_count)
                     if opened.file_type(e) == 0o100000}
    bad = resealed_damage(many, tmp_path / "bad.ffr", at, mask=0x10)
    neighbour = by_record[damaged_record + 5]  # same page, its own value intact
    elsewhere = by_record[2 * per_page + 5]
    with Archive(bad, checksums="once") as opened, open(tmp_path / "log", "wb") as log:
        tree = _compiled()(opened, log.fileno())
        assert _errno(lambda: tree.read(neighbour + 1, 0, 100)) == errno.EIO
        assert tree.read(elsewhere + 1, 0, 100)
    text = (tmp_path / "log").read_text()
    what = "the header's record CRCs" if region == "crcs" else "the header's record offsets"
    start = regions[0 if region == "crcs" else 1][0] + page_size
    assert what in text and f"[{start}, " in text, text


def test_a_damaged_piece_record_page_never_lets_a_large_file_skip_its_piece_checks(tmp_path: Path) -> None:
    """A large file's piece CRCs are found by a search of piece_record: on a damaged page
    its zeros read as "not listed", and the file was checked whole instead, the verdict
    remembered, so once its record CRC matched every later READ served it with no piece
    checked (fuzz finding tests/fuzz_c/unlisted-from-damaged-page.ffr).  packfs.core
    checks that page at open, so the Tree is given the wrong CRC directly, as the fuzzer
    gives it."""
    from packfs import _lowlevel
    from packfs.format import PIECE_SIZE

    sound = tmp_path / "sound.ffr"
    packfs.pack_entries([packfs.Entry("a", b"a"), packfs.Entry("big", bytes(PIECE_SIZE + 1))], sound)
    data = sound.read_bytes()
    n = struct.unpack_from("<q", data, 4)[0]
    with Archive(sound) as opened:
        big = opened.find(b"big")
        start = struct.unpack_from("<q", data, 12 + 4 * n + 8 * opened.column("record")[big].item())[0]
    # The second piece no longer matches its piece CRC; the record's CRC is made to match.
    damaged = resealed_damage(sound, tmp_path / "damaged.ffr", start + PIECE_SIZE)
    damaged_bytes = damaged.read_bytes()
    with Archive(damaged, checksums="once") as opened, open(tmp_path / "log", "wb") as log:
        page_size, regions, _, data_end = opened.page_checks
        # Every page's CRC right (the header's record CRCs changed), piece_record's (section 15's) wrong.
        crcs = [zlib.crc32(damaged_bytes[at:min(at + page_size, end)]) ^ (region == 2 + 15)
                for region, (begin, end) in enumerate(regions) for at in range(begin, end, page_size)]
        wrong = struct.pack(f"<{len(crcs)}I", *crcs)
        source = opened.source
        tree = _lowlevel.Tree(source.mapping, source.fileno(), -1, opened.record_count, opened.data_records,
                              opened.entry_count, opened.section_spans, True, "damaged.ffr", log.fileno(),
                              pieces=opened.piece_spans, xattrs=opened.xattr_spans,
                              pages=(page_size, regions, wrong, data_end))
        for offset in (0, 1, PIECE_SIZE):  # the first answer used to be the only EIO
            assert _errno(lambda: tree.read(big + 1, offset, 100)) == errno.EIO
        del tree
    assert "section 'piece_record' is damaged" in (tmp_path / "log").read_text()
