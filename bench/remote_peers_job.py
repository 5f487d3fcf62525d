"""One measured training job of bench/remote_peers.py (issue 36), run in a fresh process.

It runs in the venv of the system it measures (packfs's own .venv, or a peer's venv
that the benchmark installed), so it imports nothing from packfs or the repository
at the top: only the standard library, torch, PIL and, inside its system's function,
that system's own package.

    python bench/remote_peers_job.py '{"system": "mds", ...}'
    python bench/remote_peers_job.py --write mds IMAGES OUT     # the system's writer

It talks to the benchmark on stdout and stdin, one line each: at every boundary it
prints ``@@MARK {json}`` and waits for a line on stdin, so that the benchmark reads
the proxy's counters (requests, bytes) at that boundary before the job goes on.  The
marks: ``start`` (imports done, before the dataset is made: the clock of "time to
first batch" starts here), ``epoch`` (one per epoch: samples, seconds, first batch,
classes per batch), ``done``.  Anything else a library prints is ignored.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

SIZE = 64  # the side images are resized to: the decode and resize every system pays


def mark(kind: str, **figures) -> None:
    print("@@MARK " + json.dumps({"kind": kind, **figures}), flush=True)
    sys.stdin.readline()  # the benchmark has read its counters


def to_tensor(image: Image.Image) -> torch.Tensor:
    image = image.convert("RGB").resize((SIZE, SIZE), Image.BILINEAR)
    return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)


def decode(data: bytes) -> torch.Tensor:
    return to_tensor(Image.open(io.BytesIO(data)))


# -- the systems: each returns an iterable of (images, labels) batches, re-iterable per epoch ---

def packfs_loader(job: dict):
    from packfs.torch import PackedImageFolder

    if job["packfs_mode"] == "uniform":
        # Today's default for a local archive, asked for explicitly at a URL: every file
        # read as asked (window_bytes=None), in a uniform shuffle: a GET per sample.
        dataset = PackedImageFolder(job["url"], root="train", transform=to_tensor, cache_dir=job["cache_dir"],
                                    window_bytes=None)
        return _EpochLoader(dataset, shuffle=True)
    # Block-aware reading (issue 36): windows of adjacent records, each fetched whole into
    # the node cache by whichever worker reads it first, shuffled a pool of windows at a
    # time (WindowedSampler); the dataset's default window size for a URL unless given.
    from packfs.torch import WindowedSampler

    dataset = PackedImageFolder(job["url"], root="train", transform=to_tensor, cache_dir=job["cache_dir"],
                                window_bytes=job.get("window_bytes") or "auto")
    # One process: num_replicas and rank given (without them it asks torch.distributed).
    return _EpochLoader(dataset, sampler=WindowedSampler(dataset, num_replicas=1, rank=0, seed=job["seed"]))


class _EpochLoader:
    """A DataLoader per epoch (workers not persistent, as the issue's run has it),
    setting the sampler's epoch where it has one."""

    def __init__(self, dataset, shuffle: bool = False, sampler=None) -> None:
        self.dataset, self.shuffle, self.sampler, self.epoch = dataset, shuffle, sampler, 0
        self.loader = DataLoader(dataset, batch_size=JOB["batch"], num_workers=JOB["workers"],
                                 shuffle=shuffle if sampler is None else None, sampler=sampler)

    def __iter__(self):
        if self.sampler is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)
        self.epoch += 1
        return iter(self.loader)


class PlainObjects(Dataset):
    """Each JPEG its own object, read by one GET (boto3, one client per worker): the
    ImageFolder of an object store, listed once."""

    def __init__(self, bucket: str, prefix: str) -> None:
        import boto3

        self.bucket = bucket
        client = boto3.client("s3")
        self.keys = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
            self.keys += [item["Key"] for item in page.get("Contents", ())]
        self.keys.sort()
        classes = sorted({key.split("/")[-2] for key in self.keys})
        index = {name: i for i, name in enumerate(classes)}
        self.labels = [index[key.split("/")[-2]] for key in self.keys]
        self._client = None
        self._pid = None

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int):
        if self._pid != os.getpid():  # a client of the worker's own, not the parent's
            import boto3

            self._client, self._pid = boto3.client("s3"), os.getpid()
        body = self._client.get_object(Bucket=self.bucket, Key=self.keys[i])["Body"].read()
        return decode(body), self.labels[i]


def plain_loader(job: dict):
    return _EpochLoader(PlainObjects(job["bucket"], job["prefix"]), shuffle=True)


def import_streaming() -> None:
    """Import MosaicML streaming, whose package imports torchvision (for vision data sets
    not used here).  PyPI's torchvision is a CUDA build: its compiled ops cannot load
    beside the CPU torch, and its import then fails registering meta kernels for those
    absent ops.  Those registrations are skipped (an empty module in their place);
    torchvision's Python parts, all that streaming imports, load as they are."""
    import types

    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    import streaming  # noqa: F401


def mds_loader(job: dict):
    import_streaming()
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()  # a previous job's, should one have died

    class Images(StreamingDataset):
        def __getitem__(self, i):
            sample = super().__getitem__(i)
            return decode(sample["image"]), sample["label"]

    dataset = Images(remote=f"s3://{job['bucket']}/{job['prefix']}", local=job["cache_dir"], shuffle=True,
                     shuffle_seed=job["seed"], batch_size=job["batch"])
    return _EpochLoader(dataset)


def wds_loader(job: dict):
    import webdataset as wds

    # Its documented pipeline: shards shuffled and split among workers, a shuffle
    # buffer, shards read by curl (webdataset's own opener for http URLs) and kept in
    # a local cache for the next epoch.
    dataset = (wds.WebDataset(job["urls"], shardshuffle=len(job["urls"]), cache_dir=job["cache_dir"],
                              nodesplitter=wds.single_node_only, empty_check=False, seed=job["seed"])
               .shuffle(1000).to_tuple("jpg", "cls").map_tuple(decode, lambda b: int(b)))
    return _EpochLoader(dataset)


def litdata_loader(job: dict):
    import litdata as ld
    from litdata.streaming import downloader
    from litdata.streaming.resolver import Dir

    # Its chunk GETs go through obstore, with client options of its own that leave out
    # allow_http (and so override AWS_ALLOW_HTTP): the loopback endpoint is plain http.
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True

    class Images(ld.StreamingDataset):
        def __getitem__(self, i):
            sample = super().__getitem__(i)
            return decode(sample["image"]), sample["label"]

    dataset = Images(input_dir=Dir(path=job["cache_dir"], url=f"s3://{job['bucket']}/{job['prefix']}"),
                     shuffle=True, seed=job["seed"], storage_options=job["storage_options"])
    loader = ld.StreamingDataLoader(dataset, batch_size=job["batch"], num_workers=job["workers"])
    return loader


# -- the writers: each system's own, with the settings its docs recommend -------------------

def samples(images: str):
    """(bytes, class index, key) of the ImageFolder ``images/train``, in its order."""
    root = os.path.join(images, "train")
    for label, name in enumerate(sorted(os.listdir(root))):
        for file in sorted(os.listdir(os.path.join(root, name))):
            with open(os.path.join(root, name, file), "rb") as handle:
                yield handle.read(), label, f"{name}_{file[:-4]}"


def write_mds(images: str, out: str) -> None:
    import_streaming()
    from streaming import MDSWriter

    # Its defaults: shards up to 64 MiB (size_limit 1 << 26), no compression.
    with MDSWriter(out=out, columns={"image": "bytes", "label": "int"}) as writer:
        for data, label, _ in samples(images):
            writer.write({"image": data, "label": label})


def write_wds(images: str, out: str) -> None:
    import webdataset as wds

    # Shards of 100 MB, the low end of the 100 MB-1 GB its docs recommend (the data set is 1 GB).
    with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxsize=100_000_000, maxcount=1_000_000) as sink:
        for data, label, key in samples(images):
            sink.write({"__key__": key, "jpg": data, "cls": label})


def _litdata_sample(item):
    path, label = item
    with open(path, "rb") as handle:
        return {"image": handle.read(), "label": label}


def write_litdata(images: str, out: str) -> None:
    import litdata as ld

    root = os.path.join(images, "train")
    inputs = [(os.path.join(root, name, file), label) for label, name in enumerate(sorted(os.listdir(root)))
              for file in sorted(os.listdir(os.path.join(root, name)))]
    # chunk_bytes="64MB" as its README's examples; one worker: the one core the writers get.
    ld.optimize(fn=_litdata_sample, inputs=inputs, output_dir=out, chunk_bytes="64MB", num_workers=1)


WRITERS = {"mds": write_mds, "wds": write_wds, "litdata": write_litdata}
SYSTEMS = {"packfs": packfs_loader, "plain": plain_loader, "mds": mds_loader, "wds": wds_loader,
           "litdata": litdata_loader}
JOB: dict = {}


def main() -> None:
    if sys.argv[1] == "--write":
        WRITERS[sys.argv[2]](sys.argv[3], sys.argv[4])
        return
    JOB.update(json.loads(sys.argv[1]))
    torch.set_num_threads(1)
    mark("start")
    start = time.perf_counter()
    loader = SYSTEMS[JOB["system"]](JOB)
    for epoch in range(1, JOB["epochs"] + 1):
        began = time.perf_counter() if epoch > 1 else start
        samples, first, classes = 0, None, []
        limit = JOB.get("max_samples") or None
        for images, labels in loader:
            if first is None:
                first = time.perf_counter() - began
            samples += len(labels)
            if len(labels) == JOB["batch"]:  # a short last batch would lower the mean
                classes.append(len(set(torch.as_tensor(labels).tolist())))
            if limit and samples >= limit:
                break
        seconds = time.perf_counter() - began
        mark("epoch", epoch=epoch, samples=samples, seconds=seconds, first_batch=first,
             classes_per_batch=(sum(classes) / len(classes)) if classes else None, full_batches=len(classes))
    mark("done")


if __name__ == "__main__":
    main()
