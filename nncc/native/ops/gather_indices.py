"""Gather whose indices or data are integers known at run time (nncc/native/gather_gen.py):
by run-time int32 or int64 indices (from the model's inputs or a step of the partition)
over float32, int32 or int64 data, constant or not (embeddings); and by constant indices
over run-time int32 or int64 data (a categorical column picked out of a model's integer
input, whose ids then index an embedding table). And Concat of run-time int32 or int64
values (such ids joined). Gather of float32 data by constant indices is an element move
(ops/data_movement.py)."""

from __future__ import annotations

import numpy as np

from nncc.native import gather_gen
from nncc.native.graph_query import const_value
from nncc.native.ops.entry import NativeOp


class GatherByIndices(NativeOp):
    ops = frozenset({("", "Gather")})
    float_values = False  # integer indices or data: checked below

    def takes(self, node, graph, infos) -> bool:
        if not super().takes(node, graph, infos) or len(node.inputs) < 2:
            return False
        data = infos.get(node.inputs[0])
        return const_value(graph, infos, node.inputs[1]) is None or (
            data is not None and str(data.dtype) in gather_gen.INDEX_CTYPES)

    def check(self, node, graph, infos) -> str | None:
        data, indices, out = (infos.get(n) for n in (node.inputs[0], node.inputs[1], node.outputs[0]))
        for name, info in ((node.inputs[0], data), (node.outputs[0], out)):
            if info is None or str(info.dtype) not in gather_gen.DATA_CTYPES or not info.is_static:
                return f"value {name!r} is not a static float32, int32 or int64 tensor"
        if data.dtype != out.dtype:
            return "a Gather whose output type differs from its data's"
        if str(data.dtype) in gather_gen.INDEX_CTYPES and const_value(graph, infos, node.inputs[0]) is not None:
            return f"a Gather of a {data.dtype} constant (folded at -O1)"  # packed constants are float32
        if not data.shape or not -len(data.shape) <= int(node.attrs.get("axis", 0)) < len(data.shape):
            return "a Gather axis out of range"
        extent = data.shape[int(node.attrs.get("axis", 0))]
        if extent == 0:
            return "a Gather from an empty axis"
        picks = const_value(graph, infos, node.inputs[1])
        if picks is not None:
            picks = np.asarray(picks)
            if picks.dtype.kind not in "iu":
                return "Gather indices are not integers"
            if picks.size == 0:
                return "a Gather of no indices"
            if gather_gen.constant_positions(picks, extent) is None:
                return "a Gather index out of range"
            return None
        if indices is None or str(indices.dtype) not in gather_gen.INDEX_CTYPES or not indices.is_static:
            return f"Gather indices {node.inputs[1]!r} are not static int32 or int64"
        return None

    def plan(self, writer, node):
        picks = const_value(writer.graph, writer.infos, node.inputs[1])
        if picks is None:
            return None
        extent = writer.shape(node.inputs[0])[int(node.attrs.get("axis", 0))]
        return gather_gen.constant_positions(picks, extent)

    def render(self, writer, node, plan) -> None:
        gather_gen.emit(writer, node, plan)


class IndexConcat(NativeOp):
    """Concat of run-time int32 or int64 values: ids picked apart, joined into one index
    tensor (a float32 Concat is ops/sum_concat.py's)."""

    ops = frozenset({("", "Concat")})
    float_values = False  # integers: checked below

    def takes(self, node, graph, infos) -> bool:
        first = infos.get(node.inputs[0]) if node.inputs and node.inputs[0] else None
        return super().takes(node, graph, infos) and first is not None and \
            str(first.dtype) in gather_gen.INDEX_CTYPES

    def check(self, node, graph, infos) -> str | None:
        out = infos.get(node.outputs[0])
        for name in [*node.inputs, node.outputs[0]]:
            info = infos.get(name) if name else None
            if info is None or out is None or info.dtype != out.dtype or not info.is_static:
                return f"value {name!r} is not a static {out.dtype if out is not None else 'integer'} tensor"
            if name != node.outputs[0] and const_value(graph, infos, name) is not None:
                return f"a Concat of a {info.dtype} constant (packed constants are float32)"
        if not out.shape or not -len(out.shape) <= int(node.attrs.get("axis", 0)) < len(out.shape):
            return "a Concat axis out of range"
        return None

    def render(self, writer, node, plan) -> None:
        gather_gen.concat(writer, node)


ENTRY = GatherByIndices()
CONCAT = IndexConcat()
