"""Real servers on loopback for the remote-source tests and benches: nginx (Debian's)
and moto_server (S3, from PyPI), each started on a free port in a directory of its
own and stopped when its ``with`` block ends, a failing test included.

Both count requests from their own logs: nginx's access log (a format of our own, one
tab-separated line per request: status, method, URI, Range, If-Match, bytes sent) and
moto_server's request log (werkzeug's, one line per request on stderr: method, path,
status).  Neither depends on the client or on the proxy in front.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional

from tests.conftest import time_limit

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
MOTO_SERVER = shutil.which("moto_server") or (
    os.path.join(os.path.dirname(sys.executable), "moto_server")
    if os.path.exists(os.path.join(os.path.dirname(sys.executable), "moto_server")) else None)

# Keys moto accepts (any); never real credentials.
S3_KEY, S3_SECRET, S3_REGION = "testing-key-id", "testing-secret-key", "us-east-1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, log: Path, seconds: float = 20) -> None:
    deadline = time.monotonic() + time_limit(seconds)
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}: {log.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"server did not listen on port {port} within {seconds} s: {log.read_text(errors='replace')[-2000:]}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(time_limit(5))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_log(read, at_least: int, seconds: float = 10) -> list:
    deadline = time.monotonic() + time_limit(seconds)
    found = read()
    while len(found) < at_least and time.monotonic() < deadline:
        time.sleep(0.01)
        found = read()
    return found


@dataclass
class LoggedRequest:
    """One request as a server logged it."""
    status: int
    method: str
    path: str
    range: str = ""  # the Range header ("" when none); nginx only
    if_match: str = ""  # the If-Match header; nginx only
    bytes_sent: int = 0  # body and header bytes the server sent; nginx only


NGINX_CONF = """\
daemon off;
master_process off;
worker_processes 1;
error_log {root}/error.log warn;
pid {root}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    log_format counted escape=none '$status\\t$request_method\\t$uri\\t$http_range\\t$http_if_match\\t$bytes_sent';
    client_body_temp_path {root}/tmp/body;
    proxy_temp_path {root}/tmp/proxy;
    fastcgi_temp_path {root}/tmp/fastcgi;
    uwsgi_temp_path {root}/tmp/uwsgi;
    scgi_temp_path {root}/tmp/scgi;
    types {{ }}
    default_type application/octet-stream;
    keepalive_requests 100000;
    server {{
        listen 127.0.0.1:{port};
        access_log {root}/access.log counted;
        root {root}/www;
        location /data/ {{ }}
        # The same files, from a server that ignores Range and answers 200 with all.
        location /norange/ {{ alias {root}/www/data/; max_ranges 0; }}
        location /denied/ {{ deny all; }}
        # The same files, one redirect away (302 to /data/).
        location /moved/ {{ rewrite ^/moved/(.*)$ /data/$1 redirect; }}
    }}
    # The same files over TLS (a certificate for 127.0.0.1 made at start: certificate()).
    server {{
        listen 127.0.0.1:{tls_port} ssl;
        ssl_certificate {root}/tls.crt;
        ssl_certificate_key {root}/tls.key;
        access_log {root}/access.log counted;
        root {root}/www;
        location /data/ {{ }}
    }}
}}
"""


class Nginx:
    """nginx serving ``root/www/data`` at ``url("name")`` (``/data/name``), the same files
    with Range ignored at ``/norange/name`` and 403 for anything under ``/denied/``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "www" / "data"
        self.port = self.tls_port = 0
        self.certificate = root / "tls.crt"
        self.process: Optional[subprocess.Popen] = None

    def url(self, name: str, location: str = "data", port: Optional[int] = None) -> str:
        return f"http://127.0.0.1:{port or self.port}/{location}/{name}"

    def tls_url(self, name: str) -> str:
        """``name`` over https, whose certificate :attr:`certificate` is (a client trusts it
        with ``SSL_CERT_FILE``)."""
        return f"https://127.0.0.1:{self.tls_port}/data/{name}"

    def put(self, name: str, contents: bytes) -> None:
        """Create or replace (by a rename, as a deploy does: a new ETag) a file."""
        temporary = self.data / f".{name}.tmp"
        temporary.write_bytes(contents)
        os.replace(temporary, self.data / name)

    def requests(self, at_least: int = 0) -> List[LoggedRequest]:
        """The requests logged so far; waiting (up to 10 s) for ``at_least`` of them:
        a server logs a request after its answer went out."""
        return wait_for_log(self._logged, at_least)

    def _logged(self) -> List[LoggedRequest]:
        log = self.root / "access.log"
        found = []
        for line in log.read_text().splitlines() if log.exists() else []:
            status, method, path, range_, if_match, sent = line.split("\t")
            found.append(LoggedRequest(int(status), method, path, "" if range_ == "-" else range_,
                                       "" if if_match == "-" else if_match, int(sent)))
        return found

    def clear_log(self) -> None:
        """Forget the requests logged so far, once the log stopped growing for 50 ms
        (the line of a request just answered may still be on its way)."""
        log = self.root / "access.log"
        size = -1
        while log.exists() and size != log.stat().st_size:
            size = log.stat().st_size
            time.sleep(0.05)
        log.write_bytes(b"")  # nginx appends (O_APPEND): truncation is safe

    def __enter__(self) -> "Nginx":
        if NGINX is None:
            raise FileNotFoundError("nginx is not installed (apt-get install nginx; make setup does as root)")
        for sub in ("www/data", "www/denied", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.certificate = self.root / "tls.crt"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                        "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(self.root / "tls.key"),
                        "-out", str(self.certificate)], check=True, capture_output=True)
        for attempt in range(5):
            self.port, self.tls_port = free_port(), free_port()
            (self.root / "nginx.conf").write_text(NGINX_CONF.format(root=self.root, port=self.port,
                                                                    tls_port=self.tls_port))
            log = self.root / "stderr.log"
            with open(log, "wb") as out:
                self.process = subprocess.Popen([NGINX, "-c", str(self.root / "nginx.conf"), "-p", str(self.root)],
                                                stdout=out, stderr=subprocess.STDOUT)
            try:
                wait_for_port(self.port, self.process, log)
                return self
            except RuntimeError:
                stop(self.process)
                if attempt == 4 or "Address already in use" not in log.read_text():
                    raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            stop(self.process)


# werkzeug's request line: 127.0.0.1 - - [date] "GET /bucket/key HTTP/1.1" 206 -
_MOTO_LINE = re.compile(r'"([A-Z]+) (\S+) HTTP/[0-9.]+" (\d{3})')
_COLOURS = re.compile(r"\x1b\[[0-9;]*m")


class MotoServer:
    """moto_server (S3) on a free port: ``endpoint`` for clients, ``client()`` a boto3
    client for setting objects up, ``requests()`` what it logged."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = 0
        self.process: Optional[subprocess.Popen] = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=S3_KEY,
                            aws_secret_access_key=S3_SECRET, region_name=S3_REGION)

    def reset(self) -> None:
        """Forget every bucket and object."""
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"), timeout=time_limit(10))

    def requests(self, at_least: int = 0) -> List[LoggedRequest]:
        """The requests logged so far (moto's own, /moto-api, left out); waiting (up
        to 10 s) for ``at_least`` of them, as :meth:`Nginx.requests` does."""
        return wait_for_log(self._logged, at_least)

    def _logged(self) -> List[LoggedRequest]:
        log = self.root / "moto.log"
        text = _COLOURS.sub("", log.read_text(errors="replace"))  # werkzeug colours some lines
        return [LoggedRequest(int(m.group(3)), m.group(1), m.group(2))
                for m in map(_MOTO_LINE.search, text.splitlines()) if m
                and not m.group(2).startswith("/moto-api")]

    def __enter__(self) -> "MotoServer":
        if MOTO_SERVER is None:
            raise FileNotFoundError("moto_server is not installed (pip install \"moto[server]\"; the test extra has it)")
        self.root.mkdir(parents=True, exist_ok=True)
        for attempt in range(5):
            self.port = free_port()
            log = self.root / "moto.log"
            with open(log, "wb") as out:
                self.process = subprocess.Popen([MOTO_SERVER, "-H", "127.0.0.1", "-p", str(self.port)],
                                                stdout=out, stderr=subprocess.STDOUT,
                                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
            try:
                wait_for_port(self.port, self.process, log, seconds=60)
                return self
            except RuntimeError:
                stop(self.process)
                if attempt == 4 or "Address already in use" not in log.read_text(errors="replace"):
                    raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            stop(self.process)


def bytes_asked_twice(spans) -> int:
    """Bytes inside more than one of the (start, end) byte ``spans`` (of a server's log):
    what was fetched more than once."""
    twice, reach = 0, -1
    for start, end in sorted(spans):
        if start < reach:
            twice += min(end, reach) - start
        reach = max(reach, end)
    return twice


@contextlib.contextmanager
def servers(root: Path) -> Iterator[tuple]:
    """Both servers, stopped at the end whatever happens."""
    with Nginx(root / "nginx") as nginx, MotoServer(root / "moto") as moto:
        yield nginx, moto


def http_get(url: str, headers: Optional[dict] = None) -> tuple:
    """(status, headers, body) of a plain GET, errors included (for checking servers)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=time_limit(10)) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()
