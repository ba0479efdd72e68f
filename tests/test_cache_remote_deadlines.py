"""Deadlines, not per-read time-outs: a remote that sends a byte a second, or stops
answering in the middle of a run, costs one deadline (remote.timeout) and one warning,
and the status line tells the remote's wait apart from the compile.

These tests bound elapsed time because that bound is the feature: the faults they stage
would otherwise hold a run for minutes (the drip never ends), so the margins below are
several seconds wide and far from both the pass and the fail case."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.remote_servers import ACCESS, KEY, RedisServer, slow_drip
from tests.test_cache import MLP, RESNET, warnings_in


def run_nncc(model, cache, **env):
    return subprocess.Popen([sys.executable, "-m", "nncc", "run", str(model), "--random-inputs", "--json",
                             "--cache-dir", str(cache)], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), NNCC_REMOTE_KEY=KEY, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(proc) -> tuple[dict, list[str], str]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "internal error" not in err, err
    return json.loads(out)["cache"], warnings_in(err), err


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["redis", "s3"])
def test_a_slow_drip_server_costs_one_deadline(tmp_path, kind):
    timeout = 1.0
    if kind == "redis":
        reply = b"$1000000\r\n" + b"x" * 64  # a bulk reply that never completes
    else:
        reply = b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 64
    with slow_drip(reply) as (port, closed):
        env = {"NNCC_REMOTE_TIMEOUT": str(timeout)}
        if kind == "redis":
            env["NNCC_REMOTE"] = f"redis://127.0.0.1:{port}/0"
        else:
            env |= ACCESS | {"NNCC_REMOTE": "s3://team-cache/nncc", "NNCC_S3_ENDPOINT": f"http://127.0.0.1:{port}"}
        cache, warned, err = finished(run_nncc(MLP, tmp_path / "a", **env))
    assert cache["outcome"] == "miss"  # compiled here, as if there were no remote
    assert len(warned) == 1 and "timed out" in warned[0], warned
    assert cache["remote_note"] == "timed out" and cache["remote_seconds"] < timeout + 4.0, cache
    assert "remote wait" in err and "(timed out); compiled and stored in" in err, err


@pytest.mark.slow
def test_a_server_that_stops_answering_mid_run_costs_one_deadline(tmp_path):
    """Redis freezes (SIGSTOP) once the run holds its compile lease: the upload times out
    once, and the lease is not released after that (it expires by itself)."""
    timeout = 3.0
    server = RedisServer(tmp_path)
    try:
        proc = run_nncc(RESNET, tmp_path / "a", NNCC_REMOTE=server.url, NNCC_REMOTE_TIMEOUT=str(timeout))
        deadline = time.monotonic() + 120
        while not list(server.client.scan_iter(match="nncc:leases/*")):
            assert time.monotonic() < deadline and proc.poll() is None, "the run took no lease"
            time.sleep(0.001)
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            cache, warned, err = finished(proc)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        # a release the run sent into the frozen server would be served now that it runs
        # again: the lease must still be there, left to expire by itself
        server.client.ping()
        leases = list(server.client.scan_iter(match="nncc:leases/*"))
    finally:
        server.stop()
    assert cache["outcome"] == "miss" and cache["remote_note"] == "timed out"
    assert len(warned) == 1 and "timed out" in warned[0], warned
    assert leases, "the run released its lease after the remote had already timed out"
