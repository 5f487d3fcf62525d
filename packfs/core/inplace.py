"""An opened archive as a compiled reader sees it: one value, made in one place.

The C format library (``packfs/cformat/``) reads an archive in place, through the map,
descriptor and SIGBUS guard slot the core already holds, and checks every value it
reads itself.  Two readers are built on it: the FUSE daemon's ``packfs._lowlevel.Tree``
and ``packfs.core._format.Tree`` (``PackedFolder.read``'s hot path).  Both take the
same arguments; :func:`in_place` is the one place they are gathered from an
:class:`~packfs.core.Archive`, and the one place it is decided whether an archive can
be read in place at all.  :func:`compiled_reader` builds the core's own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional, Union

from ..format import FLAG_CODECS
from ..source import is_url
from .checkpolicy import ChecksumPolicy

__all__ = ["InPlace", "in_place", "compiled_reader"]

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

    def tree_arguments(self, check_data: bool, log_fd: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The positional and keyword arguments of either Tree: ``check_data`` for each
        record's CRC at its first read (False: never), ``log_fd`` for what it finds
        wrong (-1: nothing logged)."""
        return ((self.mapping, self.fileno, self.guard_slot, self.record_count, self.data_records,
                 self.entry_count, self.sections, check_data, self.path, log_fd),
                {"pieces": self.pieces, "xattrs": self.xattrs, "pages": self.pages, "codecs": self.codecs})


def in_place(archive: Any) -> Union[InPlace, str]:
    """``archive`` as a compiled reader reads it in place, or why it cannot be: in words
    for a one-line notice (a legacy or format 1.0 archive, a URL, a source without a
    map, a map without packfs._sigbus's guard, a 1.5 archive whose codec sections are
    not in place)."""
    if archive.legacy:
        return "the archive is an FFRecord packed folder (packfs convert makes it a native archive)"
    if archive.footer.version_minor < 1:
        return f"the archive is format {archive.version} (packfs convert writes the current version, with inode numbers stored)"
    source = archive.source
    if is_url(source.name):
        return ("the archive is a URL: the Python daemon reads it with ranged requests (the compiled one reads "
                "local files in place)")
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
        from . import _format  # type: ignore[attr-defined]  # a compiled module: no source for mypy
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
