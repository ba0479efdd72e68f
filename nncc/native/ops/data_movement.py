"""Data movement, reductions, LRN, Resize and Softmax over an inner axis over plain data
(nncc/native/plain_ops.py, which checks its own values: only the data input is read)."""

from __future__ import annotations

from nncc.native import plain_ops
from nncc.native.ops.entry import NativeOp


class PlainOps(NativeOp):
    ops = frozenset(("", op) for op in plain_ops.OPS)
    float_values = False

    def takes(self, node, graph, infos) -> bool:
        if (node.domain, node.op_type) not in self.ops:
            return False
        if node.op_type in ("Softmax", "LogSoftmax"):  # over the last axis: ops/softmax.py
            return plain_ops.inner_softmax_axis(node, graph, infos) is not None
        return True

    def check(self, node, graph, infos) -> str | None:
        try:
            plain_ops.plan(node, graph, infos)
        except plain_ops.Refused as why:
            return str(why)
        return None

    def plan(self, writer, node):
        return plain_ops.plan(node, writer.graph, writer.infos)

    def render(self, writer, node, plan) -> None:
        plain_ops.emit(writer, node, plan)


ENTRY = PlainOps()
