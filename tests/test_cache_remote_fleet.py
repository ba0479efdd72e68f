"""A fleet on one remote: 8 processes with 8 separate local caches and one real Redis,
all cold on one model. Exactly one compiles; the others wait on its lease and get its
entry as remote hits. And a compiling process killed mid-way: another takes over once
its lease expires."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.remote_servers import KEY, fresh_remote_state, redis_server  # noqa: F401
from tests.test_cache import RESNET, check_outputs, feeds_for
from tests.test_cache_concurrency import BARRIER_DRIVER

pytestmark = pytest.mark.slow  # fleets of processes compiling against one remote


def fleet_env(server, cache_dir, **extra) -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), NNCC_CACHE_DIR=str(cache_dir), NNCC_REMOTE=server.url,
                NNCC_REMOTE_KEY=KEY, **extra)


def start_fleet(tmp_path, count: int, env_for) -> list[subprocess.Popen]:
    """``count`` processes, each with its own cold cache, released at the same moment."""
    tmp_path.mkdir(exist_ok=True)
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, **feeds_for(RESNET))
    go = tmp_path / "go"
    procs = []
    for i in range(count):
        cmd = [sys.executable, "-c", BARRIER_DRIVER, str(tmp_path / f"ready{i}"), str(go), *run_cmd(tmp_path, i, feeds)]
        procs.append(subprocess.Popen(cmd, env=env_for(tmp_path / f"machine{i}"), cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + 240
    while not all((tmp_path / f"ready{i}").exists() for i in range(count)):
        assert time.monotonic() < deadline, "the processes did not get ready"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
        time.sleep(0.01)
    go.write_text("go")
    return procs


def check_fleet(tmp_path, procs) -> None:
    """Exactly one compiled; the others got its entry from the remote; all outputs are
    right (onnxruntime) and bit-identical."""
    outcomes = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        assert "warning" not in err, err
        outcome = json.loads(out)["cache"]["outcome"]
        outcomes.append(outcome)
        assert ("compiled" if outcome == "miss" else "remote hit") in err, err
    assert sorted(outcomes) == ["miss"] + ["remote hit"] * (len(procs) - 1)
    first = dict(np.load(tmp_path / "out0.npz"))
    for i in range(len(procs)):
        check_outputs(tmp_path / f"out{i}.npz", RESNET)
        got = dict(np.load(tmp_path / f"out{i}.npz"))
        assert all(np.array_equal(got[name], first[name]) for name in first)


def run_cmd(tmp_path, i, feeds):
    return ["run", str(RESNET), "--inputs", str(feeds), "-o", str(tmp_path / f"out{i}.npz"), "--json"]


def test_eight_machines_compile_once(redis_server, tmp_path):
    check_fleet(tmp_path, start_fleet(tmp_path, 8, lambda cache: fleet_env(redis_server, cache)))
    client = redis_server.client
    assert len(list(client.scan_iter(match="nncc:manifests/*"))) == 1
    assert list(client.scan_iter(match="nncc:leases/*")) == []


def test_four_machines_on_s3_and_on_a_shared_folder_compile_once(tmp_path):
    """The other stores' leases under real contention: S3's conditional put, O_EXCL files."""
    from tests.remote_servers import ACCESS, MotoServer

    server = MotoServer()
    try:
        s3 = dict(ACCESS, NNCC_S3_ENDPOINT=server.endpoint)
        check_fleet(tmp_path / "s3", start_fleet(tmp_path / "s3", 4, lambda cache: fleet_env(server, cache, **s3)))
    finally:
        server.stop()
    shared = tmp_path / "shared"
    shared.mkdir()
    folder = type("Folder", (), {"url": f"file://{shared}"})
    check_fleet(tmp_path / "file", start_fleet(tmp_path / "file", 4, lambda cache: fleet_env(folder, cache)))
    assert os.listdir(shared / "leases") == []


def _lease_holder(client, deadline: float) -> tuple[str, bytes]:
    while time.monotonic() < deadline:
        for key in client.scan_iter(match="nncc:leases/*"):
            owner = client.get(key)
            if owner is not None:
                return key.decode(), owner
        time.sleep(0.001)
    raise AssertionError("no process took the lease")


def test_a_killed_compiler_is_taken_over_after_its_lease_expires(redis_server, tmp_path):
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, **feeds_for(RESNET))
    client = redis_server.client
    short = {"NNCC_REMOTE_LEASE": "2", "NNCC_REMOTE_WAIT": "300"}
    first = subprocess.Popen([sys.executable, "-m", "nncc", *run_cmd(tmp_path, 0, feeds)], cwd=ROOT,
                             env=fleet_env(redis_server, tmp_path / "machine0", **short),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        key, owner = _lease_holder(client, time.monotonic() + 120)
        os.kill(first.pid, signal.SIGSTOP)  # frozen mid-compile, holding the lease
        assert f":{first.pid}:" in owner.decode()
        assert list(client.scan_iter(match="nncc:manifests/*")) == []  # it had not uploaded anything
        second = subprocess.Popen([sys.executable, "-m", "nncc", *run_cmd(tmp_path, 1, feeds)], cwd=ROOT,
                                  env=fleet_env(redis_server, tmp_path / "machine1", **short),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        os.kill(first.pid, signal.SIGKILL)  # dies without releasing: only expiry frees the lease
        first.wait()
        out, err = second.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert second.returncode == 0, err
    assert json.loads(out)["cache"]["outcome"] == "miss" and "compiled" in err  # took over and compiled
    assert "waited" not in err  # through the expired lease, not by giving up waiting
    check_outputs(tmp_path / "out1.npz", RESNET)
    assert client.get(key) is None  # released after its upload
    assert len(list(client.scan_iter(match="nncc:manifests/*"))) == 1
    third = subprocess.run([sys.executable, "-m", "nncc", *run_cmd(tmp_path, 2, feeds)], cwd=ROOT,
                           env=fleet_env(redis_server, tmp_path / "machine2"), capture_output=True, text=True)
    assert third.returncode == 0 and json.loads(third.stdout)["cache"]["outcome"] == "remote hit", third.stderr
    check_outputs(tmp_path / "out2.npz", RESNET)
