"""PackedFolder: a packfs archive as a folder of paths, with FFRecord's interface.

The path-level facade over :class:`packfs.core.Archive`: paths in and out as ``str``,
attributes as :class:`FileStat`, listings and walks; every byte and every table value
comes through the Archive's public interface.
"""

from __future__ import annotations

import os
import stat as stat_module
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional, Sequence, Union, overload

from .core import CLOSED, Archive, ArchiveReader, PackedFile, PathArg, VerifyReport, lookup_key, open_archive
from .core.codecs import whole_read_limit
from .errors import NotADirectoryPathError, NotASymlinkError, PackfsError, PathNotFoundError
from .format import S_IFDIR, S_IFLNK, S_IFMT, S_IFREG
from .source import absolute_location

__all__ = ["PackedFolder", "FileStat", "PackedFile", "VerifyReport", "EntryAttributes", "PathArg"]

_KIND = {S_IFDIR: "dir", S_IFREG: "file", S_IFLNK: "symlink"}
# The largest file read goes through the C library: the Python path's limit for a whole
# read of a framed or sparse file (packfs.core.codecs.whole_read_limit: half this
# machine's memory), so that a hostile archive's 2**62-byte sparse file meets the same
# TooLargeToReadError there.  A stored file is its record's length, at most the
# archive's size: the whole file is what read asks for, as the Python path reads it.
_WHOLE_READ_LIMIT = whole_read_limit()
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
        """The permission bits of ``mode`` (no file type)."""
        return stat_module.S_IMODE(self.mode)


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


class PackedFolder:
    """A packfs archive opened for reading, with FFRecord's PackedFolder interface.

    The path table stays in the memory map: opening reads the header, the footer and
    the sections' geometry, and does no per-entry work, so it costs the same for any
    number of files.  Each table value is checked where it is used (a hostile or
    damaged table raises FormatError there); :meth:`verify` checks everything.

    Parameters
    ----------
    path
        The archive file, or its ``s3://`` or ``http(s)://`` URL (read with ranged
        requests, every byte checked: ``pip install "packfs[remote]"``); or a shard
        set served as one tree (:mod:`packfs.core.union`): its manifest
        (``NAME.ffrset``), a list of archives, or a glob (``"data-*.ffr"``).
    check_data
        Check CRCs: of the header and the path table (at open before format 1.4, where
        first used from 1.4 on), and of a file's contents each time it is read (the
        Archive's ``"always"`` policy; ``False`` is ``"never"``).
    storage_options
        For a URL: credentials, endpoint and client options, as s3fs and fsspec take
        them (``key``, ``secret``, ``token``, ``endpoint_url``, ``region``, ``anon``),
        and ``cache_size``, the disk cache's bound in bytes.
    cache_dir
        For a URL: where the disk cache shared by every process on the node keeps the
        blocks fetched (None: ``$PACKFS_CACHE_DIR``, else ``~/.cache/packfs``; False:
        no disk cache).

    Raises
    ------
    FormatError
        The file is not a packfs archive, or its header, footer or sections are
        malformed.
    ChecksumError
        A CRC of the header or the path table does not match.

    Attributes
    ----------
    archive
        The entry-level interface this folder reads through (:class:`packfs.core.ArchiveReader`:
        an Archive, or a ShardSet):
        entry numbers, listings and reads for code that keeps its own index.
    """

    def __init__(self, path: Union[PathArg, Sequence[PathArg]], check_data: bool = True,
                 storage_options: Optional[Mapping[str, Any]] = None,
                 cache_dir: Union[PathArg, bool, None] = None) -> None:
        self.check_data = check_data
        given = [os.fsdecode(p) for p in path] if isinstance(path, (list, tuple)) else os.fsdecode(path)
        # What the folder pickles as and a DataLoader worker re-opens: a path, a URL, or
        # a shard set's list of them, a relative path made absolute, so that a re-open
        # after a change of directory finds the same files (messages keep the name given).
        self.spec: Union[str, list[str]] = ([absolute_location(p) for p in given] if isinstance(given, list)
                                            else absolute_location(given))
        # A worker re-opens a URL with the same credentials, endpoint, client options and
        # cache as this folder (they travel in its pickle: see __getstate__).
        self._storage_options = dict(storage_options) if storage_options else None
        self._cache_dir = (cache_dir if cache_dir is None or isinstance(cache_dir, bool)
                           else os.path.abspath(os.fspath(cache_dir)))
        self.archive: ArchiveReader = open_archive(given, checksums="always" if check_data else "never",
                                    storage_options=storage_options, cache_dir=cache_dir)
        self.path = self.archive.path
        self.legacy = self.archive.legacy  # an FFRecord pack_folder archive
        self.footer = self.archive.footer
        self._file_count = -1
        # The C format library's whole-file read (the Archive's, which its read_path asks
        # first), where it is built and reads this archive in place; None: every read
        # takes the Python path.  Looked up once, not at each read.
        self._read_compiled = self.archive.compiled_read if type(self.archive) is Archive else None
        if type(self).read_one is PackedFolder.read_one:
            # The hottest call goes straight to the core (a facade's call costs 1-2% of
            # a 4 KiB read); a subclass that overrides read_one keeps its own.
            self.read_one = self.archive.read_path  # type: ignore[method-assign]

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Close the archive: any later call raises ValueError("I/O operation on a
        closed archive"), as a closed file does.  A call still running in another
        thread finishes, and files from :meth:`open` and views from :meth:`read_view`
        keep working until they are closed (:meth:`packfs.core.Archive.close`)."""
        archive = self.archive
        self.archive = CLOSED  # type: ignore[assignment]
        self._read_compiled = None  # its hold on the map goes with the map
        archive.close()

    @property
    def _compiled(self) -> Any:
        """The C format library's Tree that :meth:`read` asks first, or None."""
        return self.archive.compiled_tree if self._read_compiled is not None else None  # type: ignore[union-attr]

    @_compiled.setter
    def _compiled(self, tree: None) -> None:
        # None turns the library off for this folder, its archive's read_path included:
        # the pure-Python path, as where the library is not built (tests, bench/).
        if tree is not None:
            raise ValueError("the Tree is the archive's: only None (the Python path) can be set")
        self._read_compiled = None
        if type(self.archive) is Archive:
            self.archive.compiled_read = None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self.archive is CLOSED

    def __enter__(self) -> PackedFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PackedFolder({self.path!r}, check_data={self.check_data!r})"

    def __getstate__(self) -> dict[str, object]:
        # Pickles as its path, so DataLoader workers re-open (and share) the map; a URL's
        # storage options (credentials among them: what the user gave this folder) and
        # cache directory go with it, or a spawn worker would re-open it with the
        # environment's credentials, endpoint and cache.
        return {"path": self.spec, "check_data": self.check_data, "storage_options": self._storage_options,
                "cache_dir": self._cache_dir}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["path"], state["check_data"], storage_options=state.get("storage_options"),  # type: ignore[misc, arg-type]
                      cache_dir=state.get("cache_dir"))

    # -- lookup ----------------------------------------------------------------------

    def exists(self, path: PathArg) -> bool:
        """Whether ``path`` names an entry (symlinks followed; a broken one does not exist)."""
        try:
            self.archive.lookup(path)
        except (PathNotFoundError, NotADirectoryPathError):
            return False
        return True

    __contains__ = exists

    def _is(self, path: PathArg, kind: int, follow: bool = True) -> bool:
        archive = self.archive
        try:
            return archive.file_type(archive.lookup(path, follow)) == kind
        except (PathNotFoundError, NotADirectoryPathError):
            return False

    def is_file(self, path: PathArg) -> bool:
        """Whether ``path`` is a regular file (symlinks followed)."""
        return self._is(path, S_IFREG)

    def is_dir(self, path: PathArg) -> bool:
        """Whether ``path`` is a directory (symlinks followed)."""
        return self._is(path, S_IFDIR)

    def is_symlink(self, path: PathArg) -> bool:
        """Whether ``path`` itself is a symlink (not followed)."""
        return self._is(path, S_IFLNK, follow=False)

    # -- reading ---------------------------------------------------------------------

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
        return self.archive.read_path(path)

    @overload
    def read(self, path: PathArg) -> bytes: ...

    @overload
    def read(self, path: Sequence[PathArg]) -> list[bytes]: ...

    def read(self, path: PathArg | Sequence[PathArg]) -> bytes | list[bytes]:
        """The contents of one file, or a list of contents for a list of paths (as
        :meth:`read_many` reads them).

        Where packfs.core._format is built and reads the archive in place, the file is
        found, read, checked and decoded in C without the GIL, straight into the bytes
        returned, whatever its size (stored, zstd, framed or sparse: a framed or sparse
        file over the whole-read limit, half this machine's memory, is left to the
        Python path, which raises TooLargeToReadError for it).  Anything the library does
        not answer (a path that is not canonical or goes through a symlink, a directory,
        damage, an archive changed in place) is asked of the Python path, which reads it,
        follows the symlink or raises its own error, so both give the same.
        """
        read_compiled = self._read_compiled
        if read_compiled is not None:
            # The key is made in C from a str or bytes (a lookup_key in Python cost more
            # than the rest of the call); None: not answered.
            contents = read_compiled(path, _WHOLE_READ_LIMIT)
            if contents is not None:
                return contents
        if isinstance(path, (str, bytes, os.PathLike)):
            return self.archive.read_path(path)
        return self.archive.read_many(path)

    def read_many(self, paths: Sequence[PathArg]) -> list[bytes]:
        """The contents of each file in ``paths``, in the order given (symlinks followed,
        duplicates allowed), each checked against its CRC if ``check_data``.

        From an archive at a URL the whole list is fetched at once: sorted by offset,
        neighbouring files share one ranged GET and many GETs are in flight (a batch
        costs a few round trips, not one per file).  A local archive reads each file as
        :meth:`read` does.

        Raises
        ------
        PathNotFoundError, NotAFileError
            A path is missing or is not a file (nothing is returned).
        ChecksumError
            ``check_data`` is on and a file fails its CRC: the error names its path.
        TypeError
            ``paths`` is one path, not a list of them.
        """
        return self.archive.read_many(paths)

    def read_view(self, path: PathArg) -> memoryview:
        """A zero-copy, read-only view of a file's bytes in the map (checked if
        ``check_data``).  Release it (or let it go) before closing the folder.

        The view is the map itself, the one read that is not protected from the
        archive being overwritten in place (``cp`` over it) while you hold the view:
        its bytes may become the new file's, or zeros (with packfs's SIGBUS guard,
        while the folder is open), or touching them is SIGBUS (without the guard, or
        after the folder is closed).  ``read`` and ``open`` raise ArchiveChangedError
        instead; packfs itself only ever replaces archives whole.

        A file stored compressed or sparse (an archive with codecs, format 1.5) has no
        bytes of its own in the map: its view is of a decoded copy (bytes), which no
        overwrite in place touches.
        """
        return self.archive.read_view(path)

    def open(self, path: PathArg) -> PackedFile:
        """A seekable, read-only binary file object, as fast as a built-in file for
        small reads and seeks (a :class:`~packfs.core.files.PackedFile`).

        The CRC is checked once here (if ``check_data``), not on every read.  A file of
        at most 1 MiB (256 KiB without ``check_data``) is read here, whole, and served
        from memory: the bytes checked are the bytes read.  A larger one is read as it
        is read, through a 32 KiB buffer, each read checking that the archive was not
        changed in place since it was opened (ArchiveChangedError).
        """
        archive = self.archive
        return archive.open(archive.lookup_kind(path, S_IFREG), os.fsdecode(path))

    def readlink(self, path: PathArg) -> str:
        """The target of symlink ``path``, as stored; NotASymlinkError for anything else."""
        archive = self.archive
        entry = archive.lookup(path, follow=False)
        if archive.file_type(entry) != S_IFLNK:
            raise NotASymlinkError(f"{os.fsdecode(path)!r} is not a symlink")
        return os.fsdecode(archive.readlink(entry))

    def stat(self, path: PathArg, follow_symlinks: bool = False) -> FileStat:
        """Attributes of ``path`` (of the link itself unless ``follow_symlinks``)."""
        return self._stat_entry(self.archive.lookup(path, follow=follow_symlinks))

    def xattrs(self, path: PathArg, follow_symlinks: bool = True) -> dict[str, bytes]:
        """The extended attributes of ``path`` (of the link itself unless
        ``follow_symlinks``), name to value, as ``os.listxattr`` and ``os.getxattr``
        give them for a file on disk; every name of a hard-linked file has the same."""
        archive = self.archive
        return {os.fsdecode(name): value
                for name, value in archive.xattrs(archive.lookup(path, follow=follow_symlinks))}

    def _stat_entry(self, entry: int) -> FileStat:
        archive = self.archive
        mode, uid, gid, mtime_ns, size, nlink, inode = archive.stat(entry)
        return FileStat(path=os.fsdecode(archive.path_of(entry)), kind=_KIND[mode & S_IFMT], mode=mode, uid=uid,
                        gid=gid, mtime_ns=mtime_ns, size=size, nlink=nlink, inode=inode)

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
        entry = self.archive.lookup_kind("" if path is None else path, S_IFDIR)
        return [
            os.fsdecode(relative)
            for relative, child in self._iter_tree(entry, recursive)
            if (list_dir if self.archive.file_type(child) == S_IFDIR else list_file)
        ]

    def _iter_tree(self, entry: int, recursive: bool) -> Iterator[tuple[bytes, int]]:
        """(path relative to ``entry``, child entry) depth first, names in table order.
        Iterative, with one running prefix (not one per level, which costs O(depth**2)
        bytes in a deep tree of long names): any depth walks in memory proportional to
        the longest path."""
        archive = self.archive
        prefix = bytearray()
        stack = [(iter(archive.children(entry)), 0)]  # (children, len(prefix) at that level)
        while stack:
            children, level_start = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                del prefix[level_start:]
                continue
            del prefix[level_start:]  # the previous sibling's subtree left its name here
            name = archive.name(child)
            yield bytes(prefix) + name, child
            if recursive and archive.file_type(child) == S_IFDIR:
                stack.append((iter(archive.children(child)), len(prefix) + len(name) + 1))
                prefix += name + b"/"

    def scandir(self, path: PathArg = "") -> Iterator[tuple[str, FileStat]]:
        """(name, FileStat) for each child of directory ``path``."""
        entry = self.archive.lookup_kind(path, S_IFDIR)
        for child in self.archive.children(entry):
            yield os.fsdecode(self.archive.name(child)), self._stat_entry(child)

    def list_attributes(self, path: PathArg = "", recursive: bool = False) -> Iterator[EntryAttributes]:
        """:meth:`list` with attributes: an :class:`EntryAttributes` for each entry of
        directory ``path`` (symlinks to directories followed), names as raw bytes, in
        the order of ``list``.  Names and attributes are read as slices of the table's
        columns, a bounded number of entries at a time: well under a microsecond per
        entry, where ``stat`` of each listed path costs several.

        Raises PathNotFoundError or NotADirectoryPathError at the call, before the
        iterator is returned; FormatError (a damaged table) while iterating."""
        entry = self.archive.lookup_kind(path, S_IFDIR)
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
        archive = self.archive
        children = archive.children(entry)
        for low in range(0, len(children), _LIST_PART):
            part = children[low:low + _LIST_PART]  # a range, or a list in a shard set's merged directory
            yield from zip(part, *archive.listing_columns(part))

    def walk(self, top: PathArg = "") -> Iterator[tuple[str, list[str], list[str]]]:
        """Like os.walk (top-down): (dirpath, dirnames, filenames); symlinks are
        listed with the files and not followed."""
        start = self.archive.lookup_kind(top, S_IFDIR)
        archive = self.archive
        stack = [(start, lookup_key(top))]
        while stack:
            entry, key = stack.pop()
            dirnames, filenames, subdirs = [], [], []
            children, names, modes = archive.listing(entry)  # one slice a column, not a call a child
            for child, name, mode in zip(children, names, modes):
                if mode & S_IFMT == S_IFDIR:
                    dirnames.append(os.fsdecode(name))
                    subdirs.append((child, key + b"/" + name if key else name))
                else:
                    filenames.append(os.fsdecode(name))
            yield os.fsdecode(key), dirnames, filenames
            stack.extend(reversed(subdirs))

    def __iter__(self) -> Iterator[str]:
        """Full paths of all regular files, depth-first, names sorted bytewise."""
        for relative, child in self._iter_tree(0, True):
            if self.archive.file_type(child) == S_IFREG:
                yield os.fsdecode(relative)

    def num_files(self) -> int:
        """Number of regular files (hard links counted once per path)."""
        if self._file_count < 0:
            mode = self.archive.column("mode")
            self._file_count = int(((mode & S_IFMT) == S_IFREG).sum())
        return self._file_count

    __len__ = num_files

    @property
    def entry_count(self) -> int:
        """Entries in the path table: directories, files and symlinks, the root included."""
        return self.footer.entry_count

    def stats(self) -> dict[str, int]:
        """What reading the archive cost so far (:meth:`packfs.core.Archive.stats`):
        requests, bytes fetched and page-cache hits for an archive at a URL."""
        return self.archive.stats()

    def info(self) -> dict[str, object]:
        """Counts and sizes for ``packfs info``."""
        file_type = self.archive.column("mode") & S_IFMT
        is_file = file_type == S_IFREG
        return {
            "path": self.path,
            # A legacy archive has no packfs footer: Archive.version says what it is.
            "format_version": self.archive.version,
            "files": int(is_file.sum()),
            # A directory several shards of a set hold is one directory.
            "dirs": int((file_type == S_IFDIR).sum()) - getattr(self.archive, "directories_counted_twice", int)(),
            "symlinks": int((file_type == S_IFLNK).sum()),
            "file_bytes": int(self.archive.column("size")[is_file].sum()),
            "archive_bytes": self.archive.size,
            "xattrs": self.archive.xattr_entries,  # entries that have extended attributes
            "xattr_bytes": self.archive.xattr_bytes,
            "records": self.archive.record_count,
            "largest_files": self._largest_files(5),
            **self._codec_info(),
        }

    def _codec_info(self) -> dict[str, object]:
        """``info``'s fields about format 1.5's codecs: "uncompressed" for an archive
        without them; else what :meth:`packfs.core.Archive.codec_summary` says."""
        if not self.archive.has_codecs:
            return {"compression": "uncompressed"}
        summary = self.archive.codec_summary()
        summary.pop("original_bytes")  # file_bytes already
        return summary

    def _largest_files(self, count: int) -> list[dict[str, object]]:
        import numpy as np

        sizes = np.where((self.archive.column("mode") & S_IFMT) == S_IFREG, self.archive.column("size"), 0)
        top = np.argsort(sizes, kind="stable")[::-1][:count]  # O(n log n) once, for a summary
        return [{"path": os.fsdecode(self.archive.path_of(int(entry))), "size": int(sizes[entry])}
                for entry in top if sizes[entry]]

    # -- verification ----------------------------------------------------------------


    def verify(self, progress: Callable[[int], None] | None = None) -> VerifyReport:
        """Check every CRC in the archive (header, tables, every record) and that each
        path's stored hash matches, whatever ``check_data`` was.

        ``progress`` is called with byte counts as records are checked.
        """
        return self.archive.verify(progress)
