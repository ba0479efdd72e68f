"""Cast. A Cast to the type its input already has (float32 to float32, as RMSNorm exports
write) is an alias, like Reshape; the -O1 passes remove it before partitioning
(passes/cleanup.py), so this is for -O0. A Cast to or from another type stays portable:
every buffer of a native call is a float32 tensor, and its reason says so."""

from __future__ import annotations

from nncc.native.ops.entry import NativeOp, static_f32


class Cast(NativeOp):
    ops = frozenset({("", "Cast")})
    float_values = False  # the check below names the types instead

    def check(self, node, graph, infos) -> str | None:
        src, dst = infos.get(node.inputs[0]), infos.get(node.outputs[0])
        if static_f32(src) and static_f32(dst):
            return None
        if src is not None and dst is not None and src.dtype == dst.dtype:
            return f"a Cast of {_type(src)} values with a dynamic shape"
        return f"a Cast from {_type(src)} to {_type(dst)}: native code holds float32 values only"

    def render(self, writer, node, plan) -> None:
        writer.reshape(node)  # the same values: an alias, or a copy into a partition output


def _type(info) -> str:
    return "an unknown type" if info is None or info.dtype is None else str(info.dtype)


ENTRY = Cast()
