"""Every writer of archives goes through one builder (packfs/write/builder.py), fed by
drivers: a directory (pack_folder, one process or -j workers), entries (a sequence, or
an iterator spooled first), a tar, a zip, a shard set, an appended shard, convert.
The same tree given to each must give the same bytes, and the bytes must not change
when the code is rearranged: the digests below were taken before pack.py was split
into the builder and its drivers (issue 35).  A deliberate change of the format or of
the layout changes them; then say so in the commit and take new ones."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import zipfile
from pathlib import Path
from typing import Iterator, Literal

import pytest

from packfs.core import Archive
from packfs.write import Entry, convert, pack_archive, pack_entries, pack_folder
from packfs.write.sets import append_shard, make_set
from packfs.write.shards import pack_shards

MTIME = 1_700_000_000  # seconds: tar and zip store whole seconds
UID = GID = 1000

# (path, kind, bytes or link target): depth-first, names sorted bytewise, as pack_folder
# walks a directory; a file of more than the builder's 1 MiB chunk, an empty one, a
# symlink, a hard link and an empty directory.
TREE: list[tuple[str, str, bytes]] = [
    ("a", "dir", b""),
    ("a/big.txt", "file", b"".join(b"line %d of a text long enough to be read in chunks\n" % i
                                    for i in range(40_000))),
    ("a/empty", "file", b""),
    ("a/link", "symlink", b"big.txt"),
    ("a/same", "hardlink", b"a/big.txt"),
    ("b", "dir", b""),
    ("b/c", "dir", b""),
    ("b/c/one.json", "file", b'{"one": 1, "text": "' + b"lorem ipsum " * 300 + b'"}'),
    ("b/c/two.json", "file", b'{"two": 2, "text": "' + b"dolor sit " * 300 + b'"}'),
    ("b/zeros", "file", bytes(70_000)),
    ("d", "dir", b""),
    ("top.txt", "file", b"at the top\n"),
]


def _entries(uid: int = UID, gid: int = GID) -> list[Entry]:
    entries = []
    for path, kind, data in TREE:
        mode = {"dir": 0o755, "file": 0o644, "symlink": 0o777, "hardlink": 0o644}[kind]
        if kind == "file":
            entries.append(Entry(path, data, "file", mode=mode, uid=uid, gid=gid, mtime_ns=MTIME * 10**9))
        elif kind == "dir":
            entries.append(Entry(path, None, "dir", mode=mode, uid=uid, gid=gid, mtime_ns=MTIME * 10**9))
        else:
            link: Literal["symlink", "hardlink"] = "symlink" if kind == "symlink" else "hardlink"
            entries.append(Entry(path, None, link, target=data.decode(), mode=mode, uid=uid, gid=gid,
                                 mtime_ns=MTIME * 10**9))
    return entries


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tar(path: Path) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, data in TREE:
            info = tarfile.TarInfo(name)
            info.uid, info.gid, info.mtime = UID, GID, MTIME
            info.uname = info.gname = ""
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif kind == "symlink":
                info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, data.decode()
            elif kind == "hardlink":
                info.type, info.mode, info.linkname = tarfile.LNKTYPE, 0o644, data.decode()
            else:
                info.mode, info.size = 0o644, len(data)
            tar.addfile(info, io.BytesIO(data) if kind == "file" else None)


def _set_bytes(directory: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(directory.iterdir())}


# Taken from the code before the split (commit f192d7a).
ENTRIES = "8a3200e88386e469c8c0077dd5313c858f20f19f8361ecf104c2a463a8896f10"
# A tar's own bytes: its directories come from its members, in the tar's order.
TARRED = "d13d1bbe80d9c60c9341f495d29eed0e468214e8e6c05a889b50bd88a9d6c8af"
TARRED_COMPRESSED = "f187229076d91ef2b50014a2b67f56664834b2626a0a533f3ddc4ddf33c69d53"
CONVERTED = "97ab6a545c12cea59b57fa497fc4540ff841ae4b8a918c8a379e36600e798f87"
COMPRESSED = "d02c636b65ef7724bdcef3765d363071a5a8bbf4621d8636bd69e9f3864e67a3"


def test_entries_a_sequence_or_an_iterator_and_a_tar_give_the_bytes_they_gave_before(tmp_path: Path) -> None:
    pack_entries(_entries(), tmp_path / "list.ffr")
    assert _digest(tmp_path / "list.ffr") == ENTRIES

    def one_by_one() -> Iterator[Entry]:  # no length: spooled to disk first
        yield from _entries()

    pack_entries(one_by_one(), tmp_path / "spooled.ffr")
    assert _digest(tmp_path / "spooled.ffr") == ENTRIES
    _tar(tmp_path / "tree.tar")
    pack_archive(str(tmp_path / "tree.tar"), tmp_path / "tar.ffr")
    assert _digest(tmp_path / "tar.ffr") == TARRED


def test_codecs_through_entries_a_tar_and_convert_give_the_bytes_they_gave_before(tmp_path: Path) -> None:
    pack_entries(_entries(), tmp_path / "list.ffr", compress="zstd")
    assert _digest(tmp_path / "list.ffr") == COMPRESSED
    _tar(tmp_path / "tree.tar")
    pack_archive(str(tmp_path / "tree.tar"), tmp_path / "tar.ffr", compress="zstd")
    assert _digest(tmp_path / "tar.ffr") == TARRED_COMPRESSED
    pack_entries(_entries(), tmp_path / "plain.ffr")
    convert(tmp_path / "plain.ffr", tmp_path / "converted.ffr", compress="zstd")
    assert _digest(tmp_path / "converted.ffr") == CONVERTED


def test_a_zip_gives_the_same_bytes_as_before(tmp_path: Path) -> None:
    # A zip has no owner, no symlink type here and no hard links: its own digest.
    with zipfile.ZipFile(tmp_path / "tree.zip", "w") as zipped:
        for name, kind, data in TREE:
            if kind == "file":
                info = zipfile.ZipInfo(name, (2023, 11, 14, 22, 13, 20))
                info.external_attr = (0o100644 << 16)
                zipped.writestr(info, data)
    pack_archive(str(tmp_path / "tree.zip"), tmp_path / "zip.ffr")
    assert _digest(tmp_path / "zip.ffr") == ZIPPED


ZIPPED = "52132dc299169671c2da5b57d99470e5c03e7c8d266b6d70904934b818ca6a7c"


def test_shards_and_an_appended_shard_give_the_same_bytes_as_before(tmp_path: Path) -> None:
    _tar(tmp_path / "tree.tar")
    (tmp_path / "set").mkdir()
    pack_shards(str(tmp_path / "tree.tar"), tmp_path / "set" / "data.ffr", shards=2)
    assert _set_bytes(tmp_path / "set") == SHARDS
    manifest = str(tmp_path / "set" / "data.ffrset")
    more = [Entry("e", None, "dir", mode=0o755, uid=UID, gid=GID, mtime_ns=MTIME * 10**9),
            Entry("e/more.txt", b"appended\n", mode=0o644, uid=UID, gid=GID, mtime_ns=MTIME * 10**9)]
    append_shard(manifest, lambda path: pack_entries(more, path))
    assert _set_bytes(tmp_path / "set") == APPENDED


SHARDS = {"data-00000-of-00002.ffr": "b73f7207802fc447f6407de4c1f5570c54a48cd6e4515b82d1792c096e3b0c8e",
          "data-00001-of-00002.ffr": "8fc7a606e6fbb7d8255f7636f4cf1d6e57bfb82b8e8102678e5bbc17f953be13",
          "data.ffrset": "4dafd612bb5688dd796b064c28ad11c0da4ff746cf717b59cf6b8f51601d66b6"}
APPENDED = {**SHARDS, "data-00002.ffr": "af79248c85e5598df9b85d9fc8bbbedf75b22bac75f4f0db1c75f0aedae3cb61",
            "data.ffrset": "ca12247505e82cd4377c788e7de32b82be470f1b664e2d3a0b9acff0ea678ec0"}


def _tree_on_disk(src: Path) -> None:
    for path, kind, data in TREE:
        where = src / path
        where.parent.mkdir(parents=True, exist_ok=True)
        if kind == "dir":
            where.mkdir(exist_ok=True)
        elif kind == "file":
            where.write_bytes(data)
        elif kind == "symlink":
            where.symlink_to(data.decode())
        else:
            os.link(src / data.decode(), where)
    for path, _, _ in reversed(TREE):  # children first: a child's change moves its parent's mtime
        os.utime(src / path, (MTIME, MTIME), follow_symlinks=False)


@pytest.mark.parametrize("compress", [None, "zstd"])
def test_a_directory_gives_the_same_bytes_from_one_process_or_two(tmp_path: Path, compress: str | None) -> None:
    """pack_folder's two ways to read the files (this process, -j worker processes or
    encoding threads) feed the builder the same records.  (Its bytes before and after
    the split were compared by running the old code on the same tree: the owner is
    this user's, so no digest can be written here.)"""
    _tree_on_disk(tmp_path / "src")
    pack_folder(tmp_path / "src", tmp_path / "one.ffr", jobs=1, compress=compress, xattrs=False)
    pack_folder(tmp_path / "src", tmp_path / "two.ffr", jobs=2, compress=compress, xattrs=False)
    assert _digest(tmp_path / "one.ffr") == _digest(tmp_path / "two.ffr")
    with Archive(str(tmp_path / "one.ffr")) as archive:
        for path, kind, data in TREE:
            entry = archive.lookup(path, follow=False)
            if kind in ("file", "hardlink"):
                assert archive.read_path(path) == (data if kind == "file" else dict(
                    (name, content) for name, _, content in TREE)[data.decode()])
            elif kind == "symlink":
                assert archive.readlink(entry) == data


def test_a_set_made_of_archives_keeps_their_bytes(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    pack_entries(_entries()[:5], tmp_path / "s" / "one.ffr")
    pack_entries(_entries()[5:], tmp_path / "s" / "two.ffr")
    before = _set_bytes(tmp_path / "s")
    make_set(str(tmp_path / "s" / "all.ffrset"), [str(tmp_path / "s" / "one.ffr"), str(tmp_path / "s" / "two.ffr")])
    after = _set_bytes(tmp_path / "s")
    assert {name: digest for name, digest in after.items() if name != "all.ffrset"} == before


class _ReadintoOnly:
    """A stream with the one read a pack makes of an Entry's data: readinto (and close)."""

    def __init__(self, data: bytes) -> None:
        self._data, self._at = data, 0

    def readinto(self, buffer: bytearray | memoryview) -> int:
        size = min(len(buffer), len(self._data) - self._at)
        buffer[:size] = self._data[self._at : self._at + size]
        self._at += size
        return size

    def close(self) -> None:
        pass


def test_a_stream_read_only_with_readinto_packs_from_an_iterator_as_from_a_list(tmp_path: Path) -> None:
    """An iterator of unknown length is spooled first; the spool reads a stream as the
    builder does, with readinto (shutil.copyfileobj, which wants read, refused one)."""
    def entries() -> Iterator[Entry]:
        for entry in _entries():
            data = entry.data
            if entry.kind == "file" and isinstance(data, bytes):
                yield Entry(entry.path, (lambda data=data: _ReadintoOnly(data)), mode=entry.mode, uid=entry.uid,
                            gid=entry.gid, mtime_ns=entry.mtime_ns)
            else:
                yield entry

    pack_entries(entries(), tmp_path / "streamed.ffr")
    assert _digest(tmp_path / "streamed.ffr") == ENTRIES
