"""C that turns an int8 image's NCHW bytes into its pixels' runs of channels (NHWC), for the
pixel-major int8 convolution (nncc/native/int8_conv_gen.py) reading the bytes a depthwise or
channel-major step stored.

Byte by byte, each pixel's C bytes are read C planes apart: a strided load per byte. Here
16 channels x 16 pixels are loaded as 16 vectors (one per channel, 16 pixels each) and
transposed in registers by four rounds of ``punpck[lh]bw`` pairing vector i with i + 8 (each
round interleaves the halves, after four the rows are the columns), then stored as 16
pixels' runs of 16 channels. Past the last whole 16 channels, a block overlapping the
previous one stores the same bytes again (so only C >= 16 takes this path); pixels past the
last whole 16 go byte by byte. Pure data movement: the bytes are those of the plain loop.

A float image (the portable kernel's exact image of q) is recovered the same way, on
AVX-512: a channel's 16 pixels a vector, each recovered as q_byte does (float32 product by
1 / scale, rounded half to even, plus the zero point, clamped with a NaN taking the low
bound: ``vmaxps`` returns its second operand when the first is NaN, then the shift), the 16
channels' bytes transposed as above; so every byte is q_byte's.
"""

from __future__ import annotations

BLOCK = 16  # channels and pixels of a block transposed in registers


def wanted(byte_in: str | None, c: int) -> bool:
    """Whether a layer reads an NCHW image (bytes or floats) with channels enough for whole
    blocks."""
    return byte_in != "nhwc" and c >= BLOCK


_BLOCK16 = """#if defined(__SSE2__)
#include <emmintrin.h>
/* 16 channel rows (``stride`` bytes apart) of 16 pixels into 16 pixels' runs of 16 channels
 * (``pitch`` bytes apart) */
static inline void qt_block16(const uint8_t *src, int64_t stride, uint8_t *dst, int64_t pitch) {
    __m128i v[16];
    for (int i = 0; i < 16; i++) v[i] = _mm_loadu_si128((const __m128i *)(src + i * stride));
    qt_transpose16(v, dst, pitch);
}
#endif
"""

_FLOAT16 = """#if defined(__AVX512F__)
#include <immintrin.h>
/* 16 channel rows of 16 floats (``stride`` floats apart) recovered to bytes as q_byte does,
 * into 16 pixels' runs of 16 channels (``pitch`` bytes apart) */
static inline void qt_float16(const float *src, int64_t stride, uint8_t *dst, int64_t pitch, __m512 inv,
                              __m512 zero, __m512 lo, __m512 hi, __m512i shift) {
    __m128i v[16];
    for (int i = 0; i < 16; i++) {
        __m512 q = _mm512_add_ps(_mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(src + i * stride), inv),
                                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zero);
        q = _mm512_min_ps(_mm512_max_ps(q, lo), hi);  /* NaN: lo (vmaxps's second operand) */
        v[i] = _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(q), shift));
    }
    qt_transpose16(v, dst, pitch);
}
#endif
"""

_TRANSPOSE16 = """#if defined(__SSE2__)
#include <emmintrin.h>
/* 16 rows of 16 bytes transposed in registers, the columns stored ``pitch`` bytes apart */
static inline void qt_transpose16(__m128i v[16], uint8_t *dst, int64_t pitch) {
    __m128i t[16];
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < 8; i++) {
            t[2 * i] = _mm_unpacklo_epi8(v[i], v[i + 8]);
            t[2 * i + 1] = _mm_unpackhi_epi8(v[i], v[i + 8]);
        }
        for (int i = 0; i < 16; i++) v[i] = t[i];
    }
    for (int i = 0; i < 16; i++) _mm_storeu_si128((__m128i *)(dst + i * pitch), v[i]);
}
#endif
"""


def source(c: int, plane: int) -> str:
    """C of ``qt_nhwc(src, out, pixels)``: ``pixels`` consecutive pixels of an NCHW byte
    image (channel planes ``plane`` bytes apart, from ``src``) into their runs of ``c``
    bytes from ``out``."""
    assert c >= BLOCK
    last = c - BLOCK
    return f"""{_TRANSPOSE16}{_BLOCK16}
static void qt_nhwc(const uint8_t *src, uint8_t *out, int64_t pixels) {{
    int64_t q = 0;
#if defined(__SSE2__)
    for (; q + 16 <= pixels; q += 16) {{
        for (int64_t ch = 0; ch < {last}; ch += 16)
            qt_block16(src + ch * {plane} + q, {plane}, out + q * {c} + ch, {c});
        qt_block16(src + {last * plane} + q, {plane}, out + q * {c} + {last}, {c});  /* overlaps the one before */
    }}
#endif
    for (; q < pixels; q++)
        for (int64_t ch = 0; ch < {c}; ch++) out[q * {c} + ch] = src[ch * {plane} + q];
}}
"""


def float_source(c: int, plane: int) -> str:
    """C of ``qt_nhwc_float(src, out, pixels, inv, zero, lo, hi, shift)``: source's
    ``qt_nhwc`` for a float image, each value recovered to its byte as q_byte does."""
    assert c >= BLOCK
    last = c - BLOCK
    return f"""{_TRANSPOSE16}{_FLOAT16}
static void qt_nhwc_float(const float *src, uint8_t *out, int64_t pixels, float inv, float zero, float lo,
                          float hi, float shift) {{
    int64_t q = 0;
#if defined(__AVX512F__)
    const __m512 vi = _mm512_set1_ps(inv), vz = _mm512_set1_ps(zero), vl = _mm512_set1_ps(lo), vh = _mm512_set1_ps(hi);
    const __m512i vs = _mm512_set1_epi32((int32_t)shift);
    for (; q + 16 <= pixels; q += 16) {{
        for (int64_t ch = 0; ch < {last}; ch += 16)
            qt_float16(src + ch * {plane} + q, {plane}, out + q * {c} + ch, {c}, vi, vz, vl, vh, vs);
        qt_float16(src + {last * plane} + q, {plane}, out + q * {c} + {last}, {c}, vi, vz, vl, vh, vs);
    }}
#endif
    for (; q < pixels; q++)
        for (int64_t ch = 0; ch < {c}; ch++) out[q * {c} + ch] = q_byte(src[ch * {plane} + q], inv, zero, lo, hi, shift);
}}
"""
