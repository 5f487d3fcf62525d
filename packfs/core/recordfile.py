"""FFRecord record files: containers of numbered records with no path table (what
FFRecord's ``FileWriter`` and :class:`packfs.RecordWriter` write), told apart from
packfs archives, described and checked.

An archive's last record is its footer (format section 3), an FFRecord packed
folder's its pickled tree (:mod:`.legacy`); a container whose last record is neither
is a record file.
"""

from __future__ import annotations

from typing import Callable

from ..errors import FormatError, RecordFileError
from ..format import FOOTER_SIZE, MAGIC, crc32
from . import legacy
from .container import Container
from .verify import VerifyReport, verify_archive

__all__ = ["is_record_file", "describe", "record_file_error", "record_file_info", "verify_record_file",
           "READ_RECORDS_WITH"]

READ_RECORDS_WITH = "packfs.RecordReader or packfs.ffrecord.FileReader"
# Enough of the last record to tell a footer or a packed folder's tree from a record.
_HEAD_BYTES = 16
_OFFSET_CHUNK = 1 << 17  # offsets per numpy pass: 1 MiB of them, in bounded memory


def _records(count: int) -> str:
    return f"{count} record" if count == 1 else f"{count} records"


def _readers(container: Container) -> str:
    return READ_RECORDS_WITH + (" with allow_legacy_header=True" if container.legacy_header else "")


def is_record_file(container: Container) -> bool:
    """Whether ``container`` is a record file: its last record is neither a packfs
    footer (whole, extended, or cut short) nor a packed folder's tree.  Reads at most
    a few bytes of the last record, whatever its size."""
    n = container.record_count
    if n == 0:
        return True
    try:
        start, end = container.record_span(n - 1)
    except FormatError:  # the file ends before the last record: truncated, whatever it was
        return False
    head = container.pread(start, min(end, start + _HEAD_BYTES))
    if head[: len(MAGIC)] == MAGIC or legacy.is_legacy(head):
        return False
    # A footer cut to fewer than its magic's bytes (even to none) is the start of the
    # magic with a CRC that no longer matches; a record that happens to be such a
    # prefix matches its CRC.
    if len(head) < len(MAGIC) and MAGIC.startswith(head) and crc32(head) != container.stored_crc(n - 1):
        return False
    # A footer-sized last record that fails its CRC is more likely a damaged footer than
    # a record: the footer's own check then reports the damage.
    if end - start == FOOTER_SIZE and crc32(container.pread(start, end)) != container.stored_crc(n - 1):
        return False
    return True


def _unindexed_bytes(container: Container) -> int:
    """Bytes between the header and the first record (after the header when there are
    no records), which no record holds: FFRecord's writer leaves none, an aborted
    FFRecord write leaves its records there under a header of zeros."""
    first = container.offset_items[0] if container.record_count else container.file_size
    return max(0, min(first, container.file_size) - container.data_start)


def describe(container: Container) -> str:
    """What the record file is, for messages: ``an FFRecord record file of 5 records
    without a path table``, with its legacy header or an aborted write named."""
    n = container.record_count
    if n == 0 and container.legacy_header and _unindexed_bytes(container):
        return (f"an aborted FFRecord write (its header is zeros, FFRecord's legacy marker: 0 records, "
                f"and {_unindexed_bytes(container)} bytes after it that no record holds)")
    text = f"an FFRecord record file of {_records(n)} without a path table"
    if container.legacy_header:
        text += " (its header checksum is 0, FFRecord's legacy marker: the header cannot be checked)"
    return text


def record_file_error(container: Container, advice: str | None = None) -> RecordFileError:
    """The error for a record file where an archive of files is expected; ``advice``
    says what to do instead (by default: which readers read it)."""
    if advice is None:
        if container.record_count == 0 and container.legacy_header and _unindexed_bytes(container):
            advice = ("FFRecord's writer fills in the header only when it closes, so its records "
                      "cannot be found: write the file again")
        else:
            advice = (f"read its records with {_readers(container)} "
                      f"(packfs info and packfs verify describe and check it)")
    description = describe(container)
    return RecordFileError(f"{container.path!r} is {description}, not a packfs archive of files: {advice}",
                           container.path, container.record_count, description)


def _record_length_range(container: Container) -> tuple[int, int]:
    """(smallest, largest) record length, the offsets read in chunks (checked first)."""
    import numpy as np

    n = container.record_count
    if n == 0:
        return 0, 0
    offsets = container.offsets
    smallest, largest = None, 0
    for start in range(0, n, _OFFSET_CHUNK):
        stop = min(start + _OFFSET_CHUNK, n)
        following = int(offsets[stop]) if stop < n else container.file_size
        lengths = np.diff(offsets[start:stop], append=following)
        low, high = int(lengths.min()), int(lengths.max())
        smallest = low if smallest is None else min(smallest, low)
        largest = max(largest, high)
    return int(smallest or 0), largest


def record_file_info(container: Container) -> dict[str, object]:
    """What ``packfs info`` shows of a record file (its offsets are checked first).

    Keys: ``path``, ``kind`` ("FFRecord record file", or "aborted FFRecord write"),
    ``records``, ``record_bytes`` (all records together), ``smallest_record`` and
    ``largest_record`` (bytes), ``archive_bytes``, ``header_checksum`` (as hex, or
    "0 (FFRecord's legacy marker: unchecked)"), ``read_with`` (the Python readers
    that read it, and how).
    """
    container.check_offsets()
    n = container.record_count
    aborted = n == 0 and container.legacy_header and _unindexed_bytes(container) > 0
    smallest, largest = _record_length_range(container)
    return {
        "path": container.path,
        "kind": "aborted FFRecord write" if aborted else "FFRecord record file",
        "records": n,
        "record_bytes": container.file_size - container.offset_items[0] if n else 0,
        "smallest_record": smallest,
        "largest_record": largest,
        "archive_bytes": container.file_size,
        "header_checksum": ("0 (FFRecord's legacy marker: unchecked)" if container.legacy_header
                            else f"{container.header_checksum:#010x}"),
        "read_with": _readers(container),
    }


def verify_record_file(container: Container, progress: Callable[[int], None] | None = None) -> VerifyReport:
    """Check a record file: its header CRC (a legacy header of checksum 0 is reported:
    it cannot be checked), every offset, every record's CRC, and that no bytes lie
    outside the records.  Each finding is one line of ``problems``, each failing
    record too (the last one's says that its length comes from the file's size)."""
    report = verify_archive(container, None, progress)
    problems = list(report.problems)
    n = container.record_count
    for record in report.bad_records:
        line = f"record {record} fails its checksum"
        if record == n - 1:
            length = container.record_length(record)
            line += (f" (the last record: its length, {length} bytes, is the file's size minus its offset, "
                     f"so the file may have been truncated or extended)")
        problems.append(line)
    if report.records_checked == n:  # the offsets were sound, so the gap is known
        unindexed = _unindexed_bytes(container)
        if unindexed:
            where = "after the header" if n == 0 else "between the header and record 0"
            problems.append(f"{unindexed} bytes {where} belong to no record"
                            + (" (what an aborted FFRecord write leaves)" if n == 0 and container.legacy_header else ""))
    return VerifyReport(report.records_checked, report.bytes_checked, (), report.bad_records, tuple(problems))
