"""bench/remote_peers.py's own parts (issue 36): its command line, the uniform
expectation it prints beside classes per batch, the proxy's serial mode it measures
the slow endpoint with, and its moto whose ranged GETs read only their range.  The
benchmark itself is not run here (minutes, and venvs of its own)."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import numpy as np

from bench import remote_peers
from bench.proxy import Proxy
from tests.conftest import time_limit
from tests.remote_servers import S3_KEY, S3_REGION, S3_SECRET, free_port, stop, wait_for_port

REPO = Path(__file__).resolve().parent.parent


def test_help_names_the_modes():
    result = subprocess.run([sys.executable, str(REPO / "bench" / "remote_peers.py"), "--help"],
                            capture_output=True, text=True, timeout=time_limit(60))
    assert result.returncode == 0, result.stderr
    assert "--packfs-mode" in result.stdout and "windowed" in result.stdout and "--quick" in result.stdout


def test_uniform_expectation_matches_draws():
    """The hypergeometric expectation against 4,000 seeded uniform batches of 64 from
    100 classes of 100: within 0.2 classes (the draws' standard error is about 0.06)."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(100), 100)
    drawn = [len(np.unique(labels[rng.permutation(len(labels))[:64]])) for _ in range(4000)]
    expected = remote_peers.uniform_classes(100, 100, 64)
    assert abs(np.mean(drawn) - expected) < 0.2
    assert remote_peers.uniform_classes(1, 100, 64) == 1.0  # one class: always one


class _Counting(http.server.BaseHTTPRequestHandler):
    """Answers after a pause, counting how many requests it holds at once."""
    protocol_version = "HTTP/1.1"
    lock = threading.Lock()
    now = most = 0
    entered = threading.Event()

    def do_GET(self):
        cls = type(self)
        with cls.lock:
            cls.now += 1
            cls.most = max(cls.most, cls.now)
        cls.entered.set()
        threading.Event().wait(0.05)  # long enough for the other client's request to arrive
        with cls.lock:
            cls.now -= 1
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def _most_at_once(serial: bool) -> tuple:
    _Counting.now = _Counting.most = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with Proxy(server.server_address[1], serial=serial) as proxy:
            def get() -> None:
                with urllib.request.urlopen(f"http://127.0.0.1:{proxy.port}/x", timeout=time_limit(10)) as answer:
                    assert answer.read() == b"ok"
            clients = [threading.Thread(target=get) for _ in range(4)]
            for client in clients:
                client.start()
            for client in clients:
                client.join()
            return _Counting.most, proxy.requests
    finally:
        server.shutdown()
        server.server_close()


def test_serial_proxy_answers_one_request_at_a_time():
    most, requests = _most_at_once(serial=True)
    assert (most, requests) == (1, 4)
    most, requests = _most_at_once(serial=False)  # the same clients overlap without it
    assert most > 1 and requests == 4


def test_moto_ranged_gets_read_their_range(tmp_path):
    import boto3

    port = free_port()
    log = tmp_path / "moto.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, str(REPO / "bench" / "remote_peers_moto.py"), "-H", "127.0.0.1",
                                    "-p", str(port)], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, process, log, seconds=60)
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id=S3_KEY,
                              aws_secret_access_key=S3_SECRET, region_name=S3_REGION)
        client.create_bucket(Bucket="bench")
        data = bytes(range(256)) * 20_000  # over moto's in-memory size: a spooled file
        client.put_object(Bucket="bench", Key="k", Body=data)
        for asked, expected in (("bytes=10-20", data[10:21]), ("bytes=5000000-", data[5_000_000:]),
                                ("bytes=-7", data[-7:]), ("bytes=0-99999999", data),
                                ("bytes=0-1,5-6", data)):  # several ranges: moto's own answer, all of it
            got = client.get_object(Bucket="bench", Key="k", Range=asked)["Body"].read()
            assert got == expected, asked
        assert client.get_object(Bucket="bench", Key="k")["Body"].read() == data
        client.put_object(Bucket="bench", Key="empty", Body=b"")
        assert client.get_object(Bucket="bench", Key="empty")["Body"].read() == b""
    finally:
        stop(process)
