"""Every reader of the format, opened over the contract's tree (:mod:`.trees`): what the
suite is parametrised over.  A kind opens its archive's directory (or a damaged copy of
it) with a checksum policy, and says where a file's stored bytes lie, for the damage
tests."""

from __future__ import annotations

import itertools
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from packfs.core import Archive, ArchiveReader, open_archive
from packfs.format import S_IFREG
from tests.contract.compiled import CompiledReader
from tests.contract.trees import Packed

# (name, what opens) for each reader; "compiled" readers are the C one through its adapter.
# "archive" reads whole files through the C format library where it is built
# (Archive.read_path asks it first); "archive-python" is the same Archive with it turned
# off, so that the pure-Python path, the fallback where C is not built, meets the
# contract too.
KINDS = ("archive", "archive-python", "one-shard", "layered", "url", "compiled", "compiled-set")
_ENTRY = {"archive": "tree.ffr", "archive-python": "tree.ffr", "one-shard": "one.ffrset",
          "layered": "layered.ffrset", "url": "tree.ffr", "compiled": "tree.ffr", "compiled-set": "one.ffrset"}
_copies = itertools.count()


@dataclass
class ReaderKind:
    """One reader over one packing of the tree (``coded``: through format 1.5's codecs)."""

    name: str
    coded: bool
    packed: Packed
    scratch: Path  # where damaged copies go
    nginx: Any = None  # tests.remote_servers.Nginx for "url"
    served: Optional[Path] = None  # the undamaged copy nginx serves, made once

    @property
    def unanswered(self) -> dict[str, str]:
        """What this reader cannot be asked, and why (the compiled reader's adapter says)."""
        return CompiledReader.UNANSWERED if self.name.startswith("compiled") else {}

    def require(self, question: str) -> None:
        """Skip, with the reader's own reason, a test of what it cannot answer."""
        reason = self.unanswered.get(question)
        if reason is not None:
            pytest.skip(f"{self.name}: {reason}")

    @property
    def directory(self) -> Path:
        """The directory of the archive files this reader opens, undamaged."""
        source = {"archive": self.packed.archive, "archive-python": self.packed.archive, "url": self.packed.archive,
                  "compiled": self.packed.archive,
                  "one-shard": self.packed.one_shard, "compiled-set": self.packed.one_shard,
                  "layered": self.packed.layered}[self.name]
        return source

    def copy(self) -> Path:
        """A copy of :attr:`directory` to damage; for "url", where nginx serves it."""
        parent = self.nginx.data if self.name == "url" else self.scratch
        target = parent / f"copy-{next(_copies)}"
        shutil.copytree(self.directory, target)
        return target

    def open(self, checksums: str = "always", directory: Optional[Path] = None,
             cache_dir: Any = None) -> ArchiveReader:
        """This reader over ``directory`` (a :meth:`copy`; the undamaged packing if None)."""
        if checksums == "always":
            self.require("always")
        if directory is None:
            if self.name == "url" and self.served is None:
                self.served = self.copy()
            directory = self.served if self.name == "url" else self.directory
        where = directory / _ENTRY[self.name]
        if self.name == "url":
            return Archive(self.nginx.url(f"{directory.name}/{_ENTRY[self.name]}"), checksums=checksums,
                           cache_dir=cache_dir)
        if self.name.startswith("compiled"):
            log = os.open(self.scratch / "compiled.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                return CompiledReader(open_archive(str(where), checksums=checksums), log)  # type: ignore[return-value]
            finally:
                os.close(log)  # the Tree writes to its own duplicate
        opened = open_archive(str(where), checksums=checksums)
        if self.name == "archive-python":
            assert isinstance(opened, Archive)
            opened.compiled_read = None
        return opened


def stored_span(directory: Path, path: bytes) -> tuple[Path, int, int]:
    """(archive file, start, end) of the regular file ``path``'s stored bytes among the
    archives in ``directory``."""
    for file in sorted(directory.glob("*.ffr")):
        with Archive(file) as archive:
            entry = archive.find(path)
            if entry >= 0 and archive.file_type(entry) == S_IFREG:
                return (file, *archive.extent(entry))
    raise LookupError(f"{path!r} is in no archive of {directory}")


def flip_byte(file: Path, at: int, keep_mtime: bool = False) -> None:
    """Flip every bit of byte ``at`` of ``file`` in place; with ``keep_mtime`` the file's
    mtime is put back, so a reader that opened it sees the same file (a change no
    identity check can see: what a bad sector or a bit flip in memory looks like)."""
    before = os.stat(file)
    with open(file, "r+b") as opened:
        opened.seek(at)
        value = opened.read(1)[0]
        opened.seek(at)
        opened.write(bytes([value ^ 0xFF]))
    if keep_mtime:
        os.utime(file, ns=(before.st_atime_ns, before.st_mtime_ns))


def damaged(kind: ReaderKind, path: bytes, where: Callable[[int, int], int] = lambda start, end: start) -> Path:
    """A copy of ``kind``'s archives with one byte of file ``path``'s stored bytes flipped
    (at ``where(start, end)``)."""
    copy = kind.copy()
    file, start, end = stored_span(copy, path)
    flip_byte(file, where(start, end))
    return copy
