"""What a pack is given and what it reports: :class:`Entry` (one path of the tree to
write), :class:`PackProgress` (who is told as it goes) and :class:`PackStats` (what
it wrote).  Shared by the builder (:mod:`.builder`) and every driver that feeds it
(:mod:`.pack`'s directory and entries, :mod:`.archives`' tar and zip, :mod:`.shards`,
:mod:`.convert`, :mod:`.dask`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import IO, Callable, Literal, Mapping, Optional, Protocol, Union

from ..core.files import PackedFile
from ..core.paths import PathArg, archive_key
from .skips import SkippedPath

__all__ = ["Entry", "PackStats", "PackProgress", "PathLike", "Data", "Xattrs", "Readable", "Stream", "readinto_of",
           "close_stream"]

PathLike = PathArg
class Readable(Protocol):
    """What a file's data given as a stream must do: the one read a pack makes of it is
    ``readinto`` (a binary file object, a :class:`~packfs.core.PackedFile`, a tar
    member all do), and the pack closes what a callable returned."""

    def readinto(self, buffer: bytearray | memoryview) -> int | None:
        """Fill ``buffer`` from the next bytes: how many (0 at the end)."""

    def close(self) -> None:
        """Release the stream."""


# A PackedFile (an archive's file, as convert copies them) is an io object of one of two
# kinds; the class the checker sees declares neither readinto nor close.
Stream = Union[IO[bytes], Readable, PackedFile]
Data = Union[bytes, bytearray, memoryview, Stream, Callable[[], Stream], None]


def readinto_of(source: Stream) -> Callable[[bytearray | memoryview], int | None]:
    """``source``'s readinto, the one read a pack makes of a stream."""
    # typeshed's typing.IO declares no readinto, which every binary file object has
    # (io.RawIOBase, io.BufferedIOBase, a tar member, a zip member, a PackedFile).
    return source.readinto  # type: ignore[union-attr]


def close_stream(source: Stream) -> None:
    """Close ``source`` (one a callable of an Entry's data returned)."""
    source.close()  # type: ignore[union-attr]  # PackedFile's close is its io class's, as above
# Extended attributes by name, the names all str or all bytes (a Mapping is invariant in
# its keys: Mapping[str | bytes, bytes] would refuse a dict of bytes names).
Xattrs = Union[Mapping[str, bytes], Mapping[bytes, bytes]]



class PackProgress(Protocol):
    """What pack_folder and pack_entries report progress to (the CLI draws a bar from it).

    ``start`` may be called again, with new totals, when a pack has a second phase
    (see :func:`pack_entries`); a total of 0 means unknown.
    """

    def start(self, total_files: int, total_bytes: int) -> None:
        """A pack (or its next phase) begins: ``total_files`` and ``total_bytes`` to come (0: unknown)."""

    def advance(self, files: int, nbytes: int) -> None:
        """``files`` more files and ``nbytes`` more bytes were written."""


@dataclass(frozen=True)
class Entry:
    """One entry for :func:`pack_entries`.

    Parameters
    ----------
    path
        Path inside the archive, ``/``-separated; a leading ``/`` is ignored.
    data
        File contents: bytes, a binary file object, or a callable returning one (opened
        only when the entry is written, so millions of entries need no open files).
    kind
        ``"file"``, ``"dir"``, ``"symlink"`` (``target`` is the link text) or
        ``"hardlink"`` (``target`` is the path of an earlier file entry: another name
        of that file, with its mode, owner, mtime and extended attributes; its own are
        ignored, as a file system has one set per file).
    mode
        Permission bits; default 0o644 for files, 0o755 for directories, 0o777 for
        symlinks.
    size
        Expected file size; when given, a different number of bytes read is an error.
    xattrs
        Extended attributes, name to value (format section 4c; names in the user.,
        security., trusted. or system. namespace).  A hard link has its file's.
    """

    path: PathLike
    data: Data = None
    kind: Literal["file", "dir", "symlink", "hardlink"] = "file"
    target: PathLike | None = None
    mode: int | None = None
    uid: int = 0
    gid: int = 0
    mtime_ns: int = 0
    size: int | None = None
    # Optional[...] rather than "X | None": dataclasses evaluate no annotation, but
    # typing.get_type_hints() on Python 3.9 would.
    xattrs: Optional[Xattrs] = None

    # The keys are worked out once, on first use, and kept with the entry (the cache is
    # the instance's __dict__, which a frozen dataclass leaves writable to
    # cached_property): every step of a pack (shards, the table, the codec's choice)
    # asks for them.  Not at construction: an Entry with a path the format forbids
    # is refused by pack_entries, as a PackError, not where it is made.
    @functools.cached_property
    def key(self) -> bytes:
        """``path`` as the archive stores it (:func:`packfs.core.archive_key`): bytes, no
        leading, trailing or doubled slashes; PackError for a path the format forbids."""
        return archive_key(self.path)

    @functools.cached_property
    def target_key(self) -> bytes:
        """For a hard link, the key of the file it names (``target`` as ``key`` is ``path``)."""
        return archive_key(self.target or b"")


@dataclass(frozen=True)
class PackStats:
    """What a pack wrote, and every path it left out (``skipped``, in the order met;
    paths left out by ``exclude`` are not listed)."""

    files: int
    dirs: int
    symlinks: int
    hardlinks: int
    skipped: tuple[SkippedPath, ...]
    file_bytes: int
    archive_bytes: int
    seconds: float
    # Files that changed while they were read, stored as a later read found them whole
    # (what GNU tar calls "file changed as we read it"; packfs pack then exits 3).
    changed: tuple[str, ...] = ()
    # Files stored as another file's record because their bytes are equal (format 4f).
    deduplicated: int = 0

    @property
    def failed(self) -> tuple[SkippedPath, ...]:
        """The skipped paths that could not be read whole (``packfs pack`` then exits 3)."""
        return tuple(path for path in self.skipped if path.failed)
