"""One-node ONNX models run by onnxruntime (the oracle) and by both nncc routes: the
reference interpreter and compile_graph at -O2 (passes, plan, arena, executor).

Inputs listed in ``constant`` become initializers, so the compile route sees their values
(static output shapes, folding); the others are graph inputs fed at run time.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from nncc.compiler import CompileOptions, compile_graph
from nncc.frontend.onnx import parse_model
from nncc.model import CompiledModel
from nncc.runtime.interpreter import Interpreter
from tests.oracle import ort_run


def make_model(op, inputs, opset, attrs=None, constant=(), outputs=1):
    names = ["" if x is None else f"in{i}" for i, x in enumerate(inputs)]
    while names and names[-1] == "":
        names.pop()
    out_names = [f"out{i}" for i in range(outputs)]
    node = helper.make_node(op, names, out_names, **(attrs or {}))
    graph_inputs, initializers, feeds = [], [], {}
    for i, (name, x) in enumerate(zip(names, inputs)):
        if not name:
            continue
        x = np.asarray(x)
        if i in constant:
            initializers.append(numpy_helper.from_array(x, name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape))
            feeds[name] = x
    graph = helper.make_graph([node], "g", graph_inputs,
                              [helper.make_empty_tensor_value_info(n) for n in out_names],
                              initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model, feeds



def run_nncc(model, feeds):
    """{route: outputs} for the interpreter and the compiled (-O2) route."""
    graph = parse_model(model.SerializeToString())
    interpreted = Interpreter(graph).run(dict(feeds))
    compiled = CompiledModel(compile_graph(graph, CompileOptions(opt_level=2))).run(dict(feeds))
    return {route: [np.asarray(result[name]) for name in graph.outputs]
            for route, result in (("interp", interpreted), ("compile", compiled))}


def assert_same(got, expected, rtol, atol, what=""):
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != {expected.dtype}"
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    if expected.dtype.kind in "fc":
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, expected, err_msg=what)


def check_against_ort(op, inputs, opset, attrs=None, constant=(), rtol=1e-5, atol=1e-6,
                      outputs=1):
    model, feeds = make_model(op, inputs, opset, attrs, constant, outputs)
    expected = [np.asarray(e) for e in ort_run(model, feeds)]
    for route, got in run_nncc(model, feeds).items():
        for g, e in zip(got, expected):
            assert_same(g, e, rtol, atol, f"{op} via {route}")
    return expected


def check_against(expected, op, inputs, opset, attrs=None, constant=(), rtol=1e-5, atol=1e-6):
    """Both nncc routes against given expected outputs (an oracle other than onnxruntime)."""
    model, feeds = make_model(op, inputs, opset, attrs, constant, len(expected))
    for route, got in run_nncc(model, feeds).items():
        for g, e in zip(got, expected):
            assert_same(g, np.asarray(e), rtol, atol, f"{op} via {route}")
