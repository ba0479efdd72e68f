"""Neural-network op kernels (conv, pool, normalization, resize, linalg) against onnxruntime.

onnxruntime is the oracle: each case builds a one-node ONNX model, runs it in onnxruntime
and compares with calling the nncc kernel directly. The kernel's shape function is checked
against the shape onnxruntime produced, both with the inputs' contents known (as for
constants) and unknown.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
import pytest

from nncc.errors import KernelError, ShapeInferenceError, UnsupportedOpError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import Ctx, resolve
from tests.one_node_graphs import one_node
from tests.oracle import ort_run

RNG = np.random.default_rng(1234)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def run_ort(op, inputs, attrs, opset, n_out):
    """inputs: list of arrays or None (omitted optional input)."""
    model, feeds, _ = one_node(op, inputs, n_out, attrs, opset)
    return ort_run(model, feeds)


def run_nncc(op, inputs, attrs, opset, n_out):
    k = resolve(op, "", opset)
    ctx = Ctx(dict(attrs), opset, n_out)
    got = k.fn(ctx, *inputs)
    got = got if isinstance(got, tuple) else (got,)
    known = k.shape(ctx, *[None if a is None else TensorInfo.of(a) for a in inputs])
    unknown = k.shape(ctx, *[None if a is None else TensorInfo(a.dtype, tuple(a.shape)) for a in inputs])
    return got, known, unknown


def check(op, inputs, attrs=None, opset=22, n_out=1, rtol=1e-4, atol=1e-5):
    attrs = attrs or {}
    expected = run_ort(op, inputs, attrs, opset, n_out)
    got, known, unknown = run_nncc(op, inputs, attrs, opset, n_out)
    assert len(got) == n_out
    for i, (e, g) in enumerate(zip(expected, got)):
        g = np.asarray(g)
        assert g.shape == e.shape, f"output {i}: shape {g.shape} != onnxruntime {e.shape}"
        assert g.dtype == e.dtype, f"output {i}: dtype {g.dtype} != onnxruntime {e.dtype}"
        if e.dtype.kind == "f":
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, e)
        assert known[i].dtype == e.dtype
        assert known[i].shape == e.shape, f"shape fn (known inputs) {known[i].shape} != {e.shape}"
        u = unknown[i].shape
        assert unknown[i].dtype == e.dtype
        assert u is None or (len(u) == e.ndim and all(d is None or d == s for d, s in zip(u, e.shape)))
    return got


# --------------------------------------------------------------------------- Conv

CONV_CASES = [
    # (x shape, w shape, attrs, with bias)
    ((1, 64, 56, 56), (64, 64, 3, 3), dict(pads=[1, 1, 1, 1]), True),          # ResNet block
    ((1, 3, 64, 64), (16, 3, 7, 7), dict(pads=[3, 3, 3, 3], strides=[2, 2]), True),  # stem
    ((2, 16, 20, 20), (32, 16, 3, 3), dict(strides=[2, 2], pads=[0, 1, 1, 2]), True),  # asymmetric pads
    ((1, 16, 21, 19), (8, 16, 3, 3), dict(dilations=[2, 3], pads=[2, 3, 2, 3]), False),
    ((1, 16, 14, 14), (24, 4, 3, 3), dict(group=4, pads=[1, 1, 1, 1]), True),  # grouped
    ((2, 32, 28, 28), (32, 1, 3, 3), dict(group=32, pads=[1, 1, 1, 1]), True),  # depthwise
    ((1, 24, 29, 29), (24, 1, 3, 3), dict(group=24, pads=[1, 1, 1, 1], strides=[2, 2]), True),
    ((1, 16, 15, 15), (32, 1, 5, 5), dict(group=16, pads=[2, 2, 2, 2]), True),  # multiplier 2
    ((1, 8, 17, 17), (8, 1, 3, 3), dict(group=8, dilations=[2, 2], pads=[2, 1, 2, 3]), False),
    ((1, 32, 28, 28), (48, 32, 1, 1), {}, True),                                 # 1x1
    ((2, 32, 28, 28), (16, 32, 1, 1), dict(strides=[2, 2]), True),              # strided 1x1
    ((1, 32, 9, 9), (16, 8, 1, 1), dict(group=4), False),                        # grouped 1x1
    ((1, 8, 15, 16), (8, 8, 3, 3), dict(strides=[2, 2], auto_pad="SAME_UPPER"), True),
    ((1, 8, 15, 16), (8, 8, 4, 4), dict(strides=[2, 3], auto_pad="SAME_LOWER"), True),
    ((1, 8, 15, 16), (8, 8, 3, 2), dict(strides=[2, 2], auto_pad="VALID"), True),
    ((1, 8, 11, 13), (4, 8, 5, 3), dict(strides=[3, 2], pads=[2, 1, 0, 1]), True),
    ((1, 4, 5, 5), (6, 4, 5, 5), {}, True),                                      # 1x1 output
    ((1, 4, 6, 7), (6, 4, 3, 3), dict(pads=[3, 3, 3, 3], strides=[2, 2]), True),  # big pads
    ((2, 8, 30), (12, 8, 5), dict(strides=[3], dilations=[2], pads=[1, 4]), True),  # 1-D
    ((1, 4, 8, 9, 10), (6, 4, 3, 3, 3), dict(strides=[1, 2, 2], pads=[1, 1, 1, 1, 0, 1]), True),  # 3-D
    ((1, 4, 7, 8, 6), (8, 2, 2, 3, 3), dict(group=2, dilations=[2, 1, 2]), True),
]


@pytest.mark.parametrize("xs, ws, attrs, bias", CONV_CASES)
def test_conv_matches_onnxruntime(xs, ws, attrs, bias):
    x, w = rand(*xs), rand(*ws)
    inputs = [x, w] + ([rand(ws[0])] if bias else [])
    check("Conv", inputs, attrs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["gather", "copies"])
@pytest.mark.parametrize("xs, ws, attrs, bias", CONV_CASES)
def test_conv_im2col_layouts_each_match_onnxruntime(xs, ws, attrs, bias, layout, monkeypatch):
    """Small images take one gather with precomputed indices, larger ones a copy per tap
    (phase or exact layout): force each on every geometry."""
    from nncc.kernels import conv as conv_module

    limit = 10**12 if layout == "gather" else 0
    monkeypatch.setattr(conv_module, "_GATHER_MAX", limit)
    monkeypatch.setattr(conv_module, "_GATHER_PER_TAP", limit)
    x, w = rand(*xs), rand(*ws)
    inputs = [x, w] + ([rand(ws[0])] if bias else [])
    check("Conv", inputs, attrs, rtol=1e-4, atol=1e-4)


def _kept_workspace_runs(x, w, b, attrs):
    """The executor's steady state: the kernel called twice with one workspace and a
    preallocated output."""
    k = resolve("Conv", "", 22)
    ctx = Ctx(dict(attrs), 22, 1)
    inputs = [x, w] + ([b] if b is not None else [])
    (info,) = k.shape(ctx, *[TensorInfo.of(a) for a in inputs])
    out = np.empty(info.shape, info.dtype)
    first = k.fn(ctx, *inputs, out=(out,)).copy()
    second = k.fn(ctx, *inputs, out=(out,))
    return ctx, first, second


@pytest.mark.parametrize("xs, ws, attrs, bias", CONV_CASES)
def test_conv_in_bands_of_output_rows_matches_onnxruntime(xs, ws, attrs, bias, monkeypatch):
    """Columns above a size are made and multiplied a band of output rows at a time: force
    one-row bands on every geometry (with the copy layouts), twice with a kept workspace."""
    from nncc.kernels import conv as conv_module

    for name, value in (("_GATHER_MAX", 0), ("_GATHER_PER_TAP", 0), ("_BAND_BYTES", 1),
                        ("_BAND_WEIGHT_RATIO", 0)):
        monkeypatch.setattr(conv_module, name, value)
    conv_module._band_rows.cache_clear()  # it caches decisions made under other settings
    try:
        x, w = rand(*xs), rand(*ws)
        b = rand(ws[0]) if bias else None
        (expected,) = run_ort("Conv", [x, w] + ([b] if bias else []), attrs, 22, 1)
        _, first, second = _kept_workspace_runs(x, w, b, attrs)
        np.testing.assert_allclose(first, expected, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(second, first)
    finally:
        conv_module._band_rows.cache_clear()


def test_conv_bands_bound_the_column_buffer():
    """A large image's columns (here 15 MB) are made 8 MiB at a time, not all at once."""
    from nncc.kernels import conv as conv_module

    x, w, b = rand(1, 16, 160, 160), rand(16, 16, 3, 3), rand(16)
    attrs = dict(pads=[1, 1, 1, 1])
    (expected,) = run_ort("Conv", [x, w, b], attrs, 22, 1)
    ctx, first, second = _kept_workspace_runs(x, w, b, attrs)
    np.testing.assert_allclose(first, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(second, first)
    whole = 16 * 9 * 160 * 162 * 4
    assert whole > conv_module._BAND_BYTES
    cols = [v for k, v in ctx.workspace.items() if k == ("shared block", "cols")]
    assert cols and 0 < cols[0].nbytes <= conv_module._BAND_BYTES + 4096


def test_conv_float64_and_float16():
    # onnxruntime's CPU Conv is float32 only: compare against it on the same values
    x, w, b = rand(1, 8, 12, 12), rand(8, 8, 3, 3), rand(8)
    attrs = dict(pads=[1, 1, 1, 1])
    (expected,) = run_ort("Conv", [x, w, b], attrs, 22, 1)
    got, _, _ = run_nncc("Conv", [x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)], attrs, 22, 1)
    assert got[0].dtype == np.float64
    np.testing.assert_allclose(got[0], expected, rtol=1e-4, atol=1e-4)
    h = [a.astype(np.float16) for a in (x, w, b)]
    (expected,) = run_ort("Conv", [a.astype(np.float32) for a in h], attrs, 22, 1)
    got, known, _ = run_nncc("Conv", h, attrs, 22, 1)
    assert got[0].dtype == np.float16 and known[0].dtype == np.float16
    np.testing.assert_allclose(got[0].astype(np.float32), expected, rtol=1e-2, atol=3e-2)


def test_conv_old_opset_and_kernel_shape_attribute():
    x, w = rand(1, 3, 10, 10), rand(5, 3, 3, 3)
    check("Conv", [x, w], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), opset=9)


def test_conv_does_not_modify_inputs():
    x, w, b = rand(1, 4, 9, 9), rand(4, 1, 3, 3), rand(4)
    copies = [a.copy() for a in (x, w, b)]
    run_nncc("Conv", [x, w, b], dict(group=4, pads=[1, 1, 1, 1]), 22, 1)
    for a, c in zip((x, w, b), copies):
        np.testing.assert_array_equal(a, c)


def test_conv_shape_symbolic_and_unknown():
    k = resolve("Conv", "", 22)
    ctx = Ctx(dict(pads=[3, 3, 3, 3], strides=[2, 2]), 22)
    (out,) = k.shape(ctx, TensorInfo(np.dtype(np.float32), ("N", 3, None, 224)),
                     TensorInfo(np.dtype(np.float32), (64, 3, 7, 7)))
    assert out.shape == ("N", 64, None, 112)
    (out,) = k.shape(Ctx(dict(auto_pad="SAME_UPPER", strides=[2, 2]), 22),
                     TensorInfo(np.dtype(np.float32), (1, 3, 225, "W")),
                     TensorInfo(np.dtype(np.float32), (8, 3, 3, 3)))
    assert out.shape == (1, 8, 113, None)
    (out,) = k.shape(Ctx({}, 22), TensorInfo(np.dtype(np.float32), None),
                     TensorInfo(np.dtype(np.float32), (8, 3, 3, 3)))
    assert out.shape == (None, 8, None, None)


def test_conv_errors():
    k = resolve("Conv", "", 22)
    f32 = np.dtype(np.float32)
    with pytest.raises(ShapeInferenceError, match="channels"):
        k.shape(Ctx({}, 22), TensorInfo(f32, (1, 4, 8, 8)), TensorInfo(f32, (8, 3, 3, 3)))
    with pytest.raises(ShapeInferenceError, match="auto_pad"):
        k.shape(Ctx(dict(auto_pad="SAME"), 22), TensorInfo(f32, (1, 3, 8, 8)), TensorInfo(f32, (8, 3, 3, 3)))
    with pytest.raises(ShapeInferenceError, match="pads"):
        k.shape(Ctx(dict(pads=[1, 1]), 22), TensorInfo(f32, (1, 3, 8, 8)), TensorInfo(f32, (8, 3, 3, 3)))
    with pytest.raises(ShapeInferenceError, match="empty output"):
        k.shape(Ctx({}, 22), TensorInfo(f32, (1, 3, 2, 2)), TensorInfo(f32, (8, 3, 3, 3)))
    with pytest.raises(KernelError):
        k.fn(Ctx(dict(group=2), 22), rand(1, 3, 8, 8), rand(4, 2, 3, 3))


# --------------------------------------------------------------------------- ConvTranspose

CONVT_CASES = [
    ((1, 16, 7, 7), (16, 8, 4, 4), dict(strides=[2, 2], pads=[1, 1, 1, 1]), True),
    ((2, 8, 6, 5), (8, 4, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]), True),
    ((1, 8, 5, 5), (8, 3, 3, 3), dict(group=2, strides=[1, 2]), True),
    ((1, 6, 4, 5), (6, 2, 3, 2), dict(dilations=[2, 2], strides=[3, 2], pads=[0, 1, 2, 0]), False),
    ((1, 4, 9), (4, 5, 4), dict(strides=[3], pads=[1, 2]), True),                 # 1-D
    ((1, 4, 3, 4, 5), (4, 2, 3, 3, 2), dict(strides=[2, 1, 2]), True),            # 3-D
    ((1, 4, 5, 5), (4, 2, 3, 3), dict(strides=[2, 2], output_shape=[10, 10]), True),  # even total pad
    ((1, 4, 5, 5), (4, 2, 3, 3), dict(strides=[2, 2], auto_pad="SAME_UPPER"), True),
    ((1, 4, 5, 5), (4, 2, 4, 4), dict(strides=[2, 2], auto_pad="SAME_UPPER"), True),
    ((1, 4, 5, 5), (4, 2, 3, 3), dict(auto_pad="VALID", strides=[2, 2]), True),
    ((1, 4, 5, 5), (4, 4, 1, 1), dict(strides=[2, 2]), True),                     # 1x1 kernel
]


@pytest.mark.parametrize("xs, ws, attrs, bias", CONVT_CASES)
def test_conv_transpose_matches_onnxruntime(xs, ws, attrs, bias):
    x, w = rand(*xs), rand(*ws)
    m = ws[1] * attrs.get("group", 1)
    check("ConvTranspose", [x, w] + ([rand(m)] if bias else []), attrs, rtol=1e-4, atol=1e-4)


def test_conv_transpose_output_shape_larger_than_full():
    # output_shape beyond the computed extent zero-extends (plus bias), like output_padding
    x, w, b = rand(1, 2, 3, 3), rand(2, 3, 3, 3), rand(3)
    got = check("ConvTranspose", [x, w, b], dict(strides=[3, 2], output_shape=[10, 8]))
    assert got[0].shape == (1, 3, 10, 8)


# --------------------------------------------------------------------------- pools

MAXPOOL_CASES = [
    ((1, 16, 28, 28), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 8, 13, 13), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ((1, 8, 12, 11), dict(kernel_shape=[2, 3], strides=[2, 2], pads=[1, 0, 0, 1], ceil_mode=1)),
    ((1, 4, 15, 15), dict(kernel_shape=[3, 3], dilations=[2, 2], strides=[2, 1])),
    ((2, 4, 10, 9), dict(kernel_shape=[3, 2], auto_pad="SAME_UPPER", strides=[2, 2])),
    ((2, 4, 10, 9), dict(kernel_shape=[4, 3], auto_pad="SAME_LOWER", strides=[3, 2])),
    ((1, 4, 10, 9), dict(kernel_shape=[3, 3], auto_pad="VALID", strides=[2, 2])),
    ((2, 3, 20), dict(kernel_shape=[4], strides=[3], pads=[1, 2], ceil_mode=1)),
    ((1, 2, 6, 7, 8), dict(kernel_shape=[2, 3, 3], strides=[2, 2, 2], pads=[0, 1, 1, 1, 1, 0])),
]


@pytest.mark.parametrize("xs, attrs", MAXPOOL_CASES)
def test_max_pool_matches_onnxruntime(xs, attrs):
    check("MaxPool", [rand(*xs)], attrs)


@pytest.mark.parametrize("xs, attrs", MAXPOOL_CASES)
def test_max_pool_indices_match_onnxruntime(xs, attrs):
    check("MaxPool", [rand(*xs)], attrs, n_out=2)


def test_max_pool_indices_column_major_and_ties():
    x = rand(2, 3, 7, 6)
    check("MaxPool", [x], dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1], storage_order=1), n_out=2)
    ties = np.round(rand(1, 2, 8, 8)).astype(np.float32)  # many equal values: first maximum wins
    check("MaxPool", [ties], dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]), n_out=2)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float16, np.float64])
def test_max_pool_dtypes(dtype):
    x = (RNG.integers(0, 100, (1, 3, 9, 9)) if dtype in (np.uint8, np.int8) else rand(1, 3, 9, 9)).astype(dtype)
    check("MaxPool", [x], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))


AVGPOOL_CASES = [
    ((1, 8, 13, 13), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 8, 13, 12), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
    ((1, 4, 10, 11), dict(kernel_shape=[3, 2], strides=[3, 2], pads=[2, 0, 1, 1], ceil_mode=1)),
    ((1, 4, 10, 11), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 4, 10, 11), dict(kernel_shape=[4, 3], strides=[3, 2], auto_pad="SAME_LOWER")),
    ((1, 4, 15, 14), dict(kernel_shape=[3, 3], strides=[2, 2], dilations=[2, 2], pads=[1, 1, 2, 2])),
    ((2, 3, 17), dict(kernel_shape=[4], strides=[3], pads=[1, 2], ceil_mode=1)),
    ((1, 2, 7, 6, 5), dict(kernel_shape=[3, 2, 3], strides=[2, 2, 1], pads=[1, 0, 1, 1, 1, 1])),
]


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("xs, attrs", AVGPOOL_CASES)
def test_average_pool_matches_onnxruntime(xs, attrs, include_pad):
    check("AveragePool", [rand(*xs)], dict(attrs, count_include_pad=include_pad))


def test_average_pool_old_opsets():
    x = rand(1, 3, 9, 9)
    check("AveragePool", [x], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1), opset=7)
    check("AveragePool", [x], dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1), opset=10)
    check("MaxPool", [x], dict(kernel_shape=[2, 2], strides=[2, 2]), opset=1)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 16, 7, 7), (1, 8, 10), (1, 4, 3, 4, 5)])
def test_global_pools(op, shape):
    check(op, [rand(*shape)])
    check(op, [rand(*shape).astype(np.float16)], rtol=1e-3, atol=1e-3)


def test_pool_shape_function_and_errors():
    k = resolve("MaxPool", "", 22)
    f32 = np.dtype(np.float32)
    ctx = Ctx(dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), 22, 2)
    y, idx = k.shape(ctx, TensorInfo(f32, ("N", "C", 112, None)))
    assert y.shape == ("N", "C", 56, None) and idx.dtype == np.int64
    with pytest.raises(ShapeInferenceError, match="kernel_shape"):
        k.shape(Ctx({}, 22), TensorInfo(f32, (1, 1, 4, 4)))
    with pytest.raises(ShapeInferenceError, match="spatial"):
        k.shape(Ctx(dict(kernel_shape=[2]), 22), TensorInfo(f32, (1, 1, 4, 4)))
    with pytest.raises(KernelError):
        resolve("AveragePool", "", 22).fn(Ctx(dict(kernel_shape=[2, 2], pads=[2, 2, 2, 2]), 22), rand(1, 1, 4, 4))
    (g,) = resolve("GlobalAveragePool", "", 22).shape(Ctx({}, 22), TensorInfo(f32, ("N", 8, None, None)))
    assert g.shape == ("N", 8, 1, 1)


# --------------------------------------------------------------------------- normalization


def test_batch_normalization_inference():
    x = rand(2, 8, 5, 6)
    s, b, m = rand(8), rand(8), rand(8)
    v = RNG.random(8).astype(np.float32) + 0.1
    check("BatchNormalization", [x, s, b, m, v], dict(epsilon=1e-3), opset=15)
    check("BatchNormalization", [x, s, b, m, v], {}, opset=9)
    check("BatchNormalization", [rand(3, 8), s, b, m, v], {}, opset=15)  # 2-D input
    check("BatchNormalization", [rand(2, 8, 4, 3, 2), s, b, m, v], {}, opset=14)
    check("BatchNormalization", [x.astype(np.float16), s.astype(np.float16), b.astype(np.float16),
                                 m.astype(np.float16), v.astype(np.float16)], {}, opset=15, rtol=1e-2, atol=1e-2)


def test_batch_normalization_training_mode():
    x = rand(4, 3, 5, 5)
    s, b, m = rand(3), rand(3), rand(3)
    v = RNG.random(3).astype(np.float32) + 0.1
    check("BatchNormalization", [x, s, b, m, v], dict(training_mode=1, momentum=0.8), opset=15, n_out=3)


def test_instance_normalization():
    check("InstanceNormalization", [rand(2, 6, 7, 8), rand(6), rand(6)], dict(epsilon=1e-3))
    check("InstanceNormalization", [rand(2, 6, 9), rand(6), rand(6)], {}, opset=6)
    check("InstanceNormalization", [rand(1, 3, 4, 5, 6), rand(3), rand(3)], {})


@pytest.mark.parametrize("axis", [-1, -2, 1, 0])
def test_layer_normalization_with_statistics(axis):
    x = rand(2, 5, 6, 7)
    norm_shape = x.shape[axis:]
    check("LayerNormalization", [x, rand(*norm_shape), rand(*norm_shape)], dict(axis=axis), opset=17, n_out=3)


def test_layer_normalization_variants():
    x = rand(4, 10, 32)
    check("LayerNormalization", [x, rand(32)], dict(epsilon=1e-3), opset=17)            # no bias
    check("LayerNormalization", [x, rand(32), rand(32)], {}, opset=17, n_out=2)
    check("LayerNormalization", [x, rand(1, 32), rand(32)], {}, opset=17)                # broadcast scale
    check("LayerNormalization", [x, rand(10, 32), rand(10, 32)], dict(axis=1), opset=17)


def test_layer_normalization_shape_function():
    k = resolve("LayerNormalization", "", 17)
    f16 = np.dtype(np.float16)
    y, mean, inv = k.shape(Ctx(dict(axis=-2), 17, 3), TensorInfo(f16, ("B", "T", 64)),
                           TensorInfo(f16, ("T", 64)), None)
    assert y.shape == ("B", "T", 64) and y.dtype == f16
    assert mean.shape == ("B", 1, 1) and mean.dtype == np.float32 and inv.dtype == np.float32
    with pytest.raises(ShapeInferenceError):
        k.shape(Ctx(dict(axis=3), 17, 1), TensorInfo(f16, (2, 3)), TensorInfo(f16, (3,)), None)
    with pytest.raises(UnsupportedOpError):
        resolve("LayerNormalization", "", 16)


@pytest.mark.parametrize("size", [1, 3, 5])
def test_lrn(size):
    check("LRN", [rand(2, 7, 5, 4)], dict(size=size, alpha=1e-2, beta=0.6, bias=2.0))
    check("LRN", [rand(1, 9, 6, 6)], dict(size=size), opset=1)


def test_lrn_even_size_matches_spec_formula():
    # onnxruntime rejects even sizes (and onnx.reference's LRN loops over the wrong axis),
    # so the oracle is the spec's formula written out channel by channel:
    # square_sum[n, c] = sum(X[n, i]^2) for max(0, c - floor((size-1)/2)) <= i <= min(C-1, c + ceil((size-1)/2))
    size, alpha, beta, bias = 4, 0.1, 0.5, 1.5
    x = rand(2, 6, 3, 3)
    c_total = x.shape[1]
    expected = np.empty_like(x)
    for c in range(c_total):
        lo = max(0, c - (size - 1) // 2)
        hi = min(c_total - 1, c + -(-(size - 1) // 2))
        square_sum = (x[:, lo:hi + 1].astype(np.float64) ** 2).sum(axis=1)
        expected[:, c] = x[:, c] / (bias + alpha / size * square_sum) ** beta
    got, _, _ = run_nncc("LRN", [x], dict(size=size, alpha=alpha, beta=beta, bias=bias), 13, 1)
    np.testing.assert_allclose(got[0], expected, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- Resize


def _f(*v):
    return np.array(v, dtype=np.float32)


def _i(*v):
    return np.array(v, dtype=np.int64)


EMPTY = np.zeros(0, np.float32)
ALIGN, PYTORCH, SYMMETRIC, ASYM = "align_corners", "pytorch_half_pixel", "half_pixel_symmetric", "asymmetric"

RESIZE_CASES = [
    # (x shape, [roi, scales, sizes], attrs, opset)
    ((1, 3, 8, 8), [None, _f(1, 1, 2, 2), None], dict(mode="nearest"), 19),
    ((1, 3, 9, 7), [None, _f(1, 1, 0.6, 0.8), None], dict(mode="nearest"), 19),
    ((1, 3, 5, 7), [None, None, _i(1, 3, 12, 9)], dict(mode="nearest", nearest_mode="floor",
                                                   coordinate_transformation_mode="align_corners"), 19),
    ((1, 3, 5, 7), [None, None, _i(1, 3, 12, 9)], dict(mode="nearest", nearest_mode="ceil",
                                                   coordinate_transformation_mode="half_pixel"), 19),
    ((1, 3, 5, 7), [None, None, _i(1, 3, 10, 21)], dict(mode="nearest", nearest_mode="round_prefer_ceil",
                                                    coordinate_transformation_mode="asymmetric"), 19),
    ((1, 3, 6, 6), [None, None, _i(1, 3, 9, 3)], dict(mode="nearest", nearest_mode="round_prefer_floor",
                                                  coordinate_transformation_mode="pytorch_half_pixel"), 19),
    ((2, 4, 8, 8), [None, _f(1, 1, 2, 2), None], dict(mode="linear"), 19),
    ((2, 4, 8, 8), [None, _f(1, 1, 0.5, 0.75), None], dict(mode="linear"), 19),
    ((1, 2, 7, 9), [None, None, _i(1, 2, 15, 4)], dict(mode="linear", coordinate_transformation_mode=ALIGN), 19),
    # align_corners with scales divides by the integer output length (spec and onnxruntime)
    ((1, 1, 2, 4), [None, _f(1, 1, 0.6, 0.6), None], dict(mode="linear", coordinate_transformation_mode=ALIGN), 19),
    ((1, 1, 2, 4), [None, _f(1, 1, 0.6, 0.6), None], dict(mode="cubic", coordinate_transformation_mode=ALIGN), 19),
    ((1, 2, 7, 9), [None, None, _i(1, 2, 15, 1)], dict(mode="linear", coordinate_transformation_mode=PYTORCH), 19),
    ((1, 2, 7, 9), [None, _f(1, 1, 1.7, 2.3), None], dict(mode="linear", coordinate_transformation_mode=ASYM), 19),
    ((1, 2, 7, 9), [None, _f(1, 1, 1.5, 0.7), None], dict(mode="linear", coordinate_transformation_mode=SYMMETRIC), 19),
    ((1, 2, 6, 8), [None, _f(1, 1, 2, 1.5), None], dict(mode="cubic"), 19),
    ((1, 2, 6, 8), [None, None, _i(1, 2, 13, 5)], dict(mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1), 19),
    ((1, 2, 6, 8), [None, None, _i(1, 2, 13, 5)], dict(mode="cubic", coordinate_transformation_mode=ALIGN), 19),
    ((1, 2, 6, 8), [None, None, _i(1, 2, 4, 3)], dict(mode="linear", antialias=1), 19),
    ((1, 2, 6, 8), [None, None, _i(1, 2, 4, 3)], dict(mode="cubic", antialias=1), 19),
    ((1, 1, 5, 6), [_f(0, 0, 0.2, 0.1, 1, 1, 0.9, 1.2), None, _i(1, 1, 4, 7)],
     dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-3.0), 19),
    ((1, 1, 5, 6), [_f(0, 0, -0.2, 0.1, 1, 1, 0.9, 0.8), None, _i(1, 1, 4, 7)],
     dict(mode="nearest", coordinate_transformation_mode="tf_crop_and_resize"), 19),
    ((1, 2, 6, 8), [None, _f(2, 3), None], dict(mode="linear", axes=[2, 3]), 19),
    ((1, 2, 6, 8), [None, None, _i(16, 9)], dict(mode="nearest", axes=[3, 2]), 19),
    ((1, 2, 6, 8), [None, None, _i(9, 9)], dict(mode="nearest", axes=[2, 3], keep_aspect_ratio_policy="not_larger"),
     19),
    ((1, 2, 6, 8), [None, None, _i(9, 9)], dict(mode="linear", axes=[2, 3], keep_aspect_ratio_policy="not_smaller"),
     18),
    ((1, 2, 6, 8), [EMPTY, _f(1, 1, 2, 2), None], dict(mode="linear"), 11),
    ((1, 2, 6, 8), [EMPTY, EMPTY, _i(1, 2, 3, 11)], dict(mode="nearest"), 11),
    ((1, 2, 6, 8), [None, _f(1, 1, 2, 3), None], dict(mode="nearest", nearest_mode="floor",
                                                 coordinate_transformation_mode="asymmetric"), 13),
    ((1, 1, 3, 200), [None, _f(1, 1, 2, 1.3), None], dict(mode="linear"), 19),   # large axis: tap path
    ((1, 1, 2, 300), [None, None, _i(1, 1, 3, 150)], dict(mode="cubic"), 19),
    ((4, 5), [None, _f(2, 0.5), None], dict(mode="linear"), 19),                  # 2-D input
]


@pytest.mark.parametrize("xs, extra, attrs, opset", RESIZE_CASES)
def test_resize_matches_onnxruntime(xs, extra, attrs, opset):
    x = rand(*xs)
    inputs = [x] + extra
    check("Resize", inputs, attrs, opset=opset, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("scales", [(1, 1, 2, 2), (1, 1, 0.6, 0.6), (1, 1, 1.7, 0.4)])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_opset10(scales, mode):
    check("Resize", [rand(1, 2, 5, 7), _f(*scales)], dict(mode=mode), opset=10)


def test_resize_crop_on_axis_of_unchanged_length_follows_spec():
    # onnxruntime skips an axis whose output length equals its input length, ignoring the
    # roi there; the spec (and onnx.reference) crop it like any other axis.
    from onnx.reference import ReferenceEvaluator

    x = rand(1, 1, 7, 4)
    roi = _f(0, 0, 0.3, 0.2, 1, 1, 0.6, 0.55)
    attrs = dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize")
    node = helper.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], **attrs)
    (expected,) = ReferenceEvaluator(node).run(None, {"x": x, "roi": roi, "sizes": _i(1, 1, 7, 5)})
    got, _, _ = run_nncc("Resize", [x, roi, None, _i(1, 1, 7, 5)], attrs, 19, 1)
    np.testing.assert_allclose(got[0], expected, rtol=1e-5, atol=1e-5)


def test_resize_uint8_nearest_and_linear():
    x = RNG.integers(0, 256, (1, 3, 6, 5)).astype(np.uint8)
    check("Resize", [x, None, _f(1, 1, 2, 2)], dict(mode="nearest"), opset=19)
    # linear on integers: onnxruntime's fixed-point path may round the other way by one
    (expected,) = run_ort("Resize", [x, None, _f(1, 1, 1.5, 2.5)], dict(mode="linear"), 19, 1)
    got, known, _ = run_nncc("Resize", [x, None, _f(1, 1, 1.5, 2.5)], dict(mode="linear"), 19, 1)
    assert got[0].dtype == np.uint8 and got[0].shape == expected.shape == known[0].shape
    assert np.abs(got[0].astype(int) - expected.astype(int)).max() <= 1


def test_resize_shape_function():
    k = resolve("Resize", "", 19)
    f32 = np.dtype(np.float32)
    x = TensorInfo(f32, ("N", 3, 32, 48))
    scales = TensorInfo(f32, (4,), _f(1, 1, 2, 0.5))
    (y,) = k.shape(Ctx({}, 19), x, None, scales, None)
    assert y.shape == ("N", 3, 64, 24)
    (y,) = k.shape(Ctx({}, 19), x, None, TensorInfo(f32, (4,)), None)  # contents unknown
    assert y.shape == (None, None, None, None)
    (y,) = k.shape(Ctx(dict(axes=[2, 3]), 19), x, None, None, TensorInfo(np.dtype(np.int64), (2,)))
    assert y.shape == ("N", 3, None, None)
    sizes = TensorInfo(np.dtype(np.int64), (2,), _i(64, 64))
    (y,) = k.shape(Ctx(dict(axes=[2, 3], keep_aspect_ratio_policy="not_larger"), 19), x, None, None, sizes)
    assert y.shape == ("N", 3, 43, 64)
    with pytest.raises(ShapeInferenceError, match="only one"):
        k.shape(Ctx({}, 19), x, None, scales, TensorInfo(np.dtype(np.int64), (4,), _i(1, 3, 4, 4)))
    with pytest.raises(ShapeInferenceError, match="mode"):
        k.shape(Ctx(dict(mode="bicubic"), 19), x, None, scales, None)
    with pytest.raises(KernelError, match="expected 4"):
        k.fn(Ctx({}, 19), rand(1, 1, 2, 2), None, _f(2, 2), None)


# --------------------------------------------------------------------------- MatMul / Gemm / Einsum

MATMUL_CASES = [
    ((3, 4), (4, 5)),
    ((4,), (4,)),
    ((4,), (2, 4, 5)),
    ((2, 3, 4), (4,)),
    ((2, 1, 3, 4), (5, 4, 6)),
    ((1, 3, 4), (7, 4, 2)),
    ((8, 16, 64), (64, 32)),
    ((6, 1, 5), (1, 5, 1)),
]


@pytest.mark.parametrize("a, b", MATMUL_CASES)
def test_matmul_matches_onnxruntime(a, b):
    check("MatMul", [rand(*a), rand(*b)])
    check("MatMul", [rand(*a).astype(np.float16), rand(*b).astype(np.float16)], rtol=1e-2, atol=1e-2)


def test_matmul_integers_and_old_opset():
    a = RNG.integers(-50, 50, (3, 4)).astype(np.int32)
    b = RNG.integers(-50, 50, (4, 2)).astype(np.int32)
    check("MatMul", [a, b], opset=13)
    check("MatMul", [a.astype(np.int64), b.astype(np.int64)], opset=13)
    check("MatMul", [rand(2, 3), rand(3, 2)], opset=1)


def test_matmul_shape_function():
    k = resolve("MatMul", "", 13)
    f32 = np.dtype(np.float32)
    (y,) = k.shape(Ctx({}, 13), TensorInfo(f32, ("B", 1, "S", 64)), TensorInfo(f32, (8, 64, 32)))
    assert y.shape == ("B", 8, "S", 32)
    (y,) = k.shape(Ctx({}, 13), TensorInfo(f32, (64,)), TensorInfo(f32, ("B", 64, 32)))
    assert y.shape == ("B", 32)
    with pytest.raises(ShapeInferenceError, match="inner"):
        k.shape(Ctx({}, 13), TensorInfo(f32, (2, 3)), TensorInfo(f32, (4, 5)))


GEMM_CASES = [
    (dict(), (3, 5), (5, 4), (4,)),
    (dict(transA=1), (5, 3), (5, 4), (3, 4)),
    (dict(transB=1, alpha=0.5, beta=2.0), (3, 5), (4, 5), (3, 1)),
    (dict(transA=1, transB=1, alpha=-1.5), (5, 3), (4, 5), (1,)),
    (dict(beta=0.0), (3, 5), (5, 4), (3, 4)),
    (dict(), (3, 5), (5, 4), None),
    (dict(alpha=2.0), (3, 5), (5, 4), ()),
]


@pytest.mark.parametrize("attrs, a, b, c", GEMM_CASES)
def test_gemm_matches_onnxruntime(attrs, a, b, c):
    inputs = [rand(*a), rand(*b)] + ([] if c is None else [rand(*c)])
    check("Gemm", inputs, attrs, opset=13)


def test_gemm_old_opsets_and_errors():
    check("Gemm", [rand(3, 5), rand(5, 4), rand(3, 4)], dict(beta=0.5), opset=7)
    check("Gemm", [rand(3, 5), rand(5, 4), rand(4)], {}, opset=9)
    k = resolve("Gemm", "", 13)
    f32 = np.dtype(np.float32)
    with pytest.raises(ShapeInferenceError, match="inner"):
        k.shape(Ctx(dict(transA=1), 13), TensorInfo(f32, (3, 5)), TensorInfo(f32, (5, 4)))
    with pytest.raises(ShapeInferenceError, match="broadcast"):
        k.shape(Ctx({}, 13), TensorInfo(f32, (3, 5)), TensorInfo(f32, (5, 4)), TensorInfo(f32, (2, 4)))
    (y,) = k.shape(Ctx(dict(transB=1), 13), TensorInfo(f32, ("M", 5)), TensorInfo(f32, (7, 5)), None)
    assert y.shape == ("M", 7)


EINSUM_CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ii->i", [(4, 4)]),
    ("ij->", [(3, 4)]),
    ("i,i", [(5,), (5,)]),
    ("ij,kj", [(3, 4), (2, 4)]),
    ("...ij,...jk->...ik", [(2, 5, 3, 4), (2, 5, 4, 2)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)]),
    ("b i d, b j d -> b i j", [(2, 3, 4), (2, 5, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("...j->...", [(2, 3, 4)]),
]


@pytest.mark.parametrize("eq, shapes", EINSUM_CASES)
def test_einsum_matches_onnxruntime(eq, shapes):
    check("Einsum", [rand(*s) for s in shapes], dict(equation=eq), opset=12)


def test_einsum_shape_and_errors():
    k = resolve("Einsum", "", 12)
    f32 = np.dtype(np.float32)
    (y,) = k.shape(Ctx(dict(equation="...ij,jk"), 12), TensorInfo(f32, ("B", 3, 4)), TensorInfo(f32, (4, 5)))
    assert y.shape == ("B", 3, 5)
    (y,) = k.shape(Ctx(dict(equation="...ij,...jk->...ik"), 12), TensorInfo(f32, (2, 1, 3, 4)),
                   TensorInfo(f32, ("H", 4, 5)))
    assert y.shape == (2, "H", 3, 5)
    (y,) = k.shape(Ctx(dict(equation="ij,jk->ik"), 12), TensorInfo(f32, None), TensorInfo(f32, (4, 5)))
    assert y.shape == (None, None)
    with pytest.raises(ShapeInferenceError, match="operands"):
        k.shape(Ctx(dict(equation="ij,jk->ik"), 12), TensorInfo(f32, (3, 4)))
    with pytest.raises(ShapeInferenceError, match="both"):
        k.shape(Ctx(dict(equation="ij,jk->ik"), 12), TensorInfo(f32, (3, 4)), TensorInfo(f32, (5, 6)))
