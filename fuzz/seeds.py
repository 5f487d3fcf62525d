"""The seed corpus of the compiled daemon's fuzzer (fuzz/lowlevel_fuzz.c), made from the
test suite's archives:

    python fuzz/seeds.py DIR      # make fuzz-c does this into fuzz/build/seeds

- the fuzzer's own seed (tests.fuzz.build_seed: every kind of entry, a hard link,
  extended attributes, a file over 1 MiB with piece CRCs), two files over 1 MiB,
  and a small one without the large files (most of the fuzzing happens on small
  inputs: they run fastest);
- the small one as format 1.2 (no attributes) and 1.1 (no piece CRCs);
- damaged copies: a small file's record and the large file's second piece, each
  failing its CRC (the daemon answers EIO there and serves the rest);
- the hostile archives of tests/hostile.py (records aliasing each other or running
  over the table), tests/deep_tables.py's shapes (a chain of directories, many
  long-named ones, a symlink target over 4,095 bytes), a file whose attribute names
  take more than 64 KiB (packfs.core and the daemon refuse them), a table section changed with
  every CRC recomputed (tests.fuzz.mutate's "hostile" kind, a few seeds);
- format 1.4 (what packfs writes; its footer's page plan 0: the daemon checks its
  header and table page by page, every page CRC right) with other page plans
  (fuzz/daemon.h: page_geometry): pages with a wrong CRC (the small seed's, and one
  whose names section spans two 64 KiB pages), larger pages, a hostile geometry of each
  kind tree_init refuses, and none at all;
- format 1.5's codecs (section 4f; tests/codec_archives.py): a small archive with every
  codec (a zstd file, two with a dictionary, zstd frames, a sparse file, a record shared
  by two names, a hard link to a compressed file), what the packer writes with
  ``compress="zstd", dictionary="auto", dedup=True, sparse=True``, hostile variants (a
  frame's stored CRC wrong, a frame that decodes to more than it says, one that decodes
  to other bytes than its decoded CRC's, a decompression
  bomb, an extent past the file's end, a dictionary's row not a dictionary's), and a
  page plan whose wrong page is codec_data's;
- FFRecord's reference vectors (tests/vectors/ffrecord; the daemon never serves them,
  the fuzzer's mutations may make something of them) and packed_folder.ffr converted.

Each seed is named for what it is; the same run always makes the same files.
"""

from __future__ import annotations

import argparse
import random
import shutil
import struct
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import packfs  # noqa: E402
from packfs.format import PIECE_SECTIONS, PIECE_SIZE, SECTIONS, XATTR  # noqa: E402
from tests.conftest import as_version_1_1, damaged_copy, read_records, write_records  # noqa: E402
from tests.deep_tables import chain_archive, long_target_archive, realigned, wide_long_names_archive  # noqa: E402
from tests.fuzz import SEED_XATTRS, _records, build_seed, mutate  # noqa: E402
from tests.codec_archives import Codec, Layout, codec_archive, train_dictionary  # noqa: E402
from tests.hostile import all_hostile  # noqa: E402

VECTORS = REPO / "tests" / "vectors" / "ffrecord"


def small_seed(path: Path, xattrs: bool = True) -> Path:
    """build_seed's tree without its two large files (70 KB and 2 MiB)."""
    files = {
        "empty.txt": b"",
        "hello.txt": b"hello world\n",
        "a/b/deep.bin": bytes(range(256)) * 2,
        "a/b/c/tiny": b"x",
        "names/\u00e9t\u00e9.txt": "\u00fcn\u00efc\u00f6d\u00e9".encode(),
        "names/bytes-\udcff.bin": b"\x00\x01\x02",
    }
    entries = [packfs.Entry(p, c, xattrs=SEED_XATTRS.get(p) if xattrs else None) for p, c in files.items()]
    entries += [
        packfs.Entry("a", kind="dir", xattrs=SEED_XATTRS["a"] if xattrs else None),
        packfs.Entry("empty_dir", kind="dir"),
        packfs.Entry("link", kind="symlink", target="hello.txt"),
        packfs.Entry("a/up", kind="symlink", target="../hello.txt"),
        packfs.Entry("a/absolute", kind="symlink", target="/etc/passwd"),
        packfs.Entry("a/hard", kind="hardlink", target="hello.txt"),
    ]
    packfs.pack_entries(entries, path)
    return path


def long_xattr_list(path: Path, names: int = 260) -> Path:
    """A file whose attribute names take more than Linux's 65,536 bytes (``names`` of 255
    bytes; the packer refuses that, format section 4c): its list, xattr_start and the
    padding records rewritten, every CRC recomputed."""
    packfs.pack_entries([packfs.Entry("f", b"x", xattrs={"user.a": b"1"})], path)
    records = read_records(path)
    data_records = int.from_bytes(records[-1][24:32], "little")
    attributes = [(b"user." + b"%03d" % i + b"n" * 247, b"v") for i in range(names)]
    listed = b"".join(XATTR.pack(len(name), len(value)) + name + value for name, value in attributes)
    first = len(SECTIONS) + len(PIECE_SECTIONS)  # xattr_entry, xattr_start, xattr_data
    records[data_records + 2 * (first + 1) + 1] = struct.pack("<QQ", 0, len(listed))
    records[data_records + 2 * (first + 2) + 1] = listed
    path.unlink()
    return write_records(path, realigned(records, data_records))


def two_large_files(path: Path) -> Path:
    """Two files just over 1 MiB (two records with piece CRCs: piece_start's inner
    items matter), and a small one."""
    contents = random.Random(3).randbytes(2 * PIECE_SIZE + 5100)
    packfs.pack_entries([packfs.Entry("one.bin", contents[:PIECE_SIZE + 100]),
                         packfs.Entry("two.bin", contents[PIECE_SIZE + 100:]), packfs.Entry("small", b"s")], path)
    return path


# The page plans of fuzz/daemon.h's page_geometry (the footer's last 8 bytes, little-endian).
PAGE_PLANS = {
    "larger-pages": 0x0200,  # 256 KiB pages
    "wrong-page-1": 0x01_0000,  # the header's first page of record CRCs
    "wrong-pages-3-7-12": 0x0D_08_04_0000,
    "wrong-page-size-column": 0x08_0000,  # page 7: section 5, the sizes a listing answers
    "no-page-checks": 0x07,
    **{f"hostile-geometry-{kind}": 0x06 | kind << 40 | 0x03 << 48 for kind in range(7)},
}


def with_page_plan(source: Path, target: Path, plan: int) -> Path:
    """A copy of ``source`` whose footer's last 8 bytes (reserved) hold ``plan``."""
    data = bytearray(source.read_bytes())
    data[-8:] = plan.to_bytes(8, "little")
    target.write_bytes(bytes(data))
    return target


def two_page_names(path: Path, files: int = 400) -> Path:
    """A 1.4 archive whose names section (200-byte names) is over 64 KiB: two pages."""
    packfs.pack_entries([packfs.Entry(f"{i:03d}-" + "n" * 196, b"%d" % i) for i in range(files)], path)
    return path


_CODEC_SAMPLES = [b'{"id": %d, "name": "%s", "tags": ["a", "b"]}\n' % (i, b"n" * (i % 9)) for i in range(200)]


def _codec_files() -> dict[str, bytes]:
    rng = random.Random(15)
    sparse = bytearray(200_000)
    sparse[4096:8192] = rng.randbytes(4096)
    sparse[150_000:150_100] = b"s" * 100
    return {
        "small.txt": b"hello, compressed world\n" * 20,
        "frames.txt": b"".join(b"line %d\n" % rng.randrange(1000) for _ in range(20_000))[: 3 * 65536 - 100],
        "dict/a.json": b"".join(_CODEC_SAMPLES[10:14]),
        "dict/b.json": b"".join(_CODEC_SAMPLES[40:42]),
        "sparse.bin": bytes(sparse),
        "plain": b"stored",
        "same/one": b"shared contents\n" * 30,
        "same/two": b"shared contents\n" * 30,
    }


_CODEC_CODECS = {
    "small.txt": Codec("zstd"),
    "frames.txt": Codec("frames", frame_log2=16),
    "dict/a.json": Codec("zstd", dictionary="json"),
    "dict/b.json": Codec("zstd", dictionary="json"),
    "sparse.bin": Codec("sparse"),
    "same/one": Codec("zstd"),
}


def codec_seed(path: Path, tamper=None, codecs: dict[str, Codec] | None = None) -> Path:
    """A small 1.5 archive with every codec (tests/codec_archives.py), ``tamper`` as there."""
    files = _codec_files()
    entries = [packfs.Entry(name, data, mode=0o600 if name == "same/two" else 0o644) for name, data in files.items()]
    entries += [packfs.Entry("link", kind="symlink", target="small.txt"),
                packfs.Entry("hard", kind="hardlink", target="small.txt")]
    return codec_archive(path, entries, codecs or _CODEC_CODECS,
                         dictionaries={"json": train_dictionary(_CODEC_SAMPLES, 1024)},
                         shared={"same/two": "same/one"}, tamper=tamper)


def _frame_crc_wrong(layout: Layout) -> None:
    layout.codec_data[layout.aux_of["frames.txt"] + 16 + 8] ^= 1


def _bomb(layout: Layout) -> None:
    import zstandard

    layout.data[layout.record_of["small.txt"]] = zstandard.ZstdCompressor().compress(bytes(4 << 20))


def _extent_past_end(layout: Layout) -> None:
    struct.pack_into("<Q", layout.codec_data, layout.aux_of["sparse.bin"] + 8 + 16, 199_990)


def _dictionary_row_stored(layout: Layout) -> None:
    layout.record_codec[16 * layout.dictionary_record["json"]] = 0


def packer_codecs(path: Path) -> Path:
    """What pack writes with every codec on (a dictionary trained from the small files)."""
    rng = random.Random(4)
    entries = [packfs.Entry(f"docs/{i}.json", _CODEC_SAMPLES[i] * (1 + i % 3)) for i in range(120)]
    entries += [packfs.Entry("big.txt", b"".join(b"row %d\n" % rng.randrange(50) for _ in range(200_000))),
                packfs.Entry("copy1", b"dup " * 500), packfs.Entry("copy2", b"dup " * 500)]
    packfs.pack_entries(entries, path, compress="zstd:1", dictionary="auto", dedup=True)
    return path


def make_seeds(out: Path) -> list[Path]:
    """Write the seeds into ``out`` (created); returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        build_seed(out / "seed-full.ffr")
        two_large_files(out / "two-large-files.ffr")
        small = small_seed(out / "seed-small.ffr")
        small_seed(out / "seed-small-1.2.ffr", xattrs=False)
        as_version_1_1(out / "seed-small-1.2.ffr", out / "seed-small-1.1.ffr")
        damaged_copy(small, out / "damaged-small-file.ffr", b"hello.txt", at=3)
        damaged_copy(out / "seed-full.ffr", out / "damaged-second-piece.ffr", b"pieces.bin", at=PIECE_SIZE + 7)
        for name, path in all_hostile(work, files=6).items():
            shutil.copyfile(path, out / f"hostile-{name}.ffr")
        chain_archive(out / "deep-chain.ffr", depth=40, name_length=3)
        wide_long_names_archive(out / "long-names.ffr", directories=12, name_length=200)
        long_target_archive(out / "long-target.ffr", b"d/.." * 1100 + b"/d/x")
        long_xattr_list(out / "long-xattr-list.ffr")
        original = small.read_bytes()
        records, data_records = _records(small)
        for seed in range(6):
            damaged = mutate(original, records, data_records, random.Random(seed), "hostile")
            (out / f"hostile-section-{seed}.ffr").write_bytes(damaged)
        for name, plan in PAGE_PLANS.items():
            with_page_plan(small, out / f"pages-{name}.ffr", plan)
        names = two_page_names(work / "two-page-names.ffr")
        with_page_plan(names, out / "pages-two-page-names.ffr", 0)
        with_page_plan(names, out / "pages-two-page-names-wrong-second.ffr", 0x10_0000)  # page 15
        codecs = codec_seed(out / "codecs-small.ffr")
        codec_seed(out / "codecs-frame-crc-wrong.ffr", _frame_crc_wrong)
        codec_seed(out / "codecs-bomb.ffr", _bomb)
        codec_seed(out / "codecs-extent-past-end.ffr", _extent_past_end)
        codec_seed(out / "codecs-dictionary-row-stored.ffr", _dictionary_row_stored)
        longer = dict(_CODEC_CODECS)
        longer["frames.txt"] = Codec("frames", frame_log2=16, frame_override={1: b"x" * 65537})
        codec_seed(out / "codecs-frame-longer.ffr", codecs=longer)
        other = dict(_CODEC_CODECS)  # frame 1 decodes to its size, but not to its decoded_crc's bytes
        other["frames.txt"] = Codec("frames", frame_log2=16, frame_override={1: b"o" * 65536})
        codec_seed(out / "codecs-frame-other-bytes.ffr", codecs=other)
        packer_codecs(out / "codecs-packer.ffr")
        with packfs.core.Archive(codecs) as opened:
            pages = len(opened.page_checks[2]) // 4
        with_page_plan(codecs, out / "pages-codecs-wrong-codec-data.ffr", pages << 16)  # the last page
        for vector in sorted(VECTORS.glob("*.ffr")):
            shutil.copyfile(vector, out / f"ffrecord-{vector.name}")
        packfs.convert(VECTORS / "packed_folder.ffr", out / "converted-packed-folder.ffr")
    return sorted(out.glob("*.ffr"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    seeds = make_seeds(args.out)
    print(f"{len(seeds)} seeds in {args.out} ({sum(p.stat().st_size for p in seeds):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
