"""Floor, Ceil, Round (half to even, as ONNX asks: the default rounding mode's
``nearbyintf``) and Sign, one elementwise step each (elementwise_gen's ``unary``, over the
blocked layout after a convolution). NaN stays NaN, and the infinities stay themselves
(Sign gives +-1, and +0 for either zero, as onnxruntime does)."""

from __future__ import annotations

from nncc.native.ops.entry import NativeOp

EXPRESSIONS = {
    "Floor": "floorf(v)",
    "Ceil": "ceilf(v)",
    "Round": "nearbyintf(v)",
    "Sign": "(v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : (v == 0.0f ? 0.0f : v)))",  # -0 gives +0, NaN NaN
}


class Rounding(NativeOp):
    ops = frozenset(("", op) for op in EXPRESSIONS)
    blocked = True

    def render(self, writer, node, plan) -> None:
        writer.unary(node, EXPRESSIONS[node.op_type])

    def render_blocked(self, writer, node) -> bool:
        return writer.blocked_unary(node, EXPRESSIONS[node.op_type])


ENTRY = Rounding()
