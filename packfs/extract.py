"""unpack(): restore an archive's tree on disk, never writing outside the destination.

Every create is relative to an open directory descriptor and never follows a final
symlink (O_EXCL | O_NOFOLLOW; mkdir, symlink and link never follow one), and names
are single components (the table forbids "/", ".", ".." and NUL).  So no symlink in
the archive, or already in the destination, can redirect a write elsewhere.

A file (and a symlink) is written under a temporary name in its directory and
published under its own name (link, then unlink the temporary name) only once its CRC
has matched and its attributes are set: a file under its archived name is always
complete and correct, even after a crash, which is what lets ``skip_existing`` resume
an earlier unpack.  The temporary name (``.packfs-unpack-<pid>-<random>``) is
registered before the file exists (:mod:`packfs.write.temporaries`), so a signal
handler that removes what is registered (the CLI's) leaves nothing, whichever
instruction the signal lands on; ``kill -9``'s leftovers are removed by the next unpack
into that directory (:meth:`_Extractor.remove_abandoned`).

Damage is handled per file: a file (or symlink) whose contents fail their CRC, or
whose table values are inconsistent, is left out and reported, everything intact is
unpacked, and :class:`UnpackDamagedError` is raised at the end (``stop_on_error``
stops at the first one instead).  Problems of the destination (something in the way,
no space, no permission) stop at once: they would recur for every file after.

What is written is what the table claims, so before anything is created the whole
archive is checked against the rules that bound it (format section 5, "before writing
out a whole archive": offsets non-decreasing, and a record shared only by the names of
one hard-linked file): each record is then written once, the other names of a file
are hard links, and the bytes written are at most the archive's size.  An archive with
codecs (format 1.5, section 4f) may hold much more than its size (compressed files;
one record shared by files with equal contents, each written as a file of its own, not
a hard link), so the bytes to write are compared with DEST's free space first, and a
sparse file is written sparse: its holes are skipped, never written as zeros.  A hostile
archive whose records all cover the same bytes, each with a valid CRC, is a
FormatError there, not a bomb.  Where DEST refuses a hard link, a copy is written
instead, and later names link to that copy (EMLINK: the first name's inode is full);
such copies together may not exceed the archive's size either.

The walk is iterative and holds a bounded number of directory descriptors (reopening
a parent through ".." when it has to), and no path string is built per entry, so
trees of any depth unpack: paths longer than PATH_MAX included.
"""

from __future__ import annotations

import contextlib

import errno
import logging
import os
import re
import secrets
import stat as stat_module
from typing import Callable, Iterator, Sequence

from .errors import ArchiveChangedError, ChecksumError, FormatError, UnpackDamagedError, UnpackError, UnpackStats
from .folder import PackedFolder, PathArg
from .format import CODEC_SPARSE, S_IFDIR, S_IFLNK, S_IFREG
from .write.temporaries import abandoned, register, unregister

log = logging.getLogger("packfs")

__all__ = ["unpack", "UnpackStats", "check_claims"]

_CHUNK = 1 << 20
# Directory descriptors held open at once on the way down a deep tree; the ones above
# are closed and reopened through ".." on the way back up (ulimit -n is often 1024).
_OPEN_DIRS = 64
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# link() failures that mean "this file system has no (more) hard links here", not
# "something is in the way".
_NO_LINKS = {errno.EPERM, errno.EMLINK, errno.EXDEV, errno.ENOTSUP, errno.EOPNOTSUPP}
_EXISTS_HINT = "unpack never overwrites; to resume an earlier unpack, skip existing files (--skip-existing)"
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMPORARY_MARKER = ".packfs-unpack-"
# Names without "<pid>-" were made by packfs before it put the pid in them: leftovers too.
_TEMPORARY_NAME = re.compile(r"\.packfs-unpack-(?:([0-9]+)-)?[0-9a-f]{12}\Z")


class _Damaged(Exception):
    """One entry is damaged: it is left out; ``reason`` says why."""

    def __init__(self, reason: str, cause: FormatError | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.cause = cause


def _reason(error: FormatError) -> str:
    if isinstance(error, ChecksumError):
        return "checksum mismatch"
    return str(error)


class _Frame:
    """A directory being filled: its entry, descriptor (-1 while closed), identity
    (to check a reopen through ".." found it again) and the children still to do."""

    __slots__ = ("entry", "fd", "identity", "children")

    def __init__(self, entry: int, fd: int, children: Iterator[int]) -> None:
        self.entry = entry
        self.fd = fd
        st = os.fstat(fd)
        self.identity = (st.st_dev, st.st_ino)
        self.children = children


class _Extractor:
    def __init__(self, folder: PackedFolder, dest_fd: int, dest: str,
                 progress: Callable[[int], None] | None, skip_existing: bool, stop_on_error: bool,
                 on_damaged: Callable[[str, str], None] | None, xattrs: bool = True) -> None:
        self.folder = folder
        self.restore_xattrs = xattrs and folder.archive.xattr_entries > 0
        self.archive = archive = folder.archive
        self.dest_fd = dest_fd
        self.dest = dest
        self.progress = progress
        self.skip_existing = skip_existing
        self.stop_on_error = stop_on_error
        self.on_damaged = on_damaged
        self.as_root = os.geteuid() == 0
        self.dest_created = False  # set by unpack(): only a DEST it made gets the root's attributes
        self.dest_mode = -1  # a resumed DEST's own mode, while unpack has it opened up to fill it
        self.root_finished = False
        self.temporary_prefix = f"{_TEMPORARY_MARKER}{os.getpid()}-".encode()
        # Keyed by inode, which every name of a hard-linked file shares (and only those:
        # check_claims refuses records shared otherwise before anything is written).
        self.first_entry: dict[int, int] = {}  # inode -> the entry whose name holds it in DEST
        self.damaged_records: dict[int, str] = {}  # inode -> why it was left out
        self.damaged: list[tuple[str, str]] = []
        self.attempted = 0  # files and symlinks met
        # Bytes of copies written where DEST refused a hard link: at most the archive's size.
        self.copied = 0
        self.copy_budget = archive.size
        self.counts = {"files": 0, "dirs": 0, "symlinks": 0, "hardlinks": 0, "bytes": 0, "existing": 0,
                       "xattrs": 0, "xattrs_not_restored": 0}
        self.xattr_warned: set[int] = set()  # errnos already warned about: one line each
        self.frames: dict[int, _Frame] = {}  # directory entry -> its frame, for the stack's directories

    # -- helpers -----------------------------------------------------------------------

    def label(self, entry: int) -> str:
        """The entry's path for messages (built only when one is needed: O(depth))."""
        try:
            return os.fsdecode(self.archive.path_of(entry))
        except FormatError:
            return f"<entry {entry}>"

    def _error(self, entry: int, what: str) -> UnpackError:
        return UnpackError(f"cannot unpack {self.label(entry)!r} into {self.dest!r}: {what}")

    def _advance(self, nbytes: int) -> None:
        if self.progress is not None and nbytes:
            self.progress(nbytes)

    def _report_damage(self, entry: int, damage: _Damaged) -> None:
        if self.stop_on_error:
            if damage.cause is not None:
                raise damage.cause
            raise ChecksumError(f"{self.folder.path!r}: {self.label(entry)!r}: {damage.reason}; "
                                f"the damaged file was not unpacked")
        path = self.label(entry)
        self.damaged.append((path, damage.reason))
        if self.on_damaged is not None:
            self.on_damaged(path, damage.reason)

    def stats(self) -> UnpackStats:
        c = self.counts
        return UnpackStats(c["files"], c["dirs"], c["symlinks"], c["hardlinks"], c["bytes"],
                           c["existing"], tuple(self.damaged), c["xattrs"], c["xattrs_not_restored"])

    def _restore_xattrs(self, entry: int, target: int | bytes, parent_fd: int | None = None) -> None:
        """Set entry ``entry``'s extended attributes on ``target`` (a descriptor, or a
        symlink's name in ``parent_fd``): after its owner (chown clears a file
        capability) and before its mode (user.* needs write permission).  What DEST
        refuses (EPERM for trusted.* without root, user.* on a symlink, a file system
        without attributes) is counted and warned about once per reason, as tar does."""
        if not self.restore_xattrs:
            return
        for name, value in self.archive.xattrs(entry):
            try:
                if parent_fd is None:
                    os.setxattr(target, name, value)
                else:  # no *at() call sets attributes: through the directory's descriptor
                    os.setxattr(b"/proc/self/fd/%d/%s" % (parent_fd, target), name, value, follow_symlinks=False)
            except OSError as error:
                self.counts["xattrs_not_restored"] += 1
                if error.errno not in self.xattr_warned:
                    self.xattr_warned.add(error.errno)
                    log.warning("%r: extended attribute %r not restored (%s); others refused for the same "
                                "reason are counted in the summary", self.label(entry), os.fsdecode(name),
                                error.strerror)
            else:
                self.counts["xattrs"] += 1

    # -- directories -------------------------------------------------------------------

    def open_dir(self, parent_fd: int, name: bytes, entry: int) -> int:
        """Create (or reuse) directory ``name`` and open it without following a symlink."""
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
            existed = False
        except FileExistsError:
            existed = True
        except OSError as error:
            raise self._error(entry, error.strerror) from None
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self._error(entry, "a non-directory is in the way") from None
            raise self._error(entry, error.strerror) from None
        if not self.as_root:
            # An earlier unpack may have made it read-only (its archived mode): open it
            # up while filling it; its mode is set again once it is done.
            mode = os.fstat(fd).st_mode
            if mode & 0o700 != 0o700:
                try:
                    os.fchmod(fd, mode | 0o700)
                except OSError:
                    pass
        if existed:
            self.remove_abandoned(fd)
        return fd

    def _finish_dir(self, entry: int, fd: int) -> None:
        # Attributes last: a read-only directory must not block its children.
        try:
            if entry == 0 and not self.dest_created:
                # DEST was there before: its owner and mode stay the user's.  An
                # archive's root attributes (owner 1234, mode 0777, no sticky bit) would
                # otherwise take over an existing directory, /tmp included, when root
                # unpacks into it.  A resume finishes what the unpack that made DEST
                # left undone: that unpack set its owner and mode as it stopped
                # (leave_dest), and the mtime could not be set before now.
                self.put_back_dest_mode(fd)
                if self.skip_existing:
                    mtime_ns = self.archive.stat(entry).mtime_ns
                    os.utime(fd, ns=(mtime_ns, mtime_ns))
            else:
                mode, uid, gid, mtime_ns, _, _, _ = self.archive.stat(entry)
                if self.as_root:
                    os.fchown(fd, uid, gid)
                self._restore_xattrs(entry, fd)
                os.fchmod(fd, mode & 0o7777)
                os.utime(fd, ns=(mtime_ns, mtime_ns))
        except OSError as error:
            raise self._error(entry, error.strerror or str(error)) from None
        if entry == 0:
            self.root_finished = True
        self.counts["dirs"] += 1

    def start_dest(self) -> None:
        """A DEST this unpack created for the whole archive starts with the root's
        permission bits as far as they are safe while it is filled (no group or other
        write; the owner's rwx to fill it): what a resume finds after a ``kill -9``,
        which leave_dest cannot follow."""
        try:
            mode = self.archive.stat(0).mode & 0o755
            os.fchmod(self.dest_fd, mode if self.as_root else mode | 0o700)
        except (OSError, FormatError):
            pass  # the walk meets the same problem and reports it

    def open_up_dest(self) -> None:
        """Resuming into a DEST that an earlier unpack left with the archive root's
        read-only mode: open it up to fill it (put_back_dest_mode restores it)."""
        if self.as_root or self.dest_created:
            return
        try:
            mode = os.fstat(self.dest_fd).st_mode & 0o7777
            if mode & 0o700 != 0o700:
                os.fchmod(self.dest_fd, mode | 0o700)
                self.dest_mode = mode
        except OSError as error:
            raise UnpackError(f"cannot unpack into {self.dest!r}: {error.strerror}") from None

    def put_back_dest_mode(self, fd: int) -> None:
        """Undo open_up_dest."""
        if self.dest_mode >= 0:
            os.fchmod(fd, self.dest_mode)
            self.dest_mode = -1

    def leave_dest(self) -> None:
        """An unpack of the whole archive stops before its end (an error, a signal):
        give a DEST it created the archive root's owner and mode now, as an unpack
        that ends gives it, so that a resume (which leaves the owner and mode of a DEST
        that was there before as they are) ends with the same DEST; and put back the
        mode of a DEST opened up to be filled."""
        try:
            self.put_back_dest_mode(self.dest_fd)
            if self.dest_created and not self.root_finished:
                mode, uid, gid, _, _, _, _ = self.archive.stat(0)
                if self.as_root:
                    os.fchown(self.dest_fd, uid, gid)
                os.fchmod(self.dest_fd, mode & 0o7777)
        except (OSError, FormatError):
            pass  # what stopped the unpack is the error to report

    def remove_abandoned(self, fd: int) -> None:
        """Remove the temporary files that an unpack killed where nothing could clean
        up after it (``kill -9``, a crash, a power cut) left in directory ``fd``: named
        by a process that is gone, or by an older packfs that put no pid in the name.
        Only directories that were there before are searched: a new one has none."""
        try:
            names = os.scandir(fd)
        except OSError:
            return  # not readable: nothing can be written there either, which says why
        with names:
            for item in names:
                if not item.name.startswith(_TEMPORARY_MARKER):
                    continue
                match = _TEMPORARY_NAME.match(item.name)
                if match is None:
                    continue
                name = os.fsencode(item.name)
                if match.group(1) is None or abandoned(int(match.group(1)), name):
                    try:
                        os.unlink(name, dir_fd=fd)
                    except OSError:
                        pass

    def walk(self, top: int, top_fd: int) -> None:
        """Unpack directory ``top`` (already open as ``top_fd``, which this closes) and
        everything below it, without recursion."""
        archive = self.archive
        stack: list[_Frame] = []
        lowest_open = 0  # stack[lowest_open:] hold open descriptors
        try:
            try:
                children = iter(archive.children(top))
            except FormatError as error:
                os.close(top_fd)
                self._report_damage(top, _Damaged(_reason(error), error))
                return
            stack.append(_Frame(top, top_fd, children))
            self.frames[top] = stack[-1]
            while stack:
                frame = stack[-1]
                child = next(frame.children, None)
                if child is None:
                    parent = stack[-2] if len(stack) > 1 else None
                    if parent is not None and parent.fd < 0:
                        self._reopen_parent(frame, parent)
                        lowest_open = len(stack) - 2
                    self._finish_dir(frame.entry, frame.fd)
                    # Forgotten before it is closed: a signal raised as close() returns
                    # must not make the `finally` below close it (or a reused number) again.
                    finished_fd, frame.fd = frame.fd, -1
                    os.close(finished_fd)
                    del self.frames[frame.entry]
                    stack.pop()
                    continue
                try:
                    is_dir = archive.file_type(child) == S_IFDIR
                    if is_dir:
                        name = archive.name(child)
                        children = iter(archive.children(child))
                except FormatError as error:
                    self._report_damage(child, _Damaged(_reason(error), error))
                    continue
                if not is_dir:
                    self.leaf(child, frame.fd)
                    continue
                fd = self.open_dir(frame.fd, name, child)
                try:
                    stack.append(_Frame(child, fd, children))
                except BaseException:
                    os.close(fd)
                    raise
                self.frames[child] = stack[-1]
                if len(stack) - lowest_open > _OPEN_DIRS:
                    above_fd, stack[lowest_open].fd = stack[lowest_open].fd, -1
                    os.close(above_fd)
                    lowest_open += 1
        finally:
            for frame in stack:
                self.frames.pop(frame.entry, None)
                if frame.fd >= 0:
                    os.close(frame.fd)

    def _reopen_parent(self, frame: _Frame, parent: _Frame) -> None:
        try:
            fd = os.open("..", _DIR_FLAGS, dir_fd=frame.fd)
        except OSError as error:
            raise self._error(parent.entry, f"cannot reopen it: {error.strerror}") from None
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != parent.identity:
            os.close(fd)
            raise self._error(parent.entry, "it was moved or replaced while unpacking")
        parent.fd = fd

    def _dir_fd_of(self, entry: int) -> tuple[int, bool]:
        """A descriptor of directory ``entry`` in DEST (and whether the caller must
        close it): one of the walk's, or opened a component at a time from DEST."""
        if entry == 0:
            return self.dest_fd, False
        frame = self.frames.get(entry)
        if frame is not None and frame.fd >= 0:
            return frame.fd, False
        fd = os.dup(self.dest_fd)
        try:
            for part in self.archive.path_of(entry).split(b"/"):
                below = os.open(part, _DIR_FLAGS, dir_fd=fd)
                fd, above = below, fd
                os.close(above)
        except BaseException:
            os.close(fd)
            raise
        return fd, True

    # -- files and symlinks --------------------------------------------------------------

    def leaf(self, entry: int, parent_fd: int) -> None:
        """Unpack file or symlink ``entry`` into ``parent_fd``; damage is reported and
        left out, a problem of the destination raises UnpackError."""
        self.attempted += 1
        archive = self.archive
        try:
            name = archive.name(entry)
            kind = archive.file_type(entry)
            mode, uid, gid, mtime_ns, size, _, record = archive.stat(entry)  # record: the inode
        except FormatError as error:
            self._report_damage(entry, _Damaged(_reason(error), error))
            return
        mode &= 0o7777
        try:
            if kind == S_IFLNK:
                self._symlink(entry, name, parent_fd, uid, gid, mtime_ns)
            elif record in self.damaged_records:
                self._advance(size)
                raise _Damaged(self.damaged_records[record])
            elif self._existing(entry, name, parent_fd, size, mtime_ns):
                self.first_entry.setdefault(record, entry)
                self._advance(size)
            elif record in self.first_entry and self._link(record, name, parent_fd):
                self._advance(size)
            else:
                if record in self.first_entry:  # DEST refused a hard link to its first name
                    self._charge_copy(entry, size)
                try:
                    self._write_file(entry, name, parent_fd, mode, uid, gid, mtime_ns, size)
                except _Damaged as damage:
                    self.damaged_records[record] = damage.reason
                    raise
                # Later names link to this name: after EMLINK, to the newest copy.
                self.first_entry[record] = entry
        except _Damaged as damage:
            self._report_damage(entry, damage)
        except FileExistsError:
            raise self._error(entry, f"it already exists ({_EXISTS_HINT})") from None
        except OSError as error:
            raise self._error(entry, error.strerror or str(error)) from None

    def _charge_copy(self, entry: int, size: int) -> None:
        """Count a copy written because DEST refused a hard link; UnpackError once the
        copies would add up to more than the archive's size (hard links cost an archive
        nothing, so a copy per name is an amplification the archive did not pay for)."""
        self.copied += size
        if self.copied > self.copy_budget:
            raise self._error(
                entry, f"the destination refuses hard links, and a copy of each name of the archive's "
                       f"hard-linked files would write more than the archive's {self.copy_budget} bytes "
                       f"(unpack onto a file system with hard links)")

    def _existing(self, entry: int, name: bytes, parent_fd: int, size: int, mtime_ns: int) -> bool:
        """False if nothing is at ``name``; True if a file the archive's is there and
        ``skip_existing`` (counted); else UnpackError saying what is in the way."""
        try:
            st = os.lstat(name, dir_fd=parent_fd)
        except FileNotFoundError:
            return False
        if not self.skip_existing:
            raise self._error(entry, f"it already exists ({_EXISTS_HINT})")
        if not stat_module.S_ISREG(st.st_mode):
            raise self._error(entry, f"a {_kind(st.st_mode)} is in the way, where the archive has a file "
                                     f"(unpack never overwrites)")
        if st.st_size != size or st.st_mtime_ns != mtime_ns:
            what = (f"{st.st_size} bytes, the archive's has {size}" if st.st_size != size
                    else "its modification time differs from the archive's")
            raise self._error(entry, f"a different file is in the way ({what}; unpack never overwrites)")
        self.counts["existing"] += 1
        return True

    def _symlink(self, entry: int, name: bytes, parent_fd: int,
                 uid: int, gid: int, mtime_ns: int) -> None:
        try:
            target = self.archive.readlink(entry, check=True)
        except FormatError as error:
            raise _Damaged(_reason(error), error) from None
        # Only a resume looks first: otherwise the link that publishes it fails with
        # EEXIST if something is in the way (one system call fewer per symlink).
        if self.skip_existing and self._existing_symlink(entry, name, parent_fd, target):
            return
        # Under a temporary name too: a symlink appears under its name only with its
        # owner and mtime set, so a resume can leave one it finds as it is.
        temporary = self._new_temporary(parent_fd)
        published = False
        try:
            os.symlink(target, temporary, dir_fd=parent_fd)
            if self.as_root:
                os.chown(temporary, uid, gid, dir_fd=parent_fd, follow_symlinks=False)
            self._restore_xattrs(entry, temporary, parent_fd)
            os.utime(temporary, ns=(mtime_ns, mtime_ns), dir_fd=parent_fd, follow_symlinks=False)
            self._publish(temporary, name, parent_fd)
            published = True
        finally:
            self._drop_temporary(temporary, parent_fd, published)
        self.counts["symlinks"] += 1

    def _existing_symlink(self, entry: int, name: bytes, parent_fd: int, target: bytes) -> bool:
        """For skip_existing: False if nothing is at ``name``; True if the archive's
        symlink is there (counted); else UnpackError saying what is in the way."""
        try:
            st = os.lstat(name, dir_fd=parent_fd)
        except FileNotFoundError:
            return False
        if not stat_module.S_ISLNK(st.st_mode):
            raise self._error(entry, f"a {_kind(st.st_mode)} is in the way, where the archive has a "
                                     f"symlink (unpack never overwrites)")
        if os.readlink(name, dir_fd=parent_fd) != target:
            raise self._error(entry, "a symlink to somewhere else is in the way (unpack never overwrites)")
        self.counts["existing"] += 1
        return True

    def _link(self, record: int, name: bytes, parent_fd: int) -> bool:
        """Hard-link ``name`` to the record's first name in DEST; False where the file
        system refuses (the caller then writes a copy)."""
        first = self.first_entry[record]
        source_fd, close = self._dir_fd_of(self.archive.parent(first))
        try:
            os.link(self.archive.name(first), name, src_dir_fd=source_fd, dst_dir_fd=parent_fd,
                    follow_symlinks=False)
        except OSError as error:
            if error.errno in _NO_LINKS:
                return False
            raise
        finally:
            if close:
                os.close(source_fd)
        self.counts["hardlinks"] += 1
        return True

    def _new_temporary(self, parent_fd: int) -> bytes:
        """A temporary name in directory ``parent_fd``, registered before anything is
        created under it (so that no instruction lies between the file existing and the
        clean-up knowing it); _drop_temporary unregisters it."""
        temporary = self.temporary_prefix + secrets.token_hex(6).encode()
        register(temporary, parent_fd)
        return temporary

    def _drop_temporary(self, temporary: bytes, parent_fd: int, published: bool) -> None:
        """Remove the temporary file unless it was published; forget its name."""
        if not published:
            try:
                os.unlink(temporary, dir_fd=parent_fd)
            except FileNotFoundError:
                pass
        unregister(temporary, parent_fd)

    def _publish(self, temporary: bytes, name: bytes, parent_fd: int) -> None:
        """Give the finished temporary file (or symlink) its own name, never replacing
        anything there, and remove the temporary name."""
        try:
            os.link(temporary, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd, follow_symlinks=False)
        except OSError as error:
            if error.errno not in _NO_LINKS:
                raise
            # No hard links here: rename, which would replace what is at ``name``,
            # so only where nothing is (what a concurrent writer could still race).
            try:
                os.lstat(name, dir_fd=parent_fd)
            except FileNotFoundError:
                os.rename(temporary, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
                return
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST)) from None
        os.unlink(temporary, dir_fd=parent_fd)

    def _write_file(self, entry: int, name: bytes, parent_fd: int,
                    mode: int, uid: int, gid: int, mtime_ns: int, size: int) -> None:
        """Write file ``entry`` under a temporary name, check its CRC, set its attributes,
        then publish it as ``name`` (never replacing anything there)."""
        temporary = self._new_temporary(parent_fd)
        fd = -1
        published = False
        try:
            # O_EXCL: an existing file of that name (48 random bits and this pid: only
            # one abandoned by an earlier process of this pid) is an error, not reused.
            fd = os.open(temporary, _CREATE_FLAGS, 0o600, dir_fd=parent_fd)
            # pread, not the map: an archive overwritten in place under us is then an
            # ArchiveChangedError from the short read, never a fault in write().
            length = 0
            try:
                # At each piece's offset: a sparse file's holes (format 1.5) are left
                # unwritten, so they stay holes, and the size is set at the end.
                for offset, chunk in self.archive.read_extents(entry, _CHUNK):
                    written = 0
                    while written < len(chunk):
                        written += os.pwrite(fd, memoryview(chunk)[written:], offset + written)
                    length += len(chunk)
                    self._advance(len(chunk))
                if os.fstat(fd).st_size != size:
                    os.ftruncate(fd, size)
                    self._advance(size - length)  # a sparse file's holes: done, not written
            except ArchiveChangedError:
                raise
            except ChecksumError:
                raise _Damaged("checksum mismatch") from None
            except FormatError as error:
                raise _Damaged(_reason(error), error) from None
            if self.as_root:
                os.fchown(fd, uid, gid)
            self._restore_xattrs(entry, fd)
            os.fchmod(fd, mode)
            os.utime(fd, ns=(mtime_ns, mtime_ns))
            # Forgotten before it is closed: a signal raised as close() returns must not
            # make the `finally` close it (or a reused number) again.
            fd, written_fd = -1, fd
            os.close(written_fd)
            self._publish(temporary, name, parent_fd)
            published = True
        finally:
            if fd >= 0:
                os.close(fd)
            self._drop_temporary(temporary, parent_fd, published)
        self.counts["files"] += 1
        self.counts["bytes"] += length


def _kind(mode: int) -> str:
    if stat_module.S_ISDIR(mode):
        return "directory"
    if stat_module.S_ISLNK(mode):
        return "symlink"
    if stat_module.S_ISREG(mode):
        return "file"
    return "special file"


def _selected(folder: PackedFolder, paths: Sequence[PathArg]) -> list[int]:
    """The entries of ``paths`` (all of them checked to exist before anything is
    created), without repeats or entries inside another selected directory."""
    entries: list[int] = []
    for path in paths or [""]:
        entry = folder.archive.lookup(path, follow=False)  # PathNotFoundError names the path
        if entry not in entries:
            entries.append(entry)
    chosen = set(entries)
    archive = folder.archive
    kept = []
    for entry in entries:
        above = archive.parent(entry) if entry else -1
        while above > 0 and above not in chosen:
            above = archive.parent(above)
        if above == 0 and 0 in chosen and entry != 0 or above > 0:
            continue  # unpacked with the selected directory above it
        kept.append(entry)
    return kept


def check_claims(folder: PackedFolder) -> int:
    """Check what writing out the whole of ``folder`` trusts (format section 5, "before
    writing out a whole archive") and return the bytes that writes: the distinct data
    records' total, at most the archive's size.

    The offsets are checked non-decreasing (so data records are disjoint and end where
    the table begins), and each record is named by one entry or by the names of one
    hard-linked file.  O(records + entries) with numpy, in chunks; 8 bytes per data
    record.  FormatError names the first rule broken."""
    return folder.archive.check_records()


def _check_free_space(folder: PackedFolder, entries: list[int], dest_fd: int, dest: str) -> None:
    """UnpackError, before anything is written, if the files' sizes add up to more than
    DEST's free space: an archive with codecs (format 1.5) can hold far more than its
    own size (compressed, or one record shared by many names: each is written as a file
    of its own), and a bomb would otherwise fill the disk.  The selected files' bytes
    are counted, holes excepted (:meth:`packfs.core.Archive.unpack_bytes` for the whole
    archive)."""
    needed = folder.archive.unpack_bytes() if 0 in entries else _selected_bytes(folder, entries)
    info = os.fstatvfs(dest_fd)
    free = info.f_bavail * info.f_frsize
    if needed > free:
        raise UnpackError(f"cannot unpack {folder.path!r} into {dest!r}: its files take {needed} bytes "
                          f"({needed / 2**30:.1f} GiB), more than the {free} bytes free there")


def _selected_bytes(folder: PackedFolder, entries: list[int]) -> int:
    """What unpacking the subtrees of ``entries`` writes: each file's size (a sparse
    file's data only; a hard link's other names not counted), walked depth-first with
    one iterator per level (memory grows with the depth, not the number of files)."""
    archive = folder.archive
    total = 0
    stack = [iter(entries)]
    while stack:
        for entry in stack[-1]:
            kind = archive.file_type(entry)
            if kind == S_IFDIR:
                stack.append(iter(archive.children(entry)))
                break
            if kind == S_IFREG:
                stat = archive.stat(entry)
                if stat.nlink <= 1 or stat.inode == entry + 1:
                    if archive.codec(entry) == CODEC_SPARSE:
                        start, end = archive.extent(entry)
                        total += end - start
                    else:
                        total += stat.size
        else:
            stack.pop()
    return total


def _make_dest(dest: str) -> list[str]:
    """Create ``dest`` and any missing parents; return the directories created, the
    deepest first (what to remove again if nothing is unpacked)."""
    created = []
    path = os.path.abspath(dest)
    while not os.path.lexists(path):
        created.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    os.makedirs(dest, exist_ok=True)
    return created


def unpack(
    folder: PackedFolder,
    dest: PathArg,
    paths: Sequence[PathArg] = (),
    progress: Callable[[int], None] | None = None,
    *,
    skip_existing: bool = False,
    stop_on_error: bool = False,
    on_damaged: Callable[[str, str], None] | None = None,
    xattrs: bool = True,
) -> UnpackStats:
    """Extract ``paths`` (default: everything) from ``folder`` into ``dest``.

    Each path lands at its own place below ``dest`` (its path in the archive, with
    symlinks on the way resolved).  Modes, mtimes, symlinks, hard links and empty
    directories are restored, and owners when running as root.  Existing files are
    never overwritten, and symlinks already in ``dest`` are never followed.

    Parameters
    ----------
    skip_existing
        Resume an earlier unpack: a file already in ``dest`` with the archive's size
        and mtime (a symlink: its target) is left as it is and counted in
        ``existing``.  Anything else in the way is still an error.  Unpacking the
        whole archive, ``dest``'s own mtime is set to the root's even though ``dest``
        was there before (never its owner or mode: the unpack that created it set
        them), so that the result equals an unpack never interrupted.
    stop_on_error
        Raise at the first damaged file (its ChecksumError or FormatError) instead of
        unpacking everything intact first.
    on_damaged
        Called with (path, reason) as each damaged entry is left out.
    xattrs
        Restore extended attributes where DEST permits (trusted.* and most
        security.* need root; a symlink takes no user.*); each refusal is counted in
        ``xattrs_not_restored`` and warned about once per reason.

    Raises
    ------
    FormatError
        Before anything is created: the archive's offsets or its table claim more than
        it holds (records overlapping, or one shared by names that are not hard links
        of one file, outside an archive with codecs; :func:`check_claims`).
    UnpackError
        Before anything is written: the files take more bytes than ``dest`` has free
        (a compressed or deduplicated archive, format 1.5, can hold far more than its
        own size; a sparse file's holes are not counted).  Not checked with
        ``skip_existing``.
    PathNotFoundError
        One of ``paths`` is not in the archive (checked before anything is created).
    UnpackDamagedError
        After everything intact was unpacked: some files were damaged and left out
        (``error.stats``).  It is a ChecksumError and an UnpackError.
    UnpackError
        Something is in the way, or the destination cannot be written; unpacking
        stops there.

    A damaged file is never left in ``dest``, whole or in part.  If ``dest`` did not
    exist and unpacking fails with nothing in it, ``dest`` is removed again.  An
    exception (KeyboardInterrupt included) leaves no temporary file; temporary files
    that a killed unpack left in a directory this one writes into are removed.
    """
    dest_text = os.fsdecode(dest)
    entries = _selected(folder, paths)
    check_claims(folder)
    try:
        created = _make_dest(dest_text)
        dest_fd = os.open(dest_text, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise UnpackError(f"cannot unpack into {dest_text!r}: {error.strerror}") from None
    if not skip_existing:  # a resumed unpack writes only what is missing
        try:
            _check_free_space(folder, entries, dest_fd, dest_text)
        except BaseException:
            os.close(dest_fd)
            for path in created:
                try:
                    os.rmdir(path)
                except OSError:
                    break
            raise
    extractor = _Extractor(folder, dest_fd, dest_text, progress, skip_existing, stop_on_error, on_damaged, xattrs)
    extractor.dest_created = bool(created)
    try:
        try:
            if created and 0 in entries:
                extractor.start_dest()
            elif not created:
                if skip_existing and 0 in entries:
                    extractor.open_up_dest()
                extractor.remove_abandoned(dest_fd)
            # Everything at once, in archive order: from a URL without a disk cache, fetched
            # in large windows read ahead rather than a request per file.
            scanning = getattr(folder.archive, "scanning", None)
            with scanning() if scanning is not None and 0 in entries else contextlib.nullcontext():
                for entry in entries:
                    _unpack_entry(extractor, entry)
        except BaseException:
            if 0 in entries:
                extractor.leave_dest()
            raise
        finally:
            os.close(dest_fd)
        stats = extractor.stats()
        if stats.damaged:
            path, reason = stats.damaged[0]
            more = f", and {stats.skipped - 1} more" if stats.skipped > 1 else ""
            written = stats.files + stats.hardlinks + stats.symlinks + stats.existing
            raise UnpackDamagedError(
                f"{stats.skipped} damaged {'file' if stats.skipped == 1 else 'files'} in {folder.path!r} "
                f"not unpacked ({path!r}: {reason}{more}); {written} of {extractor.attempted} "
                f"unpacked into {dest_text!r}", stats)
        return stats
    except BaseException:
        for path in created:  # the deepest first; rmdir removes only what is empty
            try:
                os.rmdir(path)
            except OSError:
                break
        raise


def _unpack_entry(extractor: _Extractor, entry: int) -> None:
    archive = extractor.archive
    if entry == 0:
        extractor.walk(0, os.dup(extractor.dest_fd))
        return
    # Create the leading directories (their archived attributes are left to a full
    # unpack) a component at a time, then the entry itself.
    parts = archive.path_of(entry).split(b"/")
    above = []
    walker = archive.parent(entry)
    while walker:
        above.append(walker)
        walker = archive.parent(walker)
    above.reverse()
    fd = os.dup(extractor.dest_fd)
    try:
        for directory, part in zip(above, parts):
            below = extractor.open_dir(fd, part, directory)
            fd, upper = below, fd
            os.close(upper)
        if archive.file_type(entry) == S_IFDIR:
            below = extractor.open_dir(fd, parts[-1], entry)
            extractor.walk(entry, below)
        else:
            extractor.leaf(entry, fd)
    finally:
        os.close(fd)
