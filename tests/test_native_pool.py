"""The native thread pool hands out chunks of each parallel step to whichever of its threads
claims them, the caller included. Every task computes its own outputs, so the results are
those of one thread bit for bit, however the chunks fell; the pool below has more threads
than this machine has cores, so workers wake late and the caller claims their share."""

from __future__ import annotations

import numpy as np
import pytest

import nncc
from nncc.native.toolchain import find_toolchain
from nncc.util.threads import blas_threads, limit_blas_threads
from tests.models import GraphBuilder
from tests.oracle import ort_run

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")


def _convnet() -> GraphBuilder:
    """Steps of every convolution kind, large enough to run on the pool (no BLAS call, whose
    own kernels may round a block's edge differently)."""
    m = GraphBuilder(17, 11, "pooled")
    x = m.input([2, 16, 24, 24])
    y = m.node("Relu", [m.node("Conv", [x, m.weight([32, 16, 3, 3]), m.weight([32])], pads=[1, 1, 1, 1])])
    y = m.node("Conv", [y, m.weight([32, 1, 3, 3])], pads=[1, 1, 1, 1], group=32)  # depthwise
    y = m.node("Conv", [y, m.weight([32, 16, 3, 3])], pads=[1, 1, 1, 1], group=2, strides=[2, 2])  # grouped
    s = m.node("Conv", [y, m.weight([32, 32, 1, 1]), m.weight([32])])
    y = m.node("Mul", [s, m.node("Sigmoid", [s])])  # SiLU
    y = m.node("Relu", [m.node("Add", [m.node("Conv", [y, m.weight([32, 32, 1, 1])]), y])])  # residual
    m.output(m.node("GlobalAveragePool", [y]))
    m.output(y)
    return m


@pytest.mark.slow
def test_results_do_not_depend_on_how_the_pool_shared_the_chunks(tmp_path):
    if blas_threads() is None:
        pytest.skip("numpy's BLAS here has no known thread-count entry point: the pool's size cannot be set")
    m = _convnet()
    path = tmp_path / "m.onnx"
    m.save(path)
    names = [o.name for o in m.outputs]
    with limit_blas_threads(1):
        alone = nncc.compile_model(path)
    with limit_blas_threads(4):
        pooled = nncc.compile_model(path)
    assert [c._executor.loaded["native"].threads for c in (alone, pooled)] == [1, 4]
    assert alone.native_partitions == pooled.native_partitions == 1
    want = alone.run(m.feeds)
    for name, oracle in zip(names, ort_run(path, m.feeds, names)):
        scale = max(1.0, float(np.abs(oracle).max()))
        np.testing.assert_allclose(want[name], oracle, rtol=1e-5, atol=1e-5 * scale, err_msg=name)
    for _ in range(20):
        got = pooled.run(m.feeds)
        for name in names:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
