"""GELU, ONNX's and nncc's (a GELU spelled out in ops, passes/fusion.py), over the thread
pool (elementwise_gen's ``gelu``)."""

from __future__ import annotations

from nncc.native.elementwise_gen import GELU_FORMS, GELU_OPS
from nncc.native.ops.entry import NativeOp


class Gelu(NativeOp):
    ops = frozenset(GELU_OPS)

    def refuse(self, node, graph, infos) -> str | None:
        approximate = node.attrs.get("approximate", "none")
        return None if approximate in GELU_FORMS else f"Gelu approximate={approximate!r}"

    def render(self, writer, node, plan) -> None:
        writer.gelu(node)


ENTRY = Gelu()
