"""FFRecord's ``ffrecord.torch.dataset``: ``ReaderRegistry``, ``Dataset``, ``Subset``
and ``ConcatDataset``, whose ``__getitem__`` takes a batch: a list of indices in, a
list of samples out."""

from __future__ import annotations

import bisect
from typing import Any, Iterable, List, Sequence, Tuple, Union

from torch.utils.data import Dataset as TorchDataset

from ..fileio import FileReader

__all__ = ["ReaderRegistry", "Dataset", "Subset", "ConcatDataset"]


class ReaderRegistry:
    """An object that keeps track of the :class:`~packfs.ffrecord.FileReader` objects
    assigned to its attributes, and of other registries assigned to them, so that
    :meth:`ffreaders` finds every reader below it (FFRecord's ``ReaderRegistry``).

    Readers and registries are kept apart from the other attributes (in ``_readers``
    and ``_registries``), read back as attributes, and pickled with the object.
    """

    def ffreaders(self) -> list[FileReader]:
        """The readers assigned to this object's attributes, then those of each
        registry assigned to them, recursively."""
        readers = list(self.__dict__.get("_readers", {}).values())
        for registry in self.__dict__.get("_registries", {}).values():
            readers += registry.ffreaders()
        return readers

    def __setattr__(self, name: str, value: Any) -> None:
        state = self.__dict__
        readers = state.setdefault("_readers", {})
        registries = state.setdefault("_registries", {})
        # A name lives in one place: re-assigning it drops what it held elsewhere
        # (FFRecord's leaves a replaced reader in ffreaders()).
        readers.pop(name, None)
        registries.pop(name, None)
        if isinstance(value, FileReader):
            state.pop(name, None)
            readers[name] = value
        elif isinstance(value, ReaderRegistry):
            state.pop(name, None)
            registries[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        # Called only for names not found the usual way: readers and registries.
        state = self.__dict__
        for table in ("_readers", "_registries"):
            if name in state.get(table, ()):
                return state[table][name]
        return object.__getattribute__(self, name)

    def __delattr__(self, name: str) -> None:
        state = self.__dict__
        for table in ("_readers", "_registries"):
            if name in state.get(table, ()):
                del state[table][name]
                return
        object.__delattr__(self, name)


class Dataset(TorchDataset, ReaderRegistry):
    """FFRecord's dataset: ``dataset[indices]`` takes a list (or tuple) of indices and
    returns a list of samples, so that a batch is read at once.

    Either subclass it with your own ``__getitem__(self, indices)`` and ``__len__``
    (FFRecord's README and ImageNet example), or call ``super().__init__(fnames)`` and
    define :meth:`process`, which gets each batch's indices and raw records::

        class Samples(Dataset):
            def __init__(self, fnames, transform=None):
                super().__init__(fnames)
                self.transform = transform

            def process(self, indices, data):
                return [self.transform(pickle.loads(b)) for b in data]

    :class:`~packfs.ffrecord.torch.DataLoader` hands each batch of indices to
    ``dataset[batch]``; so does ``torch.utils.data.DataLoader``, through
    ``__getitems__``.  Datasets pickle with their readers, which re-open their files
    where they are unpickled (DataLoader workers under spawn).

    Parameters
    ----------
    fnames
        FFRecord file(s), as :class:`~packfs.ffrecord.FileReader` takes them.
    check_data
        Check each record's CRC as it is read.
    """

    def __init__(self, fnames: Union[str, List, Tuple], check_data: bool = True) -> None:
        self.fnames = fnames
        self.reader = FileReader(fnames, check_data)

    def __len__(self) -> int:
        return self.reader.n

    def __getitem__(self, indices: Sequence[int]) -> List[Any]:
        if not isinstance(indices, (list, tuple)):
            raise TypeError(f"indices must be a list of index, not {type(indices).__name__}")
        # The raw records of the batch, then the user-defined process().
        return self.process(indices, self.reader.read(indices))

    def __getitems__(self, indices: Sequence[int]) -> List[Any]:
        # What torch's DataLoader calls with a batch: the same batch call as FFRecord's
        # own fetcher makes, without patching torch.
        return self[indices]

    def process(self, indices: List[int], data: List[Any]) -> List[Any]:
        """Turn one batch's raw records (uint8 numpy arrays, one per index) into a list
        of samples, which the DataLoader's ``collate_fn`` then gets.  Define it in a
        subclass that does not define ``__getitem__``."""
        raise NotImplementedError(f"{type(self).__name__} defines neither process() nor __getitem__()")

    def __add__(self, other: Dataset) -> ConcatDataset:
        return ConcatDataset([self, other])


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices``: ``subset[[i, j]]`` is
    ``dataset[[indices[i], indices[j]]]``.

    Parameters
    ----------
    dataset
        The whole dataset (an FFRecord-style :class:`Dataset`).
    indices
        Indices into ``dataset`` (any sequence: a list, a numpy array, a range).
    """

    dataset: Dataset
    indices: Sequence[int]

    def __init__(self, dataset: Dataset, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, indices: Sequence[int]) -> List[Any]:
        return self.dataset[[self.indices[index] for index in indices]]

    def __len__(self) -> int:
        return len(self.indices)


class ConcatDataset(Dataset):
    """Datasets one after another: indices below ``len(datasets[0])`` are the first's,
    the next ``len(datasets[1])`` the second's, and so on; negative ones count from the
    end.  Each batch asks each dataset once, for its share, and returns the samples in
    the order of the indices (repeats included).

    Parameters
    ----------
    datasets
        FFRecord-style :class:`Dataset` objects; at least one.

    Raises
    ------
    ValueError
        ``datasets`` is empty.
    TypeError
        One of them is not an FFRecord-style Dataset.
    """

    datasets: List[Dataset]
    cumulative_sizes: List[int]

    @staticmethod
    def cumsum(sequence: Iterable[Dataset]) -> List[int]:
        """The running totals of the datasets' lengths."""
        totals, total = [], 0
        for dataset in sequence:
            total += len(dataset)
            totals.append(total)
        return totals

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("datasets should not be an empty iterable")
        for dataset in self.datasets:
            if not isinstance(dataset, Dataset):
                raise TypeError(f"ConcatDataset takes packfs.ffrecord.torch.Dataset objects, "
                                f"not {type(dataset).__name__}")
        self.cumulative_sizes = self.cumsum(self.datasets)

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def _convert_index(self, index: int) -> tuple[int, int]:
        """(dataset number, index in it) of ``index``."""
        if index < 0:
            if -index > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            index += len(self)
        dataset = bisect.bisect_right(self.cumulative_sizes, index)
        if dataset == len(self.datasets):
            raise IndexError(f"index {index} out of range for a dataset of {len(self)} samples")
        return dataset, index - (self.cumulative_sizes[dataset - 1] if dataset else 0)

    def __getitem__(self, indices: Sequence[int]) -> List[Any]:
        shares: dict[int, tuple[list[int], list[int]]] = {}  # dataset -> (its indices, batch positions)
        for position, index in enumerate(indices):
            dataset, sample = self._convert_index(index)
            wanted, positions = shares.setdefault(dataset, ([], []))
            wanted.append(sample)
            positions.append(position)
        samples: list[Any] = [None] * len(indices)
        for dataset, (wanted, positions) in sorted(shares.items()):
            for position, sample in zip(positions, self.datasets[dataset][wanted]):
                samples[position] = sample
        return samples
