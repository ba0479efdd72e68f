"""The per-thread scratch of native kernels (``nn_scratch`` in nncc/native/runtime.c): the
fused attention's packed K and V and score tiles, and a depthwise convolution's padded
planes (a Conv whose weights are fed at run time goes through the runtime's nn_conv2d).

A thread keeps its buffers for its life, so one model's layers of different sizes share
them and a later run finds what an earlier one left: results must match onnxruntime's on
every run, at one thread and at two. When the memory truly runs out (a child process whose
address space is capped after the model is prepared, so the first run's scratch cannot be
had), the run must fail with one line naming the bytes, exit code 2, never hand back
outputs its kernel skipped; and once memory is there again the next run is right.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest

import nncc
from nncc.native.toolchain import find_toolchain
from nncc.util.threads import blas_threads, limit_blas_threads
from tests import native_fuzz_cases as F
from tests.models import GraphBuilder
from tests.oracle import ort_run

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")

# attention geometries whose buffers differ in size, with pads the vector loops read past
# (keys not a multiple of the 64-key block, value heads not a multiple of the vector width)
# and a causal mask whose hidden key blocks are skipped
GEOMETRIES = [
    dict(batch=1, heads=4, d=64, dv=64, sq=96, skv=96, split="transpose", mask="causal", scale="mul", merge=True),
    dict(batch=2, heads=3, d=17, dv=5, sq=33, skv=130, split="given", mask="padding", scale="div", merge=False),
    dict(batch=1, heads=2, d=8, dv=33, sq=200, skv=7, split="rank3", mask="", scale="mul", merge=False),
]


def _attention_cases(seed: int) -> list:
    cases = []
    for i, given in enumerate(GEOMETRIES):
        case = F.Case(seed, i, "attention", {}, opt_level=2)
        F.attention(case, np.random.default_rng([seed, i]), guard=False, **given)
        cases.append(case)
    return cases


def _depthwise(sizes, seed: int) -> GraphBuilder:
    """Depthwise Convs whose weights are inputs (so nn_conv2d's padded planes are used), one
    per (channels, height, width), each pooled to one value per channel so its
    intermediate lives in the arena."""
    m = GraphBuilder(17, seed, "depthwise")
    for c, h, w in sizes:
        y = m.node("Conv", [m.input([1, c, h, w]), m.input([c, 1, 3, 3])], pads=[1, 1, 1, 1], group=c)
        m.output(m.node("GlobalAveragePool", [y]))
    return m


def _pool_threads(model) -> int:
    return model._executor.loaded["native"].threads


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_kernels_sharing_a_threads_scratch_match_onnxruntime_run_after_run(tmp_path, threads):
    if blas_threads() is None:
        pytest.skip("numpy's BLAS here has no known thread-count entry point: the pool's size cannot be set")
    first, second = _attention_cases(31), _attention_cases(32)  # same geometries, other values
    path = tmp_path / "attention.onnx"
    onnx.save(F.batch_model(first), str(path))
    dw_sizes = [(3, 20, 24), (4, 9, 40)]
    dw_path = tmp_path / "depthwise.onnx"
    _depthwise(dw_sizes, 1).save(dw_path)
    with limit_blas_threads(threads):
        model = nncc.compile_model(path)
        dw_model = nncc.compile_model(dw_path)
    assert _pool_threads(model) == _pool_threads(dw_model) == threads
    assert "nncc::FusedAttention::1" in model.plan.kernels and model.native_partitions == 1
    assert dw_model.native_partitions == 1
    native = F.native_outputs(model)
    for cases in (first, second, first):  # the second run reads buffers the first left behind
        got, want = model.run(F.feeds(cases)), F.run_onnxruntime(cases)
        reports = [r for case in cases if (r := F.judge(case, got, want, native))]
        assert not reports, "\n".join(reports)
    for seed in (1, 2, 1):
        feeds = _depthwise(dw_sizes, seed).feeds
        got = dw_model.run(feeds)
        for name, want in zip(got, ort_run(dw_path, feeds, list(got))):
            np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-5, err_msg=name)


# The child prepares the model, then caps its address space a few MiB above what it holds,
# so the first run's scratch (16 MiB per thread) cannot be had. glibc is held to its main
# arena (MALLOC_ARENA_MAX=1, set by the parent): another thread's arena reserves 64 MiB of
# address space up front and grows inside it, where the cap does not reach.
_CHILD = r"""
import json, resource, sys
import numpy as np
from nncc.util.threads import set_blas_threads
import nncc
from nncc.errors import NnccError
path, feeds_path, threads, out_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
assert set_blas_threads(threads)
model = nncc.compile_model(path)
with np.load(feeds_path) as saved:
    feeds = dict(saved)
with open("/proc/self/status") as status:
    held = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (held + (6 << 20), hard))
try:
    model.run(feeds)
    failure = None
except NnccError as exc:
    failure = dict(message=str(exc), exit_code=exc.exit_code, kind=type(exc).__name__)
resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
np.savez(out_path, **model.run(feeds))
print(json.dumps(dict(failure=failure, native=model.native_partitions,
                      threads=model._executor.loaded["native"].threads)))
"""


def _big_attention(tmp_path):
    """One query over 32768 keys, two heads: 16 MiB of packed K and V per task."""
    case = F.Case(5, 0, "attention", {}, opt_level=2)
    F.attention(case, np.random.default_rng([5, 0]), batch=1, heads=2, d=64, dv=64, sq=1, skv=32768, split="given",
                mask="", scale="mul", merge=False, guard=False)
    path = tmp_path / "attention.onnx"
    onnx.save(F.batch_model([case]), str(path))
    return path, F.feeds([case])


def _big_depthwise(tmp_path):
    """A 2048 x 2048 image: a 16 MiB padded plane."""
    m = _depthwise([(1, 2048, 2048)], 3)
    path = tmp_path / "depthwise.onnx"
    m.save(path)
    return path, m.feeds


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="the child reads its address space's size there")
@pytest.mark.parametrize("make, threads", [(_big_attention, 2), (_big_depthwise, 1)], ids=["attention", "depthwise"])
def test_a_run_whose_scratch_cannot_be_allocated_fails_in_one_line(tmp_path, make, threads):
    if blas_threads() is None:
        pytest.skip("numpy's BLAS here has no known thread-count entry point: the pool's size cannot be set")
    path, feeds = make(tmp_path)
    np.savez(tmp_path / "feeds.npz", **feeds)
    out = tmp_path / "outputs.npz"
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(tmp_path / "feeds.npz"), str(threads),
                           str(out)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, MALLOC_ARENA_MAX="1"))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["native"] == 1 and report["threads"] == threads
    failure = report["failure"]
    assert failure is not None, "the run returned outputs although its scratch could not be allocated"
    assert failure["kind"] == "LimitError" and failure["exit_code"] == 2
    assert re.fullmatch(r"\S+: native step \d+ could not allocate [\d,]+ bytes of scratch memory",
                        failure["message"]), failure["message"]
    asked = int(re.search(r"allocate ([\d,]+) bytes", failure["message"]).group(1).replace(",", ""))
    assert asked >= 16 << 20  # the packed K and V, or the padded plane
    with np.load(out) as got:  # the run after memory came back
        names = list(got)
        for name, want in zip(names, ort_run(path, feeds, names)):
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)
