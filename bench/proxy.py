"""A latency-injecting HTTP/1.1 proxy for loopback servers, with fault injection.

It listens on 127.0.0.1 and forwards to a target port.  Each request is delayed by
half the round-trip time before it reaches the server, and each response by half
before it reaches the client, so one request costs one RTT ``rtt`` (a new connection
one more, its handshake); ``bandwidth`` (bytes/s, per connection) paces response
bodies.  It counts connections, requests and response bytes, and keeps each request's
head (``heads``) for tests that check what a client sent.  ``serial`` makes it a
serial endpoint: one request at a time across all connections, each held from its
head's arrival until its response was sent (others wait their turn), as a server that
answers one GET at a time does (bench/remote_peers.py's slow endpoint).

It is HTTP-aware (request heads; responses framed by Content-Length or chunked) so
that it can inject the faults the remote-source tests need, each for the next
``count`` requests that ``fault_filter`` accepts (by default, every request):

``503``            answer ``503 SlowDown`` (S3's XML) without asking the server
``kill``           send the head and half the body, then reset the connection
``truncate``       send the head and half the body, then close cleanly
``flip``           flip one bit in the middle of the body
``ignore_range``   drop the request's Range header (the server answers 200, whole)
``wrong_range``    shift the response's Content-Range by one byte
``longer``         ask the server for one byte more than the client asked
``stall``          forward the request, never answer (until the client gives up)

Run as a program for benches (its CPU then is not the client's)::

    python -m bench.proxy --target 8080 --rtt-ms 20 [--port 0] [--bandwidth B]

which prints the port it listens on, then serves until killed.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import socket
import struct
import sys
import threading
import time
from typing import Callable, Optional

FAULTS = ("503", "kill", "truncate", "flip", "ignore_range", "wrong_range", "longer", "stall")
SLOW_DOWN = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>"
             b"<Message>Please reduce your request rate.</Message></Error>")


class Proxy:
    """The proxy, serving on :attr:`port` from construction until :meth:`close`."""

    def __init__(self, target_port: int, rtt: float = 0.0, bandwidth: float = 0.0, port: int = 0,
                 target_host: str = "127.0.0.1", serial: bool = False) -> None:
        self.target = (target_host, target_port)
        self.rtt = rtt
        self.bandwidth = bandwidth
        self.connections = 0
        self.requests = 0
        self.response_bytes = 0
        self.faults_injected = 0
        self.heads: list = []  # every request's head (bytes), as the client sent it
        self._fault: Optional[str] = None
        self._fault_count = 0
        self._fault_filter: Callable[[bytes], bool] = lambda head: True
        self._lock = threading.Lock()
        # Held for a whole request in serial mode; not self._lock, which the counters need meanwhile.
        self._turn = threading.Lock() if serial else None
        self._open: set = set()
        self._listener = socket.create_server(("127.0.0.1", port), backlog=256)
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def fault(self, kind: Optional[str], count: int = 1, when: Optional[Callable[[bytes], bool]] = None) -> None:
        """Inject ``kind`` (one of FAULTS, or None for none) into the next ``count``
        requests whose head (bytes) ``when`` accepts."""
        if kind is not None and kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}, expected one of {FAULTS}")
        with self._lock:
            self._fault, self._fault_count = kind, count
            self._fault_filter = when or (lambda head: True)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            sockets = list(self._open)
        for sock in sockets:
            _close(sock)

    def __enter__(self) -> "Proxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- serving ---------------------------------------------------------------------

    def _take_fault(self, head: bytes) -> Optional[str]:
        with self._lock:
            if self._fault and self._fault_count > 0 and self._fault_filter(head):
                self._fault_count -= 1
                self.faults_injected += 1
                return self._fault
        return None

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._open.add(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True, name="proxy-conn").start()

    def _serve(self, client: Optional[socket.socket]) -> None:
        server = None
        try:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client_in = client.makefile("rb")
            time.sleep(self.rtt)  # the TCP handshake's round trip
            server = socket.create_connection(self.target)
            server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._open.add(server)
            server_in = server.makefile("rb")
            while not self._closed:
                head = _read_head(client_in)
                if head is None:
                    return
                with self._turn or contextlib.nullcontext():
                    with self._lock:
                        self.requests += 1
                        self.heads.append(head)
                    fault = self._take_fault(head)
                    time.sleep(self.rtt / 2)
                    if fault == "503":
                        client.sendall(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                                       b"Content-Length: %d\r\n\r\n" % len(SLOW_DOWN) + SLOW_DOWN)
                        continue
                    if fault == "ignore_range":
                        head = re.sub(rb"(?im)^range:[^\r\n]*\r\n", b"", head)
                    elif fault == "longer":
                        head = re.sub(rb"(?im)^(range: *bytes=\d+-)(\d+)", lambda m: m.group(1) + str(int(m.group(2)) + 1).encode(), head)
                    server.sendall(head)
                    response = _read_head(server_in)
                    if response is None:
                        return
                    if fault == "stall":
                        client_in.read(1)  # until the client closes
                        return
                    if fault == "wrong_range":
                        response = re.sub(rb"(?im)^(content-range: *bytes )(\d+)-(\d+)",
                                          lambda m: m.group(1) + b"%d-%d" % (int(m.group(2)) + 1, int(m.group(3)) + 1), response)
                    time.sleep(self.rtt / 2)
                    body = _read_body(server_in, response, head)
                    if fault == "flip" and body:
                        middle = len(body) // 2
                        body = body[:middle] + bytes([body[middle] ^ 0x10]) + body[middle + 1:]
                    if fault in ("kill", "truncate"):
                        client.sendall(response + body[: len(body) // 2])
                        if fault == "kill":  # a reset (RST), not a clean close (FIN)
                            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                            with self._lock:
                                self._open.discard(client)
                            client.close()
                            client = None
                        return
                    client.sendall(response)
                    self._send_paced(client, body)
                    with self._lock:
                        self.response_bytes += len(response) + len(body)
        except OSError:
            pass
        finally:
            for sock in (client, server):
                if sock is not None:
                    _close(sock)
                    with self._lock:
                        self._open.discard(sock)

    def _send_paced(self, sock: socket.socket, body: bytes) -> None:
        if not self.bandwidth:
            sock.sendall(body)
            return
        step = 64 << 10
        start = time.monotonic()
        for offset in range(0, len(body), step):
            sock.sendall(body[offset:offset + step])
            ahead = start + (offset + step) / self.bandwidth - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def _read_head(stream) -> Optional[bytes]:
    """A request's or response's head, up to and including the blank line; None at EOF."""
    lines = []
    while True:
        line = stream.readline(65537)
        if not line:
            return None
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)


def _read_body(stream, response: bytes, request: bytes) -> bytes:
    """The body that follows ``response`` (framed as HTTP/1.1 frames it), chunked
    framing included, as raw bytes to forward."""
    if request.startswith(b"HEAD ") or re.match(rb"HTTP/1\.[01] (1\d\d|204|304)", response):
        return b""
    length = re.search(rb"(?im)^content-length: *(\d+)", response)
    if length:
        return stream.read(int(length.group(1)))
    if re.search(rb"(?im)^transfer-encoding: *chunked", response):
        parts = []
        while True:
            size_line = stream.readline()
            parts.append(size_line)
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                while True:  # trailers, then the blank line
                    line = stream.readline()
                    parts.append(line)
                    if line in (b"\r\n", b"\n", b""):
                        return b"".join(parts)
            parts.append(stream.read(size + 2))
    return stream.read()  # framed by the connection's close


def main(argv: Optional[list] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=int, required=True, help="the server's port on 127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="the port to listen on (0: any free one)")
    parser.add_argument("--rtt-ms", type=float, default=20.0, help="round-trip time to add, in ms")
    parser.add_argument("--bandwidth", type=float, default=0.0, help="bytes/s per connection (0: no cap)")
    parser.add_argument("--serial", action="store_true", help="answer one request at a time")
    args = parser.parse_args(argv)
    proxy = Proxy(args.target, rtt=args.rtt_ms / 1000, bandwidth=args.bandwidth, port=args.port,
                  serial=args.serial)
    print(proxy.port, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        proxy.close()


if __name__ == "__main__":
    main(sys.argv[1:])
