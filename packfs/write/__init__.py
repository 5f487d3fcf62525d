"""Writing archives: a tree of entries (a directory, a tar, a zip, a legacy FFRecord
archive) streamed into records, the path table built after them, and the file
published whole under its name.  Reads only through :mod:`packfs.core`'s public names.
"""

from __future__ import annotations

from .archives import pack_archive
from .container import TEMP_MARKER, ContainerWriter
from .convert import convert
from .exclude import ExcludePatterns
from .entry import Entry, PackProgress, PackStats
from .pack import pack_entries, pack_folder
from .skips import SkipList, SkippedPath
from .temporaries import remove_unfinished

__all__ = ["Entry", "PackProgress", "PackStats", "SkippedPath", "SkipList", "pack_entries", "pack_folder",
           "pack_archive", "convert", "ExcludePatterns",
           "ContainerWriter", "TEMP_MARKER", "remove_unfinished"]
