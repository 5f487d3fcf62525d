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
from tests.test_remote_source import nginx  # noqa: F401 (the fixture: a real nginx, stopped at the end)

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
