"""FUSE front end: the only code that imports a FUSE binding.

- ``operations``: the FUSE callbacks over an open archive;
- ``libfuse``: running libfuse's loop (packfs's own fuse_main);
- ``process``: mounting, the background daemon, unmount and mount(8)'s helper.
"""

from __future__ import annotations

from .operations import BINDINGS, DEFAULT_BINDING, PackfsOperations
from .process import (
    FSNAME_PREFIX,
    FSTYPE,
    MOUNT_HELPER,
    check_allow_other,
    check_fuse,
    check_mountpoint,
    check_options,
    fuse_options,
    helper_script,
    is_mounted,
    is_stale,
    mount,
    mount_helper,
    mount_in_background,
    remove_old_logs,
    state_directory,
    state_file,
    unmount,
)

__all__ = [
    "BINDINGS", "DEFAULT_BINDING", "PackfsOperations", "FSNAME_PREFIX", "FSTYPE", "MOUNT_HELPER",
    "check_allow_other", "check_fuse", "check_mountpoint", "check_options", "fuse_options", "helper_script",
    "is_mounted", "is_stale", "mount", "mount_helper", "mount_in_background", "remove_old_logs",
    "state_directory", "state_file", "unmount",
]
