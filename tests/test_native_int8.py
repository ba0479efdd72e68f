"""The native int8 GEMM (nncc/native/int8_gemm_gen.py) for com.microsoft DynamicQuantizeMatMul,
against onnxruntime, for the host's ISA (vpdpbusd where the CPU has AVX-512 VNNI) and for
the baseline x86-64 target, whose code is the plain C fallback: both must give onnxruntime's
result bit for bit (an exact integer product, then the same float32 roundings), and run as
native code. tests/native_fuzz_cases.py covers many more geometries, sanitized too."""

from __future__ import annotations

import platform

import numpy as np
import onnx
from onnx import helper, numpy_helper
import pytest

import nncc
from nncc.native.toolchain import find_toolchain
from tests.oracle import ort_session

pytestmark = pytest.mark.skipif(find_toolchain(sanitize=False) is None, reason="no C compiler")
TARGETS = ["native"] + (["x86-64"] if platform.machine() in ("x86_64", "AMD64") else [])


def _model(rng, shape, n, b_zero, bias, per_column):
    k = shape[-1]
    inits = [numpy_helper.from_array(rng.integers(-128, 128, (k, n)).astype(np.int8), "b"),
             numpy_helper.from_array((rng.uniform(0.01, 0.03, n) if per_column else np.array(0.02)).astype(np.float32),
                                     "bs")]
    names = ["a", "b", "bs", "", ""]
    if b_zero:
        zero = rng.integers(-9, 10, n) if per_column else np.array(4)
        inits.append(numpy_helper.from_array(zero.astype(np.int8), "bz"))
        names[3] = "bz"
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias"))
        names[4] = "bias"
    while not names[-1]:
        names.pop()
    node = helper.make_node("DynamicQuantizeMatMul", names, ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", 1, shape)],
                              [helper.make_tensor_value_info("y", 1, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("target", TARGETS)
def test_int8_gemm_matches_onnxruntime_bit_for_bit(tmp_path, target):
    rng = np.random.default_rng(4)
    geometries = [((1, 64), 64, False, True, False), ((7, 33), 19, True, False, True),
                  ((2, 3, 13, 128), 130, True, True, True), ((200, 17), 65, False, True, False)]
    for i, (shape, n, b_zero, bias, per_column) in enumerate(geometries):
        path = tmp_path / f"m{i}.onnx"
        onnx.save(_model(rng, shape, n, b_zero, bias, per_column), path)
        model = nncc.compile_model(path, target=target)
        assert model.native_partitions == 1
        session = ort_session(path)
        for scale in (4.0, 0.001):
            a = (rng.standard_normal(shape) * scale).astype(np.float32)
            if scale < 1:
                a = np.abs(a)  # a range without negatives: zero point 0
            np.testing.assert_array_equal(model.run({"a": a})["y"], session.run(None, {"a": a})[0])
        zeros = np.zeros(shape, np.float32)  # an all-zero input: scale 1, zero point 0
        np.testing.assert_array_equal(model.run({"a": zeros})["y"], session.run(None, {"a": zeros})[0])
