"""ArchiveReader (packfs/core/interface.py) is what Archive and ShardSet provide: every
member is there, each method's parameters named, ordered and defaulted alike, each
property a property, so a front end may be handed either."""

from __future__ import annotations

import inspect
import re

import pytest

from packfs.core import Archive, ArchiveReader, ShardSet


def _members() -> list[str]:
    own = set(vars(ArchiveReader)) | set(getattr(ArchiveReader, "__annotations__", {}))
    return sorted(name for name in own if not name.startswith("_") or name in ("__enter__", "__exit__"))


def _parameters(function: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]  # type: ignore[arg-type]


@pytest.mark.parametrize("implementation", [Archive, ShardSet])
@pytest.mark.parametrize("member", _members())
def test_the_implementations_provide_it(implementation: type, member: str) -> None:
    declared = inspect.getattr_static(ArchiveReader, member, None)
    provided = inspect.getattr_static(implementation, member, None)
    if provided is None:  # an attribute each instance sets (Archive's footer is read at open)
        assert declared is None or isinstance(declared, property), member
        assert re.search(rf"self\.{member}(: [^=]+)? = ", inspect.getsource(implementation)), member
        return
    if declared is None:  # a data attribute of the protocol: a class attribute here (a set is never legacy)
        assert not callable(provided), member
        return
    if isinstance(declared, property):
        assert isinstance(provided, property), member
        return
    assert callable(provided), member
    assert _parameters(provided) == _parameters(declared), member


def test_every_method_has_its_contract() -> None:
    for member in _members():
        declared = inspect.getattr_static(ArchiveReader, member, None)
        if declared is not None:
            assert (declared.__doc__ or "").strip(), member
