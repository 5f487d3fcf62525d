"""The contract's fixtures: the tree packed once per session, stored and through codecs,
and ``kind``, every reader over each packing (tests/contract/readers.py)."""

from __future__ import annotations

from typing import Iterator

import pytest

from packfs.core import ArchiveReader
from tests.contract.readers import KINDS, ReaderKind
from tests.contract.trees import Packed, pack_all
from tests.test_remote_source import nginx  # noqa: F401  (the one nginx fixture, on loopback)


@pytest.fixture(scope="session")
def packings(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Packed]:
    """The tree and its packings, stored as it is (False) and with codecs (True)."""
    return {coded: pack_all(tmp_path_factory.mktemp("coded" if coded else "stored"), coded) for coded in (False, True)}


@pytest.fixture(params=[(name, coded) for coded in (False, True) for name in KINDS],
                ids=[f"{name}-{'coded' if coded else 'stored'}" for coded in (False, True) for name in KINDS])
def kind(request: pytest.FixtureRequest, packings: dict[bool, Packed],
         tmp_path_factory: pytest.TempPathFactory) -> ReaderKind:
    """One reader over one packing."""
    name, coded = request.param
    server = request.getfixturevalue("nginx") if name == "url" else None
    return ReaderKind(name, coded, packings[coded], tmp_path_factory.mktemp(name), server)


@pytest.fixture
def reader(kind: ReaderKind) -> Iterator[ArchiveReader]:
    """``kind`` opened over the undamaged packing with its strictest policy."""
    opened = kind.open("once" if "always" in kind.unanswered else "always")
    yield opened
    if "close" not in kind.unanswered:
        opened.close()
