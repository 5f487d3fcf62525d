"""ArchiveReader: the reader interface every front end reads through.

:class:`~packfs.core.Archive` (one archive) and :class:`~packfs.core.ShardSet` (several
archives as one tree) both provide it, and :func:`~packfs.core.open_archive` returns
either; a front end (``PackedFolder``, the datasets, fsspec, FFRecord's API, unpack,
the FUSE daemons, the CLI) annotates what it holds as ``ArchiveReader``, as
ratarmount's ``MountSource`` and zarr's ``Store`` declare what their back ends share.
The docstrings here are the contract; ``tests/contract/`` checks every reader against
them, the compiled daemon's ``_lowlevel.Tree`` too (through an adapter).

Identity.  Entries are numbered 0 (the root) to ``entry_count - 1`` and a number never
changes while the reader is open.  A front end reports ``inode(entry)``: ``entry + 1``
except that every name of a hard-linked file reports its first name's, and a directory
several shards of a set hold reports its canonical (first) entry's.

Errors.  Every call raises from the :class:`~packfs.errors.PackfsError` hierarchy
alone: ``PathNotFoundError``, ``NotAFileError``, ``NotADirectoryPathError`` for what
is asked, ``FormatError`` (``ChecksumError`` for a CRC that does not match,
``ArchiveChangedError`` for an archive rewritten in place) for what is read, and
``ClosedArchiveError`` for every call after :meth:`ArchiveReader.close`.  A number that
is no entry (below 0, or ``entry_count`` and above) is ``NotAFileError`` ("no entry N")
from every call that takes an entry.

``isinstance(x, ArchiveReader)`` checks that every member is there; before Python 3.12
that reads each property, and a set's properties open its shards: code on a hot path
tests for :class:`~packfs.core.Archive` or :class:`~packfs.core.ShardSet`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Protocol, Sequence, Union, runtime_checkable

from .archive import EntryStat
from .files import PackedFile
from .paths import PathArg
from .verify import VerifyReport

__all__ = ["ArchiveReader", "FooterCounts"]


class FooterCounts(Protocol):
    """What a reader reports as its footer: the format version and the entry count."""

    @property
    def version_major(self) -> int:
        """The format's major version."""
        ...

    @property
    def version_minor(self) -> int:
        """The format's minor version (a set reports its first shard's)."""
        ...

    @property
    def entry_count(self) -> int:
        """Entries, the root included."""
        ...


@runtime_checkable
class ArchiveReader(Protocol):
    """An archive opened for reading, by entry number: what :class:`~packfs.core.Archive`
    and :class:`~packfs.core.ShardSet` share and front ends use."""

    path: str
    """What was opened, as messages show it (a URL without its credentials)."""

    checksums: str
    """The checksum policy, one of ``CHECKSUM_POLICIES``: ``"always"`` checks a
    record's CRC at every read (a read of part of a record checks what it covers: the
    whole record, or the 1 MiB pieces of a record with piece CRCs); ``"once"`` at its
    first read, the outcome remembered (a record that failed fails every later read at
    once, without being read again); ``"never"`` not at all.  In an archive with
    codecs (format 1.5) decoded bytes are checked against their own CRC but under
    ``"never"``, and never decoded past their declared size."""

    legacy: bool
    """Whether this is an FFRecord ``pack_folder`` archive (no packfs footer)."""

    # -- what the archive is ------------------------------------------------------------

    @property
    def footer(self) -> FooterCounts:
        """The format version and entry count, as the footer states them."""
        ...

    @property
    def entry_count(self) -> int:
        """Entries in the tree (directories, files, symlinks), the root included; a set
        counts a directory several shards hold once per shard."""
        ...

    @property
    def data_records(self) -> int:
        """Records holding contents (files' and symlinks')."""
        ...

    @property
    def record_count(self) -> int:
        """Records in the container(s), the tables' and footers' included."""
        ...

    @property
    def size(self) -> int:
        """The archive's bytes (a set's: its shards' together)."""
        ...

    @property
    def identity(self) -> object:
        """Equal for two opens of the same bytes."""
        ...

    @property
    def version(self) -> str:
        """The format version in words."""
        ...

    @property
    def section_spans(self) -> tuple[tuple[int, int], ...] | None:
        """Where the path table's columns lie in one file read in place (for the
        compiled daemon), else None."""
        ...

    @property
    def has_codecs(self) -> bool:
        """Whether some file is stored through format 1.5's codecs (compressed, shared
        with another file, sparse)."""
        ...

    @property
    def xattr_entries(self) -> int:
        """How many entries have extended attributes."""
        ...

    @property
    def xattr_bytes(self) -> int:
        """The bytes the extended attributes take."""
        ...

    def codec_summary(self, top: int = 5) -> dict[str, object]:
        """What the codecs did: stored and original bytes, ratio, files per codec, bytes
        saved by shared records, dictionaries, and the ``top`` kinds of file."""
        ...

    def stats(self) -> dict[str, int]:
        """What reading cost so far (requests, bytes fetched, page-cache counters for a
        remote archive; {} for a local one)."""
        ...

    # -- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Close the reader; closing twice does nothing.  Every later call that reads
        the archive (a lookup, an attribute, a listing, a read) raises
        ``ClosedArchiveError`` (a ``ValueError``, as a closed file's calls do); files
        from :meth:`open` and views from :meth:`read_view` keep working until closed."""
        ...

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        ...

    def __enter__(self) -> Any:
        """The reader itself; :meth:`close` at the block's end."""
        ...

    def __exit__(self, *exc: object) -> None:
        """:meth:`close`."""
        ...

    def check_unchanged(self) -> None:
        """ArchiveChangedError if the bytes read so far changed in place since opened."""
        ...

    def release_pages(self) -> None:
        """Drop mapped table pages from this process's RSS (they fault back in)."""
        ...

    # -- looking up ---------------------------------------------------------------------

    def find(self, key: bytes) -> int:
        """The entry stored at exactly ``key`` (canonical: no leading, trailing or doubled
        slash, no ``.`` or ``..``; ``b""`` is the root; symlinks not followed), or -1."""
        ...

    def lookup(self, path: PathArg, follow: bool = True) -> int:
        """The entry ``path`` names (a leading slash, ``.``, ``..`` and doubled slashes
        allowed), symlinks in its directories followed and in its last component when
        ``follow``, as a shell does (40 hops at most).  PathNotFoundError when nothing
        is there (a dangling or looping symlink, a target outside the tree),
        NotADirectoryPathError when a component before the last is not a directory."""
        ...

    def lookup_kind(self, path: PathArg, kind: int) -> int:
        """:meth:`lookup`, then NotAFileError (``kind`` S_IFREG) or
        NotADirectoryPathError (``kind`` S_IFDIR) unless the entry is of that type."""
        ...

    def lookup_child(self, directory: int, name: bytes) -> int:
        """The entry named ``name`` in ``directory``, or -1 (also for a non-directory)."""
        ...

    # -- attributes ---------------------------------------------------------------------

    def file_type(self, entry: int) -> int:
        """Entry ``entry``'s file type bits: S_IFDIR, S_IFREG or S_IFLNK."""
        ...

    def stat(self, entry: int) -> EntryStat:
        """``EntryStat(mode, uid, gid, mtime_ns, size, nlink, inode)`` as stored: mode
        with its type bits; a file's size is its contents' (decoded) length, a symlink's
        its target's; a directory's nlink is 2 plus its subdirectories; ``inode`` is
        :meth:`inode`'s.  Every name of a hard-linked file has its first name's.
        FormatError if the sizes break the format's rules."""
        ...

    def inode(self, entry: int) -> int:
        """The inode number a front end reports (the module's Identity)."""
        ...

    def name(self, entry: int) -> bytes:
        """Entry ``entry``'s last path component (the root's is ``b""``)."""
        ...

    def path_of(self, entry: int) -> bytes:
        """Entry ``entry``'s stored path from the root (``b""`` for the root)."""
        ...

    def parent(self, entry: int) -> int:
        """Entry ``entry``'s parent directory (the root's is the root)."""
        ...

    def xattrs(self, entry: int) -> list[tuple[bytes, bytes]]:
        """Entry ``entry``'s extended attributes as (name, value), in name order; every
        name of a hard-linked file has its first name's; [] without any."""
        ...

    def codec(self, entry: int) -> int:
        """File ``entry``'s codec (CODEC_STORED, CODEC_ZSTD, CODEC_FRAMES, CODEC_SPARSE);
        NotAFileError for anything but a regular file."""
        ...

    def extent(self, entry: int) -> tuple[int, int]:
        """(start, end) of file or symlink ``entry``'s stored bytes in its archive file."""
        ...

    def extents_of(self, entries: Sequence[int]) -> Any:
        """:meth:`extent` of each of ``entries`` as an (n, 2) int64 array, the table's values
        checked for all at once (a plan over millions of files); raises as :meth:`extent`."""
        ...

    def column(self, name: str) -> Any:
        """Path-table section ``name`` over every entry, as a numpy array."""
        ...

    def prefetch(self, entries: Sequence[int]) -> int:
        """Make the stored bytes of files ``entries`` present in the node's disk cache
        (an archive at a URL read through one), fetched in a few large ranged GETs and
        once per node, without returning them: what a reader asks before reading many
        files of one stretch of the archive.  The bytes fetched; 0 for a local archive
        or one read without a disk cache."""
        ...

    # -- listings -----------------------------------------------------------------------

    def children(self, directory: int) -> Sequence[int]:
        """Directory ``directory``'s children in name order (bytewise), ``.`` and ``..``
        not included; empty for a file or symlink."""
        ...

    def listing(self, directory: int) -> tuple[Sequence[int], list[bytes], list[int]]:
        """(:meth:`children`, their names, their modes), in the same order."""
        ...

    def listing_with_inodes(self, directory: int) -> tuple[Sequence[int], list[bytes], list[int], list[int]]:
        """:meth:`listing` and each child's :meth:`inode`."""
        ...

    def listing_columns(self, part: Sequence[int]) -> tuple[list[bytes], list[int], list[int], list[int], list[int],
                                                              list[int], list[int]]:
        """(names, modes, uids, gids, mtimes_ns, sizes, nlinks) of the entries of
        ``part``, a slice of :meth:`children`, as :meth:`name` and :meth:`stat` give them."""
        ...

    # -- reading ------------------------------------------------------------------------

    def read(self, entry: int, offset: int = 0, size: int = -1) -> bytes:
        """Up to ``size`` bytes (-1: to the end) of file ``entry``'s contents from
        ``offset`` (past the end: ``b""``), checked under the policy.  NotAFileError for
        a directory, a symlink or a number that is no entry."""
        ...

    def read_path(self, path: PathArg) -> bytes:
        """The whole contents of the file at ``path`` (symlinks followed): :meth:`lookup`
        and :meth:`read` in one call.  PathNotFoundError, NotAFileError."""
        ...

    def read_view(self, path: PathArg) -> memoryview:
        """A read-only view of :meth:`read_path`'s bytes (zero-copy where the archive is
        mapped and the file stored as it is)."""
        ...

    def open(self, entry: int, name: str = "") -> PackedFile:
        """A seekable, read-only binary file object over file ``entry`` (``read``,
        ``readinto``, ``seek``, ``tell``, ``readable``, ``seekable``), its contents
        checked under the policy at most once per file object; ``name`` is its name."""
        ...

    def read_many(self, items: Sequence[Union[int, PathArg]]) -> list[bytes]:
        """The contents of each item, entries (ints) or paths (symlinks followed), in the
        order asked, duplicates allowed; every item located before any is returned.
        TypeError for one path given instead of a list."""
        ...

    def read_batch(self, entries: Sequence[int]) -> Iterator[tuple[int, bytes]]:
        """(position in ``entries``, contents) of each file, in an order of the reader's
        choosing (its archive order), each checked under the policy."""
        ...

    def read_chunks(self, entry: int, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """File ``entry``'s contents in chunks of at most ``chunk_size`` bytes; every
        byte checked whatever the policy, a stored record's CRC compared after the last
        chunk (ChecksumError then)."""
        ...

    def read_extents(self, entry: int, chunk_size: int = 1 << 20) -> Iterator[tuple[int, bytes]]:
        """(offset, bytes) of file ``entry``'s contents in order, a sparse file's holes
        left out (they read as zeros); checked as :meth:`read_chunks`."""
        ...

    def readlink(self, entry: int, check: bool | None = None) -> bytes:
        """Symlink ``entry``'s target as stored, checked under the policy (or as
        ``check`` says); NotAFileError for anything but a symlink."""
        ...

    def check(self, entry: int) -> None:
        """Check file ``entry``'s CRC as a read of all of it would under the policy;
        ChecksumError if it fails."""
        ...

    # -- checking everything ------------------------------------------------------------

    def verify(self, progress: Callable[[int], None] | None = None) -> VerifyReport:
        """Check every CRC and every rule of the tables, whatever the policy."""
        ...

    def check_records(self) -> int:
        """Check what writing the whole tree out trusts (records named once, in
        order); the bytes an unpack writes."""
        ...

    def unpack_bytes(self) -> int:
        """The bytes an unpack of the whole tree writes: each regular file's once per inode,
        a sparse file's data without its holes."""
        ...
