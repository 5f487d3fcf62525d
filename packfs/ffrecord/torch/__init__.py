"""FFRecord's ``ffrecord.torch``: ``Dataset``, ``Subset``, ``ConcatDataset``,
``ReaderRegistry`` and ``DataLoader`` (``from packfs.ffrecord.torch import ...``).

The only part of :mod:`packfs.ffrecord` that imports torch.
"""

from .dataset import ConcatDataset, Dataset, ReaderRegistry, Subset
from .dataloader import DataLoader

__all__ = [
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "ReaderRegistry",
    "Subset",
]
