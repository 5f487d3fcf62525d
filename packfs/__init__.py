"""packfs: serve a huge directory tree from one checksummed, FFRecord-compatible file.

>>> import packfs
>>> packfs.pack_folder("dataset/", "data.ffr")            # doctest: +SKIP
>>> with packfs.PackedFolder("data.ffr") as folder:         # doctest: +SKIP
...     jpeg = folder.read("train/cat/1.jpg")

The byte layout is specified in :mod:`packfs.format`.
"""

from __future__ import annotations

from .errors import (
    ArchiveChangedError,
    ChecksumError,
    ClosedArchiveError,
    FormatError,
    NotADirectoryPathError,
    NotAFileError,
    NotASymlinkError,
    PackError,
    PackfsError,
    PathNotFoundError,
    UnpackDamagedError,
    UnpackError,
)
from .convert import convert
from .extract import UnpackStats, unpack
from .reader import FileStat, PackedFile, PackedFolder, VerifyReport
from .records import RecordReader, RecordWriter
from .writer import Entry, PackStats, pack_entries, pack_folder

__version__ = "0.1.0"

__all__ = [
    "PackedFolder",
    "PackedFile",
    "FileStat",
    "VerifyReport",
    "pack_folder",
    "pack_entries",
    "convert",
    "Entry",
    "PackStats",
    "unpack",
    "UnpackStats",
    "RecordWriter",
    "RecordReader",
    "PackfsError",
    "FormatError",
    "ChecksumError",
    "ClosedArchiveError",
    "ArchiveChangedError",
    "PathNotFoundError",
    "NotAFileError",
    "NotADirectoryPathError",
    "NotASymlinkError",
    "PackError",
    "UnpackError",
    "UnpackDamagedError",
    "__version__",
]
