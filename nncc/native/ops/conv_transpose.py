"""ConvTranspose, 1-D and 2-D with constant weights: a GEMM by the weights, then a
scatter of each tap into the output (nncc/native/conv_transpose_gen.py)."""

from __future__ import annotations

from nncc.native import conv_transpose_gen
from nncc.native.ops.entry import NativeOp


class ConvTranspose(NativeOp):
    ops = frozenset({("", "ConvTranspose")})

    def refuse(self, node, graph, infos) -> str | None:
        return conv_transpose_gen.refused(node, graph, infos)

    def render(self, writer, node, plan) -> None:
        conv_transpose_gen.emit(writer, node)


ENTRY = ConvTranspose()
