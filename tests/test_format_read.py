"""Whole-file reads through the C format library (packfs.core._format's Tree.read_path
and read_file): what Archive.read_path and PackedFolder.read ask first (issue 35).

Each test compares the library with the pure-Python path over the same archive (the
same Archive class with ``compiled_read`` set to None): the same bytes for every codec
and size (the library's CRC, folded with PCLMULQDQ, agrees with zlib's at every length
it meets), None where it leaves a read to Python, and the same PackfsError subclass
for damage, a closed archive and a file over the limit."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

import packfs
from packfs.core import Archive
from packfs.core.codecs import whole_read_limit
from packfs.errors import ChecksumError, ClosedArchiveError, NotAFileError, PackfsError, TooLargeToReadError
from packfs.write import pack_folder
from tests.conftest import damaged_copy
from tests.test_compress_pack import _json
from tests.test_core_format import _format_module
from tests.test_inodedaemon_codecs import CONTENTS, _build, claim_a_huge_sparse_file

MIB = 1 << 20


def _outcome(call, *args):
    try:
        return call(*args)
    except PackfsError as error:
        return type(error)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every length 0-300 (the CRC's tail, its 16- and 64-byte folds, their edges),
    lengths around 4 KiB and the 1 MiB map-copy limit, incompressible files over it
    (pread, and piece CRCs over 1 MiB), JSON files alike enough for a dictionary, a
    text over a zstd frame, and a file with a hole."""
    src = tmp_path_factory.mktemp("whole") / "src"
    rng = random.Random(35)
    (src / "lengths").mkdir(parents=True)
    for n in range(301):
        (src / "lengths" / f"{n:03}").write_bytes(rng.randbytes(n))
    for n in (4095, 4096, 4097, 100_000, MIB - 1, MIB, MIB + 17, 3 * MIB + 5):
        (src / f"random-{n}").write_bytes(rng.randbytes(n))
    (src / "json").mkdir()
    for i in range(120):
        (src / "json" / f"{i:04}.json").write_bytes(_json(i))
    (src / "big.txt").write_bytes(b"".join(b"line %d of a large text file\n" % i for i in range(60_000)))
    with open(src / "holes.img", "wb") as f:
        f.truncate(8 * MIB)
        f.seek(3 * MIB)
        f.write(b"data" * 10_000)
    os.symlink("big.txt", src / "link")
    return src


@pytest.fixture(scope="module", params=["stored", "zstd", "zstd+dictionary"])
def packed(request: pytest.FixtureRequest, source: Path) -> Path:
    _format_module()
    out = source.parent / f"{request.param}.ffr"
    if request.param == "stored":
        pack_folder(source, out, sparse=False)
    else:
        pack_folder(source, out, compress="zstd", dictionary="auto" if request.param.endswith("dictionary") else None)
    return out


def _files(source: Path) -> dict[str, bytes]:
    return {os.path.relpath(os.path.join(top, name), source): Path(top, name).read_bytes()
            for top, _, names in os.walk(source) for name in names if not Path(top, name).is_symlink()}


def test_every_file_reads_through_the_library_as_through_python(packed: Path, source: Path) -> None:
    files = _files(source)
    with Archive(packed) as compiled, Archive(packed) as python:
        python.compiled_read = None
        read = compiled.compiled_read
        assert read is not None, "the library reads this archive in place"
        for path, data in files.items():
            assert read(path, whole_read_limit()) == data, path  # answered by C, a str key
            assert read(path.encode(), whole_read_limit()) == data, path  # and a bytes key
            assert compiled.read_path(path) == python.read_path(path) == data, path
        # What the library leaves to Python: not a canonical key, a symlink, a
        # directory, a path not there, another type; the Archive answers all the same.
        for path in ("/big.txt", "json/../big.txt", "./big.txt", "json//0001.json", "link", "json", "", "nothing",
                     b"\xff", "caf\udcc3\udca9", Path("big.txt")):
            assert read(path, whole_read_limit()) is None, path
            assert _outcome(compiled.read_path, path) == _outcome(python.read_path, path), path
        assert compiled.read_path("link") == files["big.txt"]


def test_a_file_over_max_size_is_left_to_python(packed: Path, source: Path) -> None:
    with Archive(packed) as opened:
        tree = opened.compiled_tree
        data = (source / f"random-{3 * MIB + 5}").read_bytes()
        assert tree.read_path(f"random-{3 * MIB + 5}", len(data) - 1) is None
        assert tree.read_path(f"random-{3 * MIB + 5}", len(data)) == data
        with pytest.raises(TooLargeToReadError):
            tree.read_file(f"random-{3 * MIB + 5}".encode(), max_size=len(data) - 1)
        assert tree.read_file(b"holes.img", max_size=8 * MIB) == (source / "holes.img").read_bytes()


def test_a_damaged_record_raises_what_python_raises(packed: Path, tmp_path: Path) -> None:
    """A stored, zstd or framed file whose record fails its CRC: the library answers
    None (read_path) or ChecksumError (read_file), and Archive.read_path and
    PackedFolder.read raise the Python path's ChecksumError, message and all."""
    for name in ("json/0007.json", "random-4096", f"random-{MIB + 17}", "big.txt"):
        bad = damaged_copy(packed, tmp_path / "bad.ffr", name.encode(), at=5)
        with Archive(bad) as compiled, Archive(bad) as python:
            python.compiled_read = None
            assert compiled.compiled_read(name, -1) is None, name
            with pytest.raises(ChecksumError):
                compiled.compiled_tree.read_file(name.encode())
            with pytest.raises(ChecksumError) as caught:
                compiled.read_path(name)
            with pytest.raises(ChecksumError) as expected:
                python.read_path(name)
            assert str(caught.value) == str(expected.value), name
            assert compiled.read_path("json/0001.json") == python.read_path("json/0001.json")
        with packfs.PackedFolder(bad) as folder:
            with pytest.raises(ChecksumError):
                folder.read(name)


def test_once_shares_its_bitmaps_with_the_python_policy(packed: Path, tmp_path: Path) -> None:
    """Under "once" the Tree keeps its verdicts in the policy's own bitmaps: a record the
    library checked is one Python does not check again, and one it found damaged fails
    in Python at once (the policy raises without reading it)."""
    with Archive(packed, checksums="once") as opened:
        policy = opened._policy
        record = opened._table.record(opened.find(b"random-4096"))
        assert not policy.checked[record >> 3] & (1 << (record & 7))
        assert opened.compiled_read("random-4096", -1) is not None
        assert policy.checked[record >> 3] & (1 << (record & 7))
        assert not policy.must_check(record, "random-4096")
    bad = damaged_copy(packed, tmp_path / "bad.ffr", b"random-4096", at=1)
    with Archive(bad, checksums="once") as opened:
        record = opened._table.record(opened.find(b"random-4096"))
        assert opened.compiled_read("random-4096", -1) is None
        assert opened._policy.failed[record >> 3] & (1 << (record & 7))
        with pytest.raises(ChecksumError):
            opened._policy.must_check(record, "random-4096")
        with pytest.raises(ChecksumError):
            opened.read_path("random-4096")


def test_a_closed_archive_and_folder_raise(packed: Path) -> None:
    opened = Archive(packed)
    assert opened.read_path("random-4096")
    opened.close()
    with pytest.raises(ClosedArchiveError):
        opened.read_path("random-4096")
    folder = packfs.PackedFolder(packed)
    assert folder._compiled is not None
    folder.close()
    with pytest.raises(ValueError):
        folder.read("random-4096")


def test_the_python_path_alone_when_the_library_is_off(packed: Path, source: Path) -> None:
    """``folder._compiled = None`` (as bench/ and the tests use it) turns the library off
    for the folder and its archive: every read is Python's, and gives the same."""
    files = _files(source)
    with packfs.PackedFolder(packed) as folder:
        folder._compiled = None
        assert folder._compiled is None and folder.archive.compiled_read is None
        for path in ("json/0003.json", "lengths/077", "big.txt", "link"):
            assert folder.read(path) == files.get(path, files["big.txt"])
        with pytest.raises(NotAFileError):
            folder.read("json")


def test_a_huge_sparse_file_meets_the_python_paths_limit(tmp_path: Path) -> None:
    """A hostile archive's sparse file claiming 2**62 bytes in a few: the library
    refuses it before allocating (over the whole-read limit), and PackedFolder.read
    raises the Python path's TooLargeToReadError."""
    archive = _build(tmp_path / "huge.ffr", claim_a_huge_sparse_file)
    with packfs.PackedFolder(archive) as folder:
        assert folder._compiled is not None
        assert folder.archive.compiled_read("sparse.bin", whole_read_limit()) is None
        with pytest.raises(TooLargeToReadError):
            folder.read("sparse.bin")
        with pytest.raises(TooLargeToReadError):
            folder._compiled.read_file(b"sparse.bin", max_size=whole_read_limit())
        assert folder.read("small.txt") == CONTENTS["small.txt"]


def test_a_fork_while_a_thread_loads_a_dictionary_leaves_the_child_no_lock_held(tmp_path: Path) -> None:
    """A DataLoader forks its workers while other threads may be reading: a child must
    never inherit a lock held by a thread it does not have.  A thread's first read of a
    dictionary-compressed file loads the dictionary; here its record's bytes come through
    a reader (as a URL tree's do) that stops, in this process only, until the fork is
    over.  The child then reads the same file through the same Tree, under a deadline:
    the dictionaries' lock must not be held across the record's read."""
    import dataclasses
    import signal
    import threading
    import time

    from packfs.core.inplace import in_place

    module = _format_module()
    dictionaries: dict[str, int] = {}
    archive = _build(tmp_path / "dictionaries.ffr", lambda layout: dictionaries.update(layout.dictionary_record))
    expected = CONTENTS["dict/a.json"]
    with Archive(archive) as opened:
        start, _end = opened._container.record_span(dictionaries["json"])  # the record a reader asks for first
        parent, fd = os.getpid(), os.open(archive, os.O_RDONLY)
        reading, forked = threading.Event(), threading.Event()

        def reader(at: int, count: int, limit: int = 0) -> bytes:
            if os.getpid() == parent and at <= start < at + count:
                reading.set()
                forked.wait(60)
            return os.pread(fd, count, at)

        view = in_place(opened)
        assert not isinstance(view, str)
        view = dataclasses.replace(view, remote=(reader, -1, "", 0, opened.size, *opened.data_area))
        positional, keywords = view.tree_arguments(True, -1)
        tree = module.Tree(*positional, **keywords)
        results: list[bytes] = []
        thread = threading.Thread(target=lambda: results.append(tree.read_file(b"dict/a.json")))
        thread.start()
        try:
            assert reading.wait(30), "the dictionary's record was never read"
            pid = os.fork()
            if pid == 0:
                try:
                    os._exit(0 if tree.read_file(b"dict/a.json") == expected else 1)
                finally:
                    os._exit(2)
            deadline = time.monotonic() + 30
            done, status = os.waitpid(pid, os.WNOHANG)
            while not done:
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    pytest.fail("the child hung on a lock its parent's thread held at the fork")
                time.sleep(0.01)
                done, status = os.waitpid(pid, os.WNOHANG)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        finally:
            forked.set()
            thread.join()
            os.close(fd)
        assert results == [expected]
