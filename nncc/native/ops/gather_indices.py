"""Gather by run-time indices (int32 or int64, from the model's inputs or a Cast in the
partition) over float32 data, constant or not: embeddings (nncc/native/gather_gen.py).
Gather by constant indices is an element move (ops/data_movement.py)."""

from __future__ import annotations

from nncc.native import gather_gen
from nncc.native.graph_query import const_value
from nncc.native.ops.entry import NativeOp, static_f32


class GatherByIndices(NativeOp):
    ops = frozenset({("", "Gather")})
    float_values = False  # the indices are integers: checked below

    def takes(self, node, graph, infos) -> bool:
        return super().takes(node, graph, infos) and len(node.inputs) > 1 and \
            const_value(graph, infos, node.inputs[1]) is None

    def check(self, node, graph, infos) -> str | None:
        data, indices, out = (infos.get(n) for n in (node.inputs[0], node.inputs[1], node.outputs[0]))
        for name, info in ((node.inputs[0], data), (node.outputs[0], out)):
            if not static_f32(info):
                return f"value {name!r} is not a static float32 tensor"
        if indices is None or str(indices.dtype) not in gather_gen.INDEX_CTYPES or not indices.is_static:
            return f"Gather indices {node.inputs[1]!r} are not static int32 or int64"
        if not data.shape or not -len(data.shape) <= int(node.attrs.get("axis", 0)) < len(data.shape):
            return "a Gather axis out of range"
        if data.shape[int(node.attrs.get("axis", 0))] == 0:
            return "a Gather from an empty axis"
        return None

    def render(self, writer, node, plan) -> None:
        gather_gen.emit(writer, node)


ENTRY = GatherByIndices()
