"""What reading an archive at a URL costs in memory, per process, as
tests/test_remote_memory.py measures it in processes of its own (so that pytest's
memory is not counted):

    python -m tests.remote_memory open URL     # 1,000 files open at once
    python -m tests.remote_memory loader URL   # a DataLoader with 8 workers, one epoch
    python -m tests.remote_memory prefetch URL CACHE   # every file fetched into a disk cache

Prints one JSON line: for ``open``, this process's memory with every file open (and
a part of each read); for ``loader``, each worker's after the epoch's last batch it
read.  Memory is in bytes: ``rss`` (VmRSS), ``peak`` (VmHWM, the highest RSS), ``own``
(Private_Clean + Private_Dirty of /proc/self/smaps_rollup: pages no other process
shares, which leaves out the pages a forked worker shares with its parent, such as
torch's own 200 MB) and ``start_rss`` (VmRSS before the first read).
"""

from __future__ import annotations

import json
import os
import stat
import sys


def memory() -> dict:
    status = {}
    with open("/proc/self/status") as file:
        for line in file:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                status[name] = int(value.split()[0]) * 1024
    own = 0
    with open("/proc/self/smaps_rollup") as file:
        for line in file:
            name, _, value = line.partition(":")
            if name in ("Private_Clean", "Private_Dirty"):
                own += int(value.split()[0]) * 1024
    return {"rss": status["VmRSS"], "peak": status["VmHWM"], "own": own}


def open_files(url: str) -> dict:
    from packfs import PackedFolder

    folder = PackedFolder(url)
    paths = folder.list("", list_dir=False, recursive=True)
    start = memory()["rss"]
    files = [folder.open(path) for path in paths]
    for file in files:
        file.seek(len(file.read(100)) * 10)
        file.read(4096)
    found = memory()
    found.update(start_rss=start, files=len(files), open=sum(not file.closed for file in files),
                 **folder.stats())
    return found


_START: dict = {}


def _worker_start(worker: int) -> None:
    _START["rss"] = memory()["rss"]


def _collate(batch: list) -> dict:
    found = memory()
    found.update(start_rss=_START["rss"], pid=os.getpid(), samples=len(batch))
    return found


def loader(url: str) -> dict:
    import torch

    from packfs.torch import PackedDataset

    dataset = PackedDataset(url, "**/*")
    loader = torch.utils.data.DataLoader(dataset, batch_size=32, shuffle=True, num_workers=8,
                                         collate_fn=_collate, worker_init_fn=_worker_start,
                                         multiprocessing_context="fork")
    workers: dict = {}
    samples = 0
    for report in loader:
        samples += report.pop("samples")
        workers[report["pid"]] = report  # the last: peak covers the epoch
    return {"samples": samples, "parent": memory(), "workers": list(workers.values())}


def prefetch(url: str, cache_dir: str) -> dict:
    """Every file of the archive fetched into the disk cache in one call (the windows of
    a block-aware epoch, all at once), the memory it took."""
    import numpy  # noqa: F401 (imported by the first prefetch: 13 MiB of code and data, not what it fetched)

    from packfs.core import Archive

    with Archive(url, cache_dir=cache_dir) as archive:
        files = [entry for entry in range(archive.entry_count) if stat.S_ISREG(archive.file_type(entry))]
        start = memory()["rss"]
        fetched = archive.prefetch(files)
        found = memory()
        found.update(start_rss=start, fetched=fetched, **archive.stats())
    return found


if __name__ == "__main__":
    mode, url = sys.argv[1], sys.argv[2]
    found = open_files(url) if mode == "open" else prefetch(url, sys.argv[3]) if mode == "prefetch" else loader(url)
    print(json.dumps(found))
