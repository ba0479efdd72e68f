"""Depthwise convolution (Conv with group == channels, nncc.kernels.depthwise) against
onnxruntime.

Each case builds a one-node Conv model, runs it in onnxruntime (the oracle) and compares
with the registered Conv kernel called twice with a kept workspace and a preallocated
output (the executor's steady state): both runs must match the oracle and each other.
The shapes are those of light_shufflenet and the mobilenet fixture, plus the geometries
the fast path treats specially (odd widths with stride 2, dilations, asymmetric pads,
channel multipliers, 1-D and 3-D, float64, batches).
"""

from __future__ import annotations

import itertools
import tracemalloc

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.ir.graph import TensorInfo
from nncc.kernels.depthwise import depthwise_conv
from nncc.kernels.registry import Ctx, resolve
from tests.oracle import ort_session

RNG = np.random.default_rng(7)
_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}


def _model(x_shape, w, attrs, bias=None, dtype=np.float32):
    inits = [numpy_helper.from_array(w.astype(dtype), "w")]
    inputs = ["x", "w"]
    if bias is not None:
        inits.append(numpy_helper.from_array(bias.astype(dtype), "b"))
        inputs.append("b")
    node = helper.make_node("Conv", inputs, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", _ELEM[np.dtype(dtype)], x_shape)],
                              [helper.make_empty_tensor_value_info("y")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _oracle(model, x):
    sess = ort_session(model)
    return sess.run(None, {"x": x})[0]


CASES = [
    # (x shape, multiplier, kernel, attrs)
    ((1, 272, 14, 14), 1, (3, 3), dict(pads=[1, 1, 1, 1])),                  # light_shufflenet
    ((1, 136, 28, 28), 1, (3, 3), dict(pads=[1, 1, 1, 1])),
    ((1, 544, 7, 7), 1, (3, 3), dict(pads=[1, 1, 1, 1])),
    ((1, 112, 56, 56), 1, (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    ((1, 136, 28, 28), 1, (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    ((1, 272, 14, 14), 1, (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    ((1, 16, 32, 32), 1, (3, 3), dict(pads=[1, 1, 1, 1])),                    # mobilenet fixture
    ((1, 32, 32, 32), 1, (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    ((1, 96, 16, 16), 1, (3, 3), dict(pads=[1, 1, 1, 1])),
    ((1, 24, 15, 13), 1, (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),    # odd sizes, stride 2
    ((1, 8, 11, 9), 1, (3, 3), dict(pads=[0, 0, 0, 0], strides=[2, 2])),      # no padding
    ((2, 12, 10, 10), 1, (3, 3), dict(pads=[1, 1, 1, 1])),                    # batch
    ((1, 8, 17, 17), 1, (3, 3), dict(pads=[2, 2, 2, 2], dilations=[2, 2])),   # dilation 2
    ((1, 8, 17, 16), 1, (3, 3), dict(pads=[2, 1, 2, 3], dilations=[2, 2])),   # asymmetric pads
    ((1, 6, 12, 12), 1, (3, 3), dict(pads=[0, 2, 1, 0], strides=[2, 1])),     # asymmetric pads
    ((1, 6, 9, 9), 1, (3, 3), dict(pads=[3, 3, 3, 3])),                       # pads beyond the kernel
    ((1, 16, 15, 15), 2, (5, 5), dict(pads=[2, 2, 2, 2])),                    # multiplier 2
    ((2, 4, 9, 10), 3, (3, 2), dict(pads=[1, 0, 1, 1], strides=[1, 2])),      # multiplier 3, batch
    ((1, 8, 20, 20), 1, (7, 7), dict(pads=[3, 3, 3, 3], strides=[3, 3])),     # stride 3
    ((1, 10, 13, 13), 1, (1, 1), dict(pads=[0, 0, 0, 0])),                    # 1x1 (matmul path)
    ((1, 6, 25), 1, (3,), dict(pads=[1, 1])),                                 # 1-D
    ((2, 5, 30), 2, (5,), dict(pads=[1, 3], strides=[2], dilations=[2])),     # 1-D strided, dilated
    ((1, 4, 6, 7, 8), 1, (3, 3, 3), dict(pads=[1] * 6)),                      # 3-D
    ((1, 3, 7, 6, 9), 2, (2, 3, 3), dict(pads=[0, 1, 2, 1, 0, 1], strides=[2, 1, 2], dilations=[1, 2, 1])),
]


def _ids(case):
    x_shape, mult, kernel, attrs = case
    return f"x{'x'.join(map(str, x_shape))}-m{mult}-k{''.join(map(str, kernel))}-" + "-".join(
        f"{k[0]}{''.join(map(str, v))}" for k, v in sorted(attrs.items()))


def _run_kernel(x, w, attrs, bias=None, runs=2):
    """The registered Conv kernel as the executor calls it: one ctx, kept workspace,
    a preallocated output."""
    k = resolve("Conv", "", 13)
    ctx = Ctx(dict(attrs, group=x.shape[1], kernel_shape=list(w.shape[2:])), 13, 1)
    out_shape = k.shape(ctx, *[TensorInfo(a.dtype, a.shape) for a in (x, w)])[0].shape
    target = np.full(out_shape, np.nan, x.dtype)
    results = []
    for _ in range(runs):
        args = (x, w) if bias is None else (x, w, bias)
        y = k.fn(ctx, *args, out=(target,))
        results.append(np.array(y, copy=True))
    return results, ctx


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_depthwise_matches_onnxruntime(case):
    x_shape, mult, kernel, attrs = case
    c = x_shape[1]
    x = RNG.standard_normal(x_shape).astype(np.float32)
    w = RNG.standard_normal((c * mult, 1) + kernel).astype(np.float32)
    b = RNG.standard_normal(c * mult).astype(np.float32)
    expected = _oracle(_model(x_shape, w, dict(attrs, group=c), b), x)
    (first, second), _ = _run_kernel(x, w, dict(attrs), b)
    assert first.shape == expected.shape
    np.testing.assert_allclose(first, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(second, first)  # the kept buffers give the same result


@pytest.mark.parametrize("case", [CASES[0], CASES[4], CASES[13], CASES[17], CASES[21], CASES[23]], ids=_ids)
def test_depthwise_float64(case):
    # onnxruntime has no float64 Conv: the oracle is the float32 model on the same values
    # (loose tolerance) and the independent numpy reference below (tight tolerance)
    x_shape, mult, kernel, attrs = case
    c = x_shape[1]
    x = RNG.standard_normal(x_shape).astype(np.float32).astype(np.float64)
    w = RNG.standard_normal((c * mult, 1) + kernel).astype(np.float32).astype(np.float64)
    expected32 = _oracle(_model(x_shape, w, dict(attrs, group=c)), x.astype(np.float32))
    nd = len(kernel)
    pads = attrs.get("pads", [0] * 2 * nd)
    expected, _ = _reference(x, w, attrs.get("strides", [1] * nd), attrs.get("dilations", [1] * nd),
                             pads[:nd], pads[nd:])
    (first, second), _ = _run_kernel(x, w, dict(attrs))
    assert first.dtype == np.float64
    np.testing.assert_allclose(first, expected32, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(first, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(second, first)


def _reference(x, w, strides, dilations, pb, pe):
    """Independent oracle for geometries onnxruntime rejects (negative pads): crop, zero-pad,
    then sum each kernel tap's strided window times its per-channel weight."""
    nd = x.ndim - 2
    x = x[(slice(None), slice(None)) + tuple(slice(max(0, -b), x.shape[2 + i] - max(0, -e))
                                             for i, (b, e) in enumerate(zip(pb, pe)))]
    x = np.pad(x, [(0, 0), (0, 0)] + [(max(0, b), max(0, e)) for b, e in zip(pb, pe)])
    x = np.repeat(x, w.shape[0] // x.shape[1], axis=1)
    kernel = w.shape[2:]
    outs = [(x.shape[2 + i] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(nd)]
    y = np.zeros(x.shape[:2] + tuple(outs))
    for offs in itertools.product(*(range(k) for k in kernel)):
        window = x[(slice(None), slice(None)) + tuple(
            slice(o * d, o * d + (n - 1) * s + 1, s) for o, d, n, s in zip(offs, dilations, outs, strides))]
        y += window * w[(slice(None), 0) + offs].reshape((-1,) + (1,) * nd)
    return y, outs


def test_negative_pads_and_non_contiguous_input():
    x = RNG.standard_normal((2, 3, 12, 22))[..., ::2]  # a strided view: last axis not contiguous
    w = RNG.standard_normal((6, 1, 3, 3))
    for pb, pe in [([-1, 1], [2, -2]), ([1, -1], [-1, 1])]:
        expected, outs = _reference(x, w, [1, 2], [1, 1], pb, pe)
        scratch = {}
        for _ in range(2):
            got = depthwise_conv(x, w, [3, 3], [1, 2], [1, 1], pb, pe, outs, scratch, np.empty(expected.shape))
            np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_steady_state_reuses_buffers(tmp_path):
    # Through the whole compiler and executor: two runs into caller memory give the same
    # result, allocate no new kernel buffers and no large temporaries.
    x = RNG.standard_normal((1, 272, 14, 14)).astype(np.float32)
    w = RNG.standard_normal((272, 1, 3, 3)).astype(np.float32)
    model_proto = _model(x.shape, w, dict(group=272, pads=[1, 1, 1, 1], strides=[2, 2]))
    path = tmp_path / "dw.onnx"
    onnx.save(model_proto, str(path))
    expected = _oracle(model_proto, x)
    model = nncc.compile_model(path)
    targets = {"y": np.empty(expected.shape, np.float32)}
    first = model.run({"x": x}, outputs=targets)["y"].copy()
    workspace = next(step[1].workspace for step in model._executor.steps)
    kept = {key: id(value) for key, value in workspace.items()}
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        result = model.run({"x": x}, outputs=targets)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result["y"] is targets["y"]
    np.testing.assert_allclose(first, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(result["y"], first)
    assert {key: id(value) for key, value in workspace.items()} == kept
    assert peak - before < 64 << 10, peak - before  # the output alone would be 53 KiB


@pytest.mark.parametrize("stride", [1, 2])
def test_non_finite_values_reach_only_their_windows(stride):
    # Padding reads must contribute exact zeros (not 0 * a neighbour's value): a NaN or inf
    # at a border of one channel may not leak into another row or channel.
    x = RNG.standard_normal((1, 4, 10, 12))
    x[0, 1, 3, 11] = np.nan
    x[0, 2, 0, 0] = np.inf
    x[0, 3, 9, 11] = -np.inf
    w = RNG.standard_normal((4, 1, 3, 3))
    expected, outs = _reference(x, w, [stride, stride], [1, 1], [1, 1], [1, 1])
    got = depthwise_conv(x, w, [3, 3], [stride, stride], [1, 1], [1, 1], [1, 1], outs, {})
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-12, atol=1e-12)
