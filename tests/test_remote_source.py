"""packfs.source.remote.RemoteFile against real servers on loopback: nginx (Range,
If-Match, 403, 404, a location that ignores Range) and moto_server (S3), with
bench/proxy.py in front for the failures a server does not make on its own (503,
killed and truncated answers, another Content-Range, a stall, a flipped bit).  Request
counts come from the servers' own logs (tests/remote_servers.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import packfs
from packfs.errors import (ArchiveChangedError, ChecksumError, ClosedArchiveError, RemoteAccessError,
                           RemoteArchiveError, RemoteCredentialsError, RemoteIOError, RemoteNotFoundError,
                           RemoteProtocolError, RemoteTimeoutError)
from packfs.source import LocalFile, is_url, open_source
from packfs.source.s3config import s3_settings
from tests.conftest import require_extra, time_limit
from tests.remote_servers import S3_KEY, S3_REGION, S3_SECRET, MotoServer, Nginx

REPO = Path(__file__).resolve().parent.parent
SIZE = 3 << 20
BLOB = bytes((k * 7 + (k >> 11)) & 0xFF for k in range(SIZE))
FAST = {"timeout": 2.0, "retries": 2, "backoff": 0.005}  # short tries: the module runs in seconds


def require_server(kind: str, error: Exception) -> None:
    """Skip, saying why, when a server cannot be started; under CI a failure (make
    setup installs both)."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{kind} must run under CI: {error}")
    pytest.skip(f"{kind} cannot be started here: {error}")


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are the remote source's own: each request as it sends it, without the
    disk cache's blocks (tests/test_cache.py tests the cache)."""
    monkeypatch.setenv("PACKFS_CACHE_DIR", "off")


@pytest.fixture(scope="module")
def nginx(tmp_path_factory):
    require_extra("urllib3", "remote")
    server = Nginx(tmp_path_factory.mktemp("nginx"))
    try:
        server.__enter__()
    except (FileNotFoundError, RuntimeError) as error:
        require_server("nginx", error)
    try:
        server.put("blob.bin", BLOB)
        yield server
    finally:
        server.__exit__()


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    require_extra("urllib3", "remote")
    server = MotoServer(tmp_path_factory.mktemp("moto"))
    try:
        server.__enter__()
    except (FileNotFoundError, RuntimeError) as error:
        require_server("moto_server", error)
    try:
        client = server.client()
        client.create_bucket(Bucket="bucket")
        client.put_object(Bucket="bucket", Key="blob.bin", Body=BLOB)
        yield server
    finally:
        server.__exit__()


@pytest.fixture
def s3_env(moto, monkeypatch, tmp_path):
    """The environment a user of moto would set; no shared files."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET)
    monkeypatch.setenv("AWS_REGION", S3_REGION)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)
    return moto


@pytest.fixture
def proxy(nginx):
    from bench.proxy import Proxy

    with Proxy(nginx.port) as running:
        yield running


def settled_count(server) -> int:
    """How many requests the server logged, once its log stopped growing for 50 ms
    (a line is written after its answer went out)."""
    count = -1
    while count != len(server.requests()):
        count = len(server.requests())
        time.sleep(0.05)
    return count


# -- opening -----------------------------------------------------------------------------


def test_opening_is_one_suffix_get(nginx: Nginx) -> None:
    nginx.clear_log()
    source = open_source(nginx.url("blob.bin"), suffix_bytes=100_000)
    [request] = nginx.requests(at_least=1)
    assert (request.status, request.range, request.if_match) == (206, "bytes=-100000", "")
    assert source.size == SIZE and source.suffix_start == SIZE - 100_000 and source.suffix == BLOB[-100_000:]
    assert source.identity[0] == nginx.url("blob.bin") and source.identity[2] == SIZE and source.identity[1]
    assert source.owner[:2] == (os.getuid(), os.getgid()) and source.owner[2] > 0
    assert source.mapping is None and source.stats() == {"requests": 1, "bytes_fetched": 100_000, "retries": 0}
    assert source.read(SIZE - 10, SIZE) == BLOB[-10:] and len(nginx.requests()) == 1  # served from the suffix


def test_a_small_object_comes_whole_and_an_empty_one_is_no_archive(nginx: Nginx) -> None:
    nginx.put("small.bin", b"tiny")
    source = open_source(nginx.url("small.bin"))
    assert (source.size, source.suffix, source.suffix_start) == (4, b"tiny", 0)
    nginx.put("empty.bin", b"")
    assert open_source(nginx.url("empty.bin")).size == 0  # nginx answers 200 (no range of nothing), Content-Length 0
    with pytest.raises(packfs.FormatError):
        packfs.core.Archive(open_source(nginx.url("empty.bin")))


def test_s3_opening_is_one_request(s3_env: MotoServer) -> None:
    before = settled_count(s3_env)
    source = open_source("s3://bucket/blob.bin", suffix_bytes=65536)
    [request] = s3_env.requests(at_least=before + 1)[before:]
    assert (request.method, request.status) == ("GET", 206)
    assert source.size == SIZE and source.suffix == BLOB[-65536:] and source.identity[0] == "s3://bucket/blob.bin"
    assert source.read(1000, 300_000) == BLOB[1000:300_000]
    assert len(s3_env.requests(at_least=before + 2)) == before + 2


# -- reading -----------------------------------------------------------------------------


def test_every_read_is_one_get_with_if_match(nginx: Nginx) -> None:
    source = open_source(nginx.url("blob.bin"))
    nginx.clear_log()
    for start, end in [(0, 1), (12345, 200_000), (SIZE - 300_000, SIZE - 262_000)]:
        assert source.read(start, end) == BLOB[start:end]
    buffer = bytearray(5000)
    source.readinto(memoryview(buffer), 777)
    assert bytes(buffer) == BLOB[777:5777]
    requests = nginx.requests(at_least=4)
    assert [r.range for r in requests] == ["bytes=0-0", "bytes=12345-199999", f"bytes={SIZE - 300_000}-{SIZE - 262_001}",
                                           "bytes=777-5776"]
    assert {r.if_match for r in requests} == {source.identity[1]} and {r.status for r in requests} == {206}


def test_a_large_span_is_read_in_parallel_parts(nginx: Nginx) -> None:
    source = open_source(nginx.url("blob.bin"), part_bytes=1 << 20, suffix_bytes=1024)
    nginx.clear_log()
    assert source.read(100, SIZE - 100) == BLOB[100:SIZE - 100]
    ranges = sorted(r.range for r in nginx.requests(at_least=3))
    assert ranges == sorted([f"bytes=100-{(1 << 20) + 99}", f"bytes={(1 << 20) + 100}-{(2 << 20) + 99}",
                             f"bytes={(2 << 20) + 100}-{SIZE - 101}"])


def test_read_ranges_coalesces_near_spans_and_keeps_the_order(nginx: Nginx) -> None:
    source = open_source(nginx.url("blob.bin"), coalesce_gap=4096, suffix_bytes=1024)
    nginx.clear_log()
    spans = [(500_000, 500_100), (0, 10), (2_000_000, 2_100_000), (20, 30), (4000, 5000), (500_200, 500_300)]
    assert source.read_ranges(spans) == [BLOB[a:b] for a, b in spans]
    assert sorted(r.range for r in nginx.requests(at_least=3)) == sorted(["bytes=0-4999", "bytes=500000-500299",
                                                                "bytes=2000000-2099999"])
    assert source.stats()["requests"] == 4


# -- the object replaced -------------------------------------------------------------------


def test_an_object_replaced_on_nginx_is_changed_for_good(nginx: Nginx) -> None:
    nginx.put("replaced.bin", BLOB)
    nginx.clear_log()
    source = open_source(nginx.url("replaced.bin"), suffix_bytes=1024)
    assert source.read(0, 100) == BLOB[:100]
    os.utime(nginx.data / "replaced.bin", (1, 1))  # another Last-Modified: nginx's ETag is mtime and size
    with pytest.raises(ArchiveChangedError, match="412 Precondition Failed"):
        source.read(0, 100)
    assert [r.status for r in nginx.requests(at_least=3)] == [206, 206, 412]
    with pytest.raises(ArchiveChangedError):
        source.check_unchanged()
    sent = len(nginx.requests())
    with pytest.raises(ArchiveChangedError):
        source.read(200, 300)  # sticky: no request sent
    assert len(nginx.requests()) == sent


def test_an_object_replaced_on_s3_is_changed(s3_env: MotoServer) -> None:
    client = s3_env.client()
    client.put_object(Bucket="bucket", Key="replaced.bin", Body=BLOB)
    source = open_source("s3://bucket/replaced.bin", suffix_bytes=1024)
    client.put_object(Bucket="bucket", Key="replaced.bin", Body=BLOB[::-1])
    before = settled_count(s3_env)
    with pytest.raises(ArchiveChangedError):
        source.read(0, 100)
    assert [(r.method, r.status) for r in s3_env.requests(at_least=before + 1)[before:]] == [("GET", 412)]
    with pytest.raises(ArchiveChangedError):
        source.check_unchanged()


def test_an_answer_from_another_object_is_changed(nginx: Nginx) -> None:
    """A server that ignores If-Match (nginx honours it; a proxy's stale cache may not):
    the answer's own ETag gives the change away."""
    nginx.put("ignored.bin", BLOB)
    source = open_source(nginx.url("ignored.bin"), suffix_bytes=1024)
    source._options.pop("if_match")  # as if the server had not seen it
    os.utime(nginx.data / "ignored.bin", (1, 1))
    with pytest.raises(ArchiveChangedError, match="now has ETag"):
        source.read(0, 100)


# -- refusals ----------------------------------------------------------------------------


def test_403_404_are_named(nginx: Nginx) -> None:
    with pytest.raises(RemoteAccessError, match=r"access denied \(403\)") as denied:
        open_source(nginx.url("blob.bin", "denied"))
    assert isinstance(denied.value, PermissionError)
    with pytest.raises(RemoteNotFoundError, match="no such object") as missing:
        open_source(nginx.url("missing.bin"))
    assert isinstance(missing.value, FileNotFoundError)


def test_s3_404_403_and_missing_credentials(s3_env: MotoServer, monkeypatch) -> None:
    with pytest.raises(RemoteNotFoundError):
        open_source("s3://bucket/missing.bin")
    before = settled_count(s3_env)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(RemoteCredentialsError, match="no AWS credentials found") as raised:
        open_source("s3://bucket/blob.bin")
    assert isinstance(raised.value, PermissionError) and len(s3_env.requests()) == before  # nothing was sent
    with pytest.raises(RemoteAccessError, match=r"access denied \(403\)"):  # the bucket is private
        open_source("s3://bucket/blob.bin", storage_options={"anon": True})
    assert [r.status for r in s3_env.requests(at_least=before + 1)[before:]] == [403]


def test_s3_credentials_from_the_shared_files_and_storage_options(s3_env: MotoServer, monkeypatch, tmp_path) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION"):
        monkeypatch.delenv(name)
    (tmp_path / "credentials").write_text(f"[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n"
                                          f"[ours]\naws_access_key_id = {S3_KEY}\naws_secret_access_key = {S3_SECRET}\n")
    (tmp_path / "config").write_text(f"[profile ours]\nregion = {S3_REGION}\nendpoint_url = {s3_env.endpoint}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "ours")
    assert open_source("s3://bucket/blob.bin").size == SIZE
    settings = s3_settings({"key": "k", "secret": "s", "endpoint_url": "http://e"})
    assert (settings["access_key_id"], settings["endpoint"], settings["region"]) == ("k", "http://e", S3_REGION)
    assert "s" not in repr(settings).replace("S3Settings", "").replace("session", "").replace("access", "") \
        or "'s'" not in repr(settings)
    monkeypatch.delenv("AWS_PROFILE")
    assert s3_settings()["access_key_id"] == "wrong"  # the default profile
    with pytest.raises(RemoteArchiveError, match="unknown storage option 'secret_key'"):
        s3_settings({"secret_key": "x"})


def test_secrets_never_appear(nginx: Nginx, s3_env: MotoServer) -> None:
    secret = "TOPSECRETVALUE"
    url = nginx.url("blob.bin", "denied").replace("http://", f"http://user:{secret}@")
    with pytest.raises(RemoteAccessError) as raised:
        open_source(url)
    assert secret not in str(raised.value) and secret not in repr(raised.value)
    with pytest.raises(RemoteArchiveError) as raised:
        open_source(nginx.url("blob.bin") + f"?X-Amz-Signature={secret}")
    assert secret not in str(raised.value)
    source = open_source("s3://bucket/blob.bin", storage_options={"key": S3_KEY, "secret": secret + "x",
                                                                  "endpoint_url": s3_env.endpoint})
    for shown in (source.name, repr(source), repr(source.identity), repr(source.stats())):
        assert secret not in shown and S3_KEY not in shown
    with pytest.raises(RemoteNotFoundError) as raised:
        open_source("s3://bucket/none.bin", storage_options={"key": S3_KEY, "secret": secret})
    assert secret not in str(raised.value) and S3_KEY not in str(raised.value)


def test_a_server_that_ignores_range_is_refused_unread(nginx: Nginx) -> None:
    big = bytes(64 << 20)
    nginx.put("big.bin", big)
    nginx.clear_log()
    with pytest.raises(RemoteProtocolError, match="ignores Range"):
        open_source(nginx.url("big.bin", "norange"))
    [get] = nginx.requests(at_least=1)  # the 200's Content-Length said it was too large: no HEAD
    assert (get.method, get.status) == ("GET", 200)
    assert get.bytes_sent < len(big) // 4  # nginx stopped when the client hung up: what the sockets held (up to ~10 MiB)
    nginx.put("small.bin", b"tiny")
    nginx.clear_log()
    source = open_source(nginx.url("small.bin", "norange"))  # no larger than the suffix: taken whole from that GET
    assert (source.size, source.suffix, source.suffix_start) == (4, b"tiny", 0)
    assert [(r.method, r.status) for r in nginx.requests(at_least=1)] == [("GET", 200)]


def test_closed_and_other_schemes(nginx: Nginx, archive: Path) -> None:
    source = open_source(nginx.url("blob.bin"))
    source.close()
    assert source.closed
    with pytest.raises(ClosedArchiveError):
        source.read(0, 1)
    for url in ("gs://bucket/a.ffr", "memory://a.ffr", "hf://datasets/x/a.ffr"):
        with pytest.raises(RemoteArchiveError, match="packfs reads archives at s3://, http:// and https:// URLs"):
            open_source(url)
    with pytest.raises(RemoteArchiveError, match="is a file:// URL: give the path itself"):
        open_source(archive.as_uri())
    assert isinstance(open_source(str(archive)), LocalFile) and not is_url(str(archive))
    assert is_url("s3://bucket/x") and is_url("https://h/x")


def test_local_use_imports_no_client_library(archive: Path) -> None:
    code = ("import sys, packfs; from packfs.source import open_source\n"
            f"with packfs.PackedFolder({str(archive)!r}) as f: f.read('hello.txt')\n"
            f"open_source({str(archive)!r}).read(0, 8)\n"
            "loaded = [m for m in sys.modules if m.split('.')[0] == 'urllib3' or m == 'packfs.source.remote']\n"
            "assert not loaded, loaded\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=time_limit(60))


# -- failures through the proxy --------------------------------------------------------------


def through(proxy, nginx: Nginx, **options):
    return open_source(nginx.url("blob.bin", port=proxy.port), suffix_bytes=1024, **{**FAST, **options})


def test_a_batch_raises_only_once_every_get_of_it_is_done(nginx: Nginx) -> None:
    """A batch's GETs that run on threads (those the fast path left) are all finished
    before the first failure is raised: their callers then close the descriptors and
    free the buffers those GETs write to, and a GET still running would write into
    whatever reused them."""
    import threading

    nginx.put("batch.bin", bytes(1 << 16))
    finished = []
    entered = threading.Barrier(2)

    def get(item: int) -> None:
        entered.wait(time_limit(10))  # both running at once
        if item == 0:
            raise RemoteAccessError("the first GET failed")
        time.sleep(0.3)
        finished.append(item)

    source = open_source(nginx.url("batch.bin"))
    try:
        with pytest.raises(RemoteAccessError):
            source._run(get, [0, 1], 2)
        assert finished == [1]
    finally:
        source.close()


def test_503_is_retried_then_succeeds(proxy, nginx: Nginx) -> None:
    source = through(proxy, nginx)
    proxy.fault("503", count=2)
    assert source.read(0, 100_000) == BLOB[:100_000]
    assert source.stats()["retries"] == 2 and source.stats()["requests"] == 4 and proxy.faults_injected == 2


def test_503_forever_is_a_clear_error(proxy, nginx: Nginx) -> None:
    source = through(proxy, nginx)
    proxy.fault("503", count=10**9)
    with pytest.raises(RemoteIOError, match=r"kept failing \(503, 3 tries\)") as raised:
        source.read(0, 100_000)
    assert isinstance(raised.value, OSError) and source.stats()["retries"] == 2
    proxy.fault(None)
    assert source.read(0, 10) == BLOB[:10]  # a failure, not a change: the source reads on


@pytest.mark.parametrize("fault", ["kill", "truncate", "wrong_range"])
def test_a_broken_answer_is_retried(proxy, nginx: Nginx, fault: str) -> None:
    source = through(proxy, nginx)
    proxy.fault(fault, count=1)
    assert source.read(1000, 500_000) == BLOB[1000:500_000]
    assert source.stats()["retries"] == 1


@pytest.mark.parametrize("fault, error, message", [
    ("kill", RemoteIOError, "connection failed"),
    ("truncate", RemoteIOError, "cut off"),
    ("wrong_range", RemoteProtocolError, "another range than asked"),
    ("longer", RemoteProtocolError, "another range than asked"),
    ("ignore_range", RemoteProtocolError, "ignores Range"),
])
def test_a_broken_answer_every_time_is_refused(proxy, nginx: Nginx, fault: str, error: type, message: str) -> None:
    source = through(proxy, nginx)
    proxy.fault(fault, count=10**9)
    with pytest.raises(error, match=message):
        source.read(1000, 500_000)
    proxy.fault(None)
    source.check_unchanged()  # not a change of the object


def test_a_stalled_server_times_out(proxy, nginx: Nginx) -> None:
    source = through(proxy, nginx, timeout=0.3, retries=1)
    proxy.fault("stall", count=2)
    with pytest.raises(RemoteTimeoutError, match="no complete answer within 0.3 s") as raised:
        source.read(0, 100)
    assert isinstance(raised.value, TimeoutError)


def test_a_flipped_bit_is_caught_by_the_archive_checks(proxy, nginx: Nginx, archive: Path) -> None:
    from packfs.core import Archive

    nginx.put("tree.ffr", archive.read_bytes())
    opened = Archive(open_source(nginx.url("tree.ffr", port=proxy.port), suffix_bytes=1024, **FAST))
    proxy.fault("flip", count=1)
    with pytest.raises(ChecksumError):
        opened.read_path("big/large.bin")
    assert opened.read_path("big/large.bin")[:100] == (archive.parent / "src/big/large.bin").read_bytes()[:100]


def test_read_ranges_with_spans_larger_than_a_part(nginx: Nginx) -> None:
    """Large spans among many small ones, more parts than threads: every part is a
    task of its own (a task waiting on parts queued behind it would never finish)."""
    source = open_source(nginx.url("blob.bin"), part_bytes=256 << 10, in_flight=2, suffix_bytes=1024)
    spans = [(k * 1000, k * 1000 + 10) for k in range(50)] + [(0, SIZE), (SIZE // 2, SIZE), (5, 6), (SIZE - 3, SIZE)]
    assert source.read_ranges(spans) == [BLOB[a:b] for a, b in spans]


def test_spans_outside_the_object_are_refused_unsent(nginx: Nginx) -> None:
    source = open_source(nginx.url("blob.bin"), suffix_bytes=1024)
    assert source.read(10, 10) == b"" and source.read_ranges([]) == [] and source.read_ranges([(5, 5)]) == [b""]
    before = source.stats()["requests"]
    for start, end in [(SIZE - 5, SIZE + 1), (-1, 5), (10, 5)]:
        with pytest.raises(packfs.FormatError, match="expected a span inside it"):
            source.read(start, end)
    with pytest.raises(packfs.FormatError):
        source.read_ranges([(0, 1), (SIZE, SIZE + 1)])
    assert source.stats()["requests"] == before


def test_a_versioned_bucket_pins_the_version_opened(s3_env: MotoServer) -> None:
    """On a bucket that keeps versions, the identity is the version: a new version put
    after the open does not disturb a reader, which goes on reading its own."""
    client = s3_env.client()
    client.create_bucket(Bucket="versioned")
    client.put_bucket_versioning(Bucket="versioned", VersioningConfiguration={"Status": "Enabled"})
    version = client.put_object(Bucket="versioned", Key="blob.bin", Body=BLOB)["VersionId"]
    source = open_source("s3://versioned/blob.bin", suffix_bytes=1024)
    assert source.identity == ("s3://versioned/blob.bin", f"{version} at {s3_env.endpoint}", SIZE)
    client.put_object(Bucket="versioned", Key="blob.bin", Body=BLOB[::-1])
    before = settled_count(s3_env)
    assert source.read(0, 100_000) == BLOB[:100_000]
    source.check_unchanged()
    [request] = s3_env.requests(at_least=before + 1)[before:]
    assert request.status == 206 and f"versionId={version}" in request.path


def test_random_faults_never_give_wrong_bytes(proxy, nginx: Nginx) -> None:
    """Reads of random spans, each with a random fault (or none) on its first try:
    every read returns exactly the object's bytes or raises; none hangs."""
    import random

    rng = random.Random(1)
    source = through(proxy, nginx, retries=1, timeout=0.25)
    outcomes = {"ok": 0, "refused": 0}
    for _ in range(150):
        start = rng.randrange(0, SIZE - 1)
        end = min(SIZE, start + rng.randint(1, 600_000))
        fault = rng.choice([None, "503", "kill", "truncate", "wrong_range", "longer", "ignore_range", "stall"])
        proxy.fault(fault, count=rng.choice([1, 2]))
        try:
            data = source.read(start, end)
        except (RemoteIOError, RemoteProtocolError, RemoteTimeoutError):
            outcomes["refused"] += 1
        else:
            assert data == BLOB[start:end], (fault, start, end)
            outcomes["ok"] += 1
        proxy.fault(None)
    source.check_unchanged()
    assert outcomes["ok"] and outcomes["refused"], outcomes


def test_s3_requests_are_signed_with_the_key_pair_found_whole(s3_env: MotoServer, monkeypatch) -> None:
    """Credentials from storage_options are used whole: a session token in the
    environment (another identity's) is not sent beside them; one given with them is."""
    from bench.proxy import Proxy

    monkeypatch.setenv("AWS_SESSION_TOKEN", "environment-token")
    with Proxy(s3_env.port) as proxy:
        endpoint = f"http://127.0.0.1:{proxy.port}"
        open_source("s3://bucket/blob.bin", storage_options={"key": "other-key", "secret": "s", "endpoint_url": endpoint})
        open_source("s3://bucket/blob.bin", storage_options={"key": "third-key", "secret": "s", "token": "given-token",
                                                             "endpoint_url": endpoint})
        first, second = (head.decode().lower() for head in proxy.heads)
    assert "credential=other-key/" in first and "x-amz-security-token" not in first
    assert "credential=third-key/" in second and "x-amz-security-token: given-token" in second


# -- fork ----------------------------------------------------------------------------------


def in_forked_child(work, seconds: float = 20) -> str:
    """Run ``work()`` in a forked child; what it returns (a str), or what it raised.  A
    child that hangs (as one did on a client whose runtime does not survive fork) is
    killed and the test fails."""
    import signal

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        signal.alarm(int(seconds))
        try:
            said = work()
        except BaseException as error:  # noqa: BLE001 (reported to the parent whatever it is)
            said = f"raised {type(error).__name__}: {error}"
        os.write(write_end, said.encode())
        os._exit(0)
    os.close(write_end)
    deadline = time.monotonic() + time_limit(seconds + 5)
    done, status = os.waitpid(pid, os.WNOHANG)
    while not done and time.monotonic() < deadline:
        time.sleep(0.02)
        done, status = os.waitpid(pid, os.WNOHANG)
    if not done:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_end)
        pytest.fail("the forked child hung")
    with os.fdopen(read_end, "rb") as pipe:
        said = pipe.read().decode()
    assert os.WIFEXITED(status), f"the forked child died: status {status} ({said!r})"
    return said


def test_a_forked_child_reads_on_its_own_connections(proxy, nginx: Nginx) -> None:
    """The parent opened, read (its pool has an idle connection, its thread pool runs)
    and forked: the child reads the right bytes through a connection of its own (the
    proxy counts a second one), with threads of its own for read_ranges; the parent
    reads on over its own, untouched."""
    source = through(proxy, nginx, in_flight=4)
    spans = [(0, 1000), (1_000_000, 1_001_000), (2_000_000, 2_200_000)]
    assert source.read_ranges(spans) == [BLOB[a:b] for a, b in spans]  # threads started
    assert source.read(5000, 6000) == BLOB[5000:6000]
    connections = proxy.connections

    def child() -> str:
        assert source.read(100_000, 300_000) == BLOB[100_000:300_000]
        assert source.read_ranges(spans) == [BLOB[a:b] for a, b in spans]
        return "read"

    assert in_forked_child(child) == "read"
    assert proxy.connections > connections  # the child's own
    after_child = proxy.connections
    assert source.read(7000, 8000) == BLOB[7000:8000]
    assert source.stats()["retries"] == 0
    assert proxy.connections == after_child  # the parent's idle connection was left alone


def test_a_forked_child_sees_the_object_replaced(nginx: Nginx) -> None:
    nginx.put("forked.bin", BLOB)
    source = open_source(nginx.url("forked.bin"), suffix_bytes=1024)
    assert source.read(0, 1000) == BLOB[:1000]

    def child() -> str:
        assert source.read(1000, 2000) == BLOB[1000:2000]
        os.utime(nginx.data / "forked.bin", (1, 1))  # another ETag
        try:
            source.read(0, 100)
        except ArchiveChangedError as error:
            return f"changed: {error}"
        return "read a replaced object"

    said = in_forked_child(child)
    assert said.startswith("changed:") and "412 Precondition Failed" in said, said
    with pytest.raises(ArchiveChangedError):  # the parent finds out on its own next request
        source.read(0, 100)


# -- redirects and S3's errors ---------------------------------------------------------------


def test_an_http_redirect_is_followed_on_every_request(nginx: Nginx) -> None:
    nginx.clear_log()
    source = open_source(nginx.url("blob.bin", "moved"), suffix_bytes=1024)
    assert source.name == nginx.url("blob.bin", "moved") and source.size == SIZE
    assert source.read(10, 20) == BLOB[10:20]
    assert [(r.status, r.path) for r in nginx.requests(at_least=4)] == [
        (302, "/moved/blob.bin"), (206, "/data/blob.bin"), (302, "/moved/blob.bin"), (206, "/data/blob.bin")]


def test_s3_error_codes_are_told_apart(s3_env: MotoServer) -> None:
    """NoSuchBucket and NoSuchKey (both 404) named from S3's XML; a refusal of an
    unsigned request says so (moto's 403 has no body to name it further)."""
    with pytest.raises(RemoteNotFoundError, match="NoSuchBucket"):
        open_source("s3://no-such-bucket/blob.bin")
    with pytest.raises(RemoteNotFoundError, match="NoSuchKey"):
        open_source("s3://bucket/no-such-key.bin")
    with pytest.raises(RemoteAccessError, match=r"access denied \(403\): refused: unsigned requests"):
        open_source("s3://bucket/blob.bin", storage_options={"anon": True})


# -- the signature -------------------------------------------------------------------------


def test_sigv4_matches_aws_published_example() -> None:
    """AWS's own example (S3 API reference, "Authenticating Requests: Using the
    Authorization Header", GET Object): the same signature to the last digit."""
    import calendar

    from packfs.source.sigv4 import sign_v4

    headers = sign_v4("GET", "examplebucket.s3.amazonaws.com", "/test.txt", "", region="us-east-1",
                      access_key_id="AKIAIOSFODNN7EXAMPLE",
                      secret_access_key="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                      when=calendar.timegm((2013, 5, 24, 0, 0, 0)), extra_signed={"Range": "bytes=0-9"})
    assert headers["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")


@pytest.mark.parametrize("key, token", [("plain.ffr", None), ("dir/a b+c=d&é~%.ffr", "session/token+="),
                                        ("a//b/", None)])
def test_sigv4_agrees_with_botocore(key: str, token) -> None:
    """Keys with characters SigV4 encodes, a version id in the query, a session token:
    the signature botocore (boto3's signer) computes for the same request."""
    botocore = pytest.importorskip("botocore", reason="boto3 (the test extra) checks the signer")
    import calendar
    import datetime
    from unittest import mock

    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from packfs.source.sigv4 import canonical_query, encode_key, sign_v4

    when = calendar.timegm((2024, 2, 29, 12, 34, 56))
    path, query = f"/bucket/{encode_key(key)}", canonical_query({"versionId": "v1.2_3~x+y"})
    ours = sign_v4("GET", "127.0.0.1:9000", path, query, region="eu-west-3", access_key_id="AKID",
                   secret_access_key="SECRET/key+", session_token=token, when=when)
    request = AWSRequest(method="GET", url=f"http://127.0.0.1:9000{path}?{query}", headers={})
    request.context["payload_signing_enabled"] = True
    # botocore signs for now: its clock is set to ``when`` (older botocore read utcnow).
    with mock.patch("botocore.auth.get_current_datetime", create=True,
                    return_value=datetime.datetime(2024, 2, 29, 12, 34, 56)):
        S3SigV4Auth(Credentials("AKID", "SECRET/key+", token), "s3", "eu-west-3").add_auth(request)
    assert botocore and request.headers["X-Amz-Date"] == ours["x-amz-date"]
    assert request.headers["Authorization"] == ours["Authorization"]


def test_a_refused_connection_is_tried_twice_then_told(nginx: Nginx) -> None:
    """Nothing listening on the port: one more try (a server restarting), not every
    retry (docs/remote.md); timeouts, resets and 503 keep theirs (the tests above)."""
    from bench.proxy import Proxy
    from tests.remote_servers import free_port

    closed = f"http://127.0.0.1:{free_port()}/blob.bin"
    with pytest.raises(RemoteIOError, match=r"connection refused; 2 tries\): expected a server listening at "
                                            r"http://127\.0\.0\.1:\d+$"):
        open_source(closed, retries=5, backoff=0.005)
    with Proxy(nginx.port) as proxy:
        source = open_source(nginx.url("blob.bin", port=proxy.port), retries=5, backoff=0.005)
    # The proxy is gone, its port closed: a new connection is refused.
    source._http.clear()  # noqa: SLF001 (no kept-alive connection to the dead proxy: only refusals)
    with pytest.raises(RemoteIOError, match=r"connection refused; 2 tries"):
        source.read(0, 1000)
    assert source.stats()["requests"] == 1 + 2 and source.stats()["retries"] == 1
