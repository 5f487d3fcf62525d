"""``pack --verify``: the new archive read back before it is published.

A pack with ``verify`` writes and fsyncs the archive under its temporary name, then
opens it with the reader every user has (:class:`packfs.core.Archive`) and checks it
whole, as ``packfs verify`` does (every CRC, every table rule, every file decoded);
from a directory, it also compares each file's bytes and each symlink's target with
the source, read again.  Only then is the archive renamed into place: a pack that
fails the check leaves nothing.
"""

from __future__ import annotations

import os
from typing import Sequence

from ..errors import PackError
from ..format import S_IFREG
from .scan import Scanned

__all__ = ["verify_written", "VERIFY_CHUNK"]

VERIFY_CHUNK = 1 << 20


def verify_written(path: str, out: str, root: bytes | None = None, items: Sequence[Scanned] = ()) -> None:
    """Check the archive at ``path`` (the temporary file of ``out``), and, with
    ``root``, that it holds ``items`` (a scan of ``root``) as they are now on disk.

    Raises
    ------
    PackError
        What differs or is damaged, naming ``out`` and the path.
    """
    from ..core import Archive

    with Archive(path, checksums="always") as archive:
        report = archive.verify()
        if not report.ok:
            found = list(report.problems) + [f"{bad!r} fails its checksum" for bad in report.bad_paths]
            raise PackError(f"{out!r} failed --verify: {found[0] if found else 'damaged records'}"
                            + (f" (and {len(found) - 1} more)" if len(found) > 1 else ""))
        if root is None:
            for entry in range(1, archive.entry_count):  # every file decoded whole
                if archive.file_type(entry) == S_IFREG:
                    for _ in archive.read_chunks(entry, VERIFY_CHUNK):
                        pass
            return
        for item in items:
            if item.kind not in ("file", "symlink", "hardlink"):
                continue
            label = os.fsdecode(root + b"/" + item.key)
            entry = archive.lookup(item.key, follow=False)
            if entry < 0:
                raise PackError(f"{out!r} failed --verify: {label!r} is missing from it")
            if item.kind == "symlink":
                if archive.readlink(entry) != os.readlink(root + b"/" + item.key):
                    raise PackError(f"{out!r} failed --verify: the symlink {label!r} has another target")
                continue
            _compare_file(archive, entry, root + b"/" + item.key, label, out)


def _compare_file(archive, entry: int, source: bytes, label: str, out: str) -> None:
    try:
        handle = open(source, "rb")
    except OSError as error:
        raise PackError(f"{out!r} failed --verify: cannot read {label!r} again: {error.strerror}") from None
    with handle:
        for chunk in archive.read_chunks(entry, VERIFY_CHUNK):
            if handle.read(len(chunk)) != chunk:
                raise PackError(f"{out!r} failed --verify: {label!r} differs from the archive "
                                f"(it changed after it was read, or the archive is wrong)")
        if handle.read(1):
            raise PackError(f"{out!r} failed --verify: {label!r} is longer than the archive's copy")
