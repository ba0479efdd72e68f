"""A small model on the native pool, run as a serving loop runs it: back to back (the
workers still spin from the run before), and with pauses longer than the workers spin
after a call (they sleep, and the first step of a run finds them asleep: a small one runs
on the caller and wakes them, a larger one is shared with them). However the steps fell,
the results are one thread's bit for bit, and they match onnxruntime; a shape change still
gets its own plan. A call as small as this model's runs every job on the caller once its
entry point has seen its size: its workers never get one of its jobs."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import onnx
import pytest

import nncc
from nncc.native.toolchain import find_toolchain
from nncc.util.threads import blas_threads, limit_blas_threads
from tests.conftest import ROOT
from tests.models import mlp
from tests.oracle import ort_run

pytestmark = [pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing"),
              pytest.mark.skipif(blas_threads() is None, reason="numpy's BLAS here has no known thread-count entry "
                                                                "point: the pool's size cannot be set")]

# products of 32 x 64 x 256 and 32 x 256 x 128 multiply-adds: one under the work that pays
# for waking a sleeping worker, one over it; the call's work (1.6M) under what the pool
# shares at all once a call's size is known. LARGE_ROWS make a call the pool shares.
ROWS, FEATURES, HIDDEN, OUT = 32, 64, 256, 128
LARGE_ROWS = 1024


def _model(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(("batch", FEATURES), HIDDEN, OUT, seed=3, scale=0.1, softmax=True), path)
    return path


def _feeds(rows: int, seed: int) -> dict:
    return {"x": np.random.default_rng(seed).standard_normal((rows, FEATURES)).astype(np.float32)}


def _runs(model, feeds, pause_s: float, count: int) -> list[np.ndarray]:
    got = []
    for _ in range(count):
        got.append(model.run(feeds)["probs"])
        if pause_s:
            time.sleep(pause_s)  # longer than a worker spins after a call: it sleeps
    return got


@pytest.mark.parametrize("rows", [ROWS, LARGE_ROWS], ids=["small-call", "shared-call"])
def test_one_two_and_four_threads_give_one_threads_bits_back_to_back_and_after_pauses(tmp_path, rows):
    path = _model(tmp_path)
    feeds = _feeds(rows, 0)
    compiled = {}
    for threads in (1, 2, 4):
        with limit_blas_threads(threads):
            compiled[threads] = nncc.compile_model(path, dims={"batch": rows})
        assert compiled[threads]._executor.loaded["native"].threads == threads
        assert compiled[threads].native_partitions == 1
    want = compiled[1].run(feeds)["probs"]
    (oracle,) = ort_run(path, feeds, ["probs"])
    np.testing.assert_allclose(want, oracle, rtol=1e-5, atol=1e-5)
    for threads in (2, 4):
        for pause_s in (0.0, 0.002):
            for got in _runs(compiled[threads], feeds, pause_s, 30):
                np.testing.assert_array_equal(got, want, err_msg=f"{threads} threads, pause {pause_s}")


def test_a_small_call_keeps_its_jobs_on_the_caller_and_a_large_one_shares_them(tmp_path):
    """Each entry point records its call's work: from the second run on, a call under the
    pool's bound hands its workers no job (its constants stay in the caller's cache), back
    to back and after pauses; a call over it does, and both give onnxruntime's answer."""
    path = _model(tmp_path)
    with limit_blas_threads(2):
        small = nncc.compile_model(path, dims={"batch": ROWS})
        large = nncc.compile_model(path, dims={"batch": LARGE_ROWS})
    shared = {}
    for model, rows in ((small, ROWS), (large, LARGE_ROWS)):
        library = model._executor.loaded["native"]
        assert library.threads == 2 and model.native_partitions == 1
        feeds = _feeds(rows, 4)
        model.run(feeds)  # the entry point's first call: its size is not known yet
        before = library.jobs_shared()
        for pause_s in (0.0, 0.002):
            for got in _runs(model, feeds, pause_s, 10):
                np.testing.assert_allclose(got, ort_run(path, feeds, ["probs"])[0], rtol=1e-5, atol=1e-5)
        shared[rows] = library.jobs_shared() - before
    assert shared[ROWS] == 0, f"a call of {ROWS} rows handed {shared[ROWS]} jobs to the workers"
    assert shared[LARGE_ROWS] >= 20, f"a call of {LARGE_ROWS} rows shared only {shared[LARGE_ROWS]} jobs in 20 runs"


def test_outputs_of_runs_on_the_pool_are_not_shared(tmp_path):
    path = _model(tmp_path)
    with limit_blas_threads(2):
        model = nncc.compile_model(path, dims={"batch": ROWS})
    first, second = _feeds(ROWS, 1), _feeds(ROWS, 2)
    a = model.run(first)["probs"]
    b = model.run(second)["probs"]
    assert not np.shares_memory(a, b)
    for feeds, got in ((first, a), (second, b)):
        np.testing.assert_allclose(got, ort_run(path, feeds, ["probs"])[0], rtol=1e-5, atol=1e-5)


def test_a_shape_change_on_two_threads_gets_its_own_plan_and_onnxruntimes_answer(tmp_path):
    path = _model(tmp_path)
    cache = tmp_path / "cache"
    with limit_blas_threads(2):
        nncc.prepare(path, cache_dir=cache, stage="optimized")
        model, _ = nncc.prepare(path, cache_dir=cache)
        shapes = [ROWS, 5, ROWS, 5, 5]
        for i, rows in enumerate(shapes):
            feeds = _feeds(rows, 10 + i)
            got = model.run(feeds)["probs"]
            np.testing.assert_allclose(got, ort_run(path, feeds, ["probs"])[0], rtol=1e-5, atol=1e-5,
                                       err_msg=f"run {i}, {rows} rows")
            for thread in [t for t in threading.enumerate() if t.name.startswith("nncc-shape-")]:
                thread.join()
    assert ((5, FEATURES),) in model.shape_plans


def test_an_idle_process_takes_no_core_once_the_workers_stop_spinning(tmp_path):
    """After a run a worker spins a bounded while, then sleeps: over 0.3 s of the caller
    asleep the process's other threads take next to no CPU time (a worker that kept
    spinning would take most of a core). In a fresh process: no other test's threads."""
    path = _model(tmp_path)
    code = f"""
import resource, time
import numpy as np
import nncc
from nncc.util.threads import limit_blas_threads
with limit_blas_threads(2):
    model = nncc.compile_model({str(path)!r}, dims={{"batch": {ROWS}}})
assert model._executor.loaded["native"].threads == 2
feeds = {{"x": np.ones(({ROWS}, {FEATURES}), np.float32)}}
for _ in range(50):
    model.run(feeds)
time.sleep(0.01)  # the spin after the last call is over
cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
before, own = cpu(), time.thread_time()
time.sleep(0.3)
print((cpu() - before) - (time.thread_time() - own))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    others = float(done.stdout.split()[-1])
    assert others < 0.03, f"the pool's workers took {others:.3f} s of CPU while the process was idle"
