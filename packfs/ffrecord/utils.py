"""FFRecord's ``ffrecord.utils``: :func:`dump`."""

from __future__ import annotations

import multiprocessing
import operator
import os
import warnings
from pathlib import Path
from typing import Any, Mapping, Union

from ..errors import PackError
from .fileio import FileWriter

__all__ = ["dump"]

# As FFRecord: at most this many writer processes at a time.
_MAX_PROCESSES = 16


def dump(dataset: Mapping[int, Any], fname: Union[str, os.PathLike], nfiles: int, verbose: bool = False) -> None:
    """Write ``dataset[0]``, ``dataset[1]``, ... (bytes-like, any object with
    ``len()`` and ``[]``) to FFRecord files.

    With ``nfiles == 1``, ``fname`` is one ``.ffr`` file.  Otherwise ``fname`` is a
    folder (created if needed) of ``PART_00000.ffr``, ``PART_00001.ffr``, ...: the
    records split into runs of ``ceil(n / nfiles)``, each written by its own process,
    up to 16 at a time, as FFRecord does; ``FileReader(fname)`` reads them back as one
    sequence in the original order.  A warning says when that gives fewer than
    ``nfiles`` files, or when the folder holds other ``.ffr`` files (``FileReader``
    would read those too).  Existing files of the same names are replaced.

    Parameters
    ----------
    dataset
        The records.  Under the ``spawn`` or ``forkserver`` start methods it is
        pickled to each writer process.
    fname
        The ``.ffr`` file (``nfiles == 1``) or the folder.
    nfiles
        How many files to split the records into.
    verbose
        Show progress (tqdm bars where tqdm is installed, else a line per file).

    Raises
    ------
    ValueError
        ``nfiles`` is less than 1.
    PackError
        The folder cannot be created, or a writer process failed (its file is then
        not written).
    """
    n = len(dataset)
    nfiles = operator.index(nfiles)
    if nfiles < 1:
        raise ValueError(f"nfiles must be at least 1, got {nfiles}")
    if nfiles == 1:
        _write_part(0, n, dataset, fname, verbose)
        return
    out_dir = Path(fname)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PackError(f"{str(out_dir)!r}: cannot create the output folder: {error.strerror}") from None
    size = max(-(-n // nfiles), 1)
    tasks = [(start, min(size, n - start), dataset, out_dir / f"PART_{part:05d}.ffr", verbose)
             for part, start in enumerate(range(0, n, size))]
    if not tasks:  # no record: one empty file, so that the folder reads as 0 records
        tasks = [(0, 0, dataset, out_dir / "PART_00000.ffr", verbose)]
    if len(tasks) != nfiles:
        warnings.warn(f"Split into {len(tasks)} files rather than {nfiles} files", stacklevel=2)
    others = sorted(set(out_dir.glob("*.ffr")) - {task[3] for task in tasks})
    if others:
        warnings.warn(f"{str(out_dir)!r} also holds {', '.join(path.name for path in others[:5])}"
                      f"{' ...' if len(others) > 5 else ''}: FileReader of the folder reads them too",
                      stacklevel=2)
    failed = []
    for first in range(0, len(tasks), _MAX_PROCESSES):
        processes = []
        for task in tasks[first : first + _MAX_PROCESSES]:
            process = multiprocessing.Process(target=_write_part, args=task)
            process.start()
            processes.append((process, task[3]))
        for process, path in processes:
            process.join()
            if process.exitcode != 0:
                failed.append(f"{str(path)!r} (exit code {process.exitcode})")
    if failed:
        raise PackError(f"the processes writing {', '.join(failed)} failed; those files were not written")


def _write_part(start: int, count: int, dataset: Mapping[int, Any], fname: Union[str, os.PathLike],
                verbose: bool) -> None:
    """Write ``dataset[start : start + count]`` to ``fname`` (one writer process's work)."""
    indices: Any = range(start, start + count)
    bar = False
    if verbose:
        try:
            from tqdm import tqdm
        except ImportError:  # FFRecord requires tqdm; packfs does not
            pass
        else:
            indices, bar = tqdm(indices), True
    with FileWriter(fname, count) as writer:
        for index in indices:
            writer.write_one(dataset[index])
    if verbose and not bar:
        print(f"{str(fname)}: {count} records written", flush=True)
