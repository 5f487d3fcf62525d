"""packfs pack --shard-size / --shards: a tree cut into complete archives and a
manifest; each shard opens alone, together they hold exactly the tree, the same
source gives the same bytes, and an interrupted pack leaves nothing."""

from __future__ import annotations

import io
import os
import signal
import stat as stat_module
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from packfs.core import Archive, open_archive
from packfs.core.manifest import parse_manifest
from packfs.errors import PackError
from packfs.ffrecord import FileReader
from packfs.format import S_IFDIR, S_IFMT, S_IFREG
from packfs.write.shards import ShardCutter, pack_shards
from tests.conftest import MTIME_NS, packfs_cli

ROOT = Path(__file__).resolve().parent.parent


def shard_contents(manifest: Path) -> tuple[dict[str, tuple], dict[str, list[tuple]]]:
    """(leaves, directories) of a set, checking each shard alone on the way: leaves
    (files by bytes, symlinks by target) by path, each in one shard only; every
    shard's copy of each directory."""
    records = parse_manifest(manifest.read_bytes(), str(manifest))
    leaves: dict[str, tuple] = {}
    directories: dict[str, list[tuple]] = {}
    for record in records:
        path = manifest.parent / record.file
        assert path.stat().st_size == record.size
        with Archive(path) as archive:
            assert archive.entry_count == record.entries
            archive.verify()
            for entry in range(archive.entry_count):
                name = os.fsdecode(archive.path_of(entry))
                info = archive.stat(entry)
                kind = info.mode & S_IFMT
                attributes = (info.mode, info.mtime_ns, info.uid, info.gid)
                if kind == S_IFDIR:
                    directories.setdefault(name, []).append(attributes)
                    continue
                assert name not in leaves, f"{name} in two shards"
                body = archive.read(entry) if kind == S_IFREG else archive.readlink(entry)
                leaves[name] = attributes + (body,)
        with FileReader(str(path)) as reader:  # FFRecord's reader: every record, CRCs checked
            assert reader.n > 0
            reader.read(list(range(reader.n)))
    return leaves, directories


def source_contents(root: Path) -> tuple[dict[str, tuple], dict[str, tuple]]:
    leaves: dict[str, tuple] = {}
    directories: dict[str, tuple] = {}
    info = os.lstat(root)
    directories[""] = (info.st_mode, info.st_mtime_ns, info.st_uid, info.st_gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            relative = os.path.relpath(path, root)
            info = os.lstat(path)
            attributes = (info.st_mode, info.st_mtime_ns, info.st_uid, info.st_gid)
            if stat_module.S_ISDIR(info.st_mode):
                directories[relative] = attributes
            elif stat_module.S_ISLNK(info.st_mode):
                leaves[relative] = attributes + (os.fsencode(os.readlink(path)),)
            else:
                leaves[relative] = attributes + (Path(path).read_bytes(),)
    return leaves, directories


def one_tree(manifest: Path) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """(leaves, directories) of the set read back as one tree (open_archive), walked
    from its root through the merged listings."""
    leaves: dict[str, tuple] = {}
    directories: dict[str, tuple] = {}
    with open_archive(manifest) as tree:
        pending = [0]
        while pending:
            entry = pending.pop()
            name = os.fsdecode(tree.path_of(entry))
            info = tree.stat(entry)
            attributes = (info.mode, info.mtime_ns, info.uid, info.gid)
            kind = info.mode & S_IFMT
            if kind == S_IFDIR:
                assert name not in directories
                directories[name] = attributes
                pending.extend(tree.children(entry))
            else:
                body = tree.read(entry) if kind == S_IFREG else tree.readlink(entry)
                leaves[name] = attributes + (body,)
    return leaves, directories


def assert_set_is_tree(manifest: Path, root: Path, whole_seconds: bool = False) -> None:
    """The set holds exactly the tree at ``root``, shard by shard and read back as
    one tree (``whole_seconds``: mtimes compared in seconds, as a tar keeps them)."""
    leaves, directories = shard_contents(manifest)
    want_leaves, want_directories = source_contents(root)
    merged_leaves, merged_directories = one_tree(manifest)
    assert merged_leaves == leaves
    assert merged_directories == {name: copies[0] for name, copies in directories.items()}
    if whole_seconds:
        def seconds(attributes: tuple) -> tuple:
            return (attributes[0], attributes[1] // 10**9) + attributes[2:]

        leaves = {name: seconds(value) for name, value in leaves.items()}
        want_leaves = {name: seconds(value) for name, value in want_leaves.items()}
        directories = {name: [seconds(copy) for copy in copies] for name, copies in directories.items()}
        want_directories = {name: seconds(value) for name, value in want_directories.items()}
    # An empty directory is a leaf of its shard; others are shared.
    for name, copies in directories.items():
        assert set(copies) == {want_directories[name]}, name
    assert set(directories) == set(want_directories)
    assert leaves == {name: value for name, value in want_leaves.items()}


def set_bytes(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


@pytest.fixture
def wide(tmp_path: Path) -> Path:
    """A directory of 40 files of 1-40 KiB (spanning shards), a nested one, an empty
    one, a symlink and a hard link whose names lie far apart."""
    root = tmp_path / "wide"
    (root / "many").mkdir(parents=True)
    for number in range(40):
        (root / "many" / f"f{number:03d}.bin").write_bytes(bytes([number]) * 1024 * (number + 1))
    (root / "many" / "sub").mkdir()
    (root / "many" / "sub" / "x.txt").write_bytes(b"x" * 3000)
    (root / "empty").mkdir()
    (root / "a-first.txt").write_bytes(b"linked" * 1000)
    os.link(root / "a-first.txt", root / "zz-last-link.txt")
    os.symlink("many/f001.bin", root / "link")
    os.chmod(root / "many", 0o750)
    os.chmod(root / "many" / "f003.bin", 0o600)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), ns=(MTIME_NS, MTIME_NS), follow_symlinks=False)
    os.utime(root / "many", ns=(MTIME_NS + 7, MTIME_NS + 7))
    return root


def test_shards_from_a_directory_hold_exactly_the_tree(wide: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    stats = pack_shards(wide, out / "data.ffr", shard_size=100 * 1024)
    assert len(stats.shards) > 5
    names = sorted(os.listdir(out))
    count = len(stats.shards)
    assert names == [f"data-{n:05d}-of-{count:05d}.ffr" for n in range(count)] + ["data.ffrset"]
    assert_set_is_tree(out / "data.ffrset", wide)
    # The directory "many" spans shards, each copy with the source's attributes.
    _, directories = shard_contents(out / "data.ffrset")
    assert len(directories["many"]) > 3
    assert stats.files == 43 and stats.hardlinks == 1 and stats.symlinks == 1


def test_a_shard_holds_files_until_the_next_would_pass_the_size(wide: Path, tmp_path: Path) -> None:
    size = 100 * 1024
    stats = pack_shards(wide, tmp_path / "data", shard_size=size)
    for record in stats.shards:
        with Archive(tmp_path / record.file) as archive:
            sizes = [archive.stat(entry).size for entry in range(archive.entry_count)
                     if archive.file_type(entry) == S_IFREG]
        assert sum(sizes) <= size or len(sizes) == 1


def test_a_file_larger_than_the_shard_size_gets_a_shard_of_its_own(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    (root / "a").write_bytes(b"a" * 100)
    (root / "b").write_bytes(b"b" * 10_000)
    (root / "c").write_bytes(b"c" * 100)
    stats = pack_shards(root, tmp_path / "s.ffr", shard_size=1000)
    assert [(record.first, record.last) for record in stats.shards] == [(b"a", b"a"), (b"b", b"b"), (b"c", b"c")]


def test_n_shards_of_about_equal_bytes(wide: Path, tmp_path: Path) -> None:
    stats = pack_shards(wide, tmp_path / "data.ffr", shards=4)
    assert len(stats.shards) == 4
    sizes = [record.size for record in stats.shards]
    assert max(sizes) < 1.5 * min(sizes)
    assert_set_is_tree(tmp_path / "data.ffrset", wide)


def test_fewer_files_than_shards_gives_fewer_shards(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    (root / "one").write_bytes(b"1" * 10)
    (root / "two").write_bytes(b"2" * 10)
    stats = pack_shards(root, tmp_path / "s.ffr", shards=8)
    assert [record.file for record in stats.shards] == ["s-00000-of-00002.ffr", "s-00001-of-00002.ffr"]


def test_an_empty_tree_gives_one_shard_holding_the_root(tmp_path: Path) -> None:
    root = tmp_path / "empty"
    root.mkdir()
    os.chmod(root, 0o711)
    stats = pack_shards(root, tmp_path / "e.ffr", shard_size=1 << 20)
    assert len(stats.shards) == 1 and stats.shards[0].entries == 1
    with Archive(tmp_path / stats.shards[0].file) as archive:
        assert archive.stat(0).mode == S_IFDIR | 0o711


def test_a_hard_link_across_shards_is_a_copy_and_within_one_a_link(wide: Path, tmp_path: Path) -> None:
    split = pack_shards(wide, tmp_path / "split.ffr", shard_size=50 * 1024)
    whole = pack_shards(wide, tmp_path / "whole.ffr", shard_size=1 << 30)
    holders = []
    for record in split.shards:
        with Archive(tmp_path / record.file) as archive:
            for name in (b"a-first.txt", b"zz-last-link.txt"):
                try:
                    entry = archive.lookup(name)
                except FileNotFoundError:
                    continue
                holders.append(record.file)
                assert archive.read(entry) == b"linked" * 1000 and archive.stat(entry).nlink == 1
    assert len(set(holders)) == 2
    with Archive(tmp_path / whole.shards[0].file) as archive:
        assert archive.stat(archive.lookup("zz-last-link.txt")).nlink == 2


def test_the_same_source_gives_the_same_bytes(wide: Path, tmp_path: Path) -> None:
    for attempt in ("one", "two"):
        (tmp_path / attempt).mkdir()
        pack_shards(wide, tmp_path / attempt / "d.ffr", shard_size=64 * 1024)
    assert set_bytes(tmp_path / "one") == set_bytes(tmp_path / "two")


def _tar(root: Path, out: Path, *options: str) -> Path:
    subprocess.run(["tar", "cf", str(out), *options, "-C", str(root), "."], check=True)
    return out


def test_shards_from_a_tar_file_hold_the_tree_and_repeat_exactly(wide: Path, tmp_path: Path) -> None:
    tar = _tar(wide, tmp_path / "t.tar")  # member order: the directory's, unsorted
    for attempt in ("one", "two"):
        (tmp_path / attempt).mkdir()
        pack_shards(tar, tmp_path / attempt / "t.ffr", shards=3)
    assert set_bytes(tmp_path / "one") == set_bytes(tmp_path / "two")
    assert len(os.listdir(tmp_path / "one")) == 4
    assert_set_is_tree(tmp_path / "one" / "t.ffrset", wide, whole_seconds=True)


def test_a_sorted_tar_stream_is_cut_as_it_is_read(wide: Path, tmp_path: Path) -> None:
    tar = _tar(wide, tmp_path / "t.tar", "--sort=name")
    with open(tar, "rb") as stream:
        stats = pack_shards("-", tmp_path / "s.ffr", shard_size=100 * 1024, stdin=stream)
    assert len(stats.shards) > 5
    assert_set_is_tree(tmp_path / "s.ffrset", wide, whole_seconds=True)
    with open(tar, "rb") as stream:
        result = subprocess.run([sys.executable, "-m", "packfs", "pack", "-", str(tmp_path / "c.ffr"),
                                 "--shard-size", "100K"], stdin=stream, capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "c.ffrset").exists() and "shards of" in result.stderr
    assert_set_is_tree(tmp_path / "c.ffrset", wide, whole_seconds=True)


def test_an_unsorted_tar_stream_is_refused_and_leaves_nothing(wide: Path, tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in ("b.txt", "a.txt"):
            info = tarfile.TarInfo(name)
            info.size = 5
            tar.addfile(info, io.BytesIO(b"12345"))
    out = tmp_path / "out"
    out.mkdir()
    buffer.seek(0)
    with pytest.raises(PackError, match="pack order.*--sort=name"):
        pack_shards("-", out / "s.ffr", shard_size=1, stdin=buffer)
    assert os.listdir(out) == []
    gz = tmp_path / "t.tgz"
    subprocess.run(["tar", "czf", str(gz), "-C", str(wide), "."], check=True)
    with pytest.raises(PackError, match="--shards needs the total"):
        pack_shards(gz, out / "g.ffr", shards=2)
    assert os.listdir(out) == []


def test_a_zip_gives_shards_in_pack_order(tmp_path: Path) -> None:
    import zipfile

    with zipfile.ZipFile(tmp_path / "z.zip", "w") as archive:
        for name in ("z/2.bin", "a/1.bin", "m.bin", "a/0.bin"):
            archive.writestr(name, name.encode() * 500)
    stats = pack_shards(tmp_path / "z.zip", tmp_path / "z.ffr", shards=4)
    assert [(record.first, record.last) for record in stats.shards] == [
        (b"a/0.bin", b"a/0.bin"), (b"a/1.bin", b"a/1.bin"), (b"m.bin", b"m.bin"), (b"z/2.bin", b"z/2.bin")]


def test_an_existing_set_is_kept_without_force_and_replaced_with_it(wide: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    pack_shards(wide, out / "d.ffr", shards=4)
    before = set_bytes(out)
    with pytest.raises(PackError, match="already exists"):
        pack_shards(wide, out / "d.ffr", shards=2)
    assert set_bytes(out) == before
    pack_shards(wide, out / "d.ffr", shards=2, force=True)
    assert sorted(os.listdir(out)) == ["d-00000-of-00002.ffr", "d-00001-of-00002.ffr", "d.ffrset"]


def test_the_cutter_never_cuts_before_the_first_file() -> None:
    cutter = ShardCutter(shards=3, total_bytes=300)
    assert [cutter.starts_shard(size) for size in (250, 25, 25)] == [False, True, False]  # 250: parts 0-1
    cutter = ShardCutter(shards=3, total_bytes=300)
    assert [cutter.starts_shard(size) for size in (100, 100, 100)] == [False, True, True]
    cutter = ShardCutter(shard_size=10)
    assert [cutter.starts_shard(size) for size in (4, 4, 4, 30, 1)] == [False, False, True, True, True]


# -- the command line ------------------------------------------------------------------


@pytest.mark.parametrize("options, message", [
    (["--shards", "0"], "0 is not a number of shards"),
    (["--shards", "-2"], "-2 is not a number of shards"),
    (["--shard-size", "0"], "is not a size"),
    (["--shard-size", "lots"], "is not a size"),
    (["--shards", "2", "--shard-size", "1M"], "cannot be used together"),
    (["--shards", "2", "--keep-going"], "--keep-going does not apply"),
    (["--shards", "2", "-j", "2"], "-j does not apply to a shard set"),
    (["--shard-size", "1M", "--jobs", "1"], "-j does not apply to a shard set"),
])
def test_bad_shard_options_are_usage_errors(wide: Path, tmp_path: Path, options: list[str], message: str) -> None:
    result = packfs_cli("pack", wide, tmp_path / "x.ffr", *options)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert not [name for name in os.listdir(tmp_path) if name != "wide"]


def test_the_cli_prints_one_line_for_the_set(wide: Path, tmp_path: Path) -> None:
    result = packfs_cli("pack", wide, tmp_path / "x.ffr", "--shard-size", "100K")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "shards of" in lines[0] and "x.ffrset" in lines[0]
    assert "packed 43 files" in lines[0]


# -- interrupted packs -----------------------------------------------------------------

# The CLI runs for real; its progress display sends the signal at the Nth chunk of
# data, when earlier shards are complete and one is half written.
_SIGNAL_MID_SET = """
import os, signal, sys
import packfs.cli
import packfs.cli.plumbing
seen = []
def advance(self, files, nbytes):
    seen.append(1)
    if len(seen) == {after}:
        os.kill(os.getpid(), {sig})
packfs.cli.plumbing.TerminalProgress.advance = advance
sys.argv = ["packfs"] + sys.argv[1:]
packfs.cli.main()
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize("after", [1, 30])
@pytest.mark.parametrize("source", ["dir", "tar"])
def test_a_signal_mid_set_exits_128_plus_it_and_leaves_nothing(wide: Path, tmp_path: Path, sig: int,
                                                               after: int, source: str) -> None:
    src = wide if source == "dir" else _tar(wide, tmp_path / "t.tar")
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run([sys.executable, "-c", _SIGNAL_MID_SET.format(sig=int(sig), after=after), "pack",
                             str(src), str(out / "x.ffr"), "--shard-size", "50K"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 128 + sig, result.stderr
    assert f"Interrupted by {signal.Signals(sig).name}" in result.stderr
    assert os.listdir(out) == []


def test_a_killed_packers_temporaries_go_with_the_next_pack(wide: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run([sys.executable, "-c", _SIGNAL_MID_SET.format(sig=int(signal.SIGKILL), after=30),
                             "pack", str(wide), str(out / "x.ffr"), "--shard-size", "50K"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == -signal.SIGKILL
    left = os.listdir(out)
    assert left and all(".packfs-tmp-" in name for name in left)  # no shard, no manifest under its name
    pack_shards(wide, out / "x.ffr", shard_size=50 * 1024)
    assert all(".packfs-tmp-" not in name for name in os.listdir(out))
    assert_set_is_tree(out / "x.ffrset", wide)


def test_a_failure_mid_set_leaves_nothing(wide: Path, tmp_path: Path) -> None:
    """A file that vanishes after the scan fails the pack when its shard is written,
    after earlier shards are complete: none of them is left."""

    class RemoveOneAfterTheScan:
        def start(self, files: int, nbytes: int) -> None:
            (wide / "many" / "f030.bin").unlink()

        def advance(self, files: int, nbytes: int) -> None:
            pass

    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(PackError, match="f030.bin"):
        pack_shards(wide, out / "x.ffr", shard_size=50 * 1024, progress=RemoveOneAfterTheScan())
    assert os.listdir(out) == []


def test_an_interruption_between_the_shards_and_the_manifest_leaves_nothing(
        wide: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shard already renamed into place when the interruption lands (as Ctrl-C
    would, before the manifest is written): all are removed."""
    import packfs.write.shards as shards

    def interrupted(directory: str) -> None:
        assert [name for name in os.listdir(directory) if name.endswith(".ffr")]
        raise KeyboardInterrupt

    monkeypatch.setattr(shards, "_fsync_directory", interrupted)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(KeyboardInterrupt):
        pack_shards(wide, out / "x.ffr", shard_size=50 * 1024)
    assert os.listdir(out) == []


def test_a_signal_as_the_manifest_lands_removes_the_whole_set(wide: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's handler (remove_unfinished, then the exception) just after the
    manifest's rename: the manifest goes with the shards, never the shards alone."""
    import packfs.write.shards as shards
    from packfs.write import remove_unfinished

    real = shards._rename

    def rename_then_signal(temporary: str, final: str, force: bool) -> None:
        real(temporary, final, force)
        if final.endswith(".ffrset"):
            remove_unfinished()
            raise KeyboardInterrupt

    monkeypatch.setattr(shards, "_rename", rename_then_signal)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(KeyboardInterrupt):
        pack_shards(wide, out / "x.ffr", shard_size=50 * 1024)
    assert os.listdir(out) == []
