"""A dynamic model runs the native plan the cache holds for an input shape from that shape's
first run (nncc.runtime.specialize, nncc.preparing.shapes): in a fresh process, through
`nncc run` and the Python API, whether the entry was built by an earlier run's background
build (a thread, or the detached worker `nncc run` leaves behind) or by
``prepare(path, stage="optimized", dims=...)`` itself. Outputs are checked against
onnxruntime."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time

import numpy as np
import pytest

from nncc.model import prepare
from nncc.native.toolchain import find_toolchain
from tests.conftest import ROOT
from tests.oracle import ort_outputs

pytestmark = pytest.mark.skipif(find_toolchain() is None,
                                reason="no C compiler on this machine: no native plan can be built")

TRANSFORMER = ROOT / "fixtures" / "transformer.onnx"  # tokens [1, S, 64] -> hidden


def _entries(cache) -> list[tuple[str, str]]:
    """(token, stage) of every entry in the cache's index."""
    with sqlite3.connect(cache / "index.sqlite3") as db:
        return db.execute("SELECT token, stage FROM entries").fetchall()


def _nncc_run(model, cache, tokens_file, out_file, env):
    proc = subprocess.run([sys.executable, "-m", "nncc", "run", str(model), "--cache-dir", str(cache),
                           "--input", f"tokens={tokens_file}", "--output", str(out_file), "--json"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _tokens(tmp_path, length: int, seed: int = 0):
    tokens = np.random.default_rng(seed).standard_normal((1, length, 64)).astype(np.float32)
    path = tmp_path / f"tokens{length}.npy"
    np.save(path, tokens)
    return tokens, path


THREAD_RUN = """
import sys, threading
import numpy as np
from nncc.model import prepare
model, outcome = prepare(sys.argv[1], cache_dir=sys.argv[2])
model.run({"tokens": np.load(sys.argv[3])})  # the shape's first run: no entry yet, its build starts
[t.join() for t in threading.enumerate() if t.name.startswith("nncc-shape-")]
print(model.last_run_native_partitions)
"""


@pytest.mark.slow
def test_a_fresh_nncc_run_finds_the_shape_plan_a_thread_built_and_runs_it_natively(tmp_path):
    cache = tmp_path / "cache"
    tokens, tokens_file = _tokens(tmp_path, 9)
    env = dict(os.environ, NNCC_UPGRADE_AFTER="2")
    first = subprocess.run([sys.executable, "-c", THREAD_RUN, str(TRANSFORMER), str(cache), str(tokens_file)],
                           capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["0"]  # its one run was portable: the plan was built after it
    assert sorted(stage for _, stage in _entries(cache)) == ["optimized", "quick"]  # S=9's entry, the model's

    report = _nncc_run(TRANSFORMER, cache, tokens_file, tmp_path / "out.npz", env)
    assert report["native_partitions"] == 0  # the general plan, dynamic in S, has no native code
    assert report["run_native_partitions"] >= 1  # the first (and only) run of S=9 was native
    want = ort_outputs(TRANSFORMER, {"tokens": tokens})["hidden"]
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["hidden"], want, rtol=1e-4, atol=1e-5)
    assert len(_entries(cache)) == 2  # nothing new was built: it was found


def _wait_for_entries(cache, count: int) -> None:
    """Until the cache index holds ``count`` optimized entries (the detached worker's),
    with a deadline far beyond any compile here, so that a worker that never commits
    fails the test instead of hanging it."""
    deadline = time.monotonic() + 600
    while sum(stage == "optimized" for _, stage in _entries(cache)) < count:
        assert time.monotonic() < deadline, f"no worker committed the shape's entry: {_entries(cache)}"
        time.sleep(0.2)


@pytest.mark.slow
def test_nncc_run_leaves_a_worker_that_builds_the_shape_plan_for_the_next_run(tmp_path):
    cache = tmp_path / "cache"
    tokens, tokens_file = _tokens(tmp_path, 11, seed=1)
    want = ort_outputs(TRANSFORMER, {"tokens": tokens})["hidden"]
    env = dict(os.environ, NNCC_UPGRADE_AFTER="2")
    first = _nncc_run(TRANSFORMER, cache, tokens_file, tmp_path / "first.npz", env)
    assert first["run_native_partitions"] == 0  # nothing cached for S=11 yet: portable, and a worker started
    np.testing.assert_allclose(np.load(tmp_path / "first.npz")["hidden"], want, rtol=1e-4, atol=1e-5)
    _wait_for_entries(cache, 1)  # the command has exited; its worker outlives it

    second = _nncc_run(TRANSFORMER, cache, tokens_file, tmp_path / "second.npz", env)
    assert second["run_native_partitions"] >= 1
    np.testing.assert_allclose(np.load(tmp_path / "second.npz")["hidden"], want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_an_entry_prepared_for_fixed_sizes_serves_the_first_run_even_with_upgrades_off(tmp_path):
    # what `nncc compile --dim S=13` stores; conftest turns background builds off, so only
    # the lookup can make the run native
    cache = tmp_path / "cache"
    fixed, _ = prepare(TRANSFORMER, cache_dir=cache, stage="optimized", dims={"S": 13})
    assert fixed.native_partitions >= 1
    model, _ = prepare(TRANSFORMER, cache_dir=cache)
    assert model.native_partitions == 0
    tokens = np.random.default_rng(2).standard_normal((1, 13, 64)).astype(np.float32)
    got = model.run({"tokens": tokens})["hidden"]
    assert model.last_run_native_partitions == fixed.native_partitions
    assert model.shape_plans == [((1, 13, 64),)]
    np.testing.assert_allclose(got, ort_outputs(TRANSFORMER, {"tokens": tokens})["hidden"], rtol=1e-4, atol=1e-5)

    other = np.ones((1, 4, 64), np.float32)  # a size with no entry: portable, and nothing is built
    model.run({"tokens": other})
    assert model.last_run_native_partitions == 0
    assert len(_entries(cache)) == 2


@pytest.mark.slow
def test_nncc_run_builds_the_plan_for_one_sample_and_the_next_runs_any_batch_size_with_it(tmp_path):
    from tests.test_dynamic_samples import _feeds, convnet

    model = tmp_path / "convnet.onnx"
    builder = convnet(model)
    cache = tmp_path / "cache"
    env = dict(os.environ, NNCC_UPGRADE_AFTER="2")
    results = []
    for n in (3, 6):
        feeds = _feeds(builder, {"x0": {0: n}}, seed=n)
        np.save(tmp_path / f"x{n}.npy", feeds["x0"])
        proc = subprocess.run([sys.executable, "-m", "nncc", "run", str(model), "--cache-dir", str(cache),
                               "--input", f"x0={tmp_path / f'x{n}.npy'}", "--output", str(tmp_path / f"out{n}.npz"),
                               "--json"], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        results.append(json.loads(proc.stdout)["run_native_partitions"])
        want = ort_outputs(model, feeds)
        got = np.load(tmp_path / f"out{n}.npz")
        for name, expected in want.items():
            np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-5)
        if n == 3:
            _wait_for_entries(cache, 2)  # the workers' entries: the plan for N = 1, and N = 3's own
    assert results[0] == 0 and results[1] >= 1  # N = 6 ran natively, through the plan for N = 1
    _wait_for_entries(cache, 3)  # and asked for its own, which a later process's prepare keeps
    assert sorted(stage for _, stage in _entries(cache)) == ["optimized"] * 3 + ["quick"]


def test_a_second_shape_worker_for_the_same_sizes_leaves_while_the_first_builds(tmp_path):
    from nncc.cache.locking import try_lock
    from nncc.preparing.shapes import worker_lock_path

    cache = tmp_path / "cache"
    prepare(TRANSFORMER, cache_dir=cache)  # the folder, as a run that spawns a worker has it
    options = json.dumps({"dims": {"S": 6}})
    held = try_lock(worker_lock_path(str(cache), str(TRANSFORMER), options))  # as a first worker holds it
    try:
        proc = subprocess.run([sys.executable, "-m", "nncc.preparing.shapes", "--cache-dir", str(cache),
                               "--model", str(TRANSFORMER), "--options", options], capture_output=True, text=True)
    finally:
        held.release()
    assert proc.returncode == 0, proc.stderr
    assert len(_entries(cache)) == 1  # it built nothing: the first worker's build is the one
