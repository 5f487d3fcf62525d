"""Checking a whole archive at once: every CRC, every offset, every rule of the path
table (what ``packfs verify`` reports)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Callable

from ..errors import FormatError
from ..format import (PIECE_SIZE, S_IFDIR, crc32, S_IFLNK, S_IFMT, S_IFREG, name_length_problem, symlink_length_problem,
                      symlink_target_problem)
from ..source.scan import SequentialScan
from .codecs import CodecTable
from .container import Container
from .pathtable import PathTable
from .pieces import PieceTable
from .tablecheck import long_names, validate
from .tailcheck import tail_problems
from .xattrs import XattrTable

__all__ = ["VerifyReport", "verify_archive"]


@dataclass(frozen=True)
class VerifyReport:
    """What :meth:`packfs.core.Archive.verify` found."""

    records_checked: int
    bytes_checked: int
    bad_paths: tuple[str, ...]  # entries whose contents fail their CRC
    bad_records: tuple[int, ...]  # every record that fails, table records included
    problems: tuple[str, ...]  # table-level findings beyond CRCs
    files_checked: int = 0  # regular files (each name of a hard-linked one) whose contents were checked
    symlinks_checked: int = 0

    @property
    def ok(self) -> bool:
        """Whether nothing was found."""
        return not (self.bad_records or self.problems)


def verify_archive(
    container: Container, table: PathTable | None, progress: Callable[[int], None] | None = None,
    pieces: PieceTable | None = None, xattrs: XattrTable | None = None, codecs: CodecTable | None = None,
) -> VerifyReport:
    """Check everything at once: the header CRC, every offset, every record's CRC and,
    with ``table``, every rule of the path table (each path's stored hash included),
    with ``pieces``, every piece CRC (format section 4b) and, with ``xattrs``, every
    entry's extended attributes (format section 4c) and, with ``codecs``, every codec
    row, frame table and extent list, each file decoded whole (format section 4f)."""
    bad_records = []
    checked_bytes = 0
    problems = []
    # Progress and bytes_checked count every byte of the file once: the header (its
    # checksum and what it covers; a legacy one's offsets) here, then each record, so a
    # run ends at the archive's size (100%).
    if container.legacy_header:
        problems.append("header: its checksum is 0, FFRecord's legacy marker (an old FFRecord file, or one "
                        "whose writer was aborted), so the header cannot be checked")
        if progress is not None:
            progress(container.data_start)
    else:
        with SequentialScan(container.source, 4, container.data_start) if not container.zero_copy \
                else contextlib.nullcontext() as header:
            value = header.crc(4, container.data_start, progress) if header is not None \
                else container.crc_of_span(4, container.data_start, progress)
        if value != container.stored_header_checksum():
            problems.append("header checksum mismatch")
        if progress is not None:
            progress(4)
    checked_bytes = container.data_start
    try:
        container.check_offsets()
    except FormatError as error:  # without sound offsets no record can be found
        problems.append(str(error))
        return VerifyReport(0, checked_bytes, (), (), tuple(problems))
    # The header's arrays as stored, unchecked (check_offsets checked the offsets): a
    # damaged page of them is found here, record by record, not raised by a check of
    # the whole array (a 1.4 archive's first use of them).
    offsets, crcs, n = container.offsets, container.crcs, container.record_count
    # Without a map (an archive at a URL), the records' bytes are read once, in order,
    # in large windows (one request per record was 4,446 GETs for a 110 MB archive);
    # the piece CRCs of large records are computed from the same bytes.
    scan = SequentialScan(container.source, int(offsets[0]), container.file_size) \
        if n and not container.zero_copy else None
    piece_crcs: dict[int, list[int]] = {}
    try:
        for record in range(n):
            start, end = int(offsets[record]), int(offsets[record + 1]) if record + 1 < n else container.file_size
            if scan is None:
                value = container.crc_of_span(start, end, progress)
            elif pieces is not None and record < container.data_records and end - start > PIECE_SIZE:
                value, parts = 0, []
                for at in range(start, end, PIECE_SIZE):
                    part = 0
                    for view in scan.pieces(at, min(end, at + PIECE_SIZE)):
                        part, value = crc32(view, part), crc32(view, value)
                        if progress is not None:
                            progress(len(view))
                    parts.append(part)
                piece_crcs[record] = parts
            else:
                value = scan.crc(start, end, progress)
            if value != int(crcs[record]):
                bad_records.append(record)
            checked_bytes += end - start
    finally:
        if scan is not None:
            scan.close()
    bad_paths: list[str] = []
    files = symlinks = 0
    if table is not None:
        sections_bad = [r for r in bad_records if r >= table.data_records]
        if sections_bad:
            problems.append(f"path table records {sections_bad} fail their checksums")
        try:
            validate(table)
            # A 1.4 archive's header entries are checked by their pages when first used.
            if table.data_records:
                container.record_span(0)
        except FormatError as error:
            problems.append(str(error))
        else:  # the paths below can only be built from a sound table
            bad = set(bad_records)
            file_type = table.column("mode") & S_IFMT
            files, symlinks = int((file_type == S_IFREG).sum()), int((file_type == S_IFLNK).sum())
            records = table.column("record")
            for entry in (file_type != S_IFDIR).nonzero()[0]:
                if int(records[entry]) in bad:
                    bad_paths.append(os.fsdecode(table.full_path(int(entry))))
            if pieces is not None:
                problems.extend(pieces.problems(container, piece_crcs if scan is not None else None))
            if xattrs is not None:
                problems.extend(xattrs.problems(table.entry_count, table.inode))
            if codecs is not None:
                # Every file decoded: its record read again, in archive order (from a URL
                # without a cache, through a scan: not a GET per file).
                with container.scanning():
                    problems.extend(codecs.problems(table))
            if container.tail is not None:
                problems.extend(tail_problems(container, table, container.tail))
            for entry in long_names(table):
                problems.append(f"{os.fsdecode(table.full_path(entry))!r} has "
                                f"{name_length_problem(table.name(entry))} (NAME_MAX)")
            for entry in (file_type == S_IFLNK).nonzero()[0].tolist():
                length = container.record_length(int(records[entry]))
                problem = symlink_length_problem(length) or symlink_target_problem(
                    container.record_bytes(int(records[entry])))
                if problem:
                    problems.append(f"symlink {os.fsdecode(table.full_path(entry))!r} has {problem}")
    return VerifyReport(
        records_checked=container.record_count,
        bytes_checked=checked_bytes,
        bad_paths=tuple(bad_paths),
        bad_records=tuple(bad_records),
        problems=tuple(problems),
        files_checked=files,
        symlinks_checked=symlinks,
    )
