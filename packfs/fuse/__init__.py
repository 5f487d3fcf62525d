"""FUSE front end: the only code that imports a FUSE binding.

- ``common``: what every daemon shares (bindings, the name codec, errno mapping,
  the kernel's view of attributes);
- ``inodedaemon``: the compiled daemon (packfs._lowlevel, libfuse's low-level API,
  inode = entry + 1): the default wherever it can serve;
- ``pathdaemon``: the Python daemon, FUSE callbacks by path (libfuse's high-level API);
- ``checks``: what must hold before a mount (FUSE present, the mount point, the mount
  table, options);
- ``libfuse``: running libfuse's loop (packfs's own fuse_main);
- ``process``: mounting, the background daemon, unmount and mount(8)'s helper.

Every daemon reads the archive through :class:`packfs.core.Archive` only.
"""

from __future__ import annotations

from .common import BINDINGS, DAEMONS, DEFAULT_BINDING
from .inodedaemon import LOWLEVEL, CompiledView, compiled_libfuse_version, compiled_view, tree_for, unavailable
from .pathdaemon import PackfsOperations
from .checks import (FSNAME_PREFIX, FSTYPE, check_allow_other, check_fuse, check_mountpoint, check_options,
                     fuse_options, is_mounted)
from .process import (
    MOUNT_HELPER,
    MountPlan,
    choose_binding,
    helper_script,
    hide_command_line_secrets,
    is_stale,
    mount,
    mount_helper,
    mount_in_background,
    open_for_mount,
    plan_mount,
    remove_old_logs,
    state_directory,
    state_file,
    unmount,
)

__all__ = [
    "BINDINGS", "DAEMONS", "DEFAULT_BINDING", "LOWLEVEL", "CompiledView", "MountPlan", "choose_binding", "compiled_view", "compiled_libfuse_version", "tree_for", "unavailable", "PackfsOperations", "FSNAME_PREFIX", "FSTYPE", "MOUNT_HELPER",
    "check_allow_other", "check_fuse", "check_mountpoint", "check_options", "fuse_options", "helper_script",
    "hide_command_line_secrets",
    "is_mounted", "is_stale", "mount", "mount_helper", "mount_in_background", "open_for_mount", "plan_mount", "remove_old_logs",
    "state_directory", "state_file", "unmount",
]
