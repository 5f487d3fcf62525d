from __future__ import annotations

import zlib

import pytest

from packfs.errors import FormatError
from packfs.format import (
    FOOTER_SIZE, MAGIC, SECTION_COUNT, WRITTEN_SECTION_COUNT, crc32, header_size, pack_footer, record_count_for,
    unpack_footer,
)


def test_crc32_is_zlibs() -> None:
    for data in (b"", b"a", b"hello world", bytes(range(256)) * 100):
        assert crc32(data) == zlib.crc32(data)
    assert crc32(b"world", crc32(b"hello ")) == zlib.crc32(b"hello world")
    # The spec's example: the header CRC of an empty container is the CRC of 8 zero bytes.
    assert crc32(bytes(8)) == 0x6522DF69


def test_record_count_is_odd_so_the_offset_table_is_aligned() -> None:
    for data_records in range(10):
        n = record_count_for(data_records)
        assert n % 2 == 1
        assert (12 + 4 * n) % 8 == 0
        assert n - data_records - 2 * WRITTEN_SECTION_COUNT - 1 in (0, 1)
    assert header_size(5) == 72


def test_footer_round_trip() -> None:
    data = pack_footer(entry_count=7, data_records=3)
    assert len(data) == FOOTER_SIZE == 64
    assert data.startswith(MAGIC)
    footer = unpack_footer(data, "x")
    assert (footer.entry_count, footer.data_records, footer.section_count) == (7, 3, WRITTEN_SECTION_COUNT)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: b"\0" + d[1:], "not a packfs archive"),
        (lambda d: d[:8] + (2).to_bytes(2, "little") + d[10:], "unsupported format version 2.2"),  # the minor stays that of the writer
        (lambda d: d[:12] + (2).to_bytes(4, "little") + d[16:], "unknown feature flags 0x2"),
        # The codecs flag (format 4f) in an archive of a version before 1.5.
        (lambda d: d[:12] + (1).to_bytes(4, "little") + d[16:], "sets the codecs flag in a version 1.2 archive"),
        (lambda d: d[:32] + (3).to_bytes(4, "little") + d[36:], "lists 3 sections"),
        (lambda d: d[:16] + bytes(8) + d[24:], "0 entries"),
        (lambda d: d[:-1], "not a packfs archive"),
    ],
)
def test_footer_rejects(mutate, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        unpack_footer(mutate(pack_footer(3, 2)), "x")


def test_higher_minor_version_is_accepted() -> None:
    data = pack_footer(3, 2, minor=4, tail=bytes(64))
    data = data[:10] + (7).to_bytes(2, "little") + data[12:]
    assert unpack_footer(data, "x").version_minor == 7
    # A 1.5 archive with codecs has their two sections (format 4f) and the flag.
    footer = unpack_footer(pack_footer(3, 2, minor=5, tail=bytes(64)), "x")
    assert (footer.flags, footer.section_count) == (1, 25)


def test_each_minor_version_needs_the_sections_of_the_steps_before_it() -> None:
    # A 1.3 archive has the attribute sections (format section 4c); one that claims
    # 1.3 with only 1.2's sections is malformed, not an archive without attributes.
    data = pack_footer(3, 2, minor=2)
    assert unpack_footer(data, "x").section_count == 18
    claims_3 = data[:10] + (3).to_bytes(2, "little") + data[12:]
    with pytest.raises(FormatError, match="lists 18 sections, version 1.3 needs 21"):
        unpack_footer(claims_3, "x")
    assert unpack_footer(pack_footer(3, 2, minor=3), "x").section_count == 21
    # 1.4 adds the lookup index and the tail (format sections 4d, 4e), located by the footer.
    footer = unpack_footer(pack_footer(3, 2, minor=4, tail=bytes(100)), "x")
    assert (footer.section_count, footer.tail_size) == (23, 100)
    with pytest.raises(ValueError, match="needs tail"):
        pack_footer(3, 2, minor=4)
