"""com.microsoft DynamicQuantizeMatMul as one int8 GEMM step (nncc/native/int8_gemm_gen.py)."""

from __future__ import annotations

from nncc.native import int8_gemm_gen
from nncc.native.ops.entry import NativeOp


class DynamicQuantizeMatMul(NativeOp):
    ops = frozenset({("com.microsoft", "DynamicQuantizeMatMul")})
    float_values = False  # int8 weights: int8_gemm_gen checks every value
    own_layout = True

    def check(self, node, graph, infos) -> str | None:
        return int8_gemm_gen.check(node, graph, infos)

    def render(self, writer, node, plan) -> None:
        int8_gemm_gen.emit(writer, node)


ENTRY = DynamicQuantizeMatMul()
