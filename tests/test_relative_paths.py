"""Archives, shard-set manifests, lists and globs named by relative paths (issue 33):
every command, PackedFolder and open_archive, and a real mount, before and after
``packfs append``, run from a working directory other than the archives', and, in
process, used after the working directory changed (as a mount's daemon changes to
``/``).  A shard set opens its shards when first used, so where they are must be known
when the set is opened."""

from __future__ import annotations

import errno
import json
import os
import pickle
from pathlib import Path
from typing import NamedTuple

import pytest

import packfs
from packfs.core import open_archive
from packfs.format import S_IFDIR
from tests.conftest import TEST_BINDING, cli_runner, mounted, packfs_cli

IMGS = {"a/f1.jpg": b"a1", "a/f2.jpg": b"a2" * 300, "a/f3.jpg": b"a3", "b/f1.jpg": b"b1" * 500, "b/f2.jpg": b"b2",
        "b/sub/f3.jpg": b"b3"}
# Appended: a range (a/e.jpg .. c/new.jpg) overlapping the packed shards' ranges, so
# the set has two layers (served by the Python daemon) and a/ merges two shards' files.
MORE = {"a/e.jpg": b"ae", "a/z.jpg": b"az", "c/new.jpg": b"new"}
KINDS = ("archive", "list", "glob", "manifest")


class Layout(NamedTuple):
    root: Path  # the working directory the relative paths are relative to
    elsewhere: Path  # another directory, below neither the archives nor the sources
    files: dict[str, bytes]  # what each set holds

    def spec(self, kind: str) -> str | list[str]:
        """The relative name of each kind of thing to open."""
        if kind == "archive":
            return "shards/one.ffr"
        if kind == "manifest":
            return "shards/train.ffrset"
        if kind == "glob":
            return "shards/train-*.ffr"
        return sorted(str(path.relative_to(self.root)) for path in (self.root / "shards").glob("train-*.ffr"))

    def expected(self, kind: str) -> dict[str, bytes]:
        return IMGS if kind == "archive" else self.files


def _write(root: Path, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)


@pytest.fixture(scope="module", params=["packed", "appended"])
def layout(request, tmp_path_factory: pytest.TempPathFactory) -> Layout:
    """The issue's steps, every path relative: ``pack data/imgs shards/train.ffr
    --shard-size``, a lone archive beside it, and for "appended" ``append
    shards/train.ffrset data/more`` (made once for the module: the tests only read)."""
    tmp_path = tmp_path_factory.mktemp(request.param)
    _write(tmp_path / "data" / "imgs", IMGS)
    _write(tmp_path / "data" / "more", MORE)
    (tmp_path / "shards").mkdir()
    (tmp_path / "elsewhere").mkdir()
    for args in (("pack", "data/imgs", "shards/train.ffr", "--shard-size", "600"),
                 ("pack", "data/imgs", "shards/one.ffr")):
        result = packfs_cli(*args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    files = dict(IMGS)
    if request.param == "appended":
        result = packfs_cli("append", "shards/train.ffrset", "data/more", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        files.update(MORE)
    layout = Layout(tmp_path, tmp_path / "elsewhere", files)
    with open_archive(str(tmp_path / "shards" / "train.ffrset")) as opened:
        assert opened.shard_count >= 3 and opened.layer_count == (2 if request.param == "appended" else 1)
    return layout


@pytest.mark.parametrize("kind", KINDS)
def test_a_relative_spec_reads_after_the_working_directory_changes(layout: Layout, kind: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(layout.root)
    spec = layout.spec(kind)
    expected = layout.expected(kind)
    with open_archive(spec) as archive, packfs.PackedFolder(spec) as folder:
        monkeypatch.chdir(layout.elsewhere)  # nothing of the set read yet but what opening reads
        root = archive.lookup("")
        assert root == 0 and archive.file_type(root) == S_IFDIR
        assert archive.find(b"") == 0 and archive.stat(0).mode & S_IFDIR
        for path, data in expected.items():
            assert archive.read_path(path) == data
            assert folder.read(path) == data
        walked = {f"{top}/{name}" if top else name for top, _, names in folder.walk() for name in names}
        assert walked == set(expected)
        assert not folder.verify().problems


@pytest.mark.parametrize("kind", KINDS)
def test_a_folder_and_a_dataset_pickled_after_a_change_of_directory_reopen_the_same(
        layout: Layout, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a DataLoader worker does: re-open what the folder or dataset was given,
    wherever the working directory is by then."""
    from packfs.dataset import PackedFiles

    monkeypatch.chdir(layout.root)
    spec = layout.spec(kind)
    expected = layout.expected(kind)
    dataset = PackedFiles(spec)
    with packfs.PackedFolder(spec) as folder:
        monkeypatch.chdir(layout.elsewhere)
        with pickle.loads(pickle.dumps(folder)) as again:
            assert {path: again.read(path) for path in expected} == expected
    copy = pickle.loads(pickle.dumps(dataset))
    assert sorted(copy[k] for k in range(len(copy))) == sorted(expected.values())
    copy.close()
    dataset.close()


@pytest.mark.parametrize("kind", ["archive", "glob", "manifest"])
def test_every_command_takes_a_relative_spec_from_another_directory(layout: Layout, kind: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """ls, find, cat, info, verify and unpack, run where the archives are not (the CLI
    takes an archive, a manifest or a quoted glob; a list is the Python API's), in
    process (the mount test below runs the CLI as a process)."""
    from packfs.cli import main

    cwd = layout.elsewhere
    monkeypatch.chdir(cwd)
    spec = os.path.join("..", layout.spec(kind))  # type: ignore[arg-type]
    expected = layout.expected(kind)
    runner = cli_runner()

    def run(*args: str) -> str:
        result = runner.invoke(main, list(args), catch_exceptions=False)
        assert result.exit_code == 0, (args, result.stderr)
        return result.stdout

    listed = run("ls", "-R", spec)
    assert all(os.path.basename(path) in listed for path in expected)
    assert set(run("find", spec, "-type", "f").split()) == set(expected)
    assert run("cat", spec, *sorted(expected)) == "".join(expected[p].decode() for p in sorted(expected))
    assert json.loads(run("info", "--json", spec))
    run("verify", "-q", spec)
    run("unpack", "-q", spec, f"out-{kind}")
    for path, data in expected.items():
        assert (cwd / f"out-{kind}" / path).read_bytes() == data
    run("ls", spec, "a")  # a directory shards of the set share


def test_a_relative_manifest_mounts_with_its_root_and_files(layout: Layout) -> None:
    """The issue's blocker: ``packfs mount shards/train.ffrset mnt`` then ``stat mnt``
    (with the default binding, an appended set of two layers goes to the Python daemon,
    a set packed at once to the compiled one; PACKFS_TEST_BINDING=mfusepy: both Python)."""
    with mounted("shards/train.ffrset", layout.root / "mnt", cwd=layout.root) as root:
        info = os.stat(root)
        assert info.st_ino == 1 and info.st_mode & S_IFDIR
        assert sorted(os.listdir(root)) == sorted({path.split("/")[0] for path in layout.files})
        for path, data in layout.files.items():
            assert (root / path).read_bytes() == data


def test_a_missing_shard_under_the_python_daemon_is_eio_and_logged(tmp_path: Path) -> None:
    """A shard the manifest lists that cannot be opened is a damaged set, not a path
    missing from the tree: EIO and a log line, not ENOENT for the root."""
    from packfs.fuse import state_file

    _write(tmp_path / "data", IMGS)
    (tmp_path / "shards").mkdir()
    assert packfs_cli("pack", "data", "shards/train.ffr", "--shard-size", "600", cwd=tmp_path).returncode == 0
    missing = sorted((tmp_path / "shards").glob("train-*.ffr"))[1]
    missing.rename(tmp_path / missing.name)
    mountpoint = tmp_path / "mnt"
    with mounted("shards/train.ffrset", mountpoint, binding="mfusepy", cwd=tmp_path) as root:
        with pytest.raises(OSError) as caught:
            os.stat(root)
        assert caught.value.errno == errno.EIO
        log = Path(state_file(str(mountpoint), ".log")).read_text()
        assert missing.name in log and "is missing" in log


@pytest.mark.skipif(TEST_BINDING != "auto", reason="the compiled daemon's refusal: the default binding only")
def test_a_missing_shard_is_refused_at_mount_by_the_compiled_daemon(tmp_path: Path) -> None:
    """The compiled daemon opens every shard before it mounts: a missing one fails the
    mount with one line naming it."""
    _write(tmp_path / "data", IMGS)
    (tmp_path / "shards").mkdir()
    assert packfs_cli("pack", "data", "shards/train.ffr", "--shard-size", "600", cwd=tmp_path).returncode == 0
    missing = sorted((tmp_path / "shards").glob("train-*.ffr"))[1]
    missing.unlink()
    (tmp_path / "mnt").mkdir()
    result = packfs_cli("mount", "shards/train.ffrset", "mnt", "--binding", "lowlevel", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("Error: ") and missing.name in result.stderr
