"""Trained zstd dictionaries for ``--dictionary auto`` (format 1.5, section 4f).

Small files compress poorly alone: a 2 KB JSON file has too little history for zstd to
find its repetitions, which are across files.  A dictionary trained on a sample of the
tree gives every small file that history while it stays its own frame, readable alone.
One dictionary is trained per kind of file (its extension) that has enough small files,
and one for the other small files together; each is kept only if it pays: compressing
the sample with it must save more than the dictionary's own size, scaled to every file
of that kind.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Callable, Sequence

import zstandard

__all__ = ["train_dictionaries", "DICTIONARY_SIZE", "SMALL_FILE_MAX", "SAMPLES_PER_KIND"]

log = logging.getLogger("packfs")

DICTIONARY_SIZE = 112 * 1024  # zstd's own default (zstd --train)
SMALL_FILE_MAX = 64 * 1024  # larger files have history enough of their own
SAMPLES_PER_KIND = 2000
_MIN_SAMPLES = 32
_MAX_DICTIONARIES = 16
GENERAL = ""  # the kind of the dictionary for small files of no kind with its own


def train_dictionaries(files: Sequence[tuple[str, int]], read: Callable[[int], bytes | None],
                       level: int) -> list[tuple[str, bytes]]:
    """Dictionaries worth storing, as (kind, bytes).

    ``files`` are (kind, size) of every file to be packed, in pack order; ``read(i)``
    gives file ``i``'s bytes (None if it cannot be read now: it is left out of the
    sample).  Files up to SMALL_FILE_MAX bytes are sampled, evenly spread, at most
    SAMPLES_PER_KIND a kind."""
    by_kind: dict[str, list[int]] = defaultdict(list)
    for index, (kind, size) in enumerate(files):
        if 0 < size <= SMALL_FILE_MAX:
            by_kind[kind].append(index)
    kinds = sorted(by_kind, key=lambda kind: -sum(files[i][1] for i in by_kind[kind]))
    own = [kind for kind in kinds if kind != GENERAL and len(by_kind[kind]) >= SAMPLES_PER_KIND // 4]
    own = own[: _MAX_DICTIONARIES - 1]
    general = [i for kind in kinds if kind not in own for i in by_kind[kind]]
    groups = [(kind, by_kind[kind]) for kind in own] + ([(GENERAL, sorted(general))] if general else [])
    chosen = []
    for kind, members in groups:
        trained = _train(kind, members, files, read, level)
        if trained is not None:
            chosen.append((kind, trained))
    return chosen


def _train(kind: str, members: list[int], files: Sequence[tuple[str, int]], read: Callable[[int], bytes | None],
           level: int) -> bytes | None:
    step = max(1, len(members) // SAMPLES_PER_KIND)
    samples = [data for data in (read(i) for i in members[::step][:SAMPLES_PER_KIND]) if data]
    if len(samples) < _MIN_SAMPLES:
        return None
    sample_bytes = sum(map(len, samples))
    size = min(DICTIONARY_SIZE, max(4096, sample_bytes // 10))
    # Trained on every other sample, judged on the rest: a dictionary scored on its
    # own training set would always look as if it paid.
    judged = samples[1::2]
    training: list[bytes | bytearray | memoryview] = list(samples[::2])
    try:
        # Fixed cover parameters: zstd's search for the best ones took 7.7 s on a
        # 14 MB sample of site-packages where these take 0.1 s, for a dictionary
        # within 0.5% as good (bench/compression.py measures the result).
        dictionary = zstandard.train_dictionary(size, training, k=512, d=8, f=18, accel=4, level=level)
    except zstandard.ZstdError as error:  # too few or too uniform samples
        log.debug("no dictionary for %r files: %s", kind or "other", error)
        return None
    data = dictionary.as_bytes()
    plain = zstandard.ZstdCompressor(level=level, write_checksum=False, write_dict_id=False)
    with_dictionary = zstandard.ZstdCompressor(level=level, dict_data=dictionary, write_checksum=False,
                                               write_dict_id=False)
    without = sum(len(plain.compress(sample)) for sample in judged)
    with_it = sum(len(with_dictionary.compress(sample)) for sample in judged)
    judged_bytes = sum(map(len, judged)) or 1
    total_bytes = sum(files[i][1] for i in members)
    saved = (without - with_it) * total_bytes / judged_bytes
    if saved <= len(data):
        log.debug("dictionary for %r files dropped: saves %d bytes, costs %d", kind or "other", saved, len(data))
        return None
    return data

