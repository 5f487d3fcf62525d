"""packfs(1), generated from the CLI (packfs/manpage.py) and installed by the Makefile:
every command and option is on it, and groff and man render it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from packfs.cli import main
from packfs.manpage import manpage
from tests.conftest import REPO


def _escaped(text: str) -> str:
    return text.replace("\\", "\\e").replace("-", "\\-")


def test_every_command_and_option_is_on_the_page() -> None:
    page = manpage()
    assert page.startswith(".TH PACKFS 1 ")
    root = main.make_context("packfs", [], resilient_parsing=True)
    for option in ("--debug", "--version", "-h", "--help"):
        assert f"\\fB{_escaped(option)}\\fR" in page, option
    commands = [(name, command, root) for name, command in main.commands.items()]
    for group_name, group, _ in list(commands):  # and a group's commands (cache list, ...)
        if isinstance(group, click.Group):
            group_ctx = group.make_context(group_name, [], parent=root, resilient_parsing=True)
            commands += [(f"{group_name} {name}", command, group_ctx) for name, command in group.commands.items()]
    assert "cache prefetch" in [name for name, _, _ in commands]
    for name, command, parent in commands:
        ctx = command.make_context(name.split()[-1], [], parent=parent, resilient_parsing=True)
        usage = " ".join(command.collect_usage_pieces(ctx))
        assert f'.SS "packfs {name} {_escaped(usage)}"' in page, name
        first_line = (command.help or "").strip().splitlines()[0]
        assert _escaped(first_line) in page, name
        for param in command.get_params(ctx):
            if isinstance(param, click.Option):
                for option in param.opts + param.secondary_opts:
                    assert f"\\fB{_escaped(option)}\\fR" in page, (name, option)


def test_no_line_starts_a_request_by_accident() -> None:
    # A help line starting with "." or "'" would be read as a troff request.
    known = {".TH", ".SH", ".SS", ".PP", ".TP", ".nf", ".fi"}
    for line in manpage().splitlines():
        if line.startswith((".", "'")):
            assert line.split(" ")[0] in known, line


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff is not installed")
def test_groff_renders_it_without_warnings(tmp_path: Path) -> None:
    page = tmp_path / "packfs.1"
    page.write_text(manpage())
    result = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", str(page)], capture_output=True, text=True)
    assert result.returncode == 0 and result.stderr == "", result.stderr


@pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed")
def test_man_renders_it(tmp_path: Path) -> None:
    page = tmp_path / "packfs.1"
    page.write_text(manpage())
    env = dict(os.environ, MANWIDTH="100", MANPAGER="cat", PAGER="cat")
    result = subprocess.run(["man", "-l", str(page)], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    for expected in ("PACKFS(1)", "packfs find [OPTIONS] ARCHIVE [PATH]", "-name, --name GLOB",
                     "--json", "EXIT STATUS", "packfs mount [OPTIONS] ARCHIVE MOUNTPOINT"):
        assert expected in text, expected


@pytest.mark.skipif(not (REPO / ".venv" / ".installed").exists(),
                    reason="no .venv/.installed: the Makefile's rule needs make setup to have run")
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_makefile_installs_what_the_generator_writes(tmp_path: Path) -> None:
    mandir = tmp_path / "share" / "man" / "man1"
    result = subprocess.run(["make", "-s", "man", f"MANDIR={mandir}", f"PY={sys.executable}"], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (mandir / "packfs.1").read_text() == manpage()
    assert not (mandir / "packfs.1.tmp").exists()
