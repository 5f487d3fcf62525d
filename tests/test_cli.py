"""The CLI through click's CliRunner: exit codes, one-line errors, output."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from packfs import PackedFolder, pack_folder
from packfs.cli import main
from tests.conftest import BLUEPRINT, NON_UTF8, VECTORS, cli_runner, damaged_copy, time_limit


@pytest.fixture
def run():
    runner = cli_runner()

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


def test_pack_exclude_forms_and_the_warning(run, tree: Path, tmp_path: Path) -> None:
    result = run("pack", "--exclude", "./a/", "--exclude", f"{tree}/hello.txt", "--exclude", "*.gti",
                 tree, tmp_path / "x.ffr")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == f"Warning: exclude pattern '*.gti' excluded nothing in {str(tree)!r}"
    folder = PackedFolder(tmp_path / "x.ffr")
    assert not folder.exists("a") and not folder.exists("hello.txt") and folder.exists("big/large.bin")
    result = run("pack", "--exclude", "./", tree, tmp_path / "y.ffr")
    assert result.exit_code == 2 and "Invalid value for '--exclude'" in result.stderr
    assert "names the directory being packed itself" in result.stderr


@pytest.mark.parametrize("option", [["-L"], ["--exclude", "a"], ["-k"], ["--keep-going"]])
def test_pack_options_for_a_directory_are_usage_errors_for_a_tar(run, tree: Path, tmp_path: Path,
                                                                  option: list[str]) -> None:
    import tarfile

    with tarfile.open(tmp_path / "t.tar", "w") as tar:
        tar.add(tree / "hello.txt", "hello.txt")
    result = run("pack", *option, tmp_path / "t.tar", tmp_path / "t.ffr")
    assert result.exit_code == 2
    assert "-L, --exclude and --keep-going apply to a directory SRC only" in result.stderr
    assert not (tmp_path / "t.ffr").exists()


def test_pack_warns_about_special_files(run, tree: Path, tmp_path: Path) -> None:
    os.mkfifo(tree / "pipe")
    result = run("pack", tree, tmp_path / "x.ffr")
    assert result.exit_code == 0  # a FIFO is no failure: archives hold none
    lines = result.stderr.splitlines()
    assert lines[0] == f"skipped: {tree / 'pipe'} (a FIFO)"
    assert lines[1].startswith("packed 11 files") and lines[1].endswith("; skipped 1 path, each listed above")


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
    assert "format version  1.4" in text and "files" in text and "MiB" in text
    data = json.loads(run("info", "--json", archive).stdout)
    assert data["files"] == 11 and data["symlinks"] == 5 and data["format_version"] == "1.4"
    assert data["largest_files"][:2] == [{"path": "big/large.bin", "size": 3 * (1 << 20) + 17},
                                         {"path": "a/b/c/deep.bin", "size": 768}]
    assert "largest files" in text and "3.0 MiB  big/large.bin" in text


def test_verify(run, archive: Path, tmp_path: Path) -> None:
    result = run("verify", archive)
    assert result.exit_code == 0 and result.stdout.startswith("OK: ")
    bad = damaged_copy(archive, tmp_path / "bad.ffr", b"Zeta.txt")
    result = run("verify", bad)
    assert result.exit_code == 1
    assert "damaged: Zeta.txt" in result.stdout
    assert "Error:" in result.stderr and "1 file fails its checksum" in result.stderr


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
    _one_line_error(run("ls", junk), f"{str(junk)!r} is a text file, not a packfs archive")
    _one_line_error(run("ls", VECTORS / "records.ffr"), "not a packfs archive")
    _one_line_error(run("verify", VECTORS / "corrupt_header.ffr"), "header checksum mismatch")


def test_usage_errors_exit_2(run, tmp_path: Path) -> None:
    # A missing archive is not a usage mistake: one "Error:" line and exit 1.
    assert run("ls", tmp_path / "missing.ffr").exit_code == 1
    assert run("pack").exit_code == 2
    assert run("frobnicate").exit_code == 2


def test_an_unquoted_glob_is_a_usage_error_that_says_to_quote_it(tmp_path: Path) -> None:
    from tests.conftest import packfs_cli

    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(3):
        src = tmp_path / f"src{i}"
        src.mkdir()
        (src / f"part{i}.txt").write_text(f"part {i}\n")
        pack_folder(src, shards / f"part-{i}.ffr")
    expanded = sorted(str(path) for path in shards.glob("*.ffr"))  # what `packfs ls shards/*.ffr` runs
    quoted = f"'{shards}/*.ffr'"
    for args, example in ((["ls", *expanded], f"packfs ls {quoted}"),
                          (["mount", *expanded, tmp_path / "mnt"], f"packfs mount {quoted} {tmp_path / 'mnt'}")):
        result = packfs_cli(*args)
        assert result.returncode == 2 and "Usage: packfs" in result.stderr, result.stderr
        error = result.stderr.strip().splitlines()[-1]
        assert error.startswith("Error: Got unexpected extra argument"), error
        assert "Did the shell expand a glob into these 3 files?  Quote it" in error and error.endswith(example)
    listed = packfs_cli("ls", f"{shards}/*.ffr")  # quoted: packfs opens the set
    assert listed.returncode == 0 and listed.stdout.split() == ["part0.txt", "part1.txt", "part2.txt"]
    # Extra words that are not files: click's message alone.
    plain = packfs_cli("ls", expanded[0], "x", "y")
    assert plain.returncode == 2 and "glob" not in plain.stderr and "unexpected extra argument (y)" in plain.stderr


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


# -- progress ----------------------------------------------------------------------------
# pack_entries' and convert's reporting is tested here, beside the bar it feeds.


class _Recorder:
    """A PackProgress that keeps every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def start(self, total_files: int, total_bytes: int) -> None:
        self.calls.append(("start", total_files, total_bytes))

    def advance(self, files: int, nbytes: int) -> None:
        self.calls.append(("advance", files, nbytes))

    def file_sizes(self) -> list[int]:
        """The bytes told between one file's end (advance(1, 0)) and the next."""
        sizes, pending = [], 0
        for call, files, nbytes in self.calls:
            if call == "advance":
                pending += nbytes
                if files:
                    sizes.append(pending)
                    pending = 0
        return sizes

    def phases(self) -> list[tuple[tuple[int, int] | None, int, int]]:
        """(totals given to start, files advanced, bytes advanced) for each phase."""
        phases: list[tuple[tuple[int, int] | None, int, int]] = []
        for call, files, nbytes in self.calls:
            if call == "start" or not phases:
                phases.append(((files, nbytes) if call == "start" else None, 0, 0))
            if call == "advance":
                totals, done_files, done_bytes = phases[-1]
                phases[-1] = (totals, done_files + files, done_bytes + nbytes)
        return phases


def _tar_of(tree: Path, out: Path, flags: str = "cf") -> Path:
    subprocess.run(["tar", flags, str(out), "-C", str(tree), "."], check=True)
    return out


def test_pack_entries_reports_each_file_and_the_spooled_totals(tmp_path: Path) -> None:
    from packfs import Entry, pack_entries

    def entries() -> list[Entry]:
        return [Entry("a/one", b"one"), Entry("a/two", lambda: io.BytesIO(b"two!")), Entry("d", kind="dir"),
                Entry("link", kind="symlink", target="a/one"), Entry("again", kind="hardlink", target="a/one"),
                Entry("empty", b"")]

    known = _Recorder()
    stats = pack_entries(entries(), tmp_path / "list.ffr", progress=known)
    # With the count known nothing is spooled: the caller gives the totals; bytes are
    # told as they are written, and each file at its end.
    assert known.calls == [("advance", 0, 3), ("advance", 1, 0), ("advance", 0, 4), ("advance", 1, 0),
                           ("advance", 0, 0), ("advance", 1, 0)]
    assert known.file_sizes() == [3, 4, 0]
    assert stats.file_bytes == 7
    spooled = _Recorder()
    pack_entries(iter(entries()), tmp_path / "spooled.ffr", progress=spooled)
    assert spooled.calls[0] == ("start", 3, 7)
    assert spooled.phases() == [((3, 7), 3, 7)]


def test_convert_reports_the_legacy_archives_totals(tmp_path: Path) -> None:
    from packfs import PackedFolder, convert

    legacy = VECTORS / "packed_folder.ffr"
    with PackedFolder(legacy) as folder:
        files, file_bytes = folder.info()["files"], folder.info()["file_bytes"]
        sizes = sorted(folder.stat(path).size for path in folder.list(recursive=True, list_dir=False))
    progress = _Recorder()
    stats = convert(legacy, tmp_path / "native.ffr", progress=progress)
    assert progress.phases() == [((files, file_bytes), files, file_bytes)]
    assert (stats.files, stats.file_bytes) == (files, file_bytes)
    assert sorted(progress.file_sizes()) == sizes


@pytest.mark.parametrize("kind", ["tar", "tar.gz", "zip", "stdin", "stdin-file"])
def test_pack_archive_reports_the_input_read_then_the_spooled_files(tree: Path, tmp_path: Path, kind: str) -> None:
    import zipfile

    from packfs.write import pack_archive

    stdin = None
    if kind == "zip":
        source = tmp_path / "tree.zip"
        with zipfile.ZipFile(source, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(tree.rglob("*")):
                if path.is_file() and not path.is_symlink() and path.name != NON_UTF8:  # zip names are UTF-8
                    archive.write(path, path.relative_to(tree))
    else:
        source = _tar_of(tree, tmp_path / f"tree.{kind}", "czf" if kind == "tar.gz" else "cf")
    size = source.stat().st_size
    if kind == "stdin":
        stdin = io.BytesIO(source.read_bytes())  # no file descriptor: a size unknown, as for a pipe
    elif kind == "stdin-file":
        stdin = open(source, "rb")  # `packfs pack - out < file`: the size is known
    progress = _Recorder()
    try:
        stats = pack_archive("-" if stdin is not None else str(source), tmp_path / "out.ffr", stdin=stdin,
                             progress=progress)
    finally:
        if stdin is not None:
            stdin.close()
    phases = progress.phases()
    (total_files, total_bytes), files, input_bytes = phases[0]
    assert (total_files, total_bytes, files) == (0, 0 if kind == "stdin" else size, 0)
    # Reads are counted, seeks are not: a few blocks of the input may go unread or be
    # read twice (a zip's end record), never more.
    assert abs(input_bytes - size) < 16 << 10, (input_bytes, size)
    if kind in ("tar", "zip"):  # written straight from the input, no spool
        assert len(phases) == 1
    else:
        written = stats.files - stats.hardlinks
        assert phases[1:] == [((written, stats.file_bytes), written, stats.file_bytes)]


def test_no_progress_bar_when_stderr_is_not_a_terminal(run, tree: Path, tmp_path: Path) -> None:
    tarball = _tar_of(tree, tmp_path / "tree.tar")
    commands = {
        "converted": ("convert", VECTORS / "packed_folder.ffr", tmp_path / "c.ffr"),
        "packed": ("pack", tarball, tmp_path / "t.ffr"),
    }
    for summary, args in commands.items():
        result = run(*args)
        assert result.exit_code == 0, result.output
        assert result.stderr.startswith(summary) and result.stderr.count("\n") == 1, result.stderr
        assert "\r" not in result.stderr and "%" not in result.stderr
        assert run(*args[:1], "-q", "--force", *args[1:]).stderr == ""
    result = run("pack", "-", tmp_path / "s.ffr", input=tarball.read_bytes())
    assert result.exit_code == 0 and result.stderr.startswith("packed") and "\r" not in result.stderr
    assert run("pack", "-q", "-", tmp_path / "q.ffr", input=tarball.read_bytes()).stderr == ""


def test_terminal_progress_with_an_unknown_total_and_a_restart(capsys: pytest.CaptureFixture[str]) -> None:
    from packfs.cli.plumbing import TerminalProgress as _TerminalProgress

    progress = _TerminalProgress("packing")
    progress.enabled = True  # as on a terminal
    progress.start(0, 0)
    assert capsys.readouterr().err == ""
    progress.advance(0, 2048)
    line = capsys.readouterr().err
    # No rate in the first second: a rate over a few milliseconds is noise.
    assert line == "\rpacking  2.0 KiB" and "%" not in line and "ETA" not in line
    progress.start(2, 100)  # a second phase: drawn at once, counted from zero
    line = capsys.readouterr().err
    assert "0.0%  0/2 files  0 B/100 B" in line and "ETA" not in line
    assert (progress.files, progress.bytes) == (0, 0)
    progress.advance(2, 150)  # input counted by reads may overshoot the size a little
    assert "100.0%  2/2 files" in capsys.readouterr().err
    progress.close()
    blank = capsys.readouterr().err
    assert blank.startswith("\r") and blank.endswith("\r") and not blank.strip()


def test_terminal_progress_shows_a_rate_and_eta_only_after_a_second(capsys: pytest.CaptureFixture[str]) -> None:
    """The first line once said "ETA 109950 s": a rate from the first milliseconds."""
    from packfs.cli.plumbing import TerminalProgress as _TerminalProgress

    progress = _TerminalProgress("packing")
    progress.enabled = True
    progress.start(1, 100 << 20)
    progress.advance(0, 1024)
    first = capsys.readouterr().err
    assert "ETA" not in first and "/s" not in first
    progress.started -= 2.0  # as if two seconds had passed
    progress._drawn = 0.0
    progress.advance(0, 50 << 20)
    later = capsys.readouterr().err
    assert "MiB/s" in later and "ETA 2 s" in later


def test_forced_progress_into_a_pipe_is_lines_a_second_apart_then_the_whole_runs_rate(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """--progress where stderr is no terminal (a job's log): newline-ended lines, never
    redrawn with \\r, at most one a second; the last one with the whole run's rate."""
    import types

    from packfs.cli import plumbing
    from packfs.cli.plumbing import TerminalProgress as _TerminalProgress

    # The progress line's clock, set by the test: a loaded machine's milliseconds
    # between two calls made the rate 24.9 MiB/s, not 25.0.
    now = [1000.0]
    monkeypatch.setattr(plumbing, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    progress = _TerminalProgress("unpacking", force=True)
    assert progress.enabled and progress.lines  # capsys' stderr is no terminal
    progress.start(0, 100 << 20)
    progress.advance(0, 1 << 20)
    progress.advance(0, 1 << 20)  # within the same second: no second line
    first = capsys.readouterr().err
    assert first == "unpacking   1.0%  1.0 MiB/100.0 MiB\n"
    now[0] += 2.0  # two seconds pass
    progress.advance(0, 48 << 20)
    later = capsys.readouterr().err
    assert later.startswith("unpacking  50.0%  50.0 MiB/100.0 MiB  25.0 MiB/s  ETA 2 s") and later.count("\n") == 1
    progress.close()  # before a warning: nothing to blank between lines
    assert capsys.readouterr().err == ""
    progress.advance(0, 50 << 20)
    progress.finish()
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("unpacking 100.0%  100.0 MiB/100.0 MiB  ") and "MiB/s  in 2.0 s" in last
    assert "ETA" not in last and "\r" not in last
    progress.finish()  # once only
    assert capsys.readouterr().err == ""


def test_progress_option_in_a_pipe_and_quiet(run, archive: Path, tmp_path: Path) -> None:
    for args in (("verify", archive), ("unpack", archive, tmp_path / "out")):
        plain = run(*args)
        assert plain.exit_code == 0 and "%" not in plain.stderr  # a pipe: no progress unless asked
        forced = run(args[0], "--progress", *args[1:-1], str(args[-1]) + ("2" if args[0] == "unpack" else ""))
        assert forced.exit_code == 0, forced.output
        label = "verifying" if args[0] == "verify" else "unpacking"
        lines = [line for line in forced.stderr.splitlines() if line.startswith(label)]
        assert lines and lines[-1].startswith(f"{label} 100.0%") and "/s  in " in lines[-1], forced.stderr
        assert "\r" not in forced.stderr and "fetched" not in forced.stderr  # a local archive fetches nothing
    quiet = run("unpack", "-q", "--progress", archive, tmp_path / "out3")
    assert quiet.stderr.startswith("unpacking ") and "unpacked" not in quiet.stderr  # progress, no summary


def test_verify_progress_ends_at_100_percent_of_the_archive(run, tmp_path: Path) -> None:
    # Many small files: the header is a tenth of the archive.  verify once counted only
    # the records, so its last line said 89.4% (99.9% on a large archive).
    src = tmp_path / "small"
    src.mkdir()
    for i in range(50):
        (src / f"f{i}.txt").write_text(f"file {i}\n")
    archive = tmp_path / "small.ffr"
    assert run("pack", "-q", src, archive).exit_code == 0
    size = archive.stat().st_size
    record_file = VECTORS / "records.ffr"
    for path in (archive, record_file):
        result = run("verify", "--progress", path)
        assert result.exit_code == 0, result.output
        last = [line for line in result.stderr.splitlines() if line.startswith("verifying")][-1]
        assert last.startswith("verifying 100.0%  "), result.stderr
    report = json.loads(run("verify", "--json", archive).stdout)
    assert report["bytes_checked"] == size  # the header counts as checked, as the progress does


def test_info_prints_the_fetch_and_cache_counters_a_source_keeps() -> None:
    from packfs.cli.reading import _fetch_counts

    assert _fetch_counts({}) == {}  # a local archive
    remote = {"requests": 3, "bytes_fetched": 4096, "retries": 0, "page_cache_hits": 1}
    assert _fetch_counts(remote) == {"requests": 3, "fetched_bytes": 4096}
    cached = {**remote, "cache_hits": 5, "cache_misses": 2, "cache_waits": 1, "readahead_bytes": 8 << 20}
    assert _fetch_counts(cached) == {"requests": 3, "fetched_bytes": 4096, "cache_hits": 5, "cache_misses": 2,
                                     "cache_waits": 1, "readahead_bytes": 8 << 20}


def test_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    import pty
    import select

    from tests.conftest import REPO

    try:
        master, terminal = pty.openpty()
    except OSError as error:
        pytest.skip(f"no pseudo-terminal: {error}")
    out = tmp_path / "native.ffr"
    process = subprocess.Popen([sys.executable, "-m", "packfs", "convert", str(VECTORS / "packed_folder.ffr"),
                                str(out)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=terminal, cwd=REPO)
    os.close(terminal)
    shown = b""
    try:
        while select.select([master], [], [], 60)[0]:  # a hang guard, not a speed check
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the command exited and closed the terminal
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(master)
        process.wait(timeout=time_limit(60))
    assert process.returncode == 0, shown
    text = shown.decode().replace("\r\n", "\n")  # the terminal's own line ends
    bar, _, summary = text.rpartition("\r")
    assert "\rconverting " in bar and "%" in bar and "files" in bar, text
    assert bar.endswith(" ") and not bar.rpartition("\r")[2].strip()  # blanked before the summary
    assert summary.startswith("converted 9 files"), text


def test_counts_are_plural_only_when_they_should_be(run, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_bytes(b"x")
    (src / "l").symlink_to("d/f")
    os.mkfifo(src / "pipe")
    out = tmp_path / "one.ffr"
    packed = run("pack", src, out)
    assert packed.exit_code == 0, packed.output
    # What was skipped is named: each in a warning, then counted with its noun.
    assert f"skipped: {src / 'pipe'} (a FIFO)" in packed.stderr
    assert "packed 1 file, 2 dirs, 1 symlink (1 B)" in packed.stderr
    assert packed.stderr.rstrip().endswith("; skipped 1 path, each listed above")
    unpacked = run("unpack", out, tmp_path / "dest")
    assert unpacked.stderr.startswith("unpacked 1 file, 2 dirs, 1 symlink (1 B)")
    converted = run("convert", VECTORS / "packed_empty_folder.ffr", tmp_path / "converted.ffr")
    assert converted.stderr.startswith("converted 0 files, 1 dir, 0 symlinks (0 B)"), converted.stderr
    assert run("verify", out).stdout.startswith("OK: 1 file, 1 symlink and the path table, ")


def test_verify_and_info_speak_of_files_not_records(run, archive: Path, tmp_path: Path) -> None:
    verified = run("verify", archive)
    assert verified.stdout.startswith("OK: 11 files, 5 symlinks and the path table, "), verified.stdout
    assert "record" not in verified.stdout
    bad = damaged_copy(archive, tmp_path / "bad.ffr", b"a/b/c/deep.bin")
    result = run("verify", bad)
    assert result.exit_code == 1 and result.stdout == "damaged: a/b/c/deep.bin\n"
    assert result.stderr == f"Error: {str(bad)!r} is damaged: 1 file fails its checksum (listed above)\n"
    linked = damaged_copy(archive, tmp_path / "linked.ffr", b"hello.txt")  # and its hard link
    result = run("verify", linked)
    assert result.stdout == "damaged: hardlink.txt\ndamaged: hello.txt\n"
    assert result.stderr.endswith(" is damaged: 2 files fail their checksums (listed above)\n")
    info = run("info", archive)
    assert "records" not in info.stdout and "files           11" in info.stdout.splitlines()
    assert json.loads(run("info", "--json", archive).stdout)["records"] > 11  # the container's, for scripts


def test_verify_json(run, archive: Path, tmp_path: Path) -> None:
    sound = run("verify", "--json", archive)
    assert sound.exit_code == 0 and sound.stderr == ""
    report = json.loads(sound.stdout)
    assert report["ok"] is True and report["kind"] == "packfs archive" and report["path"] == str(archive)
    assert (report["files_checked"], report["symlinks_checked"]) == (11, 5)
    assert report["damaged_paths"] == report["damaged_records"] == report["problems"] == []
    assert report["bytes_checked"] > 3 << 20 and report["records_checked"] > 11
    bad = damaged_copy(archive, tmp_path / "bad.ffr", NON_UTF8.encode("utf-8", "surrogateescape"))
    damaged = run("verify", "--json", bad)
    assert damaged.exit_code == 1
    assert damaged.stderr == f"Error: {str(bad)!r} is damaged: 1 file fails its checksum\n"
    report = json.loads(damaged.stdout)
    assert report["ok"] is False and len(report["damaged_records"]) == 1
    assert [os.fsencode(path) for path in report["damaged_paths"]] == [os.fsencode(NON_UTF8)]


def test_verify_json_of_record_files(run) -> None:
    sound = json.loads(run("verify", "--json", VECTORS / "records.ffr").stdout)
    assert sound["ok"] is True and sound["kind"] == "FFRecord record file" and sound["records_checked"] == 5
    result = run("verify", "--json", VECTORS / "corrupt_payload.ffr")
    report = json.loads(result.stdout)
    assert result.exit_code == 1 and report["damaged_records"] == [2] and report["damaged_paths"] == []
    assert report["problems"] == ["record 2 fails its checksum"]
