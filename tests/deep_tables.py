"""Archives the packer would need quadratic memory to write: a chain of directories
``depth`` deep whose names are each ``name_length`` bytes (4,000 levels of 255-byte names
is a 1 MB archive whose deepest path is 1 MB long).  Built column by column, each path's
CRC continued from its parent's, so no full path is ever held.  Every CRC is right:
``verify`` calls these archives sound, as the adversarial review's were."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from packfs.format import SECTION_ALIGNMENT, SECTIONS, crc32, pack_footer, record_count_for
from packfs.pathtable import S_IFDIR, S_IFREG
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
    columns = {
        "parent": parent, "mode": mode, "uid": np.zeros(count, "<u4"), "gid": np.zeros(count, "<u4"),
        "mtime_ns": np.zeros(count, "<i8"), "size": size, "record": record, "child_start": child_start,
        "child_count": child_count, "name_end": name_end, "nlink": nlink,
        "first_link": np.zeros(count, "<u4"), "names": names,
        "path_hash": hashes[by_hash].astype("<u4"), "path_entry": by_hash.astype("<u4"),
    }
    records = [contents]
    position = 12 + 12 * record_count_for(1) + len(contents)
    for section, dtype in SECTIONS:
        data = np.ascontiguousarray(columns[section], dtype=dtype).tobytes()
        padding = -position % SECTION_ALIGNMENT
        records += [bytes(padding), data]
        position += padding + len(data)
    if len(records) + 1 < record_count_for(1):
        records.append(b"")
    records.append(pack_footer(count, 1))
    return write_records(out, records)
