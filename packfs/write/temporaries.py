"""Temporary files of pack and unpack: known from before they exist until they are
published or removed, so that a signal at any point finds them; and the leftovers of a
killed process told apart from a live writer's.

A writer registers a temporary name *before* it creates the file, and unregisters it
only once the file is published or removed.  A signal handler that calls
:func:`remove_unfinished` before raising (the CLI's) therefore removes whatever was
being written, whichever instruction the signal interrupted: between the system call
that created the file and the ``try`` that would remove it included.  Names carry the
writer's process id, so that ``kill -9``'s leftovers (which nothing can catch) are
recognised and removed by the next pack or unpack: see :func:`abandoned`.
"""

from __future__ import annotations

import os
__all__ = ["register", "unregister", "remove_unfinished", "abandoned", "process_alive"]

# (directory descriptor or None for the working directory, path relative to it) of each
# temporary file this process has registered and neither published nor removed.  An
# entry with a descriptor is unregistered before that descriptor is closed.
_UNFINISHED: set[tuple[int | None, str | bytes | os.PathLike]] = set()


def register(path: str | bytes | os.PathLike, dir_fd: int | None = None) -> None:
    """Record that a temporary file is about to be created at ``path`` (relative to
    ``dir_fd``); call before creating it."""
    _UNFINISHED.add((dir_fd, path))


def unregister(path: str | bytes | os.PathLike, dir_fd: int | None = None) -> None:
    """Forget ``path``: the file was published under its own name or removed."""
    _UNFINISHED.discard((dir_fd, path))


def remove_unfinished() -> None:
    """Remove every temporary file registered and not yet unregistered: for a signal
    handler, before it raises (every registered directory descriptor is still open
    then), whichever point of a write the signal interrupted.  A name registered but
    not created yet is no error."""
    for dir_fd, path in list(_UNFINISHED):
        try:
            os.unlink(path, dir_fd=dir_fd)
        except OSError:
            pass
        _UNFINISHED.discard((dir_fd, path))


def abandoned(pid: int, name: str | bytes | os.PathLike) -> bool:
    """Whether a temporary file named with process ``pid`` and registered (if by this
    process) as ``name`` is nobody's any more: its process is gone, or it is this
    process (the same pid again, as in a new container) and this process did not
    register it."""
    if pid == os.getpid():
        return all(path != name for _, path in list(_UNFINISHED))
    return not process_alive(pid)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs.  A killed process that has not been reaped
    (a zombie) or is being torn down no longer writes: it counts as gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            state = stat_file.read().rpartition(b")")[2].split()[:1]
        return state not in ([b"Z"], [b"X"], [b"x"])
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # alive, someone else's
        return True
