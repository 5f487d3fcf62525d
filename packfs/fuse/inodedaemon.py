"""The compiled daemon: packfs._lowlevel serves every request in C on libfuse3's
low-level API (inode = entry + 1, READDIRPLUS, no-open and no-opendir so the kernel
caches pages and listings, 1 MiB requests), on libfuse's own worker threads without the
GIL.  Python only decides whether it can serve, mounts, and waits.

What it needs, and what ``packfs mount`` does without it (the Python path daemon, said
in one line): the extension built (a C compiler, libfuse3 3.10+ and zlib headers at
install time; for an archive with codecs, format 1.5, libzstd's too), a native archive
of format 1.1 or later read in place from a local file, and its map guarded by
packfs._sigbus (the daemon must survive the archive being truncated under it).  A
shard set (packfs.core.union) is served as a Forest of one Tree per shard when every
shard could be served alone and the set is one layer (shards whose ranges do not
overlap, as a set packed at once): its shared directories are then known at mount,
O(shards x depth).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
from typing import Any, Iterator

from ..core import Archive, ShardSet
from ..core.inplace import InPlace, in_place, remote_view_problem
from ..errors import MountError
from ..format import FLAG_CODECS
from ..source import is_url, shown_location
from .libfuse import CapturedStderr, options_error

__all__ = ["LOWLEVEL", "CompiledView", "compiled_view", "unavailable", "compiled_libfuse_version", "tree_for", "serve", "lowlevel_options", "READ_AHEAD_KB"]

LOWLEVEL = "lowlevel"

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# The kernel's readahead for the mount (its bdi's read_ahead_kb; FUSE starts at 128):
# a large file read cold then comes in 1 MiB requests, several in flight.
READ_AHEAD_KB = 1024

# libfuse's high-level options that the low-level API does not take: the compiled
# daemon sets what they mean itself (inode numbers, kernel caching, timeouts).
_HIGH_LEVEL_ONLY = {"use_ino", "kernel_cache", "entry_timeout", "attr_timeout", "negative_timeout"}
# High-level options the compiled daemon applies itself, to every entry.
_OVERRIDES = ("uid", "gid", "umask", "direct_io")
# Descriptors a compiled daemon needs besides its shards' (libfuse's, the log, the
# interpreter's own, a thread per clone_fd).
_SPARE_DESCRIPTORS = 256
# libfuse's loop options, which the loop takes rather than the session.
_LOOP_OPTIONS = ("clone_fd", "max_idle_threads", "max_threads")


@dataclasses.dataclass(frozen=True)
class CompiledView:
    """What the compiled daemon serves an opened archive from, decided once per mount
    (:func:`compiled_view`): the archive, and each shard's in-place view (one for an
    archive), as :func:`packfs.core.inplace.in_place` gives it."""

    archive: Archive | ShardSet
    views: tuple[InPlace, ...]


def _extension_unavailable() -> str | None:
    try:
        from .. import _lowlevel
    except ImportError as error:
        if isinstance(error, ModuleNotFoundError):
            return ("packfs._lowlevel is not built (it needs gcc, libfuse3-dev 3.10 or later, pkg-config and "
                    "zlib1g-dev when packfs is installed)")
        return f"packfs._lowlevel cannot be loaded ({error})"
    if _lowlevel.FUSE_VERSION < 310:
        return f"libfuse {_lowlevel.FUSE_VERSION // 100}.{_lowlevel.FUSE_VERSION % 100} is older than 3.10"
    return None


def compiled_view(archive: Archive | ShardSet) -> CompiledView | str:
    """What the compiled daemon serves ``archive`` from, or why it cannot, in words for a
    one-line notice.  A mount asks this once (packfs.fuse.process.plan_mount) and hands
    the answer on: every view is made here, the local view of a URL's metadata and each
    shard's included, and the Tree is built from them (:func:`tree_for`).

    A shard set's shards are all kept open from here on (the Forest reads each one's
    descriptor and map by number: the set must never drop one), within the limit on open
    files this raises."""
    reason = _extension_unavailable()
    if reason is not None:
        return reason
    if isinstance(archive, ShardSet):
        if archive.layer_count > 1:
            return (f"the shard set has shards whose ranges overlap ({archive.layer_count} layers): the Python "
                    f"daemon merges them")
        reason = _descriptors_for(archive.shard_count)
        if reason is not None:
            return reason
        archive.keep_every_shard_open()
        views = []
        for index in range(archive.shard_count):
            view = _shard_view(archive.shard(index))
            if isinstance(view, str):
                return f"shard {index} ({shown_location(archive.shard_locations[index])}): {view}"
            views.append(view)
        return CompiledView(archive, tuple(views))
    view = _shard_view(archive)
    return view if isinstance(view, str) else CompiledView(archive, (view,))


def unavailable(archive: Archive | ShardSet | None = None, copy: bool = True) -> str | None:
    """Why the compiled daemon cannot serve ``archive`` (or, without one, cannot serve
    at all), in words for a one-line notice; None when it can (:func:`compiled_view`
    gives what it would serve from).  Without ``copy``, a URL's metadata is not copied
    to find out (``packfs info``): only what its open read is asked, and a copy that
    would fail (a full disk) is not foreseen."""
    if archive is None:
        return _extension_unavailable()
    if not copy and _urls(archive):
        reason = _extension_unavailable()
        if reason is not None:
            return reason
        shards = [archive.shard(k) for k in range(archive.shard_count)] if isinstance(archive, ShardSet) else [archive]
        for index, shard in enumerate(shards):
            reason = remote_view_problem(shard) or _zstd_problem(bool(shard.footer.flags & FLAG_CODECS))
            if reason is not None:
                return reason if len(shards) == 1 else f"shard {index}: {reason}"
        if isinstance(archive, ShardSet) and archive.layer_count > 1:
            return (f"the shard set has shards whose ranges overlap ({archive.layer_count} layers): the Python "
                    f"daemon merges them")
        return None
    view = compiled_view(archive)
    return view if isinstance(view, str) else None


def _urls(archive: Archive | ShardSet) -> bool:
    """Whether ``archive`` (every shard of a set) is read from URLs."""
    if isinstance(archive, ShardSet):
        return all(is_url(location) for location in archive.shard_locations)
    return is_url(archive.source.name)


def _zstd_problem(has_codecs: bool) -> str | None:
    if has_codecs:
        from .. import _lowlevel

        if not _lowlevel.ZSTD_VERSION:
            return ("the archive has codecs (format 1.5) and packfs._lowlevel was built without libzstd "
                    "(install libzstd-dev and reinstall packfs)")
    return None


def _descriptors_for(shards: int) -> str | None:
    """Make room for the Forest's descriptors (three per shard, all open while it serves):
    the soft limit on open files is raised, up to the hard limit, when the set needs
    more; past the hard limit, why not (the Python daemon keeps the shards it holds open
    within the limit, closing the least recently used)."""
    try:
        import resource
    except ImportError:
        return None
    # The shard's, its map's (Python's mmap keeps a dup) and its Tree's own, beyond what
    # the process holds open already (a library caller may hold many: sockets, files).
    try:
        held = len(os.listdir("/proc/self/fd"))
    except OSError:
        held = 0
    need = held + 3 * shards + _SPARE_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    if hard != resource.RLIM_INFINITY and hard < need:
        return (f"the shard set has {shards} shards, three descriptors each, and the hard limit on open files is "
                f"{hard} (ulimit -Hn): the Python daemon keeps the shards it holds open within it")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    except (OSError, ValueError) as error:
        return f"the shard set has {shards} shards, three descriptors each, and the limit on open files is {soft}: {error}"
    return None


def _shard_view(archive: Archive) -> InPlace | str:
    """One archive's in-place view (a URL's made once, kept while the archive is), or why not."""
    view = in_place(archive, remote=True)
    if isinstance(view, str):
        return view
    return _zstd_problem(view.codecs is not None) or view


def compiled_libfuse_version() -> str:
    """The libfuse version the compiled daemon runs on ("3.14"); "" if it is not built."""
    try:
        from .. import _lowlevel
    except ImportError:
        return ""
    return f"{_lowlevel.FUSE_VERSION // 100}.{_lowlevel.FUSE_VERSION % 100}"


def tree_for(served: Archive | ShardSet | CompiledView, log_fd: int = 2) -> Any:
    """The compiled daemon's view of ``served`` (an archive, or what :func:`compiled_view`
    decided for one): a packfs._lowlevel.Tree, or for a shard set a
    packfs._lowlevel.Forest of one Tree per shard and the set's shared directories, which
    each shard's Tree serves as it would alone.  It reads each map, descriptor and guard
    in place; each record's CRC is checked at its first read unless the archive's policy
    is "never" (a record with piece CRCs, format 1.2's files over 1 MiB, piece by piece as
    reads reach them), and so, in a format 1.4 archive, is each page of the header's and
    the table's bytes at the first use of a value in it (nothing checked them at open).
    Its methods (lookup, getattr, readdir, read, readlink) are the daemon's operations,
    for tests and the fuzzer; it logs what it finds wrong (each entry's problem once) to
    ``log_fd``.

    Raises
    ------
    MountError
        :func:`compiled_view` gives a reason.
    """
    if isinstance(served, CompiledView):
        view = served
    else:
        decided = compiled_view(served)
        if isinstance(decided, str):
            raise MountError(f"the compiled daemon cannot serve {served.path!r}: {decided}")
        view = decided
    return _made(view, log_fd)[0]


def _made(view: CompiledView, log_fd: int) -> tuple[Any, list[Any]]:
    """tree_for's Tree or Forest, and the Tree of each view (the Forest's parts)."""
    from .. import _lowlevel

    archive = view.archive
    check_data = archive.checksums != "never"
    if not isinstance(archive, ShardSet):
        positional, keywords = view.views[0].tree_arguments(check_data, log_fd)
        tree = _lowlevel.Tree(*positional, **keywords)
        return tree, [tree]
    try:
        trees = [_lowlevel.Tree(*positional, **keywords)
                 for positional, keywords in (one.tree_arguments(check_data, log_fd) for one in view.views)]
    except OSError as error:  # three descriptors a shard: EMFILE past the limit raised
        raise MountError(f"the compiled daemon cannot serve {archive.path!r}: {error.strerror} "
                         f"({archive.shard_count} shards, three descriptors each)") from None
    try:
        # nlink=False: the Forest counts each merged directory's links from its parts'
        # (a listing of every shared directory in Python took 4.8 s of a 1,000-shard mount).
        return _lowlevel.Forest(trees, sorted(archive.shared_directories(nlink=False))), trees
    except ValueError as error:
        raise MountError(f"the compiled daemon cannot serve {archive.path!r}: {error}") from None


class _CacheHits:
    """A URL mount's cache hits in C, added to the node cache's counters (``packfs
    cache``): each Tree counts the blocks it served from the cache itself; every
    FLUSH_EVERY seconds, and when the mount ends, what it counted since is added to its
    source's counts (its misses are read through the source, which counts them)."""

    def __init__(self, view: CompiledView, trees: list[Any]) -> None:
        self._pairs = [(tree, one.remote[0].source) for tree, one in zip(trees, view.views)
                       if one.remote is not None and hasattr(one.remote[0].source, "count_hits_elsewhere")]
        self._added = [0] * len(self._pairs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _CacheHits:
        if self._pairs:
            from ..source.cachestats import FLUSH_EVERY

            self._thread = threading.Thread(target=self._run, args=(FLUSH_EVERY,), daemon=True,
                                            name="packfs-cache-hits")
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        for _tree, source in self._pairs:
            source.flush_counts()  # the daemon ends in os._exit: no atexit writes them

    def _run(self, every: float) -> None:
        while True:
            stopped = self._stop.wait(every)
            for index, (tree, source) in enumerate(self._pairs):
                hits = tree.remote_counts()["cache_hits"]
                source.count_hits_elsewhere(hits - self._added[index])
                self._added[index] = hits
            if stopped:
                return


def lowlevel_options(options: dict[str, Any]) -> tuple[str, dict[str, int], dict[str, int]]:
    """``options`` (as checks.fuse_options gives them) as libfuse's low-level ``-o``
    string, the uid/gid/umask overrides the daemon applies itself, and the loop's
    options (clone_fd, max_idle_threads, max_threads: fuse_main takes them out before
    fuse_new, and so does this)."""
    words = []
    overrides: dict[str, int] = {}
    loop: dict[str, int] = {}
    for key, value in options.items():
        if key in _HIGH_LEVEL_ONLY:
            continue
        if key in _OVERRIDES or key in _LOOP_OPTIONS:
            try:
                number = 1 if value is True else int(str(value), 8 if key == "umask" else 10)
            except ValueError:
                raise MountError(f"-o {key}={value}: expected a number") from None
            (overrides if key in _OVERRIDES else loop)[key] = number
            continue
        if value is True:
            words.append(key)
        elif value is not False and value is not None:
            words.append(f"{key}={value}")
    words.append(f"max_read={1 << 20}")
    return ",".join(words), overrides, loop


def _raise_read_ahead(mountpoint: str) -> None:
    """Set the mount's read_ahead_kb (root only; otherwise the kernel's 128 KiB stays,
    which costs large cold files some speed).  Run on a thread once mounted: the stat
    of the mount point is a request the serving loop answers."""
    try:
        device = os.stat(mountpoint).st_dev
        with open(f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb", "w") as setting:
            setting.write(str(READ_AHEAD_KB))
    except OSError:
        pass


@contextlib.contextmanager
def _default_signals() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP at their default actions while libfuse serves:
    libfuse installs its stop handlers only over default ones, and Python's own SIGINT
    handler would only set a flag that no Python code runs to see."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {number: signal.signal(number, signal.SIG_DFL) for number in _STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)


def serve(view: CompiledView, mountpoint: str, options: dict[str, Any], threads: int = 0,
          debug: bool = False) -> int:
    """Mount ``view``'s archive (:func:`compiled_view`) at ``mountpoint`` with the compiled daemon and serve until it
    is unmounted or stopped (SIGINT, SIGTERM, SIGHUP); return the loop's status (0, or
    the stopping signal's number).

    Raises
    ------
    MountError
        The compiled daemon cannot serve it, libfuse refused an option, mounting failed.
    """
    tree, parts = _made(view, 2)
    archive = view.archive
    text, overrides, loop = lowlevel_options(options)
    tree.override(**overrides)
    threads = loop.pop("max_threads", threads)
    with _default_signals():  # before mount(), which installs libfuse's handlers
        with CapturedStderr() as said:
            try:
                tree.mount(mountpoint, text, debug=debug)
            except RuntimeError:
                failed = True
            else:
                failed = False
                said.replay()  # -d's output, warnings
        if failed:
            if "unknown option" in said.text:
                raise MountError(f"mounting {archive.path!r} at {mountpoint!r}: {options_error(said)}")
            raise MountError(f"mounting {archive.path!r} at {mountpoint!r} failed: "
                             f"{said.reason() or 'libfuse error'}")
        threading.Thread(target=_raise_read_ahead, args=(mountpoint,), daemon=True).start()
        with _CacheHits(view, parts):
            status = tree.run(threads=threads, **loop)
    if status < 0:
        raise MountError(f"serving {archive.path!r} at {mountpoint!r} failed: libfuse's loop ended with "
                         f"{os.strerror(-status)}")
    return status
