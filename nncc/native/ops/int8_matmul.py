"""com.microsoft DynamicQuantizeMatMul as one int8 GEMM step (nncc/native/int8_gemm_gen.py)."""

from __future__ import annotations

from nncc.native import int8_gemm_gen
from nncc.native.ops.entry import Generated


class DynamicQuantizeMatMul(Generated):
    generator = int8_gemm_gen
    ops = frozenset({("com.microsoft", "DynamicQuantizeMatMul")})
    own_layout = True


ENTRY = DynamicQuantizeMatMul()
