"""Softmax and LogSoftmax over the last axis (before opset 13: over the flattened axes from
``axis``), as rows of the runtime's nn_softmax_rows. An inner axis is ops/data_movement.py's."""

from __future__ import annotations

import math
from dataclasses import dataclass

from nncc.native.ops.entry import NativeOp


@dataclass(frozen=True)
class Rows:
    rows: int
    n: int
    log: bool


def _axis(node, graph) -> int:
    return node.attrs.get("axis", -1 if graph.opset(node.domain) >= 13 else 1)


class Softmax(NativeOp):
    ops = frozenset({("", "Softmax"), ("", "LogSoftmax")})

    def refuse(self, node, graph, infos) -> str | None:
        shape = infos[node.inputs[0]].shape
        if graph.opset(node.domain) >= 13 and _axis(node, graph) % max(len(shape), 1) != len(shape) - 1:
            return "softmax over an inner axis"
        return None

    def plan(self, writer, node) -> Rows:
        shape = writer.shape(node.inputs[0])
        axis = _axis(node, writer.graph) % len(shape)
        return Rows(math.prod(shape[:axis]), math.prod(shape[axis:]), node.op_type == "LogSoftmax")

    def render(self, writer, node, plan: Rows) -> None:
        writer.softmax_rows(node, plan.rows, plan.n, plan.log)


ENTRY = Softmax()
