"""The compiled reader (``packfs._lowlevel``'s ``Tree``, and a ``Forest`` for a set)
asked the contract's questions through a thin adapter.

The compiled reader is the FUSE daemon's: it answers what the kernel asks (LOOKUP of a
name in a directory inode, GETATTR, READDIR, READ of an inode's range, READLINK,
GETXATTR, LISTXATTR, and ``Tree.read_file`` of a stored path), numbers entries by inode,
and reports what is wrong as an errno.  The adapter turns those answers into
:class:`packfs.core.ArchiveReader`'s, and adds nothing a front end would not: it walks
paths from the root (symlinks resolved by :func:`packfs.core.paths.resolve_path`, as the
kernel resolves them) and remembers where it found each entry (the compiled reader
keeps no parent pointers to hand out: a daemon is always told the directory).

What it cannot answer is in :data:`UNANSWERED`, with the reason the contract's tests
skip on.
"""

from __future__ import annotations

import errno
import io
import os
from typing import Any, Iterator, Sequence, Union

from packfs.core import Archive, EntryStat, PathArg, ShardSet, lookup_key
from packfs.core.paths import resolve_path
from packfs.errors import (FormatError, NotADirectoryPathError, NotAFileError, PackfsError, PathNotFoundError)
from packfs.format import S_IFDIR, S_IFLNK, S_IFMT, S_IFREG
from packfs.fuse.inodedaemon import tree_for

# A READ's largest size (_lowlevel.c's MAX_REQUEST): longer reads are several.
_REQUEST = 1 << 20

UNANSWERED = {
    "always": "the compiled reader checks a record once (its daemon's policy) or never: it has no 'always'",
    "close": "a Tree or Forest has no close(): it lives as long as its daemon, and an adapter's own flag would "
             "test the adapter",
    "entry per name": "the compiled reader numbers entries by inode: every name of a hard-linked file is one entry",
    "checksum error": "the compiled reader answers EIO for every damage (its log says which): a CRC mismatch is a "
                      "FormatError here, not told apart as ChecksumError",
    "no entry": "the compiled reader answers EIO for an inode it does not have (a kernel never asks for one), as "
                "for damage: it cannot say 'no such entry'",
    "extents": "the compiled reader answers READs of ranges: it does not say where a sparse file's holes are",
    "checked chunks": "the compiled reader checks under its policy only (READ's): read_chunks under 'never' cannot "
                      "check every byte",
    "prefetch": "the compiled reader is asked READs by the kernel, never told which files come next: prefetch is for "
                "the datasets, which read through the Python reader",
    "window plans": "the compiled reader is asked READs by the kernel, never where files lie: extents_of is for the "
                    "datasets' window plans, which read through the Python reader",
}

_ERRORS = {errno.ENOENT: PathNotFoundError, errno.EISDIR: NotAFileError, errno.EINVAL: NotAFileError,
           errno.ENOTDIR: NotADirectoryPathError}


def _translated(error: OSError, what: str) -> PackfsError:
    kind = _ERRORS.get(error.errno or 0)
    if kind is not None:
        return kind(f"{what}: {os.strerror(error.errno or 0)}")
    return FormatError(f"{what}: the compiled reader answered {errno.errorcode.get(error.errno or 0, error.errno)} "
                       "(it logs the problem)")


class CompiledReader:
    """:class:`packfs.core.ArchiveReader`'s questions asked of ``tree_for(opened)``."""

    UNANSWERED = UNANSWERED

    def __init__(self, opened: Union[Archive, ShardSet], log_fd: int) -> None:
        self._opened = opened  # held: the Tree reads its map and descriptor
        self._tree = tree_for(opened, log_fd)
        self._is_tree = not isinstance(opened, ShardSet)
        self.path = opened.path
        self.checksums = opened.checksums
        self.legacy = False
        self.entry_count = opened.entry_count
        # Where each entry handed out was found: (parent, name).
        self._found: dict[int, tuple[int, bytes]] = {0: (0, b"")}

    def _where(self, entry: int) -> str:
        """What a message names: the entry's path where it was found, else its number."""
        return repr(os.fsdecode(self.path_of(entry))) if entry in self._found else f"entry {entry}"

    def _ask(self, what: str, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except OSError as error:
            raise _translated(error, f"{self.path!r}: {what}") from None

    # -- looking up ---------------------------------------------------------------------

    def lookup_child(self, directory: int, name: bytes) -> int:
        try:
            found = self._tree.lookup(directory + 1, name)
        except OSError as error:
            if error.errno in (errno.ENOENT, errno.ENOTDIR):
                return -1
            raise _translated(error, f"{self.path!r}: lookup of {name!r}") from None
        entry = found["st_ino"] - 1
        self._found.setdefault(entry, (directory, name))
        return entry

    def find(self, key: bytes) -> int:
        entry = 0
        for name in key.split(b"/") if key else ():
            entry = self.lookup_child(entry, name)
            if entry < 0:
                return -1
        return entry

    def lookup(self, path: PathArg, follow: bool = True) -> int:
        key = lookup_key(path)
        return resolve_path(key, follow, os.fsdecode(path), self.path, self.file_type, self.lookup_child,
                            self.path_of, self.readlink)

    def lookup_kind(self, path: PathArg, kind: int) -> int:
        entry = self.lookup(path)
        if self.file_type(entry) != kind:
            raise (NotADirectoryPathError if kind == S_IFDIR else NotAFileError)(f"{os.fsdecode(path)!r}")
        return entry

    # -- attributes ---------------------------------------------------------------------

    def stat(self, entry: int) -> EntryStat:
        st = self._ask(f"entry {entry}", self._tree.getattr, entry + 1)
        return EntryStat(st["st_mode"], st["st_uid"], st["st_gid"], st["st_mtime_ns"], st["st_size"], st["st_nlink"],
                         st["st_ino"])

    def file_type(self, entry: int) -> int:
        return self.stat(entry).mode & S_IFMT

    def inode(self, entry: int) -> int:
        return self.stat(entry).inode

    def name(self, entry: int) -> bytes:
        return self._found[entry][1]

    def parent(self, entry: int) -> int:
        return self._found[entry][0]

    def path_of(self, entry: int) -> bytes:
        names = []
        while entry:
            entry, name = self._found[entry]
            names.append(name)
        return b"/".join(reversed(names))

    def xattrs(self, entry: int) -> list[tuple[bytes, bytes]]:
        names = self._ask(f"entry {entry}", self._tree.listxattr, entry + 1).split(b"\0")[:-1]
        return sorted((name, self._ask(f"entry {entry}", self._tree.getxattr, entry + 1, name)) for name in names)

    # -- listings -----------------------------------------------------------------------

    def listing_with_inodes(self, directory: int) -> tuple[list[int], list[bytes], list[int], list[int]]:
        if self.file_type(directory) != S_IFDIR:
            return [], [], [], []
        rows = self._ask(f"entry {directory}", self._tree.readdir, directory + 1)
        entries, names, modes, inodes = [], [], [], []
        for name, inode, mode, _ in rows:
            if name in (b".", b".."):
                continue
            # READDIR hands out inodes, which are entries + 1 (a hard link's: its first name's).
            self._found.setdefault(inode - 1, (directory, name))
            entries.append(inode - 1)
            names.append(name)
            modes.append(self.stat(inode - 1).mode)  # READDIR's mode is the type alone
            inodes.append(inode)
        return entries, names, modes, inodes

    def listing(self, directory: int) -> tuple[list[int], list[bytes], list[int]]:
        return self.listing_with_inodes(directory)[:3]  # type: ignore[return-value]

    def children(self, directory: int) -> list[int]:
        return self.listing_with_inodes(directory)[0]

    def listing_columns(self, part: Sequence[int]) -> tuple[list, ...]:
        columns: tuple[list, ...] = ([], [], [], [], [], [], [])
        for entry in part:
            st = self.stat(entry)
            for column, value in zip(columns, (self.name(entry), st.mode, st.uid, st.gid, st.mtime_ns, st.size,
                                               st.nlink)):
                column.append(value)
        return columns

    # -- reading ------------------------------------------------------------------------

    def _regular(self, entry: int) -> int:
        if self.file_type(entry) != S_IFREG:
            raise NotAFileError(f"{self.path!r}: entry {entry} is not a file")
        return entry

    def read(self, entry: int, offset: int = 0, size: int = -1) -> bytes:
        length = self.stat(self._regular(entry)).size
        offset = max(offset, 0)
        stop = length if size < 0 else min(length, offset + size)
        parts = []
        while offset < stop:
            part = self._ask(f"read of {self._where(entry)}", self._tree.read, entry + 1, offset,
                             min(_REQUEST, stop - offset))
            if not part:
                break
            parts.append(part)
            offset += len(part)
        return b"".join(parts)

    def read_path(self, path: PathArg) -> bytes:
        key = lookup_key(path)
        if self._is_tree:
            # The in-process read path: found, read, checked and decoded in C in one call.
            try:
                return self._tree.read_file(key)
            except OSError as error:
                # A symlink (EINVAL) is followed, and a missing path said as lookup says it.
                if error.errno not in (errno.EINVAL, errno.ENOENT, errno.ENOTDIR):
                    raise _translated(error, f"{self.path!r}: read of {os.fsdecode(path)!r}") from None
        return self.read(self.lookup_kind(path, S_IFREG))

    def read_view(self, path: PathArg) -> memoryview:
        return memoryview(self.read_path(path))

    def open(self, entry: int, name: str = "") -> io.BufferedReader:
        return io.BufferedReader(_CompiledFile(self, self._regular(entry), self.stat(entry).size, name))

    def read_many(self, items: Sequence[Union[int, PathArg]]) -> list[bytes]:
        if isinstance(items, (str, bytes, os.PathLike)):
            raise TypeError(f"read_many takes a list of paths or entries, not one path ({items!r})")
        return [self.read_path(item) if isinstance(item, (str, bytes, os.PathLike)) else self.read(int(item))
                for item in items]

    def read_batch(self, entries: Sequence[int]) -> Iterator[tuple[int, bytes]]:
        contents = [self.read(int(entry)) for entry in entries]  # every one located before any is given
        yield from enumerate(contents)

    def read_chunks(self, entry: int, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        length = self.stat(self._regular(entry)).size
        for offset in range(0, length, chunk_size):
            yield self.read(entry, offset, chunk_size)

    def readlink(self, entry: int, check: bool | None = None) -> bytes:
        if self.file_type(entry) != S_IFLNK:
            raise NotAFileError(f"{self.path!r}: entry {entry} is not a symlink")
        return self._ask(f"readlink of entry {entry}", self._tree.readlink, entry + 1)

    def check(self, entry: int) -> None:
        self.read(entry)


class _CompiledFile(io.RawIOBase):
    """A file object over an entry's READs: what a program reading a mounted file sees."""

    def __init__(self, reader: CompiledReader, entry: int, size: int, name: str) -> None:
        self._reader, self._entry, self._size, self.name = reader, entry, size, name
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._reader.read(self._entry, self._position, len(buffer))
        buffer[: len(data)] = data
        self._position += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        if whence == io.SEEK_SET and offset < 0:
            raise ValueError(f"negative seek position {offset}")
        self._position = max(base + offset, 0)  # as io.BytesIO and PackedFile seek
        return self._position

    def tell(self) -> int:
        return self._position
