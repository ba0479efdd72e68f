"""nncc's ScaleShift: y = act(x * scale[c] + shift[c]), a BatchNormalization that could not
fold into a convolution (conv_gen's ``scale_shift``, blocked when its input is)."""

from __future__ import annotations

from nncc.native.activations import CODES
from nncc.native.graph_query import AFFINE_OPS
from nncc.native.ops.entry import NativeOp


class ScaleShift(NativeOp):
    ops = frozenset(AFFINE_OPS)
    own_layout = True

    def refuse(self, node, graph, infos) -> str | None:
        if node.attrs.get("activation", "") not in CODES:
            return f"activation {node.attrs.get('activation')!r}"
        c = infos[node.inputs[0]].shape[1]
        if any(not n or infos[n].shape != (c,) for n in node.inputs[1:3]):
            return "scale and shift are not per-channel vectors"
        return None

    def render(self, writer, node, plan) -> None:
        writer.scale_shift(node)


ENTRY = ScaleShift()
