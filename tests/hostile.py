"""Hostile archives laid out by hand: every CRC valid, the claims inconsistent.

Each generator writes one archive at ``path`` and returns ``path``; tests and the fuzzer
(``tests/fuzz.py``) call them.  The container is assembled directly (header, data area,
table records, footer), so offsets can go backwards, records can cover the same bytes
or the path table, and entries can share a record while their table says they are not
hard links: what ``write_records`` (records back to back) cannot produce.

- :func:`aliasing_archive`: records whose offsets go backwards so that every file's
  record covers the same bytes (``stride=0``) or overlapping windows of them; unpacked
  without the checks of format section 5, ``files * size`` bytes come out of an archive
  of about ``size``.  ``stride=size`` is the honest control: the same table, records
  disjoint.
- :func:`shared_record_archive`: many entries naming one record without being hard
  links of one file (nlink 1), or (``hard_links=True``) declared as hard links.
- :func:`record_over_table`: a file whose record runs from the data area over the whole
  path table (its size and CRC agree with that span), next to an ordinary file.
- :func:`long_name_archive`: names longer than NAME_MAX (255 bytes), which the format
  allows but no Linux file system holds, beside ordinary ones.
- :func:`legacy_aliasing_archive`: an FFRecord ``pack_folder`` archive with the
  backwards offsets of :func:`aliasing_archive` (what ``packfs convert`` reads).
"""

from __future__ import annotations

import pickle
import random
import struct
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from packfs.format import (FOOTER_SIZE, NO_RECORD, PIECE_SECTIONS, SECTION_ALIGNMENT, SECTIONS, crc32, pack_footer,
                           record_count_for)
from packfs.core.legacy import MAGIC as LEGACY_MAGIC
from packfs.format import S_IFDIR, S_IFREG
from packfs.core.tablebuild import TableRows, build_tables

__all__ = ["aliasing_archive", "shared_record_archive", "record_over_table", "long_name_archive", "legacy_aliasing_archive",
           "write_container", "Layout", "assemble", "all_hostile", "HOSTILE_KINDS", "hostile_structure"]

MTIME_NS = 1_600_000_000_000_000_000
# The path table's sections, then the piece CRCs' (empty here: no record is over 1 MiB).
ALL_SECTIONS = SECTIONS + PIECE_SECTIONS


def _no_pieces() -> dict[str, np.ndarray]:
    return {"piece_record": np.zeros(0, "<u8"), "piece_start": np.zeros(1, "<u8"), "piece_crc": np.zeros(0, "<u4")}


def write_container(out: Path, body: bytes, offsets: list[int]) -> Path:
    """An FFRecord container: ``body`` after the header, record ``i`` starting at
    ``offsets[i]`` (relative to the end of the header; any order).  Each record's CRC
    is computed over the span its offsets give it (0 for a span that runs backwards,
    which no reader may use), and the header's over the header."""
    n = len(offsets)
    ends = offsets[1:] + [len(body)]
    crcs = [crc32(body[start:end]) if 0 <= start <= end <= len(body) else 0 for start, end in zip(offsets, ends)]
    data_start = 12 + 12 * n
    header = struct.pack("<q", n) + np.array(crcs, "<u4").tobytes()
    header += np.array([data_start + offset for offset in offsets], "<i8").tobytes()
    Path(out).write_bytes(struct.pack("<I", crc32(header)) + header + body)
    return Path(out)


@dataclass(frozen=True)
class Layout:
    """Where an assembled archive's parts lie, relative to the end of the header."""

    data_records: int
    table_start: int  # the padding record before section 0: where data must end
    footer_start: int
    section_spans: dict[str, tuple[int, int]]


def _layout(tables: dict[str, np.ndarray], blob_size: int, data_records: int) -> tuple[Layout, list[int]]:
    """The table records' offsets after a data area of ``blob_size`` bytes (the header
    is 12 + 12n bytes, so alignment is computed in file offsets)."""
    data_start = 12 + 12 * record_count_for(data_records)
    position = blob_size
    offsets, spans = [], {}
    for name, _ in ALL_SECTIONS:
        offsets.append(position)  # padding
        position += -(data_start + position) % SECTION_ALIGNMENT
        offsets.append(position)
        spans[name] = (position, position + tables[name].nbytes)
        position += tables[name].nbytes
    if record_count_for(data_records) != data_records + 2 * len(ALL_SECTIONS) + 1:
        offsets.append(position)  # the parity record
    offsets.append(position)  # the footer
    return Layout(data_records, blob_size, position, spans), offsets


def assemble(out: Path, rows: TableRows, blob: bytes, data_records: int,
             data_offsets: Callable[[Layout], list[int]],
             patch: Callable[[dict[str, np.ndarray], Layout], None] | None = None) -> Path:
    """A packfs archive of ``rows``'s table over the data area ``blob``: the data
    records start where ``data_offsets(layout)`` says (relative to the data area's
    start); ``patch(tables, layout)`` may then change the table's columns."""
    tables = {name: array.copy() for name, array in build_tables(rows).items()}
    tables.update(_no_pieces())
    layout, table_offsets = _layout(tables, len(blob), data_records)
    if patch is not None:
        patch(tables, layout)
    body = bytearray(blob)
    for name, _ in ALL_SECTIONS:
        start, end = layout.section_spans[name]
        body += bytes(start - len(body))
        body += tables[name].tobytes()
    body += pack_footer(len(tables["parent"]), data_records)
    offsets = list(data_offsets(layout)) + table_offsets
    assert len(offsets) == record_count_for(data_records) and len(offsets[:data_records]) == data_records
    return write_container(out, bytes(body), offsets)


def _rows(names: list[str], size: int, records: list[int]) -> TableRows:
    rows = TableRows()
    rows.add(b"", S_IFDIR | 0o755, 0, 0, MTIME_NS, 0, NO_RECORD)
    for name, record in zip(names, records):
        rows.add(name.encode(), S_IFREG | 0o644, 0, 0, MTIME_NS, size, record)
    return rows


def _names(files: int) -> list[str]:
    return [f"f{i:07d}" for i in range(files)]


def aliasing_archive(path: Path, files: int = 1000, size: int = 1 << 16, stride: int = 0, seed: int = 0) -> Path:
    """``files`` files of ``size`` bytes whose records cover the same bytes.

    File ``j`` is record ``2j`` at ``j * stride``; record ``2j + 1`` (named by no entry)
    starts at ``j * stride + size``, so record ``2j`` ends there: with ``stride <
    size`` the offsets go backwards and the records overlap (``stride=0``: all the same
    bytes, the same CRC).  The archive holds ``size + stride * (files - 1)`` data
    bytes; the files claim ``files * size``."""
    blob = random.Random(seed).randbytes(size + stride * (files - 1))
    rows = _rows(_names(files), size, [2 * j for j in range(files)])

    def data_offsets(layout: Layout) -> list[int]:
        return [offset for j in range(files) for offset in (j * stride, j * stride + size)]

    return assemble(path, rows, blob, 2 * files, data_offsets)


def shared_record_archive(path: Path, files: int = 1000, size: int = 1 << 16, hard_links: bool = False,
                          seed: int = 0) -> Path:
    """``files`` regular files all naming record 0 (``size`` bytes, offsets sound).

    Without ``hard_links`` their table says each is a file of its own (nlink 1,
    first_link 0): aliases.  With it they are declared as the names of one file (nlink
    ``files``, first_link the lowest), as ``pack`` writes hard links."""
    blob = random.Random(seed).randbytes(size)
    rows = _rows(_names(files), size, [0] * files)

    def patch(tables: dict[str, np.ndarray], layout: Layout) -> None:
        if not hard_links:
            is_file = (tables["mode"] & 0o170000) == S_IFREG
            tables["nlink"][is_file] = 1
            tables["first_link"][:] = 0

    return assemble(path, rows, blob, 1, lambda layout: [0], patch)


def record_over_table(path: Path, over: str = "table") -> Path:
    """Two files: ``ok.txt``, ordinary, and ``spans-table``, whose record runs from the
    start of the data area to the footer (``over="table"``) or to the end of the file
    (``over="footer"``), its size and CRC made to agree.  Record 1, named by no entry,
    starts there, which is how its offsets get past the table."""
    first, ok = b"the data area\n", b"ok\n"
    blob = first + ok
    rows = TableRows()
    rows.add(b"", S_IFDIR | 0o755, 0, 0, MTIME_NS, 0, NO_RECORD)
    rows.add(b"spans-table", S_IFREG | 0o644, 0, 0, MTIME_NS, 0, 0)
    rows.add(b"ok.txt", S_IFREG | 0o644, 0, 0, MTIME_NS, len(ok), 2)

    def end_of(layout: Layout) -> int:
        return layout.footer_start + (FOOTER_SIZE if over == "footer" else 0)

    def patch(tables: dict[str, np.ndarray], layout: Layout) -> None:
        names = bytes(tables["names"])
        ends = tables["name_end"].tolist()
        for entry in range(1, len(ends)):
            if names[ends[entry - 1] : ends[entry]] == b"spans-table":
                tables["size"][entry] = end_of(layout)

    return assemble(path, rows, blob, 3, lambda layout: [0, end_of(layout), len(first)], patch)


def long_name_archive(path: Path, lengths: tuple[int, ...] = (300, 1100)) -> Path:
    """Directory ``dir`` holding files whose names are ``lengths`` bytes long (``"n" *
    length``, contents ``b"%d\\n" % length``) beside ordinary ones (``a.txt``, ``z.txt``,
    a 255-byte name ``"m" * 255``) and a directory with a 256-byte name holding
    ``inner.txt``; every rule of format section 5 kept: what a writer before the
    NAME_MAX rule stored from a tar."""
    files = {b"dir/a.txt": b"a\n", b"dir/" + b"m" * 255: b"255\n", b"dir/z.txt": b"z\n",
             b"dir/" + b"d" * 256 + b"/inner.txt": b"inner\n"}
    files.update({b"dir/" + b"n" * length: b"%d\n" % length for length in lengths})
    rows = TableRows()
    for directory in (b"", b"dir", b"dir/" + b"d" * 256):
        rows.add(directory, S_IFDIR | 0o755, 0, 0, MTIME_NS, 0, NO_RECORD)
    offsets, blob = [], b""
    for record, (name, contents) in enumerate(files.items()):
        rows.add(name, S_IFREG | 0o644, 0, 0, MTIME_NS, len(contents), record)
        offsets.append(len(blob))
        blob += contents
    return assemble(path, rows, blob, len(files), lambda layout: offsets)


def legacy_aliasing_archive(path: Path, files: int = 1000, size: int = 1 << 16, stride: int = 0,
                            seed: int = 0) -> Path:
    """An FFRecord ``pack_folder`` archive (files, then the pickled tree) with the
    backwards offsets of :func:`aliasing_archive`: file ``j`` is record ``2j``."""
    blob = random.Random(seed).randbytes(size + stride * (files - 1))
    tree = OrderedDict((name, 2 * j) for j, name in enumerate(_names(files)))
    metadata = LEGACY_MAGIC + pickle.dumps(tree, protocol=4)
    offsets = [offset for j in range(files) for offset in (j * stride, j * stride + size)]
    return write_container(path, blob + metadata, offsets + [len(blob)])


def all_hostile(directory: Path, files: int = 100) -> dict[str, Path]:
    """One of each (small), by name: for a fuzzer that wants them as seeds."""
    directory = Path(directory)
    return {
        "aliasing": aliasing_archive(directory / "aliasing.ffr", files, 4096),
        "overlapping": aliasing_archive(directory / "overlapping.ffr", files, 4096, stride=100),
        "shared": shared_record_archive(directory / "shared.ffr", files, 4096),
        "over-table": record_over_table(directory / "over-table.ffr"),
        "over-footer": record_over_table(directory / "over-footer.ffr", over="footer"),
        "legacy-aliasing": legacy_aliasing_archive(directory / "legacy-aliasing.ffr", files, 4096),
    }


HOSTILE_KINDS = ("aliasing", "overlapping", "shared_record", "record_over_table", "legacy_aliasing")


def hostile_structure(kind: str, path: Path, rng: random.Random) -> list[str]:
    """Build one of HOSTILE_KINDS at ``path``, sized by ``rng``, and return the paths
    worth asking for in it (the shape of tests/fuzz.py's ``build_structure``).  Unpack
    must refuse each before writing anything (so write at most the archive's size)."""
    files = rng.choice([2, 3, 50, rng.randint(2, 3000)])
    size = rng.choice([1, 100, 4096, rng.randint(1, 1 << 16)])
    if kind == "aliasing":
        aliasing_archive(path, files, size, stride=0, seed=rng.randrange(1 << 30))
    elif kind == "overlapping":
        size = max(size, 2)  # a stride below the size: windows that overlap
        aliasing_archive(path, files, size, stride=rng.randint(1, size - 1), seed=rng.randrange(1 << 30))
    elif kind == "shared_record":
        shared_record_archive(path, files, size, seed=rng.randrange(1 << 30))
    elif kind == "record_over_table":
        record_over_table(path, rng.choice(["table", "footer"]))
        return ["spans-table", "ok.txt"]
    elif kind == "legacy_aliasing":
        legacy_aliasing_archive(path, files, size, seed=rng.randrange(1 << 30))
    else:
        raise ValueError(f"kind must be one of {HOSTILE_KINDS}, got {kind!r}")
    return _names(files)[:: max(1, files // 8)]
