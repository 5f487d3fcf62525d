"""The packfs command line: parses arguments, calls one library function, prints."""

from __future__ import annotations

import json
import fnmatch
import logging
import os
import stat as stat_module
import sys
import time
from typing import Any

import click

from . import __version__
from .errors import PackfsError
from .extract import unpack as unpack_archive
from .reader import PackedFolder
from .writer import pack_folder

EXISTING_FILE = click.Path(exists=True, dir_okay=False)


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


class _Group(click.Group):
    """Turns PackfsError into one ``Error: ...`` line and exit 1 (a traceback with --debug)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PackfsError as error:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            raise click.ClickException(str(error)) from None
        except BrokenPipeError:
            sys.stderr.close()  # reader went away (e.g. `packfs cat ... | head`)
            sys.exit(1)


class _TerminalProgress:
    """A one-line progress display on stderr, drawn only when stderr is a terminal.

    A total of 0 is unknown (a tar on a pipe): then only bytes and rate are shown.
    ``start`` may come again, for a second phase (copying out of a spool), and begins
    the count anew.
    """

    def __init__(self, label: str, quiet: bool = False) -> None:
        self.label = label
        self.enabled = not quiet and sys.stderr.isatty()
        self._width = 0  # of the line on screen, to blank it
        self.start(0, 0)

    def start(self, total_files: int, total_bytes: int) -> None:
        self.total_files, self.total_bytes = total_files, total_bytes
        self.files = self.bytes = 0
        self.started = time.monotonic()
        self._drawn = 0.0  # the next advance draws at once
        if self.enabled and self._width:  # a second phase: show at once that it began
            self._draw(self.started)

    def advance(self, files: int, nbytes: int) -> None:
        self.files += files
        self.bytes += nbytes
        now = time.monotonic()
        if self.enabled and now - self._drawn > 0.1:
            self._drawn = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        rate = self.bytes / max(now - self.started, 1e-9)
        files = f"{self.files}/{self.total_files} files  " if self.total_files else ""
        if self.total_bytes:
            # Input counted by reads may run a few blocks past the size: never over 100%.
            percent = min(100 * self.bytes / self.total_bytes, 100.0)
            line = (f"{self.label} {percent:5.1f}%  {files}{human_size(self.bytes)}"
                    f"/{human_size(self.total_bytes)}  {human_size(rate)}/s")
            if rate:
                line += f"  ETA {max(self.total_bytes - self.bytes, 0) / rate:.0f} s"
        else:
            line = f"{self.label}  {files}{human_size(self.bytes)}  {human_size(rate)}/s"
        click.echo("\r" + line.ljust(self._width), nl=False, err=True)
        self._width = max(self._width, len(line))

    def add_bytes(self, nbytes: int) -> None:
        self.advance(0, nbytes)

    def close(self) -> None:
        if self.enabled and self._width:
            click.echo("\r" + " " * self._width + "\r", nl=False, err=True)


class _WarningHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        click.echo(f"Warning: {record.getMessage()}", err=True)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(__version__, prog_name="packfs")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Pack a directory tree into one checksummed file and read it in place.

    \b
    Example:
      packfs pack dataset/ data.ffr
      packfs ls -l data.ffr train
      packfs verify data.ffr
    """
    ctx.obj = {"debug": debug}
    logger = logging.getLogger("packfs")
    if not any(isinstance(h, _WarningHandler) for h in logger.handlers):
        logger.addHandler(_WarningHandler())
    logger.propagate = False


@main.command()
@click.argument("src", type=click.Path(exists=True, allow_dash=True))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("-L", "--follow-symlinks", is_flag=True, help="Store what symlinks point to.")
@click.option("--exclude", multiple=True, metavar="GLOB",
              help="Leave out paths or names matching GLOB (repeatable).")
@click.option("-f", "--force", is_flag=True, help="Replace OUT if it exists.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
def pack(src: str, out: str, follow_symlinks: bool, exclude: tuple[str, ...], force: bool,
         quiet: bool) -> None:
    """Pack SRC into the archive OUT: a directory, a tar (.tar, .tar.gz, .tar.bz2,
    .tar.xz; "-" reads one from stdin) or a zip, recognised by content.  Archives are
    streamed in, never extracted to disk.

    \b
    Example:
      packfs pack dataset/ data.ffr --exclude '*.tmp'
      packfs pack ILSVRC2012_img_val.tar val.ffr
    """
    from_archive = src == "-" or not os.path.isdir(src)
    if from_archive and (follow_symlinks or exclude):
        raise click.UsageError("-L and --exclude apply to a directory SRC only")
    progress = _TerminalProgress("packing", quiet)
    try:
        if from_archive:
            from .archives import pack_archive

            stats = pack_archive(src, out, force=force, stdin=sys.stdin.buffer, progress=progress)
        else:
            stats = pack_folder(src, out, follow_symlinks=follow_symlinks, exclude=exclude,
                                force=force, progress=progress)
    finally:
        progress.close()
    if not quiet:
        rate = stats.file_bytes / stats.seconds if stats.seconds else 0
        click.echo(
            f"packed {stats.files} files, {stats.dirs} dirs, {stats.symlinks} symlinks "
            f"({human_size(stats.file_bytes)}) into {out!r} ({human_size(stats.archive_bytes)}) "
            f"in {stats.seconds:.2f} s ({stats.files / max(stats.seconds, 1e-9):.0f} files/s, "
            f"{human_size(rate)}/s)"
            + (f"; skipped {stats.skipped}" if stats.skipped else ""),
            err=True,
        )


@main.command()
@click.argument("legacy", type=EXISTING_FILE)
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("-f", "--force", is_flag=True, help="Replace OUT if it exists.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
def convert(legacy: str, out: str, force: bool, quiet: bool) -> None:
    """Rewrite LEGACY, an archive made by FFRecord's pack_folder, as a packfs archive OUT.

    Every packfs command already reads LEGACY as it is; OUT opens in O(1) instead of
    building the path table in memory at each open, and carries packfs' checks.

    \b
    Example:
      packfs convert old_dataset.ffr dataset.ffr && packfs verify dataset.ffr
    """
    from .convert import convert as convert_archive

    progress = _TerminalProgress("converting", quiet)
    try:
        stats = convert_archive(legacy, out, force=force, progress=progress)
    finally:
        progress.close()
    if not quiet:
        click.echo(f"converted {stats.files} files, {stats.dirs} dirs ({human_size(stats.file_bytes)}) "
                   f"into {out!r} in {stats.seconds:.2f} s", err=True)


def _echo_path_line(line: str) -> None:
    """Print a line holding archive names as their exact bytes (they need not be UTF-8)."""
    click.echo(os.fsencode(line))


def _ls_line(name: str, info: Any, folder: PackedFolder, path: str, human: bool = False) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.mtime_ns / 1e9))
    size = f"{human_size(info.size):>10}" if human else f"{info.size:12d}"
    line = (f"{stat_module.filemode(info.mode)} {info.nlink:3d} {info.uid:5d} {info.gid:5d} "
            f"{size} {when} {name}")
    if info.kind == "symlink":
        line += " -> " + folder.readlink(path)
    return line


@main.command(context_settings={"help_option_names": ["--help"]})  # -h is --human-readable, as in ls
@click.argument("archive", type=EXISTING_FILE)
@click.argument("path", default="")
@click.option("-l", "long", is_flag=True, help="Long listing: mode, links, owner, size, mtime.")
@click.option("-h", "--human-readable", "human", is_flag=True, help="With -l, sizes as 1.5 KiB, 3.2 MiB.")
@click.option("-R", "recursive", is_flag=True, help="List sub-directories recursively.")
def ls(archive: str, path: str, long: bool, human: bool, recursive: bool) -> None:
    """List directory PATH (default: the root) of ARCHIVE.

    \b
    Example:
      packfs ls -lh data.ffr train/cat
    """
    with PackedFolder(archive) as folder:
        if not folder.is_dir(path):
            info = folder.stat(path)
            _echo_path_line(_ls_line(path, info, folder, path, human) if long else path)
            return
        for name in folder.list(path, recursive=recursive):
            full = f"{path.strip('/')}/{name}" if path.strip("/") else name
            _echo_path_line(_ls_line(name, folder.stat(full), folder, full, human) if long else name)


_FIND_TYPES = {"f": "file", "d": "dir", "l": "symlink"}


@main.command()
@click.argument("archive", type=EXISTING_FILE)
@click.argument("path", default="")
@click.option("--name", "pattern", metavar="GLOB", help="Only entries whose name matches GLOB (as find -name).")
@click.option("--type", "kind", type=click.Choice(sorted(_FIND_TYPES)), help="Only files, directories or symlinks.")
def find(archive: str, path: str, pattern: str | None, kind: str | None) -> None:
    """Print the paths under PATH (default: everything) in ARCHIVE, depth first.

    \b
    Example:
      packfs find data.ffr train --name '*.jpg' --type f | wc -l
    """
    wanted = _FIND_TYPES.get(kind or "")
    top = path.strip("/")
    with PackedFolder(archive) as folder:
        info = folder.stat(top)
        candidates = [""] + (folder.list(top, recursive=True) if info.kind == "dir" else [])
        for relative in candidates:
            full = "/".join(part for part in (top, relative) if part)
            if pattern is not None and not fnmatch.fnmatchcase(full.rpartition("/")[2], pattern):
                continue
            if wanted is not None and folder.stat(full).kind != wanted:
                continue
            _echo_path_line(full or ".")


@main.command()
@click.argument("archive", type=EXISTING_FILE)
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


@main.command()
@click.argument("archive", type=EXISTING_FILE)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def info(archive: str, as_json: bool) -> None:
    """Show counts, sizes and the format version of ARCHIVE.

    \b
    Example:
      packfs info --json data.ffr
    """
    with PackedFolder(archive) as folder:
        details = folder.info()
    if as_json:
        click.echo(json.dumps(details, indent=2))
        return
    largest = details.pop("largest_files")
    for key, value in details.items():
        if key.endswith("_bytes"):
            value = f"{human_size(value)} ({value} bytes)"  # type: ignore[arg-type]
        click.echo(f"{key.replace('_', ' '):<16}{value}")
    if largest:
        click.echo("largest files")
        for item in largest:  # type: ignore[attr-defined]
            _echo_path_line(f"  {human_size(item['size']):>10}  {item['path']}")


@main.command()
@click.argument("archive", type=EXISTING_FILE)
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def verify(archive: str, quiet: bool) -> None:
    """Check every checksum in ARCHIVE; exit 1 listing what is damaged.

    \b
    Example:
      packfs verify data.ffr && echo sound
    """
    progress = _TerminalProgress("verifying", quiet)
    with PackedFolder(archive) as folder:
        progress.start(0, folder._container.file_size)
        try:
            report = folder.verify(progress.add_bytes)
        finally:
            progress.close()
    if report.ok:
        click.echo(f"OK: {report.records_checked} records, {human_size(report.bytes_checked)} checked")
        return
    for path in report.bad_paths:
        _echo_path_line(f"damaged: {path}")
    for problem in report.problems:
        click.echo(f"damaged: {problem}")
    raise click.ClickException(
        f"{archive!r} is damaged: {len(report.bad_paths)} files and "
        f"{len(report.bad_records)} records fail their checksums"
    )


@main.command()
@click.argument("archive", type=EXISTING_FILE)
@click.argument("dest", type=click.Path(file_okay=False))
@click.argument("paths", nargs=-1)
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
def unpack(archive: str, dest: str, paths: tuple[str, ...], quiet: bool) -> None:
    """Extract ARCHIVE (or just PATHS in it) into the directory DEST.

    Restores modes, mtimes, symlinks, hard links and empty directories; never writes
    outside DEST and never overwrites an existing file.

    \b
    Example:
      packfs unpack data.ffr restored/ train/cat
    """
    progress = _TerminalProgress("unpacking", quiet)
    with PackedFolder(archive) as folder:
        progress.start(0, int(folder.info()["file_bytes"]))  # type: ignore[call-overload]
        try:
            stats = unpack_archive(folder, dest, paths, progress=progress.add_bytes)
        finally:
            progress.close()
    if not quiet:
        click.echo(
            f"unpacked {stats.files + stats.hardlinks} files, {stats.dirs} dirs, "
            f"{stats.symlinks} symlinks ({human_size(stats.bytes)}) into {dest!r}",
            err=True,
        )


def _parse_options(values: tuple[str, ...]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for value in values:
        for item in value.split(","):
            if item:
                key, sep, setting = item.partition("=")
                options[key] = setting if sep else True
    return options


@main.command()
@click.argument("archive", type=EXISTING_FILE)
@click.argument("mountpoint", type=click.Path())
@click.option("-f", "--foreground", is_flag=True, help="Stay in the foreground; log to stderr.")
@click.option("-d", "--debug", "fuse_debug", is_flag=True, help="Show FUSE's own debug output (implies -f).")
@click.option("-o", "options", multiple=True, metavar="OPTION[,OPTION...]",
              help="FUSE mount options, e.g. -o uid=1000,gid=1000 to show files as yours.")
@click.option("--allow-other", is_flag=True, help="Let other users read the mount.")
@click.option("--check-data/--no-check-data", default=True, show_default=True,
              help="Check each file's CRC once, at its first open; a mismatch reads as EIO.")
@click.option("--threads", default=0, type=click.IntRange(0), metavar="N",
              help="1 serves requests one at a time; the default is multithreaded.")
@click.option("--binding", type=click.Choice(["fusepy", "mfusepy"]), default="mfusepy", show_default=True,
              help="FUSE binding: mfusepy (libfuse3, faster warm reads) or fusepy (libfuse2).")
@click.option("--log-file", type=click.Path(dir_okay=False), default=None,
              help="Where a background daemon logs (default: a file named in the output).")
def mount(archive: str, mountpoint: str, foreground: bool, fuse_debug: bool, options: tuple[str, ...],
          allow_other: bool, check_data: bool, threads: int, binding: str, log_file: str | None) -> None:
    """Serve ARCHIVE read-only at the directory MOUNTPOINT through FUSE.

    Returns once the mount works; the daemon then runs in the background until
    `packfs unmount MOUNTPOINT` (or SIGTERM/SIGINT to it).

    \b
    Example:
      packfs mount data.ffr /mnt/data && ls /mnt/data
    """
    from . import mount as fuse_mount  # the only importer of a FUSE binding

    extra = _parse_options(options)
    # Everything that can be known up front fails here, before anything detaches.
    fuse_mount.check_fuse(binding)
    fuse_mount.check_mountpoint(mountpoint, nonempty=bool(extra.get("nonempty")))
    folder = PackedFolder(archive, check_data=check_data)
    settings = dict(debug=fuse_debug, threads=threads != 1, check_data=check_data,
                    allow_other=allow_other, options=extra, binding=binding)
    if foreground or fuse_debug:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s packfs: %(message)s"))
        mount_log = logging.getLogger("packfs.mount")
        mount_log.addHandler(handler)
        mount_log.propagate = False  # not also through the CLI's "Warning:" handler
        fuse_mount.mount(folder, mountpoint, foreground=True, **settings)
        return
    log_path = log_file or fuse_mount.state_file(mountpoint, ".log")
    pid = fuse_mount.mount_in_background(folder, mountpoint, log_path, foreground=True, **settings)
    click.echo(f"mounted {archive!r} at {mountpoint!r} (daemon pid {pid}, log {log_path})", err=True)


@main.command()
@click.argument("mountpoint", type=click.Path())
@click.option("-z", "--lazy", is_flag=True, help="Detach now even if busy; clean up when no longer used.")
def unmount(mountpoint: str, lazy: bool) -> None:
    """Unmount a packfs mount and wait for its daemon to exit.

    Also clears a stale mount whose daemon died ("Transport endpoint is not connected").

    \b
    Example:
      packfs unmount /mnt/data
    """
    from . import mount as fuse_mount

    stale = fuse_mount.is_stale(mountpoint)
    fuse_mount.unmount(mountpoint, lazy=lazy)
    if stale:
        click.echo(f"cleared stale mount {mountpoint!r} (its daemon had died)", err=True)


if __name__ == "__main__":
    main()
