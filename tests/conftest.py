"""Shared fixtures: a tricky source tree (the blueprint) and its archive."""

from __future__ import annotations

import array
import importlib
import itertools
import os
import shutil
import stat as stat_module
import struct
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

import packfs
from packfs import RecordReader, RecordWriter
from packfs.write.indexbuild import LookupIndex, build_lookup_index, build_tail, page_crcs
from packfs.format import (FOOTER_SIZE, INDEX_PAGE, INDEX_SINCE_MINOR, MAGIC, PIECE_SECTIONS, SECTION_ALIGNMENT,
                           SECTION_COUNT, SECTIONS, TAIL_HEADER, XATTR_SECTIONS, TAIL_MAGIC, TAIL_SPAN, TAIL_SPAN_COUNT, crc32,
                           header_size, record_count_for, section_count_for, tail_crc)

# Files written by FFRecord's own code (see its README there); copied in, never edited.
VECTORS = Path(__file__).resolve().parent / "vectors" / "ffrecord"

# The blueprint: path -> contents (bytes) for files, None for empty directories.
# Names cover what a POSIX file system allows and tools trip over.
NON_UTF8 = os.fsdecode(b"bytes-\xff\xfe.bin")
BLUEPRINT: dict[str, bytes | None] = {
    "empty.txt": b"",
    "hello.txt": b"hello world\n",
    "a/b/c/deep.bin": bytes(range(256)) * 3,
    "données/été.txt": "ünïcödé\n".encode(),
    "with space.txt": b"space",
    "-leading-dash": b"dash",
    "hash#percent%.txt": b"#%",
    NON_UTF8: b"\x00\x01\x02",
    "Zeta.txt": b"upper case sorts first",
    "big/large.bin": os.urandom(3 * (1 << 20) + 17),  # crosses the 1 MiB chunk size
    "empty_dir": None,
    "a/empty_nested": None,
}
SYMLINKS = {"link-to-hello": "hello.txt", "a/link-up": "../hello.txt", "dangling": "no/such/target",
            "absolute": "/etc/hostname", "a/dirlink": "b"}
HARDLINK = ("hardlink.txt", "hello.txt")
MTIME_NS = 1_600_000_000_123_456_789


_TMP_NUMBERS = itertools.count()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_PASSED] = report.passed


_PASSED = pytest.StashKey[bool]()


@pytest.fixture
def tmp_path(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Path]:
    """pytest's tmp_path, with a name no earlier test of the session had, removed when
    its test passes.  pytest's own, under tmp_path_retention_policy = "failed", gives a
    removed directory's name to the next test: state kept beside it, or keyed by its
    path (a cache directory warned about once per process), leaked into that test."""
    name = "".join(c if c.isalnum() else "_" for c in request.node.name)[:30]
    path = tmp_path_factory.mktemp(f"{name}-{next(_TMP_NUMBERS)}", numbered=False)
    yield path
    if request.node.stash.get(_PASSED, False):
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _cache_dir_per_test(tmp_path_factory: pytest.TempPathFactory,
                        monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test reads archives at URLs through a disk cache of its own: none reads the
    user's ~/.cache, and no test is served blocks another one fetched (the counts of
    requests the remote tests check stay theirs).  The cache goes with its test: kept,
    ~1,600 of them held 0.5 GB and filled a CI machine's disk."""
    cache = tmp_path_factory.mktemp("packfs-cache")
    monkeypatch.setenv("PACKFS_CACHE_DIR", str(cache))
    yield
    shutil.rmtree(cache, ignore_errors=True)


def write_blueprint(root: Path, blueprint: dict[str, bytes | None]) -> None:
    """Write ``blueprint`` (path -> contents, None for a directory) under ``root``."""
    for relative, contents in blueprint.items():
        path = root / relative
        if contents is None:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(contents)


def make_tree(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    write_blueprint(root, BLUEPRINT)
    for relative, target in SYMLINKS.items():
        os.symlink(target, root / relative)
    os.link(root / HARDLINK[1], root / HARDLINK[0])
    os.chmod(root / "hello.txt", 0o600)
    os.chmod(root / "a/b/c/deep.bin", 0o755)
    os.chmod(root / "empty_dir", 0o700)
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), ns=(MTIME_NS, MTIME_NS), follow_symlinks=False)
    os.utime(root, ns=(MTIME_NS, MTIME_NS))
    return root


def tree_snapshot(root: Path) -> dict[str, tuple]:
    """Everything unpack restores, by path relative to ``root`` ("." for ``root``
    itself): the mode with the file type, the mtime in ns, the owner, and the contents
    of a file (with the first name, in sorted order, of the names that share its inode:
    hard links), the target of a symlink.  Directory sizes are left out (a file
    system's own business)."""
    snapshot: dict[str, tuple] = {}
    first_name: dict[tuple[int, int], str] = {}

    def add(path: str) -> None:
        st = os.lstat(path)
        relative = os.path.relpath(path, root)
        if stat_module.S_ISREG(st.st_mode):
            with open(path, "rb") as opened:
                extra: object = (opened.read(), first_name.setdefault((st.st_dev, st.st_ino), relative))
        elif stat_module.S_ISLNK(st.st_mode):
            extra = os.readlink(path)
        else:
            extra = None
        snapshot[relative] = (st.st_mode, st.st_mtime_ns, st.st_uid, st.st_gid, extra)

    add(str(root))
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            add(os.path.join(dirpath, name))
    return snapshot


def assert_same_tree(expected: Path, actual: Path) -> None:
    """``actual`` holds what ``expected`` holds, attributes, hard links and the root's
    own mode and mtime included (see tree_snapshot)."""
    want, got = tree_snapshot(expected), tree_snapshot(actual)
    differences = [(path, want.get(path, "missing")[:4], got.get(path, "missing")[:4])
                   for path in sorted(set(want) | set(got)) if want.get(path) != got.get(path)]
    assert not differences, f"{len(differences)} differences (path, expected, actual): {differences[:10]}"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "src")


@pytest.fixture
def archive(tree: Path, tmp_path: Path) -> Path:
    out = tmp_path / "tree.ffr"
    packfs.pack_folder(tree, out)
    return out


@pytest.fixture
def folder(archive: Path):
    with packfs.PackedFolder(archive) as opened:
        yield opened


# -- FUSE ------------------------------------------------------------------------------

import contextlib  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Iterator  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# Every wall-clock limit in these tests guards against a hang; none measures speed.  Each
# is a generous base times PACKFS_TEST_TIME_SCALE (default 1): on a machine loaded past
# what the bases allow, set it (4, 10) rather than see a test that passes on a quiet one
# fail there.  docs/reliability.md, "The test suite".
TIME_SCALE = float(os.environ.get("PACKFS_TEST_TIME_SCALE") or 1)
if not TIME_SCALE > 0:
    raise ValueError(f"PACKFS_TEST_TIME_SCALE must be a number above 0, got {TIME_SCALE!r}")


def time_limit(base: float) -> float:
    """A test's wall-clock limit: ``base`` seconds times PACKFS_TEST_TIME_SCALE."""
    return base * TIME_SCALE


def fuse_unavailable_reason(binding: str = "mfusepy") -> str | None:
    """Why FUSE cannot work here, or None (the same checks packfs mount makes)."""
    from packfs.errors import MountError
    from packfs.fuse import check_fuse

    try:
        check_fuse(binding)
    except MountError as error:
        return str(error)
    return None


def require_fuse(binding: str = "mfusepy") -> None:
    reason = fuse_unavailable_reason(binding)
    if reason is None and binding in ("auto", "lowlevel") and os.environ.get("CI") == "true":
        from packfs.fuse import unavailable

        compiled = unavailable()
        if compiled is not None:
            pytest.fail(f"the compiled daemon must be built under CI: {compiled}")
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"FUSE must work under CI: {reason}")
    pytest.skip(reason)


def require_extra(module: str, extra: str):
    """Import ``module`` from an optional extra: a skip naming the extra where it is not
    installed, a failure under CI (where ``make test`` installs every extra, but for
    those PACKFS_TEST_WITHOUT_EXTRAS names: the pass on the lowest Python has no torch)."""
    left_out = os.environ.get("PACKFS_TEST_WITHOUT_EXTRAS", "").split(",")
    if os.environ.get("CI") == "true" and extra not in left_out:
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"the {extra} extra is not installed (pip install packfs[{extra}])")


def cli_runner():
    """click's CliRunner with stdout and stderr apart, as click 8.2 always keeps them
    and 8.1 (the last release for Python 3.9, which packfs supports) does when asked."""
    import inspect

    from click.testing import CliRunner

    if "mix_stderr" in inspect.signature(CliRunner).parameters:
        return CliRunner(mix_stderr=False)
    return CliRunner()


def require_python_as_nobody() -> None:
    """Skip, saying why, where user nobody cannot run this interpreter: pyenv's Pythons
    live under /root (mode 0700) and link their libpython from there, so only those
    that Debian's own libraries stand in for (3.11 here) run as another user.  The pass
    on the lowest Python (make test-lowest) meets this; the main pass runs these tests."""
    probe = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable,
                            "-c", "import packfs"], capture_output=True, text=True, cwd="/", timeout=time_limit(60),
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    if probe.returncode != 0:
        pytest.skip(f"user nobody cannot run {sys.executable}: {probe.stderr.strip().splitlines()[-1:]}")


def packfs_cli(*args: object, check: bool = False, timeout: float = 600, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """The CLI in a subprocess; ``timeout``: a hang guard, scaled (time_limit)."""
    return subprocess.run([sys.executable, "-m", "packfs", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=time_limit(timeout), check=check)


def wait_until(condition: Callable[[], bool], seconds: float = 60) -> bool:
    """Poll ``condition`` until it holds or ``seconds`` (scaled: time_limit) pass; whether it held."""
    deadline = time.monotonic() + time_limit(seconds)
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def _is_tmpfs(path: str) -> bool:
    try:
        with open("/proc/self/mounts") as mounts:
            return any(line.split()[1:3] == [path, "tmpfs"] for line in mounts)
    except OSError:
        return False


@contextlib.contextmanager
def deep_scratch(prefix: str) -> Iterator[Path]:
    """A directory for trees 10,000 levels deep, removed at the end: under /dev/shm where
    it is a tmpfs, where removing such a tree costs what making it does (on this disk,
    ext4 with online discard, each of 10,000 rmdirs is a journalled, discarded block:
    pytest's teardown of such trees took 50-60 s on a loaded machine), else the
    system's temporary directory.  rm -rf stays on its file system: it never deletes
    through a mount a failing test left behind."""
    parent = "/dev/shm" if _is_tmpfs("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield path
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


def daemon_pid(mountpoint: Path) -> int:
    """The pid of the daemon serving ``mountpoint``, from its pid file."""
    from packfs.fuse import state_file

    return int(Path(state_file(str(mountpoint), ".pid")).read_text())


def force_unmount(mountpoint: Path) -> None:
    from packfs.fuse import is_mounted

    if is_mounted(str(mountpoint)):
        subprocess.run(["fusermount", "-u", "-z", str(mountpoint)], capture_output=True)


# The daemon the mount tests use unless they name one: `packfs mount`'s default, the
# compiled daemon wherever it can serve (require_fuse insists it is built under CI);
# `make test` runs the mount tests again with PACKFS_TEST_BINDING=mfusepy, so both
# daemons pass them.
TEST_BINDING = os.environ.get("PACKFS_TEST_BINDING", "auto")


@contextlib.contextmanager
def mounted(archive: Path | str, mountpoint: Path, *options: str, binding: str = TEST_BINDING, cwd: Path = REPO):
    """Mount in the background as a user would (``packfs mount`` run in ``cwd``, the
    mount point named relative to it); always unmount, and on a failure show the
    daemon's log and the mount table."""
    require_fuse(binding)
    from packfs.fuse import is_mounted, state_file

    mountpoint.mkdir(parents=True, exist_ok=True)
    result = packfs_cli("mount", archive, os.path.relpath(mountpoint, cwd), "--binding", binding, *options, cwd=cwd)
    log = Path(state_file(str(mountpoint), ".log"))
    if result.returncode != 0 or not is_mounted(str(mountpoint)):
        table = Path("/proc/self/mounts").read_text()
        force_unmount(mountpoint)
        pytest.fail(f"mount failed: {result.stderr}\nlog: {log.read_text() if log.exists() else ''}"
                    f"\nmounts:\n{table}")
    try:
        yield mountpoint
    finally:
        done = packfs_cli("unmount", mountpoint)
        if done.returncode != 0:
            force_unmount(mountpoint)
            deadline = time.monotonic() + time_limit(30)
            while is_mounted(str(mountpoint)) and time.monotonic() < deadline:
                time.sleep(0.05)


# -- a mount outside the suite's folders ---------------------------------------------------

# The suite once took down packfs mounts of other people's while it ran (issue 34).  A
# test may unmount only what it mounted (docs/reliability.md, "The test suite"): this
# mount, made as a user makes one outside the suite's folders before the first test,
# must still be there, serving, after every test and after the last.
SENTINEL_CONTENTS = b"a mount no test made\n"
_sentinel: dict[str, object] = {}


def _sentinel_alive(mountpoint: Path) -> str | None:
    """Why the sentinel mount is not mounted and serving, or None."""
    from packfs.fuse import is_mounted

    if not is_mounted(str(mountpoint)):
        return f"{mountpoint} is no longer mounted"
    try:
        if (mountpoint / "sentinel.txt").read_bytes() != SENTINEL_CONTENTS:
            return f"{mountpoint}/sentinel.txt reads other bytes"
    except OSError as error:
        return f"{mountpoint}/sentinel.txt cannot be read: {error}"
    return None


@pytest.fixture(scope="session", autouse=True)
def _a_mount_outside_the_suite() -> Iterator[None]:
    """``packfs mount`` in the background of a small archive at a mount point under
    $TMPDIR (packfs-sentinel-*), outside every folder the tests use, for the whole
    session; at its end still mounted and serving (else an error), then unmounted.  No
    such mount where FUSE is absent (under CI that is a failure, as for every mount
    test)."""
    reason = fuse_unavailable_reason(TEST_BINDING if TEST_BINDING != "auto" else "mfusepy")
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"FUSE must work under CI: {reason}")
        yield
        return
    base = Path(tempfile.mkdtemp(prefix="packfs-sentinel-"))
    mountpoint = base / "mnt"
    try:
        (base / "src").mkdir()
        (base / "src" / "sentinel.txt").write_bytes(SENTINEL_CONTENTS)
        packfs.pack_folder(base / "src", base / "sentinel.ffr")
        mountpoint.mkdir()
        result = packfs_cli("mount", "--binding", TEST_BINDING, base / "sentinel.ffr", mountpoint, cwd=base)
        problem = (f"packfs mount failed: {result.stderr.strip()}" if result.returncode != 0
                   else _sentinel_alive(mountpoint))
        _sentinel.update(mountpoint=mountpoint, gone=None if problem is None else "before the first test")
        yield
        problem = problem or _sentinel_alive(mountpoint)
        if problem is not None:
            raise AssertionError(f"the mount outside the suite's folders was taken down while it ran "
                                 f"(first seen after {_sentinel['gone']}): {problem}")
    finally:
        _sentinel.clear()
        if is_mounted_path(mountpoint):
            if packfs_cli("unmount", mountpoint).returncode != 0:
                force_unmount(mountpoint)
        if not is_mounted_path(mountpoint):
            subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)


def is_mounted_path(path: Path) -> bool:
    """Whether ``path`` is a mount point (the mount table's word)."""
    from packfs.fuse import is_mounted

    return is_mounted(str(path))


@pytest.fixture(autouse=True)
def _the_mount_outside_is_still_there(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test, the session's outside mount still mounted: the first test after
    which it is not fails, named (a test that unmounted what it did not mount)."""
    yield
    mountpoint = _sentinel.get("mountpoint")
    if mountpoint is None or _sentinel.get("gone") is not None:
        return
    if not is_mounted_path(mountpoint):  # type: ignore[arg-type]
        _sentinel["gone"] = request.node.nodeid
        pytest.fail(f"{mountpoint}, a packfs mount outside the suite's folders that no test made, was "
                    f"unmounted during this test: a test may unmount only the mounts it made")


def damaged_copy(archive: Path, out: Path, path: bytes, at: int = 0, mask: int = 0xFF) -> Path:
    """A copy of ``archive`` at ``out`` with byte ``at`` of file ``path``'s contents XORed
    with ``mask``: contents that fail their CRC, every table value intact."""
    with packfs.PackedFolder(archive) as opened:
        start, _ = opened.archive.extent(opened.archive.find(path))
    data = bytearray(archive.read_bytes())
    data[start + at] ^= mask
    out.write_bytes(bytes(data))
    return out


def archive_layout(archive: Path) -> tuple[int, list[int], int]:
    """(n, offsets, data_records) of an archive."""
    reader = RecordReader(archive)
    container = reader._containers[0]
    n = container.record_count
    offsets = [int(x) for x in container.offsets]
    footer = reader.read_one(n - 1)
    data_records = struct.unpack_from("<Q", footer, 24)[0]
    reader.close()
    return n, offsets, data_records


def read_records(archive: Path) -> list[bytes]:
    """Every record of a container, in order."""
    with RecordReader(archive) as reader:
        return reader[:]


def resealed(records: list[bytes], rebuild_index: bool = True) -> list[bytes]:
    """``records`` of an archive, with a 1.4 archive's lookup index, tail and footer
    recomputed from its table and data (format sections 3, 4d and 4e), as the writer
    lays them out: what ``write_records`` does so a hostile archive passes every
    checksum and its index agrees with its (hostile) table.  Archives before 1.4 are
    returned as given."""
    footer = records[-1]
    if len(footer) != FOOTER_SIZE or footer[:8] != MAGIC or struct.unpack_from("<H", footer, 10)[0] < INDEX_SINCE_MINOR:
        return records
    data_records = struct.unpack_from("<Q", footer, 24)[0]
    # Every section but the tail: 22 in 1.4, 24 in 1.5 (sections 22-23, format 4f).
    span_count = struct.unpack_from("<I", footer, 32)[0] - 1
    n = len(records)
    tail_record = data_records + 2 * span_count + 1
    records = list(records)
    if tail_record >= n - 1:
        # A footer that does not describe these records: the tail as it is, under the
        # footer's new CRC, so the archive is refused for what its footer says.
        tail_record = n - 2 if records[n - 2] else n - 3
        return records[:-1] + [_footer_for(footer, records[tail_record])]

    def positions() -> list[int]:
        at = [header_size(n)]
        for record in records:
            at.append(at[-1] + len(record))
        return at

    def section(k: int) -> int:
        return data_records + 2 * k + 1

    at = positions()
    crcs = array.array("I", (crc32(record) for record in records[:data_records]))
    offsets = array.array("q", at[:data_records])
    try:
        if not rebuild_index:
            raise ValueError("keep the index as it is")
        tables = {name: np.frombuffer(records[section(k)], dtype) for k, (name, dtype) in enumerate(SECTIONS)}
        index = build_lookup_index(tables, crcs, offsets, data_records)
    except (IndexError, ValueError):  # a table too hostile to index: keep the index it has
        index = LookupIndex(records[section(TAIL_SPAN_COUNT - 1)], np.zeros(0, np.int64), np.zeros(0, np.int64))
    else:
        records[section(TAIL_SPAN_COUNT - 1)] = index.data
    for k in range(TAIL_SPAN_COUNT - 1, span_count + 1):  # re-pad the index and what follows it
        records[section(k) - 1] = b""
        records[section(k) - 1] = bytes(-positions()[section(k) - 1] % SECTION_ALIGNMENT)
    at = positions()
    spans = [(at[section(k)], len(records[section(k)])) for k in range(span_count)]
    regions = [crcs.tobytes(), array.array("q", at[: data_records + 1]).tobytes()]
    regions += [records[section(k)] for k in range(TAIL_SPAN_COUNT - 1)]
    regions += [records[section(k)] for k in range(TAIL_SPAN_COUNT, span_count)]  # 1.5's codec sections
    if len(index.row_ends):
        tail = build_tail(record_count=n, data_end=at[data_records], tail_start=at[tail_record], spans=spans,
                          regions=regions, index=index)
    else:  # the old index's pages, under CRCs of its bytes as they are now
        old_tail = records[tail_record]
        tail = bytearray(old_tail)
        position = TAIL_HEADER.size + TAIL_SPAN.size * span_count
        page_size = struct.unpack_from("<I", old_tail, 8)[0]
        for region in regions:
            crcs_of_pages = page_crcs(region, page_size).tobytes()
            tail[position : position + len(crcs_of_pages)] = crcs_of_pages
            position += len(crcs_of_pages)
        index_data = records[section(TAIL_SPAN_COUNT - 1)]
        page_count = struct.unpack_from("<Q", old_tail, 32)[0]
        starts = [INDEX_PAGE.unpack_from(old_tail, position + INDEX_PAGE.size * j)[2] for j in range(page_count)]
        starts.append(len(index_data))
        for j in range(page_count):
            first_hash, _, start = INDEX_PAGE.unpack_from(old_tail, position + INDEX_PAGE.size * j)
            INDEX_PAGE.pack_into(tail, position + INDEX_PAGE.size * j, first_hash,
                                 crc32(index_data[starts[j] : starts[j + 1]]), start)
        tail = bytes(tail)
    records[tail_record] = tail
    return records[:-1] + [_footer_for(footer, tail)]


def _footer_for(footer: bytes, tail: bytes) -> bytes:
    new_footer = bytearray(footer)
    struct.pack_into("<QI", new_footer, 36, len(tail), 0)
    struct.pack_into("<QI", new_footer, 36, len(tail), tail_crc(tail, new_footer))
    return bytes(new_footer)


def write_records(out: Path, records: list[bytes], reseal: bool = True, rebuild_index: bool = True) -> Path:
    """A container of ``records`` with every CRC computed (a 1.4 archive's tail too,
    unless not ``reseal``; its lookup index rebuilt from the table unless not
    ``rebuild_index``): how tests build hostile archives that pass every checksum."""
    if reseal:
        records = resealed(records, rebuild_index)
    with RecordWriter(out, len(records)) as writer:
        for record in records:
            writer.write_one(record)
    return out


def rewrite_section(archive: Path, out: Path, section: str, mutate: Callable[[np.ndarray], None]) -> Path:
    """Copy ``archive`` with one section (of the table or the piece CRCs) changed in
    place, all CRCs recomputed."""
    _, _, data_records = archive_layout(archive)
    sections = SECTIONS + PIECE_SECTIONS + XATTR_SECTIONS
    index = data_records + 2 * [name for name, _ in sections].index(section) + 1
    records = read_records(archive)
    array = np.frombuffer(records[index], dict(sections)[section]).copy()
    mutate(array)
    records[index] = array.tobytes()
    return write_records(out, records)


def column_changed(archive: Path, out: Path, section: str, values: dict[bytes, int]) -> Path:
    """Copy ``archive`` with table column ``section`` set to ``values[path]`` for each
    stored path, every CRC recomputed: a hostile archive that passes every checksum."""
    with packfs.PackedFolder(archive) as opened:
        entries = {opened.archive.find(path): value for path, value in values.items()}

    def change(column: np.ndarray) -> None:
        for entry, value in entries.items():
            column[entry] = value

    return rewrite_section(archive, out, section, change)


def as_version(archive: Path, out: Path, minor: int) -> Path:
    """A copy of a current (1.4) archive as version 1.``minor`` wrote it: the same data,
    the sections that version has (format section 3: 15 up to 1.1, 18 in 1.2, 21 in
    1.3), each section's padding laid out anew, the footer's tail fields zero; in 1.0
    the ``first_link`` column is zero too (1.1 gave it its meaning)."""
    _, _, data_records = archive_layout(archive)
    records = read_records(archive)
    data = records[:data_records]
    count = section_count_for(minor)
    sections = [records[data_records + 2 * k + 1] for k in range(count)]
    if minor == 0:
        sections[11] = bytes(len(sections[11]))  # first_link
    footer = bytearray(records[-1])
    struct.pack_into("<H", footer, 10, minor)  # version_minor
    struct.pack_into("<I", footer, 32, count)
    footer[36:64] = bytes(28)
    n = record_count_for(data_records, count)
    position = header_size(n) + sum(len(record) for record in data)
    laid_out = list(data)
    for section in sections:
        padding = -position % SECTION_ALIGNMENT
        laid_out += [bytes(padding), section]
        position += padding + len(section)
    laid_out += [b""] * (n - len(laid_out) - 1) + [bytes(footer)]
    return write_records(out, laid_out)


def as_version_1_1(archive: Path, out: Path) -> Path:
    """A copy of an archive as 1.1 wrote it (:func:`as_version`)."""
    return as_version(archive, out, 1)


def damaged_unpieced_archive(directory: Path, size: int = 16 << 20, small_files: int = 300) -> Path:
    """An archive as 1.1 wrote it (no piece CRCs, so a large file is checked whole) of
    ``big.bin`` (``size`` bytes, one byte in its middle damaged) and ``small_files``
    sound files ``s000``, ``s001``, ... whose records follow big.bin's: with 257 or
    more, record r + 256 (the lock stripe the compiled daemon once shared with r) is one
    of them."""
    source = directory / "damaged-src"
    source.mkdir()
    (source / "big.bin").write_bytes(bytes(range(256)) * (size // 256))
    for k in range(small_files):
        (source / f"s{k:03d}").write_bytes(f"small file {k}\n".encode())
    packfs.pack_folder(source, directory / "sound.ffr")
    old = as_version_1_1(directory / "sound.ffr", directory / "sound-1.1.ffr")
    return damaged_copy(old, directory / "damaged.ffr", b"big.bin", at=size // 2)


def bytes_read_by_this_thread() -> int:
    """What this thread has passed to read() and pread() so far (/proc/thread-self/io's
    rchar, page cache hits included): how a test sees that a read re-read nothing."""
    for line in Path("/proc/thread-self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/thread-self/io")
