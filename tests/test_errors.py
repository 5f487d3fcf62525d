"""What a user sees when they hand packfs the wrong thing: the right exception type
from the API, one clear line and exit 1 from the CLI."""

from __future__ import annotations

import gzip
import os
import random
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import packfs
from packfs import PackedFolder
from tests.conftest import BLUEPRINT, packfs_cli, time_limit


def test_a_missing_archive_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        PackedFolder(tmp_path / "missing.ffr")
    with pytest.raises(packfs.PathNotFoundError):
        PackedFolder(tmp_path / "missing.ffr")


@pytest.mark.parametrize("url", ["gs://bucket/data.ffr", "hf://datasets/x/data.ffr"])
def test_a_url_of_another_scheme_names_those_packfs_reads(url: str) -> None:
    from packfs.core import Archive

    for open_archive in (PackedFolder, Archive, packfs.RecordReader, packfs.record_file_info):
        with pytest.raises(packfs.RemoteArchiveError, match="URLs are not supported: packfs reads archives at "
                                                            "s3://, http:// and https:// URLs and local paths") as raised:
            open_archive(url)
        assert not isinstance(raised.value, FileNotFoundError) and repr(url) in str(raised.value)


def test_a_url_that_cannot_be_reached_is_one_clear_error() -> None:
    from packfs.source.remote import RemoteFile

    url = f"http://127.0.0.1:{_closed_port()}/data.ffr"
    with pytest.raises(packfs.RemoteIOError) as raised:
        RemoteFile(url, retries=1, backoff=0.001, timeout=2)
    assert isinstance(raised.value, OSError) and repr(url) in str(raised.value)
    assert "\n" not in str(raised.value)


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens there once it is closed


@pytest.mark.parametrize("command", ["ls", "find", "cat", "info", "verify", "unpack", "convert", "mount", "pack"])
def test_every_command_names_the_urls_it_reads(command: str, tmp_path: Path) -> None:
    from tests.conftest import cli_runner

    from packfs.cli import main

    (tmp_path / "mnt").mkdir()
    extra = {"cat": ["x"], "unpack": [tmp_path / "dest"], "convert": [tmp_path / "out.ffr"],
             "mount": [tmp_path / "mnt"], "pack": [tmp_path / "out.ffr"]}.get(command, [])
    url = "gs://bucket/data.ffr"
    result = cli_runner().invoke(main, [command, url] + [str(x) for x in extra])
    if command == "mount" and "FUSE is not available" in result.stderr:
        pytest.skip(result.stderr.strip())
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0] == (
        f"Error: {url!r}: gs:// URLs are not supported: packfs reads archives at s3://, http:// and https:// "
        f"URLs and local paths")
    if command == "pack":  # packing reads local trees, tars and zips only
        result = cli_runner().invoke(main, ["pack", "https://example.com/tree.tar", str(tmp_path / "out.ffr")])
        assert result.exit_code == 1 and "a URL, where a local path is expected" in result.stderr
    assert not (tmp_path / "dest").exists() and not (tmp_path / "out.ffr").exists()


def test_a_file_url_names_the_path_to_give(archive: Path) -> None:
    with pytest.raises(packfs.RemoteArchiveError, match=f"is a file:// URL: give the path itself, {str(archive)!r}"):
        PackedFolder(archive.as_uri())


def test_a_local_path_shaped_like_a_url_is_a_path(archive: Path, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "s3:" / "bucket").mkdir(parents=True)
    (tmp_path / "s3:" / "bucket" / "data.ffr").write_bytes(archive.read_bytes())
    monkeypatch.chdir(tmp_path)
    with PackedFolder("s3://bucket/data.ffr") as folder:
        assert folder.read("hello.txt") == BLUEPRINT["hello.txt"]
    with pytest.raises(packfs.PathNotFoundError):
        PackedFolder("s3://bucket/missing.ffr")  # its directory exists: a missing local file


def test_a_directory_given_as_an_archive_says_so(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError, match="is a directory, expected an archive file"):
        PackedFolder(tmp_path)


def test_a_closed_folder_raises_value_error(archive: Path) -> None:
    folder = PackedFolder(archive)
    from packfs.dataset import PackedFiles

    dataset = PackedFiles(folder)
    folder.close()
    assert folder.closed
    for use in (lambda: folder.read("hello.txt"), lambda: folder.stat("hello.txt"),
                lambda: folder.list(), lambda: folder.exists("a"), lambda: folder.open("hello.txt"),
                lambda: folder.read_view("hello.txt"), lambda: list(folder.walk()), lambda: len(folder),
                lambda: folder.verify(), lambda: dataset[0], lambda: dataset.read_batch([0])):
        with pytest.raises(ValueError, match="closed"):
            use()
    folder.close()  # twice is fine, as for files


def test_a_closed_dataset_raises_value_error(archive: Path) -> None:
    from packfs.dataset import PackedFiles

    dataset = PackedFiles(archive)
    assert dataset[0] is not None
    dataset.close()
    with pytest.raises(ValueError, match="closed"):
        dataset[0]


def _foreign_files(tmp_path: Path, archive: Path) -> dict[str, tuple[Path, str]]:
    tar = tmp_path / "data.tar"
    with tarfile.open(tar, "w") as t:
        t.add(archive, "a.ffr")
    zipped = tmp_path / "data.zip"
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("a", b"b" * 100)
    gz = tmp_path / "data.ffr.gz"
    gz.write_bytes(gzip.compress(archive.read_bytes()))
    empty = tmp_path / "empty.ffr"
    empty.write_bytes(b"")
    data = archive.read_bytes()
    truncated = tmp_path / "truncated.ffr"
    truncated.write_bytes(data[: len(data) // 2])
    text = tmp_path / "passwd"  # as /etc/passwd: `packfs mount /etc/passwd` once spoke of its "records"
    text.write_text("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n")
    binary = tmp_path / "random.bin"  # its first 8 bytes as a record count: negative
    binary.write_bytes(bytes(random.Random(33).getrandbits(8) for _ in range(4096))[:11] + b"\xf3"
                       + bytes(random.Random(34).getrandbits(8) for _ in range(4096)))
    return {
        "text": (text, f"{str(text)!r} is a text file, not a packfs archive"),
        "random": (binary, f"{str(binary)!r}: not a packfs archive (no FFRecord header: its first 12 bytes give "
                           f"a record count that no file could hold)"),
        "tar": (tar, "is a tar archive, not a packfs archive; to make one from it: packfs pack"),
        "zip": (zipped, "is a zip archive, not a packfs archive"),
        "gzip": (gz, "is gzip-compressed data, not a packfs archive"),
        "empty": (empty, "is empty (0 bytes), not a packfs archive"),
        "truncated": (truncated, f"truncated: {len(data) // 2} bytes, but its header puts the last "
                                 f"record at offset {len(data) - 64}, so it must be at least {len(data) - 64} bytes "
                                 f"({len(data)} with a packfs archive's 64-byte footer)"),
    }


@pytest.mark.parametrize("kind", ["tar", "zip", "gzip", "empty", "truncated", "text", "random"])
@pytest.mark.parametrize("check_data", [True, False])
def test_files_that_are_not_archives_say_what_they_are(archive: Path, tmp_path: Path, kind: str,
                                                       check_data: bool) -> None:
    path, message = _foreign_files(tmp_path, archive)[kind]
    with pytest.raises(packfs.FormatError) as error:
        PackedFolder(path, check_data=check_data)
    assert message in str(error.value)
    assert "checksum" not in str(error.value) and "records" not in str(error.value)


@pytest.mark.parametrize("command", ["info", "ls", "verify", "find", "mount"])
@pytest.mark.parametrize("kind", ["tar", "zip", "empty", "truncated", "text", "random", "missing", "directory"])
def test_the_cli_says_it_in_one_line_and_exits_1(archive: Path, tmp_path: Path, command: str, kind: str) -> None:
    files = _foreign_files(tmp_path, archive)
    files["missing"] = (tmp_path / "missing.ffr", "no such file, expected an archive")
    files["directory"] = (tmp_path, "is a directory, expected an archive file")
    path, message = files[kind]
    args = [command, path] + ([tmp_path / "mnt"] if command == "mount" else [])
    (tmp_path / "mnt").mkdir(exist_ok=True)
    result = packfs_cli(*args)
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error: "), result.stderr
    assert message in result.stderr and "Usage" not in result.stderr


def test_a_missing_pack_source_is_one_line_exit_1(tmp_path: Path) -> None:
    result = packfs_cli("pack", tmp_path / "nope", tmp_path / "out.ffr")
    assert result.returncode == 1 and result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1
    assert "no such file or directory" in result.stderr
    assert not (tmp_path / "out.ffr").exists()


def test_usage_mistakes_still_exit_2(archive: Path) -> None:
    assert packfs_cli("info").returncode == 2
    assert packfs_cli("ls", archive, "--no-such-option").returncode == 2


def test_a_pipe_given_as_the_source_is_read_as_a_stream(tree: Path, tmp_path: Path) -> None:
    """packfs pack <(tar c ...) out.ffr: the pipe is read once, like '-'."""
    out = tmp_path / "out.ffr"
    script = f'packfs pack <(tar cf - -C "{tree}" .) "{out}"'
    env = dict(os.environ, PATH=os.path.dirname(_packfs()) + os.pathsep + os.environ["PATH"])
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    with PackedFolder(out) as folder:
        assert folder.read("hello.txt") == BLUEPRINT["hello.txt"]
        assert folder.read("a/b/c/deep.bin") == BLUEPRINT["a/b/c/deep.bin"]


def _packfs() -> str:
    import shutil
    import sys

    return shutil.which("packfs", path=os.path.dirname(sys.executable)) or "packfs"


@pytest.mark.parametrize("module, absent, message", [
    ("packfs.torch", "torch", 'packfs.torch needs PyTorch (torch), which is not installed: pip install "packfs[torch]"'),
    ("packfs.ffrecord.torch", "torch",
     'packfs.ffrecord.torch needs PyTorch (torch), which is not installed: pip install "packfs[torch]"'),
    ("packfs.ffrecord.torch.dataloader", "torch", "packfs.ffrecord.torch needs PyTorch (torch)"),
    ("packfs.fsspec", "fsspec", 'packfs.fsspec needs fsspec, which is not installed: pip install "packfs[fsspec]"'),
])
def test_a_missing_extra_is_named(module: str, absent: str, message: str) -> None:
    # The dependency made absent as an uninstalled one is (None in sys.modules).
    code = (f"import sys; sys.modules[{absent!r}] = None\n"
            f"try:\n    import {module}\n"
            f"except ModuleNotFoundError as error:\n    print(type(error).__name__, error.name, error)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.startswith(f"ModuleNotFoundError {absent} {message}"), result.stdout + result.stderr
    assert '(in a clone of packfs: pip install -e ".[' in result.stdout


def test_pillow_missing_is_named_at_decode() -> None:
    require = "import sys; sys.modules['PIL'] = None\nfrom packfs.torch import decode_pil\n"
    code = require + "try:\n    decode_pil(b'')\nexcept ModuleNotFoundError as error:\n    print(error)\n"
    pytest.importorskip("torch")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.startswith('packfs.torch.decode_pil needs Pillow (PIL), which is not installed: '
                                    'pip install "packfs[torch]"'), result.stdout + result.stderr


def test_a_broken_dependency_is_not_called_missing() -> None:
    # Anything but the dependency's own absence passes through as it was.
    error = ImportError("libtorch_cpu.so: cannot open shared object file", name="torch")
    assert packfs.errors.missing_dependency(error, "torch", "packfs.torch", "torch") is error
    inner = ModuleNotFoundError("No module named 'typing_extensions'", name="typing_extensions")
    assert packfs.errors.missing_dependency(inner, "torch", "packfs.torch", "torch") is inner


def test_a_clone_named_packfs_run_from_its_parent_is_one_clear_import_error(tmp_path: Path) -> None:
    """A script beside a clone named packfs once imported the clone's folder as an empty
    namespace package (``packfs.PackedFolder``: AttributeError, while ``packfs.torch``
    imported); the root's __init__.py makes it one ImportError saying what to do."""
    from tests.conftest import REPO

    clone = tmp_path / "packfs"
    clone.symlink_to(REPO, target_is_directory=True)  # as `git clone ... packfs` beside the script
    (tmp_path / "train.py").write_text("import packfs\nprint(packfs.PackedFolder)\n")
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    for command in (["train.py"], ["-c", "import packfs"], ["-c", "from packfs.torch import PackedImageFolder"],
                    ["-c", "import packfs.fsspec"]):
        result = subprocess.run([sys.executable, *command], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=time_limit(60))
        assert result.returncode == 1, (command, result.stdout, result.stderr)
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith(f"ImportError: 'import packfs' found {clone}, the folder of a clone of packfs's "
                               f"repository, not the packfs package (which is {clone / 'packfs'})"), last
        assert f"Run from another directory (from inside the clone, cd {clone}, works too), or rename the clone " \
               f"(mv {clone} {clone}-src)" in last
        assert "AttributeError" not in result.stderr
    # From inside the clone, or anywhere else, packfs is the package.
    for where in (clone, tmp_path / "elsewhere"):
        where.mkdir(exist_ok=True)
        result = subprocess.run([sys.executable, "-c", "import packfs; print(packfs.PackedFolder.__name__)"],
                                cwd=where, env=env, capture_output=True, text=True, timeout=time_limit(60))
        assert result.returncode == 0 and result.stdout == "PackedFolder\n", result.stderr
