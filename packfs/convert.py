"""``packfs convert``: an FFRecord ``pack_folder`` archive rewritten as a native one."""

from __future__ import annotations

import functools
import os

from .errors import PackError
from .extract import check_claims
from .pathtable import S_IFDIR, S_IFMT
from .reader import PackedFolder
from .writer import Entry, PackProgress, PackStats, PathLike, pack_entries

__all__ = ["convert"]


def convert(archive: PathLike, out: PathLike, *, force: bool = False,
            progress: PackProgress | None = None) -> PackStats:
    """Rewrite the FFRecord packed folder ``archive`` as a packfs archive at ``out``.

    The contents are the same, each file's CRC checked as it is copied; entries get the
    modes, owner and mtime a legacy archive is served with (files 0444, directories
    0555).  Written atomically, like ``pack``: on any error OUT is untouched or absent.

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

    Returns
    -------
    PackStats

    Raises
    ------
    PackError
        ``archive`` is already a packfs archive, or OUT cannot be written.
    FormatError, ChecksumError
        ``archive`` is damaged; records that overlap or a record named twice are refused
        before OUT is begun (:func:`packfs.extract.check_claims`), so the output is
        never larger than what the archive holds.
    """
    with PackedFolder(archive) as folder:
        if not folder.legacy:
            raise PackError(f"{os.fsdecode(archive)!r} is already a packfs archive: nothing to convert")
        check_claims(folder)
        table = folder._table
        if progress is not None:
            has_data = (table.column("mode") & S_IFMT) != S_IFDIR
            progress.start(int(has_data.sum()), int(table.column("size")[has_data].sum()))

        def entries():
            for entry in range(1, table.entry_count):
                path = table.full_path(entry)
                mode, uid, gid, mtime_ns, size, _ = table.attributes(entry)
                if mode & S_IFMT == S_IFDIR:
                    yield Entry(path, kind="dir", mode=mode & 0o7777, uid=uid, gid=gid, mtime_ns=mtime_ns)
                else:
                    yield Entry(path, functools.partial(folder.open, path), mode=mode & 0o7777,
                                uid=uid, gid=gid, mtime_ns=mtime_ns, size=size)

        return pack_entries(entries(), out, count=table.entry_count - 1, force=force, progress=progress)
