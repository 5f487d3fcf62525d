"""The checksum policy (packfs/core/checkpolicy.py): one object per archive that says
when a record is checked and keeps what its checks found, asked by every read call.
Tested on its own, over a real archive's container, and through the archive's reads
from many threads at once."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

import packfs
from packfs import ChecksumError
from packfs.core import Archive, Container
from packfs.core.checkpolicy import ChecksumPolicy
from packfs.core.pieces import PieceTable
from tests.conftest import damaged_copy, damaged_unpieced_archive, time_limit

SOUND, DAMAGED = b"sound.bin", b"damaged.bin"


@pytest.fixture
def damaged(tmp_path: Path) -> Path:
    """An archive with a sound and a damaged file (one byte flipped, tables intact)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "sound.bin").write_bytes(os.urandom(50_000))
    (src / "damaged.bin").write_bytes(os.urandom(50_000))
    packfs.pack_folder(src, tmp_path / "good.ffr")
    return damaged_copy(tmp_path / "good.ffr", tmp_path / "damaged.ffr", DAMAGED, at=1234)


def _policy(archive: Path, kind: str) -> tuple[ChecksumPolicy, Container, dict[bytes, int]]:
    """A policy over a fresh container of ``archive``, and its files' records."""
    with Archive(archive) as opened:
        records = {name: int(opened.column("record")[opened.find(name)]) for name in (SOUND, DAMAGED)}
    container = Container(archive, use_tail=True)
    footer = container.footer
    policy = ChecksumPolicy(kind, container, PieceTable(container, footer), footer.data_records, repr)
    return policy, container, records


def _record(container: Container, record: int) -> bytes:
    start, end = container.record_span(record)
    return container.pread(start, end)


def test_what_each_policy_says_about_a_sound_record(damaged: Path) -> None:
    for kind, first, later in (("always", True, True), ("once", True, False), ("never", False, False)):
        policy, container, records = _policy(damaged, kind)
        sound = records[SOUND]
        assert policy.must_check(sound, "x") is first, kind
        policy.check_if_due(sound, _record(container, sound), "x")
        assert policy.must_check(sound, "x") is later, kind
        assert policy.checks is (kind != "never")


def test_once_remembers_a_failed_record_and_raises_on_every_later_ask_without_reading(damaged: Path,
                                                                                    monkeypatch) -> None:
    policy, container, records = _policy(damaged, "once")
    bad = records[DAMAGED]
    with pytest.raises(ChecksumError, match="'where'"):
        policy.check(bad, _record(container, bad), "where")
    reads: list[int] = []
    monkeypatch.setattr(Container, "record_crc_ok", lambda self, index, progress=None: reads.append(index))
    for ask in (lambda: policy.must_check(bad, "again"), lambda: policy.check(bad, None, "again"),
                lambda: policy.check_if_due(bad, b"any bytes", "again"), lambda: policy.raise_if_failed(bad, "again")):
        with pytest.raises(ChecksumError, match="'again'"):
            ask()
    assert reads == []  # never read or checked again
    assert policy.must_check(records[SOUND], "sound") is True  # the other record is untouched


def test_always_checks_every_time_and_never_nothing(damaged: Path) -> None:
    always, container, records = _policy(damaged, "always")
    bad = records[DAMAGED]
    data = _record(container, bad)
    for _ in range(3):
        with pytest.raises(ChecksumError):
            always.check_if_due(bad, data, "bad")
        with pytest.raises(ChecksumError):
            always.check_if_due(bad, None, "bad")  # read from the source
    never, container, records = _policy(damaged, "never")
    never.check_if_due(bad, data, "bad")  # nothing checked, nothing raised
    assert never.checked is None and never.failed is None


def test_an_unknown_policy_is_refused(damaged: Path) -> None:
    container = Container(damaged, use_tail=True)
    with pytest.raises(ValueError, match="sometimes"):
        ChecksumPolicy("sometimes", container, PieceTable(container, container.footer), 2, repr)


@pytest.mark.parametrize("sound", [True, False])
def test_threads_hammering_once_on_one_record_check_it_once(tmp_path: Path, monkeypatch, sound: bool) -> None:
    """Sixteen threads read parts of one large record (no piece CRCs: checked from the
    source, whole) at once: it is read and checked once, every thread gets the same
    answer, and a damaged one is never remembered as sound."""
    damaged = damaged_unpieced_archive(tmp_path, size=8 << 20, small_files=3)
    archive = tmp_path / "sound-1.1.ffr" if sound else damaged  # its undamaged original
    expected = (bytes(range(256)) * ((8 << 20) // 256))
    checks: list[int] = []
    real = Container.record_crc_ok
    gate = threading.Barrier(16)

    def counted(self, index, progress=None):
        checks.append(index)
        return real(self, index, progress)

    outcomes: list[object] = []
    with Archive(archive, checksums="once") as opened:
        entry = opened.find(b"big.bin")
        monkeypatch.setattr(Container, "record_crc_ok", counted)  # after the open's checks of the table

        def reader(k: int) -> None:
            gate.wait()
            for turn in range(20):
                offset = (k * 4096 + turn * 65536) % (8 << 20)
                try:
                    outcomes.append(opened.read(entry, offset, 100) == expected[offset : offset + 100])
                except ChecksumError as error:
                    outcomes.append(type(error))

        threads = [threading.Thread(target=reader, args=(k,)) for k in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(outcomes) == 16 * 20
        assert len(checks) == 1  # one thread checked; the others waited and found its outcome
        assert set(outcomes) == ({True} if sound else {ChecksumError})
        if not sound:  # and it stays failed, whichever call asks
            for again in (lambda: opened.read(entry), lambda: opened.check(entry), lambda: opened.open(entry),
                          lambda: list(opened.read_batch([entry]))):
                with pytest.raises(ChecksumError, match="big.bin"):
                    again()
            assert len(checks) == 1


def test_a_forked_child_checks_with_locks_of_its_own(tmp_path: Path) -> None:
    """A parent's thread holding a check's lock at the fork does not hang the child:
    its locks are replaced in the child (a lock is copied held)."""
    archive = damaged_unpieced_archive(tmp_path, size=4 << 20, small_files=3)
    with Archive(tmp_path / "sound-1.1.ffr", checksums="once") as opened:
        entry = opened.find(b"big.bin")
        policy = opened._policy  # the parent's policy, its lock taken as a checking thread would hold it
        policy._lock.acquire()
        try:
            pid = os.fork()
            if pid == 0:  # the child: read (and check) the file, then say how it went
                code = 1
                try:
                    code = 0 if opened.read(entry, 10, 10) == bytes(range(10, 20)) else 2
                finally:
                    os._exit(code)
        finally:
            policy._lock.release()
        deadline = time.monotonic() + time_limit(30)
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if not done:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on a lock its parent's thread held at the fork")
    assert os.waitstatus_to_exitcode(status) == 0
    assert archive.exists()
