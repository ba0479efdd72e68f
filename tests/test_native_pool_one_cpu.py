"""The native code's thread pool when its threads outnumber the cores the process may use:
the caller runs the shares of a parallel loop that no worker has started yet (a woken worker
may wait long for a core), so every share still runs exactly once. A process confined to one
CPU, with a pool of two threads, runs a convnet on fifty different inputs; each output must
match onnxruntime's (a share skipped would leave the previous input's values behind, a share
run twice by two threads would race on its rows)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from nncc.native.toolchain import find_toolchain
from tests.models import convnet
from tests.oracle import ort_run

needs_cc = pytest.mark.skipif(find_toolchain() is None,
                              reason="no C compiler on this machine: no native plan can be built")

_CHILD = r"""
import os, sys
import numpy as np
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core for the caller and the worker
from nncc.util.threads import set_blas_threads
import nncc
import nncc.native.activate as activate
path, inputs, outputs = sys.argv[1:4]
pools = []
load_native = activate.load_native
def recording(*args, **kwargs):  # the size of each loaded library's pool
    library = load_native(*args, **kwargs)
    pools.append(None if library is None else library.threads)
    return library
activate.load_native = recording
set_blas_threads(2)  # the pool is sized like BLAS's when the library loads: two threads
model = nncc.compile_model(path, dims={"n": 8})
assert model.native_partitions == 1, model.plan.fallbacks
with np.load(inputs) as saved:
    xs = saved["x"]
np.save(outputs, np.stack([model.run({"x": x})["y"] for x in xs]))
print(pools)
"""


@pytest.mark.slow
@needs_cc
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="the process cannot confine itself to one CPU here")
def test_a_pool_larger_than_its_cores_runs_every_share_once(tmp_path):
    path = tmp_path / "convnet.onnx"
    path.write_bytes(convnet(seed=3).SerializeToString())
    xs = np.random.default_rng(7).standard_normal((50, 8, 3, 16, 16)).astype(np.float32)
    np.savez(tmp_path / "inputs.npz", x=xs)
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(tmp_path / "inputs.npz"),
                           str(tmp_path / "outputs.npy")], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "[2]", done.stdout  # one library, its pool two threads on one core
    got = np.load(tmp_path / "outputs.npy")
    for x, y in zip(xs, got):
        np.testing.assert_allclose(y, ort_run(path, {"x": x})[0], rtol=1e-4, atol=1e-5)
