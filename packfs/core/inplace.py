"""An opened archive as a compiled reader sees it: one value, made in one place.

The C format library (``packfs/cformat/``) reads an archive in place, through the map,
descriptor and SIGBUS guard slot the core already holds, and checks every value it
reads itself.  Two readers are built on it: the FUSE daemon's ``packfs._lowlevel.Tree``
and ``packfs.core._format.Tree`` (``PackedFolder.read``'s hot path).  Both take the
same arguments; :func:`in_place` is the one place they are gathered from an
:class:`~packfs.core.Archive`, and the one place it is decided whether an archive can
be read in place at all.  :func:`compiled_reader` builds the core's own.

A URL is read in place too, by the daemon (:func:`in_place` with ``remote=True``): its
metadata (the header, and everything from the end of the data records on: the path
table's sections, pieces, attributes, tail, codec sections, footer) is copied once
into a sparse, unlinked file of the archive's size, which is mapped and guarded as a
local archive's is and opened as one (every open-time check runs on it as on a local
archive, and the C library checks its pages as it uses them); the data records stay
holes.  The C library reads the data area through ``remote``: the node-wide disk cache
of :mod:`packfs.source.cache` (its blocks read and checked in C, packfs/cformat/
blockcache.c), and what the cache does not hold through :class:`RemoteReader`, which
reads it with the archive's own source (fetched once per node, written to the cache).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Optional, Union

from ..errors import ArchiveChangedError, PackfsError
from ..format import FLAG_CODECS
from ..source import is_url, shown_location
from .checkpolicy import ChecksumPolicy

# An archive here is a packfs.core.Archive, named in words, not imported: archive.py
# imports this module (its compiled_read), and the layers have no circles.
OpenedArchive = Any

__all__ = ["InPlace", "in_place", "remote_view_problem", "compiled_reader"]

Spans = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class InPlace:
    """What a compiled reader needs of an opened archive (``Tree(*tree_arguments())``):
    the source's map, descriptor and guard slot; the header's counts; where the path
    table's sections lie (format section 4), and the piece CRC (4b) and extended
    attribute (4c) sections; a format 1.4 archive's page geometry (4e: page size,
    regions, page CRCs, data end), checked page by page as values are used; and where a
    format 1.5 archive's codec sections lie (4f: the last two paged regions)."""

    mapping: Any
    fileno: int
    guard_slot: int
    record_count: int
    data_records: int
    entry_count: int
    sections: Spans
    pieces: Spans | None
    xattrs: Spans | None
    pages: tuple[int, Spans, memoryview, int] | None
    codecs: Spans | None
    path: str
    # A URL's: (reader, the node cache's directory descriptor or -1, the archive's
    # directory below it, the CRC salt, the size, the data area's start and end).
    remote: Optional[tuple[Any, int, str, int, int, int, int]] = None

    def tree_arguments(self, check_data: bool, log_fd: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The positional and keyword arguments of either Tree: ``check_data`` for each
        record's CRC at its first read (False: never), ``log_fd`` for what it finds
        wrong (-1: nothing logged)."""
        keywords: dict[str, Any] = {"pieces": self.pieces, "xattrs": self.xattrs, "pages": self.pages,
                                    "codecs": self.codecs}
        if self.remote is not None:
            self.remote[0].log_fd = log_fd
            keywords["remote"] = self.remote
        return ((self.mapping, self.fileno, self.guard_slot, self.record_count, self.data_records,
                 self.entry_count, self.sections, check_data, self.path, log_fd), keywords)


def remote_view_problem(archive: OpenedArchive) -> Optional[str]:
    """Why a URL archive's local view (:func:`in_place` with ``remote``) cannot be made,
    as far as what its open read tells (legacy, version, data area, the metadata's
    size), without copying anything; None when nothing does: ``packfs info`` asks this,
    so that saying which daemon would serve a URL costs no copy of its metadata.  The
    copy itself may still fail (a full disk): then the mount says so."""
    if archive.legacy or archive.footer.version_minor < 1:
        view = in_place(archive)  # its words for these (nothing is copied)
        return view if isinstance(view, str) else None
    size = archive.size
    data_start, data_end = archive.data_area
    if not 0 < data_start <= data_end <= size:
        return "the archive's data area is not inside it"
    metadata = data_start + size - data_end
    if metadata > _VIEW_MAX:
        return (f"its header and table take {metadata} bytes, more than the compiled daemon copies to a local "
                f"view ({_VIEW_MAX})")
    return None


def in_place(archive: OpenedArchive, remote: bool = False) -> Union[InPlace, str]:
    """``archive`` as a compiled reader reads it in place, or why it cannot be: in words
    for a one-line notice (a legacy or format 1.0 archive, a URL unless ``remote``, a
    source without a map, a map without packfs._sigbus's guard, a 1.5 archive whose
    codec sections are not in place).  A URL's view (``remote``: the daemon's) is made
    once per archive (see the module's docstring) and kept while the archive is.

    Raises
    ------
    PackfsError
        Making a URL's view: its metadata could not be read (RemoteArchiveError), or
        does not hold together (FormatError, ChecksumError)."""
    if archive.legacy:
        return "the archive is an FFRecord packed folder (packfs convert makes it a native archive)"
    if archive.footer.version_minor < 1:
        return f"the archive is format {archive.version} (packfs convert writes the current version, with inode numbers stored)"
    source = archive.source
    if is_url(source.name):
        if not remote:
            return ("the archive is a URL: read with ranged requests (only the mount daemon reads a URL's "
                    "metadata in place)")
        with _VIEWS_LOCK:
            view = _VIEWS.get(archive)
            if view is None:
                view = _VIEWS[archive] = _remote_view(archive)
        return view
    sections = archive.section_spans
    guard_slot = getattr(source, "guard_slot", None)
    if sections is None or guard_slot is None:
        return "the archive is not a local file read in place"
    if guard_slot < 0:
        return "the archive's map is not guarded against truncation (packfs._sigbus is not built)"
    pages = archive.page_checks
    codecs = None
    if archive.footer.flags & FLAG_CODECS:
        if pages is None:  # every 1.5 archive has a tail: read in place, its pages are too
            return "the archive's codec sections are not in place"
        codecs = tuple(pages[1][-2:])
    return InPlace(source.mapping, source.fileno(), guard_slot, archive.record_count, archive.data_records,
                   archive.entry_count, sections, archive.piece_spans, archive.xattr_spans, pages, codecs,
                   os.fsdecode(archive.path))


def compiled_reader(archive: object, check_data: bool, policy: Optional[ChecksumPolicy] = None) -> Any:
    """``packfs.core._format.Tree`` over ``archive`` (a whole file found, read, checked
    and decoded in C without the GIL), or None where that extension is not built,
    ``archive`` is not an :class:`Archive` itself (its class says READS_IN_PLACE, not
    inherited: a shard set, or a subclass, may read otherwise), it cannot be read in place (:func:`in_place`), it has codecs and the extension
    has no libzstd, or the library refuses its spans (the Python reader then says what
    is wrong).  Its policy: every read checked ("always") with ``check_data``, else
    never; or ``policy``'s, the archive's own, whose "once" bitmaps the Tree shares (a
    record checked by either reader is not checked again by the other, and one that
    failed fails in both); it logs nothing (the Python path raises what it finds)."""
    try:
        from . import _format
    except ImportError:
        return None
    if not type(archive).__dict__.get("READS_IN_PLACE", False):
        return None
    view = in_place(archive)
    if isinstance(view, str) or (view.codecs is not None and not _format.ZSTD_VERSION):
        return None
    kind = policy.kind if policy is not None else "always" if check_data else "never"
    positional, keywords = view.tree_arguments(kind != "never", -1)
    if kind == "once":
        assert policy is not None and policy.checked is not None and policy.failed is not None
        keywords.update(checked_bits=policy.checked, failed_bits=policy.failed)
    try:
        return _format.Tree(*positional, **keywords, check_always=kind == "always")
    except (ValueError, OSError):
        return None


# A URL archive's view, made once (the daemon asks whether it can serve it, then builds
# its Tree from it): the archive -> its InPlace or why not.
_VIEWS: "weakref.WeakKeyDictionary[OpenedArchive, Union[InPlace, str]]" = weakref.WeakKeyDictionary()
_VIEWS_LOCK = threading.Lock()
# What is copied at a time into a URL's view (bounded memory whatever the table's size).
_COPY_PIECE = 8 << 20
# The most metadata (header and table) copied into a view: far more than 100 M entries
# take; a larger claim (a hostile footer) is served by the Python daemon, page by page.
_VIEW_MAX = 64 << 30


class RemoteReader:
    """What the C library reads a URL archive's data area with when the node cache does
    not hold (or holds damaged) what it needs: ``reader(at, count, limit)``, the bytes from
    the archive's source (the cache's ``read``: fetched, written for the next reader), or
    None for EIO.  What fails is written to ``log_fd`` (the daemon's log), each message
    once: a changed object as the Python daemon says it ("archive changed in place;
    remount"), which fails every read from then on (the source remembers it)."""

    def __init__(self, source: Any, view_archive: OpenedArchive) -> None:
        self.source = source
        self.view_archive = view_archive  # holds the view's map and descriptor open
        self.log_fd = 2
        self._logged: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, at: int, count: int, limit: int = 0) -> Optional[bytes]:
        try:
            # ``limit``: the end of a large file read piece by piece, where read-ahead
            # stops (Container.pread's rule); 0: a scan may read ahead across files.
            if limit and getattr(self.source, "reads_ahead", False):
                data = self.source.read(at, at + count, limit)
            else:
                data = self.source.read(at, at + count)
            if len(data) == count:
                return bytes(data)
            message = f"read of {count} bytes at {at}: {len(data)} came"
        except ArchiveChangedError as error:
            message = f"archive changed in place; remount: {error}"
        except (PackfsError, OSError) as error:
            message = f"read of {count} bytes at {at}: {error}"
        except Exception as error:  # a bug must not take the daemon down: EIO, said
            message = f"read of {count} bytes at {at}: {error!r}"
        self._log(message)
        return None

    def _log(self, message: str) -> None:
        with self._lock:
            if message in self._logged or len(self._logged) >= 10000 or self.log_fd < 0:
                return
            self._logged.add(message)
        try:
            os.write(self.log_fd, f"packfs: {message}\n".encode("utf-8", "backslashreplace"))
        except OSError:
            pass


def _view_file(cache: Optional[tuple[int, str, int]]) -> int:
    """A new file nobody else can open: unlinked from the start (O_TMPFILE), in the
    archive's directory of the checked cache (opened relative to its descriptor, as
    every file of the cache is), else in $TMPDIR; where the file system has no
    O_TMPFILE, unlinked right after it is made in $TMPDIR."""
    flags = getattr(os, "O_TMPFILE", 0) | os.O_RDWR | os.O_CLOEXEC
    if flags & getattr(os, "O_TMPFILE", 0):
        try:
            if cache is not None:
                return os.open(cache[1], flags, 0o600, dir_fd=cache[0])
            return os.open(tempfile.gettempdir(), flags, 0o600)
        except OSError:
            pass
    fd, path = tempfile.mkstemp(prefix=".packfs-view-")
    os.unlink(path)
    return fd


def _remote_view(archive: OpenedArchive) -> Union[InPlace, str]:
    """A URL archive's view (see the module's docstring), or why not."""
    source = archive.source
    size = archive.size
    data_start, data_end = archive.data_area
    reason = remote_view_problem(archive)
    if reason is not None:
        return reason
    cache = source.node_cache() if hasattr(source, "node_cache") else None
    try:
        fd = _view_file(cache)
    except OSError as error:
        return f"no local view of its metadata can be made ({error.strerror or error})"
    try:
        os.ftruncate(fd, size)
        for start, end in ((0, data_start), (data_end, size)):
            for at in range(start, end, _COPY_PIECE):
                piece = source.read(at, min(end, at + _COPY_PIECE))
                os.pwrite(fd, piece, at)
        # Opened as any local archive (the open-time checks run on these bytes), by a
        # name of the descriptor's: the file has none.
        local = type(archive)(f"/proc/self/fd/{fd}", checksums=archive.checksums)  # an Archive, local
    except OSError as error:  # the view's file system: full, no sparse file that large, no /proc
        if isinstance(error, PackfsError):
            raise
        return f"no local view of its metadata can be made ({error.strerror or error})"
    finally:
        os.close(fd)  # the local archive has its own descriptor
    view = in_place(local)
    if isinstance(view, str):
        local.close()
        return view
    directory_fd, relative, salt = cache if cache is not None else (-1, "", 0)
    reader = RemoteReader(source, local)
    return dataclasses.replace(view, path=shown_location(archive.path),
                               remote=(reader, directory_fd, relative, salt, size, data_start, data_end))
