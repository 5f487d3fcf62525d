"""Packing from tar and zip archives without extracting them.

Members stream straight into the packfs archive: nothing is written to disk but the
output (and, for a stream whose length is unknown, the writer's own spool file), and a
member of many GiB is copied in chunks.  Modes, owners, mtimes, symlinks and hard links
are kept.  Unsafe member names are never followed out of the tree: a leading ``/`` is
dropped and a name with a ``..`` component is skipped, each with a warning, and so is a
name with a component over 255 bytes (format section 5's NAME_MAX); devices,
FIFOs and other special members are skipped with a warning, as ``pack`` does for a
directory, and so are symlinks whose target an archive cannot hold (empty, with a NUL
byte, or longer than 4,095 bytes).

From a seekable, uncompressed tar the entries are written in the order ``pack`` uses
for a directory (depth-first, names sorted bytewise), so the archive is byte for byte
what packing the extracted tree gives.  Compressed tars, zips and ``-`` (a tar on
stdin) are written in member order: the same contents and attributes, other record
positions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import functools
import logging
import os
import stat as stat_module
import tarfile
import time
import zipfile
from typing import Any, BinaryIO, Callable, Iterable, Iterator, cast

from ..errors import PackError
from ..format import MAX_SYMLINK_TARGET, path_name_problem, symlink_length_problem, symlink_target_problem
from ..source import url_error
from .entry import Entry, PackProgress, PackStats, PathLike
from .pack import pack_entries
from .skips import SkipList

__all__ = ["archive_kind", "archive_entries", "pack_archive"]

log = logging.getLogger("packfs")

_CHUNK = 1 << 20


def archive_kind(path: str) -> str | None:
    """"tar" or "zip" by content (not by name), or None for anything else."""
    if path == "-":
        return "tar"
    if not os.path.isfile(path):
        return None
    if zipfile.is_zipfile(path):
        return "zip"
    try:
        if tarfile.is_tarfile(path):
            return "tar"
    except (OSError, tarfile.TarError):
        return None
    return None


def _is_stream(path: str) -> bool:
    """Whether ``path`` names a pipe, socket or character device: bytes read once."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat_module.S_ISFIFO(mode) or stat_module.S_ISCHR(mode) or stat_module.S_ISSOCK(mode)


def _normalized(name: str) -> str | None:
    """A member name as an archive path, or None if it would leave the tree."""
    parts = [part for part in name.replace("\\", "/").split("/") if part not in ("", ".")]
    return None if ".." in parts else "/".join(parts)


def _safe_name(name: str, skips: SkipList) -> str | None:
    """A member name as an archive path, or None (the member skipped, with the reason)."""
    normal = _normalized(name)
    if normal is None:
        skips.add(name, "a name with '..' would leave the tree")
        return None
    # A tar stores names of any length (GNU long names, pax records); an archive at most NAME_MAX bytes.
    problem = path_name_problem(os.fsencode(normal))
    if problem:
        skips.add(name, f"{problem} (NAME_MAX: no Linux file system holds a longer name)")
        return None
    if name.startswith("/"):
        log.warning("%sstored %r as %r, without the leading '/'", skips.where, name, normal)
    return normal


def _storable_target(target: str | bytes, name: str, skips: SkipList, length: int | None = None) -> bool:
    """Whether a symlink member's target is one an archive can hold (format section 5:
    non-empty, no NUL byte, at most 4,095 bytes); if not, the member is skipped with a
    warning, as other members packfs cannot store are: one bad member of a tar or zip
    should not cost the whole pack."""
    problem = (symlink_length_problem(length) if length is not None
               else symlink_target_problem(os.fsencode(target)))
    if problem:
        skips.add(name, f"a symlink with {problem}")
    return not problem


def _depth_first_key(name: str) -> bytes:
    # pack's order: each directory's names sorted bytewise, subtrees in place.
    return os.fsencode(name).replace(b"/", b"\0")


# GNU tar --xattrs (and bsdtar) store each attribute as a pax record of this name.
_PAX_XATTR = "SCHILY.xattr."


def _member_xattrs(member: tarfile.TarInfo) -> dict[bytes, bytes] | None:
    """A member's extended attributes from its pax header; tarfile decoded each value
    as UTF-8 with surrogateescape for bytes that are not, which encoding undoes."""
    found = {key[len(_PAX_XATTR):].encode("utf-8", "surrogateescape"): value.encode("utf-8", "surrogateescape")
             for key, value in member.pax_headers.items() if key.startswith(_PAX_XATTR)}
    return found or None


def _attributes(member: tarfile.TarInfo, xattrs: bool) -> dict[str, Any]:
    return {"mode": member.mode & 0o7777, "uid": member.uid, "gid": member.gid,
            "mtime_ns": int(round(member.mtime * 1e9)), "xattrs": _member_xattrs(member) if xattrs else None}


def _tar_entries(tar: tarfile.TarFile, members: Iterator[tarfile.TarInfo], skips: SkipList,
                 xattrs: bool = True) -> Iterator[Entry]:
    for member in members:
        # tarfile keeps every member it has read (for getmembers() and extracting hard
        # links), about 1 KiB each; entries here name their link targets themselves, so
        # the list is let go: a stream of any length is packed in bounded memory.
        del tar.members[:]  # type: ignore[attr-defined]  # typeshed omits TarFile.members (getmembers' list)
        name = _safe_name(member.name, skips)
        if name is not None:
            yield from _tar_entry(tar, member, name, skips, xattrs)


def _tar_entry(tar: tarfile.TarFile, member: tarfile.TarInfo, name: str, skips: SkipList,
               xattrs: bool = True) -> Iterator[Entry]:
    """The entry of ``member``, stored as ``name`` (none if it is skipped)."""
    if member.isdir():
        yield Entry(name, kind="dir", **_attributes(member, xattrs))
    elif member.isreg():
        yield Entry(name, tar.extractfile(member), size=member.size, **_attributes(member, xattrs))
    elif member.issym():
        if _storable_target(member.linkname, member.name, skips):
            yield Entry(name, kind="symlink", target=member.linkname, **_attributes(member, xattrs))
    elif member.islnk():
        target = _safe_name(member.linkname, skips)
        if target is not None:
            yield Entry(name, kind="hardlink", target=target, **_attributes(member, xattrs))
    else:
        skips.add(member.name, "a device, FIFO or other special member")


def _tar_entries_in_pack_order(tar: tarfile.TarFile, skips: SkipList,
                               xattrs: bool = True) -> tuple[Iterator[Entry], int]:
    """The members in pack's order, reading each file by seeking; a hard-link group's
    data goes to its first path in that order, as pack stores an extracted tree."""
    members = {}
    for member in tar.getmembers():
        name = _safe_name(member.name, skips)
        if name is not None:
            members[name] = member
    groups: dict[str, list[str]] = {}  # a linked file's path -> every path of its data
    for name, member in members.items():
        if member.islnk():
            target = _normalized(member.linkname)
            if target in members and members[target].isreg():
                groups.setdefault(target, [target]).append(name)
    leader: dict[str, str] = {}  # any path in a group -> the group's first path in pack's order
    regular: dict[str, tarfile.TarInfo] = {}  # any path in a group -> the member with the data
    for target, names in groups.items():
        first = min(names, key=_depth_first_key)
        for name in names:
            leader[name], regular[name] = first, members[target]
    order = sorted(members, key=_depth_first_key)

    def entries() -> Iterator[Entry]:
        for name in order:
            member = members[name]
            if name in leader:
                original = regular[name]
                if name == leader[name]:
                    yield Entry(name, _opener(tar, original), size=original.size, **_attributes(original, xattrs))
                else:
                    yield Entry(name, kind="hardlink", target=leader[name], **_attributes(original, xattrs))
            elif member.islnk():
                skips.add(member.name, f"a hard link to {member.linkname!r}, which is not a file in the archive")
            elif member.isreg():
                yield Entry(name, _opener(tar, member), size=member.size, **_attributes(member, xattrs))
            else:
                yield from _tar_entry(tar, member, name, skips, xattrs)  # its name was checked above

    count = sum(1 for m in members.values() if m.isreg() or m.issym())  # hard links take no record
    return entries(), count


def _opener(tar: tarfile.TarFile, member: tarfile.TarInfo) -> Callable[[], BinaryIO]:
    """A member's data opened only when it is written: an open reader holds a buffer,
    and a shard set plans every member's entry before it writes any."""
    return lambda: cast(BinaryIO, tar.extractfile(member))


def _compressed(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(6)
    return head[:2] == b"\x1f\x8b" or head[:3] == b"BZh" or head == b"\xfd7zXZ\x00"


def _zip_entries(archive: zipfile.ZipFile, skips: SkipList) -> Iterator[Entry]:
    for info in archive.infolist():
        name = _safe_name(info.filename, skips)
        if name is None:
            continue
        unix_mode = info.external_attr >> 16
        mtime_ns = int(time.mktime(info.date_time + (0, 0, -1)) * 1e9)
        kind = stat_module.S_IFMT(unix_mode)
        if info.is_dir():
            yield Entry(name, kind="dir", mode=(unix_mode & 0o7777) or 0o755, mtime_ns=mtime_ns)
        elif kind == stat_module.S_IFLNK:
            # The declared size first, so a huge "target" is not decompressed to be refused.
            if info.file_size > MAX_SYMLINK_TARGET:
                _storable_target(b"", info.filename, skips, length=info.file_size)  # skips it
                continue
            target = archive.read(info)
            if _storable_target(target, info.filename, skips):
                yield Entry(name, kind="symlink", target=target, mtime_ns=mtime_ns)
        elif kind in (0, stat_module.S_IFREG):
            yield Entry(name, functools.partial(archive.open, info), size=info.file_size,
                        mode=(unix_mode & 0o7777) or 0o644, mtime_ns=mtime_ns)
        else:
            skips.add(info.filename, "a device, FIFO or other special member")


class _CountingReader:
    """A binary input that reports each byte read through it to a PackProgress."""

    def __init__(self, raw: BinaryIO, progress: PackProgress) -> None:
        self._raw = raw
        self._progress = progress
        self.name = getattr(raw, "name", None)  # tarfile and zipfile name their source by it
        self.mode = "rb"

    def read(self, size: int | None = -1) -> bytes:
        data = self._raw.read(-1 if size is None else size)
        if data:
            self._progress.advance(0, len(data))
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:
        got = self._raw.readinto(buffer)  # type: ignore[attr-defined]
        if got:
            self._progress.advance(0, got)
        return got

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def seekable(self) -> bool:
        return self._raw.seekable()

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        pass  # the raw file belongs to pack_archive (or, for stdin, to the caller)


class _RawReader(io.RawIOBase):
    """A binary stream seen as a raw one, so that io.BufferedReader can buffer it."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        return self._stream.readinto(buffer)  # type: ignore[attr-defined]


def _input_size(stream: BinaryIO) -> int:
    """The bytes left in ``stream`` if it is a regular file, else 0 (unknown: a pipe)."""
    try:
        info = os.fstat(stream.fileno())
        if stat_module.S_ISREG(info.st_mode):
            return max(info.st_size - stream.tell(), 0)
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        pass
    return 0


def _source_kind(source: str, stdin: BinaryIO | None, caller: str) -> tuple[bool, str]:
    """Whether ``source`` is read as a stream, and whether it is a "tar" or a "zip":
    the one check of a tar or zip source (PackError for anything else)."""
    # A pipe given by name (`packfs pack <(tar c ...) out`) is read once, as "-" is:
    # sniffing its first bytes would consume them.
    streamed = source == "-" or _is_stream(source)
    if not streamed and not os.path.lexists(source):
        raise url_error(source) or PackError(f"{source!r}: no such file or directory, expected a directory, a tar or a zip archive")
    kind = "tar" if streamed else archive_kind(source)
    if kind not in ("tar", "zip"):
        raise PackError(f"{source!r} is neither a directory nor a tar or zip archive")
    if source == "-" and stdin is None:
        raise ValueError(f'{caller}("-") needs the stream to read as stdin')
    return streamed, kind


def pack_archive(source: str, out: PathLike, *, force: bool = False,
                 stdin: BinaryIO | None = None, progress: PackProgress | None = None,
                 xattrs: bool = True, compress: str | None = None, dictionary: str | None = None,
                 dedup: bool | None = None, sparse: bool | None = None, verify: bool = False) -> PackStats:
    """Pack the tar or zip ``source`` (``"-"``: a tar read from ``stdin``) into ``out``.

    Parameters
    ----------
    source
        A tar (plain, gzip, bzip2 or xz) or a zip, recognised by content; ``"-"`` reads
        a tar stream from ``stdin``.
    out
        The archive to write, atomically.
    force
        Replace ``out`` if it exists.
    stdin
        The binary stream ``"-"`` stands for.
    progress
        Told the size of ``source`` (0 when unknown, as for a pipe), then the bytes of it
        read as they are read; seeks are not counted, so the sum may differ from the
        size by a few blocks.  Compressed tars and ``"-"`` are spooled first, so
        ``start`` is then called again with the spooled file count and bytes, and each
        file is reported as it is copied from the spool (see :func:`pack_entries`).
    xattrs
        Keep the extended attributes a tar stores in pax headers (``SCHILY.xattr.``,
        as GNU tar ``--xattrs`` and bsdtar write them).  Zips have none.
    compress, dictionary, dedup, sparse
        Format 1.5's codecs, as for :func:`packfs.write.pack_folder` (a tar's sparse
        members are stored whole: their holes are not known).  Dictionaries are
        sampled from a zip's members, or from a tar's once it is spooled.
    verify
        Check the archive whole before it is moved into place (see
        :func:`packfs.write.pack_entries`).

    Returns
    -------
    PackStats

    Raises
    ------
    PackError
        ``source`` is not a tar or zip, is damaged or truncated, or ``out`` cannot be
        written.
    """
    streamed, kind = _source_kind(source, stdin, "pack_archive")
    skips = SkipList(where=f"{'<stdin>' if source == '-' else source}: ")

    def pack(entries: Iterable[Entry], count: int | None = None, progress: PackProgress | None = None,
             xattrs: bool | None = None) -> PackStats:
        return pack_entries(entries, out, count=count, force=force, progress=progress, xattrs=xattrs,
                            compress=compress, dictionary=dictionary, dedup=dedup, sparse=sparse, verify=verify)

    spool_for_dictionaries = dictionary == "auto"  # a tar read in place is sampled from the spool
    try:
        with contextlib.ExitStack() as stack:
            raw = cast(BinaryIO, stdin) if source == "-" else stack.enter_context(open(source, "rb"))
            if progress is not None:
                progress.start(0, _input_size(raw))
                raw = cast(BinaryIO, _CountingReader(raw, progress))
            if kind == "zip":
                with zipfile.ZipFile(raw) as archive:
                    # The central directory lists every member up front, so the record
                    # count is known and members stream straight in, without a spool.
                    # (The counting reader already reports the bytes they are read from.)
                    entries = list(_zip_entries(archive, skips))
                    stats = pack(entries, count=sum(entry.kind != "dir" for entry in entries))
            elif streamed:
                # A stream: member order.  tarfile reads a stream 10 KiB at a time, and
                # its stream buffer copies what it holds at every read, so a larger
                # bufsize makes each 512-byte header read copy that much (1 MiB made
                # 8,000 JPEGs 4x slower).  A 1 MiB buffer below it keeps the system
                # calls few instead.
                with tarfile.open(fileobj=io.BufferedReader(_RawReader(raw), _CHUNK), mode="r|*") as tar:
                    stats = pack(_tar_entries(tar, iter(tar), skips, xattrs), progress=progress)
            else:
                compressed = _compressed(source)
                with tarfile.open(fileobj=raw, mode="r:*" if compressed else "r:") as tar:
                    if compressed:  # reading a compressed tar out of order would be slow
                        stats = pack(_tar_entries(tar, iter(tar), skips, xattrs), progress=progress)
                    elif spool_for_dictionaries:
                        stats = pack(_tar_entries(tar, iter(tar), skips, xattrs), progress=progress)
                    else:
                        in_order, count = _tar_entries_in_pack_order(tar, skips, xattrs)
                        # Not spooled: the counting reader already reports every byte copied, and
                        # pack_entries reporting the files too would count them twice.
                        has_xattrs = xattrs and any(_member_xattrs(member) for member in tar.getmembers())
                        stats = pack(in_order, count=count, xattrs=has_xattrs)
        return dataclasses.replace(stats, skipped=tuple(skips.paths))
    except (tarfile.TarError, zipfile.BadZipFile, EOFError) as error:
        raise PackError(f"cannot read {source!r}: {error}") from None


@contextlib.contextmanager
def archive_entries(source: str, skips: SkipList, *, stdin: BinaryIO | None = None,
                    xattrs: bool = True) -> Iterator[tuple[Iterator[Entry], bool]]:
    """The entries of the tar or zip ``source`` (``"-"``: a tar on ``stdin``), for a
    packer that cuts them into several archives (:mod:`packfs.write.shards`), as
    ``(entries, planned)``.

    ``planned``: an uncompressed tar file or a zip; the entries come in pack's order
    (depth-first, names bytewise) and each file's data is opened only when it is
    read, so all may be listed before any is written.  Otherwise (a stream, a
    compressed tar) they come in member order, each file's data to be read before
    the next entry is taken.  A damaged source raises PackError, from the ``with``
    block too.
    """
    streamed, kind = _source_kind(source, stdin, "archive_entries")
    try:
        with contextlib.ExitStack() as stack:
            raw = cast(BinaryIO, stdin) if source == "-" else stack.enter_context(open(source, "rb"))
            if kind == "zip":
                archive = stack.enter_context(zipfile.ZipFile(raw))
                entries = sorted(_zip_entries(archive, skips), key=lambda entry: _depth_first_key(str(entry.path)))
                yield iter(entries), True
            elif streamed or _compressed(source):
                fileobj = io.BufferedReader(_RawReader(raw), _CHUNK) if streamed else raw
                tar = stack.enter_context(tarfile.open(fileobj=fileobj, mode="r|*" if streamed else "r:*"))
                yield _tar_entries(tar, iter(tar), skips, xattrs), False
            else:
                tar = stack.enter_context(tarfile.open(fileobj=raw, mode="r:"))
                yield _tar_entries_in_pack_order(tar, skips, xattrs)[0], True
    except (tarfile.TarError, zipfile.BadZipFile, EOFError) as error:
        raise PackError(f"cannot read {source!r}: {error}") from None
