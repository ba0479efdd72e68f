"""3x3 stride-1 convolutions by Winograd's minimal filtering F(4x4, 3x3), over the
channel-blocked layout.

Each 4x4 tile of output is computed from a 6x6 tile of input with 36 multiplies per input
and output channel pair instead of 144: the input tile is transformed (V = Bᵀ d B), every
one of the 36 positions becomes one product of [tiles x C] by [C x K] (the same
register-blocked micro-kernel as a 1x1 convolution, nncc/native/blocked_conv.py), and the
products are transformed back (Y = Aᵀ M A) with the bias, residual and activation applied
in that store. The filters are transformed (U = G g Gᵀ) and packed at compile time, so a
cache hit maps them as they are.

Three parallel phases over the pool: input transform (tiles and channel blocks), the 36
products, output transform. Rounding differs from a direct convolution by the transforms'
few extra additions; the interpolation points 0, ±1, ±2 keep the constants small, and the
error stays within a few units in the last place of the output's magnitude times the
reduction length, as for a GEMM.
"""

from __future__ import annotations

from fractions import Fraction as Fr

import numpy as np

from nncc.native.activations import SCALAR_ONLY
from nncc.native.blocked_conv import (Conv2d, after_store, blocks, choose_tiling, direct_conv, pack_direct_weights,
                                      parallel_call, stored)

BT = [[4, 0, -5, 0, 1, 0],
      [0, -4, -4, 1, 1, 0],
      [0, 4, -4, -1, 1, 0],
      [0, -2, -1, 2, 1, 0],
      [0, 2, -1, -2, 1, 0],
      [0, 4, 0, -5, 0, 1]]
G = [[Fr(1, 4), 0, 0],
     [Fr(-1, 6), Fr(-1, 6), Fr(-1, 6)],
     [Fr(-1, 6), Fr(1, 6), Fr(-1, 6)],
     [Fr(1, 24), Fr(1, 12), Fr(1, 6)],
     [Fr(1, 24), Fr(-1, 12), Fr(1, 6)],
     [0, 0, 1]]
AT = [[1, 1, 1, 1, 1, 0],
      [0, 1, -1, 2, -2, 0],
      [0, 1, 1, 4, 4, 0],
      [0, 1, -1, 8, -8, 1]]


# What decides whether it pays (rough figures of a current x86 core pair): the products
# run at about the direct kernel's rate, but the transformed filters are four times the
# size, and a small plane (few tiles) reads each of them only a few times, so a 512-channel
# 7x7 layer reads 38 MB of filters instead of 9 MB.
DIRECT_FLOPS = 190e9  # dense multiply-adds per second of the direct kernel, two threads
SPEEDUP = 3.5  # the products' saving over a direct convolution, transforms included
MEMORY = 37e9  # bytes per second of filters streamed from memory (measured in ResNet-18)
# Fewer tiles than this read each transformed filter too few times to pay for holding it
# four times larger (a 7x7 plane has 4; ResNet-50's three such layers would add 113 MB).
MIN_TILES = 16


def applies(g: Conv2d, vl: int) -> bool:
    """Where Winograd pays: 3x3, stride 1, undilated, ungrouped, enough channels for the
    products to be real GEMMs, a plane of at least one whole tile, and filters that its
    saving outweighs reading four times larger."""
    if not (g.kh == g.kw == 3 and g.sh == g.sw == 1 and g.dh == g.dw == 1 and g.group == 1
            and g.c >= 2 * vl and g.k >= 2 * vl and g.oh >= 4 and g.ow >= 4):
        return False
    if g.n * -(-g.oh // 4) * -(-g.ow // 4) < MIN_TILES:
        return False
    flops = 2 * g.n * g.k * g.c * 9 * g.oh * g.ow
    direct = flops / DIRECT_FLOPS + 9 * g.c * g.k * 4 / MEMORY
    return flops / (DIRECT_FLOPS * SPEEDUP) + 36 * g.c * g.k * 4 / MEMORY < direct


def _products(g: Conv2d) -> Conv2d:
    """The 36 products as one 1x1 convolution per position over the tiles."""
    tiles = g.n * -(-g.oh // 4) * -(-g.ow // 4)
    return Conv2d(36, g.c, 1, tiles, g.k, 1, tiles, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0)


def pack_weights(w: np.ndarray, g: Conv2d, vl: int) -> tuple[np.ndarray, int]:
    """(U for every position packed as the products' micro-kernel reads it, its OCB)."""
    gm = np.array(G, dtype=np.float64)
    u = np.einsum("ai,kcij,bj->abkc", gm, w.astype(np.float64), gm)  # [6, 6, K, C]
    ocb, _ = choose_tiling(_products(g), vl)
    packed = [pack_direct_weights(u[a, b][:, :, None, None].astype(np.float32), vl, ocb, False)
              for a in range(6) for b in range(6)]
    return np.stack(packed), ocb


def _combine(matrix, terms: list[str]) -> list[str]:
    """C expressions of matrix @ terms (vectors), with exact small coefficients."""
    out = []
    for row in matrix:
        parts = []
        for c, t in zip(row, terms):
            if c == 0:
                continue
            if c == 1:
                parts.append(f"+ {t}")
            elif c == -1:
                parts.append(f"- {t}")
            else:
                parts.append(f"+ nn_vmul({t}, nn_vset1({float(c)!r}f))")
        expr = " ".join(parts).lstrip("+ ")
        out.append(expr if not expr.startswith("- ") else f"nn_vzero() {expr}")
    return out


def winograd_conv(g: Conv2d, vl: int, ptrs: dict[str, str | None], act: int, p0: str, p1: str,
                  scratch: str) -> tuple[str, str, int]:
    """(support C, call statement, scratch bytes) for ``g`` by F(4x4, 3x3). ``ptrs`` as
    for direct_conv, with ``w`` the packed U; ``scratch`` a char pointer expression."""
    th, tw = -(-g.oh // 4), -(-g.ow // 4)
    tiles = g.n * th * tw
    icb, kb = blocks(g.c, vl), blocks(g.k, vl)
    v_floats = 36 * icb * tiles * vl
    m_floats = 36 * kb * tiles * vl
    has_bias, has_res = ptrs.get("b") is not None, ptrs.get("r") is not None

    # input transform: d (6x6 vectors, zero outside the input) -> V[pos][icb][tile]
    lines = [f"NN_REQUIRE_VL({vl});",
             "static void wino_in(void *p, int64_t lo, int64_t hi) {",
             "  const float *const *a = p;",
             "  const float *xp = a[0];",
             "  float *vp = (float *)a[1];",
             "  for (int64_t t = lo; t < hi; t++) {",
             f"    const int64_t tile = t / {icb}, cb = t % {icb};",
             f"    const int64_t n = tile / {th * tw}, ty = tile / {tw} % {th}, tx = tile % {tw};",
             f"    const float *x = xp + (n * {icb} + cb) * {g.h * g.w * vl};",
             f"    const int64_t y0 = ty * 4 - {g.pt}, x0 = tx * 4 - {g.pl};"]
    for i in range(6):
        for j in range(6):
            lines.append(f"    const nn_v d{i}{j} = (uint64_t)(y0 + {i}) < {g.h} && (uint64_t)(x0 + {j}) < {g.w} ? "
                         f"nn_vload(x + ((y0 + {i}) * {g.w} + x0 + {j}) * {vl}) : nn_vzero();")
    for j in range(6):  # columns: t = Bᵀ d
        for i, e in enumerate(_combine(BT, [f"d{r}{j}" for r in range(6)])):
            lines.append(f"    const nn_v t{i}{j} = {e};")
    for i in range(6):  # rows: V = t B
        for j, e in enumerate(_combine(BT, [f"t{i}{c}" for c in range(6)])):
            lines.append(f"    nn_vstore(vp + (({i * 6 + j} * {icb} + cb) * {tiles} + tile) * {vl}, {e});")
    lines += ["  }", "}"]

    # output transform: M[pos][kb][tile] -> 4x4 outputs, bias, residual, activation
    out = ["static void wino_out(void *p, int64_t lo, int64_t hi) {",
           "  const float *const *a = p;",
           "  const float *mp = a[0], *bp = a[1], *rp = a[2];",
           "  float *yp = (float *)a[4];",
           "  for (int64_t t = lo; t < hi; t++) {",
           f"    const int64_t tile = t / {kb}, kb = t % {kb};",
           f"    const int64_t n = tile / {th * tw}, ty = tile / {tw} % {th}, tx = tile % {tw};",
           f"    const nn_v bias = {'nn_vload(bp + kb * %d)' % vl if has_bias else 'nn_vzero()'};",
           f"    const int64_t base = (n * {kb} + kb) * {g.oh * g.ow * vl};"]
    for i in range(6):
        for j in range(6):
            out.append(f"    const nn_v m{i}{j} = nn_vload(mp + (({i * 6 + j} * {kb} + kb) * {tiles} + tile) * {vl});")
    for j in range(6):
        for i, e in enumerate(_combine(AT, [f"m{r}{j}" for r in range(6)])):
            out.append(f"    const nn_v s{i}{j} = {e};")
    for i in range(4):
        for j, e in enumerate(_combine(AT, [f"s{i}{c}" for c in range(6)])):
            out.append(f"    if (ty * 4 + {i} < {g.oh} && tx * 4 + {j} < {g.ow}) {{")
            out.append(f"      const int64_t o = base + ((ty * 4 + {i}) * {g.ow} + tx * 4 + {j}) * {vl};")
            out.append(f"      nn_v v = {stored(f'nn_vadd({e}, bias)', 'rp + o' if has_res else None, act, p0, p1)};")
            out.append("      nn_vstore(yp + o, v);")
            if act in SCALAR_ONLY:
                out.append(f"      {after_store(act, 'yp + o', 1, vl, p0, p1)}")
            out.append("    }")
    out += ["  }", "}"]

    v_ptr, m_ptr = f"((float *){scratch})", f"((float *){scratch} + {v_floats})"
    gemm_support, gemm_call = direct_conv(_products(g), vl, False, {"x": v_ptr, "w": ptrs["w"], "y": m_ptr},
                                          0, "0.0f", "0.0f", weights_per_image=True)
    support = "\n".join(lines) + "\n" + "\n".join(out) + "\n" + gemm_support
    call = " ".join([
        parallel_call({"x": ptrs["x"], "w": v_ptr, "y": "0"}, tiles * icb, 36 * tiles * icb * vl * 12,
                       "wino_in"),
        gemm_call,
        parallel_call({"x": m_ptr, "w": ptrs.get("b"), "b": ptrs.get("r"), "r": None, "y": ptrs["y"]},
                       tiles * kb, 36 * tiles * kb * vl * 12, "wino_out"),
    ])
    return support, call, (v_floats + m_floats) * 4
