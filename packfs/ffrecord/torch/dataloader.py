"""FFRecord's ``ffrecord.torch.dataloader``: ``DataLoader``, whose ``set_step`` skips
the first batches of an epoch (to resume a run mid-epoch), and its ``SkipableSampler``."""

from __future__ import annotations

import operator
from typing import Any, Iterable, Iterator, List, Optional

from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import RandomSampler, Sampler, SequentialSampler

from .dataset import Dataset

__all__ = ["DataLoader", "SkipableSampler"]


class SkipableSampler(Sampler[List[int]]):
    """A batch sampler that skips the first ``step`` batches of ``sampler``.

    Skipping draws them and drops them, so the batches that follow are exactly those
    an unskipped epoch would give after them (a shuffling sampler draws the same
    permutation).  ``len()`` counts the batches left.
    """

    def __init__(self, sampler: Iterable[List[int]]) -> None:
        self.sampler = sampler
        self.step = 0

    def __iter__(self) -> Iterator[List[int]]:
        for i, batch in enumerate(self.sampler):
            if i >= self.step:
                yield batch

    def __len__(self) -> int:
        return len(self.sampler) - self.step  # type: ignore[arg-type]

    def set_step(self, step: int) -> None:
        """Skip the first ``step`` batches from the next epoch on."""
        self.step = step


class _SingletonBatches(Sampler[List[int]]):
    """``[index]`` for each index of ``sampler``: how FFRecord's loader asks one of its
    datasets, which take lists only, for an unbatched sample (``batch_size=None``)."""

    def __init__(self, sampler: Iterable[int]) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[List[int]]:
        return ([index] for index in self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]


class DataLoader(TorchDataLoader):
    """PyTorch's ``DataLoader``, with FFRecord's arguments and ``set_step``.

    FFRecord-style :class:`~packfs.ffrecord.torch.Dataset` objects get each batch of
    indices in one call (``dataset[batch]``); other datasets are loaded as torch loads
    them.  Workers are forked (FFRecord's fixed choice) unless
    ``multiprocessing_context`` says otherwise.

    Parameters
    ----------
    dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, \
pin_memory, drop_last, timeout, worker_init_fn, generator, prefetch_factor, persistent_workers
        As torch's (FFRecord's order: ``generator`` is the 12th positional argument;
        ``prefetch_factor`` is ignored without workers).
    skippable
        Make :meth:`set_step` available (the batch sampler becomes a
        :class:`SkipableSampler`).  ``False`` keeps torch's own batch sampler (what
        PyTorch Lightning expects).
    multiprocessing_context
        A packfs addition: the workers' start method, ``"fork"`` by default as in
        FFRecord; ``"spawn"`` or ``"forkserver"`` pickle the dataset to each worker.

    Raises
    ------
    ValueError
        ``skippable`` without batches (``batch_size=None`` and no ``batch_sampler``).
    """

    def __init__(self, dataset: Any, batch_size: Optional[int] = 1, shuffle: bool = False, sampler: Any = None,
                 batch_sampler: Any = None, num_workers: int = 0, collate_fn: Any = None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn: Any = None, generator: Any = None, *,
                 prefetch_factor: int = 2, persistent_workers: bool = False, skippable: bool = True,
                 multiprocessing_context: Any = None) -> None:
        if num_workers == 0:
            # torch >= 2.0 refuses a prefetch_factor without workers; FFRecord's default
            # of 2 means nothing there.
            prefetch: Optional[int] = None
            multiprocessing_context = None
        else:
            prefetch = prefetch_factor
            multiprocessing_context = multiprocessing_context or "fork"
        if skippable and batch_size is None and batch_sampler is None:
            raise ValueError("a skippable DataLoader needs batches: give batch_size or batch_sampler, "
                             "or skippable=False")
        if batch_size is None and batch_sampler is None and isinstance(dataset, Dataset):
            if sampler is None:
                # torch's own default sampler, built here to be wrapped.
                sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
                shuffle = False
            sampler = _SingletonBatches(sampler)
        self.skippable = skippable
        super().__init__(dataset=dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                         batch_sampler=batch_sampler, num_workers=num_workers, collate_fn=collate_fn,
                         pin_memory=pin_memory, drop_last=drop_last, timeout=timeout,
                         worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
                         generator=generator, prefetch_factor=prefetch, persistent_workers=persistent_workers)
        if skippable:
            # torch forbids setting batch_sampler after __init__ (its __setattr__);
            # FFRecord sets it the same way, past that guard.
            object.__setattr__(self, "batch_sampler", SkipableSampler(self.batch_sampler))

    def set_step(self, step: int) -> None:
        """Start the next epochs at batch ``step``: the first ``step`` batches are
        skipped (and ``len(loader)`` shrinks by ``step``) until ``set_step(0)``.

        Raises
        ------
        ValueError
            The loader is not skippable, or ``step`` is not in ``[0, number of batches)``
            (``0`` is always allowed).
        """
        if not self.skippable:
            raise ValueError("This dataloader is not skippable (skippable=False)")
        step = operator.index(step)
        batches = len(self.batch_sampler.sampler)
        if not (0 <= step < batches or step == 0):
            raise ValueError(f"step must be in [0, {batches}), the number of batches in an epoch; got {step}")
        self.batch_sampler.set_step(step)
