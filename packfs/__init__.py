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
    PackSourceError,
    PathNotFoundError,
    RecordFileError,
    RemoteArchiveError,
    RemoteNotFoundError,
    RemoteAccessError,
    RemoteCredentialsError,
    RemoteTimeoutError,
    RemoteProtocolError,
    RemoteIOError,
    UnpackDamagedError,
    UnpackError,
)
from .write import Entry, PackStats, SkippedPath, convert, pack_entries, pack_folder
from .extract import UnpackStats, unpack
from .folder import FileStat, PackedFile, PackedFolder, VerifyReport
from .records import RecordReader, RecordWriter, record_file_info, verify_record_file
from .nodecache import CacheReport, CachedArchive, cache_clear, cache_prefetch, cache_stats

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
    "SkippedPath",
    "unpack",
    "UnpackStats",
    "RecordWriter",
    "RecordReader",
    "record_file_info",
    "verify_record_file",
    "cache_stats",
    "cache_clear",
    "cache_prefetch",
    "CacheReport",
    "CachedArchive",
    "PackfsError",
    "FormatError",
    "ChecksumError",
    "RecordFileError",
    "RemoteArchiveError",
    "RemoteNotFoundError",
    "RemoteAccessError",
    "RemoteCredentialsError",
    "RemoteTimeoutError",
    "RemoteProtocolError",
    "RemoteIOError",
    "ClosedArchiveError",
    "ArchiveChangedError",
    "PathNotFoundError",
    "NotAFileError",
    "NotADirectoryPathError",
    "NotASymlinkError",
    "PackError",
    "PackSourceError",
    "UnpackError",
    "UnpackDamagedError",
    "__version__",
]
