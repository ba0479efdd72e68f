"""The com.microsoft quantized ops (nncc/kernels/qlinear_contrib.py) against onnxruntime.

One-node models run by onnxruntime and by both nncc routes (the interpreter, and
compile_graph at -O2). Quantized outputs must match bit for bit, except where the module
documents that float32 scale arithmetic done in another order may move a value lying at a
tie by one quantization step: there the bound is one step, and the values off by one must
be rare (a tie is rare in random data).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.oracle import ort_run
from tests.test_kernels_quantize import build, check, exact_matmul_integer, run_nncc

MS = "com.microsoft"
RNG = np.random.default_rng(31)


def _ints(dtype, shape):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def _params(dtype, scale, zero):
    return np.float32(scale), np.array(zero, dtype)


def within_one_step(op, inputs, consts, attrs, order):
    """nncc's result is onnxruntime's, or one step from it in at most 5% of the values
    (an average of integers lies at a tie often: about 2% in these cases)."""
    model = build(op, inputs, consts, dict(attrs, _order=order), 17, 1, MS)
    (expected,) = ort_run(model, inputs)
    for (got,) in run_nncc(model, inputs):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        diff = np.abs(got.astype(np.int32) - expected.astype(np.int32))
        assert diff.max() <= 1
        assert np.count_nonzero(diff) <= max(1, expected.size // 20)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_mul_broadcasting(dtype):
    a, b = _ints(dtype, (8, 16, 5)), _ints(dtype, (16, 1))
    zero = 5 if dtype == np.int8 else 130
    consts = {"as": np.float32(0.04), "az": np.array(zero, dtype), "bs": np.float32(0.07),
              "bz": np.array(-zero // 3 if dtype == np.int8 else 90, dtype), "cs": np.float32(0.3),
              "cz": np.array(zero // 2, dtype)}
    within_one_step("QLinearMul", {"a": a, "b": b}, consts, {},
                    ["a", "as", "az", "b", "bs", "bz", "cs", "cz"])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_global_average_pool(dtype, channels_last):
    x = _ints(dtype, (2, 7, 7, 24) if channels_last else (2, 24, 7, 7))
    zero = -3 if dtype == np.int8 else 121
    consts = {"xs": np.float32(0.05), "xz": np.array(zero, dtype), "ys": np.float32(0.02),
              "yz": np.array(zero + 2, dtype)}
    check("QLinearGlobalAveragePool", {"x": x}, consts, {"channels_last": channels_last},
          opset=17, domain=MS)


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
    dict(kernel_shape=[2, 3], strides=[2, 1], ceil_mode=1),
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], channels_last=1),
])
def test_qlinear_average_pool(attrs):
    x = _ints(np.uint8, (2, 9, 9, 6) if attrs.get("channels_last") else (2, 6, 9, 9))
    consts = {"xs": np.float32(0.05), "xz": np.uint8(128), "ys": np.float32(0.04), "yz": np.uint8(120)}
    within_one_step("QLinearAveragePool", {"x": x}, consts, attrs, ["x", "xs", "xz", "ys", "yz"])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_concat_requantizes_each_input(dtype):
    a, b, c = _ints(dtype, (2, 3, 4)), _ints(dtype, (2, 5, 4)), _ints(dtype, (2, 1, 4))
    zero = 0 if dtype == np.int8 else 128
    consts = {"ys": np.float32(0.1), "yz": np.array(zero, dtype),
              "as": np.float32(0.1), "az": np.array(zero, dtype),  # already the output's: copied
              "bs": np.float32(0.037), "bz": np.array(zero + 7, dtype),
              "cs": np.float32(0.5), "cz": np.array(zero - 9, dtype)}
    check("QLinearConcat", {"a": a, "b": b, "c": c}, consts,
          {"axis": -2, "_order": ["ys", "yz", "a", "as", "az", "b", "bs", "bz", "c", "cs", "cz"]},
          opset=17, domain=MS)


@pytest.mark.parametrize("op, attrs", [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.13})])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_lookup_ops_on_every_value(op, attrs, dtype):
    info = np.iinfo(dtype)
    x = np.arange(info.min, info.max + 1).astype(dtype).reshape(16, 16)  # every possible input
    zero = 10 if dtype == np.int8 else 140
    consts = {"xs": np.float32(0.06), "xz": np.array(zero, dtype), "ys": np.float32(0.004 if op == "QLinearSigmoid"
                                                                                   else 0.05),
              "yz": np.array(info.min if op == "QLinearSigmoid" else zero, dtype)}
    check(op, {"x": x}, consts, dict(attrs, _order=["x", "xs", "xz", "ys", "yz"]), opset=17, domain=MS)


@pytest.mark.parametrize("per_column, with_zero, with_bias", [(False, True, True), (True, True, False),
                                                              (False, False, False)])
def test_dynamic_quantize_matmul(per_column, with_zero, with_bias):
    a = (RNG.standard_normal((3, 7, 33)) * 2).astype(np.float32)
    n = 19
    consts = {"b": _ints(np.int8, (33, n)),
              "bs": RNG.uniform(0.01, 0.03, n).astype(np.float32) if per_column else np.float32(0.02)}
    order = ["a", "b", "bs"]
    if with_zero:
        consts["bz"] = np.zeros(n, np.int8) if per_column else np.int8(0)
        order.append("bz")
    if with_bias:
        consts["bias"] = RNG.standard_normal(n).astype(np.float32)
        order += [""] * (4 - len(order)) + ["bias"]
    check("DynamicQuantizeMatMul", {"a": a}, consts, {"_order": order}, opset=17, domain=MS, atol=1e-5)


@pytest.mark.parametrize("a_type", [np.uint8, np.int8])
def test_matmul_integer_to_float(a_type):
    a = _ints(a_type, (2, 5, 40))
    n = 12
    consts = {"b": _ints(np.int8, (40, n)), "as": np.float32(0.03), "bs": RNG.uniform(0.01, 0.03, n).astype(np.float32),
              "az": np.array(3, a_type), "bz": np.zeros(n, np.int8),
              "bias": RNG.standard_normal(n).astype(np.float32)}
    # the exact integer product, scaled and biased in float32 (onnxruntime's u8s8 product is
    # not exact on CPUs without VNNI: tests/test_kernels_quantize.exact_matmul_integer)
    product = exact_matmul_integer(a, consts["b"], consts["az"], consts["bz"]).astype(np.float32)
    expected = product * (consts["as"] * consts["bs"]) + consts["bias"]
    check("MatMulIntegerToFloat", {"a": a}, consts, {"_order": ["a", "b", "as", "bs", "az", "bz", "bias"]},
          opset=17, domain=MS, atol=1e-5, expected=[expected])
