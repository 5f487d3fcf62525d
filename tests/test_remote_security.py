"""Remote reads against servers that misbehave or are hostile (issue 34): a server that
trickles its answer, redirects to another host or port, S3 keys with characters a URL
gives a meaning to, passwords in a shard set's URL, two S3 endpoints with the same
bucket and key.  Real servers on loopback: small socket servers of our own written
here, nginx and moto_server (tests/remote_servers.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import pytest

from packfs.errors import RemoteArchiveError
from tests.conftest import daemon_pid, mounted, packfs_cli, require_extra
from tests.test_remote_source import BLOB as NGINX_BLOB
from tests.test_remote_source import moto, nginx, s3_env  # noqa: F401 (the fixtures: real servers, stopped at the end)

REPO = Path(__file__).resolve().parent.parent
BLOB = bytes((k * 13 + (k >> 9)) & 0xFF for k in range(1 << 20))
ETAG = '"trickle-1"'


# -- a server of our own -------------------------------------------------------------------


class LoopbackServer:
    """A threaded HTTP/1.1 server on a free loopback port: ``answer(head, sock)`` is
    called with each request's head (text) and writes the answer itself.  Every
    connection is served on a daemon thread; closing stops accepting and closes what is
    open."""

    def __init__(self, answer: Callable[[str, socket.socket], None]) -> None:
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests: list[str] = []
        self.connections: list[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _accept(self) -> None:
        while not self.closed:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.connections.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        buffer = b""
        try:
            for _ in range(1000):  # requests on one connection: bounded
                while b"\r\n\r\n" not in buffer:
                    piece = sock.recv(65536)
                    if not piece:
                        return
                    buffer += piece
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                text = head.decode("latin-1")
                self.requests.append(text)
                self.answer(text, sock)
        except OSError:
            pass
        finally:
            sock.close()

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        for sock in self.connections:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


def header(head: str, name: str) -> Optional[str]:
    for line in head.split("\r\n")[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == name.lower():
            return value.strip()
    return None


def ranged_answer(head: str) -> tuple[int, int]:
    """The [first, end) of BLOB a request's Range asks for."""
    asked = (header(head, "Range") or "").removeprefix("bytes=")
    first, _, last = asked.partition("-")
    if not first:
        return len(BLOB) - int(last), len(BLOB)
    return int(first), int(last) + 1


def send_head(sock: socket.socket, first: int, end: int) -> None:
    sock.sendall((f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {first}-{end - 1}/{len(BLOB)}\r\n"
                  f"Content-Length: {end - first}\r\nETag: {ETAG}\r\n"
                  f"Last-Modified: Sat, 28 Nov 2026 12:00:00 GMT\r\n\r\n").encode())


def trickle(head: str, sock: socket.socket) -> None:
    """The open's suffix at once; any other range a byte a second (at most 300 bytes,
    then the connection is closed)."""
    first, end = ranged_answer(head)
    send_head(sock, first, end)
    if (header(head, "Range") or "").startswith("bytes=-"):
        sock.sendall(BLOB[first:end])
        return
    for at in range(first, min(end, first + 300)):
        sock.sendall(BLOB[at:at + 1])
        time.sleep(1.0)
    raise OSError("trickled enough")


def run_client(code: str, guard: float) -> str:
    """Run ``code`` in a fresh interpreter (no disk cache); what it printed.  One still
    running after ``guard`` seconds is killed and the test fails: that is the bug."""
    env = {**os.environ, "PACKFS_CACHE_DIR": "off", "PYTHONPATH": str(REPO)}
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=guard, env=env,
                              cwd=str(REPO))
    except subprocess.TimeoutExpired:
        pytest.fail(f"still reading after {guard:g} s: the deadline was not kept")
    return done.stdout.strip() + done.stderr.strip()[-2000:]


READ_AND_TELL = """
import sys
from packfs.source import open_source
source = open_source({url!r}, timeout=3, retries=1, backoff=0.01)
try:
    {read}
    print("read it all")
except Exception as error:
    print(type(error).__name__, error)
"""


@pytest.fixture
def trickling():
    require_extra("urllib3", "remote")
    server = LoopbackServer(trickle)
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize("read", ["source.read(0, 1000)", "source.read_ranges([(0, 1000), (500000, 501000)])"],
                         ids=["single", "batch"])
def test_a_trickling_server_times_out(trickling: LoopbackServer, read: str) -> None:
    """A byte a second: the whole answer is bounded by the timeout (per try), on the
    single-GET path and on the batch's one-thread path alike.  With timeout=3 and
    retries=1 the error comes after a few tries of 3 s; 60 s is the guard."""
    said = run_client(READ_AND_TELL.format(url=trickling.url("/blob.bin"), read=read), guard=60)
    assert said.startswith("RemoteTimeoutError"), said
    assert "no complete answer within 3 s (2 tries)" in said


# -- redirects -------------------------------------------------------------------------------


def redirect_to(target: str) -> Callable[[str, socket.socket], None]:
    def answer(head: str, sock: socket.socket) -> None:
        path = head.split(" ")[1]
        sock.sendall(f"HTTP/1.1 302 Found\r\nLocation: {target}{path}\r\nContent-Length: 0\r\n\r\n".encode())
    return answer


def whole_ranges(head: str, sock: socket.socket) -> None:
    first, end = ranged_answer(head)
    send_head(sock, first, end)
    sock.sendall(BLOB[first:end])


@pytest.fixture
def redirecting():
    require_extra("urllib3", "remote")
    servers = []
    try:
        elsewhere = LoopbackServer(whole_ranges)
        servers.append(elsewhere)
        here = LoopbackServer(redirect_to(f"http://127.0.0.1:{elsewhere.port}"))
        servers.append(here)
        yield here, elsewhere
    finally:
        for server in servers:
            server.close()


def test_a_redirect_to_another_port_is_not_followed(redirecting) -> None:
    """A URL someone hands over must not make its reader send requests elsewhere (a
    blind SSRF: a cloud's metadata address, a service on loopback): a redirect to
    another host or port is an error that names it, and nothing is sent there."""
    from packfs.source import open_source

    here, elsewhere = redirecting
    with pytest.raises(RemoteArchiveError) as raised:
        open_source(here.url("/blob.bin"), timeout=5, retries=0)
    assert f"127.0.0.1:{elsewhere.port}" in str(raised.value) and "redirects to another server" in str(raised.value)
    assert len(here.requests) == 1 and elsewhere.requests == []


def test_a_redirect_on_its_own_server_is_followed(nginx) -> None:
    from packfs.source import open_source

    nginx.clear_log()
    source = open_source(nginx.url("blob.bin", "moved"), suffix_bytes=1024, timeout=5)
    assert source.read(10, 20) == NGINX_BLOB[10:20]


# -- S3 keys -----------------------------------------------------------------------------------

# Keys a URL parser would cut (#, ?), decode (%2F, %41), drop (a leading /) or remove
# (dot segments), or that need encoding (space, unicode, +); each beside the object a
# wrong reading would name.
S3_KEYS = ["dir/a#frag", "dir/a", "q?x=1", "q", "p%2Fq", "p/q", "%41", "A", "/lead", "lead", "two//slashes",
           "two/slashes", "sp ace+plus", "ünï/cödé", "x#y?z%20w", "up/../down", "down", "./dot", "dot", ".."]


@pytest.fixture
def s3_uncached(s3_env, monkeypatch):  # noqa: F811
    """moto's S3 as a user sets it up (tests.test_remote_source), without the disk cache:
    what these tests count is each request the source sends."""
    monkeypatch.setenv("PACKFS_CACHE_DIR", "off")
    return s3_env


def test_s3_keys_are_literal_each_reads_its_own_object(s3_uncached) -> None:
    """s3://BUCKET/KEY takes KEY literally, as `aws s3` does: each of these keys reads
    its own object, never its neighbour's."""
    from packfs.source import open_source

    client = s3_uncached.client()
    client.create_bucket(Bucket="keys")
    for k, key in enumerate(S3_KEYS):
        client.put_object(Bucket="keys", Key=key, Body=f"object {k}: {key}".encode())
    for k, key in enumerate(S3_KEYS):
        source = open_source(f"s3://keys/{key}")
        assert source.read(0, source.size) == f"object {k}: {key}".encode(), key
        assert source.name == f"s3://keys/{key}"
        source.close()


def test_an_s3_endpoint_with_a_password_is_refused(s3_uncached) -> None:
    """A user and password in endpoint_url would be sent in Host: (and signed): refused,
    saying where credentials go, without the password."""
    from packfs.source import open_source

    endpoint = s3_uncached.endpoint.replace("http://", "http://user:hunter2secret@")
    with pytest.raises(RemoteArchiveError) as raised:
        open_source("s3://keys/A", storage_options={"endpoint_url": endpoint})
    assert "user or password" in str(raised.value) and "hunter2secret" not in str(raised.value)


# -- the disk cache: one object per endpoint ----------------------------------------------------


def test_the_same_bucket_and_key_on_another_endpoint_is_not_served_from_the_cache(s3_uncached, tmp_path) -> None:
    """Another S3 endpoint (a test server, MinIO, a hostile one) with the same bucket,
    key, ETag, size and last bytes, but other bytes in the middle: what one endpoint's
    reads put in the node's cache is never served for the other's."""
    from packfs.source import open_source

    client = s3_uncached.client()
    client.create_bucket(Bucket="same")
    client.put_object(Bucket="same", Key="blob.bin", Body=BLOB)
    etag = client.head_object(Bucket="same", Key="blob.bin")["ETag"]
    other = bytearray(BLOB)
    other[1000:2000] = b"X" * 1000  # the same last bytes, size and ETag: only the middle differs

    def lookalike(head: str, sock: socket.socket) -> None:
        first, end = ranged_answer(head)
        sock.sendall((f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {first}-{end - 1}/{len(other)}\r\n"
                      f"Content-Length: {end - first}\r\nETag: {etag}\r\n"
                      f"Last-Modified: Sat, 28 Nov 2026 12:00:00 GMT\r\n\r\n").encode() + bytes(other[first:end]))

    server = LoopbackServer(lookalike)
    try:
        cache = {"cache_dir": str(tmp_path / "cache")}
        hostile = open_source("s3://same/blob.bin", storage_options={**cache, "endpoint_url": server.url("")})
        assert hostile.read(0, 4096)[1000:2000] == b"X" * 1000
        hostile.close()
        real = open_source("s3://same/blob.bin", storage_options=cache)
        assert real.read(0, 4096) == BLOB[:4096]
        real.close()
    finally:
        server.close()


# -- a password in a shard set's URL ------------------------------------------------------------

SECRET = "s3cr3tPassw0rd"


def pack(directory: Path, files: dict, name: str) -> Path:
    import packfs

    source = directory / f"{name}.src"
    for path, contents in files.items():
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        (source / path).write_bytes(contents)
    packfs.pack_folder(source, directory / name)
    return directory / name


@pytest.fixture
def set_url(nginx, tmp_path):  # noqa: F811
    """A shard set of two archives on nginx, at a URL with a user and password (nginx
    asks for none and ignores them)."""
    for shard in range(2):
        path = pack(tmp_path, {f"s{shard}/{k}.txt": f"shard {shard} file {k}".encode() for k in range(3)},
                    f"pw-{shard}.ffr")
        nginx.put(path.name, path.read_bytes())
    done = packfs_cli("set", tmp_path / "pw.ffrset", tmp_path / "pw-0.ffr", tmp_path / "pw-1.ffr")
    assert done.returncode == 0, done.stderr
    nginx.put("pw.ffrset", (tmp_path / "pw.ffrset").read_bytes())
    return nginx.url("pw.ffrset").replace("http://", f"http://reader:{SECRET}@")


def test_a_shard_sets_password_is_never_shown(set_url: str, nginx, tmp_path) -> None:  # noqa: F811
    """The set's path and repr, its shards' errors and `packfs info` show the URL
    without its user and password, as a single archive's do; it still reads."""
    import packfs
    from packfs.core import ShardSet, open_archive

    opened = open_archive(set_url)
    assert isinstance(opened, ShardSet)
    for shown in (opened.path, repr(opened)):
        assert SECRET not in shown and "reader" not in shown and "127.0.0.1" in shown
    with packfs.PackedFolder(set_url) as folder:
        assert folder.read("s1/2.txt") == b"shard 1 file 2"
        assert SECRET not in repr(folder) and SECRET not in str(folder.info())
    opened.close()
    from packfs.dataset import PackedFiles

    files = PackedFiles(set_url, "*/*.txt")
    assert len(files) == 6 and SECRET not in repr(files)
    files.close()
    with pytest.raises(packfs.PackfsError) as raised:
        PackedFiles(set_url, "nothing/*")
    assert SECRET not in str(raised.value)
    info = packfs_cli("info", set_url, "--json")
    assert info.returncode == 0 and SECRET not in info.stdout + info.stderr, info.stderr
    # A shard gone: the error names it, without the password.
    os.unlink(nginx.data / "pw-1.ffr")
    failed = packfs_cli("cat", set_url, "s1/2.txt")
    assert failed.returncode == 1 and failed.stderr.startswith("Error: ") and "pw-1.ffr" in failed.stderr
    assert SECRET not in failed.stderr, failed.stderr
    missing = packfs_cli("info", set_url.replace("pw.ffrset", "none.ffrset"))
    assert missing.returncode == 1 and SECRET not in missing.stderr, missing.stderr


@pytest.mark.parametrize("binding", ["auto", "mfusepy"])
def test_a_mounted_sets_password_is_not_in_the_mount_table_nor_the_daemons_command_line(
        set_url: str, tmp_path, binding: str) -> None:
    """/proc/mounts (fsname), the `mounted ...` line and the daemon's command line
    (/proc/PID/cmdline, what ps shows every user) never hold the password."""
    from packfs.fuse import state_file

    mountpoint = tmp_path / "mnt"
    with mounted(set_url, mountpoint, binding=binding):
        assert (mountpoint / "s0" / "1.txt").read_bytes() == b"shard 0 file 1"
        table = Path("/proc/mounts").read_text()
        assert str(mountpoint) in table and SECRET not in table
        command_line = Path(f"/proc/{daemon_pid(mountpoint)}/cmdline").read_bytes()
        assert b"pw.ffrset" in command_line and SECRET.encode() not in command_line, command_line
        log = Path(state_file(str(mountpoint), ".log"))
        assert not log.exists() or SECRET not in log.read_text()
    mountpoint.mkdir(exist_ok=True)
    said = packfs_cli("mount", set_url, mountpoint, "--binding", binding)
    try:
        assert said.returncode == 0 and "mounted 'http://127.0.0.1:" in said.stderr and SECRET not in said.stderr, \
            said.stderr
    finally:
        packfs_cli("unmount", mountpoint)
