"""The opening bytes of archives at URLs, kept beside the disk cache, so that a process
that opens an archive the node already opened does not fetch them again.

An open fetches the object's last bytes (its suffix: an archive's tail and footer,
256 KiB by default).  A DataLoader worker re-created each epoch, a second training
process, the next run: each opened the same archive by fetching them again.  Kept
here, a re-open fetches only the last ``CHECK_BYTES`` (an archive's footer) and takes
the kept suffix when the answer is the same object as the one kept: the same ETag (and
version id), the same size, and the same footer.  The footer of a format 1.4 archive
holds the CRC of its tail, which holds a CRC of every other page of the archive, so a
server whose ETag does not change with the bytes (nginx's is the modification second
and the size) still never has one archive's suffix taken for another's.

On disk (the cache's directory, beside its blocks)::

    cache_dir/tails-v1/t<hash of the URL>   a JSON line (ETag, version, Last-Modified,
                                            size, where the suffix starts, its CRC),
                                            then the suffix's bytes

written whole to a temporary file (a name nobody can guess, created O_EXCL, 0600) and
renamed into place, every file opened relative to the cache's directory's descriptor
and never through a link; nothing is read or written unless the cache's directory and
``tails-v1/`` are this user's alone (:mod:`packfs.source.cachedir`).  Read back, a file
whose CRC or length does not match is not there.  One file per URL (a replaced object's suffix
replaces the one kept), a few hundred KiB each.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import stat
from typing import NamedTuple, Optional

from ..format import FOOTER_SIZE, crc32
from .cachedir import DIR_FLAGS, FILE_FLAGS, private_root, private_subdir

__all__ = ["KnownTail", "TailStore", "CHECK_BYTES"]

log = logging.getLogger("packfs.cache")

# What a re-open fetches to tell the object kept from another: an archive's footer.
CHECK_BYTES = FOOTER_SIZE
LAYOUT = "tails-v1"
_HEADER_LIMIT = 64 << 10


class KnownTail(NamedTuple):
    """An object's last bytes as an open fetched them, and what identified it."""

    etag: Optional[str]
    version: Optional[str]
    modified: str  # the Last-Modified header as sent ("" when none)
    size: int
    suffix_start: int
    suffix: bytes


class TailStore:
    """The suffixes kept under ``directory`` (a cache directory), by URL."""

    def __init__(self, directory: str) -> None:
        self.top = os.path.abspath(os.path.expanduser(os.fspath(directory)))
        self.root = os.path.join(self.top, LAYOUT)

    @staticmethod
    def _path(location: str) -> str:
        """The file of ``location``, relative to the cache's directory."""
        return f"{LAYOUT}/t" + hashlib.sha256(location.encode("utf-8", "surrogateescape")).hexdigest()[:40]

    def _top(self, create: bool) -> int:
        """The cache's directory's descriptor, ``tails-v1/`` in it checked (made when
        ``create``); OSError (UnsafeCacheDir among them) when it cannot be used."""
        fd = private_root(self.top, create)
        private_subdir(fd, LAYOUT, self.top, create)
        return fd

    def load(self, location: str) -> Optional[KnownTail]:
        """The suffix kept for ``location`` (a URL without secrets), or None (none kept,
        or what is kept fails its checks)."""
        try:
            top = self._top(create=False)
            with open(os.open(self._path(location), os.O_RDONLY | FILE_FLAGS, dir_fd=top), "rb") as file:
                line = file.readline(_HEADER_LIMIT)
                head = json.loads(line)
                suffix = file.read(int(head["length"]) + 1)
            known = KnownTail(head["etag"], head["version"], str(head["modified"]), int(head["size"]),
                              int(head["suffix_start"]), suffix)
            if head["location"] != location or len(suffix) != int(head["length"]) \
                    or crc32(suffix) != int(head["crc"]) or known.suffix_start + len(suffix) != known.size:
                return None
            return known
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save(self, location: str, known: KnownTail) -> None:
        """Keep ``known`` for ``location``; a failure to write is only not kept."""
        path = self._path(location)
        top = -1
        head = {"location": location, "etag": known.etag, "version": known.version, "modified": known.modified,
                "size": known.size, "suffix_start": known.suffix_start, "length": len(known.suffix),
                "crc": crc32(known.suffix)}
        temporary = f"{path}.{secrets.token_hex(8)}.tmp"
        try:
            top = self._top(create=True)
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o600, dir_fd=top)
            with open(fd, "wb") as out:
                out.write(json.dumps(head).encode() + b"\n")
                out.write(known.suffix)
            os.replace(temporary, path, src_dir_fd=top, dst_dir_fd=top)
        except OSError as error:
            log.debug("packfs: the opening bytes of %s could not be kept in %r: %s", location, self.root, error)
            if top >= 0:
                try:
                    os.unlink(temporary, dir_fd=top)
                except OSError:
                    pass

    def clear(self) -> int:
        """Remove every suffix kept (``packfs cache clear``); the bytes freed.  Nothing is
        followed: ``tails-v1/`` is opened with O_NOFOLLOW and only its regular files are
        removed, relative to it.  A reader that then opens a URL fetches its tail again."""
        freed = 0
        try:
            top = self._top(create=False)
            fd = os.open(LAYOUT, DIR_FLAGS, dir_fd=top)
        except OSError:
            return 0
        try:
            for name in os.listdir(fd):
                try:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode):
                        os.unlink(name, dir_fd=fd)
                        freed += info.st_blocks * 512
                except OSError:
                    continue
        finally:
            os.close(fd)
        return freed
