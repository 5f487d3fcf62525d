"""FFRecord's own pack_folder archives (tests/vectors/ffrecord), opened safely."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
from collections import OrderedDict
from pathlib import Path

import pytest

import packfs
from packfs import FormatError, PackedFolder
from packfs.core.legacy import MAGIC
from tests.conftest import VECTORS, damaged_copy, mounted, write_records

LEGACY = ["packed_folder", "packed_folder_py37"]  # pickle protocols 4 and 3


def _expected(name: str) -> dict:
    return json.loads((VECTORS / f"{name}.json").read_text())


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_packed_folders_read_as_ffrecord_says(name: str) -> None:
    expected = _expected(name)
    api = expected["ffrecord_PackedFolder_api"]
    with PackedFolder(VECTORS / f"{name}.ffr") as folder:
        assert folder.legacy
        assert folder.num_files() == api["num_files()"]
        assert folder.list() == api["list()"]["value"]
        assert folder.list(recursive=True) == api["list(recursive=True)"]["value"]
        assert folder.list(list_dir=False, recursive=True) == api["list(list_dir=False, recursive=True)"]["value"]
        assert folder.list(list_file=False, recursive=True) == api["list(list_file=False, recursive=True)"]["value"]
        for probe in ("sub", "empty_dir", "données"):
            assert folder.list(probe) == api[f"list({probe!r})"]["value"]
        for probe in ("001.txt", "nope"):
            with pytest.raises(packfs.PackfsError):
                folder.list(probe)
        # On purpose, packfs reads "/001.txt" and "sub/../001.txt" as a file system does
        # (FFRecord looks ".." up literally and fails on a leading "/"), and answers
        # False where FFRecord raises TypeError ("001.txt/x").
        differs = {"/001.txt", "sub/../001.txt"}
        for method in ("exists", "is_file", "is_dir"):
            for path, outcome in api[method].items():
                if outcome["ok"] and path not in differs:
                    assert getattr(folder, method)(path) == outcome["value"], (method, path)
            assert getattr(folder, method)("001.txt/x") is False
        assert folder.read("/001.txt") == folder.read("sub/../001.txt") == folder.read("001.txt")
        for path, outcome in api["read_one"].items():
            if path in differs:
                continue
            if outcome["ok"]:
                assert hashlib.sha256(folder.read_one(path)).hexdigest() == outcome["sha256"], path
            else:
                with pytest.raises(packfs.PackfsError):
                    folder.read_one(path)
        batch = api["read(sorted files)"]
        assert [hashlib.sha256(d).hexdigest() for d in folder.read(batch["paths"])] == batch["sha256"]
        for path, info in expected["source_tree"]["files"].items():
            assert hashlib.sha256(folder.read(path)).hexdigest() == info["sha256"]
        # No modes or times in a legacy archive: read-only files and directories.
        assert folder.stat("001.txt").mode == stat.S_IFREG | 0o444
        assert folder.stat("sub").mode == stat.S_IFDIR | 0o555
        assert folder.stat("sub").mtime_ns == os.stat(VECTORS / f"{name}.ffr").st_mtime_ns
        assert folder.verify().ok


def test_packed_empty_folder() -> None:
    with PackedFolder(VECTORS / "packed_empty_folder.ffr") as folder:
        assert folder.legacy and folder.list() == [] and folder.num_files() == 0 and folder.verify().ok


@pytest.mark.fuse
def test_a_legacy_archive_mounts_like_a_native_one(tmp_path: Path) -> None:
    expected = _expected("packed_folder")["source_tree"]["files"]
    with mounted(VECTORS / "packed_folder.ffr", tmp_path / "mnt") as root:
        for path, info in expected.items():
            assert hashlib.sha256((root / path).read_bytes()).hexdigest() == info["sha256"]
        assert stat.S_IMODE(os.stat(root / "sub").st_mode) == 0o555
        assert stat.S_IMODE(os.stat(root / "001.txt").st_mode) == 0o444
        assert sorted(os.listdir(root / "empty_dir")) == []


# -- hostile metadata: refused, and nothing runs ------------------------------------------


def _legacy_archive(path: Path, metadata: bytes, files: int = 1) -> Path:
    return write_records(path, [b"file %d" % i for i in range(files)] + [MAGIC + metadata])


class _Runs:
    """Unpickling this runs os.system: what a hostile FFRecord file can carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _deep(depth: int) -> OrderedDict:
    tree: OrderedDict = OrderedDict(f=0)
    for _ in range(depth):
        tree = OrderedDict(d=tree)
    return tree


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_pickles_as_pack_folder_writes_them_are_accepted(tmp_path: Path, protocol: int) -> None:
    tree = OrderedDict([("b", OrderedDict([("x", 1)])), ("a", 0), ("e", OrderedDict())])
    archive = _legacy_archive(tmp_path / "ok.ffr", pickle.dumps(tree, protocol=protocol), files=2)
    with PackedFolder(archive) as folder:
        assert folder.list(recursive=True) == ["a", "b", "b/x", "e"]
        assert folder.read("b/x") == b"file 1"


@pytest.mark.parametrize("make, message", [
    (lambda marker: pickle.dumps(OrderedDict(a=_Runs(marker)), protocol=4), "global"),
    (lambda marker: pickle.dumps(_Runs(marker), protocol=2), "global"),
    (lambda marker: b"\x80\x03cos\nsystem\nq\x00X\x05\x00\x00\x00touchq\x01\x85R.", "global"),
    (lambda marker: pickle.dumps({"a": 0}, protocol=4), "OrderedDict"),  # an EMPTY_DICT root is fine...
    (lambda marker: pickle.dumps(OrderedDict(a=[0]), protocol=4), "opcode"),
    (lambda marker: pickle.dumps(OrderedDict(a=0.5), protocol=4), "opcode"),
    (lambda marker: pickle.dumps(OrderedDict(a=b"x"), protocol=4), "opcode"),
    (lambda marker: pickle.dumps(OrderedDict(a=5), protocol=4), "record 5"),
    (lambda marker: pickle.dumps(OrderedDict(a=0, b=0), protocol=4), "two paths"),
    (lambda marker: pickle.dumps(OrderedDict([("../up", 0)]), protocol=4), "not a valid file name"),
    (lambda marker: pickle.dumps(OrderedDict([("", 0)]), protocol=4), "not a valid file name"),
    (lambda marker: pickle.dumps(OrderedDict([("a\0b", 0)]), protocol=4), "not a valid file name"),
    (lambda marker: pickle.dumps(_deep(300), protocol=4), "deeper than"),
    (lambda marker: pickle.dumps(OrderedDict(a=0), protocol=4)[:-3], "truncated|opcode"),
    (lambda marker: pickle.dumps(OrderedDict(a=0), protocol=4) + b"junk", "after the pickle"),
    (lambda marker: pickle.dumps(OrderedDict(a=0), protocol=1), "PROTO"),
])
def test_hostile_metadata_is_refused_and_runs_nothing(tmp_path: Path, make, message: str) -> None:
    marker = tmp_path / "ran"
    data = make(marker)
    if message == "OrderedDict":  # a plain dict is what EMPTY_DICT builds: accepted
        with PackedFolder(_legacy_archive(tmp_path / "dict.ffr", data)) as folder:
            assert folder.list() == ["a"]
        return
    with pytest.raises(FormatError, match=message):
        PackedFolder(_legacy_archive(tmp_path / "bad.ffr", data))
    assert not marker.exists()


def test_a_directory_placed_twice_is_refused(tmp_path: Path) -> None:
    """A pickle can name one memoised dict from two places (a DAG, or a bomb when
    repeated); pack_folder never does."""
    shared: OrderedDict = OrderedDict(f=0)
    data = pickle.dumps(OrderedDict(a=shared, b=shared), protocol=4)  # pickle memoises `shared`
    with pytest.raises(FormatError, match="twice"):
        PackedFolder(_legacy_archive(tmp_path / "dag.ffr", data))


@pytest.mark.parametrize("names", [("\u00e9", "\udcc3\udca9"), ("\udcc3\udca9", "\u00e9"),
                                   ("\u00e9", "\udcc3\u00a9")])
def test_names_that_are_the_same_bytes_are_refused(tmp_path: Path, names: tuple[str, str]) -> None:
    r"""pack_folder's names come from os.listdir, where an undecodable byte is a lone
    surrogate ("\udcc3"), so different strings can stand for the same bytes: "\u00e9"
    and "\udcc3\udca9" are both b"\xc3\xa9".  Compared as strings, the second file hid
    the first and verify saw nothing.  ("\udcc3\u00a9" is another name, b"\xc3\xc2\xa9".)"""
    for level, tree in enumerate((OrderedDict([(names[0], 0), (names[1], 1)]),
                                  OrderedDict(d=OrderedDict([(names[0], 0), (names[1], 1)])))):
        archive = _legacy_archive(tmp_path / f"{level}.ffr", pickle.dumps(tree, protocol=4), files=2)
        if os.fsencode(names[0]) != os.fsencode(names[1]):  # b"\xc3\xc2\xa9": another name
            with PackedFolder(archive) as folder:
                assert folder.num_files() == 2 and folder.verify().ok
            continue
        with pytest.raises(FormatError, match=r"appears twice in one directory \(as the bytes b'\\xc3\\xa9'\)"):
            PackedFolder(archive)


def test_an_undecodable_name_reads_as_its_bytes(tmp_path: Path) -> None:
    data = pickle.dumps(OrderedDict([("\udcff.bin", 0), ("\u00e9", 1)]), protocol=4)
    with PackedFolder(_legacy_archive(tmp_path / "bytes.ffr", data, files=2)) as folder:
        assert folder.read(b"\xff.bin") == b"file 0" and folder.read("\u00e9") == b"file 1"
        assert [entry.name for entry in folder.list_attributes()] == [b"\xc3\xa9", b"\xff.bin"]
        assert folder.verify().ok


# -- packfs convert, and the CLI on legacy archives -----------------------------------------


@pytest.mark.parametrize("name", LEGACY)
def test_convert_then_verify(tmp_path: Path, name: str) -> None:
    from tests.conftest import packfs_cli

    out = tmp_path / "native.ffr"
    result = packfs_cli("convert", VECTORS / f"{name}.ffr", out)
    assert result.returncode == 0, result.stderr
    assert packfs_cli("verify", out).returncode == 0
    with PackedFolder(out) as native, PackedFolder(VECTORS / f"{name}.ffr") as legacy:
        assert not native.legacy
        assert native.list(recursive=True) == legacy.list(recursive=True)
        for path in legacy.list(recursive=True, list_dir=False):
            assert native.read(path) == legacy.read(path)
            assert native.stat(path).mode == legacy.stat(path).mode == stat.S_IFREG | 0o444
    again = packfs_cli("convert", out, tmp_path / "again.ffr")
    assert again.returncode == 1 and again.stderr.startswith("Error: ") and "already a packfs archive" in again.stderr
    assert not (tmp_path / "again.ffr").exists()


def test_convert_of_a_damaged_legacy_archive_leaves_nothing(tmp_path: Path) -> None:
    bad = damaged_copy(VECTORS / "packed_folder.ffr", tmp_path / "bad.ffr", b"sub/deeper/004.bin", mask=1)
    with pytest.raises(packfs.ChecksumError, match="004.bin"):
        packfs.convert(bad, tmp_path / "out.ffr")
    assert sorted(os.listdir(tmp_path)) == ["bad.ffr"]


def test_cli_reads_legacy_archives(tmp_path: Path) -> None:
    from tests.conftest import packfs_cli

    archive = VECTORS / "packed_folder.ffr"
    with PackedFolder(archive) as folder:
        assert packfs_cli("cat", archive, "sub/003.txt").stdout == folder.read("sub/003.txt").decode()
    assert "sub/deeper/004.bin" in packfs_cli("ls", "-R", archive).stdout
    assert packfs_cli("verify", archive).returncode == 0
    assert packfs_cli("unpack", archive, tmp_path / "out").returncode == 0
    expected = _expected("packed_folder")["source_tree"]["files"]
    for path, info in expected.items():
        assert hashlib.sha256((tmp_path / "out" / path).read_bytes()).hexdigest() == info["sha256"]
    assert (tmp_path / "out" / "empty_dir").is_dir()


def test_a_legacy_archive_walks_and_lists_attributes() -> None:
    """Its table is built in memory: names must come out as bytes there too."""
    with PackedFolder(VECTORS / "packed_folder.ffr") as folder:
        walked = list(folder.walk())
        assert walked and all(isinstance(top, str) for top, _, _ in walked)
        assert sorted(folder.list(recursive=True)) == sorted(
            os.fsdecode(item.name) for item in folder.list_attributes("", recursive=True))
