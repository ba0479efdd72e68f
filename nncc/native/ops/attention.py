"""nncc's FusedAttention: scaled dot-product attention in blocks of keys (nncc/native/attention_gen.py)."""

from __future__ import annotations

from nncc.native import attention_gen
from nncc.native.ops.entry import NativeOp


class Attention(NativeOp):
    ops = frozenset({("nncc", "FusedAttention")})

    def refuse(self, node, graph, infos) -> str | None:
        return attention_gen.check(node, graph, infos)

    def render(self, writer, node, plan) -> None:
        attention_gen.emit(writer, node)


ENTRY = Attention()
