"""pack_on_dask on a real distributed.LocalCluster of worker processes: the same bytes
whatever the number of workers (and as pack_shards of the same tree), a worker killed
mid-task (the task runs again elsewhere, no debris, the same bytes), errors that leave
nothing."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from packfs.errors import PackError
from packfs.write.shards import pack_shards
from tests.conftest import require_extra, time_limit

distributed = require_extra("distributed", "dask")


def make_files(root: Path) -> list[str]:
    """30 files of 1-30 KiB in nested directories (with their own modes and mtimes)."""
    names = []
    for number in range(30):
        relative = f"d{number % 3}/e{number % 2}/f{number:02d}.bin"
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes([number]) * 1024 * (number + 1))
        names.append(relative)
    os.chmod(root / "d1", 0o750)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), ns=(1_600_000_000_123_456_789,) * 2)
    os.utime(root, ns=(1_600_000_000_123_456_789,) * 2)
    return names


def set_bytes(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def _cluster2() -> Iterator[Any]:
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        yield client


@pytest.fixture
def cluster2(_cluster2: Any) -> Any:
    """The module's cluster with both workers up: an earlier test's restart that timed
    out on a loaded machine fails here, not as a test waiting forever for workers."""
    _cluster2.wait_for_workers(2, timeout=time_limit(60))
    return _cluster2


def patch_every_worker(client: Any, function: Callable[..., None], *args: str) -> None:
    """Run ``function`` in both worker processes (both registered: a restart's
    workers come back one by one)."""
    client.wait_for_workers(2, timeout=time_limit(60))
    assert len(client.run(function, *args)) == 2


def restart(client: Any) -> None:
    client.restart(timeout=time_limit(60))
    client.wait_for_workers(2, timeout=time_limit(60))


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, list[str]]:
    root = tmp_path / "src"
    return root, make_files(root)


def test_the_same_bytes_with_one_worker_two_workers_and_pack_shards(files: tuple[Path, list[str]], tmp_path: Path,
                                                                     cluster2: object) -> None:
    from packfs.write.dask import pack_on_dask

    root, names = files
    for name in ("two", "one", "local"):
        (tmp_path / name).mkdir()
    stats = pack_on_dask(names, tmp_path / "two" / "data.ffr", root=root, shards=4, client=cluster2)
    assert len(stats.shards) == 4 and stats.files == 30
    with distributed.LocalCluster(n_workers=1, processes=True, threads_per_worker=1, dashboard_address=":0") as one, \
            distributed.Client(one) as client:
        pack_on_dask(reversed(names), tmp_path / "one" / "data.ffr", root=root, shards=4, client=client)
    pack_shards(root, tmp_path / "local" / "data.ffr", shards=4)
    two = set_bytes(tmp_path / "two")
    assert sorted(two) == [f"data-0000{n}-of-00004.ffr" for n in range(4)] + ["data.ffrset"]
    assert two == set_bytes(tmp_path / "one") == set_bytes(tmp_path / "local")


def test_a_bag_of_pairs_by_shard_size(files: tuple[Path, list[str]], tmp_path: Path, cluster2: object) -> None:
    import dask.bag

    from packfs.core import Archive, open_archive
    from packfs.write.dask import pack_on_dask

    root, names = files
    pairs = [(f"images/{name}", str(root / name)) for name in names]
    out = tmp_path / "out"
    out.mkdir()
    stats = pack_on_dask(dask.bag.from_sequence(pairs, npartitions=5), out / "b.ffr", shard_size=100 * 1024,
                         client=cluster2)
    assert len(stats.shards) > 3
    found = {}
    for record in stats.shards:
        with Archive(out / record.file) as archive:
            for entry in range(archive.entry_count):
                if archive.file_type(entry) != 0o040000:
                    found[os.fsdecode(archive.path_of(entry))] = archive.read(entry)
    assert found == {key: Path(path).read_bytes() for key, path in pairs}
    with open_archive(out / "b.ffrset") as tree:  # the set served as one tree, no re-pack
        assert {name: tree.read_path(name) for name in found} == found
        assert len(tree.children(tree.lookup("images/d0/e0"))) == 5
    (tmp_path / "again").mkdir()
    pack_on_dask(dask.bag.from_sequence(pairs[::-1], npartitions=2), tmp_path / "again" / "b.ffr",
                 shard_size=100 * 1024, client=cluster2)
    assert set_bytes(out) == set_bytes(tmp_path / "again")


def _kill_the_first_attempt(marker: str, out: str) -> None:
    """Run on each worker: the first pack_entries of the cluster (whichever worker
    creates the marker) kills its own worker process mid-write, after noting what
    the output directory held then."""
    import packfs.write.shards as shards

    real = shards.pack_entries

    def pack_entries(entries, path, **options):  # type: ignore[no-untyped-def]
        class KillMidWrite:
            def start(self, *counts: int) -> None:
                pass

            def advance(self, files: int, nbytes: int) -> None:
                try:
                    fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
                except FileExistsError:
                    return
                os.write(fd, "\n".join(os.listdir(out)).encode())
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)

        options["progress"] = KillMidWrite()
        return real(entries, path, **options)

    shards.pack_entries = pack_entries


def test_a_worker_killed_mid_task_is_retried_and_leaves_no_debris(files: tuple[Path, list[str]], tmp_path: Path,
                                                                   cluster2: object) -> None:
    from packfs.write.dask import pack_on_dask

    root, names = files
    out, reference = tmp_path / "out", tmp_path / "reference"
    out.mkdir()
    reference.mkdir()
    marker = tmp_path / "killed"
    patch_every_worker(cluster2, _kill_the_first_attempt, str(marker), str(out))
    try:
        pack_on_dask(names, out / "k.ffr", root=root, shards=3, client=cluster2)
    finally:
        restart(cluster2)  # workers without the patch for the other tests
    seen_at_the_kill = marker.read_text().split("\n")
    assert any(".packfs-tmp-" in name for name in seen_at_the_kill)  # the killed attempt's file
    pack_shards(root, reference / "k.ffr", shards=3)
    assert set_bytes(out) == set_bytes(reference)  # nothing else left


def _fail_the_second_shard() -> None:
    """Run on each worker: packing shard 1 fails, as a full disk would."""
    import packfs.write.shards as shards

    real = shards.pack_entries

    def pack_entries(entries, path, **options):  # type: ignore[no-untyped-def]
        if str(path).endswith("-00001-of-00003.ffr"):
            raise PackError(f"cannot write {str(path)!r}: No space left on device")
        return real(entries, path, **options)

    shards.pack_entries = pack_entries


def test_a_failed_task_fails_the_set_and_leaves_nothing(files: tuple[Path, list[str]], tmp_path: Path,
                                                          cluster2: object) -> None:
    from packfs.write.dask import pack_on_dask

    root, names = files
    out = tmp_path / "out"
    out.mkdir()
    patch_every_worker(cluster2, _fail_the_second_shard)
    try:
        with pytest.raises(PackError, match="No space left on device"):
            pack_on_dask(names, out / "m.ffr", root=root, shards=3, client=cluster2)
    finally:
        restart(cluster2)
    assert os.listdir(out) == []  # shards 0 and 2 were in place: removed


def test_an_interrupted_client_stops_the_run_and_leaves_nothing(files: tuple[Path, list[str]], tmp_path: Path,
                                                                   cluster2: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the client waits for the tasks: those not taken are cancelled,
    those taken end, and nothing is left, not even a shard of a task that was running."""
    from packfs.write.dask import pack_on_dask

    root, names = files
    out = tmp_path / "out"
    out.mkdir()

    def interrupted(futures: list[Any]) -> None:
        # Bounded: a cluster left without workers by an earlier failure would wait forever.
        distributed.wait(futures[:1], timeout=time_limit(120))
        raise KeyboardInterrupt

    monkeypatch.setattr(cluster2, "gather", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pack_on_dask(names, out / "i.ffr", root=root, shards=8, client=cluster2)
    assert os.listdir(out) == []


def test_bad_lists_are_refused_before_any_task(files: tuple[Path, list[str]], tmp_path: Path,
                                               cluster2: object) -> None:
    import dask.bag

    from packfs.write.dask import pack_on_dask

    root, names = files
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(PackError, match="nothing-here"):
        pack_on_dask(names + ["nothing-here"], out / "m.ffr", root=root, shards=2, client=cluster2)
    pairs = [(name, str(root / name)) for name in names]
    with pytest.raises(PackError, match="given twice"):
        pack_on_dask(dask.bag.from_sequence(pairs[:3] + pairs[:1]), out / "m.ffr", shards=2, client=cluster2)
    assert os.listdir(out) == []


def test_arguments_are_checked(files: tuple[Path, list[str]], tmp_path: Path, cluster2: object) -> None:
    from packfs.write.dask import pack_on_dask

    root, names = files
    with pytest.raises(ValueError, match="one of them"):
        pack_on_dask(names, tmp_path / "x.ffr", root=root, client=cluster2)
    with pytest.raises(ValueError, match="needs the root"):
        pack_on_dask(names, tmp_path / "x.ffr", shards=2, client=cluster2)
    with pytest.raises(PackError, match="not a file under"):
        pack_on_dask(["../elsewhere"], tmp_path / "x.ffr", root=root, shards=2, client=cluster2)


def test_compressed_shards_on_dask_match_pack_shards(files: tuple[Path, list[str]], tmp_path: Path,
                                                     cluster2: object) -> None:
    """Format 1.5's codecs on the workers: each task compresses (and dedups) its shard,
    byte for byte as pack_shards does."""
    from packfs.write.dask import pack_on_dask

    from .spec15 import Spec15

    root, names = files
    (root / "d0" / "copy.bin").write_bytes((root / names[0]).read_bytes())
    names.append("d0/copy.bin")
    for name in ("dask", "local"):
        (tmp_path / name).mkdir()
    codecs = {"compress": "zstd:3"}
    pack_on_dask(names, tmp_path / "dask" / "data.ffr", root=root, shards=2, client=cluster2, codecs=codecs)
    pack_shards(root, tmp_path / "local" / "data.ffr", shards=2, codecs=codecs)
    assert set_bytes(tmp_path / "dask") == set_bytes(tmp_path / "local")
    found = {}
    for shard in sorted((tmp_path / "dask").glob("*.ffr")):
        archive = Spec15(shard)
        assert archive.footer.flags == 1
        found.update({path: data for path, (data, _, _) in archive.files().items()})
    assert found == {os.fsencode(name): (root / name).read_bytes() for name in names}
