"""A mount decides once (issue 35): ``packfs mount`` makes every pre-flight check, opens
the archive and decides which daemon serves it (and, for the compiled one, makes each
shard's in-place view) once, in the CLI's process; the background daemon forked from it
serves that plan and checks nothing again.

Each case runs the real CLI in a subprocess whose checks are wrapped to count their calls;
the counts are written when the daemon starts serving (in the forked daemon, whose memory
holds the parent's counts too) and read back after a real file read through the mount."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import packfs
from packfs.fuse import is_mounted
from tests.conftest import REPO, force_unmount, packfs_cli, require_fuse, time_limit, wait_until

pytestmark = pytest.mark.fuse

# The CLI with its checks counted: each wrapped where its caller looks it up.
_COUNTING_CLI = r"""
import json, sys
from packfs.fuse import checks, inodedaemon, process

counts_path = sys.argv[1]
counts = {}

def counted(module, name, key):
    original = getattr(module, name)
    def wrapper(*args, **kwargs):
        counts[key] = counts.get(key, 0) + 1
        return original(*args, **kwargs)
    setattr(module, name, wrapper)

counted(inodedaemon, "in_place", "in_place")  # each shard's view, the compiled daemon's
counted(process, "check_fuse", "check_fuse")
counted(process, "check_mountpoint", "check_mountpoint")
counted(process, "check_allow_other", "check_allow_other")
counted(process, "open_for_mount", "open_for_mount")
counted(process, "compiled_view", "compiled_view")
counted(checks, "check_options", "check_options")
counted(process, "check_options", "check_options")

def dump(where):
    def at_serving(*args, **kwargs):
        with open(counts_path, "w") as out:
            json.dump(dict(counts, served_by=where), out)
        return original[where](*args, **kwargs)
    return at_serving

original = {"compiled": process.serve, "python": process.PackfsOperations}
process.serve = dump("compiled")
process.PackfsOperations = dump("python")

from packfs.cli import main
main.main(sys.argv[2:], prog_name="packfs")
"""


def _mount_counted(tmp_path: Path, archive: str, binding: str, *options: str, read: str = "a/f00",
                   expected: bytes = b"file 0\n") -> dict:
    """Mount ``archive`` in the background through the counting CLI, read ``read``
    through the mount (``expected``), unmount; the counts the daemon saw when it started
    serving."""
    require_fuse(binding)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    counts_path = tmp_path / "counts.json"
    command = [sys.executable, "-c", _COUNTING_CLI, str(counts_path), "mount", archive, str(mountpoint),
               "--binding", binding, *options]
    try:
        result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=time_limit(120))
        assert result.returncode == 0, result.stderr
        assert is_mounted(str(mountpoint))
        assert (mountpoint / read).read_bytes() == expected
        assert wait_until(counts_path.exists, 30)
        return json.loads(counts_path.read_text())
    finally:
        packfs_cli("unmount", mountpoint)
        force_unmount(mountpoint)


def _entries(count: int) -> list[packfs.Entry]:
    return [packfs.Entry(f"a/f{k:02d}", f"file {k}\n".encode()) for k in range(count)]


def test_a_compiled_mount_makes_each_check_and_the_view_once(tmp_path):
    archive = tmp_path / "one.ffr"
    packfs.pack_entries(_entries(20), archive)
    counts = _mount_counted(tmp_path, str(archive), "auto", "-o", "allow_other")
    assert counts["served_by"] == "compiled"
    assert {key: counts.get(key) for key in ("check_fuse", "check_mountpoint", "check_allow_other",
                                             "check_options", "open_for_mount", "compiled_view", "in_place")} == {
        "check_fuse": 1, "check_mountpoint": 1, "check_allow_other": 1, "check_options": 1,
        "open_for_mount": 1, "compiled_view": 1, "in_place": 1}


def test_a_shard_set_mount_makes_each_shards_view_once(tmp_path):
    entries = _entries(30)
    for index in range(3):
        packfs.pack_entries(entries[index * 10:(index + 1) * 10], tmp_path / f"s{index}.ffr")
    counts = _mount_counted(tmp_path, str(tmp_path / "s*.ffr"), "lowlevel")
    assert counts["served_by"] == "compiled"
    assert counts["compiled_view"] == 1
    assert counts["in_place"] == 3  # one view a shard, made once
    assert counts["check_fuse"] == counts["check_mountpoint"] == counts["open_for_mount"] == 1


def test_a_fallback_to_the_python_daemon_decides_once(tmp_path):
    """An FFRecord packed folder, which the compiled daemon cannot serve: "auto" asks
    once, falls back, and the Python daemon serves without a second check."""
    legacy = REPO / "tests" / "vectors" / "ffrecord" / "packed_folder.ffr"
    require_fuse("mfusepy")
    expected = packfs.PackedFolder(legacy).read("sub/003.txt")
    counts = _mount_counted(tmp_path, str(legacy), "auto", read="sub/003.txt", expected=expected)
    assert counts["served_by"] == "python"
    assert counts["compiled_view"] == 1
    assert counts["check_fuse"] == counts["check_mountpoint"] == counts["open_for_mount"] == 1


def test_the_daemon_serves_the_plan_its_parent_made(tmp_path):
    """In-process: plan_mount's view is what tree_for serves, with no second decision."""
    require_fuse("lowlevel")
    from packfs.fuse import MountPlan, plan_mount, tree_for

    archive = tmp_path / "one.ffr"
    packfs.pack_entries(_entries(3), archive)
    (tmp_path / "mnt").mkdir()
    plan = plan_mount(str(archive), str(tmp_path / "mnt"), binding="lowlevel")
    try:
        assert isinstance(plan, MountPlan) and plan.binding == "lowlevel" and plan.compiled is not None
        assert plan.path == os.path.abspath(tmp_path / "mnt") and plan.options["ro"] is True
        tree = tree_for(plan.compiled, os.open(os.devnull, os.O_WRONLY))
        child = tree.lookup(tree.lookup(1, b"a")["st_ino"], b"f01")["st_ino"]
        assert tree.read(child, 0, 100) == b"file 1\n"
    finally:
        plan.served.close()
