"""``exclude`` patterns of a pack, written as tar and rsync users write them, matched
against the paths of the tree being packed; each remembers whether it excluded
anything, so that one that excluded nothing can be reported."""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from typing import Sequence

__all__ = ["ExcludePatterns"]


@dataclass
class _Pattern:
    given: str
    regex: re.Pattern[str]
    anchored: bool  # matched against the path relative to SRC only, never a name
    directories_only: bool
    used: bool = False


class ExcludePatterns:
    """The ``exclude`` patterns of one pack of the directory ``src``.

    A pattern is a glob (``*``, ``?``, ``[...]``; ``*`` also matches ``/``) matched
    against an entry's path relative to ``src`` and against its name: ``.git`` leaves
    out every ``.git``, ``build/*.o`` that path.  An excluded directory is left out
    whole.  Written as tar and rsync users write them:

    - ``./PATTERN`` (tar) and ``/PATTERN`` (rsync) are anchored at the top of ``src``:
      matched against the relative path only, so ``./.git`` is ``src``'s own ``.git``;
    - an absolute path inside ``src`` (``/data/project/.git`` when packing
      ``/data/project``, or a path to it through symlinks) is that path, anchored;
    - ``PATTERN/`` matches directories only (rsync), so ``.git/`` leaves out ``.git``
      directories but not the ``.git`` files of git worktrees and submodules.

    Parameters
    ----------
    patterns
        The patterns, as given.
    src
        The directory being packed.

    Raises
    ------
    ValueError
        A pattern names ``src`` itself (``.``, ``./``, ``src``'s own absolute path).
    """

    def __init__(self, patterns: Sequence[str], src: str | bytes) -> None:
        text = os.fsdecode(src)
        tops = {os.path.abspath(text), os.path.realpath(text)}
        self._patterns = [_compile(given, tops) for given in patterns]

    def __bool__(self) -> bool:
        return bool(self._patterns)

    def excludes(self, key: bytes, name: bytes, directory: bool = False) -> bool:
        """Whether the entry at ``key`` (relative to ``src``), named ``name``, is left
        out by a pattern for any entry, or, with ``directory``, by one for directories
        only (ask again with ``directory=True`` once the entry is known to be one)."""
        path: str | None = None
        base = ""  # set with path, when a pattern is first tried
        hit = False
        for pattern in self._patterns:
            if pattern.directories_only != directory or (hit and pattern.used):
                continue  # after a hit, only patterns not yet known to match are tried
            if path is None:
                path, base = os.fsdecode(key), os.fsdecode(name)
            if pattern.regex.match(path) or (not pattern.anchored and pattern.regex.match(base)):
                pattern.used = hit = True
        return hit

    def unused(self) -> list[str]:
        """The patterns, as given, that excluded nothing (so far)."""
        return [pattern.given for pattern in self._patterns if not pattern.used]


def _compile(given: str, tops: set[str]) -> _Pattern:
    text = given
    directories_only = text.endswith("/") and text.strip("/") != ""
    if directories_only:
        text = text.rstrip("/")
    anchored = False
    if text.startswith("/"):
        text, anchored = _inside(text, tops), True
    while text.startswith("./"):
        text, anchored = text[2:].lstrip("/"), True
    if text in ("", "."):
        raise ValueError(f"exclude pattern {given!r} names the directory being packed itself")
    # A name holds no "/": a pattern with one can only match a path.
    anchored = anchored or "/" in text
    return _Pattern(given, re.compile(fnmatch.translate(text)), anchored, directories_only)


def _inside(text: str, tops: set[str]) -> str:
    """An absolute pattern as a path relative to the directory being packed (reached
    as any of ``tops``); one outside it is rsync's: anchored at the top, its ``/``
    dropped."""
    candidates = {os.path.normpath(text)}
    if not any(char in text for char in "*?["):  # a plain path: through symlinks too
        candidates.add(os.path.realpath(text))
    for candidate in candidates:
        for top in tops:
            if candidate == top:
                return ""
            prefix = top.rstrip("/") + "/"
            if candidate.startswith(prefix):
                return candidate[len(prefix):]
    return text.lstrip("/")
