"""Archive: the entry-level interface every front end reads through.

An archive's entries are numbered as in its path table (format section 4): the root
is entry 0, and an entry's number never changes, so it is the identity front ends
keep (the FUSE daemons' inode is ``entry + 1``; every name of a hard-linked file
reports its first name's, :meth:`Archive.inode`).  Paths are looked up once and then
forgotten: listing, attributes and reads all take entry numbers.

The checksum policy is decided here, once, for every front end (``checksums``; kept
and applied by :class:`~packfs.core.checkpolicy.ChecksumPolicy`, and every record read,
checked and decoded by :class:`~packfs.core.recordreader.RecordReader`):

- ``"always"``: every read of a file checks its record's CRC (a read of part of a
  file checks the whole record first, so front ends that read in parts open a file
  with :meth:`Archive.open`, which checks it once per handle; a record with piece CRCs,
  format 1.2's files over 1 MiB, checks just the 1 MiB pieces the read covers);
- ``"once"``: a record is checked the first time it is read and the outcome
  remembered in two bitmaps of one bit per data record, sound and failed (what a
  mount wants: a large file read in 128 KiB requests is checked once, not once per
  request, and a damaged one fails every later read at once instead of being read
  and checked again); a record with piece CRCs has the two bits per piece instead, so
  the first bytes of a large file wait for one piece's check, not the whole file's;
- ``"never"``: no CRC of contents is checked (the header and the table are not
  checked at open either).

In an archive with codecs (format 1.5, section 4f) every read returns the decoded
contents (:mod:`packfs.core.codecs`): the stored bytes are checked under the policy
before they are decoded (a frame of a large compressed file against its own CRC, so
a read decodes and checks only the frames it covers), the decoded bytes against the
row's or the frame's CRC after (but under "never"), and a frame is never decoded into
more bytes than the archive declares, whatever the policy.
"""

from __future__ import annotations

import operator
import os
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterable, ContextManager, Iterator, Mapping, NamedTuple, Optional, Sequence, Union

if TYPE_CHECKING:
    import numpy as np

from ..errors import (ClosedArchiveError, FormatError, NotADirectoryPathError, NotAFileError, PackfsError,
                      RecordFileError)
from ..format import (CODEC_SPARSE, CODEC_STORED, CODEC_ZSTD, FOOTER_SIZE, S_IFDIR,
                      S_IFLNK, S_IFMT, S_IFREG, crc32, record_count_for, symlink_length_problem,
                      symlink_target_problem, unpack_footer)
from ..source import ByteSource, with_cache_dir
from . import legacy, recordfile, tablecheck
from .checkpolicy import CHECKSUM_POLICIES, ChecksumPolicy
from .codecs import STORED_ROW, CodecRow, CodecTable, whole_read_limit
from .container import MAP_COPY_BYTES, Container, explain_foreign
from .files import (SMALL_FILE_BYTES, UNCHECKED_SMALL_FILE_BYTES, DecodedFile, MemoryFile, PackedFile, StreamFile,
                    read_entries, read_spans)
from .inplace import compiled_reader
from .paths import PathArg, lookup_key, resolve_path
from .pathtable import PathTable
from .pieces import PieceTable
from .recordreader import RecordReader
from .tail import prefetch_pages
from .xattrs import XattrTable
from .verify import VerifyReport, verify_archive

__all__ = ["Archive", "EntryStat", "CHECKSUM_POLICIES", "CLOSED", "columns_by_entry"]

ROOT = 0
_KIND = {S_IFDIR: "dir", S_IFREG: "file", S_IFLNK: "symlink"}


def _zeros(count: int, chunk_size: int) -> Iterator[bytes]:
    """``count`` zero bytes in chunks of at most ``chunk_size``."""
    while count > 0:
        yield bytes(min(count, chunk_size))
        count -= chunk_size


class EntryStat(NamedTuple):
    """An entry's attributes as stored (``mode`` with the file type bits), and its inode."""

    mode: int
    uid: int
    gid: int
    mtime_ns: int
    size: int
    nlink: int
    inode: int


# read_path's C read takes files up to this size; a larger one is the Python path's,
# which reads a stored file whole and refuses a framed or sparse one over the same
# limit (TooLargeToReadError: a hostile archive's 2**62-byte sparse file).
_WHOLE_READ_LIMIT = whole_read_limit()


class ClosedStandIn:
    """Stands in for a closed archive's table and container: every use raises
    ClosedArchiveError (a ValueError, as a closed file raises), at no cost to the open
    archive's hot paths."""

    def __getattr__(self, name: str) -> object:
        raise ClosedArchiveError("I/O operation on a closed archive")

    def __getitem__(self, index: object) -> object:
        # A call already past its first check when the archive was closed meets this
        # in place of the header's or the table's item views ...
        raise ClosedArchiveError("I/O operation on a closed archive")

    def __call__(self, *args: object) -> object:
        # ... or of the table's bound lookup.
        raise ClosedArchiveError("I/O operation on a closed archive")

    def close(self) -> None:
        """Closing a closed archive does nothing."""
        pass


CLOSED = ClosedStandIn()


def _weak_label(archive: "Archive") -> Callable[[Any], str]:
    """``archive._label``, holding the archive weakly."""
    reference = weakref.ref(archive)

    def label(where: Any) -> str:
        held = reference()
        return held._label(where) if held is not None else str(where)

    return label


class Archive:
    """A packfs archive (or an FFRecord packed folder) opened for reading.

    Opening reads the header, the footer and the sections' geometry, and does no
    per-entry work, so it costs the same for any number of entries.  Each table value
    is checked where it is used (a hostile or damaged table raises FormatError there);
    :meth:`verify` checks everything.  Every call ends by checking that the archive
    did not change in place under it (ArchiveChangedError).

    Parameters
    ----------
    source
        The archive: a path, an ``s3://`` or ``http(s)://`` URL, or any
        :class:`packfs.source.ByteSource`, which the archive then owns: it is released
        when the archive and every file or view from it are gone (a source frees
        itself when collected; see close()).  A URL is opened with one request (a 1.4
        archive's tail; older archives read their header and table whole), and then
        each lookup reads one page of the lookup index and each file one range, every
        byte checked against its CRC.
    checksums
        ``"always"``, ``"once"`` or ``"never"``: when the CRCs of contents are checked
        (see the module's documentation).  All but ``"never"`` check the header's and
        the table's CRCs: at open before format 1.4, where first used from 1.4 on.
    storage_options
        For a URL: credentials, endpoint and client options (:mod:`packfs.source.remote`).
    cache_dir
        For a URL: the disk cache shared by the node's processes (:mod:`packfs.source.cache`):
        a directory, None for the default (``$PACKFS_CACHE_DIR``, else
        ``~/.cache/packfs``), False for none.  ``storage_options={"cache_size": N}``
        bounds it (32 GiB by default).

    Raises
    ------
    FormatError
        The file is not a packfs archive, or its header, footer or sections are
        malformed.
    RecordFileError
        The file is an FFRecord record file: records without a path table.
    ChecksumError
        A CRC of the header or the path table does not match.
    """

    def __init__(self, source: Union[PathArg, ByteSource], checksums: str = "always",
                 storage_options: Optional[Mapping[str, Any]] = None,
                 cache_dir: Union[PathArg, bool, None] = None) -> None:
        if checksums not in CHECKSUM_POLICIES:
            raise ValueError(f"checksums must be one of {CHECKSUM_POLICIES}, got {checksums!r}")
        self.checksums = checksums
        check_data = checksums != "never"
        if isinstance(source, (str, bytes, os.PathLike)):
            source = os.fsdecode(source)
        # A legacy header (checksum 0) is refused below, once the file was told apart
        # from a record file, which is then named as what it is.
        storage_options = with_cache_dir(storage_options, cache_dir)
        self._container = container = Container(source, check_data=check_data, allow_legacy_header=True,
                                                 use_tail=True, storage_options=storage_options)
        self.path: str = container.path
        self.legacy = False  # an FFRecord pack_folder archive (packfs.core.legacy)
        try:
            self._open_table(check_data)
            # Format 1.5's codec rows (section 4f): read when first used.
            # The label through a weak reference: a bound method here made every archive a
            # reference cycle, freed (its descriptor closed) only by the cyclic collector,
            # and a shard set that drops shards to bound its descriptors ran out of them.
            self._codecs = CodecTable(container, None if self.legacy else self.footer, _weak_label(self),
                                      check_data)
            self._coded = self._codecs.active
            if self._coded:
                self._table.codecs = self._codecs
        except RecordFileError:
            container.close()
            raise
        except FormatError as error:
            explained = explain_foreign(container.source, error)
            container.close()
            raise explained from None
        except BaseException:
            container.close()
            raise
        # When contents are checked, and what the checks found (bitmaps bounded by the
        # archive's size); and the one reader of records that asks it.
        label = _weak_label(self)
        self._policy = policy = ChecksumPolicy(checksums, container, self._pieces, self.footer.data_records, label)
        self._reader = RecordReader(container, self._codecs, policy, self._pieces, label)
        # The hot paths' direct item access (read_path, read_view): memoryviews of the
        # header's and the table's columns, each value checked before it is used, set
        # on first use (__getattr__): with a tail, the sections are checked then.
        # Namedtuple fields cost more to read than attributes.
        self._data_record_count, self._entry_count = self.footer.data_records, self.footer.entry_count

    # packfs.core.inplace reads this class's archives in place (not a subclass's: it may
    # read otherwise); the flag, not an import of this module, which imports inplace.
    READS_IN_PLACE = True

    _HOT_ITEMS = frozenset(("_offset_items", "_crc_items", "_mode_items", "_record_items", "_size_items",
                            "_lookup_unchecked"))

    def __getattr__(self, name: str) -> object:
        # Only for attributes not set yet: the hot paths' item views, and the C format
        # library's Tree, on first use.
        if name in ("compiled_tree", "compiled_read") and "_policy" in self.__dict__:
            self._open_tree()
            return self.__dict__[name]
        if name in Archive._HOT_ITEMS and "_table" in self.__dict__:
            container, table = self._container, self._table
            self._offset_items, self._crc_items = container.offset_items, container.crc_items
            self._mode_items, self._record_items, self._size_items = (
                table.items("mode"), table.items("record"), table.items("size"))
            self._lookup_unchecked = table.lookup_unchecked
            return self.__dict__[name]
        raise AttributeError(name)

    def _open_tree(self) -> None:
        """The C format library's Tree over this archive, where it is built and reads it
        in place (packfs.core.inplace.compiled_reader), made at the first whole-file
        read, not at open (it duplicates the descriptor and copies the page CRCs): its
        policy is this archive's, the "once" bitmaps shared.  ``compiled_read``, its
        read_path or None, is what read_path asks first; set it to None and every read
        takes the pure-Python path (tests, bench/folder_read.py)."""
        tree = None if self._policy is CLOSED else compiled_reader(self, self.checksums != "never", self._policy)
        self.compiled_tree = tree
        self.compiled_read = tree.read_path if tree is not None else None

    def _open_table(self, check_data: bool) -> None:
        container = self._container
        if container.tail is not None:
            # Format 1.4: the tail located everything; nothing more is read now.
            self.footer = footer = container.footer
            expected = record_count_for(footer.data_records, footer.section_count)
            if container.record_count != expected:
                raise FormatError(
                    f"{self.path!r}: {container.record_count} records, but the footer's {footer.data_records} "
                    f"data records and {footer.section_count} sections need {expected}"
                )
            self._table = PathTable(container, footer)
            self._pieces = PieceTable(container, footer)
            self._xattrs = XattrTable(container, footer)
            self._table.release_pages()  # what the open faulted in (see below)
            return
        if check_data and container.legacy_header:
            # Nothing in an unchecked header is trusted beyond telling what the file is.
            if recordfile.is_record_file(container):
                raise recordfile.record_file_error(container)
            raise container.legacy_header_error()
        n = container.record_count
        if n == 0:
            raise recordfile.record_file_error(container)
        last_start = container.offset_items[n - 1]
        if container.data_start <= last_start and container.file_size < last_start:
            # Bytes are missing from the end: say so, and how many must be there.
            raise FormatError(
                f"{self.path!r}: truncated: {container.file_size} bytes, but its header puts "
                f"the last record at offset {last_start}, so it must be at least "
                f"{last_start} bytes ({last_start + FOOTER_SIZE} with a packfs archive's "
                f"{FOOTER_SIZE}-byte footer)"
            )
        if recordfile.is_record_file(container):
            raise recordfile.record_file_error(container)
        footer_data = container.record_bytes(n - 1)
        if legacy.is_legacy(footer_data):
            if check_data:
                container.check_crc(n - 1, footer_data, "FFRecord packed-folder metadata")
            self.footer, self._table = legacy.legacy_table(container, footer_data, repr(self.path))
            self._pieces = PieceTable(container, None)
            self._xattrs = XattrTable(container, None)
            self.legacy = True
            return
        if len(footer_data) == FOOTER_SIZE and check_data:
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
        self._pieces = PieceTable(container, footer)
        self._xattrs = XattrTable(container, footer)
        # Opening touched a few header and table pages; a fault may map a whole large
        # folio around each, which stayed in RSS (about 1.5 MiB an open at 100,000
        # entries, paid again by every DataLoader worker).  Lookups fault back in what
        # they use.
        self._table.release_pages()

    # -- what the archive is -------------------------------------------------------------

    @property
    def entry_count(self) -> int:
        """Entries in the path table: directories, files and symlinks, the root included."""
        return self.footer.entry_count

    @property
    def data_records(self) -> int:
        """Records that hold contents (files' and symlinks'); the table's follow them."""
        return self.footer.data_records

    @property
    def record_count(self) -> int:
        """Records in the container, the table's and the footer included."""
        return self._container.record_count

    @property
    def size(self) -> int:
        """The archive's size in bytes."""
        return self._container.file_size

    @property
    def identity(self) -> object:
        """Equal for two opens of the same bytes (locally: device, inode, size, mtime_ns)."""
        return self._container.source.identity

    @property
    def source(self) -> ByteSource:
        """Where the archive's bytes come from."""
        return self._container.source

    @property
    def data_area(self) -> tuple[int, int]:
        """Where the data records lie in the source's bytes, (start, end): after the
        header, before the path table's records (format sections 1 and 5)."""
        container = self._container
        return container.data_start, container.data_end

    @property
    def section_spans(self) -> tuple[tuple[int, int], ...] | None:
        """Where the path table's columns lie in the source's bytes (format section 4's
        order), for a reader that reads them in place (the compiled daemon); None where
        the table is not in place (legacy archives, sources without a map)."""
        return self._table.section_spans

    @property
    def piece_spans(self) -> tuple[tuple[int, int], ...] | None:
        """Where the piece CRC sections (format section 4b) lie in the source's bytes,
        or None: an archive before 1.2, a legacy one, or one read into memory."""
        container = self._container
        return self._pieces.spans if container.zero_copy else None

    @property
    def xattr_spans(self) -> tuple[tuple[int, int], ...] | None:
        """Where the extended-attribute sections (format section 4c) lie in the source's
        bytes, or None: an archive without attributes, or one read into memory."""
        return self._xattrs.spans if self._container.zero_copy else None

    @property
    def page_checks(self) -> tuple[int, tuple[tuple[int, int], ...], memoryview, int] | None:
        """What the compiled daemon needs to check a format 1.4 archive's header and
        table page by page as it reads them in place (nothing checks them at open): the
        page size, the paged regions' (start, end) in the source's bytes (the header's
        data-record CRCs, their offsets and offset[D], sections 0-20: format section 4e),
        their page CRCs (u32, region after region) and where the data records end; None
        for an archive without a tail (before 1.4; checked whole at open) or one not
        read in place."""
        container = self._container
        tail = container.tail
        if tail is None or not container.zero_copy:
            return None
        return tail.page_size, tuple(tail.regions), tail.page_crcs, tail.data_end

    @property
    def xattr_entries(self) -> int:
        """How many files, directories and symlinks have extended attributes."""
        return self._xattrs.entry_count

    @property
    def xattr_bytes(self) -> int:
        """The bytes the extended attributes take, names and values with their headers."""
        return self._xattrs.data_bytes

    def stats(self) -> dict[str, int]:
        """What reading the archive cost so far: for a remote one, ``requests`` sent
        (retries included), ``bytes_fetched``, ``retries``, and its table pages'
        ``page_cache_hits``, ``page_cache_misses`` and ``page_cache_bytes``; {} for a
        local one (its reads are the page cache's)."""
        container = self._container
        counters = dict(container.source.stats()) if hasattr(container.source, "stats") else {}
        cache = getattr(container, "page_cache", None)
        if cache is not None:
            counters.update(page_cache_hits=cache.hits, page_cache_misses=cache.misses,
                            page_cache_bytes=cache.size)
        return counters

    @property
    def version(self) -> str:
        """The format version, or what a legacy (FFRecord pack_folder) archive is."""
        if self.legacy:
            return "FFRecord pack_folder (legacy; packfs convert makes it native)"
        return f"{self.footer.version_major}.{self.footer.version_minor}"

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Close the archive: later calls raise ValueError("I/O operation on a closed
        archive"), as a closed file does.

        Nothing is released by hand: a call running in another thread holds the table
        and the container in its locals, and releasing their views under it gave
        "released memoryview", or a pread from whatever file next reused the
        descriptor's number.  So close() drops the archive's references; the objects
        free themselves (views, map, and the descriptor through the source's finalizer)
        when the last holder drops them, which for an idle archive is this call.  Files
        from :meth:`open` and views from :meth:`read_view` keep working until closed.
        """
        self._table = self._container = self._pieces = self._xattrs = CLOSED  # type: ignore[assignment]
        self._codecs = self._policy = self._reader = CLOSED  # type: ignore[assignment]
        # The item views too (they export the map, which would stay open while this
        # object lives).
        self._offset_items = self._crc_items = self._mode_items = CLOSED  # type: ignore[assignment]
        self._record_items = self._size_items = self._lookup_unchecked = CLOSED  # type: ignore[assignment]
        # The Tree holds the map and a descriptor of its own: it goes with the archive.
        self.compiled_tree = self.compiled_read = CLOSED  # type: ignore[assignment]

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._container is CLOSED

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Archive({self.path!r}, checksums={self.checksums!r})"

    def check_unchanged(self) -> None:
        """ArchiveChangedError if the archive was overwritten or truncated in place since
        it was opened (every call checks this after what it read; a front end that
        answers from what it kept, a FUSE daemon, checks again before it answers)."""
        self._container.check_unchanged()

    # -- looking up ----------------------------------------------------------------------

    def find(self, key: bytes) -> int:
        """The entry whose stored path is exactly ``key`` (canonical: no leading, trailing
        or doubled slash, no ``.`` or ``..``; symlinks are not followed), or -1.  What a
        FUSE path daemon needs: the kernel resolves symlinks and ``..`` itself."""
        return self._table.lookup(key)

    def lookup(self, path: PathArg, follow: bool = True) -> int:
        """The entry ``path`` names, following symlinks in its directories (and in its
        last component when ``follow``), as a shell would.

        Raises
        ------
        PathNotFoundError
            Nothing is there, or a symlink loops or points outside the archive.
        NotADirectoryPathError
            A component before the last is not a directory.
        """
        key = lookup_key(path)
        table = self._table
        try:
            entry = table.lookup(key)
            if entry >= 0 and (not follow or table.file_type(entry) != S_IFLNK):
                return entry
            return self._resolve(key, follow, path)
        except PackfsError:
            # A "not found" or "not a directory" read off a map rewritten in place.
            self._container.changed_instead()
            raise

    def _resolve(self, key: bytes, follow: bool, original: PathArg) -> int:
        """Slow path: walk ``key`` a component at a time, expanding symlinks."""
        table = self._table
        shown = os.fsdecode(original)
        return resolve_path(key, follow, shown, self.path, table.file_type, table.lookup_child, table.full_path,
                            lambda entry: self._link_target(entry, shown))

    def lookup_kind(self, path: PathArg, kind: int) -> int:
        """:meth:`lookup`, and NotAFileError or NotADirectoryPathError unless the entry
        is of file type ``kind`` (S_IFREG or S_IFDIR)."""
        entry = self.lookup(path)
        actual = self._table.file_type(entry)
        if actual != kind:
            self._container.changed_instead()
            if kind == S_IFDIR:
                raise NotADirectoryPathError(f"{os.fsdecode(path)!r} is not a directory but a {_KIND[actual]}")
            raise NotAFileError(f"{os.fsdecode(path)!r} is not a file but a {_KIND[actual]}")
        return entry

    def lookup_child(self, directory: int, name: bytes) -> int:
        """Entry of ``name`` in directory entry ``directory``, or -1: a binary search of
        its children, which are sorted by name (format section 4)."""
        return self._table.lookup_child(self._entry(directory), name)

    def _entry(self, entry: int) -> int:
        """``entry``, NotAFileError unless it is one: the table's columns are indexed by
        entry, and Python's indexing takes a number below 0 from the end."""
        if not 0 <= entry < self._entry_count:
            raise NotAFileError(f"{self.path!r}: no entry {entry} (the archive has {self._entry_count})")
        return entry

    # -- attributes ----------------------------------------------------------------------

    def file_type(self, entry: int) -> int:
        """Entry ``entry``'s file type bits: S_IFDIR, S_IFREG or S_IFLNK."""
        return self._table.file_type(self._entry(entry))

    def stat(self, entry: int) -> EntryStat:
        """Entry ``entry``'s attributes as stored, and its inode number.

        What every front end hands out (a mount's GETATTR, ``PackedFolder.stat``), so
        they obey the rules of the data they describe: FormatError if a file's or
        symlink's size is not its record's length, or a symlink's is not 1 to 4,095
        bytes (a mount answers EIO for that entry).  Every name of a hard-linked file
        has its first name's attributes (format section 4, ``first_link``)."""
        return EntryStat(*self._table.stat(self._entry(entry)))

    def inode(self, entry: int) -> int:
        """Entry + 1, except that every name of a hard-linked file reports its first
        name's (format section 4, ``first_link``), as on any POSIX file system."""
        return self._table.inode(self._entry(entry))

    def xattrs(self, entry: int) -> list[tuple[bytes, bytes]]:
        """Entry ``entry``'s extended attributes as (name, value) pairs in name order
        (format section 4c); every name of a hard-linked file has its first name's."""
        return self._xattrs.attributes(self._table.inode(self._entry(entry)) - 1)

    def name(self, entry: int) -> bytes:
        """Entry ``entry``'s name (the root's is empty)."""
        return self._table.name(self._entry(entry))

    def path_of(self, entry: int) -> bytes:
        """Entry ``entry``'s full path from the root, names joined by '/'."""
        return self._table.full_path(self._entry(entry))

    def parent(self, entry: int) -> int:
        """Entry ``entry``'s parent directory (the root's is the root)."""
        return self._table.parent(self._entry(entry))

    def children(self, directory: int) -> range:
        """Directory ``directory``'s children, as a range of entries (empty for a file)."""
        return self._table.children(self._entry(directory))

    def listing(self, directory: int) -> tuple[range, list[bytes], list[int]]:
        """A directory's children, their names and their modes, each read as one slice."""
        return self._table.listing(self._entry(directory))

    def listing_with_inodes(self, directory: int) -> tuple[range, list[bytes], list[int], list[int]]:
        """:meth:`listing` and the children's inode numbers (what readdir hands on)."""
        return self._table.listing_with_inodes(self._entry(directory))

    def listing_columns(self, part: Sequence[int]) -> tuple[list[bytes], list[int], list[int], list[int],
                                                             list[int], list[int], list[int]]:
        """(names, modes, uids, gids, mtimes_ns, sizes, nlinks) of the entries in
        ``part``, a slice of :meth:`children` (a range: each column read as one slice, so
        a long listing reads its directory a part at a time; any other sequence of
        entries, entry by entry).  An entry past the table is NotAFileError, as each
        entry's stat says (a slice would silently stop at the table's end)."""
        if isinstance(part, range) and part.step == 1:
            if len(part):
                self._entry(part.start)
                self._entry(part.stop - 1)
            return self._table.listing_columns(part)
        return columns_by_entry(self, part)

    def extent(self, entry: int) -> tuple[int, int]:
        """(start, end): where file or symlink ``entry``'s contents lie in the archive
        file, its table values checked (a tool that reads them itself, with O_DIRECT or
        from another host, needs no more)."""
        return self._container.checked(self._record_span, entry)

    def extents_of(self, entries: Sequence[int] | np.ndarray) -> np.ndarray:
        """:meth:`extent` of each of ``entries``, an (n, 2) int64 array, checked at once."""
        return self._container.checked(self._table.record_spans, entries, self._record_span)

    def _record_span(self, entry: int) -> tuple[int, int]:
        return self._container.record_span(self._table.record(self._entry(entry)))

    def prefetch(self, entries: Sequence[int] | np.ndarray) -> int:
        """Fetch files ``entries``' records into the node's disk cache (its single flight:
        once per node) in large ranged GETs, not read here: a window of a block-aware
        epoch, before its files are read. Bytes fetched; 0 locally or without a cache."""
        fetch = getattr(self._container.source, "prefetch_spans", None)
        return 0 if fetch is None else int(fetch(self.extents_of(entries).tolist()))

    def column(self, name: str) -> np.ndarray:
        """Table section ``name`` (format section 4) as a numpy array over the map, for
        summaries over every entry (numpy is imported on first use)."""
        return self._table.column(name)

    def release_pages(self) -> None:
        """Drop the table's and the header's mapped pages from this process's RSS (they
        stay in the page cache); later accesses fault back in what they touch."""
        self._table.release_pages()

    # -- reading -------------------------------------------------------------------------

    def _file_span(self, entry: int) -> tuple[int, int, int]:
        """(record, start, end) of regular file ``entry``, its table values checked."""
        record = self._record_items[entry]
        if record < self._data_record_count:
            container = self._container
            # A data record is never the last record (the table and footer follow), so
            # record + 1 is in range.
            offsets = self._offset_items
            start, end = offsets[record], offsets[record + 1]
            if end - start == self._size_items[entry] and container.data_start <= start and end <= container.data_end:
                return record, start, end
        # What the fast path refused: this raises FormatError saying which rule broke.
        record = self._table.record(entry)
        return (record, *self._container.record_span(record))

    def _path_span(self, path: PathArg) -> tuple[int, int, int]:
        """(record, start, end) of file ``path``; the caller checks the archive is unchanged."""
        entry = self._lookup_unchecked(lookup_key(path))
        if entry < 0 or self._mode_items[entry] & S_IFMT != S_IFREG:
            entry = self.lookup_kind(path, S_IFREG)
        return self._file_span(entry)

    def _label(self, where: int | PathArg) -> str:
        if isinstance(where, int):
            where = self._table.full_path(where)
        return repr(os.fsdecode(where))

    def read_path(self, path: PathArg) -> bytes:
        """The contents of the file at ``path`` (symlinks followed): :meth:`lookup` and
        :meth:`read` in one call, the hottest path of all (``PackedFolder.read``).

        Raises
        ------
        PathNotFoundError, NotAFileError
            ``path`` is missing or is not a file.
        ChecksumError
            The contents fail their CRC (under the policy).
        """
        # The C format library first (compiled_read): found, read, checked and decoded without
        # the GIL; None for what it does not answer (a path to normalise or through a symlink,
        # not a file, damage), which the Python path below answers or raises, the same.
        read_compiled = self.compiled_read
        if read_compiled is not None:
            contents = read_compiled(path, _WHOLE_READ_LIMIT)
            if contents is not None:
                return contents
        container = self._container
        if self._coded:
            entry = self._lookup_unchecked(lookup_key(path))  # _path_entry, inlined
            if entry < 0 or self._mode_items[entry] & S_IFMT != S_IFREG:
                entry = self.lookup_kind(path, S_IFREG)
            return self._read_coded(entry, path)
        if not container.guarded:
            container.check_size()  # the table is read through the map
        # Guarded, a small file is copied out of the map (a truncation under the copy reads
        # zeros and the check after it raises); else it is read with pread (Container.read_record
        # says why). The table and header are read through memoryviews: calls cost more.
        try:
            record, start, end = self._path_span(path)
            # The one place the checksum policy is read inline rather than asked
            # (ChecksumPolicy.check_if_due, packfs.core.checkpolicy, is the rule): on 4 KiB
            # files each call cost about 3% of the read.  A check that is due, or that
            # fails, is the policy's.
            policy = self._policy
            checked = policy.checked
            unchecked = checked is not None and not checked[record >> 3] & (1 << (record & 7))
            if unchecked:
                policy.raise_if_failed(record, path)  # not read again
            mapping = container.mapping  # a guarded map, when guarded
            if container.guarded and end - start < MAP_COPY_BYTES and mapping is not None:
                data = mapping[start:end]
            else:
                data = container.pread(start, end)
            if checked is None:
                if policy.every_read and crc32(data) != self._crc_items[record]:
                    policy.check(record, data, path)  # raises
            elif unchecked:
                policy.check(record, data, path)
        except PackfsError:
            container.changed_instead()
            raise
        container.check_unchanged()
        return data

    def read(self, entry: int, offset: int = 0, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all with -1) of file ``entry`` from ``offset`` on, read
        with pread (no page of contents joins this process's RSS), checked under the
        policy: a read of part of a file whose record needs a check checks the whole
        record first, or just the 1 MiB pieces it covers where the record has piece
        CRCs (format 1.2's files over 1 MiB).

        Raises
        ------
        NotAFileError
            ``entry`` is not a regular file (or not an entry).
        ChecksumError
            The record fails its CRC.
        """
        container = self._container
        if not container.guarded:
            container.check_size()
        try:
            # Datasets read whole files by entry, a small file per call: the type check is
            # inlined, as in read_path.
            if not 0 <= entry < self._entry_count or self._mode_items[entry] & S_IFMT != S_IFREG:
                self._regular_file(entry)  # raises, saying what the entry is
            if self._coded:
                return self._read_coded(entry, entry, offset, size)
            record, start, end = self._file_span(entry)
            if not (offset or size >= 0) and end - start < MAP_COPY_BYTES:
                # A small file whole, one call to the policy (a record that failed before
                # is read again: a small pread costs less than a second call would).
                data = container.pread(start, end)
                self._policy.check_if_due(record, data, entry)
            else:
                begin = min(max(offset, 0), end - start)
                stop = end - start if size < 0 else min(end - start, begin + size)
                data = self._reader.read_stored(record, start, end, begin, stop, entry)
        except PackfsError:
            container.changed_instead()
            raise
        container.check_unchanged()
        return data

    def _regular_file(self, entry: int) -> int:
        if not 0 <= entry < self.footer.entry_count or self._table.file_type(entry) != S_IFREG:
            raise NotAFileError(f"{self.path!r}: entry {entry} is not a file")
        return entry

    def check(self, entry: int) -> None:
        """Check file ``entry``'s CRC as a read of all of it would under the policy (so
        "once" remembers it); ChecksumError if it fails."""
        container = self._container
        if self._coded and self._codec_row(entry).codec != CODEC_STORED:
            self._check_coded(entry)
            return
        try:
            record = self._file_span(self._regular_file(entry))[0]
            self._policy.check_if_due(record, None, entry)
        except PackfsError:
            container.changed_instead()
            raise
        container.check_unchanged()

    def read_view(self, path: PathArg) -> memoryview:
        """A zero-copy, read-only view of the file at ``path`` in the map, checked under
        the policy.  The one read not protected from the archive being overwritten in
        place while the view is held (``PackedFolder.read_view`` says what happens).
        A file whose record is not stored as it is (format 1.5: compressed, sparse) is
        decoded: its view is of a copy (bytes), as from a source without a map."""
        container = self._container
        if not container.zero_copy or (self._coded and self._codec_row(self._path_entry(path)).codec != CODEC_STORED):
            return memoryview(self.read_path(path))
        if not container.guarded:
            container.check_size()
        try:
            record, start, end = self._path_span(path)
            view = container.view[start:end]
            self._policy.check_if_due(record, view, path)
        except PackfsError:
            container.changed_instead()
            raise
        container.check_unchanged()
        return view

    def open(self, entry: int, name: str = "") -> PackedFile:
        """A seekable, read-only binary file over file ``entry`` (a
        :class:`~packfs.core.files.PackedFile`): its CRC is checked here under the
        policy ("always" checks it once per file object, not on every read).  A file of
        at most SMALL_FILE_BYTES (UNCHECKED_SMALL_FILE_BYTES where no check is due) is
        read here, whole, and the bytes checked are the bytes its reads return (a
        MemoryFile); a larger one is read as it is read, each read checking that the
        archive was not changed in place (a StreamFile)."""
        container = self._container
        if self._coded and self._codec_row(entry).codec != CODEC_STORED:
            return self._open_coded(entry, name)
        if not container.guarded:
            container.check_size()
        try:
            record, start, end = self._file_span(self._regular_file(entry))
            policy = self._policy
            check = policy.must_check(record, name or entry)
            data = None
            if end - start <= (SMALL_FILE_BYTES if check else UNCHECKED_SMALL_FILE_BYTES):
                data = container.pread(start, end)
                if check:
                    policy.check(record, data, name or entry)
            elif check:
                policy.check(record, None, name or entry)
        except PackfsError:
            container.changed_instead()
            raise
        container.check_unchanged()
        if data is not None:
            return MemoryFile(data, name)
        return StreamFile(container, start, end, name)

    def read_batch(self, entries: Sequence[int] | np.ndarray) -> Iterator[tuple[int, bytes]]:
        """(position in ``entries``, contents) of each file in ``entries``, in archive
        order: each file checked under the policy as it is yielded, so a caller that
        transforms each one holds one file's bytes at a time.  The table values of the
        whole batch are checked before anything is read; a run of adjacent small files
        is read with one pread.  From a URL, the batch is fetched as :meth:`read_many`
        fetches it (neighbours share a GET, many in flight, groups bounded in bytes)."""
        container = self._container
        if not container.zero_copy:
            # From a URL: the batch's spans fetched in parallel (read_many's path); the
            # header's and the table's whole arrays that read_entries indexes would be
            # fetched whole, and grow with the archive.
            yield from self._read_located(entries)
            return
        if not container.guarded:
            container.check_size()
        try:
            yield from read_entries(self, self._table, container, entries, self._reader,
                                    self._codecs if self._coded else None)
        except PackfsError:
            container.changed_instead()
            raise

    def read_many(self, items: Sequence[int | PathArg] | np.ndarray) -> list[bytes]:
        """The contents of each file in ``items``, in the order asked: entries (ints) or
        paths (symlinks followed, as :meth:`read_path` follows them), duplicates
        allowed.  Each file's CRC is checked under the policy before it is returned; a
        ChecksumError names the path (the one asked for, or an entry's stored path).

        From a source without a map (an archive at a URL) every file is located first
        (its table values checked), then the spans, in offset order, are fetched with
        :func:`~packfs.core.files.read_spans`: neighbours share a ranged GET and many
        are in flight at once, in groups bounded in bytes.  A local archive reads each
        file as :meth:`read_path` and :meth:`read` do (pread, or a copy out of the map).

        Raises
        ------
        PathNotFoundError, NotAFileError
            An item is missing or is not a regular file (nothing is returned).
        ChecksumError
            A file fails its CRC.
        TypeError
            ``items`` is one path (whose characters would be read as paths), not a list.
        """
        if isinstance(items, (str, bytes, os.PathLike)):
            raise TypeError(f"read_many takes a list of paths or entries, not one path ({items!r})")
        if self._container.zero_copy:
            read, read_path = self.read, self.read_path
            return [read_path(item) if isinstance(item, (str, bytes, os.PathLike)) else read(operator.index(item))
                    for item in items]
        results: list[bytes] = [b""] * len(items)
        for position, data in self._read_located(items):
            results[position] = data
        return results

    def _locate(self, item: int | PathArg) -> tuple[int, int, int]:
        """(record, start, end) of the regular file ``item`` names (an entry or a path),
        its table values checked."""
        if isinstance(item, (str, bytes, os.PathLike)):
            return self._path_span(item)
        entry = operator.index(item)
        if not 0 <= entry < self._entry_count or self._mode_items[entry] & S_IFMT != S_IFREG:
            self._regular_file(entry)  # raises, saying what the entry is
        return self._file_span(entry)

    def _read_located(self, items: Sequence[int | PathArg] | np.ndarray) -> Iterator[tuple[int, bytes]]:
        """(position in ``items``, contents) of each file, in offset order, fetched from a
        source without a map by :func:`read_spans` and checked under the policy before
        it is yielded.  Every item is located (and refused) before anything is fetched."""
        container = self._container
        try:
            self._prefetch_pages(items)
            coded = self._coded
            coded_rows: dict[int, tuple[int, CodecRow]] = {}  # position -> (size, codec row)
            located, names = [], []  # names: what a ChecksumError names (the path asked, or the entry)
            for position, item in enumerate(items):
                where = item if isinstance(item, (str, bytes, os.PathLike)) else operator.index(item)
                if coded:
                    entry = self._path_entry(where) if not isinstance(where, int) else self._regular_file(where)
                    record, start, end, size, row = self._coded_span(entry, where)
                    coded_rows[position] = (size, row)
                else:
                    record, start, end = self._locate(where)
                located.append((start, end, record, position))
                names.append(where)
            located.sort()
            for group, contents in read_spans(container.source, [(start, end) for start, end, _, _ in located]):
                # Unchanged after the fetch: the bytes, and every table value used above,
                # are the archive's as it was opened.
                container.check_unchanged()
                for k, data in zip(group, contents):
                    _, _, record, position = located[k]
                    size, row = coded_rows.pop(position) if coded else (0, STORED_ROW)
                    yield position, self._reader.decode_whole(record, data, size, row, names[position])
        except PackfsError:
            container.changed_instead()
            raise

    def _prefetch_pages(self, items: Sequence[int | PathArg] | np.ndarray) -> None:
        """Before a batch's files are located one by one: the table pages they need,
        fetched at once from a remote 1.4 archive (its lookup-index pages for paths;
        for entries, their columns' pages, then their records' offsets and CRCs), so a
        cold batch waits two round trips for its pages, not one for each.  Items that
        are no file are left to be refused where they are located."""
        fetch_many = getattr(self._container.source, "read_ranges", None)
        if fetch_many is None or not len(items):
            return
        keys, entries = [], []
        for item in items:
            if isinstance(item, (str, bytes, os.PathLike)):
                try:
                    keys.append(lookup_key(item))
                except PackfsError:
                    pass
            else:
                entries.append(operator.index(item))
        self._table.prefetch_paths(keys, fetch_many)
        if not entries:
            return
        prefetch_pages([(self._mode_items, entries), (self._record_items, entries), (self._size_items, entries)],
                       fetch_many)
        count, records = self._data_record_count, []
        for entry in entries:
            if 0 <= entry < self._entry_count:
                record = self._record_items[entry]
                if record < count:
                    records.append(record)
        wanted = [(self._offset_items, records + [record + 1 for record in records]), (self._crc_items, records)]
        if self._coded:  # and their codec rows (format 1.5), 16 bytes each
            wanted.append((self._codecs.row_items(), [record << 4 for record in records]))
        prefetch_pages(wanted, fetch_many)

    def read_chunks(self, entry: int, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """File ``entry``'s contents in chunks of ``chunk_size`` bytes, read with pread
        (from a remote source: read ahead in windows of parallel ranged parts);
        the CRC (computed as they go, whatever the policy) is compared after the last
        chunk, and a mismatch raises ChecksumError then: a caller writing the chunks out
        publishes them only once the iterator is exhausted (packfs unpack does)."""
        container = self._container
        if self._coded and self._codec_row(entry).codec != CODEC_STORED:
            yield from self._coded_chunks(entry, chunk_size)
            return
        record, begin, end = container.checked(self._file_span, self._regular_file(entry))
        yield from self._reader.stored_chunks(record, begin, end, entry, chunk_size)

    # -- reading with codecs (format 1.5, section 4f) -------------------------------------

    def _path_entry(self, path: PathArg) -> int:
        """The regular file ``path`` names (symlinks followed): NotAFileError otherwise."""
        entry = self._lookup_unchecked(lookup_key(path))
        if entry < 0 or self._mode_items[entry] & S_IFMT != S_IFREG:
            entry = self.lookup_kind(path, S_IFREG)
        return entry

    def _coded_span(self, entry: int, where: int | PathArg) -> tuple[int, int, int, int, CodecRow]:
        """(record, start, end, size, codec row) of regular file ``entry`` in an archive
        with codecs, every value checked (section 4f's row and size rules)."""
        record = self._record_items[entry]
        if record >= self._data_record_count:
            self._table.record(entry)  # raises, naming the rule
        start, end = self._container.record_span(record)
        size = self._size_items[entry]
        return record, start, end, size, self._codecs.file_row(record, size, end - start, where)

    def _codec_row(self, entry: int) -> CodecRow:
        """Regular file ``entry``'s codec row, checked (NotAFileError for another entry)."""
        container = self._container
        return container.checked(lambda: self._coded_span(self._regular_file(entry), entry)[4])

    def _read_coded(self, entry: int, where: int | PathArg, offset: int = 0, size: int = -1) -> bytes:
        """:meth:`read` (and :meth:`read_path`) in an archive with codecs: the record
        located and its row checked here, read, checked and decoded by the
        :class:`~packfs.core.recordreader.RecordReader`.  A part of a frames or sparse
        file reads and decodes only the frames or extents it covers."""
        container = self._container
        if not container.guarded:
            container.check_size()
        try:
            # _coded_span, inlined (the hot path of small compressed files).
            record = self._record_items[entry]
            if record < self._data_record_count:
                offsets = self._offset_items
                start, end = offsets[record], offsets[record + 1]
                if not container.data_start <= start <= end <= container.data_end:
                    container.record_span(record)  # raises, naming the rule
            else:
                self._table.record(entry)  # raises, naming the rule
            length = self._size_items[entry]
            row = self._codecs.file_row(record, length, end - start, where)
            reader = self._reader
            if offset or size >= 0:
                begin = min(max(offset, 0), length)
                stop = length if size < 0 else min(length, begin + size)
                data = reader.read_range(record, start, end, length, row, where, begin, stop, reader.recent())
            else:
                data = reader.read_whole(record, start, end, length, row, where)
        except PackfsError:
            container.changed_instead()
            raise
        container.check_unchanged()
        return data

    def _check_coded(self, entry: int) -> None:
        """:meth:`check` of a file whose record is not stored as it is (in bounded memory)."""
        self._container.checked(lambda: self._reader.check_record(*self._coded_span(self._regular_file(entry), entry),
                                                                  entry))

    def _open_coded(self, entry: int, name: str) -> PackedFile:
        """:meth:`open` of a file whose record is not stored as it is: a zstd file, or a
        frames or sparse file of at most SMALL_FILE_BYTES, decoded whole here (a
        MemoryFile); a larger one a DecodedFile, whose reads decode only the frames or
        read only the extents they cover (a sparse file's record checked here, under
        the policy; each frame against its own CRCs as it is decoded)."""
        where = name or entry
        container = self._container
        try:
            record, start, end, length, row = self._coded_span(self._regular_file(entry), where)
            if row.codec == CODEC_ZSTD or length <= SMALL_FILE_BYTES:
                data = self._reader.read_whole(record, start, end, length, row, where)
            else:
                data = None
                layout = None
                if row.codec == CODEC_SPARSE:
                    self._policy.check_if_due(record, None, where)
                    layout = self._codecs.sparse_layout(row, record, length, end - start, where)
        except PackfsError:
            container.changed_instead()
            raise
        container.check_unchanged()
        if data is not None:
            return MemoryFile(data, name)
        return DecodedFile(container, self._reader, record, start, end, length, row, layout, name, where)

    def _coded_chunks(self, entry: int, chunk_size: int) -> Iterator[bytes]:
        """:meth:`read_chunks` of a file whose record is not stored as it is: its
        decoded contents in chunks (a sparse file's holes as zeros), every stored and
        decoded byte checked whatever the policy."""
        position = 0
        for offset, data in self.read_extents(entry, chunk_size):
            yield from _zeros(offset - position, chunk_size)
            # A zstd file's one extent is all of it: cut to size as every other chunk is.
            yield from (data[at : at + chunk_size] for at in range(0, len(data), chunk_size)) if len(
                data) > chunk_size else (data,)
            position = offset + len(data)
        yield from _zeros(self._table.size(entry) - position, chunk_size)

    def read_extents(self, entry: int, chunk_size: int = 1 << 20) -> Iterator[tuple[int, bytes]]:
        """(offset, bytes) of file ``entry``'s contents, in order, in chunks of at most
        ``chunk_size`` bytes (a zstd file in one), leaving out a sparse file's holes
        (format 1.5, section 4f: they read as zeros): what ``unpack`` writes, seeking
        over the holes.  Every stored and decoded byte is checked whatever the policy;
        a stored or sparse record's CRC is compared after its last chunk (ChecksumError
        then: a caller publishes what it wrote only once the iterator is exhausted)."""
        container = self._container
        entry = self._regular_file(entry)
        if self._coded:
            record, start, end, length, row = container.checked(self._coded_span, entry, entry)
        else:
            record, start, end = container.checked(self._file_span, entry)
            length, row = end - start, STORED_ROW
        yield from self._reader.extents(record, start, end, length, row, entry, chunk_size)

    def readlink(self, entry: int, check: bool | None = None) -> bytes:
        """Symlink ``entry``'s target as stored; CRC-checked under the policy (or
        whatever ``check`` says), and checked to be one a symlink can hold (format
        section 5).  NotAFileError if ``entry`` is not a symlink."""
        if self._table.file_type(self._entry(entry)) != S_IFLNK:
            raise NotAFileError(f"{self.path!r}: entry {entry} is not a symlink")
        return self._link_target(entry, entry, check)

    def _link_target(self, entry: int, where: int | PathArg, check: bool | None = None) -> bytes:
        table, container = self._table, self._container
        record = table.record(entry)
        # Refused before any byte is copied or checked: a long target costs its length
        # to read and, as path components, to walk.
        problem = symlink_length_problem(table.size(entry))
        if problem is None:
            target = container.checked(container.record_bytes, record)
            if check is None:
                self._policy.check_if_due(record, target, where)
            elif check:
                self._policy.check(record, target, where)
            problem = symlink_target_problem(target)
        if problem:
            raise FormatError(f"{self.path!r}: {self._label(where)}: symlink with {problem}")
        return target

    # -- checking everything -------------------------------------------------------------

    def scanning(self) -> ContextManager[None]:
        """A context for reading the whole archive in archive order (unpack): from a URL
        without a disk cache, its bytes are then fetched once, in large windows read
        ahead, rather than a request per file (:meth:`Container.scanning`)."""
        return self._container.scanning()

    def verify(self, progress: Callable[[int], None] | None = None) -> VerifyReport:
        """Check every CRC in the archive (header, tables, every record), every rule of
        the path table and each path's stored hash, whatever the policy.

        ``progress`` is called with byte counts as records are checked.
        """
        return verify_archive(self._container, self._table, progress, self._pieces, self._xattrs, self._codecs)

    @property
    def has_codecs(self) -> bool:
        """Whether the archive uses format 1.5's codecs (section 4f: its footer's
        FLAG_CODECS): files compressed, sharing records or sparse."""
        return self._coded

    def codec_summary(self, top: int = 5) -> dict[str, object]:
        """What the codecs did (:meth:`packfs.core.codecs.CodecTable.summary`): stored
        and original bytes, ratio, files per codec, bytes saved by shared records,
        dictionaries, and the ``top`` kinds of file by extension."""
        return self._codecs.summary(self._table, top)

    def codec(self, entry: int) -> int:
        """File ``entry``'s codec (format 1.5, section 4f): CODEC_STORED, CODEC_ZSTD,
        CODEC_FRAMES or CODEC_SPARSE (always CODEC_STORED in an archive without codecs),
        its row and size checked."""
        if not self._coded:
            self._regular_file(entry)
            return CODEC_STORED
        return self._codec_row(entry).codec

    def unpack_bytes(self) -> int:
        """The bytes an unpack of the whole archive writes to disk: each regular file's
        size once per inode (a hard link's other names are links), a sparse file's only
        its data (its holes are skipped, format 1.5 section 4f); what ``unpack`` compares
        with the destination's free space before it writes anything.  In chunks, with
        numpy: memory bounded whatever the number of entries."""
        import numpy as np

        table, container = self._table, self._container
        mode, record, size = table.column("mode"), table.column("record"), table.column("size")
        nlink, first_link = table.column("nlink"), table.column("first_link")
        sparse = self._codecs.codec_column() == CODEC_SPARSE if self._coded else None
        offsets, count, chunk, total = container.offsets, self.entry_count, 1 << 16, 0
        for start in range(0, count, chunk):
            end = min(count, start + chunk)
            index = np.arange(start, end)
            primary = ((mode[start:end] & S_IFMT) == S_IFREG) & (
                (nlink[start:end] <= 1) | (first_link[start:end] == 0) | (first_link[start:end] == index))
            sizes = size[start:end][primary].astype(np.float64)  # no overflow on a hostile 2**64 - 1
            if sparse is not None:
                records = record[start:end][primary]
                valid = records < self._data_record_count
                holey = np.zeros(len(records), bool)
                holey[valid] = sparse[records[valid].astype(np.int64)]
                stored = records[holey].astype(np.int64)
                sizes[holey] = (offsets[stored + 1] - offsets[stored]).astype(np.float64)
            total += int(sizes.sum())
        return total

    def check_records(self) -> int:
        """Check that the records the entries name are what writing the whole archive out
        may trust (format section 5: offsets non-decreasing, each record named by one
        entry or by the names of one hard-linked file), and return the bytes an unpack
        writes.  FormatError names the first entry that breaks a rule."""
        container = self._container
        container.check_offsets()
        total = tablecheck.check_records(self._table)
        if total > container.file_size:  # implied by the rules above; the invariant itself
            raise FormatError(f"{self.path!r}: its records add up to {total} bytes, more than the "
                              f"archive's {container.file_size}")
        return total


def columns_by_entry(reader: Any, entries: Iterable[int]) -> tuple[list[bytes], list[int], list[int], list[int],
                                                                  list[int], list[int], list[int]]:
    """``listing_columns`` of ``entries`` asked of ``reader`` (an Archive or a ShardSet)
    entry by entry, through its ``name`` and ``stat``: what either does where its
    columns cannot be read as one slice."""
    names: list[bytes] = []
    columns: tuple[list[int], ...] = ([], [], [], [], [], [])
    for entry in entries:
        stat = reader.stat(entry)
        names.append(reader.name(entry))
        for column, value in zip(columns, (stat.mode, stat.uid, stat.gid, stat.mtime_ns, stat.size, stat.nlink)):
            column.append(value)
    modes, uids, gids, mtimes, sizes, nlinks = columns
    return names, modes, uids, gids, mtimes, sizes, nlinks
