"""A residual Add (or Sum of two) of a convolution that deferred its output to it: written by
that convolution's epilogue, with a Relu or Clip after it (conv_gen's ``residual``)."""

from __future__ import annotations

from nncc.native.graph_query import is_pair_sum
from nncc.native.ops.entry import Fusion


class Residual(Fusion):
    def claim(self, writer, node):
        return is_pair_sum(node) and any(i in writer.deferred for i in node.inputs) or None

    def render(self, writer, node, claim) -> None:
        writer.residual(node)


ENTRY = Residual()
