"""packfs.ffrecord.utils.dump, checked as FFRecord's tests/test_utils.py checks it, and
for what FFRecord leaves unchecked (failed writer processes)."""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

import packfs
from packfs.ffrecord import FileReader
from packfs.ffrecord.utils import dump


class Tagged:
    """Records that say which process wrote them."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> bytes:
        return pickle.dumps((index * 2, os.getpid()))


class FailsAt(Tagged):
    def __getitem__(self, index: int) -> bytes:
        if index == 7:
            raise RuntimeError("record 7 cannot be made")
        return super().__getitem__(index)


def test_dump_to_one_file_as_ffrecords_test() -> None:
    tmp = tempfile.mktemp(suffix=".ffr", prefix="tmp-test")
    dataset = [i * 2 for i in range(200)]
    dump(list(map(pickle.dumps, dataset)), tmp, nfiles=1)
    try:
        with FileReader(tmp, True) as reader:
            assert reader.n == 200
            assert [pickle.loads(x) for x in reader.read(list(range(reader.n)))] == dataset
    finally:
        Path(tmp).unlink()


@pytest.mark.parametrize("n, nfiles, parts", [(200, 8, 8), (200, 64, 50), (10, 16, 10)])
def test_dump_to_a_folder_of_shards_in_parallel_processes(tmp_path: Path, n: int, nfiles: int, parts: int) -> None:
    out = tmp_path / "out.ffr"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dump(Tagged(n), out, nfiles=nfiles)
    # FFRecord's split: runs of ceil(n / nfiles), so fewer files than asked, said so.
    messages = [str(w.message) for w in caught]
    assert messages == ([] if parts == nfiles else [f"Split into {parts} files rather than {nfiles} files"])
    assert sorted(os.listdir(out)) == [f"PART_{i:05d}.ffr" for i in range(parts)]
    with FileReader(out, True) as reader:
        assert reader.n == n
        records = [pickle.loads(x) for x in reader.read(list(range(n)))]
        sizes = [FileReader(path).n for path in reader.fnames]
    assert [value for value, _ in records] == [i * 2 for i in range(n)]  # in order, as one sequence
    # Each shard was written by a process of its own, none by this one.
    writers = [{pid for _, pid in records[sum(sizes[:k]) : sum(sizes[: k + 1])]} for k in range(parts)]
    assert all(len(pids) == 1 for pids in writers)
    assert len(set.union(*writers)) == parts and os.getpid() not in set.union(*writers)


def test_dump_overwrites_and_warns_about_other_shards(tmp_path: Path) -> None:
    out = tmp_path / "out"
    dump(Tagged(30), out, nfiles=3)
    with pytest.warns(UserWarning, match="PART_00002.ffr: FileReader of the folder reads them too"):
        dump(Tagged(4), out, nfiles=2)
    assert FileReader(out / "PART_00000.ffr").n == 2  # replaced


def test_a_failed_writer_process_is_an_error_and_its_shard_is_not_written(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(packfs.PackError, match=r"PART_00001.ffr' \(exit code 1\)"):
        dump(FailsAt(20), out, nfiles=4)  # FFRecord: no error, and no PART_00001.ffr
    assert sorted(os.listdir(out)) == ["PART_00000.ffr", "PART_00002.ffr", "PART_00003.ffr"]


def test_dump_arguments_and_edges(tmp_path: Path, capfd, monkeypatch) -> None:
    with pytest.raises(ValueError, match="nfiles must be at least 1"):
        dump([b"x"], tmp_path / "a.ffr", nfiles=0)
    with pytest.raises(packfs.PackError, match="does not end with .ffr"):
        dump([b"x"], tmp_path / "a.bin", nfiles=1)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(packfs.PackError, match="cannot create the output folder"):
        dump([b"x"], tmp_path / "file", nfiles=2)
    with pytest.warns(UserWarning, match="Split into 1 files rather than 3"):
        dump([], tmp_path / "empty", nfiles=3)  # FFRecord: ValueError from range()
    assert FileReader(tmp_path / "empty").n == 0
    monkeypatch.setitem(sys.modules, "tqdm", None)  # FFRecord needs tqdm; packfs prints a line
    dump([b"a", b"b"], tmp_path / "v.ffr", nfiles=1, verbose=True)
    assert f"{tmp_path / 'v.ffr'}: 2 records written" in capfd.readouterr().out
