"""The CLI through click's CliRunner: exit codes, one-line errors, output."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from packfs.cli import main
from tests.conftest import BLUEPRINT, VECTORS


@pytest.fixture
def run():
    runner = CliRunner()

    def invoke(*args: str, input: bytes | None = None):
        return runner.invoke(main, [str(a) for a in args], input=input)

    return invoke


def _one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0]


def test_pack_then_read_back(run, tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.ffr"
    result = run("pack", tree, out)
    assert result.exit_code == 0, result.output
    assert "packed 11 files" in result.stderr and "files/s" in result.stderr
    result = run("cat", out, "hello.txt", "données/été.txt")
    assert result.exit_code == 0
    assert result.stdout_bytes == b"hello world\n" + BLUEPRINT["données/été.txt"]
    result = run("cat", out, "big/large.bin")
    assert result.stdout_bytes == BLUEPRINT["big/large.bin"]


def test_pack_options(run, tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.ffr"
    assert run("pack", "-q", "--exclude", "*.txt", "--exclude", "big", tree, out).exit_code == 0
    listing = run("ls", "-R", out).stdout.splitlines()
    assert "hello.txt" not in listing and "big" not in listing and "a/b/c/deep.bin" in listing
    _one_line_error(run("pack", tree, out), repr(str(out)), "already exists", "--force")
    result = run("pack", "-q", "--force", "-L", tree, out)
    assert result.exit_code == 0
    assert "dangling" in result.stderr and "kept as a symlink" in result.stderr
    long = run("ls", "-l", out).stdout
    assert "link-to-hello -> " not in long and "dangling -> no/such/target" in long


def test_pack_warns_about_special_files(run, tree: Path, tmp_path: Path) -> None:
    os.mkfifo(tree / "pipe")
    result = run("pack", tree, tmp_path / "x.ffr")
    assert result.exit_code == 0
    assert "Warning: skipped FIFO" in result.stderr and "pipe" in result.stderr


def test_ls(run, archive: Path) -> None:
    result = run("ls", archive)
    assert result.exit_code == 0
    assert result.stdout.splitlines()[:3] == ["-leading-dash", "Zeta.txt", "a"]
    long = run("ls", "-l", archive, "a/b/c").stdout
    assert long.startswith("-rwxr-xr-x   1") and "768" in long and "deep.bin" in long
    assert "link-to-hello -> hello.txt" in run("ls", "-l", archive).stdout
    assert "c/deep.bin" in run("ls", "-R", archive, "a/b").stdout.splitlines()
    assert run("ls", archive, "hello.txt").stdout == "hello.txt\n"
    _one_line_error(run("ls", archive, "nope"), "'nope'", "no such file")


def test_info(run, archive: Path) -> None:
    text = run("info", archive).stdout
    assert "format version  1.0" in text and "files" in text and "MiB" in text
    data = json.loads(run("info", "--json", archive).stdout)
    assert data["files"] == 11 and data["symlinks"] == 5 and data["format_version"] == "1.0"
    assert data["largest_files"][:2] == [{"path": "big/large.bin", "size": 3 * (1 << 20) + 17},
                                         {"path": "a/b/c/deep.bin", "size": 768}]
    assert "largest files" in text and "3.0 MiB  big/large.bin" in text


def test_verify(run, archive: Path, tmp_path: Path) -> None:
    result = run("verify", archive)
    assert result.exit_code == 0 and result.stdout.startswith("OK: ")
    from packfs import PackedFolder

    with PackedFolder(archive) as folder:
        start, _ = folder._container.record_span(folder._table.record(folder._table.lookup(b"Zeta.txt")))
    data = bytearray(archive.read_bytes())
    data[start] ^= 0xFF
    bad = tmp_path / "bad.ffr"
    bad.write_bytes(bytes(data))
    result = run("verify", bad)
    assert result.exit_code == 1
    assert "damaged: Zeta.txt" in result.stdout
    assert "Error:" in result.stderr and "1 files" in result.stderr


def test_unpack(run, archive: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run("unpack", archive, out, "a")
    assert result.exit_code == 0, result.output
    assert (out / "a/b/c/deep.bin").read_bytes() == BLUEPRINT["a/b/c/deep.bin"]
    assert not (out / "hello.txt").exists()
    _one_line_error(run("unpack", archive, out, "a"), "already exists")


def test_cat_errors(run, archive: Path) -> None:
    _one_line_error(run("cat", archive, "a"), "'a' is not a file but a dir")
    _one_line_error(run("cat", archive, "missing"), "'missing'")


def test_bad_archives_give_one_line(run, tmp_path: Path) -> None:
    junk = tmp_path / "junk.ffr"
    junk.write_bytes(b"not an archive at all")
    _one_line_error(run("ls", junk), repr(str(junk)), "header claims")
    _one_line_error(run("info", VECTORS / "records.ffr"), "not a packfs archive")
    _one_line_error(run("verify", VECTORS / "corrupt_header.ffr"), "header checksum mismatch")


def test_usage_errors_exit_2(run, tmp_path: Path) -> None:
    assert run("ls", tmp_path / "missing.ffr").exit_code == 2
    assert run("pack").exit_code == 2
    assert run("frobnicate").exit_code == 2


def test_debug_shows_the_traceback(run, tmp_path: Path) -> None:
    junk = tmp_path / "junk.ffr"
    junk.write_bytes(b"x" * 20)
    result = run("--debug", "ls", junk)
    assert result.exit_code == 1
    assert type(result.exception).__name__ == "FormatError"


def test_help_and_version(run) -> None:
    for command in ("pack", "ls", "cat", "info", "verify", "unpack"):
        result = run(command, "--help")
        assert result.exit_code == 0 and "Example:" in result.stdout
    assert run("--version").stdout.startswith("packfs, version ")


def test_python_dash_m(tmp_path: Path, archive: Path) -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "packfs", "ls", str(archive)],
                            capture_output=True, cwd=Path(__file__).parent.parent)
    assert result.returncode == 0 and b"hello.txt" in result.stdout
    assert b"bytes-\xff\xfe.bin\n" in result.stdout  # names printed as their exact bytes


def test_find_by_name_and_type(run, archive: Path) -> None:
    everything = run("find", archive)
    assert everything.exit_code == 0
    lines = everything.stdout.splitlines()
    assert lines[0] == "." and "a/b/c/deep.bin" in lines and "a/empty_nested" in lines
    assert run("find", archive, "a", "--type", "d").stdout.splitlines() == ["a", "a/b", "a/b/c", "a/empty_nested"]
    # Names are printed as their exact bytes, whatever their encoding.
    assert run("find", archive, "--name", "*.bin", "--type", "f").stdout_bytes.splitlines() == [
        b"a/b/c/deep.bin", b"big/large.bin", b"bytes-\xff\xfe.bin"]
    links = run("find", archive, "--type", "l").stdout.splitlines()
    assert set(links) == {"absolute", "dangling", "link-to-hello", "a/dirlink", "a/link-up"}
    assert run("find", archive, "hello.txt").stdout == "hello.txt\n"
    _one_line_error(run("find", archive, "missing"), "missing")


def test_ls_human_readable_sizes(run, archive: Path) -> None:
    result = run("ls", "-lh", archive, "big")
    assert result.exit_code == 0 and "3.0 MiB" in result.stdout and "large.bin" in result.stdout
    assert run("ls", "--help", archive).exit_code == 0


def test_version_and_shell_completion(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.conftest import REPO

    version = subprocess.run([sys.executable, "-m", "packfs", "--version"], capture_output=True, text=True, cwd=REPO)
    assert version.returncode == 0 and version.stdout.startswith("packfs, version ")
    for shell in ("bash", "zsh", "fish"):  # click's own completion, as the README shows
        script = subprocess.run([sys.executable, "-m", "packfs"], capture_output=True, text=True, cwd=REPO,
                                env={**os.environ, "_PACKFS_COMPLETE": f"{shell}_source"})
        assert script.returncode == 0 and "_PACKFS_COMPLETE" in script.stdout, shell
    words = subprocess.run([sys.executable, "-m", "packfs"], capture_output=True, text=True, cwd=REPO,
                           env={**os.environ, "_PACKFS_COMPLETE": "bash_complete", "COMP_WORDS": "packfs fi",
                                "COMP_CWORD": "1"})
    assert "find" in words.stdout
