"""nncc's QConv and QuantizeDequantize: int8 convolutions and their quantization steps
(nncc/native/int8_conv_gen.py), reading and writing byte images in their own layout."""

from __future__ import annotations

from nncc.native import int8_conv_gen
from nncc.native.ops.entry import Generated


class Int8Conv(Generated):
    generator = int8_conv_gen
    ops = frozenset({int8_conv_gen.QCONV, int8_conv_gen.QUANTIZE_DEQUANTIZE})
    own_layout = True


ENTRY = Int8Conv()
