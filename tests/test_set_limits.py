"""Shard sets at their limits and against hostile input (packfs/core/union.py, issue 34):
more shards than the process may open files, a manifest URL that claims to be huge, a
pickled folder over a URL re-opened by a spawn worker, a manifest whose ranges lie (its
CRC valid), shards that lead outside the set's directory."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import resource
import subprocess
import sys
from pathlib import Path

import pytest

import packfs
from packfs.core import ShardSet, open_archive
from packfs.core.manifest import manifest_bytes, parse_manifest
from packfs.errors import FormatError
from packfs.write.sets import make_set
from tests.conftest import REPO, TEST_BINDING, packfs_cli, require_fuse, time_limit
from tests.remote_servers import S3_KEY, S3_REGION, S3_SECRET
from tests.test_remote_source import moto, nginx  # noqa: F401 (fixtures: real servers, stopped at the end)
from tests.test_union import _shards, _tree

LOW_LIMIT = 256  # soft RLIMIT_NOFILE of the CLI runs below: far fewer than the set's shards


def _low_soft_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW_LIMIT, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


def _low_hard_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW_LIMIT, LOW_LIMIT))


def _cli(*args: object, limit=_low_soft_limit, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "packfs", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=time_limit(timeout), preexec_fn=limit)


def _clean(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr


# -- more shards than open files ---------------------------------------------------------

SHARDS = 1100


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    """A set of 1,100 one-file shards, as `packfs pack --shards 1100` writes it."""
    root = tmp_path_factory.mktemp("many")
    files = {f"d{n // 100:02d}/f{n:04d}": str(n).encode() for n in range(SHARDS)}
    for path, data in files.items():
        (root / "src" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "src" / path).write_bytes(data)
    manifest = root / "set" / "many.ffrset"
    manifest.parent.mkdir()
    # `packfs pack --shards 1100` itself, with fsync a no-op (a thousand fsyncs are
    # most of its time, and prove nothing here).
    script = ("import os, sys\nos.fsync = lambda fd: None\nfrom packfs.cli import main\n"
              "main(sys.argv[1:], prog_name='packfs')\n")
    _clean(subprocess.run([sys.executable, "-c", script, "pack", "--shards", str(SHARDS), str(root / "src"),
                           str(manifest)], capture_output=True, text=True, cwd=REPO, timeout=time_limit(600)))
    shards = len(parse_manifest(manifest.read_bytes(), "test"))
    assert shards > LOW_LIMIT * 4
    return manifest, files


def test_a_set_of_more_shards_than_open_files_lists_verifies_and_unpacks(many, tmp_path) -> None:
    manifest, files = many
    listed = _cli("ls", "-R", manifest)
    _clean(listed)
    assert all(path.rsplit("/", 1)[1] in listed.stdout for path in files)
    _clean(_cli("verify", manifest))
    _clean(_cli("unpack", manifest, tmp_path / "out"))
    assert {str(p.relative_to(tmp_path / "out")): p.read_bytes()
            for p in (tmp_path / "out").rglob("*") if p.is_file()} == files


def test_a_set_holds_a_bounded_number_of_shards_open(many) -> None:
    manifest, files = many
    with packfs.PackedFolder(manifest) as folder:
        limit = packfs.core.union.open_shard_limit()
        for path, data in files.items():
            assert folder.read(path) == data
            assert folder.archive.open_shards <= limit
        # Dropped shards open again, checked again, when next used.
        assert folder.read("d00/f0000") == b"0"


def _mount(manifest: Path, mountpoint: Path, binding: str, limit) -> subprocess.CompletedProcess:
    mountpoint.mkdir(parents=True, exist_ok=True)
    return _cli("mount", manifest, mountpoint, "--binding", binding, limit=limit, timeout=120)


@pytest.mark.parametrize("limit", [_low_soft_limit, _low_hard_limit], ids=["soft", "hard"])
def test_a_set_of_more_shards_than_open_files_mounts(many, tmp_path, limit) -> None:
    """The compiled daemon holds a descriptor per shard: it raises the soft limit to
    what the set needs; where the hard limit is too low, auto serves the set with the
    Python daemon, which keeps its shards within the limit."""
    require_fuse(TEST_BINDING)
    from packfs.fuse import is_mounted

    manifest, files = many
    mountpoint = tmp_path / "mnt"
    result = _mount(manifest, mountpoint, TEST_BINDING, limit)
    try:
        assert "Traceback" not in result.stderr, result.stderr
        assert result.returncode == 0 and is_mounted(str(mountpoint)), result.stderr
        if limit is _low_hard_limit and TEST_BINDING == "auto":
            assert "hard limit on open files" in result.stderr
        walked = {os.path.relpath(os.path.join(d, n), mountpoint): Path(d, n).read_bytes()
                  for d, _, names in os.walk(mountpoint) for n in names}
        assert walked == files
    finally:
        packfs_cli("unmount", mountpoint)


def test_the_compiled_daemon_refuses_a_set_past_the_hard_limit_in_one_line(many, tmp_path) -> None:
    require_fuse("lowlevel")
    manifest, _ = many
    result = _mount(manifest, tmp_path / "mnt", "lowlevel", _low_hard_limit)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("Error: ") and "hard limit on open files" in result.stderr


# -- a manifest URL's size ---------------------------------------------------------------

@pytest.mark.parametrize("claim", [2 << 30, 1 << 40], ids=["2GB", "1TiB"])
def test_a_huge_manifest_url_is_refused_before_it_is_read(nginx, claim) -> None:  # noqa: F811
    name = f"huge-{claim}.ffrset"
    path = nginx.data / name
    path.write_bytes(b'{"crc":')
    try:
        os.truncate(path, claim)  # sparse: no disk
    except OSError as error:
        pytest.skip(f"cannot make a sparse file of {claim} bytes: {error}")
    # The peak is this process's own (VmHWM): ru_maxrss would count the parent's at the
    # fork too (Linux keeps it across exec), which is pytest's, gigabytes in a whole run.
    script = ("import re, sys\nimport packfs\n"
              "try:\n    packfs.core.open_archive(sys.argv[1], cache_dir=False)\n"
              "except packfs.errors.FormatError as error:\n    print('refused:', error)\n"
              "print(re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read()).group(1))\n")
    result = subprocess.run([sys.executable, "-c", script, nginx.url(name)], capture_output=True, text=True,
                            cwd=REPO, timeout=time_limit(120))
    assert result.returncode == 0, result.stderr
    refused, peak = result.stdout.splitlines()
    assert refused.startswith("refused:") and "too large for a shard-set manifest" in refused
    assert int(peak) < 400 << 10  # KiB: nothing near the claim was allocated
    cli = packfs_cli("ls", nginx.url(name), "--cache-dir", "off")
    assert cli.returncode == 1 and cli.stderr.startswith("Error: ") and "too large" in cli.stderr
    assert "Traceback" not in cli.stderr
    path.unlink()


def test_a_manifest_url_naming_a_shard_up_through_escapes_is_refused(nginx, tmp_path) -> None:  # noqa: F811
    """"%2e%2e/x" passes as a name, but a server decodes it to "../x" before it resolves
    the path: a manifest at a URL would name files outside its directory."""
    files = _tree()
    shards = _shards(files, tmp_path, 2)
    records = [shard_record_of(path, name) for path, name in zip(shards, ["%2e%2e/outside.ffr", shards[1].name])]
    (nginx.data / "sub").mkdir(exist_ok=True)
    nginx.put("outside.ffr", shards[0].read_bytes())
    nginx.put(shards[1].name, shards[1].read_bytes())
    (nginx.data / "sub" / "escapes.ffrset").write_bytes(manifest_bytes(records))
    with pytest.raises(FormatError, match="%-decoded"):
        open_archive(nginx.url("sub/escapes.ffrset"), cache_dir=False)


def shard_record_of(path: Path, name: str):
    from packfs.core import Archive
    from packfs.core.manifest import shard_record

    with Archive(path) as archive:
        return shard_record(archive, name)


# -- a pickled folder over a URL -------------------------------------------------------------

def _read_in_worker(pickled: bytes) -> tuple[bytes, list[str]]:
    folder = pickle.loads(pickled)
    with folder:
        return folder.read("README"), folder.list("")


def test_a_pickled_folder_over_a_url_reopens_with_its_storage_options_and_cache(moto, tmp_path,  # noqa: F811
                                                                                 monkeypatch) -> None:
    """The endpoint and credentials given only as storage_options, and a cache_dir,
    reach a spawn worker (which has neither in its environment)."""
    files = _tree()
    shards = _shards(files, tmp_path, 3)
    manifest = tmp_path / "data.ffrset"
    make_set(str(manifest), [str(s) for s in shards])
    client = moto.client()
    client.create_bucket(Bucket="pickled")
    for path in [*shards, manifest]:
        client.put_object(Bucket="pickled", Key=f"sets/{path.name}", Body=path.read_bytes())
        client.put_object(Bucket="pickled", Key=path.name, Body=path.read_bytes())
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    environment_cache = tmp_path / "environment-cache"
    monkeypatch.setenv("PACKFS_CACHE_DIR", str(environment_cache))
    options = {"key": S3_KEY, "secret": S3_SECRET, "region": S3_REGION, "endpoint_url": moto.endpoint,
               "retries": 0, "timeout": 5}
    context = multiprocessing.get_context("spawn")
    for url in ("s3://pickled/sets/data.ffrset", f"s3://pickled/{shards[0].name}"):
        given_cache = tmp_path / f"given-cache-{url.count('/')}"
        with packfs.PackedFolder(url, storage_options=options, cache_dir=given_cache) as folder:
            expected = (folder.read("README") if folder.exists("README") else b"", folder.list(""))
            pickled = pickle.dumps(folder)
        with context.Pool(1) as pool:
            if expected[0]:
                assert pool.apply(_read_in_worker, (pickled,)) == expected
            else:
                assert pool.apply(_list_in_worker, (pickled,)) == expected[1]
        assert not environment_cache.exists() or not any(environment_cache.rglob("*"))
        assert any(given_cache.rglob("*"))


def _list_in_worker(pickled: bytes) -> list[str]:
    with pickle.loads(pickled) as folder:
        return folder.list("")


# -- manifests that lie, shards that lead outside --------------------------------------------

@pytest.fixture
def four(tmp_path) -> tuple[Path, list[Path], dict[str, bytes]]:
    files = _tree()
    directory = tmp_path / "set"
    directory.mkdir()
    shards = _shards(files, directory, 4)
    manifest = directory / "data.ffrset"
    make_set(str(manifest), [str(s) for s in shards])
    return manifest, shards, files


def _rewrite(manifest: Path, change) -> None:
    """The manifest with its records changed, written by the project's own writer (a
    valid CRC)."""
    records = parse_manifest(manifest.read_bytes(), "test")
    manifest.write_bytes(manifest_bytes(change(records)))


@pytest.mark.parametrize("lie", ["overlap", "shrunk", "swapped"])
def test_a_manifest_whose_ranges_lie_is_refused_naming_the_shard(four, lie) -> None:
    manifest, shards, files = four

    def change(records):
        if lie == "overlap":  # shard 1 claims shard 2's range too: names listed twice
            records[1] = records[1]._replace(last=records[2].last)
        elif lie == "shrunk":  # shard 1's last paths belong to no shard: listed, not found
            records[1] = records[1]._replace(last=records[1].first)
        else:  # shards 1 and 2 trade ranges
            records[1], records[2] = (records[1]._replace(first=records[2].first, last=records[2].last),
                                      records[2]._replace(first=records[1].first, last=records[1].last))
        return records

    _rewrite(manifest, change)
    named = f"({shards[1].name}|{shards[2].name})" if lie == "swapped" else shards[1].name
    with pytest.raises(FormatError, match=named + ".*manifest is wrong"):
        with packfs.PackedFolder(manifest) as folder:
            for path in files:
                assert folder.read(path) == files[path]
            folder.walk("")
    verified = packfs_cli("verify", manifest)
    assert verified.returncode != 0 and "Traceback" not in verified.stderr
    assert "manifest is wrong" in verified.stdout + verified.stderr
    listed = packfs_cli("ls", "-R", manifest)
    assert listed.returncode == 1 and "Traceback" not in listed.stderr and "manifest is wrong" in listed.stderr



@pytest.mark.parametrize("lie", ["overlap", "shrunk"])
def test_a_mount_of_a_manifest_whose_ranges_lie_serves_nothing_wrong(four, tmp_path, lie) -> None:
    """The compiled daemon (a set of one layer) refuses it in one line; the Python
    daemon (several layers, or asked for) answers EIO and logs the shard."""
    require_fuse(TEST_BINDING)
    manifest, shards, files = four

    def change(records):
        records[1] = records[1]._replace(last=records[2].last if lie == "overlap" else records[1].first)
        return records

    _rewrite(manifest, change)
    mountpoint = tmp_path / "mnt"
    result = _mount(manifest, mountpoint, TEST_BINDING, None)
    try:
        assert "Traceback" not in result.stderr
        if result.returncode != 0:
            assert result.stderr.startswith("Error: ") and "manifest is wrong" in result.stderr
        else:
            with pytest.raises(OSError) as raised:
                os.listdir(mountpoint)
            assert raised.value.errno == 5  # EIO
    finally:
        packfs_cli("unmount", mountpoint)


def test_a_shard_replaced_by_a_symlink_outside_the_set_is_refused(four, tmp_path) -> None:
    manifest, shards, files = four
    outside = tmp_path / "outside.ffr"
    os.replace(shards[2], outside)
    shards[2].symlink_to(outside)  # the same bytes: only where they are is wrong
    with pytest.raises(FormatError, match="outside the set's directory"):
        with packfs.PackedFolder(manifest) as folder:
            for path in files:
                folder.read(path)
    verified = packfs_cli("verify", manifest)
    assert verified.returncode != 0 and "outside the set's directory" in verified.stdout + verified.stderr
    # A link within the set's directory is followed.
    os.replace(outside, shards[2].with_suffix(".real"))
    shards[2].unlink()
    shards[2].symlink_to(shards[2].with_suffix(".real").name)
    with packfs.PackedFolder(manifest) as folder:
        assert all(folder.read(path) == files[path] for path in files)


def test_a_manifest_naming_a_shard_through_a_directory_link_outside_is_refused(four, tmp_path) -> None:
    manifest, shards, files = four
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.replace(shards[3], elsewhere / shards[3].name)
    (manifest.parent / "sub").symlink_to(elsewhere)

    def change(records):
        records[3] = records[3]._replace(file=f"sub/{records[3].file}")
        return records

    _rewrite(manifest, change)
    assert json.loads(manifest.read_bytes())["shards"][3]["file"].startswith("sub/")
    with pytest.raises(FormatError, match="outside the set's directory"):
        with ShardSet.from_manifest(manifest) as opened:
            opened.shard(3)
    listed = packfs_cli("ls", "-R", manifest)
    assert listed.returncode == 1 and "outside the set's directory" in listed.stderr
    # The same archives named by the user (a list) are theirs to name.
    with open_archive([str(s) for s in shards[:3]] + [str(elsewhere / shards[3].name)]) as opened:
        assert opened.shard_count == 4


def test_a_dropped_shard_keeps_serving_the_files_and_views_taken_from_it(four) -> None:
    """A shard dropped to stay within the bound is not closed under its readers: a file
    object, a view, and reads in other threads keep working."""
    import random
    import threading

    manifest, shards, files = four
    with packfs.PackedFolder(manifest) as folder:
        shard_set = folder.archive
        shard_set._members.open_limit = 1  # the bound open_shard_limit() gives, made tiny
        paths = sorted(files)
        first, last = paths[0], paths[-1]
        view = folder.read_view(first)
        handle = folder.open(first)
        assert folder.read(last) == files[last]  # another shard: the first is dropped
        assert shard_set.open_shards == 1
        assert bytes(view) == files[first] and handle.read() == files[first]
        handle.close()
        view.release()
        problems = []

        def reader(seed: int) -> None:
            rng = random.Random(seed)
            try:
                for path in rng.choices(paths, k=300):
                    assert folder.read(path) == files[path]
                    with folder.open(path) as opened:
                        assert opened.read() == files[path]
            except BaseException as error:  # noqa: BLE001 (reported below)
                problems.append(repr(error))

        threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert problems == []
        assert shard_set.open_shards <= 1
