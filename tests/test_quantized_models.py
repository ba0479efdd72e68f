"""Quantized models as users make them: onnxruntime's quantizer applied to small float
models with real random weights, then run by nncc and compared with onnxruntime running
the same quantized model.

Static quantization (with a calibration reader) in QDQ format and in QOperator format,
and dynamic quantization; per-tensor and per-channel weights; int8 activations (the
quantizer's default), uint8 and uint16 ones; int8 and int4 weights.
The QOperator format's defaults write two com.microsoft ops (QGemm for Gemm, QLinearAdd
for Add); the "standard" variant quantizes only Conv and MatMul, which keeps the graph to
standard ONNX ops (QLinearConv, QLinearMatMul, QuantizeLinear, DequantizeLinear).

Tolerance, derived from the quantization (see _tolerance): for the static models one step
of the output's quantization (the scale of the DequantizeLinear that produces it; the last
rounding may fall on the other side of a tie), plus the steps the float32 sum before that
rounding may cross (its number of terms and their quantized bounds), plus the float32
rounding of the dequantized outputs; float rounding only for the dynamic ones, whose outputs
are integer products scaled in float.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnxruntime import quantization
import pytest

import nncc
from tests.conftest import ROOT
from tests.models import convnet, mlp
from tests.oracle import ort_run

SHAPES = {"convnet": (2, 3, 16, 16), "mlp": (4, 32)}


class Calibration(quantization.CalibrationDataReader):
    def __init__(self, shape, seed):
        rng = np.random.default_rng(seed)
        self.batches = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(6)])

    def get_next(self):
        return next(self.batches, None)


VARIANTS = {
    # name: (function, keyword arguments); static variants get a calibration reader
    "qdq": ("static", dict(quant_format=quantization.QuantFormat.QDQ)),
    "qdq-per-channel-uint8": ("static", dict(quant_format=quantization.QuantFormat.QDQ, per_channel=True,
                                             activation_type=quantization.QuantType.QUInt8,
                                             weight_type=quantization.QuantType.QInt8)),
    "qoperator": ("static", dict(quant_format=quantization.QuantFormat.QOperator)),
    "qoperator-per-channel-uint8": ("static", dict(quant_format=quantization.QuantFormat.QOperator,
                                                   per_channel=True,
                                                   activation_type=quantization.QuantType.QUInt8)),
    "qoperator-standard": ("static", dict(quant_format=quantization.QuantFormat.QOperator,
                                          op_types_to_quantize=["Conv", "MatMul"])),
    # 4-bit weights and 16-bit activations need opset 21 (the float models are made at 21)
    "qdq-int4-weights-uint16": ("static", dict(quant_format=quantization.QuantFormat.QDQ,
                                               weight_type=quantization.QuantType.QInt4,
                                               activation_type=quantization.QuantType.QUInt16)),
    "dynamic": ("dynamic", dict()),
    "dynamic-per-channel": ("dynamic", dict(per_channel=True)),
}


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """{(model, variant): path} of every quantized model, made once."""
    folder = tmp_path_factory.mktemp("quantized")
    made = {}
    for name, build in (("convnet", lambda opset: convnet(7, opset)),
                        ("mlp", lambda opset: mlp(["n", 32], 64, 10, seed=7, scale=0.2, bias_scale=0.1,
                                                  second_bias=True, opset=opset))):
        float_path = folder / f"{name}.onnx"
        onnx.save(build(17), float_path)
        onnx.save(build(21), folder / f"{name}-21.onnx")  # the same weights
        for variant, (kind, options) in VARIANTS.items():
            path = folder / f"{name}-{variant}.onnx"
            if "int4" in variant:
                quantization.quantize_static(folder / f"{name}-21.onnx", path, Calibration(SHAPES[name], 11),
                                             **options)
            elif kind == "static":
                quantization.quantize_static(float_path, path, Calibration(SHAPES[name], 11), **options)
            else:
                quantization.quantize_dynamic(float_path, path, **options)
            made[name, variant] = path
    return made


def _onnxruntime(path, x):
    # onnxruntime's optimizer turns DequantizeLinear(int4 weights) + MatMul into its
    # MatMulNBits, which computes with less precision than the model states (the MLP's
    # output moves by some 150 steps); unoptimized, it runs the model's own ops
    return ort_run(path, {"x": x}, optimized="int4" not in str(path))[0]


WEIGHTED = {"Conv", "Gemm", "MatMul", "QLinearConv", "QGemm", "QLinearMatMul"}


def _tolerance(path) -> float:
    """For a quantized output: its last rounding may fall on either side of a tie, one step;
    the float32 sum of K terms before it may differ between two correct summation orders by
    up to gamma_K * max|a| * sum|w| (max|a| from the activation's quantization, sum|w| over
    one output's weights), which can cross that many more steps; and each dequantized output
    is rounded to float32, half a unit in the last place each. 0 for float outputs."""
    model = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    last = producers["y"]
    if last.op_type != "DequantizeLinear":
        return 0.0
    scale, zero, dtype = _quantization(inits, last.input)
    weighted = last
    while weighted.op_type not in WEIGHTED:  # back along the first input to the last weighted op
        weighted = producers[weighted.input[0]]
    a, w = _operands(weighted, producers, inits)
    weights = np.abs(inits[w[0]].astype(np.float64)) + np.abs(inits[w[2]].astype(np.float64)).max()
    transposed = "MatMul" in weighted.op_type or (
        "Gemm" in weighted.op_type and not any(a.name == "transB" and a.i for a in weighted.attribute))
    rows = weights.reshape(-1, weights.shape[-1]).T if transposed else weights.reshape(weights.shape[0], -1)
    terms = rows.shape[1]
    w_sum = rows.sum(axis=1).max() * float(inits[w[1]].max())  # the largest sum of |w| over one output's terms
    gamma = terms * 2.0**-24 / (1 - terms * 2.0**-24)
    a_scale, a_zero, a_dtype = _quantization(inits, a)
    info = np.iinfo(a_dtype)
    a_max = a_scale * max(abs(info.min - a_zero), abs(info.max - a_zero))
    summation = gamma * a_max * w_sum
    info = np.iinfo(dtype)
    y_max = scale * max(abs(info.min - zero), abs(info.max - zero))
    return scale * (1 + np.floor(summation / scale)) + float(np.spacing(np.float32(y_max)))


def _quantization(inits, inputs) -> tuple[float, int, np.dtype]:
    """(largest scale, zero point, integer type) of a DequantizeLinear's or QLinear op's
    (value, scale, zero point) inputs; the type from the zero point, as ONNX defines it."""
    zero = inits[inputs[2]]
    return float(inits[inputs[1]].max()), int(zero.ravel()[0]), zero.dtype


def _operands(node, producers, inits):
    """The (value, scale, zero point) names of a weighted op's activation and weights."""
    if node.op_type.startswith("Q"):  # QLinearConv, QLinearMatMul, QGemm: a, sa, za, w, sw, zw
        return node.input[0:3], node.input[3:6]
    return tuple(producers[name].input for name in node.input[:2])  # both through DequantizeLinear


def _ops(path) -> set[tuple[str, str]]:
    return {(n.domain or "ai.onnx", n.op_type) for n in onnx.load(path).graph.node}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("model", ["convnet", "mlp"])
def test_quantized_model_matches_onnxruntime(quantized, model, variant):
    path = quantized[model, variant]
    ops = {op for _, op in _ops(path)}
    # the quantizer did quantize: integer ops (QOperator, dynamic) or Q/DQ pairs
    assert ops & {"QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger", "QuantizeLinear"}
    if variant == "qoperator-standard":
        assert all(domain == "ai.onnx" for domain, _ in _ops(path))
    if "int4" in variant:  # packed 4-bit initializers
        assert TensorProto.INT4 in {t.data_type for t in onnx.load(path).graph.initializer}
    compiled = nncc.compile_model(path)
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = rng.standard_normal(SHAPES[model]).astype(np.float32) * 1.5  # beyond calibration too
        expected = _onnxruntime(path, x)
        got = compiled.run({"x": x})["y"]
        assert got.dtype == expected.dtype and got.shape == expected.shape
        step = _tolerance(path)
        np.testing.assert_allclose(got, expected, rtol=1e-5 if step == 0 else 0, atol=step or 1e-5)


def test_default_qoperator_uses_microsoft_ops(quantized):
    """What the default QOperator settings produce, so the com.microsoft kernels are needed."""
    assert ("com.microsoft", "QGemm") in _ops(quantized["convnet", "qoperator"])
    assert ("com.microsoft", "QLinearAdd") in _ops(quantized["mlp", "qoperator"])


# one variant's CLI run stays quick: test_quantized_model_matches_onnxruntime runs every
# variant in-process, and the others' processes are slow
@pytest.mark.parametrize("model, variant", [("convnet", "qoperator"), pytest.param("mlp", "qdq", marks=pytest.mark.slow),
                                            pytest.param("convnet", "dynamic", marks=pytest.mark.slow)])
def test_nncc_run_cli_on_quantized_model(quantized, tmp_path, model, variant):
    path = quantized[model, variant]
    x = np.random.default_rng(5).standard_normal(SHAPES[model]).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = subprocess.run(
        [sys.executable, "-m", "nncc", "run", str(path), "--input", f"x={tmp_path / 'x.npy'}",
         "--output", str(tmp_path / "out.npz")],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    got = np.load(tmp_path / "out.npz")["y"]
    step = _tolerance(path)
    np.testing.assert_allclose(got, _onnxruntime(path, x), rtol=1e-5 if step == 0 else 0, atol=step or 1e-5)
