"""What must hold before a mount, shared by every daemon: FUSE present, the mount point
usable (the mount table says what is mounted where), ``allow_other`` allowed, and the
mount options (the user's ``-o``, mount(8)'s, and the ones packfs sets so the kernel
caches everything).
"""

from __future__ import annotations

import os
import shutil
import stat as stat_module
from types import ModuleType
from typing import Any

from ..errors import MountError
from ..source import is_url
from .common import CACHE_SECONDS, DEFAULT_BINDING
from .inodedaemon import LOWLEVEL, unavailable
from .libfuse import load_binding

__all__ = ["FSTYPE", "FSNAME_PREFIX", "FUSE_CONF", "mount_entry", "is_mounted", "check_fuse", "check_allow_other", "check_mountpoint",
           "check_options", "fuse_options"]

# What our mounts look like in the mount table (fuse_options sets both).
FSTYPE = "fuse.packfs"
FSNAME_PREFIX = "packfs:"


def _unescape(field: bytes) -> str:
    # /proc/self/mounts writes space, tab, newline and backslash as octal escapes.
    return os.fsdecode(field.decode("unicode_escape").encode("latin-1"))


def _mount_table() -> list[tuple[str, str, str]]:
    """(source, mountpoint, fstype) from /proc/self/mounts, in mount order."""
    entries = []
    try:
        with open("/proc/self/mounts", "rb") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) >= 3:
                    entries.append((_unescape(fields[0]), _unescape(fields[1]), fields[2].decode()))
    except OSError:
        pass
    return entries


def mount_entry(mountpoint: str) -> tuple[str, str] | None:
    """(source, fstype) of what is mounted at ``mountpoint`` (the topmost of stacked
    mounts), or None."""
    target = os.path.abspath(mountpoint)
    found = None
    for source, point, fstype in _mount_table():
        if point == target:
            found = (source, fstype)
    return found


def is_mounted(mountpoint: str) -> bool:
    """True if ``mountpoint`` is in the mount table (also when its daemon is dead)."""
    return mount_entry(mountpoint) is not None


def check_fuse(binding: str = DEFAULT_BINDING) -> ModuleType | None:
    """Raise MountError naming what is missing unless FUSE can work here with
    ``binding``; return the binding's module (None for the compiled daemon, or "auto",
    which process.choose_binding settles once the archive is open)."""
    if not os.path.exists("/dev/fuse"):
        raise MountError("FUSE is not available: /dev/fuse does not exist (load the fuse module)")
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as error:
        raise MountError(f"FUSE is not available: cannot open /dev/fuse: {error.strerror}") from None
    if not (shutil.which("fusermount3") or shutil.which("fusermount")):
        raise MountError("FUSE is not available: no fusermount or fusermount3 (install fuse3)")
    if binding == "auto":
        return None
    if binding == LOWLEVEL:
        reason = unavailable()
        if reason is not None:
            raise MountError(f"the compiled daemon (--binding {LOWLEVEL}) is not available: {reason}")
        return None
    return load_binding(binding)


FUSE_CONF = "/etc/fuse.conf"


def check_allow_other(conf: str = FUSE_CONF) -> None:
    """Raise MountError unless the caller may mount with allow_other: root always; other
    users only when ``conf`` has a ``user_allow_other`` line (fusermount's rule, which it
    would otherwise report in words of its own, after the daemon has started)."""
    if os.geteuid() == 0:
        return
    try:
        with open(conf, encoding="utf-8", errors="replace") as lines:
            if any(line.split("#", 1)[0].strip() == "user_allow_other" for line in lines):
                return
    except OSError:
        pass
    raise MountError(f"--allow-other (-o allow_other) needs a line 'user_allow_other' in {conf} "
                     f"for users other than root (ask root to add it)")


def check_mountpoint(mountpoint: str, nonempty: bool = False) -> str:
    """Raise MountError unless ``mountpoint`` is an existing, empty directory that is
    not already a mount; return its absolute path.

    A non-empty directory needs ``nonempty`` (``-o nonempty``): what is in it is hidden
    while mounted, which is seldom meant.  packfs makes this check for both bindings, so
    the option works the same on libfuse3 (which has no such option and mounts over
    anything) as on libfuse2."""
    path = os.path.abspath(mountpoint)
    if is_mounted(path):
        raise MountError(f"{mountpoint!r} is already a mount point (packfs unmount it first)")
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise MountError(f"mount point {mountpoint!r} does not exist, expected a directory") from None
    except OSError as error:
        raise MountError(f"mount point {mountpoint!r}: {error.strerror}") from None
    if not stat_module.S_ISDIR(info.st_mode):
        raise MountError(f"mount point {mountpoint!r} is not a directory")
    if not nonempty and os.listdir(path):
        raise MountError(f"mount point {mountpoint!r} is not empty (add -o nonempty to mount over "
                         f"its contents, which stay hidden while mounted)")
    return path


# Options mount(8), fstab and mount.fuse3 pass that mean nothing to a read-only FUSE
# mount or to libfuse (which rejects what it does not know): accepted and dropped.
# "rw" is among them: the archive is read-only, and mount(8) adds "rw" unless told "ro".
_IGNORED_OPTIONS = {
    "defaults", "rw", "auto", "noauto", "user", "nouser", "users", "owner", "group", "nofail",
    "_netdev", "relatime", "norelatime", "strictatime", "nostrictatime", "lazytime", "nolazytime",
    "diratime", "nodiratime", "iversion", "noiversion", "mand", "nomand", "loud", "silent",
    # A packfs mount is always nosuid and nodev (fuse_options): an archive comes from
    # elsewhere, so its setuid and setgid bits must not run its programs with another
    # user's power here, and the format holds no device nodes.  suid and dev are dropped
    # rather than refused because mount(8)'s defaults include them: fuse3's mount.fuse3
    # adds both to every mount it runs that does not say nosuid and nodev.  (Passed on,
    # they took nosuid and nodev away, silently, for root.)
    "suid", "dev",
}


def _ignored(key: str) -> bool:
    return key in _IGNORED_OPTIONS or key.startswith(("x-", "comment="))


# Options packfs sets itself: unmount (and `mount`'s output) recognise packfs mounts by them.
_RESERVED_OPTIONS = ("fsname", "subtype")

# -o uid= and gid= (decimal) and umask= (octal): what the owner and mode shown may be.
# (uid_t)-1 means "no owner" to the kernel, so 2**32 - 2 is the largest.
_LARGEST_ID = 2**32 - 2


def _check_number(key: str, value: Any) -> None:
    """Raise MountError unless -o ``key``=``value`` is a uid, gid or umask the kernel takes."""
    octal = key == "umask"
    given = f"{key}={value}" if isinstance(value, str) else key
    try:
        number = int(value, 8 if octal else 10) if isinstance(value, str) and value.isdigit() else -1
    except ValueError:
        number = -1
    if octal and not 0 <= number <= 0o7777:
        raise MountError(f"-o {given}: expected an octal mode from 0 to 7777")
    if not octal and not 0 <= number <= _LARGEST_ID:
        raise MountError(f"-o {given}: expected a number from 0 to {_LARGEST_ID}")


def check_options(extra: dict[str, Any]) -> None:
    """Raise MountError for a -o option the user may not set, or a value no daemon takes."""
    for key in _RESERVED_OPTIONS:
        if key in extra:
            raise MountError(f"-o {key} is set by packfs itself (packfs unmount recognises its "
                             f"mounts by it); leave it out")
    for key in ("uid", "gid", "umask"):
        if key in extra:
            _check_number(key, extra[key])


def fuse_options(archive: str, allow_other: bool, extra: dict[str, Any], binding: str) -> dict[str, Any]:
    """The mount options: read-only, long caches, our inode numbers, then ``extra``
    (the user's -o, which :func:`check_options` has passed) without what only mount(8)
    or packfs itself uses."""
    options: dict[str, Any] = {
        "ro": True,
        "nosuid": True,  # whatever -o says: see _IGNORED_OPTIONS
        "nodev": True,
        # A URL as it is (the source's name: no credentials, no query string).
        "fsname": f"{FSNAME_PREFIX}{archive if is_url(archive) else os.path.abspath(archive)}".replace(",", "_"),
        "subtype": "packfs",
        "default_permissions": True,  # the kernel checks mode bits; no access() round trips
        "use_ino": True,
        "kernel_cache": True,  # the archive is immutable: keep pages across opens
        "entry_timeout": CACHE_SECONDS,
        "attr_timeout": CACHE_SECONDS,
        "negative_timeout": CACHE_SECONDS,
    }
    if binding == "fusepy":
        options["max_read"] = 131072  # libfuse2's largest read request
    if allow_other:
        options["allow_other"] = True
    for key, value in extra.items():
        if _ignored(key):
            continue
        if key == "nonempty" and binding != "fusepy":
            continue  # check_mountpoint made the check; libfuse3 has no such option
        options[key] = value
    return options
