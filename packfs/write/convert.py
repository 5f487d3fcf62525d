"""``packfs convert``: an FFRecord ``pack_folder`` archive, or a packfs archive of an
older format version, rewritten as a native archive of the current version."""

from __future__ import annotations

import functools
import os
from typing import Iterator

from ..core import Archive
from ..core.recordfile import READ_RECORDS_WITH
from ..errors import PackError, RecordFileError
from ..format import PIECES_SINCE_MINOR, S_IFDIR, S_IFLNK, S_IFMT
from .entry import Entry, PackProgress, PackStats, PathLike
from .pack import pack_entries

__all__ = ["convert"]


def convert(archive: PathLike, out: PathLike, *, force: bool = False,
            progress: PackProgress | None = None, compress: str | None = None, dictionary: str | None = None,
            dedup: bool | None = None) -> PackStats:
    """Rewrite the FFRecord packed folder ``archive``, or a packfs archive of an older
    format version (1.0 stored no inode numbers, 1.1 no piece CRCs), as a packfs archive
    of the current version at ``out``.

    The contents are the same, each file's CRC checked as it is copied; entries of a
    legacy archive get the modes, owner and mtime it is served with (files 0444,
    directories 0555); a native archive keeps its own, its symlinks and its hard links.
    Written atomically, like ``pack``: on any error OUT is untouched or absent.

    Parameters
    ----------
    archive
        The legacy archive.
    out
        The packfs archive to write.
    force
        Replace ``out`` if it exists.
    progress
        Told the file count and bytes first, then each file as it is written.
    compress, dictionary, dedup
        Format 1.5's codecs, as for :func:`packfs.write.pack_folder`: with any of
        them, any archive (of the current version too) is rewritten with them, or
        without compression for ``compress="none"``.

    Returns
    -------
    PackStats

    Raises
    ------
    PackError
        ``archive`` is already a packfs archive of the current version, or OUT cannot
        be written.
    RecordFileError
        ``archive`` is an FFRecord record file: records without paths, nothing to
        convert (the message says what reads it).
    FormatError, ChecksumError
        ``archive`` is damaged; records that overlap or a record named twice are refused
        before OUT is begun (:meth:`packfs.core.Archive.check_records`), so the output is
        never larger than what the archive holds.
    """
    try:
        opened = Archive(archive)
    except RecordFileError as error:
        if not error.record_count:
            raise  # no records either: its own message says what it is and what to do
        raise RecordFileError(
            f"{error.path!r} is {error.description}: it has no paths, so there is nothing to convert; "
            f"{READ_RECORDS_WITH} read it as it is, and to make an archive of files from its records, "
            f"give each a path and pack them with packfs.pack_entries (docs/ffrecord.md shows how)",
            error.path, error.record_count, error.description) from None
    with opened as source:
        recode = compress is not None or dictionary is not None or dedup is not None
        if not recode and not source.legacy and source.footer.version_minor >= PIECES_SINCE_MINOR:  # 1.3 only adds attributes
            raise PackError(f"{os.fsdecode(archive)!r} is already a packfs archive of format "
                            f"{source.version}: nothing to convert")
        source.check_records()
        if progress is not None:
            has_data = (source.column("mode") & S_IFMT) != S_IFDIR
            progress.start(int(has_data.sum()), int(source.column("size")[has_data].sum()))

        def entries() -> Iterator[Entry]:
            for entry in range(1, source.entry_count):
                path = source.path_of(entry)
                mode, uid, gid, mtime_ns, size, _, inode = source.stat(entry)
                if mode & S_IFMT == S_IFDIR:
                    yield Entry(path, kind="dir", mode=mode & 0o7777, uid=uid, gid=gid, mtime_ns=mtime_ns)
                elif mode & S_IFMT == S_IFLNK:
                    yield Entry(path, kind="symlink", target=source.readlink(entry), mode=mode & 0o7777,
                                uid=uid, gid=gid, mtime_ns=mtime_ns)
                elif inode != entry + 1:  # a later name of a hard-linked file (format section 4)
                    yield Entry(path, kind="hardlink", target=source.path_of(inode - 1), uid=uid, gid=gid,
                                mtime_ns=mtime_ns)
                else:
                    yield Entry(path, functools.partial(source.open, entry, os.fsdecode(path)), mode=mode & 0o7777,
                                uid=uid, gid=gid, mtime_ns=mtime_ns, size=size)

        listed = entries() if dictionary != "auto" else list(entries())  # sampled: a sequence
        return pack_entries(listed, out, count=source.entry_count - 1, force=force, progress=progress,
                            compress=compress, dictionary=dictionary, dedup=dedup)
