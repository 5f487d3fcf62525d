"""unpack(): a faithful restore that never writes outside the destination."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

import packfs
from packfs import (ChecksumError, PackedFolder, PathNotFoundError, UnpackDamagedError, UnpackError, pack_entries,
                    pack_folder, unpack)
from packfs.cli import main
from tests.conftest import BLUEPRINT, HARDLINK, MTIME_NS, assert_same_tree, cli_runner, deep_scratch


def test_unpack_restores_the_tree(tree: Path, archive: Path, tmp_path: Path) -> None:
    with PackedFolder(archive) as folder:
        stats = unpack(folder, tmp_path / "out")
    assert_same_tree(tree, tmp_path / "out")
    assert os.stat(tmp_path / "out").st_mtime_ns == MTIME_NS
    assert stats.hardlinks == 1 and stats.symlinks == 5


def test_unpack_selected_paths(archive: Path, tmp_path: Path, tree: Path) -> None:
    with PackedFolder(archive) as folder:
        unpack(folder, tmp_path / "out", ["a/b", "hello.txt"])
    out = tmp_path / "out"
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "a", "a/b", "a/b/c", "a/b/c/deep.bin", "hello.txt"]
    assert (out / "a/b/c/deep.bin").read_bytes() == (tree / "a/b/c/deep.bin").read_bytes()


def test_unpack_never_overwrites(archive: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "hello.txt").write_bytes(b"mine")
    with PackedFolder(archive) as folder, pytest.raises(UnpackError, match="already exists"):
        unpack(folder, out, ["hello.txt"])
    assert (out / "hello.txt").read_bytes() == b"mine"


def test_unpack_does_not_follow_a_symlink_in_the_way(archive: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(outside, out / "a")  # a trap where the archive has the directory "a"
    with PackedFolder(archive) as folder, pytest.raises(UnpackError, match="non-directory is in the way"):
        unpack(folder, out, ["a"])
    assert list(outside.iterdir()) == []


def test_archive_symlinks_are_created_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    pack_entries([
        packfs.Entry("escape", kind="symlink", target=str(outside)),
        packfs.Entry("zz/file", b"data"),
    ], tmp_path / "s.ffr")
    with PackedFolder(tmp_path / "s.ffr") as folder:
        unpack(folder, tmp_path / "out")
    assert os.readlink(tmp_path / "out" / "escape") == str(outside)
    assert list(outside.iterdir()) == []


def test_read_only_directories_are_filled_before_their_mode_is_set(tmp_path: Path) -> None:
    pack_entries([packfs.Entry("ro", kind="dir", mode=0o555), packfs.Entry("ro/f", b"x")],
                 tmp_path / "r.ffr")
    with PackedFolder(tmp_path / "r.ffr") as folder:
        unpack(folder, tmp_path / "out")
    assert (tmp_path / "out/ro/f").read_bytes() == b"x"
    assert os.stat(tmp_path / "out/ro").st_mode & 0o777 == 0o555


@pytest.mark.parametrize("symlink_first", [True, False])
def test_a_hostile_archive_cannot_unpack_through_its_own_symlink(tmp_path: Path, symlink_first: bool) -> None:
    """A table (every CRC valid) with a symlink "a" -> outside and a directory "a" holding
    "x" in the same directory: unpack must neither follow the link it created nor write
    outside DEST, whichever of the two comes first."""
    from tests.conftest import rewrite_section

    outside = tmp_path / "outside"
    outside.mkdir()
    link, directory = ("a", "b") if symlink_first else ("b", "a")
    pack_entries([packfs.Entry(f"{directory}/x", b"payload"),
                  packfs.Entry(link, kind="symlink", target=str(outside))], tmp_path / "ok.ffr")
    # Root's children are named "a" and "b" (names section starts b"ab"); rename "b" to "a".
    bad = rewrite_section(tmp_path / "ok.ffr", tmp_path / "bad.ffr", "names",
                          lambda names: names.__setitem__(1, ord("a")))
    with PackedFolder(bad) as folder:
        with pytest.raises(UnpackError):
            unpack(folder, tmp_path / "out")
        assert not folder.verify().ok  # duplicate names, and a path hash that no longer matches
    assert list(outside.iterdir()) == []


# -- damage: unpack everything intact, report every damaged path ---------------------------



DAMAGED = ["a/b/c/deep.bin", "big/large.bin", "hello.txt"]  # hello.txt has the hard link hardlink.txt


def _damage(archive: Path, out: Path, paths: list[str]) -> Path:
    """A copy of ``archive`` with one bit flipped in the middle of each file's record
    (as tests/test_corruption.py does)."""
    data = bytearray(archive.read_bytes())
    with PackedFolder(archive) as folder:
        for path in paths:
            start, end = folder.archive.extent(folder.archive.find(os.fsencode(path)))
            data[start + (end - start) // 2] ^= 0x01
    out.write_bytes(bytes(data))
    return out


def _all_paths(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _check_intact(out: Path, tree: Path, left_out: set[str]) -> None:
    """Everything but ``left_out`` is in ``out`` as in ``tree``; nothing else is, no
    temporary file included."""
    expected = [p for p in _all_paths(tree) if p not in left_out]
    assert _all_paths(out) == expected
    for relative, contents in BLUEPRINT.items():
        if contents is not None and relative not in left_out:
            assert (out / relative).read_bytes() == contents, relative


def test_unpack_goes_past_damaged_files_and_reports_each(archive: Path, tree: Path, tmp_path: Path) -> None:
    bad = _damage(archive, tmp_path / "bad.ffr", DAMAGED)
    seen: list[tuple[str, str]] = []
    with PackedFolder(bad) as folder:
        with pytest.raises(UnpackDamagedError) as caught:
            unpack(folder, tmp_path / "out", on_damaged=lambda path, why: seen.append((path, why)))
    error = caught.value
    assert isinstance(error, ChecksumError) and isinstance(error, UnpackError)
    damaged = sorted(DAMAGED + [HARDLINK[0]])  # the hard link shares hello.txt's record
    assert sorted(error.stats.damaged) == sorted(seen) == [(p, "checksum mismatch") for p in damaged]
    assert error.stats.skipped == 4
    assert "4 damaged files" in str(error) and "12 of 16 unpacked" in str(error)
    # 7 of the 11 files written, every symlink; no damaged file, whole or in part.
    assert (error.stats.files, error.stats.symlinks, error.stats.hardlinks) == (7, 5, 0)
    _check_intact(tmp_path / "out", tree, set(damaged))


def test_stop_on_error_stops_at_the_first_damaged_file(archive: Path, tmp_path: Path) -> None:
    bad = _damage(archive, tmp_path / "bad.ffr", DAMAGED)
    first = "'a/b/c/deep.bin': checksum mismatch"
    with PackedFolder(bad) as folder, pytest.raises(ChecksumError, match=first) as caught:
        unpack(folder, tmp_path / "out", stop_on_error=True)
    assert not isinstance(caught.value, UnpackDamagedError)
    assert not (tmp_path / "out/a/b/c/deep.bin").exists()
    assert not (tmp_path / "out/hello.txt").exists()  # never reached
    assert not [p for p in _all_paths(tmp_path / "out") if ".packfs-unpack-" in p]


def test_a_file_appears_under_its_name_only_once_written_and_checked(archive: Path, tmp_path: Path) -> None:
    """Written under a temporary name and published whole: killed (here: interrupted)
    in the middle of a file, unpack leaves neither the file nor the temporary one."""
    out = tmp_path / "out"
    written = []

    def progress(nbytes: int) -> None:
        written.append(nbytes)
        if sum(written) > 1 << 20:  # inside big/large.bin, after its first chunk
            assert not (out / "big" / "large.bin").exists()
            assert [p.name for p in (out / "big").iterdir()][0].startswith(".packfs-unpack-")
            raise KeyboardInterrupt

    with PackedFolder(archive) as folder, pytest.raises(KeyboardInterrupt):
        unpack(folder, out, ["big"], progress=progress)
    assert list((out / "big").iterdir()) == []


def test_a_damaged_first_name_of_a_hard_link_group(tmp_path: Path) -> None:
    """The first name is damaged: every name of the group is reported (the record is
    read once) and none is written; another group still links."""
    pack_entries([packfs.Entry("a/first", b"shared bytes"), packfs.Entry("b/second", kind="hardlink", target="a/first"),
                  packfs.Entry("c/third", kind="hardlink", target="a/first"),
                  packfs.Entry("d/x", b"other"), packfs.Entry("e/y", kind="hardlink", target="d/x")],
                 tmp_path / "h.ffr")
    bad = _damage(tmp_path / "h.ffr", tmp_path / "bad.ffr", ["a/first"])
    with PackedFolder(bad) as folder, pytest.raises(UnpackDamagedError) as caught:
        unpack(folder, tmp_path / "out")
    stats = caught.value.stats
    assert [path for path, _ in stats.damaged] == ["a/first", "b/second", "c/third"]
    assert (stats.files, stats.hardlinks) == (1, 1)
    out = tmp_path / "out"
    assert not any((out / p).exists() for p in ("a/first", "b/second", "c/third"))
    assert os.stat(out / "d/x").st_ino == os.stat(out / "e/y").st_ino


def test_unpack_cli_lists_damage_and_exits_1(archive: Path, tree: Path, tmp_path: Path) -> None:
    bad = _damage(archive, tmp_path / "bad.ffr", DAMAGED)
    out = tmp_path / "out"
    result = cli_runner().invoke(main, ["unpack", str(bad), str(out)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    lines = result.stderr.splitlines()
    assert lines[:4] == [f"damaged: {p} (checksum mismatch)" for p in
                         ["a/b/c/deep.bin", "big/large.bin", "hardlink.txt", "hello.txt"]]
    assert lines[4].startswith("unpacked 7 files, 8 dirs, 5 symlinks")
    assert lines[4].endswith("; skipped 4 damaged files")
    assert lines[5].startswith("Error: 4 damaged files in ") and "12 of 16 unpacked" in lines[5]
    assert len(lines) == 6 and "Traceback" not in result.output
    _check_intact(out, tree, {"a/b/c/deep.bin", "big/large.bin", "hardlink.txt", "hello.txt"})
    # -q: the damage and the error, no summary.
    quiet = cli_runner().invoke(main, ["unpack", "-q", str(bad), str(tmp_path / "q")])
    assert quiet.exit_code == 1 and len(quiet.stderr.splitlines()) == 5
    stopped = cli_runner().invoke(main, ["unpack", "--stop-on-error", str(bad), str(tmp_path / "s")])
    assert stopped.exit_code == 1
    assert stopped.stderr.splitlines() == [f"Error: {str(bad)!r}: 'a/b/c/deep.bin': checksum mismatch; "
                                           f"the damaged file was not unpacked"]
    debug = cli_runner().invoke(main, ["--debug", "unpack", str(bad), str(tmp_path / "d")])
    assert type(debug.exception).__name__ == "UnpackDamagedError"


@pytest.mark.parametrize("call", ["open", "symlink"])
def test_an_interrupt_as_a_temporary_file_is_created_leaves_nothing(archive: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     call: str) -> None:
    """Ctrl-C in a program that calls unpack, landing as the system call that created
    the temporary file (or symlink) returns: before the `try` that would remove it, in
    the code before this fix.  Its name was known before it existed, so it goes."""
    from packfs.write import temporaries

    real = getattr(os, call)
    created = []

    def interrupted(*args: object, **kwargs: object) -> object:
        result = real(*args, **kwargs)
        name = args[1] if call == "symlink" else args[0]
        if isinstance(name, bytes) and name.startswith(b".packfs-unpack-"):
            created.append(name)
            assert any(path == name for _, path in temporaries._UNFINISHED)  # known from the start
            raise KeyboardInterrupt
        return result

    monkeypatch.setattr(os, call, interrupted)
    with PackedFolder(archive) as folder, pytest.raises(KeyboardInterrupt):
        unpack(folder, tmp_path / "out")
    monkeypatch.undo()
    assert created
    assert not [p for p in _all_paths(tmp_path / "out") if ".packfs-unpack-" in p]
    assert not temporaries._UNFINISHED


def test_temporary_files_abandoned_by_a_killed_unpack_go_and_a_live_ones_stay(archive: Path, tree: Path,
                                                                              tmp_path: Path) -> None:
    """What kill -9 left (its process gone; or named by a packfs before issue 22, with no
    pid; or the same pid as this process, not registered by it: a container's pid) is
    removed by the next unpack into that directory; a live process's temporary file, and
    a user's file that only looks alike, stay."""
    out = tmp_path / "out"
    with PackedFolder(archive) as folder:
        unpack(folder, out)
    dead = subprocess.Popen(["true"])
    dead.wait()
    live = subprocess.Popen(["sleep", "60"])
    try:
        left = {out / f".packfs-unpack-{dead.pid}-0123456789ab": False,
                out / "a" / ".packfs-unpack-0123456789ab": False,  # before issue 22
                out / "a" / "b" / f".packfs-unpack-{os.getpid()}-00000000beef": False,
                out / "big" / f".packfs-unpack-{live.pid}-0123456789ab": True,
                out / "a" / ".packfs-unpack-notes.txt": True}
        for path in left:
            path.write_bytes(b"")
        with PackedFolder(archive) as folder:
            stats = unpack(folder, out, skip_existing=True)
        assert stats.files == 0 and stats.existing == 16
        assert {path: path.exists() for path in left} == left
    finally:
        live.kill()
        live.wait()


# -- resuming: --skip-existing -------------------------------------------------------------


def test_a_rerun_resumes_with_skip_existing(archive: Path, tree: Path, tmp_path: Path) -> None:
    bad = _damage(archive, tmp_path / "bad.ffr", DAMAGED)
    out = tmp_path / "out"
    with PackedFolder(bad) as folder:
        with pytest.raises(UnpackDamagedError):
            unpack(folder, out)
        # Without skip_existing a rerun stops at the first file already there, naming the way out.
        with pytest.raises(UnpackError, match=r"already exists \(unpack never overwrites; .*--skip-existing"):
            unpack(folder, out)
        with pytest.raises(UnpackDamagedError) as caught:
            unpack(folder, out, skip_existing=True)  # the same damage, nothing else to do
        assert caught.value.stats.existing == 12 and caught.value.stats.files == 0
    with PackedFolder(archive) as folder:  # a sound copy fills in what was missing
        stats = unpack(folder, out, skip_existing=True)
        assert (stats.files, stats.hardlinks, stats.existing) == (3, 1, 12)
        assert stats.skipped == 0
    assert_same_tree(tree, out)
    result = cli_runner().invoke(main, ["unpack", "--skip-existing", str(archive), str(out)])
    assert result.exit_code == 0, result.output
    assert "unpacked 0 files" in result.stderr and "16 already there, left as they were" in result.stderr


def test_skip_existing_never_overwrites_or_follows(archive: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"precious")
    with PackedFolder(archive) as folder:
        unpack(folder, out, ["hello.txt", "a", "Zeta.txt", "link-to-hello"])
        (out / "hello.txt").write_bytes(b"my own!  ..")  # another size
        different = r"'hello.txt'.*a different file is in the way \(11 bytes, the archive's has 12"
        with pytest.raises(UnpackError, match=different):
            unpack(folder, out, ["hello.txt"], skip_existing=True)
        assert (out / "hello.txt").read_bytes() == b"my own!  .."
        (out / "hello.txt").write_bytes(b"my own!  ...")  # same size, another mtime
        with pytest.raises(UnpackError, match="modification time differs"):
            unpack(folder, out, ["hello.txt"], skip_existing=True)
        assert (out / "hello.txt").read_bytes() == b"my own!  ..."
        (out / "Zeta.txt").unlink()
        os.symlink(outside / "victim", out / "Zeta.txt")  # a trap where the archive has a file
        with pytest.raises(UnpackError, match="a symlink is in the way, where the archive has a file"):
            unpack(folder, out, ["Zeta.txt"], skip_existing=True)
        (out / "link-to-hello").unlink()
        os.symlink("elsewhere", out / "link-to-hello")
        with pytest.raises(UnpackError, match="a symlink to somewhere else is in the way"):
            unpack(folder, out, ["link-to-hello"], skip_existing=True)
        os.unlink(out / "a/b/c/deep.bin")
        os.rmdir(out / "a/empty_nested")
        (out / "a/empty_nested").write_bytes(b"file where a dir goes")
        with pytest.raises(UnpackError, match="non-directory is in the way"):
            unpack(folder, out, ["a"], skip_existing=True)
    assert (outside / "victim").read_bytes() == b"precious" and os.listdir(outside) == ["victim"]
    assert os.readlink(out / "Zeta.txt") == str(outside / "victim")


# -- PATHS are checked first; a DEST made for nothing is removed -----------------------------


def test_missing_paths_are_refused_before_anything_is_created(archive: Path, tmp_path: Path) -> None:
    out = tmp_path / "new" / "out"
    with PackedFolder(archive) as folder:
        with pytest.raises(PathNotFoundError, match="'nope'"):
            unpack(folder, out, ["hello.txt", "nope"])
        with pytest.raises(packfs.NotADirectoryPathError):
            unpack(folder, out, ["a", "hello.txt/x"])
    assert not (tmp_path / "new").exists()
    result = cli_runner().invoke(main, ["unpack", str(archive), str(out), "a", "nope"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [f"Error: 'nope': no such file or directory in {str(archive)!r}"]
    assert not (tmp_path / "new").exists()


def test_a_dest_left_empty_by_an_error_is_removed_unless_it_was_there(tmp_path: Path) -> None:
    pack_entries([packfs.Entry("only", b"the one file")], tmp_path / "one.ffr")
    bad = _damage(tmp_path / "one.ffr", tmp_path / "bad.ffr", ["only"])
    with PackedFolder(bad) as folder:
        with pytest.raises(UnpackDamagedError):
            unpack(folder, tmp_path / "made/for/it")
        assert not (tmp_path / "made").exists()
        (tmp_path / "mine").mkdir()
        with pytest.raises(UnpackDamagedError):
            unpack(folder, tmp_path / "mine")
        assert (tmp_path / "mine").is_dir()


def test_overlapping_paths_unpack_once(archive: Path, tmp_path: Path) -> None:
    with PackedFolder(archive) as folder:
        stats = unpack(folder, tmp_path / "out", ["a", "a/b/c", "a/", "./a/b"])
        assert _all_paths(tmp_path / "out") == ["a", "a/b", "a/b/c", "a/b/c/deep.bin", "a/dirlink",
                                                "a/empty_nested", "a/link-up"]
        assert stats.files == 1
        stats = unpack(folder, tmp_path / "all", ["a", "", "hello.txt"])
        assert stats.files == 10 and stats.hardlinks == 1


# -- depth: no recursion, no path longer than one name, bounded descriptors -----------------

DEPTH = 10_000


def _open_beneath(root: Path, parts: list[bytes]) -> int:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for part in parts:
        below = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        os.close(fd)
        fd = below
    return fd


@pytest.fixture
def deep_dir() -> Iterator[Path]:
    """Where the deep trees go: not pytest's tmp_path, where removing them cost 50-60 s."""
    with deep_scratch("packfs-deep-unpack-") as path:
        yield path


def test_a_tree_10000_levels_deep_unpacks_with_few_descriptors(deep_dir: Path) -> None:
    """Paths of 20,000 bytes (PATH_MAX is 4,096), ten times Python's recursion limit in
    levels, with ulimit -n at 256; hard links whose first name's directory is no longer
    open, both above and beside."""
    import resource

    deep = "/".join(["d"] * DEPTH)
    pack_entries([
        packfs.Entry("d/top", b"near the top"),
        packfs.Entry(f"{deep}/leaf", b"at the bottom"),
        packfs.Entry(f"{deep}/link", kind="symlink", target="leaf"),
        packfs.Entry(f"{deep}/up", kind="hardlink", target="d/top"),  # d's descriptor is long closed
        packfs.Entry("e/down", kind="hardlink", target=f"{deep}/leaf"),  # deep's directories are done
        packfs.Entry("d/ro", kind="dir", mode=0o555),
    ], deep_dir / "deep.ffr")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
    try:
        with PackedFolder(deep_dir / "deep.ffr") as folder:
            stats = unpack(folder, deep_dir / "out")
            assert (stats.dirs, stats.files, stats.hardlinks, stats.symlinks) == (DEPTH + 3, 2, 2, 1)
            again = unpack(folder, deep_dir / "out", skip_existing=True)
            assert again.existing == 5 and again.files == 0
            alone = unpack(folder, deep_dir / "alone", [f"{deep}/leaf"])
            assert alone.files == 1 and alone.dirs == 0
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    out = deep_dir / "out"
    bottom = _open_beneath(out, [b"d"] * DEPTH)
    try:
        leaf = os.stat("leaf", dir_fd=bottom)
        assert os.readlink("link", dir_fd=bottom) == "leaf"
        assert os.stat("up", dir_fd=bottom).st_ino == os.stat(out / "d/top").st_ino
        assert leaf.st_ino == os.stat(out / "e/down").st_ino and leaf.st_nlink == 2
    finally:
        os.close(bottom)
    assert os.stat(out / "d/ro").st_mode & 0o777 == 0o555
    bottom = _open_beneath(deep_dir / "alone", [b"d"] * DEPTH)
    try:
        assert os.listdir(bottom) == ["leaf"]
    finally:
        os.close(bottom)


def test_an_existing_dest_keeps_its_owner_and_mode(tmp_path: Path) -> None:
    """The archive's root attributes (another owner, 0777) are not applied to a DEST
    that was there before: unpacked into /tmp by root, they would take it over."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"x")
    os.chmod(src, 0o777)
    if os.geteuid() == 0:
        os.chown(src, 1234, 1234)
    archive = tmp_path / "a.ffr"
    pack_folder(src, archive)
    dest = tmp_path / "dest"
    dest.mkdir()
    os.chmod(dest, 0o1755)
    before = os.stat(dest)
    with PackedFolder(archive) as folder:
        unpack(folder, dest)
    after = os.stat(dest)
    assert (after.st_mode, after.st_uid, after.st_gid) == (before.st_mode, before.st_uid, before.st_gid)
    assert (dest / "f").read_bytes() == b"x"
    # A resume finishes DEST's mtime (which the unpack that made DEST could not set
    # before it was stopped), never its owner or mode.
    os.unlink(dest / "f")
    with PackedFolder(archive) as folder:
        unpack(folder, dest, skip_existing=True)
    after = os.stat(dest)
    assert (after.st_mode, after.st_uid, after.st_gid) == (before.st_mode, before.st_uid, before.st_gid)
    assert after.st_mtime_ns == os.stat(src).st_mtime_ns
    # A DEST that unpack creates is the archive's root, attributes and all.
    with PackedFolder(archive) as folder:
        unpack(folder, tmp_path / "new")
    assert os.stat(tmp_path / "new").st_mode & 0o7777 == 0o777
