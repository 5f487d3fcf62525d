"""``packfs.mount``: the FUSE front end's public names, kept for scripts and for the
mount(8) helpers that earlier versions installed.  The code is in :mod:`packfs.fuse`
(callbacks, running libfuse, mounting as processes)."""

from __future__ import annotations

from .fuse import *  # noqa: F401,F403  (re-exported: this module is the old public name)
from .fuse import __all__  # noqa: F401
