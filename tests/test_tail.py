"""Format 1.4: the tail opens an archive from its last bytes, and the table and the
lookup index are read and checked a page at a time (format sections 4d and 4e)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest

import packfs
from packfs import ChecksumError, FormatError
from packfs.core import Archive
from packfs.write.indexbuild import LookupIndex, tail_page_size
from packfs.format import FOOTER_SIZE, INDEX_ROW, INDEX_SINCE_MINOR, MAGIC, TABLE_PAGE_MIN, TAIL_MAX, TAIL_SPAN_COUNT
from tests.conftest import BLUEPRINT, HARDLINK, SYMLINKS, as_version, read_records, write_records
from tests.test_core_archive import BytesSource


class CountingSource(BytesSource):
    """A source without a map (what a remote one is to the core) that records every read."""

    def __init__(self, data: bytes, memory_cap: int = 256 << 20) -> None:
        super().__init__(data)
        self.memory_cap = memory_cap
        self.requests: list[tuple[int, int]] = []

    def read(self, start: int, end: int) -> bytes:
        self.requests.append((start, end))
        return super().read(start, end)


def _many(tmp_path: Path, count: int = 40_000) -> Path:
    out = tmp_path / "many.ffr"
    packfs.pack_entries((packfs.Entry(f"d{i // 500:03d}/f{i:06d}.bin", (b"%d" % i) * (i % 5 + 1))
                         for i in range(count)), out, count=count)
    return out


def test_an_archive_opens_from_its_last_bytes(archive: Path, tmp_path: Path) -> None:
    for path in (archive, _many(tmp_path)):
        data = path.read_bytes()
        source = CountingSource(data)
        with Archive(source) as opened:
            assert opened.version == "1.4"
            # The footer and the tail: both within what one suffix request of 1 MiB brings.
            assert min(start for start, _ in source.requests) >= len(data) - TAIL_MAX - 2 * FOOTER_SIZE
            assert max(end for _, end in source.requests) == len(data)
            assert len(source.requests) == 2


def test_a_lookup_stat_and_read_fetch_one_index_page_and_the_file(tmp_path: Path) -> None:
    path = _many(tmp_path)
    source = CountingSource(path.read_bytes())
    with Archive(source) as opened:
        tail = opened.source and opened._container.tail  # noqa: SLF001 (the page geometry, for the bound)
        for i in (0, 17, 39_999, 12_345):
            source.requests.clear()
            key = f"d{i // 500:03d}/f{i:06d}.bin"
            entry = opened.lookup(key)
            stat = opened.stat(entry)
            contents = opened.read_path(key)
            assert contents == (b"%d" % i) * (i % 5 + 1) and stat.size == len(contents)
            *pages, file = source.requests  # the index page, unless an earlier lookup fetched it
            assert len(pages) <= 1 and all(end - start <= tail.page_size + INDEX_ROW.size + 64
                                           for start, end in pages)
            assert file[1] - file[0] == len(contents)
        source.requests.clear()
        assert opened.find(b"no/such/file") == -1
        assert len(source.requests) <= 1


def test_the_index_answers_as_the_table_does(archive: Path) -> None:
    with Archive(archive) as local, Archive(CountingSource(archive.read_bytes())) as remote:
        paths = list(BLUEPRINT) + list(SYMLINKS) + [HARDLINK[0], "", "a", "a/b"]
        for path in paths:
            key = os.fsencode(path)
            assert remote.find(key) == local.find(key), path
            entry = local.find(key)
            assert remote.stat(entry) == local.stat(entry), path
            if BLUEPRINT.get(path):
                assert remote.read_path(path) == BLUEPRINT[path]
        assert remote.stat(remote.find(HARDLINK[0].encode())).inode == remote.stat(remote.find(HARDLINK[1].encode())).inode
        assert remote.read_path("a/link-up") == BLUEPRINT["hello.txt"]  # a symlink followed
        assert sorted(remote.listing(remote.find(b"a"))[1]) == sorted(local.listing(local.find(b"a"))[1])
        assert remote.verify().ok


def test_pages_are_kept_in_a_cache_bounded_in_bytes(tmp_path: Path) -> None:
    path = _many(tmp_path)
    source = CountingSource(path.read_bytes(), memory_cap=4 << 20)
    with Archive(source) as opened:
        cache = opened._container.page_cache  # noqa: SLF001
        for i in range(0, 40_000, 97):
            assert opened.read_path(f"d{i // 500:03d}/f{i:06d}.bin")
        list(opened.listing(0))
        assert 0 < cache.size <= cache.capacity <= 2 << 20
        # A page read again after it was dropped is fetched and checked again.
        assert opened.read_path("d000/f000000.bin") == b"0"


def test_a_damaged_index_page_is_a_checksum_error_where_used(archive: Path, tmp_path: Path) -> None:
    records = read_records(archive)
    data_records = struct.unpack_from("<Q", records[-1], 24)[0]
    index = data_records + 2 * (TAIL_SPAN_COUNT - 1) + 1
    damaged = bytearray(records[index])
    damaged[5] ^= 0x40
    records[index] = bytes(damaged)
    bad = write_records(tmp_path / "bad.ffr", records, reseal=False)  # the tail's CRCs left as they were
    bad_data = bytearray(bad.read_bytes())
    # write_records recomputed the footer's record CRC but the tail_crc covers only the
    # tail and the footer, which are unchanged: the archive opens.
    with Archive(CountingSource(bytes(bad_data))) as remote:
        with pytest.raises(ChecksumError, match="the lookup index is damaged"):
            remote.find(b"hello.txt")
    with Archive(bad) as local:  # a local reader uses the table's columns
        assert local.read_path("hello.txt") == BLUEPRINT["hello.txt"]
        assert any("lookup index" in problem for problem in local.verify().problems)


def test_a_hostile_index_row_is_a_format_error(archive: Path, tmp_path: Path) -> None:
    records = read_records(archive)
    data_records = struct.unpack_from("<Q", records[-1], 24)[0]
    index = data_records + 2 * (TAIL_SPAN_COUNT - 1) + 1
    rows = bytearray(records[index])
    second = INDEX_ROW.size + struct.unpack_from("<I", rows, INDEX_ROW.size - 4)[0]  # the root's row is first
    struct.pack_into("<I", rows, second + 4, 1 << 30)  # the second row's entry, far beyond the table
    records[index] = bytes(rows)
    bad = write_records(tmp_path / "bad.ffr", records, rebuild_index=False)  # every CRC matches
    with Archive(CountingSource(bad.read_bytes())) as remote:
        length = struct.unpack_from("<I", rows, second + INDEX_ROW.size - 4)[0]
        path = bytes(rows[second + INDEX_ROW.size : second + INDEX_ROW.size + length])
        with pytest.raises(FormatError, match="invalid lookup index"):
            remote.find(path)
    with Archive(bad) as local:
        assert not local.verify().ok


def _row_paths(rows: bytes):
    """(offset of the row, its path) for every row of one index page."""
    position = 0
    while position < len(rows):
        length = struct.unpack_from("<I", rows, position + INDEX_ROW.size - 4)[0]
        yield position, bytes(rows[position + INDEX_ROW.size: position + INDEX_ROW.size + length])
        position += INDEX_ROW.size + length


@pytest.mark.parametrize("forged, problem", [
    (b"zz/yy/leaf.txt", "does not name its directory's path"),  # the right name under another directory
    (b"xx/yy/leaf.tx_", "not a path ending in its name"),
    (b"/x/yy/leaf.txt", "does not name its directory's path"),  # an absolute path, as long
])
def test_verify_finds_an_index_row_that_names_another_path(tmp_path: Path, forged: bytes, problem: str) -> None:
    """verify matches each row's path with the table by its last name and its parent's
    row (not by building every path, which cost minutes 10,000 levels deep): a row that
    names a path of the same length, its page CRC and hash resealed, is still found."""
    src = tmp_path / "src"
    for directory in ("xx/yy", "zz/yy"):
        (src / directory).mkdir(parents=True)
        (src / directory / "leaf.txt").write_bytes(directory.encode())
    archive = tmp_path / "good.ffr"
    packfs.pack_folder(src, archive)
    records = read_records(archive)
    data_records = struct.unpack_from("<Q", records[-1], 24)[0]
    index = data_records + 2 * (TAIL_SPAN_COUNT - 1) + 1
    rows = bytearray(records[index])
    at = next(position for position, path in _row_paths(bytes(rows)) if path == b"xx/yy/leaf.txt")
    rows[at + INDEX_ROW.size: at + INDEX_ROW.size + len(forged)] = forged
    struct.pack_into("<I", rows, at, packfs.format.crc32(forged))  # the row's path hash, as a forger would
    records[index] = bytes(rows)
    bad = write_records(tmp_path / "bad.ffr", records, rebuild_index=False)  # every CRC matches
    with Archive(bad) as damaged:
        report = damaged.verify()
    assert not report.ok
    assert any(problem in found for found in report.problems), report.problems
    with Archive(archive) as good:
        assert good.verify().ok


def test_a_damaged_tail_or_footer_is_refused_at_open(archive: Path, tmp_path: Path) -> None:
    data = archive.read_bytes()
    for offset in (len(data) - FOOTER_SIZE - 100, len(data) - FOOTER_SIZE + 40):  # in the tail; tail_size
        bad = bytearray(data)
        bad[offset] ^= 1
        with pytest.raises(FormatError):
            Archive(CountingSource(bytes(bad)))
    # Unchecked ("never"), a damaged tail is still refused where its geometry does not fit.
    bad = bytearray(data)
    bad[len(data) - FOOTER_SIZE - 1] ^= 0xFF  # the last index page's start
    with pytest.raises(FormatError):
        Archive(CountingSource(bytes(bad)), checksums="always")


def test_the_page_size_grows_until_the_tail_fits_a_suffix_request() -> None:
    one_page = LookupIndex(b"", np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert tail_page_size([1 << 20] * 21, one_page) == TABLE_PAGE_MIN
    # 2 GiB of table per section (tens of millions of entries): 64 KiB pages would need
    # 2.6 MB of CRCs, so the pages are larger.
    big = tail_page_size([2 << 30] * 21, one_page)
    assert big > TABLE_PAGE_MIN and 4 * 21 * (2 << 30) // big <= TAIL_MAX


@pytest.mark.parametrize("minor", [0, 1, 2, 3])
def test_every_older_version_still_opens_locally_and_without_a_map(archive: Path, tmp_path: Path, minor: int) -> None:
    old = as_version(archive, tmp_path / f"v1{minor}.ffr", minor)
    with Archive(old) as local, Archive(CountingSource(old.read_bytes())) as remote, \
            Archive(archive) as current:
        for opened in (local, remote):
            assert opened.version == f"1.{minor}"
            for path, contents in BLUEPRINT.items():
                entry = opened.find(os.fsencode(path))
                assert opened.stat(entry) == current.stat(current.find(os.fsencode(path))), path
                if contents is not None:
                    assert opened.read_path(path) == contents
            assert opened.read_path("a/link-up") == BLUEPRINT["hello.txt"]
            assert opened.verify().ok


def test_ffrecords_layout_reads_every_record_of_a_1_4_archive(archive: Path) -> None:
    """FFRecord's reader, as its format says (tests/vectors/ffrecord/README.md), written
    out here without packfs's code: the header's CRC over [4, 12 + 12n), each record's
    CRC over its span, the last record ending at the end of the file."""
    import zlib

    data = archive.read_bytes()
    checksum_meta, n = struct.unpack_from("<Iq", data, 0)
    assert checksum_meta == zlib.crc32(data[4 : 12 + 12 * n])
    crcs = struct.unpack_from(f"<{n}I", data, 12)
    offsets = struct.unpack_from(f"<{n}q", data, 12 + 4 * n) + (len(data),)
    for record in range(n):
        assert offsets[record] <= offsets[record + 1]
        assert zlib.crc32(data[offsets[record] : offsets[record + 1]]) == crcs[record], record
    footer = data[offsets[n - 1] :]
    assert footer[:8] == MAGIC and struct.unpack_from("<H", footer, 10)[0] == INDEX_SINCE_MINOR
    with packfs.RecordReader(archive) as reader:  # and packfs's own record reader
        assert [bytes(reader.read_one(i)) for i in range(n)] == [data[offsets[i] : offsets[i + 1]] for i in range(n)]
