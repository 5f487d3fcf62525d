"""Hostile inputs from the adversarial review: long symlink targets (at pack, at read,
through FUSE), closing under concurrent use, and stat values the kernel refuses."""

from __future__ import annotations

import dataclasses
import errno
import gc
import io
import logging
import os
import random
import stat
import sys
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

import packfs
from packfs import FormatError, PackedFolder, PackError, PathNotFoundError
from packfs.format import MAX_SYMLINK_TARGET, SECTION_ALIGNMENT, SECTIONS, header_size
from packfs.write import pack_archive
from packfs.fuse import PackfsOperations
from tests.conftest import HARDLINK, column_changed, mounted, read_records, rewrite_section, write_records, time_limit

_CLOSED_MESSAGE = "I/O operation on a closed archive"


def _errno(call) -> int:
    with pytest.raises(OSError) as caught:
        call()
    return caught.value.errno


# -- symlink targets longer than Linux allows --------------------------------------------


def test_pack_entries_refuses_a_target_longer_than_linux_allows(tmp_path: Path) -> None:
    longest = "d/" * (MAX_SYMLINK_TARGET // 2) + "x"  # exactly 4,095 bytes
    assert len(longest) == MAX_SYMLINK_TARGET
    packfs.pack_entries([packfs.Entry("l", kind="symlink", target=longest)], tmp_path / "ok.ffr")
    with PackedFolder(tmp_path / "ok.ffr") as folder:
        assert folder.readlink("l") == longest and folder.verify().ok
    with pytest.raises(PackError, match=r"'l' has a target of 4096 bytes, expected at most 4095"):
        packfs.pack_entries([packfs.Entry("l", kind="symlink", target=longest + "y")], tmp_path / "bad.ffr")
    assert not (tmp_path / "bad.ffr").exists()


def _tar_with_links(path: Path, links: dict[str, str]) -> Path:
    with tarfile.open(path, "w") as tar:
        data = b"kept"
        info = tarfile.TarInfo("file")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for name, target in links.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return path


@pytest.mark.parametrize("seekable", [True, False])
def test_tar_members_with_unstorable_targets_are_skipped_with_a_warning(tmp_path: Path, caplog,
                                                                         seekable: bool) -> None:
    source = _tar_with_links(tmp_path / "in.tar", {"long": "a/" * 5000, "empty": "", "fine": "file"})
    out = tmp_path / "out.ffr"
    with caplog.at_level(logging.WARNING, logger="packfs"):
        if seekable:
            pack_archive(str(source), out)
        else:  # a tar on stdin: member order, no seeking
            with open(source, "rb") as stream:
                pack_archive("-", out, stdin=stream)
    assert "skipped 'long': a symlink with a target of 10000 bytes, expected at most 4095" in caplog.text
    assert "skipped 'empty': a symlink with an empty target" in caplog.text
    with PackedFolder(out) as folder:
        assert folder.list() == ["file", "fine"] and folder.read("fine") == b"kept" and folder.verify().ok


def test_zip_members_with_long_targets_are_skipped_unread(tmp_path: Path, caplog, monkeypatch) -> None:
    source = tmp_path / "in.zip"
    with zipfile.ZipFile(source, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("file", b"kept")
        for name, target in (("long", b"a/" * 5000), ("fine", b"file")):
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, target)
    read = zipfile.ZipFile.read
    unread = []
    monkeypatch.setattr(zipfile.ZipFile, "read", lambda self, name, *a: unread.append(getattr(name, "filename", name))
                        or read(self, name, *a))
    with caplog.at_level(logging.WARNING, logger="packfs"):
        pack_archive(str(source), tmp_path / "out.ffr")
    assert "skipped 'long': a symlink with a target of 10000 bytes" in caplog.text
    assert "long" not in unread  # refused by its declared size, not decompressed first
    with PackedFolder(tmp_path / "out.ffr") as folder:
        assert folder.list() == ["file", "fine"] and folder.read("fine") == b"kept"


def _with_target(archive: Path, out: Path, link: str, target: bytes) -> Path:
    """Copy ``archive`` with symlink ``link``'s target replaced (record and size), every
    CRC recomputed: a hostile archive the writer would never make."""
    with PackedFolder(archive) as folder:
        entry = folder.archive.find(link.encode())
        record = folder.archive._table.record(entry)
        data_records = folder.footer.data_records
    records = read_records(archive)
    records[record] = target
    size_record = data_records + 2 * [name for name, _ in SECTIONS].index("size") + 1
    sizes = np.frombuffer(records[size_record], "<u8").copy()
    sizes[entry] = len(target)
    records[size_record] = sizes.tobytes()
    # Re-pad so every section still starts at a multiple of 64 (format section 2).
    position = header_size(len(records))
    for index, record in enumerate(records):
        if data_records <= index < data_records + 2 * len(SECTIONS) and (index - data_records) % 2 == 0:
            records[index] = bytes(-position % SECTION_ALIGNMENT)
        position += len(records[index])
    return write_records(out, records)


@pytest.fixture
def long_link(tmp_path: Path) -> Path:
    """``d/l`` points (through 64 KiB of ``d/..``) at ``f``; ``d/ok`` at ``../f``."""
    packfs.pack_entries([packfs.Entry("f", b"contents"), packfs.Entry("d", kind="dir"),
                         packfs.Entry("d/l", kind="symlink", target="../f"),
                         packfs.Entry("d/ok", kind="symlink", target="../f")], tmp_path / "base.ffr")
    return _with_target(tmp_path / "base.ffr", tmp_path / "long.ffr", "d/l", b"../d/" * 13107 + b"../f")


@pytest.mark.parametrize("check_data", [True, False])
def test_a_long_target_is_a_format_error_where_it_is_used(long_link: Path, check_data: bool) -> None:
    with PackedFolder(long_link, check_data=check_data) as folder:
        walked = []
        lookup_child = folder.archive._table.lookup_child
        folder.archive._table.lookup_child = lambda *args: walked.append(args) or lookup_child(*args)
        for use in (lambda: folder.read("d/l"), lambda: folder.readlink("d/l"), lambda: folder.exists("d/l"),
                    lambda: folder.stat("d/l", follow_symlinks=True), lambda: folder.open("d/l")):
            with pytest.raises(FormatError, match=r"symlink with a target of 65539 bytes, expected at most 4095"):
                use()
        assert len(walked) <= 10  # refused before its components were walked
        assert folder.read("d/ok") == b"contents"
        # Its attributes obey the rule its target breaks: no size of 65,539 handed out.
        with pytest.raises(FormatError, match=r"entry \d+ is a symlink with a target of 65539 bytes"):
            folder.stat("d/l")
        report = folder.verify()
        assert report.problems == ("symlink 'd/l' has a target of 65539 bytes, expected at most 4095",)


def test_fuse_readlink_of_a_long_target_is_eio(long_link: Path) -> None:
    with PackedFolder(long_link) as folder:
        ops = PackfsOperations(folder)
        assert _errno(lambda: ops.readlink("/d/l")) == errno.EIO
        assert _errno(lambda: ops.getattr("/d/l")) == errno.EIO  # its size breaks the target's rule
        assert ops.readlink("/d/ok") == "../f" and stat.S_ISLNK(ops.getattr("/d/ok")["st_mode"])


def _link_chain(tmp_path: Path, links: int, padding: int) -> Path:
    """``l0`` -> ``l1`` -> ... -> ``f``, each target ``padding`` bytes of ``d/../`` first."""
    filler = "d/../" * (padding // 5)
    entries = [packfs.Entry("f", b"end"), packfs.Entry("d", kind="dir")]
    entries += [packfs.Entry(f"l{i}", kind="symlink", target=filler + (f"l{i + 1}" if i + 1 < links else "f"))
                for i in range(links)]
    packfs.pack_entries(entries, tmp_path / "chain.ffr", force=True)
    return tmp_path / "chain.ffr"


def test_one_resolution_walks_a_bounded_number_of_components(tmp_path: Path) -> None:
    """The worst a valid archive can do: 40 hops through 4,095-byte targets."""
    with PackedFolder(_link_chain(tmp_path, 40, MAX_SYMLINK_TARGET - 5)) as folder:
        walked = []
        lookup_child = folder.archive._table.lookup_child
        folder.archive._table.lookup_child = lambda *args: walked.append(args) or lookup_child(*args)
        assert folder.read("l0") == b"end"
        assert len(walked) <= 40 * MAX_SYMLINK_TARGET // 2 + 1
    with PackedFolder(_link_chain(tmp_path, 41, 8)) as folder:
        with pytest.raises(PathNotFoundError, match="too many levels of symbolic links"):
            folder.read("l0")


def test_the_expansion_bound_holds_without_the_per_target_check(tmp_path: Path, monkeypatch) -> None:
    """Should a target's own length check ever be bypassed, one resolution still stops
    after 40 x 4,095 bytes of targets, long before 40 hops of 8 KiB."""
    monkeypatch.setattr(packfs.format, "MAX_SYMLINK_TARGET", 1 << 20)  # the writer's and readers' rule
    with PackedFolder(_link_chain(tmp_path, 30, 8190)) as folder:
        walked = []
        lookup_child = folder.archive._table.lookup_child
        folder.archive._table.lookup_child = lambda *args: walked.append(args) or lookup_child(*args)
        with pytest.raises(PathNotFoundError, match=r"their targets add up to more than 163800 bytes"):
            folder.read("l0")
        assert len(walked) <= 40 * MAX_SYMLINK_TARGET // 2 + 8190


# -- closing while other threads read ---------------------------------------------------


def _archive_fds(archive: Path) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == str(archive)
        except OSError:
            pass
    return count


def _archive_maps(archive: Path) -> int:
    return Path("/proc/self/maps").read_text().count(str(archive))


@pytest.fixture
def many_files(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    rng = random.Random(5)
    files = {f"d{i % 5}/f{i}": rng.randbytes(rng.choice((0, 1, 100, 5000, 70_000))) for i in range(120)}
    entries = [packfs.Entry(path, data) for path, data in files.items()]
    entries += [packfs.Entry("up/link", kind="symlink", target="../d1/f1")]
    files["up/link"] = files["d1/f1"]
    packfs.pack_entries(entries, tmp_path / "many.ffr")
    return tmp_path / "many.ffr", files


def _reader(folder: PackedFolder, files: dict[str, bytes], seed: int, start: threading.Barrier,
            errors: list[BaseException], wrong: list[str]) -> None:
    rng = random.Random(seed)
    paths = sorted(files)
    start.wait()
    while True:
        path = rng.choice(paths)
        try:
            operation = rng.randrange(7)
            if operation == 0:
                data = folder.read(path)
            elif operation == 1:
                data = folder.read([path])[0]
            elif operation == 2:
                with folder.read_view(path) as view:
                    data = view.tobytes()
            elif operation == 3:
                with folder.open(path) as handle:
                    data = handle.read()
            elif operation == 4:  # pread through the descriptor, as packfs.dataset does
                data = folder.archive.read(folder.archive.lookup(path))
            elif operation == 5:
                entries = np.array([folder.archive.lookup(p) for p in (path, "d2/f2", "d3/f3")])
                batch = dict(folder.archive.read_batch(entries))
                data = batch[0]
                if batch[1] != files["d2/f2"] or batch[2] != files["d3/f3"]:
                    wrong.append("batch")
            else:
                data = files[path] if folder.stat(path, follow_symlinks=True).size == len(files[path]) else b"?"
                folder.list("d1"), folder.exists("d4/f4"), list(folder.list_attributes("d0"))
        except BaseException as error:  # noqa: BLE001 - what escapes is what the test checks
            errors.append(error)
            return
        if data != files[path]:
            wrong.append(path)


def test_closing_under_concurrent_reads_gives_one_clear_error(many_files) -> None:
    """8 threads read every way there is while another closes the folder: each read
    either returns the right bytes or raises ClosedArchiveError (a ValueError) ("I/O operation on a closed
    archive"), whatever the interleaving; the map and descriptor are released once
    the last reader has let go."""
    archive, files = many_files
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, inside reads
    try:
        for round_ in range(30):
            folder = PackedFolder(archive, check_data=bool(round_ % 2))
            start = threading.Barrier(9)
            errors: list[BaseException] = []
            wrong: list[str] = []
            threads = [threading.Thread(target=_reader, args=(folder, files, 100 * round_ + i, start, errors, wrong))
                       for i in range(8)]
            for thread in threads:
                thread.start()
            start.wait()
            time.sleep(random.Random(round_).uniform(0, 0.004))
            folder.close()
            for thread in threads:
                thread.join(timeout=time_limit(60))
            assert not any(thread.is_alive() for thread in threads)
            assert not wrong, f"round {round_}: wrong bytes for {wrong[:5]}"
            kinds = {(type(error), str(error)) for error in errors}
            assert kinds == {(packfs.ClosedArchiveError, _CLOSED_MESSAGE)}, f"round {round_}: {errors[:3]!r}"
            assert len(errors) == 8
            # The errors' tracebacks hold the last references, in a cycle through the
            # readers' frames (which hold the list of errors).
            del errors, folder, threads
            gc.collect()
            assert _archive_fds(archive) == 0 and _archive_maps(archive) == 0, f"round {round_}"
    finally:
        sys.setswitchinterval(interval)


def test_close_of_an_idle_folder_releases_at_once_and_open_files_keep_working(many_files) -> None:
    archive, files = many_files
    folder = PackedFolder(archive)
    assert folder.read("d1/f1") == files["d1/f1"]
    folder.close()
    assert folder.closed and _archive_fds(archive) == 0 and _archive_maps(archive) == 0
    with pytest.raises(ValueError, match=_CLOSED_MESSAGE):
        folder.read("d1/f1")
    folder = PackedFolder(archive)
    handle, view = folder.open("d0/f0"), folder.read_view("d2/f2")
    folder.close()
    assert handle.read() == files["d0/f0"] and view.tobytes() == files["d2/f2"]
    view.release()
    handle.close()
    assert _archive_fds(archive) == 0 and _archive_maps(archive) == 0  # the last holder let go


# -- stat values the kernel cannot represent ----------------------------------------------

_EXTREMES = [
    packfs.Entry("owner", kind="dir", uid=2**32 - 1, gid=2**32 - 1),
    packfs.Entry("future", kind="dir", mtime_ns=2**63 - 1),
    packfs.Entry("past", kind="dir", mtime_ns=-(2**63)),
    packfs.Entry("huge", kind="dir"),
    packfs.Entry("file-owner", b"x", uid=2**32 - 1, gid=2**32 - 2),
    packfs.Entry("huge-file", b"x"),
]


@pytest.fixture
def extremes(tmp_path: Path) -> Path:
    """Owners and times at the ends of their columns, and (hostile: the writer never
    makes them) a directory and a file whose size is 2**64 - 1 (the file's then breaks
    the rule that it is its record's length)."""
    packfs.pack_entries(_EXTREMES, tmp_path / "extremes.ffr")
    with PackedFolder(tmp_path / "extremes.ffr") as folder:
        huge = [folder.archive.find(b"huge"), folder.archive.find(b"huge-file")]
    return rewrite_section(tmp_path / "extremes.ffr", tmp_path / "hostile.ffr", "size",
                           lambda size: size.__setitem__(huge, 2**64 - 1))


def test_getattr_clamps_what_the_kernel_cannot_represent(extremes: Path) -> None:
    with PackedFolder(extremes) as folder:
        ops = PackfsOperations(folder)
        assert (ops.getattr("/owner")["st_uid"], ops.getattr("/owner")["st_gid"]) == (2**32 - 2, 2**32 - 2)
        assert ops.getattr("/file-owner")["st_gid"] == 2**32 - 2
        assert ops.getattr("/huge")["st_size"] == 2**63 - 1
        assert _errno(lambda: ops.getattr("/huge-file")) == errno.EIO  # never a size its record disagrees with
        assert ops.getattr("/future")["st_mtime"] == 2**63 - 1 and ops.getattr("/past")["st_mtime"] == -(2**63)
        assert _errno(lambda: ops.open("/huge-file", os.O_RDONLY)) == errno.EIO  # its record disagrees


@pytest.mark.fuse
@pytest.mark.parametrize("binding", ["lowlevel", "mfusepy", "fusepy"])
def test_extreme_attributes_stat_through_a_mount(extremes: Path, tmp_path: Path, binding: str) -> None:
    with mounted(extremes, tmp_path / "mnt", binding=binding) as root:
        assert (root / "huge").lstat().st_size == 2**63 - 1  # was EIO: the kernel refuses > 2**63 - 1
        with pytest.raises(OSError) as caught:
            (root / "huge-file").lstat()  # its record is 1 byte long: EIO, never a size of 2**63 - 1
        assert caught.value.errno == errno.EIO
        assert (root / "owner").lstat().st_uid == 2**32 - 2
        assert (root / "future").lstat().st_mtime_ns == 2**63 - 1
        assert (root / "past").lstat().st_mtime_ns == -(2**63)
        assert sorted(os.listdir(root)) == sorted(entry.path for entry in _EXTREMES)
        with pytest.raises(OSError) as caught:
            (root / "huge-file").read_bytes()
        assert caught.value.errno == errno.EIO


# -- names longer than NAME_MAX (255 bytes) -----------------------------------------------

_LONG = (b"n" * 300, b"n" * 1100, b"d" * 256)  # long_name_archive's, the 256-byte one a directory
_LISTED = [b"a.txt", b"m" * 255, b"z.txt"]


@pytest.fixture
def long_names(tmp_path: Path) -> Path:
    from tests.hostile import long_name_archive

    return long_name_archive(tmp_path / "long.ffr")


def test_verify_names_each_name_over_255_bytes_and_the_library_still_reads_them(long_names: Path) -> None:
    with PackedFolder(long_names) as folder:
        report = folder.verify()
        assert not report.ok and not report.bad_records
        assert sorted(report.problems) == sorted(
            f"'dir/{name.decode()}' has a name of {len(name)} bytes, expected at most 255 (NAME_MAX)" for name in _LONG)
        assert folder.read("dir/" + "n" * 300) == b"300\n"  # no use of it is unsafe


def test_the_python_daemon_leaves_long_names_out_logged_once(long_names: Path, caplog) -> None:
    with PackedFolder(long_names) as folder:
        ops = PackfsOperations(folder)
        for _ in range(2):
            assert [name for name, _, _ in ops.readdir("/dir", 0)][2:] == [name.decode() for name in _LISTED]
        logged = [record.getMessage() for record in caplog.records]
        assert len(logged) == 3 and all("left out of the listing" in message for message in logged)
        for name in _LONG:
            assert sum(f"a name of {len(name)} bytes" in message for message in logged) == 1
            assert _errno(lambda: ops.getattr("/dir/" + name.decode())) == errno.ENAMETOOLONG
        assert _errno(lambda: ops.getattr("/dir/" + "d" * 256 + "/inner.txt")) == errno.ENAMETOOLONG
        assert _errno(lambda: ops.getattr("/dir/" + "x" * 256)) == errno.ENAMETOOLONG  # not there either
        assert ops.read("/dir/" + "m" * 255, 100, 0, 0) == b"255\n"
        assert ops.statfs("/")["f_namemax"] == 255


def test_the_compiled_daemon_leaves_long_names_out_logged_once(long_names: Path, tmp_path: Path) -> None:
    from packfs.core import Archive
    from packfs.fuse import tree_for, unavailable

    if unavailable() is not None:
        pytest.skip(unavailable())
    with Archive(long_names, checksums="once") as opened, open(tmp_path / "log", "wb") as log:
        tree = tree_for(opened, log.fileno())
        directory = tree.lookup(1, b"dir")["st_ino"]
        for _ in range(2):
            listing = tree.readdir(directory)
            assert [name for name, *_ in listing] == [b".", b".."] + _LISTED
        # Positions stay those of the children, so a listing resumes anywhere.
        assert [offset for *_, offset in listing] == [1, 2, 3, 5, 8]
        assert tree.readdir(directory, 4) == listing[3:]
        for name in _LONG:
            assert _errno(lambda: tree.lookup(directory, name)) == errno.ENAMETOOLONG
        assert tree.lookup(directory, b"m" * 255)["st_size"] == 4
    lines = (tmp_path / "log").read_text().splitlines()
    assert len(lines) == 3 and all("longer than 255 (NAME_MAX): left out of its directory's listing" in line
                                   for line in lines), lines


@pytest.mark.fuse
def test_a_mount_lists_a_directory_with_long_names_without_them(long_names: Path, tmp_path: Path) -> None:
    """Both daemons (PACKFS_TEST_BINDING): the directory lists its other names (the
    compiled daemon answered EIO for all of it), a long name is ENAMETOOLONG."""
    with mounted(long_names, tmp_path / "mnt") as root:
        assert sorted(os.listdir(root / "dir")) == [name.decode() for name in _LISTED]
        assert (root / "dir" / ("m" * 255)).read_bytes() == b"255\n"
        for name in _LONG:
            with pytest.raises(OSError) as caught:
                os.stat(root / "dir" / name.decode())
            assert caught.value.errno == errno.ENAMETOOLONG
        assert os.statvfs(root).f_namemax == 255


# -- attributes that break the rules of the data they describe -----------------------------


def test_stat_refuses_a_size_that_is_not_its_records_length(archive: Path, tmp_path: Path) -> None:
    """Issue 23: stat handed out the size column as stored while reads refused it, so a
    mount showed a 12-byte file as empty.  Archive.stat, which PackedFolder.stat and the
    Python daemon's GETATTR use, now holds a size to its record's length (EIO through
    the daemon), and every name of a hard link has its inode's attributes."""
    first, second = (name.encode() for name in HARDLINK)
    broken = {b"with space.txt": 0, b"-leading-dash": 2**62, b"link-to-hello": 4, second: 5}
    with PackedFolder(column_changed(archive, tmp_path / "bad.ffr", "size", broken)) as folder:
        ops = PackfsOperations(folder)
        for path in broken:
            with pytest.raises(FormatError, match=r"entry \d+'s size differs from the length of its record"):
                folder.stat(path)
            assert _errno(lambda: ops.getattr("/" + path.decode())) == errno.EIO
        assert folder.stat(first).size == 12 and folder.read(first) == b"hello world\n"
        assert ops.getattr("/" + first.decode())["st_size"] == 12
        assert sorted(os.fsencode(name) for name in folder.list()) == sorted(folder.archive.listing(0)[1])
        assert folder.stat("empty.txt").size == 0
    with PackedFolder(column_changed(archive, tmp_path / "owner.ffr", "uid", {second: 4242})) as folder:
        shown = [dataclasses.replace(folder.stat(name), path="") for name in HARDLINK]
        assert shown[0] == shown[1] and shown[1].uid != 4242
