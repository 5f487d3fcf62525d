"""An archive at a URL (``s3://``, ``http://``, ``https://``) as a byte source: ranged
GETs through urllib3 (``pip install "packfs[remote]"``), imported only when a URL is
opened; S3's requests signed here (:mod:`packfs.source.sigv4`).

Opening sends one request, a suffix-range GET (``Range: bytes=-N``): its
``Content-Range`` gives the object's size, its ETag (and S3's version id, where the
bucket keeps versions) the identity, and its body the archive's last N bytes, which
hold everything the format needs to open.  Every later GET carries ``If-Match`` (and
the version id): a 412, or an answer with another ETag or size, means the object was
replaced, which is ArchiveChangedError from then on, so no read ever mixes the bytes
of two objects.  Each answer must be exactly the range asked for (a server that
ignores Range and sends the whole object is refused as soon as its head arrives, its
body unread, unless the whole object is no larger than the suffix asked for); a
short, long or misplaced answer is retried, then refused.  5xx, 429, 503 SlowDown,
reset or killed connections and timeouts are retried with exponential backoff and
full jitter; 403, 404 and missing credentials are not.

Fork safety: the connections, the lock and the threads belong to the process that
made them.  A forked child (DataLoader workers, ``packfs mount``'s daemon) makes its
own before its first request (it never touches the parent's sockets); the identity,
and so If-Match, stay the parent's.

The bytes are not trusted further: the format code checks every byte against its CRC.
Nothing here holds more than the suffix and the parts in flight.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from email.utils import parsedate_to_datetime
from typing import Dict, List, Optional, Sequence, Tuple
from urllib.parse import unquote, urljoin, urlsplit

from ..errors import (ArchiveChangedError, ClosedArchiveError, FormatError, PackfsError, RemoteAccessError,
                      RemoteArchiveError, RemoteIOError, RemoteNotFoundError, RemoteProtocolError, RemoteTimeoutError,
                      missing_dependency)
from .multiget import MultiGet, Sink
from .s3config import s3_settings
from .sigv4 import canonical_query, encode_key, sign_v4
from .tails import CHECK_BYTES, KnownTail

__all__ = ["RemoteFile", "public_url", "REMOTE_SCHEMES"]

REMOTE_SCHEMES = ("s3", "http", "https")
# Requests one RemoteFile keeps in flight for read_ranges.  bench/remote_clients.py, at
# RTT 20 ms: random 64-256 KiB GETs are bound by latency, so requests/s rise in step
# with the number in flight (47, 363, 1443, 2879 at 1, 8, 32, 64) while the CPU per
# request falls (474, 315, 288, 256 us); 64 takes most of that and keeps the
# connections one reader opens to a server modest (the pool holds at most this many).
# bench/batch_inflight.py, Archive.read_many of batches of 256 shuffled 90-130 KB files
# (3,000 in the archive) at RTT 20 ms, no bandwidth cap, client on CPU 1, nginx and the
# proxy on CPU 0, the batch's GETs on one thread (packfs.source.multiget): files/s 773,
# 1376, 2523, 3987, 4356 at 16, 32, 64, 128, 256 in flight (0.31, 0.55, 1, 1.58, 1.73
# of 64's; CPU 119, 94, 92, 77, 76 us a file; drift 1.04).  Through one thread per GET
# (urllib3) the same run gave 712, 1274, 1893, 2463 at 16-128 with 350 us of CPU a file.
# More than 64 still pays, but every DataLoader worker of every process on a node opens
# this many connections to the server (8 workers x 64 = 512): 64 stays the default.
IN_FLIGHT = 64
# Parts of one large span in flight at once: 8 x 8 MiB parts bound what is held.
PARTS_IN_FLIGHT = 8
# A body is read a receive at a time (at most this much), the time left checked
# before each: what bounds a whole request when a server trickles its answer.
READ_PIECE = 1 << 20
# What is read of an error's body (S3's XML names the error in <Code>).
ERROR_BODY_LIMIT = 64 << 10
REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_S3_CODE = re.compile(rb"<Code>([A-Za-z0-9.]+)</Code>")
# S3 error codes -> how they are told (the HTTP status alone is ambiguous: 400 is an
# expired token as well as a malformed request).
S3_NOT_FOUND = ("NoSuchKey", "NoSuchBucket", "NoSuchVersion")
S3_ACCESS = {"AccessDenied": "were refused", "InvalidAccessKeyId": "name a key id the server does not know",
             "SignatureDoesNotMatch": "have a secret that does not match the key id",
             "ExpiredToken": "have a session token that expired", "InvalidToken": "have an invalid session token",
             "TokenRefreshRequired": "have a session token that expired",
             "AuthorizationHeaderMalformed": "are for another region than the bucket's"}
# The conditions of every GET after the open, by name -> the header that carries each.
CONDITION_HEADERS = {"if_match": "If-Match", "if_unmodified_since": "If-Unmodified-Since"}
S3_RETRIED = ("SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout")
# A refused connection (nothing listens on the port: a wrong port, a server not
# started or gone) is tried once more, after the first backoff, and then told: on
# loopback or a LAN it is final at once, and 6 tries spread over 5 s only delayed the
# error.  The one retry covers a server restarting or a load balancer's node cycling.
# Timeouts, resets, cut-off answers, 5xx, 429 and S3's SlowDown keep every retry.
REFUSED_RETRIES = 1


def split_s3_url(url: str) -> Tuple[str, str]:
    """(bucket, key) of ``s3://BUCKET/KEY``, the key taken literally, as ``aws s3``
    takes it: everything after the bucket's ``/``, ``#``, ``?``, ``%XX``, a leading or
    doubled ``/`` and spaces included (an S3 key may hold any of them; a URL parser
    would cut at ``#`` and ``?``, decode ``%2F`` and drop a leading ``/``)."""
    rest = url.split("://", 1)[1] if "://" in url else ""
    bucket, _, key = rest.partition("/")
    return bucket, key


def public_url(url: str) -> str:
    """``url`` without what may be secret: user and password, query string, fragment.
    An ``s3://`` URL holds no secret (credentials come from elsewhere) and its key is
    literal: it is kept whole, but for a user and password before the bucket."""
    if url.split(":", 1)[0].lower() == "s3":
        bucket, key = split_s3_url(url)
        return f"s3://{bucket.rpartition('@')[2]}/{key}"
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return f"{parts.scheme}://{netloc}{parts.path}"


class _Retry(Exception):
    """A failure worth another try: carries the error to raise when tries run out, and
    at most how many retries its kind gets (None: the ``retries`` option's)."""

    def __init__(self, error: Exception, most: Optional[int] = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.most = most


class _Endpoint:
    """Where one object's GETs go and what they carry: the URL (``url``), headers for
    every request (an http URL's Basic auth), and for ``s3://`` the signature."""

    def __init__(self, url: str, name: str, storage_options: Optional[dict]) -> None:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        self.name = name
        self.headers: Dict[str, str] = {}
        self.settings: Optional[dict] = None  # the S3 settings when signing
        self.is_s3 = scheme == "s3"
        self.server = ""  # for s3://, the endpoint the bucket is on (a bucket's name is its own there)
        self.follows_redirects = not self.is_s3  # a signature is for one host and path
        self.query: Dict[str, str] = {}
        if scheme == "s3":
            bucket, key = split_s3_url(url)
            if not bucket or not key or "@" in bucket:
                raise RemoteArchiveError(f"{name!r}: expected s3://BUCKET/KEY")
            settings = s3_settings(storage_options, url=name)
            self.region = str(settings["region"])
            endpoint = str(settings.get("endpoint") or "")
            if endpoint:
                # Path-style, as S3-compatible servers (MinIO, moto, Ceph) take it.
                where = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
                if where.username is not None or where.password is not None:
                    # It would be sent in Host: (and signed); S3 takes no password there.
                    raise RemoteArchiveError(
                        f"{name!r}: the S3 endpoint {public_url(where.geturl())!r} has a user or password in it: "
                        f"expected http(s)://HOST[:PORT] (credentials go in AWS_ACCESS_KEY_ID and "
                        f"AWS_SECRET_ACCESS_KEY, a profile, or storage_options key and secret)")
                if where.scheme not in ("http", "https") or not where.hostname:
                    raise RemoteArchiveError(f"{name!r}: the S3 endpoint {public_url(where.geturl())!r} is not "
                                             f"an http(s) URL: expected http(s)://HOST[:PORT]")
                self.origin = f"{where.scheme}://{where.netloc}"
                self.path = f"{where.path.rstrip('/')}/{encode_key(bucket)}/{encode_key(key)}"
                self.host = where.netloc
                self.server = self.origin + where.path.rstrip("/")
            elif "." in bucket:
                # A dotted bucket's virtual host would not match AWS's wildcard certificate.
                self.host = f"s3.{self.region}.amazonaws.com"
                self.origin, self.path = f"https://{self.host}", f"/{encode_key(bucket)}/{encode_key(key)}"
            else:
                self.host = f"{bucket}.s3.{self.region}.amazonaws.com"
                self.origin, self.path = f"https://{self.host}", f"/{encode_key(key)}"
            if not endpoint:
                self.server = f"https://s3.{self.region}.amazonaws.com"
            if not settings.get("anon"):
                self.settings = settings
            return
        if scheme not in ("http", "https"):
            raise RemoteArchiveError(f"{name!r}: {scheme}:// is not a scheme packfs reads: expected s3://, "
                                     f"http:// or https://")
        if storage_options:
            raise RemoteArchiveError(f"{name!r}: storage_options are for s3:// URLs; an http(s) URL takes none")
        if parts.query:
            raise RemoteArchiveError(f"{name!r}: URLs with a query string (signed URLs) are not supported: "
                                     f"expected a plain http(s):// URL, or s3://BUCKET/KEY with credentials")
        if not parts.path.rpartition("/")[2]:
            raise RemoteArchiveError(f"{name!r}: expected the URL of an archive file, not of a directory")
        if not parts.hostname:
            raise RemoteArchiveError(f"{name!r}: expected a host in the URL")
        if parts.username is not None:
            import base64

            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            self.headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        self.host = host + (f":{parts.port}" if parts.port else "")
        self.origin, self.path = f"{scheme}://{self.host}", parts.path

    def pin_version(self, version: str) -> None:
        """Every later GET asks for this version of the object."""
        self.query = {"versionId": version}

    @property
    def url(self) -> str:
        """The URL every GET starts from (its query, the version id, is no secret)."""
        query = canonical_query(self.query)
        return self.origin + self.path + (f"?{query}" if query else "")

    def signed(self, url: str) -> Dict[str, str]:
        """The headers of a GET of ``url``: the signature for S3, Basic auth where the
        URL gave it (on the origin it was given for, not on a redirect's other host)."""
        if self.settings is not None:
            settings = self.settings
            return {"Host": self.host, **sign_v4("GET", self.host, self.path, canonical_query(self.query),
                                                 region=self.region, access_key_id=settings["access_key_id"],
                                                 secret_access_key=settings["secret_access_key"],
                                                 session_token=settings.get("session_token"))}
        if self.headers and not url.startswith(self.origin + "/"):
            return {}
        return self.headers

    def credentials_source(self) -> str:
        """Where the key pair came from, for an error message (never the keys)."""
        return str((self.settings or {}).get("found_in") or "storage_options, the environment or ~/.aws")


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
        Seconds for connecting, for each wait for the server's bytes, and for a
        whole answer (checked before each receive of its body: a server that
        trickles times out), per try; a batch's GETs each have it from when sent.
    retries
        Tries after the first, for failures worth another.
    part_bytes, coalesce_gap, in_flight, backoff
        A span over ``part_bytes`` is fetched as parallel parts of that size; spans of
        :meth:`read_ranges` closer than ``coalesce_gap`` share one GET; at most
        ``in_flight`` requests at once; the first retry waits up to ``backoff`` s,
        doubling each time (to 20 s at most).
    tails
        A :class:`~packfs.source.tails.TailStore` (the disk cache's): an object whose
        last bytes it kept is opened by fetching its footer only (64 bytes), the rest
        taken from it when the object is the same; None: the last bytes are fetched.

    Raises
    ------
    RemoteNotFoundError, RemoteAccessError, RemoteCredentialsError, RemoteTimeoutError,
    RemoteProtocolError, RemoteIOError, RemoteArchiveError
        As their names say; ModuleNotFoundError without urllib3.
    """

    mapping = None
    guarded = True

    def __init__(self, url: str, *, storage_options: Optional[dict] = None, suffix_bytes: int = 256 << 10,
                 memory_cap: int = 256 << 20, timeout: float = 30.0, retries: int = 5, part_bytes: int = 8 << 20,
                 coalesce_gap: int = 64 << 10, in_flight: int = IN_FLIGHT, backoff: float = 0.1,
                 tails=None) -> None:
        self.name = public_url(url)
        self.memory_cap = memory_cap
        self.part_bytes = max(1, part_bytes)
        self.coalesce_gap = coalesce_gap
        self.in_flight = max(1, in_flight)
        self._timeout, self._retries, self._backoff = timeout, max(0, retries), backoff
        self._stats = {"requests": 0, "bytes_fetched": 0, "retries": 0}
        self._changed = ""
        self._closed = False
        self._endpoint = _Endpoint(url, self.name, storage_options)
        self._urllib3 = _import_urllib3()
        self._options: Dict[str, str] = {}  # CONDITION_HEADERS's names -> values
        self._etag: Optional[str] = None
        self._version: Optional[str] = None
        self.size = -1  # known once the open's answer came
        # What belongs to one process: the connections, the lock, the threads.  A
        # forked child makes its own before its first request (_own).
        self._pid = -1
        self._own()
        data, headers, first, size = self._open(max(1, suffix_bytes), tails)
        self.size = size
        self.suffix = data
        self.suffix_start = first
        self._etag = headers.get("etag") or None
        self._version = headers.get("x-amz-version-id") or None
        if self._version == "null":  # S3's name for "this bucket keeps no versions"
            self._version = None
        modified_text = headers.get("last-modified") or ""
        try:
            modified = parsedate_to_datetime(modified_text) if modified_text else None
        except (TypeError, ValueError, IndexError):
            modified = None
        if self._etag:
            self._options["if_match"] = self._etag
        elif modified is not None:
            self._options["if_unmodified_since"] = modified_text
        else:
            raise RemoteProtocolError(f"{self.name!r}: the server sends neither an ETag nor Last-Modified: "
                                      f"a replaced object could not be told apart, expected either")
        if self._version:
            self._endpoint.pin_version(self._version)
        tag = self._version or self._etag or f"last-modified {modified.isoformat()}"  # type: ignore[union-attr]
        if self._endpoint.server:
            # s3://BUCKET/KEY names an object on one endpoint: the same bucket and key on
            # another (MinIO, a test server, a hostile one) is another object, whose
            # ETag may be the same; its cached blocks must never be served for this one.
            tag = f"{tag} at {self._endpoint.server}"
        self.identity: Tuple[str, str, int] = (self.name, tag, self.size)
        self.owner = (os.getuid(), os.getgid(), int(modified.timestamp()) * 10**9 if modified else 0)
        # The batches' fast path (packfs.source.multiget): what it does not take, _get does.
        self._multi = MultiGet(self._endpoint.url, self._request_head, self._accepts, self.in_flight, self._timeout)

    def _open(self, suffix_bytes: int, tails) -> Tuple[bytes, dict, int, int]:
        """The opening request's answer: (the last bytes, the headers, where they start,
        the object's size).  With ``tails`` (a :class:`~packfs.source.tails.TailStore`)
        that kept this URL's last bytes, only the last CHECK_BYTES are fetched, and the
        kept ones taken when the answer is the same object (ETag, version id,
        Last-Modified, size and those bytes alike); the last bytes fetched are kept."""
        location = self._endpoint.url
        known = tails.load(location) if tails is not None else None
        if known is not None and len(known.suffix) >= min(suffix_bytes, known.size) > CHECK_BYTES:
            data, headers, first, size = self._fetch(0, 0, suffix=CHECK_BYTES)
            version = headers.get("x-amz-version-id") or None
            if (size, headers.get("etag") or None, None if version == "null" else version,
                    headers.get("last-modified") or "") == (known.size, known.etag, known.version, known.modified) \
                    and first == size - len(data) and known.suffix.endswith(data):
                return known.suffix, headers, known.suffix_start, size
        data, headers, first, size = self._fetch(0, 0, suffix=suffix_bytes)
        if tails is not None and size > CHECK_BYTES:
            version = headers.get("x-amz-version-id") or None
            tails.save(location, KnownTail(headers.get("etag") or None, None if version == "null" else version,
                                           headers.get("last-modified") or "", size, first, bytes(data)))
        return data, headers, first, size

    def _own(self) -> None:
        """Connections, a lock and (on first use) threads of this process's own.  In a
        forked child the parent's are dropped unused: its sockets are the parent's
        connections (a request on one would interleave with the parent's), its lock may
        have been held by a thread that does not exist here, nor do its pool's threads."""
        urllib3 = self._urllib3
        self._http = urllib3.PoolManager(num_pools=4, maxsize=self.in_flight, block=True, retries=False,
                                         timeout=urllib3.Timeout(connect=self._timeout, read=self._timeout))
        self._lock = threading.Lock()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._pid = os.getpid()

    def _locked(self) -> threading.Lock:
        if self._pid != os.getpid():
            self._own()
        return self._lock

    # -- reading -----------------------------------------------------------------------

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end): from the suffix fetched at open when they lie in it, else
        one ranged GET, or parallel parts of ``part_bytes`` for a larger span."""
        self._check_open()
        self.check_span(start, end)
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
        self.check_span(start, end)
        if start >= self.suffix_start:
            buffer[:] = self.suffix[start - self.suffix_start:end - self.suffix_start]
            return
        if end <= start:
            return
        parts = [(at, min(at + self.part_bytes, end)) for at in range(start, end, self.part_bytes)]
        target = buffer.cast("B") if buffer.format != "B" else buffer
        if len(parts) == 1:
            target[:] = self._get(start, end)
            return
        # Parts received straight into the buffer, PARTS_IN_FLIGHT at a time (what is
        # in flight stays bounded).
        for first in range(0, len(parts), PARTS_IN_FLIGHT):
            group = parts[first:first + PARTS_IN_FLIGHT]
            self._fetch_spans(group, [target[a - start:b - start] for a, b in group])

    def _request_head(self, start: int, end: int) -> bytes:
        """A ranged GET's head, as _fetch_once sends it (for the fast path)."""
        url = self._endpoint.url
        parts = urlsplit(url)
        headers = {"Host": self._endpoint.host, "Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity",
                   **{CONDITION_HEADERS[name]: value for name, value in self._options.items()},
                   **self._endpoint.signed(url)}
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        return (f"GET {target} HTTP/1.1\r\n" + "".join(f"{name}: {value}\r\n" for name, value in headers.items())
                + "\r\n").encode("latin-1")

    def _accepts(self, headers: Dict[str, str], total: str) -> bool:
        """Whether an answer's headers are the object's as it was opened (else the slow
        path asks again, and tells what changed)."""
        return (total == str(self.size) and (not self._etag or headers.get("etag") == self._etag)
                and (not self._version or headers.get("x-amz-version-id") == self._version))

    def _fetch_spans(self, spans: Sequence[Tuple[int, int]], into: Optional[Sequence[memoryview]] = None,
                     sink: Optional[Sink] = None) -> List[object]:
        """Each span's bytes (or, with ``into``, each received into its buffer; with
        ``sink``, each handed to it as it arrives): all of them through the fast path,
        then what it left one GET each through _get, up to ``in_flight`` at once."""
        if self._pid != os.getpid():
            self._own()
        results, requests, received = self._multi.get(spans, into, sink)
        left = [k for k, got in enumerate(results) if got is None]
        with self._locked():
            self._stats["requests"] += requests
            self._stats["bytes_fetched"] += received
            # A span the fast path left was asked for (or could not be): asked again.
            self._stats["retries"] += min(len(left), requests)

        def fill(k: int) -> None:
            data = self._get(*spans[k])
            if sink is not None:
                sink(k, 0, memoryview(data))  # from its start again: the fast path's pieces are void
                results[k] = True
            elif into is not None:
                into[k][:] = data
                results[k] = into[k]
            else:
                results[k] = data

        self._run(fill, left, self.in_flight)
        return results

    def read_ranges_to(self, spans: Sequence[Tuple[int, int]], sink: Sink) -> None:
        """Hand the bytes of each (start, end) span to ``sink`` as they arrive (see
        :data:`packfs.source.multiget.Sink`), up to ``in_flight`` GETs at once: what a
        read ahead that only writes them to the disk cache asks, so that what it holds
        is a receive buffer per batch, not the spans (one span fetched again after a
        failure is held whole, at most ``part_bytes``).  Returns once every span is
        in; raises what the slow path raises."""
        self._check_open()
        for start, end in spans:
            self.check_span(start, end)
        self._fetch_spans(spans, sink=sink)

    def read_ranges(self, spans: Sequence[Tuple[int, int]], gap: Optional[int] = None) -> List[bytes]:
        """The bytes of each (start, end) span, in the order given: spans closer than
        ``gap`` (None: ``coalesce_gap``) share one GET, up to ``in_flight`` GETs at once."""
        self._check_open()
        for start, end in spans:
            self.check_span(start, end)
        gap = self.coalesce_gap if gap is None else gap
        order = sorted(range(len(spans)), key=lambda k: spans[k])
        groups: List[List[int]] = []  # runs of span indexes fetched by one GET
        bounds: List[List[int]] = []  # each run's [first, last) byte
        for k in order:
            start, end = spans[k]
            if groups and start - bounds[-1][1] <= gap \
                    and max(end, bounds[-1][1]) - bounds[-1][0] <= self.part_bytes:
                groups[-1].append(k)
                bounds[-1][1] = max(end, bounds[-1][1])
            else:
                groups.append([k])
                bounds.append([start, end])
        # Each group's parts: the suffix's bytes from memory, the others fetched all at once.
        parts: List[Tuple[int, int]] = []
        for first, last in bounds:
            parts += [(at, min(at + self.part_bytes, last)) for at in range(first, last, self.part_bytes)
                      if at < self.suffix_start]
        fetched = dict(zip(parts, self._fetch_spans(parts)))
        results: List[bytes] = [b""] * len(spans)
        for group, (first, last) in zip(groups, bounds):
            pieces = [fetched[(at, min(at + self.part_bytes, last))] if at < self.suffix_start else
                      self.suffix[at - self.suffix_start:min(at + self.part_bytes, last) - self.suffix_start]
                      for at in range(first, last, self.part_bytes)]
            data = pieces[0] if len(pieces) == 1 else b"".join(pieces)  # type: ignore[arg-type]
            for k in group:
                start, end = spans[k]
                # bytes sliced whole is the same object: a group of one span is not copied.
                results[k] = data[start - first:end - first]  # type: ignore[index]
        return results

    def check_span(self, start: int, end: int) -> None:
        """FormatError unless [start, end) lies inside the object; ClosedArchiveError
        after close(), ArchiveChangedError once an answer showed another object."""
        self._check_open()
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
        # Every task done before anything is raised: a caller that gave them buffers, or
        # a sink writing to descriptors it closes once this returns, must not have a
        # task still writing after it (a descriptor number may be reused meanwhile).
        wait(futures)
        for future in futures:
            future.result()

    def _executor(self) -> ThreadPoolExecutor:
        with self._locked():
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.in_flight, thread_name_prefix="packfs-remote")
            return self._pool

    def _get(self, start: int, end: int) -> bytes:
        return self._fetch(start, end)[0]

    def _fetch(self, start: int, end: int, suffix: int = 0) -> Tuple[bytes, dict, int, int]:
        """One GET of bytes [start, end), or at open of the last ``suffix`` bytes, tried
        again for failures worth it: (bytes, the answer's headers, the first byte's
        offset, the object's size)."""
        for attempt in range(self._retries + 1):
            self._check_open()
            try:
                return self._fetch_once(start, end, suffix)
            except _Retry as failure:
                if attempt >= (self._retries if failure.most is None else min(self._retries, failure.most)):
                    raise failure.error from None
                with self._locked():
                    self._stats["retries"] += 1
                time.sleep(random.uniform(0.5, 1.0) * min(20.0, self._backoff * 2 ** attempt))
        raise AssertionError("unreachable")

    def _fetch_once(self, start: int, end: int, suffix: int) -> Tuple[bytes, dict, int, int]:
        with self._locked():
            self._stats["requests"] += 1
            http = self._http
        headers = {"Range": f"bytes=-{suffix}" if suffix else f"bytes={start}-{end - 1}",
                   "Accept-Encoding": "identity"}  # a range of an encoded body would be another range
        if not suffix:
            headers.update((CONDITION_HEADERS[name], value) for name, value in self._options.items()
                           if name in CONDITION_HEADERS)
        deadline = time.monotonic() + self._timeout
        response = None
        reusable = False
        try:
            response = self._send(http, headers)
            data, answer, first, size = self._take(response, start, end, suffix, deadline)
            reusable = True
        except (_Retry, PackfsError):
            raise
        except (self._urllib3.exceptions.HTTPError, OSError) as error:
            raise self._failure(error) from None
        finally:
            if response is not None:
                _finish(response, reusable)
        with self._locked():
            self._stats["bytes_fetched"] += len(data)
        return data, answer, first, size

    def _send(self, http, headers: Dict[str, str]):
        """The answer to a GET, its body unread; an http(s) URL's redirects followed
        (an S3 signature holds for one host and path: S3's redirects are errors)."""
        url = self._endpoint.url
        for hop in range(MAX_REDIRECTS + 1):
            # Through the host's pool with the path as it is: PoolManager.urlopen(url)
            # would remove the path's dot segments, and S3's key a/../b is not b.
            parts = urlsplit(url)
            pool = http.connection_from_host(parts.hostname, parts.port, scheme=parts.scheme)
            response = pool.urlopen("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
                                    headers={**headers, **self._endpoint.signed(url)}, preload_content=False,
                                    decode_content=False, redirect=False, retries=False, assert_same_host=False)
            location = response.headers.get("location")
            if response.status not in REDIRECTS or not location or not self._endpoint.follows_redirects \
                    or hop == MAX_REDIRECTS:
                return response
            _finish(response, False)
            target = urljoin(url, location)
            if not _same_server(url, target):
                raise RemoteArchiveError(
                    f"{self.name!r}: the server redirects to another server ({public_url(target)!r}), which packfs "
                    f"does not follow: a URL may only lead to its own host and port (or from http to https on "
                    f"the same host); expected the archive's own URL (open the URL redirected to, if it is to "
                    f"be trusted)")
            url = target
        raise AssertionError("unreachable")

    def _take(self, response, start: int, end: int, suffix: int, deadline: float) -> Tuple[bytes, dict, int, int]:
        """The body of an answer that is exactly what was asked, else the error (a
        _Retry for one worth another try); a refused body is left unread."""
        status, answer = response.status, response.headers
        if status == 206:
            match = _CONTENT_RANGE.fullmatch(answer.get("content-range", "").strip())
            total = int(match.group(3)) if match and match.group(3) != "*" else -1
            if not suffix:
                self._check_identity(answer, total)
            wanted = (max(0, total - suffix), total) if suffix else (start, end)
            if match is None or total < 0 or (int(match.group(1)), int(match.group(2)) + 1) != wanted:
                raise _Retry(RemoteProtocolError(
                    f"{self.name!r}: the server answered another range than asked (bytes {wanted[0]}-{wanted[1] - 1} "
                    f"asked, {answer.get('content-range')!r} answered): expected exactly the range asked for"))
            return self._read_body(response, wanted[1] - wanted[0], deadline), answer, wanted[0], total
        if status == 200 and suffix:
            # The whole object for a suffix: taken when it is no larger than the suffix asked.
            length = answer.get("content-length")
            if length is not None and length.isdigit() and int(length) <= suffix:
                return self._read_body(response, int(length), deadline), answer, 0, int(length)
        if status == 200:
            raise RemoteProtocolError(f"{self.name!r}: the server ignores Range requests (it answered 200 with the "
                                      f"whole object, which was not read): expected 206 Partial Content")
        raise self._refusal(response, status, opening=bool(suffix))

    def _read_body(self, response, length: int, deadline: float) -> bytes:
        """Exactly ``length`` bytes of body, in pieces, the time left checked before
        each (a trickling server is a timeout); a shorter body is cut off, a longer
        one refused."""
        declared = response.headers.get("content-length")
        if declared is not None and declared != str(length):
            raise _Retry(RemoteProtocolError(f"{self.name!r}: the server declared a body of {declared} bytes for "
                                             f"{length} asked (another range than asked): expected exactly the range "
                                             f"asked for"))
        pieces = []
        got = 0
        # One receive at a time (read1), the time left checked before each: read(n)
        # waits for n bytes, so a server sending a byte a second held it for n seconds.
        # urllib3 before 2.3 has no read1: there a timer shuts the socket down at the
        # deadline, which ends the read(n) waiting on it.
        watchdog = None
        receive_once = hasattr(response, "read1")
        if not receive_once:
            sock = getattr(response.connection, "sock", None)
            if sock is not None:
                watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), _shut_down, (sock,))
                watchdog.daemon = True
                watchdog.start()
        try:
            while got < length:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Retry(self._timed_out())
                sock = getattr(response.connection, "sock", None)
                if sock is not None:
                    sock.settimeout(min(self._timeout, left))
                piece = response.read1(min(READ_PIECE, length - got), decode_content=False) if receive_once \
                    else response.read(min(READ_PIECE, length - got), decode_content=False)
                if not piece:
                    break
                pieces.append(piece)
                got += len(piece)
        except (self._urllib3.exceptions.HTTPError, OSError):
            if time.monotonic() >= deadline:
                raise _Retry(self._timed_out()) from None
            raise
        finally:
            if watchdog is not None:
                watchdog.cancel()
        if got < length and time.monotonic() >= deadline:
            raise _Retry(self._timed_out())
        if got < length:
            raise _Retry(RemoteIOError(f"{self.name!r}: the connection failed (the answer was cut off after {got} of "
                                       f"{length} bytes; {self._retries + 1} tries)"))
        if declared is None and response.read(1, decode_content=False):  # chunked: its end must come now
            raise _Retry(RemoteProtocolError(f"{self.name!r}: the server sent more than the {length} bytes asked for "
                                             f"(another range than asked): expected exactly the range asked for"))
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _check_identity(self, answer, total: int) -> None:
        etag, version = answer.get("etag") or None, answer.get("x-amz-version-id") or None
        if (self._etag and etag != self._etag) or (self._version and version != self._version) \
                or (total >= 0 and total != self.size):
            self._note_change(f"it now has ETag {etag!r} and {total} bytes, it had {self._etag!r} and {self.size}")

    # -- errors ------------------------------------------------------------------------

    def _refusal(self, response, status: int, opening: bool) -> Exception:
        """The error for an answer other than 206 (a _Retry for one worth another try);
        S3's are told apart by the ``<Code>`` of their XML body."""
        code = ""
        if self._endpoint.is_s3:
            try:
                found = _S3_CODE.search(response.read(ERROR_BODY_LIMIT, decode_content=False) or b"")
                code = found.group(1).decode() if found else ""
            except (self._urllib3.exceptions.HTTPError, OSError):
                pass  # the status alone tells it
        where = f"{self.name!r}"
        if status == 412 or code == "PreconditionFailed":
            self._note_change("the server answered 412 Precondition Failed to If-Match")
        if status == 404 or code in S3_NOT_FOUND:
            if not opening:
                self._note_change(f"it is gone (404 Not Found{', ' + code if code else ''})")
            return RemoteNotFoundError(f"{where}: no such object (404 Not Found{', ' + code if code else ''}), "
                                       f"expected an archive")
        if status in (401, 403) or code in S3_ACCESS:
            if self._endpoint.is_s3:
                if self._endpoint.settings is None:
                    why = f"{code or 'refused'}: unsigned requests (anon=True) may not read it"
                else:
                    why = (f"{code or 'refused'}: the credentials from {self._endpoint.credentials_source()} "
                           f"{S3_ACCESS.get(code, 'were refused')}")
            else:
                why = "refused"
            return RemoteAccessError(f"{where}: access denied ({status}): {why}: expected credentials that may read "
                                     f"it (for s3://: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile in "
                                     f"~/.aws, or storage_options)")
        if status in REDIRECTS and self._endpoint.is_s3:
            region = response.headers.get("x-amz-bucket-region")
            if region:
                return RemoteArchiveError(f"{where}: the bucket is in region {region!r}, not "
                                          f"{self._endpoint.region!r}: expected region={region!r} (storage_options, "
                                          f"AWS_REGION or the profile's region)")
        if status == 416:
            if opening:
                return FormatError(f"{where}: the object is empty (416 Range Not Satisfiable), expected an archive")
            self._note_change("the server answered 416 Range Not Satisfiable: it is shorter now")
        if status >= 500 or status == 429 or code in S3_RETRIED:
            return _Retry(RemoteIOError(f"{where}: the server kept failing ({status}, {self._retries + 1} tries)"
                                        f"{' with ' + code if code else ''}: try again later"))
        return RemoteArchiveError(f"{where}: the server answered {status}{' ' + code if code else ''}, "
                                  f"expected 206 Partial Content")

    def _failure(self, error: Exception) -> Exception:
        """The error for a failed connection (a _Retry for one worth another try).
        urllib3's own message is never passed on: it names the host and path."""
        exceptions = self._urllib3.exceptions
        text = f"{type(error).__name__} {error!r}"
        if isinstance(error, exceptions.SSLError) and "CERTIFICATE_VERIFY_FAILED" in text:
            return RemoteArchiveError(f"{self.name!r}: the server's TLS certificate was not accepted: expected one "
                                      f"this machine trusts")
        if isinstance(error, ConnectionRefusedError) or "Connection refused" in text:
            tries = min(self._retries, REFUSED_RETRIES) + 1
            return _Retry(RemoteIOError(f"{self.name!r}: the connection failed (connection refused; {tries} "
                                        f"{'try' if tries == 1 else 'tries'}): expected a server listening at "
                                        f"{self._endpoint.origin}"), REFUSED_RETRIES)
        if isinstance(error, exceptions.NewConnectionError):
            cause = "could not connect: the host name did not resolve" if "resolution" in text or "not known" in text \
                else "could not connect"
        elif isinstance(error, (exceptions.TimeoutError, TimeoutError)) or "timed out" in text:
            return _Retry(self._timed_out())
        else:
            cause = _cause(text)
        return _Retry(RemoteIOError(f"{self.name!r}: the connection failed ({cause}; {self._retries + 1} tries)"))

    def _timed_out(self) -> RemoteTimeoutError:
        return RemoteTimeoutError(f"{self.name!r}: no complete answer within {self._timeout:g} s "
                                  f"({self._retries + 1} tries)")

    def _note_change(self, why: str) -> None:
        with self._locked():
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
        with self._locked():
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
        with self._locked():
            pool, self._pool = self._pool, None
            http = self._http
        if pool is not None:
            pool.shutdown(wait=False)
        http.clear()  # the idle connections; those in use are closed as they come back
        self._multi.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def __repr__(self) -> str:
        return f"RemoteFile({self.name!r})"


def _finish(response, reusable: bool) -> None:
    """Give the connection back: as it is after a body read whole, closed otherwise (what
    it still holds, an unread or refused body, is never read)."""
    if not reusable:
        response.close()
    response.release_conn()


def _same_server(url: str, target: str) -> bool:
    """Whether a redirect from ``url`` to ``target`` stays on the server the URL
    named: the same scheme, host and port, or from http to https on the same host's
    port 443.  Anything else is not followed: a URL someone hands over must not make
    its reader send requests to other hosts or ports (a cloud's metadata address, a
    service on loopback)."""
    here, there = urlsplit(url), urlsplit(target)
    try:
        ours = (here.scheme.lower(), (here.hostname or "").lower(), here.port or _PORTS.get(here.scheme.lower()))
        theirs = (there.scheme.lower(), (there.hostname or "").lower(), there.port or _PORTS.get(there.scheme.lower()))
    except ValueError:  # a port that is no number
        return False
    return theirs == ours or (ours[0] == "http" and theirs == ("https", ours[1], 443))


_PORTS = {"http": 80, "https": 443}


def _shut_down(sock) -> None:
    """End every wait on ``sock`` (a request past its deadline, on urllib3 before 2.3)."""
    try:
        sock.shutdown(2)  # socket.SHUT_RDWR
    except OSError:
        pass  # closed meanwhile


def _cause(text: str) -> str:
    for known, said in (("IncompleteRead", "the answer was cut off"), ("Reset", "connection reset"),
                        ("RemoteDisconnected", "the server closed the connection without answering"),
                        ("BrokenPipe", "the request could not be sent"), ("SSLError", "TLS failed")):
        if known in text:
            return said
    return "no answer"


def _import_urllib3():
    try:
        import urllib3
    except ImportError as error:
        raise missing_dependency(error, "urllib3", "reading archives at URLs", "remote") from None
    return urllib3
