"""RNN, GRU and LSTM (nncc/native/recurrent_gen.py, which checks its own values: a
sequence_lens input is int32)."""

from __future__ import annotations

from nncc.native import recurrent_gen
from nncc.native.ops.entry import NativeOp


class Recurrent(NativeOp):
    ops = frozenset(("", op) for op in recurrent_gen.GATES)
    float_values = False

    def check(self, node, graph, infos) -> str | None:
        return recurrent_gen.check(node, graph, infos)

    def render(self, writer, node, plan) -> None:
        recurrent_gen.emit(writer, node)


ENTRY = Recurrent()
