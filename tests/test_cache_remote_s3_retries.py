"""botocore's retries, exercised for real: a loopback HTTP proxy between nncc and moto's S3
server answers chosen requests with 503 SlowDown, the body S3 itself sends when asked to
slow down. A few of them are retried away (the remote miss and hit go through, the proxy
sees each retry); a store that only ever says SlowDown costs botocore's attempts on the
first request, then one warning, and the run goes on with the local cache."""

from __future__ import annotations

import http.client
import http.server
import threading

import pytest

from nncc.model import prepare
from nncc.cache.remote import s3_store
from nncc.preparing import remote as flow
from nncc.cache.store import Cache
from tests.remote_servers import ACCESS, KEY, MotoServer, fresh_remote_state  # noqa: F401
from tests.test_cache import MLP, RESNET, assert_correct, warnings_in

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n'
             b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
             b"<RequestId>4442587FB7D0A2F9</RequestId><HostId>proxy</HostId></Error>")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te", "upgrade"}


class SlowDownProxy:
    """A reverse proxy on 127.0.0.1 in front of ``upstream`` (host, port): it forwards each
    request whole, except the ones it is told to refuse, which it answers 503 SlowDown.
    ``log`` holds (method, path, status) of every request, in order."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.log: list[tuple[str, str, int]] = []
        self._refuse = 0  # requests still to answer with SlowDown (-1: all of them)
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as botocore's connection pool expects

            def log_message(self, *args):
                pass

            def handle_one(self):
                body = self._body()
                with proxy._lock:
                    refuse = proxy._refuse != 0
                    if proxy._refuse > 0:
                        proxy._refuse -= 1
                if refuse:
                    status, headers, data = 503, [("Content-Type", "application/xml")], SLOW_DOWN
                else:
                    status, headers, data = proxy._forward(self.command, self.path, self.headers, body)
                with proxy._lock:
                    proxy.log.append((self.command, self.path, status))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                if self.command != "HEAD":  # a HEAD answer keeps the object's own Content-Length
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _body(self) -> bytes | None:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()  # the CRLF after each chunk
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return b"".join(chunks)
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else None

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = handle_one

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _forward(self, method, path, headers, body):
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            sent = {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP | {"content-length"}}
            if body is not None:
                sent["Content-Length"] = str(len(body))
            conn.request(method, path, body=body, headers=sent)
            answer = conn.getresponse()
            data = answer.read()
            kept = [(k, v) for k, v in answer.getheaders()
                    if k.lower() not in HOP_BY_HOP and (method == "HEAD" or k.lower() != "content-length")]
            return answer.status, kept, data
        finally:
            conn.close()

    def refuse(self, count: int) -> None:
        """Answer the next ``count`` requests with SlowDown (-1: every request from now on)."""
        with self._lock:
            self._refuse = count

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def moto():
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture
def proxy(moto, monkeypatch, request):
    """nncc talks to moto through the proxy, under a key prefix of the test's own."""
    front = SlowDownProxy(("127.0.0.1", moto.port))
    for name, value in ACCESS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NNCC_REMOTE", f"s3://team-cache/{request.node.name}")
    monkeypatch.setenv("NNCC_S3_ENDPOINT", front.endpoint)
    monkeypatch.setenv("NNCC_REMOTE_KEY", KEY)
    # botocore waits up to 1 s, then up to 2 s, between its attempts (standard mode, jittered):
    # the deadline leaves room for them, so the test sees botocore's retries, not nncc's deadline
    monkeypatch.setenv("NNCC_REMOTE_TIMEOUT", "10")
    yield front
    front.stop()


def counters(cache_dir) -> dict[str, int]:
    with Cache.open(cache_dir) as c:
        return c.index.counters()


@pytest.mark.slow
def test_slow_down_answers_are_retried_and_the_miss_and_hit_go_through(proxy, moto, tmp_path, request):
    refused = s3_store.RETRIES - 1  # the most one request can be refused and still succeed
    proxy.refuse(refused)
    model, outcome = prepare(MLP, cache_dir=tmp_path / "a")
    assert outcome.outcome == "miss" and outcome.remote_note is None  # no fault: the remote tier stayed on
    assert_correct(model, MLP)
    first = proxy.log[:refused + 1]  # the miss's first request, sent again after each SlowDown
    assert len({(method, path) for method, path, _ in first}) == 1, first
    assert [status for _, _, status in first] == [503] * refused + [404]  # the manifest is not there yet
    assert sum(1 for *_, status in proxy.log if status == 503) == refused
    assert counters(tmp_path / "a")["remote_errors"] == 0
    uploaded = moto.client.list_objects_v2(Bucket="team-cache", Prefix=f"{request.node.name}/manifests/")
    assert len(uploaded.get("Contents", [])) == 1  # written back through the proxy, seen on moto itself

    flow._tiers.clear()  # another machine: a client of its own
    mark = len(proxy.log)
    proxy.refuse(refused)
    model, outcome = prepare(MLP, cache_dir=tmp_path / "b")
    assert outcome.outcome == "remote hit"
    assert_correct(model, MLP)
    first = proxy.log[mark:mark + refused + 1]
    assert len({(method, path) for method, path, _ in first}) == 1, first
    assert [status for _, _, status in first] == [503] * refused + [200]
    assert counters(tmp_path / "b")["remote_errors"] == 0


@pytest.mark.slow
def test_a_store_that_always_says_slow_down_costs_one_warning_and_the_local_cache_goes_on(proxy, tmp_path, capfd):
    proxy.refuse(-1)
    capfd.readouterr()
    model, outcome = prepare(MLP, cache_dir=tmp_path / "a")
    assert outcome.outcome == "miss" and outcome.remote_note == "failed"  # botocore gave up, not the deadline
    assert_correct(model, MLP)
    # botocore's attempts at the first request, all refused; then nothing more is asked
    assert len(proxy.log) == s3_store.RETRIES
    assert len({(method, path) for method, path, _ in proxy.log}) == 1 and {s for *_, s in proxy.log} == {503}
    model, outcome = prepare(RESNET, cache_dir=tmp_path / "b")  # later in the same run
    assert outcome.outcome == "miss"
    assert_correct(model, RESNET)
    assert len(proxy.log) == s3_store.RETRIES
    warned = warnings_in(capfd.readouterr().err)
    assert len(warned) == 1 and "503 SlowDown" in warned[0] and "local cache only" in warned[0], warned
    assert counters(tmp_path / "a")["remote_errors"] == 1
    with Cache.open(tmp_path / "a") as c:
        assert [e.origin for e in c.index.entries()] == ["local"]
