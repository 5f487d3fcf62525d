"""One rank of a block-aware run, as tests/test_windows.py starts it: a PackedDataset
over a URL with ``window_bytes``, a WindowedSampler given its rank and world size
(no process group), a DataLoader of 2 forked workers.

    python -m tests.windowed_rank URL RANK WORLD WINDOW_BYTES POOL OUT PERSISTENT [--sync DIR]

Runs 2 epochs and writes OUT (JSON): each epoch's sample numbers in the order
delivered (a sample's first 8 bytes are its number) and the worker pids of each
epoch.  With --sync, after epoch 0 it writes DIR/done<RANK> and waits for DIR/go
(the test reads and clears the server's log in between, so each epoch's requests are
counted apart).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from packfs.torch import PackedDataset, WindowedSampler

BATCH = 8


def collate(batch: list) -> tuple:
    return [int(data[:8]) for data in batch], os.getpid()


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("url", "rank", "world", "window_bytes", "pool", "out", "persistent"):
        parser.add_argument(name)
    parser.add_argument("--sync", default="")
    options = parser.parse_args()
    dataset = PackedDataset(options.url, "**/*.bin", window_bytes=int(options.window_bytes))
    sampler = WindowedSampler(dataset, windows_per_pool=int(options.pool), num_replicas=int(options.world),
                              rank=int(options.rank), seed=3)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=2,
                                         collate_fn=collate, multiprocessing_context="fork",
                                         persistent_workers=options.persistent == "1")
    epochs: dict = {}
    workers: dict = {}
    for epoch in range(2):
        sampler.set_epoch(epoch)
        delivered = epochs.setdefault(str(epoch), [])
        for numbers, pid in loader:
            delivered += numbers
            workers.setdefault(str(epoch), set()).add(pid)
        if options.sync and epoch == 0:
            with open(os.path.join(options.sync, f"done{options.rank}"), "w"):
                pass
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(options.sync, "go")) and time.monotonic() < deadline:
                time.sleep(0.02)
    with open(options.out, "w") as file:
        json.dump({"epochs": epochs, "workers": {epoch: sorted(pids) for epoch, pids in workers.items()},
                   "windows": dataset.window_plan().windows}, file)


if __name__ == "__main__":
    main()
