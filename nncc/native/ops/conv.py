"""2-D convolutions, nncc's FusedConv with its activation included (conv_gen's ``conv``:
blocked or over NCHW, a residual Add after it written in the same pass)."""

from __future__ import annotations

from nncc.native.activations import CODES
from nncc.native.graph_query import CONV_OPS
from nncc.native.ops.entry import NativeOp


class Conv(NativeOp):
    ops = frozenset(CONV_OPS)
    own_layout = True  # reads a blocked input as it is, or makes it plain itself

    def refuse(self, node, graph, infos) -> str | None:
        attrs = node.attrs
        x = infos[node.inputs[0]].shape
        if len(x) != 4:
            return "only 2-D convolutions"
        k, cg = infos[node.inputs[1]].shape[:2]
        if cg * int(attrs.get("group", 1)) != x[1]:
            return "weights that do not match the input's channels"
        if len(node.inputs) > 2 and node.inputs[2] and infos[node.inputs[2]].shape != (k,):
            return "a bias that is not one value per output channel"  # the portable kernel says why
        if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            return "auto_pad"
        if attrs.get("activation", "") not in CODES:
            return f"activation {attrs.get('activation')!r}"
        return None

    def render(self, writer, node, plan) -> None:
        writer.conv(node)


ENTRY = Conv()
