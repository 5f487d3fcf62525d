"""Real mounts: real programs, concurrency, failures and the daemon's life cycle."""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import random
import signal
import sqlite3
import subprocess
import threading
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

import packfs
from packfs.fuse import is_mounted, is_stale, state_file
from tests.conftest import (BLUEPRINT, HARDLINK, column_changed, daemon_pid, damaged_copy, force_unmount, mounted,
                            packfs_cli, require_fuse, wait_until)

pytestmark = pytest.mark.fuse


@pytest.fixture
def clients_tree(tmp_path: Path) -> Path:
    """Files that real programs open: images, .npy, SQLite, zip, a git repository."""
    import cv2

    src = tmp_path / "src"
    (src / "images").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(20):
        image = rng.integers(0, 255, (32, 48, 3), dtype=np.uint8)
        cv2.imwrite(str(src / "images" / f"{i}.png"), image)
        cv2.imwrite(str(src / "images" / f"{i}.jpg"), image)
    np.save(src / "array.npy", np.arange(10000, dtype=np.float32).reshape(100, 100))
    with sqlite3.connect(src / "db.sqlite") as db:
        db.execute("create table t (k integer primary key, v text)")
        db.executemany("insert into t values (?, ?)", [(i, f"value {i}") for i in range(500)])
    db.close()
    with zipfile.ZipFile(src / "archive.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("inner/file.txt", "zipped text\n" * 100)
    repo = src / "repo"
    repo.mkdir()
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    subprocess.run(["git", "init", "-q", str(repo)], check=True, env=env)
    for i in range(3):
        (repo / f"f{i}.txt").write_text(f"version {i}\n")
        subprocess.run(["git", "-C", str(repo), "add", "."], check=True, env=env)
        subprocess.run(["git", "-C", str(repo), "commit", "-qm", f"commit {i}"], check=True, env=env)
    return src


def test_real_programs_read_the_mount(clients_tree: Path, tmp_path: Path) -> None:
    import cv2

    archive = tmp_path / "clients.ffr"
    packfs.pack_folder(clients_tree, archive)
    with mounted(archive, tmp_path / "mnt") as root:
        for i in range(20):
            for ext in ("png", "jpg"):
                ours = cv2.imread(str(root / "images" / f"{i}.{ext}"))
                theirs = cv2.imread(str(clients_tree / "images" / f"{i}.{ext}"))
                assert ours is not None and np.array_equal(ours, theirs)
        array = np.load(root / "array.npy", mmap_mode="r")
        assert array[99, 99] == 9999 and isinstance(array, np.memmap)
        uri = f"file:{root / 'db.sqlite'}?mode=ro&immutable=1"
        with sqlite3.connect(uri, uri=True) as db:
            assert db.execute("select count(*), max(v) from t").fetchone() == (500, "value 99")
        db.close()
        with zipfile.ZipFile(root / "archive.zip") as z:
            assert z.read("inner/file.txt") == b"zipped text\n" * 100
        diff = subprocess.run(["diff", "-r", str(clients_tree), str(root)], capture_output=True, text=True)
        assert diff.returncode == 0, diff.stdout + diff.stderr
        safe = ["-c", f"safe.directory={root / 'repo'}"]
        log = subprocess.run(["git", *safe, "-C", str(root / "repo"), "log", "--oneline"],
                             capture_output=True, text=True)
        assert log.returncode == 0 and len(log.stdout.splitlines()) == 3, log.stderr
        fsck = subprocess.run(["git", *safe, "-C", str(root / "repo"), "fsck", "--no-dangling"],
                              capture_output=True, text=True)
        assert fsck.returncode == 0, fsck.stderr
        tar = subprocess.run(["tar", "cf", "-", "-C", str(root), "images"], capture_output=True)
        assert tar.returncode == 0 and len(tar.stdout) > 0
        found = subprocess.run(["find", str(root)], capture_output=True, text=True).stdout.splitlines()
        assert len(found) == sum(1 for _ in clients_tree.rglob("*")) + 1
        du = subprocess.run(["du", "-s", "--apparent-size", "-B1", str(root / "images")],
                            capture_output=True, text=True)
        assert du.returncode == 0


def _reader_process(root: str, paths: list[str], expected: dict[str, int], seconds: float, queue) -> None:
    rng = random.Random(os.getpid())
    reads = bad = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        path = rng.choice(paths)
        with open(os.path.join(root, path), "rb") as f:
            if zlib.crc32(f.read()) != expected[path]:
                bad += 1
        reads += 1
    queue.put((reads, bad))


def test_concurrent_threads_and_processes(archive: Path, tmp_path: Path) -> None:
    paths = [p for p, c in BLUEPRINT.items() if c is not None]
    expected = {p: zlib.crc32(BLUEPRINT[p]) for p in paths}
    with mounted(archive, tmp_path / "mnt") as root:
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        processes = [context.Process(target=_reader_process, args=(str(root), paths, expected, 3.0, queue))
                     for _ in range(4)]
        for process in processes:
            process.start()
        results: list[tuple[int, int]] = []
        errors: list[str] = []

        def thread_reader() -> None:
            try:
                rng = random.Random(threading.get_ident())
                deadline = time.monotonic() + 3.0
                reads = bad = 0
                while time.monotonic() < deadline:
                    path = rng.choice(paths)
                    with open(root / path, "rb") as f:
                        f.seek(rng.randrange(max(1, len(BLUEPRINT[path]))))
                        f.seek(0)
                        bad += zlib.crc32(f.read()) != expected[path]
                    reads += 1
                results.append((reads, bad))
            except Exception as error:  # collected and asserted below
                errors.append(repr(error))

        threads = [threading.Thread(target=thread_reader) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for process in processes:
            results.append(queue.get(timeout=60))
            process.join(60)
            assert process.exitcode == 0
    assert errors == []
    assert sum(bad for _, bad in results) == 0
    assert all(reads > 0 for reads, _ in results) and len(results) == 12


def test_writes_fail_with_erofs(archive: Path, tmp_path: Path) -> None:
    with mounted(archive, tmp_path / "mnt") as root:
        attempts = [
            lambda: open(root / "hello.txt", "wb"),
            lambda: open(root / "hello.txt", "r+b"),
            lambda: open(root / "new.txt", "wb"),
            lambda: os.unlink(root / "hello.txt"),
            lambda: os.mkdir(root / "newdir"),
            lambda: os.rename(root / "hello.txt", root / "moved.txt"),
            lambda: os.chmod(root / "hello.txt", 0o777),
            lambda: os.symlink("x", root / "newlink"),
            lambda: os.rmdir(root / "empty_dir"),
            lambda: os.truncate(root / "hello.txt", 0),
            lambda: os.utime(root / "hello.txt"),
        ]
        for attempt in attempts:
            with pytest.raises(OSError) as caught:
                attempt()
            assert caught.value.errno == errno.EROFS
        assert (root / "hello.txt").read_bytes() == b"hello world\n"


@pytest.mark.parametrize("binding", ["mfusepy", "fusepy"])  # CRC checked at read / at open
def test_corrupt_file_reads_as_eio_while_others_read(archive: Path, tmp_path: Path, binding: str) -> None:
    bad = damaged_copy(archive, tmp_path / "bad.ffr", b"Zeta.txt")
    with mounted(bad, tmp_path / "mnt", binding=binding) as root:
        for _ in range(2):
            with pytest.raises(OSError) as caught:
                (root / "Zeta.txt").read_bytes()
            assert caught.value.errno == errno.EIO
        assert (root / "hello.txt").read_bytes() == b"hello world\n"
        assert (root / "big/large.bin").read_bytes() == BLUEPRINT["big/large.bin"]
    log = Path(state_file(str(tmp_path / "mnt"), ".log")).read_text()
    assert "checksum mismatch" in log and "Zeta.txt" in log
    with mounted(bad, tmp_path / "mnt2", "--no-check-data", binding=binding) as root:
        assert (root / "Zeta.txt").read_bytes() != BLUEPRINT["Zeta.txt"]


def test_a_size_that_is_not_its_records_length_is_eio_through_the_mount(archive: Path, tmp_path: Path) -> None:
    """Issue 23: a 12-byte file whose size column said 0 was served as empty (cat exited
    0), one of 2**62 made open().read() raise MemoryError before any READ, and through
    the compiled daemon a hard link's wrong size, once stat'ed, cut its sound name short
    (the kernel keeps one set of attributes per inode).  Each is EIO for that entry now;
    the directory lists whole and the rest reads."""
    first, second = HARDLINK
    broken = {b"with space.txt": 0, b"-leading-dash": 2**62, second.encode(): 5}
    bad = column_changed(archive, tmp_path / "bad.ffr", "size", broken)
    with mounted(bad, tmp_path / "mnt") as root:
        listed = subprocess.run(["ls", "-l", str(root)], capture_output=True, text=True,  # READDIRPLUS
                                errors="surrogateescape")
        assert listed.returncode != 0 and listed.stderr.count("Input/output error") == 3, listed.stderr
        assert " 12 " in next(line for line in listed.stdout.splitlines() if line.endswith(" " + first))
        assert sorted(os.listdir(root)) == sorted(os.listdir(tmp_path / "src"))
        for name in broken:
            path = root / os.fsdecode(name)
            with pytest.raises(OSError) as caught:
                os.stat(path)
            assert caught.value.errno == errno.EIO
            with pytest.raises(OSError) as caught:
                path.read_bytes()
            assert caught.value.errno == errno.EIO
            shown = subprocess.run(["cat", str(path)], capture_output=True)
            assert shown.returncode == 1 and b"Input/output error" in shown.stderr and not shown.stdout
        assert os.stat(root / first).st_size == 12  # after its other name's stat: EIO, not 5
        assert (root / first).read_bytes() == b"hello world\n"
        assert (root / "empty.txt").read_bytes() == b"" and (root / "Zeta.txt").read_bytes() == BLUEPRINT["Zeta.txt"]


def test_up_front_errors(archive: Path, tmp_path: Path) -> None:
    require_fuse()
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    (tmp_path / "file").write_text("x")
    junk = tmp_path / "junk.ffr"
    junk.write_bytes(b"junk" * 10)
    from tests.conftest import VECTORS

    cases = [
        ((tmp_path / "missing.ffr", empty), 1, "no such file, expected an archive"),
        ((junk, empty), 1, "is a text file, not a packfs archive"),
        ((VECTORS / "corrupt_header.ffr", empty), 1, "header checksum mismatch"),
        ((VECTORS / "records.ffr", empty), 1, "not a packfs archive"),
        ((archive, tmp_path / "nowhere"), 1, "does not exist, expected a directory"),
        ((archive, tmp_path / "file"), 1, "is not a directory"),
        ((archive, tmp_path / "full"), 1, "is not empty"),
    ]
    for args, code, message in cases:
        result = packfs_cli("mount", *args)
        assert result.returncode == code, (args, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
        if code == 1:
            assert len(result.stderr.strip().splitlines()) == 1
    with mounted(archive, tmp_path / "mnt"):
        result = packfs_cli("mount", archive, tmp_path / "mnt")
        assert result.returncode == 1 and "already a mount point" in result.stderr


def test_fuse_unavailable_is_reported(archive: Path, tmp_path: Path) -> None:
    require_fuse()
    (tmp_path / "mnt").mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("python3",):
        os.symlink(os.path.realpath(os.sys.executable), bin_dir / tool)
    env = dict(os.environ, PATH=str(bin_dir))
    result = subprocess.run([os.sys.executable, "-m", "packfs", "mount", str(archive), str(tmp_path / "mnt")],
                            capture_output=True, text=True, env=env, cwd=Path(__file__).parent.parent)
    assert result.returncode == 1
    assert "no fusermount" in result.stderr


def test_check_fuse_names_what_is_missing(monkeypatch) -> None:
    from packfs.fuse import checks as mount
    from packfs.errors import MountError

    monkeypatch.setattr(mount.os.path, "exists", lambda path: False)
    with pytest.raises(MountError, match="/dev/fuse does not exist"):
        mount.check_fuse()


def test_unmount_errors(archive: Path, tmp_path: Path) -> None:
    require_fuse()
    (tmp_path / "plain").mkdir()
    result = packfs_cli("unmount", tmp_path / "plain")
    assert result.returncode == 1 and "is not mounted" in result.stderr
    with mounted(archive, tmp_path / "mnt") as root:
        handle = open(root / "hello.txt", "rb")
        try:
            busy = packfs_cli("unmount", root)
            assert busy.returncode == 1 and "busy" in busy.stderr and "--lazy" in busy.stderr
            assert handle.read() == b"hello world\n"
        finally:
            handle.close()


@contextlib.contextmanager
def daemon_mount(archive: Path, mountpoint: Path):
    """A mount these tests end themselves (by signal, kill or lazy unmount); whatever
    they leave is cleared afterwards."""
    require_fuse()
    mountpoint.mkdir()
    assert packfs_cli("mount", archive, mountpoint).returncode == 0
    try:
        yield mountpoint
    finally:
        force_unmount(mountpoint)


def test_lazy_unmount_while_busy(archive: Path, tmp_path: Path) -> None:
    with daemon_mount(archive, tmp_path / "mnt") as mountpoint:
        handle = open(mountpoint / "hello.txt", "rb")
        assert packfs_cli("unmount", "--lazy", mountpoint).returncode == 0
        assert not is_mounted(str(mountpoint))
        assert handle.read() == b"hello world\n"  # open files keep working until closed
        handle.close()




@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_unmount_cleanly(archive: Path, tmp_path: Path, sig: int) -> None:
    with daemon_mount(archive, tmp_path / "mnt") as mountpoint:
        pid = daemon_pid(mountpoint)
        os.kill(pid, sig)
        assert wait_until(lambda: not is_mounted(str(mountpoint)))
        assert wait_until(lambda: not os.path.exists(f"/proc/{pid}") or
                     Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z")


def test_killed_daemon_leaves_a_stale_mount_that_unmount_clears(archive: Path, tmp_path: Path) -> None:
    with daemon_mount(archive, tmp_path / "mnt") as mountpoint:
        os.kill(daemon_pid(mountpoint), signal.SIGKILL)
        assert wait_until(lambda: is_stale(str(mountpoint)))
        with pytest.raises(OSError) as caught:
            os.listdir(mountpoint)
        assert caught.value.errno == errno.ENOTCONN
        result = packfs_cli("unmount", mountpoint)
        assert result.returncode == 0 and "stale" in result.stderr
        assert not is_mounted(str(mountpoint))
        with mounted(archive, mountpoint) as root:  # the same mount point works again
            assert (root / "hello.txt").read_bytes() == b"hello world\n"


def test_daemon_memory_does_not_grow_with_files(tmp_path: Path) -> None:
    """Daemon RSS after walking 1,000,000 entries stays within a few MiB of that for
    2,000: the table pages a walk maps are released as it goes (without that, RSS grew
    by 31 MiB here; with it by 12 MiB, the last directories' large folios)."""
    require_fuse()
    rss = {}
    for count in (2000, 1_000_000):
        out = tmp_path / f"{count}.ffr"
        packfs.pack_entries((packfs.Entry(f"d{i % 100}/f{i}", b"x") for i in range(count)), out, count=count)
        with mounted(out, tmp_path / f"mnt{count}") as root:
            assert len(os.listdir(root / "d7")) == count // 100
            # A whole walk maps every table page once; they must not stay in RSS.
            assert sum(len(files) for _, _, files in os.walk(root)) == count
            status = Path(f"/proc/{daemon_pid(root)}/status").read_text()
            rss[count] = int(status.split("VmRSS:")[1].split()[0])
    assert rss[1_000_000] - rss[2000] < 16 * 1024, rss  # KiB


@pytest.mark.parametrize("binding", ["fusepy", "mfusepy"])
def test_listings_carry_file_types_and_inodes(tmp_path: Path, binding: str) -> None:
    """readdir hands the kernel each entry's type and inode (so os.walk needs no stat),
    also for a directory whose listing spans many reply buffers."""
    count = 5000
    entries = [packfs.Entry("big", kind="dir"), packfs.Entry("big/sub", kind="dir"),
               packfs.Entry("big/link", kind="symlink", target="sub")]
    entries += [packfs.Entry(f"big/file-{i:05d}-{'x' * (i % 40)}", b"%d" % i) for i in range(count)]
    out = tmp_path / "big.ffr"
    packfs.pack_entries(entries, out)
    with mounted(out, tmp_path / "mnt", binding=binding) as root:
        listed = list(os.scandir(root / "big"))
        assert len(listed) == count + 2
        assert sorted(e.name for e in listed) == sorted(["sub", "link"] + [e.path[4:] for e in entries[3:]])
        for item in listed:
            info = os.lstat(item.path)
            assert item.inode() == info.st_ino
            assert item.is_dir(follow_symlinks=False) == (item.name == "sub")
            assert item.is_symlink() == (item.name == "link")
        assert os.stat(root / "big").st_ino != os.stat(root / "big" / "sub").st_ino


@pytest.mark.parametrize("binding", ["fusepy", "mfusepy"])
def test_both_bindings_serve_the_tree_and_uid_option(archive: Path, tmp_path: Path, binding: str) -> None:
    with mounted(archive, tmp_path / "mnt", "-o", "uid=1234,gid=4321", binding=binding) as root:
        assert (root / "a/b/c/deep.bin").read_bytes() == BLUEPRINT["a/b/c/deep.bin"]
        info = os.stat(root / "hello.txt")
        assert (info.st_uid, info.st_gid) == (1234, 4321)
        statvfs = os.statvfs(root)
        assert statvfs.f_files > 20
