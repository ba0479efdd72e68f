"""Transpose of up to 8 axes (elementwise_gen's ``transpose``, the runtime's nn_transpose); a
channel shuffle a convolution reads is the reorder into its blocked layout instead
(layout's ``shuffle_into_blocked``)."""

from __future__ import annotations

from nncc.native.ops.entry import NativeOp


class Transpose(NativeOp):
    ops = frozenset({("", "Transpose")})

    def refuse(self, node, graph, infos) -> str | None:
        return None if len(infos[node.inputs[0]].shape) <= 8 else "rank above 8"

    def render(self, writer, node, plan) -> None:
        if not writer.shuffle_into_blocked(node):
            writer.transpose(node)


ENTRY = Transpose()
