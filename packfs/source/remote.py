"""An archive at a URL (``s3://``, ``http://``, ``https://``) as a byte source: ranged
GETs through obstore (Rust's object_store; ``pip install "packfs[remote]"``), imported
only when a URL is opened.

Opening sends one request, a suffix-range GET (``Range: bytes=-N``): its
``Content-Range`` gives the object's size, its ETag (and S3's version id, where the
bucket keeps versions) the identity, and its body the archive's last N bytes, which
hold everything the format needs to open.  Every later GET carries ``If-Match`` (and
the version id): a 412, or an answer with another ETag or size, means the object was
replaced, which is ArchiveChangedError from then on, so no read ever mixes the bytes
of two objects.  Each answer must be exactly the range asked for (a server that
ignores Range and sends the whole object is refused as soon as its status line
arrives, its body unread); a short, long or misplaced answer is retried, then refused.
5xx, 429, 503 SlowDown, reset or killed connections and timeouts are retried with
exponential backoff and full jitter; 403, 404 and missing credentials are not.

The bytes are not trusted further: the format code checks every byte against its CRC.
Nothing here holds more than the suffix and the parts in flight.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence, Tuple
from urllib.parse import unquote, urlsplit

from ..errors import (ArchiveChangedError, ClosedArchiveError, FormatError, RemoteAccessError, RemoteArchiveError,
                      RemoteIOError, RemoteNotFoundError, RemoteProtocolError, RemoteTimeoutError, missing_dependency)
from .s3config import s3_settings

__all__ = ["RemoteFile", "public_url", "REMOTE_SCHEMES"]

REMOTE_SCHEMES = ("s3", "http", "https")
# Requests one RemoteFile keeps in flight for read_ranges.  bench/remote_clients.py, at
# RTT 20 ms: random 64-256 KiB GETs are bound by latency, so requests/s rise in step
# with the number in flight (47, 377, 1482, 2610 at 1, 8, 32, 64) while obstore's CPU
# per request stays low (297, 158, 130, 157 us); 64 takes most of that and keeps the
# connections one reader opens to a server modest.
IN_FLIGHT = 64
# Parts of one large span in flight at once: 8 x 8 MiB parts bound what is held.
PARTS_IN_FLIGHT = 8


def public_url(url: str) -> str:
    """``url`` without what may be secret: user and password, query string, fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return f"{parts.scheme}://{netloc}{parts.path}"


class _Retry(Exception):
    """A failure worth another try: carries the error to raise when tries run out."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class RemoteFile:
    """The bytes of one object at a URL, as they were when it was opened.

    Parameters
    ----------
    url
        ``s3://bucket/key``, ``http://...`` or ``https://...``.
    storage_options
        For ``s3://``: credentials, region, endpoint (see :mod:`packfs.source.s3config`).
    suffix_bytes
        How many of the last bytes the opening request fetches (and keeps).
    memory_cap
        The bound for the core's own cache of this archive's bytes.
    timeout
        Seconds for connecting, and for a whole request, per try.
    retries
        Tries after the first, for failures worth another.
    part_bytes, coalesce_gap, in_flight, backoff
        A span over ``part_bytes`` is fetched as parallel parts of that size; spans of
        :meth:`read_ranges` closer than ``coalesce_gap`` share one GET; at most
        ``in_flight`` requests at once; the first retry waits up to ``backoff`` s,
        doubling each time (to 20 s at most).

    Raises
    ------
    RemoteNotFoundError, RemoteAccessError, RemoteCredentialsError, RemoteTimeoutError,
    RemoteProtocolError, RemoteIOError, RemoteArchiveError
        As their names say; ModuleNotFoundError without obstore.
    """

    mapping = None
    guarded = True

    def __init__(self, url: str, *, storage_options: Optional[dict] = None, suffix_bytes: int = 256 << 10,
                 memory_cap: int = 256 << 20, timeout: float = 30.0, retries: int = 5, part_bytes: int = 8 << 20,
                 coalesce_gap: int = 64 << 10, in_flight: int = IN_FLIGHT, backoff: float = 0.1) -> None:
        self.name = public_url(url)
        self.memory_cap = memory_cap
        self.part_bytes = max(1, part_bytes)
        self.coalesce_gap = coalesce_gap
        self.in_flight = max(1, in_flight)
        self._timeout, self._retries, self._backoff = timeout, max(0, retries), backoff
        self._lock = threading.Lock()
        self._stats = {"requests": 0, "bytes_fetched": 0, "retries": 0}
        self._changed = ""
        self._closed = False
        self._pool: Optional[ThreadPoolExecutor] = None
        self._obstore = _import_obstore()
        self._store, self._path = _open_store(url, self.name, storage_options, timeout)
        # A forked child (a mount's daemon, DataLoader workers) gets its own client, lock
        # and threads: the parent's client runtime and pool threads do not survive fork.
        self._pid = os.getpid()
        self._reopen = (url, storage_options, timeout)
        self._options: Dict[str, object] = {}
        self._opening = True
        try:
            data, meta, first = self._fetch({"suffix": max(1, suffix_bytes)}, None)
        except RemoteProtocolError as error:
            if not getattr(error, "range_ignored", False):
                raise
            data, meta, first = self._open_whole(suffix_bytes, error)
        self._opening = False
        self.size = int(meta["size"])
        self.suffix = data
        self.suffix_start = first
        self._etag = meta.get("e_tag") or None
        self._version = meta.get("version") or None
        modified = meta.get("last_modified")
        self._modified = modified
        if self._etag:
            self._options["if_match"] = self._etag
        elif modified is not None:
            self._options["if_unmodified_since"] = modified
        else:
            raise RemoteProtocolError(f"{self.name!r}: the server sends neither an ETag nor Last-Modified: "
                                      f"a replaced object could not be told apart, expected either")
        if self._version:
            self._options["version"] = self._version
        tag = self._version or self._etag or f"last-modified {modified.isoformat()}"
        self.identity: Tuple[str, str, int] = (self.name, tag, self.size)
        self.owner = (os.getuid(), os.getgid(), int(modified.timestamp()) * 10**9 if modified else 0)

    def _open_whole(self, suffix_bytes: int, refusal: RemoteProtocolError) -> Tuple[bytes, dict, int]:
        """The open on a server that ignores Range: a whole object no larger than the
        suffix asked for is fetched whole (a HEAD first says how large it is); a larger
        one is refused as ``refusal`` says."""
        try:
            with self._lock:
                self._stats["requests"] += 1
            size = int(self._obstore.head(self._store, self._path)["size"])
            if size > suffix_bytes:
                raise refusal
            with self._lock:
                self._stats["requests"] += 1
            result = self._obstore.get(self._store, self._path)
            meta, data = result.meta, result.bytes()
        except (self._obstore.exceptions.BaseError, OSError) as error:
            raise self._translate(error, 0.0) from None
        if len(data) != size or int(meta["size"]) != size:
            raise RemoteProtocolError(f"{self.name!r}: the server sent {len(data)} bytes of an object of {size}: "
                                      f"expected the whole object")
        with self._lock:
            self._stats["bytes_fetched"] += len(data)
        return bytes(data), meta, 0

    # -- reading -----------------------------------------------------------------------

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end): from the suffix fetched at open when they lie in it, else
        one ranged GET, or parallel parts of ``part_bytes`` for a larger span."""
        self._check_open()
        self._check_span(start, end)
        if start >= self.suffix_start:
            return self.suffix[start - self.suffix_start:end - self.suffix_start]
        if end <= start:
            return b""
        if end - start <= self.part_bytes:
            return self._get(start, end)
        buffer = bytearray(end - start)
        self.readinto(memoryview(buffer), start)
        return bytes(buffer)

    def readinto(self, buffer: memoryview, start: int) -> None:
        """Fill ``buffer`` with the bytes from ``start`` on (parts in parallel, as :meth:`read`)."""
        self._check_open()
        end = start + len(buffer)
        self._check_span(start, end)
        if start >= self.suffix_start:
            buffer[:] = self.suffix[start - self.suffix_start:end - self.suffix_start]
            return
        if end <= start:
            return
        parts = [(at, min(at + self.part_bytes, end)) for at in range(start, end, self.part_bytes)]
        target = buffer.cast("B") if buffer.format != "B" else buffer

        def fill(part: Tuple[int, int]) -> None:
            target[part[0] - start:part[1] - start] = self._get(*part)

        self._run(fill, parts, min(PARTS_IN_FLIGHT, self.in_flight))

    def read_ranges(self, spans: Sequence[Tuple[int, int]]) -> List[bytes]:
        """The bytes of each (start, end) span, in the order given: spans closer than
        ``coalesce_gap`` share one GET, up to ``in_flight`` GETs at once."""
        self._check_open()
        for start, end in spans:
            self._check_span(start, end)
        order = sorted(range(len(spans)), key=lambda k: spans[k])
        groups: List[List[int]] = []  # runs of span indexes fetched by one GET
        bounds: List[List[int]] = []  # each run's [first, last) byte
        for k in order:
            start, end = spans[k]
            if groups and start - bounds[-1][1] <= self.coalesce_gap \
                    and max(end, bounds[-1][1]) - bounds[-1][0] <= self.part_bytes:
                groups[-1].append(k)
                bounds[-1][1] = max(end, bounds[-1][1])
            else:
                groups.append([k])
                bounds.append([start, end])
        # Every GET at one level of the pool (a task that waited on parts it queued
        # behind itself could wait forever): each group's buffer filled part by part.
        buffers = []
        parts = []
        for first, last in bounds:
            buffer = memoryview(bytearray(last - first))
            buffers.append((first, buffer))
            parts += [(buffer, first, at, min(at + self.part_bytes, last)) for at in range(first, last, self.part_bytes)]

        def fill(part: Tuple[memoryview, int, int, int]) -> None:
            buffer, first, start, end = part
            if start >= self.suffix_start:
                buffer[start - first:end - first] = self.suffix[start - self.suffix_start:end - self.suffix_start]
            else:
                buffer[start - first:end - first] = self._get(start, end)

        self._run(fill, parts, self.in_flight)
        results: List[bytes] = [b""] * len(spans)
        for group, (first, buffer) in zip(groups, buffers):
            for k in group:
                results[k] = bytes(buffer[spans[k][0] - first:spans[k][1] - first])
        return results

    def _check_span(self, start: int, end: int) -> None:
        # The object's size is fixed at open: bytes past it are not there to fetch (a
        # server would answer with fewer, which is no reason to try again).
        if not 0 <= start <= end or end > self.size:
            raise FormatError(f"{self.name!r}: bytes {start}-{end} asked of an object of {self.size} bytes: "
                              f"expected a span inside it")

    def _run(self, task, items: list, limit: int) -> None:
        if len(items) <= 1:
            for item in items:
                task(item)
            return
        pool = self._executor()
        semaphore = threading.BoundedSemaphore(limit)

        def bounded(item) -> None:
            try:
                task(item)
            finally:
                semaphore.release()

        futures = []
        for item in items:
            semaphore.acquire()  # what is held stays bounded: at most ``limit`` parts in flight
            futures.append(pool.submit(bounded, item))
        for future in futures:
            future.result()

    def _executor(self) -> ThreadPoolExecutor:
        if self._pid != os.getpid():
            self._after_fork()
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.in_flight, thread_name_prefix="packfs-remote")
            return self._pool

    def _get(self, start: int, end: int) -> bytes:
        data, _, _ = self._fetch((start, end), self._options)
        return data

    def _fetch(self, byte_range: object, options: Optional[Dict[str, object]]) -> Tuple[bytes, dict, int]:
        """One GET of ``byte_range`` (a (start, end) or {"suffix": n}), tried again for
        failures worth it: (bytes, object metadata, first byte's offset)."""
        for attempt in range(self._retries + 1):
            self._check_open()
            try:
                return self._fetch_once(byte_range, options)
            except _Retry as failure:
                if attempt == self._retries:
                    raise failure.error from None
                with self._lock:
                    self._stats["retries"] += 1
                time.sleep(random.uniform(0.5, 1.0) * min(20.0, self._backoff * 2 ** attempt))
        raise AssertionError("unreachable")

    def _after_fork(self) -> None:
        """In a child process: a client, a lock and a pool of its own (the identity,
        and so If-Match, stay the parent's)."""
        url, storage_options, timeout = self._reopen
        self._lock = threading.Lock()
        self._pool = None
        self._store, self._path = _open_store(url, self.name, storage_options, timeout)
        self._pid = os.getpid()

    def _fetch_once(self, byte_range: object, options: Optional[Dict[str, object]]) -> Tuple[bytes, dict, int]:
        if self._pid != os.getpid():
            self._after_fork()
        with self._lock:
            self._stats["requests"] += 1
        began = time.monotonic()
        try:
            result = self._obstore.get(self._store, self._path, options={**(options or {}), "range": byte_range})
            meta = result.meta
            if options is not None:
                self._check_meta(meta)
            first, stop = result.range
            data = result.bytes()
        except (self._obstore.exceptions.BaseError, OSError) as error:  # obstore raises FileNotFoundError for 404
            raise self._translate(error, time.monotonic() - began) from None
        with self._lock:
            self._stats["bytes_fetched"] += len(data)
        if isinstance(byte_range, tuple):
            wanted = byte_range
        else:
            wanted = (max(0, int(meta["size"]) - byte_range["suffix"]), int(meta["size"]))  # type: ignore[index]
        if (first, stop) != wanted or len(data) != stop - first:
            raise _Retry(RemoteProtocolError(
                f"{self.name!r}: asked for bytes {wanted[0]}-{wanted[1] - 1}, the server answered with "
                f"{len(data)} bytes as {first}-{stop - 1}: expected exactly the range asked for"))
        return bytes(data), meta, first

    def _check_meta(self, meta: dict) -> None:
        etag, version, size = meta.get("e_tag") or None, meta.get("version") or None, int(meta["size"])
        if (self._etag and etag != self._etag) or (self._version and version != self._version) or size != self.size:
            self._note_change(f"it now has ETag {etag!r} and {size} bytes, it had {self._etag!r} and {self.size}")

    # -- errors ------------------------------------------------------------------------

    def _translate(self, error: Exception, elapsed: float) -> Exception:
        """The PackfsError for an obstore error; _Retry for one worth another try.  Its
        own message is never passed on: it names the URL whole (a query string too)."""
        exceptions = self._obstore.exceptions
        text = str(error)
        status_match = re.search(r"status(?: code)?: (\d{3})", text)
        status = int(status_match.group(1)) if status_match else 0
        where = f"{self.name!r}"
        if isinstance(error, exceptions.PreconditionError) or status == 412:
            self._note_change("the server answered 412 Precondition Failed to If-Match")
        if isinstance(error, (exceptions.NotFoundError, FileNotFoundError)) or status == 404:
            if not self._opening:
                self._note_change("it is gone (404 Not Found)")
            return RemoteNotFoundError(f"{where}: no such object (404 Not Found), expected an archive")
        if isinstance(error, (exceptions.PermissionDeniedError, exceptions.UnauthenticatedError)) or status in (401, 403):
            return RemoteAccessError(f"{where}: access denied ({status or 403}): expected credentials that may "
                                     f"read it (for s3://: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile "
                                     f"in ~/.aws, or storage_options)")
        if isinstance(error, exceptions.NotSupportedError) and "Range" in text:
            refusal = RemoteProtocolError(f"{where}: the server ignores Range requests (it answered 200 with the "
                                          f"whole object, which was not read): expected 206 Partial Content")
            refusal.range_ignored = True  # type: ignore[attr-defined]
            return refusal
        answered = re.search(r"Requested \S+, got (\S+)", text)
        if answered:
            return _Retry(RemoteProtocolError(f"{where}: the server answered another range than asked "
                                              f"({answered.group(1)}): expected exactly the range asked for"))
        if status == 416:
            return FormatError(f"{where}: the object is empty (416 Range Not Satisfiable), expected an archive")
        if status >= 500 or status == 429:
            return _Retry(RemoteIOError(f"{where}: the server kept failing ({status}, "
                                        f"{self._retries + 1} tries): try again later"))
        if status:
            return RemoteArchiveError(f"{where}: the server answered {status}, expected 206 Partial Content")
        if "Timeout" in text or "TimedOut" in text or "timed out" in text or elapsed >= self._timeout * 0.95:
            return _Retry(RemoteTimeoutError(f"{where}: no complete answer within {self._timeout:g} s "
                                             f"({self._retries + 1} tries)"))
        return _Retry(RemoteIOError(f"{where}: the connection failed ({_cause(text)}; {self._retries + 1} tries)"))

    def _note_change(self, why: str) -> None:
        with self._lock:
            if not self._changed:
                self._changed = why
        raise self._changed_error()

    def _changed_error(self) -> ArchiveChangedError:
        return ArchiveChangedError(f"{self.name!r}: the object changed while open ({self._changed}): reopen it; "
                                   f"nothing read from the new object was returned")

    # -- the ByteSource interface's checks ----------------------------------------------

    def check_unchanged(self) -> None:
        """Raise ArchiveChangedError if any answer since the open showed another
        object (another ETag, version or size, or a 412 to If-Match)."""
        if self._changed:
            raise self._changed_error()

    def check_before_map(self) -> None:
        """Nothing: a remote source has no map."""

    def release(self, start: int, end: int) -> None:
        """Nothing: a remote source has no map."""

    def stats(self) -> Dict[str, int]:
        """Counters since the open: ``requests`` sent (tries included), ``bytes_fetched``
        (bodies received whole), ``retries``."""
        with self._lock:
            return dict(self._stats)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedArchiveError(f"{self.name!r}: I/O operation on a closed archive")
        if self._changed:
            raise self._changed_error()

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Close; later reads raise ClosedArchiveError (requests in flight finish)."""
        self._closed = True
        self.suffix = b""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def __repr__(self) -> str:
        return f"RemoteFile({self.name!r})"


def _cause(text: str) -> str:
    for known, said in (("ConnectionReset", "connection reset"), ("ConnectionRefused", "connection refused"),
                        ("body error", "the answer was cut off"), ("IncompleteMessage", "the answer was cut off"),
                        ("error sending request", "the request could not be sent")):
        if known in text:
            return said
    return "no answer"


def _import_obstore():
    try:
        import obstore
        import obstore.exceptions  # noqa: F401
        import obstore.store  # noqa: F401
    except ImportError as error:
        raise missing_dependency(error, "obstore", "reading archives at URLs", "remote") from None
    return obstore


def _open_store(url: str, name: str, storage_options: Optional[dict], timeout: float):
    """(store, path in it) for ``url``: an S3Store for the bucket, or an HTTPStore for
    the URL's directory."""
    from obstore.store import HTTPStore, S3Store

    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    client = {"timeout": f"{max(1, int(timeout * 1000))}ms", "connect_timeout": f"{max(1, int(timeout * 1000))}ms"}
    no_retries = {"max_retries": 0}  # retried here, where they are counted and the errors named
    if scheme == "s3":
        if not parts.netloc or not parts.path.strip("/"):
            raise RemoteArchiveError(f"{name!r}: expected s3://BUCKET/KEY")
        settings = s3_settings(storage_options, url=name)
        config = {key: settings[key] for key in ("region", "endpoint") if settings.get(key)}
        provider = None
        if settings.get("anon"):
            config["skip_signature"] = True
        else:
            # The key pair found, whole: S3Store would otherwise fill what it was not
            # given from the environment (a session token beside another pair's key).
            credential = {"access_key_id": settings["access_key_id"], "secret_access_key": settings["secret_access_key"],
                          "token": settings.get("session_token") or None, "expires_at": None}

            def provider() -> dict:
                return credential
        if str(settings.get("endpoint") or "").startswith("http://"):
            client["allow_http"] = True
        return S3Store(parts.netloc, config=config, client_options=client, retry_config=no_retries,
                       credential_provider=provider), unquote(parts.path.lstrip("/"))
    if scheme in ("http", "https"):
        if storage_options:
            raise RemoteArchiveError(f"{name!r}: storage_options are for s3:// URLs; an http(s) URL takes none")
        if parts.query:
            raise RemoteArchiveError(f"{name!r}: URLs with a query string (signed URLs) are not supported: "
                                     f"expected a plain http(s):// URL, or s3://BUCKET/KEY with credentials")
        directory, _, base = parts.path.rpartition("/")
        if not base:
            raise RemoteArchiveError(f"{name!r}: expected the URL of an archive file, not of a directory")
        headers = {}
        if parts.username is not None:
            import base64

            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        if headers:
            client["default_headers"] = headers
        client["allow_http"] = scheme == "http"
        root = f"{scheme}://{parts.hostname if ':' not in (parts.hostname or '') else f'[{parts.hostname}]'}" \
               f"{f':{parts.port}' if parts.port else ''}{directory}"
        return HTTPStore.from_url(root, client_options=client, retry_config=no_retries), unquote(base)
    raise RemoteArchiveError(f"{name!r}: {scheme}:// is not a scheme packfs reads: expected s3://, http:// or https://")
