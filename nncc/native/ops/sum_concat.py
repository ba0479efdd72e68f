"""Sum of same-shape operands and Concat (elementwise_gen's steps, or over the blocked layout)."""

from __future__ import annotations

from nncc.native.ops.entry import NativeOp


class Sum(NativeOp):
    ops = frozenset({("", "Sum")})
    blocked = True

    def refuse(self, node, graph, infos) -> str | None:
        out = infos[node.outputs[0]].shape
        if not node.inputs or any(not n or infos[n].shape != out for n in node.inputs):
            return "Sum with broadcasting or omitted inputs"
        return None

    def render(self, writer, node, plan) -> None:
        writer.sum(node)

    def render_blocked(self, writer, node) -> bool:
        return writer.blocked_sum(node)


class Concat(NativeOp):
    ops = frozenset({("", "Concat")})
    blocked = True

    def refuse(self, node, graph, infos) -> str | None:
        return "Concat with an omitted input" if any(not n for n in node.inputs) else None

    def render(self, writer, node, plan) -> None:
        writer.concat(node)

    def render_blocked(self, writer, node) -> bool:
        return writer.blocked_concat(node)


SUM = Sum()
CONCAT = Concat()
