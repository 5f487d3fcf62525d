"""FFRecord's Python API on packfs: replace ``import ffrecord`` (or ``import
ffrecord.torch``) with ``from packfs import ffrecord``, and ``from ffrecord... import``
with ``from packfs.ffrecord... import``; the rest of the code stays as it is.

The modules are FFRecord's: this package (``FileReader``, ``FileWriter``,
``PackedFolder``, ``pack_folder``, ``checkFsAlign``, ``utils``, ``__version__``),
:mod:`packfs.ffrecord.torch` (``Dataset``, ``Subset``, ``ConcatDataset``,
``ReaderRegistry``, ``DataLoader``; imported on first use of ``ffrecord.torch``, as
torch is needed only there) and :mod:`packfs.ffrecord.utils` (``dump``), with FFRecord's
names, arguments, defaults, attributes and return types (reads give numpy ``uint8``
arrays).  ``__version__`` is ``"1.4.0+packfs.<packfs version>"``: the FFRecord release
whose API this matches, so that version checks written for FFRecord pass, with a local
part saying it is packfs.

Where packfs differs, it does so on purpose (docs/ffrecord.md has the details):

Stricter
    - Errors are ``PackfsError`` subclasses that also derive from the built-in that
      fits: ``FormatError``/``ChecksumError`` (ValueError), ``PathNotFoundError``
      (FileNotFoundError), ``NotAFileError``, ``PackError``, ``ClosedArchiveError``
      (ValueError) instead of ``RuntimeError``/``AssertionError``; a bad index is an
      IndexError, a bad argument a TypeError or ValueError.
    - Readers check every offset (``12 + 12n <= offsets[0] <= ... <= file size``) and
      ``n`` at open, with ``check_data=False`` too, and refuse to return bytes of a file
      overwritten in place while open (``ArchiveChangedError``).
    - Files whose header CRC is 0 (FFRecord's "legacy" files, and what an aborted
      FFRecord writer leaves) open only with ``allow_legacy_header=True``.
    - ``PackedFolder`` never unpickles: FFRecord's packed folders are parsed, and a
      hostile pickle is a FormatError; ``pack_folder`` writes a packfs archive (no
      pickle), which FFRecord's ``FileReader`` reads but FFRecord's ``PackedFolder``
      cannot open.
    - ``FileWriter`` writes to a temporary file that replaces ``fname`` at ``close()``:
      fewer records than ``n`` (or an exception in its ``with`` block) publishes
      nothing and leaves an existing file as it was; files get mode 0666 & ~umask
      (FFRecord: 0700).
    - ``write_one`` stores all of a numpy array's bytes (FFRecord stores ``shape[0]``).
    - ``utils.dump`` raises when a writer process fails (FFRecord ignores it), and warns
      when the folder holds other ``.ffr`` files.

More lenient
    - Negative indices count from the end; batches have no 4096 cap; indices may be
      numpy or torch integers.
    - ``get_offsets``/``get_checksums`` default to file 0; ``set_step(0)`` is allowed
      on a loader with no batches; ``prefetch_factor`` is ignored without workers.
    - ``DataLoader(multiprocessing_context=...)`` chooses the workers' start method
      (FFRecord always forks); ``Dataset`` has ``__getitems__``, so torch's own
      DataLoader batches it too.
    - ``ReaderRegistry``: ``del`` of a reader attribute works and re-assigning a name
      drops its old reader (FFRecord raises, and keeps it); ``ConcatDataset`` returns
      every sample of a batch with repeated indices (FFRecord leaves 0 in all but the
      last place).
    - ``PackedFolder`` also reads packfs archives (symlinks followed; ``.``, ``..`` and
      a leading ``/`` resolved as a file system does) and has the rest of
      :class:`packfs.PackedFolder`; ``structure`` leaves symlinks out.
    - ``pack_folder(verbose=True)`` prints ``index/total`` without the path; FIFOs and
      devices are skipped with a warning (FFRecord reads them), and so is a symlink
      that loops (FFRecord recurses until it fails).  ``dump(verbose=True)`` works
      without tqdm.
"""

from __future__ import annotations

import importlib
from typing import Any

from .. import __version__ as packfs_version
from . import utils  # ffrecord.utils after "import ffrecord", as FFRecord's __init__ does
from .fileio import FileReader, FileWriter, checkFsAlign
from .package import PackedFolder, pack_folder

__version__ = f"1.4.0+packfs.{packfs_version}"

__all__ = [
    "FileReader",
    "FileWriter",
    "PackedFolder",
    "checkFsAlign",
    "pack_folder",
]


def __getattr__(name: str) -> Any:
    # ``ffrecord.torch`` without an import of its own, so that ``from packfs import
    # ffrecord`` also replaces ``import ffrecord.torch``; torch loads only then.
    if name == "torch":
        return importlib.import_module(f"{__name__}.torch")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
