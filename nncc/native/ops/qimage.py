"""nncc's QAdd, QGlobalAveragePool and QGemm over quantized images (nncc/native/qimage_ops_gen.py)."""

from __future__ import annotations

from nncc.native import qimage_ops_gen
from nncc.native.ops.entry import Generated


class QuantizedImageOps(Generated):
    generator = qimage_ops_gen
    ops = frozenset(qimage_ops_gen.OPS)
    own_layout = True


ENTRY = QuantizedImageOps()
