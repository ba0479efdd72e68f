"""nncc::QConv's depthwise form over pixels with their channels side by side (NHWC bytes),
for small planes: C code generated per layer, called from int8_depthwise_gen.emit.

The NCHW kernel (int8_depthwise_gen) puts 16 or 32 output positions of one channel in a
vector; on a 7 x 7 or 14 x 14 plane most of each vector and most of the time go to the
channel's own overhead (its phase planes, its short rows). Here the lanes are 32 channels
of one output pixel instead, so a plane of any size fills them:

* a block of 32 channels is copied into a zero-bordered image in scratch, int16 q - x_zero
  per channel, pixel after pixel (the border is 0, the zero point's own q - x_zero);
* each output pixel sums its taps in pairs: the two taps' channel vectors are interleaved
  (``vpunpck[lh]wd``) and ``vpdpwssd`` multiplies each by the pair of weights (w - w_zero,
  int16) and adds both products into an int32 lane: the very integers the NCHW kernel sums
  (|q - x_zero|, |w - w_zero| <= 255, nothing saturates), the bias in the start;
* requantization as the portable kernel (rint(float32(acc) * multiplier), saturated) and
  32 bytes stored at the pixel.

Any input (NHWC or NCHW bytes, or the float image) and any output (NHWC or NCHW bytes, or
the float image) is taken, so the byte plan (int8_bytes) may give this step any mix. Without
AVX-512 (BW, VL, VNNI) but with AVX2, NHWC bytes out are summed on 16-channel halves with
``vpmaddwd`` (the plain loop was 8% slower on the whole MobileNetV2 than the NCHW kernel's
AVX2 form; this one is level with it); otherwise the same sums are plain C on int32.
"""

from __future__ import annotations

import numpy as np

from nncc.native import int8_tables
from nncc.native.graph_query import const_value
from nncc.native.int8_bytes import image_at
from nncc.native.kernel import scratch_arg

LANES = 32  # channels per block: one AVX-512 vector of int16

# Output planes up to this many pixels take this form, where the plan lets them (measured
# on MobileNetV2: its 7 x 7 and 14 x 14 depthwise layers, benchmarks/RESULTS.md).
SMALL_PLANE = 196

QCONV, QADD = ("nncc", "QConv"), ("nncc", "QAdd")


def pixel_side(graph, infos, node, pixel_major) -> bool:
    """Whether the depthwise QConv ``node`` reads and writes pixels with their channels side
    by side (int8_bytes.plan then stores its input and output NHWC where the steps at their
    other ends do too): a depthwise layer on a small output plane between pixel-side steps,
    an ungrouped QConv of the pixel-major form (``pixel_major(node)``) or a QAdd, before it
    and after it. Only then: where one side stays NCHW the kernel has to transpose that side
    pixel by pixel, slower than the NCHW kernel (MobileNetV2's 14 x 14 layers into a
    channel-major projection: 2.5 times slower)."""
    x, w = node.inputs[0], node.inputs[3]
    wv = const_value(graph, infos, w)
    if wv is None or x not in infos or node.outputs[0] not in infos:
        return False
    xshape, yshape = infos[x].shape, infos[node.outputs[0]].shape
    if len(xshape) != 4 or len(yshape) != 4 or not all(isinstance(d, int) for d in yshape):
        return False
    c = xshape[1]
    if int(node.attrs.get("group", 1)) != c or np.shape(wv)[:2] != (c, 1) or yshape[2] * yshape[3] > SMALL_PLANE:
        return False

    def side(other) -> bool:  # another depthwise step never counts: no recursion
        key = (other.domain, other.op_type)
        return key == QADD or (key == QCONV and int(other.attrs.get("group", 1)) == 1 and pixel_major(other))

    producer = graph.producers().get(x)
    readers = graph.consumers().get(node.outputs[0], [])
    return producer is not None and side(producer) and bool(readers) and all(side(r) for r in readers)


def padded(h, w, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl) -> tuple[int, int]:
    """(rows, columns) of the zero-bordered image every tap reads inside."""
    hp = max(h + pt, (oh - 1) * sh + (kh - 1) * dh + 1)
    wp = max(w + pl, (ow - 1) * sw + (kw - 1) * dw + 1)
    return hp, wp


def scratch_bytes(c, *geometry) -> int:
    """Bytes of scratch: a bordered image of int16 per block of LANES channels."""
    hp, wp = padded(*geometry)
    return -(-c // LANES) * hp * wp * LANES * 2


def pack_pairs(pairs: np.ndarray) -> np.ndarray:
    """[C, pairs] int32 pair words (int8_depthwise_gen.pair_weights) -> [blocks, pairs,
    LANES]: a block's pair k is LANES channels' words side by side (0 past C)."""
    c, count = pairs.shape
    blocks = -(-c // LANES)
    out = np.zeros((blocks * LANES, count), np.int32)
    out[:c] = pairs
    return out.reshape(blocks, LANES, count).transpose(0, 2, 1).reshape(-1)


def _padded_channels(values: np.ndarray, c: int) -> np.ndarray:
    out = np.zeros(-(-c // LANES) * LANES, values.dtype)
    out[:c] = values
    return out


def _fill(h, w, c, pt, pl, wp, form) -> tuple[str, str]:
    """C (AVX-512 and plain) that writes block c0's nc channels of the input image into the
    bordered image's interior, q - x_zero as int16: from NHWC bytes a pixel's channels are
    one run, from NCHW bytes or the float image one channel's plane at a time."""
    at = f"xp + ((ih + {pt}) * {wp} + iw + {pl}) * {LANES}"
    if form == "nhwc":
        wide = f"""        for (int64_t ih = 0; ih < {h}; ih++)
            for (int64_t iw = 0; iw < {w}; iw++) {{
                const uint8_t *s = src + (ih * {w} + iw) * {c} + c0;
                const __m256i b = nc == {LANES} ? _mm256_loadu_si256((const __m256i *)s) : _mm256_maskz_loadu_epi8(mask, s);
                _mm512_storeu_si512({at}, _mm512_sub_epi16(_mm512_cvtepu8_epi16(b), centre16));
            }}
"""
        plain = f"""        for (int64_t ih = 0; ih < {h}; ih++)
            for (int64_t iw = 0; iw < {w}; iw++) {{
                const uint8_t *s = src + (ih * {w} + iw) * {c} + c0;
                int16_t *d = {at};
                for (int ch = 0; ch < {LANES}; ch++) d[ch] = ch < nc ? (int16_t)(s[ch] - centre) : 0;
            }}
"""
        return wide, plain
    value = "(int16_t)(s[ih * {w} + iw] - centre)" if form == "nchw" else \
        "(int16_t)q_centred(s[ih * {w} + iw], inv, qlo, qhi)"
    value = value.replace("{w}", str(w))
    src_type = "uint8_t" if form == "nchw" else "float"
    plain = f"""        for (int ch = 0; ch < {LANES}; ch++) {{
            const {src_type} *s = (const {src_type} *)j->x + (c0 + ch) * {h * w};
            for (int64_t ih = 0; ih < {h}; ih++)
                for (int64_t iw = 0; iw < {w}; iw++)
                    ({at})[ch] = ch < nc ? {value} : 0;
        }}
"""
    return plain, plain


def _wide_store(form, c, p) -> str:
    """C that stores the 32 requantized channels of lo and hi (AVX-512) at pixel `pix`."""
    if form == "nhwc":
        return f"""                const __m512i bl = _mm512_add_epi32(_mm512_cvtps_epi32(qn_clamp(lo, ml, ylo, yhi)), yconv);
                const __m512i bh = _mm512_add_epi32(_mm512_cvtps_epi32(qn_clamp(hi, mh, ylo, yhi)), yconv);
                const __m256i bytes = _mm512_cvtepi16_epi8(_mm512_packs_epi32(bl, bh));
                uint8_t *d = (uint8_t *)j->y + pix * {c} + c0;
                if (nc == {LANES}) _mm256_storeu_si256((__m256i *)d, bytes);
                else _mm256_mask_storeu_epi8(d, mask, bytes);"""
    if form == "nchw":
        return f"""                const __m512i bl = _mm512_add_epi32(_mm512_cvtps_epi32(qn_clamp(lo, ml, ylo, yhi)), yconv);
                const __m512i bh = _mm512_add_epi32(_mm512_cvtps_epi32(qn_clamp(hi, mh, ylo, yhi)), yconv);
                uint8_t out[{LANES}];
                _mm256_storeu_si256((__m256i *)out, _mm512_cvtepi16_epi8(_mm512_packs_epi32(bl, bh)));
                for (int ch = 0; ch < nc; ch++) ((uint8_t *)j->y)[(c0 + ch) * {p} + pix] = out[ch];"""
    return f"""                const __m512 fl = _mm512_mul_ps(_mm512_roundscale_ps(qn_clamp(lo, ml, ylo, yhi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), yconv);
                const __m512 fh = _mm512_mul_ps(_mm512_roundscale_ps(qn_clamp(hi, mh, ylo, yhi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), yconv);
                float out[{LANES}];
                _mm512_storeu_ps(out, _mm512_permutex2var_ps(fl, _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23), fh));
                _mm512_storeu_ps(out + 16, _mm512_permutex2var_ps(fl, _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31), fh));
                for (int ch = 0; ch < nc; ch++) j->y[(c0 + ch) * {p} + pix] = out[ch];"""


def _plain_store(form, c, p) -> str:
    """C that stores channel ch's requantized v (plain path)."""
    if form == "nhwc":
        return f"((uint8_t *)j->y)[pix * {c} + c0 + ch] = (uint8_t)(int32_t)(v + yconv);"
    if form == "nchw":
        return f"((uint8_t *)j->y)[(c0 + ch) * {p} + pix] = (uint8_t)(int32_t)(v + yconv);"
    return f"j->y[(c0 + ch) * {p} + pix] = v * yconv;"


def _avx2_branch(out_form, c, oh, ow, sh, wp, sw, pairs, fill_plain, fill_avx2, yconv) -> str:
    """The AVX2 form of the block's sums, for NHWC bytes out (other outputs take the plain
    loop): the AVX-512 loop on 16-channel halves, ``vpmaddwd`` and an add for ``vpdpwssd``."""
    if out_form != "nhwc":
        return ""
    sums = "\n".join(
        f"""                    {{ const __m256i x0 = _mm256_loadu_si256((const __m256i *)(a + {o0} + h * 16)),
                                    x1 = _mm256_loadu_si256((const __m256i *)(a + {o1} + h * 16));
                      lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(x0, x1), wl[{k}][h]));
                      hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(x0, x1), wh[{k}][h])); }}"""
        for k, (o0, o1) in enumerate(pairs))
    return f"""#elif defined(__AVX2__)
{fill_avx2 or fill_plain}
        /* per 16-channel half, the lanes vpunpcklwd and vpunpckhwd leave channels in: per
         * 128-bit lane, its low four and its high four (0-3 and 8-11, 4-7 and 12-15) */
        __m256i wl[{len(pairs)}][2], wh[{len(pairs)}][2], bl[2], bh[2];
        __m256 ml[2], mh[2];
        for (int h = 0; h < 2; h++) {{
            for (int k = 0; k < {len(pairs)}; k++) {{
                const __m256i w0 = _mm256_loadu_si256((const __m256i *)(wk + k * {LANES} + h * 16));
                const __m256i w1 = _mm256_loadu_si256((const __m256i *)(wk + k * {LANES} + h * 16 + 8));
                wl[k][h] = _mm256_permute2x128_si256(w0, w1, 0x20);
                wh[k][h] = _mm256_permute2x128_si256(w0, w1, 0x31);
            }}
            const __m256i b0 = _mm256_loadu_si256((const __m256i *)(t->bias + c0 + h * 16));
            const __m256i b1 = _mm256_loadu_si256((const __m256i *)(t->bias + c0 + h * 16 + 8));
            bl[h] = _mm256_permute2x128_si256(b0, b1, 0x20);
            bh[h] = _mm256_permute2x128_si256(b0, b1, 0x31);
            const __m256 m0 = _mm256_loadu_ps(t->mult + c0 + h * 16), m1 = _mm256_loadu_ps(t->mult + c0 + h * 16 + 8);
            ml[h] = _mm256_permute2f128_ps(m0, m1, 0x20);
            mh[h] = _mm256_permute2f128_ps(m0, m1, 0x31);
        }}
        const __m256 ylo = _mm256_set1_ps(t->y_lo - t->y_zero), yhi = _mm256_set1_ps(t->y_hi - t->y_zero);
        const __m256i yconv = _mm256_set1_epi32((int32_t)({yconv}));
        for (int64_t oy = 0; oy < {oh}; oy++)
            for (int64_t ox = 0; ox < {ow}; ox++) {{
                const int64_t pix = oy * {ow} + ox;
                const int16_t *a = xp + (oy * {sh * wp} + ox * {sw}) * {LANES};
                for (int h = 0; h < 2 && h * 16 < nc; h++) {{
                    __m256i lo = bl[h], hi = bh[h];
{sums}
                    /* saturated before rounding, as the AVX-512 loop; packs put the halves
                     * back in channel order, every value 0..255 */
                    const __m256i il = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_min_ps(yhi, _mm256_max_ps(ylo, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), ml[h])))), yconv);
                    const __m256i ih = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_min_ps(yhi, _mm256_max_ps(ylo, _mm256_mul_ps(_mm256_cvtepi32_ps(hi), mh[h])))), yconv);
                    const __m256i words = _mm256_packs_epi32(il, ih);
                    const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(words, words), 8);
                    uint8_t *d = (uint8_t *)j->y + pix * {c} + c0 + h * 16;
                    if (nc - h * 16 >= 16) _mm_storeu_si128((__m128i *)d, _mm256_castsi256_si128(bytes));
                    else {{
                        uint8_t part[16];
                        _mm_storeu_si128((__m128i *)part, _mm256_castsi256_si128(bytes));
                        memcpy(d, part, (size_t)(nc - h * 16));
                    }}
                }}
            }}
"""


def source(name, n, c, h, w, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl,
           in_form: str | None, out_form: str | None, shift_out: int | None) -> str:
    """The step's C. ``in_form`` and ``out_form``: "nhwc" or "nchw" bytes, None for the float
    image; ``shift_out``: what a stored output byte adds to q (None for a float image)."""
    hp, wp = padded(h, w, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl)
    blocks = -(-c // LANES)
    plane = hp * wp * LANES
    p = oh * ow
    taps = [(i * dh * wp + j * dw) * LANES for i in range(kh) for j in range(kw)]
    taps += taps[-1:] * (len(taps) % 2)  # a lone last tap reads its own run twice, its partner's weight 0
    pairs = list(zip(taps[0::2], taps[1::2]))
    table = int8_tables.depthwise(blocks * LANES, len(pairs))
    fill_wide, fill_plain = _fill(h, w, c, pt, pl, wp, in_form)
    fill_avx2 = "" if in_form != "nhwc" else f"""        for (int64_t ih = 0; ih < {h}; ih++)
            for (int64_t iw = 0; iw < {w}; iw++) {{
                const uint8_t *s = src + (ih * {w} + iw) * {c} + c0;
                int16_t *d = xp + ((ih + {pt}) * {wp} + iw + {pl}) * {LANES};
                if (nc == {LANES}) {{  /* 32 bytes less the centre, 16 a vector */
                    const __m256i centre16 = _mm256_set1_epi16((int16_t)centre);
                    _mm256_storeu_si256((__m256i *)d, _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)s)), centre16));
                    _mm256_storeu_si256((__m256i *)(d + 16), _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(s + 16))), centre16));
                }} else
                    for (int ch = 0; ch < {LANES}; ch++) d[ch] = ch < nc ? (int16_t)(s[ch] - centre) : 0;
            }}
"""
    yconv = "t->y_scale" if shift_out is None else f"t->y_zero + {float(shift_out)}f"
    wide_sums = "\n".join(
        f"""                {{ const __m512i x0 = _mm512_loadu_si512(a + {o0}), x1 = _mm512_loadu_si512(a + {o1});
                  lo = _mm512_dpwssd_epi32(lo, _mm512_unpacklo_epi16(x0, x1), wl[{k}]);
                  hi = _mm512_dpwssd_epi32(hi, _mm512_unpackhi_epi16(x0, x1), wh[{k}]); }}"""
        for k, (o0, o1) in enumerate(pairs))
    plain_sums = "\n".join(
        f"""                for (int ch = 0; ch < {LANES}; ch++) {{
                    const int32_t pw = wk[{k * LANES} + ch];
                    s[ch] += (uint32_t)(a[{o0} + ch] * (int32_t)(int16_t)(pw & 0xffff)
                                        + a[{o1} + ch] * (int32_t)(int16_t)((uint32_t)pw >> 16));
                }}"""
        for k, (o0, o1) in enumerate(pairs))
    border = f"""    for (int64_t r = 0; r < {hp}; r++)
        for (int64_t col = 0; col < {wp}; col++)
            if (r < {pt} || r >= {pt + h} || col < {pl} || col >= {pl + w})
                memset(xp + (r * {wp} + col) * {LANES}, 0, {LANES * 2});"""
    byte_out_wide = "const __m512i yconv = _mm512_set1_epi32((int32_t)(" + yconv + "));" if out_form else \
        "const __m512 yconv = _mm512_set1_ps(" + yconv + ");"
    return f"""/* q - zero, exact: q_int's rounding and saturation with the zero point taken off the
 * bounds (the NCHW kernel's q_centred) */
static inline float q_centred(float v, float inv, float lo, float hi) {{
    float q = rintf(v * inv);
    q = q < lo ? lo : q; q = q > hi ? hi : q;
    return q != q ? lo : q;  /* NaN: the lowest value, as the portable kernel */
}}

{table.declaration}
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define QN_WIDE 1
/* float32(acc) * mult saturated, not yet rounded: the bounds are integers, so rounding after
 * the clamp is the clamp of the rounded value */
static inline __m512 qn_clamp(__m512i acc, __m512 m, __m512 lo, __m512 hi) {{
    return _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_mul_ps(_mm512_cvtepi32_ps(acc), m)));
}}
#endif

typedef struct {{ const float *x; {table.pointer}t; int16_t *xp; float *y; }} qn_job;

/* channel blocks [lo, hi): the block's bordered image, then every output pixel's 32 sums */
static void qn_blocks(void *ctx, int64_t lo, int64_t hi) {{
    const qn_job *j = ctx;
    {table.pointer}t = j->t;
    const float inv = t->x_inv, qlo = t->x_lo - t->x_zero, qhi = t->x_hi - t->x_zero;  /* x's range less its zero */
    const int32_t centre = (int32_t)(t->x_zero + t->x_shift);  /* what a stored byte holds beyond q - x_zero */
    (void)inv; (void)qlo; (void)qhi; (void)centre;
    const uint8_t *src = (const uint8_t *)j->x;
    (void)src;
    int16_t *xp = j->xp + lo * {plane};  /* the task's first block's image serves them all: it stays in cache */
{border}
    for (int64_t blk = lo; blk < hi; blk++) {{
        const int64_t c0 = blk * {LANES};
        const int nc = {c} - c0 < {LANES} ? (int)({c} - c0) : {LANES};
        const int32_t *wk = t->pairs + blk * {len(pairs) * LANES};
#if defined(QN_WIDE)
        const __mmask32 mask = (__mmask32)(((uint64_t)1 << nc) - 1);
        const __m512i centre16 = _mm512_set1_epi16((int16_t)centre);
        (void)mask; (void)centre16;
{fill_wide}
        /* the lanes vpunpcklwd and vpunpckhwd leave channels in: per 128-bit lane, its low
         * four and its high four */
        const __m512i ilo = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
        const __m512i ihi = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
        __m512i wl[{len(pairs)}], wh[{len(pairs)}];
        for (int k = 0; k < {len(pairs)}; k++) {{
            const __m512i w0 = _mm512_loadu_si512(wk + k * {LANES}), w1 = _mm512_loadu_si512(wk + k * {LANES} + 16);
            wl[k] = _mm512_permutex2var_epi32(w0, ilo, w1);
            wh[k] = _mm512_permutex2var_epi32(w0, ihi, w1);
        }}
        const __m512i b0 = _mm512_loadu_si512(t->bias + c0), b1 = _mm512_loadu_si512(t->bias + c0 + 16);
        const __m512i bl = _mm512_permutex2var_epi32(b0, ilo, b1), bh = _mm512_permutex2var_epi32(b0, ihi, b1);
        const __m512 m0 = _mm512_loadu_ps(t->mult + c0), m1 = _mm512_loadu_ps(t->mult + c0 + 16);
        const __m512 ml = _mm512_permutex2var_ps(m0, ilo, m1), mh = _mm512_permutex2var_ps(m0, ihi, m1);
        const __m512 ylo = _mm512_set1_ps(t->y_lo - t->y_zero), yhi = _mm512_set1_ps(t->y_hi - t->y_zero);
        {byte_out_wide}
        for (int64_t oy = 0; oy < {oh}; oy++)
            for (int64_t ox = 0; ox < {ow}; ox++) {{
                const int64_t pix = oy * {ow} + ox;
                const int16_t *a = xp + (oy * {sh * wp} + ox * {sw}) * {LANES};
                __m512i lo = bl, hi = bh;
{wide_sums}
{_wide_store(out_form, c, p)}
            }}
{_avx2_branch(out_form, c, oh, ow, sh, wp, sw, pairs, fill_plain, fill_avx2, yconv)}#else
{fill_plain}
        const float ylo = t->y_lo - t->y_zero, yhi = t->y_hi - t->y_zero, yconv = {yconv};
        for (int64_t oy = 0; oy < {oh}; oy++)
            for (int64_t ox = 0; ox < {ow}; ox++) {{
                const int64_t pix = oy * {ow} + ox;
                const int16_t *a = xp + (oy * {sh * wp} + ox * {sw}) * {LANES};
                uint32_t s[{LANES}];  /* wrapping as the vector lanes do, without signed overflow */
                for (int ch = 0; ch < {LANES}; ch++) s[ch] = (uint32_t)t->bias[c0 + ch];
{plain_sums}
                for (int ch = 0; ch < nc; ch++) {{
                    float v = rintf((float)(int32_t)s[ch] * t->mult[c0 + ch]);
                    v = v < ylo ? ylo : v; v = v > yhi ? yhi : v;
                    {_plain_store(out_form, c, p)}
                }}
            }}
#endif
    }}
}}

static void {name}(const float *X, {table.pointer}table, float *Y, char *scratch) {{
    qn_job j = {{0, table, (int16_t *)scratch, 0}};
    for (int64_t img = 0; img < {n}; img++) {{
        j.x = {image_at("X", c * h * w, in_form is not None, const=True)};
        j.y = {image_at("Y", c * p, out_form is not None)};
        nn_parallel({blocks}, {c * p * kh * kw}, qn_blocks, &j);
    }}
}}
"""


def emit(wr, x, w, out, key: str, pairs: np.ndarray, bias, mult, scalars, x_shape, kernel, geometry,
         in_form: str | None, out_form: str | None, shift_out: int | None) -> None:
    """The step for int8_depthwise_gen.emit: ``pairs`` its weights' pair words, ``kernel``
    (kh, kw), ``geometry`` (oh, ow, strides, dilations, pads begin), the input's and the
    output's forms as source takes them."""
    n, c, h, wd = x_shape
    table = int8_tables.depthwise(-(-c // LANES) * LANES, pairs.shape[1])
    packed = wr.pack(w, f"depthwise nhwc pairs {key}",
                     table.pack(**scalars, pairs=pack_pairs(pairs), bias=_padded_channels(np.asarray(bias, np.int64), c),
                                mult=_padded_channels(np.asarray(mult, np.float32), c)))
    scratch = scratch_bytes(c, h, wd, *kernel, *geometry)
    code = f"q_depthwise_nhwc({wr.ptr(x)}, {wr.ptr(packed)}, {wr.ptr(out)}, {scratch_arg(scratch)});"
    wr.step(code, [x, (packed, table.pointer)], [out], scratch,
            support=wr.simd + source("q_depthwise_nhwc", n, c, h, wd, *kernel, *geometry, in_form, out_form,
                                     shift_out))
