"""fuse_gelu: a GELU spelled out in elementwise ops after a value no product absorbed (here
the sum of two inputs; in an int8 transformer, the dynamically quantized product's float
result) becomes one nncc Gelu node, which the native backend runs as one step. The oracle
is onnxruntime running the spelled-out ops."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.frontend.onnx import parse_model
from nncc.passes.pipeline import run_passes
from tests.oracle import ort_session

SHAPE = [3, 37, 130]


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def _model(form: str, leak: bool = False):
    """s = a + b, then GELU(s) spelled as exporters write it; ``leak``: an inner value is an
    output too, so the spelling must stay as it is."""
    nodes = [helper.make_node("Add", ["a", "b"], ["s"])]
    if form == "erf":
        inits = [_const("sqrt2", math.sqrt(2.0)), _const("one", 1.0), _const("half", 0.5)]
        nodes += [helper.make_node("Div", ["s", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["s", "e1"], ["m"]),
                  helper.make_node("Mul", ["m", "half"], ["y"])]
        inner = "e"
    else:
        inits = [_const("three", 3.0), _const("c", 0.044715), _const("k", math.sqrt(2.0 / math.pi)),
                 _const("one", 1.0), _const("half", 0.5)]
        nodes += [helper.make_node("Pow", ["s", "three"], ["p"]), helper.make_node("Mul", ["p", "c"], ["pc"]),
                  helper.make_node("Add", ["s", "pc"], ["u"]), helper.make_node("Mul", ["u", "k"], ["uk"]),
                  helper.make_node("Tanh", ["uk"], ["t"]), helper.make_node("Add", ["t", "one"], ["t1"]),
                  helper.make_node("Mul", ["half", "s"], ["hs"]), helper.make_node("Mul", ["hs", "t1"], ["y"])]
        inner = "t"
    outputs = ["y"] + ([inner] if leak else [])
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info(n, TensorProto.FLOAT, SHAPE)
                                              for n in ("a", "b")],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds():
    rng = np.random.default_rng(5)
    return {n: (rng.standard_normal(SHAPE) * 3).astype(np.float32) for n in ("a", "b")}


def _onnxruntime(model, feeds):
    names = [o.name for o in model.graph.output]
    return dict(zip(names, ort_session(model)
                    .run(None, feeds)))


@pytest.mark.parametrize("form,approximate", [("erf", "none"), ("tanh", "tanh")])
def test_a_spelled_gelu_after_an_unfused_value_is_one_native_step(tmp_path, form, approximate):
    model = _model(form)
    graph = run_passes(parse_model(model.SerializeToString()), 2)
    assert [(n.domain, n.op_type, dict(n.attrs)) for n in graph.nodes] == [
        ("", "Add", {}), ("nncc", "Gelu", {"approximate": approximate})]
    path = tmp_path / "gelu.onnx"
    onnx.save(model, path)
    feeds = _feeds()
    expected = _onnxruntime(model, feeds)["y"]
    for backends in (("numpy",), None):
        compiled = nncc.compile_model(path, backends=backends) if backends else nncc.compile_model(path)
        if backends is None:
            assert all(p.backend == "native" for p in compiled.plan.partitions)
        got = compiled.run(feeds)["y"]
        # float32 rounding of the spelled ops against one GELU: a few ulps of the value
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("form", ["erf", "tanh"])
def test_a_gelu_whose_inner_value_is_read_elsewhere_stays_spelled(tmp_path, form):
    model = _model(form, leak=True)
    graph = run_passes(parse_model(model.SerializeToString()), 2)
    assert not any(n.op_type == "Gelu" for n in graph.nodes)
    path = tmp_path / "gelu.onnx"
    onnx.save(model, path)
    feeds = _feeds()
    expected = _onnxruntime(model, feeds)
    got = nncc.compile_model(path).run(feeds)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=2e-6, atol=2e-6)
