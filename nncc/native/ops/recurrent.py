"""RNN, GRU and LSTM (nncc/native/recurrent_gen.py, which checks its own values: a
sequence_lens input is int32)."""

from __future__ import annotations

from nncc.native import recurrent_gen
from nncc.native.ops.entry import Generated


class Recurrent(Generated):
    generator = recurrent_gen
    ops = frozenset(("", op) for op in recurrent_gen.GATES)


ENTRY = Recurrent()
