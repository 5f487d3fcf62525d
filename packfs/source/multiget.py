"""Many ranged GETs at once, from one thread: the fast path of a RemoteFile's batches.

A batch of shuffled 110 KB files is a few hundred GETs, each bound by a round trip.
Through urllib3 each costs about 300 us of CPU in its own thread (bench/batch_inflight.py),
and the threads fight over the GIL: one process then reads under 2,000 files/s
whatever the network.  Here the GETs of a batch share one thread and a set of
keep-alive connections driven by ``selectors`` (epoll): a request is written whole,
the answer's head parsed with a few splits, its body received straight into the
buffer it is for (or handed on piece by piece to a sink, which keeps nothing of it in
memory: a read ahead written to the disk cache as it arrives).

Only the answer a well-behaved server gives is taken here: ``206`` with exactly the
Content-Range and Content-Length asked for, the ETag (and version id) of the open, a
body of that length.  Anything else -- another status, a redirect, a chunked body,
another ETag, a reset or a silent connection -- leaves that span to the caller, which
fetches it through the RemoteFile's own path, with its retries and its errors
(:mod:`packfs.source.remote`).  So this module decides nothing about failures.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import ssl
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

__all__ = ["MultiGet", "Sink"]

HEAD_LIMIT = 64 << 10  # an answer's head longer than this is left to the slow path
RECEIVE = 256 << 10

#: Where a body goes piece by piece: called with (the span's position in the batch, the
#: piece's offset in the span, the piece), in order; a span left to the caller and
#: fetched again starts again at offset 0.  The piece is only valid during the call.
Sink = Callable[[int, int, memoryview], None]


class _Connection:
    """One keep-alive connection and the request it carries (if any)."""

    __slots__ = ("sock", "connected", "reused", "span", "out", "head", "body", "pieces", "sink", "scratch", "got",
                 "closing", "index", "deadline")

    def __init__(self, sock) -> None:
        self.sock = sock
        self.connected = False
        self.reused = False  # it carried an answer before (the server may have closed it since)
        self.span: Tuple[int, int] = (0, 0)
        self.index = -1  # the span's position in the batch
        self.out = b""  # what of the request is left to send
        self.head = bytearray()  # the answer's head as received so far
        self.body: Optional[memoryview] = None  # where the body goes, if given a buffer
        self.pieces: List[bytes] = []  # else the body as received
        self.sink: Optional[Sink] = None  # or where each piece goes as it is received,
        self.scratch: Optional[memoryview] = None  # received first into this (its batch's own)
        self.got = 0
        self.closing = False  # the server said Connection: close
        self.deadline = 0.0  # when the request it carries is given up (time.monotonic())


class MultiGet:
    """Ranged GETs of one object over up to ``connections`` keep-alive connections.

    ``request_head(start, end)`` gives a request's head (bytes, through its blank
    line); ``accept(headers)`` tells whether an answer's headers (names in lower
    case) are the object's as opened.  Connections belong to the process that made
    them (a forked child drops its parent's unused)."""

    def __init__(self, url: str, request_head, accept, connections: int, timeout: float) -> None:
        parts = urlsplit(url)
        self.tls = parts.scheme == "https"
        self.address = (parts.hostname or "", parts.port or (443 if self.tls else 80))
        self.server_name = parts.hostname or ""
        self.request_head = request_head
        self.accept = accept
        self.connections = max(1, connections)
        self.timeout = timeout
        self._idle: List[_Connection] = []
        self._pid = os.getpid()
        self._context: Optional[ssl.SSLContext] = None

    def get(self, spans: Sequence[Tuple[int, int]], into: Optional[Sequence[memoryview]] = None,
            sink: Optional[Sink] = None) -> Tuple[List[object], int, int]:
        """Fetch each (start, end) span: (per span its bytes -- a bytearray, or with
        ``into`` the buffer ``into[k]`` it was received into, or with ``sink`` True once
        all its pieces went there --, or None for a span left to the caller; the
        requests sent; the body bytes received)."""
        if os.getpid() != self._pid:
            self._idle, self._pid = [], os.getpid()  # the parent's: never used here
        results: List[object] = [None] * len(spans)
        pending = list(range(len(spans) - 1, -1, -1))  # popped from the end: in order
        again = set()  # spans that met a reused connection the server had closed: tried once more
        selector = selectors.DefaultSelector()
        active: Dict[int, _Connection] = {}
        requests = received = 0
        # A sink's pieces are received one at a time into one buffer of this call's
        # (batches of other threads use their own).
        scratch = memoryview(bytearray(RECEIVE)) if sink is not None else None
        try:
            while pending or active:
                while pending and len(active) < self.connections:
                    connection = self._connection()
                    if connection is None:
                        pending = []  # cannot connect: what is left goes to the caller
                        break
                    k = pending.pop()
                    start, end = spans[k]
                    connection.index, connection.span = k, (start, end)
                    connection.out, connection.head, connection.got = self.request_head(start, end), bytearray(), 0
                    connection.body, connection.pieces = (into[k] if into is not None else None), []
                    connection.sink, connection.scratch = sink, scratch
                    # The whole request, not each wait, is bounded: a server that
                    # trickles its answer a byte at a time is given up as one that is silent.
                    connection.deadline = time.monotonic() + self.timeout
                    active[connection.sock.fileno()] = connection
                    selector.register(connection.sock, selectors.EVENT_WRITE, connection)
                    requests += 1
                if not active:
                    break
                now = time.monotonic()
                late = [connection for connection in active.values() if connection.deadline <= now]
                if late:
                    for connection in late:  # past its deadline: left to the caller
                        active.pop(connection.sock.fileno(), None)
                        selector.unregister(connection.sock)
                        connection.sock.close()
                    pending = []  # the server is slow: what is left goes to the caller too
                    continue
                events = selector.select(max(0.0, min(c.deadline for c in active.values()) - now))
                for key, _ in events:
                    connection = key.data
                    done = self._step(connection, selector)
                    if done is None:
                        continue
                    active.pop(connection.sock.fileno(), None)
                    selector.unregister(connection.sock)
                    if done:
                        pieces = connection.pieces
                        results[connection.index] = True if sink is not None else \
                            connection.body if into is not None else \
                            pieces[0] if len(pieces) == 1 else b"".join(pieces)
                        received += connection.got
                        if connection.closing:
                            connection.sock.close()
                        else:
                            connection.reused = True
                            self._idle.append(connection)
                        continue
                    if connection.reused and connection.head == b"" and connection.index not in again:
                        again.add(connection.index)  # closed while idle: on a new connection
                        pending.append(connection.index)
                    connection.sock.close()
        finally:
            for connection in active.values():
                connection.sock.close()
            selector.close()
        return results, requests, received

    def close(self) -> None:
        """Close the idle connections."""
        idle, self._idle = self._idle, []
        if os.getpid() == self._pid:
            for connection in idle:
                connection.sock.close()

    # -- one connection ----------------------------------------------------------------

    def _connection(self) -> Optional[_Connection]:
        while self._idle:
            connection = self._idle.pop()
            if connection.sock.fileno() >= 0:
                return connection
        try:
            sock = socket.socket(socket.AF_INET6 if ":" in self.address[0] else socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            code = sock.connect_ex(self.address)
        except OSError:
            return None
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            return None
        if self.tls:
            if self._context is None:
                self._context = ssl.create_default_context()
            sock = self._context.wrap_socket(sock, server_hostname=self.server_name, do_handshake_on_connect=False)
        return _Connection(sock)

    def _step(self, connection: _Connection, selector) -> Optional[bool]:
        """Move ``connection`` on: None while its answer is still coming, True when the
        body is in, False when the span is left to the caller (the connection closed)."""
        sock = connection.sock
        try:
            if not connection.connected:
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    return False
                if self.tls:
                    try:
                        sock.do_handshake()
                    except ssl.SSLWantReadError:
                        selector.modify(sock, selectors.EVENT_READ, connection)
                        return None
                    except ssl.SSLWantWriteError:
                        selector.modify(sock, selectors.EVENT_WRITE, connection)
                        return None
                connection.connected = True
            if connection.out:
                sent = sock.send(connection.out)
                connection.out = connection.out[sent:]
                if connection.out:
                    selector.modify(sock, selectors.EVENT_WRITE, connection)
                    return None
                selector.modify(sock, selectors.EVENT_READ, connection)
                return None
            while True:
                if connection.head is None:
                    return self._receive_body(connection)
                piece = sock.recv(RECEIVE)
                if not piece:
                    return False
                connection.head += piece  # type: ignore[operator]
                end = connection.head.find(b"\r\n\r\n")  # type: ignore[union-attr]
                if end < 0:
                    if len(connection.head) > HEAD_LIMIT:  # type: ignore[arg-type]
                        return False
                    continue
                head, rest = bytes(connection.head[:end]), connection.head[end + 4:]  # type: ignore[index]
                connection.head = None  # type: ignore[assignment]
                if not self._head_ok(connection, head):
                    return False
                length = connection.span[1] - connection.span[0]
                if len(rest) > length:
                    return False  # more than the body: not an answer to this request
                if connection.body is not None:
                    connection.body[:len(rest)] = rest
                elif connection.sink is not None:
                    if rest:
                        connection.sink(connection.index, 0, memoryview(rest))
                elif rest:
                    connection.pieces.append(bytes(rest))
                connection.got = len(rest)
                if connection.got == length:
                    return True
        except (ssl.SSLWantReadError, BlockingIOError, InterruptedError):
            return None
        except ssl.SSLWantWriteError:
            selector.modify(sock, selectors.EVENT_WRITE, connection)
            return None
        except (OSError, ValueError):
            return False

    def _receive_body(self, connection: _Connection) -> Optional[bool]:
        """Receive what the socket has of the body: True once it is all in."""
        body, sock = connection.body, connection.sock
        length = connection.span[1] - connection.span[0]
        while connection.got < length:
            if body is not None:
                got = sock.recv_into(body[connection.got:])
            elif connection.sink is not None:
                piece = connection.scratch[:min(RECEIVE, length - connection.got)]  # type: ignore[index]
                got = sock.recv_into(piece)
                if got:
                    connection.sink(connection.index, connection.got, piece[:got])
            else:
                # A small body that arrives at once is one bytes object, never copied; a
                # large one comes in pieces of RECEIVE (recv allocates what it is asked for).
                piece = sock.recv(min(RECEIVE, length - connection.got))
                connection.pieces.append(piece)
                got = len(piece)
            if not got:
                return False
            connection.got += got
        return True

    def _head_ok(self, connection: _Connection, head: bytes) -> bool:
        lines = head.split(b"\r\n")
        status = lines[0].split(b" ", 2)
        if len(status) < 2 or status[1] != b"206" or not status[0].startswith(b"HTTP/1."):
            return False
        headers: Dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if sep:
                headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        start, end = connection.span
        if headers.get("content-length") != str(end - start) or "transfer-encoding" in headers:
            return False
        answered = headers.get("content-range", "")
        if not answered.startswith(f"bytes {start}-{end - 1}/"):
            return False
        if not self.accept(headers, answered[answered.index("/") + 1:]):
            return False
        connection.closing = headers.get("connection", "").lower() == "close" or status[0] == b"HTTP/1.0"
        return True
