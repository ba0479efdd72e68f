"""Cast. A Cast to the type its input already has (float32 to float32, as RMSNorm exports
write) is an alias, like Reshape; the -O1 passes remove it before partitioning
(passes/cleanup.py), so this is for -O0. A Cast between float32, int32, int64, uint8 and
bool is one conversion loop (nncc/native/cast_gen.py: ONNX's rounding, and no undefined
conversion in C); its non-float32 side lives inside the partition (nncc/native/arguments.py).
A Cast to or from another type stays portable, and its reason names the types."""

from __future__ import annotations

from nncc.native import cast_gen
from nncc.native.graph_query import const_value
from nncc.native.ops.entry import NativeOp, static_f32

HELD = "float32, int32, int64, uint8 and bool"


class Cast(NativeOp):
    ops = frozenset({("", "Cast")})
    float_values = False  # the check below names the types instead

    def check(self, node, graph, infos) -> str | None:
        src, dst = infos.get(node.inputs[0]), infos.get(node.outputs[0])
        if static_f32(src) and static_f32(dst):
            return None
        if src is None or dst is None or src.dtype not in cast_gen.CTYPES or dst.dtype not in cast_gen.CTYPES:
            return f"a Cast from {_type(src)} to {_type(dst)}: native code holds {HELD} values only"
        if not (src.is_static and dst.is_static):
            return f"a Cast of {_type(src)} values with a dynamic shape"
        if src.dtype != cast_gen.FLOAT and const_value(graph, infos, node.inputs[0]) is not None:
            return f"a Cast of a {src.dtype} constant (folded at -O1)"  # packed constants are float32
        return None

    def render(self, writer, node, plan) -> None:
        src, dst = writer.infos[node.inputs[0]].dtype, writer.infos[node.outputs[0]].dtype
        if src == dst:
            writer.reshape(node)  # the same values: an alias, or a copy into a partition output
        else:
            cast_gen.emit(writer, node)


def _type(info) -> str:
    return "an unknown type" if info is None or info.dtype is None else str(info.dtype)


ENTRY = Cast()
