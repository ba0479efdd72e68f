"""The activations that gate x by a function of itself, as one elementwise loop: ONNX Swish
and Mish, and nncc's HardSwish, Silu and Mish that passes/fusion.py writes for a spelled-out
form at an opset without the ONNX op (ONNX HardSwish is elementwise.py's). Over the blocked
layout when the input is in it (after a convolution that could not take the activation)."""

from __future__ import annotations

from nncc.native.activations import CODES
from nncc.native.c_literal import c_float
from nncc.native.ops.entry import NativeOp

_MISH = "(v * nn_tanh(v > 20.0f ? v : log1pf(nn_exp(v))))"  # softplus(v) is v in float32 above 20
_EXPRESSIONS = {
    ("nncc", "HardSwish"): f"nn_act({CODES['HardSwish']}, v, 0.0f, 0.0f)",
    ("nncc", "Silu"): "(v * nn_sigmoid(v))",
    ("nncc", "Mish"): _MISH,
    ("", "Mish"): _MISH,
}


class SelfGated(NativeOp):
    ops = frozenset({*_EXPRESSIONS, ("", "Swish")})
    own_layout = True  # keeps a blocked input's layout itself

    def plan(self, writer, node) -> str:
        """The C expression of v."""
        if node.op_type == "Swish":
            return f"(v * nn_sigmoid({c_float(float(node.attrs.get('alpha', 1.0)))} * v))"
        return _EXPRESSIONS[(node.domain, node.op_type)]

    def render(self, writer, node, plan: str) -> None:
        if writer.is_blocked(node.inputs[0]) and writer.blocked_unary(node, plan):
            return
        writer.plain_inputs(node)
        writer.unary(node, plan)


ENTRY = SelfGated()
