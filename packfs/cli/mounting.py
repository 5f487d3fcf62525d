"""The commands that serve an archive to the kernel and look after the node's cache:
mount, unmount and cache (list, clear, prefetch)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import click

from ..source import shown_location
from .plumbing import (ARCHIVE_PATH, Command, TerminalProgress, cache_options, closing, counted, human_size,
                       progress_option)


def _parse_options(values: tuple[str, ...]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for value in values:
        for item in value.split(","):
            if item:
                key, sep, setting = item.partition("=")
                options[key] = setting if sep else True
    return options


@click.command(cls=Command)
@click.argument("archive", type=ARCHIVE_PATH)
@cache_options
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
    from .. import fuse as fuse_mount  # the only importer of a FUSE binding

    extra = _parse_options(options)
    if threads > 1 and binding == "fusepy":
        raise click.UsageError("--threads N with N > 1 needs --binding mfusepy "
                               "(libfuse2 always serves with up to 10 threads)")
    # Everything that can be known up front fails here, once, before anything detaches:
    # the daemon serves this plan.
    plan = fuse_mount.plan_mount(archive, mountpoint, debug=fuse_debug, threads=threads, check_data=check_data,
                                 allow_other=allow_other, options=extra, binding=binding)
    fuse_mount.hide_command_line_secrets()  # a URL's password, shown by ps while the mount serves
    if plan.notice:
        click.echo(f"note: {plan.notice}", err=True)
    if foreground or fuse_debug:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s packfs: %(message)s"))
        mount_log = logging.getLogger("packfs.mount")
        mount_log.addHandler(handler)
        mount_log.propagate = False  # not also through the CLI's "Warning:" handler
        fuse_mount.mount(plan)
        return
    log_path = log_file or fuse_mount.state_file(mountpoint, ".log")
    pid = fuse_mount.mount_in_background(plan, log_path)
    click.echo(f"mounted {shown_location(archive)!r} at {mountpoint!r} (daemon pid {pid}, log {log_path})", err=True)


@click.command(cls=Command)
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
    from .. import fuse as fuse_mount

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


@click.group(invoke_without_command=True)
@cache_options
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
@cache_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the directory, the bound and each archive's fields.")
def cache_list(as_json: bool) -> None:
    """List what the disk cache holds, an archive a line.

    For each archive: its URL, the bytes cached, the hits and misses (16 KiB blocks)
    and GETs of every process that read it through this cache, when it was first
    cached and last used; then the total, the directory and the bound.  A process adds
    its counts at close, at exit and every 10 s of reading.
    """
    from ..nodecache import cache_stats

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
    click.echo(f"{counted(len(report.archives), 'archive')}, {human_size(report.cached_bytes)} cached in "
               f"{report.directory} (bound {human_size(report.bound)})")


@cache.command(name="clear")
@cache_options
@click.argument("url", required=False)
def cache_clear(url: str | None) -> None:
    """Remove every archive from the disk cache, or every version of URL.

    Safe while other processes read: they fetch again what they need.

    \b
    Example:
      packfs cache clear
      packfs cache clear https://example.com/data.ffr
    """
    from ..nodecache import cache_clear as clear

    removed, freed = clear(url)
    click.echo(f"removed {counted(removed, 'archive')}, {human_size(freed)}")


@cache.command(name="prefetch")
@cache_options
@click.argument("url")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
@progress_option
def cache_prefetch(url: str, quiet: bool, force_progress: bool) -> None:
    """Fill the disk cache with the whole archive at URL (a shard set: every shard).

    Reads what the cache does not hold in large ranged GETs, many in flight, so that
    a job that follows (every process on the node) reads it from local disk.

    \b
    Example:
      packfs cache prefetch s3://bucket/train.ffrset && torchrun train.py
    """
    from ..nodecache import cache_prefetch as prefetch

    progress = TerminalProgress("prefetching", quiet, force_progress)

    def opened(archive: Any) -> None:
        progress.fetched = archive.stats
        progress.start(0, archive.size)

    started = time.monotonic()
    with closing(progress):
        stats = prefetch(url, progress.add_bytes, opened=opened)
        progress.fetched = lambda: stats  # the archive is closed: its last line says what the run fetched
    if not quiet:
        click.echo(f"prefetched {shown_location(url)}: fetched {human_size(stats.get('bytes_fetched', 0))} in "
                   f"{counted(stats.get('requests', 0), 'request')}, {time.monotonic() - started:.1f} s")
