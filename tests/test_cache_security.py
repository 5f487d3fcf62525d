"""The disk cache is one user's (issue 34): a cache directory another user can write is
not used; links planted in a cache are never followed (written, truncated or deleted
through); what packfs creates there is 0700/0600; a block is checked each time it is
served, and one that fails (or was copied from elsewhere) is fetched again; a chunk
that cannot be read is read around.  Against nginx on loopback, a second user being
``nobody`` (setpriv)."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from packfs import PackedFolder
from packfs.source import cache as cache_module
from packfs.source import open_source
from packfs.source.cache import BLOCK_BYTES, BLOCKS_PER_CHUNK, CHUNK_BYTES, SLOT, SLOTS_BYTES
from tests.conftest import REPO, require_python_as_nobody, time_limit, wait_until
from tests.test_cache import _data_gets, dataset, served  # noqa: F401 (fixtures)
from tests.test_remote_source import nginx  # noqa: F401 (fixture: a real server, stopped at the end)

NOBODY = 65534


def _require_root_and_setpriv() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs as root: these tests need root (and user nobody)")
        pytest.skip("needs root (to run as user nobody)")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    require_python_as_nobody()


def _as_nobody(*command: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *command],
                          capture_output=True, text=True, cwd="/", timeout=time_limit(120), input=stdin,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.fixture
def open_dir():
    """A directory every user can enter (pytest's are 0700), removed at the end."""
    directory = Path(tempfile.mkdtemp(prefix="packfs-cachesec-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _warnings(caplog) -> list:
    return [r.getMessage() for r in caplog.records if r.name == "packfs.cache" and r.levelno >= logging.WARNING]


def _big_range(folder) -> tuple:
    entry = folder.archive.lookup("big/weights.bin")
    start, end = folder.archive.extent(entry)[:2]
    return start, end


# -- a cache directory that is not this user's alone -------------------------------------------


def test_a_cache_written_by_another_user_is_not_used(nginx, served, dataset, open_dir, caplog) -> None:  # noqa: F811
    """nobody makes the cache directory root is told to use (a shared /scratch/cache),
    fills it, then rewrites a cached block and forges its slot's CRC: root reads
    without the cache (one warning naming it), gets the right bytes, writes nothing
    there."""
    _require_root_and_setpriv()
    _, files = dataset
    shared = open_dir / "cache"
    shared.mkdir()
    os.chown(shared, NOBODY, NOBODY)  # nobody's own directory, its mode nobody's choice
    script = (
        "import sys\n"
        "from packfs import PackedFolder\n"
        "from packfs.source import cache as c\n"
        "with PackedFolder(sys.argv[1], cache_dir=sys.argv[2]) as folder:\n"
        "    folder.read('big/weights.bin')\n"
        "    entry = folder.archive.lookup('big/weights.bin')\n"
        "    start = folder.archive.extent(entry)[0]\n"
        "    source = folder.archive.source\n"
        "    block = start // c.BLOCK_BYTES + 1\n"
        "    evil = b'attacker' * (c.BLOCK_BYTES // 8)\n"
        "    fd = source._open_chunk(block // c.BLOCKS_PER_CHUNK, create=True)\n"
        # bytes and a slot that matches them
        "    source._store(fd, block // c.BLOCKS_PER_CHUNK * c.BLOCKS_PER_CHUNK, block, evil)\n"
        "    assert source.read(block * c.BLOCK_BYTES, (block + 1) * c.BLOCK_BYTES) == evil\n"
        "    print(block)\n"
    )
    poisoned = _as_nobody(sys.executable, "-c", script, served, str(shared))
    assert poisoned.returncode == 0, poisoned.stderr
    block = int(poisoned.stdout)
    assert shared.stat().st_uid == NOBODY
    before = {p: p.read_bytes() for p in shared.rglob("*") if p.is_file()}
    caplog.set_level(logging.WARNING, logger="packfs.cache")
    for _ in range(2):
        with PackedFolder(served, cache_dir=shared) as folder:
            assert folder.archive.source.directory is None
            assert folder.read("big/weights.bin") == files["big/weights.bin"]
            assert folder.archive.source.read(block * BLOCK_BYTES, (block + 1) * BLOCK_BYTES) \
                != b"attacker" * (BLOCK_BYTES // 8)
    [warning] = _warnings(caplog)  # once, for both opens
    assert str(shared) in warning and "owned by uid 65534" in warning, warning
    assert {p: p.read_bytes() for p in shared.rglob("*") if p.is_file()} == before  # root wrote nothing there


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_a_cache_directory_others_can_write_is_not_used(nginx, served, dataset, tmp_path, mode, caplog) -> None:  # noqa: F811
    _, files = dataset
    shared = tmp_path / "cache"
    shared.mkdir()
    shared.chmod(mode)
    caplog.set_level(logging.WARNING, logger="packfs.cache")
    with PackedFolder(served, cache_dir=shared) as folder:
        assert folder.archive.source.directory is None
        assert folder.read("train/0003.bin") == files["train/0003.bin"]
    [warning] = _warnings(caplog)
    assert str(shared) in warning and "writable by" in warning, warning
    assert list(shared.iterdir()) == []
    result = subprocess.run([sys.executable, "-m", "packfs", "cache", "list", "--cache-dir", str(shared)],
                            capture_output=True, text=True, timeout=time_limit(120))
    assert result.returncode == 1 and "is not used" in result.stderr and "writable by" in result.stderr, result


def test_a_symlink_as_the_cache_directory_is_not_used(nginx, served, dataset, tmp_path, caplog) -> None:  # noqa: F811
    _, files = dataset
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "cache").symlink_to(tmp_path / "elsewhere")  # planted in a shared /tmp
    caplog.set_level(logging.WARNING, logger="packfs.cache")
    with PackedFolder(served, cache_dir=tmp_path / "cache") as folder:
        assert folder.archive.source.directory is None
        assert folder.read("train/0004.bin") == files["train/0004.bin"]
    assert "is a symlink" in _warnings(caplog)[0]
    assert list((tmp_path / "elsewhere").iterdir()) == []


# -- links planted in the cache ------------------------------------------------------------------


def _key_directory(cache: Path) -> Path:
    [directory] = [p for p in (cache / "v1").iterdir() if not p.is_symlink()]
    return directory


def test_a_link_at_a_chunk_is_never_written_through(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    _, files = dataset
    cache = tmp_path / "cache"
    with PackedFolder(served, cache_dir=cache) as folder:  # makes the archive's directory
        start, _ = _big_range(folder)
    key = _key_directory(cache)
    for chunk in key.glob("c*"):
        chunk.unlink()
    target = tmp_path / "root-only"
    target.write_bytes(b"seventeen bytes!\n")
    target.chmod(0o600)
    (key / f"c{start // CHUNK_BYTES}").symlink_to(target)
    with PackedFolder(served, cache_dir=cache) as folder:
        assert folder.read("big/weights.bin") == files["big/weights.bin"]
    assert target.read_bytes() == b"seventeen bytes!\n" and target.stat().st_size == 17


def test_a_link_at_the_identity_files_temporary_name_is_not_followed(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    _, files = dataset
    cache = tmp_path / "cache"
    with PackedFolder(served, cache_dir=cache) as folder:
        folder.read("train/0005.bin")
    key = _key_directory(cache)
    (key / "identity").unlink()
    target = tmp_path / "root-only"
    target.write_bytes(b"x" * 1000)
    (key / f"identity.{os.getpid()}.tmp").symlink_to(target)  # the name main made it under
    with PackedFolder(served, cache_dir=cache) as folder:
        assert folder.read("train/0005.bin") == files["train/0005.bin"]
    assert target.read_bytes() == b"x" * 1000
    assert (key / "identity").is_file() and not (key / "identity").is_symlink()
    assert stat.S_IMODE((key / "identity").stat().st_mode) == 0o600


def test_a_linked_layout_directory_is_not_used(nginx, served, dataset, tmp_path, caplog) -> None:  # noqa: F811
    _, files = dataset
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    outside = tmp_path / "outside"
    outside.mkdir()
    (cache / "v1").symlink_to(outside, target_is_directory=True)
    caplog.set_level(logging.WARNING, logger="packfs.cache")
    with PackedFolder(served, cache_dir=cache) as folder:
        assert folder.read("train/0006.bin") == files["train/0006.bin"]
        assert folder.archive.source.directory is None
    assert list(outside.iterdir()) == []
    assert "v1" in _warnings(caplog)[0] and "symlink" in _warnings(caplog)[0]


def test_eviction_follows_no_linked_directory(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    _, files = dataset
    cache = tmp_path / "cache"
    with PackedFolder(served, cache_dir=cache) as folder:
        folder.read("train/0007.bin")
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("c0", "c1"):
        (outside / name).write_bytes(b"keep me" * 100_000)
        os.utime(outside / name, (1, 1))  # the least recently used of all
    (cache / "v1" / ("e" * 40)).symlink_to(outside, target_is_directory=True)
    with PackedFolder(served, cache_dir=cache, storage_options={"cache_size": 1 << 20}) as folder:  # a bound the big file overflows
        assert folder.read("big/weights.bin") == files["big/weights.bin"]
    assert sorted(p.name for p in outside.iterdir()) == ["c0", "c1"]
    assert sum(p.stat().st_blocks * 512 for p in _key_directory(cache).glob("c*")) <= 2 * CHUNK_BYTES  # it did evict


# -- modes -----------------------------------------------------------------------------------------


def test_what_the_cache_creates_is_private(nginx, served, dataset, open_dir) -> None:  # noqa: F811
    """0700 directories, 0600 files; nobody can neither read a cached byte nor open a
    chunk to lock it (a lock another user held on a 0644 chunk stalled every miss of its
    owner 120 s).  A directory of the user's own that others may read (an older packfs
    made them 0755) is made 0700."""
    _require_root_and_setpriv()
    _, files = dataset
    cache = open_dir / "cache"
    cache.mkdir(mode=0o755)
    cache.chmod(0o755)
    with PackedFolder(served, cache_dir=cache) as folder:
        assert folder.read("big/weights.bin") == files["big/weights.bin"]
    with PackedFolder(served, cache_dir=cache) as folder:  # the open's tail kept, read back
        assert folder.read("train/0008.bin") == files["train/0008.bin"]
        folder.archive.source.flush_counts()  # the stats file
    everything = [cache, *cache.rglob("*")]
    assert any(p.name.startswith("c") for p in everything) and (cache / "tails-v1").is_dir()
    assert any(p.name == "stats" for p in everything)
    for path in everything:
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    [chunk] = [p for p in cache.rglob("c*") if p.parent.parent.name == "v1"][:1]
    script = (
        "import fcntl, struct, sys\n"
        "try:\n"
        "    fd = open(sys.argv[1], 'rb')\n"
        "except PermissionError:\n"
        "    print('denied')\n"
        "else:\n"
        "    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack('hhqqi4x', fcntl.F_RDLCK, 0, 0, 0, 0))\n"
        "    print(fd.read(1 << 20).strip(b'\\0')[:8])\n"
    )
    result = _as_nobody(sys.executable, "-c", script, str(chunk))
    assert result.stdout.strip() == "denied", (result.stdout, result.stderr)


# -- a block checked each time it is served ------------------------------------------------------


def test_a_block_copied_from_elsewhere_is_fetched_again(nginx, served, dataset, tmp_path) -> None:  # noqa: F811
    """One block's bytes and slot copied over another's, between two reads of one open
    source (a mount checks a 1 MiB piece once, then serves it from the cache): the
    second read gets the right bytes, that block fetched again, and the cache repaired."""
    _, files = dataset
    cache = tmp_path / "cache"
    source = open_source(served, storage_options={"cache_dir": cache})
    try:
        with PackedFolder(served, cache_dir=cache) as folder:
            start, end = _big_range(folder)
        first = start // BLOCK_BYTES + 2
        span = (first * BLOCK_BYTES, (first + 4) * BLOCK_BYTES)
        right = source.read(*span)
        assert right == files["big/weights.bin"][span[0] - start:span[1] - start]
        chunk = first // BLOCKS_PER_CHUNK
        local = first % BLOCKS_PER_CHUNK
        path = _key_directory(cache) / f"c{chunk}"
        with open(path, "r+b") as f:  # block local+1 becomes a copy of block local, slot and all
            f.seek(local * SLOT.size)
            slot = f.read(SLOT.size)
            f.seek(SLOTS_BYTES + local * BLOCK_BYTES)
            data = f.read(BLOCK_BYTES)
            assert SLOT.unpack(slot)[1] == BLOCK_BYTES and data != right[BLOCK_BYTES:2 * BLOCK_BYTES]
            f.seek((local + 1) * SLOT.size)
            f.write(slot)
            f.seek(SLOTS_BYTES + (local + 1) * BLOCK_BYTES)
            f.write(data)
        nginx.clear_log()
        misses = source.stats()["cache_misses"]
        assert source.read(*span) == right
        assert source.stats()["cache_misses"] == misses + 1
        # (nginx writes its log a little later, and it may hold other tests' reads ahead
        # still in flight: this GET is waited for among them)
        assert wait_until(lambda: ((first + 1) * BLOCK_BYTES, (first + 2) * BLOCK_BYTES) in _data_gets(nginx))
        assert source.read(*span) == right and source.stats()["cache_misses"] == misses + 1  # written over: repaired
    finally:
        source.close()


def test_a_chunk_that_cannot_be_read_is_read_around(nginx, served, dataset, tmp_path, caplog) -> None:  # noqa: F811
    """A chunk whose reads fail (a directory where the chunk was: EISDIR from pread, a
    real error; EIO itself, which nothing here can make a file give, injected at
    os.pread): the bytes come from the server, warned once."""
    _, files = dataset
    cache = tmp_path / "cache"
    with PackedFolder(served, cache_dir=cache) as folder:
        start, _ = _big_range(folder)
        folder.read("big/weights.bin")
    caplog.set_level(logging.WARNING, logger="packfs.cache")
    key = _key_directory(cache)
    chunk = key / f"c{(start + CHUNK_BYTES // 2) // CHUNK_BYTES}"
    chunk.unlink()
    chunk.mkdir()
    with PackedFolder(served, cache_dir=cache) as folder:
        assert folder.read("big/weights.bin") == files["big/weights.bin"]
        assert folder.archive.source.stats()["cache_read_errors"] >= 1
    assert any("cannot be read" in m for m in _warnings(caplog)), _warnings(caplog)
    chunk.rmdir()
    with PackedFolder(served, cache_dir=cache) as folder:
        folder.read("big/weights.bin")  # the chunk written again


def test_eio_from_a_chunk_falls_back_to_the_server(nginx, served, dataset, tmp_path, monkeypatch, caplog) -> None:  # noqa: F811
    _, files = dataset
    cache = tmp_path / "cache"
    with PackedFolder(served, cache_dir=cache) as folder:
        folder.read("big/weights.bin")
    real = os.pread

    def failing(fd, count, offset):
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith("c"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd, count, offset)

    monkeypatch.setattr(cache_module.os, "pread", failing)
    caplog.set_level(logging.WARNING, logger="packfs.cache")
    with PackedFolder(served, cache_dir=cache) as folder:
        for _ in range(2):
            assert folder.read("big/weights.bin") == files["big/weights.bin"]
    assert len([m for m in _warnings(caplog) if "cannot be read" in m and "Input/output error" in m]) == 1


def test_a_lock_nobody_releases_is_waited_for_a_bounded_time(nginx, served, dataset, tmp_path, monkeypatch,  # noqa: F811
                                                            caplog) -> None:
    """A lock on a chunk that is never released (a holder stopped; before chunks were
    0600, another user's read lock) costs LOCK_WAIT, then the blocks are fetched here.
    (This pins behaviour main already had; what was new is that another user can no
    longer open a chunk to lock it: test_what_the_cache_creates_is_private.)"""
    import fcntl
    import struct

    _, files = dataset
    cache = tmp_path / "cache"
    with PackedFolder(served, cache_dir=cache) as folder:
        start, end = _big_range(folder)
        folder.read("train/0009.bin")
    chunk = _key_directory(cache) / f"c{start // CHUNK_BYTES}"
    fd = os.open(chunk, os.O_RDWR | os.O_CREAT, 0o600)  # a description of its own: its OFD lock excludes the reader's
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
        monkeypatch.setattr(cache_module, "LOCK_WAIT", 0.2)
        caplog.set_level(logging.WARNING, logger="packfs.cache")
        with PackedFolder(served, cache_dir=cache) as folder:
            assert folder.read("big/weights.bin") == files["big/weights.bin"]
        assert any("waited" in m for m in _warnings(caplog)), _warnings(caplog)
    finally:
        os.close(fd)
