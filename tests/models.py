"""Model builders the tests share (one-node models: tests/one_node_graphs.py).

``GraphBuilder``: a float32 model under construction, node by node, with seeded random
inputs and weights.

``benchmark_model``: a model benchmarks/real_models.py builds, made as the benchmarks make
it, in a process of its own with benchmarks/ on its path (the benchmarks are scripts, not
a package the tests import)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import ROOT


class GraphBuilder:
    """A model under construction: float32 inputs fed seeded normal values (times
    ``scale``), constants, weights scaled by their fan-in, nodes with one output each."""

    def __init__(self, opset: int = 18, seed: int = 0, name: str = "model"):
        self.opset, self.name = opset, name
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inputs, self.outputs, self.inits, self.feeds = [], [], [], [], {}

    def input(self, shape, scale: float = 1.0) -> str:
        name = f"x{len(self.inputs)}"
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        self.feeds[name] = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return name

    def const(self, value, dtype=np.float32) -> str:
        name = f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def weight(self, shape) -> str:
        return self.const(self.rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:])))

    def node(self, op, inputs, domain: str = "", **attrs) -> str:
        out = f"y{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], domain=domain, **attrs))
        return out

    def output(self, name: str) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))

    def save(self, path, domains=()) -> onnx.ModelProto:
        """Write the model (opset ``opset``, plus version 1 of each of ``domains``)."""
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)]
                                  + [helper.make_opsetid(d, 1) for d in domains])
        model.ir_version = 8
        onnx.save(model, path)
        return model


def benchmark_model(call: str, folder: pathlib.Path) -> onnx.ModelProto:
    """The model ``call`` returns, a Python expression over benchmarks/real_models.py's
    names (e.g. ``"lstm(seq=9, inp=6, hidden=21, layers=3)"``)."""
    path = folder / "benchmark-model.onnx"
    code = f"import onnx\nfrom real_models import *\nfrom real_models import _transformer\nonnx.save({call}, {str(path)!r})"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT)]))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return onnx.load(path)
