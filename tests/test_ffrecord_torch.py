"""packfs.ffrecord.torch: FFRecord's Dataset, Subset, ConcatDataset, ReaderRegistry and
DataLoader, checked as FFRecord's own tests check them (tests/test_pytorch.py,
tests/test_registry.py there) and against torch's DataLoader."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import require_extra

torch = require_extra("torch", "torch")

from torch.utils.data import DataLoader as TorchDataLoader  # noqa: E402

from packfs.ffrecord import FileReader, FileWriter  # noqa: E402
from packfs.ffrecord.torch import ConcatDataset, DataLoader, Dataset, ReaderRegistry, Subset  # noqa: E402
from packfs.ffrecord.torch.dataloader import SkipableSampler  # noqa: E402


class Pairs(Dataset):
    """FFRecord's DummyFireFlyerDataset: the base class reads, process() unpickles."""

    def process(self, indices, data):
        return [pickle.loads(bytes_) for bytes_ in data]


class Raw(Dataset):
    """FFRecord's DummyFFDataset."""

    def process(self, indices, data):
        return [bytes(d) for d in data]


class Tagged(Dataset):
    """A README-style dataset (its own __getitem__), tagging each sample with the
    process that read it."""

    def __init__(self, fname):
        self.reader = FileReader(fname, check_data=True)

    def __len__(self):
        return self.reader.n

    def __getitem__(self, indices):
        return [(pickle.loads(b)[0], os.getpid()) for b in self.reader.read(indices)]


def pairs_file(path: Path, n: int) -> Path:
    with FileWriter(path, n) as writer:
        for i in range(n):
            writer.write_one(pickle.dumps((i * 2, i * 3)))
    return path


def torch_pairs(n: int, **arguments) -> list:
    return list(TorchDataLoader([(i * 2, i * 3) for i in range(n)], **arguments))


def same_batches(left: list, right: list) -> bool:
    return len(left) == len(right) and all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(left, right))


# -- ReaderRegistry -----------------------------------------------------------------


class A(ReaderRegistry):
    def __init__(self, file1, file2):
        self.r1 = FileReader(file1)
        self.r2 = FileReader(file2)


class B(Dataset):
    def __init__(self, file1, file2):
        self.reader1 = FileReader(file1)
        self.reader2 = FileReader(file2)
        self.another = A(file1, file2)
        self.plain = 5


def test_reader_registry_finds_every_reader_below_it(tmp_path: Path) -> None:
    path = pairs_file(tmp_path / "a.ffr", 3)
    b = B(path, path)
    readers = b.ffreaders()
    assert len(readers) == 4 and all(isinstance(r, FileReader) for r in readers)  # FFRecord's test
    assert readers[:2] == [b.reader1, b.reader2] and readers[2:] == [b.another.r1, b.another.r2]
    assert b.plain == 5 and "reader1" not in b.__dict__ and "plain" in b.__dict__
    twin = pickle.loads(pickle.dumps(b))  # readers pickle as their names and re-open
    assert len(twin.ffreaders()) == 4 and twin.another.r2.read_one(2).tobytes() == pickle.dumps((4, 6))
    b.reader1 = 7  # a name holds one thing: the old reader is gone from ffreaders()
    assert b.reader1 == 7 and len(b.ffreaders()) == 3
    del b.reader2
    del b.another
    assert b.ffreaders() == [] and not hasattr(b, "reader2") and not hasattr(b, "another")
    with pytest.raises(AttributeError):
        del b.nothing
    with pytest.raises(AttributeError):
        b.nothing  # noqa: B018


# -- Dataset, Subset, ConcatDataset -------------------------------------------------


def test_dataset_takes_lists_of_indices(tmp_path: Path) -> None:
    path = pairs_file(tmp_path / "a.ffr", 10)
    dataset = Pairs(path)
    assert len(dataset) == 10 and dataset.fnames == path and dataset.ffreaders() == [dataset.reader]
    assert dataset[[3, 0, 3]] == [(6, 9), (0, 0), (6, 9)] and dataset[(1,)] == [(2, 3)]
    with pytest.raises(TypeError, match="list of index"):
        dataset[3]
    seen = []

    class Recording(Dataset):
        def process(self, indices, data):
            seen.append((indices, [(type(d), d.dtype) for d in data]))
            return list(indices)

    assert Recording(path, check_data=False)[[4, 2]] == [4, 2]
    assert seen == [([4, 2], [(np.ndarray, np.uint8)] * 2)]
    with pytest.raises(NotImplementedError):
        Dataset(path)[[0]]


def test_concat_dataset_subset_and_plus_as_ffrecords_tests(tmp_path: Path) -> None:
    n = 100
    for name, factor in (("a.ffr", 1), ("b.ffr", 2)):
        with FileWriter(tmp_path / name, n) as writer:
            for i in range(n):
                writer.write_one(bytearray([(i * factor) % 256]))
    ds1, ds2 = Raw(tmp_path / "a.ffr", True), Raw(tmp_path / "b.ffr", True)
    ds, ds3 = ConcatDataset([ds1, ds2]), ds1 + ds2
    assert isinstance(ds3, ConcatDataset) and len(ds3) == len(ds) == 200 and ds.cumulative_sizes == [100, 200]
    indices = list(range(len(ds)))
    assert ds[indices] == ds3[indices] == [bytes([i % 256]) for i in range(100)] + \
        [bytes([(2 * i) % 256]) for i in range(100)]
    # Mixed order, negative indices and repeats (FFRecord loses all but the last repeat).
    assert ds[[150, 3, -1, 150, 3]] == [bytes([100]), bytes([3]), bytes([198]), bytes([100]), bytes([3])]
    with pytest.raises(ValueError, match="should not exceed dataset length"):
        ds[[-201]]
    with pytest.raises(IndexError):
        ds[[200]]
    with pytest.raises(ValueError):
        ConcatDataset([])
    with pytest.raises(TypeError):
        ConcatDataset([ds1, [b"x"]])
    picks = np.random.default_rng(0).choice(n, n // 2)
    subset = Subset(ds1, picks)
    assert len(subset) == len(picks)
    for i in range(len(subset)):
        assert subset[[i]] == ds1[[picks[i]]]  # numpy indices, as FFRecord's test passes them
    assert (subset + ds2)[[len(subset)]] == [bytes([0])]
    assert Subset(ds, range(150, 160))[[0, 9]] == [bytes([100]), bytes([118])]
    assert subset.ffreaders() == [ds1.reader]


# -- DataLoader ---------------------------------------------------------------------


def test_dataloader_gives_torchs_batches(tmp_path: Path) -> None:
    n = 100
    dataset = Pairs(pairs_file(tmp_path / "a.ffr", n))
    loader = DataLoader(dataset, batch_size=8, shuffle=False, num_workers=0)
    assert isinstance(loader.batch_sampler, SkipableSampler) and loader.skippable
    assert len(loader) == 13 and same_batches(list(loader), torch_pairs(n, batch_size=8))
    # torch's own DataLoader batches FFRecord-style datasets too (through __getitems__).
    assert same_batches(list(TorchDataLoader(dataset, batch_size=8)), torch_pairs(n, batch_size=8))
    # Plain torch datasets load as torch loads them.
    plain = DataLoader([(i * 2, i * 3) for i in range(n)], batch_size=8, drop_last=True)
    assert len(plain) == 12 and same_batches(list(plain), torch_pairs(n, batch_size=8, drop_last=True))
    # FFRecord's positional order: the 12th argument is the generator.
    generator = torch.Generator().manual_seed(3)
    positional = DataLoader(dataset, 8, True, None, None, 0, None, False, False, 0, None, generator)
    assert positional.generator is generator
    assert same_batches(list(positional), torch_pairs(n, batch_size=8, shuffle=True,
                                                     generator=torch.Generator().manual_seed(3)))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_set_step_skips_the_first_batches_of_the_same_epoch(tmp_path: Path, shuffle: bool, batch_size: int) -> None:
    # FFRecord's subtest_set_step, without workers (the worker tests below add them).
    nbatches, step = 25, 5
    n = batch_size * nbatches
    reference = torch_pairs(n, batch_size=batch_size, shuffle=shuffle, generator=torch.Generator().manual_seed(12345))
    loader = DataLoader(Pairs(pairs_file(tmp_path / "a.ffr", n)), batch_size=batch_size, shuffle=shuffle,
                        generator=torch.Generator().manual_seed(12345))
    loader.set_step(step)
    assert len(loader) == nbatches - step
    assert same_batches(list(loader), reference[step:])
    assert len(list(loader)) == nbatches - step  # the next epoch skips too, until set_step(0)
    loader.set_step(0)
    assert len(loader) == nbatches and len(list(loader)) == nbatches


def test_set_step_arguments(tmp_path: Path) -> None:
    dataset = Pairs(pairs_file(tmp_path / "a.ffr", 10))
    loader = DataLoader(dataset, batch_size=4)
    loader.set_step(2)
    assert len(loader) == 1
    for wrong in (-1, 3, 10):
        with pytest.raises(ValueError, match=r"step must be in \[0, 3\)"):
            loader.set_step(wrong)
    fixed = DataLoader(dataset, batch_size=4, skippable=False)
    assert not isinstance(fixed.batch_sampler, SkipableSampler)
    with pytest.raises(ValueError, match="not skippable"):
        fixed.set_step(1)
    with pytest.raises(ValueError, match="needs batches"):
        DataLoader(dataset, batch_size=None)
    # Unbatched, as FFRecord fetches it: collate_fn (default_convert) of dataset[[i]].
    from torch.utils.data import default_convert

    unbatched = DataLoader(dataset, batch_size=None, skippable=False)
    assert list(unbatched) == [default_convert([(i * 2, i * 3)]) for i in range(10)]
    shuffled = DataLoader(dataset, batch_size=None, shuffle=True, skippable=False,
                          generator=torch.Generator().manual_seed(1))
    assert sorted(tuple(sample) for [sample] in shuffled) == [(i * 2, i * 3) for i in range(10)]
    empty = DataLoader(Subset(dataset, []), batch_size=4)
    empty.set_step(0)  # FFRecord refuses even 0 when there is no batch
    assert list(empty) == []


@pytest.mark.parametrize("context", [None, "spawn"])
def test_two_workers_resume_mid_epoch(tmp_path: Path, context: str | None) -> None:
    # None: FFRecord's fixed choice, fork (the reader is inherited); spawn: the dataset
    # and its reader are pickled to each worker and re-open the file there.
    n, batch_size, step = 48, 4, 3
    dataset = Tagged(pairs_file(tmp_path / "a.ffr", n)) + Tagged(tmp_path / "a.ffr")
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=2, multiprocessing_context=context,
                        generator=torch.Generator().manual_seed(7), persistent_workers=True)
    assert loader.multiprocessing_context.get_start_method() == (context or "fork")
    full = [(values.tolist(), pids.tolist()) for values, pids in loader]
    assert sorted(v for values, _ in full for v in values) == sorted(list(range(0, 2 * n, 2)) * 2)
    pids = {pid for _, batch_pids in full for pid in batch_pids}
    assert len(pids) == 2 and os.getpid() not in pids
    # Resume: a new loader with the same generator seed, set_step(3), gives the tail.
    resumed = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=2, multiprocessing_context=context,
                         generator=torch.Generator().manual_seed(7))
    resumed.set_step(step)
    assert [values.tolist() for values, _ in resumed] == [values for values, _ in full[step:]]
    # The persistent loader's next epoch honours a set_step too.
    loader.set_step(len(loader) - 1)
    assert len(list(loader)) == 1
