"""nncc's QConv and QuantizeDequantize: int8 convolutions and their quantization steps
(nncc/native/int8_conv_gen.py), reading and writing byte images in their own layout."""

from __future__ import annotations

from nncc.native import int8_conv_gen
from nncc.native.ops.entry import NativeOp


class Int8Conv(NativeOp):
    ops = frozenset({int8_conv_gen.QCONV, int8_conv_gen.QUANTIZE_DEQUANTIZE})
    float_values = False  # quantized weights and zero points: int8_conv_gen checks every value
    own_layout = True

    def check(self, node, graph, infos) -> str | None:
        return int8_conv_gen.check(node, graph, infos)

    def render(self, writer, node, plan) -> None:
        int8_conv_gen.emit(writer, node)


ENTRY = Int8Conv()
