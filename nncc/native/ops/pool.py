"""2-D max and average pooling, and GlobalAveragePool and GlobalMaxPool of any rank from 3
(conv_gen's ``pool``, or over the blocked layout)."""

from __future__ import annotations

from nncc.native.conv_gen import GLOBAL_POOLS, POOL_OPS
from nncc.native.ops.entry import NativeOp


class Pool(NativeOp):
    ops = frozenset(("", op) for op in POOL_OPS)
    blocked = True

    def refuse(self, node, graph, infos) -> str | None:
        op, attrs = node.op_type, node.attrs
        if op in GLOBAL_POOLS:
            return None if len(infos[node.inputs[0]].shape) >= 3 else "a global pool of rank below 3"
        if len(infos[node.inputs[0]].shape) != 4:
            return "only 2-D pooling"
        if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            return "auto_pad"
        if op == "MaxPool" and (len([o for o in node.outputs if o]) > 1 or attrs.get("storage_order", 0)):
            return "MaxPool indices"
        if op == "AveragePool" and (attrs.get("dilations") and any(d != 1 for d in attrs["dilations"])):
            return "dilated average pooling"
        return None

    def render(self, writer, node, plan) -> None:
        writer.pool(node)

    def render_blocked(self, writer, node) -> bool:
        return writer.blocked_pool(node)


ENTRY = Pool()
