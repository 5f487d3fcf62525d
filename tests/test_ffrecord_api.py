"""packfs.ffrecord: FFRecord's API, checked against files FFRecord itself wrote."""

from __future__ import annotations

import hashlib
import os
import json
from pathlib import Path

import numpy as np
import pytest

import packfs
from packfs.ffrecord import FileReader, FileWriter, PackedFolder, pack_folder
from tests.conftest import VECTORS, require_extra


def _records() -> list[dict]:
    return json.loads((VECTORS / "records.json").read_text())["records"]


def test_file_reader_returns_uint8_arrays_as_ffrecord_does() -> None:
    with FileReader(VECTORS / "records.ffr") as reader:
        assert reader.n == 5
        for record in _records():
            data = reader.read_one(record["index"])
            assert data.dtype == np.uint8 and data.flags.writeable
            assert hashlib.sha256(data.tobytes()).hexdigest() == record["sha256"]
        batch = reader.read(list(range(5)))
        assert [hashlib.sha256(d.tobytes()).hexdigest() for d in batch] == [r["sha256"] for r in _records()]


def test_file_writer_writes_ffrecords_bytes_exactly(tmp_path: Path) -> None:
    with FileReader(VECTORS / "records.ffr") as reader:
        payloads = [reader.read_one(i).tobytes() for i in range(reader.n)]
    out = tmp_path / "records.ffr"
    with FileWriter(out, len(payloads)) as writer:
        for payload in payloads:
            writer.write_one(payload)
    assert out.read_bytes() == (VECTORS / "records.ffr").read_bytes()


def test_file_reader_takes_a_list_or_a_directory(tmp_path: Path) -> None:
    for name in ("a.ffr", "b.ffr"):
        with FileWriter(tmp_path / name, 2) as writer:
            writer.write_one(name.encode())
            writer.write_one(np.arange(3, dtype=np.int32))  # all 12 bytes, unlike FFRecord's 3
    for source in ([tmp_path / "a.ffr", tmp_path / "b.ffr"], tmp_path):
        with FileReader(source) as reader:
            assert reader.n == 4 and reader.read_one(2).tobytes() == b"b.ffr"
            assert reader.read_one(-1).view(np.int32).tolist() == [0, 1, 2]


def test_legacy_header_needs_the_explicit_flag() -> None:
    with pytest.raises(packfs.FormatError, match="allow_legacy_header"):
        FileReader(VECTORS / "zero_meta_checksum.ffr")
    with FileReader(VECTORS / "zero_meta_checksum.ffr", allow_legacy_header=True) as reader:
        assert [hashlib.sha256(reader.read_one(i).tobytes()).hexdigest() for i in range(reader.n)] == \
            [r["sha256"] for r in _records()]


def test_damaged_vectors_give_packfs_errors() -> None:
    with pytest.raises(packfs.ChecksumError):
        FileReader(VECTORS / "corrupt_header.ffr")
    with FileReader(VECTORS / "corrupt_payload.ffr") as reader:
        assert reader.read_one(1).tobytes() == b"a"
        with pytest.raises(packfs.ChecksumError):
            reader.read_one(2)
        with pytest.raises(packfs.ChecksumError):
            reader.read(list(range(5)))
    with FileReader(VECTORS / "truncated.ffr") as reader, pytest.raises(packfs.ChecksumError):
        reader.read_one(4)


def test_packed_folder_and_pack_folder(tmp_path: Path) -> None:
    with PackedFolder(VECTORS / "packed_folder.ffr") as folder:
        data = folder.read_one("sub/003.txt")
        assert data.dtype == np.uint8 and data.tobytes() == folder.read(["sub/003.txt"])[0].tobytes()
        assert folder.num_files() == 9
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "x.bin").write_bytes(b"xyz")
    pack_folder(src, tmp_path / "p.ffr")
    with PackedFolder(tmp_path / "p.ffr") as folder:
        assert folder.read_one("d/x.bin").tobytes() == b"xyz" and folder.list() == ["d"]
    with FileReader(tmp_path / "p.ffr") as reader:  # FFRecord's FileReader reads the records
        assert reader.read_one(0).tobytes() == b"xyz"


def test_offsets_and_checksums_as_ffrecord_reports_them() -> None:
    view = json.loads((VECTORS / "records.json").read_text())["ffrecord_reader_view"]
    with FileReader(VECTORS / "records.ffr") as reader:
        assert reader.get_offsets(0).tolist() == view["get_offsets(0)"]
        assert reader.get_checksums(0).tolist() == view["get_checksums(0)"]
        assert str(reader.read_one(0).dtype) == view["read_one_dtype"]


def test_info_names_a_legacy_archive() -> None:
    from tests.conftest import packfs_cli

    result = packfs_cli("info", VECTORS / "packed_folder.ffr")
    assert result.returncode == 0 and "FFRecord pack_folder (legacy" in result.stdout


# -- the module layout --------------------------------------------------------------


def test_the_top_level_names_are_ffrecords() -> None:
    from packfs import ffrecord

    # FFRecord's ffrecord/__init__.py: this __all__ (kept sorted there), plus utils and
    # __version__.
    assert ffrecord.__all__ == ["FileReader", "FileWriter", "PackedFolder", "checkFsAlign", "pack_folder"]
    assert all(callable(getattr(ffrecord, name)) for name in ffrecord.__all__)
    assert ffrecord.utils.dump is packfs.ffrecord.utils.dump
    # The FFRecord release whose API this is, and a PEP 440 local part saying it is
    # packfs (FFRecord's own was "1.4.0+3f6380c").
    import re

    public, _, local = ffrecord.__version__.partition("+")
    assert public == "1.4.0" and local == f"packfs.{packfs.__version__}"
    assert re.fullmatch(r"[a-z0-9]+(\.[a-z0-9]+)*", local)


def test_importing_the_top_level_does_not_import_torch_but_ffrecord_torch_does() -> None:
    import subprocess
    import sys

    require_extra("torch", "torch")

    code = ("import sys\nfrom packfs import ffrecord\nassert 'torch' not in sys.modules\n"
            "ffrecord.utils.dump\nassert 'torch' not in sys.modules\n"
            "assert ffrecord.torch.DataLoader.__module__ == 'packfs.ffrecord.torch.dataloader'\n"
            "assert 'torch' in sys.modules\n"
            "import packfs.ffrecord.torch as t\nassert t is ffrecord.torch\n"
            "try:\n    ffrecord.nothing\nexcept AttributeError:\n    pass\nelse:\n    raise SystemExit(1)\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- FileReader ---------------------------------------------------------------------


def _write(path: Path, payloads: list[bytes]) -> Path:
    with FileWriter(path, len(payloads)) as writer:
        for payload in payloads:
            writer.write_one(payload)
    return path


def test_file_reader_attributes_and_what_it_opens(tmp_path: Path) -> None:
    for name in ("b.ffr", "a.ffr", ".c.ffr"):
        _write(tmp_path / name, [name.encode()])
    (tmp_path / "notes.txt").write_bytes(b"x")
    (tmp_path / "dir.ffr").mkdir()  # FFRecord's glob matches it too, and then refuses it
    with pytest.raises(packfs.NotAFileError, match="dir.ffr"):
        FileReader(tmp_path)
    (tmp_path / "dir.ffr").rmdir()
    with FileReader(tmp_path, check_data=False) as reader:
        # pathlib's glob, as FFRecord's: dot files count; str() of each path, sorted.
        assert reader.fnames == [str(tmp_path / name) for name in (".c.ffr", "a.ffr", "b.ffr")]
        assert reader.n == 3 and reader.check_data is False
        assert [a.tobytes() for a in reader.read([0, 1, 2])] == [b".c.ffr", b"a.ffr", b"b.ffr"]
    with FileReader((tmp_path / "a.ffr", str(tmp_path / "b.ffr"))) as reader:
        assert reader.fnames == [str(tmp_path / "a.ffr"), str(tmp_path / "b.ffr")] and reader.check_data is True


def test_file_reader_refuses_what_ffrecord_refuses_with_packfs_errors(tmp_path: Path) -> None:
    _write(tmp_path / "a.ffr", [b"a"])
    (tmp_path / "data.bin").write_bytes((tmp_path / "a.ffr").read_bytes())
    (tmp_path / "empty").mkdir()
    with pytest.raises(packfs.PathNotFoundError, match="missing.ffr"):
        FileReader(tmp_path / "missing.ffr")
    with pytest.raises(packfs.FormatError, match="data.bin.*does not end with .ffr"):
        FileReader(tmp_path / "data.bin")
    with pytest.raises(packfs.NotAFileError, match="empty"):
        FileReader([tmp_path / "a.ffr", tmp_path / "empty"])
    with pytest.raises(packfs.PathNotFoundError, match="no .ffr file"):
        FileReader(tmp_path / "empty")
    with pytest.raises(ValueError, match="at least one"):
        FileReader([])
    with pytest.raises(TypeError, match="fname must be"):
        FileReader(3)  # type: ignore[arg-type]


def test_batches_in_any_order_with_repeats_numpy_indices_and_runs(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    # Adjacent records of every size class: empty ones, small ones that share a preadv,
    # and ones past the 256 KiB run limit.
    sizes = [0, 1, 0, 7, 300_000, 5, 70_000, 200_000, 0, 3]
    payloads = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for size in sizes]
    half = len(payloads) // 2
    files = [_write(tmp_path / "p0.ffr", payloads[:half]), _write(tmp_path / "p1.ffr", payloads[half:])]
    with FileReader(files) as reader:
        assert reader.n == len(payloads)
        order = [9, 0, 4, 4, 3, 2, 1, 8, 7, 6, 5, -1, -10]
        got = reader.read(order)
        assert [a.tobytes() for a in got] == [payloads[i] for i in order]
        assert all(a.dtype == np.uint8 and a.flags.writeable and a.flags.owndata for a in got)
        got[2][:] = 0  # each array is its own: the repeat is untouched
        assert got[3].tobytes() == payloads[4]
        assert [a.tobytes() for a in reader.read(np.array([3, 1], dtype=np.int64))] == [payloads[3], payloads[1]]
        assert [a.tobytes() for a in reader.read(range(2))] == payloads[:2]
        assert reader.read_one(np.int32(4)).tobytes() == payloads[4]
        assert reader.read([]) == []
        assert len(reader.read([1] * 5000)) == 5000  # FFRecord caps a batch at 4096
        with pytest.raises(IndexError, match="out of range for 10 records"):
            reader.read([0, 10])
        with pytest.raises(IndexError):
            reader.read_one(-11)
        with pytest.raises(TypeError):
            reader.read(3)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            reader.read([1.5])  # type: ignore[list-item]


def test_a_batch_checksum_error_names_the_global_index(tmp_path: Path) -> None:
    with FileReader([VECTORS / "records.ffr", VECTORS / "corrupt_payload.ffr"]) as reader:
        assert reader.read([0, 1, 5, 6]) is not None  # record 2 of the second file is the bad one
        with pytest.raises(packfs.ChecksumError, match=r"corrupt_payload.ffr.*record 7: checksum mismatch"):
            reader.read([9, 7, 3])
    with FileReader([VECTORS / "records.ffr", VECTORS / "corrupt_payload.ffr"], check_data=False) as reader:
        assert reader.read_one(7).tobytes() == b"iello world"


def test_close_pickle_and_context_manager(tmp_path: Path) -> None:
    import pickle

    path = _write(tmp_path / "a.ffr", [b"one", b"two"])
    reader = FileReader(path, False)
    twin = pickle.loads(pickle.dumps(reader))
    assert type(twin) is FileReader and twin.fnames == reader.fnames and twin.check_data is False
    assert [a.tobytes() for a in twin.read([0, 1])] == [b"one", b"two"]
    reader.close()
    reader.close()  # twice is fine
    for call in (lambda: reader.read_one(0), lambda: reader.read([]), lambda: reader.get_offsets(0)):
        with pytest.raises(packfs.ClosedArchiveError):
            call()
    assert reader.n == 2 and reader.fnames == [str(path)]  # still there, as FFRecord's
    reopened = pickle.loads(pickle.dumps(reader))  # a closed reader pickles and re-opens
    assert reopened.read_one(1).tobytes() == b"two"
    with FileReader(path) as inner:
        pass
    with pytest.raises(packfs.ClosedArchiveError):
        inner.read_one(0)
    assert twin.read_one(0).tobytes() == b"one"  # closing one reader leaves the others


def test_validate_and_legacy_headers() -> None:
    with FileReader(VECTORS / "records.ffr") as reader:
        reader.validate()
    with FileReader(VECTORS / "corrupt_header.ffr", check_data=False) as reader:
        with pytest.raises(packfs.ChecksumError, match="corrupt_header.ffr"):
            reader.validate()
    with FileReader(VECTORS / "zero_meta_checksum.ffr", check_data=False) as reader:
        with pytest.raises(packfs.FormatError, match="allow_legacy_header"):
            reader.validate()
    with FileReader(VECTORS / "zero_meta_checksum.ffr", allow_legacy_header=True) as reader:
        reader.validate()  # FFRecord warns and skips the header of such a file


def test_a_file_truncated_under_an_open_reader_is_an_error_not_short_data(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.ffr", [b"x" * 5000, b"y" * 5000])
    with FileReader(path) as reader:
        os.truncate(path, path.stat().st_size - 100)
        with pytest.raises(packfs.ArchiveChangedError):
            reader.read([0, 1])


# -- FileWriter ---------------------------------------------------------------------


def test_file_writer_overwrites_an_existing_file_as_ffrecord_does(tmp_path: Path) -> None:
    import tempfile

    fd, name = tempfile.mkstemp(suffix=".ffr", dir=tmp_path)  # what FFRecord's own tests do
    os.close(fd)
    writer = FileWriter(name, 2)
    assert (writer.n, writer.count) == (2, 0)
    writer.write_one(b"12345")
    writer.write_one(bytearray(b"abc"))
    assert writer.count == 2
    writer.close()
    writer.close()  # twice is fine
    with FileReader(name) as reader:
        assert [a.tobytes() for a in reader.read([0, 1])] == [b"12345", b"abc"]
    with pytest.raises(packfs.ClosedArchiveError):
        writer.write_one(b"more")
    _write(Path(name), [b"new"])  # and again, over a complete file
    with FileReader(name) as reader:
        assert reader.n == 1 and reader.read_one(0).tobytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(name)]  # no temporary file left


def test_a_short_or_failed_write_leaves_the_old_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.ffr", [b"old"])
    before = path.read_bytes()
    writer = FileWriter(path, 2)
    writer.write_one(b"only one")
    with pytest.raises(packfs.PackError, match="1 records written, 2 declared"):
        writer.close()
    with pytest.raises(RuntimeError, match="boom"):
        with FileWriter(path, 1) as writer:
            writer.write_one(b"complete, but")
            raise RuntimeError("boom")
    writer = FileWriter(path, 1)
    writer.write_one(b"1")
    with pytest.raises(packfs.PackError, match="more records written than the 1 declared"):
        writer.write_one(b"2")
    assert writer.count == 1
    del writer  # all its records written: finished when dropped, as FFRecord's destructor does
    assert FileReader(path).read_one(0).tobytes() == b"1"
    path.write_bytes(before)
    unfinished = FileWriter(path, 2)
    unfinished.write_one(b"x")
    del unfinished  # not all written: dropped
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["a.ffr"]


def test_file_writer_names_and_buffers(tmp_path: Path) -> None:
    with pytest.raises(packfs.PackError, match="does not end with .ffr"):
        FileWriter(tmp_path / "a.bin", 1)
    with pytest.raises(TypeError):
        FileWriter(b"a.ffr", 1)  # type: ignore[arg-type]
    with pytest.raises(packfs.PackError, match="is a directory"):
        (tmp_path / "d.ffr").mkdir()
        FileWriter(tmp_path / "d.ffr", 1)
    array = np.arange(6, dtype=np.int16).reshape(2, 3)
    with FileWriter(tmp_path / "a.ffr", 3) as writer:
        writer.write_one(array)  # all 12 bytes (FFRecord: shape[0] = 2)
        writer.write_one(array[:, ::2])  # not contiguous: its bytes in C order
        writer.write_one(memoryview(b"view"))
    with FileReader(tmp_path / "a.ffr") as reader:
        assert reader.read_one(0).view(np.int16).tolist() == list(range(6))
        assert reader.read_one(1).view(np.int16).tolist() == [0, 2, 3, 5]
        assert reader.read_one(2).tobytes() == b"view"


# -- checkFsAlign -------------------------------------------------------------------


def test_check_fs_align_is_ffrecords_ioctl(tmp_path: Path) -> None:
    import fcntl
    import struct

    from packfs.ffrecord import checkFsAlign

    def check_fs_align_2(fd: int) -> bool:
        # FFRecord's tests/test_fsalign.py reference, verbatim in substance.
        buf = bytearray(4)
        try:
            fcntl.ioctl(fd, 2147772004, buf)
        except OSError:
            return False
        return struct.unpack("i", buf)[0] == 1

    path = tmp_path / "a.ffr"
    path.write_bytes(b"x")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert checkFsAlign(fd) is check_fs_align_2(fd) is False  # not HFAiLab's file system
    finally:
        os.close(fd)
    assert checkFsAlign(fd) is False  # a closed descriptor


# -- PackedFolder and pack_folder ---------------------------------------------------


def test_packed_folder_answers_as_ffrecords_did_on_its_own_file() -> None:
    from collections import OrderedDict

    recorded = json.loads((VECTORS / "packed_folder.json").read_text())
    api = recorded["ffrecord_PackedFolder_api"]
    with PackedFolder(ffr_file=VECTORS / "packed_folder.ffr") as folder:
        assert folder.num_files() == api["num_files()"]
        for call, arguments in [("list()", {}), ("list(recursive=True)", {"recursive": True}),
                                ("list(list_dir=False, recursive=True)", {"list_dir": False, "recursive": True}),
                                ("list(list_file=False, recursive=True)", {"list_file": False, "recursive": True}),
                                ("list('sub')", {"path": "sub"}),
                                ("list('sub', recursive=True)", {"path": "sub", "recursive": True}),
                                ("list('empty_dir')", {"path": "empty_dir"})]:
            listed = folder.list(**arguments)
            assert [str(name) for name in listed] == api[call]["value"], call
            assert sorted({type(name).__name__ for name in listed}) == api[call]["element_types"], call
        # On purpose different: ".." and a leading "/" are resolved as a file system does
        # (FFRecord looks them up literally: False), and a path through a file is
        # simply missing (FFRecord: TypeError).
        assert folder.is_file("sub/../001.txt") and folder.is_file("/001.txt") and not folder.exists("001.txt/x")
        for path in api["exists"]:
            if ".." in path or path.startswith("/") or "value" not in api["exists"][path]:
                continue
            assert folder.exists(path) == api["exists"][path]["value"], path
            assert folder.is_file(path) == api["is_file"][path]["value"], path
            assert folder.is_dir(path) == api["is_dir"][path]["value"], path
        batch = api["read(sorted files)"]
        data = folder.read(batch["paths"])
        assert [hashlib.sha256(d.tobytes()).hexdigest() for d in data] == batch["sha256"]
        with pytest.raises(TypeError, match="list or tuple"):
            folder.read("001.txt")  # type: ignore[arg-type]
        with pytest.raises(packfs.NotADirectoryPathError):
            folder.list("001.txt")
        with pytest.raises(packfs.PathNotFoundError):
            folder.list("nope")
        structure = folder.structure
        decoded = recorded["metadata_record"]["decoded_structure (OrderedDict -> JSON object, int = record index)"]
        assert structure == decoded and isinstance(structure["sub"], OrderedDict)
        assert list(structure) == list(decoded)  # the same order
        assert folder.reader.n == 10 and folder.reader.read_one(structure["sub"]["003.txt"]).tobytes() == \
            folder.read_one("sub/003.txt").tobytes()
        reader = folder.reader
    with pytest.raises(packfs.ClosedArchiveError):
        reader.read_one(0)  # closed with the folder
    with pytest.raises(packfs.FormatError):  # FFRecord: ValueError "is not a packed folder"
        PackedFolder(VECTORS / "records.ffr")


def test_pack_folder_overwrites_follows_symlinks_and_prints_progress(tmp_path: Path, capsys) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "x.bin").write_bytes(b"xyz")
    (src / "a.txt").write_bytes(b"a")
    os.symlink("d/x.bin", src / "link")
    os.symlink("d", src / "dirlink")
    out = _write(tmp_path / "p.ffr", [b"something else"])
    pack_folder(src, out, verbose=True)
    assert capsys.readouterr().out.splitlines() == ["0/4", "1/4", "2/4", "3/4"]
    with PackedFolder(out) as folder:
        assert folder.read_one("link").tobytes() == b"xyz" and folder.read_one("dirlink/x.bin").tobytes() == b"xyz"
        assert folder.list() == ["a.txt", "d", "dirlink", "link"]
    with pytest.raises(packfs.PackError, match="does not end with .ffr"):
        pack_folder(src, tmp_path / "p.zip")
    with pytest.raises(packfs.PackError, match="not a directory"):
        pack_folder(src / "a.txt", out)
