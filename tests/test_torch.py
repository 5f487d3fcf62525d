"""packfs.torch and packfs.dataset: datasets over an archive, through real DataLoaders
(2 workers, fork and spawn), with the CPU build of torch."""

from __future__ import annotations

import os
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import packfs
from packfs.dataset import Glob, PackedFiles
from tests.conftest import require_extra

torch = require_extra("torch", "torch")
from torch.utils.data import DataLoader  # noqa: E402

from packfs.torch import PackedDataset, PackedImageFolder  # noqa: E402

SAMPLES = 1200
SAMPLE_BYTES = 48 << 10  # 56 MiB in all: far more than the RSS bound below


def sample_bytes(index: int) -> bytes:
    head = f"{index:06d}".encode()
    return head + bytes([index % 251]) * (SAMPLE_BYTES - len(head))


@pytest.fixture(scope="module")
def samples_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("torch") / "samples.ffr"
    packfs.pack_entries([packfs.Entry(f"shard{i % 7}/{i:06d}.bin", sample_bytes(i)) for i in range(SAMPLES)], out)
    return out


def identify(data: bytes) -> tuple[int, int, int, int]:
    """A transform run in the worker: (sample index, worker pid, and for every 40th
    sample the worker's anonymous memory and its resident pages of the archive, in
    KiB; -1 otherwise, as reading smaps costs milliseconds)."""
    index = int(data[:6])
    if index % 40:
        return index, os.getpid(), -1, -1
    anonymous = archive = 0
    with open("/proc/self/smaps") as smaps:
        in_archive = False
        for line in smaps:
            if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                in_archive = line.rstrip().endswith(".ffr")
            elif line.startswith("Rss:") and in_archive:
                archive += int(line.split()[1])
            elif line.startswith("Anonymous:"):
                anonymous += int(line.split()[1])
    return index, os.getpid(), anonymous, archive


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_dataloader_epoch_with_two_workers_gives_every_sample_once_at_flat_rss(
        samples_archive: Path, context: str) -> None:
    dataset = PackedDataset(samples_archive, "**/*.bin", transform=identify)
    assert len(dataset) == SAMPLES
    loader = DataLoader(dataset, batch_size=16, shuffle=True, num_workers=2,
                        multiprocessing_context=context, generator=torch.Generator().manual_seed(1))
    seen: list[int] = []
    memory: dict[int, list[tuple[int, int]]] = {}
    for indices, pids, anonymous, archive in loader:
        seen += indices.tolist()
        for pid, anon_kib, archive_kib in zip(pids.tolist(), anonymous.tolist(), archive.tolist()):
            memory.setdefault(pid, [])
            if anon_kib >= 0:
                memory[pid].append((anon_kib, archive_kib))
    assert sorted(seen) == list(range(SAMPLES)) and Counter(seen).most_common(1)[0][1] == 1
    assert len(memory) == 2 and os.getpid() not in memory
    for history in memory.values():
        # Each worker reads about 28 MiB.  Reading through the map would leave that much
        # of the archive resident in the worker; with pread only table pages are, and
        # they are released every few thousand reads.  Nothing is copied per worker.
        anonymous_growth = (max(anon for anon, _ in history) - history[0][0]) / 1024
        archive_resident = max(archive for _, archive in history) / 1024
        assert len(history) >= 5 and archive_resident < 4 and anonymous_growth < 8, (
            f"a worker's anonymous memory grew by {anonymous_growth:.1f} MiB and it had "
            f"{archive_resident:.1f} MiB of the archive resident")


def test_the_batch_path_is_what_the_dataloader_calls(samples_archive: Path) -> None:
    dataset = PackedDataset(samples_archive)
    calls = []
    original = dataset.files.read_batch
    dataset.files.read_batch = lambda indices, transform=None: calls.append(list(indices)) or original(indices, transform)  # type: ignore
    batches = list(DataLoader(dataset, batch_size=8, sampler=range(40), collate_fn=list))
    assert calls == [list(range(k, k + 8)) for k in range(0, 40, 8)]
    assert [data for batch in batches for data in batch] == [dataset[i] for i in range(40)]


def test_samples_are_the_sorted_paths_and_batches_equal_single_reads(tmp_path: Path) -> None:
    src = tmp_path / "src"
    # '-' and '.' sort before '/': sorted() puts "a.b" before "a/x", a walk would not.
    for relative in ["a/x", "a.b", "a-b/y", "b", "a/c/d.jpg", "Z.jpg", ".hidden"]:
        (src / relative).parent.mkdir(parents=True, exist_ok=True)
        (src / relative).write_bytes(relative.encode())
    (src / "a" / "link").symlink_to("x")
    (src / "a" / "broken").symlink_to("nowhere")
    packfs.pack_folder(src, tmp_path / "d.ffr")
    dataset = PackedDataset(tmp_path / "d.ffr")
    paths = [dataset.path(i) for i in range(len(dataset))]
    expected = sorted(["a/x", "a.b", "a-b/y", "b", "a/c/d.jpg", "Z.jpg", ".hidden", "a/link"])
    # A symlink to a file reads as that file, under its own path; a broken one is left out.
    assert paths == expected
    assert [dataset[i] for i in range(len(dataset))] == [b"a/x" if path == "a/link" else path.encode()
                                                         for path in paths]
    order = [5, 0, 7, 3, 3, -1]
    assert dataset.__getitems__(order) == dataset[order] == [dataset[i] for i in order]
    assert dataset[np.array([1, 2])] == [dataset[1], dataset[2]]
    with pytest.raises(IndexError):
        dataset[len(dataset)]
    jpegs = PackedDataset(tmp_path / "d.ffr", "**/*.jpg", transform=bytes.upper)
    assert [jpegs.path(i) for i in range(len(jpegs))] == ["Z.jpg", "a/c/d.jpg"] and jpegs[1] == b"A/C/D.JPG"
    assert [PackedDataset(tmp_path / "d.ffr", "a/*").path(i) for i in range(2)] == ["a/link", "a/x"]
    for bad in ([1.9], [True, False]):
        with pytest.raises(IndexError, match="integers"):
            dataset[bad]
    assert dataset[torch.tensor([2, 0])] == [dataset[2], dataset[0]] and dataset[torch.tensor(1)] == dataset[1]
    assert dataset[[]] == [] and dataset.path(-1) == paths[-1]
    with pytest.raises(IndexError):
        dataset.path(-len(dataset) - 1)
    with pytest.raises(packfs.PathNotFoundError, match="no file matches 'nothing/\\*\\*'"):
        PackedDataset(tmp_path / "d.ffr", "nothing/**")


@pytest.mark.parametrize(("pattern", "path", "matches"), [
    ("**/*", "a", True), ("**/*", "a/b/c", True), ("**", "a/b", True),
    ("**/*.jpg", "x.jpg", True), ("**/*.jpg", "a/b/x.jpg", True), ("**/*.jpg", "a/x.png", False),
    ("train/**/*.jpg", "train/x.jpg", True), ("train/**/*.jpg", "val/x.jpg", False),
    ("*", "a/b", False), ("a/?", "a/b", True), ("a/?", "a/bc", False), ("a/[bc]", "a/c", True),
    ("a/[!bc]", "a/d", True), ("a/[!bc]", "a/b", False), ("a[!x]b", "a/b", False),
    ("*.jpg", ".hidden.jpg", True), ("a.b", "aXb", False), ("[", "[", True), ("[z-a]", "x", False),
    ("a/**/b/**/*.jpg", "a/b/x.jpg", True), ("a/**/b/**/*.jpg", "a/x/b/y/z.jpg", True),
    ("a/**/b/**/*.jpg", "a/x/c/z.jpg", False), ("x[[]1].jpg", "x[1].jpg", True),
    # fnmatch's own matching per name: linear in the name, however many stars.
    ("*_*_*_*.jpg", "_" * 1000, False), ("*_*_*_*.jpg", "_" * 1000 + ".jpg", True),
])
def test_glob_patterns(pattern: str, path: str, matches: bool) -> None:
    assert Glob(pattern)(path) is matches


@pytest.mark.parametrize("pattern", ["", "/", "a/*/", "**/"])
def test_glob_patterns_that_select_no_file_are_refused(pattern: str) -> None:
    with pytest.raises(ValueError):
        Glob(pattern)


def test_it_pickles_small_and_reopens_where_it_is_used(samples_archive: Path) -> None:
    dataset = PackedDataset(samples_archive)
    pickled = pickle.dumps(dataset)
    # The archive's path and 8 bytes per file, never the data or the map.
    assert len(pickled) < 1024 + 8 * SAMPLES and sample_bytes(5)[6:40] not in pickled
    clone = pickle.loads(pickled)
    assert clone.files._folder is None and clone[5] == dataset[5]
    assert clone.files._folder is not None


def test_a_changed_archive_is_refused_after_pickling(tmp_path: Path) -> None:
    out = tmp_path / "d.ffr"
    packfs.pack_entries([packfs.Entry("a", b"one"), packfs.Entry("b", b"two")], out)
    pickled = pickle.dumps(PackedDataset(out))
    packfs.pack_entries([packfs.Entry("b", b"other"), packfs.Entry("c", b"three!")], out, force=True)
    with pytest.raises(packfs.FormatError, match="changed since these files were selected"):
        pickle.loads(pickled)[0]


def test_damaged_contents_raise_checksum_error_single_and_batched(tmp_path: Path) -> None:
    out = tmp_path / "d.ffr"
    packfs.pack_entries([packfs.Entry(f"f{i}", bytes([i]) * 1000) for i in range(10)], out)
    with packfs.PackedFolder(out) as folder:
        start, _ = folder.archive.extent(folder.archive.lookup("f3"))
    with open(out, "r+b") as f:
        f.seek(start + 10)
        f.write(b"\xee")
    dataset = PackedDataset(out)
    with pytest.raises(packfs.ChecksumError, match="'f3'.*checksum mismatch"):
        dataset[3]
    with pytest.raises(packfs.ChecksumError, match="'f3'"):
        dataset[[2, 3, 4]]
    assert dataset[[2, 4]] == [bytes([2]) * 1000, bytes([4]) * 1000]
    unchecked = PackedDataset(out, check_data=False)
    assert unchecked[3][10:11] == b"\xee" and unchecked[[3]][0] == unchecked[3]


def test_files_in_a_legacy_ffrecord_archive(tmp_path: Path) -> None:
    from packfs.ffrecord import pack_folder as ffrecord_pack_folder

    src = tmp_path / "src"
    (src / "x").mkdir(parents=True)
    for name in ["2.bin", "1.bin", "x/3.bin"]:
        (src / name).write_bytes(name.encode() * 100)
    ffrecord_pack_folder(str(src), str(tmp_path / "legacy.ffr"))
    files = PackedFiles(tmp_path / "legacy.ffr")
    assert [files.path(i) for i in range(3)] == ["1.bin", "2.bin", "x/3.bin"]
    assert files.read_batch([2, 0]) == [b"x/3.bin" * 100, b"1.bin" * 100]


def torchvision_make_dataset(root: Path, extensions: tuple[str, ...]) -> tuple[list[str], list[tuple[str, int]]]:
    """torchvision.datasets.folder.find_classes and make_dataset, as written there
    (torchvision has no CPU build to install here)."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    samples = []
    for index, name in enumerate(classes):
        for directory, _, fnames in sorted(os.walk(root / name, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(directory, fname)
                if path.lower().endswith(extensions):
                    samples.append((os.path.relpath(path, root.parent), index))
    return classes, samples


def test_image_folder_has_torchvisions_semantics_and_decodes(tmp_path: Path) -> None:
    import cv2

    src = tmp_path / "src"
    train = src / "train"
    image = np.zeros((6, 5, 3), np.uint8)
    image[..., 0] = 200  # blue in OpenCV's BGR
    png = cv2.imencode(".png", image)[1].tobytes()
    for relative in ["cat/1.png", "cat/z.PNG", "cat/sub/0.png", "cat/sub/deep/5.png", "cat/sub-x/9.png", "cat/notes.txt",
                     "dog/2.png", "ant.b/3.png", "dog/deeper/and/deeper/4.png"]:
        (train / relative).parent.mkdir(parents=True, exist_ok=True)
        (train / relative).write_bytes(b"not an image" if relative.endswith(".txt") else png)
    (train / "stray.png").write_bytes(png)  # a file in root is no class
    packfs.pack_folder(src, tmp_path / "d.ffr")
    dataset = PackedImageFolder(tmp_path / "d.ffr", root="train", loader="cv2")
    classes, samples = torchvision_make_dataset(train, dataset_extensions())
    assert dataset.classes == classes == ["ant.b", "cat", "dog"]
    assert dataset.class_to_idx == {"ant.b": 0, "cat": 1, "dog": 2}
    assert list(dataset.samples) == list(dataset.imgs) == samples
    assert dataset.targets == [target for _, target in samples]
    decoded, target = dataset[1]
    assert target == 1 and decoded.shape == (6, 5, 3) and decoded[0, 0].tolist() == [0, 0, 200]  # RGB
    pil_image, _ = PackedImageFolder(tmp_path / "d.ffr", loader="pil")[0]
    assert pil_image.mode == "RGB" and pil_image.size == (5, 6) and pil_image.getpixel((0, 0)) == (0, 0, 200)
    batch = PackedImageFolder(tmp_path / "d.ffr", loader=len, target_transform=str).__getitems__([0, 2])
    assert batch == [(len(png), "0"), (len(png), "1")]
    only_sub = PackedImageFolder(tmp_path / "d.ffr", loader=len, allow_empty=True,
                                 is_valid_file=lambda path: "/sub/" in path)
    assert [path for path, _ in only_sub.samples] == ["train/cat/sub/0.png", "train/cat/sub/deep/5.png"]
    with pytest.raises(FileNotFoundError, match="no valid file for the classes ant.b, dog"):
        PackedImageFolder(tmp_path / "d.ffr", is_valid_file=lambda path: "/sub/" in path)
    with pytest.raises(FileNotFoundError):
        PackedImageFolder(tmp_path / "d.ffr", root="missing")
    with pytest.raises(ValueError, match="OpenCV cannot decode"):
        PackedImageFolder(tmp_path / "d.ffr", loader="cv2", extensions=(".txt",), allow_empty=True)[0]


def dataset_extensions() -> tuple[str, ...]:
    from packfs.torch import IMG_EXTENSIONS

    return IMG_EXTENSIONS


def test_image_folder_through_a_spawned_worker(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for relative in ["train/a/1.jpg", "train/a/2.jpg", "train/b/3.jpg"]:
        (src / relative).parent.mkdir(parents=True, exist_ok=True)
        (src / relative).write_bytes(relative.encode())
    packfs.pack_folder(src, tmp_path / "d.ffr")
    dataset = PackedImageFolder(tmp_path / "d.ffr", loader=bytes)
    loader = DataLoader(dataset, batch_size=2, num_workers=1, multiprocessing_context="spawn", collate_fn=list)
    assert [sample for batch in loader for sample in batch] == [
        (b"train/a/1.jpg", 0), (b"train/a/2.jpg", 0), (b"train/b/3.jpg", 1)]


def test_packfs_never_imports_torch(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = ("import sys, packfs, packfs.cli, packfs.mount, packfs.dataset, packfs.fsspec; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_hostile_tables_are_refused_by_single_and_batched_reads(tmp_path: Path) -> None:
    from tests.conftest import read_records, rewrite_section

    base = tmp_path / "base.ffr"
    packfs.pack_entries([packfs.Entry(name, name.encode() * 100) for name in ("a", "b", "c")], base)
    with packfs.PackedFolder(base) as folder:
        entry_b = folder.archive.lookup("b")
    records = read_records(base)
    # A record of 2**64 - k (with the size of record n - k, a table section whose CRC
    # matches) is -k as int64: numpy would read that section as b's contents.
    k = next(k for k in range(2, len(records)) if records[-k])
    step = rewrite_section(base, tmp_path / "step.ffr", "record", lambda a: a.__setitem__(entry_b, (1 << 64) - k))
    negative = rewrite_section(step, tmp_path / "negative.ffr", "size",
                               lambda a: a.__setitem__(entry_b, len(records[-k])))
    top_bit = rewrite_section(base, tmp_path / "top-bit.ffr", "record", lambda a: a.__setitem__(entry_b, 1 << 63))
    for archive in (negative, top_bit):
        dataset = PackedDataset(archive)
        for read in (lambda: dataset[1], lambda: dataset[[0, 1]], lambda: dataset[[1]]):
            with pytest.raises(packfs.FormatError, match="record"):
                read()
        assert dataset[[0, 2]] == [b"a" * 100, b"c" * 100]


def test_overlapping_child_ranges_are_refused_not_walked_exponentially(tmp_path: Path) -> None:
    from tests.conftest import rewrite_section

    depth = 40
    base = tmp_path / "chain.ffr"
    packfs.pack_entries([packfs.Entry("/".join(["d"] * depth) + "/f.jpg", b"x")], base)

    def every_later_entry(count: np.ndarray) -> None:  # directory k lists entries k+1 .. N-1
        for k in range(1, depth + 1):
            count[k] = depth + 1 - k

    hostile = rewrite_section(base, tmp_path / "dag.ffr", "child_count", every_later_entry)
    for make in (lambda: PackedDataset(hostile), lambda: PackedImageFolder(hostile, root="d"),
                 lambda: packfs.PackedFolder(hostile).list(recursive=True)):
        with pytest.raises(packfs.FormatError, match="name another parent"):
            make()


def test_an_archive_truncated_while_open_is_an_error_not_sigbus(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = tmp_path / "d.ffr"
    packfs.pack_entries([packfs.Entry(f"f{i:04d}", bytes(4096)) for i in range(2000)], out)
    code = f"""
import os, packfs
from packfs.dataset import PackedFiles
files = PackedFiles({str(out)!r})
os.truncate({str(out)!r}, os.path.getsize({str(out)!r}) // 2)
for read in (lambda: files[1999], lambda: files.read_batch([1999, 0])):
    try:
        read()
    except packfs.FormatError as error:
        assert "changed while open" in str(error), error
    else:
        raise SystemExit("no error")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, (result.returncode, result.stderr)  # -7 would be SIGBUS


def test_records_over_2_gib_are_read_in_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Linux's pread returns at most 2 GiB - 4 KiB; the same short reads, made small.
    import packfs.source.local

    out = tmp_path / "d.ffr"
    contents = bytes(range(256)) * 40
    packfs.pack_entries([packfs.Entry("big", contents)], out)
    real_pread = os.pread
    monkeypatch.setattr(packfs.source.local.os, "pread", lambda fd, n, offset: real_pread(fd, min(n, 1000), offset))
    dataset = PackedDataset(out)
    assert dataset[0] == contents and dataset[[0]] == [contents]


def test_a_replacement_made_while_selecting_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "d.ffr"
    packfs.pack_entries([packfs.Entry("a", b"one"), packfs.Entry("b", b"two")], out)
    folder = packfs.PackedFolder(out)
    # Replaced (a new inode, the same size) after the folder was opened, before the
    # dataset selects from it: the selection describes the old file.
    packfs.pack_entries([packfs.Entry("a", b"ONE"), packfs.Entry("b", b"TWO")], out, force=True)
    dataset = PackedDataset(folder)
    assert dataset[0] == b"one"
    with pytest.raises(packfs.FormatError, match="changed since these files were selected"):
        pickle.loads(pickle.dumps(dataset))[0]


def test_image_folder_details_as_torchvision(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for relative in ["train/cat/1.png", "train/cat/2.gif", "elsewhere/dog/3.png"]:
        (src / relative).parent.mkdir(parents=True, exist_ok=True)
        (src / relative).write_bytes(relative.encode())
    (src / "train" / "dog").symlink_to("../elsewhere/dog")  # a symlinked class counts
    (src / "train" / "cat" / "0.png").symlink_to("1.png")
    packfs.pack_folder(src, tmp_path / "d.ffr")
    dataset = PackedImageFolder(tmp_path / "d.ffr", loader=bytes, extensions=".png")  # a string, as torchvision
    assert dataset.classes == ["cat", "dog"]
    assert list(dataset.samples) == [("train/cat/0.png", 0), ("train/cat/1.png", 0), ("train/dog/3.png", 1)]
    assert [image for image, _ in (dataset[i] for i in range(3))] == [
        b"train/cat/1.png", b"train/cat/1.png", b"elsewhere/dog/3.png"]
    with pytest.raises(FileNotFoundError):
        PackedImageFolder(tmp_path / "d.ffr", extensions=())
    with PackedDataset(tmp_path / "d.ffr") as opened:
        assert len(opened) == 4
    assert opened.files._folder is None
