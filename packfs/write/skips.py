"""The paths a pack leaves out, and why: each reported when it is met, all listed at the end."""

from __future__ import annotations

import logging
from typing import NamedTuple

__all__ = ["SkippedPath", "SkipList"]

log = logging.getLogger("packfs")


class SkippedPath(NamedTuple):
    """A path a pack left out of the archive, and why.

    ``failed`` is True for a path that was to be packed but could not be read whole
    (unreadable, vanished, or changing while it was read: only with ``keep_going``),
    False for what an archive does not hold (FIFOs, sockets, devices, symlink loops,
    unsafe tar or zip members).
    """

    path: str
    reason: str
    failed: bool = False


class SkipList:
    """The paths one pack leaves out, each logged as a warning on the ``packfs`` logger
    when it is met (the record carries it as ``skipped_path``, which the CLI prints as
    ``skipped: PATH (reason)``).

    Parameters
    ----------
    keep_going
        Whether a failed path is skipped; if not, the pack fails listing them, and they
        are not logged as skipped.
    where
        Put before each warning (the tar or zip a member was in).
    """

    def __init__(self, keep_going: bool = False, where: str = "") -> None:
        self.keep_going = keep_going
        self.where = where
        self.paths: list[SkippedPath] = []

    def add(self, path: str, reason: str, failed: bool = False) -> None:
        """Note that ``path`` is left out, and why."""
        skipped = SkippedPath(path, reason, failed)
        self.paths.append(skipped)
        if self.keep_going or not failed:
            log.warning("%sskipped %r: %s", self.where, path, reason, extra={"skipped_path": skipped})

    @property
    def failures(self) -> list[SkippedPath]:
        """The paths that could not be read whole."""
        return [path for path in self.paths if path.failed]
