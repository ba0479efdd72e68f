"""The channel-major form of the native int8 convolution (nncc/native/int8_conv_gen.py):
output channels x pixels, for layers with few output channels over many pixels (a
MobileNet's early 1x1 layers), where the pixel-major form's 64-channel panels would be
mostly padding and its stores would transpose.

The input image is quantized into padded byte planes (C x Hp x Wp, the padding the zero
point), then packed as A4: for each group of four rows of K (K ordered channel, kernel row,
kernel column, as the weights lie), the pixels' four bytes side by side, pixels padded to a
multiple of 64. ``vpdpbusd`` multiplies 64 pixels' bytes (four vectors) by one output
channel's four weight bytes broadcast, six channels at a time; plain C elsewhere. The
epilogue is int8_conv_gen's (zero points through the pixels' and channels' sums, the int32
bias, float32 requantization, the output's image), vectorised over 64 pixels and stored
contiguously in NCHW.
"""

from __future__ import annotations

import numpy as np

from nncc.native.int8_bytes import byte_store, image_at
from nncc.native.int8_gemm_gen import vnni_sums

MRC = 6  # output channels per micro-tile
NP = 64  # pixels per micro-tile: four AVX-512 vectors of int32 lanes


def preferred(pixels: int, channels: int, pixel_rows: int, channel_panel: int) -> bool:
    """Whether the channel-major form wastes less padding than the pixel-major one."""
    def up(v, to):
        return -(-v // to) * to
    return up(pixels, NP) * up(channels, MRC) < up(pixels, pixel_rows) * up(channels, channel_panel)


def table(head: np.ndarray, matrix: np.ndarray, zero_w, bias, mult, shift: int) -> np.ndarray:
    """head, then per output channel (padded to MRC): the weights' sum, zero point (shifted
    with them), multiplier and bias."""
    m = matrix.shape[0]
    mp = -(-m // MRC) * MRC
    columns = np.zeros((4, mp), np.float32)
    ints = columns.view(np.int32)
    ints[0, :m] = matrix.astype(np.int32).sum(axis=1)
    ints[1, :m] = zero_w - shift
    columns[2, :m] = mult
    ints[3, :m] = bias
    return np.concatenate([head, columns.reshape(-1)])


def pack_weights(matrix: np.ndarray) -> np.ndarray:
    """[M, K] int8 -> [Mp, Kp] bytes, zero-padded."""
    m, k = matrix.shape
    out = np.zeros((-(-m // MRC) * MRC, -(-k // 4) * 4), np.int8)
    out[:m, :k] = matrix
    return out.reshape(-1)


def scratch_bytes(c, h, w, m, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl) -> int:
    hp, wp = _padded(h, w, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl)
    kp = -(-c * kh * kw // 4) * 4
    p64 = -(-oh * ow // NP) * NP
    return _up64((c + 1) * hp * wp) + _up64(kp * p64) + p64 * 4


def _up64(n: int) -> int:
    return -(-n // 64) * 64


def _padded(h, w, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl):
    return (max(h + pt, (oh - 1) * sh + (kh - 1) * dh + 1), max(w + pl, (ow - 1) * sw + (kw - 1) * dw + 1))


def source(name, quantize_byte, header, n, c, h, w, m, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl,
           zero_points: bool, byte_in: bool = False, byte_out: int | None = None) -> str:
    """``zero_points``: some weight zero point is not 0, so the pixels' sums are needed.
    ``byte_in``: the input is stored as bytes; ``byte_out``: store the output as bytes, q
    plus this shift (int8_bytes)."""
    hp, wp = _padded(h, w, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl)
    k = c * kh * kw
    kp = -(-k // 4) * 4
    groups = kp // 4
    p = oh * ow
    p64 = -(-p // NP) * NP
    blocks = p64 // NP
    slivers = -(-m // MRC)
    mp = slivers * MRC
    planes = _up64((c + 1) * hp * wp)
    a_bytes = _up64(kp * p64)
    taps = kh * kw
    colsum = "(int64_t)zw[o] * (int64_t)j->colsum[p0 + q]" if zero_points else "0"
    sums = f"""
/* pixels [lo, hi): the sum of each pixel's bytes over K (for the weights' zero points) */
static void qm_sums(void *ctx, int64_t lo, int64_t hi) {{
    const qm_job *j = ctx;
    for (int64_t q = lo; q < hi; q++) {{
        int32_t s = 0;
        for (int64_t g = 0; g < {groups}; g++) {{
            const uint8_t *b = j->a + (g * {p64} + q) * 4;
            s += b[0] + b[1] + b[2] + b[3];
        }}
        j->colsum[q] = s;
    }}
}}
""" if zero_points else ""
    call_sums = f"        nn_parallel({p64}, {p64 * kp}, qm_sums, &j);\n" if zero_points else ""
    pointwise = kh == kw == 1 and sh == sw == 1 and (oh, ow) == (h, w) and pt == pl == 0
    full, rest = divmod(c, 4)
    x_type = "uint8_t" if byte_in else "float"

    def pack_loop(channels):  # the group's channels, composed into each pixel's word
        reads = "".join(f", *x{t} = x0 + {t * p}" for t in range(1, channels))
        byte = "(uint32_t)x{t}[q]" if byte_in else "(uint32_t)q_byte(x{t}[q], inv, zero, qlo, qhi, shift)"
        word = " | ".join(byte.format(t=t) + f" << {8 * t}" for t in range(channels))
        return f"""{{
            const {x_type} *x0 = (const {x_type} *)j->x + 4 * g * {p}{reads};
            for (int64_t q = 0; q < {p}; q++) out[q] = {word};
        }}"""
    tail = f"""
        else
            {pack_loop(rest)}""" if rest else ""
    direct = f"""
typedef uint32_t qm_word __attribute__((may_alias));

/* groups [lo, hi) of four channels of a pointwise layer, packed straight from the input:
 * each pixel's four bytes composed as one 32-bit word, so the loop runs in whole vectors
 * (storing the bytes one by one extracted them a lane at a time) */
static void qm_pack_direct(void *ctx, int64_t lo, int64_t hi) {{
    const qm_job *j = ctx;
    const float *t = j->table;
    const float inv = t[0], zero = t[1], qlo = t[2], qhi = t[3], shift = t[4];
    for (int64_t g = lo; g < hi; g++) {{
        qm_word *out = (qm_word *)(j->a + g * {p64 * 4});
        if (g < {full})
            {pack_loop(4)}{tail}
        memset(out + {p}, 0, {(p64 - p) * 4});
    }}
}}
""" if pointwise else ""
    phases = (f"        nn_parallel({groups}, {kp * p64}, qm_pack_direct, &j);\n" if pointwise else
              f"        nn_parallel({c + 1}, {c * hp * wp}, qm_planes, &j);\n"
              f"        nn_parallel({groups}, {kp * p64}, qm_pack, &j);\n")
    if byte_in:  # the bytes are q plus the shift already: a copy per image row
        fill_plane = f"""        const uint8_t *src = (const uint8_t *)j->x + ch * {h * w};
        for (int64_t ih = 0; ih < {h}; ih++) memcpy(plane + (ih + {pt}) * {wp} + {pl}, src + ih * {w}, {w});"""
    else:
        fill_plane = f"""        const float *src = j->x + ch * {h * w};
        for (int64_t ih = 0; ih < {h}; ih++)
            for (int64_t iw = 0; iw < {w}; iw++)
                plane[(ih + {pt}) * {wp} + iw + {pl}] = q_byte(src[ih * {w} + iw], inv, zero, qlo, qhi, shift);"""
    if byte_out is None:
        out_type, to_out = "float", "(v - yzero) * yscale"
    else:
        out_type, to_out = "uint8_t", byte_store(byte_out)
    return f"""
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define Q_VNNI 1
#endif
{quantize_byte}
typedef struct {{ const float *x; uint8_t *planes, *a; int32_t *colsum; const int8_t *w; const float *table;
                  float *y; }} qm_job;

/* channels [lo, hi): the padded byte planes; plane C stays all zero bytes (K's padding) */
static void qm_planes(void *ctx, int64_t lo, int64_t hi) {{
    const qm_job *j = ctx;
    const float *t = j->table;
    const float inv = t[0], zero = t[1], qlo = t[2], qhi = t[3], shift = t[4];
    const uint8_t pad = (uint8_t)(int32_t)(zero + shift);
    for (int64_t ch = lo; ch < hi; ch++) {{
        uint8_t *plane = j->planes + ch * {hp * wp};
        if (ch == {c}) {{
            memset(plane, 0, {hp * wp});
            continue;
        }}
        memset(plane, pad, {hp * wp});
{fill_plane}
    }}
}}

/* groups [lo, hi) of four K rows: each pixel's four bytes side by side */
static void qm_pack(void *ctx, int64_t lo, int64_t hi) {{
    const qm_job *j = ctx;
    for (int64_t g = lo; g < hi; g++) {{
        const uint8_t *src[4];
        for (int t = 0; t < 4; t++) {{
            int64_t k = 4 * g + t;
            if (k >= {k}) {{
                src[t] = j->planes + {c * hp * wp};
                continue;
            }}
            int64_t ch = k / {taps}, i = (k / {kw}) % {kh}, jj = k % {kw};
            src[t] = j->planes + ch * {hp * wp} + i * {dh * wp} + jj * {dw};
        }}
        uint8_t *out = j->a + g * {p64 * 4};
        for (int64_t oy = 0; oy < {oh}; oy++) {{
            const uint8_t *s0 = src[0] + oy * {sh * wp}, *s1 = src[1] + oy * {sh * wp};
            const uint8_t *s2 = src[2] + oy * {sh * wp}, *s3 = src[3] + oy * {sh * wp};
            uint8_t *d = out + oy * {ow * 4};
            for (int64_t ox = 0; ox < {ow}; ox++) {{
                d[4 * ox] = s0[ox * {sw}];
                d[4 * ox + 1] = s1[ox * {sw}];
                d[4 * ox + 2] = s2[ox * {sw}];
                d[4 * ox + 3] = s3[ox * {sw}];
            }}
        }}
        memset(out + {p * 4}, 0, {(p64 - p) * 4});
    }}
}}
{sums}
{direct}
/* int32 dot products of 64 pixels with ``rows`` output channels, into acc[rows][64]; out of line,
 * so the tile loop's epilogue constants do not crowd its 24 sums out of the registers */
static __attribute__((noinline)) void qm_dots(const uint8_t *a, const int8_t *w, int rows,
                                                          int32_t acc[{MRC}][{NP}]) {{
#ifdef Q_VNNI
    {vnni_sums(MRC, groups, [f"_mm512_loadu_si512(a + g * {p64 * 4} + {64 * v})" for v in range(4)],
               lambda r: f"w + {r * kp} + g * 4", vector_unsigned=True)}
#else
    for (int r = 0; r < rows; r++) {{
        int32_t *c = acc[r];
        for (int q = 0; q < {NP}; q++) c[q] = 0;
        for (int64_t g = 0; g < {groups}; g++) {{
            const uint8_t *ag = a + g * {p64 * 4};
            const int8_t *wg = w + r * {kp} + g * 4;
            int32_t w0 = wg[0], w1 = wg[1], w2 = wg[2], w3 = wg[3];
            for (int q = 0; q < {NP}; q++)
                c[q] += ag[4 * q] * w0 + ag[4 * q + 1] * w1 + ag[4 * q + 2] * w2 + ag[4 * q + 3] * w3;
        }}
    }}
#endif
}}

/* the (pixel block x channel sliver) tiles [lo, hi) */
static void qm_tiles(void *ctx, int64_t lo, int64_t hi) {{
    const qm_job *j = ctx;
    const float *t = j->table;
    const float zero = t[1] + t[4], yscale = t[5], yzero = t[6], qlo = t[7], qhi = t[8];
    const int32_t za = (int32_t)zero;
    const int32_t *ws = (const int32_t *)(t + {header}), *zw = (const int32_t *)(t + {header + mp});
    const float *mult = t + {header + 2 * mp};
    const int32_t *bias = (const int32_t *)(t + {header + 3 * mp});
    int32_t acc[{MRC}][{NP}];
    for (int64_t task = lo; task < hi; task++) {{
        int64_t b = task / {slivers}, s = task % {slivers};
        int64_t p0 = b * {NP}, m0 = s * {MRC};
        int rows = s == {slivers - 1} ? {m - (slivers - 1) * MRC} : {MRC};
        int width = b == {blocks - 1} ? {p - (blocks - 1) * NP} : {NP};
        qm_dots(j->a + p0 * 4, j->w + m0 * {kp}, rows, acc);
        for (int r = 0; r < rows; r++) {{
            int64_t o = m0 + r;
            /* unsigned: wraps as the portable kernel's int32 accumulator */
            uint32_t fixed = (uint32_t)bias[o] - (uint32_t)za * (uint32_t)ws[o] + (uint32_t)({k} * za) * (uint32_t)zw[o];
            {out_type} out[{NP}];
            for (int q = 0; q < {NP}; q++) {{
                uint32_t e = (uint32_t)acc[r][q] + fixed - (uint32_t)({colsum});
                float v = rintf((float)(int32_t)e * mult[o]) + yzero;
                v = v < qlo ? qlo : v; v = v > qhi ? qhi : v;
                out[q] = {to_out};
            }}
            memcpy(({out_type} *)j->y + o * {p} + p0, out, width * sizeof *out);
        }}
    }}
}}

static void {name}(const float *X, const float *W, const float *table, float *Y, char *scratch) {{
    qm_job j = {{0, (uint8_t *)scratch, (uint8_t *)(scratch + {planes}), (int32_t *)(scratch + {planes + a_bytes}),
                (const int8_t *)W, table, 0}};
    for (int64_t img = 0; img < {n}; img++) {{
        j.x = {image_at("X", c * h * w, byte_in, const=True)};
        j.y = {image_at("Y", m * p, byte_out is not None)};
{phases}{call_sums}        nn_parallel({blocks * slivers}, {p * m * k}, qm_tiles, &j);
    }}
}}
"""
