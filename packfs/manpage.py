"""packfs(1), generated from the command line itself: every command's usage, help text
and options as ``--help`` shows them, written as a man page (``python -m packfs.manpage
> packfs.1``; ``make setup`` installs it into the venv's ``share/man/man1``).

Written from click's own help records, so the page cannot drift from the CLI, with
no dependency beyond click.
"""

from __future__ import annotations

import inspect
import sys
from typing import TextIO

import click

from . import __version__
from .cli import main

__all__ = ["manpage", "write_manpage"]

_EXIT_STATUS = (
    "0 on success.  1 on an error, printed as one line \"Error: ...\" on standard error "
    "(a traceback with \\-\\-debug), and when verify or unpack find damage.  2 for a usage "
    "mistake (an unknown option, a missing argument).  128 + N when signal N stopped "
    "pack, convert or unpack, which leave nothing half written (130 for Ctrl\\-C)."
)
_SEE_ALSO = "fusermount3(1), mount(8), umount(8), fstab(5)"


def _escape(text: str) -> str:
    """``text`` as troff reads it literally: backslashes and hyphens escaped, and no
    line starting with a control character."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line.startswith((".", "'")) else line for line in text.split("\n"))


def _paragraphs(help_text: str) -> list[str]:
    """A click help text as troff: paragraphs filled, ``\\b`` blocks kept as written."""
    out: list[str] = []
    for block in inspect.cleandoc(help_text).split("\n\n"):
        lines = block.split("\n")
        if lines[0].strip() == "\b":
            out += [".PP", ".nf", _escape("\n".join(lines[1:])), ".fi"]
        else:
            out += [".PP", _escape(" ".join(line.strip() for line in lines))]
    return out


def _bold_options(names: str) -> str:
    """Click's option column (``-n, --numeric-uid-gid``, ``--exclude GLOB``,
    ``--check-data / --no-check-data``) with option names in bold and metavars in
    italics."""
    words = []
    for word in names.split(" "):
        comma = "," if word.endswith(",") else ""
        word = word.rstrip(",")
        if word == "/":
            words.append("/")
        elif word.startswith("-"):
            words.append(f"\\fB{_escape(word)}\\fR{comma}")
        else:
            words.append(f"\\fI{_escape(word)}\\fR{comma}")
    return " ".join(words)


def _options(command: click.Command, ctx: click.Context) -> list[str]:
    out: list[str] = []
    for param in command.get_params(ctx):
        if not isinstance(param, click.Option):
            continue
        record = param.get_help_record(ctx)
        if record is None:
            continue
        names, help_text = record
        out += [".TP", _bold_options(names), _escape(help_text) if help_text else "\\&"]
    return out


def _commands(group: click.Group, parent: click.Context, prefix: str = "") -> list:
    """(name, command, context) of every command under ``group``, a group's own commands
    after it (``cache``, ``cache list``, ...)."""
    found = []
    for name, command in group.commands.items():
        ctx = command.make_context(name, [], parent=parent, resilient_parsing=True)
        found.append((prefix + name, command, ctx))
        if isinstance(command, click.Group):
            found += _commands(command, ctx, f"{prefix}{name} ")
    return found


def manpage() -> str:
    """packfs(1) as troff (man macros)."""
    # make_context applies each command's context_settings (which names its help option).
    root = main.make_context("packfs", [], resilient_parsing=True)
    summary = main.help.strip().split("\n")[0].rstrip(".") if main.help else "packfs"
    lines = [
        f'.TH PACKFS 1 "" "packfs {__version__}" "User Commands"',
        ".SH NAME",
        f"packfs \\- {_escape(summary[0].lower() + summary[1:])}",
        ".SH SYNOPSIS",
        ".nf",
        "\\fBpackfs\\fR [\\fB\\-\\-debug\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR] \\fIARGUMENTS\\fR...",
        "\\fBpackfs\\fR \\fIARCHIVE\\fR \\fIMOUNTPOINT\\fR [\\fB\\-o\\fR \\fIOPTIONS\\fR]   (how mount(8) runs it: see mount)",
        ".fi",
        ".SH DESCRIPTION",
        *_paragraphs(main.help or ""),
        ".SH OPTIONS",
        *_options(main, root),
        ".SH COMMANDS",
    ]
    for name, command, ctx in _commands(main, root):
        usage = " ".join(command.collect_usage_pieces(ctx))
        lines += [f'.SS "packfs {name} {_escape(usage)}"', *_paragraphs(command.help or "")]
        options = _options(command, ctx)
        if options:
            lines += [".PP", "Options:", *options]
    lines += [".SH EXIT STATUS", _EXIT_STATUS, ".SH SEE ALSO", _SEE_ALSO, ""]
    return "\n".join(lines)


def write_manpage(out: TextIO = sys.stdout) -> None:
    """Write :func:`manpage` to ``out``."""
    out.write(manpage())


if __name__ == "__main__":
    write_manpage()
