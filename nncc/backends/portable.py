"""The portable backend: every node runs as its registered (numpy) kernel.

It is one backend under two names: ``numpy`` (its name, recorded in plans) and ``cpu``
(an alias). It is also the fallback: the nodes no backend takes, itself included, run
here. What it *selects* are the nodes its buffers can be planned for ahead of time (static
shapes, plain numeric dtypes); the rest it runs too, and the plan records why each was
not selected (``nncc inspect`` shows those fallbacks), since they run without planned
memory.
"""

from __future__ import annotations

import numpy as np

from nncc.backends.base import Backend
from nncc.errors import UnsupportedOpError
from nncc.ir.graph import Graph, TensorInfo
from nncc.kernels.registry import resolve

# dtypes whose buffers are planned; anything else (strings, complex) falls back.
FAST_DTYPES = {np.dtype(t) for t in (np.float32, np.float64, np.float16, np.int64, np.int32,
                                     np.int8, np.uint8, np.int16, np.uint16, np.bool_)}


class PortableBackend(Backend):
    name = "numpy"
    aliases = ("cpu",)
    version = "1"
    maker = "nncc"
    targets = "cpu (numpy kernels, BLAS; dynamic shapes)"

    def partition(self, graph: Graph, infos: dict[str, TensorInfo]) -> dict[int, int | None]:
        selected = {}
        for index, node in enumerate(graph.nodes):
            if self.reject_reason(node, graph, infos) is None:
                selected[index] = None
        return selected

    def reject_reason(self, node, graph: Graph, infos: dict[str, TensorInfo]) -> str | None:
        try:
            resolve(node.op_type, node.domain, graph.opset(node.domain))
        except UnsupportedOpError as exc:
            return str(exc)
        for name in list(node.inputs) + list(node.outputs):
            if not name:
                continue
            info = infos.get(name)
            if info is not None and info.kind != "tensor":
                return f"value {name!r} is a {info.kind.replace('_', ' ')}, not a tensor"
            if info is None or not info.is_static:
                return f"value {name!r} has no static shape"
            if info.dtype not in FAST_DTYPES:
                return f"value {name!r} has dtype {info.dtype}, not planned by the fast path"
        return None
