"""packfs.core.files: the file objects of Archive.open and PackedFolder.open behave as
io.BytesIO over the file's bytes does, whichever kind (MemoryFile up to
SMALL_FILE_BYTES, StreamFile above), check the CRC at open under the policy, and hold
a bounded amount of memory whatever the file's size."""

from __future__ import annotations

import array
import io
import os
import tracemalloc
from pathlib import Path
from typing import Any, Callable

import pytest

import packfs
from packfs import ChecksumError, PackedFile, PackedFolder
from packfs.core import Archive, MemoryFile, StreamFile
from packfs.core.files import SMALL_FILE_BYTES, STREAM_BUFFER_BYTES, UNCHECKED_SMALL_FILE_BYTES
from tests.conftest import damaged_copy, require_extra

LINES = b"".join(b"line %d %s\n" % (n, b"x" * (n % 50)) for n in range(400))
SIZES = {
    "empty": b"",
    "lines": LINES,  # about 14 KB, a MemoryFile
    "300 KiB": os.urandom(300 << 10),  # a MemoryFile where its CRC is checked at open, else a StreamFile
    "at the bound": os.urandom(SMALL_FILE_BYTES),  # the largest MemoryFile
    "just over": (LINES * 80)[: SMALL_FILE_BYTES + 1],  # the smallest StreamFile, with lines
    "large": os.urandom(3 * SMALL_FILE_BYTES + 12345),
}


@pytest.fixture(scope="module")
def files_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("files") / "files.ffr"
    packfs.pack_entries([packfs.Entry(name, data) for name, data in SIZES.items()], out)
    return out


def _kind(size: int) -> type:
    return MemoryFile if size <= SMALL_FILE_BYTES else StreamFile


# Operations, each applied to io.BytesIO(data) and to the packfs file in turn: the
# results (or the exception types) must agree, call by call.
def _script(n: int) -> list[tuple[str, Callable[[Any], Any]]]:
    steps: list[tuple[str, Callable[[Any], Any]]] = [
        ("read(0)", lambda f: f.read(0)),
        ("read(16)", lambda f: f.read(16)),
        ("tell", lambda f: f.tell()),
        ("seek(1000)", lambda f: f.seek(1000)),
        ("read(7)", lambda f: f.read(7)),
        ("seek(-5, CUR)", lambda f: f.seek(-5, io.SEEK_CUR)),
        ("read1(9)", lambda f: f.read1(9)),
        ("seek(-10**9, CUR): before the start goes to 0", lambda f: f.seek(-10**9, io.SEEK_CUR)),
        ("tell at 0", lambda f: f.tell()),
        ("seek(-3, END)", lambda f: f.seek(-3, io.SEEK_END)),
        ("read()", lambda f: f.read()),
        ("read() at the end", lambda f: f.read()),
        ("read(5) at the end", lambda f: f.read(5)),
        ("seek(n + 100): past the end", lambda f: f.seek(n + 100)),
        ("read(10) past the end", lambda f: f.read(10)),
        ("readinto past the end", lambda f: f.readinto(bytearray(10))),
        ("tell past the end", lambda f: f.tell()),
        ("seek(-1)", lambda f: f.seek(-1)),
        ("seek(0, 3)", lambda f: f.seek(0, 3)),
        ("seek(n // 2)", lambda f: f.seek(n // 2)),
        ("read(None)", lambda f: len(f.read(None))),
        ("seek(0)", lambda f: f.seek(0)),
        ("readinto bytearray(100)", lambda f: (lambda b: (f.readinto(b), bytes(b)))(bytearray(100))),
        ("readinto memoryview", lambda f: (lambda b: (f.readinto(memoryview(b)[10:50]), bytes(b)))(bytearray(60))),
        ("readinto array('i')", lambda f: (lambda b: (f.readinto(b), b.tobytes()))(array.array("i", [0] * 8))),
        ("readinto1", lambda f: (lambda b: (f.readinto1(b), bytes(b)))(bytearray(33))),
        ("readline()", lambda f: f.readline()),
        ("readline(5)", lambda f: f.readline(5)),
        ("readline(-1)", lambda f: f.readline(-1)),
        ("readlines(200)", lambda f: f.readlines(200)),
        ("seek(n - 1)", lambda f: f.seek(max(n - 1, 0))),
        ("readline() at the last byte", lambda f: f.readline()),
        ("readline() at the end", lambda f: f.readline()),
        ("seek(0) and iterate", lambda f: (f.seek(0), sum(1 for _ in f))[1]),
        ("seek(0) and read a large block", lambda f: (f.seek(0), len(f.read(SMALL_FILE_BYTES + 7)))[1]),
        ("read(-1) from 2", lambda f: (f.seek(2), f.read(-1))[1]),
        ("seekable, readable, isatty", lambda f: (f.seekable(), f.readable(), f.isatty())),
    ]
    return steps


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return ("ok", call())
    except Exception as error:  # noqa: BLE001 - the type is what is compared
        return ("raises", type(error).__name__)


@pytest.mark.parametrize("name", SIZES)
def test_every_call_behaves_as_on_io_bytesio(files_archive: Path, name: str) -> None:
    data = SIZES[name]
    with PackedFolder(files_archive) as folder, folder.open(name) as packed:
        assert type(packed) is _kind(len(data))
        reference = io.BytesIO(data)
        for label, step in _script(len(data)):
            assert _outcome(lambda: step(packed)) == _outcome(lambda: step(reference)), label


@pytest.mark.parametrize("name", SIZES)
def test_the_attributes_callers_rely_on(files_archive: Path, name: str) -> None:
    data = SIZES[name]
    with Archive(files_archive) as archive:
        f = archive.open(archive.find(name.encode()), name=name)
        assert isinstance(f, PackedFile) and isinstance(f, io.BufferedIOBase) and isinstance(f, io.IOBase)
        assert f.name == name and f.mode == "rb" and not f.closed
        assert f.readable() and f.seekable() and not f.writable()
        assert repr(f) == f"<packfs.{_kind(len(data)).__name__} name={name!r}>"
        for refused in (lambda: f.write(b"x"), lambda: f.writelines([b"x"]), lambda: f.truncate(0),
                        lambda: f.fileno()):
            with pytest.raises(io.UnsupportedOperation):
                refused()
        f.seek(5)
        assert f.peek(3)[:3] == data[5:8] and f.tell() == 5  # peek never moves
        if isinstance(f, MemoryFile):
            view = f.getbuffer()
            assert view.readonly and view == data
            view.release()
        with f:
            assert f.read(4) == data[5:9]
        assert f.closed
        for call in (f.read, lambda: f.read(1), lambda: f.seek(0), f.tell, lambda: f.readinto(bytearray(4)),
                     f.readline, lambda: f.peek(1)):
            with pytest.raises(ValueError):
                call()


def test_which_kind_open_gives(files_archive: Path) -> None:
    """Read whole at open where that reads nothing open would not read anyway (its CRC
    check reads the whole record), and up to UNCHECKED_SMALL_FILE_BYTES otherwise."""
    assert UNCHECKED_SMALL_FILE_BYTES < len(SIZES["300 KiB"]) < SMALL_FILE_BYTES
    kinds = {}
    for policy in ("always", "once", "never"):
        with Archive(files_archive, checksums=policy) as archive:
            entry = archive.find(b"300 KiB")
            kinds[policy] = [type(archive.open(entry)).__name__ for _ in range(2)]
            with archive.open(entry) as f:
                assert f.read() == SIZES["300 KiB"]
    # "once": the first open checks the record, a later one has nothing to check.
    assert kinds == {"always": ["MemoryFile"] * 2, "once": ["MemoryFile", "StreamFile"],
                     "never": ["StreamFile"] * 2}
    with Archive(files_archive, checksums="never") as archive:
        assert type(archive.open(archive.find(b"lines"))) is MemoryFile


@pytest.mark.parametrize("policy", ["always", "once"])
@pytest.mark.parametrize("name", ["lines", "large"])
def test_a_damaged_file_is_a_checksum_error_at_every_open(files_archive: Path, tmp_path: Path, policy: str,
                                                          name: str) -> None:
    """The CRC is checked when the file is opened (the whole record, as documented), so
    no read ever returns damaged bytes; under "once" a damaged record is never
    remembered as sound.  Under "never" the reads return the damaged bytes."""
    bad = damaged_copy(files_archive, tmp_path / "bad.ffr", name.encode(), at=len(SIZES[name]) // 2)
    with Archive(bad, checksums=policy) as archive:
        entry = archive.find(name.encode())
        for _ in range(2):
            with pytest.raises(ChecksumError, match=name):
                archive.open(entry, name=name)
        other = "at the bound"
        with archive.open(archive.find(other.encode())) as sound:
            assert sound.read() == SIZES[other]
    with Archive(bad, checksums="never") as archive, archive.open(archive.find(name.encode())) as f:
        damaged = f.read()
    assert damaged != SIZES[name] and len(damaged) == len(SIZES[name])


def test_a_small_file_serves_the_bytes_it_checked_after_the_archive_changes(files_archive: Path,
                                                                             tmp_path: Path) -> None:
    """A MemoryFile read its bytes (and checked them) at open: an archive truncated in
    place afterwards changes nothing for it.  A StreamFile reads as it goes, and says
    the archive changed (ArchiveChangedError), never returning other bytes."""
    copy = tmp_path / "copy.ffr"
    copy.write_bytes(files_archive.read_bytes())
    folder = PackedFolder(copy)
    small, large = folder.open("lines"), folder.open("large")
    os.truncate(copy, 4096)
    assert small.read() == SIZES["lines"]
    with pytest.raises(packfs.ArchiveChangedError):
        large.read(100)
    small.close(), large.close(), folder.close()


def test_a_large_file_is_read_in_bounded_memory(tmp_path: Path) -> None:
    """Opening, seeking about and reading a 64 MiB file in parts holds a buffer, never
    the file: what tracemalloc sees stays under 1 MiB + a few buffers."""
    size = 64 << 20
    chunk = os.urandom(1 << 20)
    (tmp_path / "src").mkdir()
    with open(tmp_path / "src" / "big", "wb") as big:
        for _ in range(size // len(chunk)):
            big.write(chunk)
    out = tmp_path / "big.ffr"
    packfs.pack_folder(tmp_path / "src", out)
    with PackedFolder(out) as folder:
        tracemalloc.start()
        try:
            with folder.open("big") as f:
                assert isinstance(f, StreamFile)
                total = 0
                while True:
                    part = f.read(256 << 10)
                    if not part:
                        break
                    total += len(part)
                for offset in range(0, size, 5 << 20):
                    f.seek(offset)
                    assert f.read(16) == chunk[offset % len(chunk):][:16]
                f.seek(-10, io.SEEK_END)
                assert f.read() == chunk[-10:]
                f.seek(0)
                lines = sum(1 for _ in zip(range(1000), f))  # readline through the buffer
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert total == size and lines > 0
    assert peak < (1 << 20) + 4 * STREAM_BUFFER_BYTES, f"peak {peak} bytes reading a {size}-byte file"


def test_fsspec_opens_them_in_binary_and_text_mode(files_archive: Path) -> None:
    fsspec = require_extra("fsspec", "fsspec")
    for name in ("lines", "just over"):
        with fsspec.open(f"packfs://{name}", "rb", fo=str(files_archive)) as f:
            f.seek(-4, io.SEEK_END)
            assert f.read() == SIZES[name][-4:]
        with fsspec.open(f"packfs://{name}", "rt", fo=str(files_archive)) as text:
            assert text.readline() == SIZES[name].split(b"\n")[0].decode() + "\n"
            assert text.read() == SIZES[name][SIZES[name].index(b"\n") + 1:].decode()
