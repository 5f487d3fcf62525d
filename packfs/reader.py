"""PackedFolder: read a packfs archive in place through a memory map."""

from __future__ import annotations

import io
import os
import stat as stat_module
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, NamedTuple, Sequence, Union, overload

if TYPE_CHECKING:
    import numpy as np

from . import legacy
from .container import Container, explain_foreign
from .errors import (
    ChecksumError,
    ClosedArchiveError,
    FormatError,
    NotADirectoryPathError,
    NotAFileError,
    NotASymlinkError,
    PackfsError,
    PathNotFoundError,
)
from .format import FOOTER_SIZE, MAX_SYMLINK_TARGET, crc32, record_count_for, unpack_footer
from .pathtable import S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, PathTable

__all__ = ["PackedFolder", "FileStat", "PackedFile", "VerifyReport", "EntryAttributes"]

PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

_MAX_SYMLINK_HOPS = 40  # as Linux's MAXSYMLINKS
# One resolution expands at most this many bytes of symlink targets (40 targets of at
# most 4,095 bytes: about 82,000 components), so a hostile archive cannot make one
# lookup walk megabytes of "d/../d/..": the bound holds even if a target's own length
# check were bypassed.
_MAX_EXPANDED_BYTES = _MAX_SYMLINK_HOPS * MAX_SYMLINK_TARGET
# A batch read joins adjacent files into one pread while the run stays this small
# (packfs.dataset): that saves a system call per small file, but a large run is one
# large allocation, faulted in page by page and then copied again into the files'
# own bytes objects, which cost more than the calls saved (bench/dataloader.py).
_BATCH_RUN_BYTES = 64 << 10
_KIND = {S_IFDIR: "dir", S_IFREG: "file", S_IFLNK: "symlink"}
# Smaller files are copied out of the (guarded) map, larger ones read with pread.
_MAP_COPY_BYTES = 1 << 20
# list_attributes reads a directory's columns this many entries at a time.
_LIST_PART = 1 << 14


@dataclass(frozen=True)
class FileStat:
    """Attributes of one entry, as stored in the archive."""

    path: str
    kind: str  # "file", "dir" or "symlink"
    mode: int  # st_mode, file type bits included
    uid: int
    gid: int
    mtime_ns: int
    size: int
    nlink: int
    inode: int  # stable: the entry index + 1 (the root is 1); one per file, shared by hard links

    @property
    def permissions(self) -> int:
        return stat_module.S_IMODE(self.mode)


@dataclass(frozen=True)
class VerifyReport:
    """What :meth:`PackedFolder.verify` found."""

    records_checked: int
    bytes_checked: int
    bad_paths: tuple[str, ...]  # entries whose contents fail their CRC
    bad_records: tuple[int, ...]  # every record that fails, table records included
    problems: tuple[str, ...]  # table-level findings beyond CRCs

    @property
    def ok(self) -> bool:
        return not (self.bad_records or self.problems)


class EntryAttributes(NamedTuple):
    """One entry from :meth:`PackedFolder.list_attributes`: its name as the raw bytes
    stored (with ``recursive``, its path relative to the listed directory) and its
    attributes as stored, ``mode`` with the file type bits."""

    name: bytes
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    size: int
    nlink: int


_FS_ENCODING = sys.getfilesystemencoding()


def _key(path: PathArg) -> bytes:
    """Table form of a user path: bytes without leading, trailing or doubled slashes."""
    # str.encode directly: os.fsencode's own type dispatch costs more than the lookup.
    key = path.encode(_FS_ENCODING, "surrogateescape") if type(path) is str else os.fsencode(path)
    if key[:1] == b"/" or key[-1:] == b"/":
        key = key.strip(b"/")
    if b"/." in key or b"//" in key or key[:1] == b".":
        parts = []
        for part in key.split(b"/"):
            if part in (b"", b"."):
                continue
            if part == b"..":
                if parts:
                    parts.pop()
                continue
            parts.append(part)
        key = b"/".join(parts)
    return key


class _Closed:
    """Stands in for a closed folder's table and container: every use raises
    ClosedArchiveError (a ValueError, as a closed file raises), at no cost to the open
    folder's hot paths."""

    def __getattr__(self, name: str) -> object:
        raise ClosedArchiveError("I/O operation on a closed archive")

    def close(self) -> None:
        pass


_CLOSED = _Closed()


class PackedFolder:
    """A packfs archive opened for reading, with FFRecord's PackedFolder interface.

    The path table stays in the memory map: opening reads the header, the footer and
    the sections' geometry, and does no per-entry work, so it costs the same for any
    number of files.  Each table value is checked where it is used (a hostile or
    damaged table raises FormatError there); :meth:`verify` checks everything.

    Parameters
    ----------
    path
        The archive file.
    check_data
        Check CRCs: of the header and the path table at open, and of a file's
        contents each time it is read.

    Raises
    ------
    FormatError
        The file is not a packfs archive, or its header, footer or sections are
        malformed.
    ChecksumError
        A CRC of the header or the path table does not match.
    """

    def __init__(self, path: PathArg, check_data: bool = True) -> None:
        self.path = os.fsdecode(path)
        self.check_data = check_data
        self.legacy = False  # an FFRecord pack_folder archive (packfs.legacy)
        self._container = Container(self.path, check_data=check_data)
        try:
            self._open_table()
        except FormatError as error:
            explained = explain_foreign(self._container.fd, error, self.path)
            self._container.close()
            raise explained from None
        except BaseException:
            self._container.close()
            raise

    def _open_table(self) -> None:
        container = self._container
        n = container.record_count
        if n == 0:
            raise FormatError(f"{self.path!r}: not a packfs archive (an empty FFRecord container)")
        self._file_count = -1
        last_start = container._offset_items[n - 1]
        if container.data_start <= last_start and container.file_size < last_start:
            # Bytes are missing from the end: say so, and how many must be there.
            raise FormatError(
                f"{self.path!r}: truncated: {container.file_size} bytes, but its header puts "
                f"the last record at offset {last_start}, so it must be at least "
                f"{last_start + FOOTER_SIZE} bytes (with the {FOOTER_SIZE}-byte footer)"
            )
        footer_data = container.record_bytes(n - 1)
        if legacy.is_legacy(footer_data):
            if self.check_data:
                container.check_crc(n - 1, footer_data, "FFRecord packed-folder metadata")
            self.footer, self._table = legacy.legacy_table(container, footer_data, repr(self.path))
            self.legacy = True
            return
        if len(footer_data) == FOOTER_SIZE and self.check_data:
            container.check_crc(n - 1, footer_data, "footer")
        footer = unpack_footer(footer_data, repr(self.path))
        expected = record_count_for(footer.data_records, footer.section_count)
        if n != expected:
            raise FormatError(
                f"{self.path!r}: {n} records, but the footer's {footer.data_records} data "
                f"records and {footer.section_count} sections need {expected}"
            )
        self.footer = footer
        self._table = PathTable(container, footer)
        # Opening touched a few header and table pages; a fault may map a whole large
        # folio around each, which stayed in RSS (about 1.5 MiB an open at 100,000
        # entries, paid again by every DataLoader worker).  Lookups fault back in what
        # they use.
        self._table.release_pages()

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Close the archive: any later call raises ValueError("I/O operation on a
        closed archive"), as a closed file does, and the map and the descriptor are
        released as soon as nothing uses them (at once, unless another thread is
        still inside a call, or a file from :meth:`open` or a view from
        :meth:`read_view` is still open: those keep working until they are closed).

        Nothing is released here by hand.  A call already running in another thread
        holds the table and the container in its own locals; releasing their views
        under it gave "released memoryview" and AttributeError, and closing the
        descriptor gave EBADF, or a pread from whatever file next reused the number.
        So close() only drops the folder's references; the objects free themselves
        (views, map, and the descriptor through Container's finalizer) when the last
        holder drops them, which for an idle folder is this call.  Calls that start
        later meet the _CLOSED sentinel.  The open folder's read paths pay nothing.
        """
        self._table = self._container = _CLOSED  # type: ignore[assignment]

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._container is _CLOSED

    def __enter__(self) -> PackedFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PackedFolder({self.path!r}, check_data={self.check_data!r})"

    def __getstate__(self) -> dict[str, object]:
        # Pickles as its path, so DataLoader workers re-open (and share) the map.
        return {"path": self.path, "check_data": self.check_data}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["path"], state["check_data"])  # type: ignore[misc, arg-type]

    # -- lookup ----------------------------------------------------------------------

    def _find(self, path: PathArg, follow: bool = True) -> int:
        """Entry index for ``path``, following symlinks (also in the final component
        when ``follow``); raises PathNotFoundError or NotADirectoryPathError."""
        key = _key(path)
        entry = self._table.lookup(key)
        if entry >= 0 and (not follow or self._table.file_type(entry) != S_IFLNK):
            return entry
        return self._resolve(key, follow, path)

    def _resolve(self, key: bytes, follow: bool, original: PathArg) -> int:
        """Slow path: walk ``key`` a component at a time, expanding symlinks.  Each
        step is a binary search in one directory, so depth costs nothing extra."""
        table = self._table
        pending = key.split(b"/") if key else []
        pending.reverse()
        current = 0
        hops = expanded = 0
        trail: list[int] = []  # the directories above ``current``, for ".."
        while pending:
            part = pending.pop()
            if part in (b"", b"."):
                continue
            if part == b"..":
                current = trail.pop() if trail else 0
                continue
            if table.file_type(current) != S_IFDIR:
                raise NotADirectoryPathError(
                    f"{os.fsdecode(original)!r}: {os.fsdecode(table.full_path(current))!r} is not a directory"
                )
            candidate = table.lookup_child(current, part)
            if candidate < 0:
                raise PathNotFoundError(f"{os.fsdecode(original)!r}: no such file or directory in {self.path!r}")
            if table.file_type(candidate) == S_IFLNK and (pending or follow):
                hops += 1
                if hops > _MAX_SYMLINK_HOPS:
                    raise PathNotFoundError(f"{os.fsdecode(original)!r}: too many levels of symbolic links")
                target = self._link_target(candidate, repr(os.fsdecode(original)))
                expanded += len(target)
                if expanded > _MAX_EXPANDED_BYTES:
                    raise PathNotFoundError(
                        f"{os.fsdecode(original)!r}: too many levels of symbolic links (their targets "
                        f"add up to more than {_MAX_EXPANDED_BYTES} bytes)"
                    )
                if target.startswith(b"/"):
                    raise PathNotFoundError(
                        f"{os.fsdecode(original)!r}: symlink to {os.fsdecode(target)!r} "
                        f"points outside the archive"
                    )
                pending.extend(reversed(target.split(b"/")))
                continue
            trail.append(current)
            current = candidate
        return current

    def _entry_of_kind(self, path: PathArg, kind: int) -> int:
        entry = self._find(path)
        actual = self._table.file_type(entry)
        if actual != kind:
            if kind == S_IFDIR:
                raise NotADirectoryPathError(f"{os.fsdecode(path)!r} is not a directory but a {_KIND[actual]}")
            raise NotAFileError(f"{os.fsdecode(path)!r} is not a file but a {_KIND[actual]}")
        return entry

    def exists(self, path: PathArg) -> bool:
        """Whether ``path`` names an entry (symlinks followed; a broken one does not exist)."""
        try:
            self._find(path)
        except (PathNotFoundError, NotADirectoryPathError):
            return False
        return True

    __contains__ = exists

    def is_file(self, path: PathArg) -> bool:
        """Whether ``path`` is a regular file (symlinks followed)."""
        try:
            return self._table.file_type(self._find(path)) == S_IFREG
        except (PathNotFoundError, NotADirectoryPathError):
            return False

    def is_dir(self, path: PathArg) -> bool:
        """Whether ``path`` is a directory (symlinks followed)."""
        try:
            return self._table.file_type(self._find(path)) == S_IFDIR
        except (PathNotFoundError, NotADirectoryPathError):
            return False

    def is_symlink(self, path: PathArg) -> bool:
        """Whether ``path`` itself is a symlink (not followed)."""
        try:
            return self._table.file_type(self._find(path, follow=False)) == S_IFLNK
        except (PathNotFoundError, NotADirectoryPathError):
            return False

    # -- reading ---------------------------------------------------------------------

    def _file_span(self, path: PathArg) -> tuple[int, int, int]:
        """(record, start, end) of file ``path``, its table values checked as they are used."""
        table = self._table
        entry = table._lookup(_key(path))  # the caller checks the archive is unchanged
        # The hot path reads the table's and the container's memoryviews directly;
        # method calls cost more than the lookup itself for small files.
        if entry < 0 or table._mode[entry] & S_IFMT != S_IFREG:
            entry = self._entry_of_kind(path, S_IFREG)
        return self._entry_span(entry)

    def _entry_span(self, entry: int) -> tuple[int, int, int]:
        """(record, start, end) of regular-file ``entry``, its table values checked."""
        table, container = self._table, self._container
        record = table._record[entry]
        if record < table.data_records:
            # A data record is never the last record (the table and footer follow), so
            # record + 1 is in range.
            offsets = container._offset_items
            start, end = offsets[record], offsets[record + 1]
            if end - start == table._size[entry] and container.data_start <= start and end <= container.data_end:
                return record, start, end
        # What the fast path refused: this raises FormatError saying which rule broke.
        record = table.record(entry)
        return (record, *container.record_span(record))

    def read_one(self, path: PathArg) -> bytes:
        """The contents of one file.

        Raises
        ------
        PathNotFoundError, NotAFileError
            ``path`` is missing or is a directory.
        ChecksumError
            ``check_data`` is on and the contents fail their CRC.
        FormatError
            The table is inconsistent where this file is concerned.
        """
        container = self._container
        if not container.guarded:
            container.check_size()  # the table is read through the map
        # Guarded (packfs._sigbus), contents are copied from the map: a truncation
        # under the copy reads zeros instead of killing, and the check after it raises.
        # Unguarded, and for large files, with pread: a short read or other bytes,
        # never a SIGBUS, and no page of a large file stays in this process's RSS.
        # bench/overwrite.py: the map copy and the guard's check cost 4 KiB reads about
        # what the lseek did; pread costs 0.5 us more (and is faster from 1 MiB up).
        try:
            record, start, end = self._file_span(path)
            if container.guarded and end - start < _MAP_COPY_BYTES:
                data = container._mm[start:end]
            else:
                data = container.pread(start, end)
            if self.check_data and crc32(data) != container._crc_items[record]:
                container.check_crc(record, data, repr(os.fsdecode(path)))  # raises, with details
        except PackfsError:
            container.changed_instead()
            raise
        container.check_unchanged()
        return data

    @overload
    def read(self, path: PathArg) -> bytes: ...

    @overload
    def read(self, path: Sequence[PathArg]) -> list[bytes]: ...

    def read(self, path: PathArg | Sequence[PathArg]) -> bytes | list[bytes]:
        """The contents of one file, or a list of contents for a list of paths."""
        if isinstance(path, (str, bytes, os.PathLike)):
            return self.read_one(path)
        return [self.read_one(p) for p in path]

    def read_view(self, path: PathArg) -> memoryview:
        """A zero-copy, read-only view of a file's bytes in the map (checked if
        ``check_data``).  Release it (or let it go) before closing the folder.

        The view is the map itself, the one read that is not protected from the
        archive being overwritten in place (``cp`` over it) while you hold the view:
        its bytes may become the new file's, or zeros (with packfs's SIGBUS guard,
        while the folder is open), or touching them is SIGBUS (without the guard, or
        after the folder is closed).  ``read`` and ``open`` raise ArchiveChangedError
        instead; packfs itself only ever replaces archives whole.
        """
        container = self._container
        if not container.guarded:
            container.check_size()
        try:
            record, start, end = self._file_span(path)
            view = container._view[start:end]
            if self.check_data:
                container.check_crc(record, view, repr(os.fsdecode(path)))
        except PackfsError:
            container.changed_instead()
            raise
        container.check_unchanged()
        return view

    def open(self, path: PathArg) -> PackedFile:
        """A seekable, read-only binary file object (reads are preads of the archive).

        The CRC is checked once here, not on every read; each read checks that the
        archive was not changed in place since it was opened.
        """
        container = self._container
        if not container.guarded:
            container.check_size()
        try:
            record, start, end = self._file_span(path)
            if self.check_data and container.crc_of_span(start, end) != container._crc_items[record]:
                raise ChecksumError(f"{self.path!r}: {os.fsdecode(path)!r}: checksum mismatch")
        except PackfsError:
            container.changed_instead()
            raise
        container.check_unchanged()
        return PackedFile(container, start, end, os.fsdecode(path))

    # Reads by entry index, with pread rather than through the map, for packfs.dataset:
    # no path resolution, and no page of file data joins this process's RSS.

    def _pread_entry(self, entry: int) -> bytes:
        """The contents of file ``entry``, checked like :meth:`read_one`."""
        table, container = self._table, self._container
        if not container.guarded:
            container.check_size()  # the table is read through the map
        try:
            if not 0 <= entry < table.entry_count or table.file_type(entry) != S_IFREG:
                raise NotAFileError(f"{self.path!r}: entry {entry} is not a file")
            record, start, end = self._entry_span(entry)
            data = container.pread(start, end)
            if self.check_data and crc32(data) != container._crc_items[record]:
                container.check_crc(record, data, repr(os.fsdecode(table.full_path(entry))))
        except PackfsError:
            container.changed_instead()
            raise
        container.check_unchanged()
        return data

    def _pread_entries(self, entries: Sequence[int]) -> Iterator[tuple[int, bytes]]:
        """(position in ``entries``, contents) of each file in ``entries`` (a numpy
        integer array), in archive order: each file checked as it is yielded, so a
        caller that transforms each one holds one file's bytes at a time, not a batch's
        (fresh memory for a batch of large files costs more in page faults than the
        batch saves).

        The table values of the whole batch are checked before anything is read; a run
        of adjacent small files is read with one pread of up to 64 KiB."""
        import numpy as np

        container = self._container
        if not container.guarded:
            container.check_size()  # the table is read through the map
        try:
            yield from self._pread_checked_entries(np.asarray(entries, dtype=np.int64))
        except PackfsError:
            container.changed_instead()
            raise

    def _pread_checked_entries(self, entries: np.ndarray) -> Iterator[tuple[int, bytes]]:
        import numpy as np

        table, container = self._table, self._container
        if not len(entries):
            return
        if entries.min() < 0 or entries.max() >= table.entry_count:
            raise NotAFileError(f"{self.path!r}: entry {int(entries.max())} is not in the table")
        # Compared while still unsigned: a hostile record or size of 2**63 or more would
        # turn negative as int64, and a negative record indexes from the end.
        records = table.column("record")[entries]
        sizes = table.column("size")[entries]
        refused = (((table.column("mode")[entries] & S_IFMT) != S_IFREG) | (records >= table.data_records)
                   | (sizes > container.file_size))
        if not refused.any():
            records, sizes = records.astype(np.int64), sizes.astype(np.int64)
            starts = container.offsets[records]
            ends = container.offsets[records + 1]  # a data record is never the last record
            refused = ((ends - starts != sizes) | (ends < starts) | (starts < container.data_start)
                       | (ends > container.data_end))
        if refused.any():
            bad = int(entries[np.argmax(refused)])
            self._pread_entry(bad)  # raises, naming the rule
            raise FormatError(f"{self.path!r}: entry {bad}'s record is not a valid data record")
        order = np.argsort(starts, kind="stable")
        starts_list, ends_list, order_list = starts[order].tolist(), ends[order].tolist(), order.tolist()
        stored = container.crcs[records].tolist() if self.check_data else None
        i, count = 0, len(order_list)
        while i < count:
            run_start, run_end, j = starts_list[i], ends_list[i], i + 1
            while j < count and starts_list[j] == run_end and ends_list[j] - run_start <= _BATCH_RUN_BYTES:
                run_end, j = ends_list[j], j + 1
            block = container.pread(run_start, run_end)
            # Unchanged after the read: the block, and every table value used above,
            # are the archive's as it was opened.
            container.check_unchanged()
            view = memoryview(block)
            for k in range(i, j):
                position = order_list[k]
                data = block if j == i + 1 else bytes(view[starts_list[k] - run_start : ends_list[k] - run_start])
                if stored is not None and crc32(data) != stored[position]:
                    container.check_crc(int(records[position]), data,
                                        repr(os.fsdecode(table.full_path(int(entries[position])))))
                yield position, data
            view.release()
            i = j

    def readlink(self, path: PathArg) -> str:
        """The target of symlink ``path``, as stored; NotASymlinkError for anything else."""
        entry = self._find(path, follow=False)
        if self._table.file_type(entry) != S_IFLNK:
            raise NotASymlinkError(f"{os.fsdecode(path)!r} is not a symlink")
        return os.fsdecode(self._link_target(entry, repr(os.fsdecode(path))))

    def _link_target(self, entry: int, label: str, check: bool | None = None) -> bytes:
        """Symlink ``entry``'s target, CRC-checked if ``check`` (default: ``check_data``),
        and one a symlink can hold: non-empty, without a NUL byte, at most 4,095 bytes
        (format section 5)."""
        record = self._table.record(entry)
        # Refused before any byte is copied or checked: a long target costs its length
        # to read and, as path components, to walk.
        length = self._table.size(entry)
        if length > MAX_SYMLINK_TARGET:
            raise FormatError(f"{self.path!r}: {label}: symlink target of {length} bytes, "
                              f"expected at most {MAX_SYMLINK_TARGET}")
        if self.check_data if check is None else check:
            target = self._container.checked_record_bytes(record, label)
        else:
            target = self._container.record_bytes(record)
        if not target or b"\0" in target:
            raise FormatError(f"{self.path!r}: {label}: symlink target {target!r} is empty or contains a NUL byte")
        return target

    def stat(self, path: PathArg, follow_symlinks: bool = False) -> FileStat:
        """Attributes of ``path`` (of the link itself unless ``follow_symlinks``)."""
        return self._stat_entry(self._find(path, follow=follow_symlinks))

    def _stat_entry(self, entry: int) -> FileStat:
        mode, uid, gid, mtime_ns, size, nlink = self._table.attributes(entry)
        return FileStat(
            path=os.fsdecode(self._table.full_path(entry)),
            kind=_KIND[mode & S_IFMT],
            mode=mode,
            uid=uid,
            gid=gid,
            mtime_ns=mtime_ns,
            size=size,
            nlink=nlink,
            inode=self._table.inode(entry),
        )

    # -- listing ---------------------------------------------------------------------

    def list(
        self,
        path: PathArg | None = None,
        list_file: bool = True,
        list_dir: bool = True,
        recursive: bool = False,
    ) -> list[str]:
        """Names in directory ``path`` (the root by default), sorted bytewise.

        With ``recursive``, paths relative to ``path`` in depth-first order, as
        FFRecord's PackedFolder returns them.  Symlinks count as files.
        """
        entry = self._entry_of_kind("" if path is None else path, S_IFDIR)
        return [
            os.fsdecode(relative)
            for relative, child in self._iter_tree(entry, recursive)
            if (list_dir if self._table.file_type(child) == S_IFDIR else list_file)
        ]

    def _iter_tree(self, entry: int, recursive: bool) -> Iterator[tuple[bytes, int]]:
        """(path relative to ``entry``, child entry) depth first, names in table order.
        Iterative, with one running prefix (not one per level, which costs O(depth**2)
        bytes in a deep tree of long names): any depth walks in memory proportional to
        the longest path."""
        table = self._table
        prefix = bytearray()
        stack = [(iter(table.children(entry)), 0)]  # (children, len(prefix) at that level)
        while stack:
            children, level_start = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                del prefix[level_start:]
                continue
            del prefix[level_start:]  # the previous sibling's subtree left its name here
            name = table.name(child)
            yield bytes(prefix) + name, child
            if recursive and table.file_type(child) == S_IFDIR:
                stack.append((iter(table.children(child)), len(prefix) + len(name) + 1))
                prefix += name + b"/"

    def scandir(self, path: PathArg = "") -> Iterator[tuple[str, FileStat]]:
        """(name, FileStat) for each child of directory ``path``."""
        entry = self._entry_of_kind(path, S_IFDIR)
        for child in self._table.children(entry):
            yield os.fsdecode(self._table.name(child)), self._stat_entry(child)

    def list_attributes(self, path: PathArg = "", recursive: bool = False) -> Iterator[EntryAttributes]:
        """:meth:`list` with attributes: an :class:`EntryAttributes` for each entry of
        directory ``path`` (symlinks to directories followed), names as raw bytes, in
        the order of ``list``.  Names and attributes are read as slices of the table's
        columns, a bounded number of entries at a time: well under a microsecond per
        entry, where ``stat`` of each listed path costs several.

        Raises PathNotFoundError or NotADirectoryPathError at the call, before the
        iterator is returned; FormatError (a damaged table) while iterating."""
        entry = self._entry_of_kind(path, S_IFDIR)
        if not recursive:
            return (EntryAttributes._make(item[1:]) for item in self._attribute_items(entry))
        return self._list_recursively(entry)

    def _list_recursively(self, entry: int) -> Iterator[EntryAttributes]:
        # Depth first with a stack of iterators, not recursion (a tree may be deeper than
        # Python's recursion limit), and one running prefix, not one per level (which
        # costs O(depth**2) bytes in a deep tree of long names).
        prefix = bytearray()
        stack = [(self._attribute_items(entry), 0)]  # (children, len(prefix) at that level)
        while stack:
            items, level_start = stack[-1]
            item = next(items, None)
            if item is None:
                stack.pop()
                continue
            del prefix[level_start:]  # the previous sibling's subtree left its name here
            child, name, *columns = item
            yield EntryAttributes(bytes(prefix) + name, *columns)
            if columns[0] & S_IFMT == S_IFDIR:
                stack.append((self._attribute_items(child), len(prefix) + len(name) + 1))
                prefix += name + b"/"

    def _attribute_items(self, entry: int) -> Iterator[tuple]:
        """(child, name, mode, uid, gid, mtime_ns, size, nlink) for each child of
        directory ``entry``, its columns read _LIST_PART entries at a time."""
        table = self._table
        children = table.children(entry)
        for low in range(children.start, children.stop, _LIST_PART):
            part = range(low, min(low + _LIST_PART, children.stop))
            yield from zip(part, *table.listing_columns(part))

    def walk(self, top: PathArg = "") -> Iterator[tuple[str, list[str], list[str]]]:
        """Like os.walk (top-down): (dirpath, dirnames, filenames); symlinks are
        listed with the files and not followed."""
        start = self._entry_of_kind(top, S_IFDIR)
        table = self._table
        stack = [(start, _key(top))]
        while stack:
            entry, key = stack.pop()
            dirnames, filenames, subdirs = [], [], []
            for child in table.children(entry):
                name = table.name(child)
                if table.file_type(child) == S_IFDIR:
                    dirnames.append(os.fsdecode(name))
                    subdirs.append((child, key + b"/" + name if key else name))
                else:
                    filenames.append(os.fsdecode(name))
            yield os.fsdecode(key), dirnames, filenames
            stack.extend(reversed(subdirs))

    def __iter__(self) -> Iterator[str]:
        """Full paths of all regular files, depth-first, names sorted bytewise."""
        for relative, child in self._iter_tree(0, True):
            if self._table.file_type(child) == S_IFREG:
                yield os.fsdecode(relative)

    def num_files(self) -> int:
        """Number of regular files (hard links counted once per path)."""
        if self._file_count < 0:
            mode = self._table.column("mode")
            self._file_count = int(((mode & S_IFMT) == S_IFREG).sum())
        return self._file_count

    __len__ = num_files

    @property
    def entry_count(self) -> int:
        """Entries in the path table: directories, files and symlinks, the root included."""
        return self.footer.entry_count

    def info(self) -> dict[str, object]:
        """Counts and sizes for ``packfs info``."""
        file_type = self._table.column("mode") & S_IFMT
        is_file = file_type == S_IFREG
        return {
            "path": self.path,
            # A legacy archive has no packfs footer: say what it is instead of a version.
            "format_version": ("FFRecord pack_folder (legacy; packfs convert makes it native)" if self.legacy
                               else f"{self.footer.version_major}.{self.footer.version_minor}"),
            "files": int(is_file.sum()),
            "dirs": int((file_type == S_IFDIR).sum()),
            "symlinks": int((file_type == S_IFLNK).sum()),
            "file_bytes": int(self._table.column("size")[is_file].sum()),
            "archive_bytes": self._container.file_size,
            "records": self._container.record_count,
            "largest_files": self._largest_files(5),
        }

    def _largest_files(self, count: int) -> list[dict[str, object]]:
        import numpy as np

        sizes = np.where((self._table.column("mode") & S_IFMT) == S_IFREG, self._table.column("size"), 0)
        top = np.argsort(sizes, kind="stable")[::-1][:count]  # O(n log n) once, for a summary
        return [{"path": os.fsdecode(self._table.full_path(int(entry))), "size": int(sizes[entry])}
                for entry in top if sizes[entry]]

    # -- verification ----------------------------------------------------------------

    def verify(self, progress: Callable[[int], None] | None = None) -> VerifyReport:
        """Check every CRC in the archive (header, tables, every record) and that each
        path's stored hash matches, whatever ``check_data`` was.

        ``progress`` is called with byte counts as records are checked.
        """
        return verify_container(self._container, self._table, progress)


class PackedFile(io.RawIOBase):
    """A read-only, seekable binary file over one record of an archive.

    Reads are preads of the archive file, not copies out of its memory map: an archive
    overwritten or truncated in place while the file is open gives ArchiveChangedError
    (a FormatError), never a SIGBUS, and never the new file's bytes.
    """

    def __init__(self, container: Container, start: int, end: int, name: str) -> None:
        super().__init__()
        self._container: Container | None = container
        self._start = start
        self._length = end - start
        self._position = 0
        self.name = name

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _span(self, size: int | None) -> tuple[int, int]:
        start = self._position
        end = self._length if size is None or size < 0 else min(self._length, start + size)
        return start, end

    def read(self, size: int | None = -1) -> bytes:
        container = self._open_container()
        start, end = self._span(size)
        if end <= start:
            return b""
        data = container.pread(self._start + start, self._start + end)
        container.check_unchanged()
        self._position = end
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        container = self._open_container()
        with memoryview(buffer) as raw, raw.cast("B") as target:
            start, end = self._span(len(target))
            if end <= start:
                return 0
            got = os.preadv(container.fd, [target[: end - start]], self._start + start)
            if got != end - start:  # a short read: the file is shorter than it was
                data = container.pread(self._start + start + got, self._start + end)  # raises
                target[got : end - start] = data
        container.check_unchanged()
        self._position = end
        return end - start

    def readline(self, size: int | None = -1) -> bytes:
        container = self._open_container()
        start, limit = self._span(size)
        parts, position = [], start
        while position < limit:
            chunk = container.pread(self._start + position, self._start + min(limit, position + 8192))
            newline = chunk.find(b"\n")
            if newline >= 0:
                parts.append(chunk[: newline + 1])
                position += newline + 1
                break
            parts.append(chunk)
            position += len(chunk)
        container.check_unchanged()
        self._position = position
        return b"".join(parts)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._check_closed()
        if whence == io.SEEK_SET:
            position = offset
        elif whence == io.SEEK_CUR:
            position = self._position + offset
        elif whence == io.SEEK_END:
            position = self._length + offset
        else:
            raise ValueError(f"invalid whence {whence!r}")
        if position < 0:
            raise ValueError(f"negative seek position {position}")
        self._position = position
        return position

    def tell(self) -> int:
        self._check_closed()
        return self._position

    def close(self) -> None:
        # A closed file must not keep the archive's descriptor open after its folder
        # is closed.
        self._container = None
        super().close()

    def _open_container(self) -> Container:
        self._check_closed()
        container = self._container
        if container is None or container.closed:
            raise ClosedArchiveError("I/O operation on a closed archive")
        return container

    def _check_closed(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")


def verify_container(
    container: Container, table: PathTable | None, progress: Callable[[int], None] | None = None
) -> VerifyReport:
    """Check everything at once: the header CRC, every offset, every record's CRC and,
    with ``table``, every rule of the path table (each path's stored hash included)."""
    bad_records = []
    checked_bytes = 0
    header_crc = container.mmap[:4]
    problems = []
    if container.crc_of_span(4, container.data_start) != int.from_bytes(header_crc, "little"):
        problems.append("header checksum mismatch")
    try:
        container.check_offsets()
    except FormatError as error:  # without sound offsets no record can be found
        problems.append(str(error))
        return VerifyReport(0, 0, (), (), tuple(problems))
    for record in range(container.record_count):
        start, end = container.record_span(record)
        if not container.record_crc_ok(record, progress):
            bad_records.append(record)
        checked_bytes += end - start
    bad_paths: list[str] = []
    if table is not None:
        sections_bad = [r for r in bad_records if r >= table.data_records]
        if sections_bad:
            problems.append(f"path table records {sections_bad} fail their checksums")
        try:
            table.validate()
        except FormatError as error:
            problems.append(str(error))
        else:  # the paths below can only be built from a sound table
            bad = set(bad_records)
            file_type = table.column("mode") & S_IFMT
            records = table.column("record")
            for entry in (file_type != S_IFDIR).nonzero()[0]:
                if int(records[entry]) in bad:
                    bad_paths.append(os.fsdecode(table.full_path(int(entry))))
            for entry in (file_type == S_IFLNK).nonzero()[0].tolist():
                if container.record_length(int(records[entry])) > MAX_SYMLINK_TARGET:
                    problems.append(f"symlink {os.fsdecode(table.full_path(entry))!r} has a target of "
                                    f"{container.record_length(int(records[entry]))} bytes, expected at "
                                    f"most {MAX_SYMLINK_TARGET}")
                    continue
                target = container.record_bytes(int(records[entry]))
                if not target or b"\0" in target:
                    problems.append(f"symlink {os.fsdecode(table.full_path(entry))!r} has the target {target!r}")
    return VerifyReport(
        records_checked=container.record_count,
        bytes_checked=checked_bytes,
        bad_paths=tuple(bad_paths),
        bad_records=tuple(bad_records),
        problems=tuple(problems),
    )
