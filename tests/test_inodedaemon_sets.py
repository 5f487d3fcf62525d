"""The compiled daemon serving a shard set (packfs._lowlevel.Forest: one Tree per
shard, the set's shared directories merged), called directly and through real mounts:
what it answers is the union tree packfs.core.ShardSet gives, its inode numbers are
the set's, a directory several shards hold is listed once with its parts' children in
order, and a shard truncated under the mount is EIO for its own files alone."""

from __future__ import annotations

import bisect
import ctypes
import errno
import os
import random
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import packfs
from packfs.core import open_archive
from packfs.core.manifest import depth_first_key
from packfs.format import S_IFDIR, S_IFMT
from tests.conftest import time_limit

SPREAD = 600  # files of big/, a directory several shards hold


def _compiled():
    from packfs.fuse import unavailable

    reason = unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the compiled daemon must be built under CI: {reason}")
        pytest.skip(reason)


def _leaves(seed: int) -> list[packfs.Entry]:
    """A tree's leaves in depth-first order: deep shared paths, a directory spread over
    several shards, symlinks, a hard link, extended attributes."""
    rng = random.Random(seed)
    entries = []
    for top in ("a", "b"):
        for middle in range(6):
            for leaf in range(5):
                path = f"{top}/m{middle}/deep/f{leaf}"
                entries.append(packfs.Entry(path, rng.randbytes(rng.randrange(0, 3000))))
    for k in range(SPREAD):
        entries.append(packfs.Entry(f"big/f{k:04d}", f"big {k}\n".encode(),
                                    xattrs={"user.k": str(k).encode()} if k % 50 == 0 else None))
    entries.append(packfs.Entry("c/links/target", b"linked\n"))
    entries.append(packfs.Entry("c/links/target2", kind="hardlink", target="c/links/target"))
    entries.append(packfs.Entry("c/links/to-target", kind="symlink", target="target"))
    entries.append(packfs.Entry("c/links/up", kind="symlink", target="../../big/f0001"))
    entries.sort(key=lambda entry: depth_first_key(os.fsencode(entry.path)))
    return entries


def _make_set(directory: Path, shards: int, seed: int = 1) -> tuple[str, list[packfs.Entry]]:
    """``shards`` archives of consecutive leaves (a hard link stays with its file): the
    glob that names them, and the leaves."""
    leaves = _leaves(seed)
    # Cut points: any leaf but a hard link (whose file must be in its shard).
    cuttable = [k for k in range(1, len(leaves)) if leaves[k].kind != "hardlink"]
    # With three shards or more, big/ spans three of them or more.
    first_big = next(k for k, entry in enumerate(leaves) if entry.path.startswith("big/"))
    cuts = [first_big + SPREAD // 3, first_big + 2 * SPREAD // 3][:max(shards - 1, 0)] if shards >= 3 else []
    others = [k for k in cuttable if k not in cuts]
    cuts = sorted(cuts + random.Random(seed).sample(others, shards - 1 - len(cuts)))
    bounds = [0] + cuts + [len(leaves)]
    directory.mkdir(parents=True, exist_ok=True)
    for index in range(len(bounds) - 1):
        packfs.pack_entries(leaves[bounds[index]:bounds[index + 1]], directory / f"s{index:03d}.ffr")
    return str(directory / "s*.ffr"), leaves


def _expected(leaves: list[packfs.Entry]) -> dict[str, set[str]]:
    """Each directory's children's names, from the leaves."""
    listing: dict[str, set[str]] = {"": set()}
    for entry in leaves:
        parts = entry.path.split("/")
        for depth in range(len(parts)):
            parent = "/".join(parts[:depth])
            listing.setdefault(parent, set()).add(parts[depth])
            if depth < len(parts) - 1:
                listing.setdefault("/".join(parts[:depth + 1]), set())
    return listing


def _forest(spec: str):
    from packfs.fuse import tree_for

    shards = open_archive(spec)
    return shards, tree_for(shards)


def _walk(forest, inode: int = 1, prefix: str = ""):
    for name, child, mode, _ in forest.readdir(inode):
        if name in (b".", b".."):
            continue
        path = prefix + os.fsdecode(name)
        yield path, child, mode
        if mode & S_IFMT == S_IFDIR:
            yield from _walk(forest, child, path + "/")


@pytest.mark.parametrize("count", [2, 24])
def test_the_forest_answers_what_the_set_answers(tmp_path: Path, count: int) -> None:
    _compiled()
    spec, leaves = _make_set(tmp_path / "set", count)
    shards, forest = _forest(spec)
    with shards:
        assert shards.shard_count == count and shards.layer_count == 1
        listed = {}
        for path, inode, mode in _walk(forest):
            entry = shards.lookup(path, follow=False)
            stored = shards.stat(entry)
            assert (inode, mode) == (stored.inode, stored.mode & S_IFMT), path
            attributes = forest.getattr(inode)
            parent, _, name = path.rpartition("/")
            parent_inode = shards.stat(shards.lookup(parent)).inode if parent else 1
            assert forest.lookup(parent_inode, os.fsencode(name)) == attributes, path
            assert (attributes["st_ino"], attributes["st_mode"], attributes["st_nlink"]) == \
                (stored.inode, stored.mode, stored.nlink), path
            listed[path] = mode
        expected = _expected(leaves)
        assert set(listed) == {p for p in expected if p} | {e.path for e in leaves}
        for entry in leaves:
            if entry.kind == "file":
                inode = forest.lookup(shards.stat(shards.lookup(entry.path.rpartition("/")[0])).inode,
                                      os.fsencode(entry.path.rpartition("/")[2]))["st_ino"]
                assert forest.read(inode, 0, 1 << 20) == entry.data, entry.path
        # A shared directory's listing resumes at every offset it handed out.
        for directory, _, parts in shards.shared_directories():
            inode = directory + 1
            whole = forest.readdir(inode)
            names = [name for name, *_ in whole]
            assert names[2:] == sorted(names[2:]) and len(set(names)) == len(names)
            assert names[2:] == [os.fsencode(n) for n in sorted(expected[os.fsdecode(shards.path_of(directory))],
                                                               key=os.fsencode)]
            for position, (_, _, _, following) in enumerate(whole):
                assert forest.readdir(inode, following) == whole[position + 1:]
            assert forest.getattr(inode)["st_nlink"] == 2 + sum(1 for _, _, mode, _ in whole[2:]
                                                                 if mode & S_IFMT == S_IFDIR)


def test_lookups_in_a_shared_directory_find_every_parts_names_and_nothing_between(tmp_path: Path) -> None:
    _compiled()
    spec, leaves = _make_set(tmp_path / "set", 5)
    shards, forest = _forest(spec)
    with shards:
        big = shards.lookup("big")
        holders = next(parts for canonical, _, parts in shards.shared_directories() if canonical == big)
        assert len(holders) >= 3
        for shard, local in holders:
            for child in shards.shard(shard).children(local):
                name = shards.shard(shard).name(child)
                assert forest.lookup(big + 1, name)["st_ino"] == shards.stat(shards.lookup(b"big/" + name)).inode
                for missing in (name + b"x", name[:-1], b"\x00" + name, name + b"\xff"):
                    if missing.rpartition(b"/")[2] and not missing.startswith(b"\x00"):
                        with pytest.raises(OSError) as caught:
                            forest.lookup(big + 1, missing)
                        assert caught.value.errno == errno.ENOENT
        with pytest.raises(OSError) as caught:
            forest.lookup(1, b"\x01before-everything")
        assert caught.value.errno == errno.ENOENT
        with pytest.raises(OSError) as caught:
            forest.lookup(1, b"x" * 256)
        assert caught.value.errno == errno.ENAMETOOLONG


def test_what_the_compiled_daemon_cannot_serve_of_a_set_is_said(tmp_path: Path) -> None:
    """A set whose shards' ranges overlap (appended into the middle of the tree) is
    served by the Python daemon, and the notice says why in one line."""
    from packfs.fuse import choose_binding, unavailable

    _compiled()
    packfs.pack_entries([packfs.Entry("a/1", b"1"), packfs.Entry("c/1", b"3")], tmp_path / "s0.ffr")
    packfs.pack_entries([packfs.Entry("b/1", b"2")], tmp_path / "s1.ffr")
    with open_archive(str(tmp_path / "s*.ffr")) as shards:
        assert shards.layer_count == 2
        reason = unavailable(shards)
        assert "overlap" in reason and "\n" not in reason
        binding, notice = choose_binding("auto", shards)
        assert binding == "mfusepy" and "overlap" in notice
    spec, _ = _make_set(tmp_path / "one", 3)
    with open_archive(spec) as shards:
        assert unavailable(shards) is None
        assert choose_binding("auto", shards) == ("lowlevel", None)


class _Dirent64(ctypes.Structure):
    _fields_ = [("d_ino", ctypes.c_uint64), ("d_off", ctypes.c_int64), ("d_reclen", ctypes.c_ushort),
                ("d_type", ctypes.c_ubyte)]


def _getdents(fd: int, size: int) -> list[tuple[bytes, int, int]]:
    """One getdents64(2) of ``size`` bytes: (name, inode, offset after it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(size)
    got = libc.syscall(217, fd, buffer, size)  # SYS_getdents64 on x86-64
    if got < 0:
        raise OSError(ctypes.get_errno(), "getdents64")
    items, at = [], 0
    while at < got:
        head = _Dirent64.from_buffer_copy(buffer.raw[at:at + ctypes.sizeof(_Dirent64)])
        name = buffer.raw[at + 19:at + head.d_reclen].split(b"\x00", 1)[0]
        items.append((name, head.d_ino, head.d_off))
        at += head.d_reclen
    return items


def _list_in_small_reads(path: Path, size: int = 120, start: int | None = None) -> list[tuple[bytes, int, int]]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if start is not None:
            os.lseek(fd, start, os.SEEK_SET)
        items = []
        while True:
            part = _getdents(fd, size)
            if not part:
                return items
            items.extend(part)
    finally:
        os.close(fd)


@pytest.mark.fuse
@pytest.mark.parametrize("count", [2, 24])
def test_a_set_mounted_with_the_compiled_daemon_is_its_union(tmp_path: Path, count: int) -> None:
    from tests.conftest import mounted

    _compiled()
    spec, leaves = _make_set(tmp_path / "set", count)
    expected = _expected(leaves)
    with open_archive(spec) as shards, mounted(spec, tmp_path / "m", binding="lowlevel") as root:
        walked = {}
        for directory, subdirectories, files in os.walk(root):
            relative = os.path.relpath(directory, root)
            relative = "" if relative == "." else relative
            walked[relative] = set(subdirectories) | set(files)
            names = os.listdir(directory)
            assert names == sorted(set(names), key=os.fsencode), relative  # merged in order, each name once
        assert walked == {directory: names for directory, names in expected.items()}
        inodes = {}
        for entry in leaves:
            path = root / entry.path
            if entry.kind == "symlink":
                assert os.readlink(path) == entry.target
            else:
                target = entry.path if entry.kind == "file" else "c/links/target"
                assert path.read_bytes() == next(e.data for e in leaves if e.path == target), entry.path
            if entry.xattrs:
                assert os.getxattr(path, "user.k") == entry.xattrs["user.k"]
        for directory in expected:
            for name in expected[directory]:
                relative = f"{directory}/{name}" if directory else name
                status = os.lstat(root / relative)
                stored = shards.stat(shards.lookup(relative, follow=False))
                assert (status.st_ino, status.st_nlink) == (stored.inode, stored.nlink), relative
                inodes.setdefault(status.st_ino, set()).add(relative)
        shared = [names for names in inodes.values() if len(names) > 1]
        assert shared == [{"c/links/target", "c/links/target2"}]  # the hard link alone shares an inode
        for number, names in inodes.items():  # stable: a second stat gives the same numbers
            assert all(os.lstat(root / name).st_ino == number for name in names)
        big = root / "big"
        assert os.stat(big).st_nlink == 2 and len(os.listdir(big)) == SPREAD
        assert os.stat(root).st_nlink == 2 + len(expected[""])  # a, b, big, c: held by several shards
        assert os.statvfs(root).f_files == shards.entry_count


@pytest.mark.fuse
def test_a_directory_spread_over_shards_lists_in_small_reads_with_stable_offsets(tmp_path: Path) -> None:
    from tests.conftest import mounted

    _compiled()
    spec, _ = _make_set(tmp_path / "set", 6)
    with open_archive(spec) as shards, mounted(spec, tmp_path / "m", binding="lowlevel") as root:
        big = shards.lookup("big")
        holders = next(parts for canonical, _, parts in shards.shared_directories() if canonical == big)
        assert len(holders) >= 3
        first = _list_in_small_reads(root / "big")
        again = _list_in_small_reads(root / "big", size=4096)
        assert first == again
        names = [name for name, _, _ in first if name not in (b".", b"..")]
        assert names == [b"f%04d" % k for k in range(SPREAD)]
        for position in (1, 7, len(first) // 3, len(first) // 2, len(first) - 2):
            assert _list_in_small_reads(root / "big", start=first[position][2]) == first[position + 1:]


@pytest.mark.fuse
def test_a_shard_truncated_under_the_mount_is_eio_and_the_others_still_serve(tmp_path: Path) -> None:
    from tests.conftest import mounted

    _compiled()
    spec, leaves = _make_set(tmp_path / "set", 3)
    with open_archive(spec) as shards:
        owner = {entry.path: bisect.bisect_right(shards.bases, shards.lookup(entry.path, follow=False)) - 1
                 for entry in leaves if entry.kind == "file"}
    assert sorted(set(owner.values())) == [0, 1, 2]
    victim = tmp_path / "set" / "s001.ffr"
    with mounted(spec, tmp_path / "m", binding="lowlevel") as root:
        with open(victim, "r+b") as handle:
            handle.truncate(os.path.getsize(victim) // 2)
        for path, shard in owner.items():
            if shard == 1:
                with pytest.raises(OSError) as caught:
                    (root / path).read_bytes()
                assert caught.value.errno == errno.EIO, path
            else:
                assert (root / path).read_bytes() == next(e.data for e in leaves if e.path == path)
        assert stat.S_ISDIR(os.stat(root).st_mode)
        with pytest.raises(OSError) as caught:  # a listing that would leave the shard's names out
            os.listdir(root / "big")
        assert caught.value.errno == errno.EIO


def test_a_set_past_the_soft_descriptor_limit_raises_it_and_past_the_hard_one_is_a_mount_error(
        tmp_path: Path) -> None:
    """Each shard's Tree holds descriptors: past the soft limit the compiled daemon
    raises it (up to the hard limit) rather than fail (issue 34: a set of 1,073 shards
    could not mount at the usual 1,024); past the hard limit the mount is refused in
    one line (an OSError with a traceback before)."""
    import resource

    from packfs.errors import MountError
    from packfs.fuse import tree_for

    _compiled()
    spec, _ = _make_set(tmp_path / "set", 24)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with open_archive(spec) as shards:
        for index in range(shards.shard_count):
            shards.shard(index)
        # A few descriptors free below the limit, not 24 (a new one is the lowest free).
        low = len(os.listdir("/proc/self/fd")) + 4
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
        try:
            assert tree_for(shards) is not None
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 3 * 24
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    script = ("import os, resource, sys\nfrom packfs.core import open_archive\nfrom packfs.fuse import tree_for\n"
              "from packfs.errors import MountError\nshards = open_archive(sys.argv[1])\n"
              "low = len(os.listdir('/proc/self/fd')) + 4\n"
              "resource.setrlimit(resource.RLIMIT_NOFILE, (low, low))\n"
              "try:\n    tree_for(shards)\nexcept MountError as error:\n    print(error)\n")
    result = subprocess.run([sys.executable, "-c", script, str(spec)], capture_output=True, text=True, timeout=time_limit(60))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "24 shards, three descriptors each, and the hard limit on open files" in result.stdout


@pytest.mark.fuse
def test_packfs_mount_of_a_set_uses_the_compiled_daemon_by_default(tmp_path: Path) -> None:
    """`packfs info` names the compiled daemon for a one-layer set, and `packfs mount`
    serves it so with no notice; a set of two layers gets the Python daemon and says why."""
    from tests.conftest import packfs_cli, require_fuse

    require_fuse("auto")
    _compiled()
    spec, leaves = _make_set(tmp_path / "set", 4)
    assert "mount daemon    lowlevel (compiled" in packfs_cli("info", spec).stdout
    (tmp_path / "m").mkdir()
    result = packfs_cli("mount", spec, tmp_path / "m")
    try:
        lines = result.stderr.splitlines()
        assert result.returncode == 0 and len(lines) == 1 and lines[0].startswith("mounted "), result.stderr
        assert (tmp_path / "m" / leaves[0].path).read_bytes() == leaves[0].data
    finally:
        assert packfs_cli("unmount", tmp_path / "m").returncode == 0
    packfs.pack_entries([packfs.Entry("a/1", b"1"), packfs.Entry("c/1", b"3")], tmp_path / "l0.ffr")
    packfs.pack_entries([packfs.Entry("b/1", b"2")], tmp_path / "l1.ffr")
    info = packfs_cli("info", str(tmp_path / "l*.ffr")).stdout
    assert "mount daemon    mfusepy (Python): the shard set has shards whose ranges overlap (2 layers)" in info
