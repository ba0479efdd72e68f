"""Elementwise ops: unary, broadcasting binary, the activations as ops (Clip, LeakyRelu,
HardSigmoid, HardSwish), Pow by a constant exponent, and the reshape-like ops that alias
their input (elementwise_gen's steps, blocked ones through the blocked layout)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nncc.native.elementwise_gen import ALIASES, BINARY, PARAMETRIC, POW_BY, UNARY
from nncc.native.graph_query import const_value, scalar_const
from nncc.native.mask_gen import BOOL
from nncc.native.ops.entry import NativeOp, static_values_refused


@dataclass(frozen=True)
class Elementwise:
    form: str  # "alias" (no step unless it is a partition output), "unary" or "binary"
    expr: str = ""  # the C expression of v (unary) or of a and b (binary)


class ElementwiseOps(NativeOp):
    ops = frozenset(("", op) for op in [*UNARY, *BINARY, *ALIASES, *PARAMETRIC])
    blocked = True

    def data_inputs(self, node) -> list[str]:
        """What the code reads: not a reshape's shape, Clip's bounds or Dropout's ratio."""
        if node.op_type in ("Reshape", "Unsqueeze", "Squeeze", "Clip", "Dropout"):
            return list(node.inputs[:1])
        return list(node.inputs)

    def check(self, node, graph, infos) -> str | None:
        if node.op_type == "Clip":
            for bound in node.inputs[1:]:
                value = const_value(graph, infos, bound) if bound else 0.0
                if value is None or np.size(value) != 1 or np.asarray(value).dtype.kind != "f":
                    return "Clip bounds are not float constant scalars"
        elif node.op_type == "Dropout" and len([o for o in node.outputs if o]) > 1:
            return "Dropout's mask output"
        elif node.op_type in ALIASES and _static_mask(infos, node.inputs[0]) and _static_mask(infos, node.outputs[0]):
            return None  # a mask's view: masks live inside a partition (nncc/native/mask_gen.py)
        elif node.op_type in INDEX_VIEWS and _run_time_ints(graph, infos, node.inputs[0], node.outputs[0]):
            return None  # a view of ids (a picked column unsqueezed): they live inside a partition too
        why = static_values_refused(node, infos, self.data_inputs(node))
        if why is None and node.op_type in BINARY and len(node.inputs) != 2:
            return "variadic form"
        return why

    def plan(self, writer, node) -> Elementwise:
        op = node.op_type
        if op in ALIASES:
            return Elementwise("alias")
        exponent = _pow_by(writer, node)
        if exponent is not None:
            return Elementwise("unary", POW_BY[exponent])
        if op in BINARY:
            return Elementwise("binary", BINARY[op])
        return Elementwise("unary", writer.unary_expr(node))

    def render(self, writer, node, plan: Elementwise) -> None:
        if plan.form == "alias":
            writer.reshape(node)
        elif plan.form == "binary":
            writer.binary(node, plan.expr)
        else:
            writer.unary(node, plan.expr)

    def render_blocked(self, writer, node) -> bool:
        op = node.op_type
        exponent = _pow_by(writer, node)
        if exponent is not None:
            return writer.blocked_unary(node, POW_BY[exponent])
        if op in BINARY:
            return writer.blocked_binary(node, BINARY[op], writer.broadcast_loop)
        if op in UNARY or op in PARAMETRIC:
            return writer.blocked_unary(node, writer.unary_expr(node))
        return False


def _static_mask(infos, name) -> bool:
    info = infos.get(name)
    return info is not None and info.dtype == BOOL and info.is_static


INDEX_VIEWS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}
INTS = (np.dtype(np.int32), np.dtype(np.int64))


def _run_time_ints(graph, infos, x, y) -> bool:
    """``x`` and ``y``: int32 or int64 values of one type with static shapes, known only at
    run time (a constant's view is folded at -O1, and packed constants are float32)."""
    a, b = infos.get(x), infos.get(y)
    return (a is not None and b is not None and a.dtype in INTS and a.dtype == b.dtype and a.is_static
            and b.is_static and const_value(graph, infos, x) is None)


def _pow_by(writer, node) -> float | None:
    """Pow's exponent when it is a constant with a cheaper form than powf."""
    if node.op_type != "Pow":
        return None
    exponent = scalar_const(writer.graph, writer.infos, node.inputs[1])
    return exponent if exponent in POW_BY else None


ENTRY = ElementwiseOps()
