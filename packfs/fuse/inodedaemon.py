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
import os
import signal
import threading
from typing import Any, Iterator

from ..core import Archive, ShardSet
from ..core.inplace import in_place
from ..errors import MountError
from ..source import shown_location
from .libfuse import CapturedStderr, options_error

__all__ = ["LOWLEVEL", "unavailable", "compiled_libfuse_version", "tree_for", "serve", "lowlevel_options", "READ_AHEAD_KB"]

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


def unavailable(archive: Archive | ShardSet | None = None) -> str | None:
    """Why the compiled daemon cannot serve ``archive`` (or, without one, cannot serve
    at all), in words for a one-line notice; None when it can."""
    try:
        from .. import _lowlevel
    except ImportError as error:
        if isinstance(error, ModuleNotFoundError):
            return ("packfs._lowlevel is not built (it needs gcc, libfuse3-dev 3.10 or later, pkg-config and "
                    "zlib1g-dev when packfs is installed)")
        return f"packfs._lowlevel cannot be loaded ({error})"
    if _lowlevel.FUSE_VERSION < 310:
        return f"libfuse {_lowlevel.FUSE_VERSION // 100}.{_lowlevel.FUSE_VERSION % 100} is older than 3.10"
    if archive is None:
        return None
    if isinstance(archive, ShardSet):
        return _set_unavailable(archive)
    return _archive_unavailable(archive)


def _set_unavailable(shards: ShardSet) -> str | None:
    if shards.layer_count > 1:
        return (f"the shard set has shards whose ranges overlap ({shards.layer_count} layers): the Python daemon "
                f"merges them")
    reason = _descriptors_for(shards.shard_count)
    if reason is not None:
        return reason
    for index in range(shards.shard_count):
        reason = _archive_unavailable(shards.shard(index))
        if reason is not None:
            return f"shard {index} ({shown_location(shards.shard_locations[index])}): {reason}"
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
    # The shard's, its map's (Python's mmap keeps a dup) and its Tree's own.
    need = 3 * shards + _SPARE_DESCRIPTORS
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


def _archive_unavailable(archive: Archive) -> str | None:
    view = in_place(archive, remote=True)
    if isinstance(view, str):
        return view
    if view.codecs is not None:
        from .. import _lowlevel

        if not _lowlevel.ZSTD_VERSION:
            return ("the archive has codecs (format 1.5) and packfs._lowlevel was built without libzstd "
                    "(install libzstd-dev and reinstall packfs)")
    return None


def compiled_libfuse_version() -> str:
    """The libfuse version the compiled daemon runs on ("3.14"); "" if it is not built."""
    try:
        from .. import _lowlevel
    except ImportError:
        return ""
    return f"{_lowlevel.FUSE_VERSION // 100}.{_lowlevel.FUSE_VERSION % 100}"


def tree_for(archive: Archive | ShardSet, log_fd: int = 2) -> Any:
    """The compiled daemon's view of ``archive`` (a packfs._lowlevel.Tree; for a shard
    set, a packfs._lowlevel.Forest of one Tree per shard and the set's shared
    directories, which each shard's Tree serves as it would alone), which reads
    its map, descriptor and guard in place; each record's CRC is checked at its first
    read unless the archive's policy is "never" (a record with piece CRCs, format 1.2's
    files over 1 MiB, piece by piece as reads reach them), and so, in a format 1.4
    archive, is each page of the header's and the table's bytes at the first use of a
    value in it (nothing checked them at open).  Its methods (lookup, getattr,
    readdir, read, readlink) are the daemon's operations, for tests and the fuzzer; it
    logs what it finds wrong (each entry's problem once) to ``log_fd``.

    Raises
    ------
    MountError
        :func:`unavailable` gives a reason.
    """
    reason = unavailable(archive)
    if reason is not None:
        raise MountError(f"the compiled daemon cannot serve {archive.path!r}: {reason}")
    from .. import _lowlevel

    if isinstance(archive, ShardSet):
        # Each Tree reads its shard's descriptor and map by number: the set must not drop
        # (and so close) a shard while the Forest serves it.
        archive.keep_every_shard_open()
        try:
            trees = [_tree(archive.shard(index), log_fd) for index in range(archive.shard_count)]
        except OSError as error:  # three descriptors a shard: EMFILE past the limit raised
            raise MountError(f"the compiled daemon cannot serve {archive.path!r}: {error.strerror} "
                             f"({archive.shard_count} shards, three descriptors each)") from None
        try:
            # nlink=False: the Forest counts each merged directory's links from its parts'
            # (a listing of every shared directory in Python took 4.8 s of a 1,000-shard mount).
            return _lowlevel.Forest(trees, sorted(archive.shared_directories(nlink=False)))
        except ValueError as error:
            raise MountError(f"the compiled daemon cannot serve {archive.path!r}: {error}") from None
    return _tree(archive, log_fd)


def _tree(archive: Archive, log_fd: int) -> Any:
    from .. import _lowlevel

    view = in_place(archive, remote=True)
    if isinstance(view, str):  # a shard of a set: unavailable() asked only of the set
        raise MountError(f"the compiled daemon cannot serve {archive.path!r}: {view}")
    positional, keywords = view.tree_arguments(archive.checksums != "never", log_fd)
    return _lowlevel.Tree(*positional, **keywords)


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


def serve(archive: Archive | ShardSet, mountpoint: str, options: dict[str, Any], threads: int = 0,
          debug: bool = False) -> int:
    """Mount ``archive`` at ``mountpoint`` with the compiled daemon and serve until it
    is unmounted or stopped (SIGINT, SIGTERM, SIGHUP); return the loop's status (0, or
    the stopping signal's number).

    Raises
    ------
    MountError
        The compiled daemon cannot serve it, libfuse refused an option, mounting failed.
    """
    tree = tree_for(archive)
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
        status = tree.run(threads=threads, **loop)
    if status < 0:
        raise MountError(f"serving {archive.path!r} at {mountpoint!r} failed: libfuse's loop ended with "
                         f"{os.strerror(-status)}")
    return status
