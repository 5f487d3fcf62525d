"""Shard sets served as one tree (packfs/core/union.py): a manifest, a list or a glob
through PackedFolder, the datasets, fsspec, FFRecord's API, the CLI and the mount;
paths held twice refused; appending (packfs/write/sets.py)."""

from __future__ import annotations

import json
import os
import pickle
import random
import stat as stat_module
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest

import packfs
from packfs.core import Archive, ShardSet, open_archive
from packfs.core.manifest import (ShardRecord, depth_first_key, leaf_range, manifest_bytes, parse_manifest,
                                  shard_file_problem)
from packfs.errors import FormatError
from packfs.write import Entry, pack_entries
from packfs.write.sets import append_shard, make_set
from tests.conftest import mounted, packfs_cli, time_limit
from tests.test_remote_source import moto, nginx, s3_env  # noqa: F401 (fixtures: real servers, stopped at the end)

MTIME = 1_700_000_000_000_000_000


def _tree(seed: int = 1) -> dict[str, bytes]:
    """A tree whose directories span shards: classes of files, a flat directory, deep paths."""
    rng = random.Random(seed)
    files = {}
    for klass in range(6):
        for number in range(7):
            files[f"train/n{klass:02d}/{number:03d}.jpg"] = rng.randbytes(rng.randrange(0, 300))
    for number in range(5):
        files[f"val/{number:03d}.jpg"] = rng.randbytes(50)
    files["a/b/c/d/deep.txt"] = b"deep"
    files["README"] = b"read me\n"
    return files


def _ordered(paths) -> list[str]:
    return sorted(paths, key=lambda p: depth_first_key(p.encode()))


def _pack_part(paths: list[str], files: dict[str, bytes], out: Path, extra: list[Entry] = ()) -> Path:
    entries = [Entry(p, files[p], mtime_ns=MTIME) for p in paths] + list(extra)
    pack_entries(entries, out)
    return out


def _shards(files: dict[str, bytes], directory: Path, parts: int, stem: str = "data") -> list[Path]:
    """The tree cut into ``parts`` contiguous runs of depth-first order, each packed alone."""
    order = _ordered(files)
    size = -(-len(order) // parts)
    outs = []
    for index in range(parts):
        chunk = order[index * size:(index + 1) * size]
        outs.append(_pack_part(chunk, files, directory / f"{stem}-{index:05d}-of-{parts:05d}.ffr"))
    return outs


@pytest.fixture
def files() -> dict[str, bytes]:
    return _tree()


@pytest.fixture
def shards(files, tmp_path) -> list[Path]:
    return _shards(files, tmp_path, 4)


@pytest.fixture
def manifest(shards, tmp_path) -> Path:
    out = tmp_path / "data.ffrset"
    make_set(str(out), [str(s) for s in shards])
    return out


def _walk(folder) -> list[tuple[str, list[str], list[str]]]:
    return list(folder.walk())


def test_a_set_is_the_tree_the_shards_came_from(files, shards, manifest, tmp_path) -> None:
    _pack_part(_ordered(files), files, tmp_path / "whole.ffr")
    with packfs.PackedFolder(tmp_path / "whole.ffr") as whole:
        expected_walk = _walk(whole)
        expected_info = {k: v for k, v in whole.info().items() if k in ("files", "dirs", "symlinks", "file_bytes")}
    for spec in (str(manifest), [str(s) for s in shards], str(tmp_path / "data-*-of-00004.ffr")):
        with packfs.PackedFolder(spec) as folder:
            assert isinstance(folder.archive, ShardSet)
            assert _walk(folder) == expected_walk  # merged listings, in name order
            for path, contents in files.items():
                assert folder.read(path) == contents
            assert sorted(folder) == sorted(files)
            assert folder.num_files() == len(files)
            assert folder.read_many(list(files)[::-1]) == [files[p] for p in list(files)[::-1]]
            assert folder.verify().ok
            assert {k: v for k, v in folder.info().items() if k in expected_info} == expected_info


def test_every_shard_stands_alone_for_packfs_and_ffrecord(shards) -> None:
    from packfs.ffrecord import FileReader

    for shard in shards:
        with Archive(shard) as archive:
            assert archive.verify().ok
        reader = FileReader(str(shard), check_data=True)
        assert reader.n > 0
        reader.read(list(range(reader.n)))
        reader.close()


def test_inodes_are_unique_and_directories_merged_once(files, manifest) -> None:
    with packfs.PackedFolder(manifest) as folder:
        archive = folder.archive
        seen: dict[int, str] = {}
        for dirpath, dirnames, filenames in folder.walk():
            for name in [*dirnames, *filenames]:
                path = f"{dirpath}/{name}" if dirpath else name
                inode = folder.stat(path).inode if hasattr(folder.stat(path), "inode") else archive.inode(
                    archive.lookup(path))
                assert inode not in seen, (path, seen.get(inode))
                seen[inode] = path
                entry = archive.lookup(path)
                assert archive.inode(entry) == archive.stat(entry).inode
                assert archive.path_of(entry) == path.encode()
                assert archive.find(path.encode()) == entry
        train = archive.lookup("train")
        assert len(set(archive.children(train))) == 6
        assert archive.stat(train).nlink == 2 + 6  # every class directory, whichever shard holds it
        assert archive.parent(archive.lookup("train/n03/000.jpg")) == archive.lookup("train/n03")
        assert archive.lookup_child(train, b"n05") == archive.lookup("train/n05")
        assert archive.lookup_child(train, b"n99") == -1


def test_a_path_in_two_archives_is_refused_naming_both(files, tmp_path) -> None:
    a = _pack_part(["train/n00/000.jpg", "train/n00/002.jpg"], files, tmp_path / "a.ffr")
    b = _pack_part(["train/n00/001.jpg", "train/n00/002.jpg"], files, tmp_path / "b.ffr")
    with pytest.raises(FormatError, match=r"train/n00/002.jpg.*a\.ffr.*b\.ffr|train/n00/002.jpg.*b\.ffr.*a\.ffr"):
        open_archive([str(a), str(b)])
    # A file in one and a directory in the other is a collision too.
    c = _pack_part(["x"], {"x": b"file"}, tmp_path / "c.ffr")
    d = _pack_part(["x/y"], {"x/y": b"under"}, tmp_path / "d.ffr")
    with pytest.raises(FormatError, match="'x'"):
        open_archive([str(c), str(d)])
    result = packfs_cli("ls", tmp_path / "?.ffr")
    assert result.returncode == 1 and result.stderr.startswith("Error: ") and "Traceback" not in result.stderr


def test_overlapping_ranges_without_collisions_merge_in_name_order(files, tmp_path) -> None:
    a = _pack_part(["train/n00/000.jpg", "train/n00/002.jpg", "train/n01/000.jpg"], files, tmp_path / "a.ffr")
    b = _pack_part(["train/n00/001.jpg", "train/n00/003.jpg"], files, tmp_path / "b.ffr")
    with open_archive([str(a), str(b)]) as archive:
        assert archive.layer_count == 2
        assert archive.directories_counted_twice() == 3  # the root, train, train/n00 in b
        entries, names, _ = archive.listing(archive.lookup("train/n00"))
        assert names == [b"000.jpg", b"001.jpg", b"002.jpg", b"003.jpg"]
        assert [archive.read(e) for e in entries] == [files[f"train/n00/{n}"] for n in
                                                      ("000.jpg", "001.jpg", "002.jpg", "003.jpg")]


def test_independent_archives_serve_as_one_tree(files, tmp_path) -> None:
    train = _pack_part([p for p in _ordered(files) if p.startswith("train/")], files, tmp_path / "train.ffr")
    val = _pack_part([p for p in _ordered(files) if p.startswith("val/")], files, tmp_path / "val.ffr")
    with packfs.PackedFolder([train, val]) as folder:
        assert folder.list("") == ["train", "val"]
        assert folder.read("val/003.jpg") == files["val/003.jpg"]


def test_symlinks_resolve_across_shards(files, tmp_path) -> None:
    a = _pack_part(["a/target.txt"], {"a/target.txt": b"there"}, tmp_path / "a.ffr")
    b = _pack_part([], {}, tmp_path / "b.ffr",
                   [Entry("b/link", kind="symlink", target="../a/target.txt"), Entry("b/dirlink", kind="symlink",
                                                                                      target="../a")])
    with packfs.PackedFolder([a, b]) as folder:
        assert folder.read("b/link") == b"there"
        assert folder.read("b/dirlink/target.txt") == b"there"
        assert folder.readlink("b/link") == "../a/target.txt"


def test_a_manifest_opens_no_shard_until_used_and_refuses_a_replaced_one(files, shards, manifest) -> None:
    with open_archive(str(manifest)) as archive:
        assert sum(shard.archive is not None for shard in archive._shards) == 0
        assert archive.entry_count == sum(Archive(s).entry_count for s in shards)
        archive.read_path("val/004.jpg")
        assert sum(shard.archive is not None for shard in archive._shards) <= 2
    # The last shard replaced by another archive: refused when it is first used.
    other = _pack_part(["val/000.jpg"], files, shards[-1].with_suffix(".tmp"))
    os.replace(other, shards[-1])
    with open_archive(str(manifest)) as archive:
        archive.read_path("train/n00/000.jpg")
        with pytest.raises(FormatError, match="replaced or rewritten"):
            archive.read_path("val/004.jpg")


@pytest.mark.parametrize("damage", ["crc", "version", "absolute", "dotdot", "not json", "no shards", "order"])
def test_hostile_manifests_are_refused(damage, shards, manifest) -> None:
    body = json.loads(manifest.read_bytes())
    if damage == "crc":
        body["shards"][0]["entries"] += 1
    elif damage == "version":
        body["packfs_shard_set"] = 99
    elif damage == "absolute":
        body["shards"][0]["file"] = "/etc/passwd"
    elif damage == "dotdot":
        body["shards"][0]["file"] = "../x.ffr"
    elif damage == "no shards":
        body["shards"] = []
    elif damage == "order":
        body["shards"][0]["first"], body["shards"][0]["last"] = body["shards"][0]["last"], body["shards"][0]["first"]
    if damage not in ("crc",):
        body.pop("crc")
        body["crc"] = zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    data = b"{nope" if damage == "not json" else json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    manifest.write_bytes(data)
    with pytest.raises(FormatError):
        open_archive(str(manifest))
    result = packfs_cli("ls", manifest)
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and result.stderr.startswith("Error: ")


def test_manifest_round_trip_and_names() -> None:
    records = [ShardRecord("d-0.ffr", 100, 7, 3, b"a/\xff", b"b"), ShardRecord("sub/d-1.ffr", 200, 8, 4, b"c", b"c")]
    assert parse_manifest(manifest_bytes(records), "m") == records
    for bad in ("", "/x", "../x", "a/../x", "a//x", "./x"):
        assert shard_file_problem(bad)
    with pytest.raises(ValueError):
        manifest_bytes([ShardRecord("../x", 1, 1, 1, b"a", b"a")])


def test_leaf_range_and_depth_first_order(files, tmp_path) -> None:
    assert sorted([b"a.txt", b"a/b", b"a"], key=depth_first_key) == [b"a", b"a/b", b"a.txt"]
    whole = _pack_part(_ordered(files), files, tmp_path / "w.ffr")
    with Archive(whole) as archive:
        assert leaf_range(archive) == (b"README", b"val/004.jpg")
    empty = tmp_path / "empty.ffr"
    pack_entries([], empty)
    with Archive(empty) as archive:
        assert leaf_range(archive) == (b"", b"")
    with open_archive([str(empty), str(whole)]) as archive:
        assert archive.read_path("README") == b"read me\n"


def test_append_grows_the_set_and_old_readers_keep_their_view(files, manifest, tmp_path) -> None:
    before = packfs.PackedFolder(manifest)
    new = tmp_path / "new"
    (new / "train" / "n00").mkdir(parents=True)  # into the middle of the tree: a second layer
    (new / "train" / "n00" / "zzz.jpg").write_bytes(b"appended")
    (new / "test").mkdir()
    (new / "test" / "t.jpg").write_bytes(b"test")
    result = packfs_cli("append", manifest, new)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "data-00004.ffr").exists()
    with packfs.PackedFolder(manifest) as after:
        assert after.read("train/n00/zzz.jpg") == b"appended"
        assert after.read("test/t.jpg") == b"test"
        assert after.list("train/n00")[-1] == "zzz.jpg"
        assert after.num_files() == len(files) + 2
    assert not before.exists("test/t.jpg")  # opened before: the set as it was
    assert before.read("val/000.jpg") == files["val/000.jpg"]
    before.close()
    # The same files again: refused, nothing changed, the would-be shard removed.
    listed = manifest.read_bytes()
    result = packfs_cli("append", manifest, new)
    assert result.returncode == 1 and "2 paths of it are in the set already" in result.stderr
    assert manifest.read_bytes() == listed
    assert not (tmp_path / "data-00005.ffr").exists()
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


@pytest.mark.parametrize("source", ["directory", "tar", "tar stream"])
def test_a_colliding_append_is_refused_before_packing_counting_the_collisions(files, manifest, tmp_path,
                                                                              source) -> None:
    """Issue 33: the set's paths, checked before the shard is packed (a tar stream, read
    once, when it is): exit 1, no summary, the collisions counted and the first named,
    nothing written, the manifest as it was."""
    new = tmp_path / "new"
    for path in _ordered(files):
        if path.startswith("train/"):
            (new / path).parent.mkdir(parents=True, exist_ok=True)
            (new / path).write_bytes(b"again")
    (new / "train" / "n00" / "new.jpg").write_bytes(b"new")  # new paths go nowhere either
    clashes = [p for p in _ordered(files) if p.startswith("train/")]
    if source != "directory":
        subprocess.run(["tar", "cf", str(tmp_path / "new.tar"), "-C", str(new), "--sort=name", "."], check=True)
    listed, before = manifest.read_bytes(), sorted(os.listdir(tmp_path))
    args = ["append", "--progress", manifest, new if source == "directory" else tmp_path / "new.tar"]
    if source == "tar stream":
        args[-1] = "-"
        result = subprocess.run([sys.executable, "-m", "packfs", *map(str, args)], capture_output=True, text=True,
                                stdin=open(tmp_path / "new.tar", "rb"), timeout=time_limit(60))
    else:
        result = packfs_cli(*args)
    assert result.returncode == 1
    errors = result.stderr.splitlines()
    assert not [line for line in errors if line.startswith(("packed", "appended"))]
    if source != "tar stream":  # a stream is packed first: its progress lines, then the refusal
        assert len(errors) == 1, result.stderr  # refused before packing: not one progress line
    assert errors[-1].startswith("Error: ") and f"{len(clashes)} paths of it are in the set already" in errors[-1]
    assert ", ".join(repr(p) for p in clashes[:5]) + f" and {len(clashes) - 5} more" in errors[-1]
    assert manifest.read_bytes() == listed
    assert sorted(os.listdir(tmp_path)) == before  # no shard, no temporary file


def test_append_shard_checks_the_paths_given_before_packing(files, manifest, tmp_path) -> None:
    """The library's half: with the new tree's paths, a collision is refused without
    calling the packer at all."""
    from packfs.errors import PackError
    from packfs.write.sets import tree_paths

    new = tmp_path / "new"
    (new / "val").mkdir(parents=True)
    (new / "val" / "000.jpg").write_bytes(b"again")
    (new / "README").mkdir()  # a directory where the set has a file
    (new / "README" / "inside.txt").write_bytes(b"inside")
    packed = []
    with pytest.raises(PackError, match=r"2 paths of it are in the set already: 'README', 'val/000.jpg' \("):
        append_shard(str(manifest), packed.append, paths=tree_paths(str(new), str(manifest)), source=str(new))
    assert packed == []


def test_concurrent_appends_each_land(manifest, tmp_path) -> None:
    errors = []

    def one(number: int) -> None:
        try:
            def pack_into(out: str) -> None:
                pack_entries([Entry(f"extra/{number}.txt", b"%d" % number)], out)
            append_shard(str(manifest), pack_into)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    with packfs.PackedFolder(manifest) as folder:
        assert folder.list("extra") == ["0.txt", "1.txt", "2.txt", "3.txt"]


def test_set_command_and_cli_reading_a_set(files, shards, tmp_path) -> None:
    out = tmp_path / "cli.ffrset"
    result = packfs_cli("set", out, *shards)
    assert result.returncode == 0, result.stderr
    assert packfs_cli("set", out, *shards).returncode == 1  # exists
    assert packfs_cli("ls", out, "train").stdout.split() == [f"n{k:02d}" for k in range(6)]
    cat = subprocess.run([sys.executable, "-m", "packfs", "cat", str(out), "val/001.jpg"], capture_output=True)
    assert cat.returncode == 0 and cat.stdout == files["val/001.jpg"]
    info = packfs_cli("info", out)
    assert info.returncode == 0 and "shard set of 4 archives" in info.stdout
    assert packfs_cli("verify", out).returncode == 0
    dest = tmp_path / "unpacked"
    assert packfs_cli("unpack", out, dest).returncode == 0
    for path, contents in files.items():
        assert (dest / path).read_bytes() == contents
    outside = tmp_path / "sub"
    outside.mkdir()
    result = packfs_cli("set", outside / "x.ffrset", shards[0])
    assert result.returncode == 1 and "relative" in result.stderr


def test_datasets_and_dataloader_workers_read_a_set(files, manifest) -> None:
    torch = pytest.importorskip("torch")
    from packfs.dataset import PackedFiles

    dataset = PackedFiles(manifest, "train/**/*.jpg")
    assert len(dataset) == 42
    assert sorted(dataset.path(i) for i in range(len(dataset))) == sorted(p for p in files if p.startswith("train/"))
    assert dataset[3] == files[dataset.path(3)]
    assert pickle.loads(pickle.dumps(dataset))[5] == dataset[5]
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=2, collate_fn=lambda batch: batch)
    seen = [item for batch in loader for item in batch]
    assert sorted(seen) == sorted(files[p] for p in files if p.startswith("train/"))


def test_fsspec_and_ffrecord_api_read_a_set(files, manifest) -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("packfs", fo=str(manifest))
    assert sorted(fs.ls("train", detail=False)) == [f"train/n{k:02d}" for k in range(6)]
    with fs.open("val/002.jpg", "rb") as handle:
        assert handle.read() == files["val/002.jpg"]
    from packfs.ffrecord import PackedFolder as FFRecordPackedFolder

    folder = FFRecordPackedFolder(str(manifest))
    assert folder.read_one("train/n01/003.jpg").tobytes() == files["train/n01/003.jpg"]
    assert set(folder.structure["train"]) == {f"n{k:02d}" for k in range(6)}
    record = folder.structure["train"]["n04"]["002.jpg"]  # numbered over the shards' records, as FileReader's
    assert bytes(folder.reader.read_one(record)) == files["train/n04/002.jpg"]


@pytest.mark.fuse
def test_a_set_mounts_as_one_tree_and_append_under_a_live_mount(files, manifest, tmp_path) -> None:
    with mounted(manifest, tmp_path / "mnt") as root:
        walked = {}
        for dirpath, _, filenames in os.walk(root):
            for name in filenames:
                path = os.path.join(dirpath, name)
                walked[os.path.relpath(path, root)] = Path(path).read_bytes()
        assert walked == files
        inodes = [os.lstat(os.path.join(dp, n)).st_ino for dp, dns, fns in os.walk(root) for n in dns + fns]
        assert len(inodes) == len(set(inodes))
        assert os.stat(root / "train").st_nlink == 8
        # Appended while mounted: the mount keeps the set it opened; a new one sees both.
        new = tmp_path / "more"
        (new / "extra").mkdir(parents=True)
        (new / "extra" / "x.bin").write_bytes(b"x")
        assert packfs_cli("append", manifest, new).returncode == 0
        assert not (root / "extra").exists()
        assert (root / "val" / "000.jpg").read_bytes() == files["val/000.jpg"]
        with mounted(manifest, tmp_path / "mnt2") as second:
            assert (second / "extra" / "x.bin").read_bytes() == b"x"
            assert stat_module.S_ISDIR(os.stat(second / "train" / "n05").st_mode)


@pytest.mark.parametrize("where", ["http", "s3"])
def test_a_set_at_a_url_opens_with_the_manifest_alone(files, shards, manifest, request, where) -> None:
    if where == "http":
        server = request.getfixturevalue("nginx")
        for path in [*shards, manifest]:
            server.put(path.name, path.read_bytes())
        server.clear_log()
        url = server.url(manifest.name)
    else:
        request.getfixturevalue("s3_env")
        server = request.getfixturevalue("moto")
        client = server.client()
        for path in [*shards, manifest]:
            client.put_object(Bucket="bucket", Key=f"sets/{path.name}", Body=path.read_bytes())
        url = f"s3://bucket/sets/{manifest.name}"
    with packfs.PackedFolder(url, cache_dir=False) as folder:
        if where == "http":
            opened = [r for r in server.requests(1) if r.method == "GET"]
            # The manifest, then shard 0 (its footer: PackedFolder reports the version).
            assert [r.path.rsplit("/", 1)[-1] for r in opened][0] == manifest.name
            assert len({r.path for r in opened}) <= 2
        for path in random.Random(5).sample(sorted(files), 12):
            assert folder.read(path) == files[path]
        assert folder.list("train") == [f"n{k:02d}" for k in range(6)]
    result = packfs_cli("cat", url, "README", "--cache-dir", "off") if where == "http" else None
    if result is not None:
        assert result.returncode == 0 and result.stdout == "read me\n"


def test_a_killed_writers_manifest_temporary_goes_with_the_next_append(manifest, tmp_path) -> None:
    from packfs.write.container import TEMP_MARKER

    dead = 2 ** 22 + 12345  # above pid_max's default: no such process
    leftover = tmp_path / f".data{TEMP_MARKER}{dead}-0badc0de-data.ffrset"
    leftover.write_bytes(b"half a manifest")
    new = tmp_path / "more"
    new.mkdir()
    (new / "z.txt").write_bytes(b"z")
    assert packfs_cli("append", manifest, new).returncode == 0
    assert not leftover.exists()
    assert not [p for p in os.listdir(tmp_path) if TEMP_MARKER in p]
