"""Checking a whole path table at once (format section 5): what ``verify`` runs, and what
``unpack`` and ``convert`` check before they write anything out.  Column by column with
numpy, in chunks, so memory stays bounded whatever the number of entries.  The
per-entry checks that every read makes are :class:`PathTable`'s own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from ..format import CODEC_STORED, NAME_MAX, NO_RECORD, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, crc32

if TYPE_CHECKING:
    from .pathtable import PathTable

__all__ = ["validate", "check_records", "long_names"]

_VALID_TYPES = (S_IFDIR, S_IFREG, S_IFLNK)
_SLASH = ord("/")
# Validation works on slices of this many entries so its temporaries stay small.
_CHUNK = 1 << 16
_GATHER = 1 << 11


def validate(table: PathTable) -> None:
    """Check every rule of format section 5 at once, chunk by chunk (O(N), bounded
    memory); the first broken rule raises FormatError."""
    import numpy as np

    a = table.arrays
    count = table.entry_count
    names = a["names"]
    mode, parent = a["mode"], a["parent"]
    if mode[0] & S_IFMT != S_IFDIR or parent[0] != 0 or a["name_end"][0] != 0:
        table.fail("entry 0 must be the root directory with parent 0 and an empty name")
    if a["name_end"][-1] != len(names):
        table.fail(
            f"names end at {int(a['name_end'][-1])} but the names section has "
            f"{len(names)} bytes"
        )
    offsets = table.container.offsets
    data_records = table.data_records
    codes = table.codecs.codec_column() if table.codecs is not None else None  # one byte per record
    total_children = 0
    for start in range(0, count, _CHUNK):
        end = min(count, start + _CHUNK)
        index = np.arange(start, end, dtype=np.int64)
        file_type = mode[start:end] & S_IFMT
        if not np.isin(file_type, _VALID_TYPES).all():
            bad = start + int(np.argmin(np.isin(file_type, _VALID_TYPES)))
            table.fail(f"entry {bad} has file type {int(mode[bad]) & S_IFMT:#o}")
        is_dir = file_type == S_IFDIR
        child_start = a["child_start"][start:end].astype(np.int64)
        child_count = a["child_count"][start:end].astype(np.int64)
        total_children += int(child_count[is_dir].sum())
        if np.any(child_start[~is_dir]) or np.any(child_count[~is_dir]):
            table.fail("a file or symlink has children")
        # Every non-root entry lies in its parent's child range; with the total
        # below this makes the ranges an exact tiling, so the table is a tree.
        his = parent[start:end].astype(np.int64)
        body = index >= 1
        if np.any(his[body] >= index[body]):
            table.fail("an entry's parent does not come before it")
        parent_type = mode[his] & S_IFMT
        if np.any(parent_type[body] != S_IFDIR):
            table.fail("an entry's parent is not a directory")
        first = a["child_start"][his].astype(np.int64)
        last = first + a["child_count"][his]
        if np.any((index[body] < first[body]) | (index[body] >= last[body])):
            table.fail("an entry lies outside its parent's child range")
        # Names: non-empty, not "." or "..".
        name_end = a["name_end"][max(start - 1, 0) : end].astype(np.int64)
        name_start = name_end[:-1] if start else np.concatenate(([0], name_end[:-1]))
        lengths = name_end[1:] - name_end[:-1] if start else np.diff(name_end, prepend=0)
        if np.any(lengths < 0):
            table.fail("name offsets go backwards")
        if np.any(lengths[body] == 0):
            table.fail("an entry other than the root has an empty name")
        dots = (lengths == 1) | (lengths == 2)
        if dots.any():
            first_byte = names[name_start[dots]]
            last_byte = names[name_start[dots] + lengths[dots] - 1]
            if np.any((first_byte == ord(".")) & (last_byte == ord("."))):
                table.fail("a name is '.' or '..'")
        # Records: files and symlinks name a data record of exactly their size.
        record = a["record"][start:end]
        # Hard links: a recorded first name is an earlier file with the same record.
        first = a["first_link"][start:end].astype(np.int64)
        linked = np.flatnonzero(first)
        if len(linked):
            if np.any(first[linked] > index[linked]) or np.any(mode[first[linked]] & S_IFMT != S_IFREG) \
                    or np.any(a["record"][first[linked]] != record[linked]):
                table.fail("an entry's first link is not an earlier name of the same file")
        if np.any(record[is_dir] != NO_RECORD):
            table.fail("a directory names a data record")
        has_data = ~is_dir
        their = record[has_data]
        if np.any(their >= data_records):
            table.fail(f"an entry names a record outside the {data_records} data records")
        their = their.astype(np.int64)
        sizes = a["size"][start:end][has_data].astype(np.int64)
        # Records need not follow entry order (pack_entries writes them as they
        # come), so this gather can touch any page of the offset table: do it in
        # small steps and drop those pages, or a large header would pile up in RSS.
        for low in range(0, len(their), _GATHER):
            part = their[low : low + _GATHER]
            wrong = offsets[part + 1] - offsets[part] != sizes[low : low + _GATHER]
            if codes is not None:  # format 1.5: only a stored record's length is its file's size
                wrong &= codes[part] == CODEC_STORED
            if np.any(wrong):
                table.fail("an entry's size differs from the length of its record")
            if count > _CHUNK:
                table.container.release(0, table.container.data_start)
        if count > _CHUNK:
            table.release_pages()
    if total_children != count - 1:
        table.fail(f"directories list {total_children} children for {count - 1} entries")
    for start in range(0, len(names), _CHUNK * 64):
        chunk = names[start : start + _CHUNK * 64]
        if np.any((chunk == _SLASH) | (chunk == 0)):
            table.fail("a name contains '/' or a NUL byte")
        if count > _CHUNK:
            table.release_pages()
    path_entry, path_hash = a["path_entry"], a["path_hash"]
    for start in range(0, count, _CHUNK):
        end = min(count, start + _CHUNK)
        if np.any(path_entry[start:end] >= count):
            table.fail("the path index names an entry that does not exist")
        hashes = path_hash[max(start - 1, 0) : end]
        if np.any(hashes[1:] < hashes[:-1]):
            table.fail("the path index is not sorted")
        if count > _CHUNK and start % (_CHUNK * 16) == 0:
            table.release_pages()
    if count > _CHUNK:
        table.release_pages()
    check_records(table)
    _validate_paths(table)

def check_records(table: PathTable) -> int:
    """Check that the records the entries name are what writing them out may trust
    (format section 5, "before writing out a whole archive"), and return the bytes
    an unpack writes: the total length of the distinct records named.

    A record is named by one entry, or by every name of one hard-linked file (in an
    archive with codecs, format 4f, by any number of regular files):
    regular files whose ``nlink`` is the number of entries naming it and whose
    ``first_link`` is the same (all 0 in a 1.0 table); a regular file's ``nlink``
    is the number of entries naming its record.  With the container's offsets
    non-decreasing (``Container.check_offsets``, which callers run first) distinct
    records do not overlap, so the total is at most the data area.

    Two passes over the columns in chunks and 8 bytes per data record (how many
    entries name each record, and the first_link they give).  FormatError names
    the first entry that breaks the rule."""
    import numpy as np

    a = table.arrays
    count, data_records = table.entry_count, table.data_records
    users = np.zeros(data_records, np.uint32)
    link_of = np.zeros(data_records, np.uint32)
    mode, record, nlink, first_link = a["mode"], a["record"], a["nlink"], a["first_link"]
    for start in range(0, count, _CHUNK):
        end = min(count, start + _CHUNK)
        has_data = (mode[start:end] & S_IFMT) != S_IFDIR
        theirs = record[start:end][has_data]
        if np.any(theirs >= data_records):
            bad = start + int(np.flatnonzero(has_data)[np.argmax(theirs >= data_records)])
            table.fail(f"entry {bad} names record {int(record[bad])}, outside the {data_records} data records")
        theirs = theirs.astype(np.int64)
        named, times = np.unique(theirs, return_counts=True)
        users[named] += times.astype(np.uint32)
        link_of[theirs] = first_link[start:end][has_data]
        if count > _CHUNK:
            table.release_pages()
    total = 0
    for start in range(0, count, _CHUNK):
        end = min(count, start + _CHUNK)
        entries = start + np.flatnonzero((mode[start:end] & S_IFMT) != S_IFDIR)
        theirs = record[entries].astype(np.int64)
        sharing = users[theirs]
        is_file = (mode[entries] & S_IFMT) == S_IFREG
        wrong = (sharing > 1) & ~is_file
        if table.codecs is None:
            wrong |= (is_file & (nlink[entries] != sharing)) | (first_link[entries] != link_of[theirs])
        # Format 1.5 (4f): regular files with equal contents may share a record, each
        # keeping its own nlink and first_link (hard links among them are checked by
        # validate's first_link rule); records still do not overlap (check_offsets).
        if wrong.any():
            bad = int(entries[np.argmax(wrong)])
            table.fail(
                f"record {int(record[bad])} is named by {int(users[record[bad]])} entries, entry {bad} "
                f"among them, that are not the names of one hard-linked file (a record is named by "
                f"one entry, or by regular files whose nlink counts them and whose first_link agrees)")
        if count > _CHUNK:
            table.release_pages()
    offsets = table.container.offsets
    for low in range(0, data_records, _CHUNK * 16):
        high = min(data_records, low + _CHUNK * 16)
        lengths = offsets[low + 1 : high + 1] - offsets[low:high]
        total += int(lengths[users[low:high] > 0].sum())
        if data_records > _CHUNK:
            table.container.release(0, table.container.data_start)
    return total

def long_names(table: PathTable) -> Iterator[int]:
    """The entries whose names are longer than NAME_MAX bytes (format section 5: a writer
    stores none, ``verify`` reports each), in entry order; chunk by chunk, as
    :func:`validate` reads the table."""
    import numpy as np

    name_end = table.arrays["name_end"]
    count = table.entry_count
    for start in range(1, count, _CHUNK):
        end = min(count, start + _CHUNK)
        lengths = name_end[start:end].astype(np.int64) - name_end[start - 1 : end - 1].astype(np.int64)
        yield from (start + np.flatnonzero(lengths > NAME_MAX)).tolist()
        if count > _CHUNK:
            table.release_pages()


def _validate_paths(table: PathTable) -> None:
    """Sibling names strictly increasing (sorted, so no two alike) and every stored
    path hash right, one directory at a time.  Runs after the structural rules,
    which make the accessors it uses safe."""
    import numpy as np

    count = table.entry_count
    slot_of = np.full(count, -1, np.int64)
    slot_of[table.arrays["path_entry"]] = np.arange(count)
    if np.any(slot_of < 0):
        table.fail("the path index lists an entry twice and misses another")
    hashes = table.arrays["path_hash"]
    if hashes[slot_of[0]] != crc32(b""):
        table.fail("the root's path hash is wrong")
    directories = np.flatnonzero((table.arrays["mode"] & S_IFMT) == S_IFDIR).tolist()
    # A path's CRC continues its directory's (crc32(b"/" + name, crc_of_directory)),
    # so no full path is ever built: a tree 10,000 levels deep costs O(N), not
    # O(depth**2).  Directories come after their parents, so each one's CRC is
    # known when it is reached, and dropped after: the map holds only the frontier.
    directory_crc = {0: crc32(b"")}
    for directory in directories:
        children, names, modes = table.listing(directory)
        prefix_crc = directory_crc.pop(directory)
        if not names:
            continue
        for left, right in zip(names, names[1:]):
            if left >= right:
                table.fail(f"directory {table.full_path(directory)!r} lists {right!r} after {left!r}: "
                           f"names must be unique and sorted")
        stored = hashes[slot_of[children.start : children.stop]].tolist()
        separator = b"/" if directory else b""
        for child, name, mode, expected in zip(children, names, modes, stored):
            path_crc = crc32(separator + name, prefix_crc)
            if path_crc != expected:
                table.fail(f"{table.full_path(child)!r} has a wrong hash in the path index")
            if mode & S_IFMT == S_IFDIR:
                directory_crc[child] = path_crc

