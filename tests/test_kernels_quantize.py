"""Quantization kernels against onnxruntime.

Each case builds a one-node model with onnx.helper (data as graph inputs, scales and zero
points as initializers, as quantizers write them), runs it in onnxruntime and in nncc by
both routes (the interpreter, and compile_graph at -O2 with its plan and executor), and
requires the same results: bit for bit for quantized outputs, where the rounding (half to
even) and the saturation are what is being checked.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

from nncc.compiler import CompileOptions, compile_graph
from nncc.errors import KernelError, ShapeInferenceError
from nncc.frontend.onnx import parse_model
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import Ctx, resolve
from nncc.model import CompiledModel
from nncc.runtime.interpreter import Interpreter
from tests.oracle import ort_run

RNG = np.random.default_rng(2024)


def _elem(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def build(op, inputs, consts, attrs=None, opset=21, n_out=1, domain="", cast_to=None):
    """inputs: {name: array} fed at run time; consts: {name: array or None} initializers.
    The node's inputs are both, in the order given (inputs first unless ``_order``).
    ``cast_to`` appends a Cast of the output (onnxruntime returns no 4-bit arrays)."""
    names = list(inputs) + list(consts)
    order = attrs.pop("_order", None) if attrs else None
    names = order or names
    outputs = [f"y{i}" for i in range(n_out)]
    nodes = [helper.make_node(op, names, ["q0"] if cast_to else outputs, domain=domain, **(attrs or {}))]
    if cast_to:
        nodes.append(helper.make_node("Cast", ["q0"], ["y0"], to=cast_to))
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, _elem(a.dtype), a.shape) for n, a in inputs.items()],
        [helper.make_empty_tensor_value_info(f"y{i}") for i in range(n_out)],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in consts.items() if a is not None],
    )
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def run_nncc(model, feeds):
    graph = parse_model(model.SerializeToString())
    interpreted = Interpreter(graph).run(feeds)
    compiled = CompiledModel(compile_graph(graph, CompileOptions(opt_level=2))).run(feeds)
    return [[r[n] for n in graph.outputs] for r in (interpreted, compiled)]


def same(got, expected, atol=0.0):
    got = np.asarray(got)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if expected.dtype.kind == "f" or expected.dtype.name.startswith(("float", "bfloat")):
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=1e-6, atol=atol)
    else:
        np.testing.assert_array_equal(got, expected)


def check(op, inputs, consts, attrs=None, opset=21, n_out=1, domain="", atol=0.0, cast_to=None, expected=None):
    """nncc's interpreter and compiled plan against ``expected``, by default onnxruntime's
    outputs (an integer product's exact value where its kernel is not exact: see
    exact_matmul_integer)."""
    model = build(op, inputs, consts, dict(attrs or {}), opset, n_out, domain, cast_to)
    expected = ort_run(model, inputs) if expected is None else expected
    for route in run_nncc(model, inputs):
        assert len(route) == n_out
        for got, want in zip(route, expected):
            same(got, want, atol)
    return expected


def exact_matmul_integer(a, b, a_zero=0, b_zero=0) -> np.ndarray:
    """MatMulInteger as ONNX defines it, (A - a_zero) @ (B - b_zero) in int64 (a scalar or
    per-column b_zero), as int32. onnxruntime's MatMulInteger on x86 CPUs without VNNI adds
    uint8 x int8 byte products in saturating int16 pairs (vpmaddubsw), and is then off by
    thousands on full-range weights, whatever its session options say."""
    product = np.matmul(np.asarray(a).astype(np.int64) - np.asarray(a_zero).astype(np.int64),
                        np.asarray(b).astype(np.int64) - np.asarray(b_zero).astype(np.int64))
    return product.astype(np.int32)


def exact_conv_integer(x, w, x_zero=0, pad=1) -> np.ndarray:
    """ConvInteger as ONNX defines it (stride 1, square padding of ``x_zero``), in int64."""
    n, c, h, width = x.shape
    m, _, kh, kw = w.shape
    padded = np.pad(np.asarray(x).astype(np.int64) - int(x_zero), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out = np.zeros((n, m, h + 2 * pad - kh + 1, width + 2 * pad - kw + 1), np.int64)
    for i in range(kh):
        for j in range(kw):
            window = padded[:, :, i:i + out.shape[2], j:j + out.shape[3]]
            out += np.einsum("nchw,mc->nmhw", window, w[:, :, i, j].astype(np.int64))
    return out.astype(np.int32)


def ties(n, scale):
    """Values whose quotient by ``scale`` is exactly k + 0.5, and large ones that saturate."""
    halves = (np.arange(-n, n) + 0.5) * scale
    return np.concatenate([halves, [1e6, -1e6, 0.0, -0.0]]).astype(np.float32)


# ---------------------------------------------------------------------- QuantizeLinear


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.int16])
def test_quantize_per_tensor_rounds_half_to_even_and_saturates(dtype):
    x = ties(300, 0.5)
    zero = np.array(3 if np.dtype(dtype).kind == "u" else -3, dtype=dtype)
    out = check("QuantizeLinear", {"x": x}, {"s": np.float32(0.5), "z": zero}, opset=21)[0]
    assert out.min() == np.iinfo(dtype).min or dtype in (np.uint16, np.int16)
    assert out.max() == np.iinfo(dtype).max


@pytest.mark.parametrize("opset", [10, 13, 19])
def test_quantize_older_opsets(opset):
    x = ties(40, 0.25).reshape(-1, 2) if opset >= 13 else ties(40, 0.25)
    check("QuantizeLinear", {"x": x}, {"s": np.float32(0.25), "z": np.uint8(128)}, opset=opset)
    check("QuantizeLinear", {"x": x}, {"s": np.float32(0.25)}, opset=opset)  # uint8, zero 0


def test_quantize_per_axis_and_negative_axis():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32) * 50
    scale = np.array([0.1, 0.5, 2.0], np.float32)
    zero = np.array([-1, 0, 7], np.int8)
    check("QuantizeLinear", {"x": x}, {"s": scale, "z": zero}, {"axis": 1}, opset=13)
    scale4 = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    check("QuantizeLinear", {"x": x}, {"s": scale4, "z": np.zeros(4, np.uint8)}, {"axis": -1}, opset=19)


@pytest.mark.parametrize("block", [2, 3])
def test_quantize_blocked(block):
    x = RNG.standard_normal((3, 7)).astype(np.float32) * 20
    blocks = -(-7 // block)
    scale = RNG.uniform(0.05, 0.5, (3, blocks)).astype(np.float32)
    zero = RNG.integers(-5, 5, (3, blocks)).astype(np.int8)
    check("QuantizeLinear", {"x": x}, {"s": scale, "z": zero}, {"axis": 1, "block_size": block}, opset=21)


@pytest.mark.parametrize("dtype", [ml_dtypes.int4, ml_dtypes.uint4])
def test_quantize_to_4_bits(dtype):
    x = ties(12, 1.0)
    zero = np.array(1 if dtype == ml_dtypes.int4 else 8, dtype=dtype)
    out = check("QuantizeLinear", {"x": x}, {"s": np.float32(1.0), "z": zero}, opset=21,
                cast_to=TensorProto.INT8)[0]
    lo, hi = (-8, 7) if dtype == ml_dtypes.int4 else (0, 15)
    assert out.min() == lo and out.max() == hi


@pytest.mark.parametrize("dtype", [ml_dtypes.int4, ml_dtypes.uint4])
def test_quantize_to_4_bits_kernel_output(dtype):
    # the 4-bit array itself, without the Cast the onnxruntime comparison needs
    x = np.array([-100.0, -2.5, -1.5, 0.5, 1.5, 2.5, 100.0], np.float32)
    got = resolve("QuantizeLinear", "", 21).fn(Ctx({}, 21), x, np.float32(1.0), np.zeros((), dtype))
    assert got.dtype == np.dtype(dtype)
    want = [-8, -2, -2, 0, 2, 2, 7] if dtype == ml_dtypes.int4 else [0, 0, 0, 0, 2, 2, 15]
    np.testing.assert_array_equal(got.astype(np.int32), want)


def test_quantize_output_dtype_without_zero_point():
    x = ties(100, 0.5)
    out = check("QuantizeLinear", {"x": x}, {"s": np.float32(0.5)}, {"output_dtype": TensorProto.INT8}, opset=21)[0]
    assert out.dtype == np.int8


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2])
def test_quantize_to_float8(dtype, saturate):
    x = np.array([0.3, -2.7, 1000.0, -1e6, 1e5, np.inf, -np.inf, np.nan, 0.0, 17.0], np.float32)
    zero = np.zeros((), dtype=dtype)
    # onnxruntime returns no float8 arrays: both results go through an exact Cast to float
    model = build("QuantizeLinear", {"x": x}, {"s": np.float32(2.0), "z": zero}, {"saturate": saturate}, 19,
                  cast_to=TensorProto.FLOAT)
    expected = ort_run(model, {"x": x})[0]
    for got, in run_nncc(model, {"x": x}):
        assert got.dtype == expected.dtype
        assert got.tobytes() == expected.tobytes()  # the same bits: NaN, infinities, -0
    kernel = resolve("QuantizeLinear", "", 19)
    direct = kernel.fn(Ctx({"saturate": saturate}, 19), x, np.float32(2.0), zero)
    assert direct.dtype == np.dtype(dtype)
    assert direct.astype(np.float32).tobytes() == expected.tobytes()


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_quantize_nan_and_infinities(dtype):
    x = np.array([np.nan, np.inf, -np.inf, 1.0, -np.nan], np.float32)
    check("QuantizeLinear", {"x": x}, {"s": np.float32(0.5), "z": np.array(3, dtype)}, opset=19)


def test_quantize_precision_attribute_divides_in_float16():
    # onnxruntime has no `precision`: ONNX's reference evaluator is the oracle
    from onnx.reference import ReferenceEvaluator

    x = (RNG.standard_normal(200) * 40).astype(np.float32)
    model = build("QuantizeLinear", {"x": x}, {"s": np.float32(0.3), "z": np.int8(1)},
                  {"precision": TensorProto.FLOAT16}, opset=23)
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    for got, in run_nncc(model, {"x": x}):
        same(got, expected)


def test_quantize_float16_input():
    x = (RNG.standard_normal(50) * 30).astype(np.float16)
    check("QuantizeLinear", {"x": x}, {"s": np.float16(0.25), "z": np.int8(2)}, opset=19)


# --------------------------------------------------------------------- DequantizeLinear


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.int16, np.int32])
def test_dequantize_per_tensor(dtype):
    info = np.iinfo(dtype)
    x = RNG.integers(max(info.min, -(2**20)), min(info.max, 2**20), 64, endpoint=True).astype(dtype)
    consts = {"s": np.float32(0.037)}
    if dtype != np.int32:
        consts["z"] = np.array(info.min // 3 + info.max // 5, dtype=dtype)
    check("DequantizeLinear", {"x": x}, consts, opset=21)


def test_dequantize_extremes_exactly():
    x = np.array([0, 255, 128, 1], np.uint8)
    out = check("DequantizeLinear", {"x": x}, {"s": np.float32(0.5), "z": np.uint8(128)}, opset=10)[0]
    np.testing.assert_array_equal(out, [-64.0, 63.5, 0.0, -63.5])


def test_dequantize_per_axis_blocked_and_float16_scale():
    x = RNG.integers(-128, 128, (4, 6)).astype(np.int8)
    check("DequantizeLinear", {"x": x}, {"s": RNG.uniform(0.01, 1, 4).astype(np.float32),
                                         "z": RNG.integers(-3, 3, 4).astype(np.int8)}, {"axis": 0}, opset=13)
    check("DequantizeLinear", {"x": x}, {"s": RNG.uniform(0.01, 1, (4, 2)).astype(np.float32),
                                         "z": RNG.integers(-3, 3, (4, 2)).astype(np.int8)},
          {"axis": 1, "block_size": 4}, opset=21)
    check("DequantizeLinear", {"x": x}, {"s": np.float16(0.125), "z": np.int8(-4)}, opset=19)


def test_dequantize_output_dtype():
    x = RNG.integers(-128, 128, (3, 8)).astype(np.int8)
    out = check("DequantizeLinear", {"x": x}, {"s": np.float32(0.0123), "z": np.int8(5)},
                {"output_dtype": TensorProto.FLOAT16}, opset=23)[0]
    assert out.dtype == np.float16


@pytest.mark.parametrize("dtype", [ml_dtypes.int4, ml_dtypes.uint4])
def test_dequantize_4_bits(dtype):
    values = np.arange(-8, 8) if dtype == ml_dtypes.int4 else np.arange(16)
    x = values.astype(dtype).reshape(4, 4)  # an initializer: onnxruntime takes no 4-bit feeds
    check("DequantizeLinear", {}, {"x": x, "s": np.float32(0.75), "z": np.array(3, dtype)}, opset=21)


def test_dequantize_float8():
    x = np.array([0.5, -448, 448, 3.25, 0, -0.0], np.float32).astype(ml_dtypes.float8_e4m3fn)
    check("DequantizeLinear", {}, {"x": x, "s": np.float32(0.1)}, opset=19)  # no float8 feeds in onnxruntime


# ---------------------------------------------------------------- DynamicQuantizeLinear


@pytest.mark.parametrize("x", [
    RNG.standard_normal((3, 17)).astype(np.float32) * 4,
    np.abs(RNG.standard_normal(20)).astype(np.float32) + 1,  # all positive: zero point 0
    -np.abs(RNG.standard_normal(20)).astype(np.float32) - 1,  # all negative: zero point 255
    np.zeros(5, np.float32),  # no range at all: scale 1
], ids=["mixed", "positive", "negative", "zeros"])
def test_dynamic_quantize(x):
    check("DynamicQuantizeLinear", {"x": x}, {}, opset=11, n_out=3)


# ------------------------------------------------------------------------ MatMulInteger


@pytest.mark.parametrize("a_type, b_type", [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)])
def test_matmul_integer(a_type, b_type):
    a = RNG.integers(np.iinfo(a_type).min, np.iinfo(a_type).max, (5, 33), endpoint=True).astype(a_type)
    b = RNG.integers(np.iinfo(b_type).min, np.iinfo(b_type).max, (33, 7), endpoint=True).astype(b_type)
    check("MatMulInteger", {"a": a, "b": b}, {"az": np.array(17, a_type), "bz": np.array(3, b_type)}, opset=10,
          expected=[exact_matmul_integer(a, b, 17, 3)])
    check("MatMulInteger", {"a": a, "b": b}, {}, opset=10, expected=[exact_matmul_integer(a, b)])  # no zero points


def test_matmul_integer_per_column_zero_points_batched():
    a = RNG.integers(0, 256, (2, 4, 9)).astype(np.uint8)
    b = RNG.integers(-128, 128, (9, 6)).astype(np.int8)
    b_zero = RNG.integers(-5, 5, 6).astype(np.int8)
    check("MatMulInteger", {"a": a, "b": b}, {"az": np.uint8(77), "bz": b_zero}, opset=10,
          expected=[exact_matmul_integer(a, b, 77, b_zero)])


def test_matmul_integer_per_row_zero_point():
    # Neither onnxruntime nor ONNX's reference evaluator takes a per-row zero point for A;
    # the oracle is the definition, (A - zero[:, None]) @ B, in python integers.
    a = RNG.integers(0, 256, (4, 9)).astype(np.uint8)
    b = RNG.integers(-128, 128, (9, 6)).astype(np.int8)
    zero = RNG.integers(0, 256, 4).astype(np.uint8)
    model = build("MatMulInteger", {"a": a, "b": b}, {"az": zero}, opset=10)
    rows = [[int(v) - int(z) for v in row] for row, z in zip(a.tolist(), zero.tolist())]
    expected = np.array([[sum(r * int(b[k, j]) for k, r in enumerate(row)) for j in range(6)] for row in rows],
                        np.int32)
    for got, in run_nncc(model, {"a": a, "b": b}):
        same(got, expected)


def test_integer_products_in_float32_chunks_are_exact():
    # reductions of 1000 and 576 products whose sums pass 2**24, where float32 stops holding
    # every integer: nncc multiplies in float32 chunks short enough to stay exact
    a = RNG.integers(0, 256, (4, 1000)).astype(np.uint8)
    a[0] = 255
    b = RNG.integers(-128, 128, (1000, 6)).astype(np.int8)
    b[:, 0] = -127  # odd products: sums past 2**24 that float32 would round
    check("MatMulInteger", {"a": a, "b": b}, {"az": np.uint8(0), "bz": np.int8(0)}, opset=10,
          expected=[exact_matmul_integer(a, b)])
    x = RNG.integers(0, 256, (1, 64, 6, 6)).astype(np.uint8)
    x[0, :, :3] = 255
    w = RNG.integers(-128, 128, (5, 64, 3, 3)).astype(np.int8)
    w[0] = 127
    check("ConvInteger", {"x": x, "w": w}, {"xz": np.uint8(0)}, {"pads": [1, 1, 1, 1]}, opset=10,
          expected=[exact_conv_integer(x, w)])


def test_matmul_integer_long_reduction_is_exact():
    # 70000 products of up to 255 * 255: beyond what int32 can accumulate without overflow
    # in general, so nncc accumulates in int64; these sums still fit int32, and must match.
    a = np.full((2, 70000), 255, np.uint8)
    a[1, ::2] = 0
    b = RNG.integers(0, 256, (70000, 3)).astype(np.uint8)
    check("MatMulInteger", {"a": a, "b": b}, {"az": np.uint8(250), "bz": np.uint8(200)}, opset=10)


# ---------------------------------------------------------------------- QLinearMatMul


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("shapes", [((4, 9), (9, 5)), ((2, 3, 8), (8, 4)), ((2, 3, 8), (2, 8, 4))])
def test_qlinear_matmul(dtype, shapes):
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, shapes[0], endpoint=True).astype(dtype)
    b = RNG.integers(info.min, info.max, shapes[1], endpoint=True).astype(dtype)
    consts = {"as": np.float32(0.02), "az": np.array(5, dtype), "bs": np.float32(0.011),
              "bz": np.array(-3 if dtype == np.int8 else 130, dtype), "ys": np.float32(0.3),
              "yz": np.array(1 if dtype == np.int8 else 120, dtype)}
    order = ["a", "as", "az", "b", "bs", "bz", "ys", "yz"]
    check("QLinearMatMul", {"a": a, "b": b}, consts, {"_order": order}, opset=10)
    check("QLinearMatMul", {"a": a, "b": b}, consts, {"_order": order}, opset=21)


# ------------------------------------------------------------------------- ConvInteger


@pytest.mark.parametrize("attrs", [
    {},
    {"pads": [1, 1, 1, 1]},
    {"pads": [0, 2, 1, 0], "strides": [2, 1]},
    {"dilations": [2, 2], "pads": [2, 2, 2, 2]},
    {"group": 2, "pads": [1, 1, 1, 1], "strides": [2, 2]},
], ids=["plain", "pads", "asymmetric", "dilated", "grouped"])
def test_conv_integer(attrs):
    x = RNG.integers(0, 256, (2, 4, 7, 6)).astype(np.uint8)
    w = RNG.integers(0, 256, (6, 4 // attrs.get("group", 1), 3, 3)).astype(np.uint8)
    # the padding is the zero point, so a nonzero one tells padding apart from data
    check("ConvInteger", {"x": x, "w": w}, {"xz": np.uint8(100), "wz": np.uint8(120)}, attrs, opset=10)


def test_conv_integer_1d_without_zero_points():
    x = RNG.integers(0, 256, (1, 3, 11)).astype(np.uint8)
    w = RNG.integers(0, 256, (2, 3, 4)).astype(np.uint8)
    check("ConvInteger", {"x": x, "w": w}, {}, {"strides": [3]}, opset=10)


# ------------------------------------------------------------------------- QLinearConv


@pytest.mark.parametrize("x_type, w_type", [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv(x_type, w_type, per_channel):
    xi, wi = np.iinfo(x_type), np.iinfo(w_type)
    x = RNG.integers(xi.min, xi.max, (1, 3, 9, 8), endpoint=True).astype(x_type)
    w = RNG.integers(wi.min, wi.max, (5, 3, 3, 3), endpoint=True).astype(w_type)
    w_scale = RNG.uniform(0.002, 0.02, 5).astype(np.float32) if per_channel else np.float32(0.01)
    w_zero = np.zeros(5, w_type) if per_channel else np.array(0 if w_type == np.int8 else 128, w_type)
    consts = {"xs": np.float32(0.05), "xz": np.array(10 if x_type == np.int8 else 128, x_type),
              "ws": w_scale, "wz": w_zero, "ys": np.float32(0.4), "yz": np.array(7, x_type),
              "b": RNG.integers(-2000, 2000, 5).astype(np.int32)}
    order = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"]
    # uint8 x int8 weights fed at run time take onnxruntime's saturating kernel on x86 CPUs
    # without VNNI (tests/oracle.py); as constants they take its exact one
    inputs, consts = ({"x": x}, {**consts, "w": w}) if (x_type, w_type) == (np.uint8, np.int8) else ({"x": x, "w": w},
                                                                                                      consts)
    check("QLinearConv", inputs, consts, {"_order": order, "pads": [1, 1, 1, 1]}, opset=10)


def test_qlinear_conv_depthwise_strided_same_padding_without_bias():
    x = RNG.integers(0, 256, (2, 4, 10, 9)).astype(np.uint8)
    w = RNG.integers(-128, 128, (4, 1, 3, 3)).astype(np.int8)
    consts = {"xs": np.float32(0.03), "xz": np.uint8(90), "ws": np.float32(0.02), "wz": np.int8(0),
              "ys": np.float32(0.1), "yz": np.uint8(100)}
    order = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    check("QLinearConv", {"x": x, "w": w}, consts,
          {"_order": order, "group": 4, "strides": [2, 2], "auto_pad": "SAME_UPPER"}, opset=10)


# ------------------------------------------------------- com.microsoft QLinearAdd, QGemm


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_add_broadcasting(dtype):
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, (20, 30, 4), endpoint=True).astype(dtype)
    b = RNG.integers(info.min, info.max, (4,), endpoint=True).astype(dtype)
    consts = {"as": np.float32(0.05), "az": np.array(3, dtype), "bs": np.float32(0.2),
              "bz": np.array(-2 if dtype == np.int8 else 200, dtype), "cs": np.float32(0.1),
              "cz": np.array(9, dtype)}
    order = ["a", "as", "az", "b", "bs", "bz", "cs", "cz"]
    check("QLinearAdd", {"a": a, "b": b}, consts, {"_order": order}, opset=17, domain="com.microsoft")


@pytest.mark.parametrize("quantized_output", [True, False])
@pytest.mark.parametrize("per_column", [False, True])
def test_qgemm(quantized_output, per_column):
    a = RNG.integers(0, 256, (3, 10)).astype(np.uint8)
    b = RNG.integers(-128, 128, (6, 10)).astype(np.int8)  # transB: (N, K)
    b_scale = RNG.uniform(0.01, 0.05, 6).astype(np.float32) if per_column else np.float32(0.02)
    consts = {"as": np.float32(0.03), "az": np.uint8(120), "bs": b_scale,
              "bz": np.zeros(6, np.int8) if per_column else np.int8(0),
              "c": RNG.integers(-500, 500, 6).astype(np.int32)}
    order = ["a", "as", "az", "b", "bs", "bz", "c"]
    if quantized_output:
        consts.update(ys=np.float32(0.15), yz=np.uint8(110))
        order += ["ys", "yz"]
    # int8 B as a constant: fed at run time it takes onnxruntime's saturating uint8 x int8
    # kernel on x86 CPUs without VNNI (tests/oracle.py)
    check("QGemm", {"a": a}, {**consts, "b": b}, {"_order": order, "transB": 1, "alpha": 0.5},
          opset=17, domain="com.microsoft", atol=1e-5)


# ------------------------------------------------------------------ shapes and errors


def _shape(op, opset, *infos, **attrs):
    return resolve(op, "", opset).shape(Ctx(attrs, opset), *infos)


def test_shape_functions():
    x = TensorInfo(np.dtype(np.float32), ("n", 6))
    scale = TensorInfo(np.dtype(np.float32), ())
    out = _shape("QuantizeLinear", 21, x, scale, TensorInfo(np.dtype(ml_dtypes.int4), ()))
    assert out[0] == TensorInfo(np.dtype(ml_dtypes.int4), ("n", 6))
    out = _shape("QuantizeLinear", 21, x, scale, None, output_dtype=TensorProto.UINT16)
    assert out[0].dtype == np.uint16
    out = _shape("DequantizeLinear", 23, TensorInfo(np.dtype(np.int8), (2, 6)), scale, None,
                 output_dtype=TensorProto.FLOAT16)
    assert out[0] == TensorInfo(np.dtype(np.float16), (2, 6))
    out = _shape("MatMulInteger", 10, TensorInfo(np.dtype(np.uint8), ("n", 4)),
                 TensorInfo(np.dtype(np.int8), (4, 3)))
    assert out[0] == TensorInfo(np.dtype(np.int32), ("n", 3))


def test_bad_parameters_are_clear_errors():
    x = TensorInfo(np.dtype(np.float32), (2, 6))
    with pytest.raises(ShapeInferenceError, match="3 entries but input axis 1 has 6"):
        _shape("QuantizeLinear", 13, x, TensorInfo(np.dtype(np.float32), (3,)))
    with pytest.raises(ShapeInferenceError, match="blocks"):
        _shape("QuantizeLinear", 21, x, TensorInfo(np.dtype(np.float32), (2, 2)), block_size=2)
    with pytest.raises(ShapeInferenceError, match="differs from the zero point"):
        _shape("QuantizeLinear", 21, x, TensorInfo(np.dtype(np.float32), ()),
               TensorInfo(np.dtype(np.uint8), ()), output_dtype=TensorProto.INT8)
    with pytest.raises(ShapeInferenceError, match="cannot quantize to float"):
        _shape("QuantizeLinear", 21, x, TensorInfo(np.dtype(np.float32), ()), None,
               output_dtype=TensorProto.FLOAT)
    kernel = resolve("MatMulInteger", "", 10)
    with pytest.raises(KernelError, match="int8 or uint8"):
        kernel.fn(Ctx({}, 10), np.zeros((2, 2), np.int32), np.zeros((2, 2), np.int8))
