"""Real servers on loopback for the remote tier's tests: redis-server and moto's S3 server,
started per test on a free port of 127.0.0.1 and stopped afterwards; plus a black hole (a
port that accepts connections and never answers) and the raw view of each store through
an independent client (files, redis-py, boto3), to plant and inspect objects."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

KEY = "the team's secret, for tests only"
ACCESS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(check, what: str, proc: subprocess.Popen, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}")
        try:
            if check():
                return
        except Exception:  # not up yet
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class RedisServer:
    def __init__(self, folder, maxmemory: str | None = None):
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            pytest.skip("redis-server is not installed (.ci/run installs it with apt-get)")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(folder)]
        if maxmemory:
            args += ["--maxmemory", maxmemory, "--maxmemory-policy", "noeviction"]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        import redis

        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        _wait_for(self.client.ping, "redis-server", self.proc)

    def stop(self) -> None:
        self.client.close()
        _stop(self.proc)


class MotoServer:
    def __init__(self):
        import boto3  # lazy: slow to import, and only the S3 store's tests use it

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                                   aws_access_key_id="testing", aws_secret_access_key="testing")
        _wait_for(lambda: self.client.list_buckets() is not None, "moto server", self.proc)
        self.client.create_bucket(Bucket="team-cache")
        self.url = "s3://team-cache/nncc"

    def stop(self) -> None:
        _stop(self.proc)


@contextlib.contextmanager
def black_hole():
    """A port that takes connections into its backlog and never answers: connects that
    hang or requests that never get a reply, like a firewall dropping packets."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(0)
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


@contextlib.contextmanager
def slow_drip(reply: bytes):
    """A port that answers every connection with ``reply`` one byte a second, forever: a
    socket read never waits long enough to trip a per-read time-out. Yields (port, the
    number of connections the client closed)."""
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()
    closed = []

    def drip(conn):
        with conn:
            for i in range(10_000):
                if stop.wait(1.0 if i else 0.0):
                    return
                try:
                    conn.sendall(reply[i % len(reply):i % len(reply) + 1])
                except OSError:
                    closed.append(1)  # the client hung up: it gave up waiting
                    return

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], closed
    finally:
        stop.set()
        thread.join()
        server.close()


class Remote:
    """One remote store for a test: its URL, the environment that selects it, and raw
    access to its objects through a client independent of nncc."""

    def __init__(self, kind: str, url: str, env: dict, server=None, root=None):
        self.kind, self.url, self.env, self.server, self.root = kind, url, env, server, root

    def keys(self, prefix: str) -> list[str]:
        if self.kind == "file":
            folder = os.path.join(self.root, prefix.rstrip("/"))
            return sorted(f"{prefix}{n}" for n in os.listdir(folder)) if os.path.isdir(folder) else []
        if self.kind == "redis":
            return sorted(k.decode()[len("nncc:"):] for k in self.server.client.scan_iter(match=f"nncc:{prefix}*"))
        listed = self.server.client.list_objects_v2(Bucket="team-cache", Prefix=f"nncc/{prefix}")
        return sorted(o["Key"][len("nncc/"):] for o in listed.get("Contents", []))

    def get(self, key: str) -> bytes | None:
        if self.kind == "file":
            path = os.path.join(self.root, key)
            return open(path, "rb").read() if os.path.exists(path) else None
        if self.kind == "redis":
            return self.server.client.get(f"nncc:{key}")
        try:
            return self.server.client.get_object(Bucket="team-cache", Key=f"nncc/{key}")["Body"].read()
        except self.server.client.exceptions.NoSuchKey:
            return None

    def put(self, key: str, data: bytes) -> None:
        if self.kind == "file":
            path = os.path.join(self.root, key)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        elif self.kind == "redis":
            self.server.client.set(f"nncc:{key}", data)
        else:
            self.server.client.put_object(Bucket="team-cache", Key=f"nncc/{key}", Body=data)


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path)
    yield server
    server.stop()


@pytest.fixture(params=["file", "redis", "s3"])
def remote(request, tmp_path, monkeypatch):
    """Each store in turn, selected through the environment as a user would."""
    env = {"NNCC_REMOTE_KEY": KEY, "NNCC_REMOTE_TIMEOUT": "5"}
    if request.param == "file":
        root = tmp_path / "shared"
        root.mkdir()
        r = Remote("file", f"file://{root}", env | {"NNCC_REMOTE": f"file://{root}"}, root=str(root))
    elif request.param == "redis":
        server = RedisServer(tmp_path)
        request.addfinalizer(server.stop)
        r = Remote("redis", server.url, env | {"NNCC_REMOTE": server.url}, server=server)
    else:
        server = MotoServer()
        request.addfinalizer(server.stop)
        r = Remote("s3", server.url, env | ACCESS | {"NNCC_REMOTE": server.url, "NNCC_S3_ENDPOINT": server.endpoint},
                   server=server)
    for name, value in r.env.items():
        monkeypatch.setenv(name, value)
    return r


@pytest.fixture(autouse=True)
def fresh_remote_state():
    """Each test is a new run: no remote remembered as failed, no warning already given."""
    from nncc.preparing import remote as flow

    def reset():
        for state in (flow._tiers, flow._warned, flow._rejected):
            state.clear()

    reset()
    yield
    flow._release_all()
    reset()
