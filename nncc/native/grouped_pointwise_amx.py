"""A grouped 1x1 stride-1 convolution over NCHW in bfloat16 on AMX tiles (``tdpbf16ps``,
nncc/native/amx.py), for precision bf16 on CPUs with amx_tile and amx_bf16: ShuffleNet's
pointwise layers (4 groups of 34, 68 or 136 channels), whose groups are not whole channel
blocks, so they stay over NCHW where grouped_pointwise.py runs them in float32.

Each group is a product of its weights [KG, CG] by its input planes [CG, HW], the output
[KG, HW] landing in the NCHW planes as they are (rows = output channels, columns = pixels):

- A: the weights, packed at compile time (``pack_weights``) as [G][MB][CP][16][16] words:
  per group, per 16 output channels, per 32 input channels, a 1 KB tile of 16 rows of 16
  bfloat16 pairs, zero past KG and CG.
- B: the input rounded to bfloat16 at run time into scratch as [N][G][CP * 16][HWP] words,
  word (j, p) holding channels 2j (low half) and 2j + 1 of pixel p: a B tile is 16 pair
  rows of 16 pixels, read with the row stride HWP. Channels past CG and pixels past HW are
  zero, so a group's sums only ever meet its own channels (a NaN or an infinity in one group
  never reaches another's outputs).

A micro-tile is 2 x 2 tiles (C in tmm0-3, A in tmm4-5, B in tmm6-7) over every 32-channel
step of the group; its sums go through a buffer on the stack to the output with the
float32 epilogue (bias, residual, activation), only the real rows and pixels, by masks.
Tasks are (image, group, chunk of pixel-tile pairs). The step keeps grouped_pointwise.py's
float32 kernel for where the OS refuses the tiles or NNCC_AMX=0 (decided once per process).

Arithmetic: both operands rounded to bfloat16 (to nearest, ties to even), exact products
summed in float32; tdpbf16ps reads bfloat16 denormals as zero and flushes denormal results.
The bound is conv_amx's: about 2^-7 of sum |x * w| per output, plus float32 summation's and
the denormal term (docs/native.md).
"""

from __future__ import annotations

import numpy as np

from nncc.native import amx
from nncc.native.blocked_conv import SCALAR_ONLY, blocks
from nncc.native.gemm_bf16_gen import to_bf16

TILE = 16  # output channels (rows of A and C) and pixels (columns of B and C) per tile
DEPTH = 32  # input channels per tile product (16 pairs)
CONFIG = "gpa_cfg"
TASKS = 8  # at least this many tasks a step where the geometry allows
FORM = "gpamx16bf16"  # the packed weights' form (its "bf16" counts the layer as a low one)
MIN_GROUP_CHANNELS = 16  # below, a 32-deep tile product is mostly padding: float32 stays


def applies(c: int, k: int, group: int, vl: int) -> bool:
    """The grouped 1x1 convolutions built here: groups of at least MIN_GROUP_CHANNELS input
    channels (not depthwise, not ungrouped: conv_amx has those over the blocked layout)."""
    return vl == 16 and 1 < group < c and c % group == 0 and k % group == 0 and c // group >= MIN_GROUP_CHANNELS


def pack_weights(w: np.ndarray, group: int) -> np.ndarray:
    """[K, CG, 1, 1] float32 -> [G][MB][CP][16 rows][16 pairs] words of bfloat16 pairs
    (channel 2p in the low half), zero past KG and CG, carried as float32."""
    k, cg = w.shape[:2]
    kg = k // group
    mb, cp = blocks(kg, TILE), blocks(cg, DEPTH)
    full = np.zeros((group, mb * TILE, cp * DEPTH), np.float32)
    full[:, :kg, :cg] = w.reshape(group, kg, cg)
    # [G, MB, 16 rows, CP, 16 pairs, 2] -> [G, MB, CP, 16 rows, 16 pairs, 2]
    arranged = full.reshape(group, mb, TILE, cp, DEPTH // 2, 2).transpose(0, 1, 3, 2, 4, 5)
    halves = to_bf16(np.ascontiguousarray(arranged)).astype(np.uint32)
    words = halves[..., 0] | (halves[..., 1] << 16)
    return np.ascontiguousarray(words).view(np.float32)


class _Plan:
    """One convolution's tiles: row blocks (MB) and 32-channel steps (CP) a group, the
    plane in 16-pixel tiles (HWP the padded plane), and the (image, group, chunk of
    pixel-tile pairs) tasks."""

    def __init__(self, n: int, c: int, hw: int, k: int, group: int):
        self.n, self.c, self.hw, self.k, self.group = n, c, hw, k, group
        self.cg, self.kg = c // group, k // group
        self.mb, self.cp = blocks(self.kg, TILE), blocks(self.cg, DEPTH)
        self.pt = blocks(hw, TILE)  # pixel tiles
        self.hwp = self.pt * TILE
        self.rows = self.cp * TILE  # pair rows per group in scratch
        self.group_words = self.rows * self.hwp
        self.pairs = blocks(self.pt, 2)  # pixel-tile pairs
        chunks = max(1, min(self.pairs, blocks(TASKS, n * group)))
        self.per = blocks(self.pairs, chunks)
        self.chunks = blocks(self.pairs, self.per)
        self.a_words = self.cp * TILE * TILE  # one 16-row block's packed weights


def scratch_bytes(n: int, c: int, hw: int, k: int, group: int) -> int:
    """Bytes of the rounded input pairs."""
    p = _Plan(n, c, hw, k, group)
    return n * group * p.group_words * 4


def _convert(p: _Plan) -> tuple[str, str]:
    """(support, call) rounding the NCHW input at ``gpa_in[0]`` into pairs at ``gpa_in[1]``:
    one task per (image, group, pair row), zeros past the group's channels and the plane."""
    tail = p.hw % TILE
    support = f"""
static void gpa_cvt_task(void *q_, int64_t lo, int64_t hi) {{
  const float *const *a = q_;
  for (int64_t t = lo; t < hi; t++) {{
    const int64_t j = t % {p.rows}, ng = t / {p.rows}, g = ng % {p.group}, n = ng / {p.group};
    __m512i *d = (__m512i *)((uint32_t *)a[1] + t * {p.hwp});
    const int64_t c0 = 2 * j;
    const int has0 = c0 < {p.cg}, has1 = c0 + 1 < {p.cg};
    const float *s0 = a[0] + (n * {p.c} + g * {p.cg} + (has0 ? c0 : 0)) * {p.hw};
    const float *s1 = has1 ? s0 + {p.hw} : s0;
    const __mmask16 k0 = has0 ? (__mmask16)0xFFFF : 0, k1 = has1 ? (__mmask16)0xFFFF : 0;
    for (int64_t q = 0; q < {p.pt}; q++) {{
      const __mmask16 m = q == {p.pt - 1} ? (__mmask16){(1 << tail) - 1 if tail else 0xFFFF} : (__mmask16)0xFFFF;
      const __m512 v0 = _mm512_maskz_loadu_ps(m & k0, s0 + q * {TILE});
      const __m512 v1 = _mm512_maskz_loadu_ps(m & k1, s1 + q * {TILE});
      const __m512i w0 = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v0));
      const __m512i w1 = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v1));
      _mm512_storeu_si512(d + q, _mm512_or_si512(w0, _mm512_slli_epi32(w1, 16)));
    }}
  }}
}}
"""
    rows = p.n * p.group * p.rows
    call = f"nn_parallel({rows}, {rows * p.hwp * 2}, gpa_cvt_task, (void *)gpa_in);"
    return support, call


def _micro(p: _Plan, m_tiles: int, p_tiles: int) -> str:
    """C multiplying ``m_tiles`` row blocks of weights (A at a0, a1) by ``p_tiles`` pixel
    tiles of pairs (B at b0, b1) over the group's channels into ``buf``."""
    lines = [f"static inline void gpa_mt_{m_tiles}x{p_tiles}(const uint32_t *a0, const uint32_t *a1, "
             "const uint32_t *b0, const uint32_t *b1, float *buf) {", "  (void)a1; (void)b1;"]
    lines += [f"  _tile_zero({2 * r + c});" for r in range(m_tiles) for c in range(p_tiles)]
    lines.append(f"  for (int64_t s = 0; s < {p.cp}; s++) {{")
    for c in range(p_tiles):
        lines.append(f"    _tile_loadd({6 + c}, b{c} + s * {TILE * p.hwp}, {p.hwp * 4});")
    for r in range(m_tiles):
        lines.append(f"    _tile_loadd({4 + r}, a{r} + s * {TILE * TILE}, 64);")
        lines += [f"    _tile_dpbf16ps({2 * r + c}, {4 + r}, {6 + c});" for c in range(p_tiles)]
    lines.append("  }")
    lines += [f"  _tile_stored({2 * r + c}, buf + {(2 * r + c) * TILE * TILE}, 64);"
              for r in range(m_tiles) for c in range(p_tiles)]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _store(p: _Plan, has_bias: bool, has_res: bool, act: int, p0: str, p1: str) -> str:
    """C of gpa_store(buf, y, bias, res, rows, cols): a C tile's sums to ``rows`` output
    planes (stride HW) at ``cols`` pixels from y, with bias, residual and activation."""
    v = "v"
    if has_res:
        v = f"nn_vadd({v}, _mm512_maskz_loadu_ps(m, res + r * {p.hw}))"
    scalar = act in SCALAR_ONLY
    if act and not scalar:
        v = f"nn_vact({act}, {v}, {p0}, {p1})"
    lines = ["static inline void gpa_store(const float *restrict buf, float *restrict y, const float *restrict bias, "
             "const float *restrict res, int64_t rows, int64_t cols) {",
             "  (void)bias; (void)res;",
             "  const __mmask16 m = cols >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << cols) - 1);",
             "  for (int64_t r = 0; r < rows; r++) {",
             f"    const nn_v v = nn_vadd(nn_vload(buf + r * 16), nn_vset1({'bias[r]' if has_bias else '0.0f'}));",
             f"    _mm512_mask_storeu_ps(y + r * {p.hw}, m, {v});"]
    if scalar:
        lines.append(f"    for (int64_t q = 0; q < cols; q++) "
                     f"y[r * {p.hw} + q] = nn_act({act}, y[r * {p.hw} + q], {p0}, {p1});")
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def amx_grouped_pointwise(n: int, c: int, hw: int, k: int, group: int, ptrs: dict[str, str | None],
                          act: int, p0: str, p1: str, scratch: str) -> tuple[str, str]:
    """(support C, statement) of the convolution on tiles: ``ptrs`` x [N, C, HW], wa (packed
    by pack_weights), b (bias [K]) and r (residual [N, K, HW]), either None, y [N, K, HW];
    ``scratch`` a C expression of scratch_bytes(...) bytes."""
    p = _Plan(n, c, hw, k, group)
    has_bias, has_res = ptrs.get("b") is not None, ptrs.get("r") is not None
    support = ["#include <immintrin.h>\n"
               "#ifndef __AMX_BF16__\n#error \"AMX convolution built without AMX-BF16\"\n#endif\n",
               amx.tile_config(CONFIG, [(TILE, 64)] * 8)]
    cvt_support, cvt_call = _convert(p)
    support.append(cvt_support)
    support += [_micro(p, r, q) for r in (1, 2) for q in (1, 2)]
    support.append(_store(p, has_bias, has_res, act, p0, p1))
    body = amx.task_head("gpa_task", "uint32_t", 4 * TILE * TILE)
    body += amx.task_c(CONFIG, [
        "  for (int64_t t = lo; t < hi; t++) {",
        f"    const int64_t ch = t % {p.chunks}, g = t / {p.chunks} % {p.group}, n = t / {p.chunks * p.group};",
        f"    const uint32_t *xg = xb + (n * {p.group} + g) * {p.group_words};",
        f"    const uint32_t *wg = wp + g * {p.mb * p.a_words};",
        f"    const float *bg = bp ? bp + g * {p.kg} : 0;",
        f"    const int64_t plane0 = (n * {p.k} + g * {p.kg}) * {p.hw};",
        f"    const int64_t q1 = (ch + 1) * {p.per} < {p.pairs} ? (ch + 1) * {p.per} : {p.pairs};",
        f"    for (int64_t q = ch * {p.per}; q < q1; q++) {{",
        "      const int64_t t0 = 2 * q;",
        f"      const int two_t = t0 + 1 < {p.pt};",
        f"      const uint32_t *b0 = xg + t0 * {TILE}, *b1 = two_t ? b0 + {TILE} : b0;",
        f"      for (int64_t mq = 0; mq < {blocks(p.mb, 2)}; mq++) {{",
        "        const int64_t m0 = 2 * mq;",
        f"        const int two_m = m0 + 1 < {p.mb};",
        f"        const uint32_t *a0 = wg + m0 * {p.a_words}, *a1 = two_m ? a0 + {p.a_words} : a0;",
        "        if (two_m) { if (two_t) gpa_mt_2x2(a0, a1, b0, b1, buf); else gpa_mt_2x1(a0, a1, b0, b1, buf); }",
        "        else { if (two_t) gpa_mt_1x2(a0, a1, b0, b1, buf); else gpa_mt_1x1(a0, a1, b0, b1, buf); }",
        "        for (int r = 0; r <= two_m; r++)",
        "          for (int c = 0; c <= two_t; c++) {",
        f"            const int64_t row = (m0 + r) * {TILE}, px = (t0 + c) * {TILE};",
        f"            const int64_t rows = {p.kg} - row < {TILE} ? {p.kg} - row : {TILE};",
        f"            const int64_t cols = {p.hw} - px < {TILE} ? {p.hw} - px : {TILE};",
        f"            const int64_t off = plane0 + row * {p.hw} + px;",
        "            gpa_store(buf + (2 * r + c) * 256, yp + off, bg ? bg + row : 0, rp ? rp + off : 0, rows, cols);",
        "          }",
        "      }",
        "    }",
        "  }"]) + ["}"]
    support.append("\n".join(body) + "\n")
    args = ", ".join(ptrs.get(key) or "0" for key in ("b", "r"))
    flops = 2 * n * k * p.cg * hw
    call = (f"{{ const float *gpa_in[2] = {{{ptrs['x']}, (const float *)({scratch})}}; {cvt_call} }}\n"
            f"{{ const float *a[5] = {{(const float *)({scratch}), {ptrs['wa']}, {args}, (const float *){ptrs['y']}}}; "
            f"nn_parallel({n * group * p.chunks}, {flops}, gpa_task, (void *)a); }}")
    return "\n".join(support), call


def conv(n: int, c: int, hw: int, k: int, group: int, ptrs: dict[str, str | None], act: int, p0: str, p1: str,
         scratch: str, fallback: str) -> tuple[str, str]:
    """(support, statement): the convolution on tiles where the process may use them, else
    ``fallback`` (grouped_pointwise.py's float32 statement)."""
    support, call = amx_grouped_pointwise(n, c, hw, k, group, ptrs, act, p0, p1, scratch)
    return support, f"if ({amx.PERMITTED}) {{\n{call}\n}} else {{\n{fallback}\n}}"
