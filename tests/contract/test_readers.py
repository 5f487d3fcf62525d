"""The reader contract (tests/contract/base.py) run over every reader: an Archive on a
local file, a one-shard and a two-layer ShardSet, an Archive at an http:// URL served
by nginx on loopback, and the compiled reader (a Tree, and a Forest for a set), each
over the tree stored as it is and through format 1.5's codecs."""

from __future__ import annotations

from packfs.core import Archive, ArchiveReader, ShardSet
from packfs.format import CODEC_FRAMES, CODEC_SPARSE, CODEC_STORED, CODEC_ZSTD
from tests.contract.base import ReaderContract
from tests.contract.readers import ReaderKind


class TestReaders(ReaderContract):
    """Every test of the contract, for each ``kind`` (tests/contract/conftest.py)."""

    def test_the_reader_is_what_it_says(self, reader: ArchiveReader, kind: ReaderKind) -> None:
        if kind.name.startswith("compiled"):
            return  # an adapter, not an ArchiveReader: it answers what it can (tests/contract/compiled.py)
        assert isinstance(reader, ArchiveReader)
        assert isinstance(reader, ShardSet if kind.name in ("one-shard", "layered") else Archive)
        if kind.name == "layered":
            assert reader.layer_count > 1  # type: ignore[attr-defined]
        assert reader.has_codecs == kind.coded
        # Every codec is there to be decoded by every read call: zstd, frames, a shared
        # record, a sparse file; and an incompressible file stored as it is.
        codecs = {path: reader.codec(reader.lookup(path))
                  for path in ("text.txt", "big.bin", "sparse.bin", "noise.bin")}
        if kind.coded:
            assert codecs == {"text.txt": CODEC_ZSTD, "big.bin": CODEC_FRAMES, "sparse.bin": CODEC_SPARSE,
                              "noise.bin": CODEC_STORED}
            assert reader.extent(reader.lookup("twin-1.txt")) == reader.extent(reader.lookup("twin-2.txt"))
        else:
            assert set(codecs.values()) == {CODEC_STORED}
