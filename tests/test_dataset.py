"""packfs.dataset on its own (no torch): file selection, reads by index and by batch,
pickling for workers, and closing."""

from __future__ import annotations

import glob as glob_module
import os
import pickle
import sys
from pathlib import Path

import pytest

import packfs
from packfs import ClosedArchiveError, PathNotFoundError
from packfs.dataset import Glob, PackedFiles, select_files

TREE = {
    "train/cat/1.jpg": b"cat one",
    "train/cat/2.JPG": b"cat two",
    "train/dog/a.jpg": b"dog a",
    "train/dog/sub/deep.jpg": b"deep",
    "train/dog.b/x.jpg": b"sorted between dog/ and dog.b",
    "train/.hidden.jpg": b"dot",
    "val/1.png": b"png",
    "labels.txt": b"labels",
}


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    for path, data in TREE.items():
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        (source / path).write_bytes(data)
    os.symlink("cat/1.jpg", source / "train" / "alias.jpg")
    out = tmp_path / "d.ffr"
    packfs.pack_folder(source, out)
    return out


@pytest.mark.skipif(sys.version_info < (3, 11), reason="the oracle, glob's include_hidden, is Python 3.11's")
@pytest.mark.parametrize("pattern", ["**/*", "**/*.jpg", "train/*/*.jpg", "train/**", "*/c?t/*",
                                     "train/[cd]*/*", "**/sub/*", "val/*"])
def test_selection_is_sorted_and_matches_what_glob_finds_on_disk(archive: Path, tmp_path: Path,
                                                                  pattern: str) -> None:
    """The same paths as Python's glob over the extracted tree (with hidden files, and
    symlinks to files counting as files), in exactly sorted() order."""
    with packfs.PackedFolder(archive) as folder:
        entries, links = select_files(folder, pattern)
        paths = [links.get(i) or os.fsdecode(folder.archive.path_of(int(e))) for i, e in enumerate(entries)]
    root = tmp_path / "src"
    expected = sorted(os.path.relpath(p, root) for p in glob_module.glob(str(root / pattern), recursive=True,
                                                                         include_hidden=True)
                      if os.path.isfile(p))
    assert paths == expected


def test_glob_edge_cases() -> None:
    assert Glob("**/*.jpg")("a/b/c.jpg") and Glob("**/*.jpg")("c.jpg") and not Glob("**/*.jpg")("c.png")
    assert Glob("a/**")("a/b/c") and not Glob("a/**")("b/c")
    with pytest.raises(ValueError, match="selects directories"):
        Glob("train/")
    with pytest.raises(ValueError, match="matches no file"):
        Glob("/")


def test_reads_by_index_and_batch_match_the_files(archive: Path) -> None:
    files = PackedFiles(archive, "train/**")
    assert len(files) == 7  # six files and a symlink to one
    by_index = [files[i] for i in range(len(files))]
    assert files.read_batch(list(range(len(files)))[::-1]) == by_index[::-1]
    assert files.read_batch([2, 2, 0], transform=lambda i, data: (i, len(data))) == [
        (2, len(by_index[2])), (2, len(by_index[2])), (0, len(by_index[0]))]
    assert [files.path(i) for i in range(len(files))][:2] == ["train/.hidden.jpg", "train/alias.jpg"]
    assert files[1] == TREE["train/cat/1.jpg"]  # the symlink, read as its target
    with pytest.raises(IndexError):
        files.path(len(files))
    with pytest.raises(IndexError):
        files.read_batch([1.5])


def test_no_match_is_an_error(archive: Path) -> None:
    with pytest.raises(PathNotFoundError, match="no file matches"):
        PackedFiles(archive, "**/*.bmp")


def test_pickles_small_and_reopens(archive: Path) -> None:
    files = PackedFiles(archive, "**/*")
    data = pickle.dumps(files)
    assert len(data) < 2000 and b"cat one" not in data  # the selection, never the data
    copy = pickle.loads(data)
    assert [copy[i] for i in range(len(copy))] == [files[i] for i in range(len(files))]


def test_a_changed_archive_is_refused_by_a_reopening_worker(archive: Path) -> None:
    files = PackedFiles(archive, "**/*")
    data = pickle.dumps(files)
    packfs.pack_entries([packfs.Entry("other", b"x")], archive, force=True)  # replaced by rename
    with pytest.raises(packfs.FormatError, match="changed since these files were selected"):
        pickle.loads(data)[0]


def test_closing(archive: Path) -> None:
    files = PackedFiles(archive)
    files.close()
    with pytest.raises(ClosedArchiveError):
        files[0]
    with pytest.raises(ValueError):  # ClosedArchiveError is a ValueError, as for files
        files.read_batch([0])
