"""Convolutions over a blocked input in bfloat16 on AMX tiles
(``tdpbf16ps``, nncc/native/amx.py), for precision bf16 on CPUs with amx_tile and amx_bf16.

Every ungrouped one is built here: the others (kernels, strides, padding, dilation) tap by
tap (below, direct_amx_conv). A 1x1, stride-1, unpadded one is a product per image:
[H*W pixels] x [C channels] by [C] x [K]. In
the blocked layout one output block's 16 consecutive pixels are 16 rows of 64 bytes, so a
C tile of 16 pixels x 16 output channels is exactly that stretch of the output.

Operands:
- B: the weights packed for the bfloat16 direct convolution (conv_bf16.pack_weights:
  [OCG][ICB][LB/2][OCB*VL] words of channel pairs), read as tiles of pairs x 16 columns
  with a row stride of OCB*VL words; with an even count of input blocks a tile spans two
  consecutive blocks (16 pairs, 32 channels: the full 64-byte row), else one (8 pairs).
- A: the input rounded to bfloat16 pairs into scratch as [N, ICB/P, T*16, 8P] words (P
  input blocks, one tile's pairs, side by side per pixel; T tiles of 16 pixels, the pixels
  past H*W zero), so a tile of A is 16 consecutive rows of that scratch. The lanes past the
  last real channel are zeroed (as conv_bf16.convert does), where the weights are zero too.

A micro-tile is 32 pixels x 32 output channels: four C tiles (tmm0-3), two of A (tmm4-5),
two of B (tmm6-7), each loaded tile serving two products; the sums stay in the tiles over
all of C, then go through a small buffer on the stack into the output with the float32
epilogue (bias, residual, activation), only the valid pixels. A micro-tile at the end of
the pixels or channels multiplies only the tiles it needs. Tasks are (image, chunk of
32-pixel rows, chunk of 32-channel columns); each loads the tile configuration and releases
the tiles when done.

The step keeps the vdpbf16ps convolution (blocked_conv.direct_conv with bf16) for where the
OS refuses the tiles or NNCC_AMX=0 (decided once per process: runtime.c). Arithmetic:
tdpbf16ps reads bfloat16 denormals as zero and flushes denormal float32 results, rounding
to nearest even; the bound is the bfloat16 GEMM's with the denormal term (docs/native.md).
"""

from __future__ import annotations

from nncc.native import amx
from nncc.native.blocked_conv import Conv2d, after_store, blocks, stored

TILE = 16  # pixels (rows of A and C) per tile
CONFIG = "ax_cfg"
TASKS = 8  # at least this many tasks per convolution where the geometry allows


def applies(g: Conv2d, vl: int) -> bool:
    """The convolutions built here: 1x1, stride 1, unpadded, ungrouped, over 16-lane blocks."""
    return vl == 16 and g.group == 1 and g.kh == g.kw == 1 and g.sh == g.sw == 1 \
        and not (g.pt or g.pl or g.pb or g.pr)


def _per_tile(g: Conv2d, vl: int) -> int:
    """P: input blocks per tile of A (two, a full 64-byte row, where their count is even)."""
    return 2 if blocks(g.c, vl) % 2 == 0 else 1


def _pixel_tiles(g: Conv2d) -> int:
    return -(-(g.oh * g.ow) // TILE)


def scratch_bytes(g: Conv2d, vl: int) -> int:
    """Bytes of the rounded input: N x ICB blocks of T*16 pixels of VL/2 words."""
    return g.n * blocks(g.c, vl) * _pixel_tiles(g) * TILE * (vl // 2) * 4


def _convert(g: Conv2d, vl: int) -> tuple[str, str]:
    """(support, call) rounding the blocked input at ``ax_in[0]`` into the scratch at
    ``ax_in[1]`` as [N, ICB/P, T*16, 8P] words, the padding pixels zero."""
    icb, p = blocks(g.c, vl), _per_tile(g, vl)
    last = g.c - (icb - 1) * vl
    pixels, padded = g.oh * g.ow, _pixel_tiles(g) * TILE
    chunk = 1024
    chunks = -(-padded // chunk)
    half = vl // 2
    support = f"""
static void ax_cvt_task(void *q_, int64_t lo, int64_t hi) {{
  const float *const *a = q_;
  for (int64_t t = lo; t < hi; t++) {{
    const int64_t q = t % {chunks}, b = t / {chunks}, n = b / {icb}, cb = b % {icb};
    const __mmask16 keep = cb == {icb - 1} ? (__mmask16){(1 << last) - 1} : (__mmask16)0xFFFF;
    const float *s = a[0] + b * {pixels * vl};
    uint32_t *d = (uint32_t *)a[1] + (n * {icb // p} + cb / {p}) * {padded * half * p} + (cb % {p}) * {half};
    const int64_t i1 = (q + 1) * {chunk} < {padded} ? (q + 1) * {chunk} : {padded};
    for (int64_t i = q * {chunk}; i < i1; i++) {{
      __m256i v = i < {pixels} ? (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(keep, s + i * {vl}))
                               : _mm256_setzero_si256();
      _mm256_storeu_si256((__m256i *)(d + i * {half * p}), v);
    }}
  }}
}}
"""
    call = f"nn_parallel({g.n * icb * chunks}, {g.n * icb * padded * vl}, ax_cvt_task, (void *)ax_in);"
    return support, call


def _mt_kernel(r_tiles: int, c_tiles: int, kp: int, a_stride: int, pair_rows: int, b_stride: int,
               b_step: int, a_step: int) -> str:
    """C multiplying ``r_tiles`` tiles of 16 pixels by ``c_tiles`` output blocks over all
    ``kp`` tiles of input channels into ``buf`` (one 16 x 16 float block per C tile)."""
    lines = [f"static inline void ax_mt_{r_tiles}x{c_tiles}(const uint32_t *a, const uint32_t *b0, "
             "const uint32_t *b1, float *buf) {", "  (void)b1;"]
    lines += [f"  _tile_zero({2 * r + c});" for r in range(r_tiles) for c in range(c_tiles)]
    lines.append(f"  for (int64_t k = 0; k < {kp}; k++) {{")
    for r in range(r_tiles):
        lines.append(f"    _tile_loadd({4 + r}, a + k * {a_step} + {r * TILE * a_stride}, {a_stride * 4});")
        for c in range(c_tiles):
            if r == 0:
                lines.append(f"    _tile_loadd({6 + c}, b{c} + k * {b_step}, {b_stride * 4});")
            lines.append(f"    _tile_dpbf16ps({2 * r + c}, {4 + r}, {6 + c});")
    lines.append("  }")
    lines += [f"  _tile_stored({2 * r + c}, buf + {(2 * r + c) * TILE * TILE}, 64);"
              for r in range(r_tiles) for c in range(c_tiles)]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _store(vl: int, has_bias: bool, has_res: bool, act: int, p0: str, p1: str) -> str:
    """C finishing ``rows`` pixels of one C tile's sums in ``buf`` into the output: bias,
    residual and activation (blocked_conv's epilogue, one vector per pixel)."""
    res = "res + r * 16" if has_res else None
    v = stored("v", res, act, p0, p1)
    tail = after_store(act, "y", "rows", vl, p0, p1)
    return "\n".join([
        "static inline void ax_store(const float *restrict buf, float *restrict y, const float *restrict bias, "
        "const float *restrict res, int64_t rows) {",
        "  (void)bias; (void)res;",
        f"  const nn_v bv = {'nn_vload(bias)' if has_bias else 'nn_vzero()'};",
        "  for (int64_t r = 0; r < rows; r++) {",
        "    const nn_v v = nn_vadd(nn_vload(buf + r * 16), bv);",
        f"    nn_vstore(y + r * 16, {v});",
        "  }",
        f"  {tail}" if tail else "",
        "}"]) + "\n"


def amx_conv(g: Conv2d, vl: int, ocb: int, ptrs: dict[str, str | None], act: int, p0: str, p1: str,
             scratch: str) -> tuple[str, str]:
    """(support C, statement) of the convolution on tiles: ``ptrs`` as direct_conv's (x the
    blocked input, w the weights packed by conv_bf16.pack_weights with ``ocb`` blocks per
    group, b, r, y); ``scratch`` a C expression of scratch_bytes(g, vl) bytes, 64-aligned."""
    if not applies(g, vl):
        raise ValueError("the AMX convolution is 1x1, stride 1, unpadded and ungrouped")
    has_bias, has_res = ptrs.get("b") is not None, ptrs.get("r") is not None
    icb, p = blocks(g.c, vl), _per_tile(g, vl)
    kb = blocks(g.k, vl)
    half = vl // 2
    pixels, tiles = g.oh * g.ow, _pixel_tiles(g)
    padded = tiles * TILE
    a_stride = half * p  # words per pixel row of A
    a_step = padded * a_stride  # words per tile of input channels
    b_stride = ocb * vl  # words per pair row of the packed weights
    b_step = p * half * b_stride  # words per tile of input channels
    group_words = icb * half * b_stride  # a channel group's packed weights
    plane = pixels * vl
    rows2, cols2 = -(-tiles // 2), -(-kb // 2)  # 32-pixel rows, 32-channel columns
    pc = min(rows2, -(-TASKS // g.n))
    cc = min(cols2, max(1, -(-TASKS // (g.n * pc))))
    rows_per, cols_per = -(-rows2 // pc), -(-cols2 // cc)
    pc, cc = -(-rows2 // rows_per), -(-cols2 // cols_per)

    support = ["#ifndef __AMX_BF16__\n#error \"AMX convolution built without AMX-BF16\"\n#endif\n",
               amx.tile_config(CONFIG, [(TILE, 64)] * 4 + [(TILE, a_stride * 4)] * 2 + [(p * half, 64)] * 2)]
    cvt_support, cvt_call = _convert(g, vl)
    support.append(cvt_support)
    support += [_mt_kernel(r, c, icb // p, a_stride, p * half, b_stride, b_step, a_step)
                for r in (1, 2) for c in (1, 2)]
    support.append(_store(vl, has_bias, has_res, act, p0, p1))
    body = _task_head("ax_task") + amx.task_c(CONFIG, _task_loops(
        cc, pc, rows_per, rows2, cols_per, cols2) + [
        f"      const int64_t px = pr * {2 * TILE}, left = {pixels} - px;",
        f"      const uint32_t *xa = xb + n * {icb // p * a_step} + px * {a_stride};",
        f"      for (int64_t cl = cq * {cols_per}; cl < c1; cl++) {{",
        "        const int64_t ob = 2 * cl;",
        f"        const int two = ob + 1 < {kb};",
        f"        const uint32_t *b0 = wp + ob / {ocb} * {group_words} + ob % {ocb} * {vl};",
        f"        const uint32_t *b1 = two ? wp + (ob + 1) / {ocb} * {group_words} + (ob + 1) % {ocb} * {vl} : b0;",
        f"        if (left > {TILE}) {{ if (two) ax_mt_2x2(xa, b0, b1, buf); else ax_mt_2x1(xa, b0, b1, buf); }}",
        "        else { if (two) ax_mt_1x2(xa, b0, b1, buf); else ax_mt_1x1(xa, b0, b1, buf); }",
        "        for (int r = 0; r < 2; r++) {",
        f"          const int64_t rows = left - r * {TILE} < {TILE} ? left - r * {TILE} : {TILE};",
        "          if (rows <= 0) break;",
        "          for (int c = 0; c <= two; c++) {",
        f"            const int64_t yo = (n * {kb} + ob + c) * {plane} + (px + r * {TILE}) * {vl};",
        f"            ax_store(buf + (2 * r + c) * {TILE * TILE}, yp + yo, bp ? bp + (ob + c) * {vl} : 0, "
        "rp ? rp + yo : 0, rows);",
        "          }",
        "        }",
        "      }",
        "    }",
        "  }"]) + ["}"]
    support.append("\n".join(body) + "\n")
    args = ", ".join(ptrs.get(k) or "0" for k in ("b", "r"))
    call = (f"{{ const float *ax_in[2] = {{{ptrs['x']}, (const float *)({scratch})}}; {cvt_call} }}\n"
            f"{{ const float *a[5] = {{(const float *)({scratch}), {ptrs['w']}, {args}, (const float *){ptrs['y']}}}; "
            f"nn_parallel({g.n * pc * cc}, {2 * g.n * g.k * pixels * g.c}, ax_task, (void *)a); }}")
    return "\n".join(support), call


def tiles_scratch_bytes(g: Conv2d, vl: int) -> int:
    """Scratch bytes of ``conv``'s tile path."""
    return scratch_bytes(g, vl) if applies(g, vl) else direct_scratch_bytes(g, vl)


def conv(g: Conv2d, vl: int, ocb: int, ptrs: dict[str, str | None], act: int, p0: str, p1: str,
         scratch: str, fallback: str) -> tuple[str, str]:
    """(support, statement): the convolution on tiles where the process may use them (the
    1x1 stride-1 product where it applies, else tap by tap), else ``fallback`` (the
    vdpbf16ps convolution's statement)."""
    build = amx_conv if applies(g, vl) else direct_amx_conv
    support, call = build(g, vl, ocb, ptrs, act, p0, p1, scratch)
    return support, f"if ({amx.PERMITTED}) {{\n{call}\n}} else {{\n{fallback}\n}}"


# ---------------------------------------------------------------- KxK, strides, padding
#
# Any other ungrouped convolution over a blocked input: a C tile is 16 consecutive output
# pixels of one output row (a "stretch"; a row of W_out pixels has ceil(W_out / 16) of
# them, the last one short), and per tap (kernel row i, column j) and input block its A
# tile is the 16 input pixels those outputs read: consecutive at the stride, so a tile
# load with a row stride of stride * 32 bytes. The input is rounded into scratch as
# [N, ICB, Hp, Wp, 8] words with its padding (and room for a short stretch's missing
# pixels) written as zeros, so every tile load is in bounds and no tap is clipped. One
# input block per tile (8 pairs): the packed weights' taps lie between two blocks' pairs,
# so a B tile is one block's 8 pairs of one tap, rows OCB * 16 words apart.


def applies_direct(g: Conv2d, vl: int) -> bool:
    """The convolutions the tap-by-tap kernel builds: ungrouped, over 16-lane blocks."""
    return vl == 16 and g.group == 1


def _padded(g: Conv2d) -> tuple[int, int, int]:
    """(stretches per output row, padded input rows, padded input columns)."""
    tw = -(-g.ow // TILE)
    hp = max(g.h + g.pt + g.pb, (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1)
    wp = max(g.w + g.pl + g.pr, (tw * TILE - 1) * g.sw + (g.kw - 1) * g.dw + 1)
    return tw, hp, wp


def direct_scratch_bytes(g: Conv2d, vl: int) -> int:
    _, hp, wp = _padded(g)
    return g.n * blocks(g.c, vl) * hp * wp * (vl // 2) * 4


def _direct_convert(g: Conv2d, vl: int) -> tuple[str, str]:
    """(support, call) rounding the blocked input at ``ax_in[0]`` into the padded scratch at
    ``ax_in[1]``: one task per (image, block, padded row), zeros outside the input."""
    icb = blocks(g.c, vl)
    last = g.c - (icb - 1) * vl
    _, hp, wp = _padded(g)
    half = vl // 2
    support = f"""
static void kx_cvt_task(void *q_, int64_t lo, int64_t hi) {{
  const float *const *a = q_;
  for (int64_t t = lo; t < hi; t++) {{
    const int64_t r = t % {hp}, b = t / {hp}, ih = r - {g.pt};
    const __mmask16 keep = b % {icb} == {icb - 1} ? (__mmask16){(1 << last) - 1} : (__mmask16)0xFFFF;
    uint32_t *d = (uint32_t *)a[1] + t * {wp * half};
    if (ih < 0 || ih >= {g.h}) {{
      for (int64_t i = 0; i < {wp}; i++) _mm256_storeu_si256((__m256i *)(d + i * {half}), _mm256_setzero_si256());
      continue;
    }}
    const float *s = a[0] + (b * {g.h} + ih) * {g.w * vl};
    for (int64_t i = 0; i < {wp}; i++) {{
      const int64_t iw = i - {g.pl};
      __m256i v = iw >= 0 && iw < {g.w} ? (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(keep, s + iw * {vl}))
                                        : _mm256_setzero_si256();
      _mm256_storeu_si256((__m256i *)(d + i * {half}), v);
    }}
  }}
}}
"""
    call = f"nn_parallel({g.n * icb * hp}, {g.n * icb * hp * wp * vl}, kx_cvt_task, (void *)ax_in);"
    return support, call


def _direct_mt(g: Conv2d, r_tiles: int, c_tiles: int, icb: int, hp: int, wp: int, b_stride: int) -> str:
    """C multiplying ``r_tiles`` stretches (A at a0, a1: their first tap's first input
    pixel) by ``c_tiles`` output blocks (B at b0, b1) over every input block and tap."""
    half = 8
    lines = [f"static inline void kx_mt_{r_tiles}x{c_tiles}(const uint32_t *a0, const uint32_t *a1, "
             "const uint32_t *b0, const uint32_t *b1, float *buf) {", "  (void)a1; (void)b1;"]
    lines += [f"  _tile_zero({2 * r + c});" for r in range(r_tiles) for c in range(c_tiles)]
    lines += [f"  for (int64_t k = 0; k < {icb}; k++) {{",
              f"    for (int i = 0; i < {g.kh}; i++) {{",
              f"      for (int j = 0; j < {g.kw}; j++) {{",
              f"        const int64_t oa = k * {hp * wp * half} + (i * {g.dh * wp} + j * {g.dw}) * {half};",
              f"        const int64_t ob = ((k * {g.kh} + i) * {g.kw} + j) * {half * b_stride};"]
    for r in range(r_tiles):
        lines.append(f"        _tile_loadd({4 + r}, a{r} + oa, {g.sw * half * 4});")
        for c in range(c_tiles):
            if r == 0:
                lines.append(f"        _tile_loadd({6 + c}, b{c} + ob, {b_stride * 4});")
            lines.append(f"        _tile_dpbf16ps({2 * r + c}, {4 + r}, {6 + c});")
    lines += ["      }", "    }", "  }"]
    lines += [f"  _tile_stored({2 * r + c}, buf + {(2 * r + c) * TILE * TILE}, 64);"
              for r in range(r_tiles) for c in range(c_tiles)]
    lines.append("}")
    return "\n".join(lines) + "\n"


def direct_amx_conv(g: Conv2d, vl: int, ocb: int, ptrs: dict[str, str | None], act: int, p0: str, p1: str,
                    scratch: str) -> tuple[str, str]:
    """(support C, statement) of the tap-by-tap convolution on tiles; arguments as amx_conv's,
    ``scratch`` holding direct_scratch_bytes(g, vl)."""
    if not applies_direct(g, vl):
        raise ValueError("the AMX convolution is ungrouped")
    has_bias, has_res = ptrs.get("b") is not None, ptrs.get("r") is not None
    icb, kb = blocks(g.c, vl), blocks(g.k, vl)
    tw, hp, wp = _padded(g)
    half = vl // 2
    b_stride = ocb * vl
    group_words = icb * g.kh * g.kw * half * b_stride
    plane = g.oh * g.ow * vl
    stretches = g.oh * tw
    rows2, cols2 = -(-stretches // 2), -(-kb // 2)
    pc = min(rows2, -(-TASKS // g.n))
    cc = min(cols2, max(1, -(-TASKS // (g.n * pc))))
    rows_per, cols_per = -(-rows2 // pc), -(-cols2 // cc)
    pc, cc = -(-rows2 // rows_per), -(-cols2 // cols_per)
    support = ["#ifndef __AMX_BF16__\n#error \"AMX convolution built without AMX-BF16\"\n#endif\n",
               amx.tile_config(CONFIG, [(TILE, 64)] * 4 + [(TILE, half * 4)] * 2 + [(half, 64)] * 2)]
    cvt_support, cvt_call = _direct_convert(g, vl)
    support.append(cvt_support)
    support += [_direct_mt(g, r, c, icb, hp, wp, b_stride) for r in (1, 2) for c in (1, 2)]
    support.append(_store(vl, has_bias, has_res, act, p0, p1))
    body = _task_head("kx_task") + amx.task_c(CONFIG, _task_loops(
        cc, pc, rows_per, rows2, cols_per, cols2) + [
        "      int64_t oh[2], ow0[2], rows[2];",
        "      const uint32_t *xa[2];",
        f"      const int two_s = 2 * pr + 1 < {stretches};",
        "      for (int r = 0; r < 2; r++) {",
        f"        const int64_t s = 2 * pr + (r && two_s);",
        f"        oh[r] = s / {tw}; ow0[r] = s % {tw} * {TILE};",
        f"        rows[r] = {g.ow} - ow0[r] < {TILE} ? {g.ow} - ow0[r] : {TILE};",
        f"        xa[r] = xb + n * {icb * hp * wp * half} + (oh[r] * {g.sh * wp} + ow0[r] * {g.sw}) * {half};",
        "      }",
        f"      for (int64_t cl = cq * {cols_per}; cl < c1; cl++) {{",
        "        const int64_t ob = 2 * cl;",
        f"        const int two = ob + 1 < {kb};",
        f"        const uint32_t *b0 = wp + ob / {ocb} * {group_words} + ob % {ocb} * {vl};",
        f"        const uint32_t *b1 = two ? wp + (ob + 1) / {ocb} * {group_words} + (ob + 1) % {ocb} * {vl} : b0;",
        "        if (two_s) { if (two) kx_mt_2x2(xa[0], xa[1], b0, b1, buf); else kx_mt_2x1(xa[0], xa[1], b0, b1, buf); }",
        "        else { if (two) kx_mt_1x2(xa[0], xa[1], b0, b1, buf); else kx_mt_1x1(xa[0], xa[1], b0, b1, buf); }",
        "        for (int r = 0; r <= two_s; r++) {",
        "          for (int c = 0; c <= two; c++) {",
        f"            const int64_t yo = (n * {kb} + ob + c) * {plane} + (oh[r] * {g.ow} + ow0[r]) * {vl};",
        f"            ax_store(buf + (2 * r + c) * {TILE * TILE}, yp + yo, bp ? bp + (ob + c) * {vl} : 0, "
        "rp ? rp + yo : 0, rows[r]);",
        "          }",
        "        }",
        "      }",
        "    }",
        "  }"]) + ["}"]
    support.append("\n".join(body) + "\n")
    args = ", ".join(ptrs.get(k) or "0" for k in ("b", "r"))
    flops = 2 * g.n * g.k * g.oh * g.ow * g.c * g.kh * g.kw
    call = (f"{{ const float *ax_in[2] = {{{ptrs['x']}, (const float *)({scratch})}}; {cvt_call} }}\n"
            f"{{ const float *a[5] = {{(const float *)({scratch}), {ptrs['w']}, {args}, (const float *){ptrs['y']}}}; "
            f"nn_parallel({g.n * pc * cc}, {flops}, kx_task, (void *)a); }}")
    return "\n".join(support), call


def _task_head(name: str) -> list[str]:
    """C opening a pool task of either convolution: its operands (the rounded input, the
    packed weights, bias, residual, output) and the stack buffer the tiles are stored to."""
    return [
        f"static void {name}(void *q_, int64_t lo, int64_t hi) {{",
        "  const float *const *a = q_;",
        "  const uint32_t *xb = (const uint32_t *)a[0], *wp = (const uint32_t *)a[1];",
        "  const float *bp = a[2], *rp = a[3];",
        "  float *yp = (float *)a[4];",
        "  (void)bp; (void)rp;",
        f"  float buf[{4 * TILE * TILE}] __attribute__((aligned(64)));"]


def _task_loops(cc: int, pc: int, rows_per: int, rows2: int, cols_per: int, cols2: int) -> list[str]:
    """C of a task's loops: over its tasks (image, chunk of row pairs, chunk of column pairs),
    then the row pairs of its chunk (the caller's lines go inside, and close both)."""
    return [
        "  for (int64_t t = lo; t < hi; t++) {",
        f"    const int64_t cq = t % {cc}, pq = (t / {cc}) % {pc}, n = t / {cc * pc};",
        f"    const int64_t r1 = (pq + 1) * {rows_per} < {rows2} ? (pq + 1) * {rows_per} : {rows2};",
        f"    const int64_t c1 = (cq + 1) * {cols_per} < {cols2} ? (cq + 1) * {cols_per} : {cols2};",
        f"    for (int64_t pr = pq * {rows_per}; pr < r1; pr++) {{"]
