"""nncc::QConv's depthwise form (one input channel per group) as one native int8 step, C
code generated per layer (int8_conv_gen writes the other forms and calls emit here).

Each channel's image is recovered into its stride phase planes as q - x_zero in float32, and
the taps are summed in float32 on those integers, which is exact (see source), vectorised
over output pixels; the sums are requantized as the portable kernel does.
"""

from __future__ import annotations

import numpy as np

from nncc.native import int8_tables
from nncc.native.int8_bytes import image_at
from nncc.native.kernel import scratch_arg


def depthwise_plane(h, w, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl) -> tuple[int, int]:
    """(rows, columns) of each of a depthwise step's sh * sw phase planes: the padded image's
    pixel (r, col) lives in plane (r mod sh, col mod sw) at (r // sh, col // sw), so every
    tap reads its output rows' pixels as one contiguous run."""
    hp = max(h + pt, (oh - 1) * sh + (kh - 1) * dh + 1)
    wp = max(w + pl, (ow - 1) * sw + (kw - 1) * dw + 1)
    return -(-hp // sh), -(-wp // sw)


def depthwise_scratch(c, *plane_args) -> int:
    """Bytes of scratch: every channel's phase planes, float32."""
    hps, wps = depthwise_plane(*plane_args)
    sh, sw = plane_args[6], plane_args[7]
    return c * sh * sw * hps * wps * 4


_EXACT_TAPS = 258  # 258 * 255 * 255 < 2**24: a float32 sum of that many products is exact
_UNROLL = 4  # vectors summed side by side: independent FMA chains hide their latency
_BLOCK = 512  # output positions (row length wps) summed per block of output rows
_LONG_ROW = 32  # image rows at least this long are quantized one by one


def _phase_columns(w, pl, sw, wps, ph) -> tuple[int, int]:
    """[lo, hi) of the columns of phase ph that hold image pixels (the rest are border)."""
    lo = min(wps, max(0, -(-(pl - ph) // sw)))
    hi = max(lo, min(wps, -(-(pl + w - ph) // sw)))
    return lo, hi


def _centred(element: str, byte_in: bool) -> str:
    """C for q - x_zero of an input element: recovered from the float image, or read from
    its byte (q plus the shift: ``centre`` is x_zero plus the shift)."""
    return f"((float){element} - centre)" if byte_in else f"q_centred({element}, inv, qlo, qhi)"


def _depthwise_fill(w, pl, sw, hps, wps, quantized: bool, byte_in: bool = False) -> str:
    """C statements that write one padded row's sw phase segments (at dst) from an image
    row: per phase, the left border, the pixels, the right border, all literal. The pixels
    come already quantized from `line`, or are quantized here from `src` (a strided read when
    sw > 1, which the compiler vectorises with shuffles)."""
    out = []
    for ph in range(sw):
        lo, hi = _phase_columns(w, pl, sw, wps, ph)
        base = ph * hps * wps
        if lo:
            out.append(f"memset(dst + {base}, 0, {lo * 4});")
        if hi > lo and quantized and sw == 1:
            out.append(f"memcpy(dst + {base + lo}, line + {lo - pl}, {(hi - lo) * 4});")
        elif quantized and sw == 2:
            if ph == 0:  # both phases' pixels at once
                out.append(_split_pairs(w, pl, hps, wps))
        elif hi > lo:
            pixel = f"line[col * {sw} + {ph - pl}]" if quantized else \
                _centred(f"src[col * {sw} + {ph - pl}]", byte_in)
            out.append(f"for (int64_t col = {lo}; col < {hi}; col++) dst[{base} + col] = {pixel};")
        if wps > hi:
            out.append(f"memset(dst + {base + hi}, 0, {(wps - hi) * 4});")
    return "\n                ".join(out)


def _split_pairs(w, pl, hps, wps) -> str:
    """C that splits a quantized row (line) into the even and odd image columns of stride 2's
    two phases: two vectors of the row in, shuffled, one vector out to each phase."""
    even = f"dst + {(pl % 2) * hps * wps + pl // 2}"
    odd = f"dst + {((pl + 1) % 2) * hps * wps + (pl + 1) // 2}"
    return f"""{{
                    float *even = {even}, *odd = {odd};
                    int64_t k = 0;
                    for (; 2 * (k + NN_VL) <= {w}; k += NN_VL) {{
                        nn_v a = nn_vload(line + 2 * k), b = nn_vload(line + 2 * k + NN_VL);
                        nn_vstore(even + k, __builtin_shuffle(a, b, QD_EVEN));
                        nn_vstore(odd + k, __builtin_shuffle(a, b, QD_ODD));
                    }}
                    for (int64_t e = k; e < {(w + 1) // 2}; e++) even[e] = line[2 * e];
                    for (int64_t o = k; o < {w // 2}; o++) odd[o] = line[2 * o + 1];
                }}"""


def _lane_masks() -> str:
    """QD_EVEN and QD_ODD: __builtin_shuffle masks that pick the even and the odd lanes of two
    vectors, for each vector width of simd.h."""
    lines = []
    for i, vl in enumerate((16, 8, 4)):
        lines.append(("#if" if i == 0 else "#elif") + f" NN_VL == {vl}")
        for name, first in (("QD_EVEN", 0), ("QD_ODD", 1)):
            lanes = ", ".join(str(first + 2 * i) for i in range(vl))
            lines.append(f"#define {name} ((nn_vi){{{lanes}}})")
    return "\n".join(lines + ["#endif"])


def _depthwise_quantize(h, w, pt, pl, sh, sw, hps, wps, byte_in: bool = False) -> str:
    """C that quantizes the channel's image rows into their phase planes: long rows of stride
    1 straight from the image; other rows a run at a time first (so the quantizing loop stays
    long and reads contiguously, which measured faster than a strided read), then copied into
    place."""
    place = f"xp + r % {sh} * {sw * hps * wps} + r / {sh} * {wps}"
    src_type = "uint8_t" if byte_in else "float"
    if w >= _LONG_ROW and sw == 1:
        return f"""        for (int64_t ih = 0; ih < {h}; ih++) {{
            const int64_t r = ih + {pt};
            const {src_type} *src = (const {src_type} *)j->x + ch * {h * w} + ih * {w};
            float *dst = {place};
            {{
                {_depthwise_fill(w, pl, sw, hps, wps, False, byte_in)}
            }}
        }}
"""
    in_rows = 1 if w >= _LONG_ROW else max(1, min(h, _BLOCK // w))
    return f"""        for (int64_t ih0 = 0; ih0 < {h}; ih0 += {in_rows}) {{
            const int64_t n_in = {h} - ih0 < {in_rows} ? {h} - ih0 : {in_rows};
            const {src_type} *src = (const {src_type} *)j->x + ch * {h * w} + ih0 * {w};
            float q[{in_rows * w}];
            for (int64_t i = 0; i < n_in * {w}; i++) q[i] = {_centred("src[i]", byte_in)};
            for (int64_t i = 0; i < n_in; i++) {{
                const int64_t r = ih0 + i + {pt};
                const float *line = q + i * {w};
                float *dst = {place};
                {_depthwise_fill(w, pl, sw, hps, wps, True)}
            }}
        }}
"""


def _depthwise_requantize(rows, wps, ow, byte_out: int | None = None) -> str:
    """C that requantizes a block's sums (acc) into its output rows: long rows one by one,
    short ones over the whole run (one long loop) and then copied row by row. ``byte_out``:
    the rows are bytes, q plus this shift (int8_bytes)."""
    value = "v * yscale" if byte_out is None else "(uint8_t)(int32_t)(v + ybyte)"
    out_type = "float" if byte_out is None else "uint8_t"
    step = """float v = rintf((float)acc[{at}] * mult[ch]);  /* saturated less the zero point, as q_centred */
                v = v < ylo ? ylo : v; v = v > yhi ? yhi : v;
                {to} = """ + value + ";"
    if ow >= _LONG_ROW:
        return f"""            for (int64_t r = 0; r < n_rows; r++)
                for (int64_t ox = 0; ox < {ow}; ox++) {{
                {step.format(at=f"r * {wps} + ox", to=f"y[(oy + r) * {ow} + ox]")}
                }}"""
    return f"""            {out_type} out[{(rows - 1) * wps + ow}];
            for (p = 0; p < span; p++) {{
                {step.format(at="p", to="out[p]")}
            }}
            for (int64_t r = 0; r < n_rows; r++) memcpy(y + (oy + r) * {ow}, out + r * {wps}, {ow} * sizeof *out);"""


def source(name, n, c, h, w, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl,
                      byte_in: bool = False, byte_out: int | None = None) -> str:
    """Float32 on integer values, which is exact: the planes hold q - x_zero (border 0), the
    weights are w - w_zero, each product is at most 255 * 255 in magnitude, and the taps are
    summed in float32 in chunks of at most _EXACT_TAPS, each chunk's sum an exact integer
    that joins the int32 accumulator (with the bias, which may exceed float32's integers).

    In the phase planes output pixel (oy, ox) reads, for each tap, position oy * wps + ox
    plus that tap's offset: a block of output rows is one run of positions (the wps - ow
    positions between rows are computed and dropped), summed in whole vectors, the last one
    overlapping its predecessor rather than reading past the block."""
    hps, wps = depthwise_plane(h, w, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl)
    size = hps * wps  # one phase plane
    taps = kh * kw
    table = int8_tables.depthwise(c, taps)
    rows = max(1, min(oh, _BLOCK // wps))  # output rows per block
    fill_rows = _depthwise_quantize(h, w, pt, pl, sh, sw, hps, wps, byte_in)
    chunks = [(t0, min(taps, t0 + _EXACT_TAPS)) for t0 in range(0, taps, _EXACT_TAPS)]
    offset = (f"((t / {kw}) * {dh} % {sh} * {sw} + (t % {kw}) * {dw} % {sw}) * {size}"
              f" + (t / {kw}) * {dh} / {sh} * {wps} + (t % {kw}) * {dw} / {sw}")

    def sums(zero, fma, to_int, indent="                "):
        return "\n".join(f"""{indent}{{
{indent}    {zero}
{indent}    for (int64_t t = {t0}; t < {t1}; t++) {{ {fma} }}
{indent}    {to_int}
{indent}}}""" for t0, t1 in chunks)

    def vector_sums(lanes):  # `lanes` vectors from `at`, each its own chain of dependent FMAs
        names = range(lanes)
        return sums(" ".join(f"nn_v f{u} = nn_vzero();" for u in names),
                    " ".join(f"f{u} = nn_vfma(nn_vload(at + {offset} + {u} * NN_VL), w, f{u});" for u in names)
                    .join(("const nn_v w = nn_vset1(wk[t]); ", "")),
                    " ".join(f"s{u} += __builtin_convertvector(f{u}, nn_vi);" for u in names), "                    ")

    scalar_sums = sums("float f = 0.0f;", f"f += at[{offset}] * wk[t];", "acc[p] += (int32_t)f;")
    border = [(0, pt), (pt + h, hps * sh)]
    zero_rows = "\n        ".join(
        f"for (int64_t r = {r0}; r < {r1}; r++)\n"
        f"            for (int64_t ph = 0; ph < {sw}; ph++) "
        f"memset(xp + (r % {sh} * {sw} + ph) * {size} + r / {sh} * {wps}, 0, {wps * 4});"
        for r0, r1 in border if r1 > r0)
    return f"""{_lane_masks()}
/* q - zero as a float, exact: q_int's rounding and saturation with the zero point taken
 * off the bounds instead (lo and hi here are lo - zero and hi - zero: small integers, so
 * both ways agree wherever float32 holds every integer, and saturate alike beyond) */
static inline float q_centred(float v, float inv, float lo, float hi) {{
    float q = rintf(v * inv);
    q = q < lo ? lo : q; q = q > hi ? hi : q;
    return q != q ? lo : q;  /* NaN: the lowest value, as the portable kernel */
}}

{table.declaration}
typedef struct {{ const float *x; {table.pointer}t; float *xp; float *y; }} qd_job;

/* channels [lo, hi): the centred phase planes, then each block of output rows */
static void qd_channels(void *ctx, int64_t lo, int64_t hi) {{
    const qd_job *j = ctx;
    {table.pointer}t = j->t;
    const float inv = t->x_inv, qlo = t->x_lo - t->x_zero, qhi = t->x_hi - t->x_zero;  /* x's range less its zero */
    const float centre = t->x_zero + t->x_shift;  /* what a stored byte holds beyond q - x_zero */
    const float yscale = t->y_scale, ylo = t->y_lo - t->y_zero, yhi = t->y_hi - t->y_zero;  /* y's range less its zero */
    const float ybyte = t->y_zero + {float(byte_out or 0)}f;  /* a stored output byte: q plus its shift */
    (void)inv; (void)centre; (void)yscale; (void)ybyte;
    const float *wc = t->weights;  /* [C][taps] weights minus their zero point */
    const int32_t *bias = t->bias;
    const float *mult = t->mult;
    float *xp = j->xp + lo * {sh * sw * size};  /* the task's first channel's planes serve them all: they stay in cache */
    for (int64_t ch = lo; ch < hi; ch++) {{
        /* the border rows, then each image row quantized once, straight into its place
         * (border and image are written by separate loops, never chosen by a select in a
         * vectorised loop: GCC 12 vectorised one wrongly for AVX-512) */
        {zero_rows}
{fill_rows}        const float *wk = wc + ch * {taps};
        {"float" if byte_out is None else "uint8_t"} *y = ({"float" if byte_out is None else "uint8_t"} *)j->y + ch * {oh * ow};
        for (int64_t oy = 0; oy < {oh}; oy += {rows}) {{
            const int64_t n_rows = {oh} - oy < {rows} ? {oh} - oy : {rows};
            const int64_t span = (n_rows - 1) * {wps} + {ow};  /* positions up to the block's last pixel */
            const float *block = xp + oy * {wps};
            int32_t acc[{(rows - 1) * wps + ow}];
            int64_t p = 0;
            if (span >= NN_VL) {{
                for (; p + {_UNROLL} * NN_VL <= span; p += {_UNROLL} * NN_VL) {{
                    const float *at = block + p;
                    {" ".join(f"nn_vi s{u} = (nn_vi){{0}} + bias[ch];" for u in range(_UNROLL))}
{vector_sums(_UNROLL)}
                    {" ".join(f"memcpy(acc + p + {u} * NN_VL, &s{u}, sizeof s{u});" for u in range(_UNROLL))}
                }}
                for (; p < span; p += NN_VL) {{
                    if (p + NN_VL > span) p = span - NN_VL;  /* the last vector overlaps */
                    const float *at = block + p;
                    nn_vi s0 = (nn_vi){{0}} + bias[ch];
{vector_sums(1)}
                    memcpy(acc + p, &s0, sizeof s0);
                }}
            }}
            else
                for (; p < span; p++) {{
                    const float *at = block + p;
                    acc[p] = bias[ch];
{scalar_sums}
                }}
{_depthwise_requantize(rows, wps, ow, byte_out)}
        }}
    }}
}}

static void {name}(const float *X, {table.pointer}table, float *Y, char *scratch) {{
    qd_job j = {{0, table, (float *)scratch, 0}};
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
    table = int8_tables.depthwise(c, taps)
    packed = wr.pack(w, f"depthwise {key}", table.pack(**scalars, weights=centred, bias=bias, mult=mult))
    scratch = depthwise_scratch(c, h, wd, kh, kw, *geometry)
    code = f"q_depthwise({wr.ptr(x)}, {wr.ptr(packed)}, {wr.ptr(out)}, {scratch_arg(scratch)});"
    wr.step(code, [x, (packed, table.pointer)], [out], scratch,
            support=wr.simd + source("q_depthwise", n, c, h, wd, kh, kw, *geometry, byte_in, byte_out))
