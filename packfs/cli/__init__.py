"""The packfs command line: parses arguments, calls one library function, prints.

One group, ``main`` (the ``packfs`` entry point), and its commands, by what they do:
:mod:`.writing` (pack, append, set, convert), :mod:`.reading` (ls, find, cat, info,
verify, unpack) and :mod:`.mounting` (mount, unmount, cache); :mod:`.plumbing` turns
errors, signals and warnings into lines and exit statuses, for all of them."""

from __future__ import annotations

import logging

import click

from .. import __version__
from .plumbing import Group, WarningHandler


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
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
    handler, propagate = WarningHandler(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False  # no second copy from logging's last-resort handler

    def restore() -> None:
        logger.removeHandler(handler)
        logger.propagate = propagate

    ctx.call_on_close(restore)


# The commands, in the order --help and packfs(1) list them.
from . import mounting, reading, writing  # noqa: E402  (each command needs main's group first)

for _command in (writing.pack, writing.append, writing.make_set, writing.convert, reading.ls, reading.find,
                 reading.cat, reading.info, reading.verify, reading.unpack, mounting.mount, mounting.unmount,
                 mounting.cache):
    main.add_command(_command)
