"""The native int8 depthwise convolution (nncc/native/int8_depthwise_gen.py) over image rows
long enough for the fill's widest vectors (where the CPU has AVX-512 BW, 32 bytes widened
or 64 split into stride phases a vector; the last vector overlapping its predecessor, an odd
row's last byte alone): reading the bytes a 1x1 convolution stored, strides 1 and 2, its
output equal to onnxruntime's (a quantized convolution is exact)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.native.toolchain import find_toolchain
from tests.oracle import ort_run

pytestmark = pytest.mark.skipif(find_toolchain(sanitize=False) is None, reason="no C compiler")


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _model(rng, c, h, w, stride):
    """Q -> 1x1 QLinearConv -> depthwise 3x3 QLinearConv -> DQ, each convolution quantizing
    with the scale and zero point the next recovers with (so the depthwise one reads bytes)."""
    inits = [_const("s0", np.float32(0.02)), _const("z0", np.uint8(128)), _const("s1", np.float32(0.05)),
             _const("z1", np.uint8(7)), _const("s2", np.float32(0.04)), _const("z2", np.uint8(120)),
             _const("pw", rng.integers(-128, 128, (c, c, 1, 1)).astype(np.int8)),
             _const("pws", rng.uniform(0.002, 0.02, c).astype(np.float32)), _const("pwz", np.zeros(c, np.int8)),
             _const("dw", rng.integers(-128, 128, (c, 1, 3, 3)).astype(np.int8)),
             _const("dws", rng.uniform(0.002, 0.02, c).astype(np.float32)), _const("dwz", np.zeros(c, np.int8)),
             _const("b", rng.integers(-2000, 2000, c).astype(np.int32))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s0", "z0"], ["q0"]),
             helper.make_node("QLinearConv", ["q0", "s0", "z0", "pw", "pws", "pwz", "s1", "z1"], ["q1"]),
             helper.make_node("QLinearConv", ["q1", "s1", "z1", "dw", "dws", "dwz", "s2", "z2", "b"], ["q2"], group=c,
                              kernel_shape=[3, 3], pads=[1, 0, 1, 2], strides=[stride, stride]),
             helper.make_node("DequantizeLinear", ["q2", "s2", "z2"], ["y"])]
    graph = helper.make_graph(nodes, "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# the quick tier takes an odd row at stride 1 and an even one past 64 bytes at stride 2
QUICK = {(77, 1), (70, 2)}


@pytest.mark.parametrize("w, stride", [pytest.param(w, s, marks=[] if (w, s) in QUICK else [pytest.mark.slow])
                                       for w in (64, 70, 77, 131) for s in (1, 2)])
def test_long_rows_read_as_bytes_match_onnxruntime_exactly(tmp_path, w, stride):
    rng = np.random.default_rng(w * 10 + stride)
    c, h = 3, 5
    model = _model(rng, c, h, w, stride)
    path = tmp_path / "dw.onnx"
    onnx.save(model, path)
    x = (rng.standard_normal((1, c, h, w)) * 2).astype(np.float32)
    compiled = nncc.compile_model(path)
    assert [p.backend for p in compiled.plan.partitions] == ["native"]
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], ort_run(model, {"x": x})[0])
