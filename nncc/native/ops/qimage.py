"""nncc's QAdd, QGlobalAveragePool and QGemm over quantized images (nncc/native/qimage_ops_gen.py)."""

from __future__ import annotations

from nncc.native import qimage_ops_gen
from nncc.native.ops.entry import NativeOp


class QuantizedImageOps(NativeOp):
    ops = frozenset(qimage_ops_gen.OPS)
    float_values = False  # quantization parameters: qimage_ops_gen checks every value
    own_layout = True

    def check(self, node, graph, infos) -> str | None:
        return qimage_ops_gen.check(node, graph, infos)

    def render(self, writer, node, plan) -> None:
        qimage_ops_gen.emit(writer, node)


ENTRY = QuantizedImageOps()
