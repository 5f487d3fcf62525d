"""PackedFolder's interface: FFRecord's methods and packfs's additions."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import random
import subprocess
import sys
import threading
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

import packfs
from packfs import (
    NotADirectoryPathError, NotAFileError, NotASymlinkError, PackedFolder, PathNotFoundError,
    pack_entries, pack_folder,
)
from tests.conftest import BLUEPRINT, VECTORS, time_limit


def test_list_matches_ffrecords_semantics(tmp_path: Path) -> None:
    """The vector tree, packed by us, lists exactly as FFRecord's PackedFolder did."""
    expected = json.loads((VECTORS / "packed_folder.json").read_text())
    tree = tmp_path / "tree"
    for relative in expected["source_tree"]["directories"]:
        (tree / relative).mkdir(parents=True, exist_ok=True)
    import hashlib

    contents = {}
    for relative in expected["source_tree"]["files"]:
        (tree / relative).parent.mkdir(parents=True, exist_ok=True)
    # Contents are not in the JSON; sizes and names are what list() depends on.
    for relative, meta in expected["source_tree"]["files"].items():
        contents[relative] = bytes(meta["size"])
        (tree / relative).write_bytes(contents[relative])
    pack_folder(tree, tmp_path / "v.ffr")
    api = expected["ffrecord_PackedFolder_api"]
    with PackedFolder(tmp_path / "v.ffr") as folder:
        assert folder.num_files() == api["num_files()"]
        calls = {
            "list()": folder.list(),
            "list(recursive=True)": folder.list(recursive=True),
            "list(list_dir=False, recursive=True)": folder.list(list_dir=False, recursive=True),
            "list(list_file=False, recursive=True)": folder.list(list_file=False, recursive=True),
            "list('sub')": folder.list("sub"),
            "list('sub', recursive=True)": folder.list("sub", recursive=True),
            "list('empty_dir')": folder.list("empty_dir"),
            "list('données')": folder.list("données"),
        }
        for call, value in calls.items():
            assert value == api[call]["value"], call
        with pytest.raises(NotADirectoryPathError, match="not a directory but a file"):
            folder.list("001.txt")
        assert all(hashlib.sha256(folder.read(p)).hexdigest() for p in contents)


def test_exists_is_file_is_dir(folder: PackedFolder) -> None:
    assert folder.exists("") and folder.is_dir("") and folder.is_dir("/")
    assert folder.exists("hello.txt") and folder.is_file("hello.txt") and not folder.is_dir("hello.txt")
    assert folder.is_dir("a/b") and not folder.is_file("a/b")
    assert not folder.exists("nope") and not folder.is_file("nope") and not folder.is_dir("nope")
    assert not folder.exists("hello.txt/x")
    assert "hello.txt" in folder and "nope" not in folder
    assert folder.is_file("link-to-hello") and folder.is_symlink("link-to-hello")
    assert not folder.exists("dangling") and folder.is_symlink("dangling")


@pytest.mark.parametrize("spelling", ["a/b/c/deep.bin", "/a/b/c/deep.bin", "a//b/./c/deep.bin",
                                       "a/b/../b/c/deep.bin", Path("a/b/c/deep.bin"),
                                       b"a/b/c/deep.bin", "a/dirlink/c/deep.bin"])
def test_path_spellings(folder: PackedFolder, spelling) -> None:
    assert folder.read_one(spelling) == BLUEPRINT["a/b/c/deep.bin"]


def test_read_one_and_read_list(folder: PackedFolder) -> None:
    assert folder.read("hello.txt") == b"hello world\n"
    assert folder.read(["hello.txt", "empty.txt"]) == [b"hello world\n", b""]
    assert folder.read_one("a/link-up") == b"hello world\n"  # relative symlink followed


def test_read_errors(folder: PackedFolder) -> None:
    with pytest.raises(PathNotFoundError, match="'missing.txt': no such file"):
        folder.read("missing.txt")
    with pytest.raises(FileNotFoundError):  # the built-in base still catches it
        folder.read("missing.txt")
    with pytest.raises(NotAFileError, match="'a' is not a file but a dir"):
        folder.read("a")
    with pytest.raises(NotADirectoryPathError, match="'hello.txt' is not a directory"):
        folder.read("hello.txt/child")
    with pytest.raises(PathNotFoundError, match="outside the archive"):
        folder.read("absolute")
    with pytest.raises(PathNotFoundError):
        folder.read("dangling")
    with pytest.raises(NotASymlinkError):
        folder.readlink("hello.txt")
    with pytest.raises(NotADirectoryPathError):
        folder.list("hello.txt")


def test_symlink_loops_end(tmp_path: Path) -> None:
    pack_entries([packfs.Entry("x", kind="symlink", target="y"),
                  packfs.Entry("y", kind="symlink", target="x")], tmp_path / "l.ffr")
    with PackedFolder(tmp_path / "l.ffr") as folder:
        with pytest.raises(PathNotFoundError, match="too many levels"):
            folder.read("x")


def test_read_view_is_zero_copy_and_read_only(folder: PackedFolder) -> None:
    view = folder.read_view("big/large.bin")
    assert view.readonly
    assert view == BLUEPRINT["big/large.bin"]
    assert np.frombuffer(view, np.uint8).base is not None
    view.release()


def test_open_gives_a_seekable_file(folder: PackedFolder) -> None:
    with folder.open("a/b/c/deep.bin") as f:
        assert f.seekable() and f.readable() and not f.writable()
        assert f.read(3) == bytes([0, 1, 2])
        assert f.tell() == 3
        f.seek(-2, os.SEEK_END)
        assert f.read() == bytes([254, 255])
        f.seek(256)
        buffer = bytearray(4)
        assert f.readinto(buffer) == 4 and bytes(buffer) == bytes([0, 1, 2, 3])
        assert f.read(0) == b""
        f.seek(10**6)
        assert f.read() == b""
    with pytest.raises(ValueError):
        f.read()
    with folder.open("données/été.txt") as f:
        assert f.readline() == "ünïcödé\n".encode()


def test_open_works_with_real_readers(tmp_path: Path) -> None:
    import io

    array = np.arange(12, dtype=np.float64).reshape(3, 4)
    npy = io.BytesIO()
    np.save(npy, array)
    archive_zip = io.BytesIO()
    with zipfile.ZipFile(archive_zip, "w") as z:
        z.writestr("inner.txt", "inside")
    pack_entries([
        packfs.Entry("x.npy", npy.getvalue()),
        packfs.Entry("data.json", json.dumps({"k": [1, 2]}).encode()),
        packfs.Entry("a.zip", archive_zip.getvalue()),
    ], tmp_path / "r.ffr")
    with PackedFolder(tmp_path / "r.ffr") as folder:
        assert np.array_equal(np.load(folder.open("x.npy")), array)
        assert json.load(folder.open("data.json")) == {"k": [1, 2]}
        with zipfile.ZipFile(folder.open("a.zip")) as z:
            assert z.read("inner.txt") == b"inside"
        import cv2

        image = np.full((8, 8, 3), 7, np.uint8)
        ok, png = cv2.imencode(".png", image)
        assert ok


def test_stat(folder: PackedFolder) -> None:
    stat = folder.stat("a/b/c/deep.bin")
    assert stat.kind == "file" and stat.size == 768 and stat.permissions == 0o755
    assert stat.path == "a/b/c/deep.bin" and stat.inode >= 2
    assert folder.stat("").inode == 1 and folder.stat("").kind == "dir"
    assert folder.stat("link-to-hello").kind == "symlink"
    assert folder.stat("link-to-hello", follow_symlinks=True).kind == "file"
    with pytest.raises(AttributeError):
        stat.size = 1  # frozen


def test_walk_matches_os_walk(folder: PackedFolder, tree: Path) -> None:
    ours = {top: (sorted(dirs), sorted(files)) for top, dirs, files in folder.walk()}
    theirs = {}
    for top, dirs, files in os.walk(tree):
        links = [d for d in dirs if os.path.islink(os.path.join(top, d))]
        relative = os.path.relpath(top, tree)
        theirs["" if relative == "." else relative] = (
            sorted(d for d in dirs if d not in links), sorted(files + links))
    assert ours == theirs


def test_iteration_len_and_num_files(folder: PackedFolder, tree: Path) -> None:
    files = [str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file() and not p.is_symlink()]
    assert sorted(folder) == sorted(files)
    assert len(folder) == folder.num_files() == len(files)


def test_repr_and_context_manager(archive: Path) -> None:
    with PackedFolder(archive) as folder:
        assert repr(folder) == f"PackedFolder({str(archive)!r}, check_data=True)"
    folder.close()  # closing twice is fine


def _read_in_child(folder: PackedFolder, path: str, queue) -> None:
    queue.put(zlib.crc32(folder.read(path)))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_pickles_small_and_reopens_in_workers(folder: PackedFolder, method: str) -> None:
    data = pickle.dumps(folder)
    assert len(data) < 500
    assert pickle.loads(data).read("hello.txt") == b"hello world\n"
    context = multiprocessing.get_context(method)
    queue = context.Queue()
    process = context.Process(target=_read_in_child, args=(folder, "big/large.bin", queue))
    process.start()
    assert queue.get(timeout=time_limit(60)) == zlib.crc32(BLUEPRINT["big/large.bin"])
    process.join(time_limit(60))
    assert process.exitcode == 0


def test_concurrent_readers_from_threads(folder: PackedFolder) -> None:
    paths = [p for p, c in BLUEPRINT.items() if c is not None]
    errors = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(300):
                path = rng.choice(paths)
                if folder.read(path) != BLUEPRINT[path]:
                    errors.append(path)
        except Exception as error:  # collected and asserted below
            errors.append(repr(error))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_hash_collisions_are_resolved(tmp_path: Path) -> None:
    """Two different paths with the same CRC-32 are both found, each with its own data."""
    seen: dict[int, str] = {}
    pair = None
    rng = random.Random(1)  # CRC never collides on near-identical names, so use random ones
    for _ in range(1_000_000):
        name = f"{rng.getrandbits(64):016x}"
        digest = zlib.crc32(name.encode())
        if digest in seen:
            pair = (seen[digest], name)
            break
        seen[digest] = name
    assert pair is not None
    pack_entries([packfs.Entry(pair[0], b"first"), packfs.Entry(pair[1], b"second")], tmp_path / "c.ffr")
    with PackedFolder(tmp_path / "c.ffr") as folder:
        assert folder.read(pair[0]) == b"first"
        assert folder.read(pair[1]) == b"second"
        assert not folder.exists("n-none")


def test_info(folder: PackedFolder) -> None:
    info = folder.info()
    assert info["format_version"] == "1.4"
    assert info["files"] == folder.num_files()
    assert info["symlinks"] == 5
    assert info["dirs"] == 8  # root, a, a/b, a/b/c, a/empty_nested, big, données, empty_dir


def test_verify_on_a_sound_archive(folder: PackedFolder) -> None:
    report = folder.verify()
    assert report.ok and report.bad_paths == () and report.records_checked > 30


def test_reading_does_not_import_numpy(archive: Path) -> None:
    """numpy costs a tenth of a second of start-up; opening, reading and stat-ing (what
    ``packfs cat`` and the mount daemon do) must not need it."""
    code = (
        "import sys, packfs, packfs.cli, packfs.mount\n"
        f"folder = packfs.PackedFolder({str(archive)!r})\n"
        "folder.read('hello.txt'); folder.stat('a'); folder.list('a'); list(folder.walk())\n"
        "assert 'numpy' not in sys.modules, 'numpy was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_open_adds_almost_nothing_to_rss(tmp_path: Path) -> None:
    """Each open of a 100,000-entry archive used to add 8.9 MiB of mapped table pages
    to RSS (the CRCs at open read through the map); DataLoader workers each paid it."""
    count = 100_000
    archive = tmp_path / "many.ffr"
    packfs.pack_entries((packfs.Entry(f"d{i // 1000}/f{i}", b"x") for i in range(count)), archive, count=count)

    def rss_mib() -> float:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    folders = [PackedFolder(archive)]  # the first open's one-time allocations
    before = rss_mib()
    folders += [PackedFolder(archive) for _ in range(8)]
    growth = (rss_mib() - before) / 8
    for folder in folders:
        folder.close()
    assert growth < 0.5, f"each open added {growth:.2f} MiB"
