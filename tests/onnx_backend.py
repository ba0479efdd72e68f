"""nncc as an ``onnx.backend.base.Backend``, so ONNX's backend test cases can drive it.

Test-time glue only, kept out of the shipped package: it needs the ``onnx`` package (a
test extra), which nncc itself never imports. Models are serialized and read back through
nncc's own reader, then run by one of two routes: the reference interpreter, or the full
compile (passes at -O2, partitioning, the plan and its arena, the executor).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from onnx.backend.base import Backend, BackendRep

from nncc.compiler import CompileOptions, compile_graph
from nncc.frontend.onnx import parse_model
from nncc.model import CompiledModel
from nncc.passes.shape_inference import infer_shapes
from nncc.ir.graph import TensorInfo
from nncc.runtime.interpreter import Interpreter


class NnccRep(BackendRep):
    def __init__(self, interpreter: Interpreter, check_shapes: bool):
        self.interpreter = interpreter
        self.check_shapes = check_shapes

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        graph = self.interpreter.graph
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feeds = dict(zip(graph.inputs, inputs))
        expected = None
        if self.check_shapes:
            # sequences (lists) and empty optionals (None) keep their declared infos
            bound = {name: TensorInfo(np.asarray(v).dtype, np.shape(v)) for name, v in feeds.items()
                     if v is not None and not isinstance(v, list)}
            expected = infer_shapes(graph, bound)
        outputs = self.interpreter.run(feeds, expected=expected)
        return tuple(outputs[name] for name in graph.outputs)


class CompiledRep(BackendRep):
    def __init__(self, graph, compiled: CompiledModel):
        self.graph = graph
        self.compiled = compiled

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        feeds = dict(inputs) if isinstance(inputs, dict) else dict(zip(self.graph.inputs, inputs))
        outputs = self.compiled.run(feeds)
        return tuple(outputs[name] for name in self.graph.outputs)


class NnccBackend(Backend):
    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", check_shapes: bool = True,
                route: str = "interpreter", **kwargs: Any) -> BackendRep:
        """route: "interpreter"; "compiled" (the portable plan: numpy backend and CPU
        fallback); "native" (the default backends, the native code built and trusted)."""
        graph = parse_model(model.SerializeToString())
        if route == "compiled":
            return CompiledRep(graph, CompiledModel(compile_graph(graph, CompileOptions(opt_level=2,
                                                                                        backends=("numpy",)))))
        if route == "native":
            return CompiledRep(graph, CompiledModel(compile_graph(graph, CompileOptions(opt_level=2)),
                                                    trust_native=True))
        return NnccRep(Interpreter(graph), check_shapes)

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper().startswith("CPU")


prepare = NnccBackend.prepare
run_model = NnccBackend.run_model
supports_device = NnccBackend.supports_device


def run_node(node: Any, inputs: Sequence[np.ndarray], device: str = "CPU", **kwargs: Any) -> tuple:
    raise NotImplementedError("nncc runs whole models; use run_model")
