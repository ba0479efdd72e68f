"""A network's first convolution (its "stem": few input channels read straight from the plain
NCHW input, a large kernel, e.g. 7x7 stride 2 over RGB) in bfloat16 on AMX tiles
(``tdpbf16ps``, nncc/native/amx.py), for precision bf16 on CPUs with amx_tile and amx_bf16.

The float32 stem (blocked_conv.direct_conv over a plain input) broadcasts one input value
per multiply-add of 16 output channels. On tiles it is a product per image instead:
[output pixels] x [C*KH*KW receptive field] by [C*KH*KW] x [K], the receptive fields
gathered (im2col) for 32 pixels at a time into a buffer on the task's stack.

- The input is first rounded to bfloat16 into scratch as a padded NHWC image
  [N, H+pads, W+pads, C] (``vcvtneps2bf16``, the channels interleaved by a permute; the
  padding zero). One kernel row of a pixel's receptive field is then KW*C consecutive
  values (21 for 7x7 over 3 channels), so a pixel's gather is KH masked copies of at most
  64 bytes, and the padding taps are the zeros of the padded image.
- A row of A is one pixel's receptive field in the order (kernel row, kernel column,
  channel), padded with zeros to a whole number of 32-value tiles (147 to 160: five
  ``tdpbf16ps`` steps); the zeros of the tail are written once per task.
- B, the weights, are rounded to bfloat16 at compile time and packed in the same order
  as pairs: [K/16][steps][16 pairs][16 channels] words, each (block, step) one tile.

A micro-tile is 32 pixels x 32 output channels (four C tiles, two of A, two of B), the
sums stay in the tiles over the whole receptive field, and then go through a small buffer
on the stack to the blocked output with the float32 epilogue (bias, residual, activation).

The step keeps the float32 stem for where the OS refuses the tiles or NNCC_AMX=0
(decided once per process: runtime.c). Arithmetic: each product sees both inputs rounded
to 8 significant bits; tdpbf16ps reads denormals as zero and flushes denormal sums; float32
sums: the bound is conv_amx's (docs/native.md).
"""

from __future__ import annotations

import numpy as np

from nncc.native import amx, conv_amx
from nncc.native.blocked_conv import Conv2d, blocks
from nncc.native.gemm_bf16_gen import to_bf16

TILE = 16  # pixels (rows of A and C) per tile, and output channels per tile of B and C
STEP = 32  # bfloat16 values of the receptive field per tile of A (16 pairs, 64 bytes)
MAX_STEPS = 8  # a 32-pixel buffer of A up to 16 KiB on the task's stack
MAX_CHANNELS = 4  # the interleaving permute takes up to four channel vectors
CONFIG = "st_cfg"
TASKS = 8  # at least this many tasks per convolution where the geometry allows


def applies(g: Conv2d, vl: int) -> bool:
    """The stems built here: ungrouped, undilated along rows (a kernel row's taps adjacent
    in the padded image), at most MAX_CHANNELS input channels, a kernel row's values within
    one tile row, the receptive field within MAX_STEPS tiles, over 16-lane blocks."""
    return vl == 16 and g.group == 1 and g.dw == 1 and g.c <= MAX_CHANNELS and g.kw * g.c <= STEP \
        and _steps(g) <= MAX_STEPS


def pays(g: Conv2d, vl: int) -> bool:
    """Whether the stem runs on tiles rather than in float32: wherever it applies. Measured
    on stems over 1x3x224x224 (docs/native.md): 7x7 stride 2 to 64 channels took a sixth of
    float32's time at one thread, a fifth at two; 3x3 stride 2 to 32 channels, bound by its
    output's bytes either way, 0.8-0.95 of it, never more."""
    return applies(g, vl)


def _steps(g: Conv2d) -> int:
    """Tiles of 32 values over the receptive field."""
    return -(-(g.c * g.kh * g.kw) // STEP)


def _padded(g: Conv2d) -> tuple[int, int]:
    """(rows, columns) of the padded image."""
    return g.h + g.pt + g.pb, g.w + g.pl + g.pr


def scratch_bytes(g: Conv2d) -> int:
    """Bytes of the padded bfloat16 NHWC image."""
    hp, wp = _padded(g)
    return g.n * hp * wp * g.c * 2


def pack_weights(w: np.ndarray, vl: int) -> np.ndarray:
    """[K, C, KH, KW] -> bfloat16 pairs [K/VL][steps][STEP/2][VL] words (carried as float32),
    the receptive field in the order (kernel row, kernel column, channel), zero past its end
    and for the channels past K."""
    k, c, kh, kw = w.shape
    steps = -(-(c * kh * kw) // STEP)
    field = np.zeros((blocks(k, vl) * vl, steps * STEP), np.float32)
    field[:k, :c * kh * kw] = w.transpose(0, 2, 3, 1).reshape(k, -1)
    halves = to_bf16(field).astype(np.uint32)  # [K', R']
    words = halves[:, 0::2] | (halves[:, 1::2] << 16)  # [K', R'/2]
    packed = words.reshape(-1, vl, steps, STEP // 2).transpose(0, 2, 3, 1)  # [KB, steps, pairs, VL]
    return np.ascontiguousarray(packed).view(np.float32)


def _convert(g: Conv2d) -> tuple[str, str]:
    """(support, call) rounding the NCHW input at ``st_in[0]`` into the padded NHWC image at
    ``st_in[1]``: a task per padded row, 16 pixels at a time, each channel's 16 values rounded
    (vcvtneps2bf16: ties to even, NaN kept) and interleaved by a permute of the channels'
    words."""
    hp, wp = _padded(g)
    c = g.c
    row = wp * c
    # lane q of the interleaved pixels (q < 16 C) is channel q % C of pixel q / C, which the
    # concatenated channel vectors (16 words each) hold at (q % C) * 16 + q / C
    index = [(q % c) * 16 + q // c if q < 16 * c else 0 for q in range(64)]
    idx = ", ".join(str(v) for v in index)
    chans = [f"_mm512_maskz_loadu_ps(m, s + {ch * g.h * g.w})" for ch in range(c)]
    vecs = [f"(__m256i)_mm512_cvtneps_pbh({v})" for v in chans] + ["_mm256_setzero_si256()"] * (4 - c)
    support = f"""
static const uint16_t st_lanes[64] __attribute__((aligned(64))) = {{{idx}}};
static void st_cvt_task(void *q_, int64_t lo, int64_t hi) {{
  const float *const *a = q_;
  const __m512i i0 = _mm512_load_si512(st_lanes), i1 = _mm512_load_si512(st_lanes + 32);
  for (int64_t t = lo; t < hi; t++) {{
    const int64_t n = t / {hp}, r = t % {hp}, ih = r - {g.pt};
    uint16_t *d = (uint16_t *)a[1] + t * {row};
    if (ih < 0 || ih >= {g.h}) {{ memset(d, 0, {row * 2}); continue; }}
    memset(d, 0, {g.pl * c * 2});
    memset(d + {(g.pl + g.w) * c}, 0, {g.pr * c * 2});
    const float *x = a[0] + n * {c * g.h * g.w} + ih * {g.w};
    for (int64_t w0 = 0; w0 < {g.w}; w0 += 16) {{
      const int64_t left = {g.w} - w0, m_count = left < 16 ? left : 16;
      const __mmask16 m = (__mmask16)((1u << m_count) - 1);
      const float *s = x + w0;
      const __m512i v01 = _mm512_inserti64x4(_mm512_castsi256_si512({vecs[0]}), {vecs[1]}, 1);
      const __m512i v23 = _mm512_inserti64x4(_mm512_castsi256_si512({vecs[2]}), {vecs[3]}, 1);
      const int64_t words = m_count * {c};
      uint16_t *o = d + ({g.pl} + w0) * {c};
      _mm512_mask_storeu_epi16(o, words >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << words) - 1),
                               _mm512_permutex2var_epi16(v01, i0, v23));
      if (words > 32)
        _mm512_mask_storeu_epi16(o + 32, (__mmask32)((1ull << (words - 32)) - 1),
                                 _mm512_permutex2var_epi16(v01, i1, v23));
    }}
  }}
}}
"""
    call = f"nn_parallel({g.n * hp}, {g.n * hp * row}, st_cvt_task, (void *)st_in);"
    return support, call


def _mt_kernel(r_tiles: int, c_tiles: int, steps: int) -> str:
    """C multiplying ``r_tiles`` tiles of 16 pixels (A at ``a``, rows of ``steps`` tiles) by
    ``c_tiles`` output blocks (B at b0, b1) over the receptive field into ``buf``."""
    a_row = steps * STEP * 2  # bytes per pixel row of A
    lines = [f"static inline void st_mt_{r_tiles}x{c_tiles}(const uint16_t *a, const uint32_t *b0, "
             "const uint32_t *b1, float *buf) {", "  (void)b1;"]
    lines += [f"  _tile_zero({2 * r + c});" for r in range(r_tiles) for c in range(c_tiles)]
    for s in range(steps):
        for r in range(r_tiles):
            lines.append(f"  _tile_loadd({4 + r}, a + {r * TILE * steps * STEP + s * STEP}, {a_row});")
            for c in range(c_tiles):
                if r == 0:
                    lines.append(f"  _tile_loadd({6 + c}, b{c} + {s * (STEP // 2) * TILE}, 64);")
                lines.append(f"  _tile_dpbf16ps({2 * r + c}, {4 + r}, {6 + c});")
    lines += [f"  _tile_stored({2 * r + c}, buf + {(2 * r + c) * TILE * TILE}, 64);"
              for r in range(r_tiles) for c in range(c_tiles)]
    lines.append("}")
    return "\n".join(lines) + "\n"


def stem_conv(g: Conv2d, vl: int, ptrs: dict[str, str | None], act: int, p0: str, p1: str,
              scratch: str) -> tuple[str, str]:
    """(support C, statement) of the stem on tiles: ``ptrs`` as direct_conv's (x the NCHW
    input, w the weights packed by pack_weights, b, r, y); ``scratch`` a C expression of
    scratch_bytes(g) bytes."""
    if not applies(g, vl):
        raise ValueError("not a stem the AMX stem convolution takes")
    has_bias, has_res = ptrs.get("b") is not None, ptrs.get("r") is not None
    c = g.c
    hp, wp = _padded(g)
    seg = g.kw * c  # values of one kernel row of a receptive field
    steps = _steps(g)
    a_words = steps * STEP  # bfloat16 values per pixel row of A
    kb = blocks(g.k, vl)
    pixels = g.oh * g.ow
    plane = pixels * vl
    b_block = steps * (STEP // 2) * TILE  # words of B per output block
    rows2, cols2 = -(-pixels // (2 * TILE)), -(-kb // 2)  # 32-pixel blocks, 32-channel columns
    chunks = min(rows2, -(-TASKS // g.n))
    per = -(-rows2 // chunks)
    chunks = -(-rows2 // per)
    support = ["#include <immintrin.h>\n#ifndef __AMX_BF16__\n#error \"AMX stem convolution built without AMX-BF16\"\n#endif\n",
               amx.tile_config(CONFIG, [(TILE, 64)] * 8)]
    cvt_support, cvt_call = _convert(g)
    support.append(cvt_support)
    support += [_mt_kernel(r, cc, steps) for r in (1, 2) for cc in (1, 2)]
    support.append(conv_amx.store_function("st_store", vl, has_bias, has_res, act, p0, p1))
    seg_mask = f"(__mmask32)0x{(1 << seg) - 1:X}u"
    body = amx.task_head("st_task", "uint16_t", 4 * TILE * TILE) + [
        "  (void)bp; (void)rp;",
        # the receptive fields of 32 pixels, each row's tail past the field zero throughout
        f"  uint16_t ab[{2 * TILE * a_words}] __attribute__((aligned(64)));",
        "  memset(ab, 0, sizeof ab);"]
    body += amx.task_c(CONFIG, [
        "  for (int64_t t = lo; t < hi; t++) {",
        f"    const int64_t q = t % {chunks}, n = t / {chunks};",
        f"    const int64_t b1 = (q + 1) * {per} < {rows2} ? (q + 1) * {per} : {rows2};",
        f"    const uint16_t *xn = xb + n * {hp * wp * c};",
        f"    for (int64_t blk = q * {per}; blk < b1; blk++) {{",
        f"      const int64_t px = blk * {2 * TILE}, left = {pixels} - px, valid = left < {2 * TILE} ? left : {2 * TILE};",
        f"      int64_t oh = px / {g.ow}, ow = px % {g.ow};",
        "      for (int64_t r = 0; r < valid; r++) {",
        f"        const uint16_t *s = xn + (oh * {g.sh * wp} + ow * {g.sw}) * {c};",
        f"        uint16_t *d = ab + r * {a_words};",
        f"        for (int i = 0; i < {g.kh}; i++)",
        f"          _mm512_mask_storeu_epi16(d + i * {seg}, {seg_mask}, "
        f"_mm512_maskz_loadu_epi16({seg_mask}, s + i * {g.dh * wp * c}));",
        f"        if (++ow == {g.ow}) {{ ow = 0; oh++; }}",
        "      }",
        "      for (int64_t cl = 0; cl < " + str(cols2) + "; cl++) {",
        "        const int64_t ob = 2 * cl;",
        f"        const int two = ob + 1 < {kb};",
        f"        const uint32_t *b0 = wp + ob * {b_block}, *b1 = b0 + (two ? {b_block} : 0);",
        f"        if (valid > {TILE}) {{ if (two) st_mt_2x2(ab, b0, b1, buf); else st_mt_2x1(ab, b0, b1, buf); }}",
        "        else { if (two) st_mt_1x2(ab, b0, b1, buf); else st_mt_1x1(ab, b0, b1, buf); }",
        "        for (int r = 0; r < 2; r++) {",
        f"          const int64_t rows = valid - r * {TILE} < {TILE} ? valid - r * {TILE} : {TILE};",
        "          if (rows <= 0) break;",
        "          for (int cc = 0; cc <= two; cc++) {",
        f"            const int64_t yo = (n * {kb} + ob + cc) * {plane} + (px + r * {TILE}) * {vl};",
        f"            st_store(buf + (2 * r + cc) * {TILE * TILE}, yp + yo, bp ? bp + (ob + cc) * {vl} : 0, "
        "rp ? rp + yo : 0, rows);",
        "          }",
        "        }",
        "      }",
        "    }",
        "  }"]) + ["}"]
    support.append("\n".join(body) + "\n")
    args = ", ".join(ptrs.get(k) or "0" for k in ("b", "r"))
    flops = 2 * g.n * g.k * pixels * c * g.kh * g.kw
    call = (f"{{ const float *st_in[2] = {{{ptrs['x']}, (const float *)({scratch})}}; {cvt_call} }}\n"
            f"{{ const float *a[5] = {{(const float *)({scratch}), {ptrs['w']}, {args}, (const float *){ptrs['y']}}}; "
            f"nn_parallel({g.n * chunks}, {flops}, st_task, (void *)a); }}")
    return "\n".join(support), call


def conv(g: Conv2d, vl: int, ptrs: dict[str, str | None], act: int, p0: str, p1: str, scratch: str,
         fallback: str) -> tuple[str, str]:
    """(support, statement): the stem on tiles where the process may use them, else
    ``fallback`` (the float32 stem's statement)."""
    support, call = stem_conv(g, vl, ptrs, act, p0, p1, scratch)
    return support, f"if ({amx.PERMITTED}) {{\n{call}\n}} else {{\n{fallback}\n}}"
