"""FFRecord's ``ffrecord.torch``: ``Dataset``, ``Subset``, ``ConcatDataset``,
``ReaderRegistry`` and ``DataLoader`` (``from packfs.ffrecord.torch import ...``).

The only part of :mod:`packfs.ffrecord` that imports torch.
"""

from ...errors import missing_dependency

try:
    from .dataset import ConcatDataset, Dataset, ReaderRegistry, Subset
    from .dataloader import DataLoader
except ImportError as error:
    raise missing_dependency(error, "torch", "packfs.ffrecord.torch", "torch", "PyTorch") from None

__all__ = [
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "ReaderRegistry",
    "Subset",
]
