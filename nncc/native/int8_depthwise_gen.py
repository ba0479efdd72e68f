"""nncc::QConv's depthwise form (one input channel per group) as one native int8 step, C
code generated per layer (int8_conv_gen writes the other forms and calls emit here).

Integers throughout, so the sums are exact as they are:

* each channel's image goes into its stride phase planes as int16 q - x_zero (border 0):
  from the bytes a producing int8 step stored (less the byte's centre), or recovered from
  the float image as the portable kernel recovers it;
* the taps go in pairs: the two taps' int16 runs are interleaved (``vpunpck[lh]wd``) and
  ``vpmaddwd`` multiplies each pair by the pair of weights (w - w_zero, int16) and adds the
  two products into an int32 lane, |q - x_zero|, |w - w_zero| <= 255 so nothing saturates;
  16 output positions a vector, the bias in the accumulator's start;
* the sums are requantized in the same registers, as the portable kernel does in float32
  (rint(float32(acc) * multiplier), saturated), and stored as the output's bytes or its
  float image.

Without AVX2 the same sums are plain C on int32.

Where the byte plan stores the input or the output NHWC (small planes between pixel-major
steps), the step is int8_depthwise_nhwc's instead: channels in the vector lanes.
"""

from __future__ import annotations

import numpy as np

from nncc.native import int8_depthwise_nhwc, int8_tables
from nncc.native.int8_bytes import image_at
from nncc.native.kernel import scratch_arg

_VEC = 16  # output positions per vector: 16 int16 lanes of an AVX2 register
_BLOCK = 512  # output positions (row length wps) summed per block of short output rows
_UNROLLED_PAIRS = 32  # kernels up to this many tap pairs are written out, larger ones loop
_STAGE = 8192  # a channel of short rows up to this many pixels is widened as one run (on the stack)


def depthwise_plane(h, w, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl) -> tuple[int, int]:
    """(rows, columns) of each of a depthwise step's sh * sw phase planes: the padded image's
    pixel (r, col) lives in plane (r mod sh, col mod sw) at (r // sh, col // sw), so every
    tap reads its output rows' pixels as one contiguous run."""
    hp = max(h + pt, (oh - 1) * sh + (kh - 1) * dh + 1)
    wp = max(w + pl, (ow - 1) * sw + (kw - 1) * dw + 1)
    return -(-hp // sh), -(-wp // sw)


def depthwise_scratch(c, *plane_args) -> int:
    """Bytes of scratch: every channel's phase planes, int16."""
    hps, wps = depthwise_plane(*plane_args)
    sh, sw = plane_args[6], plane_args[7]
    return c * sh * sw * hps * wps * 2


def pair_weights(centred: np.ndarray) -> np.ndarray:
    """[C, taps] weights less their zero point -> [C, pairs] int32 words, taps 2k (low half)
    and 2k + 1 (high half) as int16, as ``vpmaddwd`` reads a pair; an odd last tap pairs
    with 0."""
    c, taps = centred.shape
    padded = np.zeros((c, taps + taps % 2), np.int64)
    padded[:, :taps] = centred
    low = padded[:, 0::2].astype(np.int16).view(np.uint16).astype(np.uint32)
    high = padded[:, 1::2].astype(np.int16).view(np.uint16).astype(np.uint32)
    return (low | (high << 16)).view(np.int32)


def _tap_offsets(kh, kw, sh, sw, dh, dw, hps, wps) -> list[int]:
    """Where each tap reads, relative to its output position in phase plane (0, 0)."""
    size = hps * wps
    return [((i * dh % sh) * sw + (j * dw % sw)) * size + (i * dh // sh) * wps + (j * dw // sw)
            for i in range(kh) for j in range(kw)]


def _pairs(offsets: list[int]) -> list[tuple[int, int]]:
    """(offset of tap 2k, offset of tap 2k + 1) per pair: a lone last tap reads its own
    offset twice, its partner's weight being 0."""
    padded = offsets + offsets[-1:] * (len(offsets) % 2)
    return list(zip(padded[0::2], padded[1::2]))


def _phase_columns(w, pl, sw, wps, ph) -> tuple[int, int]:
    """[lo, hi) of the columns of phase ph that hold image pixels (the rest are border)."""
    lo = min(wps, max(0, -(-(pl - ph) // sw)))
    hi = max(lo, min(wps, -(-(pl + w - ph) // sw)))
    return lo, hi


def _fill(h, w, pt, pl, sh, sw, hps, wps, byte_in) -> str:
    """C that writes the channel's image rows into their phase planes, each row's border
    columns zeroed around its pixels. Bytes go straight in, widened (two phases: the even
    and odd bytes of each 16-bit word, a mask and a shift), or, rows shorter than a vector,
    the whole channel's first, then copied row by row; floats are recovered into `line`
    first, then placed."""
    src_type = "uint8_t" if byte_in else "float"
    placed = []
    for ph in range(sw):
        lo, hi = _phase_columns(w, pl, sw, wps, ph)
        base = f"dst + {ph * hps * wps}"
        placed.append(f"for (int64_t col = 0; col < {lo}; col++) ({base})[col] = 0;")
        placed.append(f"for (int64_t col = {hi}; col < {wps}; col++) ({base})[col] = 0;")
    staged = ""
    even = f"dst + {(pl % 2) * hps * wps + pl // 2}"
    odd = f"dst + {((pl + 1) % 2) * hps * wps + (pl + 1) // 2}"
    # rows shorter than a vector: the whole channel widened (or split) as one run first
    stage = byte_in and h * w <= _STAGE and ((sw == 1 and _VEC <= h * w and w < _VEC)
                                            or (sw == 2 and 2 * _VEC <= h * w and w < 2 * _VEC and w % 2 == 0))
    channel = f"(const uint8_t *)j->x + ch * {h * w}"
    if stage and sw == 1:
        staged = f"""        int16_t stage[{h * w}];
        qd_widen(stage, {channel}, {h * w}, centre);
"""
        placed.append(f"memcpy(dst + {pl}, stage + ih * {w}, {w * 2});")
    elif stage:
        staged = f"""        int16_t evens[{h * w // 2}], odds[{h * w // 2}];
        qd_split(evens, odds, {channel}, {h * w}, centre);
"""
        placed.append(f"memcpy({even}, evens + ih * {w // 2}, {w});")
        placed.append(f"memcpy({odd}, odds + ih * {w // 2}, {w});")
    elif byte_in and sw == 1:
        placed.append(f"qd_widen(dst + {pl}, src, {w}, centre);")
    elif byte_in and sw == 2:
        placed.append(f"qd_split({even}, {odd}, src, {w}, centre);")
    else:
        line = "src" if byte_in else "line"
        if not byte_in:
            placed.insert(0, f"int16_t line[{w}];\n            for (int64_t i = 0; i < {w}; i++) "
                             f"line[i] = (int16_t)q_centred(src[i], inv, qlo, qhi);")
        for ph in range(sw):
            lo, hi = _phase_columns(w, pl, sw, wps, ph)
            value = f"({line}[col * {sw} + {ph - pl}]{' - centre' if byte_in else ''})"
            placed.append(f"for (int64_t col = {lo}; col < {hi}; col++) (dst + {ph * hps * wps})[col] = (int16_t){value};")
    body = "\n            ".join(placed)
    return f"""{staged}        for (int64_t ih = 0; ih < {h}; ih++) {{
            const int64_t r = ih + {pt};
            const {src_type} *src = (const {src_type} *)j->x + ch * {h * w} + ih * {w};
            int16_t *dst = xp + r % {sh} * {sw * hps * wps} + r / {sh} * {wps};
            {body}
        }}
"""


def _vector_sums(pairs: list[tuple[int, int]]) -> str:
    """C that sums a vector's 16 positions at `a` into lo (positions 0-3, 8-11) and hi
    (4-7, 12-15), the lanes ``vpunpck[lh]wd`` leave them in."""
    if len(pairs) <= _UNROLLED_PAIRS:
        return "\n".join(f"""            {{ const qd_v16 x0 = qd_load(a + {o0}), x1 = qd_load(a + {o1});
              lo += __builtin_ia32_pmaddwd256(__builtin_shuffle(x0, x1, QD_LO), wv[{k}]);
              hi += __builtin_ia32_pmaddwd256(__builtin_shuffle(x0, x1, QD_HI), wv[{k}]); }}"""
                         for k, (o0, o1) in enumerate(pairs))
    return """            for (int64_t k = 0; k < QD_PAIRS; k++) {
                const qd_v16 x0 = qd_load(a + qd_off[k][0]), x1 = qd_load(a + qd_off[k][1]);
                const qd_v16 pair = (qd_v16)((qd_v8i){0} + wk[k]);
                lo += __builtin_ia32_pmaddwd256(__builtin_shuffle(x0, x1, QD_LO), pair);
                hi += __builtin_ia32_pmaddwd256(__builtin_shuffle(x0, x1, QD_HI), pair);
            }"""


def _pair_vectors(count: int) -> str:
    """C that broadcasts each pair of weights into a vector once per run, when the pairs
    are written out (a loop over many pairs broadcasts as it goes: no array of them on the
    stack)."""
    if count > _UNROLLED_PAIRS:
        return ""
    return f"""        qd_v16 wv[{count}];
        for (int64_t i = 0; i < {count}; i++) wv[i] = (qd_v16)((qd_v8i){{0}} + wk[i]);"""


def _wide_sums(pairs: list[tuple[int, int]]) -> str:
    """_vector_sums on AVX-512: 32 positions at `a`, lo (positions 0-3, 8-11, 16-19, 24-27)
    and hi (the other four of each eight), ``vpdpwssd`` adding each pair's two products to
    the sums in one instruction."""
    if len(pairs) <= _UNROLLED_PAIRS:
        return "\n".join(f"""            {{ const __m512i x0 = _mm512_loadu_si512(a + {o0}), x1 = _mm512_loadu_si512(a + {o1});
              lo = _mm512_dpwssd_epi32(lo, _mm512_unpacklo_epi16(x0, x1), wz[{k}]);
              hi = _mm512_dpwssd_epi32(hi, _mm512_unpackhi_epi16(x0, x1), wz[{k}]); }}"""
                         for k, (o0, o1) in enumerate(pairs))
    return """            for (int64_t k = 0; k < QD_PAIRS; k++) {
                const __m512i x0 = _mm512_loadu_si512(a + qd_off[k][0]), x1 = _mm512_loadu_si512(a + qd_off[k][1]);
                const __m512i pair = _mm512_set1_epi32(wk[k]);
                lo = _mm512_dpwssd_epi32(lo, _mm512_unpacklo_epi16(x0, x1), pair);
                hi = _mm512_dpwssd_epi32(hi, _mm512_unpackhi_epi16(x0, x1), pair);
            }"""


def _wide_pair_vectors(count: int) -> str:
    """_pair_vectors for the AVX-512 loop."""
    if count > _UNROLLED_PAIRS:
        return ""
    return f"""        __m512i wz[{count}];
        for (int64_t i = 0; i < {count}; i++) wz[i] = _mm512_set1_epi32(wk[i]);"""


def _wide_store(byte_out: bool) -> str:
    """_vector_store for 32 positions: bytes through ``vpackssdw`` (per 128-bit lane it
    puts lo's four and hi's four back in order) and ``vpmovwb``; floats through two
    two-source permutes."""
    if byte_out:  # rounding after the clamp to integer bounds is the clamp of the rounded value
        return """            const __m512i bl = _mm512_add_epi32(_mm512_cvtps_epi32(qd_clamp16(lo, m, ylo, yhi)), yconv);
            const __m512i bh = _mm512_add_epi32(_mm512_cvtps_epi32(qd_clamp16(hi, m, ylo, yhi)), yconv);
            _mm256_storeu_si256((__m256i *)(dst + p), _mm512_cvtepi16_epi8(_mm512_packs_epi32(bl, bh)));"""
    return """            const __m512 fl = _mm512_mul_ps(_mm512_roundscale_ps(qd_clamp16(lo, m, ylo, yhi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), yconv);
            const __m512 fh = _mm512_mul_ps(_mm512_roundscale_ps(qd_clamp16(hi, m, ylo, yhi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), yconv);
            _mm512_storeu_ps(dst + p, _mm512_permutex2var_ps(fl, _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23), fh));
            _mm512_storeu_ps(dst + p + 16, _mm512_permutex2var_ps(fl, _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31), fh));"""


def _vector_store(byte_out: bool) -> str:
    """C that requantizes lo and hi (float32, as the portable kernel) and stores the 16
    positions in order at dst + p."""
    if byte_out:  # packs put lo's and hi's halves back in order; the clamped q + shift is in 0..255
        return """            const qd_v8i bl = __builtin_convertvector(qd_requantize(lo, m, ylo, yhi) + yconv, qd_v8i);
            const qd_v8i bh = __builtin_convertvector(qd_requantize(hi, m, ylo, yhi) + yconv, qd_v8i);
            const qd_v16 words = (qd_v16)__builtin_ia32_packssdw256(bl, bh);
            const qd_v4q bytes = __builtin_ia32_permdi256((qd_v4q)__builtin_ia32_packuswb256(words, words), 8);
            memcpy(dst + p, &bytes, 16);"""
    return """            const qd_v8f fl = qd_requantize(lo, m, ylo, yhi) * yconv, fh = qd_requantize(hi, m, ylo, yhi) * yconv;
            const qd_v8f first = __builtin_ia32_vperm2f128_ps256(fl, fh, 0x20);
            const qd_v8f second = __builtin_ia32_vperm2f128_ps256(fl, fh, 0x31);
            memcpy(dst + p, &first, 32);
            memcpy(dst + p + 8, &second, 32);"""


def _scalar_sums(pairs: list[tuple[int, int]]) -> str:
    """C that sums position p in uint32 (wrapping as the vector lanes do, without the
    undefined behaviour of a signed overflow)."""
    if len(pairs) <= _UNROLLED_PAIRS:
        terms = "\n".join(f"            s += (uint32_t)(at[p + {o0}] * (int32_t)(int16_t)(wk[{k}] & 0xffff)"
                          f" + at[p + {o1}] * (int32_t)(int16_t)((uint32_t)wk[{k}] >> 16));"
                          for k, (o0, o1) in enumerate(pairs))
        return terms
    return """            for (int64_t k = 0; k < QD_PAIRS; k++)
                s += (uint32_t)(at[p + qd_off[k][0]] * (int32_t)(int16_t)(wk[k] & 0xffff)
                                + at[p + qd_off[k][1]] * (int32_t)(int16_t)((uint32_t)wk[k] >> 16));"""


def source(name, n, c, h, w, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl,
           byte_in: bool = False, byte_out: int | None = None, wide: bool = False) -> str:
    """In the phase planes output pixel (oy, ox) reads, for each tap, position oy * wps + ox
    plus that tap's offset: a run of output positions reads a run of each tap's. Rows of
    whole vectors (or whose last vector's overlap recomputes no more than the plane's
    border, or too long to join two a block) are runs of their own, stored straight into the output; other rows go a block
    at a time as one run (the wps - ow positions between rows computed and dropped). A
    run's last vector overlaps its predecessor rather than reading past it.
    ``wide``: code for 16-float vectors (AVX-512), whose runs take 32 positions a vector
    where the CPU has AVX-512 BW and VNNI, so rows of fewer than 32 go in blocks."""
    vec = 2 * _VEC if wide else _VEC
    hps, wps = depthwise_plane(h, w, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl)
    size = hps * wps  # one phase plane
    taps = kh * kw
    pairs = _pairs(_tap_offsets(kh, kw, sh, sw, dh, dw, hps, wps))
    table = int8_tables.depthwise(c, len(pairs))
    out_type = "float" if byte_out is None else "uint8_t"
    border = [(0, pt), (pt + h, hps * sh)]
    zero_rows = "\n        ".join(
        f"for (int64_t r = {r0}; r < {r1}; r++)\n"
        f"            for (int64_t ph = 0; ph < {sw}; ph++) "
        f"memset(xp + (r % {sh} * {sw} + ph) * {size} + r / {sh} * {wps}, 0, {wps * 2});"
        for r0, r1 in border if r1 > r0)
    offsets = "" if len(pairs) <= _UNROLLED_PAIRS else (  # each pair's taps' offsets, for the loops
        f"static const int32_t qd_off[QD_PAIRS][2] = {{{', '.join(f'{{{o0}, {o1}}}' for o0, o1 in pairs)}}};\n")
    scalar_value = "v * k.yconv" if byte_out is None else "(uint8_t)(int32_t)(v + k.yconv)"
    # a row of whole vectors is a run of its own; other rows are joined, a block of at least
    # two, with the wps - ow dropped positions between them, fewer than a row's overlapping
    # last vector recomputes (a 56-position row: 58 a row joined against 64)
    if ow >= vec and (-(-ow // vec) * vec <= wps or _BLOCK // wps < 2):
        runs = f"""        for (int64_t oy = 0; oy < {oh}; oy++)
            qd_run(xp + oy * {wps}, {ow}, y + oy * {ow}, wk, bias[ch], k);"""
    else:
        rows = max(1, min(oh, _BLOCK // wps))  # output rows per block
        runs = f"""        for (int64_t oy = 0; oy < {oh}; oy += {rows}) {{
            const int64_t n_rows = {oh} - oy < {rows} ? {oh} - oy : {rows};
            {out_type} out[{(rows - 1) * wps + ow}];
            qd_run(xp + oy * {wps}, (n_rows - 1) * {wps} + {ow}, out, wk, bias[ch], k);
            for (int64_t r = 0; r < n_rows; r++) memcpy(y + (oy + r) * {ow}, out + r * {wps}, {ow} * sizeof *out);
        }}"""
    return f"""/* q - zero, exact: q_int's rounding and saturation with the zero point taken off the
 * bounds instead (lo and hi here are lo - zero and hi - zero: small integers, so both ways
 * agree wherever float32 holds every integer, and saturate alike beyond) */
static inline float q_centred(float v, float inv, float lo, float hi) {{
    float q = rintf(v * inv);
    q = q < lo ? lo : q; q = q > hi ? hi : q;
    return q != q ? lo : q;  /* NaN: the lowest value, as the portable kernel */
}}

/* n bytes less the centre (x_zero plus the bytes' shift): q - x_zero; 16 at a time, the
 * last 16 overlapping their predecessors */
typedef uint8_t qd_bytes __attribute__((vector_size(16)));
typedef uint16_t qd_words __attribute__((vector_size(32)));
typedef int16_t qd_halves __attribute__((vector_size(32)));
static inline void qd_widen16(int16_t *dst, const uint8_t *src, int32_t centre) {{
    qd_bytes b;
    memcpy(&b, src, sizeof b);
    const qd_halves v = __builtin_convertvector(b, qd_halves) - (int16_t)centre;
    memcpy(dst, &v, sizeof v);
}}
#if defined(__AVX512BW__)
#include <immintrin.h>
#define QD_FILL_WIDE 1  /* the fill's runs 32 words a vector: half the instructions of 16 */
static inline void qd_widen32(int16_t *dst, const uint8_t *src, int32_t centre) {{
    const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)src));
    _mm512_storeu_si512(dst, _mm512_sub_epi16(v, _mm512_set1_epi16((int16_t)centre)));
}}
/* a row's 64 bytes: the even ones (each word's low byte) and the odd ones, less the centre */
static inline void qd_split32(int16_t *even, int16_t *odd, const uint8_t *src, int32_t centre) {{
    const __m512i words = _mm512_loadu_si512(src), c = _mm512_set1_epi16((int16_t)centre);
    _mm512_storeu_si512(even, _mm512_sub_epi16(_mm512_and_si512(words, _mm512_set1_epi16(0xff)), c));
    _mm512_storeu_si512(odd, _mm512_sub_epi16(_mm512_srli_epi16(words, 8), c));
}}
#endif
static inline void qd_widen(int16_t *dst, const uint8_t *src, int64_t n, int32_t centre) {{
    if (n < 16) {{
        for (int64_t i = 0; i < n; i++) dst[i] = (int16_t)(src[i] - centre);
        return;
    }}
#if defined(QD_FILL_WIDE)
    if (n >= 32) {{
        for (int64_t i = 0;; i += 32) {{
            if (i + 32 > n) i = n - 32;
            qd_widen32(dst + i, src + i, centre);
            if (i + 32 >= n) return;
        }}
    }}
#endif
    for (int64_t i = 0;; i += 16) {{
        if (i + 16 > n) i = n - 16;
        qd_widen16(dst + i, src + i, centre);
        if (i + 16 >= n) return;
    }}
}}
/* the same for a row's even bytes into `even` and its odd ones into `odd` (stride 2's phases) */
static inline void qd_split16(int16_t *even, int16_t *odd, const uint8_t *src, int32_t centre) {{
    qd_words words;
    memcpy(&words, src, sizeof words);
    const qd_halves e = (qd_halves)(words & 0xff) - (int16_t)centre, o = (qd_halves)(words >> 8) - (int16_t)centre;
    memcpy(even, &e, sizeof e);
    memcpy(odd, &o, sizeof o);
}}
static inline void qd_split(int16_t *even, int16_t *odd, const uint8_t *src, int64_t n, int32_t centre) {{
    int64_t k = 0;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__  /* a word's low byte is the even one */
#if defined(QD_FILL_WIDE)
    if (n / 2 >= 32) {{
        for (; 2 * (k + 32) <= n; k += 32) qd_split32(even + k, odd + k, src + 2 * k, centre);
        if (k < n / 2) qd_split32(even + n / 2 - 32, odd + n / 2 - 32, src + 2 * (n / 2 - 32), centre);
        k = n / 2;  /* an odd n's last even byte is the scalar loop's */
    }}
#endif
    for (; 2 * (k + 16) <= n; k += 16) qd_split16(even + k, odd + k, src + 2 * k, centre);
    if (k > 0 && k < n / 2) {{  /* the last whole pairs: a vector that overlaps its predecessor */
        k = n / 2 - 16;
        qd_split16(even + k, odd + k, src + 2 * k, centre);
        k = n / 2;
    }}
#endif
    for (int64_t i = k; i < (n + 1) / 2; i++) even[i] = (int16_t)(src[2 * i] - centre);
    for (int64_t i = k; i < n / 2; i++) odd[i] = (int16_t)(src[2 * i + 1] - centre);
}}

{table.declaration}
#define QD_PAIRS {len(pairs)}
{offsets}typedef struct {{ float mult, ylo, yhi, yconv; }} qd_consts;  /* a channel's requantization */

#if defined(__AVX2__)
typedef int16_t qd_v16 __attribute__((vector_size(32)));
typedef int32_t qd_v8i __attribute__((vector_size(32)));
typedef float qd_v8f __attribute__((vector_size(32)));
typedef long long qd_v4q __attribute__((vector_size(32)));
/* the lanes vpunpcklwd and vpunpckhwd take from two vectors: per 128-bit half, the pairs
 * (x0[i], x1[i]) of its low and its high four positions */
#define QD_LO ((qd_v16){{0, 16, 1, 17, 2, 18, 3, 19, 8, 24, 9, 25, 10, 26, 11, 27}})
#define QD_HI ((qd_v16){{4, 20, 5, 21, 6, 22, 7, 23, 12, 28, 13, 29, 14, 30, 15, 31}})
static inline qd_v16 qd_load(const int16_t *p) {{ qd_v16 v; memcpy(&v, p, sizeof v); return v; }}
/* rint(float32(acc) * mult) saturated less the zero point, as q_centred: max and min return
 * their second operand on a NaN, as the scalar selects keep v */
static inline qd_v8f qd_requantize(qd_v8i acc, qd_v8f m, qd_v8f lo, qd_v8f hi) {{
    const qd_v8f v = __builtin_ia32_roundps256(__builtin_convertvector(acc, qd_v8f) * m, 8);
    return __builtin_ia32_minps256(hi, __builtin_ia32_maxps256(lo, v));
}}
#endif

#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define QD_WIDE 1
/* float32(acc) * mult saturated to lo and hi, not yet rounded: the bounds are integers, so
 * rounding after the clamp gives the clamp of the rounded value, as qd_requantize */
static inline __m512 qd_clamp16(__m512i acc, __m512 m, __m512 lo, __m512 hi) {{
    return _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_mul_ps(_mm512_cvtepi32_ps(acc), m)));
}}
#endif

/* n output positions from `at` (a run in the phase planes) into dst[0, n) */
static void qd_run(const int16_t *at, int64_t n, {out_type} *dst, const int32_t *wk, int32_t bias, qd_consts k) {{
    int64_t p = 0;
#if defined(QD_WIDE)
    if (n >= {2 * _VEC}) {{
{_wide_pair_vectors(len(pairs))}
        const __m512i start = _mm512_set1_epi32(bias);
        const __m512 m = _mm512_set1_ps(k.mult), ylo = _mm512_set1_ps(k.ylo), yhi = _mm512_set1_ps(k.yhi);
        {"const __m512 yconv = _mm512_set1_ps(k.yconv);" if byte_out is None else "const __m512i yconv = _mm512_set1_epi32((int32_t)k.yconv);"}
        for (;; p += {2 * _VEC}) {{
            if (p + {2 * _VEC} > n) p = n - {2 * _VEC};  /* the last vector overlaps */
            const int16_t *a = at + p;
            __m512i lo = start, hi = start;
{_wide_sums(pairs)}
{_wide_store(byte_out is not None)}
            if (p + {2 * _VEC} >= n) return;
        }}
    }}
#endif
#if defined(__AVX2__)
    if (n >= {_VEC}) {{
{_pair_vectors(len(pairs))}
        const qd_v8i start = (qd_v8i){{0}} + bias;
        const qd_v8f m = (qd_v8f){{0}} + k.mult, ylo = (qd_v8f){{0}} + k.ylo, yhi = (qd_v8f){{0}} + k.yhi;
        const qd_v8f yconv = (qd_v8f){{0}} + k.yconv;
        for (;; p += {_VEC}) {{
            if (p + {_VEC} > n) p = n - {_VEC};  /* the last vector overlaps */
            const int16_t *a = at + p;
            qd_v8i lo = start, hi = start;
{_vector_sums(pairs)}
{_vector_store(byte_out is not None)}
            if (p + {_VEC} >= n) return;
        }}
    }}
#endif
    for (; p < n; p++) {{
        uint32_t s = (uint32_t)bias;
{_scalar_sums(pairs)}
        float v = rintf((float)(int32_t)s * k.mult);
        v = v < k.ylo ? k.ylo : v; v = v > k.yhi ? k.yhi : v;
        dst[p] = {scalar_value};
    }}
}}

typedef struct {{ const float *x; {table.pointer}t; int16_t *xp; float *y; }} qd_job;

/* channels [lo, hi): the centred phase planes, then the output's runs */
static void qd_channels(void *ctx, int64_t lo, int64_t hi) {{
    const qd_job *j = ctx;
    {table.pointer}t = j->t;
    const float inv = t->x_inv, qlo = t->x_lo - t->x_zero, qhi = t->x_hi - t->x_zero;  /* x's range less its zero */
    const int32_t centre = (int32_t)(t->x_zero + t->x_shift);  /* what a stored byte holds beyond q - x_zero */
    (void)inv; (void)qlo; (void)qhi; (void)centre;
    const int32_t *bias = t->bias;
    int16_t *xp = j->xp + lo * {sh * sw * size};  /* the task's first channel's planes serve them all: they stay in cache */
    for (int64_t ch = lo; ch < hi; ch++) {{
        {zero_rows}
{_fill(h, w, pt, pl, sh, sw, hps, wps, byte_in)}        const int32_t *wk = t->pairs + ch * QD_PAIRS;
        const qd_consts k = {{t->mult[ch], t->y_lo - t->y_zero, t->y_hi - t->y_zero,
                             {"t->y_scale" if byte_out is None else f"t->y_zero + {float(byte_out)}f"}}};
        {out_type} *y = ({out_type} *)j->y + ch * {oh * ow};
{runs}
    }}
}}

static void {name}(const float *X, {table.pointer}table, float *Y, char *scratch) {{
    qd_job j = {{0, table, (int16_t *)scratch, 0}};
    for (int64_t img = 0; img < {n}; img++) {{
        j.x = {image_at("X", c * h * w, byte_in, const=True)};
        j.y = {image_at("Y", c * oh * ow, byte_out is not None)};
        nn_parallel({c}, {c * oh * ow * taps}, qd_channels, &j);
    }}
}}
"""


def emit(wr, x, w, out, key: str, wv, zero_w, bias, mult, scalars, x_shape, geometry, byte_in, byte_out) -> None:
    """The depthwise step for QConv: ``key`` names the layer's quantization parameters (its
    packed table is shared by layers that agree on them), ``geometry`` (oh, ow, strides,
    dilations, pads begin) as source takes it."""
    n, c, h, wd = x_shape
    m, _, kh, kw = wv.shape
    taps = kh * kw
    centred = wv.astype(np.int64).reshape(m, taps) - zero_w[:, None]
    pairs = pair_weights(centred)
    out_form = wr.byte_images.get(out) if byte_out is not None else None
    if "nhwc" in (byte_in, out_form):  # the plan gave a side NHWC bytes: channels in the lanes
        int8_depthwise_nhwc.emit(wr, x, w, out, key, pairs, bias, mult, scalars, x_shape, (kh, kw), geometry,
                                 byte_in or None, out_form, byte_out)
        return
    table = int8_tables.depthwise(c, pairs.shape[1])
    packed = wr.pack(w, f"depthwise pairs {key}", table.pack(**scalars, pairs=pairs, bias=bias, mult=mult))
    scratch = depthwise_scratch(c, h, wd, kh, kw, *geometry)
    code = f"q_depthwise({wr.ptr(x)}, {wr.ptr(packed)}, {wr.ptr(out)}, {scratch_arg(scratch)});"
    wr.step(code, [x, (packed, table.pointer)], [out], scratch,
            support=wr.simd + source("q_depthwise", n, c, h, wd, kh, kw, *geometry, byte_in, byte_out,
                                     wide=wr.vl == 16))
