"""packfs.core._format: the C format library (packfs/cformat/) for Python's readers,
built without libfuse.  Its Tree reads what packfs.core's Archive holds (the map, the
descriptor, the section spans) and answers a path's entry, stat, whole contents and
many files' contents, raising packfs.errors' PackfsError for what it finds broken."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from packfs.core import Archive
from packfs.errors import (ArchiveChangedError, ChecksumError, FormatError, NotAFileError, PackfsError,
                           PathNotFoundError, TooLargeToReadError)
from packfs.core.inplace import compiled_reader, in_place
from packfs.format import FLAG_CODECS
from tests.conftest import BLUEPRINT, HARDLINK, column_changed, damaged_copy
from tests.test_inodedaemon_codecs import CONTENTS, _build, _hostile


def _format_module():
    try:
        from packfs.core import _format
    except ImportError as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"packfs.core._format must be built under CI: {error}")
        pytest.skip(f"packfs.core._format is not built: {error}")
    return _format


def format_tree(opened: Archive, log_fd: int | None = None):
    """The C library's Tree over ``opened``, from the one value the core hands either Tree."""
    module = _format_module()
    view = in_place(opened)
    assert not isinstance(view, str), view
    if log_fd is None:
        log_fd = os.open(os.devnull, os.O_WRONLY)
    positional, keywords = view.tree_arguments(opened.checksums != "never", log_fd)
    return module.Tree(*positional, **keywords)


FILES = {path: data for path, data in BLUEPRINT.items() if data is not None}


def test_reads_stats_and_finds_what_the_archive_holds(archive: Path) -> None:
    with Archive(archive, checksums="once") as opened:
        tree = format_tree(opened)
        for path, data in FILES.items():
            assert tree.read_file(os.fsencode(path)) == data, path
            entry = opened.find(os.fsencode(path))
            assert tree.find(os.fsencode(path)) == entry
            attributes = tree.stat(os.fsencode(path))
            assert stat.S_ISREG(attributes["st_mode"]) and attributes["st_size"] == len(data), path
        assert tree.read_many([os.fsencode(path) for path in FILES]) == list(FILES.values())
        assert tree.read_many([]) == []
        # Every name of a hard link reads its file and reports its inode's entry.
        assert tree.read_file(HARDLINK[0].encode()) == FILES[HARDLINK[1]]
        assert tree.stat(HARDLINK[0].encode())["st_ino"] == tree.stat(HARDLINK[1].encode())["st_ino"]
        assert stat.S_ISDIR(tree.stat(b"a/b")["st_mode"]) and stat.S_ISLNK(tree.stat(b"link-to-hello")["st_mode"])
        assert not tree.changed()


def test_what_is_not_a_file_raises_the_packfs_error_for_it(archive: Path) -> None:
    with Archive(archive, checksums="once") as opened:
        tree = format_tree(opened)
        for path in (b"nothing", b"/hello.txt", b"hello.txt/", b"a//b", b"a/b/c/deep.bin/x"):
            with pytest.raises(PathNotFoundError):
                tree.read_file(path)
            with pytest.raises(PathNotFoundError):
                tree.stat(path)
        for path in (b"a", b"", b"link-to-hello"):  # a directory, the root, a symlink
            with pytest.raises(NotAFileError):
                tree.read_file(path)
        with pytest.raises(TooLargeToReadError):
            tree.read_file(b"hello.txt", max_size=4)
        assert tree.read_file(b"hello.txt", max_size=4, none_if_larger=True) is None  # nothing read
        assert tree.read_file(b"hello.txt", 100, True) == FILES["hello.txt"]
        assert tree.read_file(b"hello.txt", max_size=len(FILES["hello.txt"])) == FILES["hello.txt"]
        with pytest.raises(PathNotFoundError, match="nothing"):
            tree.read_many([b"hello.txt", b"nothing", b"empty.txt"])
        with pytest.raises(TypeError):
            tree.read_many(["hello.txt"])


def test_a_damaged_record_is_a_checksum_error_and_the_rest_reads(tmp_path: Path, archive: Path) -> None:
    bad = damaged_copy(archive, tmp_path / "bad.ffr", b"hello.txt", at=3)
    with Archive(bad, checksums="once") as opened:
        log_path = tmp_path / "bad.log"
        with open(log_path, "wb") as log:
            tree = format_tree(opened, log.fileno())
            for _ in range(2):  # failed once, it fails again without being read
                with pytest.raises(ChecksumError, match="hello.txt"):
                    tree.read_file(b"hello.txt")
            with pytest.raises(ChecksumError):
                tree.read_many([b"a/b/c/deep.bin", b"hello.txt"])
            assert tree.read_file(b"a/b/c/deep.bin") == FILES["a/b/c/deep.bin"]
        assert "checksum mismatch" in log_path.read_text()
    with Archive(bad, checksums="never") as opened:  # the policy: nothing is checked
        assert format_tree(opened).read_file(b"hello.txt") != FILES["hello.txt"]


def test_a_broken_table_rule_is_a_format_error(tmp_path: Path, archive: Path) -> None:
    bad = column_changed(archive, tmp_path / "bad.ffr", "size", {b"hello.txt": 2**62})
    with Archive(bad, checksums="once") as opened:
        tree = format_tree(opened)
        with pytest.raises(FormatError) as caught:
            tree.read_file(b"hello.txt")
        assert not isinstance(caught.value, ChecksumError)
        with pytest.raises(FormatError):
            tree.stat(b"hello.txt")
        assert tree.read_file(b"empty.txt") == b""


def test_an_archive_written_over_in_place_is_archive_changed(tmp_path: Path, archive: Path) -> None:
    target = tmp_path / "target.ffr"
    target.write_bytes(archive.read_bytes())
    with Archive(target, checksums="once") as opened:
        tree = format_tree(opened)
        assert tree.read_file(b"hello.txt") == FILES["hello.txt"]
        with open(target, "r+b") as rewrite:
            rewrite.truncate(0)
        with pytest.raises(ArchiveChangedError):
            tree.read_file(b"a/b/c/deep.bin")
        assert tree.changed()


def test_compressed_records_decode_and_hostile_ones_raise(tmp_path: Path) -> None:
    archive = _build(tmp_path / "codecs.ffr")
    with Archive(archive, checksums="once") as opened:
        tree = format_tree(opened)
        for path, data in CONTENTS.items():
            assert tree.read_file(os.fsencode(path)) == data, path
        assert tree.read_many([os.fsencode(path) for path in CONTENTS]) == list(CONTENTS.values())
    hostile = _build(tmp_path / "hostile.ffr", _hostile)
    with Archive(hostile, checksums="once") as opened:
        tree = format_tree(opened)
        for path in ("small.txt", "big_frames.bin", "sparse.bin", "frames.txt"):
            with pytest.raises(FormatError):  # ChecksumError is one: frames.txt's stored CRC
                tree.read_file(os.fsencode(path))
        assert tree.read_file(b"dict/b.json") == CONTENTS["dict/b.json"]


def test_reads_run_without_the_gil_from_many_threads(archive: Path) -> None:
    """Threads reading the same Tree at once get every file right (each call releases
    the GIL while the library reads and checks)."""
    with Archive(archive, checksums="once") as opened:
        tree = format_tree(opened)
        paths = [os.fsencode(path) for path in FILES] * 20
        failures: list[BaseException] = []

        def reader() -> None:
            try:
                assert tree.read_many(paths) == [FILES[os.fsdecode(path)] for path in paths]
            except BaseException as error:  # noqa: BLE001 - reported by the main thread
                failures.append(error)

        threads = [threading.Thread(target=reader) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []


def test_spans_that_break_a_rule_are_refused(archive: Path) -> None:
    module = _format_module()
    with Archive(archive, checksums="once") as opened:
        source = opened.source
        sections = list(opened.section_spans)
        sections[0] = (sections[0][0], sections[0][1] + 4)
        with pytest.raises(ValueError, match="section 0"):
            module.Tree(source.mapping, source.fileno(), -1, opened.record_count, opened.data_records,
                        opened.entry_count, sections, True, "x", 2)
        unopened = module.Tree.__new__(module.Tree)
        with pytest.raises(ValueError, match="not initialised"):
            unopened.read_file(b"hello.txt")
    assert issubclass(ChecksumError, PackfsError)


def test_packed_folder_reads_through_the_library_with_the_python_paths_answers(tmp_path: Path,
                                                                                archive: Path) -> None:
    """PackedFolder.read takes the C library where it is built, and gives what the Python
    path gives: the same bytes, a symlink followed, the same errors (damage included)."""
    import packfs

    _format_module()
    bad = damaged_copy(archive, tmp_path / "bad.ffr", b"hello.txt", at=3)
    for path in (archive, bad):
        with packfs.PackedFolder(path) as compiled, packfs.PackedFolder(path) as python:
            assert compiled._compiled is not None
            python._compiled = None
            for name in [*FILES, "link-to-hello", "a/dirlink/c/deep.bin", "/a/b/../b/c/deep.bin"]:
                outcomes = []
                for folder in (compiled, python):
                    try:
                        outcomes.append(folder.read(name))
                    except PackfsError as error:
                        outcomes.append((type(error), str(error)))
                assert outcomes[0] == outcomes[1], name
            if path == bad:
                with pytest.raises(ChecksumError):
                    compiled.read("hello.txt")
    with packfs.PackedFolder(archive, check_data=False) as unchecked:
        assert unchecked._compiled is not None and unchecked.read("hello.txt") == FILES["hello.txt"]


def test_one_value_builds_both_compiled_readers_alike(tmp_path: Path, archive: Path) -> None:
    """core/inplace.py's InPlace is what the daemon's Tree and the core's take: built from
    it, both answer every file as the Archive does, plain and with codecs."""
    from packfs.fuse.inodedaemon import tree_for, unavailable

    coded = tmp_path / "coded.ffr"
    _build(coded)
    for path, files in ((archive, FILES), (coded, CONTENTS)):
        with Archive(path, checksums="once") as opened:
            view = in_place(opened)
            assert not isinstance(view, str), view
            assert (view.codecs is not None) == bool(opened.footer.flags & FLAG_CODECS)
            assert view.sections == opened.section_spans and view.pages == opened.page_checks
            core_tree = format_tree(opened)
            for name, data in files.items():
                assert core_tree.read_file(os.fsencode(name)) == data == opened.read_path(name), name
            if unavailable(opened) is None:  # the daemon's Tree, where packfs._lowlevel is built
                daemon_tree = tree_for(opened, os.open(os.devnull, os.O_WRONLY))
                for name, data in files.items():
                    inode = opened.inode(opened.find(os.fsencode(name)))
                    pieces = [daemon_tree.read(inode, offset, 64 << 10) for offset in range(0, len(data) + 1, 64 << 10)]
                    assert b"".join(pieces) == data, name  # READs as the kernel sends them


def test_what_cannot_be_read_in_place_is_said_once_for_every_compiled_reader(tmp_path: Path) -> None:
    """An FFRecord packed folder and a shard set get no core Tree; the folder's reason is
    the words the daemon's notice gives."""
    from packfs.core import open_archive
    from packfs.fuse.inodedaemon import unavailable
    from packfs.write.shards import pack_shards
    from tests.conftest import REPO

    _format_module()
    legacy = REPO / "tests" / "vectors" / "ffrecord" / "packed_folder.ffr"
    with Archive(legacy) as opened:
        reason = in_place(opened)
        assert isinstance(reason, str) and "FFRecord packed folder" in reason
        assert compiled_reader(opened, True) is None
        if unavailable() is None:
            assert unavailable(opened) == reason
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "f").write_bytes(b"x")
    (tmp_path / "s").mkdir()
    pack_shards(tmp_path / "t", tmp_path / "s" / "data.ffr", shards=1)
    with open_archive(str(tmp_path / "s" / "data.ffrset")) as shards:
        assert compiled_reader(shards, True) is None
