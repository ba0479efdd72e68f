"""Convolutions over a blocked input in bfloat16 on AMX tiles (``tdpbf16ps``,
nncc/native/amx.py), for precision bf16 on CPUs with amx_tile and amx_bf16: every
ungrouped one, any kernel, stride, padding and dilation, tap by tap.

A tile product costs the same whatever its depth, so every one here is a full 16 pairs
deep: 32 input channels of one tap. The operands are laid out for that:

- B: the weights packed at compile time (``pack_weights``) as [KB][CP][KH][KW][16][16]
  words: per output block of 16 channels, per group of 32 input channels (CP of them, the
  last zero past the real ones), per tap, 16 pairs x 16 output channels, so a B tile is
  1 KB of consecutive bytes and one output block's weights are one stream.
- A: the input rounded to bfloat16 at run time into scratch as [N][CP][phases][Hp][Wp][16]
  words, its padding (and the pixels past it that the last tiles read) zero: a pixel's 32
  channels are one 64-byte row. At a stride above 1 the padded input is split into its
  phases (pixels whose row is r mod SH and column c mod SW; only those some tap reads), in
  which every tap reads at stride 1.

A tile of C covers 16 "positions" of one phase's grid: position oh * Wp + ow is output
(oh, ow), and its tap (i, j) the scratch pixel at a fixed offset from it, so a tile of A is
16 consecutive scratch rows wherever it starts. Wp is the output width plus the taps'
reach, so the positions past an output row's end are computed and never stored: a 7-pixel
row costs 9 positions, where a tile per row would spend 16.

A micro-tile is 2 x 2 tiles: four C tiles (tmm0-3), two of A (tmm4-5), two of B (tmm6-7),
each loaded tile serving two products; the sums stay in the tiles over every tap and
channel group, then go through a buffer on the stack into the output with the float32
epilogue (bias, residual, activation), only the valid pixels. The work is cut into
(image, chunk of position pairs, chunk of output-block pairs) tasks, the cut chosen for
the fewest bytes re-read: a layer whose weights outweigh its input (the deep 7x7 ones) is
cut by output channels, so each weight is streamed once. Each task loads the tile
configuration and releases the tiles when done.

The step keeps the vdpbf16ps convolution (blocked_conv.direct_conv with bf16, over its own
packed weights) for where the OS refuses the tiles or NNCC_AMX=0 (decided once per
process: runtime.c). Arithmetic: tdpbf16ps reads bfloat16 denormals as zero and flushes
denormal float32 results, rounding to nearest even; the bound is the bfloat16 GEMM's with
the denormal term (docs/native.md).
"""

from __future__ import annotations

import numpy as np

from nncc.native import amx
from nncc.native.blocked_conv import Conv2d, after_store, blocks, stored
from nncc.native.gemm_bf16_gen import to_bf16

TILE = 16  # positions (rows of A and C) per tile
DEPTH = 32  # input channels per tile of A (16 pairs: 64 bytes a row)
WORDS = DEPTH // 2  # 32-bit words per scratch pixel
CONFIG = "ax_cfg"
TASKS = 8  # at least this many tasks per convolution where the geometry allows
FORM = "amx16bf16"  # the packed weights' form (its "bf16" counts it as a low layer)


def applies(g: Conv2d, vl: int) -> bool:
    """The convolutions built here: ungrouped, over 16-lane blocks."""
    return vl == 16 and g.group == 1


def pack_weights(w: np.ndarray) -> np.ndarray:
    """[K, C, KH, KW] float32 -> [KB][CP][KH][KW][16 pairs][16] words of bfloat16 pairs
    (channel 2p in the low half), zero past K and C, carried as float32."""
    k, c, kh, kw = w.shape
    kb, cp = blocks(k, TILE), blocks(c, DEPTH)
    full = np.zeros((kb * TILE, cp * DEPTH, kh, kw), np.float32)
    full[:k, :c] = w
    # [KB, 16 oc, CP, 16 pairs, 2, KH, KW] -> [KB, CP, KH, KW, 16 pairs, 2, 16 oc]
    arranged = full.reshape(kb, TILE, cp, WORDS, 2, kh, kw).transpose(0, 2, 5, 6, 3, 4, 1)
    halves = to_bf16(np.ascontiguousarray(arranged)).astype(np.uint32)
    words = halves[..., 0, :] | (halves[..., 1, :] << 16)
    return np.ascontiguousarray(words).view(np.float32)


class _Plan:
    """One convolution's positions, scratch and work split.

    The scratch holds each channel group's padded input split into phases by the stride
    (the pixels whose padded row is i mod SH and column j mod SW), only the phases some tap
    reads, each [Hp][Wp] pixels. Output (oh, ow)'s tap (i, j) reads phase ((i*DH) % SH,
    (j*DW) % SW) at (oh + i*DH // SH, ow + j*DW // SW): within a phase every tap is a
    stride-1 read, so a position is oh * Wp + ow and a tap a fixed offset from it."""

    def __init__(self, g: Conv2d):
        self.g = g
        rows = [(i * g.dh % g.sh, i * g.dh // g.sh) for i in range(g.kh)]
        cols = [(j * g.dw % g.sw, j * g.dw // g.sw) for j in range(g.kw)]
        self.phases = sorted({(ri, cj) for ri, _ in rows for cj, _ in cols})
        self.wp = g.ow + max(c for _, c in cols)  # a valid position's taps stay in its row
        self.tiles = -(-((g.oh - 1) * self.wp + g.ow) // TILE)
        reach = max(r for _, r in rows) * self.wp + max(c for _, c in cols)
        self.hp = -(-(self.tiles * TILE + reach) // self.wp)  # rows the last tile's taps reach
        self.phase_words = self.hp * self.wp * WORDS
        # per tap (i, j): its words from a position's first word
        self.taps = [self.phases.index((ri, cj)) * self.phase_words + (r * self.wp + c) * WORDS
                     for ri, r in rows for cj, c in cols]
        self.cp = blocks(g.c, DEPTH)
        self.kb = blocks(g.k, TILE)
        self.group_words = len(self.phases) * self.phase_words
        self.image_words = self.cp * self.group_words
        self.k_words = self.cp * g.kh * g.kw * TILE * WORDS  # one output block's packed weights
        self.rows2, self.cols2 = -(-self.tiles // 2), -(-self.kb // 2)
        self.pc, self.cc = self._split()
        self.rows_per, self.cols_per = -(-self.rows2 // self.pc), -(-self.cols2 // self.cc)
        self.pc, self.cc = -(-self.rows2 // self.rows_per), -(-self.cols2 // self.cols_per)

    def _split(self) -> tuple[int, int]:
        """(chunks of position pairs, chunks of block pairs) per image: enough tasks for the
        pool, cut where the fewest bytes are re-read (each position chunk streams the
        weights of its blocks, each block chunk the input of its positions)."""
        g = self.g
        weights, image = self.kb * self.k_words * 4, self.image_words * 4
        want = min(TASKS, g.n * self.rows2 * self.cols2)
        best = None
        for pc in range(1, self.rows2 + 1):
            cc = min(self.cols2, max(1, -(-want // (g.n * pc))))
            rows_per, cols_per = -(-self.rows2 // pc), -(-self.cols2 // cc)
            tasks = g.n * -(-self.rows2 // rows_per) * -(-self.cols2 // cols_per)
            if tasks < want:
                continue
            # in cycles, roughly: the busier of two threads' products (16 cycles each), and
            # the bytes read from beyond the core's caches (a tenth of a cycle each)
            span = -(-tasks // 2) * rows_per * cols_per * 4 * self.cp * g.kh * g.kw * 16
            cost = span + 0.1 * g.n * (pc * weights + cc * image)
            if best is None or cost < best[0]:
                best = (cost, pc, cc)
        return (best[1], best[2]) if best else (1, 1)


def scratch_bytes(g: Conv2d, vl: int) -> int:
    """Bytes of the rounded, padded input."""
    return g.n * _Plan(g).image_words * 4


def _convert(p: _Plan, vl: int) -> tuple[str, str]:
    """(support, call) rounding the blocked input at ``ax_in[0]`` into the scratch at
    ``ax_in[1]``: one task per (image, channel group, phase, phase row), zeros outside the
    input. A pixel's 32 channels are its two blocks' 16 rounded side by side."""
    g = p.g
    icb = blocks(g.c, vl)
    last = g.c - (icb - 1) * vl
    phases = len(p.phases)
    rows = ", ".join(str(r) for r, _ in p.phases)
    cols = ", ".join(str(c) for _, c in p.phases)
    support = f"""
static void ax_cvt_task(void *q_, int64_t lo, int64_t hi) {{
  static const int64_t phase_row[{phases}] = {{{rows}}}, phase_col[{phases}] = {{{cols}}};
  const float *const *a = q_;
  for (int64_t t = lo; t < hi; t++) {{
    const int64_t r = t % {p.hp}, f = t / {p.hp} % {phases}, gq = t / {p.hp * phases};
    const int64_t n = gq / {p.cp}, cb = gq % {p.cp} * 2, ih = r * {g.sh} + phase_row[f] - {g.pt};
    __m512i *d = (__m512i *)((uint32_t *)a[1] + t * {p.wp * WORDS});
    if (ih < 0 || ih >= {g.h}) {{
      for (int64_t i = 0; i < {p.wp}; i++) _mm512_storeu_si512(d + i, _mm512_setzero_si512());
      continue;
    }}
    const __mmask16 k0 = cb == {icb - 1} ? (__mmask16){(1 << last) - 1} : (__mmask16)0xFFFF;
    const __mmask16 k1 = cb + 1 < {icb - 1} ? (__mmask16)0xFFFF : cb + 1 == {icb - 1} ? (__mmask16){(1 << last) - 1} : 0;
    const float *s0 = a[0] + ((n * {icb} + cb) * {g.h} + ih) * {g.w * vl};
    const float *s1 = k1 ? s0 + {g.h * g.w * vl} : s0;
    for (int64_t i = 0; i < {p.wp}; i++) {{
      const int64_t iw = i * {g.sw} + phase_col[f] - {g.pl};
      __m512i v = _mm512_setzero_si512();
      if (iw >= 0 && iw < {g.w})
        v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(k1, s1 + iw * {vl}),
                                         _mm512_maskz_loadu_ps(k0, s0 + iw * {vl}));
      _mm512_storeu_si512(d + i, v);
    }}
  }}
}}
"""
    call = f"nn_parallel({g.n * p.cp * phases * p.hp}, {g.n * p.image_words * 2}, ax_cvt_task, (void *)ax_in);"
    return support, call


def _mt_kernel(p: _Plan, r_tiles: int, c_tiles: int) -> str:
    """C multiplying ``r_tiles`` tiles of positions (A at a0, a1: their first position's
    first word) by ``c_tiles`` output blocks (B at b0, b1) over every channel group and tap
    into ``buf`` (one 16 x 16 float block per C tile)."""
    lines = [f"static inline void ax_mt_{r_tiles}x{c_tiles}(const uint32_t *a0, const uint32_t *a1, "
             "const uint32_t *b0, const uint32_t *b1, float *buf) {", "  (void)a1; (void)b1;"]
    lines += [f"  _tile_zero({2 * r + c});" for r in range(r_tiles) for c in range(c_tiles)]
    lines.append(f"  for (int64_t k = 0; k < {p.cp}; k++) {{")
    for tap, offset in enumerate(p.taps):
        lines.append(f"    {{ const int64_t oa = k * {p.group_words} + {offset}, "
                     f"ob = (k * {len(p.taps)} + {tap}) * {TILE * WORDS};")
        for r in range(r_tiles):
            lines.append(f"      _tile_loadd({4 + r}, a{r} + oa, 64);")
            for c in range(c_tiles):
                if r == 0:
                    lines.append(f"      _tile_loadd({6 + c}, b{c} + ob, 64);")
                lines.append(f"      _tile_dpbf16ps({2 * r + c}, {4 + r}, {6 + c});")
        lines.append("    }")
    lines.append("  }")
    lines += [f"  _tile_stored({2 * r + c}, buf + {(2 * r + c) * TILE * TILE}, 64);"
              for r in range(r_tiles) for c in range(c_tiles)]
    lines.append("}")
    return "\n".join(lines) + "\n"


def store_function(name: str, vl: int, has_bias: bool, has_res: bool, act: int, p0: str, p1: str) -> str:
    """C of ``name``(buf, y, bias, res, rows), finishing ``rows`` consecutive output pixels of
    one C tile's sums in ``buf`` at ``y`` (residual at ``res``): bias, residual and
    activation (blocked_conv's epilogue, one vector per pixel). The stem's tiles
    (conv_stem_bf16) finish theirs with it too."""
    res = "res + r * 16" if has_res else None
    v = stored("v", res, act, p0, p1)
    tail = after_store(act, "y", "rows", vl, p0, p1)
    return "\n".join([
        f"static inline void {name}(const float *restrict buf, float *restrict y, const float *restrict bias, "
        "const float *restrict res, int64_t rows) {",
        "  (void)bias; (void)res;",
        f"  const nn_v bv = {'nn_vload(bias)' if has_bias else 'nn_vzero()'};",
        "  for (int64_t r = 0; r < rows; r++) {",
        "    const nn_v v = nn_vadd(nn_vload(buf + r * 16), bv);",
        f"    nn_vstore(y + r * 16, {v});",
        "  }",
        f"  {tail}" if tail else "",
        "}"]) + "\n"


def _finish(p: _Plan, vl: int) -> str:
    """C storing a C tile (its sums at ``buf``) of output block ``ob`` of image ``n``, tile
    ``t`` of positions: the pixels it holds, run by run of consecutive output pixels (the
    positions past an output row's end hold none)."""
    g = p.g
    plane = g.oh * g.ow * vl
    return "\n".join([
        "static inline void ax_finish(const float *buf, float *yp, const float *bp, const float *rp, "
        "int64_t n, int64_t ob, int64_t t) {",
        f"  const int64_t base = (n * {p.kb} + ob) * {plane};",
        f"  const float *bias = bp ? bp + ob * {vl} : 0;",
        f"  int64_t q = t * {TILE}, oh = q / {p.wp}, ow = q % {p.wp};",
        f"  for (int64_t r = 0; r < {TILE} && oh < {g.oh};) {{",
        f"    if (ow >= {g.ow}) {{ r += {p.wp} - ow; oh++; ow = 0; continue; }}",
        f"    const int64_t rows = {g.ow} - ow < {TILE} - r ? {g.ow} - ow : {TILE} - r;",
        f"    const int64_t yo = base + (oh * {g.ow} + ow) * {vl};",
        "    ax_store(buf + r * 16, yp + yo, bias, rp ? rp + yo : 0, rows);",
        "    r += rows; ow += rows;",
        "  }",
        "}"]) + "\n"


def amx_conv(g: Conv2d, vl: int, ptrs: dict[str, str | None], act: int, p0: str, p1: str,
             scratch: str) -> tuple[str, str]:
    """(support C, statement) of the convolution on tiles: ``ptrs`` as direct_conv's (x the
    blocked input, b, r, y) with ``wa`` the weights packed by pack_weights; ``scratch`` a C
    expression of scratch_bytes(g, vl) bytes, 64-aligned."""
    if not applies(g, vl):
        raise ValueError("the AMX convolution is ungrouped, over 16-lane blocks")
    p = _Plan(g)
    has_bias, has_res = ptrs.get("b") is not None, ptrs.get("r") is not None
    support = ["#ifndef __AMX_BF16__\n#error \"AMX convolution built without AMX-BF16\"\n#endif\n",
               amx.tile_config(CONFIG, [(TILE, 64)] * 8)]
    cvt_support, cvt_call = _convert(p, vl)
    support.append(cvt_support)
    support += [_mt_kernel(p, r, c) for r in (1, 2) for c in (1, 2)]
    support += [store_function("ax_store", vl, has_bias, has_res, act, p0, p1), _finish(p, vl)]
    body = amx.task_head("ax_task", "uint32_t", 4 * TILE * TILE)
    body += amx.task_c(CONFIG, [
        "  for (int64_t t = lo; t < hi; t++) {",
        f"    const int64_t cq = t % {p.cc}, pq = (t / {p.cc}) % {p.pc}, n = t / {p.cc * p.pc};",
        f"    const int64_t r1 = (pq + 1) * {p.rows_per} < {p.rows2} ? (pq + 1) * {p.rows_per} : {p.rows2};",
        f"    const int64_t c1 = (cq + 1) * {p.cols_per} < {p.cols2} ? (cq + 1) * {p.cols_per} : {p.cols2};",
        f"    const uint32_t *xn = xb + n * {p.image_words};",
        # block pairs outer: their weights stay in cache over the chunk's positions
        f"    for (int64_t cl = cq * {p.cols_per}; cl < c1; cl++) {{",
        "      const int64_t ob = 2 * cl;",
        f"      const int two = ob + 1 < {p.kb};",
        f"      const uint32_t *b0 = wp + ob * {p.k_words}, *b1 = two ? b0 + {p.k_words} : b0;",
        f"      for (int64_t pr = pq * {p.rows_per}; pr < r1; pr++) {{",
        "        const int64_t t0 = 2 * pr;",
        f"        const int two_t = t0 + 1 < {p.tiles};",
        f"        const uint32_t *a0 = xn + t0 * {TILE * WORDS}, *a1 = two_t ? a0 + {TILE * WORDS} : a0;",
        "        if (two_t) { if (two) ax_mt_2x2(a0, a1, b0, b1, buf); else ax_mt_2x1(a0, a1, b0, b1, buf); }",
        "        else { if (two) ax_mt_1x2(a0, a1, b0, b1, buf); else ax_mt_1x1(a0, a1, b0, b1, buf); }",
        "        for (int r = 0; r <= two_t; r++)",
        "          for (int c = 0; c <= two; c++)",
        f"            ax_finish(buf + (2 * r + c) * {TILE * TILE}, yp, bp, rp, n, ob + c, t0 + r);",
        "      }",
        "    }",
        "  }"]) + ["}"]
    support.append("\n".join(body) + "\n")
    args = ", ".join(ptrs.get(k) or "0" for k in ("b", "r"))
    flops = 2 * g.n * g.k * g.oh * g.ow * g.c * g.kh * g.kw
    call = (f"{{ const float *ax_in[2] = {{{ptrs['x']}, (const float *)({scratch})}}; {cvt_call} }}\n"
            f"{{ const float *a[5] = {{(const float *)({scratch}), {ptrs['wa']}, {args}, (const float *){ptrs['y']}}}; "
            f"nn_parallel({g.n * p.pc * p.cc}, {flops}, ax_task, (void *)a); }}")
    return "\n".join(support), call


def conv(g: Conv2d, vl: int, ptrs: dict[str, str | None], act: int, p0: str, p1: str,
         scratch: str, fallback: str) -> tuple[str, str]:
    """(support, statement): the convolution on tiles where the process may use them, else
    ``fallback`` (the vdpbf16ps convolution's statement)."""
    support, call = amx_conv(g, vl, ptrs, act, p0, p1, scratch)
    return support, f"if ({amx.PERMITTED}) {{\n{call}\n}} else {{\n{fallback}\n}}"
