"""The paths a pack leaves out, and why: each reported when it is met, all listed at the end."""

from __future__ import annotations

import logging

from ..errors import SkippedPath

__all__ = ["SkippedPath", "SkipList"]

log = logging.getLogger("packfs")


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
