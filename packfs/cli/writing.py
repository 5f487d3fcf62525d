"""The commands that write archives: pack (a directory, a tar or a zip, into one
archive or a shard set), append (a shard into a set), set (a manifest over archives)
and convert (an FFRecord or older packfs archive)."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

import click

from ..errors import PackSourceError
from ..write import SkippedPath, pack_folder
from .plumbing import (ARCHIVE_PATH, Command, TerminalProgress, closing, counted, exit_on_signals, human_size,
                       progress_option)


def _size_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from ..source.cache import parse_size

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
    from ..write.encode import parse_compress

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
        progress_option,
        click.option("--no-xattrs", "no_xattrs", is_flag=True,
                     help="Leave out extended attributes (kept by default: a directory's, as this user can read "
                          "them; a tar's from its pax headers)."),
    )):
        function = option(function)
    return function


@click.command(cls=Command)
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
        progress = TerminalProgress("packing", quiet, force_progress)
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
        from ..write import ExcludePatterns

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
    progress = TerminalProgress("packing", quiet, force_progress)
    try:
        with exit_on_signals(repr(out)), closing(progress):
            if from_archive:
                from ..write import pack_archive

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
        f"packed {counted(stats.files, 'file')}, {counted(stats.dirs, 'dir')}, "
        f"{counted(stats.symlinks, 'symlink')} ({human_size(stats.file_bytes)}) into {out!r} "
        f"({human_size(stats.archive_bytes)}) in {stats.seconds:.2f} s ({', '.join(rates)})"
        + _skipped_summary(stats.skipped, len(stats.failed))
        + (f"; {counted(len(stats.changed), 'file')} changed while read, stored as read again"
           if stats.changed else "")
        + (f"; {counted(stats.deduplicated, 'file')} stored once with an equal file"
           if stats.deduplicated else ""),
        err=True,
    )


@click.command(cls=Command)
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
    from ..write.sets import append_shard, tree_paths

    codecs = _codecs(compress, dictionary, dedup, sparse, verify)
    _check_source_options(src, follow_symlinks, exclude, keep_going)
    # What SRC holds, checked against the set before anything is packed (a stream,
    # read once, is checked once packed); the summary only once the shard is in the set.
    paths = tree_paths(src, manifest, follow_symlinks, exclude)
    with exit_on_signals(repr(manifest)):
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
              progress: TerminalProgress, xattrs: bool, shard_size: int | None, shards: int | None,
              codecs: dict[str, Any] | None = None) -> None:
    """packfs pack --shard-size/--shards: a shard set, and one summary line for it."""
    from ..write.shards import pack_shards, set_names

    directory, stem = set_names(out)
    try:
        with exit_on_signals(f"the set {os.path.join(directory, stem)!r}"), closing(progress):
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
            f"packed {counted(stats.files, 'file')}, {counted(stats.dirs, 'dir')}, "
            f"{counted(stats.symlinks, 'symlink')} ({human_size(stats.file_bytes)}) into "
            f"{counted(len(sizes), 'shard')} of {human_size(min(sizes))} to {human_size(max(sizes))} "
            f"({human_size(stats.archive_bytes)} in all), set {stats.manifest!r}, in {stats.seconds:.2f} s "
            f"({human_size(stats.file_bytes / seconds)}/s)" + _skipped_summary(stats.skipped, 0),
            err=True,
        )


@click.command(cls=Command, name="set")
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
    from ..write.sets import make_set as write_set

    records = write_set(manifest, list(archives), force=force)
    click.echo(f"wrote {manifest!r}: {counted(len(records), 'archive')}, "
               f"{sum(r.entries for r in records)} entries", err=True)


def _skipped_summary(skipped: tuple[SkippedPath, ...], failed: int) -> str:
    if not skipped:
        return ""
    text = f"; skipped {counted(len(skipped), 'path')}, each listed above"
    return text + (f" ({failed} could not be read)" if failed else "")


@click.command(cls=Command)
@click.argument("legacy", type=ARCHIVE_PATH)
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("-f", "--force", is_flag=True, help="Replace OUT if it exists.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
@progress_option
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
    from ..write import convert as convert_archive

    if dictionary == "auto" and compress in (None, "none"):
        raise click.UsageError("--dictionary auto needs --compress zstd[:LEVEL]")
    progress = TerminalProgress("converting", quiet, force_progress)
    with exit_on_signals(repr(out)), closing(progress):
        stats = convert_archive(legacy, out, force=force, progress=progress,
                                compress=compress, dictionary=dictionary, dedup=dedup)
    if not quiet:
        click.echo(f"converted {counted(stats.files, 'file')}, {counted(stats.dirs, 'dir')}, "
                   f"{counted(stats.symlinks, 'symlink')} ({human_size(stats.file_bytes)}) "
                   f"into {out!r} in {stats.seconds:.2f} s", err=True)
