"""fuse_dynamic_quantization: the chain onnxruntime's quantize_dynamic writes per weight
matrix becomes one com.microsoft DynamicQuantizeMatMul whose results are the chain's, bit
for bit (the same arithmetic in the same order), and match onnxruntime running the file."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from onnxruntime import quantization
import pytest

from nncc.frontend.onnx import parse_model
from nncc.passes.pipeline import run_passes
from nncc.passes.quant_fusion import fuse_dynamic_quantization
from nncc.runtime.interpreter import Interpreter
from tests.models import mlp
from tests.oracle import ort_run


@pytest.fixture(scope="module", params=[False, True], ids=["per-tensor", "per-channel"])
def quantized(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("dyn")
    onnx.save(mlp(["n", 5, 24], 40, 9, seed=8, scale=0.3), folder / "float.onnx")
    path = folder / "dynamic.onnx"
    quantization.quantize_dynamic(folder / "float.onnx", path, weight_type=quantization.QuantType.QInt8,
                                  per_channel=request.param)
    return path


def _ops(graph):
    return [(n.domain, n.op_type) for n in graph.nodes]


def test_each_weight_product_becomes_one_node_with_the_chains_results(quantized):
    graph = parse_model(onnx.load(quantized).SerializeToString())
    assert ("", "MatMulInteger") in _ops(graph)
    fused = run_passes(graph, 2)
    ops = _ops(fused)
    assert ops.count(("com.microsoft", "DynamicQuantizeMatMul")) == 2
    assert not {"MatMulInteger", "DynamicQuantizeLinear", "Cast"} & {op for _, op in ops}
    first = next(n for n in fused.nodes if n.op_type == "DynamicQuantizeMatMul")
    assert len(first.inputs) == 5 and first.inputs[4]  # the bias Add went in too
    x = (np.random.default_rng(1).standard_normal((3, 5, 24)) * 2).astype(np.float32)
    chain = Interpreter(graph).run({"x": x})["y"]
    one = Interpreter(fused).run({"x": x})["y"]
    np.testing.assert_array_equal(one, chain)
    expected = ort_run(quantized, {"x": x})[0]
    np.testing.assert_allclose(one, expected, rtol=1e-5, atol=1e-5)


def test_a_chain_whose_product_is_read_elsewhere_is_left_alone(quantized):
    model = onnx.load(quantized)
    cast = next(n for n in model.graph.node if n.op_type == "Cast")
    model.graph.output.append(helper.make_empty_tensor_value_info(cast.output[0]))  # also a graph output
    graph = parse_model(model.SerializeToString())
    after = _ops(fuse_dynamic_quantization(graph))
    assert after.count(("com.microsoft", "DynamicQuantizeMatMul")) == 1
    assert after.count(("", "MatMulInteger")) == 1
