"""Writing archives: a tree of entries (a directory, a tar, a zip, a legacy FFRecord
archive) streamed into records, the path table built after them, and the file
published whole under its name.  Reads only through :mod:`packfs.core`'s public names.
"""

from __future__ import annotations

from .archives import pack_archive
from .container import TEMP_MARKER, ContainerWriter
from .convert import convert
from .pack import Entry, PackProgress, PackStats, pack_entries, pack_folder
from .temporaries import remove_unfinished

__all__ = ["Entry", "PackProgress", "PackStats", "pack_entries", "pack_folder", "pack_archive", "convert",
           "ContainerWriter", "TEMP_MARKER", "remove_unfinished"]
