"""PyTorch datasets over a packfs archive (``pip install packfs[torch]``).

::

    from packfs.torch import PackedDataset, PackedImageFolder
    train = PackedImageFolder("imagenet.ffr", root="train", transform=preprocess)
    loader = DataLoader(train, batch_size=256, shuffle=True, num_workers=8)

Both are map-style datasets that work with ``DataLoader(num_workers=N)`` under fork
and spawn: they pickle as the archive's path and an array of entry indices (8 bytes a
file), re-open the archive in each worker, read with ``pread`` (a worker's RSS does
not grow with what it has read) and share the path table's pages between workers.
``DataLoader`` hands a batch's indices to ``__getitems__``, which reads the batch in
archive order, one ``pread`` per run of adjacent files (from a URL: neighbours share
one ranged GET and the batch's GETs are in flight at once).  See :mod:`packfs.dataset`.

packfs itself never imports torch; only this module does.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from .errors import PathNotFoundError, missing_dependency

try:
    import torch
    from torch.utils.data import Dataset, DistributedSampler
except ImportError as error:
    raise missing_dependency(error, "torch", "packfs.torch", "torch", "PyTorch") from None

from .dataset import PackedFiles, PoolsAhead, files_by_directory, settled_window_bytes, shown_archive
from .folder import PackedFolder, PathArg
from .source import with_cache_dir
from .windows import DEFAULT_FIRST_POOL, DEFAULT_WINDOWS_PER_POOL, WindowPlan

__all__ = ["PackedDataset", "PackedImageFolder", "ResumableDistributedSampler", "WindowedSampler", "IMG_EXTENSIONS",
           "decode_pil", "decode_cv2"]

# torchvision's list, so the same files count as images.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class PackedDataset(Dataset):
    """The files of an archive that match ``pattern``, in sorted order of their paths.

    ``dataset[i]`` is the i-th file's bytes, or ``transform(bytes)``;
    ``dataset[[i, j, ...]]`` (FFRecord's batch convention) and ``__getitems__`` (what
    ``DataLoader`` calls for a batch) return a list.

    Parameters
    ----------
    archive
        The archive's path or URL, or an open :class:`~packfs.PackedFolder` (whose own
        ``check_data`` then applies).
    pattern
        A glob over paths in the archive: ``*`` within a name, ``**`` across
        directories (``"train/**/*.jpg"``).  Symlinks to files count as those files.
    transform
        Applied to each file's bytes.
    check_data
        Check each file's CRC as it is read.
    storage_options
        For a URL: credentials, endpoint and client options (:mod:`packfs.source.remote`).
    cache_dir
        For a URL: the disk cache shared by every process on the node
        (:mod:`packfs.source.cache`; None: ``$PACKFS_CACHE_DIR``, else
        ``~/.cache/packfs``; False: none).
    window_bytes
        Block-aware reading (docs/remote.md): files are grouped into windows of about
        this many bytes of adjacent records, and each window is fetched whole into the
        node's disk cache when its first file is read, for an epoch ordered by
        :meth:`sampler` (:class:`WindowedSampler`).  ``"auto"`` (the default): 8 MiB
        for an archive at a URL, None for a local one, and windows are fetched whole
        only once a :class:`WindowedSampler` orders the dataset (a uniform shuffle
        over it reads file by file); a size: windows of that size, fetched whole from
        the first read; None: files are read as asked (a true uniform shuffle costs a
        GET per file from a URL).

    Raises
    ------
    PathNotFoundError
        No file matches ``pattern``.
    """

    def __init__(self, archive: PathArg | PackedFolder, pattern: str = "**/*",
                 transform: Callable[[bytes], Any] | None = None, check_data: bool = True,
                 storage_options: Mapping[str, Any] | None = None, cache_dir: PathArg | bool | None = None,
                 window_bytes: int | str | None = "auto") -> None:
        spec = archive.spec if isinstance(archive, PackedFolder) else archive
        self.files = PackedFiles(archive, pattern, check_data, storage_options=storage_options, cache_dir=cache_dir,
                                 window_bytes=settled_window_bytes(window_bytes, spec),
                                 fetch_windows=window_bytes != "auto")
        self.transform = transform

    @property
    def window_bytes(self) -> int | None:
        """The windows' size when files are fetched a window at a time (None: as asked)."""
        return self.files.window_bytes

    def window_plan(self, window_bytes: int | None = None) -> WindowPlan:
        """The samples' windows (:meth:`packfs.dataset.PackedFiles.window_plan`)."""
        return self.files.window_plan(window_bytes)

    def sampler(self, windows_per_pool: int | None = None, num_replicas: int | None = None, rank: int | None = None,
                seed: int = 0, drop_last: bool = False, first_pool: int | None = None,
                fetch_ahead: bool = True) -> WindowedSampler:
        """The :class:`WindowedSampler` over this dataset's windows: the recipe for an
        archive at a URL is ``DataLoader(dataset, batch_size=64,
        sampler=dataset.sampler(), num_workers=4)`` (``sampler.set_epoch(epoch)`` each
        epoch)."""
        return WindowedSampler(self, windows_per_pool=windows_per_pool, num_replicas=num_replicas, rank=rank,
                               seed=seed, drop_last=drop_last, first_pool=first_pool, fetch_ahead=fetch_ahead)

    @property
    def archive(self) -> str:
        """The archive's path."""
        return self.files.archive

    def __len__(self) -> int:
        return len(self.files)

    def path(self, index: int) -> str:
        """The archive path of sample ``index``."""
        return self.files.path(index)

    def _sample(self, index: int, data: bytes) -> Any:
        return data if self.transform is None else self.transform(data)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, torch.Tensor) and index.ndim:
            index = index.tolist()
        if isinstance(index, (Sequence, np.ndarray)):
            return self.__getitems__(index)
        return self._sample(index, self.files[index])

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        return self.files.read_batch(indices, self._sample)

    def stats(self) -> dict[str, int]:
        """What reading cost in this process (a DataLoader worker's own): requests and
        bytes fetched from a URL (:meth:`packfs.PackedFolder.stats`)."""
        return self.files.stats()

    def close(self) -> None:
        """Close the archive in this process (it is also closed when the dataset is
        dropped); a worker re-opens its own."""
        self.files.close()

    def __enter__(self) -> PackedDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({shown_archive(self.archive)!r}, {self.files.pattern!r}: {len(self)} files)"


class ResumableDistributedSampler(DistributedSampler):
    """torch's ``DistributedSampler`` (each of ``num_replicas`` ranks gets its own
    share of every epoch, shuffled by ``seed`` and the epoch), which can also start an
    epoch part way through its share: to resume a run that stopped mid-epoch.

    A training loop saves ``sampler.state_dict(samples_done)``, where ``samples_done``
    counts the samples this rank consumed in the current epoch's iteration (steps x
    batch size: the sampler cannot count them itself, since a DataLoader draws indices
    ahead of what its workers delivered).  A new process makes the sampler with the same
    arguments and calls :meth:`load_state_dict`: iterating epoch ``state["epoch"]``
    then yields exactly the indices that epoch had left, in the same order (the
    permutation is drawn whole and its first ``samples_done`` dropped, as FFRecord's
    ``set_step`` does with batches); every other epoch, and calling
    :meth:`set_epoch` with it, is unaffected.

    ``num_replicas`` and ``rank`` may be given without a process group (otherwise
    torch takes them from ``torch.distributed``).

    Raises
    ------
    ValueError
        A state from another world size, rank or dataset size, or a start past the
        epoch's share.
    """

    def __init__(self, dataset: Any, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self.start_epoch = -1  # the epoch that starts part way (none: -1) ...
        self.start = 0  # ... and how many of its indices are skipped

    def _skipped(self) -> int:
        return self.start if self.epoch == self.start_epoch else 0

    def _epoch_indices(self) -> list[int]:
        """This rank's whole share of the current epoch, in order (what a subclass with
        another order replaces; skipping and resuming stay here)."""
        return list(super().__iter__())

    def _settings(self) -> dict[str, int]:
        """What a saved state must match to resume here (a subclass adds its own)."""
        return {"num_replicas": self.num_replicas, "rank": self.rank, "dataset_size": len(self.dataset),  # type: ignore[arg-type]
                "shuffle": int(self.shuffle), "drop_last": int(self.drop_last)}

    def __iter__(self) -> Any:
        return iter(self._epoch_indices()[self._skipped():])

    def __len__(self) -> int:
        return self.num_samples - self._skipped()

    def state_dict(self, samples_done: int) -> dict[str, int]:
        """What :meth:`load_state_dict` needs to resume after ``samples_done`` samples
        of this iteration of the current epoch were consumed (those a resumed epoch
        skipped are added here)."""
        return {"epoch": self.epoch, "start": self._skipped() + int(samples_done), "seed": self.seed,
                **self._settings()}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resume from :meth:`state_dict`'s state: the sampler's epoch becomes the saved
        one, whose first ``start`` indices are skipped."""
        mine = self._settings()
        foreign = sorted(set(state).difference(mine, ("epoch", "start", "seed")))
        if foreign:
            raise ValueError(f"the state has {', '.join(foreign)}: it was saved by another kind of sampler")
        for key in mine:
            if key not in state:
                raise ValueError(f"the state has no {key}: it was saved by another kind of sampler")
            if int(state[key]) != mine[key]:
                raise ValueError(f"the state was saved with {key}={state[key]}, this sampler has {key}={mine[key]}: "
                                 f"a run resumes with the same world, rank and dataset")
        if not 0 <= int(state["start"]) <= self.num_samples:
            raise ValueError(f"the state starts at sample {state['start']}, expected one in [0, {self.num_samples}]")
        self.seed = int(state["seed"])
        self.set_epoch(int(state["epoch"]))
        self.start_epoch, self.start = int(state["epoch"]), int(state["start"])


class WindowedSampler(ResumableDistributedSampler):
    """A block-aware epoch order for a dataset at a URL (:mod:`packfs.windows`): the
    dataset's windows of adjacent records permuted each epoch, taken
    ``windows_per_pool`` at a time, each pool's samples shuffled together; rank ``r`` of
    ``num_replicas`` takes every ``num_replicas``-th sample of that one order (from the
    ``r``-th), so the ranks of a node read the same pool at the same time and each
    window is fetched once per node, into the node's disk cache, by whichever process
    reads it first.  ``DistributedSampler``'s rules otherwise: equal counts per rank
    (the order padded with its own first samples, or cut with ``drop_last``),
    :meth:`set_epoch` before each epoch, and :class:`ResumableDistributedSampler`'s
    ``state_dict(samples_done)`` / ``load_state_dict`` to resume mid-epoch exactly.

    ::

        dataset = PackedImageFolder("s3://bucket/train.ffr", transform=preprocess)
        loader = DataLoader(dataset, batch_size=64, sampler=WindowedSampler(dataset), num_workers=4)
        for epoch in range(epochs):
            loader.sampler.set_epoch(epoch)
            ...

    Parameters
    ----------
    dataset
        A :class:`PackedDataset` or :class:`PackedImageFolder` (anything with
        ``window_plan(window_bytes)``).
    window_bytes
        The windows' size: None takes the dataset's (the windows it fetches whole);
        a dataset made with ``window_bytes=None`` (a local archive) gets windows of
        :data:`packfs.windows.DEFAULT_WINDOW_BYTES`.
    windows_per_pool
        Windows shuffled together (None: :data:`packfs.windows.DEFAULT_WINDOWS_PER_POOL`);
        more mixes batches better, and the first batch waits for more windows.
    num_replicas, rank
        The world and this rank (None: from ``torch.distributed`` when a process group
        is initialized, else a world of 1 and rank 0).
    seed, drop_last
        As ``DistributedSampler``'s.
    first_pool
        Windows in an epoch's first pool, a pool of their own (None:
        :data:`packfs.windows.DEFAULT_FIRST_POOL`; 0: none apart): the first batch waits
        for these few windows, not for the ~one a sample a full pool's batch touches.
    fetch_ahead
        Fetch each pool's successor into the node's disk cache, on a thread of this
        process, as the pool starts being drawn (:class:`packfs.dataset.PoolsAhead`),
        so that the workers find it there.

    Raises
    ------
    ValueError
        ``windows_per_pool`` under 1, ``first_pool`` under 0, or ``window_bytes``
        other than the dataset's.
    """

    def __init__(self, dataset: Any, window_bytes: int | None = None, windows_per_pool: int | None = None,
                 num_replicas: int | None = None, rank: int | None = None, seed: int = 0,
                 drop_last: bool = False, first_pool: int | None = None, fetch_ahead: bool = True) -> None:
        if num_replicas is None or rank is None:
            # One process without a process group is a world of one (the recipe's
            # single-GPU loop), where DistributedSampler would raise.
            group = torch.distributed.is_available() and torch.distributed.is_initialized()
            num_replicas = (torch.distributed.get_world_size() if group else 1) if num_replicas is None else num_replicas
            rank = (torch.distributed.get_rank() if group else 0) if rank is None else rank
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=drop_last)
        self.windows_per_pool = DEFAULT_WINDOWS_PER_POOL if windows_per_pool is None else int(windows_per_pool)
        if self.windows_per_pool < 1:
            raise ValueError(f"windows_per_pool must be at least 1, not {windows_per_pool}")
        self.first_pool = DEFAULT_FIRST_POOL if first_pool is None else int(first_pool)
        if self.first_pool < 0:
            raise ValueError(f"first_pool must be 0 or more, not {first_pool}")
        self.plan = dataset.window_plan(window_bytes)
        # The dataset's reads fetch whole windows from now on (its order is windowed),
        # and this process fetches each pool ahead of its reads.
        files = getattr(dataset, "files", None)
        self._ahead: PoolsAhead | None = None
        if isinstance(files, PackedFiles) and files.window_bytes is not None:
            files.fetch_windows = True
            if fetch_ahead:
                self._ahead = PoolsAhead(files)

    def _epoch(self) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        return self.plan.epoch_pools(self.seed, self.epoch, self.windows_per_pool, self.first_pool)

    def _share(self, order: np.ndarray) -> list[int]:
        # DistributedSampler's padding (the order repeated from its start) or cut.
        order = np.resize(order, self.total_size)
        return order[self.rank:self.total_size:self.num_replicas].tolist()

    def _epoch_indices(self) -> list[int]:
        return self._share(self._epoch()[0])

    def __iter__(self) -> Any:
        order, starts, pools = self._epoch()
        skipped = self._skipped()
        indices = self._share(order)[skipped:]
        if self._ahead is None:
            return iter(indices)
        # Where each pool starts in this rank's share (every world-th sample from the
        # rank-th), counted from the first index this iteration yields.
        local = -(-(starts - self.rank) // self.num_replicas) - skipped
        return self._fetching_ahead(indices, np.maximum(local, 0), pools)

    def _fetching_ahead(self, indices: list[int], starts: np.ndarray, pools: list[np.ndarray]) -> Iterator[int]:
        """``indices``, asking this process's fetcher for each pool's successor as the
        pool starts being drawn (the DataLoader draws a few batches ahead of its
        workers' reads), and for the first pool and the next at once."""
        ahead = self._ahead
        assert ahead is not None
        ahead.restart()
        current = max(0, int(np.searchsorted(starts, 0, side="right")) - 1)
        for pool in pools[current:current + 2]:
            ahead.ask(pool)
        following = current + 1
        for position, index in enumerate(indices):
            while following < len(pools) and position >= starts[following]:
                if following + 1 < len(pools):
                    ahead.ask(pools[following + 1])
                following += 1
            yield index

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_ahead"] = None  # a thread: a copy of the sampler fetches nothing ahead
        return state

    def _settings(self) -> dict[str, int]:
        return {**super()._settings(), "window_bytes": self.plan.window_bytes,
                "windows_per_pool": self.windows_per_pool, "first_pool": self.first_pool}


def decode_pil(data: bytes) -> Any:
    """An RGB PIL image, as torchvision's default loader gives."""
    try:
        from PIL import Image
    except ImportError as error:
        raise missing_dependency(error, "PIL", "packfs.torch.decode_pil", "torch", "Pillow") from None

    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def decode_cv2(data: bytes) -> np.ndarray:
    """An RGB uint8 array of shape (height, width, 3), decoded by OpenCV."""
    import cv2

    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR) if data else None
    if image is None:
        raise ValueError(f"OpenCV cannot decode these {len(data)} bytes as an image")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


_LOADERS = {"pil": decode_pil, "cv2": decode_cv2}


class PackedImageFolder(PackedDataset):
    """torchvision's ``ImageFolder`` over directory ``root`` of an archive.

    The same semantics: the classes are the sorted names of ``root``'s
    sub-directories, ``class_to_idx`` maps them to 0, 1, ...; ``samples`` lists
    (path, class index) in the order ``ImageFolder`` gives (each class's directories
    in sorted order, files sorted by name), ``targets`` the class indices;
    ``dataset[i]`` is ``(transform(image), target_transform(class index))``.  Paths
    are archive paths (``"train/cat/1.jpg"``).  A symlinked class directory counts, as
    in torchvision; unlike torchvision, symlinked directories below a class are not
    walked and a broken symlink is left out.

    Parameters
    ----------
    archive
        The archive's path or URL (or an open :class:`~packfs.PackedFolder`).
    root
        The directory in the archive holding one sub-directory per class.
    transform, target_transform
        Applied to each decoded image, and to each class index.
    loader
        ``"pil"`` (an RGB PIL image, torchvision's default), ``"cv2"`` (an RGB uint8
        array from OpenCV), or a function of the file's bytes.
    extensions, is_valid_file
        Which files count as samples: by (case-insensitive) extension, default
        :data:`IMG_EXTENSIONS`, or by a function of the path; not both.
    allow_empty
        Allow classes with no sample instead of raising.
    check_data
        Check each file's CRC as it is read.
    storage_options
        For a URL: credentials, endpoint and client options (:mod:`packfs.source.remote`).
    cache_dir
        For a URL: the disk cache shared by every process on the node
        (:mod:`packfs.source.cache`; None: ``$PACKFS_CACHE_DIR``, else
        ``~/.cache/packfs``; False: none).
    window_bytes
        Block-aware reading (docs/remote.md): files are grouped into windows of about
        this many bytes of adjacent records, and each window is fetched whole into the
        node's disk cache when its first file is read, for an epoch ordered by
        :meth:`sampler` (:class:`WindowedSampler`).  ``"auto"`` (the default): 8 MiB
        for an archive at a URL, None for a local one, and windows are fetched whole
        only once a :class:`WindowedSampler` orders the dataset (a uniform shuffle
        over it reads file by file); a size: windows of that size, fetched whole from
        the first read; None: files are read as asked (a true uniform shuffle costs a
        GET per file from a URL).

    Raises
    ------
    PathNotFoundError (a FileNotFoundError)
        ``root`` is missing or has no class directory, or a class has no sample.
    """

    def __init__(self, archive: PathArg | PackedFolder, root: str = "train",
                 transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[int], Any] | None = None,
                 loader: str | Callable[[bytes], Any] = "pil",
                 extensions: tuple[str, ...] | None = None,
                 is_valid_file: Callable[[str], bool] | None = None,
                 allow_empty: bool = False, check_data: bool = True,
                 storage_options: Mapping[str, Any] | None = None, cache_dir: PathArg | bool | None = None,
                 window_bytes: int | str | None = "auto") -> None:
        storage_options = with_cache_dir(storage_options, cache_dir)
        if extensions is not None and is_valid_file is not None:
            raise ValueError("give extensions or is_valid_file, not both")
        if isinstance(loader, str):
            if loader not in _LOADERS:
                raise ValueError(f"loader must be 'pil', 'cv2' or a function of the bytes, not {loader!r}")
            loader = _LOADERS[loader]
        folder = (archive if isinstance(archive, PackedFolder)
                  else PackedFolder(archive, check_data, storage_options=storage_options))
        self.root = root.strip("/")
        self.classes, self.class_to_idx = self.find_classes(folder, self.root)
        by_extension = is_valid_file is None
        if isinstance(extensions, str):
            extensions = (extensions,)  # as torchvision takes it, not one character at a time
        if is_valid_file is None:
            suffixes = tuple(extension.lower() for extension in
                             (IMG_EXTENSIONS if extensions is None else extensions))
            is_valid_file = lambda path: path.lower().endswith(suffixes)  # noqa: E731
        entries: list[int] = []
        targets: list[int] = []
        links: dict[int, str] = {}  # the paths of samples reached through a symlink
        empty = []
        for index, name in enumerate(self.classes):
            found = len(entries)
            class_path = f"{self.root}/{name}" if self.root else name
            linked_class = folder.is_symlink(class_path)
            for path, entry, listed in files_by_directory(folder, class_path, is_valid_file):
                if listed != entry or linked_class:
                    links[len(entries)] = path
                entries.append(entry)
                targets.append(index)
            if len(entries) == found:
                empty.append(name)
        if empty and not allow_empty:
            raise PathNotFoundError(
                f"{folder.path!r}: no valid file for the classes {', '.join(empty)} in {self.root!r}"
                + (f" (extensions: {', '.join(suffixes)})" if by_extension else "")
            )
        self.files = PackedFiles(folder, f"{self.root}/*/**" if self.root else "*/**", check_data,
                                 entries=np.array(entries, dtype=np.int64), links=links,
                                 storage_options=storage_options,
                                 window_bytes=settled_window_bytes(window_bytes, folder.spec),
                                 fetch_windows=window_bytes != "auto")
        self._targets = np.array(targets, dtype=np.int32)  # 4 bytes a sample in every pickle
        self._targets.setflags(write=False)
        self.transform = transform
        self.target_transform = target_transform
        self.loader = loader

    @staticmethod
    def find_classes(folder: PackedFolder, root: str) -> tuple[list[str], dict[str, int]]:
        """(sorted class names, class name -> index): the directories in ``root``."""
        # Symlinks to directories count, as os.DirEntry.is_dir() counts them.
        classes = sorted(name for name, _ in folder.scandir(root)
                         if folder.is_dir(f"{root}/{name}" if root else name))
        if not classes:
            raise PathNotFoundError(f"{folder.path!r}: no class directory in {root!r}")
        return classes, {name: index for index, name in enumerate(classes)}

    @property
    def targets(self) -> list[int]:
        """The class index of every sample (a list, as torchvision's)."""
        return self._targets.tolist()

    @property
    def samples(self) -> _Samples:
        """(archive path, class index) of every sample; built on access, one at a time."""
        return _Samples(self)

    imgs = samples

    def _sample(self, index: int, data: bytes) -> tuple[Any, Any]:
        try:
            image = self.loader(data)
        except Exception as error:
            if hasattr(error, "add_note"):  # Python 3.11+
                error.add_note(f"while decoding {self.path(index)!r} in {shown_archive(self.archive)!r}")
            raise
        target: Any = int(self._targets[index])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target


class _Samples(Sequence):
    """``samples`` without a tuple per file held in memory."""

    def __init__(self, dataset: PackedImageFolder) -> None:
        self._dataset = dataset

    def __len__(self) -> int:
        return len(self._dataset)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self._dataset.path(index), int(self._dataset._targets[index])
