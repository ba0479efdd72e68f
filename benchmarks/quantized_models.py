"""The real-weight models quantized as onnxruntime users quantize them, for benchmarks:

    python benchmarks/quantized_models.py [OUT_DIR]     # default: build/real-models

Writes, from the float models of real_models.py (built on first use):
- bert_int8_dynamic.onnx   ``quantize_dynamic``, QInt8 weights: DynamicQuantizeLinear and
                           MatMulInteger around every weight MatMul
- mobilenetv2_int8_qdq.onnx ``quantize_static``, QDQ format (QuantizeLinear/DequantizeLinear
                           pairs around each op), QUInt8 activations, QInt8 weights
- resnet18_int8_qop.onnx   ``quantize_static``, QOperator format (QLinearConv, QLinearAdd,
                           QLinearGlobalAveragePool...)

Static quantization is calibrated on a few seeded random inputs: the figures measure
speed, not accuracy, and the same file goes to every runtime. The quantizer is
onnxruntime's own tool, so this script needs onnxruntime (``pip install 'nncc[bench]'``).
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from real_models import write_one  # noqa: E402

CALIBRATION_INPUTS = 4

# name -> (float model, how it is quantized)
QUANTIZED = {
    "bert_int8_dynamic": ("bert", "dynamic"),
    "mobilenetv2_int8_qdq": ("mobilenetv2", "qdq"),
    "resnet18_int8_qop": ("resnet18", "qoperator"),
}


class _RandomReader:
    """onnxruntime's CalibrationDataReader over seeded random inputs of the model's shapes."""

    def __init__(self, model_path: str):
        import onnx

        graph = onnx.load(model_path, load_external_data=False).graph
        initializers = {t.name for t in graph.initializer}
        rng = np.random.default_rng(7)
        self._feeds = []
        for _ in range(CALIBRATION_INPUTS):
            feed = {}
            for value in graph.input:
                if value.name in initializers:
                    continue
                shape = [d.dim_value or 1 for d in value.type.tensor_type.shape.dim]
                feed[value.name] = rng.standard_normal(shape, dtype=np.float32)
            self._feeds.append(feed)
        self._next = iter(self._feeds)

    def get_next(self):
        return next(self._next, None)

    def rewind(self):
        self._next = iter(self._feeds)


def quantize(out_dir: str, name: str) -> str:
    """OUT_DIR/NAME.onnx, written on first use."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    path = os.path.join(out_dir, f"{name}.onnx")
    if os.path.exists(path):
        return path
    base, how = QUANTIZED[name]
    source = write_one(out_dir, base)
    with tempfile.TemporaryDirectory() as work:
        prepared = os.path.join(work, "prepared.onnx")
        quant_pre_process(source, prepared)  # shape inference and folding, as the tool's docs ask
        partial = os.path.join(work, "quantized.onnx")
        if how == "dynamic":
            quantize_dynamic(prepared, partial, weight_type=QuantType.QInt8)
        else:
            fmt = QuantFormat.QDQ if how == "qdq" else QuantFormat.QOperator
            quantize_static(prepared, partial, _RandomReader(prepared), quant_format=fmt,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        os.replace(partial, path)
    return path


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "build" / "real-models")
    os.makedirs(out, exist_ok=True)
    for model in QUANTIZED:
        p = quantize(out, model)
        print(p, os.path.getsize(p))
