"""No archive makes a reader or the daemon use memory out of proportion to it.

The adversarial review's archive: a chain of directories with long names (4,000 levels
of 255 bytes is a 1.3 MB archive that verify calls sound) made the daemon reach 2.7 GB
after one find, because its directory cache was bounded in keys and each key was a
whole path.  Every cache is now bounded in bytes: the directory cache in 4 MiB of keys,
the daemon's logged messages in 10,000 x 1,000 characters."""

from __future__ import annotations

import subprocess
import tracemalloc
from pathlib import Path

import pytest

from packfs import PackedFolder
from packfs.fuse import PackfsOperations
from tests.conftest import daemon_pid, mounted
from tests.deep_tables import chain_archive

# 800 levels of 1,000-byte names: the old cache held every directory's path, 320 MB of
# keys (800 paths of 400 KB on average); bounded in bytes it holds at most 4 MiB.
DEPTH, NAME = 800, 1000


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chain_archive(tmp_path_factory.mktemp("chain") / "chain.ffr", DEPTH, NAME)


def _chain_paths(folder: PackedFolder):
    """Every directory's path, deepest last, built one at a time."""
    path = b""
    for _ in range(DEPTH):
        path = path + b"/" + b"d" * NAME if path else b"d" * NAME
        yield path


def test_lookups_of_every_level_stay_bounded(chain: Path) -> None:
    with PackedFolder(chain) as folder:
        assert folder.verify().ok
        tracemalloc.start()
        try:
            for path in _chain_paths(folder):
                assert folder.is_dir(path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        # The longest path is 0.8 MB; a few copies of it plus the 4 MiB cache.
        assert peak < 16 << 20, f"peak {peak / 2**20:.1f} MiB"
        assert folder.read(path + b"/" + b"f" * NAME) == b"at the bottom\n"


def test_the_daemons_logged_messages_are_bounded_in_bytes(chain: Path) -> None:
    with PackedFolder(chain) as folder:
        operations = PackfsOperations(folder)
        for i in range(50):
            operations.log_once(f"read /{'x' * 1_000_000}{i}: checksum mismatch")
        assert sum(map(len, operations.log_once.messages)) <= 50 * 1000


@pytest.mark.fuse
def test_a_find_through_the_mount_stays_bounded(chain: Path, tmp_path: Path) -> None:
    with mounted(chain, tmp_path / "mnt") as root:
        pid = daemon_pid(root)
        found = subprocess.run(["find", str(root)], capture_output=True)
        assert found.returncode == 0 and found.stdout.count(b"\n") == DEPTH + 2
        status = Path(f"/proc/{pid}/status").read_text()
        peak_kib = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM")))
        # 320 MB of cached paths before; now the daemon's usual 30-40 MiB plus a few
        # copies of the longest path per worker thread.
        assert peak_kib < 150 << 10, f"daemon {pid} peaked at {peak_kib >> 10} MiB"
