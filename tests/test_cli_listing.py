"""`packfs ls` and `packfs find`: NUL-separated output (-0, -print0), owner names, and
the column-slice listing (PackedFolder.list_attributes) that makes them fast."""

from __future__ import annotations

import grp
import os
import pwd
import stat
import time
from pathlib import Path

import pytest

from tests.conftest import cli_runner
import packfs
from packfs import PackedFolder
from packfs.cli import main
from packfs.errors import NotADirectoryPathError, PathNotFoundError
from packfs.folder import EntryAttributes

NEWLINE = b"new\nline.txt"
DASH = b"-dash"
RAW = b"raw-\xff\xfe\x80.bin"
# A uid and gid no machine running the tests will have a name for.
NO_NAME_ID = 3_999_999_999
MINUTE_NS = 60 * 10**9
BASE_NS = 1_700_000_000 * 10**9  # 2023-11-14 22:13:20 UTC: a whole minute plus 20 s


@pytest.fixture
def run():
    runner = cli_runner()

    def invoke(*args: object):
        return runner.invoke(main, [os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in args])

    return invoke


@pytest.fixture
def tricky(tmp_path: Path) -> Path:
    """Names with a newline, a leading dash and non-UTF-8 bytes, at the top and below."""
    Entry = packfs.Entry
    entries = [
        Entry(DASH, data=b"d", uid=0, gid=0, mtime_ns=BASE_NS),
        Entry(b"dir", kind="dir", uid=NO_NAME_ID, gid=NO_NAME_ID, mtime_ns=BASE_NS),
        Entry(b"dir/" + NEWLINE, data=b"nl", mode=0o600, uid=NO_NAME_ID, gid=0, mtime_ns=BASE_NS + 5 * 10**9),
        Entry(b"dir/" + RAW, data=b"raw!", uid=0, gid=NO_NAME_ID, mtime_ns=BASE_NS + 39 * 10**9),
        Entry(b"dir/sub\nname", kind="dir", mtime_ns=BASE_NS + 41 * 10**9),  # the next minute
        Entry(b"dir/sub\nname/" + DASH, data=b"", mtime_ns=BASE_NS - 3 * MINUTE_NS),
        Entry(b"hard", kind="hardlink", target=b"dir/" + RAW),
        Entry(b"link\n" + RAW, kind="symlink", target=b"dir/" + NEWLINE),
        Entry(NEWLINE, data=b"top", mtime_ns=BASE_NS),
    ]
    out = tmp_path / "tricky.ffr"
    packfs.pack_entries(entries, out)
    return out


ALL_PATHS = [  # depth first, names sorted bytewise
    DASH, b"dir", b"dir/" + NEWLINE, b"dir/" + RAW, b"dir/sub\nname", b"dir/sub\nname/" + DASH,
    b"hard", b"link\n" + RAW, NEWLINE,
]


def _records(output: bytes, end: bytes = b"\0") -> list[bytes]:
    assert output.endswith(end), output
    return output[: -len(end)].split(end)


# -- find -print0 ---------------------------------------------------------------------

@pytest.mark.parametrize("spelling", ["-print0", "--print0"])
def test_find_print0_is_byte_exact(run, tricky: Path, spelling: str) -> None:
    result = run("find", tricky, spelling)
    assert result.exit_code == 0, result.output
    assert _records(result.stdout_bytes) == [b"."] + ALL_PATHS
    assert b"\n" + b"\0" not in result.stdout_bytes.replace(b"new\nline", b"")  # NUL-terminated, no newlines added


def test_find_print0_with_type_name_and_path(run, tricky: Path) -> None:
    files = run("find", tricky, "--type", "f", "-print0").stdout_bytes
    assert _records(files) == [DASH, b"dir/" + NEWLINE, b"dir/" + RAW, b"dir/sub\nname/" + DASH, b"hard", NEWLINE]
    dirs = run("find", tricky, "dir", "--type", "d", "-print0").stdout_bytes
    assert _records(dirs) == [b"dir", b"dir/sub\nname"]
    links = run("find", tricky, "--type", "l", "-print0").stdout_bytes
    assert _records(links) == [b"link\n" + RAW]
    # --name matches the name's bytes, decoded as the command line is (surrogateescape).
    named = run("find", tricky, "--name", os.fsdecode(b"raw-\xff*"), "-print0").stdout_bytes
    assert _records(named) == [b"dir/" + RAW]
    named = run("find", tricky, "--name", os.fsdecode(b"*raw-\xff*"), "-print0").stdout_bytes
    assert _records(named) == [b"dir/" + RAW, b"link\n" + RAW]  # * matches a newline, as in find
    assert _records(run("find", tricky, "--name", "-dash", "-print0").stdout_bytes) == [
        DASH, b"dir/sub\nname/" + DASH]
    # A PATH naming a file, and one starting with a dash (after --).
    assert run("find", tricky, "-print0", "--", DASH).stdout_bytes == DASH + b"\0"
    assert run("find", tricky, "-print0", "dir/" + os.fsdecode(RAW)).stdout_bytes == b"dir/" + RAW + b"\0"
    # The start is tested against --type and --name as find does.
    assert run("find", tricky, "dir", "--type", "f").stdout_bytes == (
        b"dir/" + NEWLINE + b"\n" + b"dir/" + RAW + b"\n" + b"dir/sub\nname/" + DASH + b"\n")
    assert run("find", tricky, "dir", "--name", "dir").stdout_bytes == b"dir\n"


def test_find_without_print0_keeps_newlines_and_errors(run, tricky: Path) -> None:
    result = run("find", tricky)
    assert result.stdout_bytes == b"\n".join([b"."] + ALL_PATHS) + b"\n"
    missing = run("find", tricky, "-print0", "missing")
    assert missing.exit_code == 1 and missing.stderr.startswith("Error: ") and len(missing.stderr.splitlines()) == 1
    assert run("find", tricky, "-print1").exit_code == 2


def test_find_takes_options_as_find_users_type_them(run, tricky: Path) -> None:
    # `-name`/`-type` were "No such option '-n'"; both spellings give the same output.
    for name, kind in (("-name", "-type"), ("--name", "--type")):
        assert run("find", tricky, "dir", name, "sub*", kind, "d").stdout_bytes == b"dir/sub\nname\n"
        assert run("find", tricky, kind, "f", name, "-dash", "-print0").stdout_bytes == b"-dash\0dir/sub\nname/-dash\0"


def test_find_names_a_predicate_it_lacks_whole(run, tricky: Path) -> None:
    result = run("find", tricky, "-maxdepth", "1")
    assert result.exit_code == 2
    assert "No such option: -maxdepth (packfs find has -name GLOB, -type f|d|l and -print0)" in result.stderr
    # A value starting with '-' is a value, and anything after "--" a path.
    assert run("find", tricky, "-name", "-maxdepth").exit_code == 0
    assert run("find", tricky, "--", "-maxdepth").exit_code == 1


# -- ls -0 ----------------------------------------------------------------------------

@pytest.mark.parametrize("spelling", ["-0", "--zero", "--null"])
def test_ls_zero_is_byte_exact(run, tricky: Path, spelling: str) -> None:
    top = run("ls", spelling, tricky)
    assert top.exit_code == 0, top.output
    assert _records(top.stdout_bytes) == [DASH, b"dir", b"hard", b"link\n" + RAW, NEWLINE]
    inside = run("ls", spelling, tricky, "dir")
    assert _records(inside.stdout_bytes) == [NEWLINE, RAW, b"sub\nname"]
    recursive = run("ls", "-R", spelling, tricky)
    assert _records(recursive.stdout_bytes) == ALL_PATHS
    assert run("ls", "-R", spelling, tricky, "dir/").stdout_bytes == b"".join(
        p[4:] + b"\0" for p in ALL_PATHS if p.startswith(b"dir/"))


def test_ls_without_zero_and_of_a_file(run, tricky: Path) -> None:
    assert run("ls", tricky, "dir").stdout_bytes == NEWLINE + b"\n" + RAW + b"\nsub\nname\n"
    assert run("ls", "-0", tricky, "--", DASH).stdout_bytes == DASH + b"\0"
    assert run("ls", tricky, "dir/" + os.fsdecode(NEWLINE)).stdout_bytes == b"dir/" + NEWLINE + b"\n"
    long = run("ls", "-l0", tricky, "link\n" + os.fsdecode(RAW)).stdout_bytes
    assert long.endswith(b" link\n" + RAW + b" -> dir/" + NEWLINE + b"\0") and long.count(b"\0") == 1
    assert run("ls", "-0", tricky, "nothing").exit_code == 1


# -- ls -l ----------------------------------------------------------------------------

def _user(uid: int) -> bytes:
    try:
        return pwd.getpwuid(uid).pw_name.encode()
    except KeyError:
        return str(uid).encode()


def _group(gid: int) -> bytes:
    try:
        return grp.getgrgid(gid).gr_name.encode()
    except KeyError:
        return str(gid).encode()


def _when(mtime_ns: int) -> bytes:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(mtime_ns // 10**9)).encode()


def test_ls_long_matches_stat_of_each_entry(run, tricky: Path) -> None:
    """Each -l line says what stat() of that path says: the column slices line up."""
    lines = _records(run("ls", "-lR0", tricky).stdout_bytes)
    assert len(lines) == len(ALL_PATHS)
    with PackedFolder(tricky) as folder:
        for path, line in zip(ALL_PATHS, lines):
            info = folder.stat(path)
            fields = line.split(None, 7)
            assert fields[0] == stat.filemode(info.mode).encode()
            assert int(fields[1]) == info.nlink
            assert fields[2] == _user(info.uid) and fields[3] == _group(info.gid)
            assert int(fields[4]) == info.size
            assert b" ".join(fields[5:7]) == _when(info.mtime_ns)
            expected_name = path
            if info.kind == "symlink":
                expected_name += b" -> " + os.fsencode(folder.readlink(path))
            assert fields[7] == expected_name
    by_name = dict(zip(ALL_PATHS, lines))
    assert by_name[b"hard"].split()[1] == b"2" and by_name[b"dir/" + RAW].split()[1] == b"2"
    assert by_name[b"dir/" + NEWLINE].startswith(b"-rw------- ")


def test_ls_long_owner_names_and_numeric(run, tricky: Path) -> None:
    root = pwd.getpwuid(0).pw_name.encode()
    long = run("ls", "-l", tricky).stdout_bytes.split(b"\n")
    assert long[0].split()[2:4] == [root, grp.getgrgid(0).gr_name.encode()]  # -dash, uid 0
    assert long[1].split()[2:4] == [str(NO_NAME_ID).encode()] * 2  # dir: no such ids here
    for option in ("-n", "--numeric-uid-gid", "-ln"):
        numeric = run("ls", option, tricky).stdout_bytes.split(b"\n")
        assert numeric[0].startswith(b"-rw-r--r--   1     0     0            1 ")  # the old -l layout
        assert numeric[1].split()[2:4] == [str(NO_NAME_ID).encode()] * 2
        assert numeric[0].endswith(b" " + DASH)


def test_ls_long_times_cached_per_minute_stay_right(run, tricky: Path) -> None:
    lines = _records(run("ls", "-l0", tricky, "dir").stdout_bytes)
    # 5 s and 39 s past the same minute's start show the same minute; 41 s is the next.
    assert [b" ".join(line.split()[5:7]) for line in lines] == [
        _when(BASE_NS + 5 * 10**9), _when(BASE_NS + 39 * 10**9), _when(BASE_NS + 41 * 10**9)]
    assert _when(BASE_NS + 39 * 10**9) != _when(BASE_NS + 41 * 10**9)


def test_ls_human_readable_and_symlink_target(run, tricky: Path) -> None:
    result = run("ls", "-lh", tricky, "dir")
    assert result.exit_code == 0
    assert b"     2 B " in result.stdout_bytes and b"     4 B " in result.stdout_bytes
    top = run("ls", "-l", tricky).stdout_bytes
    assert b" link\n" + RAW + b" -> dir/" + NEWLINE + b"\n" in top


def test_ls_and_find_of_a_large_directory(run, tmp_path: Path) -> None:
    """More entries than one output chunk and than one part of the table read at a
    time: every one written, in order, exactly once, with its own attributes."""
    count = 20_000
    names = [b"f%06d" % i for i in range(count)]
    out = tmp_path / "many.ffr"
    packfs.pack_entries([packfs.Entry(b"d/" + name, data=b"x" * (i % 97)) for i, name in enumerate(names)], out)
    assert run("ls", out, "d").stdout_bytes == b"".join(name + b"\n" for name in names)
    long = run("ls", "-n", out, "d").stdout_bytes.splitlines()
    assert [(int(line.split()[4]), line.split()[-1]) for line in long] == [
        (i % 97, name) for i, name in enumerate(names)]
    found = run("find", out, "--type", "f", "-print0").stdout_bytes
    assert found == b"".join(b"d/" + name + b"\0" for name in names)


# -- the API under them ----------------------------------------------------------------

def test_list_attributes_agrees_with_list_and_stat(tricky: Path, archive: Path) -> None:
    for path in (tricky, archive):
        with PackedFolder(path) as folder:
            for top in ("", "dir", "a", "a/dirlink"):
                if not folder.is_dir(top):
                    continue
                for recursive in (False, True):
                    items = list(folder.list_attributes(top, recursive=recursive))
                    assert all(isinstance(item, EntryAttributes) for item in items)
                    assert [os.fsdecode(item.name) for item in items] == folder.list(top, recursive=recursive)
                    prefix = os.fsencode(top) + b"/" if top else b""
                    for item in items:
                        info = folder.stat(prefix + item.name)
                        assert (item.mode, item.uid, item.gid, item.mtime_ns, item.size, item.nlink) == (
                            info.mode, info.uid, info.gid, info.mtime_ns, info.size, info.nlink)
            with pytest.raises(PathNotFoundError):
                folder.list_attributes("no/such/dir")  # raised at the call, not on iteration


def test_list_attributes_errors_and_deep_trees(archive: Path, tmp_path: Path) -> None:
    with PackedFolder(archive) as folder:
        with pytest.raises(NotADirectoryPathError):
            folder.list_attributes("hello.txt")
        assert list(folder.list_attributes("empty_dir")) == []
        assert list(folder.list_attributes("empty_dir", recursive=True)) == []
    deep = b"/".join([b"d"] * 3000)  # deeper than Python's recursion limit
    out = tmp_path / "deep.ffr"
    packfs.pack_entries([packfs.Entry(deep + b"/leaf", data=b"x")], out)
    with PackedFolder(out) as folder:
        items = list(folder.list_attributes("", recursive=True))
    assert len(items) == 3001 and items[-1].name == deep + b"/leaf" and items[-1].size == 1


# -- ls --json --------------------------------------------------------------------------


def test_ls_json_lists_every_attribute(run, tricky: Path) -> None:
    import base64
    import json

    result = run("ls", "--json", "-R", tricky)
    assert result.exit_code == 0, result.output
    entries = json.loads(result.stdout)
    assert [os.fsencode(entry["name"]) for entry in entries] == ALL_PATHS  # the exact bytes, back
    by_name = {os.fsencode(entry["name"]): entry for entry in entries}
    raw = by_name[b"dir/" + RAW]
    assert raw == {"name": os.fsdecode(b"dir/" + RAW), "name_base64": base64.b64encode(b"dir/" + RAW).decode(),
                   "type": "file", "mode": 0o644, "size": 4, "mtime_ns": BASE_NS + 39 * 10**9, "uid": 0,
                   "gid": NO_NAME_ID, "nlink": 2}
    assert by_name[b"dir"]["type"] == "dir" and "name_base64" not in by_name[b"dir"]
    link = by_name[b"link\n" + RAW]
    assert link["type"] == "symlink" and link["target"] == "dir/new\nline.txt" and "target_base64" not in link
    assert base64.b64decode(link["name_base64"]) == b"link\n" + RAW
    assert by_name[b"dir/" + NEWLINE]["mode"] == 0o600
    # One entry a line (streamed), and plain ASCII whatever the names.
    assert len(result.stdout.splitlines()) == len(ALL_PATHS) and result.stdout.isascii()


def test_ls_json_of_one_entry_an_empty_directory_and_errors(run, tricky: Path) -> None:
    import json

    one = json.loads(run("ls", "--json", tricky, "dir/" + os.fsdecode(RAW)).stdout)
    assert len(one) == 1 and os.fsencode(one[0]["name"]) == b"dir/" + RAW
    top = json.loads(run("ls", "--json", tricky).stdout)
    assert [os.fsencode(entry["name"]) for entry in top] == [DASH, b"dir", b"hard", b"link\n" + RAW, NEWLINE]
    assert run("ls", "--json", "-0", tricky).exit_code == 2
    missing = run("ls", "--json", tricky, "missing")
    assert missing.exit_code == 1 and missing.stdout == "" and missing.stderr.startswith("Error: ")


def test_ls_json_of_an_empty_directory_and_a_raw_target(run, tmp_path: Path) -> None:
    import base64
    import json

    out = tmp_path / "empty.ffr"
    packfs.pack_entries([packfs.Entry("e", kind="dir"), packfs.Entry("s", kind="symlink", target=RAW)], out)
    assert json.loads(run("ls", "--json", out, "e").stdout) == []
    (link,) = json.loads(run("ls", "--json", out, "s").stdout)
    assert os.fsencode(link["target"]) == RAW and base64.b64decode(link["target_base64"]) == RAW
