"""The packfs command line: parses arguments, calls one library function, prints."""

from __future__ import annotations

import contextlib
import json
import fnmatch
import logging
import os
import signal
import stat as stat_module
import sys
import time
from typing import Any, Callable, Iterator

import click

from . import __version__
from .errors import PackfsError, PackSourceError, RecordFileError
from .extract import unpack as unpack_archive
from .folder import PackedFolder
from .source import shown_location
from .write import SkippedPath, pack_folder, remove_unfinished

# Checked by the library, which says in one line what is wrong (missing, a directory,
# not an archive) and exits 1; click's own check would be a usage error (exit 2).
ARCHIVE_PATH = click.Path()


def _cache_setting(variable: str, check: Callable[[str], object] | None = None) -> Callable[..., Any]:
    """A callback that puts an option's value into ``variable`` of the environment: the
    disk cache reads it there, in this process and in a mount's daemon alike."""

    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value is None:
            return
        if check is not None:
            try:
                check(value)
            except ValueError as error:
                raise click.BadParameter(str(error), ctx=ctx, param=param) from None
        os.environ[variable] = value

    return callback


def _cache_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--cache-dir and --cache-size, for every command that reads an archive (at a URL)."""
    from .source.cache import parse_size

    command = click.option("--cache-size", metavar="SIZE", expose_value=False,
                           callback=_cache_setting("PACKFS_CACHE_SIZE", parse_size),
                           help="The bound of the disk cache of archives at URLs (as 20G; default: $PACKFS_CACHE_SIZE, "
                                "else 32G).")(command)
    return click.option("--cache-dir", metavar="DIR", expose_value=False, callback=_cache_setting("PACKFS_CACHE_DIR"),
                        help="The disk cache of archives at URLs, shared by every process on the node ('off': none; "
                             "default: $PACKFS_CACHE_DIR, else $XDG_CACHE_HOME/packfs, else ~/.cache/packfs).")(command)


def human_size(n: float) -> str:
    """A byte count as people read it (``1.5 MiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


class _Command(click.Command):
    """A command taking an ARCHIVE says, when it gets extra arguments that are files,
    that they look like a glob the shell expanded, and how to quote it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        words = [arg for arg in args if not arg.startswith("-")]  # the parser consumes args
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as error:
            if "unexpected extra argument" in error.message and any(p.name == "archive" for p in self.params):
                hint = _glob_hint(ctx.command_path, words)
                if hint:
                    error.message += hint
            raise


def _glob_hint(command: str, words: list[str]) -> str:
    """For words of which several are existing files: quote the glob, so packfs opens
    the files as one set (the shell gave them as arguments of their own)."""
    import shlex

    files = [word for word in words if os.path.isfile(word)]
    if len(files) < 2:
        return ""
    directories = {os.path.dirname(file) for file in files}
    suffixes = {os.path.splitext(file)[1] for file in files}
    if len(directories) == 1 and len(suffixes) == 1:
        pattern = os.path.join(directories.pop(), "*" + suffixes.pop())
    else:
        pattern = "shards/*.ffr"
    others = " ".join(shlex.quote(word) for word in words if word not in files)  # a mount point
    example = " ".join(part for part in (command, shlex.quote(pattern), others) if part)
    return (f".  Did the shell expand a glob into these {len(files)} files?  Quote it, and packfs opens "
            f"the archives it matches as one set: {example}")


class _Group(click.Group):
    """Turns PackfsError into one ``Error: ...`` line and exit 1 (a traceback with --debug)."""

    command_class = _Command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # `mount -t fuse.packfs ARCHIVE DIR` and fstab lines of that type, without the
        # mount.fuse.packfs helper installed: mount(8) runs fuse3's mount.fuse3, which
        # runs "packfs ARCHIVE DIR -o OPTIONS".  An archive is never a command's name.
        if len(args) >= 2 and args[0] not in self.commands and not args[0].startswith("-") \
                and os.path.isfile(args[0]):
            from .fuse import mount_helper

            ctx.exit(mount_helper(list(args)))
        return super().parse_args(ctx, args)

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


_RATE_AFTER_SECONDS = 1.0
# Forced into a pipe or a file (--progress), one line at most this often: a log, not a
# stream of redrawn lines.
_LINE_EVERY_SECONDS = 1.0


class _TerminalProgress:
    """A one-line progress display on stderr, drawn only when stderr is a terminal,
    or, with ``force`` (``--progress``), as lines into whatever stderr is: at most one
    a second, and a last one with the whole run's rate.

    A total of 0 is unknown (a tar on a pipe): then only bytes and rate are shown.
    ``start`` may come again, for a second phase (copying out of a spool), and begins
    the count anew.  ``fetched``, when set (an archive at a URL: its ``stats``), adds
    what was fetched to each line.
    """

    def __init__(self, label: str, quiet: bool = False, force: bool = False) -> None:
        self.label = label
        terminal = sys.stderr.isatty()
        self.enabled = force or (terminal and not quiet)
        self.lines = self.enabled and not terminal  # newline-ended lines, never redrawn
        self.fetched: Callable[[], dict[str, int]] | None = None
        self._width = 0  # of the line on screen, to blank it
        self._advanced = False  # whether there is anything for a last line to say
        self.start(0, 0)

    def start(self, total_files: int, total_bytes: int) -> None:
        self.total_files, self.total_bytes = total_files, total_bytes
        self.files = self.bytes = 0
        self.started = time.monotonic()
        self._drawn = 0.0  # the next advance draws at once
        if self.enabled and self._width and not self.lines:  # a second phase: show at once that it began
            self._draw(self.started)

    def advance(self, files: int, nbytes: int) -> None:
        self.files += files
        self.bytes += nbytes
        self._advanced = True
        now = time.monotonic()
        if self.enabled and now - self._drawn > (_LINE_EVERY_SECONDS if self.lines else 0.1):
            self._drawn = now
            self._draw(now)

    def _line(self, now: float, final: bool = False) -> str:
        elapsed = now - self.started
        # A rate (and an ETA from it) over the first moments is noise: the first line
        # once showed "ETA 109950 s".  Both appear after a second; the last line's
        # rate is the whole run's.
        rate = self.bytes / elapsed if elapsed >= _RATE_AFTER_SECONDS or (final and elapsed > 0) else 0.0
        speed = f"  {human_size(rate)}/s" if rate else ""
        files = f"{self.files}/{self.total_files} files  " if self.total_files else ""
        if self.total_bytes:
            # Input counted by reads may run a few blocks past the size: never over 100%.
            percent = min(100 * self.bytes / self.total_bytes, 100.0)
            line = (f"{self.label} {percent:5.1f}%  {files}{human_size(self.bytes)}"
                    f"/{human_size(self.total_bytes)}{speed}")
            if rate and not final:
                line += f"  ETA {max(self.total_bytes - self.bytes, 0) / rate:.0f} s"
        else:
            line = f"{self.label}  {files}{human_size(self.bytes)}{speed}"
        if final:
            line += f"  in {elapsed:.1f} s"
        counts = self.fetched() if self.fetched is not None else {}
        if counts:
            line += f"  (fetched {human_size(counts['bytes_fetched'])} in {_count(counts['requests'], 'request')})"
        return line

    def _draw(self, now: float) -> None:
        line = self._line(now)
        if self.lines:
            click.echo(line, err=True)
            return
        click.echo("\r" + line.ljust(self._width), nl=False, err=True)
        self._width = max(self._width, len(line))

    def add_bytes(self, nbytes: int) -> None:
        self.advance(0, nbytes)

    def finish(self) -> None:
        """The work is done: a terminal's line is blanked (a summary follows); lines
        into a pipe end with the whole run's."""
        if self.lines and self._advanced:
            click.echo(self._line(time.monotonic(), final=True), err=True)
            self._advanced = False  # once
        self.close()

    def close(self) -> None:
        """Blank a terminal's line (a message, or the next update, follows)."""
        if self.enabled and self._width and not self.lines:
            click.echo("\r" + " " * self._width + "\r", nl=False, err=True)


def _progress_option(function: Callable[..., Any]) -> Callable[..., Any]:
    """``--progress``, the same on every command that shows progress."""
    return click.option("--progress", "force_progress", is_flag=True,
                        help="Show progress on stderr even when it is not a terminal (a pipe, a file, "
                             "a job's log): a line a second, and a last one with the whole run's rate "
                             "(and, for a URL, the bytes and requests fetched). On a terminal it is "
                             "shown anyway, unless -q; with -q, --progress shows it and no summary.")(function)


class _Signalled(BaseException):
    """Raised in the main thread by a terminating signal, so that whatever is being
    written unwinds (removing its temporary file) before the process exits."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# Every signal whose default action ends the process and that can be caught.  (Python
# already ignores SIGPIPE and SIGXFSZ; writes then fail with an error instead.)
_TERMINATING_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGALRM", "SIGUSR1",
                                       "SIGUSR2", "SIGVTALRM", "SIGPROF", "SIGXCPU", "SIGPWR", "SIGPOLL")
    if hasattr(signal, name)
)


@contextlib.contextmanager
def _exit_on_signals(what: str) -> Iterator[None]:
    """Turn a terminating signal into a clean exit with status 128 + signal, as Unix
    tools exit, after the work in the block has unwound; ``what`` names what was not
    written.  A second signal during the clean-up is ignored, so it cannot cut it short."""

    def stop(signum: int, frame: object) -> None:
        for number in _TERMINATING_SIGNALS:
            signal.signal(number, signal.SIG_IGN)
        # Here, before anything unwinds: pack and unpack register each temporary file
        # before creating it, so this finds it wherever the signal landed (between the
        # open() and the `try` that would remove it, or inside that `finally`), and the
        # directory descriptors unpack's names are relative to are all still open.
        remove_unfinished()
        raise _Signalled(signum)

    # A signal ignored when packfs started stays ignored (nohup, a background job's
    # SIGINT): the caller asked for the work to survive it.
    previous = {number: signal.signal(number, stop) for number in _TERMINATING_SIGNALS
                if signal.getsignal(number) is not signal.SIG_IGN}
    try:
        yield
    except _Signalled as interrupted:
        click.echo(f"Interrupted by {signal.Signals(interrupted.signum).name}: {what} not written", err=True)
        sys.exit(128 + interrupted.signum)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def _closing(progress: _TerminalProgress) -> Iterator[_TerminalProgress]:
    """Blank the progress line however the block ends (finish it when the block
    completes); warnings meanwhile blank it first, so that they do not run into it."""
    _WarningHandler.progress = progress
    try:
        yield progress
        progress.finish()
    finally:
        _WarningHandler.progress = None
        progress.close()


class _WarningHandler(logging.Handler):
    """Prints the ``packfs`` logger's warnings on stderr: ``Warning: ...``, and a path a
    pack left out as ``skipped: PATH (reason)`` (its exact bytes)."""

    progress: _TerminalProgress | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.progress is not None:
            self.progress.close()  # the next update draws it again, below
        skipped = getattr(record, "skipped_path", None)
        if skipped is not None:
            click.echo(os.fsencode(f"skipped: {skipped.path} ({skipped.reason})"), err=True)
        else:
            click.echo(f"Warning: {record.getMessage()}", err=True)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(__version__, prog_name="packfs")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Pack a directory tree into one checksummed file and read it in place.

    Every ARCHIVE may also be a URL (https://, s3://) or a shard set served as one
    tree: its manifest (NAME.ffrset, from pack --shards, set or append) or a quoted
    glob of archives ('part-*.ffr').

    \b
    Example:
      packfs pack dataset/ data.ffr
      packfs ls -l data.ffr train
      packfs verify data.ffr
      packfs mount data.ffrset /mnt/data
    """
    ctx.obj = {"debug": debug}
    # Warnings become "Warning: ..." lines for this command only: a caller running the
    # CLI in its own process (CliRunner, mount(8)'s helper) gets its logger back as it
    # was, instead of a logger that no longer reaches its handlers.
    logger = logging.getLogger("packfs")
    handler, propagate = _WarningHandler(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False  # no second copy from logging's last-resort handler

    def restore() -> None:
        logger.removeHandler(handler)
        logger.propagate = propagate

    ctx.call_on_close(restore)


def _size_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from .source.cache import parse_size

    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as error:
        raise click.BadParameter(str(error), ctx=ctx, param=param) from None


def _shard_count_option(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    if value is not None and value < 1:
        raise click.BadParameter(f"{value} is not a number of shards: expected 1 or more", ctx=ctx, param=param)
    return value


def _compress_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from .write.encode import parse_compress

    try:
        parse_compress(value)
    except ValueError as error:
        raise click.BadParameter(str(error), ctx=ctx, param=param) from None
    return value


def _codec_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """Format 1.5's codec options (format section 4f), for pack, append and convert;
    they reach the packers as the keyword arguments of the same names."""
    for option in reversed((
        click.option("--compress", metavar="zstd[:LEVEL]", callback=_compress_option, default=None,
                     help="Store each file compressed with zstd (LEVEL 1-22, default 9) where that saves at least "
                          "1/16 of it, else as it is (JPEGs); every read stays exact: one frame a small file, "
                          "1 MiB frames a large one. 'none': no compression."),
        click.option("--dictionary", type=click.Choice(["auto", "none"]), default=None,
                     help="auto: train zstd dictionaries on a sample of the small files, one per extension "
                          "where that pays (needs --compress)."),
        click.option("--dedup/--no-dedup", default=None,
                     help="Store files with equal bytes once, each name keeping its own metadata (default: "
                          "on with --compress)."),
        click.option("--sparse/--no-sparse", default=None,
                     help="Store files with holes without them (default: on with --compress)."),
        click.option("--verify", is_flag=True,
                     help="Before OUT is moved into place, read it back whole (as packfs verify does) and, "
                          "from a directory, compare every file with SRC read again; a difference fails the "
                          "pack and leaves nothing."),
    )):
        function = option(function)
    return function


def _codecs(compress: str | None, dictionary: str | None, dedup: bool | None,
            sparse: bool | None, verify: bool = False) -> dict[str, Any]:
    if dictionary == "auto" and compress in (None, "none"):
        raise click.UsageError("--dictionary auto needs --compress zstd[:LEVEL]")
    return dict(compress=compress, dictionary=dictionary, dedup=dedup, sparse=sparse, verify=verify)


def _source_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """The options of what is packed and how it is reported, for pack and append."""
    for option in reversed((
        click.option("-L", "--follow-symlinks", is_flag=True, help="Store what symlinks point to."),
        click.option("--exclude", multiple=True, metavar="GLOB",
                     help="Leave out paths or names matching GLOB (repeatable). ./GLOB, /GLOB and absolute "
                          "paths inside SRC match from SRC's top only, as tar's and rsync's do; GLOB/ matches "
                          "directories only. A GLOB that excluded nothing is warned about."),
        click.option("-k", "--keep-going", is_flag=True,
                     help="Pack the rest when paths cannot be read (unreadable, vanished, changing while read): "
                          "each is printed as 'skipped: PATH (why)' and the exit status is 3."),
        click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, metavar="N",
                     help="A directory's files read at once (default: the cores available to packfs): N "
                          "processes read them into their places, or, with --compress, --dedup or --sparse "
                          "(sizes the scan cannot know), N threads read and encode them ahead of the writer "
                          "(files over 4 MiB are encoded by the writer, frame by frame). The archive has the "
                          "same bytes whatever N. A tar or zip is one stream, read by one process whatever "
                          "N; a shard set (--shard-size, --shards) is packed by one process, and takes no -j."),
        click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary."),
        _progress_option,
        click.option("--no-xattrs", "no_xattrs", is_flag=True,
                     help="Leave out extended attributes (kept by default: a directory's, as this user can read "
                          "them; a tar's from its pax headers)."),
    )):
        function = option(function)
    return function


@main.command()
@click.argument("src", type=click.Path(allow_dash=True))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("-f", "--force", is_flag=True, help="Replace OUT if it exists.")
@_source_options
@_codec_options
@click.option("--shard-size", metavar="SIZE", callback=_size_option,
              help="Write a shard set: shards of at most SIZE file bytes (as 4G, 512M; a larger file gets a "
                   "shard of its own), OUT-00000-of-0000N.ffr... and the manifest OUT.ffrset.")
@click.option("--shards", metavar="N", type=int, callback=_shard_count_option,
              help="Write a shard set of N shards of about equal bytes (at most N: fewer with fewer files). "
                   "Not for a tar stream or a compressed tar (read once: use --shard-size).")
def pack(src: str, out: str, follow_symlinks: bool, exclude: tuple[str, ...], force: bool,
         keep_going: bool, jobs: int | None, quiet: bool, force_progress: bool, no_xattrs: bool,
         compress: str | None = None, dictionary: str | None = None, dedup: bool | None = None,
         sparse: bool | None = None, verify: bool = False, shard_size: int | None = None,
         shards: int | None = None) -> None:
    """Pack SRC into the archive OUT: a directory, a tar (.tar, .tar.gz, .tar.bz2,
    .tar.xz; "-" reads one from stdin) or a zip, recognised by content.  Archives are
    streamed in, never extracted to disk.

    A path in SRC that cannot be read fails the pack, listing every such path, and
    nothing is written; with --keep-going the rest is packed.  FIFOs, sockets and
    devices are skipped ('skipped: PATH (why)').

    With --shard-size or --shards, OUT names a shard set: complete archives
    OUT-00000-of-0000N.ffr... (each opens alone, in packfs or FFRecord), cut in pack
    order, and the manifest OUT.ffrset that makes them one tree; it appears whole or
    not at all.  A tar stream's members must then be in pack order (tar --sort=name).

    \b
    Exit status: 0 packed; 1 error, OUT not written; 2 usage error;
    3 packed, but a file changed while it was read (stored as a later read found
    it whole, with a warning), or, with --keep-going, paths that could not be read
    were left out.

    \b
    Example:
      packfs pack dataset/ data.ffr --exclude '*.tmp'
      packfs pack -k /scratch/project project.ffr   # exit status 3 if paths were left out
      packfs pack -j 8 /data/imagenet/train train.ffr   # 8 processes read the files
      packfs pack ILSVRC2012_img_val.tar val.ffr
      packfs pack dataset/ train.ffr --shard-size 4G   # train-00000-of-0000N.ffr..., train.ffrset
      packfs pack --compress zstd --dictionary auto corpus/ corpus.ffr
    """
    codecs = _codecs(compress, dictionary, dedup, sparse, verify)
    if shard_size is not None and shards is not None:
        raise click.UsageError("--shard-size and --shards cannot be used together")
    if (shard_size is not None or shards is not None) and keep_going:
        raise click.UsageError("--keep-going does not apply to a shard set (written whole or not at all)")
    if (shard_size is not None or shards is not None) and jobs is not None:
        # Said rather than ignored: -j would promise parallel reads a set's packer does not make.
        raise click.UsageError("-j does not apply to a shard set (its shards are packed by one process)")
    if shard_size is not None or shards is not None:
        _check_source_options(src, follow_symlinks, exclude, keep_going)
        progress = _TerminalProgress("packing", quiet, force_progress)
        _pack_set(src, out, follow_symlinks, exclude, force, quiet, progress, not no_xattrs, shard_size, shards,
                  codecs)
        return
    stats = _pack_source(src, out, follow_symlinks=follow_symlinks, exclude=exclude, force=force,
                         keep_going=keep_going, jobs=jobs, quiet=quiet, force_progress=force_progress,
                         no_xattrs=no_xattrs, codecs=codecs)
    if not quiet:
        _echo_pack_summary(stats, out)
    if stats.failed or stats.changed:
        click.get_current_context().exit(3)


def _check_source_options(src: str, follow_symlinks: bool, exclude: tuple[str, ...], keep_going: bool) -> None:
    """Usage errors in how SRC is to be read (for pack, a set's pack and append)."""
    from_archive = src == "-" or not os.path.isdir(src)
    if from_archive and (follow_symlinks or exclude or keep_going):
        raise click.UsageError("-L, --exclude and --keep-going apply to a directory SRC only")
    if exclude:
        from .write import ExcludePatterns

        try:
            ExcludePatterns(exclude, src)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="'--exclude'") from None


def _pack_source(src: str, out: str, *, follow_symlinks: bool, exclude: tuple[str, ...], force: bool,
                 keep_going: bool, jobs: int | None, quiet: bool, force_progress: bool, no_xattrs: bool,
                 codecs: dict[str, Any] | None = None) -> Any:
    """pack's work, shared with append: SRC (a directory, a tar or a zip) into OUT;
    returns the PackStats (:func:`_echo_pack_summary` prints them)."""
    _check_source_options(src, follow_symlinks, exclude, keep_going)
    from_archive = src == "-" or not os.path.isdir(src)
    progress = _TerminalProgress("packing", quiet, force_progress)
    try:
        with _exit_on_signals(repr(out)), _closing(progress):
            if from_archive:
                from .write import pack_archive

                stats = pack_archive(src, out, force=force, stdin=sys.stdin.buffer, progress=progress,
                                     xattrs=not no_xattrs, **(codecs or {}))
            else:
                stats = pack_folder(src, out, follow_symlinks=follow_symlinks, exclude=exclude,
                                    force=force, progress=progress, keep_going=keep_going, xattrs=not no_xattrs,
                                    jobs=jobs, **(codecs or {}))
    except PackSourceError as error:
        if len(error.failed) > 1:  # the error line names one; every one is listed
            for failed in error.failed:
                click.echo(os.fsencode(f"cannot pack: {failed.path} ({failed.reason})"), err=True)
        raise
    return stats


def _echo_pack_summary(stats: Any, out: str) -> None:
    """pack's summary line, for pack, and for append once the shard is in the set."""
    seconds = max(stats.seconds, 1e-9)
    rates = [f"{human_size(stats.file_bytes / seconds)}/s"]
    if stats.files >= 10:  # a files/s figure of one or two large files says nothing
        rates.insert(0, f"{stats.files / seconds:.0f} files/s")
    click.echo(
        f"packed {_count(stats.files, 'file')}, {_count(stats.dirs, 'dir')}, "
        f"{_count(stats.symlinks, 'symlink')} ({human_size(stats.file_bytes)}) into {out!r} "
        f"({human_size(stats.archive_bytes)}) in {stats.seconds:.2f} s ({', '.join(rates)})"
        + _skipped_summary(stats.skipped, len(stats.failed))
        + (f"; {_count(len(stats.changed), 'file')} changed while read, stored as read again"
           if stats.changed else "")
        + (f"; {_count(stats.deduplicated, 'file')} stored once with an equal file"
           if stats.deduplicated else ""),
        err=True,
    )


@main.command()
@click.argument("manifest", type=click.Path(dir_okay=False))
@click.argument("src", type=click.Path(allow_dash=True))
@_source_options
@_codec_options
def append(manifest: str, src: str, follow_symlinks: bool, exclude: tuple[str, ...], keep_going: bool,
           jobs: int | None, quiet: bool, force_progress: bool, no_xattrs: bool, compress: str | None = None,
           dictionary: str | None = None, dedup: bool | None = None, sparse: bool | None = None,
           verify: bool = False) -> None:
    """Add SRC (a directory, a tar or a zip, as pack takes it) to the shard set
    MANIFEST as a new shard, and update MANIFEST atomically.

    The new shard is a complete archive beside MANIFEST (STEM-NNNNN.ffr). Its paths
    may go anywhere in the tree, into existing directories too, but none may already
    be in the set: SRC's paths are checked before anything is packed, and the append
    is refused, counting those the set holds and naming the first few; nothing
    changes (a tar on stdin, read once, is checked once packed).
    Readers and mounts opened before keep serving the set they opened; new ones see
    the new files. Appends to one set wait for each other.

    \b
    Exit status: 0 appended; 1 error, the set unchanged; 2 usage error; 3 as pack's.

    \b
    Example:
      packfs pack day1/ logs.ffr --shards 4    # logs.ffrset and its shards
      packfs append logs.ffrset day2/
    """
    from .write.sets import append_shard, tree_paths

    codecs = _codecs(compress, dictionary, dedup, sparse, verify)
    _check_source_options(src, follow_symlinks, exclude, keep_going)
    # What SRC holds, checked against the set before anything is packed (a stream,
    # read once, is checked once packed); the summary only once the shard is in the set.
    paths = tree_paths(src, manifest, follow_symlinks, exclude)
    with _exit_on_signals(repr(manifest)):
        record, (out, stats) = append_shard(manifest, lambda out: (out, _pack_source(
            src, out, follow_symlinks=follow_symlinks, exclude=exclude, force=False, keep_going=keep_going,
            jobs=jobs, quiet=quiet, force_progress=force_progress, no_xattrs=no_xattrs, codecs=codecs)),
            paths=paths, source=src)
    if not quiet:
        _echo_pack_summary(stats, out)
        click.echo(f"appended {record.file!r} ({record.entries} entries) to {manifest!r}", err=True)
    if stats.failed or stats.changed:
        click.get_current_context().exit(3)


def _pack_set(src: str, out: str, follow_symlinks: bool, exclude: tuple[str, ...], force: bool, quiet: bool,
              progress: _TerminalProgress, xattrs: bool, shard_size: int | None, shards: int | None,
              codecs: dict[str, Any] | None = None) -> None:
    """packfs pack --shard-size/--shards: a shard set, and one summary line for it."""
    from .write.shards import pack_shards, set_names

    directory, stem = set_names(out)
    try:
        with _exit_on_signals(f"the set {os.path.join(directory, stem)!r}"), _closing(progress):
            stats = pack_shards(src, out, shard_size=shard_size, shards=shards, follow_symlinks=follow_symlinks,
                                exclude=exclude, force=force, progress=progress, xattrs=xattrs,
                                stdin=sys.stdin.buffer, codecs=codecs)
    except PackSourceError as error:
        if len(error.failed) > 1:
            for failed in error.failed:
                click.echo(os.fsencode(f"cannot pack: {failed.path} ({failed.reason})"), err=True)
        raise
    if not quiet:
        sizes = [record.size for record in stats.shards]
        seconds = max(stats.seconds, 1e-9)
        click.echo(
            f"packed {_count(stats.files, 'file')}, {_count(stats.dirs, 'dir')}, "
            f"{_count(stats.symlinks, 'symlink')} ({human_size(stats.file_bytes)}) into "
            f"{_count(len(sizes), 'shard')} of {human_size(min(sizes))} to {human_size(max(sizes))} "
            f"({human_size(stats.archive_bytes)} in all), set {stats.manifest!r}, in {stats.seconds:.2f} s "
            f"({human_size(stats.file_bytes / seconds)}/s)" + _skipped_summary(stats.skipped, 0),
            err=True,
        )


@main.command(name="set")
@click.argument("manifest", type=click.Path(dir_okay=False))
@click.argument("archives", nargs=-1, required=True, type=ARCHIVE_PATH)
@click.option("-f", "--force", is_flag=True, help="Replace MANIFEST if it exists.")
def make_set(manifest: str, archives: tuple[str, ...], force: bool) -> None:
    """Write the shard-set manifest MANIFEST (NAME.ffrset) listing ARCHIVES, so that
    they are served as one tree by every command, PackedFolder, the datasets and
    packfs mount. The archives must lie in MANIFEST's directory or below it, and no
    path may be in two of them (directories are merged).

    \b
    Example:
      packfs set data.ffrset train.ffr val.ffr
      packfs mount data.ffrset /mnt/data
    """
    from .write.sets import make_set as write_set

    records = write_set(manifest, list(archives), force=force)
    click.echo(f"wrote {manifest!r}: {_count(len(records), 'archive')}, "
               f"{sum(r.entries for r in records)} entries", err=True)


def _skipped_summary(skipped: tuple[SkippedPath, ...], failed: int) -> str:
    if not skipped:
        return ""
    text = f"; skipped {_count(len(skipped), 'path')}, each listed above"
    return text + (f" ({failed} could not be read)" if failed else "")


def _count(number: int, noun: str, plural: str = "") -> str:
    """``1 file``, ``2 files`` (``plural`` where adding an s is wrong): every count the
    CLI prints goes through here."""
    return f"{number} {noun}" if number == 1 else f"{number} {plural or noun + 's'}"


@main.command()
@click.argument("legacy", type=ARCHIVE_PATH)
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("-f", "--force", is_flag=True, help="Replace OUT if it exists.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
@_progress_option
@click.option("--compress", metavar="zstd[:LEVEL]", callback=_compress_option, default=None,
              help="Rewrite any archive (the current version too) with its files compressed, as pack "
                   "--compress does; 'none' rewrites it uncompressed.")
@click.option("--dictionary", type=click.Choice(["auto", "none"]), default=None,
              help="With --compress: train dictionaries, as pack --dictionary does.")
@click.option("--dedup/--no-dedup", default=None, help="Store files with equal bytes once (default: on with "
                                                        "--compress).")
def convert(legacy: str, out: str, force: bool, quiet: bool, force_progress: bool, compress: str | None = None,
            dictionary: str | None = None, dedup: bool | None = None) -> None:
    """Rewrite LEGACY as a packfs archive OUT of the current format version: an archive
    made by FFRecord's pack_folder, or a packfs archive of an older version.

    Every packfs command already reads LEGACY as it is.  From FFRecord, OUT opens in
    O(1) instead of building the path table in memory at each open, and carries
    packfs' checks; from format 1.0, OUT stores the inode numbers of hard links (the
    compiled mount daemon needs them); from 1.0 or 1.1, it has piece CRCs, so the
    first bytes of a large file are served without checking all of it first.

    \b
    Example:
      packfs convert old_dataset.ffr dataset.ffr && packfs verify dataset.ffr
    """
    from .write import convert as convert_archive

    if dictionary == "auto" and compress in (None, "none"):
        raise click.UsageError("--dictionary auto needs --compress zstd[:LEVEL]")
    progress = _TerminalProgress("converting", quiet, force_progress)
    with _exit_on_signals(repr(out)), _closing(progress):
        stats = convert_archive(legacy, out, force=force, progress=progress,
                                compress=compress, dictionary=dictionary, dedup=dedup)
    if not quiet:
        click.echo(f"converted {_count(stats.files, 'file')}, {_count(stats.dirs, 'dir')}, "
                   f"{_count(stats.symlinks, 'symlink')} ({human_size(stats.file_bytes)}) "
                   f"into {out!r} in {stats.seconds:.2f} s", err=True)


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


@main.command(context_settings={"help_option_names": ["--help"]})  # -h is --human-readable, as in ls
@click.argument("archive", type=ARCHIVE_PATH)
@_cache_options
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


class _FindCommand(_Command):
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


@main.command(cls=_FindCommand)
@click.argument("archive", type=ARCHIVE_PATH)
@_cache_options
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


@main.command()
@click.argument("archive", type=ARCHIVE_PATH)
@_cache_options
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
@click.argument("archive", type=ARCHIVE_PATH)
@_cache_options
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
                            f"{_count(kind['files'], 'file')}  {kind['kind']}")


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
            shown["codecs"] = ", ".join(f"{_count(files, 'file')} {codec}"
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
    from .records import record_file_info

    details = record_file_info(path)
    if as_json:
        click.echo(json.dumps(details, indent=2))
        return
    _echo_fields(details, ("smallest_record", "largest_record"))
    click.echo("(no path table: ls, find, cat, unpack and mount need a packfs archive of files)")


def _mount_daemon(folder: PackedFolder) -> str:
    """Which daemon `packfs mount` would serve the archive with, and why."""
    from . import fuse as fuse_mount

    binding, notice = fuse_mount.choose_binding("auto", folder.archive)
    if binding == fuse_mount.LOWLEVEL:
        return f"{binding} (compiled, libfuse {fuse_mount.compiled_libfuse_version()})"
    return f"{binding} (Python): {notice.partition(': ')[2]}"


@main.command()
@click.argument("archive", type=ARCHIVE_PATH)
@_cache_options
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@_progress_option
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
    progress = _TerminalProgress("verifying", quiet, force_progress)
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
        symlinks = f", {_count(report.symlinks_checked, 'symlink')}" if report.symlinks_checked else ""
        click.echo(f"OK: {_count(report.files_checked, 'file')}{symlinks} and the path table, "
                   f"{human_size(report.bytes_checked)} checked")
        return
    for path in report.bad_paths:
        _echo_path_line(f"damaged: {path}")
    for problem in report.problems:
        click.echo(f"damaged: {problem}")
    raise click.ClickException(f"{shown_location(archive)!r} is damaged: {_damage_summary(report)} (listed above)")


def _show_fetched(progress: _TerminalProgress, folder: PackedFolder) -> None:
    """An archive at a URL: its progress lines also say what was fetched."""
    if folder.stats():  # empty for a local archive
        progress.fetched = folder.stats


def _damage_summary(report: Any) -> str:
    """What a VerifyReport found, counted in files where it can be."""
    parts = []
    if report.bad_paths:
        bad = len(report.bad_paths)
        parts.append(f"{_count(bad, 'file')} {'fails its checksum' if bad == 1 else 'fail their checksums'}")
    if report.problems:
        parts.append(_count(len(report.problems), "problem" if not parts else "other problem"))
    if not parts:  # records that no path names
        parts.append(f"{_count(len(report.bad_records), 'record')} fail their checksums")
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
    from .records import verify_record_file

    progress = _TerminalProgress("verifying", quiet, force_progress)
    progress.start(0, os.path.getsize(path))
    try:
        report = verify_record_file(path, progress.add_bytes)
        progress.finish()
    finally:
        progress.close()
    records = _count(report.records_checked, "record")
    if as_json:
        _echo_report(path, "FFRecord record file", report)
        if not report.ok:
            raise click.ClickException(f"{path!r} is damaged: {_count(len(report.problems), 'problem')}")
        return
    if report.ok:
        click.echo(f"OK: an FFRecord record file of {records} (no path table), "
                   f"{human_size(report.bytes_checked)} checked")
        return
    for problem in report.problems:
        click.echo(f"damaged: {problem}")
    passed = report.records_checked - len(report.bad_records)
    raise click.ClickException(f"{path!r} is damaged: {_count(len(report.problems), 'problem')} (listed above); "
                               f"{passed} of {records} pass their checksums")


@main.command()
@click.argument("archive", type=ARCHIVE_PATH)
@_cache_options
@click.argument("dest", type=click.Path(file_okay=False))
@click.argument("paths", nargs=-1)
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
@_progress_option
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
    from .errors import UnpackDamagedError

    progress = _TerminalProgress("unpacking", quiet, force_progress)

    def report(path: str, reason: str) -> None:
        progress.close()  # blanks the progress line; the next update draws it again
        click.echo(os.fsencode(f"damaged: {path} ({reason})"), err=True)

    failure = None
    # A signal stops it cleanly: the file being written is removed (each file appears
    # under its name only once whole), and a rerun with --skip-existing resumes; the
    # result equals an unpack never interrupted.
    with _exit_on_signals(f"the rest of {dest!r} (--skip-existing resumes)"), PackedFolder(archive) as folder:
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
        summary = (f"unpacked {_count(stats.files + stats.hardlinks, 'file')}, {_count(stats.dirs, 'dir')}, "
                   f"{_count(stats.symlinks, 'symlink')} ({human_size(stats.bytes)}) into {dest!r}")
        if stats.existing:
            summary += f"; {stats.existing} already there, left as they were"
        if stats.xattrs_not_restored:
            summary += (f"; {_count(stats.xattrs_not_restored, 'extended attribute')} not restored "
                        f"(DEST refused them, see the warnings)")
        if stats.skipped:
            summary += f"; skipped {_count(stats.skipped, 'damaged file')}"
        click.echo(summary, err=True)
    if failure is not None:
        raise failure  # one "Error: ..." line and exit 1 (a traceback with --debug)


def _parse_options(values: tuple[str, ...]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for value in values:
        for item in value.split(","):
            if item:
                key, sep, setting = item.partition("=")
                options[key] = setting if sep else True
    return options


@main.command()
@click.argument("archive", type=ARCHIVE_PATH)
@_cache_options
@click.argument("mountpoint", type=click.Path())
@click.option("-f", "--foreground", is_flag=True, help="Stay in the foreground; log to stderr.")
@click.option("-d", "--debug", "fuse_debug", is_flag=True, help="Show FUSE's own debug output (implies -f).")
@click.option("-o", "options", multiple=True, metavar="OPTION[,OPTION...]",
              help="FUSE mount options, e.g. -o uid=1000,gid=1000 to show files as yours; "
                   "-o nonempty mounts over a non-empty directory. mount(8)'s own options "
                   "(defaults, rw, suid, dev, noauto, nofail, _netdev, x-*, ...) are accepted and "
                   "ignored: mounts are read-only, nosuid and nodev.")
@click.option("--allow-other", is_flag=True,
              help="Let other users read the mount (non-root users need user_allow_other in /etc/fuse.conf).")
@click.option("--check-data/--no-check-data", default=True, show_default=True,
              help="Check each file's CRC once, at its first read; a mismatch reads as EIO.")
@click.option("--threads", default=0, type=click.IntRange(0, 100000), metavar="N",
              help="Serve with at most N threads (1: one request at a time); the default is "
                   "libfuse's, 10. N > 1 needs libfuse 3.12 and is not for --binding fusepy.")
@click.option("--binding", type=click.Choice(["auto", "lowlevel", "mfusepy", "fusepy"]), default="auto",
              show_default=True,
              help="Which daemon serves: lowlevel (compiled, libfuse3's low-level API, the fastest); "
                   "mfusepy (Python, libfuse3) or fusepy (Python, libfuse2); auto takes lowlevel where "
                   "it can serve the archive, else mfusepy, and says why.")
@click.option("--log-file", type=click.Path(dir_okay=False), default=None,
              help="Where a background daemon logs (default: a file named in the output, "
                   "removed when the daemon ends with nothing logged).")
def mount(archive: str, mountpoint: str, foreground: bool, fuse_debug: bool, options: tuple[str, ...],
          allow_other: bool, check_data: bool, threads: int, binding: str, log_file: str | None) -> None:
    """Serve ARCHIVE read-only at the directory MOUNTPOINT through FUSE.

    Returns once the mount works; the daemon then runs in the background until
    `packfs unmount MOUNTPOINT` or `umount MOUNTPOINT` (or SIGTERM/SIGINT to it,
    which unmount too and are no error).

    \b
    mount(8), umount(8) and /etc/fstab work with type fuse.packfs once
    /sbin/mount.fuse.packfs exists (as root: make install-mount-helper):
      mount -t fuse.packfs /data/train.ffr /mnt/train
      /data/train.ffr  /mnt/train  fuse.packfs  ro,allow_other,nofail  0  0
    packfs' own settings go in -o there: threads=N, binding=NAME, nocheck_data.

    \b
    Example:
      packfs mount data.ffr /mnt/data && ls /mnt/data
    """
    from . import fuse as fuse_mount  # the only importer of a FUSE binding

    extra = _parse_options(options)
    fuse_mount.check_options(extra)
    if threads > 1 and binding == "fusepy":
        raise click.UsageError("--threads N with N > 1 needs --binding mfusepy "
                               "(libfuse2 always serves with up to 10 threads)")
    # Everything that can be known up front fails here, before anything detaches.
    if allow_other or extra.get("allow_other"):
        fuse_mount.check_allow_other()
    fuse_mount.check_fuse(binding)
    fuse_mount.check_mountpoint(mountpoint, nonempty=bool(extra.get("nonempty")))
    opened = fuse_mount.open_for_mount(archive, check_data)
    fuse_mount.hide_command_line_secrets()  # a URL's password, shown by ps while the mount serves
    binding, notice = fuse_mount.choose_binding(binding, opened)
    if notice:
        click.echo(f"note: {notice}", err=True)
    fuse_mount.check_fuse(binding)
    settings = dict(debug=fuse_debug, threads=threads, check_data=check_data,
                    allow_other=allow_other, options=extra, binding=binding)
    if foreground or fuse_debug:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s packfs: %(message)s"))
        mount_log = logging.getLogger("packfs.mount")
        mount_log.addHandler(handler)
        mount_log.propagate = False  # not also through the CLI's "Warning:" handler
        fuse_mount.mount(opened, mountpoint, foreground=True, **settings)
        return
    log_path = log_file or fuse_mount.state_file(mountpoint, ".log")
    pid = fuse_mount.mount_in_background(opened, mountpoint, log_path, foreground=True, **settings)
    click.echo(f"mounted {shown_location(archive)!r} at {mountpoint!r} (daemon pid {pid}, log {log_path})", err=True)


@main.command()
@click.argument("mountpoint", type=click.Path())
@click.option("-z", "--lazy", is_flag=True, help="Detach now even if busy; clean up when no longer used.")
def unmount(mountpoint: str, lazy: bool) -> None:
    """Unmount a packfs mount and wait for its daemon to exit.

    Refuses anything that is not a packfs mount (type fuse.packfs).  Also clears a
    stale mount whose daemon died ("Transport endpoint is not connected").

    \b
    Example:
      packfs unmount /mnt/data
    """
    from . import fuse as fuse_mount

    stale = fuse_mount.is_stale(mountpoint)
    fuse_mount.unmount(mountpoint, lazy=lazy)
    if stale:
        click.echo(f"cleared stale mount {mountpoint!r} (its daemon had died)", err=True)


def _ago(seconds: float) -> str:
    """A span of time as people read it in a listing: ``40 s``, ``12 min``, ``3 h``, ``5 d``."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


@main.group(invoke_without_command=True)
@_cache_options
@click.option("--json", "as_json", is_flag=True, help="With no command: print the listing as JSON.")
@click.pass_context
def cache(ctx: click.Context, as_json: bool) -> None:
    """Show, clear or fill the node's disk cache of archives at URLs.

    With no command, lists it (as cache list).  The cache is shared by every process
    on the node that reads an archive at a URL; it lives in --cache-dir,
    $PACKFS_CACHE_DIR, $XDG_CACHE_HOME/packfs or ~/.cache/packfs (the first set), and is
    bounded by --cache-size, $PACKFS_CACHE_SIZE or 32G.

    \b
    Example:
      packfs cache
      packfs cache prefetch s3://bucket/train.ffr
      packfs cache clear s3://bucket/train.ffr
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(cache_list, as_json=as_json)


@cache.command(name="list")
@_cache_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the directory, the bound and each archive's fields.")
def cache_list(as_json: bool) -> None:
    """List what the disk cache holds, an archive a line.

    For each archive: its URL, the bytes cached, the hits and misses (16 KiB blocks)
    and GETs of every process that read it through this cache, when it was first
    cached and last used; then the total, the directory and the bound.  A process adds
    its counts at close, at exit and every 10 s of reading.
    """
    from .nodecache import cache_stats

    report = cache_stats()
    if as_json:
        click.echo(json.dumps({"directory": report.directory, "bound": report.bound,
                               "cached_bytes": report.cached_bytes,
                               "archives": [a._asdict() for a in report.archives]}, indent=2))
        return
    now = time.time()
    if report.archives:
        rows = [("URL", "CACHED", "SIZE", "HITS", "MISSES", "GETS", "FETCHED", "LAST USED", "AGE")]
        for a in report.archives:
            rows.append((a.url or f"(unknown: {a.key})", human_size(a.cached_bytes), human_size(a.size) if a.size else "?",
                         str(a.cache_hits), str(a.cache_misses), str(a.requests), human_size(a.bytes_fetched),
                         _ago(now - a.last_used) + " ago", _ago(now - a.first_used)))
        widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
        for row in rows:
            click.echo("  ".join([row[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in zip(row[1:], widths[1:])]))
    else:
        click.echo("nothing cached")
    click.echo(f"{_count(len(report.archives), 'archive')}, {human_size(report.cached_bytes)} cached in "
               f"{report.directory} (bound {human_size(report.bound)})")


@cache.command(name="clear")
@_cache_options
@click.argument("url", required=False)
def cache_clear(url: str | None) -> None:
    """Remove every archive from the disk cache, or every version of URL.

    Safe while other processes read: they fetch again what they need.

    \b
    Example:
      packfs cache clear
      packfs cache clear https://example.com/data.ffr
    """
    from .nodecache import cache_clear as clear

    removed, freed = clear(url)
    click.echo(f"removed {_count(removed, 'archive')}, {human_size(freed)}")


@cache.command(name="prefetch")
@_cache_options
@click.argument("url")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
@_progress_option
def cache_prefetch(url: str, quiet: bool, force_progress: bool) -> None:
    """Fill the disk cache with the whole archive at URL (a shard set: every shard).

    Reads what the cache does not hold in large ranged GETs, many in flight, so that
    a job that follows (every process on the node) reads it from local disk.

    \b
    Example:
      packfs cache prefetch s3://bucket/train.ffrset && torchrun train.py
    """
    from .nodecache import cache_prefetch as prefetch

    progress = _TerminalProgress("prefetching", quiet, force_progress)

    def opened(archive: Any) -> None:
        progress.fetched = archive.stats
        progress.start(0, archive.size)

    started = time.monotonic()
    with _closing(progress):
        stats = prefetch(url, progress.add_bytes, opened=opened)
        progress.fetched = lambda: stats  # the archive is closed: its last line says what the run fetched
    if not quiet:
        click.echo(f"prefetched {shown_location(url)}: fetched {human_size(stats.get('bytes_fetched', 0))} in "
                   f"{_count(stats.get('requests', 0), 'request')}, {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
