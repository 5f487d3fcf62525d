"""URL archives served by the compiled daemon (packfs._lowlevel) through the node-wide
disk cache (issue 35): the metadata read in place from a local view, the data records
read from the cache's chunk files by C, and what is missing fetched through Python's
CachedSource.  Real servers on loopback (nginx over https, moto_server for S3, the
fault-injecting proxy of bench/proxy.py); requests counted from the servers' logs."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import packfs
from packfs.source.cache import BLOCK_BYTES, SLOTS_BYTES
from tests.conftest import BLUEPRINT, assert_same_tree, make_tree, mounted, packfs_cli, require_fuse
from tests.test_remote_source import moto, nginx, s3_env  # noqa: F401 (fixtures: real servers, stopped at the end)

pytestmark = pytest.mark.fuse

FILES = {path: contents for path, contents in BLUEPRINT.items() if contents is not None}
COMPILED = "lowlevel"


def _require_compiled() -> None:
    require_fuse(COMPILED)
    from packfs.fuse.inodedaemon import unavailable

    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)


def _archive(tmp_path: Path, compress: str | None) -> tuple[Path, Path]:
    tree = make_tree(tmp_path / "tree")
    out = tmp_path / f"tree-{compress or 'stored'}.ffr"
    packfs.pack_folder(tree, out, compress=compress)
    return tree, out


def _gets(server) -> list:
    return [request for request in server.requests() if request.method == "GET"]


def _log(mountpoint: Path) -> str:
    from packfs.fuse import state_file

    log = Path(state_file(str(mountpoint), ".log"))
    return log.read_text() if log.exists() else ""


@pytest.mark.parametrize("compress", [None, "zstd"])
def test_compiled_daemon_serves_a_url_over_https_then_from_the_cache_alone(
        nginx, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compress: str | None) -> None:  # noqa: F811
    _require_compiled()
    monkeypatch.setenv("SSL_CERT_FILE", str(nginx.certificate))
    tree, archive = _archive(tmp_path, compress)
    if compress:
        assert packfs.PackedFolder(archive).archive.version == "1.5"
    nginx.put(archive.name, archive.read_bytes())
    url = nginx.tls_url(archive.name)
    # --binding lowlevel: the mount fails rather than fall back to the Python daemon.
    with mounted(url, tmp_path / "mnt", binding=COMPILED) as mountpoint:
        assert_same_tree(tree, mountpoint)
        for path, contents in FILES.items():
            assert (mountpoint / path).read_bytes() == contents
    # Every byte is in the node cache now: a second mount reads nothing from the server
    # but what opening the object asks (its tail, compared with the cached one).
    nginx.clear_log()
    hits_before = _cache_hits()
    with mounted(url, tmp_path / "mnt2", binding=COMPILED) as mountpoint:
        opened = len(_gets(nginx))
        assert_same_tree(tree, mountpoint)
        for path, contents in FILES.items():
            assert (mountpoint / path).read_bytes() == contents
        assert len(_gets(nginx)) == opened <= 1
    # The blocks C served from the cache are in `packfs cache`'s counters once the
    # daemon ends: at least one a file (each read reached the new mount's daemon).
    assert _cache_hits() - hits_before >= sum(1 for contents in FILES.values() if contents)


def _cache_hits() -> int:
    """The node cache's hit counter (every process's), for the archive the test cached."""
    from packfs.source.cachestats import cached_archives

    (cached,) = cached_archives(os.path.join(os.environ["PACKFS_CACHE_DIR"], "v1"))
    return cached.cache_hits


def test_compiled_daemon_serves_an_s3_object(s3_env, tmp_path: Path) -> None:  # noqa: F811
    _require_compiled()
    tree, archive = _archive(tmp_path, "zstd")
    s3_env.client().put_object(Bucket="bucket", Key="mount.ffr", Body=archive.read_bytes())
    with mounted("s3://bucket/mount.ffr", tmp_path / "mnt", binding=COMPILED) as mountpoint:
        assert_same_tree(tree, mountpoint)
        for path, contents in FILES.items():
            assert (mountpoint / path).read_bytes() == contents


def test_a_failing_server_is_eio_for_that_read_and_the_daemon_keeps_serving(nginx, tmp_path: Path) -> None:  # noqa: F811
    _require_compiled()
    from bench.proxy import Proxy

    tree, archive = _archive(tmp_path, None)
    nginx.put(archive.name, archive.read_bytes())
    with Proxy(nginx.port) as proxy:
        url = nginx.url(archive.name, port=proxy.port)
        with mounted(url, tmp_path / "mnt", binding=COMPILED) as mountpoint:
            assert (mountpoint / "hello.txt").read_bytes() == FILES["hello.txt"]
            # The small files share the blocks the view's header was copied from: the
            # large one's first bytes are fetched at their first read.
            proxy.fault("503", count=10**9)
            fd = os.open(mountpoint / "big/large.bin", os.O_RDONLY)
            try:
                with pytest.raises(OSError) as raised:
                    os.pread(fd, 65536, 0)
                assert raised.value.errno == errno.EIO
            finally:
                os.close(fd)
            assert "503" in _log(mountpoint)
            proxy.fault(None)
            # The same bytes again (the kernel kept no pages of a failed read), and the rest.
            assert (mountpoint / "big/large.bin").read_bytes() == FILES["big/large.bin"]
            assert_same_tree(tree, mountpoint)


def test_an_object_replaced_under_the_mount_is_the_clean_error(nginx, tmp_path: Path) -> None:  # noqa: F811
    _require_compiled()
    tree, archive = _archive(tmp_path, None)
    nginx.put(archive.name, archive.read_bytes())
    url = nginx.url(archive.name)
    with mounted(url, tmp_path / "mnt", "--cache-dir", str(tmp_path / "cache"), binding=COMPILED) as mountpoint:
        assert (mountpoint / "hello.txt").read_bytes() == FILES["hello.txt"]
        other = tmp_path / "other"
        (tree / "a/b/c/deep.bin").write_bytes(b"replaced")
        packfs.pack_folder(tree, other)
        os.utime(other, (1, 1))  # nginx's ETag is the mtime and the size: another one
        replaced = other.read_bytes() + b"\0" * 7  # and another size too
        nginx.put(archive.name, replaced)
        with pytest.raises(OSError) as raised:
            (mountpoint / "big/large.bin").read_bytes()
        assert raised.value.errno == errno.EIO
        assert "archive changed in place; remount" in _log(mountpoint)
        # Still serving: what needs no byte of the server is answered.
        assert sorted(os.listdir(mountpoint / "a")) == sorted(os.listdir(tree / "a"))


def _chunk_zero(cache: Path) -> Path:
    chunks = list((cache / "v1").glob("*/c0"))
    assert len(chunks) == 1
    return chunks[0]


def test_a_damaged_cache_block_is_fetched_again_not_served(nginx, tmp_path: Path) -> None:  # noqa: F811
    _require_compiled()
    tree, archive = _archive(tmp_path, None)
    nginx.put(archive.name, archive.read_bytes())
    url = nginx.url(archive.name)
    cache = tmp_path / "cache"
    path, contents = "big/large.bin", FILES["big/large.bin"]
    with mounted(url, tmp_path / "mnt", "--cache-dir", str(cache), binding=COMPILED) as mountpoint:
        assert (mountpoint / path).read_bytes() == contents
    at = archive.read_bytes().find(contents) + len(contents) // 2
    chunk = _chunk_zero(cache)
    with open(chunk, "r+b") as f:  # one bit of a block whose slot stays
        f.seek(SLOTS_BYTES + at)
        byte = f.read(1)
        f.seek(SLOTS_BYTES + at)
        f.write(bytes([byte[0] ^ 1]))
    nginx.clear_log()
    with mounted(url, tmp_path / "mnt2", "--cache-dir", str(cache), binding=COMPILED) as mountpoint:
        opened = len(_gets(nginx))
        assert (mountpoint / path).read_bytes() == contents
        refetched = _gets(nginx)[opened:]
        assert refetched and all(request.status == 206 for request in refetched)
    with open(chunk, "rb") as f:  # written over with the server's bytes
        f.seek(SLOTS_BYTES + at)
        assert f.read(1) == archive.read_bytes()[at:at + 1]


def test_c_and_python_read_the_same_chunk_files(nginx, tmp_path: Path) -> None:  # noqa: F811
    """blockcache.c and packfs.source.cache hold to one rule: a block is served only when
    its slot's length is the block's and its CRC, seeded from the archive's key and the
    block's number, matches; anything else is a miss, which Python fetches again."""
    from packfs.core import _format
    from packfs.source import open_source

    tree, archive = _archive(tmp_path, None)
    data = archive.read_bytes()
    nginx.put(archive.name, data)
    source = open_source(nginx.url(archive.name), {"cache_dir": str(tmp_path / "cache")})
    try:
        top_fd, relative, salt = source.node_cache()
        size = len(data)
        spans = [(0, 100), (BLOCK_BYTES - 10, BLOCK_BYTES + 10), (5 * BLOCK_BYTES + 3, 9 * BLOCK_BYTES + 1)]
        for start, end in spans:
            assert _format.read_cached(top_fd, relative, salt, size, start, end - start) is None  # not fetched yet
            assert source.read(start, end) == data[start:end]
            assert _format.read_cached(top_fd, relative, salt, size, start, end - start) == data[start:end]
        # A block whose bytes were damaged: both miss it; Python fetches and writes it again.
        chunk = _chunk_zero(tmp_path / "cache")
        with open(chunk, "r+b") as f:
            f.seek(SLOTS_BYTES + 6 * BLOCK_BYTES + 100)
            f.write(bytes([data[6 * BLOCK_BYTES + 100] ^ 0x80]))
        start, end = spans[2]
        assert _format.read_cached(top_fd, relative, salt, size, start, end - start) is None
        nginx.clear_log()
        assert source.read(start, end) == data[start:end]
        # Fetched again (counted in nginx's log: a read ahead of an earlier stream may
        # add GETs of its own to the source's count meanwhile).
        damaged = 6 * BLOCK_BYTES + 100
        fetched = [tuple(int(part) for part in request.range[len("bytes="):].split("-"))
                   for request in nginx.requests(at_least=1) if request.range.startswith("bytes=")
                   and "=-" not in request.range]
        assert any(first <= damaged <= last for first, last in fetched), fetched
        assert _format.read_cached(top_fd, relative, salt, size, start, end - start) == data[start:end]
        # A slot moved to another block (bytes and slot copied): its seed differs there.
        with open(chunk, "r+b") as f:
            f.seek(0)
            slot = f.read(8)
            f.seek(SLOTS_BYTES)
            block = f.read(BLOCK_BYTES)
            f.seek(8 * 8)
            f.write(slot)
            f.seek(SLOTS_BYTES + 8 * BLOCK_BYTES)
            f.write(block)
        assert _format.read_cached(top_fd, relative, salt, size, 8 * BLOCK_BYTES, 10) is None
        assert source.read(8 * BLOCK_BYTES, 8 * BLOCK_BYTES + 10) == data[8 * BLOCK_BYTES:8 * BLOCK_BYTES + 10]
        # The bytes opening fetched (the object's last 256 KiB) are in memory, not in
        # chunk files: C misses them, and asks Python.
        assert source.read(size - 5, size) == data[-5:]
        assert _format.read_cached(top_fd, relative, salt, size, size - 5, 5) is None
        with pytest.raises(ValueError):
            _format.read_cached(top_fd, "../elsewhere", salt, size, 0, 10)
    finally:
        source.close()


def test_the_crc_c_checks_blocks_with_is_zlibs() -> None:
    import zlib

    from packfs.core import _format

    data = os.urandom(70_000)
    for length in range(300):
        for offset in (0, 1, 7):
            seed = (length * 0x9E3779B1 + offset) & 0xFFFFFFFF
            piece = data[offset:offset + length]
            assert _format.crc32(piece, seed) == zlib.crc32(piece, seed), (length, offset)
    for length in (BLOCK_BYTES, BLOCK_BYTES - 1, 65536 + 13):
        assert _format.crc32(data[3:3 + length], 12345) == zlib.crc32(data[3:3 + length], 12345)


def test_a_set_of_shards_at_urls_is_served_by_the_compiled_daemon(nginx, tmp_path: Path) -> None:  # noqa: F811
    _require_compiled()
    from packfs.write.sets import make_set
    from tests.test_union import _shards, _tree

    files = _tree()
    (tmp_path / "set").mkdir()
    shards = _shards(files, tmp_path / "set", 3)
    manifest = tmp_path / "set" / "data.ffrset"
    make_set(str(manifest), [str(shard) for shard in shards])
    for path in [*shards, manifest]:
        nginx.put(path.name, path.read_bytes())
    with mounted(nginx.url(manifest.name), tmp_path / "mnt", binding=COMPILED) as mountpoint:
        for path, contents in files.items():
            assert (mountpoint / path).read_bytes() == contents
        assert sorted(os.listdir(mountpoint / "train")) == sorted({path.split("/")[1] for path in files
                                                                   if path.startswith("train/")})


def test_a_view_too_large_to_copy_is_left_to_the_python_daemon(nginx, tmp_path: Path,  # noqa: F811
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from packfs.core import Archive, inplace
    from packfs.fuse.inodedaemon import unavailable

    _, archive = _archive(tmp_path, None)
    nginx.put(archive.name, archive.read_bytes())
    monkeypatch.setattr(inplace, "_VIEW_MAX", 1000)  # what a hostile footer's table claims, scaled down
    with Archive(nginx.url(archive.name)) as opened:
        reason = inplace.in_place(opened, remote=True)
        assert isinstance(reason, str) and "more than the compiled daemon copies" in reason
        assert unavailable(opened) == reason or unavailable(opened).startswith("packfs._lowlevel")
    # Without remote=True (PackedFolder's hot path) a URL is never read in place.
    with Archive(nginx.url(archive.name)) as again:
        assert "URL" in inplace.in_place(again)


def test_info_says_the_compiled_daemon_serves_a_url_without_copying_its_metadata(
        nginx, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """`packfs info URL` says which daemon a mount would use from what the open read:
    a mount copies the URL's whole metadata (header, table, lookup index, tail) to a
    local file, info does not.  Info's own summaries read most of the table (its
    largest files and kinds), so the bytes fetched differ by the parts only the copy
    read: the old code fetched more than the metadata (2.67 MB of 2.65 MB here)."""
    _require_compiled()
    entries = [packfs.Entry(f"d{k // 500:02d}/file-with-a-long-name-{k:06d}.txt", b"x") for k in range(12000)]
    archive = tmp_path / "many.ffr"
    packfs.pack_entries(entries, archive)
    with packfs.PackedFolder(archive) as folder:
        start, end = folder.archive.data_area
        metadata = start + folder.archive.size - end
    nginx.put(archive.name, archive.read_bytes())
    monkeypatch.setenv("PACKFS_CACHE_DIR", str(tmp_path / "fresh-cache"))
    nginx.clear_log()
    result = packfs_cli("info", nginx.url(archive.name))
    assert result.returncode == 0, result.stderr
    assert "mount daemon    lowlevel (compiled" in result.stdout
    fetched = sum(request.bytes_sent for request in _gets(nginx))
    assert fetched < metadata, (fetched, metadata)
