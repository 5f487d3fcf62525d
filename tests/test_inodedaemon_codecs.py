"""Format 1.5's codecs (format section 4f) served by the compiled daemon: zstd files,
with and without a dictionary, zstd frames, sparse files and shared records, through
real mounts (``--binding lowlevel``, which refuses to fall back to the Python daemon)
and through the Tree's own methods; damaged and hostile records answer EIO for their
file alone while every other file keeps reading."""

from __future__ import annotations

import errno
import os
import random
import struct
from pathlib import Path

import pytest

import packfs
from packfs.core import Archive
from packfs.format import EXTENT, FRAME_ROW
from tests.codec_archives import Codec, Layout, codec_archive, train_dictionary
from tests.conftest import mounted

pytestmark = pytest.mark.fuse

_rng = random.Random(15)
TEXT = b"".join(b"line %d: the quick brown fox %d jumps\n" % (i, _rng.randrange(1000)) for i in range(60000))
SAMPLES = [b"{\"id\": %d, \"name\": \"%s\", \"tags\": [\"a\", \"b\"], \"value\": %d}\n" % (i, b"n" * (i % 9), i * 7)
           for i in range(400)]
DICTIONARY = train_dictionary(SAMPLES, 2048)


def _sparse(size: int, extents: list[tuple[int, int]]) -> bytes:
    data = bytearray(size)
    for at, length in extents:
        data[at : at + length] = bytes(_rng.randrange(1, 256) for _ in range(length))
    return bytes(data)


CONTENTS = {
    "small.txt": b"hello, compressed world\n" * 20,
    "empty_zstd": b"",
    "frames.txt": TEXT,                                   # 64 KiB frames: about 36 of them
    "big_frames.bin": TEXT[:3 << 20] + os.urandom(100),  # 1 MiB frames
    "dict/a.json": b"".join(SAMPLES[10:20]),
    "dict/b.json": b"".join(SAMPLES[30:33]),
    "sparse.bin": _sparse(1 << 21, [(4096, 8192), (70000, 5), (1 << 20, 4096), ((1 << 21) - 100, 100)]),
    "sparse_hole_end.bin": _sparse(300000, [(0, 4096)]),
    "plain.txt": b"stored as it is\n",
    "copies/one.txt": b"the same contents under three names\n" * 50,
    "copies/two.txt": b"the same contents under three names\n" * 50,
    "copies/three.txt": b"the same contents under three names\n" * 50,
}
CODECS = {
    "small.txt": Codec("zstd"),
    "empty_zstd": Codec("zstd"),
    "frames.txt": Codec("frames", frame_log2=16),
    "big_frames.bin": Codec("frames", frame_log2=20),
    "dict/a.json": Codec("zstd", dictionary="json"),
    "dict/b.json": Codec("zstd", dictionary="json"),
    "sparse.bin": Codec("sparse"),
    "sparse_hole_end.bin": Codec("sparse"),
    "copies/one.txt": Codec("zstd"),
}
MODES = {"copies/two.txt": 0o600, "copies/three.txt": 0o755}
SHARED = {"copies/two.txt": "copies/one.txt", "copies/three.txt": "copies/one.txt"}


def _entries() -> list[packfs.Entry]:
    entries = [packfs.Entry(path, data, mode=MODES.get(path, 0o644), mtime_ns=(1_600_000_000 + i) * 10**9)
               for i, (path, data) in enumerate(CONTENTS.items())]
    entries.append(packfs.Entry("link", kind="symlink", target="small.txt"))
    return entries


def _build(out: Path, tamper=None) -> Path:
    return codec_archive(out, _entries(), CODECS, dictionaries={"json": DICTIONARY}, shared=SHARED, tamper=tamper)


@pytest.fixture(scope="module")
def codecs_archive(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("codecs") / "codecs.ffr")


def _lowlevel_tree(archive: Path):
    from packfs.fuse import tree_for, unavailable

    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    opened = Archive(archive, checksums="once")
    return opened, tree_for(opened, log_fd=os.open(os.devnull, os.O_WRONLY))


def _read_whole(tree, inode: int, chunk: int = 128 << 10) -> bytes:
    parts = []
    offset = 0
    while True:
        data = tree.read(inode, offset, chunk)
        if not data:
            return b"".join(parts)
        parts.append(data)
        offset += len(data)


def test_every_codec_reads_back_through_a_mount(codecs_archive: Path, tmp_path: Path) -> None:
    with mounted(codecs_archive, tmp_path / "m", binding="lowlevel") as mountpoint:
        for path, data in CONTENTS.items():
            assert os.stat(mountpoint / path).st_size == len(data), path
            assert (mountpoint / path).read_bytes() == data, path
        assert os.readlink(mountpoint / "link") == "small.txt"
        assert (mountpoint / "link").read_bytes() == CONTENTS["small.txt"]


def test_random_reads_inside_frames_and_sparse_files(codecs_archive: Path, tmp_path: Path) -> None:
    rng = random.Random(5)
    with mounted(codecs_archive, tmp_path / "m", "-o", "direct_io", binding="lowlevel") as mountpoint:
        for path in ("frames.txt", "big_frames.bin", "sparse.bin", "sparse_hole_end.bin", "small.txt"):
            data = CONTENTS[path]
            fd = os.open(mountpoint / path, os.O_RDONLY)
            try:
                for _ in range(200):
                    offset = rng.randrange(len(data) + 10)
                    size = rng.choice([1, 7, 4096, 65535, 65536, 65537, 200_000, 1 << 20])
                    assert os.pread(fd, size, offset) == data[offset : offset + size], (path, offset, size)
            finally:
                os.close(fd)


def test_sparse_holes_read_as_zeros_at_their_edges(codecs_archive: Path, tmp_path: Path) -> None:
    data = CONTENTS["sparse.bin"]
    with mounted(codecs_archive, tmp_path / "m", "-o", "direct_io", binding="lowlevel") as mountpoint:
        fd = os.open(mountpoint / "sparse.bin", os.O_RDONLY)
        try:
            for at in (0, 4095, 4096, 12287, 12288, 69999, 70000, 70004, 70005, (1 << 20) - 1, (1 << 21) - 101,
                       (1 << 21) - 1):
                assert os.pread(fd, 3, at) == data[at : at + 3], at
        finally:
            os.close(fd)


def _many_extents(count: int, data: int = 8, hole: int = 8) -> bytes:
    """A file of ``count`` extents of ``data`` bytes (none zero), each followed by a hole."""
    return b"".join(bytes([1 + k % 251]) * data + bytes(hole) for k in range(count))


def test_the_last_extents_of_a_file_of_many_read_right(tmp_path: Path) -> None:
    """Issue 34: a READ finds its extents by a binary search and the record positions
    kept at the first READ (it walked the list from the first before): the last
    extents, the first, extents beside each kept position (every 64th), a hole at the
    end, and a read across many, through a mount and through the Tree."""
    count = 200_000
    contents = _many_extents(count) + bytes(1000)
    archive = codec_archive(tmp_path / "many.ffr", [packfs.Entry("many.bin", contents), packfs.Entry("few.bin", b"x")],
                            {"many.bin": Codec("sparse", block=8)})
    end = len(contents)
    reads = [(end - 16 * 64, 16 * 64), (end - 1200, 1200), (end - 1000, 1000), (end - 17, 5), (0, 100),
             (16 * 64 - 3, 6), (16 * 64 * 1000 + 7, 16 * 64 * 3), (16 * 63, 40), (end // 2, 1 << 20), (0, end)]
    with mounted(archive, tmp_path / "m", "-o", "direct_io", binding="lowlevel") as mountpoint:
        fd = os.open(mountpoint / "many.bin", os.O_RDONLY)
        try:
            for at, size in reads:
                assert os.pread(fd, size, at) == contents[at : at + size], (at, size)
        finally:
            os.close(fd)
        assert (mountpoint / "many.bin").read_bytes() == contents
    opened, tree = _lowlevel_tree(archive)
    try:
        inode = opened.inode(opened.find(b"many.bin"))
        for at, size in reversed(reads[:-1]):  # a Tree's read is at most a READ's 1 MiB
            assert tree.read(inode, at, size) == contents[at : at + size], (at, size)
    finally:
        opened.close()


def test_shared_records_keep_their_own_inodes_and_modes(codecs_archive: Path, tmp_path: Path) -> None:
    with mounted(codecs_archive, tmp_path / "m", binding="lowlevel") as mountpoint:
        stats = {name: os.stat(mountpoint / "copies" / name) for name in ("one.txt", "two.txt", "three.txt")}
        assert len({st.st_ino for st in stats.values()}) == 3
        assert [st.st_mode & 0o7777 for st in stats.values()] == [0o644, 0o600, 0o755]
        assert len({st.st_mtime_ns for st in stats.values()}) == 3
        assert all(st.st_nlink == 1 for st in stats.values())
        for name in stats:
            assert (mountpoint / "copies" / name).read_bytes() == CONTENTS["copies/one.txt"]


def _daemon_read_calls(mountpoint: Path) -> int:
    """The read system calls the daemon serving ``mountpoint`` made so far (each FUSE
    request it takes is one, besides its preads)."""
    from tests.conftest import daemon_pid

    io = Path(f"/proc/{daemon_pid(mountpoint)}/io").read_text()
    return int(io.split("syscr:")[1].split()[0])


def test_warm_reads_of_compressed_files_never_reach_the_daemon(codecs_archive: Path, tmp_path: Path) -> None:
    """The kernel keeps a decoded file's pages (no_open: as a stored file's), so a
    second read of a 2.4 MB file of 36 zstd frames is not one request."""
    with mounted(codecs_archive, tmp_path / "m", binding="lowlevel") as mountpoint:
        path = mountpoint / "frames.txt"
        before = _daemon_read_calls(mountpoint)
        assert path.read_bytes() == CONTENTS["frames.txt"]
        cold = _daemon_read_calls(mountpoint) - before
        with open(path, "rb", buffering=0) as stream:  # another open: the kernel keeps the pages across opens
            assert stream.read() == CONTENTS["frames.txt"]
        warm = _daemon_read_calls(mountpoint) - before - cold
        assert cold >= 3 and warm == 0, (cold, warm)


def test_a_frame_is_decoded_once_for_the_reads_that_cover_it(codecs_archive: Path) -> None:
    opened, tree = _lowlevel_tree(codecs_archive)
    with opened:
        inode = tree.lookup(1, b"big_frames.bin")["st_ino"]
        before = tree.decodes()
        for offset in range(0, 1 << 20, 128 << 10):  # 8 READs of 128 KiB: one 1 MiB frame
            assert tree.read(inode, offset, 128 << 10) == CONTENTS["big_frames.bin"][offset : offset + (128 << 10)]
        assert tree.decodes() - before == 1
        small = tree.lookup(1, b"small.txt")["st_ino"]
        for offset in range(0, 480, 48):
            assert tree.read(small, offset, 48) == CONTENTS["small.txt"][offset : offset + 48]
        assert tree.decodes() - before == 2


def test_the_tree_reads_every_codec_and_the_kept_frames_stay_bounded(codecs_archive: Path) -> None:
    opened, tree = _lowlevel_tree(codecs_archive)
    with opened:
        for path, data in CONTENTS.items():
            directory, _, name = path.rpartition("/")
            parent = tree.lookup(1, directory.encode())["st_ino"] if directory else 1
            assert _read_whole(tree, tree.lookup(parent, name.encode())["st_ino"]) == data, path
        # 36 + 4 frames and the small files were decoded; at most 16 are kept, so a second
        # pass over the first frames decodes them again.
        before = tree.decodes()
        assert _read_whole(tree, tree.lookup(1, b"frames.txt")["st_ino"], 1 << 16) == CONTENTS["frames.txt"]
        assert tree.decodes() > before


# -- damage: each broken file is EIO, the others read ------------------------------------


def _frame_aux(layout: Layout, path: str) -> int:
    return layout.aux_of[path]


def _hostile(layout: Layout) -> None:
    """Break one rule of section 4f per file, every CRC of the archive recomputed."""
    # frames.txt: frame 3's stored_crc wrong
    at = layout.aux_of["frames.txt"] + FRAME_ROW.size * 3 + 8
    layout.codec_data[at] ^= 0xFF
    # big_frames.bin: frame 1's stored_end past the record's end
    at = layout.aux_of["big_frames.bin"] + FRAME_ROW.size * 1
    struct.pack_into("<Q", layout.codec_data, at, len(layout.data[layout.record_of["big_frames.bin"]]) + 1)
    # sparse.bin: an extent running past the file's end
    at = layout.aux_of["sparse.bin"] + 8 + EXTENT.size * 1 + 8
    struct.pack_into("<Q", layout.codec_data, at, 1 << 40)
    # small.txt: a zstd frame that decodes to 1,000 times its size (a decompression bomb)
    import zstandard

    layout.data[layout.record_of["small.txt"]] = zstandard.ZstdCompressor().compress(CONTENTS["small.txt"] * 1000)


def test_hostile_codec_rows_answer_eio_for_their_file_alone(tmp_path: Path) -> None:
    archive = _build(tmp_path / "hostile.ffr", _hostile)
    broken = {"small.txt", "big_frames.bin", "sparse.bin", "link"}
    with mounted(archive, tmp_path / "m", "-o", "direct_io", binding="lowlevel") as mountpoint:
        with pytest.raises(OSError) as caught:
            (mountpoint / "small.txt").read_bytes()
        assert caught.value.errno == errno.EIO
        fd = os.open(mountpoint / "frames.txt", os.O_RDONLY)
        try:
            assert os.pread(fd, 100, 0) == CONTENTS["frames.txt"][:100]  # frame 0 is sound
            with pytest.raises(OSError) as caught:
                os.pread(fd, 100, 3 << 16)  # frame 3's stored bytes fail their CRC
            assert caught.value.errno == errno.EIO
        finally:
            os.close(fd)
        for path in ("big_frames.bin", "sparse.bin"):
            with pytest.raises(OSError) as caught:
                (mountpoint / path).read_bytes()
            assert caught.value.errno == errno.EIO, path
        for path, data in CONTENTS.items():
            if path not in broken | {"frames.txt"}:
                assert (mountpoint / path).read_bytes() == data, path
        from packfs.fuse import state_file

        log = Path(state_file(str(mountpoint), ".log")).read_text()
        assert "format section 4f" in log


def test_a_frame_that_decodes_to_more_than_it_says_is_eio(tmp_path: Path) -> None:
    codecs = dict(CODECS)
    codecs["frames.txt"] = Codec("frames", frame_log2=16, frame_override={2: TEXT[2 << 16 : 3 << 16] + b"more"})
    archive = codec_archive(tmp_path / "longer.ffr", _entries(), codecs, dictionaries={"json": DICTIONARY},
                            shared=SHARED)
    with mounted(archive, tmp_path / "m", "-o", "direct_io", binding="lowlevel") as mountpoint:
        fd = os.open(mountpoint / "frames.txt", os.O_RDONLY)
        try:
            assert os.pread(fd, 10, (1 << 16) + 5) == TEXT[(1 << 16) + 5 : (1 << 16) + 15]
            with pytest.raises(OSError) as caught:
                os.pread(fd, 10, (2 << 16) + 5)
            assert caught.value.errno == errno.EIO
        finally:
            os.close(fd)
        assert (mountpoint / "dict/a.json").read_bytes() == CONTENTS["dict/a.json"]


def test_a_frame_that_decodes_to_other_bytes_than_its_crc_is_eio(tmp_path: Path) -> None:
    """Stored bytes that match their CRC and decode to the frame's size, but not to the
    bytes decoded_crc was taken of: the check after decoding finds it."""
    codecs = dict(CODECS)
    codecs["frames.txt"] = Codec("frames", frame_log2=16, frame_override={4: b"o" * 65536})
    archive = codec_archive(tmp_path / "other.ffr", _entries(), codecs, dictionaries={"json": DICTIONARY},
                            shared=SHARED)
    opened, tree = _lowlevel_tree(archive)
    with opened:
        inode = tree.lookup(1, b"frames.txt")["st_ino"]
        assert tree.read(inode, 3 << 16, 100) == TEXT[3 << 16 : (3 << 16) + 100]
        with pytest.raises(OSError) as caught:
            tree.read(inode, (4 << 16) + 10, 100)
        assert caught.value.errno == errno.EIO


def _record_offset(archive: Path, record: int) -> int:
    data = archive.read_bytes()
    n = struct.unpack_from("<q", data, 4)[0]
    return struct.unpack_from("<q", data, 12 + 4 * n + 8 * record)[0]


def test_damaged_bytes_answer_eio_for_the_files_they_hold(tmp_path: Path) -> None:
    """Bytes flipped in the archive as a disk would: a compressed record, a dictionary
    (both its files), and a page of codec_data (the frame tables and extent lists on it,
    found by the tail's page CRC), nothing recomputed."""
    layouts: list[Layout] = []
    archive = _build(tmp_path / "damaged.ffr", layouts.append)
    layout = layouts[0]
    data = bytearray(archive.read_bytes())
    data[_record_offset(archive, layout.record_of["small.txt"]) + 5] ^= 0x55
    data[_record_offset(archive, layout.dictionary_record["json"]) + 100] ^= 0x55
    damaged = tmp_path / "damaged2.ffr"
    damaged.write_bytes(bytes(data))
    with mounted(damaged, tmp_path / "m", binding="lowlevel") as mountpoint:
        for path in ("small.txt", "dict/a.json", "dict/b.json"):
            with pytest.raises(OSError) as caught:
                (mountpoint / path).read_bytes()
            assert caught.value.errno == errno.EIO, path
        for path in ("frames.txt", "big_frames.bin", "sparse.bin", "copies/two.txt", "plain.txt"):
            assert (mountpoint / path).read_bytes() == CONTENTS[path], path
    # a byte of codec_data (section 23): its page fails its CRC
    with Archive(archive) as opened:
        codec_data_start = opened.page_checks[1][-1][0]
    data = bytearray(archive.read_bytes())
    data[codec_data_start + layout.aux_of["sparse.bin"] + 8] ^= 0x01
    damaged.write_bytes(bytes(data))
    with mounted(damaged, tmp_path / "m2", binding="lowlevel") as mountpoint:
        for path in ("sparse.bin", "frames.txt"):
            with pytest.raises(OSError) as caught:
                (mountpoint / path).read_bytes()
            assert caught.value.errno == errno.EIO, path
        for path in ("small.txt", "dict/a.json", "copies/three.txt", "plain.txt"):
            assert (mountpoint / path).read_bytes() == CONTENTS[path], path


def _packed_tree(src: Path) -> dict[str, bytes]:
    rng = random.Random(3)
    (src / "docs").mkdir(parents=True)
    files: dict[str, bytes] = {}
    for i in range(300):  # enough alike small files for --dictionary auto to train one
        files[f"docs/r{i}.json"] = (b'{"id": %d, "name": "%s", "tags": ["alpha", "beta"], "v": %d}\n'
                                    % (i, b"n" * (i % 11), i * i)) * (1 + i % 5)
    files["big.txt"] = b"".join(b"line %d %d\n" % (i, rng.randrange(99)) for i in range(400_000))
    files["dup1.txt"] = files["dup2.txt"] = b"duplicate " * 1000
    files["random.bin"] = os.urandom(200_000)
    for path, data in files.items():
        (src / path).write_bytes(data)
    os.chmod(src / "dup2.txt", 0o600)
    with open(src / "sparse.img", "wb") as sparse:  # holes the packer finds with SEEK_HOLE
        sparse.truncate(8 << 20)
        sparse.seek(1 << 20)
        sparse.write(os.urandom(70_000))
        sparse.seek(5 << 20)
        sparse.write(b"z" * 100_000)
    files["sparse.img"] = (src / "sparse.img").read_bytes()
    return files


def test_what_the_packer_writes_with_every_codec_reads_back(tmp_path: Path) -> None:
    files = _packed_tree(tmp_path / "src")
    archive = tmp_path / "packed.ffr"
    packfs.pack_folder(tmp_path / "src", archive, compress="zstd", dictionary="auto", dedup=True, sparse=True)
    with Archive(archive) as opened:
        start, end = opened.page_checks[1][-2]  # record_codec (format section 4f)
    rows = archive.read_bytes()[start:end]
    assert {rows[at] for at in range(0, len(rows), 16)} == {0, 1, 2, 3, 4}  # every codec, a dictionary
    rng = random.Random(9)
    with mounted(archive, tmp_path / "m", binding="lowlevel") as mountpoint:
        for path, data in files.items():
            assert (mountpoint / path).read_bytes() == data, path
        one, two = os.stat(mountpoint / "dup1.txt"), os.stat(mountpoint / "dup2.txt")
        assert one.st_ino != two.st_ino and (one.st_mode & 0o777, two.st_mode & 0o777) == (0o644, 0o600)
        for path in ("big.txt", "sparse.img"):
            with open(mountpoint / path, "rb") as stream:
                for _ in range(100):
                    offset = rng.randrange(len(files[path]))
                    assert os.pread(stream.fileno(), 5000, offset) == files[path][offset : offset + 5000]


def test_built_without_libzstd_the_daemon_refuses_codecs_and_mount_falls_back(codecs_archive: Path,
                                                                                tmp_path: Path) -> None:
    """setup.py builds the extension with PACKFS_NO_ZSTD where libzstd's headers are
    missing: that build says so (ZSTD_VERSION 0), refuses a Tree with codecs in one
    line naming the library, and `packfs mount` then serves with the Python daemon."""
    import importlib.util
    import shutil
    import subprocess
    import sysconfig

    from packfs.fuse import unavailable

    if unavailable() is not None or shutil.which("gcc") is None or shutil.which("pkg-config") is None:
        pytest.skip("needs the compiled daemon's build tools")
    fuse3 = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True,
                           check=True).stdout.split()
    built = tmp_path / "_lowlevel.so"
    package = Path(__file__).resolve().parent.parent / "packfs"
    sources = [str(source) for folder in ("cformat", "cpython", "cdaemon") for source in sorted((package / folder).glob("*.c"))]
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", "-DPACKFS_NO_ZSTD", f"-I{sysconfig.get_paths()['include']}",
                    *sources, "-o", str(built), *fuse3, "-lz"], check=True)
    spec = importlib.util.spec_from_file_location("packfs_without_zstd._lowlevel", built)
    without = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(without)
    assert without.ZSTD_VERSION == 0
    with Archive(codecs_archive) as opened:
        source_ = opened.source
        with pytest.raises(ValueError, match="built without libzstd"):
            without.Tree(source_.mapping, source_.fileno(), -1, opened.record_count, opened.data_records,
                         opened.entry_count, opened.section_spans, True, "codecs.ffr", 2,
                         pieces=opened.piece_spans, xattrs=opened.xattr_spans, pages=opened.page_checks,
                         codecs=tuple(opened.page_checks[1][-2:]))


def test_auto_falls_back_to_the_python_daemon_naming_libzstd(codecs_archive: Path, monkeypatch) -> None:
    from packfs import _lowlevel
    from packfs.fuse import choose_binding, unavailable

    if unavailable() is not None:
        pytest.skip(unavailable())
    monkeypatch.setattr(_lowlevel, "ZSTD_VERSION", 0)
    with Archive(codecs_archive) as opened:
        binding, notice = choose_binding("auto", opened)
        assert binding != "lowlevel" and "libzstd" in notice
        with pytest.raises(packfs.errors.MountError, match="libzstd"):
            choose_binding("lowlevel", opened)


def test_read_file_finds_reads_and_decodes_in_one_call(codecs_archive: Path) -> None:
    """The in-process read path (Tree.read_file): a stored path's whole contents, each
    codec decoded; the errno of a READ or a lookup otherwise."""
    opened, tree = _lowlevel_tree(codecs_archive)
    with opened:
        for path, data in CONTENTS.items():
            assert tree.read_file(path.encode()) == data, path
        for path, expected in ((b"nothing", errno.ENOENT), (b"dict", errno.EISDIR), (b"", errno.EISDIR),
                               (b"link", errno.EINVAL), (b"/small.txt", errno.ENOENT), (b"dict/", errno.ENOENT),
                               (b"dict//a.json", errno.ENOENT), (b"copies/one.txt/x", errno.ENOENT)):
            with pytest.raises(OSError) as caught:
                tree.read_file(path)
            assert caught.value.errno == expected, path


def test_read_file_answers_eio_for_a_damaged_file_alone(tmp_path: Path) -> None:
    archive = _build(tmp_path / "hostile.ffr", _hostile)
    opened, tree = _lowlevel_tree(archive)
    with opened:
        for path in ("small.txt", "big_frames.bin", "sparse.bin", "frames.txt"):
            with pytest.raises(OSError) as caught:
                tree.read_file(path.encode())
            assert caught.value.errno == errno.EIO, path
        assert tree.read_file(b"dict/b.json") == CONTENTS["dict/b.json"]
        assert tree.read_file(b"copies/three.txt") == CONTENTS["copies/three.txt"]


def test_read_file_of_a_stored_archive_with_hard_links(archive: Path) -> None:
    """Format 1.4 (no codecs): every file of the suite's tree, hard links included."""
    opened, tree = _lowlevel_tree(archive)
    with opened, packfs.PackedFolder(archive) as folder:
        files = [f"{top}/{name}".lstrip("/") for top, _, names in folder.walk() for name in names]
        assert "hardlink.txt" in files
        for path in files:
            if folder.is_symlink(path):
                continue
            assert tree.read_file(os.fsencode(path)) == folder.read(path), path


def test_a_compressed_shard_set_mounts_as_one_tree(tmp_path: Path) -> None:
    """A Forest of compressed shards (each with its own dictionary): every file reads
    back, the decoded frames kept for the whole daemon, not per shard."""
    from packfs.write.shards import pack_shards

    files = _packed_tree(tmp_path / "src")
    pack_shards(tmp_path / "src", tmp_path / "set.ffr", shards=3,
                codecs={"compress": "zstd", "dictionary": "auto", "dedup": True})
    rng = random.Random(11)
    with mounted(tmp_path / "set.ffrset", tmp_path / "m", binding="lowlevel") as mountpoint:
        for path, data in files.items():
            assert (mountpoint / path).read_bytes() == data, path
        with open(mountpoint / "big.txt", "rb", buffering=0) as stream:
            for _ in range(50):
                offset = rng.randrange(len(files["big.txt"]))
                assert os.pread(stream.fileno(), 3000, offset) == files["big.txt"][offset : offset + 3000]


@pytest.mark.parametrize("change", ["stored aux", "stored check", "dictionary check", "unknown codec",
                                    "frames log2", "reserved", "frames aux at the end", "extents over bytes"])
def test_a_codec_row_that_breaks_its_codecs_rules_is_eio(tmp_path: Path, change: str) -> None:
    """Section 4f's rules for a row, each broken alone (every CRC recomputed): the file
    it names answers EIO, to stat as to READ, and the others read."""
    target = {"stored aux": "plain.txt", "stored check": "plain.txt", "dictionary check": "dict/a.json",
              "unknown codec": "small.txt", "frames log2": "frames.txt", "reserved": "small.txt",
              "frames aux at the end": "frames.txt", "extents over bytes": "sparse.bin"}[change]

    def tamper(layout: Layout) -> None:
        row = 16 * (layout.dictionary_record["json"] if change == "dictionary check" else layout.record_of[target])
        rows, data = layout.record_codec, layout.codec_data
        if change == "stored aux":
            struct.pack_into("<Q", rows, row + 8, 8)
        elif change in ("stored check", "dictionary check"):
            struct.pack_into("<I", rows, row + 4, 1)
        elif change == "unknown codec":
            rows[row] = 5
        elif change == "frames log2":
            rows[row + 1] = 21
        elif change == "reserved":
            rows[row + 2] = 1
        elif change == "frames aux at the end":
            struct.pack_into("<Q", rows, row + 8, len(data) + (-len(data) % 8))
        else:  # as many extents as the section holds, more than the record's bytes
            aux = layout.aux_of[target]
            struct.pack_into("<Q", data, aux, len(layout.data[layout.record_of[target]]) + 1)
            data += bytes(16 * (len(layout.data[layout.record_of[target]]) + 1))

    archive = _build(tmp_path / "row.ffr", tamper)
    opened, tree = _lowlevel_tree(archive)
    with opened:
        parent = tree.lookup(1, b"dict")["st_ino"] if target.startswith("dict/") else 1
        with pytest.raises(OSError) as caught:
            tree.lookup(parent, target.rpartition("/")[2].encode())
        assert caught.value.errno == errno.EIO
        with pytest.raises(OSError) as caught:
            tree.read_file(target.encode())
        assert caught.value.errno == errno.EIO
        assert tree.read_file(b"copies/one.txt") == CONTENTS["copies/one.txt"]


@pytest.mark.parametrize("after", ["a second frame", "a skippable frame"])
def test_a_zstd_record_is_one_frame_and_nothing_after_it(tmp_path: Path, after: str) -> None:
    """Section 4f: a CODEC_ZSTD record is one zstd frame.  zstd itself would decode a
    second frame after the first (here: the file's two halves, which decode to its
    size) or skip a skippable one; the daemon refuses both, as packfs.core does."""
    import zstandard

    data = CONTENTS["small.txt"]

    def tamper(layout: Layout) -> None:
        compressor = zstandard.ZstdCompressor()
        if after == "a second frame":
            stored = compressor.compress(data[:100]) + compressor.compress(data[100:])
        else:
            stored = compressor.compress(data) + struct.pack("<II", 0x184D2A50, 4) + b"junk"
        layout.data[layout.record_of["small.txt"]] = stored

    archive = _build(tmp_path / "frames.ffr", tamper)
    opened, tree = _lowlevel_tree(archive)
    with opened:
        with pytest.raises(OSError) as caught:
            tree.read_file(b"small.txt")
        assert caught.value.errno == errno.EIO
        assert tree.read_file(b"dict/a.json") == CONTENTS["dict/a.json"]


def claim_a_huge_sparse_file(layout: Layout) -> None:
    """A tamper for _build: sparse.bin's size says 2**62 bytes (its record holds a few)."""
    import numpy as np

    sizes = np.frombuffer(layout.sections[5], "<u8").copy()
    records = np.frombuffer(layout.sections[6], "<u8")
    sizes[list(records).index(layout.record_of["sparse.bin"])] = 1 << 62
    layout.sections[5] = sizes.tobytes()


def test_read_file_allocates_at_most_max_size(tmp_path: Path) -> None:
    """A sparse file may claim any size up to 2**63 - 1 in a few bytes of the archive
    (fuzz finding tests/fuzz_c/read-file-of-a-huge-file.ffr): read_file(max_size=)
    answers EFBIG having allocated at most max_size + 1 bytes, and without a limit a
    size no allocation can hold is ENOMEM, not a crash."""
    archive = _build(tmp_path / "huge.ffr", claim_a_huge_sparse_file)
    opened, tree = _lowlevel_tree(archive)
    with opened:
        assert tree.getattr(tree.lookup(1, b"sparse.bin")["st_ino"])["st_size"] == 1 << 62
        with pytest.raises(OSError) as caught:
            tree.read_file(b"sparse.bin", max_size=1 << 20)
        assert caught.value.errno == errno.EFBIG
        with pytest.raises(OSError) as caught:
            tree.read_file(b"sparse.bin")
        assert caught.value.errno == errno.ENOMEM
        assert tree.read_file(b"small.txt", max_size=len(CONTENTS["small.txt"])) == CONTENTS["small.txt"]
        with pytest.raises(OSError) as caught:
            tree.read_file(b"small.txt", max_size=len(CONTENTS["small.txt"]) - 1)
        assert caught.value.errno == errno.EFBIG
