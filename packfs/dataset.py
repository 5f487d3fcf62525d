"""An archive's files by number, for training loops: the torch-free core of
:mod:`packfs.torch`.

A training loop asks several worker processes for file number i, millions of times.
What that needs, and how it is met here:

* **A selection that costs 8 bytes a file and is shared by forked workers.**  The files
  matching a glob, in sorted order, are one numpy array of entry indices.  A list of
  path strings is one Python object per file, and forked DataLoader workers copy such
  a list page by page as they touch its reference counts (pytorch/pytorch#13246); an
  array's buffer is never written, so its pages stay shared.
* **Small pickles.**  A selection pickles as the archive's path, that array and the
  archive's size and mtime, never the map or any data, and re-opens the archive in
  each process that reads (after a fork too, so no file offset is shared).  A worker
  that finds the archive changed since the selection was made refuses to read.
* **Flat RSS.**  Files are read with ``pread``, not copied out of the memory map:
  pages read through a map stay mapped and count in the reader's RSS, which would grow
  to the size of everything read in an epoch.  The table pages reads touch are
  released every few thousand reads, as the FUSE daemon does.
* **No path resolution per read.**  Reading by entry skips the lookup that is most of
  the cost of ``PackedFolder.read`` for a small file.
"""

from __future__ import annotations

import fnmatch
import logging
import operator
import os
import queue
import re
import threading
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from .errors import ClosedArchiveError, FormatError, NotADirectoryPathError, PathNotFoundError
from .folder import PackedFolder, PathArg
from .format import S_IFDIR, S_IFLNK, S_IFMT, S_IFREG
from .source import is_url, shown_location, with_cache_dir
from .windows import DEFAULT_WINDOW_BYTES, WindowPlan, plan_windows

__all__ = ["PackedFiles", "PoolsAhead", "Glob", "select_files", "files_by_directory", "remote_spec", "settled_window_bytes"]

# Table and header pages that reads fault in are unmapped again after this many reads
# (they stay in the page cache), so a worker's RSS does not grow with the epoch.
_RELEASE_AFTER_READS = 1 << 13


class Glob:
    """A path pattern, matched one name at a time.

    Each name is matched by :func:`fnmatch.fnmatchcase` (``*``, ``?``, ``[...]``,
    ``[!...]``; ``*`` also matches names that start with a dot), and ``**`` as a whole
    component matches any number of directories (``**/*.jpg``: every JPEG, at any
    depth; a trailing ``**``: everything below).  Matching is a small automaton over
    the names, so its cost is linear in the path for any pattern, and a walk keeps
    each directory's state instead of matching every path from its start.

    Raises
    ------
    ValueError
        The pattern is empty, or ends with ``/`` (which selects directories: the
        files below ``a/*/`` are ``a/*/**``).
    """

    def __init__(self, pattern: str) -> None:
        if pattern.endswith("/") and pattern.strip("/"):
            raise ValueError(f"the pattern {pattern!r} selects directories, not files: "
                             f"for the files below them, use {pattern + '**'!r}")
        parts = [part for part in pattern.split("/") if part not in ("", ".")]
        if not parts:
            raise ValueError(f"the pattern {pattern!r} matches no file path")
        self._tests = [None if part == "**" else re.compile(fnmatch.translate(part)).match for part in parts]
        self._accept = len(parts)
        self.start = self._closure({0})

    def _closure(self, states: set[int]) -> frozenset[int]:
        # A "**" may match no directory at all: from it, the next part is reachable too.
        pending = list(states)
        while pending:
            state = pending.pop()
            if state < self._accept and self._tests[state] is None and state + 1 not in states:
                states.add(state + 1)
                pending.append(state + 1)
        return frozenset(states)

    def step(self, states: frozenset[int], name: str) -> frozenset[int]:
        """The states after one more name (empty: nothing below can match)."""
        following = set()
        for state in states:
            if state == self._accept:
                continue
            test = self._tests[state]
            if test is None:
                following.add(state)  # "**" takes this name and may take more
            elif test(name):
                following.add(state + 1)
        return self._closure(following) if following else frozenset()

    def accepts(self, states: frozenset[int]) -> bool:
        """Whether the match ``states`` reached include a final one (the whole pattern matched)."""
        return self._accept in states

    def __call__(self, path: str) -> bool:
        """Whether full path ``path`` (no leading ``/``) matches."""
        states = self.start
        for name in path.split("/"):
            states = self.step(states, name)
            if not states:
                return False
        return self.accepts(states)


def _literal_top(pattern: str) -> str:
    """The leading directories of ``pattern`` that contain no wildcard: where a walk
    for it can start instead of at the root."""
    parts = [part for part in pattern.split("/") if part not in ("", ".")]
    literal = []
    for part in parts[:-1]:
        if any(char in part for char in "*?["):
            break
        literal.append(part)
    return "/".join(literal)


def _children_in_path_order(folder: PackedFolder, entry: int, prefix: str) -> list[tuple[str, int, int]]:
    """(path, entry, file type) of a directory's children, ordered so that a depth-first
    walk yields paths in ``sorted()`` order: names compare as stored, except that a
    directory's name compares as if followed by its '/' (``a.b`` before ``a/x``)."""
    children, names, modes = folder.archive.listing(entry)
    rows = [(prefix + os.fsdecode(name), child, mode & S_IFMT)
            for child, name, mode in zip(children, names, modes)]
    rows.sort(key=lambda row: row[0] + "/" if row[2] == S_IFDIR else row[0])
    return rows


def _file_entry(folder: PackedFolder, path: str, kind: int, child: int) -> int:
    """The regular-file entry ``child`` stands for: itself, or what a symlink resolves
    to inside the archive; -1 for anything else (a directory, a broken link)."""
    if kind == S_IFREG:
        return child
    if kind != S_IFLNK:
        return -1
    try:
        target = folder.archive.lookup(path)
    except (PathNotFoundError, NotADirectoryPathError):
        return -1
    return target if folder.archive.file_type(target) == S_IFREG else -1


def select_files(folder: PackedFolder, pattern: str = "**/*") -> tuple[np.ndarray, dict[int, str]]:
    """Entries of the files whose paths match ``pattern`` (see :class:`Glob`), in
    the order of their sorted paths, and {position: path} for the positions reached
    through a symlink: a symlink to a file in the archive counts as that file.
    Directories reached through symlinks are not walked, except for the pattern's
    leading directories without wildcards, which are looked up as a path is."""
    glob = Glob(pattern)
    match_all = pattern.strip("/") in ("**", "**/*")
    top = _literal_top(pattern)
    if top and not folder.is_dir(top):
        return np.zeros(0, np.int64), {}
    states = glob.start
    for name in top.split("/") if top else []:
        states = glob.step(states, name)
    selected: list[int] = []
    links: dict[int, str] = {}
    # A depth-first walk with each open directory's match states: a name is matched
    # once, however many paths go through it, and a directory no path below could
    # match is not entered.  Only names are kept per level (full paths per level cost
    # O(depth**2) bytes in a deep tree of long names); a path is built for a symlink,
    # which is resolved by it.
    on_path = [top] if top else []
    stack = [(iter(_children_in_path_order(folder, folder.archive.lookup(top), "")), states)]
    while stack:
        children, states = stack[-1]
        for name, child, kind in children:
            following = states if match_all else glob.step(states, name)
            if kind == S_IFDIR:
                if following:
                    stack.append((iter(_children_in_path_order(folder, child, "")), following))
                    on_path.append(name)
                    break
                continue
            if match_all or glob.accepts(following):
                path = "/".join(on_path + [name]) if kind == S_IFLNK else ""
                entry = _file_entry(folder, path, kind, child)
                if entry >= 0:
                    if entry != child:
                        links[len(selected)] = path
                    selected.append(entry)
        else:
            stack.pop()
            if stack:  # the level left was a directory entered below the top
                on_path.pop()
    return np.array(selected, dtype=np.int64), links


def files_by_directory(
    folder: PackedFolder, top: str, accept: Callable[[str], bool]
) -> Iterator[tuple[str, int, int]]:
    """(path, file entry, listed entry) below directory ``top`` (the listed entry is the
    symlink, for a file reached through one), in the order torchvision's
    ``make_dataset`` lists a class folder: directories in sorted order of their paths
    (``sorted(os.walk(top))``), each one's files sorted by name; only paths that
    ``accept`` takes."""
    directories = []  # (path, its files' (path, entry, type)), listed once each
    stack = [(folder.archive.lookup(top), top)]
    while stack:
        entry, path = stack.pop()
        files = []
        for row in _children_in_path_order(folder, entry, path + "/" if path else ""):
            if row[2] == S_IFDIR:
                stack.append((row[1], row[0]))
            else:
                files.append(row)
        directories.append((path, sorted(files)))
    directories.sort(key=lambda directory: directory[0])
    for _, files in directories:
        for path, child, kind in files:
            if accept(path):
                file_entry = _file_entry(folder, path, kind, child)
                if file_entry >= 0:
                    yield path, file_entry, child


class PackedFiles(Sequence):
    """Files of an archive by number: ``files[i]`` is the contents of the i-th file.

    Parameters
    ----------
    archive
        The archive's path or URL, or an open :class:`PackedFolder` to select from
        (whose own ``check_data`` then applies).  Each worker process opens its own.
    pattern
        Which files (see :class:`Glob`), listed in sorted order of their paths.
    check_data
        Check each file's CRC as it is read.
    entries
        The selection itself, as entry indices (instead of ``pattern``).
    storage_options
        For a URL: credentials, endpoint and client options (:mod:`packfs.source.remote`).
    cache_dir
        For a URL: the disk cache shared by every process on the node
        (:mod:`packfs.source.cache`; None: ``$PACKFS_CACHE_DIR``, else
        ``~/.cache/packfs``; False: none).
    window_bytes
        Block-aware reading (:mod:`packfs.windows`): the selection is cut into windows
        of about this many bytes of adjacent records, and the first read of a file of a
        window in a process first makes the whole window present in the node's disk
        cache (:meth:`packfs.core.Archive.prefetch`: one or a few large GETs, once per
        node), so an epoch in a :class:`~packfs.windows.WindowPlan` order costs a GET
        per window, not per file.  None: files are read as asked.
    fetch_windows
        With windows, whether reads fetch whole windows from the start (False: only
        once a :class:`packfs.torch.WindowedSampler` orders the files' dataset, as
        ``window_bytes="auto"`` datasets do; :attr:`fetch_windows` is the switch).

    Raises
    ------
    PathNotFoundError
        No file matches.
    """

    def __init__(self, archive: PathArg | PackedFolder, pattern: str = "**/*", check_data: bool = True,
                 entries: Sequence[int] | np.ndarray | None = None, links: dict[int, str] | None = None,
                 storage_options: Mapping[str, Any] | None = None, cache_dir: PathArg | bool | None = None,
                 window_bytes: int | None = None, fetch_windows: bool = True) -> None:
        storage_options = with_cache_dir(storage_options, cache_dir)
        self._storage_options = storage_options  # a worker re-opens a URL with them
        if isinstance(archive, PackedFolder):
            self._folder: PackedFolder | None = archive
            self.archive, check_data = archive.spec, archive.check_data
        else:
            self._folder = PackedFolder(archive, check_data=check_data, storage_options=storage_options)
            self.archive = self._folder.spec  # what a worker re-opens: a relative path made absolute
        self._pid = os.getpid()
        self._closed = False
        self.pattern = pattern
        self.check_data = check_data
        # Of the file the selection is made from (its descriptor, not its path, which
        # may already name a replacement).
        self._identity = _identity(self._folder)
        self._reads = 0
        if entries is None:
            entries, links = select_files(self._folder, pattern)
            if not len(entries):
                raise PathNotFoundError(f"{shown_archive(self.archive)!r}: no file matches {pattern!r}")
        self._links = links or {}  # position -> its path, for a file reached through a symlink
        self.entries = np.ascontiguousarray(entries, dtype=np.int64)
        self.entries.setflags(write=False)
        self.window_bytes = None if window_bytes is None else int(window_bytes)
        # Made once, in the process that makes the DataLoader, and handed to the workers
        # with the selection: here when reads fetch windows from the start, else at a
        # WindowedSampler's first use; never for an epoch read in a uniform shuffle
        # (each file's record located: the table's record and size columns read whole).
        self._plan: WindowPlan | None = None
        self._fetched: np.ndarray | None = None  # windows this process made present (a byte each)
        #: Whether a read fetches its file's whole window first: with windows and
        #: ``fetch_windows``; a WindowedSampler over the files' dataset sets it (the
        #: order is windowed).  A uniformly shuffled epoch that fetched whole windows
        #: would fetch every window in its first batches, and a dataset larger than
        #: the cache over and over.
        self.fetch_windows = self.window_bytes is not None and fetch_windows
        if self.fetch_windows:  # fetching from the first read: made here, not by each worker
            self._own_plan()

    @property
    def folder(self) -> PackedFolder:
        """The open archive, re-opened in a process that did not open it (a worker)."""
        if self._closed:
            raise ClosedArchiveError(f"I/O operation on a closed dataset ({shown_archive(self.archive)!r})")
        if self._folder is None or self._pid != os.getpid():
            # A forked worker drops its copy of the parent's folder rather than sharing
            # its file offset.
            folder = PackedFolder(self.archive, check_data=self.check_data, storage_options=self._storage_options)
            identity = _identity(folder)
            if identity != self._identity:
                folder.close()
                raise FormatError(
                    f"{shown_archive(self.archive)!r} changed since these files were selected from it "
                    f"(device, inode, size and mtime {identity}, expected {self._identity}): "
                    f"select them again"
                )
            self._folder, self._pid = folder, os.getpid()
            self._fetched = None  # the parent's windows are not this process's to vouch for
        return self._folder

    def window_plan(self, window_bytes: int | None = None) -> WindowPlan:
        """The selection's windows (:class:`~packfs.windows.WindowPlan`): of the
        ``window_bytes`` the files were made with when that is not None (the windows
        they fetch whole), else of ``window_bytes`` (None:
        :data:`~packfs.windows.DEFAULT_WINDOW_BYTES`).

        Raises
        ------
        ValueError
            ``window_bytes`` differs from the files' own: a sampler's windows must be
            the ones the files fetch."""
        if self.window_bytes is not None:
            if window_bytes is not None and int(window_bytes) != self.window_bytes:
                raise ValueError(f"these files fetch windows of {self.window_bytes} bytes, not {window_bytes}: "
                                 f"give the dataset window_bytes={window_bytes}, or leave the sampler's unset")
            return self._own_plan()
        return plan_windows(self.folder.archive, self.entries,
                            DEFAULT_WINDOW_BYTES if window_bytes is None else int(window_bytes))

    def _own_plan(self) -> WindowPlan:
        """The windows of the files' own ``window_bytes``, made at the first call."""
        if self._plan is None:
            assert self.window_bytes is not None
            self._plan = plan_windows(self.folder.archive, self.entries, self.window_bytes)
        return self._plan

    def _fetch_windows(self, indices: np.ndarray, folder: PackedFolder) -> None:
        """Make the windows of files ``indices`` present in the node's disk cache, all of
        them in one call (their GETs in flight together), each window once per process:
        after that its files are read from the cache (another process's call for the
        same window waits for this one's fetch, the cache's single flight)."""
        if not self.fetch_windows or self.window_bytes is None or not len(indices):
            return
        self._prefetch(np.unique(self._own_plan().window_of[indices]), folder)

    def prefetch_windows(self, windows: Sequence[int] | np.ndarray) -> int:
        """Make windows ``windows`` of :meth:`window_plan` present in the node's disk
        cache now (one or a few large GETs each, once per node), the bytes fetched: what
        a :class:`packfs.torch.WindowedSampler` asks of the next pool while the current
        one is read.  0 without windows, locally, or without a disk cache."""
        if self.window_bytes is None:
            return 0
        return self._prefetch(np.asarray(windows, dtype=np.int64), self.folder)

    def _prefetch(self, windows: np.ndarray, folder: PackedFolder) -> int:
        plan = self._own_plan()
        if self._fetched is None:
            self._fetched = np.zeros(plan.windows, dtype=bool)
        windows = windows[~self._fetched[windows]]
        if not len(windows):
            return 0
        members = np.concatenate([plan.members(int(window)) for window in windows])
        fetched = folder.archive.prefetch(self.entries[members])
        self._fetched[windows] = True
        return fetched

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_folder"] = None  # re-opened where it is used
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int) -> bytes:  # type: ignore[override]
        entry = int(self.entries[operator.index(index)])
        folder = self.folder
        self._fetch_windows(np.array([operator.index(index)], dtype=np.int64) % len(self.entries), folder)
        self._count_reads(1)
        return folder.archive.read(entry)

    def read_batch(self, indices: Sequence[int] | np.ndarray,
                   transform: Callable[[int, bytes], Any] | None = None) -> list[Any]:
        """The contents of several files, in the order asked; with ``transform``, what it
        returns for (index, contents) of each.

        The batch's table values are checked at once, and files are read in archive
        order (adjacent small ones with one ``pread``; from a URL, neighbours share a
        ranged GET and the batch's GETs are in flight at once).  ``transform`` is applied as
        each file is read, so only one file's bytes are held at a time."""
        indices = np.asarray(indices)
        if indices.size and indices.dtype.kind not in "iu":  # 1.9 or True is no index
            raise IndexError(f"indices must be integers, not {indices.dtype}")
        indices = indices.astype(np.int64)
        entries = self.entries[indices]
        folder = self.folder
        self._fetch_windows(indices % len(self.entries), folder)
        self._count_reads(len(entries))
        results: list[Any] = [None] * len(entries)
        for position, data in folder.archive.read_batch(entries):
            results[position] = data if transform is None else transform(int(indices[position]), data)
        return results

    def stats(self) -> dict[str, int]:
        """What reading cost in this process so far (:meth:`packfs.core.Archive.stats`:
        requests, bytes fetched, ... for a URL; {} locally): a DataLoader worker's
        own, since each worker opens the archive for itself."""
        return self.folder.stats()

    def path(self, index: int) -> str:
        """The archive path of file ``index`` (of the symlink, for one reached through it)."""
        index = operator.index(index)
        index += len(self.entries) if index < 0 else 0
        if not 0 <= index < len(self.entries):
            raise IndexError(f"file {index} of {len(self.entries)}")
        if index in self._links:
            return self._links[index]
        return os.fsdecode(self.folder.archive.path_of(int(self.entries[index])))

    def _count_reads(self, count: int) -> None:
        self._reads += count
        if self._reads >= _RELEASE_AFTER_READS:
            self._reads = 0
            self._folder.archive.release_pages()  # type: ignore[union-attr]

    def close(self) -> None:
        """Close the archive this process opened; later reads raise ValueError."""
        if self._folder is not None and self._pid == os.getpid():
            self._folder.close()
        self._folder = None
        self._closed = True

    def __repr__(self) -> str:
        return f"PackedFiles({shown_archive(self.archive)!r}, {self.pattern!r}: {len(self)} files)"


class PoolsAhead:
    """Fetches pools of windows into the node's disk cache on a thread of its own, one
    after another in the order asked: a :class:`packfs.torch.WindowedSampler`, in the
    process that draws the epoch's order, asks for the next pool as the current one
    starts being read, so that the workers find it in the cache (or wait for its fetch,
    the cache's single flight) instead of waiting for all of its windows at its first
    batch.  What fails is left to the workers' own reads (which fetch what is missing
    and raise what is wrong), and said once in the log.

    The thread is a daemon (a run that ends mid-epoch does not wait for it), made at the
    first pool asked; :meth:`restart` drops what an abandoned iteration had asked."""

    def __init__(self, files: PackedFiles) -> None:
        self._files = files
        self._asked: queue.SimpleQueue[tuple[int, np.ndarray]] = queue.SimpleQueue()
        self._generation = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.fetched = 0  # bytes this thread fetched
        self._warned = False

    def restart(self) -> None:
        """A new iteration: pools asked before are not fetched any more."""
        with self._lock:
            self._generation += 1

    def ask(self, windows: np.ndarray) -> None:
        """Fetch ``windows`` after what was asked before."""
        with self._lock:
            self._asked.put((self._generation, windows))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="packfs-pools-ahead", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            generation, windows = self._asked.get()
            if generation != self._generation:
                continue
            try:
                self.fetched += self._files.prefetch_windows(windows)
            except Exception as error:  # the workers' reads fetch it, or raise what is wrong
                if not self._warned:
                    self._warned = True
                    logging.getLogger("packfs.dataset").warning("fetching the next windows ahead failed: %s", error)


def remote_spec(spec: object) -> bool:
    """Whether an archive given as ``spec`` (a path, URL, or list of them) is read from
    a URL: what decides block-aware reading's default (:func:`settled_window_bytes`)."""
    if isinstance(spec, (list, tuple)):
        return any(remote_spec(item) for item in spec)
    return isinstance(spec, str) and is_url(spec)


def settled_window_bytes(window_bytes: int | str | None, spec: object) -> int | None:
    """A dataset's ``window_bytes`` option settled: ``"auto"`` is
    :data:`~packfs.windows.DEFAULT_WINDOW_BYTES` for an archive at a URL and None (read
    as asked, a true uniform shuffle) for a local one; None or a size as given.

    Raises
    ------
    ValueError
        Neither "auto", None nor a positive size."""
    if window_bytes == "auto":
        return DEFAULT_WINDOW_BYTES if remote_spec(spec) else None
    if window_bytes is None:
        return None
    if isinstance(window_bytes, str) or isinstance(window_bytes, bool) or int(window_bytes) < 1:
        raise ValueError(f"window_bytes must be 'auto', None or a positive number of bytes, not {window_bytes!r}")
    return int(window_bytes)


def shown_archive(spec: object) -> object:
    """A dataset's archive (a path, URL or list of them) as messages and ``repr`` show
    it: a URL without its user and password (what workers re-open keeps them)."""
    if isinstance(spec, str):
        return shown_location(spec)
    if isinstance(spec, (list, tuple)):
        return [shown_location(item) if isinstance(item, str) else item for item in spec]
    return spec


def _identity(folder: PackedFolder) -> object:
    # Of the open archive (locally its descriptor's device, inode, size and mtime), not
    # of its path, which may already name a replacement.
    return folder.archive.identity
