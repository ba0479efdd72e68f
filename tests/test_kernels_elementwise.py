"""Elementwise, logic and reduction kernels: what the ONNX node suite does not cover.

Oracles: math.erf/math.erfc (Python's libm), brute-force Python definitions of the spec,
and onnxruntime on realistic shapes. Never the code under test.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx
import pytest

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import Ctx, resolve
from tests.one_node_graphs import one_node
from tests.oracle import ort_run

RNG = np.random.default_rng(20240521)


def run(op, *inputs, opset=18, nout=1, **attrs):
    k = resolve(op, "", opset)
    out = k.fn(Ctx(attrs, opset, nout), *inputs)
    return out


def infer(op, *infos, opset=18, nout=1, **attrs):
    return resolve(op, "", opset).shape(Ctx(attrs, opset, nout), *infos)


def info(dtype, shape, value=None):
    return TensorInfo(np.dtype(dtype), shape, value)


# --------------------------------------------------------------------------- Erf accuracy


def _erf_grid():
    dense = np.linspace(-7.0, 7.0, 140001)
    tiny = np.geomspace(1e-300, 1e-2, 2000)
    return np.concatenate([dense, tiny, -tiny, [0.0, 6.0 - 1e-9, 5.999, 4.0, 4.0 + 1e-12, 30.0]])


def test_erf_float64_matches_math_erf():
    x = _erf_grid()
    ref = np.array([math.erf(v) for v in x])
    got = run("Erf", x)
    assert got.dtype == np.float64
    rel = np.abs(got - ref) / np.maximum(np.abs(ref), np.finfo(np.float64).tiny)
    assert rel.max() < 1e-13


def test_erf_float32_matches_math_erf_within_one_ulp():
    x = _erf_grid().astype(np.float32)
    ref = np.array([math.erf(float(v)) for v in x])  # exact erf of the float32 inputs
    got = run("Erf", x)
    assert got.dtype == np.float32
    ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    assert np.all(np.abs(got.astype(np.float64) - ref) <= ulp)
    rel = np.abs(got - ref) / np.maximum(np.abs(ref), 1e-38)
    assert rel.max() < 1.2e-7


def test_erf_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-310], np.float64)
    got = run("Erf", x)
    assert got[0] == 0 and got[1] == 0 and np.signbit(got[1])
    assert got[2] == 1.0 and got[3] == -1.0
    assert np.isnan(got[4])
    assert got[5] == pytest.approx(2 / math.sqrt(math.pi) * 1e-310, rel=1e-12)


def test_erf_float16_and_shape_kept():
    x = RNG.standard_normal((3, 5, 7)).astype(np.float16)
    got = run("Erf", x)
    assert got.dtype == np.float16 and got.shape == x.shape
    ref = np.array([math.erf(float(v)) for v in x.ravel()]).reshape(x.shape)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=1e-3, atol=1e-4)


def test_gelu_exact_tail_uses_erfc_accuracy():
    # y = x * Phi(x) = 0.5 * x * erfc(-x / sqrt(2)): relative accuracy must hold in the
    # negative tail, where 1 + erf(x / sqrt(2)) would cancel catastrophically.
    x = np.concatenate([np.linspace(-37.0, 8.0, 20001), [-1e-300, 0.0]])
    ref = np.array([0.5 * v * math.erfc(-v / math.sqrt(2.0)) for v in x])
    got = run("Gelu", x, opset=20)
    nz = ref != 0
    rel = np.abs(got[nz] - ref[nz]) / np.abs(ref[nz])
    assert rel.max() < 1e-12
    assert np.all(got[~nz] == 0)


def test_gelu_tanh_formula_float64():
    x = np.linspace(-10, 10, 2001)
    ref = np.array([0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
                    for v in x])
    # (1 + tanh) cancels in the negative tail for any implementation of the formula: atol
    np.testing.assert_allclose(run("Gelu", x, opset=20, approximate="tanh"), ref, rtol=1e-13, atol=1e-14)


def test_gelu_rejects_unknown_approximation():
    with pytest.raises(KernelError, match="approximate"):
        run("Gelu", np.zeros(3, np.float32), opset=20, approximate="fast")


# --------------------------------------------------------------------------- shape functions


@pytest.mark.parametrize(
    "a, b, expected",
    [
        (("N", 3, 1), (1, 4), ("N", 3, 4)),
        (("N", 1), ("M",), ("N", "M")),
        (("N",), (5,), (5,)),
        (("N", "C"), ("N", "C"), ("N", "C")),
        (("N",), ("M",), (None,)),        # either may be 1: unknown
        ((None, 3), (2, 1), (2, 3)),
        ((), ("B", "S"), ("B", "S")),
        ((1,), (1, 1), (1, 1)),
    ],
)
def test_broadcast_shape_with_symbolic_dims(a, b, expected):
    for op, dtype in [("Add", np.float32), ("Mul", np.int64), ("Pow", np.float32)]:
        (out,) = infer(op, info(dtype, a), info(dtype, b), opset=14)
        assert out.shape == expected and out.dtype == dtype
    for op in ("Equal", "Less", "GreaterOrEqual"):
        (out,) = infer(op, info(np.float32, a), info(np.float32, b), opset=16)
        assert out.shape == expected and out.dtype == np.bool_


def test_broadcast_shape_unknown_rank_and_mismatch():
    (out,) = infer("Add", info(np.float32, None), info(np.float32, (3,)), opset=14)
    assert out.shape is None
    with pytest.raises(ShapeInferenceError):
        infer("Sub", info(np.float32, (2, 3)), info(np.float32, (4,)), opset=14)


def test_variadic_and_where_shapes():
    (out,) = infer("Sum", info(np.float32, ("N", 1, 4)), info(np.float32, (3, 1)),
                   info(np.float32, (4,)), opset=13)
    assert out.shape == ("N", 3, 4)
    (out,) = infer("Where", info(np.bool_, ("B", 1)), info(np.int64, (1, "S")),
                   info(np.int64, ()), opset=16)
    assert out.shape == ("B", "S") and out.dtype == np.int64


def test_pow_shape_keeps_base_dtype():
    (out,) = infer("Pow", info(np.float32, ("N", 8)), info(np.int64, ()), opset=15)
    assert out.dtype == np.float32 and out.shape == ("N", 8)


def test_legacy_broadcast_shape_is_a_shape():
    (out,) = infer("Add", info(np.float32, ("N", 3, 4, 5)), info(np.float32, (3, 4)),
                   opset=6, broadcast=1, axis=1)
    assert out.shape == ("N", 3, 4, 5)


def test_reduce_shapes_symbolic_and_axes_values():
    x = info(np.float32, ("B", "S", 768))
    (out,) = infer("ReduceMean", x, opset=13, axes=[-1])
    assert out.shape == ("B", "S", 1)
    (out,) = infer("ReduceMean", x, opset=13, axes=[0, 2], keepdims=0)
    assert out.shape == ("S",)
    (out,) = infer("ReduceSum", x, info(np.int64, (1,), np.array([1])), opset=13, keepdims=0)
    assert out.shape == ("B", 768)
    # axes input present but unknown: keepdims keeps the rank, dims unknown
    (out,) = infer("ReduceMax", info(np.float32, ("B", 1, 7)), info(np.int64, (2,)), opset=18)
    assert out.shape == (None, 1, None)
    # ... and without keepdims, a static axes length still gives the rank
    (out,) = infer("ReduceMax", x, info(np.int64, (2,)), opset=18, keepdims=0)
    assert out.shape == (None,)
    # omitted axes: all reduced, or the identity with noop_with_empty_axes
    (out,) = infer("ReduceSum", x, None, opset=13, keepdims=0)
    assert out.shape == ()
    (out,) = infer("ReduceSum", x, info(np.int64, (0,), np.zeros(0, np.int64)),
                   opset=13, noop_with_empty_axes=1)
    assert out.shape == ("B", "S", 768)
    with pytest.raises(ShapeInferenceError):
        infer("ReduceL2", x, opset=13, axes=[3])


def test_arg_topk_cumsum_shapes():
    x = info(np.float32, ("B", 1000))
    (out,) = infer("ArgMax", x, opset=13, axis=1, keepdims=0)
    assert out.shape == ("B",) and out.dtype == np.int64
    vals, idx = infer("TopK", x, info(np.int64, (1,), np.array([5])), opset=11, nout=2)
    assert vals.shape == ("B", 5) and vals.dtype == np.float32 and idx.dtype == np.int64
    vals, idx = infer("TopK", x, info(np.int64, (1,)), opset=11, nout=2)
    assert vals.shape == ("B", None) and idx.shape == ("B", None)
    vals, _ = infer("TopK", info(np.float32, (4, 6)), opset=9, nout=2, k=2, axis=0)
    assert vals.shape == (2, 6)
    with pytest.raises(ShapeInferenceError):
        infer("TopK", info(np.float32, (4, 6)), info(np.int64, (1,), np.array([7])), opset=11, nout=2)
    (out,) = infer("CumSum", x, info(np.int64, (), np.array(1)), opset=14)
    assert out.shape == ("B", 1000)


def test_softmax_shape_checks_axis():
    (out,) = infer("Softmax", info(np.float32, ("B", 12, "S", "S")), opset=13)
    assert out.shape == ("B", 12, "S", "S")
    with pytest.raises(ShapeInferenceError):
        infer("Softmax", info(np.float32, (2, 3)), opset=13, axis=2)


def test_shape_functions_propagate_small_known_values():
    shape = info(np.int64, (2,), np.array([8, 3]))
    two = info(np.int64, (), np.array(2))
    (out,) = infer("Mul", shape, two, opset=14)
    np.testing.assert_array_equal(out.value, [16, 6])
    assert out.value.dtype == np.int64
    (out,) = infer("Div", info(np.int64, (2,), np.array([-7, 7])), two, opset=14)
    np.testing.assert_array_equal(out.value, [-3, 3])  # C truncation
    (out,) = infer("Equal", shape, info(np.int64, (2,), np.array([8, 0])), opset=13)
    np.testing.assert_array_equal(out.value, [True, False])
    (out,) = infer("ReduceProd", shape, opset=13, keepdims=0)
    assert out.value == 24 and out.value.dtype == np.int64
    (out,) = infer("Where", info(np.bool_, (2,), np.array([True, False])), shape,
                   info(np.int64, (2,), np.array([-1, -1])), opset=16)
    np.testing.assert_array_equal(out.value, [8, -1])
    # unknown or large inputs: no value
    (out,) = infer("Add", shape, info(np.int64, (2,)), opset=14)
    assert out.value is None
    big = info(np.float32, (1000,), np.zeros(1000, np.float32))
    (out,) = infer("Add", big, big, opset=14)
    assert out.value is None


# --------------------------------------------------------------------------- semantics vs spec


def test_integer_div_truncates_toward_zero():
    a = RNG.integers(-50, 50, 200)
    b = RNG.integers(-7, 8, 200)
    b[b == 0] = 3
    for dtype in (np.int8, np.int32, np.int64):
        got = run("Div", a.astype(dtype), b.astype(dtype), opset=14)
        assert got.dtype == dtype
        assert got.tolist() == [math.trunc(x / y) for x, y in zip(a.tolist(), b.tolist())]
    got = run("Div", np.array([7, 200], np.uint8), np.array([2, 3], np.uint8), opset=14)
    assert got.dtype == np.uint8 and got.tolist() == [3, 66]
    # two 0-d operands (shape arithmetic: a size from Shape -> Gather over a constant)
    got = run("Div", np.array(-30, np.int64), np.array(7, np.int64), opset=14)
    assert got.shape == () and got.dtype == np.int64 and int(got) == -4


def test_mod_signs():
    a = np.array([-7, 7, -7, 7, 0], np.int32)
    b = np.array([3, -3, -3, 3, -2], np.int32)
    assert run("Mod", a, b, opset=13).tolist() == [x % y for x, y in zip(a.tolist(), b.tolist())]
    assert run("Mod", a, b, opset=13, fmod=1).tolist() == [int(math.fmod(x, y)) for x, y in zip(a.tolist(), b.tolist())]
    af, bf = a.astype(np.float32), b.astype(np.float32)
    np.testing.assert_array_equal(run("Mod", af, bf, opset=13, fmod=1),
                                  [math.fmod(x, y) for x, y in zip(af.tolist(), bf.tolist())])
    with pytest.raises(KernelError, match="fmod"):
        run("Mod", a, b, opset=13, fmod=2)


def test_pow_mixed_dtypes_and_negative_integer_exponents():
    got = run("Pow", np.array([1.5, -2.0], np.float32), np.array([2, 3], np.int64), opset=15)
    assert got.dtype == np.float32 and got.tolist() == [2.25, -8.0]
    got = run("Pow", np.array([2, 3, -2], np.int32), np.array([0.5, 2.0, 3.0], np.float32), opset=15)
    assert got.dtype == np.int32 and got.tolist() == [1, 9, -8]  # truncation of 1.414
    got = run("Pow", np.array([2, 1, -1, -1, 5], np.int64), np.array([-1, -4, -3, -2, 0], np.int64), opset=15)
    assert got.dtype == np.int64 and got.tolist() == [0, 1, -1, 1, 1]
    x = RNG.standard_normal(50).astype(np.float32)
    for e in (2.0, 0.5, 3.0, 1.0, -1.5):
        got = run("Pow", np.abs(x), np.array(e, np.float32), opset=15)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, [abs(float(v)) ** e for v in x], rtol=1e-6)


def test_elementwise_keep_dtype_without_upcast():
    ops = ["Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Selu", "Softplus", "HardSigmoid",
           "HardSwish", "Erf", "Exp", "Log", "Sqrt", "Neg", "Abs", "Reciprocal", "Floor", "Ceil",
           "Softmax", "LogSoftmax", "Gelu"]
    for dtype in (np.float16, np.float32):
        x = (np.abs(RNG.standard_normal((2, 3, 4))) + 0.1).astype(dtype)
        for op in ops:
            assert run(op, x, opset=20).dtype == dtype, op
        for op in ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean"):
            assert run(op, x, x[0], opset=20).dtype == dtype, op


def test_integer_activations_and_clip():
    x = np.array([-5, -1, 0, 3, 120], np.int8)
    assert run("Relu", x, opset=14).tolist() == [0, 0, 0, 3, 120]
    got = run("Clip", x, np.array(-2, np.int8), np.array(100, np.int8), opset=13)
    assert got.dtype == np.int8 and got.tolist() == [-2, -1, 0, 3, 100]
    got = run("Clip", x, None, np.array(0, np.int8), opset=13)
    assert got.tolist() == [-5, -1, 0, 0, 0]
    xf = np.array([-3.0, 0.5, np.nan, 9.0], np.float32)
    got = run("Clip", xf, opset=6, min=-1.0, max=2.0)
    assert got[0] == -1 and got[1] == 0.5 and np.isnan(got[2]) and got[3] == 2
    got = run("Clip", xf, np.array(3, np.float32), np.array(1, np.float32), opset=13)
    assert got[0] == 1 and got[3] == 1  # min > max: every value becomes max
    with pytest.raises(KernelError):
        run("Clip", xf, np.array([0, 1], np.float32), None, opset=13)


def test_legacy_broadcast_with_axis():
    a = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = RNG.standard_normal((3, 4)).astype(np.float32)
    got = run("Add", a, b, opset=6, broadcast=1, axis=1)
    np.testing.assert_array_equal(got, a + b[None, :, :, None])
    c = RNG.standard_normal((2,)).astype(np.float32)
    np.testing.assert_array_equal(run("Mul", a, c, opset=6, broadcast=1, axis=0),
                                  a * c[:, None, None, None])
    d = RNG.standard_normal((5,)).astype(np.float32)  # suffix matching without axis
    np.testing.assert_array_equal(run("Sub", a, d, opset=6, broadcast=1), a - d)
    got = run("Greater", a, b, opset=1, broadcast=1, axis=1)
    np.testing.assert_array_equal(got, a > b[None, :, :, None])


def test_prelu_old_opset_per_channel_slope():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    slope = np.array([0.1, 0.2, 0.3], np.float32)
    got = run("PRelu", x, slope, opset=6)
    expected = np.where(x < 0, x * slope[None, :, None, None], x)
    np.testing.assert_array_equal(got, expected)


def test_softmax_opset11_coerces_to_2d():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float64)
    got = run("Softmax", x, opset=11, axis=1)
    flat = x.reshape(2, 12)
    e = np.array([[math.exp(v - max(row)) for v in row] for row in flat.tolist()])
    np.testing.assert_allclose(got, (e / e.sum(1, keepdims=True)).reshape(2, 3, 4), rtol=1e-13)
    got13 = run("Softmax", x, opset=13, axis=1)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(got13, e / e.sum(1, keepdims=True), rtol=1e-13)


def test_softmax_is_stable_for_huge_logits():
    x = np.array([[1e4, 1e4 - 1, -1e4], [-1e30, -1e30, -1e30]], np.float32)
    got = run("Softmax", x, opset=13)
    e = math.exp(-1)
    np.testing.assert_allclose(got[0], [1 / (1 + e), e / (1 + e), 0], rtol=1e-6)
    np.testing.assert_allclose(got[1], [1 / 3] * 3, rtol=1e-6)
    lg = run("LogSoftmax", x, opset=13)
    assert np.all(np.isfinite(lg[0, :2])) and lg[0, 0] == pytest.approx(-math.log1p(e), rel=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape, axis, opset", [((3, 5, 40), -1, 13), ((3, 5, 7), 1, 13),
                                                ((2, 3, 4), 1, 11)])
def test_softmax_16bit_rounds_each_node_of_its_function_body(dtype, shape, axis, opset):
    """Softmax is defined by a function body (ReduceMax, Sub, Exp, ReduceSum, Div); in a
    16-bit type each of those nodes' results is rounded to the type, as in ONNX's stored
    results for these types. Oracle: onnx's reference evaluator."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    if dtype == "float16":
        np_dtype = np.dtype(np.float16)
    else:
        np_dtype = np.dtype(ml_dtypes.bfloat16)
    elem = onnx.TensorProto.FLOAT16 if dtype == "float16" else onnx.TensorProto.BFLOAT16
    x = (RNG.standard_normal(shape) * 3).astype(np_dtype)
    # before opset 13 the input is coerced to 2-D at axis: the oracle runs on that matrix
    x_ref = x if opset >= 13 else x.reshape(math.prod(shape[:axis]), -1)
    node = helper.make_node("Softmax", ["x"], ["y"], axis=axis if opset >= 13 else 1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, x_ref.shape)],
                              [helper.make_tensor_value_info("y", elem, x_ref.shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x_ref})
    expected = expected.reshape(shape)
    got = run("Softmax", x, opset=opset, axis=axis)
    assert got.dtype == np_dtype and got.shape == shape
    np.testing.assert_array_equal(got.astype(np.float32), expected.astype(np.float32))


def test_empty_reductions_give_spec_identities():
    f = np.zeros((2, 0, 3), np.float32)
    i = np.zeros((2, 0), np.int32)
    cases = {
        "ReduceSum": 0, "ReduceL1": 0, "ReduceL2": 0, "ReduceSumSquare": 0, "ReduceProd": 1,
        "ReduceMax": -np.inf, "ReduceMin": np.inf, "ReduceLogSumExp": -np.inf,
    }
    for op, value in cases.items():
        got = run(op, f, np.array([1], np.int64), opset=18, keepdims=0)
        assert got.shape == (2, 3) and got.dtype == np.float32
        assert np.all(got == value), op
    assert run("ReduceMax", i, np.array([1], np.int64), opset=18).tolist() == [[np.iinfo(np.int32).min]] * 2
    assert run("ReduceMin", i, np.array([1], np.int64), opset=18).tolist() == [[np.iinfo(np.int32).max]] * 2


def test_reduce_noop_and_integer_accumulation():
    x = np.full((4, 100), 2 ** 24, np.int32)
    got = run("ReduceSum", x, np.array([1], np.int64), opset=13)
    assert got.dtype == np.int32 and got.shape == (4, 1)
    got = run("ReduceSum", x[:, :3], None, opset=13, noop_with_empty_axes=1)
    np.testing.assert_array_equal(got, x[:, :3])
    got = run("ReduceMean", np.array([[-1, -2, -2]], np.int64), opset=13, axes=[1])
    assert got.tolist() == [[-1]]  # -5/3 truncated
    with pytest.raises(KernelError):
        run("ReduceSum", x, np.array([1, -1], np.int64), opset=13)


def test_argmax_select_last_index():
    x = np.array([[1, 3, 3, 0], [2, 2, 1, 2]], np.int64)
    assert run("ArgMax", x, opset=13, axis=1).tolist() == [[1], [0]]
    assert run("ArgMax", x, opset=13, axis=1, select_last_index=1, keepdims=0).tolist() == [2, 3]
    assert run("ArgMin", x, opset=13, axis=0, select_last_index=1).tolist() == [[0, 1, 1, 0]]
    with pytest.raises(KernelError):
        run("ArgMax", np.zeros((2, 0)), opset=13, axis=1)


def _topk_oracle(row, k, largest):
    order = sorted(range(len(row)), key=lambda i: ((-row[i] if largest else row[i]), i))[:k]
    return [row[i] for i in order], order


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("n, k", [(7, 3), (300, 5), (300, 300), (1000, 64), (50, 0)])
def test_topk_ties_lower_index_first(n, k, largest):
    x = RNG.integers(-4, 5, (3, n)).astype(np.int64)  # many ties
    vals, idx = run("TopK", x, np.array([k], np.int64), opset=11, nout=2, largest=largest)
    assert vals.dtype == np.int64 and idx.dtype == np.int64 and vals.shape == (3, k)
    for row, v, i in zip(x.tolist(), vals.tolist(), idx.tolist()):
        ev, ei = _topk_oracle(row, k, largest)
        assert v == ev and i == ei


def test_topk_float_axis0_and_errors():
    x = RNG.standard_normal((500, 4)).astype(np.float32)
    x[10, :] = x[20, :]  # exact ties across rows
    vals, idx = run("TopK", x, np.array([7], np.int64), opset=11, nout=2, axis=0)
    for c in range(4):
        ev, ei = _topk_oracle(x[:, c].tolist(), 7, True)
        assert vals[:, c].tolist() == ev and idx[:, c].tolist() == ei
    with pytest.raises(KernelError, match="k"):
        run("TopK", x, np.array([501], np.int64), opset=11, nout=2, axis=0)


def test_cumsum_exclusive_reverse_against_python():
    x = RNG.integers(-9, 9, (3, 70, 2)).astype(np.int32)
    for axis in (0, 1, -1):
        for exclusive in (0, 1):
            for reverse in (0, 1):
                got = run("CumSum", x, np.array(axis, np.int32), opset=14,
                          exclusive=exclusive, reverse=reverse)
                assert got.dtype == np.int32
                xm = np.moveaxis(x, axis, 0).tolist()
                n = len(xm)
                exp = np.zeros(np.moveaxis(x, axis, 0).shape, np.int64)
                for j in range(n):
                    src = range(j, n) if reverse else range(0, j + 1)
                    src = [s for s in src if not (exclusive and s == j)]
                    exp[j] = sum(np.array(xm[s]) for s in src) if src else 0
                np.testing.assert_array_equal(np.moveaxis(got, axis, 0), exp)


# --------------------------------------------------------------------------- onnxruntime




def _ort(op, inputs, attrs, opset, nout=1):
    model, feeds, _ = one_node(op, inputs, nout, attrs, opset)
    return ort_run(model, feeds)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


ORT_CASES = [
    ("Softmax", [_f32(2, 12, 64, 64)], {}, 13),
    ("Softmax", [_f32(2, 12, 64, 64)], {"axis": 1}, 13),
    ("Softmax", [_f32(4, 8, 50)], {"axis": 1}, 11),
    ("LogSoftmax", [_f32(8, 1000) * 10], {}, 13),
    ("Gelu", [_f32(2, 128, 768) * 3], {}, 20),
    ("Gelu", [_f32(2, 128, 768) * 3], {"approximate": "tanh"}, 20),
    ("Erf", [_f32(2, 128, 768) * 2], {}, 13),
    ("Sigmoid", [_f32(2, 64, 28, 28) * 8], {}, 13),
    ("HardSwish", [_f32(2, 64, 28, 28) * 4], {}, 14),
    ("LeakyRelu", [_f32(2, 64, 28, 28)], {"alpha": 0.1}, 16),
    ("Elu", [_f32(2, 64, 28, 28)], {}, 6),
    ("Softplus", [_f32(2, 64, 28, 28) * 20], {}, 1),
    ("Clip", [_f32(2, 64, 28, 28) * 4, np.array(0, np.float32), np.array(6, np.float32)], {}, 13),
    ("PRelu", [_f32(2, 64, 28, 28), _f32(64, 1, 1)], {}, 16),
    ("Div", [_f32(2, 128, 768), _f32(2, 128, 1) + 3], {}, 14),
    ("Pow", [np.abs(_f32(2, 128, 768)), np.array(2.0, np.float32)], {}, 15),
    ("Pow", [np.abs(_f32(2, 128, 768)), _f32(768)], {}, 15),
    ("Max", [_f32(2, 64, 28, 28), _f32(64, 1, 1), _f32(28)], {}, 13),
    ("Mean", [_f32(2, 64, 28, 28), _f32(64, 1, 1), _f32(28)], {}, 13),
    ("Where", [_f32(2, 128, 768) > 0, _f32(2, 128, 768), _f32(768)], {}, 16),
    ("ReduceMean", [_f32(2, 128, 768)], {"axes": [-1]}, 13),
    ("ReduceMean", [_f32(2, 64, 28, 28), np.array([2, 3], np.int64)], {}, 18),
    ("ReduceSum", [_f32(2, 64, 28, 28), np.array([1], np.int64)], {"keepdims": 0}, 13),
    ("ReduceL2", [_f32(2, 64, 28, 28)], {"axes": [1]}, 13),
    ("ReduceLogSumExp", [_f32(8, 1000) * 30, np.array([1], np.int64)], {}, 18),
    ("ReduceMax", [_f32(2, 64, 28, 28), np.array([0, 2], np.int64)], {"keepdims": 0}, 18),
    ("ArgMax", [_f32(8, 1000)], {"axis": 1}, 13),
    ("CumSum", [_f32(2, 128, 768), np.array(1, np.int64)], {"reverse": 1}, 14),
]


@pytest.mark.parametrize("op, inputs, attrs, opset", ORT_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(ORT_CASES)])
def test_against_onnxruntime(op, inputs, attrs, opset):
    (expected,) = _ort(op, inputs, attrs, opset)
    got = run(op, *inputs, opset=opset, **attrs)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("shape, k, axis", [((4, 1000), 10, -1), ((1, 25200), 100, 1),
                                            ((300, 6), 50, 0)])
def test_topk_against_onnxruntime(shape, k, axis):
    x = _f32(*shape)
    inputs = [x, np.array([k], np.int64)]
    ev, ei = _ort("TopK", inputs, {"axis": axis}, 11, nout=2)
    gv, gi = run("TopK", *inputs, opset=11, nout=2, axis=axis)
    np.testing.assert_array_equal(gv, ev)
    np.testing.assert_array_equal(gi, ei)
