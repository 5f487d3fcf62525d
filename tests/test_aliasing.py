"""Records that alias each other, or cover the table: never written out, never served.

Every archive here passes every CRC (tests/hostile.py builds them by hand); what is
wrong is what the offsets and the table claim.  Unpack and convert check the claims of
the whole archive before creating anything (format section 5, "before writing out a
whole archive"); readers and the mount check each record where it is used.
"""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import numpy as np
import pytest

import packfs
from packfs import FormatError, PackedFolder, UnpackError, unpack
from packfs.dataset import PackedFiles
from packfs import extract
from packfs.fuse import PackfsOperations
from tests.conftest import packfs_cli, rewrite_section
from tests.hostile import (
    aliasing_archive,
    legacy_aliasing_archive,
    record_over_table,
    shared_record_archive,
)

FILES, SIZE = 300, 16 << 10  # 4.8 MB claimed by an archive of about 33 KB


def _bytes_under(path: Path) -> int:
    total = 0
    for directory, _, names in os.walk(path):
        total += sum(os.lstat(os.path.join(directory, name)).st_size for name in names)
    return total


def _errno(call) -> int:
    try:
        call()
    except OSError as error:
        return error.errno
    return 0


# -- (a) offsets going backwards: records over the same bytes -------------------------


@pytest.mark.parametrize("stride", [0, 100], ids=["same-bytes", "overlapping"])
def test_unpack_of_an_aliasing_bomb_is_refused_before_anything_is_written(tmp_path: Path, stride: int) -> None:
    bomb = aliasing_archive(tmp_path / "bomb.ffr", FILES, SIZE, stride=stride)
    size = bomb.stat().st_size
    with PackedFolder(bomb) as folder:
        claimed = int(folder.archive.column("size").sum())
        assert claimed > 50 * size  # what it would unpack to: the bomb is real
        with pytest.raises(FormatError, match="non-decreasing"):
            unpack(folder, tmp_path / "out")
        with pytest.raises(FormatError, match="non-decreasing"):
            unpack(folder, tmp_path / "one", ["f0000007"])  # any unpack: the claims are the archive's
    assert not (tmp_path / "out").exists() and not (tmp_path / "one").exists()
    assert _bytes_under(tmp_path) == size  # nothing but the archive itself
    result = packfs_cli("unpack", bomb, tmp_path / "cli")
    assert result.returncode == 1 and result.stderr.startswith("Error: ") and "non-decreasing" in result.stderr
    assert not (tmp_path / "cli").exists()


def test_the_same_table_with_disjoint_records_unpacks(tmp_path: Path) -> None:
    """The control: stride == size lays the records back to back."""
    honest = aliasing_archive(tmp_path / "honest.ffr", 50, 4096, stride=4096)
    with PackedFolder(honest) as folder:
        assert folder.verify().ok
        assert extract.check_claims(folder) == 50 * 4096 <= honest.stat().st_size
        stats = unpack(folder, tmp_path / "out")
    assert stats.files == 50 and stats.bytes == 50 * 4096 == _bytes_under(tmp_path / "out")


def test_verify_reports_aliasing_records(tmp_path: Path) -> None:
    bomb = aliasing_archive(tmp_path / "bomb.ffr", 20, 1000)
    with PackedFolder(bomb) as folder:
        report = folder.verify()
    assert not report.ok and any("non-decreasing" in problem for problem in report.problems)
    assert packfs_cli("verify", bomb).returncode == 1


@pytest.mark.parametrize("stride", [0, 100])
def test_reads_serve_each_records_own_checked_bytes(tmp_path: Path, stride: int) -> None:
    """Per use, a record is its span, checked against its own CRC: records over the same
    bytes serve the same contents, overlapping ones each their own window.  Nothing is
    written, so this is what the archive says, not a bomb (format section 5)."""
    bomb = aliasing_archive(tmp_path / "bomb.ffr", 20, 1000, stride=stride)
    with PackedFolder(bomb) as folder:
        contents = [folder.read(f"f{j:07d}") for j in range(20)]
        ops = PackfsOperations(folder, no_open=True)
        assert [ops.read(f"/f{j:07d}", 1 << 20, 0, 0) for j in range(20)] == contents
    blob = random.Random(0).randbytes(1000 + stride * 19)  # aliasing_archive's data area
    assert contents == [blob[j * stride : j * stride + 1000] for j in range(20)]


def test_convert_of_a_legacy_aliasing_bomb_writes_nothing(tmp_path: Path) -> None:
    bomb = legacy_aliasing_archive(tmp_path / "legacy.ffr", FILES, SIZE)
    with PackedFolder(bomb) as folder:
        assert folder.legacy and folder.read("f0000003") == folder.read("f0000004")
    with pytest.raises(FormatError, match="non-decreasing"):
        packfs.convert(bomb, tmp_path / "out.ffr")
    assert sorted(os.listdir(tmp_path)) == ["legacy.ffr"]
    result = packfs_cli("convert", bomb, tmp_path / "cli.ffr")
    assert result.returncode == 1 and "non-decreasing" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["legacy.ffr"]


# -- (b) one record named by entries that are not one hard-linked file -----------------


def test_unpack_refuses_entries_sharing_a_record_without_being_hard_links(tmp_path: Path) -> None:
    shared = shared_record_archive(tmp_path / "shared.ffr", FILES, SIZE)
    with PackedFolder(shared) as folder:
        assert folder.read("f0000000") == folder.read("f0000299")  # one record, read as it is
        with pytest.raises(FormatError, match="not the names of one hard-linked file"):
            unpack(folder, tmp_path / "out")
        assert any("hard-linked" in problem for problem in folder.verify().problems)
    assert not (tmp_path / "out").exists()


def test_declared_hard_links_of_one_record_unpack_as_one_file(tmp_path: Path) -> None:
    links = shared_record_archive(tmp_path / "links.ffr", 100, 4096, hard_links=True)
    with PackedFolder(links) as folder:
        assert folder.verify().ok and extract.check_claims(folder) == 4096
        stats = unpack(folder, tmp_path / "out")
    assert (stats.files, stats.hardlinks, stats.bytes) == (1, 99, 4096)
    assert os.stat(tmp_path / "out/f0000042").st_nlink == 100


def _linked_archive(tmp_path: Path) -> Path:
    entries = [packfs.Entry("a", b"contents"), packfs.Entry("b", kind="hardlink", target="a"),
               packfs.Entry("c", kind="hardlink", target="a"), packfs.Entry("d", b"other"),
               packfs.Entry("s", kind="symlink", target="a")]
    packfs.pack_entries(entries, tmp_path / "linked.ffr")
    return tmp_path / "linked.ffr"


def _entries(archive: Path) -> dict[str, int]:
    with PackedFolder(archive) as folder:
        return {name: folder.archive.find(name.encode()) for name in "abcds"}


@pytest.mark.parametrize("change", ["nlink-short", "one-nlink-1", "first-link-differs", "symlink-shares",
                                    "file-joins"])
def test_inconsistent_hard_link_claims_are_refused_up_front(tmp_path: Path, change: str) -> None:
    archive = _linked_archive(tmp_path)
    e = _entries(archive)
    with PackedFolder(archive) as folder:
        record_a = folder.archive._table.record(e["a"])
    section, mutate = {
        "nlink-short": ("nlink", lambda v: v.__setitem__([e["a"], e["b"], e["c"]], 2)),
        "one-nlink-1": ("nlink", lambda v: v.__setitem__(e["c"], 1)),
        "first-link-differs": ("first_link", lambda v: v.__setitem__(e["c"], 0)),
        "symlink-shares": ("record", lambda v: v.__setitem__(e["s"], record_a)),
        "file-joins": ("record", lambda v: v.__setitem__(e["d"], record_a)),
    }[change]
    if change in ("symlink-shares", "file-joins"):
        # Sizes must agree with the record, or the entry is refused where it is used.
        sized = rewrite_section(archive, tmp_path / "sized.ffr", "size",
                                lambda v: v.__setitem__(e["s" if change == "symlink-shares" else "d"], 8))
        archive = sized
    bad = rewrite_section(archive, tmp_path / "bad.ffr", section, mutate)
    with PackedFolder(bad) as folder:
        with pytest.raises(FormatError, match="hard-linked"):
            unpack(folder, tmp_path / "out")
        assert not folder.verify().ok
    assert not (tmp_path / "out").exists()


def test_a_1_0_table_without_first_link_still_unpacks_its_hard_links(tmp_path: Path) -> None:
    """Format 1.0 wrote first_link 0 everywhere: the names of one file agree on it."""
    archive = _linked_archive(tmp_path)
    old = rewrite_section(archive, tmp_path / "old.ffr", "first_link", lambda v: v.__setitem__(slice(None), 0))
    with PackedFolder(old) as folder:
        assert folder.verify().ok
        stats = unpack(folder, tmp_path / "out")
    assert (stats.files, stats.hardlinks) == (2, 2)
    assert os.stat(tmp_path / "out/c").st_ino == os.stat(tmp_path / "out/a").st_ino


# -- where DEST refuses hard links: copies, bounded ----------------------------------------


def test_copies_for_a_destination_without_hard_links_are_bounded(tmp_path: Path, monkeypatch) -> None:
    real_link = os.link

    def no_links(source, target, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")

    links = shared_record_archive(tmp_path / "links.ffr", FILES, SIZE, hard_links=True)
    small = _linked_archive(tmp_path)
    monkeypatch.setattr(os, "link", no_links)
    with PackedFolder(small) as folder:  # a copy per name, as before, when it is small
        stats = unpack(folder, tmp_path / "small")
    assert (stats.files, stats.hardlinks) == (4, 0)
    assert (tmp_path / "small/c").read_bytes() == b"contents"
    with PackedFolder(links) as folder:
        with pytest.raises(UnpackError, match="refuses hard links"):
            unpack(folder, tmp_path / "out")
    assert _bytes_under(tmp_path / "out") <= 2 * links.stat().st_size
    monkeypatch.setattr(os, "link", real_link)


def test_emlink_starts_a_new_copy_that_later_names_link_to(tmp_path: Path, monkeypatch) -> None:
    """A file system's link limit (65,000 on ext4) costs one copy per limit reached,
    not one per name after it."""
    real_link = os.link

    def limited(source, target, *, src_dir_fd=None, dst_dir_fd=None, follow_symlinks=True):
        st = os.stat(source, dir_fd=src_dir_fd, follow_symlinks=False)
        if st.st_nlink >= 4:
            raise OSError(errno.EMLINK, "Too many links")
        real_link(source, target, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd, follow_symlinks=follow_symlinks)

    links = shared_record_archive(tmp_path / "links.ffr", 10, 1000, hard_links=True)
    monkeypatch.setattr(os, "link", limited)
    with PackedFolder(links) as folder:
        stats = unpack(folder, tmp_path / "out")
    monkeypatch.setattr(os, "link", real_link)
    inodes = {os.stat(tmp_path / "out" / f"f{j:07d}").st_ino for j in range(10)}
    assert (stats.files, stats.hardlinks) == (len(inodes), 10 - len(inodes))
    assert len(inodes) == 3  # four names an inode here: 1-4, 5-8, 9-10 (two EMLINKs, two copies)


# -- (c) a data record over the path table --------------------------------------------------


@pytest.mark.parametrize("over", ["table", "footer"])
def test_a_record_spanning_the_table_is_refused_by_every_read_path(tmp_path: Path, over: str) -> None:
    bad = record_over_table(tmp_path / "bad.ffr", over)
    with PackedFolder(bad) as folder:
        entry = folder.archive.find(b"spans-table")
        message = "data records end where the path table begins"
        # The claim (the table's bytes as the file's) is refused by stat too (issue 23).
        for read in (folder.stat, folder.read_one, folder.read, folder.read_view, folder.open):
            with pytest.raises(FormatError, match=message):
                read("spans-table")
        with pytest.raises(FormatError, match=message):
            folder.archive.read(entry)
        with pytest.raises(FormatError, match=message):
            list(folder.archive.read_batch(np.array([folder.archive.find(b"ok.txt"), entry])))
        dataset = PackedFiles(folder)
        index = [dataset.path(i) for i in range(len(dataset))].index("spans-table")
        with pytest.raises(FormatError):
            dataset[index]
        ops = PackfsOperations(folder, no_open=True)
        assert _errno(lambda: ops.read("/spans-table", 1 << 20, 0, 0)) == errno.EIO
        assert _errno(lambda: PackfsOperations(folder).open("/spans-table", os.O_RDONLY)) == errno.EIO
        assert _errno(lambda: PackfsOperations(folder).read("/spans-table", 100, 0, entry + 1)) == errno.EIO
        # The rest of the archive is served.
        assert folder.read("ok.txt") == b"ok\n" == ops.read("/ok.txt", 4096, 0, 0)
        assert not folder.verify().ok
        with pytest.raises(FormatError):
            unpack(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_record_spanning_the_table_is_eio_through_a_mount(tmp_path: Path) -> None:
    from tests.conftest import mounted

    bad = record_over_table(tmp_path / "bad.ffr")
    with mounted(bad, tmp_path / "mnt") as mountpoint:
        assert (mountpoint / "ok.txt").read_bytes() == b"ok\n"
        with pytest.raises(OSError) as caught:
            (mountpoint / "spans-table").read_bytes()
        assert caught.value.errno == errno.EIO
        with pytest.raises(OSError) as caught:
            os.stat(mountpoint / "spans-table")  # its attributes claim the table's bytes too
        assert caught.value.errno == errno.EIO
        assert "spans-table" in os.listdir(mountpoint)
