"""Shard-set manifests: the small file that makes several archives one tree.

A shard set is several complete archives (each opens alone, in any packfs or FFRecord
reader) served as one tree.  Its manifest, ``NAME.ffrset``, is a JSON document::

    {"packfs_shard_set": 1,
     "shards": [{"file": "data-00000-of-00002.ffr", "size": 1048640,
                 "footer_crc": 305419896, "entries": 5001,
                 "first": "train/n01/0001.jpg", "last": "train/n07/0420.jpg"}, ...],
     "crc": 2914467402}

- ``packfs_shard_set``: the manifest's version; a reader refuses one it does not know.
- ``file``: the shard, relative to the manifest's own directory (or URL): a relative
  path without ``..``, so a manifest never names a file outside its directory.
- ``size`` and ``footer_crc`` (CRC-32 of the shard's last 64 bytes, its footer, which
  in format 1.4 holds the CRC of the tail, which holds a CRC of every table page)
  identify the bytes the manifest was written for: a shard replaced since is refused
  when it is opened.  ``entries`` is its entry count, so a set numbers its entries
  without opening every shard.
- ``first`` and ``last``: the shard's range, its first and last *leaf* in depth-first
  order of paths (component by component, bytewise; a leaf is anything but a directory
  with children).  Everything the shard holds lies in its range except the ancestors of
  ``first``: directories, which the shards that share them merge.  Paths are the stored
  bytes decoded with ``surrogateescape`` and written with JSON's ``\\u`` escapes, so any
  bytes survive.
- ``crc``: CRC-32 of the document without its ``crc`` member, serialised with sorted
  keys, no spaces and ASCII escapes (:func:`manifest_bytes`).

Shards are listed in the order their entries are numbered.  A manifest is written to a
temporary file and renamed into place, so a reader sees the old set or the new one.
"""

from __future__ import annotations

import json
import zlib
from typing import TYPE_CHECKING, NamedTuple, Sequence

from ..errors import FormatError
from ..format import FOOTER_SIZE, S_IFDIR

if TYPE_CHECKING:
    from .archive import Archive

__all__ = ["MANIFEST_SUFFIX", "MANIFEST_VERSION", "MAX_MANIFEST_BYTES", "ShardRecord", "manifest_bytes", "parse_manifest",
           "looks_like_manifest", "depth_first_key", "shard_file_problem", "leaf_range", "footer_crc",
           "shard_record"]

MANIFEST_SUFFIX = ".ffrset"
MANIFEST_VERSION = 1
_MAGIC = b'{"crc":'  # sorted keys: every manifest starts so
MAX_MANIFEST_BYTES = 1 << 30  # 1 GiB: millions of shards; anything larger is not one


class ShardRecord(NamedTuple):
    """One shard as its manifest lists it."""

    file: str
    size: int
    footer_crc: int
    entries: int
    first: bytes
    last: bytes


def depth_first_key(path: bytes) -> tuple[bytes, ...]:
    """The key that sorts stored paths in depth-first order, names bytewise (the order
    pack writes data records in): a directory before its contents, ``a/b`` before
    ``a.txt``."""
    return tuple(path.split(b"/")) if path else ()


def shard_file_problem(name: str) -> str | None:
    """Why ``name`` cannot be a shard's ``file`` in a manifest, or None."""
    if not name or "\x00" in name:
        return "an empty name or a NUL"
    if name.startswith("/") or "\\" in name:
        return "an absolute path"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "a '.', '..' or empty component (a shard lies in the manifest's directory or below it)"
    return None


def _text(path: bytes) -> str:
    return path.decode("utf-8", "surrogateescape")


def manifest_bytes(shards: Sequence[ShardRecord]) -> bytes:
    """The manifest for ``shards``, in the order given: the bytes to write."""
    body = {
        "packfs_shard_set": MANIFEST_VERSION,
        "shards": [{"file": s.file, "size": s.size, "footer_crc": s.footer_crc, "entries": s.entries,
                    "first": _text(s.first), "last": _text(s.last)} for s in shards],
    }
    for s in shards:
        problem = shard_file_problem(s.file)
        if problem:
            raise ValueError(f"shard file {s.file!r}: {problem}")
    body["crc"] = zlib.crc32(_canonical(body))
    return _canonical(body) + b"\n"


def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def looks_like_manifest(head: bytes) -> bool:
    """Whether a file starting with ``head`` (its first bytes) is a shard-set manifest
    rather than an archive."""
    return head.startswith(_MAGIC)


def parse_manifest(data: bytes, where: str) -> list[ShardRecord]:
    """The shards a manifest lists, every value checked.

    Raises FormatError (naming ``where``) for anything but a sound manifest of a
    version this reader knows.
    """
    if len(data) > MAX_MANIFEST_BYTES:
        raise FormatError(f"{where}: {len(data)} bytes is too large for a shard-set manifest")
    try:
        body = json.loads(data.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise FormatError(f"{where}: not a shard-set manifest (not JSON in ASCII)") from None
    if not isinstance(body, dict) or "packfs_shard_set" not in body:
        raise FormatError(f"{where}: not a shard-set manifest (no packfs_shard_set member)")
    version = body.get("packfs_shard_set")
    if version != MANIFEST_VERSION:
        raise FormatError(f"{where}: shard-set manifest version {version!r}; this packfs reads version "
                          f"{MANIFEST_VERSION} (a newer packfs wrote it?)")
    crc = body.pop("crc", None)
    if not isinstance(crc, int) or zlib.crc32(_canonical(body)) != crc:
        raise FormatError(f"{where}: the shard-set manifest's CRC does not match its contents "
                          "(damaged, or edited by hand: `packfs set` writes a new one)")
    shards = body.get("shards")
    if not isinstance(shards, list) or not shards:
        raise FormatError(f"{where}: a shard-set manifest lists no shards")
    records = []
    for number, item in enumerate(shards):
        records.append(_shard(item, number, where))
    names = [record.file for record in records]
    if len(set(names)) != len(names):
        raise FormatError(f"{where}: a shard-set manifest lists one shard twice")
    return records


def _shard(item: object, number: int, where: str) -> ShardRecord:
    label = f"{where}: shard {number}"
    if not isinstance(item, dict):
        raise FormatError(f"{label}: not an object")
    def text(name: str) -> str:
        value = item.get(name)
        if not isinstance(value, str):
            raise FormatError(f"{label}: {name} is missing or not a str")
        return value

    def whole(name: str) -> int:
        value = item.get(name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise FormatError(f"{label}: {name} is missing or not a int")
        return value

    # In this order: the first missing or wrong field is the one named.
    file, size, footer_crc, entries = text("file"), whole("size"), whole("footer_crc"), whole("entries")
    first, last = text("first"), text("last")
    problem = shard_file_problem(file)
    if problem:
        raise FormatError(f"{label}: file {file!r} is {problem}")
    if not (0 < size < 1 << 63 and 0 <= footer_crc < 1 << 32 and 0 < entries < 1 << 32):
        raise FormatError(f"{label}: size, footer_crc or entries out of range")
    try:
        first_key, last_key = first.encode("utf-8", "surrogateescape"), last.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise FormatError(f"{label}: first or last is not a path") from None
    if depth_first_key(last_key) < depth_first_key(first_key):
        raise FormatError(f"{label}: its last path sorts before its first")
    return ShardRecord(file, size, footer_crc, entries, first_key, last_key)


def leaf_range(archive: Archive) -> tuple[bytes, bytes]:
    """(first, last): the first and last leaf of ``archive`` in depth-first order (a
    leaf: anything but a directory with children), found by following first and last
    children down from the root: O(depth) table reads.  An archive of the root alone
    gives (b"", b"")."""
    ends = []
    for pick in (0, -1):
        entry = 0
        while archive.file_type(entry) == S_IFDIR:
            children = archive.children(entry)
            if not len(children):
                break
            entry = children[pick]
        ends.append(archive.path_of(entry))
    return ends[0], ends[1]


def footer_crc(archive: Archive) -> int:
    """CRC-32 of ``archive``'s last 64 bytes, its footer (in format 1.4 it holds the
    CRC of the tail, which holds one of every table page): what a manifest names a
    shard's bytes by."""
    return zlib.crc32(archive.source.read(archive.size - FOOTER_SIZE, archive.size))


def shard_record(archive: Archive, file: str) -> ShardRecord:
    """What a manifest lists for ``archive``, stored as ``file`` (relative to the
    manifest's directory)."""
    first, last = leaf_range(archive)
    return ShardRecord(file, archive.size, footer_crc(archive), archive.entry_count, first, last)
