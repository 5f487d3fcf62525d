"""One rank of a distributed training run, as tests/test_distributed.py starts it: a
PackedDataset over a URL, a ResumableDistributedSampler given its rank and world
size (no process group), a DataLoader with 2 forked workers reading batches.

    python -m tests.distributed_rank URL RANK WORLD SEED EPOCHS OUT [--stop-after STEPS --state FILE] [--resume FILE]

Writes OUT (JSON): each epoch's sample numbers in the order delivered (a sample's
first 8 bytes are its number), and what this rank's workers fetched (the sum of
each worker's last ``stats()``, which each collate call reports).  With
--stop-after, stops after that many batches of the first epoch run and saves the
sampler's state to FILE; with --resume, starts from such a state.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from packfs.torch import PackedDataset, ResumableDistributedSampler

BATCH = 8


def collate(batch: list) -> tuple:
    info = torch.utils.data.get_worker_info()
    return [int(data[:8]) for data in batch], os.getpid(), info.dataset.stats()


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("url", "rank", "world", "seed", "epochs", "out"):
        parser.add_argument(name)
    parser.add_argument("--stop-after", type=int, default=0)
    parser.add_argument("--state", default="")
    parser.add_argument("--resume", default="")
    options = parser.parse_args()
    dataset = PackedDataset(options.url, "**/*.bin")
    sampler = ResumableDistributedSampler(dataset, num_replicas=int(options.world), rank=int(options.rank),
                                          shuffle=True, seed=int(options.seed))
    first_epoch = 0
    if options.resume:
        with open(options.resume) as file:
            state = json.load(file)
        sampler.load_state_dict(state)
        first_epoch = state["epoch"]
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=2,
                                         collate_fn=collate, multiprocessing_context="fork", persistent_workers=True)
    epochs: dict = {}
    worker_stats: dict = {}
    for epoch in range(first_epoch, int(options.epochs)):
        sampler.set_epoch(epoch)
        delivered = epochs.setdefault(str(epoch), [])
        for step, (numbers, pid, stats) in enumerate(loader):
            delivered += numbers
            worker_stats[pid] = stats  # counters since the worker opened the archive
            if options.stop_after and step + 1 == options.stop_after:
                with open(options.state, "w") as file:
                    json.dump(sampler.state_dict((step + 1) * BATCH), file)
                break
        else:
            continue
        break
    fetched = {key: sum(stats.get(key, 0) for stats in worker_stats.values()) for key in ("bytes_fetched", "requests")}
    with open(options.out, "w") as file:
        json.dump({"epochs": epochs, "workers": len(worker_stats), **fetched}, file)


if __name__ == "__main__":
    main()
