"""The format core: an archive's bytes read from any byte source (:mod:`packfs.source`)
as a container of records (:mod:`.container`) and a path table (:mod:`.pathtable`),
behind one entry-level interface, :class:`ArchiveReader` (:mod:`.interface`), which
:class:`Archive` and :class:`ShardSet` provide and every front end uses.

Nothing here knows about FUSE, datasets or the command line.
"""

from __future__ import annotations

from .archive import CHECKSUM_POLICIES, CLOSED, Archive, EntryStat
from .container import Container
from .files import MemoryFile, PackedFile, StreamFile
from .interface import ArchiveReader
from .paths import PathArg, archive_key, lookup_key
from .pathtable import PathTable
from .union import ShardSet, open_archive
from .verify import VerifyReport

__all__ = ["ArchiveReader", "Archive", "EntryStat", "CHECKSUM_POLICIES", "CLOSED", "Container", "PackedFile", "MemoryFile",
           "StreamFile", "PathTable", "VerifyReport", "PathArg", "archive_key", "lookup_key", "ShardSet", "open_archive"]
