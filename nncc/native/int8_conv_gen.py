"""nncc::QConv (a quantized convolution on float images, nncc/kernels/qimage.py) as one
native int8 step, C code generated per layer; and nncc::QuantizeDequantize, elementwise.

The input image's integers are recovered once per element into a padded NHWC byte image
(the padding is the zero point, which is 0 after removing it), as the portable kernel
recovers them: x times float32(1 / x_scale) rounded half to even, plus x_zero, saturated.
Each output pixel's row of A is then gathered from it, C bytes per kernel tap (K ordered
tap-major, channel-minor; with one panel of output channels by the task that multiplies the
rows, just before, else in a pass of its own that every panel's tasks then read), and multiplied by the weights packed at compile time in int8_gemm_gen's panel layout (the same
micro-kernel: ``vpdpbusd`` on AVX-512 VNNI, ``vpmaddwd`` on AVX2, plain C elsewhere). The zero points come out
in the epilogue through the rows' and columns' sums:

    sum_k (a - za)(w - zw) = sum_k a*w - zw * rowsum(a) - za * colsum(w) + K * za * zw

``vpdpbusd`` multiplies unsigned by signed bytes: int8 activations are shifted by +128 and
uint8 weights by -128, each zero point with them, which leaves every difference as it was.
The epilogue adds the int32 bias and requantizes as the portable kernel does, in float32:
rint(float32(acc) * float32(x_scale * w_scale / y_scale)) + y_zero, saturated, then stores
the output's image float32(q - y_zero) * y_scale; so the results are the portable kernel's,
bit for bit. A depthwise convolution (one input channel per group) is int8_depthwise_gen's.
"""

from __future__ import annotations

import math

import numpy as np

from nncc.ir.graph import TensorInfo
from nncc.kernels.conv import conv_geometry, conv_params
from nncc.kernels.qimage import multipliers
from nncc.kernels.registry import Ctx
from nncc.native.graph_query import const_value
from nncc.native import int8_conv_amx_gen, int8_conv_cm, int8_depthwise_gen, int8_tables, int8_transpose
from nncc.native.c_struct import Field, Struct
from nncc.native.int8_tables import quantized_range
from nncc.native.int8_depthwise_nhwc import pixel_side as depthwise_pixel_side
from nncc.native.int8_bytes import byte_output, byte_store, image_at, shift as byte_shift
from nncc.native.int8_gemm_gen import MR, NR, as_floats, dots_source, pack_b, pairs_layout, panel_bytes, remainder_capacity
from nncc.native.kernel import scratch_arg

QCONV = ("nncc", "QConv")
QUANTIZE_DEQUANTIZE = ("nncc", "QuantizeDequantize")
MAX_K = 16384  # every partial sum of the products stays below 2**31 (int8_gemm_gen)
_QUANTIZED = (np.dtype(np.uint8), np.dtype(np.int8))


def constant(graph, infos, name):
    return None if not name else const_value(graph, infos, name)


def scalar_params(graph, infos, scale: str, zero: str) -> bool:
    s, z = constant(graph, infos, scale), constant(graph, infos, zero)
    return (s is not None and z is not None and np.asarray(s).dtype == np.float32 and np.size(s) == 1
            and np.asarray(z).dtype in _QUANTIZED and np.size(z) == 1)


def static_f32(info: TensorInfo | None, rank: int | None = None) -> bool:
    return (info is not None and info.dtype == np.float32 and info.is_static
            and (rank is None or len(info.shape) == rank))


def _geometry(node, x_shape, w_shape):
    """(out sizes, strides, dilations, pads begin) or a reason string."""
    ctx = Ctx(node.attrs, 1, 1, node.name)
    try:
        nd, kernel, strides, dilations, pb, pe, auto_pad, group = conv_params(ctx, x_shape, w_shape, ValueError)
        if list(kernel) != list(w_shape[2:]):
            return "kernel_shape that does not match the weights"
        out, pb, pe = conv_geometry(x_shape[2:], kernel, strides, dilations, pb, pe, auto_pad, err=ValueError)
    except Exception:  # the portable kernel reports what is wrong
        return "a geometry the portable kernel must judge"
    if any(p < 0 for p in list(pb) + list(pe)) or any(o <= 0 for o in out):
        return "negative pads or an empty output"
    return out, strides, dilations, pb, group


def check(node, graph, infos) -> str | None:
    if (node.domain, node.op_type) == QUANTIZE_DEQUANTIZE:
        if len(node.inputs) != 3 or not static_f32(infos.get(node.inputs[0])) \
                or not static_f32(infos.get(node.outputs[0])):
            return "a dynamically shaped or non-float32 image"
        if not scalar_params(graph, infos, node.inputs[1], node.inputs[2]):
            return "scale and zero point that are not constant scalars"
        return None
    inputs = list(node.inputs) + [""] * (9 - len(node.inputs))
    x, xs, xz, w, ws, wz, ys, yz, b = inputs[:9]
    ix, iy = infos.get(x), infos.get(node.outputs[0])
    if not static_f32(ix, 4) or not static_f32(iy, 4):
        return "a 2-D convolution of static float32 images only"
    if not (scalar_params(graph, infos, xs, xz) and scalar_params(graph, infos, ys, yz)):
        return "activation scales and zero points that are not constant scalars"
    wv = constant(graph, infos, w)
    if wv is None or np.asarray(wv).dtype not in _QUANTIZED or np.ndim(wv) != 4:
        return "weights that are not a constant int8 or uint8 tensor"
    m = wv.shape[0]
    wsv, wzv, bv = constant(graph, infos, ws), constant(graph, infos, wz), constant(graph, infos, b)
    if wsv is None or np.asarray(wsv).dtype != np.float32 or np.size(wsv) not in (1, m):
        return "w_scale that is not a constant per tensor or per output channel"
    if wz and (wzv is None or np.asarray(wzv).dtype != wv.dtype or np.size(wzv) not in (1, m)):
        return "w_zero_point that is not a constant of the weights' type"
    if b and (bv is None or np.asarray(bv).dtype != np.int32 or np.size(bv) != m):
        return "a bias that is not a constant int32 per output channel"
    if node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return "auto_pad"
    geometry = _geometry(node, ix.shape, wv.shape)
    if isinstance(geometry, str):
        return geometry
    out, _, _, _, group = geometry
    c = ix.shape[1]
    if tuple(iy.shape) != (ix.shape[0], m) + tuple(out):
        return "shapes that do not match"
    depthwise = group == c == m and wv.shape[1] == 1
    if group != 1 and not depthwise:
        return "grouped convolution other than depthwise"
    if wv.shape[1] != c // group:
        return "weights that do not match the input's channels"
    if math.prod(wv.shape[1:]) > MAX_K:
        return "K above the exact int32 range"
    return None


# ------------------------------------------------------------------------------ C text

_QUANTIZE_BYTE = """
static inline int32_t q_int(float v, float inv, float zero, float lo, float hi) {
    float q = rintf(v * inv) + zero;  /* half to even, the default rounding mode */
    q = q < lo ? lo : q; q = q > hi ? hi : q;
    q = q != q ? lo : q;  /* NaN: the lowest value, as the portable kernel */
    return (int32_t)q;
}
static inline uint8_t q_byte(float v, float inv, float zero, float lo, float hi, float shift) {
    return (uint8_t)(q_int(v, inv, zero, lo, hi) + (int32_t)shift);
}
"""


# QuantizeDequantize's table: the image's scale, zero point and range
QD_TABLE = Struct("nn_qd", tuple(Field(name, "float") for name in ("scale", "zero", "lo", "hi")))


def _qd_source(name: str, size: int, byte_out: int | None = None) -> str:
    """``byte_out``: store q plus this shift as one byte an element (int8_bytes), else the
    float image."""
    chunk = 4096
    store = "Y[i] = (q - zero) * scale;" if byte_out is None else \
        f"((uint8_t *)Y)[i] = {byte_store(byte_out, 'q')};"
    return f"""{_QUANTIZE_BYTE}
{QD_TABLE.declaration}
typedef struct {{ const float *x; {QD_TABLE.pointer}t; float *y; }} qq_job;

/* chunks [lo, hi) of the image, shared over the pool */
static void qq_chunks(void *ctx, int64_t lo, int64_t hi) {{
    const qq_job *j = ctx;
    const float *X = j->x;
    float *Y = j->y;
    const float scale = j->t->scale, zero = j->t->zero, lo_q = j->t->lo, hi_q = j->t->hi;
    int64_t end = hi * {chunk} < {size} ? hi * {chunk} : {size};
    for (int64_t i = lo * {chunk}; i < end; i++) {{
        float q = rintf(X[i] / scale) + zero;
        q = q < lo_q ? lo_q : q; q = q > hi_q ? hi_q : q;
        q = q != q ? lo_q : q;
        {store}
    }}
}}

static void {name}(const float *X, {QD_TABLE.pointer}table, float *Y) {{
    qq_job j = {{X, table, Y}};
    nn_parallel({-(-size // chunk)}, {size * 8}, qq_chunks, &j);
}}
"""


# AVX-512: a tile's six rows of bytes (six pixels) stored transposed, into each of the
# first `width` channels' planes (P bytes apart) as its six pixels in a row: per 16 channels
# the rows are interleaved into each channel's first four bytes (32-bit lanes) and last two
# (16-bit lanes), then each channel takes one 4-byte and one 2-byte store instead of six
_STORE6 = """#ifdef Q_VNNI
static inline void qc_store6(uint8_t tile[6][64], uint8_t *y, int width) {
    for (int c0 = 0; c0 < width; c0 += 16) {
        const __m128i r0 = _mm_loadu_si128((const __m128i *)(tile[0] + c0)), r1 = _mm_loadu_si128((const __m128i *)(tile[1] + c0));
        const __m128i r2 = _mm_loadu_si128((const __m128i *)(tile[2] + c0)), r3 = _mm_loadu_si128((const __m128i *)(tile[3] + c0));
        const __m128i r4 = _mm_loadu_si128((const __m128i *)(tile[4] + c0)), r5 = _mm_loadu_si128((const __m128i *)(tile[5] + c0));
        const __m128i a01l = _mm_unpacklo_epi8(r0, r1), a01h = _mm_unpackhi_epi8(r0, r1);
        const __m128i a23l = _mm_unpacklo_epi8(r2, r3), a23h = _mm_unpackhi_epi8(r2, r3);
        uint32_t quad[16];
        uint16_t pair[16];
        _mm_storeu_si128((__m128i *)(quad + 0), _mm_unpacklo_epi16(a01l, a23l));
        _mm_storeu_si128((__m128i *)(quad + 4), _mm_unpackhi_epi16(a01l, a23l));
        _mm_storeu_si128((__m128i *)(quad + 8), _mm_unpacklo_epi16(a01h, a23h));
        _mm_storeu_si128((__m128i *)(quad + 12), _mm_unpackhi_epi16(a01h, a23h));
        _mm_storeu_si128((__m128i *)(pair + 0), _mm_unpacklo_epi8(r4, r5));
        _mm_storeu_si128((__m128i *)(pair + 8), _mm_unpackhi_epi8(r4, r5));
        const int n = width - c0 < 16 ? width - c0 : 16;
        for (int c = 0; c < n; c++) {
            uint8_t *d = y + (int64_t)(c0 + c) * {P};
            memcpy(d, quad + c, 4);
            memcpy(d + 4, pair + c, 2);
        }
    }
}
#endif
"""


# an unpadded layer's NCHW input (bytes or floats): blocks [lo, hi) of 16 pixels (the last maybe fewer),
# straight into the NHWC byte image
_TRANSPOSE_BLOCKS = """
static void qc_transpose_blocks(void *ctx, int64_t lo, int64_t hi) {{
    const qc_job *j = ctx;
    {recover}
    int64_t end = hi * 16 < {pixels} ? hi * 16 : {pixels};
    {call} + lo * 16, j->xp + lo * 16 * {c}, end - lo * 16{args});
}}
"""


def _wide_epilogue(byte_out: int | None, row_sum_read: str) -> str:
    """The tile's requantization on AVX-512 (where the sums are VNNI's): each row's columns
    16 at a time, the float32 value clamped to the output's integer bounds less its zero
    point before it is rounded (the clamp of the rounded value, as the portable kernel),
    into the tile as bytes (``vpmovdb``) or floats."""
    if byte_out is None:
        put = ("_mm512_storeu_ps(tile[r] + 16 * v, _mm512_mul_ps(_mm512_roundscale_ps(f, "
               "_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), ys));")
    else:
        put = ("_mm_storeu_si128((__m128i *)(tile[r] + 16 * v), "
               "_mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(f), centre)));")
    return f"""        {{
            const __m512 flo = _mm512_set1_ps(qlo - yzero), fhi = _mm512_set1_ps(qhi - yzero), ys = _mm512_set1_ps(yscale);
            const __m512i centre = _mm512_set1_epi32((int32_t)(yzero + {float(byte_out or 0)}f));
            (void)ys; (void)centre;
            for (int r = 0; r < rows; r++) {{
                const __m512i rs = _mm512_set1_epi32((int32_t){row_sum_read});
                for (int v = 0; v < {NR // 16}; v++) {{  /* padded columns have multiplier 0 */
                    const __m512i e = _mm512_add_epi32(_mm512_sub_epi32(_mm512_loadu_si512(acc[r] + 16 * v),
                        _mm512_mullo_epi32(_mm512_loadu_si512(zwq + 16 * v), rs)), _mm512_loadu_si512(fixed + 16 * v));
                    const __m512 f = _mm512_min_ps(fhi, _mm512_max_ps(flo, _mm512_mul_ps(_mm512_cvtepi32_ps(e),
                        _mm512_loadu_ps(mq + 16 * v))));
                    {put}
                }}
            }}
        }}"""


def _conv_source(name, n, c, h, w, m, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl,
                 byte_in: str | None = None, byte_out: int | None = None, out_nhwc: bool = False,
                 zero_points: bool = True, pairs: bool = False, capacity: int = 0, tiles: bool = False) -> str:
    """``byte_in``: the layout of the input's bytes, None for a float image; ``byte_out``:
    store the output as bytes, q plus this shift, NHWC if ``out_nhwc`` (int8_bytes).
    ``zero_points``: some weight zero point is not 0 (after the shift), so each row's sum of
    bytes is needed. ``pairs``: the weights are packed in int8_gemm_gen's pairs layout, with room
    for ``capacity`` remainder entries a panel. ``tiles``: K padded for the AMX tiles, and
    their product beside the vpdpbusd one where the code is built with AMX-INT8
    (int8_conv_amx_gen)."""
    hp = max(h + pt, (oh - 1) * sh + (kh - 1) * dh + 1)
    wp = max(w + pl, (ow - 1) * sw + (kw - 1) * dw + 1)
    k = c * kh * kw
    kp = int8_conv_amx_gen.padded_k(k, tiles)  # a gathered row's bytes, the packed weights' rows a panel
    groups = -(-k // 4)  # the groups vpdpbusd multiplies: never the tiles' zero padding
    panels = -(-m // NR)
    panel_stride = panel_bytes(kp // 4, pairs, capacity)
    p = oh * ow
    slivers = -(-p // MR)
    xp_bytes = -(-hp * wp * c // 64) * 64
    rows_bytes = -(-int8_conv_amx_gen.padded_rows(p, tiles) * kp // 64) * 64
    np_ = panels * NR
    tail = p - (slivers - 1) * MR
    last = m - (panels - 1) * NR
    table = int8_tables.columns(np_)
    padding = (int8_conv_amx_gen.padded_rows(p, tiles) - p) * kp
    # the tiles' last block reads rows past the pixels (their sums never stored): zero, defined
    pad_rows = f"    memset(j.a + {p * kp}, 0, {padding});\n" if padding else ""
    # NHWC bytes without padding are the byte image as they are; over a 1x1 stride-1 kernel
    # with K a whole row of A, each pixel's channels are its row of A too: no copy, no gather
    # (the tiles' last, partial block reads a zero-padded copy of its rows instead)
    direct_xp = byte_in == "nhwc" and hp == h and wp == w
    direct_a = direct_xp and kh == kw == 1 and sh == sw == 1 and kp == k
    block_tail = p % int8_conv_amx_gen.ROWS if tiles and direct_a else 0
    if direct_a:
        pad_rows = (f"    memset(j.a + {block_tail * kp}, 0, {(int8_conv_amx_gen.ROWS - block_tail) * kp});\n"
                    if block_tail else "")
    if byte_in == "nhwc":  # whole image rows of bytes, q plus the shift already
        quantize_pixel = ""
    elif byte_in:  # the bytes are q plus the shift already
        quantize_pixel = f"""            const uint8_t *src = (const uint8_t *)j->x + ih * {w} + iw;
            for (int64_t ch = 0; ch < {c}; ch++) px[ch] = src[ch * {h * w}];"""
    else:
        quantize_pixel = f"""            const float *src = j->x + ih * {w} + iw;
            for (int64_t ch = 0; ch < {c}; ch++)
                px[ch] = q_byte(src[ch * {h * w}], inv, zero, qlo, qhi, shift);"""
    if byte_out is None:
        tile_type, to_tile, y_type = "float", "(v - yzero) * yscale", "float"
    else:
        tile_type, to_tile, y_type = "uint8_t", byte_store(byte_out), "uint8_t"
    if zero_points:
        row_sum = f"""        int32_t sum = 0;
        for (int64_t t = 0; t < {k}; t++) sum += row[t];
        j->rowsum[pix] = sum;"""
        row_sum_read = "(uint32_t)j->rowsum[p0 + r]"
    else:  # every weight zero point is 0: the sums would be multiplied by 0
        row_sum, row_sum_read = "", "0"
    transposed = int8_transpose.wanted(byte_in, c)  # NCHW bytes, turned NHWC 16 x 16 at a time
    # no padding: the byte image is the input's pixels in one run, transposed in blocks of pixels
    unpadded = transposed and pt == pl == 0 and hp == h and wp == w
    if byte_in == "nhwc" or transposed:
        right = wp - pl - w
        if byte_in == "nhwc":
            fill = f"        memcpy(row + {pl * c}, (const uint8_t *)j->x + ih * {w * c}, {w * c});\n"
        elif byte_in:
            fill = f"        qt_nhwc((const uint8_t *)j->x + ih * {w}, row + {pl * c}, {w});\n"
        else:
            fill = f"        qt_nhwc_float(j->x + ih * {w}, row + {pl * c}, {w}, inv, zero, qlo, qhi, shift);\n"
        copy_row = "".join([f"        memset(row, pad, {pl * c});\n" if pl else "",
                            fill,
                            f"        memset(row + {(pl + w) * c}, pad, {right * c});\n" if right else "",
                            "        continue;\n"])
    else:
        copy_row = ""
    transpose_source = ""
    if transposed:
        transpose_source = int8_transpose.source(c, h * w) if byte_in else int8_transpose.float_source(c, h * w)
    if unpadded and byte_in:
        transpose_source += _TRANSPOSE_BLOCKS.format(recover="", call="qt_nhwc((const uint8_t *)j->x", args="",
                                                     pixels=h * w, c=c)
    elif unpadded:
        transpose_source += _TRANSPOSE_BLOCKS.format(
            recover="const float inv = j->t->x_inv, zero = j->t->x_zero, qlo = j->t->x_lo, qhi = j->t->x_hi, "
                    "shift = j->t->x_shift;", call="qt_nhwc_float(j->x", args=", inv, zero, qlo, qhi, shift",
            pixels=h * w, c=c)
    if direct_xp:
        quantize_call = "j.xp = (uint8_t *)j.x;  /* read only */"
    elif unpadded:
        quantize_call = f"nn_parallel({-(-h * w // int8_transpose.BLOCK)}, {h * w * c}, qc_transpose_blocks, &j);"
    else:
        quantize_call = f"nn_parallel({hp}, {hp * wp * c}, qc_quantize, &j);"
    if out_nhwc:  # whole pixels: each row of the tile is one pixel's channels
        store = f"""        for (int r = 0; r < rows; r++) memcpy((uint8_t *)j->y + (p0 + r) * {m} + q * {NR}, tile[r], width);"""
    else:
        store = f"""        for (int col = 0; col < width; col++) {{
            {y_type} *y = ({y_type} *)j->y + (q * {NR} + col) * {p} + p0;
            for (int r = 0; r < rows; r++) y[r] = tile[r][col];
        }}"""
        if byte_out is not None and MR == 6:  # AVX-512: each channel's six bytes as a word and a half-word
            store = f"""#ifdef Q_VNNI
        if (rows == {MR}) qc_store6(tile, (uint8_t *)j->y + q * {NR} * {p} + p0, width);
        else
#endif
{store}"""
    if direct_a and not zero_points:  # nothing to gather, no sums wanted
        gather_here, gather_apart = "", ""
    elif panels == 1:  # each sliver's rows gathered by the task that multiplies them, read from L1 at once
        gather_here, gather_apart = "        qc_gather(ctx, p0, p0 + rows);\n", ""
    else:  # every panel reads each sliver's rows: gathered once, in a pass of their own
        gather_here, gather_apart = "", f"        nn_parallel({p}, {p * kp}, qc_gather, &j);"
    if direct_a:  # the rows are the image's pixels: only their sums
        gather_apart = "\n".join(line for line in (
            "        j.a = (uint8_t *)j.x;  /* read only */",
            f"        memcpy(j.pad, j.a + {(p - block_tail) * kp}, {block_tail * kp});" if block_tail else "",
            gather_apart) if line)
    if direct_a:
        gather = "        /* the pixel's channels in the image, as they are */"
    elif dw == 1:  # a kernel row's taps are contiguous in the NHWC image: one copy per row
        gather = f"""        for (int64_t i = 0; i < {kh}; i++)
            memcpy(row + i * {kw * c}, j->xp + ((y0 + i * {dh}) * {wp} + x0) * {c}, {kw * c});"""
    else:
        gather = f"""        for (int64_t i = 0; i < {kh}; i++)
            for (int64_t jj = 0; jj < {kw}; jj++)
                memcpy(row + (i * {kw} + jj) * {c}, j->xp + ((y0 + i * {dh}) * {wp} + x0 + jj * {dw}) * {c}, {c});"""
    return f"""
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define Q_VNNI 1
#endif
{_QUANTIZE_BYTE}
{table.declaration}
typedef struct {{ const float *x; uint8_t *xp, *a; int32_t *rowsum; const int8_t *b; {table.pointer}t;
                  float *y; uint8_t *pad; }} qc_job;

{transpose_source}
/* rows [lo, hi) of the padded NHWC byte image: the quantized input, the zero point around it */
static void qc_quantize(void *ctx, int64_t lo, int64_t hi) {{
    const qc_job *j = ctx;
    const float inv = j->t->x_inv, zero = j->t->x_zero, qlo = j->t->x_lo, qhi = j->t->x_hi, shift = j->t->x_shift;
    const uint8_t pad = (uint8_t)(int32_t)(zero + shift);
    for (int64_t r = lo; r < hi; r++) {{
        uint8_t *row = j->xp + r * {wp * c};
        int64_t ih = r - {pt};
        if (ih < 0 || ih >= {h}) {{
            memset(row, pad, {wp * c});
            continue;
        }}
{copy_row}        for (int64_t col = 0; col < {wp}; col++) {{
            int64_t iw = col - {pl};
            uint8_t *px = row + col * {c};
            if (iw < 0 || iw >= {w}) {{
                memset(px, pad, {c});
                continue;
            }}
{quantize_pixel}
        }}
    }}
}}

/* output pixels [lo, hi): their rows of A (tap-major, channel-minor) and the rows' sums */
static void qc_gather(void *ctx, int64_t lo, int64_t hi) {{
    const qc_job *j = ctx;
    for (int64_t pix = lo; pix < hi; pix++) {{
        int64_t y0 = (pix / {ow}) * {sh}, x0 = (pix % {ow}) * {sw};
        uint8_t *row = j->a + pix * {kp};
{gather}
{"" if direct_a else f"        for (int64_t t = {k}; t < {kp}; t++) row[t] = 0;"}
{row_sum}
    }}
}}

{dots_source(kp, groups, pairs, capacity)}
{_STORE6.replace("{P}", str(p)) if byte_out is not None and not out_nhwc and MR == 6 else ""}
/* pixels [p0, p0 + rows) (at most {MR}) of panel q from their int32 sums ``acc``: zero points,
 * bias, requantization, the store */
static inline void qc_finish(const qc_job *j, const int32_t (*acc)[{NR}], int64_t p0, int rows, int64_t q, int width) {{
    {table.pointer}t = j->t;
    const float zero = t->x_zero + t->x_shift, yscale = t->y_scale, yzero = t->y_zero, qlo = t->y_lo, qhi = t->y_hi;
    const int32_t za = (int32_t)zero;
    const int32_t *cs = t->w_sum, *zw = t->w_zero, *bias = t->bias;
    const float *mult = t->mult;
    {{
        const int32_t *csq = cs + q * {NR}, *zwq = zw + q * {NR}, *bq = bias + q * {NR};
        const float *mq = mult + q * {NR};
        {tile_type} tile[{MR}][{NR}];
        /* unsigned: int32 wraps as the portable kernel's int32 accumulator does, and the
         * exact value of every sum of products fits; the terms no row changes, once a tile */
        uint32_t fixed[{NR}];
        for (int col = 0; col < {NR}; col++)
            fixed[col] = (uint32_t)bq[col] - (uint32_t)za * (uint32_t)csq[col] + (uint32_t)({k} * za) * (uint32_t)zwq[col];
#ifdef Q_VNNI
{_wide_epilogue(byte_out, row_sum_read)}
#else
        for (int r = 0; r < rows; r++) {{
            uint32_t rs = {row_sum_read};
            for (int col = 0; col < {NR}; col++) {{  /* padded columns have multiplier 0 */
                uint32_t e = (uint32_t)acc[r][col] - (uint32_t)zwq[col] * rs + fixed[col];
                float v = rintf((float)(int32_t)e * mq[col]) + yzero;
                v = v < qlo ? qlo : v; v = v > qhi ? qhi : v;
                tile[r][col] = {to_tile};
            }}
        }}
#endif
{store}
    }}
}}

/* the (pixel sliver x channel panel) tiles [lo, hi): products, then qc_finish */
static void qc_tiles(void *ctx, int64_t lo, int64_t hi) {{
    const qc_job *j = ctx;
    int32_t acc[{MR}][{NR}];
    for (int64_t task = lo; task < hi; task++) {{
        int64_t q = task / {slivers}, s = task % {slivers};
        int64_t p0 = s * {MR};
        int rows = s == {slivers - 1} ? {tail} : {MR};
        int width = q == {panels - 1} ? {last} : {NR};
{gather_here}        q_dots(j->a + p0 * {kp}, j->b + q * {panel_stride}, rows, acc);
        qc_finish(j, (const int32_t (*)[{NR}])acc, p0, rows, q, width);
    }}
}}
{int8_conv_amx_gen.source(p, m, kp, panel_stride, panels == 1 and bool(gather_here), block_tail) if tiles else ""}
static void {name}(const float *X, const int8_t *Bp, {table.pointer}table, float *Y, char *scratch) {{
    qc_job j = {{0, (uint8_t *)scratch, (uint8_t *)(scratch + {xp_bytes}),
                (int32_t *)(scratch + {xp_bytes + rows_bytes}), Bp, table, 0, (uint8_t *)(scratch + {xp_bytes})}};
{pad_rows}    for (int64_t img = 0; img < {n}; img++) {{
        j.x = {image_at("X", c * h * w, byte_in, const=True)};
        j.y = {image_at("Y", m * p, byte_out is not None)};
        {quantize_call}
{gather_apart}
{int8_conv_amx_gen.dispatch(p, m, k, kp) if tiles else ""}        nn_parallel({slivers * panels}, {p * m * k}, qc_tiles, &j);
    }}
}}
"""


# ---------------------------------------------------------------------- packing, emitting


# Many output pixels over a short K take the channel-major form whatever its padding: there
# the pixel-major form's work per pixel (its byte image, each pixel's gathered row and sum)
# outweighs the padding it saves. Measured per layer: MobileNetV2's 28 x 28 expansions (K 32,
# 784 pixels) twice as fast channel-major, ResNet-18's stem (K 147) 1.4 times; ResNet-18's
# 3 x 3 layers (K 576) twice as fast pixel-major. A pointwise layer (1x1, stride 1,
# unpadded) does so from far fewer pixels: channel-major, it packs its operand straight from
# the input, NCHW or NHWC bytes alike, and stores whole NCHW rows where the pixel-major form
# stores transposed. Measured per layer, both forms, 2 threads: MobileNetV2's 14 x 14
# expansions 20-22 us channel-major against 39-43 (K 64, reading the NHWC stream) and 37-40
# against 56-61 (K 96); its 7 x 7 ones (49 pixels) a tie at K 160 (27-32 us either way), 67
# against 46 at K 320. ResNet-18's strided 1x1 layers are no pointwise ones: its 14 x 14 one
# (K 128) ties, and channel-major it would turn the residual stream it reads NCHW.
_SHORT_K, _MANY_PIXELS, _MANY_POINTWISE_PIXELS = 160, 700, 150


def store_as_bytes(wr, out: str) -> str | None:
    """The layout in which the native int8 step writing ``out`` stores it as bytes, recorded
    in ``wr.byte_images`` for its readers, or None to keep the float image (int8_bytes)."""
    layout = byte_output(wr, out, lambda conv: pixel_major(wr.graph, wr.infos, conv),
                         lambda conv: reads_nhwc(wr.graph, wr.infos, conv))
    if layout:
        wr.byte_images[out] = layout
    return layout


def pixel_major(graph, infos, node) -> bool:
    """Whether emit gives the (native) QConv ``node`` the pixel-major form."""
    if int(node.attrs.get("group", 1)) != 1:  # depthwise: pixel-side by its own rule
        return depthwise_pixel_side(graph, infos, node, lambda conv: pixel_major(graph, infos, conv))
    wshape = np.shape(constant(graph, infos, node.inputs[3]))
    out = infos[node.outputs[0]].shape
    pixels = out[2] * out[3]
    many = _MANY_POINTWISE_PIXELS if pointwise(graph, infos, node) else _MANY_PIXELS
    if pixels >= many and math.prod(wshape[1:]) <= _SHORT_K:
        return False
    return not int8_conv_cm.preferred(pixels, wshape[0], MR, NR)


def pointwise(graph, infos, node) -> bool:
    """Whether the QConv ``node`` is 1x1, stride 1, unpadded and ungrouped: each output pixel
    is its input pixel's channels times the weights."""
    wshape = np.shape(constant(graph, infos, node.inputs[3]))
    x, y = infos[node.inputs[0]].shape, infos[node.outputs[0]].shape
    strides, pads = node.attrs.get("strides", [1, 1]), node.attrs.get("pads", [0, 0, 0, 0])
    return (int(node.attrs.get("group", 1)) == 1 and tuple(wshape[2:]) == (1, 1) and list(strides) == [1, 1]
            and not any(pads) and tuple(x[2:]) == tuple(y[2:]))


def reads_nhwc(graph, infos, node) -> bool:
    """Whether the QConv ``node`` can read its input as NHWC bytes: the pixel-major form, and
    the channel-major form of a pointwise layer (int8_conv_cm packs A from whole pixels)."""
    return pixel_major(graph, infos, node) or pointwise(graph, infos, node)


def emit(wr, node) -> None:
    """The step of the native code generator (nncc/native/codegen.py) for the node."""
    graph, infos = wr.graph, wr.infos
    if (node.domain, node.op_type) == QUANTIZE_DEQUANTIZE:
        x, s, z = node.inputs
        wr.as_plain(x)
        zv = np.asarray(constant(graph, infos, z))
        lo, hi = quantized_range(zv.dtype)
        table = QD_TABLE.pack(scale=np.asarray(constant(graph, infos, s), np.float32), zero=float(zv.reshape(())),
                              lo=lo, hi=hi)
        packed = wr.pack(s, f"quantize {z}", table)
        out = node.outputs[0]
        size = math.prod(wr.shape(x))
        # read only by int8 steps that recover with this scale: q itself, one byte each
        layout = store_as_bytes(wr, out)
        wr.step(f"q_image({wr.ptr(x)}, {wr.ptr(packed)}, {wr.ptr(out)});", [x, (packed, QD_TABLE.pointer)], [out],
                support=_qd_source("q_image", size, byte_shift(zv.dtype) if layout else None))
        return
    inputs = list(node.inputs) + [""] * (9 - len(node.inputs))
    x, xs, xz, w, ws, wz, ys, yz, b = inputs[:9]
    wr.as_plain(x)
    value = lambda name: None if not name else np.asarray(constant(graph, infos, name))  # noqa: E731
    wv = value(w)
    m, cg, kh, kw = wv.shape
    n, c, h, wd = wr.shape(x)
    out_sizes, strides, dilations, pads, group = _geometry(node, (n, c, h, wd), wv.shape)
    oh, ow = out_sizes
    zero_w = np.zeros(m, np.int64) if not wz else np.broadcast_to(value(wz).astype(np.int64).reshape(-1), (m,))
    bias = np.zeros(m, np.int64) if not b else value(b).astype(np.int64).reshape(-1)
    mult = multipliers(value(xs), value(ws), value(ys), m)
    scalars = int8_tables.scalars(value(xs), value(xz), value(ys), value(yz))
    out = node.outputs[0]
    geometry = (oh, ow, strides[0], strides[1], dilations[0], dilations[1], pads[0], pads[1])
    byte_in = wr.byte_images.get(x)
    layout = store_as_bytes(wr, out)
    byte_out = byte_shift(value(yz).dtype) if layout else None
    if group != 1:  # depthwise
        int8_depthwise_gen.emit(wr, x, w, out, f"{xs}|{xz}|{ws}|{wz}|{ys}|{yz}|{b}", wv, zero_w, bias, mult,
                                scalars, (n, c, h, wd), geometry, byte_in, byte_out)
        return
    shift = 128 if wv.dtype == np.uint8 else 0  # unsigned weights shift to signed
    signed = (wv.astype(np.int16) - shift).astype(np.int8)
    p = oh * ow
    shape = (c, h, wd, m, kh, kw) + geometry
    pairs = pairs_layout(wr.vl)  # the AVX2 kernels' layouts (int8_gemm_gen, int8_conv_cm)
    if not pixel_major(graph, infos, node):
        matrix = signed.reshape(m, -1)  # K ordered channel, kernel row, kernel column
        wp_ = wr.pack(w, "int8 bounded pair conv rows" if pairs else "int8 conv rows",
                      as_floats(int8_conv_cm.pack_weights(matrix, pairs)))
        table = int8_conv_cm.table(m)
        packed = wr.pack(w, f"int8 conv rows table {xs}|{xz}|{ws}|{wz}|{ys}|{yz}|{b}",
                         table.pack(**scalars, w_sum=matrix.astype(np.int32).sum(axis=1), w_zero=zero_w - shift,
                                    bias=bias, mult=mult))
        layer = int8_conv_cm.Layer(n, *shape, zero_points=bool(np.any(zero_w - shift)), byte_in=bool(byte_in),
                                   byte_out=byte_out, pairs=pairs,
                                   capacity=int8_conv_cm.remainder_capacity(matrix) if pairs else 0,
                                   nhwc_in=byte_in == "nhwc")
        scratch = layer.scratch_bytes
        code = f"q_conv_cm({wr.ptr(x)}, {wr.ptr(wp_)}, {wr.ptr(packed)}, {wr.ptr(out)}, {scratch_arg(scratch)});"
        source = int8_conv_cm.source("q_conv_cm", _QUANTIZE_BYTE, layer)
        wr.step(code, [x, (wp_, "const int8_t *"), (packed, table.pointer)], [out], scratch, support=source)
        return
    # K ordered tap-major, channel-minor: [M, KH, KW, C] -> [K, M]
    matrix = signed.transpose(0, 2, 3, 1).reshape(m, -1).T
    table = int8_tables.columns(-(-m // NR) * NR)
    tiles = int8_conv_amx_gen.wanted(wr.vl, p)  # K padded with zero rows for the AMX tiles
    padded = np.pad(matrix, ((0, int8_conv_amx_gen.padded_k(matrix.shape[0], tiles) - matrix.shape[0]), (0, 0)))
    bp = wr.pack(w, "int8 bounded pair conv panels" if pairs else "int8 tile conv panels" if tiles else "int8 conv panels",
                 as_floats(pack_b(np.ascontiguousarray(padded), pairs)))
    packed = wr.pack(w, f"int8 conv table {xs}|{xz}|{ws}|{wz}|{ys}|{yz}|{b}",
                     table.pack(**scalars, w_sum=matrix.astype(np.int32).sum(axis=0), w_zero=zero_w - shift,
                                bias=bias, mult=mult))
    hp = max(h + pads[0], (oh - 1) * strides[0] + (kh - 1) * dilations[0] + 1)
    wp = max(wd + pads[1], (ow - 1) * strides[1] + (kw - 1) * dilations[1] + 1)
    k = c * kh * kw
    kp = int8_conv_amx_gen.padded_k(k, tiles)
    rows = int8_conv_amx_gen.padded_rows(p, tiles)
    scratch = -(-hp * wp * c // 64) * 64 + -(-rows * kp // 64) * 64 + p * 4
    code = f"q_conv({wr.ptr(x)}, {wr.ptr(bp)}, {wr.ptr(packed)}, {wr.ptr(out)}, {scratch_arg(scratch)});"
    wr.step(code, [x, (bp, "const int8_t *"), (packed, table.pointer)], [out], scratch,
            support=_conv_source("q_conv", n, c, h, wd, m, kh, kw, *geometry, byte_in, byte_out, layout == "nhwc",
                                 zero_points=bool(np.any(zero_w - shift)), pairs=pairs,
                                 capacity=remainder_capacity(matrix) if pairs else 0, tiles=tiles))
