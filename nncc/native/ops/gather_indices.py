"""Gather whose indices or data are integers known at run time (nncc/native/gather_gen.py):
by run-time int32 or int64 indices (from the model's inputs or a step of the partition)
over float32, int32 or int64 data, constant or not (embeddings); and by constant indices
over run-time int32 or int64 data (a categorical column picked out of a model's integer
input, whose ids then index an embedding table). And Concat of run-time int32 or int64
values (such ids joined), and Slice of them along one axis (a run of columns). Gather and
Slice of float32 data by constant indices are element moves (ops/data_movement.py)."""

from __future__ import annotations

import numpy as np

from nncc.errors import KernelError
from nncc.kernels import tensor as tensor_math
from nncc.kernels.registry import Ctx
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


class IndexSlice(NativeOp):
    """Slice of run-time int32 or int64 values along one axis (a run of categorical columns,
    ``ids[:, 1:3]``), by constant bounds: a pick of the positions the bounds give."""

    ops = frozenset({("", "Slice")})
    float_values = False  # integers: checked below

    def takes(self, node, graph, infos) -> bool:
        data = infos.get(node.inputs[0]) if node.inputs else None
        return super().takes(node, graph, infos) and data is not None and \
            str(data.dtype) in gather_gen.INDEX_CTYPES

    def check(self, node, graph, infos) -> str | None:
        data, out = infos.get(node.inputs[0]), infos.get(node.outputs[0])
        if out is None or data.dtype != out.dtype or not (data.is_static and out.is_static) or not data.shape:
            return f"a Slice of {data.dtype} values with a dynamic shape or another output type"
        if const_value(graph, infos, node.inputs[0]) is not None:
            return f"a Slice of a {data.dtype} constant (folded at -O1)"  # packed constants are float32
        try:
            axis, positions = slice_positions(node, graph, infos)
        except KernelError as why:
            return str(why)
        if positions.size == 0:
            return "an empty Slice"
        if tuple(out.shape) != tuple(data.shape[:axis]) + (positions.size,) + tuple(data.shape[axis + 1:]):
            return f"output shape {list(out.shape)} differs from the Slice's"
        return None

    def plan(self, writer, node):
        return slice_positions(node, writer.graph, writer.infos)

    def render(self, writer, node, plan) -> None:
        axis, positions = plan
        gather_gen.emit(writer, node, positions, axis)


def slice_positions(node, graph, infos) -> tuple[int, np.ndarray]:
    """(axis, the positions a Slice keeps along it), with the portable kernel's reading of
    its bounds; KernelError when they are not constants or cut more than one axis."""
    shape = infos[node.inputs[0]].shape
    ctx = Ctx(node.attrs, graph.opset(node.domain), len(node.outputs), node.name)
    values = []
    for name in (list(node.inputs[1:5]) + [""] * 4)[:4] if ctx.opset >= 10 else ["", "", "", ""]:
        value = const_value(graph, infos, name) if name else None
        if name and value is None:
            raise KernelError("Slice bounds that are not constants")
        values.append(value)
    lists = tensor_math.slice_inputs(ctx, *values, KernelError)
    cut = []
    for axis, start, end, step in tensor_math.slice_spec(ctx, len(shape), *lists, KernelError):
        bounds, length = tensor_math.slice_bounds(shape[axis], start, end, step)
        positions = np.arange(shape[axis], dtype=np.int64)[bounds][:length]
        if not np.array_equal(positions, np.arange(shape[axis])):
            cut.append((axis, positions))
    if len(cut) > 1:
        raise KernelError("a Slice of integers along more than one axis")
    return cut[0] if cut else (0, np.arange(shape[0], dtype=np.int64))


ENTRY = GatherByIndices()
CONCAT = IndexConcat()
SLICE = IndexSlice()
