"""A small convnet quantized by onnxruntime's own tool in its default QOperator format,
which writes the com.microsoft ops (QLinearMul, QLinearConcat, QLinearSigmoid,
QLinearLeakyRelu, QLinearAveragePool, QLinearGlobalAveragePool...), run by nncc and
compared with onnxruntime running the same file: within one step of the output's
quantization (the last rounding may fall on the other side of a tie). And a quantized op
nncc lacks is one clear line naming it, its domain and its opset.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime import quantization
import pytest

import nncc
from tests.conftest import ROOT
from tests.models import gated_convnet
from tests.oracle import ort_run

SHAPE = (2, 3, 12, 12)


class _Calibration(quantization.CalibrationDataReader):
    def __init__(self):
        rng = np.random.default_rng(11)
        self.batches = iter([{"x": rng.standard_normal(SHAPE).astype(np.float32)} for _ in range(4)])

    def get_next(self):
        return next(self.batches, None)


@pytest.fixture(scope="module")
def qoperator(tmp_path_factory):
    folder = tmp_path_factory.mktemp("contrib")
    onnx.save(gated_convnet(SHAPE), folder / "float.onnx")
    path = folder / "qop.onnx"
    quantization.quantize_static(folder / "float.onnx", path, _Calibration(),
                                 quant_format=quantization.QuantFormat.QOperator,
                                 activation_type=quantization.QuantType.QUInt8)
    return path


def _onnxruntime(path, x):
    return ort_run(path, {"x": x})[0]


def test_qoperator_model_with_microsoft_ops_matches_onnxruntime(qoperator):
    model = onnx.load(qoperator)
    ops = {n.op_type for n in model.graph.node if n.domain == "com.microsoft"}
    assert {"QLinearMul", "QLinearConcat", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearAveragePool",
            "QLinearGlobalAveragePool"} <= ops
    producer = next(n for n in model.graph.node if "y" in n.output)
    assert producer.op_type == "DequantizeLinear"
    step = float(numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == producer.input[1])))
    compiled = nncc.compile_model(qoperator)
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = (rng.standard_normal(SHAPE) * 1.5).astype(np.float32)
        expected = _onnxruntime(qoperator, x)
        got = compiled.run({"x": x})["y"]
        assert got.shape == expected.shape and got.dtype == expected.dtype
        np.testing.assert_allclose(got, expected, rtol=0, atol=step * 1.0001)


def test_missing_quantized_op_is_one_clear_line(tmp_path):
    node = helper.make_node("QLinearSoftmax", ["x", "s", "z", "s", "z"], ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, (2, 4))],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, (2, 4))],
                              [numpy_helper.from_array(np.float32(0.1), "s"),
                               numpy_helper.from_array(np.uint8(3), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    path = tmp_path / "softmax.onnx"
    onnx.save(model, path)
    result = subprocess.run([sys.executable, "-m", "nncc", "compile", str(path), "-o", str(tmp_path / "out")],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("nncc: error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr
    assert "'QLinearSoftmax'" in errors[0] and "'com.microsoft'" in errors[0] and "opset 1" in errors[0]
