"""The contract's tree, written to disk (the truth every reader is compared with) and
packed as each reader opens it: one archive, a set of that one archive, and a set of
two layers made with ``packfs append``; stored as it is (format 1.4) and through
format 1.5's codecs (zstd, frames, a shared record, a sparse file)."""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import packfs
from packfs.write.sets import append_shard, make_set
from tests.conftest import write_blueprint

MTIME_NS = 1_600_000_000_123_456_789
_rng = random.Random(35)
# Incompressible (stored even with --compress), and larger than the 256 KiB a URL's
# reader keeps of the archive's end from its opening request, which holds the rest of
# the small compressed archive: read from the server at each read.
NOISE = _rng.randbytes(320_000)
TEXT = "".join(f"line {k}: the quick brown fox jumps over the lazy dog\n" for k in range(800)).encode()
TWIN = b"the same bytes twice, shared by one record with --dedup\n" * 150
# Over 1 MiB: piece CRCs when stored (format 1.2), several frames when compressed.
BIG = b"".join(k.to_bytes(4, "little") * 8 for k in range(48 * 1024)) + b"tail"
SPARSE_SIZE = 1 << 20
SPARSE_DATA = {0: b"head" * 1024, 512 << 10: b"middle" * 700}  # offset -> bytes; the rest holes

# path -> contents for files, None for directories (empty ones too).
FILES: dict[str, bytes | None] = {
    "empty.txt": b"",
    "hello.txt": b"hello world\n",
    "noise.bin": NOISE,
    "text.txt": TEXT,
    "twin-1.txt": TWIN,
    "twin-2.txt": TWIN,
    "big.bin": BIG,
    "a/b/c/deep.bin": bytes(range(256)) * 3,
    "a/empty_nested": None,
    "données/été.txt": "ünïcödé\n".encode(),
    "empty_dir": None,
    "z/last.txt": b"last",
    # What the layered set's appended shard holds: a subtree between the first shard's
    # first and last leaf (a second layer), and a file in directories both shards hold.
    "a/b/more.txt": b"appended beside deep.bin",
    "m/one.txt": b"one",
    "m/two/three.txt": b"three" * 10,
}
SPARSE = "sparse.bin"
SYMLINKS = {"link-to-hello": "hello.txt", "a/link-up": "../hello.txt", "a/dirlink": "b", "dangling": "no/such/target",
            "loop-1": "loop-2", "loop-2": "loop-1", "absolute": "/etc/hostname", "m/link-back": "../text.txt"}
HARDLINK = ("hardlink.txt", "hello.txt")
XATTRS = {"hello.txt": [(b"user.colour", b"blue"), (b"user.empty", b"")], "a": [(b"user.dir", b"yes")]}
MODES = {"hello.txt": 0o600, "a/b/c/deep.bin": 0o755, "empty_dir": 0o700}
APPENDED = ("a/b/more.txt", "m")  # what the second shard holds (paths and subtrees)


def _appended(path: str) -> bool:
    return any(path == top or path.startswith(top + "/") for top in APPENDED)


def write_tree(root: Path, part: str = "all") -> Path:
    """The tree at ``root``: ``part`` "all", or "base" (without what is appended) or
    "appended" (only that, with the directories above it)."""
    def wanted(path: str) -> bool:
        return part == "all" or (part == "appended") == _appended(path)

    root.mkdir(parents=True)
    write_blueprint(root, {path: contents for path, contents in FILES.items() if wanted(path)})
    if part != "appended":
        with open(root / SPARSE, "wb") as sparse:
            for offset, data in SPARSE_DATA.items():
                sparse.seek(offset)
                sparse.write(data)
            sparse.truncate(SPARSE_SIZE)
        os.link(root / HARDLINK[1], root / HARDLINK[0])
    for path, target in SYMLINKS.items():
        if wanted(path):
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(target, root / path)
    for path, attributes in XATTRS.items():
        if (root / path).exists():
            for name, value in attributes:
                os.setxattr(root / path, name, value, follow_symlinks=False)
    for path, mode in MODES.items():
        if (root / path).exists():
            os.chmod(root / path, mode)
    for directory, names, files in os.walk(root, topdown=False):
        for name in names + files:
            os.utime(os.path.join(directory, name), ns=(MTIME_NS, MTIME_NS), follow_symlinks=False)
    os.utime(root, ns=(MTIME_NS, MTIME_NS))
    return root


@dataclass(frozen=True)
class Packed:
    """The contract's tree packed one way, each form in a directory of its own (a
    damaged copy copies the directory): ``entry`` is what opens, relative to it."""

    tree: Path
    archive: Path  # directory holding tree.ffr
    one_shard: Path  # directory holding one.ffrset and its shard
    layered: Path  # directory holding layered.ffrset and its two shards


def pack_all(root: Path, coded: bool) -> Packed:
    """The tree written under ``root`` and packed as every reader opens it."""
    options = {"compress": "zstd", "dedup": True, "sparse": True} if coded else {}
    tree = write_tree(root / "tree")
    archive = root / "archive"
    archive.mkdir()
    packfs.pack_folder(tree, archive / "tree.ffr", **options)
    one_shard = root / "one-shard"
    one_shard.mkdir()
    shutil.copy(archive / "tree.ffr", one_shard / "only.ffr")
    make_set(str(one_shard / "one.ffrset"), [str(one_shard / "only.ffr")])
    layered = root / "layered"
    layered.mkdir()
    packfs.pack_folder(write_tree(root / "base", "base"), layered / "base.ffr", **options)
    make_set(str(layered / "layered.ffrset"), [str(layered / "base.ffr")])
    appended = write_tree(root / "appended", "appended")
    append_shard(str(layered / "layered.ffrset"), lambda path: packfs.pack_folder(appended, path, **options))
    return Packed(tree, archive, one_shard, layered)
