"""The commands that read an archive or a shard set: ls, find, cat, info, verify and
unpack."""

from __future__ import annotations

import json
import fnmatch
import os
import stat as stat_module
import sys
import time
from typing import Any

import click

from ..errors import RecordFileError
from ..extract import unpack as unpack_archive
from ..folder import PackedFolder
from ..source import shown_location
from .plumbing import (ARCHIVE_PATH, Command, TerminalProgress, cache_options, counted, exit_on_signals, human_size,
                       progress_option)


def _echo_path_line(line: str) -> None:
    """Print a line holding archive names as their exact bytes (they need not be UTF-8)."""
    click.echo(os.fsencode(line))


class _Lines:
    """Output lines as raw bytes, written in large chunks rather than one call per
    line; each ends with ``end`` (a newline, or NUL for ``-0``/``-print0``)."""

    def __init__(self, end: bytes) -> None:
        sys.stdout.flush()
        self._out = sys.stdout.buffer  # (CliRunner's stand-in has one too)
        self._end = end
        self._pending: list[bytes] = []

    def add(self, line: bytes) -> None:
        self._pending.append(line)
        if len(self._pending) >= 8192:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            self._pending.append(b"")  # the last line's terminator
            data, self._pending = self._end.join(self._pending), []
            self._out.write(data)
        self._out.flush()


class _LongFormat:
    """``ls -l`` lines, with what repeats cached: user and group names per id (numeric
    when the id has no name here, or with ``numeric``) and the time text per minute."""

    def __init__(self, numeric: bool, human: bool) -> None:
        self._numeric, self._human = numeric, human
        self._users: dict[int, str] = {}
        self._groups: dict[int, str] = {}
        self._times: dict[int, str] = {}
        import grp
        import pwd

        self._getpwuid, self._getgrgid = pwd.getpwuid, grp.getgrgid

    def _owner(self, cache: dict[int, str], lookup: Any, ident: int) -> str:
        text = cache.get(ident)
        if text is None:
            if self._numeric:
                text = f"{ident:5d}"  # as packfs ls -l always showed ids
            else:
                try:
                    text = f"{lookup(ident)[0]:<8s}"  # a name, left-aligned as ls does
                except (KeyError, OverflowError):
                    text = f"{ident:8d}"  # no such id here: the number, right-aligned
            cache[ident] = text
        return text

    def _when(self, mtime_ns: int) -> str:
        seconds = mtime_ns // 1_000_000_000
        minute = seconds // 60
        text = self._times.get(minute)
        if text is None:
            try:
                local = time.localtime(seconds)
                text = time.strftime("%Y-%m-%d %H:%M", local)
            except (OverflowError, OSError, ValueError):  # beyond what the C library converts
                return f"{seconds:>16d}"
            # Cached per minute unless the zone's offset has seconds (historic local mean
            # times): then times in one minute of the epoch can show different minutes.
            if local.tm_sec == seconds % 60:
                self._times[minute] = text
        return text

    def line(self, name: bytes, item: Any, target: bytes | None) -> bytes:
        mode, uid, gid, mtime_ns, size, nlink = item[1:7]
        user = self._users.get(uid) or self._owner(self._users, self._getpwuid, uid)
        group = self._groups.get(gid) or self._owner(self._groups, self._getgrgid, gid)
        when = self._times.get(mtime_ns // 60_000_000_000) or self._when(mtime_ns)
        size_text = f"{human_size(size):>10}" if self._human else f"{size:12d}"
        prefix = f"{stat_module.filemode(mode)} {nlink:3d} {user} {group} {size_text} {when} "
        line = prefix.encode(_FS_ENCODING, "surrogateescape") + name
        return line if target is None else line + b" -> " + target


_FS_ENCODING = sys.getfilesystemencoding()


def _ls_line(name: bytes, item: Any, folder: PackedFolder, path: bytes, formatter: _LongFormat) -> bytes:
    """One ``ls -l`` line for ``item`` (an EntryAttributes) at archive path ``path``."""
    target = None
    if item[1] & stat_module.S_IFMT(0o177777) == stat_module.S_IFLNK:
        target = os.fsencode(folder.readlink(path))
    return formatter.line(name, item, target)


@click.command(cls=Command, context_settings={"help_option_names": ["--help"]})  # -h is --human-readable, as in ls
@click.argument("archive", type=ARCHIVE_PATH)
@cache_options
@click.argument("path", default="")
@click.option("-l", "long", is_flag=True, help="Long listing: mode, links, owner, group, size, mtime.")
@click.option("-n", "--numeric-uid-gid", "numeric", is_flag=True,
              help="Like -l, with numeric user and group IDs rather than names.")
@click.option("-h", "--human-readable", "human", is_flag=True, help="With -l, sizes as 1.5 KiB, 3.2 MiB.")
@click.option("-R", "recursive", is_flag=True, help="List sub-directories recursively.")
@click.option("-0", "--zero", "--null", "zero", is_flag=True,
              help="End each line with a NUL byte, not a newline (as GNU ls --zero; for xargs -0).")
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON array of entries: name, type, mode, size, mtime_ns, uid, gid, nlink, "
                   "and target for symlinks.")
def ls(archive: str, path: str, long: bool, numeric: bool, human: bool, recursive: bool, zero: bool,
       as_json: bool) -> None:
    """List directory PATH (default: the root) of ARCHIVE.

    Names are printed as their exact bytes.  With -l, user and group IDs are shown as
    the names this machine gives them (numbers when it has none; -n for numbers).
    With -0, a name holding a newline cannot be mistaken for two.  A PATH starting
    with '-' goes after '--'.

    With --json, one entry per line in a JSON array (streamed, so a listing of
    millions needs no memory for it); "mode" holds the permission bits (420 is
    0644).  A name or target that is not UTF-8 has its undecodable bytes as the lone
    surrogates U+DC80-U+DCFF in the string (Python's os.fsencode gives the bytes
    back) and its exact bytes in "name_base64" or "target_base64".

    \b
    Example:
      packfs ls -lh data.ffr train/cat
      packfs ls -0 data.ffr train | xargs -0 -n 100 echo
      packfs ls --json -R data.ffr train | jq -r '.[] | select(.size > 1000000) | .name'
    """
    if as_json:
        if zero:
            raise click.UsageError("--json and -0 do not go together: JSON strings hold any name")
        _ls_json(archive, path, recursive)
        return
    long = long or numeric
    formatter = _LongFormat(numeric, human) if long else None
    lines = _Lines(b"\0" if zero else b"\n")
    with PackedFolder(archive) as folder:
        if not folder.is_dir(path):
            info = folder.stat(path)
            key = os.fsencode(path)
            item = (key, info.mode, info.uid, info.gid, info.mtime_ns, info.size, info.nlink)
            lines.add(_ls_line(key, item, folder, key, formatter) if formatter else key)
            lines.flush()
            return
        top = os.fsencode(path).strip(b"/")
        top = top + b"/" if top else b""
        try:
            for item in folder.list_attributes(path, recursive=recursive):
                name = item[0]
                lines.add(_ls_line(name, item, folder, top + name, formatter) if formatter else name)
        finally:
            lines.flush()  # what was listed before an error, then the error


_JSON_TYPES = {stat_module.S_IFREG: "file", stat_module.S_IFDIR: "dir", stat_module.S_IFLNK: "symlink"}


def _json_name(entry: dict[str, Any], key: str, raw: bytes) -> None:
    """``entry[key]``: ``raw`` as a string (undecodable bytes as lone surrogates), and
    when it is not UTF-8, its exact bytes in ``key + "_base64"`` too."""
    entry[key] = os.fsdecode(raw)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        import base64

        entry[key + "_base64"] = base64.b64encode(raw).decode("ascii")


def _json_entry(name: bytes, item: Any, folder: PackedFolder, path: bytes) -> bytes:
    """One ``ls --json`` entry for ``item`` (an EntryAttributes) at archive path ``path``."""
    mode, uid, gid, mtime_ns, size, nlink = item[1:7]
    entry: dict[str, Any] = {}
    _json_name(entry, "name", name)
    entry.update(type=_JSON_TYPES.get(stat_module.S_IFMT(mode), "other"), mode=stat_module.S_IMODE(mode),
                 size=size, mtime_ns=mtime_ns, uid=uid, gid=gid, nlink=nlink)
    if stat_module.S_IFMT(mode) == stat_module.S_IFLNK:
        _json_name(entry, "target", os.fsencode(folder.readlink(path)))
    return json.dumps(entry).encode("ascii")


def _ls_json(archive: str, path: str, recursive: bool) -> None:
    """``ls --json``: a JSON array, one entry a line, streamed."""
    lines = _Lines(b"\n")
    previous = b"["
    with PackedFolder(archive) as folder:
        try:
            if not folder.is_dir(path):
                info = folder.stat(path)
                key = os.fsencode(path)
                item = (key, info.mode, info.uid, info.gid, info.mtime_ns, info.size, info.nlink)
                previous += _json_entry(key, item, folder, key)
            else:
                top = os.fsencode(path).strip(b"/")
                top = top + b"/" if top else b""
                for item in folder.list_attributes(path, recursive=recursive):
                    entry = _json_entry(item[0], item, folder, top + item[0])
                    if previous == b"[":
                        previous += entry
                    else:
                        lines.add(previous + b",")
                        previous = entry
            lines.add(previous + b"]")
        finally:
            lines.flush()  # what was listed before an error, then the error


_FIND_TYPES = {"f": stat_module.S_IFREG, "d": stat_module.S_IFDIR, "l": stat_module.S_IFLNK}


class _FindCommand(Command):
    """Names a find(1) predicate it does not have as a whole word (click alone says
    ``No such option '-m'`` for ``-maxdepth``), with the ones it has."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        options = [param for param in self.params if isinstance(param, click.Option)]
        known = {name for param in options for name in param.opts}
        takes_value = {name for param in options if not param.is_flag for name in param.opts}
        arguments = iter(args)
        for arg in arguments:
            if arg == "--":
                break
            if arg in takes_value:
                next(arguments, None)  # its value may start with '-' ("-name '-*'")
            elif arg.startswith("-") and not arg.startswith("--") and len(arg) > 2 and arg not in known:
                raise click.NoSuchOption(arg, message=f"No such option: {arg} (packfs find has -name GLOB, "
                                                      f"-type f|d|l and -print0)", ctx=ctx)
        return super().parse_args(ctx, args)


@click.command(cls=_FindCommand)
@click.argument("archive", type=ARCHIVE_PATH)
@cache_options
@click.argument("path", default="")
@click.option("-name", "--name", "pattern", metavar="GLOB", help="Only entries whose name matches GLOB (as find -name).")
@click.option("-type", "--type", "kind", type=click.Choice(sorted(_FIND_TYPES)),
              help="Only files, directories or symlinks (as find -type).")
@click.option("-print0", "--print0", "print0", is_flag=True,
              help="End each path with a NUL byte, not a newline (as find -print0; for xargs -0).")
def find(archive: str, path: str, pattern: str | None, kind: str | None, print0: bool) -> None:
    """Print the paths under PATH (default: everything) in ARCHIVE, depth first.

    Paths are printed as their exact bytes; with -print0 each ends with a NUL byte, so
    names holding newlines survive a pipe into xargs -0 (or read -d '').  Options are
    spelled as find(1) spells them (-name, -type, -print0) or with two dashes.

    \b
    Example:
      packfs find data.ffr train -name '*.jpg' -type f | wc -l
      packfs find data.ffr -type f -print0 | xargs -0 -n 100 echo
    """
    import re

    wanted = _FIND_TYPES.get(kind or "")
    matches = re.compile(fnmatch.translate(pattern)).match if pattern is not None else None
    top = path.strip("/")
    top_key = os.fsencode(top)
    lines = _Lines(b"\0" if print0 else b"\n")
    with PackedFolder(archive) as folder:
        info = folder.stat(top)
        if ((matches is None or matches(top.rpartition("/")[2]))
                and (wanted is None or info.mode & stat_module.S_IFMT(0o177777) == wanted)):
            lines.add(top_key or b".")
        if info.kind != "dir":
            lines.flush()
            return
        prefix = top_key + b"/" if top_key else b""
        file_type = stat_module.S_IFMT(0o177777)
        try:
            for item in folder.list_attributes(top, recursive=True):
                relative = item[0]
                if wanted is not None and item[1] & file_type != wanted:
                    continue
                if matches is not None and not matches(os.fsdecode(relative[relative.rfind(b"/") + 1 :])):
                    continue
                lines.add(prefix + relative)
        finally:
            lines.flush()


@click.command(cls=Command)
@click.argument("archive", type=ARCHIVE_PATH)
@cache_options
@click.argument("paths", nargs=-1, required=True)
def cat(archive: str, paths: tuple[str, ...]) -> None:
    """Write the contents of files in ARCHIVE to standard output.

    \b
    Example:
      packfs cat data.ffr labels.csv | head
    """
    out = sys.stdout.buffer
    with PackedFolder(archive) as folder:
        for path in paths:
            with folder.open(path) as source:  # checks the CRC before any byte is written
                while chunk := source.read(1 << 20):
                    out.write(chunk)
    out.flush()


@click.command(cls=Command)
@click.argument("archive", type=ARCHIVE_PATH)
@cache_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def info(archive: str, as_json: bool) -> None:
    """Show counts, sizes and the format version of ARCHIVE.

    A compressed archive (pack --compress, format 1.5) also shows its stored bytes, the
    ratio of the files' bytes to them, how many files each codec holds, the bytes saved
    by files sharing another's record (dedup), its dictionaries, and the kinds of file
    (by extension) with the most bytes; any other says "compression uncompressed".

    For an archive at a URL, also what this command fetched (requests, bytes) and,
    with a disk cache, its block hits, misses and waits (blocks another process was
    already fetching) and the bytes read ahead.

    \b
    Example:
      packfs info --json data.ffr
    """
    try:
        folder = PackedFolder(archive)
    except RecordFileError:
        _record_file_info(archive, as_json)
        return
    with folder:
        details = folder.info()
        details["mount_daemon"] = _mount_daemon(folder)
        details.update(_fetch_counts(folder.stats()))
    if as_json:
        click.echo(json.dumps(details, indent=2))
        return
    largest = details.pop("largest_files")
    del details["records"]  # the container's, which a user cannot relate to files (still in --json)
    kinds = details.pop("kinds", None)
    _echo_fields(_codec_fields(details))
    if largest:
        click.echo("largest files")
        for item in largest:  # type: ignore[attr-defined]
            _echo_path_line(f"  {human_size(item['size']):>10}  {item['path']}")
    if kinds:
        click.echo("by kind (original -> stored)")
        for kind in kinds:  # type: ignore[attr-defined]
            original, stored = kind["original_bytes"], kind["stored_bytes"]
            ratio = f"{original / stored:.1f}x" if stored else "-"
            _echo_path_line(f"  {human_size(original):>10} -> {human_size(stored):>10}  {ratio:>7}  "
                            f"{counted(kind['files'], 'file')}  {kind['kind']}")


def _codec_fields(details: dict[str, object]) -> dict[str, object]:
    """``info``'s lines about format 1.5's codecs, in words: the ratio as a factor, files
    per codec on one line, dictionaries with their bytes (``--json`` keeps the numbers)."""
    if "files_by_codec" not in details:
        return details
    shown: dict[str, object] = {}
    for key, value in details.items():
        if key == "ratio":
            shown[key] = f"{value}x (original / stored)"
        elif key == "files_by_codec":
            shown["codecs"] = ", ".join(f"{counted(files, 'file')} {codec}"
                                        for codec, files in value.items())  # type: ignore[attr-defined]
        elif key == "dedup_saved_bytes":
            shown["dedup_bytes"] = value  # bytes saved: files sharing another's record
        elif key == "dictionaries":
            shown[key] = f"{value} ({human_size(details['dictionary_bytes'])})"  # type: ignore[arg-type]
        elif key != "dictionary_bytes":
            shown[key] = value
    return shown


# What ``info`` shows of an archive's stats() (an archive at a URL; a local one has
# none), under its own names; a counter the source does not keep (the disk cache's,
# without one) is left out.
_INFO_COUNTERS = (("requests", "requests"), ("bytes_fetched", "fetched_bytes"), ("cache_hits", "cache_hits"),
                  ("cache_misses", "cache_misses"), ("cache_waits", "cache_waits"),
                  ("readahead_bytes", "readahead_bytes"))


def _fetch_counts(stats: dict[str, int]) -> dict[str, int]:
    """``info``'s fields for what this command fetched and found in the cache."""
    return {name: stats[key] for key, name in _INFO_COUNTERS if key in stats}


def _echo_fields(details: dict[str, object], byte_counts: tuple[str, ...] = ()) -> None:
    """``info``'s lines: one per key, byte counts (``*_bytes`` and ``byte_counts``) in
    human units and exactly."""
    for key, value in details.items():
        if key.endswith("_bytes") or key in byte_counts:
            value = f"{human_size(value)} ({value} bytes)"  # type: ignore[arg-type]
        click.echo(f"{key.replace('_', ' '):<16}{value}")


def _record_file_info(path: str, as_json: bool) -> None:
    """``info`` of an FFRecord record file."""
    from ..records import record_file_info

    details = record_file_info(path)
    if as_json:
        click.echo(json.dumps(details, indent=2))
        return
    _echo_fields(details, ("smallest_record", "largest_record"))
    click.echo("(no path table: ls, find, cat, unpack and mount need a packfs archive of files)")


def _mount_daemon(folder: PackedFolder) -> str:
    """Which daemon `packfs mount` would serve the archive with, and why."""
    from .. import fuse as fuse_mount
    from ..fuse.common import PYTHON_FALLBACK

    # Asked without copying a URL's metadata to a local view (the mount makes it).
    reason = fuse_mount.unavailable(folder.archive, copy=False)
    if reason is None:
        return f"{fuse_mount.LOWLEVEL} (compiled, libfuse {fuse_mount.compiled_libfuse_version()})"
    return f"{PYTHON_FALLBACK} (Python): {reason}"


@click.command(cls=Command)
@click.argument("archive", type=ARCHIVE_PATH)
@cache_options
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@progress_option
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as JSON (ok, counts, damaged paths and records, problems); "
                   "the exit status is the same.")
def verify(archive: str, quiet: bool, force_progress: bool, as_json: bool) -> None:
    """Check every checksum in ARCHIVE; exit 1 listing what is damaged.

    A compressed archive (format 1.5) has every file decoded and checked too, and every
    codec row, frame table and extent list held to the format's rules.

    \b
    Example:
      packfs verify data.ffr && echo sound
      packfs verify --json data.ffr | jq .damaged_paths
    """
    try:
        folder = PackedFolder(archive)
    except RecordFileError:
        _verify_record_file(archive, quiet, force_progress, as_json)
        return
    progress = TerminalProgress("verifying", quiet, force_progress)
    with folder:
        kind = "FFRecord packed folder" if folder.archive.legacy else "packfs archive"
        _show_fetched(progress, folder)
        progress.start(0, folder.archive.size)
        try:
            report = folder.verify(progress.add_bytes)
            progress.finish()
        finally:
            progress.close()
    if as_json:
        _echo_report(archive, kind, report)
        if not report.ok:
            raise click.ClickException(f"{shown_location(archive)!r} is damaged: {_damage_summary(report)}")
        return
    if report.ok:
        symlinks = f", {counted(report.symlinks_checked, 'symlink')}" if report.symlinks_checked else ""
        click.echo(f"OK: {counted(report.files_checked, 'file')}{symlinks} and the path table, "
                   f"{human_size(report.bytes_checked)} checked")
        return
    for path in report.bad_paths:
        _echo_path_line(f"damaged: {path}")
    for problem in report.problems:
        click.echo(f"damaged: {problem}")
    raise click.ClickException(f"{shown_location(archive)!r} is damaged: {_damage_summary(report)} (listed above)")


def _show_fetched(progress: TerminalProgress, folder: PackedFolder) -> None:
    """An archive at a URL: its progress lines also say what was fetched."""
    if folder.stats():  # empty for a local archive
        progress.fetched = folder.stats


def _damage_summary(report: Any) -> str:
    """What a VerifyReport found, counted in files where it can be."""
    parts = []
    if report.bad_paths:
        bad = len(report.bad_paths)
        parts.append(f"{counted(bad, 'file')} {'fails its checksum' if bad == 1 else 'fail their checksums'}")
    if report.problems:
        parts.append(counted(len(report.problems), "problem" if not parts else "other problem"))
    if not parts:  # records that no path names
        parts.append(f"{counted(len(report.bad_records), 'record')} fail their checksums")
    return "; ".join(parts)


def _echo_report(path: str, kind: str, report: Any) -> None:
    """``verify --json``: a VerifyReport as one JSON object (paths as ``ls --json``'s
    strings are: undecodable bytes as lone surrogates)."""
    click.echo(json.dumps({
        "path": path, "kind": kind, "ok": report.ok,
        "files_checked": report.files_checked, "symlinks_checked": report.symlinks_checked,
        "records_checked": report.records_checked, "bytes_checked": report.bytes_checked,
        "damaged_paths": list(report.bad_paths), "damaged_records": list(report.bad_records),
        "problems": list(report.problems),
    }, indent=2))


def _verify_record_file(path: str, quiet: bool, force_progress: bool, as_json: bool) -> None:
    """``verify`` of an FFRecord record file: its header and every record's CRC."""
    from ..records import verify_record_file

    progress = TerminalProgress("verifying", quiet, force_progress)
    progress.start(0, os.path.getsize(path))
    try:
        report = verify_record_file(path, progress.add_bytes)
        progress.finish()
    finally:
        progress.close()
    records = counted(report.records_checked, "record")
    if as_json:
        _echo_report(path, "FFRecord record file", report)
        if not report.ok:
            raise click.ClickException(f"{path!r} is damaged: {counted(len(report.problems), 'problem')}")
        return
    if report.ok:
        click.echo(f"OK: an FFRecord record file of {records} (no path table), "
                   f"{human_size(report.bytes_checked)} checked")
        return
    for problem in report.problems:
        click.echo(f"damaged: {problem}")
    passed = report.records_checked - len(report.bad_records)
    raise click.ClickException(f"{path!r} is damaged: {counted(len(report.problems), 'problem')} (listed above); "
                               f"{passed} of {records} pass their checksums")


@click.command(cls=Command)
@click.argument("archive", type=ARCHIVE_PATH)
@cache_options
@click.argument("dest", type=click.Path(file_okay=False))
@click.argument("paths", nargs=-1)
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
@progress_option
@click.option("--skip-existing", is_flag=True,
              help="Resume an earlier unpack: leave files already in DEST with the archive's size and "
                   "mtime (symlinks: its target) as they are, and finish the rest, DEST's own mtime "
                   "included.  Anything else in the way is still an error.")
@click.option("--stop-on-error", is_flag=True,
              help="Stop at the first damaged file (by default everything intact is unpacked, each "
                   "damaged path listed, and the exit status is 1).")
@click.option("--no-xattrs", "no_xattrs", is_flag=True,
              help="Do not restore extended attributes (restored by default where DEST permits: "
                   "trusted.* and most security.* need root).")
def unpack(archive: str, dest: str, paths: tuple[str, ...], quiet: bool, force_progress: bool,
           skip_existing: bool, stop_on_error: bool, no_xattrs: bool) -> None:
    """Extract ARCHIVE (or just PATHS in it) into the directory DEST.

    Restores modes, mtimes, symlinks, hard links and empty directories; never writes
    outside DEST and never overwrites an existing file.  A damaged file is left out
    (never written in part) and listed as "damaged: PATH (why)"; everything intact is
    unpacked, and the exit status is then 1.  From a compressed archive (format 1.5)
    files are written decoded, sparse files with their holes, and files that share a
    record as files of their own; if they need more than DEST's free space, nothing is
    written (exit 1).

    \b
    Example:
      packfs unpack data.ffr restored/ train/cat
      packfs unpack --skip-existing data.ffr restored/   # resume
    """
    from ..errors import UnpackDamagedError

    progress = TerminalProgress("unpacking", quiet, force_progress)

    def report(path: str, reason: str) -> None:
        progress.close()  # blanks the progress line; the next update draws it again
        click.echo(os.fsencode(f"damaged: {path} ({reason})"), err=True)

    failure = None
    # A signal stops it cleanly: the file being written is removed (each file appears
    # under its name only once whole), and a rerun with --skip-existing resumes; the
    # result equals an unpack never interrupted.
    with exit_on_signals(f"the rest of {dest!r} (--skip-existing resumes)"), PackedFolder(archive) as folder:
        _show_fetched(progress, folder)
        progress.start(0, int(folder.info()["file_bytes"]))  # type: ignore[call-overload]
        try:
            stats = unpack_archive(folder, dest, paths, progress=progress.add_bytes, skip_existing=skip_existing,
                                   stop_on_error=stop_on_error, on_damaged=report, xattrs=not no_xattrs)
        except UnpackDamagedError as error:
            stats, failure = error.stats, error
        finally:
            progress.close()
        progress.finish()  # damaged files too: the rest was unpacked
    if not quiet:
        summary = (f"unpacked {counted(stats.files + stats.hardlinks, 'file')}, {counted(stats.dirs, 'dir')}, "
                   f"{counted(stats.symlinks, 'symlink')} ({human_size(stats.bytes)}) into {dest!r}")
        if stats.existing:
            summary += f"; {stats.existing} already there, left as they were"
        if stats.xattrs_not_restored:
            summary += (f"; {counted(stats.xattrs_not_restored, 'extended attribute')} not restored "
                        f"(DEST refused them, see the warnings)")
        if stats.skipped:
            summary += f"; skipped {counted(stats.skipped, 'damaged file')}"
        click.echo(summary, err=True)
    if failure is not None:
        raise failure  # one "Error: ..." line and exit 1 (a traceback with --debug)
