"""The piece CRCs of large records (format section 4b, version 1.2), read in place.

A record longer than PIECE_SIZE has a CRC for each PIECE_SIZE piece besides its own, so
a reader can check just the pieces a read covers: the first bytes of a 10 GiB file
arrive after 1 MiB is checked, not 10 GiB.  Archives before 1.2 have none, and every
record is checked whole, as before.  The writer's side is
``packfs.write.container.ContainerWriter(pieces=True)``.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import NoReturn

from ..errors import FormatError
from ..format import PIECE_SECTIONS, PIECE_SIZE, PIECES_SINCE_MINOR, SECTION_COUNT, Footer, piece_count
from .container import Container
from .tail import Column, PagedColumn
from .sections import open_sections

__all__ = ["PieceTable", "NO_PIECES"]

NO_PIECES = -1


class PieceTable:
    """Sections 15..17 of an archive: which records have piece CRCs, and the CRCs.

    Opening checks the sections' geometry (section 5's open rules: O(1) but for their
    CRCs when checking data); :meth:`first_piece` checks a record's entries before they
    are used.  An archive without the sections (before 1.2, or an FFRecord packed
    folder) has an empty table."""

    def __init__(self, container: Container, footer: Footer | None) -> None:
        self.path = container.path
        self.record_count = 0  # M: records with pieces
        self.piece_total = 0  # P: piece CRCs
        self.spans: tuple[tuple[int, int], ...] | None = None
        self._records: Column
        self._starts: Column
        self._crcs: Column
        if footer is None or footer.version_minor < PIECES_SINCE_MINOR:
            self._records = self._starts = self._crcs = memoryview(b"").cast("Q")
            return
        views, spans = open_sections(container, footer, SECTION_COUNT, PIECE_SECTIONS, self.fail)
        self._records, self._starts, self._crcs = views
        count = len(self._records)
        if count > footer.data_records:
            self.fail(f"{count} records with pieces, more than the {footer.data_records} data records")
        # Read page by page (a remote 1.4 archive): only the geometry now, so the open
        # fetches nothing; first_piece keeps every use in bounds, and verify checks the rest.
        paged = isinstance(self._starts, PagedColumn)
        if len(self._starts) != count + 1 or (not paged and self._starts[0] != 0):
            self.fail(f"section 'piece_start' has {len(self._starts)} items starting with "
                      f"{self._starts[0] if len(self._starts) and not paged else None}, expected {count + 1} "
                      f"starting with 0")
        total = len(self._crcs) if paged else self._starts[count]
        if len(self._crcs) != total:
            self.fail(f"section 'piece_crc' has {len(self._crcs)} CRCs, piece_start says {total}")
        data_bytes = container.data_end - container.data_start
        if total > count + data_bytes // PIECE_SIZE:
            self.fail(f"{total} piece CRCs, more than {count} records of {data_bytes} data bytes can have")
        self.record_count, self.piece_total, self.spans = count, total, spans

    def fail(self, problem: str) -> NoReturn:
        """Raise FormatError for a malformed piece section."""
        raise FormatError(f"{self.path!r}: invalid piece CRCs (format section 4b): {problem}")

    def first_piece(self, record: int, length: int) -> int:
        """The index of record ``record``'s first piece CRC (``length`` bytes long, its
        offsets checked), or NO_PIECES if it has none; FormatError if its entries do
        not describe a record of that length (section 5)."""
        if length <= PIECE_SIZE or not self.record_count:
            return NO_PIECES
        records = self._records
        j = bisect_left(records, record)
        if j == self.record_count or records[j] != record:
            return NO_PIECES
        first, after = self._starts[j], self._starts[j + 1]
        if not first <= after <= self.piece_total or after - first != piece_count(length):
            self.fail(f"record {record} of {length} bytes has pieces [{first}, {after}), "
                      f"expected {piece_count(length)} of at most {self.piece_total}")
        return first

    def crc(self, index: int) -> int:
        """Piece CRC ``index`` (below ``piece_total``, as :meth:`first_piece` checked)."""
        return self._crcs[index]

    def problems(self, container: Container, computed: dict[int, list[int]] | None = None) -> list[str]:
        """Every rule of section 4b that verify checks, the piece CRCs against the bytes
        included; [] if all hold (and for an archive without the sections).
        ``computed``: each record over PIECE_SIZE -> its pieces' CRCs, as a scan that
        read its bytes already computed them (not read again)."""
        found: list[str] = []
        if self.spans is None:
            return found
        previous = -1
        for j in range(self.record_count):
            record = self._records[j]
            if record <= previous or record >= container.data_records:
                found.append(f"piece_record[{j}] = {record}: not ascending or not a data record")
                continue
            previous = record
            length = container.record_length(record)
            try:
                first = self.first_piece(record, length)
            except FormatError as error:
                found.append(str(error))
                continue
            if first == NO_PIECES:
                found.append(f"record {record} of {length} bytes has piece CRCs but is at most {PIECE_SIZE} bytes")
                continue
            start, end = container.record_span(record)
            known = computed.get(record) if computed is not None else None
            for p, at in enumerate(range(start, end, PIECE_SIZE)):
                value = known[p] if known is not None else container.crc_of_span(at, min(end, at + PIECE_SIZE))
                if value != self._crcs[first + p]:
                    found.append(f"record {record}: piece {p} (bytes [{at - start}, "
                                 f"{min(end, at + PIECE_SIZE) - start})) fails its piece CRC")
        # Records over PIECE_SIZE from the offsets at once (verify checked them sound).
        import numpy as np

        lengths = np.diff(container.offsets[: container.data_records + 1])
        unlisted = sorted(set(np.flatnonzero(lengths > PIECE_SIZE).tolist()) - set(self._records.tolist()))
        found += [f"record {record} is longer than {PIECE_SIZE} bytes but has no piece CRCs" for record in unlisted[:100]]
        return found

    def close(self) -> None:
        """Release the views of the map."""
        for view in (self._records, self._starts, self._crcs):
            view.release()
