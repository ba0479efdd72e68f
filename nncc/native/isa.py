"""The vector width native code is laid out for: what the blocked activation layout, the
packed weights and the micro-kernels of nncc/native/simd.h agree on.

Chosen from the CPU features the target may use (for "native", the host's own; they are
in the cache token already), so a plan's packed constants always match its code: AVX-512
gives 16 floats, AVX2 with FMA 8, anything else 4 (GCC's generic vectors).
"""

from __future__ import annotations

from nncc.native.toolchain import required_features


def vector_floats(target: str) -> int:
    features = set(required_features(target))
    if "avx512f" in features:
        return 16
    if {"avx2", "fma"} <= features:
        return 8
    return 4


# vector registers the C compiler has for each vector width above: AVX-512's 32 zmm, AVX2's
# 16 ymm, and 16 for the generic vectors (SSE's xmm); a register tile of a micro-kernel is
# sized from this, leaving room for its operands
REGISTERS_BY_WIDTH = {16: 32, 8: 16, 4: 16}


def vector_registers(target: str) -> int:
    """The vector registers of the target's ISA, for the vector width vector_floats gives."""
    return REGISTERS_BY_WIDTH[vector_floats(target)]
