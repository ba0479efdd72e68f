"""The pooling kernels' fast paths against onnxruntime.

nncc/kernels/pool.py reduces 1-D/2-D pools with flat shifted passes plus recomputed
boundary rows/columns, in channel chunks for large tensors, turns whole-input windows into
one reduction per channel, and keeps temporaries between runs. These tests pin that down
where the ONNX node suite does not reach: the pool geometries of the benchmark models at
their real sizes (big enough to be chunked), ceil_mode with pads, count_include_pad both
ways, float64/float16, 1-D and 3-D pools, non-contiguous inputs, the Indices output, and
repeated runs through compiled models (kept buffers must not leak state between runs).

onnxruntime is the oracle: MaxPool must match bit for bit, averages to float rounding.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper
import pytest

import nncc
from nncc.kernels.registry import Ctx, resolve
from tests.oracle import ort_session

RNG = np.random.default_rng(20240611)
_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
         np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.uint8): TensorProto.UINT8,
         np.dtype(np.int8): TensorProto.INT8}


def _model(op, x, attrs, opset, n_out):
    node = helper.make_node(op, ["x"], [f"y{i}" for i in range(n_out)], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", _ELEM[x.dtype], x.shape)],
                              [helper.make_empty_tensor_value_info(f"y{i}") for i in range(n_out)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _ort(op, x, attrs, opset=12, n_out=1):
    session = ort_session(_model(op, x, attrs, opset, n_out))
    return session.run(None, {"x": x})


def _assert_matches(op, got, expected, rtol=2e-6, atol=2e-6):
    assert got.shape == expected.shape and got.dtype == expected.dtype, (got.shape, got.dtype, expected.shape)
    if op in ("MaxPool", "GlobalMaxPool") or expected.dtype.kind != "f":
        np.testing.assert_array_equal(got, expected)  # max pools are exact
    else:
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


def _check(op, x, attrs, opset=12, n_out=1, runs=2, **tol):
    """The kernel (with preallocated outputs and a kept workspace, run twice) vs onnxruntime."""
    expected = _ort(op, x, attrs, opset, n_out)
    k = resolve(op, "", opset)
    ctx = Ctx(dict(attrs), opset, n_out)
    out = tuple(np.full(e.shape, 7, e.dtype) for e in expected)
    for _ in range(runs):
        got = k.fn(ctx, x, out=out)
        got = got if isinstance(got, tuple) else (got,)
        for i, (g, e) in enumerate(zip(got, expected)):
            assert g is out[i], "the kernel must write its preallocated output"
            _assert_matches(op, g, e, **tol)
    fresh = k.fn(Ctx(dict(attrs), opset, n_out), x)  # and without out=
    for g, e in zip(fresh if isinstance(fresh, tuple) else (fresh,), expected):
        _assert_matches(op, np.asarray(g), e, **tol)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# The pool nodes of the light benchmark models (input shape, attributes; all opset 9,
# ceil_mode 0, count_include_pad 0). Channel counts are cut where the spatial geometry
# alone matters; the first entries keep their full size (large enough to be chunked).
MODEL_POOLS = [
    ("MaxPool", (1, 64, 112, 112), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),  # resnet50, densenet
    ("MaxPool", (1, 64, 112, 112), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])),  # inception_v2
    ("MaxPool", (1, 192, 56, 56), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])),
    ("MaxPool", (1, 64, 111, 111), dict(kernel_shape=[3, 3], strides=[2, 2])),  # squeezenet
    ("MaxPool", (1, 24, 112, 112), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),  # shufflenet
    ("MaxPool", (1, 32, 55, 55), dict(kernel_shape=[3, 3], strides=[2, 2])),
    ("MaxPool", (1, 32, 27, 27), dict(kernel_shape=[3, 3], strides=[2, 2])),
    ("MaxPool", (1, 32, 27, 27), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),  # inception_v1
    ("MaxPool", (1, 32, 13, 13), dict(kernel_shape=[3, 3], strides=[2, 2])),
    ("MaxPool", (1, 32, 28, 28), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])),
    ("MaxPool", (1, 32, 14, 14), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])),
    ("MaxPool", (1, 1024, 7, 7), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    ("MaxPool", (1, 16, 6, 6), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    ("MaxPool", (1, 16, 224, 224), dict(kernel_shape=[2, 2], strides=[2, 2])),  # vgg19
    ("MaxPool", (1, 32, 12, 12), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])),  # alexnet
    ("AveragePool", (1, 192, 28, 28), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),  # inception_v2
    ("AveragePool", (1, 576, 14, 14), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    ("AveragePool", (1, 1024, 7, 7), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    ("AveragePool", (1, 1024, 7, 7), dict(kernel_shape=[7, 7], strides=[1, 1])),  # inception_v2, resnet50
    ("AveragePool", (1, 128, 56, 56), dict(kernel_shape=[2, 2], strides=[2, 2])),  # densenet
    ("AveragePool", (1, 24, 56, 56), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),  # shufflenet
    ("AveragePool", (1, 32, 14, 14), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", (1, 1024, 6, 6), dict(kernel_shape=[7, 7], strides=[1, 1], pads=[0, 0, 1, 1])),  # inception_v1
    ("GlobalAveragePool", (1, 1000, 13, 13), {}),  # squeezenet
    ("GlobalAveragePool", (1, 1024, 7, 7), {}),  # densenet
]


@pytest.mark.parametrize("op, shape, attrs", MODEL_POOLS, ids=[f"{o}-{s[1]}x{s[2]}-{a}" for o, s, a in MODEL_POOLS])
def test_model_pool_geometries(op, shape, attrs):
    _check(op, rand(*shape), attrs, opset=9)


@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool_count_include_pad_both_ways(include_pad):
    x = rand(2, 5, 13, 11)
    for attrs in (dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
                  dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                  dict(kernel_shape=[4, 3], strides=[2, 1], pads=[2, 0, 1, 2]),
                  dict(kernel_shape=[7, 7], pads=[0, 0, 1, 1]),  # window larger than the map
                  dict(kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2])):
        _check("AveragePool", x, dict(attrs, count_include_pad=include_pad), opset=12)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_ceil_mode_with_pads(op):
    x = rand(1, 6, 14, 13)
    for attrs in (dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
                  dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1], ceil_mode=1),
                  dict(kernel_shape=[2, 3], strides=[3, 2], pads=[1, 0, 0, 2], ceil_mode=1),
                  dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)):
        if op == "AveragePool":
            for include_pad in (0, 1):
                _check(op, x, dict(attrs, count_include_pad=include_pad), opset=19)
        else:
            _check(op, x, attrs, opset=12)


FLOAT64_CASES = [dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                 dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                 dict(kernel_shape=[3, 2], strides=[1, 2], dilations=[2, 3], pads=[1, 1, 0, 1])]


@pytest.mark.parametrize("attrs", FLOAT64_CASES)
def test_float64(attrs):
    x = rand(2, 3, 17, 16, dtype=np.float64)
    _check("MaxPool", x, attrs, opset=12)
    # onnxruntime has no float64 AveragePool: onnx's reference implementation is the oracle
    from onnx.reference import ReferenceEvaluator

    for include_pad in (0, 1):
        a = dict(attrs, count_include_pad=include_pad)
        (expected,) = ReferenceEvaluator(_model("AveragePool", x, a, 19, 1)).run(None, {"x": x})
        got = resolve("AveragePool", "", 19).fn(Ctx(a, 19, 1), x)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_one_and_three_dimensional(op):
    _check(op, rand(2, 3, 40), dict(kernel_shape=[3], strides=[2], pads=[1, 1]), opset=12)
    _check(op, rand(1, 9, 70001), dict(kernel_shape=[5], strides=[1], pads=[2, 2]), opset=12)  # 9 chunks
    _check(op, rand(1, 2, 30), dict(kernel_shape=[4], strides=[3], pads=[1, 2], ceil_mode=1), opset=12)
    _check(op, rand(1, 3, 7, 8, 9), dict(kernel_shape=[3, 2, 3], strides=[2, 1, 2], pads=[1, 0, 1, 1, 1, 0]),
           opset=12)


def test_chunks_with_a_remainder_and_batches():
    # strided: 2*8 channels of 130x130 go 7 at a time (7, 7, 2)
    x = rand(2, 8, 130, 130)
    _check("MaxPool", x, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), opset=12)
    _check("AveragePool", rand(3, 11, 131, 127), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 1]),
           opset=12)
    # stride 1, "same" output: 40 channels of 120x120 go 9 at a time (4 x 9, 4)
    x = rand(1, 40, 120, 120)
    _check("AveragePool", x, dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), opset=12)
    _check("MaxPool", x, dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), opset=12)


def test_dtypes():
    ints = RNG.integers(0, 255, (2, 3, 15, 15)).astype(np.uint8)
    _check("MaxPool", ints, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), opset=12)
    _check("MaxPool", (ints.astype(np.int16) - 128).astype(np.int8), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
           opset=12)
    half = rand(1, 4, 12, 12).astype(np.float16)
    _check("MaxPool", half, dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), opset=12)
    _check("AveragePool", half, dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), opset=12, rtol=1e-3, atol=1e-3)
    _check("GlobalAveragePool", half, {}, opset=12, rtol=1e-3, atol=1e-3)


def test_max_pool_indices():
    x = rand(2, 3, 11, 10)
    for attrs in (dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                  dict(kernel_shape=[3, 2], strides=[2, 1], pads=[0, 1, 1, 0], storage_order=1),
                  dict(kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)):
        _check("MaxPool", x, attrs, opset=12, n_out=2)


def test_non_contiguous_input_and_global_pools():
    base = rand(1, 8, 20, 18)
    x = base[:, ::2, :, ::-1]  # a strided, reversed view
    _check("MaxPool", x, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), opset=12)
    _check("AveragePool", x, dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), opset=12)
    for op in ("GlobalAveragePool", "GlobalMaxPool"):
        _check(op, x, {}, opset=12)
        _check(op, rand(2, 5, 3, 4, 5), {}, opset=12)
    # a preallocated output that is a strided view still receives the result
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    (expected,) = _ort("MaxPool", base, attrs)
    target = np.zeros(expected.shape[:3] + (2 * expected.shape[3],), np.float32)[..., ::2]
    got = resolve("MaxPool", "", 12).fn(Ctx(attrs, 12, 1), base, out=(target,))
    assert got is target
    np.testing.assert_array_equal(target, expected)


def test_compiled_model_runs_twice_identically(tmp_path):
    """Two pool nodes of the same geometry share kept buffers; consecutive runs with
    different inputs must each match onnxruntime, and a repeated input repeat its result."""
    shape = [1, 24, 30, 30]
    nodes = [helper.make_node("MaxPool", ["x"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["a"], ["b"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["b"], ["c"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1]),
             helper.make_node("AveragePool", ["c"], ["d"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                              count_include_pad=1),
             helper.make_node("GlobalAveragePool", ["d"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("c", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)], ir_version=8)
    path = tmp_path / "pools.onnx"
    onnx.save(model, str(path))
    compiled = nncc.compile_model(path)
    session = ort_session(path)
    x1, x2 = rand(*shape), rand(*shape)
    first = compiled.run({"x": x1})
    first = {k: v.copy() for k, v in first.items()}
    second = compiled.run({"x": x2})
    again = compiled.run({"x": x1})
    for feeds, got in ((x1, first), (x2, second), (x1, again)):
        y, c = session.run(["y", "c"], {"x": feeds})
        np.testing.assert_allclose(got["c"], c, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["y"], y, rtol=1e-5, atol=1e-6)
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])
