"""The command line's plumbing, shared by every command: a PackfsError becomes one
``Error: ...`` line and exit 1 (a traceback with --debug), a terminating signal a clean
exit with 128 + its number, a warning a ``Warning: ...`` line; the progress line, the
cache options, and how counts and sizes are written."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from typing import Any, Callable, Iterator

import click

from ..errors import PackfsError
from ..write import remove_unfinished


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


def cache_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--cache-dir and --cache-size, for every command that reads an archive (at a URL)."""
    from ..source.cache import parse_size

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


class Command(click.Command):
    """A command taking an ARCHIVE says, when it gets extra arguments that are files,
    that they look like a glob the shell expanded, and how to quote it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """click's parsing, with the hint about an expanded glob added to its error."""
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


class Group(click.Group):
    """Turns PackfsError into one ``Error: ...`` line and exit 1 (a traceback with --debug)."""

    command_class = Command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """click's parsing, after handing mount(8)'s ``packfs ARCHIVE DIR -o ...`` to the helper."""
        # `mount -t fuse.packfs ARCHIVE DIR` and fstab lines of that type, without the
        # mount.fuse.packfs helper installed: mount(8) runs fuse3's mount.fuse3, which
        # runs "packfs ARCHIVE DIR -o OPTIONS".  An archive is never a command's name.
        if len(args) >= 2 and args[0] not in self.commands and not args[0].startswith("-") \
                and os.path.isfile(args[0]):
            from ..fuse import mount_helper

            ctx.exit(mount_helper(list(args)))
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command: a PackfsError becomes one line and exit 1, a closed pipe exit 1."""
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


class TerminalProgress:
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
        """A run (or its next phase) begins: its totals (0: unknown); the count starts anew."""
        self.total_files, self.total_bytes = total_files, total_bytes
        self.files = self.bytes = 0
        self.started = time.monotonic()
        self._drawn = 0.0  # the next advance draws at once
        if self.enabled and self._width and not self.lines:  # a second phase: show at once that it began
            self._draw(self.started)

    def advance(self, files: int, nbytes: int) -> None:
        """``files`` and ``nbytes`` more done; the line is drawn again if it is time."""
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
            line += f"  (fetched {human_size(counts['bytes_fetched'])} in {counted(counts['requests'], 'request')})"
        return line

    def _draw(self, now: float) -> None:
        line = self._line(now)
        if self.lines:
            click.echo(line, err=True)
            return
        click.echo("\r" + line.ljust(self._width), nl=False, err=True)
        self._width = max(self._width, len(line))

    def add_bytes(self, nbytes: int) -> None:
        """``nbytes`` more done (a reader's progress callback)."""
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


def progress_option(function: Callable[..., Any]) -> Callable[..., Any]:
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
def exit_on_signals(what: str) -> Iterator[None]:
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
def closing(progress: TerminalProgress) -> Iterator[TerminalProgress]:
    """Blank the progress line however the block ends (finish it when the block
    completes); warnings meanwhile blank it first, so that they do not run into it."""
    WarningHandler.progress = progress
    try:
        yield progress
        progress.finish()
    finally:
        WarningHandler.progress = None
        progress.close()


class WarningHandler(logging.Handler):
    """Prints the ``packfs`` logger's warnings on stderr: ``Warning: ...``, and a path a
    pack left out as ``skipped: PATH (reason)`` (its exact bytes)."""

    progress: TerminalProgress | None = None

    def emit(self, record: logging.LogRecord) -> None:
        """Print ``record`` on stderr, the progress line blanked first."""
        if self.progress is not None:
            self.progress.close()  # the next update draws it again, below
        skipped = getattr(record, "skipped_path", None)
        if skipped is not None:
            click.echo(os.fsencode(f"skipped: {skipped.path} ({skipped.reason})"), err=True)
        else:
            click.echo(f"Warning: {record.getMessage()}", err=True)


def counted(number: int, noun: str, plural: str = "") -> str:
    """``1 file``, ``2 files`` (``plural`` where adding an s is wrong): every count the
    CLI prints goes through here."""
    return f"{number} {noun}" if number == 1 else f"{number} {plural or noun + 's'}"
