"""Elementwise math, bitwise, activation, reduction, normalization, loss and random kernels
beyond the ONNX node suite: other shapes, dtypes, attributes and edge values.

Oracles: onnxruntime (a one-node model per case) where it implements the op for the dtype,
otherwise Python's math module or a brute-force transcription of the operator's spec.
Never the code under test. Each case also checks the kernel's shape function against the
output, with the inputs' contents known and unknown.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper
import pytest

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import Ctx, resolve
from tests.one_node_graphs import one_node
from tests.oracle import ort_run

RNG = np.random.default_rng(20261124)


def rand(*shape, dtype=np.float32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def run_ort(op, inputs, attrs, opset, n_out):
    model, feeds, _ = one_node(op, inputs, n_out, attrs, opset)
    return ort_run(model, feeds)


def run_nncc(op, inputs, attrs=None, opset=22, n_out=1):
    k = resolve(op, "", opset)
    ctx = Ctx(dict(attrs or {}), opset, n_out)
    got = k.fn(ctx, *inputs)
    return got if isinstance(got, tuple) else (got,)


def check_shape_fn(op, inputs, attrs, opset, n_out, outputs):
    k = resolve(op, "", opset)
    ctx = Ctx(dict(attrs or {}), opset, n_out)
    known = k.shape(ctx, *[None if a is None else TensorInfo.of(a) for a in inputs])
    unknown = k.shape(ctx, *[None if a is None else TensorInfo(a.dtype, tuple(a.shape)) for a in inputs])
    for i, e in enumerate(outputs):
        assert known[i].dtype == e.dtype and unknown[i].dtype == e.dtype
        assert known[i].shape == e.shape, f"shape fn (known inputs) {known[i].shape} != {e.shape}"
        u = unknown[i].shape
        assert u is None or (len(u) == e.ndim and all(d is None or d == s for d, s in zip(u, e.shape)))


def compare(got, expected, rtol, atol):
    for i, (g, e) in enumerate(zip(got, expected)):
        g, e = np.asarray(g), np.asarray(e)
        assert g.shape == e.shape, f"output {i}: shape {g.shape} != expected {e.shape}"
        assert g.dtype == e.dtype, f"output {i}: dtype {g.dtype} != expected {e.dtype}"
        if e.dtype.kind == "f":
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, e)


def check(op, inputs, attrs=None, opset=22, n_out=1, rtol=1e-5, atol=1e-6):
    """Compare the nncc kernel with onnxruntime on one node."""
    attrs = attrs or {}
    expected = run_ort(op, inputs, attrs, opset, n_out)
    got = run_nncc(op, inputs, attrs, opset, n_out)
    assert len(got) == n_out
    compare(got, expected, rtol, atol)
    check_shape_fn(op, inputs, attrs, opset, n_out, expected)
    return got


def check_against(op, inputs, expected, attrs=None, opset=22, rtol=1e-12, atol=0.0):
    """Compare the nncc kernel with an expected array from an independent definition."""
    got = run_nncc(op, inputs, attrs, opset)
    compare(got, [expected], rtol, atol)
    check_shape_fn(op, inputs, attrs, opset, 1, [np.asarray(expected)])


def elementwise(fn, x, dtype=np.float64):
    """A scalar function of Python floats applied to each element (NaN for domain errors)."""
    def safe(v):
        try:
            return fn(float(v))
        except (ValueError, OverflowError):
            return math.nan
    return np.array([safe(v) for v in x.reshape(-1)], np.float64).reshape(x.shape).astype(dtype)


# --------------------------------------------------------------------------- trigonometry

TRIG = {
    "Sin": (math.sin, 4.0), "Cos": (math.cos, 4.0), "Tan": (math.tan, 1.5),
    "Asin": (math.asin, 1.2), "Acos": (math.acos, 1.2), "Atan": (math.atan, 10.0),
    "Sinh": (math.sinh, 5.0), "Cosh": (math.cosh, 5.0), "Asinh": (math.asinh, 50.0),
    "Acosh": (math.acosh, 5.0), "Atanh": (math.atanh, 1.1),
}


@pytest.mark.parametrize("op", sorted(TRIG))
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_trig_matches_onnxruntime(op, dtype):
    # values beyond the domain (|x| > 1 for Asin, x < 1 for Acosh) give NaN in both
    _, spread = TRIG[op]
    x = RNG.uniform(-spread, spread, (3, 4, 5)).astype(dtype)
    rtol = 1e-5 if dtype == np.float32 else 1e-3
    check(op, [x], opset=9 if op in ("Sinh", "Cosh", "Asinh", "Acosh", "Atanh") else 7,
          rtol=rtol, atol=rtol)


@pytest.mark.parametrize("op", sorted(TRIG))
def test_trig_float64_matches_math(op):
    fn, spread = TRIG[op]
    # (atanh(+-1) = +-inf, where math raises, is in test_trig_special_values)
    edges = [0.0, -0.0] + ([] if op == "Atanh" else [1.0, -1.0])
    x = np.concatenate([RNG.uniform(-spread, spread, 200), edges])
    check_against(op, [x], elementwise(fn, x), rtol=1e-14, atol=1e-300)


def test_trig_special_values():
    x = np.array([np.inf, -np.inf, np.nan, 1.0, -1.0], np.float32)
    (y,) = run_nncc("Atanh", [x])
    assert np.isnan(y[:3]).all() and y[3] == np.inf and y[4] == -np.inf
    (y,) = run_nncc("Sin", [x])
    assert np.isnan(y[:3]).all()
    (y,) = run_nncc("Cosh", [np.array([1e4, -1e4], np.float32)])
    assert (y == np.inf).all()


def test_trig_rejects_integers():
    with pytest.raises(KernelError, match="floating-point"):
        run_nncc("Cos", [np.arange(3)])


def test_trig_writes_into_out():
    k = resolve("Sin", "", 22)
    x = rand(4, 5)
    out = np.empty_like(x)
    y = k.fn(Ctx({}, 22), x, out=(out,))
    assert y is out
    np.testing.assert_array_equal(out, np.sin(x))


# --------------------------------------------------------------------------- Round, Sign, IsNaN, IsInf


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_round_halves_to_even(dtype):
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4999, -2.5001, 1e7 + 0.5, 0.0, -0.0,
                  np.inf, -np.inf, np.nan], np.float64)
    with np.errstate(over="ignore"):  # 1e7 is inf in float16
        x = x.astype(dtype)
    check("Round", [x], opset=11)
    (y,) = run_nncc("Round", [x], opset=11)
    assert list(y[:6]) == [0.0, 2.0, 2.0, -0.0, -2.0, -2.0]


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32, np.float32, np.float64])
def test_sign_matches_onnxruntime(dtype):
    x = (RNG.integers(-5, 6, (4, 6)) if np.dtype(dtype).kind != "u" else RNG.integers(0, 6, (4, 6)))
    x = x.astype(dtype)
    check("Sign", [x], opset=13)


def test_sign_of_nan_and_zero():
    (y,) = run_nncc("Sign", [np.array([np.nan, -0.0, 0.0, -np.inf], np.float32)], opset=13)
    assert np.isnan(y[0]) and list(y[1:]) == [0.0, 0.0, -1.0]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("neg,pos", [(1, 1), (1, 0), (0, 1), (0, 0)])
def test_isinf_attributes_match_onnxruntime(dtype, neg, pos):
    x = np.array([[np.inf, -np.inf, np.nan], [0.0, -1e30, 65504.0]], np.float64)
    with np.errstate(over="ignore"):  # -1e30 is -inf in float16
        x = x.astype(dtype)
    check("IsInf", [x], dict(detect_negative=neg, detect_positive=pos), opset=20)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_isnan_matches_onnxruntime(dtype):
    x = np.array([np.nan, -np.nan, np.inf, 0.0, 1.0], np.float64).astype(dtype).reshape(5, 1)
    check("IsNaN", [x], opset=20)


# --------------------------------------------------------------------------- bitwise

_UNSIGNED = [np.uint8, np.uint16, np.uint32, np.uint64]
_SIGNED = [np.int8, np.int16, np.int32, np.int64]


@pytest.mark.parametrize("dtype", _UNSIGNED)
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_unsigned_matches_onnxruntime(dtype, direction):
    bits = np.dtype(dtype).itemsize * 8
    x = RNG.integers(0, np.iinfo(dtype).max, (3, 5), dtype=dtype, endpoint=True)
    y = RNG.integers(0, bits, (5,)).astype(dtype)  # broadcast along the rows
    check("BitShift", [x, y], dict(direction=direction), opset=11)


def _shift_spec(x: int, s: int, bits: int, signed: bool, left: bool) -> int:
    """The opset-28 definition on Python integers."""
    if s < 0 or s >= bits:
        return -1 if (not left and signed and x < 0) else 0
    if left:
        v = (x << s) & ((1 << bits) - 1)  # bits past the width are dropped
        return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v
    return x >> s  # Python's >> is arithmetic on negative numbers


@pytest.mark.parametrize("dtype", _SIGNED + _UNSIGNED)
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_out_of_range_amounts_follow_the_spec(dtype, direction):
    info = np.iinfo(dtype)
    bits = info.bits
    signed = info.min < 0
    xs = [info.min, info.min + 1, -1 if signed else 1, 0, 1, 5, info.max]
    ss = [0, 1, bits - 1, bits, bits + 3] + ([-1, -bits] if signed else [])
    x = np.array([v for v in xs for _ in ss], dtype)
    s = np.array([t for _ in xs for t in ss], dtype)
    left = direction == "LEFT"
    want = np.array([_shift_spec(int(a), int(b), bits, signed, left) for a, b in zip(x, s)], dtype)
    check_against("BitShift", [x, s], want, dict(direction=direction), opset=28)


@pytest.mark.parametrize("dtype", _SIGNED)
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_signed_matches_onnxruntime(dtype, direction):
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max, (4, 6), dtype=dtype, endpoint=True)
    y = RNG.integers(0, info.bits, (4, 1)).astype(dtype)
    check("BitShift", [x, y], dict(direction=direction), opset=28)


def test_bitshift_rejects_a_bad_direction_and_floats():
    x = np.arange(3, dtype=np.uint8)
    with pytest.raises(KernelError, match="direction"):
        run_nncc("BitShift", [x, x], dict(direction="UP"), opset=11)
    with pytest.raises(KernelError, match="integer"):
        run_nncc("BitShift", [x.astype(np.float32)] * 2, dict(direction="LEFT"), opset=11)


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", _SIGNED + _UNSIGNED)
def test_bitwise_binary_matches_onnxruntime(op, dtype):
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, (2, 3, 4), dtype=dtype, endpoint=True)
    b = RNG.integers(info.min, info.max, (3, 1), dtype=dtype, endpoint=True)
    check(op, [a, b], opset=18)


@pytest.mark.parametrize("dtype", _SIGNED + _UNSIGNED)
def test_bitwise_not_matches_onnxruntime(dtype):
    info = np.iinfo(dtype)
    x = np.array([info.min, info.max, 0, 1], dtype)
    check("BitwiseNot", [x], opset=18)


def test_bitwise_rejects_mixed_dtypes():
    with pytest.raises(KernelError, match="same dtype"):
        run_nncc("BitwiseAnd", [np.ones(2, np.int8), np.ones(2, np.int16)], opset=18)


# --------------------------------------------------------------------------- activations


@pytest.mark.parametrize("alpha", [1.0, 0.5, 3.0])
def test_celu_matches_onnxruntime(alpha):
    x = rand(4, 7, scale=3.0)
    check("Celu", [x], dict(alpha=alpha), opset=12)


def test_celu_float64_and_float16_match_the_formula():
    alpha = 0.75
    f = lambda v: max(0.0, v) + min(0.0, alpha * math.expm1(v / alpha))  # noqa: E731
    x = np.concatenate([RNG.uniform(-30, 30, 100), [0.0, -0.0, 1e-8, -1e-8]])
    check_against("Celu", [x], elementwise(f, x), dict(alpha=alpha), opset=12, rtol=1e-13, atol=1e-300)
    h = x.astype(np.float16)
    got = run_nncc("Celu", [h], dict(alpha=alpha), opset=12)[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), elementwise(f, h), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_mish_matches_onnxruntime(dtype):
    x = np.concatenate([rand(50, scale=5.0), [100.0, -100.0, 0.0]]).astype(dtype)
    check("Mish", [x], opset=18, rtol=1e-5 if dtype == np.float32 else 2e-3, atol=1e-6)


def test_mish_float64_matches_math():
    f = lambda v: v * math.tanh(math.log1p(math.exp(v)) if v < 30 else v)  # noqa: E731
    x = np.concatenate([RNG.uniform(-40, 40, 200), [0.0]])
    check_against("Mish", [x], elementwise(f, x), opset=18, rtol=1e-13, atol=1e-300)


@pytest.mark.parametrize("alpha", [1.0, 0.25, -2.0])
def test_swish_matches_onnxruntime(alpha):
    x = rand(3, 8, scale=4.0)
    check("Swish", [x], dict(alpha=alpha), opset=24)


@pytest.mark.parametrize("alpha", [1.0, 1.702])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_swiglu_matches_its_definition(alpha, dtype):
    a, b = rand(2, 3, 16, dtype=dtype, scale=3.0), rand(2, 3, 16, dtype=dtype)
    want = elementwise(lambda v: v / (1 + math.exp(-alpha * v)), a, np.float64) * b.astype(np.float64)
    check_against("SwiGLU", [a, b], want.astype(dtype), dict(alpha=alpha), opset=28,
                  rtol=1e-12 if dtype == np.float64 else 1e-6, atol=1e-7)


def test_swiglu_rejects_different_shapes():
    with pytest.raises(KernelError, match="same dtype and shape"):
        run_nncc("SwiGLU", [rand(2, 4), rand(1, 4)], opset=28)
    with pytest.raises(ShapeInferenceError, match="same shape"):
        resolve("SwiGLU", "", 28).shape(Ctx({}, 28), TensorInfo(np.dtype(np.float32), (2, 4)),
                                         TensorInfo(np.dtype(np.float32), (2, 5)))


def test_softsign_matches_onnxruntime():
    check("Softsign", [rand(5, 6, scale=10.0)], opset=1)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_softsign_other_dtypes_match_the_formula(dtype):
    # (onnxruntime has Softsign for float32 only)
    x = rand(5, 6, dtype=dtype, scale=10.0)
    check_against("Softsign", [x], elementwise(lambda v: v / (1 + abs(v)), x, dtype), opset=1,
                  rtol=1e-15 if dtype == np.float64 else 1e-3)


@pytest.mark.parametrize("alpha", [1.0, 0.0, -0.5, 2.5])
def test_thresholded_relu_matches_onnxruntime(alpha):
    x = np.concatenate([rand(30, scale=3.0), [alpha, np.nextafter(np.float32(alpha), np.float32(9))]]).astype(np.float32)
    check("ThresholdedRelu", [x], dict(alpha=alpha), opset=10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("attrs", [{}, dict(lambd=1.5, bias=1.5), dict(lambd=0.0, bias=-2.0)])
def test_shrink_matches_onnxruntime(dtype, attrs):
    if np.dtype(dtype).kind == "u":
        x = RNG.integers(0, 10, (4, 5)).astype(dtype)
    elif np.dtype(dtype).kind == "i":
        x = RNG.integers(-5, 6, (4, 5)).astype(dtype)
    else:
        x = rand(4, 5, dtype=dtype, scale=3.0)
    check("Shrink", [x], attrs, opset=9)


@pytest.mark.parametrize("opset,axis", [(11, 0), (11, 1), (11, 2), (11, -1), (11, -3),
                                        (13, 0), (13, 1), (13, -1), (13, -3)])
def test_hardmax_matches_onnxruntime(opset, axis):
    x = rand(3, 4, 5)
    x[1, 2, :2] = 9.0  # a tie along the last axis: the first one wins
    x[2, :, 3] = 7.0   # a tie along axis 1
    check("Hardmax", [x], dict(axis=axis), opset=opset)


def test_hardmax_default_axis_changes_at_13():
    x = rand(2, 3, 4)
    (old,) = run_nncc("Hardmax", [x], opset=11)
    (new,) = run_nncc("Hardmax", [x], opset=13)
    assert old.reshape(2, 12).sum(axis=1).tolist() == [1, 1]
    assert new.sum(axis=-1).tolist() == [[1] * 3] * 2


# --------------------------------------------------------------------------- reductions, CumProd, Det


@pytest.mark.parametrize("opset,axes,keepdims", [
    (13, None, 1), (13, [1], 0), (13, [0, 2], 1), (13, [-1], 0),
    (18, None, 0), (18, [2], 1), (18, [0, -1], 0),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reduce_log_sum_matches_onnxruntime(opset, axes, keepdims, dtype):
    x = RNG.uniform(0.1, 3.0, (3, 4, 5)).astype(dtype)
    attrs = dict(keepdims=keepdims)
    inputs = [x]
    if axes is not None and opset < 18:
        attrs["axes"] = axes
    elif axes is not None:
        inputs.append(np.array(axes, np.int64))
    check("ReduceLogSum", inputs, attrs, opset=opset)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reduce_log_sum_of_integers_matches_onnxruntime(dtype):
    # before opset 28 integer inputs are allowed; the log is truncated toward zero
    x = np.array([[1, 4], [2, 3], [20, 0], [400, 3]], dtype)
    check("ReduceLogSum", [x, np.array([1])], dict(keepdims=0), opset=18)


def test_reduce_log_sum_noop_and_empty():
    x = RNG.uniform(0.1, 3.0, (2, 3)).astype(np.float32)
    (y,) = run_nncc("ReduceLogSum", [x, np.array([], np.int64)], dict(noop_with_empty_axes=1), opset=18)
    np.testing.assert_array_equal(y, x)
    (y,) = run_nncc("ReduceLogSum", [np.zeros((2, 0), np.float32), np.array([1])], dict(keepdims=0), opset=18)
    assert y.shape == (2,) and (y == -np.inf).all()


def _cumprod_spec(x, axis, exclusive, reverse):
    """Running products by explicit loops over the axis."""
    xm = np.moveaxis(x, axis, -1)
    out = np.empty_like(xm)
    n = xm.shape[-1]
    for idx in np.ndindex(xm.shape[:-1]):
        order = range(n - 1, -1, -1) if reverse else range(n)
        acc = xm.dtype.type(1)
        for j in order:
            if exclusive:
                out[idx + (j,)] = acc
                acc = acc * xm[idx + (j,)]
            else:
                acc = acc * xm[idx + (j,)]
                out[idx + (j,)] = acc
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumprod_matches_onnxruntime(dtype, axis, exclusive, reverse):
    if np.dtype(dtype).kind == "i":
        x = RNG.integers(-3, 4, (3, 4, 5)).astype(dtype)
    else:
        x = RNG.uniform(-1.5, 1.5, (3, 4, 5)).astype(dtype)
    attrs = dict(exclusive=exclusive, reverse=reverse)
    got = check("CumProd", [x, np.array(axis, np.int64)], attrs, opset=26)
    np.testing.assert_allclose(got[0], _cumprod_spec(x, axis, exclusive, reverse), rtol=1e-6)


def test_cumprod_wide_input_uses_the_same_order():
    # many rows per position: the per-position loop; checked against the explicit loops
    x = RNG.uniform(0.5, 1.5, (6, 80)).astype(np.float64)
    for exclusive, reverse in [(0, 0), (1, 1)]:
        (y,) = run_nncc("CumProd", [x, np.array([0], np.int32)], dict(exclusive=exclusive, reverse=reverse), opset=26)
        np.testing.assert_allclose(y, _cumprod_spec(x, 0, exclusive, reverse), rtol=1e-14)


def test_det_matches_onnxruntime():
    check("Det", [rand(2, 3, 4, 4)], opset=11, rtol=1e-4, atol=1e-5)
    check("Det", [rand(5, 5)], opset=11, rtol=1e-4, atol=1e-5)
    check("Det", [rand(1, 1)], opset=11)
    singular = np.array([[1.0, 2.0], [2.0, 4.0]], np.float32)
    check("Det", [singular], opset=11)


def test_det_float64_by_cofactor_expansion():
    def cofactor(m):
        if len(m) == 1:
            return m[0][0]
        return sum((-1) ** j * m[0][j] * cofactor([row[:j] + row[j + 1:] for row in m[1:]])
                   for j in range(len(m)))
    x = rand(3, 4, 4, dtype=np.float64)
    want = np.array([cofactor(m.tolist()) for m in x])
    check_against("Det", [x], want, opset=22, rtol=1e-12, atol=1e-12)


def test_det_rejects_non_square():
    with pytest.raises(KernelError, match="M, M"):
        run_nncc("Det", [rand(3, 4)], opset=11)


# --------------------------------------------------------------------------- normalization


@pytest.mark.parametrize("shape,groups", [((2, 6, 4, 5), 3), ((1, 8, 7), 2), ((3, 4, 2, 2, 3), 4), ((2, 5, 3), 1)])
@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization_matches_onnxruntime(shape, groups, opset):
    c = shape[1]
    n_params = groups if opset == 18 else c
    x = rand(*shape, scale=2.0) + 1.0
    scale, bias = rand(n_params), rand(n_params)
    check("GroupNormalization", [x, scale, bias], dict(num_groups=groups, epsilon=1e-3),
          opset=opset, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_group_normalization_21_other_dtypes_match_onnxruntime(dtype):
    x = rand(2, 4, 3, 3, dtype=dtype)
    scale, bias = rand(4, dtype=dtype), rand(4, dtype=dtype)
    tol = 1e-5 if dtype == np.float64 else 3e-3
    check("GroupNormalization", [x, scale, bias], dict(num_groups=2), opset=21, rtol=tol, atol=tol)


def test_group_normalization_checks_groups_and_parameters():
    x = rand(1, 6, 4)
    with pytest.raises(KernelError, match="divide"):
        run_nncc("GroupNormalization", [x, rand(4), rand(4)], dict(num_groups=4), opset=21)
    with pytest.raises(KernelError, match=r"shape \(6,\)"):
        run_nncc("GroupNormalization", [x, rand(3), rand(3)], dict(num_groups=3), opset=21)


@pytest.mark.parametrize("axis,scale_shape", [(-1, (5,)), (1, (4, 5)), (0, (3, 4, 5)), (-2, (1, 5)), (2, (1,))])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_rms_normalization_matches_onnxruntime(axis, scale_shape, dtype):
    x = rand(3, 4, 5, dtype=dtype, scale=3.0)
    scale = rand(*scale_shape, dtype=dtype)
    tol = 3e-3 if dtype == np.float16 else 1e-5
    check("RMSNormalization", [x, scale], dict(axis=axis, epsilon=1e-4), opset=23, rtol=tol, atol=tol)


@pytest.mark.parametrize("opset", [9, 13])
@pytest.mark.parametrize("axes", [None, [1], [0, 1, 2, 3], [2, 3], [-1]])
def test_mean_variance_normalization_matches_onnxruntime(opset, axes):
    x = rand(2, 3, 4, 5, scale=4.0) + 2.0
    check("MeanVarianceNormalization", [x], {} if axes is None else dict(axes=axes),
          opset=opset, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("opset", [1, 22])
def test_lp_normalization_matches_onnxruntime(p, axis, opset):
    x = rand(3, 4, 5)
    check("LpNormalization", [x], dict(p=p, axis=axis), opset=opset)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("opset", [1, 22])
def test_lp_normalization_of_zeros_is_zero(p, opset):
    x = np.zeros((2, 3), np.float32)
    x[1] = [3.0, 0.0, 4.0]
    check("LpNormalization", [x], dict(p=p), opset=opset)
    check_against("LpNormalization", [x.astype(np.float64)],
                  np.array([[0, 0, 0], [0.6, 0, 0.8]] if p == 2 else [[0, 0, 0], [3 / 7, 0, 4 / 7]]),
                  dict(p=p), opset=opset, rtol=1e-15)
    with pytest.raises(KernelError, match="p must be 1 or 2"):
        run_nncc("LpNormalization", [x], dict(p=3), opset=22)


# --------------------------------------------------------------------------- losses

LOSS_SHAPES = [((5, 4), (5,)), ((2, 3, 6), (2, 6)), ((2, 4, 3, 2, 2), (2, 3, 2, 2))]


def _targets(shape, classes, ignore=None):
    t = RNG.integers(0, classes, shape).astype(np.int64)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore
    return t


@pytest.mark.parametrize("shape,tshape", LOSS_SHAPES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 1, -7])
def test_nll_loss_matches_onnxruntime(shape, tshape, reduction, weighted, ignore):
    x = rand(*shape)
    t = _targets(tshape, shape[1], ignore)
    attrs = dict(reduction=reduction)
    if ignore is not None:
        attrs["ignore_index"] = ignore
    inputs = [x, t] + ([RNG.uniform(0.2, 2.0, shape[1]).astype(np.float32)] if weighted else [])
    check("NegativeLogLikelihoodLoss", inputs, attrs, opset=13, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape,tshape", LOSS_SHAPES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 0, -1])
def test_softmax_cross_entropy_matches_onnxruntime(shape, tshape, reduction, weighted, ignore):
    x = rand(*shape, scale=3.0)
    t = _targets(tshape, shape[1], ignore)
    attrs = dict(reduction=reduction)
    if ignore is not None:
        attrs["ignore_index"] = ignore
    inputs = [x, t] + ([RNG.uniform(0.2, 2.0, shape[1]).astype(np.float32)] if weighted else [])
    check("SoftmaxCrossEntropyLoss", inputs, attrs, opset=13, n_out=2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_losses_other_dtypes_match_onnxruntime(dtype):
    x = rand(4, 5, 3, dtype=dtype)
    t = _targets((4, 3), 5, ignore=2).astype(np.int32)
    tol = 1e-3 if dtype == np.float16 else 1e-10
    check("SoftmaxCrossEntropyLoss", [x, t], dict(ignore_index=2), opset=13, n_out=2, rtol=tol, atol=tol)
    check("NegativeLogLikelihoodLoss", [x, t], dict(reduction="sum"), opset=13, rtol=tol, atol=tol)


def test_softmax_cross_entropy_large_scores_stay_finite():
    x = np.array([[1000.0, 0.0, -1000.0], [-1e4, 1e4, 0.0]], np.float32)
    t = np.array([0, 2])
    loss, logp = run_nncc("SoftmaxCrossEntropyLoss", [x, t], dict(reduction="none"), opset=13, n_out=2)
    np.testing.assert_allclose(loss, [0.0, 1e4], rtol=1e-6)
    assert np.isfinite(logp).all()


def test_losses_reject_bad_targets():
    x = rand(3, 4)
    with pytest.raises(KernelError, match="out of range"):
        run_nncc("NegativeLogLikelihoodLoss", [x, np.array([0, 4, 1])], opset=13)
    with pytest.raises(KernelError, match="does not match"):
        run_nncc("NegativeLogLikelihoodLoss", [x, np.array([0, 1])], opset=13)
    with pytest.raises(KernelError, match="reduction"):
        run_nncc("SoftmaxCrossEntropyLoss", [x, np.array([0, 1, 2])], dict(reduction="avg"), opset=13)
    # an ignored element may hold any value, even one that is no class
    (y,) = run_nncc("NegativeLogLikelihoodLoss", [x, np.array([0, 99, 1])], dict(ignore_index=99), opset=13)
    np.testing.assert_allclose(y, -(x[0, 0] + x[2, 1]) / 2, rtol=1e-6)


# --------------------------------------------------------------------------- random generators


def _fresh(op, opset, attrs):
    k = resolve(op, "", opset)
    assert not k.deterministic  # never folded at compile time
    return k, Ctx(dict(attrs), opset)


def test_random_uniform_like_range_dtype_and_seed():
    x = np.zeros((200, 50), np.float32)
    k, ctx = _fresh("RandomUniformLike", 22, dict(low=-2.0, high=3.0))
    y = k.fn(ctx, x)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert y.min() >= -2.0 and y.max() < 3.0
    assert abs(y.mean() - 0.5) < 0.05 and abs(y.std() - 5 / math.sqrt(12)) < 0.05
    assert not np.array_equal(y, k.fn(ctx, x))  # each run draws anew
    k, ctx = _fresh("RandomUniformLike", 22, dict(dtype=onnx.TensorProto.DOUBLE, seed=3.0))
    a = k.fn(ctx, x)
    assert a.dtype == np.float64
    b = k.fn(Ctx(dict(dtype=onnx.TensorProto.DOUBLE, seed=3.0), 22), x)
    np.testing.assert_array_equal(a, b)  # the same seed, the same draws
    c = k.fn(Ctx(dict(dtype=onnx.TensorProto.DOUBLE, seed=4.0), 22), x)
    assert not np.array_equal(a, c)
    with pytest.raises(KernelError, match="output type"):
        k.fn(Ctx({}, 22), np.zeros(3, np.int32))


def test_random_normal_and_uniform_from_attributes():
    k, ctx = _fresh("RandomNormal", 1, dict(shape=[400, 50], mean=1.0, scale=2.0))
    y = k.fn(ctx)
    assert y.dtype == np.float32 and y.shape == (400, 50)
    assert abs(y.mean() - 1.0) < 0.05 and abs(y.std() - 2.0) < 0.05
    info = k.shape(ctx)[0]
    assert info.dtype == np.float32 and info.shape == (400, 50)
    k, ctx = _fresh("RandomUniform", 1, dict(shape=[3, 4], dtype=onnx.TensorProto.FLOAT16))
    assert k.fn(ctx).dtype == np.float16


@pytest.mark.parametrize("dtype", [None, onnx.TensorProto.INT32, onnx.TensorProto.BOOL, onnx.TensorProto.DOUBLE])
def test_bernoulli_values_frequency_and_dtype(dtype):
    p = np.repeat(np.array([[0.0], [0.2], [0.7], [1.0]], np.float32), 5000, axis=1)
    attrs = {} if dtype is None else dict(dtype=dtype)
    k, ctx = _fresh("Bernoulli", 15, attrs)
    y = k.fn(ctx, p)
    want = np.float32 if dtype is None else helper.tensor_dtype_to_np_dtype(dtype)
    assert y.dtype == want and y.shape == p.shape
    assert k.shape(ctx, TensorInfo(p.dtype, p.shape))[0].dtype == want
    yf = y.astype(np.float64)
    assert set(np.unique(yf)) <= {0.0, 1.0}
    assert yf[0].sum() == 0 and yf[3].sum() == 5000
    assert abs(yf[1].mean() - 0.2) < 0.03 and abs(yf[2].mean() - 0.7) < 0.03


def test_bernoulli_seed_repeats_on_a_fresh_load():
    p = np.full((1000,), 0.5)
    a = resolve("Bernoulli", "", 15).fn(Ctx(dict(seed=1.5), 15), p)
    b = resolve("Bernoulli", "", 15).fn(Ctx(dict(seed=1.5), 15), p)
    np.testing.assert_array_equal(a, b)


def test_random_ops_are_not_folded_by_the_compiler():
    # A generator fed by a constant must still draw at run time, anew on every run.
    from nncc.compiler import CompileOptions, compile_graph
    from nncc.frontend.onnx import parse_model
    from nncc.model import CompiledModel

    p = helper.make_tensor("p", onnx.TensorProto.FLOAT, [64], [0.5] * 64)
    nodes = [helper.make_node("Bernoulli", ["p"], ["b"]),
             helper.make_node("RandomUniformLike", ["p"], ["u"]),
             helper.make_node("Add", ["b", "x"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [64]),
         helper.make_tensor_value_info("u", onnx.TensorProto.FLOAT, [64])], initializer=[p])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)], ir_version=10)
    m = CompiledModel(compile_graph(parse_model(model.SerializeToString()), CompileOptions(opt_level=2)))
    x = np.zeros(64, np.float32)
    r1, r2 = m.run({"x": x}), m.run({"x": x})
    assert set(np.unique(r1["y"])) <= {0.0, 1.0}
    assert not np.array_equal(r1["u"], r2["u"])
    assert not np.array_equal(r1["y"], r2["y"])  # 2**-64 chance of a false failure
