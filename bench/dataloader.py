"""DataLoader throughput: packfs.torch against a plain directory and the FUSE mount,
side by side in one run.

The same ImageNet-like tree as ``compare.py`` (JPEGs of about 65 KB in class folders)
is read, one shuffled epoch at a time, by ``torch.utils.data.DataLoader`` through:

* ``plain``: a Dataset of path strings doing ``open(path).read()`` on the directory
  (what torchvision's ImageFolder does, without decoding);
* ``mount``: the same Dataset on ``packfs mount`` of the archive;
* ``PackedDataset``: packfs.torch, batches read by ``__getitems__`` (the default);
* ``PackedDataset, per item``: the same, with the batch path hidden, so the DataLoader
  fetches one index at a time.

Each loader runs with ``--workers`` 0 and 2 (persistent workers, one untimed warm-up
epoch, then ``--repeat`` timed epochs in rotation), reading bytes only (the data path)
and, with ``--decode``, decoding each JPEG with OpenCV as training does.  Figures are
samples/s and the ratio to ``plain`` in the same round (the machines are shared: ratios
hold, absolute rates drift).

    python bench/dataloader.py                   # 8,000 images: a few minutes
    python bench/dataloader.py --images 20000 --decode

Writes ``dataloader.json`` and ``dataloader.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import packfs  # noqa: E402
from compare import Mount, file_list, make_tree  # noqa: E402
from packfs.torch import PackedDataset  # noqa: E402


class FileDataset(Dataset):
    """Files by path, as an ImageFolder-style dataset reads them."""

    def __init__(self, root: Path, paths: list[str], transform=None) -> None:
        self.paths = [str(root / path) for path in paths]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        with open(self.paths[index], "rb") as f:
            data = f.read()
        return data if self.transform is None else self.transform(data)


class PerItem(Dataset):
    """A dataset with its batch path (``__getitems__``) hidden from the DataLoader."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        return self.dataset[index]


def decode(data: bytes):
    import cv2
    import numpy as np

    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR).shape


def size_of(data: bytes) -> int:
    return len(data)


def loader_for(dataset: Dataset, workers: int, batch_size: int) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                      persistent_workers=workers > 0, collate_fn=list,
                      generator=torch.Generator().manual_seed(0))


def epoch(loader: DataLoader) -> float:
    start = time.perf_counter()
    count = sum(len(batch) for batch in loader)
    return count / (time.perf_counter() - start)


def small_files(work: Path, count: int, size: int) -> tuple[Path, Path, list[str]]:
    """A tree of ``count`` files of ``size`` bytes in 100 folders, and its archive."""
    import random

    src, archive = work / f"small-{count}x{size}", work / f"small-{count}x{size}.ffr"
    paths = [f"d{i % 100:03d}/f{i:07d}.bin" for i in range(count)]
    if not archive.exists():
        rng = random.Random(0)
        for path in paths:
            (src / path).parent.mkdir(parents=True, exist_ok=True)
            (src / path).write_bytes(rng.randbytes(size))
        packfs.pack_folder(src, archive)
    return src, archive, sorted(paths)


def read_rates(src: Path, archive: Path, pattern: str, label: str, repeat: int, batch_size: int) -> list[dict]:
    """One process, no DataLoader: files/s of each way to read the same files in batches,
    shuffled and in order, as the median of ``repeat`` rounds (each way once per round, rotated),
    with the ratio to reading them one index at a time."""
    import random

    from packfs.dataset import PackedFiles

    files = PackedFiles(archive, pattern)
    folder = packfs.PackedFolder(archive)
    paths = [files.path(i) for i in range(len(files))]
    plain_paths = [str(src / path) for path in paths]
    shuffled = list(range(len(files)))
    random.Random(0).shuffle(shuffled)
    rows = []
    for order_name, order in (("shuffled", shuffled), ("in order", list(range(len(files))))):
        batches = [order[k:k + batch_size] for k in range(0, len(order), batch_size)]

        # Each way gathers a batch, as a DataLoader does, and drops it before the next
        # one: keeping a whole epoch's data would time page faults on fresh memory.
        def one_at_a_time(batches=batches) -> None:
            for batch in batches:
                [files[i] for i in batch]

        def batched(batches=batches) -> None:
            for batch in batches:
                files.read_batch(batch)

        def by_path(batches=batches) -> None:
            for batch in batches:
                [folder.read(paths[i]) for i in batch]

        def plain(batches=batches) -> None:
            for batch in batches:
                contents = []
                for i in batch:
                    with open(plain_paths[i], "rb") as f:
                        contents.append(f.read())

        ways = {
            "one index at a time (files[i])": one_at_a_time,
            f"batches of {batch_size} (read_batch)": batched,
            "by path (PackedFolder.read)": by_path,
            "plain open().read()": plain,
        }
        for function in ways.values():
            function()  # warm
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        names = list(ways)
        for round_number in range(repeat):
            for name in names[round_number % len(names):] + names[:round_number % len(names)]:
                start = time.perf_counter()
                ways[name]()
                seconds[name].append(time.perf_counter() - start)
        base = statistics.median(seconds[names[0]])
        for name in names:
            median = statistics.median(seconds[name])
            rows.append({"files": label, "order": order_name, "way": name, "files_per_s": len(order) / median,
                         "speed_vs_one_at_a_time": base / median})
            print(f"{label:14} {order_name:8} {name:34} {len(order) / median:10.0f} files/s  x{base / median:.2f}", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=8000)
    parser.add_argument("--folders", type=int, default=80)
    parser.add_argument("--small-files", type=int, default=20000, help="4 KiB files for the in-process reads")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--decode", action="store_true", help="also decode every JPEG with OpenCV")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "packfs-dataloader")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    src = args.work / "src"
    make_tree(src, args.images, args.folders, large_mib=0, large_count=0)
    images, _, _ = file_list(src)
    archive = args.work / "tree.ffr"
    packfs.pack_folder(src, archive, force=True)
    mountpoint = args.work / "mnt"
    report: dict[str, object] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
                   f"torch {torch.__version__}",
        "command": " ".join(["python"] + sys.argv),
        "images": len(images),
        "mean_image_bytes": sum((src / path).stat().st_size for path in images) // len(images),
        "batch_size": args.batch_size,
        "results": [],
    }
    small_src, small_archive, _ = small_files(args.work, args.small_files, 4096)
    report["reads"] = (read_rates(src, archive, "**/*.JPEG", "JPEGs", args.repeat, args.batch_size)
                       + read_rates(small_src, small_archive, "**/*", "4 KiB files", args.repeat, args.batch_size))
    modes = [("bytes", size_of)] + ([("decode", decode)] if args.decode else [])
    with Mount("packfs", [sys.executable, "-m", "packfs", "mount", "-f", str(archive), str(mountpoint)],
               mountpoint):
        for mode, transform in modes:
            datasets = {
                "plain": FileDataset(src, images, transform),
                "mount": FileDataset(mountpoint, images, transform),
                "PackedDataset": PackedDataset(archive, "**/*.JPEG", transform=transform),
            }
            datasets["PackedDataset, per item"] = PerItem(datasets["PackedDataset"])
            for workers in args.workers:
                loaders = {name: loader_for(dataset, workers, args.batch_size) for name, dataset in datasets.items()}
                for loader in loaders.values():
                    epoch(loader)  # warm-up: page cache, worker start
                rates: dict[str, list[float]] = {name: [] for name in loaders}
                ratios: dict[str, list[float]] = {name: [] for name in loaders}
                names = list(loaders)
                for round_number in range(args.repeat):
                    # plain first in every round (the baseline), the others rotated.
                    others = names[1:]
                    others = others[round_number % len(others):] + others[:round_number % len(others)]
                    round_rates = {name: epoch(loaders[name]) for name in ["plain"] + others}
                    for name, rate in round_rates.items():
                        rates[name].append(rate)
                        ratios[name].append(rate / round_rates["plain"])
                for name in names:
                    row = {"mode": mode, "workers": workers, "loader": name,
                           "samples_per_s": statistics.median(rates[name]),
                           "ratio_to_plain": statistics.median(ratios[name]),
                           "ratio_range": [min(ratios[name]), max(ratios[name])]}
                    report["results"].append(row)  # type: ignore[union-attr]
                    print(f"{mode:6} workers={workers} {name:24} {row['samples_per_s']:9.0f} samples/s  "
                          f"x{row['ratio_to_plain']:.2f} of plain ({min(ratios[name]):.2f}-{max(ratios[name]):.2f})",
                          flush=True)
                del loaders
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dataloader.json").write_text(json.dumps(report, indent=2))
    (args.out / "dataloader.md").write_text(render(report))
    print(render(report))
    return 0


def render(report: dict) -> str:
    lines = [f"DataLoader throughput, {report['date']}, {report['machine']}",
             f"`{report['command']}`: {report['images']} JPEGs of {report['mean_image_bytes']} bytes on average, "
             f"batch size {report['batch_size']}, shuffled; median of rounds, ratio to plain in the same round.", "",
             "| read | workers | loader | samples/s | ratio to plain (range) |", "|---|---|---|---|---|"]
    for row in report["results"]:
        low, high = row["ratio_range"]
        lines.append(f"| {row['mode']} | {row['workers']} | {row['loader']} | {row['samples_per_s']:.0f} | "
                     f"{row['ratio_to_plain']:.2f} ({low:.2f}-{high:.2f}) |")
    lines += ["", "In one process, no DataLoader (the same files):", "",
              "| files | order | way | files/s | speed vs one index at a time |", "|---|---|---|---|---|"]
    for row in report["reads"]:
        lines.append(f"| {row['files']} | {row['order']} | {row['way']} | {row['files_per_s']:.0f} | {row['speed_vs_one_at_a_time']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
