"""Masks: the comparisons (float32, int32 or int64 in, bool out), IsNaN and IsInf (float32
in, bool out), Not, And, Or, Xor (bool in and out) and Where (a bool condition selecting
between float32 values), with broadcasting (nncc/native/mask_gen.py). A bool value lives only inside its partition
(nncc/native/arguments.py moves a node whose mask would cross an edge to numpy)."""

from __future__ import annotations

import numpy as np

from nncc.native import mask_gen
from nncc.native.graph_query import const_value
from nncc.native.mask_gen import BOOL, COMPARE, EXACT_IN_FLOAT, INTEGERS, LOGIC
from nncc.native.ops.entry import F32, NativeOp


class Masks(NativeOp):
    ops = frozenset(("", op) for op in mask_gen.OPS)
    float_values = False  # the types each input must have are checked below

    def check(self, node, graph, infos) -> str | None:
        op = node.op_type
        if op in COMPARE:
            first = _dtype(infos, node.inputs[0])
            kind = first if first in INTEGERS or (first == BOOL and op == "Equal") else F32
            want = [kind, kind]
        elif op in LOGIC:
            want = [BOOL, BOOL]
        elif op == "Not":
            want = [BOOL]
        elif op == "Where":
            want = [BOOL, F32, F32]
        else:  # IsNaN, IsInf
            want = [F32]
        names = list(node.inputs) + list(node.outputs)
        types = want + [F32 if op == "Where" else BOOL]
        if len(node.inputs) != len(want) or not all(names):
            return f"{op} with {len(node.inputs)} inputs"
        for name, dtype in zip(names, types):
            info = infos.get(name)
            if info is None or info.dtype != dtype or not info.is_static:
                return f"value {name!r} is not a static {dtype} tensor"
            value = const_value(graph, infos, name) if dtype in INTEGERS else None
            if value is not None and np.size(value) and not (
                    -EXACT_IN_FLOAT <= np.min(value) and np.max(value) <= EXACT_IN_FLOAT):
                return f"an integer constant {name!r} beyond what a packed float32 holds exactly"
        return None

    def render(self, writer, node, plan) -> None:
        mask_gen.emit(writer, node)


def _dtype(infos, name) -> np.dtype | None:
    info = infos.get(name)
    return None if info is None else info.dtype


ENTRY = Masks()
