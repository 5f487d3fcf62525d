"""Archives the packer would need quadratic memory to write: a chain of directories
``depth`` deep whose names are each ``name_length`` bytes (4,000 levels of 255-byte names
is a 1 MB archive whose deepest path is 1 MB long).  Built column by column, each path's
CRC continued from its parent's, so no full path is ever held.  Every CRC is right:
``verify`` calls these archives sound, as the adversarial review's were."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from packfs.format import PIECE_SECTIONS, SECTION_ALIGNMENT, SECTIONS, crc32, pack_footer, record_count_for
from packfs.format import S_IFDIR, S_IFREG
from tests.conftest import write_records


def chain_archive(out: Path, depth: int, name_length: int, contents: bytes = b"at the bottom\n") -> Path:
    """root / d / d / ... (``depth`` directories) / f, each name ``name_length`` bytes."""
    count = depth + 2  # the root, the chain, the file
    name = b"d" * name_length
    file_name = b"f" * name_length
    parent = np.arange(-1, count - 1, dtype=np.int64).clip(0).astype("<u4")
    mode = np.full(count, S_IFDIR | 0o755, "<u4")
    mode[-1] = S_IFREG | 0o644
    size = np.zeros(count, "<u8")
    size[-1] = len(contents)
    record = np.full(count, 2**64 - 1, "<u8")
    record[-1] = 0
    child_start = np.zeros(count, "<u4")
    child_count = np.zeros(count, "<u4")
    child_start[:-1] = np.arange(1, count)
    child_count[:-1] = 1
    lengths = np.array([0] + [name_length] * (count - 2) + [len(file_name)], np.int64)
    name_end = np.cumsum(lengths).astype("<u8")
    names = np.frombuffer(name * (count - 2) + file_name, np.uint8)
    nlink = np.full(count, 3, "<u4")  # a directory with one sub-directory
    nlink[-2] = 2
    nlink[-1] = 1
    hashes = np.zeros(count, np.uint32)
    value = crc32(b"")
    for i in range(1, count):
        value = crc32((b"/" if i > 1 else b"") + (file_name if i == count - 1 else name), value)
        hashes[i] = value
    by_hash = np.argsort(hashes, kind="stable")
    out.unlink(missing_ok=True)
    columns = {
        "parent": parent, "mode": mode, "uid": np.zeros(count, "<u4"), "gid": np.zeros(count, "<u4"),
        "mtime_ns": np.zeros(count, "<i8"), "size": size, "record": record, "child_start": child_start,
        "child_count": child_count, "name_end": name_end, "nlink": nlink,
        "first_link": np.zeros(count, "<u4"), "names": names,
        "path_hash": hashes[by_hash].astype("<u4"), "path_entry": by_hash.astype("<u4"),
        # No record is over 1 MiB: the piece CRC sections (format 4b) are empty.
        "piece_record": np.zeros(0, "<u8"), "piece_start": np.zeros(1, "<u8"), "piece_crc": np.zeros(0, "<u4"),
    }
    records = [contents]
    position = 12 + 12 * record_count_for(1) + len(contents)
    for section, dtype in SECTIONS + PIECE_SECTIONS:
        data = np.ascontiguousarray(columns[section], dtype=dtype).tobytes()
        padding = -position % SECTION_ALIGNMENT
        records += [bytes(padding), data]
        position += padding + len(data)
    if len(records) + 1 < record_count_for(1):
        records.append(b"")
    records.append(pack_footer(count, 1))
    return write_records(out, records)


def long_target_archive(out: Path, target: bytes) -> Path:
    """An archive whose symlink ``s`` has ``target`` as its text, however long (the
    packer refuses targets over 4,095 bytes; a hostile archive need not): the
    symlink's record and size are rewritten, every CRC recomputed."""
    from packfs import Entry, pack_entries
    from tests.conftest import read_records

    base = out.with_name(out.name + ".base")
    pack_entries([Entry("d/x", b"x"), Entry("s", kind="symlink", target="d")], base, force=True)
    records = read_records(base)
    base.unlink()
    data_records = int.from_bytes(records[-1][24:32], "little")
    assert data_records == 2  # d/x's contents, then s's target
    records[1] = target
    size_record = data_records + 2 * [name for name, _ in SECTIONS].index("size") + 1
    sizes = np.frombuffer(records[size_record], "<u8").copy()
    entry_of_s = 2  # root, d, s, d/x
    sizes[entry_of_s] = len(target)
    records[size_record] = sizes.tobytes()
    out.unlink(missing_ok=True)
    return write_records(out, realigned(records, data_records))


def realigned(records: list[bytes], data_records: int) -> list[bytes]:
    """``records`` with each table section's padding record recomputed, after a data
    record changed length (format section 2: sections start at multiples of 64)."""
    records = list(records)
    position = 12 + 12 * len(records) + sum(map(len, records[:data_records]))
    sections = int.from_bytes(records[-1][32:36], "little")  # the footer's section_count
    for k in range(sections):
        padding = -position % SECTION_ALIGNMENT
        records[data_records + 2 * k] = bytes(padding)
        position += padding + len(records[data_records + 2 * k + 1])
    return records


def wide_long_names_archive(out: Path, directories: int, name_length: int) -> Path:
    """``directories`` sibling directories with ``name_length``-byte names, each holding
    one file: every lookup of a file caches its directory's path (cache-bloating)."""
    from packfs import Entry, pack_entries

    entries = [Entry(f"{i:08d}{'n' * (name_length - 8)}/f", b"%d" % i) for i in range(directories)]
    pack_entries(entries, out, force=True)
    return out
