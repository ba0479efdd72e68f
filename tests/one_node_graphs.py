"""One-node ONNX models (any domain, several opsets) run by onnxruntime and by both nncc routes (shared by the kernel
tests of the attention, string, ml and training families)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

import nncc
from nncc.compiler import CompileOptions, compile_graph
from nncc.frontend.onnx import parse_model
from nncc.model import CompiledModel
from nncc.runtime.interpreter import Interpreter

ELEM = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.bool_): TensorProto.BOOL,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(object): TensorProto.STRING,
}


def one_node(op, inputs, n_out, attrs, opsets, domain="", outs=None):
    """(model, feeds, output names). ``opsets``: the default domain's opset, or a dict of
    domain -> opset. A None input is omitted (trailing ones dropped)."""
    names = ["" if a is None else f"in{i}" for i, a in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    outs = outs or [f"out{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, ELEM.get(a.dtype) or helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in zip(names, inputs) if n],
        [helper.make_empty_tensor_value_info(o) for o in outs if o])
    opsets = opsets if isinstance(opsets, dict) else {"": opsets}
    model = helper.make_model(graph, ir_version=10,
                              opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    return model, {n: a for n, a in zip(names, inputs) if n}, [o for o in outs if o]



def run_interpreter(model: onnx.ModelProto, feeds: dict) -> dict:
    return Interpreter(parse_model(model.SerializeToString())).run(feeds)


def run_nncc(model: onnx.ModelProto, feeds: dict, outs: list) -> tuple[list, list]:
    """(interpreter results, results of the compiled artifact), each in output order. The
    compiled route goes through the artifact's bytes, so the plan format is exercised."""
    raw = model.SerializeToString()
    interpreted = Interpreter(parse_model(raw)).run(feeds)
    plan = CompiledModel(compile_graph(parse_model(raw), CompileOptions(opt_level=2)))
    compiled = nncc.load(plan.to_bytes()).run(feeds)
    return [interpreted[o] for o in outs], [compiled[o] for o in outs]


def assert_same(got: list, expected: list, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        e = np.asarray(e)
        assert g.dtype == e.dtype, f"dtype {g.dtype} != {e.dtype}"
        assert g.shape == e.shape, f"shape {g.shape} != {e.shape}"
        if e.dtype.kind in "fc":
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, e)
