"""pack_folder and pack_entries: what is kept, what is refused, atomicity."""

from __future__ import annotations

import io
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

import packfs
from packfs import Entry, PackError, PackedFolder, pack_entries, pack_folder
from tests.conftest import BLUEPRINT, HARDLINK, MTIME_NS, NON_UTF8, SYMLINKS, make_tree, time_limit


def test_round_trip_every_file_and_attribute(tree: Path, archive: Path) -> None:
    with PackedFolder(archive) as folder:
        for dirpath, dirnames, filenames in os.walk(tree):
            for name in dirnames + filenames:
                path = Path(dirpath) / name
                relative = str(path.relative_to(tree))
                info = os.lstat(path)
                stat = folder.stat(relative)
                assert stat.mode == info.st_mode, relative
                assert stat.mtime_ns == info.st_mtime_ns == MTIME_NS
                assert (stat.uid, stat.gid) == (info.st_uid, info.st_gid)
                if path.is_symlink():
                    assert folder.readlink(relative) == os.readlink(path)
                    assert stat.size == len(os.fsencode(os.readlink(path)))
                elif path.is_file():
                    assert folder.read(relative) == path.read_bytes()
                    assert stat.size == info.st_size
                    assert stat.nlink == info.st_nlink
        assert folder.stat("").mtime_ns == MTIME_NS


def test_names_are_kept_as_exact_bytes(folder: PackedFolder, tree: Path) -> None:
    assert NON_UTF8 in folder.list()
    assert folder.read(NON_UTF8) == b"\x00\x01\x02"
    assert folder.read(os.fsencode(NON_UTF8)) == b"\x00\x01\x02"
    assert folder.list() == sorted(os.listdir(tree), key=os.fsencode)


def test_empty_directories_are_kept(folder: PackedFolder) -> None:
    assert folder.list("empty_dir") == []
    assert folder.stat("empty_dir").permissions == 0o700
    assert folder.list("a/empty_nested") == []


def test_hard_links_are_stored_once(folder: PackedFolder) -> None:
    table = folder.archive._table
    first = table.lookup(HARDLINK[0].encode())
    second = table.lookup(HARDLINK[1].encode())
    assert table.record(first) == table.record(second)
    assert folder.stat(HARDLINK[0]).nlink == 2


def test_symlinks_are_not_followed_by_default(folder: PackedFolder) -> None:
    for link, target in SYMLINKS.items():
        assert folder.is_symlink(link)
        assert folder.readlink(link) == target


def test_follow_symlinks_stores_the_targets(tree: Path, tmp_path: Path) -> None:
    (tree / "dangling").unlink()
    (tree / "absolute").unlink()
    out = tmp_path / "followed.ffr"
    pack_folder(tree, out, follow_symlinks=True)
    with PackedFolder(out) as folder:
        assert not folder.is_symlink("link-to-hello")
        assert folder.read("link-to-hello") == b"hello world\n"
        assert folder.is_dir("a/dirlink")
        assert folder.read("a/dirlink/c/deep.bin") == BLUEPRINT["a/b/c/deep.bin"]


def test_symlink_loop_is_skipped_with_a_warning(tmp_path: Path, caplog) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    os.symlink("..", src / "d" / "up")
    with caplog.at_level(logging.WARNING, logger="packfs"):
        pack_folder(src, tmp_path / "o.ffr", follow_symlinks=True)
    assert "symlink loop" in caplog.text


def test_special_files_are_skipped_and_named(tmp_path: Path, caplog) -> None:
    src = make_tree(tmp_path / "src")
    os.mkfifo(src / "a-fifo")  # opening it would hang the packer
    with caplog.at_level(logging.WARNING, logger="packfs"):
        stats = pack_folder(src, tmp_path / "o.ffr")
    assert f"skipped {str(src / 'a-fifo')!r}: a FIFO" in caplog.text
    assert stats.skipped == (packfs.SkippedPath(str(src / "a-fifo"), "a FIFO", failed=False),)
    assert stats.failed == ()
    assert not PackedFolder(tmp_path / "o.ffr").exists("a-fifo")


def test_exclude_globs(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.ffr"
    pack_folder(tree, out, exclude=["*.txt", "big"])
    with PackedFolder(out) as folder:
        assert not folder.exists("hello.txt")
        assert not folder.exists("données/été.txt")
        assert not folder.exists("big")
        assert folder.exists("a/b/c/deep.bin")


def _git_tree(root: Path) -> Path:
    """A project with a .git directory, a nested one, a worktree's .git file, and build
    as a directory and as a file."""
    for path in (".git/objects/ab", "sub/.git", "worktree", "build/obj", "src/build"):
        (root / path).mkdir(parents=True)
    (root / ".git" / "objects" / "ab" / "cd").write_bytes(b"object")
    (root / "sub" / ".git" / "HEAD").write_bytes(b"ref")
    (root / "worktree" / ".git").write_bytes(b"gitdir: ../.git/worktrees/w")
    (root / "build" / "obj" / "a.o").write_bytes(b"o")
    (root / "src" / "build" / "b.o").write_bytes(b"o")
    (root / "build.sh").write_bytes(b"#!/bin/sh")
    (root / "main.c").write_bytes(b"int main;")
    return root


@pytest.mark.parametrize("patterns, left_out", [
    ([".git"], [".git", "sub/.git", "worktree/.git"]),  # a name: anywhere (unchanged)
    (["./.git"], [".git"]),                              # tar: from the top only
    (["/.git"], [".git"]),                               # rsync: from the top only
    (["{src}/.git"], [".git"]),                          # an absolute path inside SRC
    (["{link}/.git"], [".git"]),                         # ... reached through a symlink
    (["{src}/sub/.git/"], ["sub/.git"]),
    ([".git/"], [".git", "sub/.git"]),                   # rsync: directories only, not the worktree's file
    (["./build/"], ["build"]),
    (["build/"], ["build", "src/build"]),
    (["build*"], ["build", "build.sh", "src/build"]),
    (["./src/build/*.o"], ["src/build/b.o"]),
    (["././main.c", "./sub//"], ["main.c", "sub"]),
])
def test_exclude_as_tar_and_rsync_users_write_it(tmp_path: Path, patterns: list[str], left_out: list[str],
                                                 caplog) -> None:
    src = _git_tree(tmp_path / "project")
    os.symlink(src, tmp_path / "link")
    patterns = [p.format(src=src, link=tmp_path / "link") for p in patterns]
    everything = _all_paths(src)
    with caplog.at_level(logging.WARNING, logger="packfs"):
        pack_folder(src, tmp_path / "x.ffr", exclude=patterns)
    assert caplog.text == ""  # every pattern excluded something
    with PackedFolder(tmp_path / "x.ffr") as folder:
        kept = set(folder.list(recursive=True))
    gone = everything - kept
    assert {path for path in gone if not any(path.startswith(top + "/") for top in gone)} == set(left_out)


def _all_paths(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*")}


def test_a_pattern_that_excludes_nothing_is_warned_about(tmp_path: Path, caplog) -> None:
    src = _git_tree(tmp_path / "project")
    patterns = [".gti", "/etc/passwd", "main.c/", "build", "build/obj"]  # the last: inside what build left out
    with caplog.at_level(logging.WARNING, logger="packfs"):
        pack_folder(src, tmp_path / "x.ffr", exclude=patterns)
    assert [record.getMessage() for record in caplog.records] == [
        f"exclude pattern {pattern!r} excluded nothing in {str(src)!r}"
        for pattern in (".gti", "/etc/passwd", "main.c/", "build/obj")]
    with PackedFolder(tmp_path / "x.ffr") as folder:
        assert folder.exists("main.c") and not folder.exists("build")


@pytest.mark.parametrize("pattern", [".", "./", "{src}", "{src}/", "/"])
def test_a_pattern_for_the_packed_directory_itself_is_refused(tmp_path: Path, pattern: str) -> None:
    src = _git_tree(tmp_path / "project")
    with pytest.raises(ValueError, match="names the directory being packed itself"):
        pack_folder(src, tmp_path / "x.ffr", exclude=[pattern.format(src=src)])
    assert not (tmp_path / "x.ffr").exists()


def test_output_inside_source_is_not_packed_into_itself(tree: Path) -> None:
    out = tree / "self.ffr"
    pack_folder(tree, out)
    pack_folder(tree, out, force=True)
    with PackedFolder(out) as folder:
        assert not folder.exists("self.ffr")
        assert not any(".packfs-tmp-" in name for name in folder.list())


def test_packing_is_deterministic(tree: Path, tmp_path: Path) -> None:
    pack_folder(tree, tmp_path / "one.ffr")
    pack_folder(tree, tmp_path / "two.ffr")
    assert (tmp_path / "one.ffr").read_bytes() == (tmp_path / "two.ffr").read_bytes()


def test_records_are_in_depth_first_order(folder: PackedFolder) -> None:
    order = []
    for relative in folder:
        order.append((folder.archive._table.record(folder.archive.find(os.fsencode(relative))), relative))
    records = [record for record, _ in order]
    # Files listed depth-first (with hard links pointing back) appear in record order.
    firsts = [r for i, r in enumerate(records) if r not in records[:i]]
    assert firsts == sorted(firsts)


def test_archive_is_an_ffrecord_container(archive: Path, tree: Path) -> None:
    reader = packfs.RecordReader(archive)
    assert reader.read_one(0) == (tree / "-leading-dash").read_bytes()  # first in byte order


def test_existing_output_is_refused_untouched(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.ffr"
    out.write_bytes(b"precious")
    with pytest.raises(PackError, match="already exists; use --force"):
        pack_folder(tree, out)
    assert out.read_bytes() == b"precious"


def test_source_must_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(PackError, match="is not a directory"):
        pack_folder(tmp_path / "f", tmp_path / "o.ffr")


class _Interrupt:
    """A progress object that raises after some files, as Ctrl-C would."""

    def __init__(self, after: int, error: BaseException) -> None:
        self.after, self.error, self.seen = after, error, 0

    def start(self, total_files: int, total_bytes: int) -> None:
        pass

    def advance(self, files: int, nbytes: int) -> None:
        self.seen += files
        if self.seen >= self.after:
            raise self.error


@pytest.mark.parametrize("error", [KeyboardInterrupt(), PackError("disk on fire")])
def test_interrupted_pack_leaves_nothing(tree: Path, tmp_path: Path, error: BaseException) -> None:
    out = tmp_path / "out" / "x.ffr"
    out.parent.mkdir()
    with pytest.raises(type(error)):
        pack_folder(tree, out, progress=_Interrupt(3, error))
    assert os.listdir(out.parent) == []
    out.write_bytes(b"old")
    with pytest.raises(type(error)):
        pack_folder(tree, out, force=True, progress=_Interrupt(3, error))
    assert os.listdir(out.parent) == ["x.ffr"] and out.read_bytes() == b"old"


def test_killed_pack_leaves_old_output_and_a_recognisable_temporary(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.ffr"
    out.write_bytes(b"old")
    script = (
        "import os, signal, packfs\n"
        "class P:\n"
        "    def start(self, *a): pass\n"
        "    def advance(self, *a): os.kill(os.getpid(), signal.SIGKILL)\n"
        f"packfs.pack_folder({str(tree)!r}, {str(out)!r}, force=True, progress=P())\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent.parent)
    assert result.returncode == -signal.SIGKILL
    assert out.read_bytes() == b"old"
    leftovers = [name for name in os.listdir(tmp_path) if name != "x.ffr" and name != "src"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".x.ffr.packfs-tmp-")
    # The next pack of the same output removes the dead packer's temporary file.
    pack_folder(tree, out, force=True)
    assert sorted(os.listdir(tmp_path)) == ["src", "x.ffr"]
    assert PackedFolder(out).read("hello.txt") == b"hello world\n"


def test_vanished_file_is_an_error(tree: Path, tmp_path: Path) -> None:
    class Vanish:
        def start(self, *args: int) -> None:
            (tree / "with space.txt").unlink()

        def advance(self, *args: int) -> None:
            pass

    with pytest.raises(PackError, match="with space.txt': vanished while packing; nothing was written"):
        pack_folder(tree, tmp_path / "x.ffr", progress=Vanish())
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_large_files_are_streamed_in_bounded_memory(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "big.bin", "wb") as f:
        for _ in range(64):
            f.write(os.urandom(1 << 20))
    tracemalloc.start()
    pack_folder(src, tmp_path / "big.ffr")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8 << 20  # a 64 MiB file, never more than a few 1 MiB buffers
    with PackedFolder(tmp_path / "big.ffr") as folder:
        assert folder.read_view("big.bin") == (src / "big.bin").read_bytes()


# -- pack_entries ----------------------------------------------------------------------


def test_pack_entries_builds_an_archive_without_a_tree(tmp_path: Path) -> None:
    entries = [
        Entry("train/cat/1.jpg", b"cat", mtime_ns=5, mode=0o640, uid=7, gid=8),
        Entry("train/dog/1.jpg", io.BytesIO(b"dog")),
        Entry("train/dog/2.jpg", lambda: io.BytesIO(b"dog2")),
        Entry("/labels.txt", b"cat\ndog\n"),
        Entry("empty", kind="dir"),
        Entry("latest", kind="symlink", target="train/dog/2.jpg"),
        Entry("alias.jpg", kind="hardlink", target="train/cat/1.jpg"),
    ]
    stats = pack_entries(entries, tmp_path / "e.ffr")
    assert (stats.files, stats.symlinks, stats.hardlinks) == (5, 1, 1)
    with PackedFolder(tmp_path / "e.ffr") as folder:
        assert folder.read("train/cat/1.jpg") == b"cat" == folder.read("alias.jpg")
        assert folder.read("latest") == b"dog2"
        assert folder.list("train") == ["cat", "dog"]
        stat = folder.stat("train/cat/1.jpg")
        assert (stat.permissions, stat.uid, stat.gid, stat.mtime_ns, stat.nlink) == (0o640, 7, 8, 5, 2)
        # A hard link is another name of its file: the table stores the file's
        # attributes under it too (it had the Entry's own defaults: uid 0, mtime 0).
        stored = {item.name: item[1:] for item in folder.list_attributes(recursive=True)}
        assert stored[b"alias.jpg"] == stored[b"train/cat/1.jpg"]
        assert folder.stat("train").permissions == 0o755  # created implicitly


def test_pack_entries_from_a_generator_spools(tmp_path: Path) -> None:
    def entries():
        for i in range(50):
            yield Entry(f"d{i % 5}/f{i}.bin", os.urandom(i))

    pack_entries(entries(), tmp_path / "g.ffr")
    with PackedFolder(tmp_path / "g.ffr") as folder:
        assert folder.num_files() == 50
        assert len(folder.read("d4/f49.bin")) == 49
    assert sorted(os.listdir(tmp_path)) == ["g.ffr"]


def test_pack_entries_with_a_count_larger_than_needed(tmp_path: Path) -> None:
    pack_entries(iter([Entry("a", b"1"), Entry("d", kind="dir")]), tmp_path / "c.ffr", count=10)
    assert PackedFolder(tmp_path / "c.ffr").read("a") == b"1"
    with pytest.raises(PackError, match="more files"):
        pack_entries(iter([Entry("a", b"1"), Entry("b", b"2")]), tmp_path / "d.ffr", count=1)
    assert not (tmp_path / "d.ffr").exists()


@pytest.mark.parametrize(
    "entries, message",
    [
        ([Entry("a", b"1"), Entry("a", b"2")], "duplicate path 'a'"),
        ([Entry("a/../b", b"1")], "component '..'"),
        ([Entry("a/./b", b"1")], "component '.'"),
        ([Entry("a", b"1"), Entry("a/b", b"2")], "not a directory"),
        ([Entry("l", kind="symlink")], "has no target"),
        ([Entry("h", kind="hardlink", target="nothing")], "not an earlier file entry"),
        ([Entry("f", b"abc", size=4)], "changed size"),
        ([Entry("d/" + "n" * 256, b"1")], "a name of 256 bytes, expected at most 255"),
        ([Entry("x" * 300 + "/f", b"1")], "a name of 300 bytes, expected at most 255"),
        ([Entry("d", kind="dir"), Entry("d/" + "é" * 128, b"1")], "a name of 256 bytes"),  # bytes, not characters
    ],
)
def test_pack_entries_rejects(tmp_path: Path, entries, message: str) -> None:
    with pytest.raises(PackError, match=message):
        pack_entries(entries, tmp_path / "bad.ffr")
    assert os.listdir(tmp_path) == []


def test_a_name_of_255_bytes_is_packed(tmp_path: Path) -> None:
    name = "é" * 127 + "x"  # 255 bytes of UTF-8
    pack_entries([Entry(f"d/{name}", b"1")], tmp_path / "ok.ffr")
    with packfs.PackedFolder(tmp_path / "ok.ffr") as folder:
        assert folder.read(f"d/{name}") == b"1" and folder.verify().ok


# -- faults while packing: a clear error, and OUT untouched or absent ----------------------


def _leftovers(directory: Path, keep: set[str]) -> list[str]:
    return sorted(set(os.listdir(directory)) - keep)


def test_unreadable_source_file_as_an_unprivileged_user(tmp_path: Path) -> None:
    """A file the packer may not read is a PackError naming it (run as nobody when the
    tests run as root, since root reads anything)."""
    import importlib
    import tempfile

    importlib.import_module("packfs.core.tablebuild")  # the child, as nobody, may not be able to import it

    work = Path(tempfile.mkdtemp(prefix="packfs-unreadable-"))
    try:
        os.chmod(work, 0o777)
        src = work / "src"
        (src / "d").mkdir(parents=True)
        (src / "d" / "ok.txt").write_bytes(b"fine")
        (src / "d" / "secret.bin").write_bytes(b"hidden")
        os.chmod(src / "d" / "secret.bin", 0o000)
        for directory in (src, src / "d"):
            os.chmod(directory, 0o755)
        out_dir = work / "out"
        out_dir.mkdir(mode=0o777)
        os.chmod(out_dir, 0o777)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child packs as an unprivileged user
            status = 4
            try:
                os.close(read_end)
                if os.geteuid() == 0:
                    os.setgroups([])
                    os.setgid(65534)
                    os.setuid(65534)
                pack_folder(src, out_dir / "x.ffr")
                status = 0
            except PackError as error:
                os.write(write_end, str(error).encode())
                status = 3
            finally:
                os._exit(status)
        os.close(write_end)
        message = os.read(read_end, 4096).decode()
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 3, message
        assert "secret.bin" in message and "Permission denied" in message, message
        assert os.listdir(out_dir) == []  # no archive, no temporary file
    finally:
        os.chmod(work / "src" / "d" / "secret.bin", 0o600)
        shutil.rmtree(work)


def test_full_disk_is_a_clear_error_and_leaves_nothing(tree: Path, tmp_path: Path) -> None:
    """ENOSPC on a 1 MiB tmpfs (mounting one needs root)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a 1 MiB tmpfs")
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True)
    try:
        (small / "x.ffr").write_bytes(b"old")
        with pytest.raises(PackError, match="No space left on device"):
            pack_folder(tree, small / "x.ffr", force=True)  # the tree holds a 3 MiB file
        assert os.listdir(small) == ["x.ffr"] and (small / "x.ffr").read_bytes() == b"old"
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_file_size_limit_is_a_clear_error_and_leaves_nothing(tree: Path, tmp_path: Path) -> None:
    """RLIMIT_FSIZE: the write fails with EFBIG (Python ignores SIGXFSZ), the CLI says so."""
    import resource

    out_dir = tmp_path / "out"
    out_dir.mkdir()

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    result = subprocess.run([sys.executable, "-m", "packfs", "pack", str(tree), str(out_dir / "x.ffr")],
                            capture_output=True, text=True, preexec_fn=limit, cwd=Path(__file__).parent.parent)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("Error: ") and "File too large" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert os.listdir(out_dir) == []


def test_sigint_during_pack_leaves_the_old_output(tmp_path: Path) -> None:
    """Ctrl-C in the middle of `packfs pack --force`: the old archive is untouched and
    the temporary file is gone."""
    src = tmp_path / "src"
    for i in range(4000):
        (src / f"d{i % 20}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 20}" / f"{i}.bin").write_bytes(os.urandom(30_000))
    out = tmp_path / "x.ffr"
    out.write_bytes(b"old")
    process = subprocess.Popen([sys.executable, "-m", "packfs", "pack", "--force", str(src), str(out)],
                               stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent)
    deadline = time.monotonic() + time_limit(30)
    while not [n for n in os.listdir(tmp_path) if ".packfs-tmp-" in n] and time.monotonic() < deadline:
        time.sleep(0.005)  # wait until it is writing
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=time_limit(60))
    assert process.returncode == 128 + signal.SIGINT, stderr  # 130, as Unix tools exit
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == f"Interrupted by SIGINT: {str(out)!r} not written", stderr
    assert out.read_bytes() == b"old"
    assert _leftovers(tmp_path, {"src", "x.ffr"}) == []


def test_a_discarded_record_leaves_nothing_of_itself(tmp_path: Path) -> None:
    """ContainerWriter.discard_record: what pack uses to read a changing file again."""
    import zlib

    from packfs import RecordReader
    from packfs.format import PIECE_SIZE, header_size
    from packfs.write import ContainerWriter

    out = tmp_path / "r.ffr"
    first, again, last = os.urandom(2 * PIECE_SIZE + 5), os.urandom(PIECE_SIZE + 3), b"last"
    with ContainerWriter(out, 2, pieces=True) as writer:
        writer.begin_record()
        writer.write(first)
        writer.discard_record()
        with pytest.raises(ValueError, match="begin_record"):
            writer.discard_record()
        writer.begin_record()
        writer.write(again[:100])
        assert writer.record_crc == zlib.crc32(again[:100])
        writer.write(again[100:])
        assert writer.end_record() == 0
        records, starts, crcs = writer.piece_table()
        assert list(records) == [0] and list(starts) == [0, 2]
        assert list(crcs) == [zlib.crc32(again[:PIECE_SIZE]), zlib.crc32(again[PIECE_SIZE:])]
        writer.write_record(last)
        writer.commit()
    assert out.stat().st_size == header_size(2) + len(again) + len(last)  # no tail of the first copy
    with RecordReader(out, check_data=True) as reader:
        assert reader[:] == [again, last]
