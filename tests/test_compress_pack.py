"""Writing format 1.5 (format section 4f): pack --compress, --dictionary, --dedup,
--sparse.  Archives are decoded by tests/spec15.py, an independent reading of the
spec, and every file compared with its source."""

from __future__ import annotations

import io
import json
import os
import random
import tarfile
import zipfile
import zlib
from pathlib import Path

import pytest

from packfs.cli import main
from packfs.errors import PackError
from packfs.format import CODEC_DICTIONARY
from packfs.write import pack_entries, pack_folder
from packfs.write.encode import FRAME_SIZE, Compression, parse_compress

from .conftest import cli_runner
from .spec15 import Spec15

JPEG = b"\xff\xd8\xff\xe0" + os.urandom(20000)


def _text(seed: int, words: int) -> bytes:
    rng = random.Random(seed)
    return " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "lorem", "ipsum", "dolor"])
                    for _ in range(words)).encode()


def _json(i: int, words: int = 150) -> bytes:
    rng = random.Random(i)
    return json.dumps({
        "id": i, "user": f"user{i}", "score": rng.random(),
        "tags": rng.sample(["red", "green", "blue", "cyan", "magenta", "yellow", "black"], 3),
        "created": f"2026-{rng.randint(1, 12):02}-{rng.randint(1, 28):02}T{rng.randint(0, 23):02}:00:00Z",
        "address": {"city": rng.choice(["Paris", "Berlin", "Lima", "Osaka"]), "zip": str(rng.randint(10000, 99999))},
        "text": _text(i, words).decode()}).encode()


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "json").mkdir(parents=True)
    for i in range(200):
        (src / "json" / f"{i:04}.json").write_bytes(_json(i))
    (src / "big.txt").write_bytes(b"".join(b"line %d of a large text file\n" % i for i in range(150_000)))
    (src / "random.bin").write_bytes(os.urandom(2 * FRAME_SIZE + 5))
    (src / "photo.jpg").write_bytes(JPEG)
    (src / "empty").write_bytes(b"")
    (src / "tiny").write_bytes(b"abc")
    with open(src / "sparse.img", "wb") as f:
        f.truncate(64 << 20)  # holes; 1 GiB wrote a GiB per unsparse pack or tar
        f.seek(7 << 20)
        f.write(b"data" * 10_000)
    os.symlink("big.txt", src / "link")
    return src


def _source_files(src: Path) -> dict[bytes, bytes]:
    found = {}
    for directory, _, names in os.walk(src):
        for name in names:
            path = Path(directory) / name
            if not path.is_symlink():
                found[os.fsencode(path.relative_to(src))] = path.read_bytes()
    return found


def _check_round_trip(archive: Path, src: Path) -> dict[bytes, tuple[bytes, str, int]]:
    files = Spec15(archive).files()
    expected = _source_files(src)
    assert set(files) == set(expected)
    for path, data in expected.items():
        assert files[path][0] == data, path
    return files


def test_uncompressed_packs_are_unchanged(mixed: Path, tmp_path: Path) -> None:
    plain = pack_folder(mixed, tmp_path / "a.ffr", sparse=False)
    again = pack_folder(mixed, tmp_path / "b.ffr", compress="none")
    assert (tmp_path / "a.ffr").read_bytes() == (tmp_path / "b.ffr").read_bytes()
    archive = Spec15(tmp_path / "a.ffr")
    assert (archive.footer.version_minor, archive.footer.flags) == (4, 0)
    assert plain.deduplicated == again.deduplicated == 0


def test_every_codec_round_trips(mixed: Path, tmp_path: Path) -> None:
    out = tmp_path / "c.ffr"
    pack_folder(mixed, out, compress="zstd", dictionary="auto")
    archive = Spec15(out)
    assert (archive.footer.version_minor, archive.footer.flags, archive.footer.section_count) == (5, 1, 25)
    files = _check_round_trip(out, mixed)
    assert files[b"big.txt"][1] == "frames"
    assert files[b"random.bin"][1] == "stored"  # does not compress: stored as it is
    assert files[b"photo.jpg"][1] == "stored"  # a JPEG is not tried
    assert files[b"sparse.img"][1] == "sparse"
    assert files[b"empty"][1] == files[b"tiny"][1] == "stored"
    assert {files[path][1] for path in files if path.startswith(b"json/")} == {"zstd+dictionary"}
    assert out.stat().st_size < 3 << 20  # 64 MiB of holes, 4 MiB of text, 2 MiB of noise
    dictionaries = [r for r in range(archive.footer.data_records) if archive.row(r)[0] == CODEC_DICTIONARY]
    assert len(dictionaries) == 1


def test_compression_without_dictionary_and_levels(mixed: Path, tmp_path: Path) -> None:
    fast, best = tmp_path / "1.ffr", tmp_path / "19.ffr"
    pack_folder(mixed, fast, compress="zstd:1")
    pack_folder(mixed, best, compress="zstd:19")
    for out in (fast, best):
        files = _check_round_trip(out, mixed)
        assert {files[path][1] for path in files if path.startswith(b"json/")} == {"zstd"}
    assert best.stat().st_size < fast.stat().st_size


def test_dictionaries_pay_on_small_json(tmp_path: Path) -> None:
    entries = [(f"d/{i:05}.json", _json(i, 20)) for i in range(1500)]
    sizes = {}
    for name, dictionary in (("plain", None), ("dict", "auto")):
        from packfs.write import Entry

        out = tmp_path / f"{name}.ffr"
        pack_entries([Entry(path, data) for path, data in entries], out, compress="zstd", dictionary=dictionary)
        archive = Spec15(out)
        files = archive.files()
        assert all(files[path.encode()][0] == data for path, data in entries)
        sizes[name] = sum(archive.offsets[r + 1] - archive.offsets[r] for r in range(archive.footer.data_records))
    assert sizes["dict"] < 0.6 * sizes["plain"]  # the dictionary's own bytes included


def test_dedup_shares_records_and_keeps_each_names_metadata(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    small, large = _text(1, 2000), os.urandom(3 * FRAME_SIZE)
    compressible_large = _text(2, 600_000)
    for name, data, mode in (("a", small, 0o644), ("b", small, 0o600), ("c", large, 0o644), ("d", large, 0o755),
                             ("e", compressible_large, 0o644), ("f", compressible_large, 0o640),
                             ("g", small + b"!", 0o644)):
        (src / name).write_bytes(data)
        os.chmod(src / name, mode)
    os.utime(src / "b", ns=(1, 123_456_789))
    stats = pack_folder(src, tmp_path / "d.ffr", compress="zstd")
    assert stats.deduplicated == 3
    archive = Spec15(tmp_path / "d.ffr")
    files = _check_round_trip(tmp_path / "d.ffr", src)
    assert files[b"a"][2] == files[b"b"][2] and files[b"c"][2] == files[b"d"][2] and files[b"e"][2] == files[b"f"][2]
    assert files[b"g"][2] != files[b"a"][2]
    assert files[b"e"][1] == "frames" and files[b"c"][1] == "stored"
    from packfs.format import SECTIONS

    columns = {name: __import__("numpy").frombuffer(archive.section(k), kind) for k, (name, kind) in enumerate(SECTIONS)}
    by_name = {archive.path(e): e for e in range(1, archive.footer.entry_count)}
    a, b = by_name[b"a"], by_name[b"b"]
    assert columns["mode"][a] & 0o777 == 0o644 and columns["mode"][b] & 0o777 == 0o600
    assert columns["mtime_ns"][b] == 123_456_789
    assert columns["nlink"][a] == columns["nlink"][b] == 1 and columns["first_link"][b] == 0  # not hard links
    without = pack_folder(src, tmp_path / "n.ffr", compress="zstd", dedup=False)
    assert without.deduplicated == 0
    assert len({f[2] for f in Spec15(tmp_path / "n.ffr").files().values()}) == 7


def _crc_collision(length: int) -> tuple[bytes, bytes]:
    """Two different byte strings of ``length`` bytes with one CRC-32 (a birthday search)."""
    rng = random.Random(27)
    seen: dict[int, bytes] = {}
    while True:
        candidate = rng.randbytes(8) if hasattr(rng, "randbytes") else bytes(rng.getrandbits(8) for _ in range(8))
        crc = zlib.crc32(candidate)
        other = seen.get(crc)
        if other is not None and other != candidate:
            prefix = b"shared prefix " * ((length - 8) // 14 + 1)
            return prefix[: length - 8] + other, prefix[: length - 8] + candidate
        seen[crc] = candidate


def test_dedup_confirms_bytes_when_size_and_crc_agree(tmp_path: Path) -> None:
    first, second = _crc_collision(4096)
    assert first != second and zlib.crc32(first) == zlib.crc32(second) and len(first) == len(second)
    from packfs.write import Entry

    for compress in ("zstd", None):
        out = tmp_path / f"collide-{compress}.ffr"
        stats = pack_entries([Entry("one", first), Entry("two", second), Entry("three", first)], out,
                             compress=compress, dedup=True)
        files = Spec15(out).files()
        assert files[b"one"][0] == first and files[b"two"][0] == second and files[b"three"][0] == first
        assert files[b"one"][2] != files[b"two"][2] and files[b"one"][2] == files[b"three"][2]
        assert stats.deduplicated == 1


def test_sparse_files(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "disk.img", "wb") as f:
        f.truncate(100 << 30)  # 100 GiB, almost all hole
        for at in (0, 5 << 30, (100 << 30) - 4096):
            f.seek(at)
            f.write(os.urandom(4096))
    if os.stat(src / "disk.img").st_blocks * 512 > 1 << 20:
        pytest.skip(f"{tmp_path} does not keep holes")
    out = tmp_path / "s.ffr"
    pack_folder(src, out, sparse=True)
    assert out.stat().st_size < 1 << 20
    archive = Spec15(out)
    (entry,) = [e for e in range(1, archive.footer.entry_count) if archive.path(e) == b"disk.img"]
    record = int(archive.record[entry])
    assert int(archive.size[entry]) == 100 << 30
    from packfs.format import EXTENT, EXTENT_COUNT

    codec, _, _, _, aux = archive.row(record)
    (count,) = EXTENT_COUNT.unpack_from(archive.codec_data, aux)
    extents = [EXTENT.unpack_from(archive.codec_data, aux + 8 + 16 * k) for k in range(count)]
    with open(src / "disk.img", "rb") as f:
        stored = archive.stored(record)
        at = 0
        for offset, length in extents:
            f.seek(offset)
            assert f.read(length) == stored[at: at + length]
            at += length
    assert sum(length for _, length in extents) >= 3 * 4096 and at == len(stored)


def test_tar_zip_and_convert(mixed: Path, tmp_path: Path) -> None:
    tar_path = tmp_path / "t.tar"
    with tarfile.open(tar_path, "w") as tar:
        tar.add(mixed, arcname=".")
    zip_path = tmp_path / "z.zip"
    with zipfile.ZipFile(zip_path, "w") as archive:
        for path, data in _source_files(mixed).items():
            if path != b"sparse.img":
                archive.writestr(os.fsdecode(path), data)
    from packfs.write import convert, pack_archive

    for source in (tar_path, zip_path):
        for dictionary in (None, "auto"):
            out = tmp_path / f"{source.stem}-{dictionary}.ffr"
            pack_archive(str(source), out, compress="zstd", dictionary=dictionary)
            files = Spec15(out).files()
            for path, data in _source_files(mixed).items():
                if source == tar_path or path != b"sparse.img":
                    assert files[path][0] == data
    plain = tmp_path / "plain.ffr"
    pack_folder(mixed, plain, sparse=False)
    squeezed = tmp_path / "squeezed.ffr"
    convert(plain, squeezed, compress="zstd:3")
    _check_round_trip(squeezed, mixed)
    assert plain.stat().st_size > 70 << 20  # the holes written out
    assert squeezed.stat().st_size < 3 << 20  # holes and text gone; the 2 MiB of noise stays


def test_shard_sets_compress_each_shard(mixed: Path, tmp_path: Path) -> None:
    from packfs.write.shards import pack_shards

    stats = pack_shards(mixed, tmp_path / "set.ffr", shards=3, codecs={"compress": "zstd", "dictionary": "auto"})
    found: dict[bytes, bytes] = {}
    for record in stats.shards:
        archive = Spec15(tmp_path / record.file)
        assert archive.footer.flags == 1
        found.update({path: data for path, (data, _, _) in archive.files().items()})
    assert found == _source_files(mixed)


def test_cli_options(mixed: Path, tmp_path: Path) -> None:
    runner = cli_runner()
    result = runner.invoke(main, ["pack", "--compress", "zstd:19", "--dictionary", "auto", str(mixed),
                                      str(tmp_path / "cli.ffr")])
    assert result.exit_code == 0, result.output
    _check_round_trip(tmp_path / "cli.ffr", mixed)
    result = runner.invoke(main, ["pack", "--dictionary", "auto", str(mixed), str(tmp_path / "x.ffr")])
    assert result.exit_code == 2 and "needs --compress" in result.stderr
    result = runner.invoke(main, ["pack", "--compress", "lz4", str(mixed), str(tmp_path / "x.ffr")])
    assert result.exit_code == 2 and "unknown compression 'lz4'" in result.stderr
    result = runner.invoke(main, ["pack", "--compress", "zstd:23", str(mixed), str(tmp_path / "x.ffr")])
    assert result.exit_code == 2
    assert not (tmp_path / "x.ffr").exists()


def test_options_read_in_one_place() -> None:
    assert parse_compress("zstd") == 9 and parse_compress("zstd:1") == 1 and parse_compress(None) is None
    assert Compression.from_options("zstd") == Compression(9, False, True, True)
    assert Compression.from_options(None, dedup=True) == Compression(None, False, True, False)
    with pytest.raises(ValueError):
        Compression.from_options(None, "auto")
    with pytest.raises(ValueError):
        parse_compress("gzip")


def test_streams_with_unknown_count_are_spooled_and_sampled(tmp_path: Path) -> None:
    from packfs.write import Entry

    entries = (Entry(f"s/{i}.json", io.BytesIO(_json(i))) for i in range(300))
    out = tmp_path / "spooled.ffr"
    pack_entries(entries, out, compress="zstd", dictionary="auto")
    files = Spec15(out).files()
    assert all(files[f"s/{i}.json".encode()][0] == _json(i) for i in range(300))
    assert {codec for _, codec, _ in files.values()} == {"zstd+dictionary"}


def test_jobs_give_the_same_bytes(mixed: Path, tmp_path: Path) -> None:
    """-j N with codecs: threads read and encode ahead, and a large file's frames are
    compressed several at once; the archive is the same for every N."""
    (mixed / "large.txt").write_bytes(_text(5, 3_000_000))  # 20 MiB: frames in batches
    for name in ("a", "b", "c"):
        (mixed / "json" / f"dup-{name}.json").write_bytes(_json(1))
    outputs = []
    for jobs in (1, 2, 3):
        out = tmp_path / f"j{jobs}.ffr"
        stats = pack_folder(mixed, out, compress="zstd:3", dictionary="auto", jobs=jobs)
        assert stats.deduplicated == 3  # json/0001.json and its three copies
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]
    _check_round_trip(tmp_path / "j2.ffr", mixed)


def test_verify_reads_the_archive_back_before_it_is_published(tmp_path: Path, monkeypatch) -> None:
    """--verify: a file that changed after it was packed (here: just before the
    rename) fails the pack, and nothing is left; an honest pack passes."""
    from packfs.write import container

    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "a.txt").write_bytes(_text(1, 500))
    (src / "b.json").write_bytes(_json(2))
    os.symlink("d/a.txt", src / "link")
    for compress in (None, "zstd"):
        pack_folder(src, tmp_path / f"ok-{compress}.ffr", compress=compress, verify=True)
        assert Spec15(tmp_path / f"ok-{compress}.ffr").files()[b"b.json"][0] == _json(2)
    original = container.ContainerWriter.commit

    def commit_after_a_change(self, before_publish=None):
        (src / "d" / "a.txt").write_bytes(_text(9, 500))
        return original(self, before_publish)

    monkeypatch.setattr(container.ContainerWriter, "commit", commit_after_a_change)
    with pytest.raises(PackError, match=r"failed --verify: .*a\.txt.* differs"):
        pack_folder(src, tmp_path / "changed.ffr", verify=True)
    assert sorted(os.listdir(tmp_path)) == ["ok-None.ffr", "ok-zstd.ffr", "src"]


def test_ffrecords_readers_read_every_record_of_a_compressed_archive(mixed: Path, tmp_path: Path) -> None:
    """FFRecord's container is unchanged in 1.5: its FileReader (packfs.ffrecord's, with
    its checks on) and a RecordReader read every record, CRCs checked, and a file's
    record is its stored (compressed) bytes."""
    import numpy as np

    from packfs import RecordReader
    from packfs.ffrecord import FileReader

    out = tmp_path / "c.ffr"
    pack_folder(mixed, out, compress="zstd", dictionary="auto")
    archive = Spec15(out)
    n = len(archive.offsets)
    reader = FileReader(str(out), check_data=True)
    assert reader.n == n
    records = reader.read(list(range(n)))
    with RecordReader(out) as plain:
        assert [bytes(r) for r in records] == plain[:]
    for r in range(n):
        assert bytes(records[r]) == archive.data[archive.offsets[r]: archive.offsets[r + 1] if r + 1 < n else None]
        assert zlib.crc32(bytes(records[r])) == archive.crcs[r]
    (entry,) = [e for e in range(1, archive.footer.entry_count) if archive.path(e) == b"big.txt"]
    stored = np.asarray(records[int(archive.record[entry])]).tobytes()
    assert stored == archive.stored(int(archive.record[entry])) and len(stored) < int(archive.size[entry]) // 10
    reader.close()
