"""End pads in generated convolution and pooling code, against onnxruntime and the onnx
reference evaluator.

A 1x1 stride-1 Conv padded at the end only has an output larger than its input, so it
cannot be the direct GEMM over the input (which would read past the input's end); an
AveragePool that counts padding must count the end pads, not the begin pads again, at the
end of each axis, also when ceil_mode makes the last window reach past the end pads."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
import pytest

import nncc
from nncc.native.toolchain import find_toolchain
from tests.oracle import ort_session

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes "
                                "nothing, so there is no generated code to check")


def _model(node, x_shape, inits=()):
    graph = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _run_native(tmp_path, model, x):
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    compiled = nncc.compile_model(path)
    assert compiled.native_partitions == 1 and not compiled.plan.fallbacks, "the node did not run natively"
    return compiled.run({"x": x})["y"]


def _oracles(model, x):
    session = ort_session(model)
    return session.run(None, {"x": x})[0], ReferenceEvaluator(model).run(None, {"x": x})[0]


@pytest.mark.parametrize("pads", [[0, 0, 1, 1], [0, 0, 2, 0], [0, 0, 0, 3]])
def test_pointwise_conv_with_end_pads_only(tmp_path, pads):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 1, 1)).astype(np.float32)
    model = _model(helper.make_node("Conv", ["x", "w"], ["y"], pads=pads), x.shape, [numpy_helper.from_array(w, "w")])
    got = _run_native(tmp_path, model, x)
    want, ref = _oracles(model, x)
    assert got.shape == want.shape == (2, 4, 5 + pads[2], 6 + pads[3])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 3], pads=[0, 1, 2, 0]),
    dict(kernel_shape=[3, 2], strides=[2, 1], pads=[2, 0, 0, 1]),
    dict(kernel_shape=[2, 3], strides=[1, 2], pads=[1, 1, 0, 2]),
])
def test_average_pool_counts_the_end_pads(tmp_path, attrs):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 2, 5, 6)).astype(np.float32)
    model = _model(helper.make_node("AveragePool", ["x"], ["y"], count_include_pad=1, **attrs), x.shape)
    got = _run_native(tmp_path, model, x)
    want, ref = _oracles(model, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attrs, x_shape", [
    (dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), (1, 2, 6, 6)),
    (dict(kernel_shape=[3, 2], strides=[2, 3], pads=[0, 1, 1, 0]), (1, 2, 7, 6)),
    (dict(kernel_shape=[2, 2], strides=[2, 2]), (2, 3, 5, 7)),
])
def test_average_pool_ceil_mode_counting_pads_is_native(tmp_path, attrs, x_shape):
    """The count is the window's cells inside the padded input (begin pads, input, end
    pads): the part of a ceil_mode window past the end pads does not count. onnxruntime
    counts so; the reference evaluator differs for some of these geometries, so it is not
    the oracle here."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(x_shape).astype(np.float32)
    model = _model(helper.make_node("AveragePool", ["x"], ["y"], count_include_pad=1, ceil_mode=1, **attrs), x_shape)
    got = _run_native(tmp_path, model, x)
    want, _ = _oracles(model, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
