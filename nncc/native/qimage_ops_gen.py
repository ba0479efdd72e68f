"""The small quantized ops between convolutions, on float images (nncc/kernels/qimage.py),
as native steps: nncc::QAdd (no broadcasting), QGlobalAveragePool and QGemm (a matrix by a
constant quantized matrix). Each recovers its integers from the images as the portable
kernel does (x times float32(1 / scale), rounded half to even, plus the zero point,
saturated) and repeats the portable kernel's arithmetic in the same types and order, products
rounded apart from the sums they feed (the code is built with contraction on: an explicit barrier stops it), so the
results are the portable kernel's, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

from nncc.kernels.qimage import reciprocal
from nncc.native import int8_bytes
from nncc.native.c_struct import Field, Struct
from nncc.native.int8_conv_gen import scalar_params, static_f32, store_as_bytes, constant
from nncc.native.int8_tables import quantized_range

OPS = {("nncc", "QAdd"), ("nncc", "QGlobalAveragePool"), ("nncc", "QGemm")}
_CHUNK = 256
_COLUMNS = 256  # of B per task
_PANEL = 64  # columns of B per panel of the grouped form: four vectors of sums at once

_RECOVER = """
static inline float qi_centred(float v, float inv, float zero, float lo, float hi) {
    float q = rintf(v * inv) + zero;
    q = q < lo ? lo : q; q = q > hi ? hi : q;
    q = q != q ? lo : q;
    return q - zero;
}
"""


def check(node, graph, infos) -> str | None:
    ins = list(node.inputs) + [""] * (9 - len(node.inputs))
    out = infos.get(node.outputs[0]) if node.outputs else None
    if not static_f32(out):
        return "an output that is not a static float32 tensor"
    if node.op_type == "QAdd":
        a, b = infos.get(ins[0]), infos.get(ins[3])
        if not (static_f32(a) and static_f32(b)) or a.shape != b.shape or tuple(out.shape) != tuple(a.shape):
            return "QAdd with broadcasting"
        if not all(scalar_params(graph, infos, s, z) for s, z in ((ins[1], ins[2]), (ins[4], ins[5]), (ins[6], ins[7]))):
            return "scales and zero points that are not constant scalars"
        return None
    if node.op_type == "QGlobalAveragePool":
        x = infos.get(ins[0])
        if not static_f32(x) or len(x.shape) < 3 or math.prod(x.shape[2:]) == 0:
            return "a pooled image that is not static float32 of rank >= 3"
        if not all(scalar_params(graph, infos, s, z) for s, z in ((ins[1], ins[2]), (ins[3], ins[4]))):
            return "scales and zero points that are not constant scalars"
        return None
    a = infos.get(ins[0])
    if not static_f32(a) or len(a.shape) != 2 or int(node.attrs.get("transA", 0)):
        return "A that is not a static float32 matrix"
    if not scalar_params(graph, infos, ins[1], ins[2]):
        return "a_scale and a_zero_point that are not constant scalars"
    bv = constant(graph, infos, ins[3])
    if bv is None or np.asarray(bv).dtype not in (np.uint8, np.int8) or np.ndim(bv) != 2:
        return "B that is not a constant quantized matrix"
    n = bv.shape[0] if int(node.attrs.get("transB", 0)) else bv.shape[1]
    k = bv.shape[1] if int(node.attrs.get("transB", 0)) else bv.shape[0]
    if a.shape[1] != k or tuple(out.shape) != (a.shape[0], n):
        return "shapes that do not match"
    bs, bz, c = (constant(graph, infos, name) for name in ins[4:7])
    if bs is None or np.asarray(bs).dtype != np.float32 or np.size(bs) not in (1, n):
        return "b_scale that is not a constant per tensor or per column"
    if ins[5] and (bz is None or np.asarray(bz).dtype != np.asarray(bv).dtype or np.size(bz) not in (1, n)):
        return "b_zero_point that is not a constant of B's type"
    if ins[6] and (c is None or np.asarray(c).dtype != np.int32 or np.size(c) not in (1, n) or np.ndim(c) > 1):
        return "C that is not a constant int32 bias per column"
    if ins[7] and not scalar_params(graph, infos, ins[7], ins[8]):
        return "y_scale and y_zero_point that are not constant scalars"
    if k > 16384:
        return "K above the exact int32 range"
    if n > 65536:
        return "more columns than the step keeps on its stack"
    return None


def _params(graph, infos, scale, zero) -> list[float]:
    s, z = np.asarray(constant(graph, infos, scale), np.float32), np.asarray(constant(graph, infos, zero))
    lo, hi = quantized_range(z.dtype)
    return [float(s.reshape(())), float(z.reshape(())), lo, hi]


def emit(wr, node) -> None:
    graph, infos = wr.graph, wr.infos
    ins = list(node.inputs) + [""] * (9 - len(node.inputs))
    out = node.outputs[0]
    f32 = np.float32
    if node.op_type == "QAdd":
        a, b = ins[0], ins[3]
        wr.as_plain(a)
        wr.as_plain(b)
        pa, pb, pc = (_params(graph, infos, s, z) for s, z in ((ins[1], ins[2]), (ins[4], ins[5]), (ins[6], ins[7])))
        ra, rb = f32(pa[0]) / f32(pc[0]), f32(pb[0]) / f32(pc[0])  # as the portable kernel forms them
        pa[0], pb[0] = reciprocal(pa[0]), reciprocal(pb[0])  # the inputs' integers are recovered by these
        values = dict(zip(_fields("a", True) + _fields("b", True) + _fields("c", False), pa + pb + pc), ra=ra, rb=rb)
        packed = wr.pack(ins[1], f"qadd {'|'.join(ins[1:8])}", _ADD.pack(**values))
        size = math.prod(wr.shape(a))
        # a value stored as bytes is read as q plus its shift; the output is stored so when
        # its readers take bytes (int8_bytes), in the layout its inputs' bytes share
        store_as_bytes(wr, out)
        shifts = [_byte_shift(wr, value, zero) for value, zero in ((a, ins[2]), (b, ins[5]), (out, ins[7]))]
        wr.step(f"q_add({wr.ptr(a)}, {wr.ptr(b)}, {wr.ptr(packed)}, {wr.ptr(out)});",
                [a, b, (packed, _ADD.pointer)], [out], support=_add_source(size, *shifts))
        return
    if node.op_type == "QGlobalAveragePool":
        x = ins[0]
        wr.as_plain(x)
        shape = wr.shape(x)
        size = math.prod(shape[2:])
        px, py = _params(graph, infos, ins[1], ins[2]), _params(graph, infos, ins[3], ins[4])
        scale = f32(px[0]) / (f32(py[0]) * f32(size))
        px[0] = reciprocal(px[0])
        values = dict(zip(_fields("x", True) + _fields("y", False), px + py), scale=scale)
        packed = wr.pack(ins[1], f"qpool {'|'.join(ins[1:5])}", _POOL.pack(**values))
        wr.step(f"q_pool({wr.ptr(x)}, {wr.ptr(packed)}, {wr.ptr(out)});", [x, (packed, _POOL.pointer)], [out],
                support=_pool_source(math.prod(shape[:2]), size, _byte_shift(wr, x, ins[2])))
        return
    _emit_gemm(wr, node, ins, out)


def _byte_shift(wr, value: str, zero: str) -> int | None:
    """What a byte of ``value`` adds to q when it is stored as bytes (int8_bytes), else None."""
    if value not in wr.byte_images:
        return None
    return int8_bytes.shift(np.asarray(constant(wr.graph, wr.infos, zero)).dtype)


def _centred(var: str, index: str, prefix: str, shift: int | None) -> str:
    """C for q - zero of element ``index`` of an input: recovered from its float image, or
    its byte less the shift and the zero point (exact: small integers in float)."""
    if shift is None:
        return f"qi_centred({var}[{index}], t->{prefix}_inv, t->{prefix}_zero, t->{prefix}_lo, t->{prefix}_hi)"
    return f"(((float)((const uint8_t *){var})[{index}] - {float(shift)}f) - t->{prefix}_zero)"


def _emit_gemm(wr, node, ins, out) -> None:
    graph, infos = wr.graph, wr.infos
    value = lambda name: None if not name else np.asarray(constant(graph, infos, name))  # noqa: E731
    a = ins[0]
    b = value(ins[3])
    b = b.T if int(node.attrs.get("transB", 0)) else b
    k, n = b.shape
    m = wr.shape(a)[0]
    zero = np.zeros(n, np.int64) if not ins[5] else np.broadcast_to(value(ins[5]).astype(np.int64).reshape(-1), (n,))
    shift = 128 if b.dtype == np.uint8 else 0  # unsigned B shifts to signed, its zero point with it
    signed = (b.astype(np.int16) - shift).astype(np.int8)  # [K, N]
    bias = np.zeros(n, np.int32) if not ins[6] else np.broadcast_to(value(ins[6]).reshape(-1), (n,)).astype(np.int32)
    f32 = np.float32
    per_column = np.broadcast_to(value(ins[4]).astype(f32).reshape(-1), (n,))
    scale = f32(node.attrs.get("alpha", 1.0)) * f32(value(ins[1]).reshape(())) * per_column  # the kernel's order
    pa = _params(graph, infos, ins[1], ins[2])
    pa[0] = reciprocal(pa[0])
    quantized = bool(ins[7])
    if quantized:
        py = _params(graph, infos, ins[7], ins[8])
        columns = (scale / f32(value(ins[7]).reshape(()))).astype(f32)
    else:
        py = [1.0, 0.0, 0.0, 0.0]
        columns = scale.astype(f32)
    scalars = dict(zip(_fields("a", True) + _fields("y", False), pa + py))
    wide = wr.vl == 16  # AVX-512: B in groups of four rows, for vpdpbusd where the CPU has VNNI
    table = _gemm_table(k, n, wide)
    if wide:
        kp, nb = -(-k // 4) * 4, -(-n // _PANEL) * _PANEL
        grouped = np.zeros((kp, nb), np.int8)
        grouped[:k, :n] = signed
        # [panel, group, column of the panel, row of the group]: a panel's bytes in one run
        grouped = grouped.reshape(kp // 4, 4, nb // _PANEL, _PANEL).transpose(2, 0, 3, 1)
        fields = dict(b=grouped, bsum=signed.astype(np.int64).sum(axis=0).astype(np.int32))
    else:
        fields = dict(b=signed)
    packed = wr.pack(ins[3], f"qgemm{'4' if wide else ''} {'|'.join(ins[1:9])}|{node.attrs}",
                     table.pack(**scalars, bias=bias, col=columns, zero=zero - shift, **fields))
    wr.as_plain(a)
    wr.step(f"q_gemm({wr.ptr(a)}, {wr.ptr(packed)}, {wr.ptr(out)});", [a, (packed, table.pointer)], [out],
            support=(_gemm4_source if wide else _gemm_source)(m, k, n, quantized))


def _gemm_table(k: int, n: int, grouped: bool = False) -> Struct:
    """A QGemm's table: A's and Y's quantization (1 / scale for A, whose integers are
    recovered by it), then per column of B the int32 bias, the float32 scale, the zero
    point (shifted with B), and B itself, [K, N] int8; ``grouped``: then each column's sum,
    and B as [N / 64, K / 4, 64, 4] (K padded to fours, N to panels of 64 columns, with
    zeros): each column's four bytes of a group side by side, as ``vpdpbusd`` reads them,
    and a panel's groups one after the other, so a task streams its panels' bytes once,
    in order."""
    if grouped:
        kp, nb = -(-k // 4) * 4, -(-n // _PANEL) * _PANEL
        per_column = (Field("bias", "int32_t", n), Field("col", "float", n), Field("zero", "int32_t", n),
                      Field("bsum", "int32_t", n), Field("b", "int8_t", kp * nb))
        return Struct(f"nn_qgemm4_{k}x{n}", _floats(*_fields("a", True), *_fields("y", False)) + per_column)
    per_column = (Field("bias", "int32_t", n), Field("col", "float", n), Field("zero", "int32_t", n),
                  Field("b", "int8_t", k * n))
    return Struct(f"nn_qgemm_{k}x{n}", _floats(*_fields("a", True), *_fields("y", False)) + per_column)


def _fields(prefix: str, read: bool) -> tuple[str, ...]:
    """A quantized operand's four scalars in _params' order: its scale (1 / scale for an
    input, whose integers are recovered by it), zero point, and range."""
    return tuple(f"{prefix}_{name}" for name in ("inv" if read else "scale", "zero", "lo", "hi"))


def _floats(*names: str) -> tuple[Field, ...]:
    return tuple(Field(name, "float") for name in names)


# QAdd: A's and B's scalars, C's, and the factors from A's and B's scales to C's
_ADD = Struct("nn_qadd", _floats(*_fields("a", True), *_fields("b", True), *_fields("c", False), "ra", "rb"))
# QGlobalAveragePool: X's and Y's scalars, and x_scale / (y_scale * pixels)
_POOL = Struct("nn_qpool", _floats(*_fields("x", True), *_fields("y", False), "scale"))


# With AVX-512 a QAdd runs 16 elements a step in the same arithmetic: the products rounded
# apart from the sum (an empty asm holds them), rint as roundscale to nearest even, the
# clamps and the NaN rule as mask blends; the elements past the last 16 take the scalar loop.
_ADD_VECTOR = """
#if defined(__AVX512F__)
#include <immintrin.h>
#define QA_VECTOR 1
#define QA_NEAREST (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
/* v < lo ? lo : v, then v > hi ? hi : v, then a NaN to lo: qi_centred's order, 16 lanes */
static inline __m512 qa_clamp16(__m512 v, __m512 lo, __m512 hi) {
    v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, lo, _CMP_LT_OQ), v, lo);
    v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, hi, _CMP_GT_OQ), v, hi);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v, lo);
}
/* qi_centred of 16 image values */
static inline __m512 qa_image16(const float *p, float inv, float zero, float lo, float hi) {
    __m512 q = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(p), _mm512_set1_ps(inv)), QA_NEAREST);
    q = qa_clamp16(_mm512_add_ps(q, _mm512_set1_ps(zero)), _mm512_set1_ps(lo), _mm512_set1_ps(hi));
    return _mm512_sub_ps(q, _mm512_set1_ps(zero));
}
/* q - zero of 16 stored bytes: (byte - shift) - zero, exact */
static inline __m512 qa_bytes16(const float *p, int64_t at, float shift, float zero) {
    __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)((const uint8_t *)p + at))));
    return _mm512_sub_ps(_mm512_sub_ps(q, _mm512_set1_ps(shift)), _mm512_set1_ps(zero));
}
#endif
"""


def _vector_operand(var: str, prefix: str, shift: int | None) -> str:
    """C for 16 elements' q - zero of an input at ``i0 + i`` (qa_image16 or qa_bytes16)."""
    if shift is None:
        return f"qa_image16({var} + i0 + i, t->{prefix}_inv, t->{prefix}_zero, t->{prefix}_lo, t->{prefix}_hi)"
    return f"qa_bytes16({var}, i0 + i, {float(shift)}f, t->{prefix}_zero)"


def _add_source(size: int, shift_a: int | None = None, shift_b: int | None = None,
                shift_y: int | None = None) -> str:
    """``shift_*``: the operand is stored as bytes, q plus this shift (int8_bytes), else
    None for a float image."""
    chunks = -(-size // _CHUNK)
    if shift_y is None:
        store = "Y[i0 + i] = (v - cz) * cs;"
        vector_store = "_mm512_storeu_ps(Y + i0 + i, _mm512_mul_ps(_mm512_sub_ps(v, vcz), _mm512_set1_ps(cs)));"
    else:
        store = f"((uint8_t *)Y)[i0 + i] = {int8_bytes.byte_store(shift_y)};"
        vector_store = ("_mm_storeu_si128((__m128i *)((uint8_t *)Y + i0 + i), _mm512_cvtepi32_epi8("
                        f"_mm512_cvttps_epi32(_mm512_add_ps(v, _mm512_set1_ps({float(shift_y)}f)))));")
    return f"""{_RECOVER}{_ADD_VECTOR}
{_ADD.declaration}
typedef struct {{ const float *a, *b; {_ADD.pointer}t; float *y; }} qa_job;

/* chunks [lo, hi) of the sum, shared over the pool */
static void qa_chunks(void *ctx, int64_t lo, int64_t hi) {{
    const qa_job *j = ctx;
    const float *A = j->a, *B = j->b;
    {_ADD.pointer}t = j->t;
    float *Y = j->y;
    const float ra = t->ra, rb = t->rb, cz = t->c_zero, clo = t->c_lo, chi = t->c_hi, cs = t->c_scale;
    for (int64_t i0 = lo * {_CHUNK}; i0 < hi * {_CHUNK} && i0 < {size}; i0 += {_CHUNK}) {{
        int64_t len = {size} - i0 < {_CHUNK} ? {size} - i0 : {_CHUNK}, start = 0;
#ifdef QA_VECTOR
        const __m512 vcz = _mm512_set1_ps(cz), vlo = _mm512_set1_ps(clo), vhi = _mm512_set1_ps(chi);
        for (int64_t i = 0; i + 16 <= len; i += 16, start = i) {{
            __m512 l = _mm512_mul_ps({_vector_operand("A", "a", shift_a)}, _mm512_set1_ps(ra));
            __m512 r = _mm512_mul_ps({_vector_operand("B", "b", shift_b)}, _mm512_set1_ps(rb));
            __asm__("" : "+v"(l), "+v"(r));  /* each product rounded on its own: no multiply-add */
            __m512 v = qa_clamp16(_mm512_roundscale_ps(_mm512_add_ps(_mm512_add_ps(l, r), vcz), QA_NEAREST), vlo, vhi);
            {vector_store}
        }}
#endif
        float l[{_CHUNK}], r[{_CHUNK}];
        for (int64_t i = start; i < len; i++) {{
            l[i] = {_centred("A", "i0 + i", "a", shift_a)} * ra;
            r[i] = {_centred("B", "i0 + i", "b", shift_b)} * rb;
        }}
        /* each product rounded on its own, as the portable kernel: no multiply-add */
        __asm__ volatile("" : : "r"(l), "r"(r) : "memory");
        for (int64_t i = start; i < len; i++) {{
            float v = rintf((l[i] + r[i]) + cz);
            v = v < clo ? clo : v; v = v > chi ? chi : v;
            v = v != v ? clo : v;
            {store}
        }}
    }}
}}

static void q_add(const float *A, const float *B, {_ADD.pointer}t, float *Y) {{
    qa_job j = {{A, B, t, Y}};
    nn_parallel({chunks}, {size * 8}, qa_chunks, &j);
}}
"""


def _pool_source(planes: int, size: int, shift: int | None = None) -> str:
    """``shift``: the input is stored as bytes (NCHW), q plus this shift, else None. Bytes
    are summed as integers and the shift and zero point taken off once per plane: each
    element's (byte - shift) - zero is an exact integer, so the sum is the same."""
    if shift is None:
        total = f"""for (int64_t i = 0; i < {size}; i++)
            sum += (int64_t){_centred("X", f"p * {size} + i", "x", None)};"""
    else:
        total = f"""const uint8_t *xb = (const uint8_t *)X + p * {size};
        for (int64_t i = 0; i < {size}; i++) sum += xb[i];
        sum -= (int64_t){size} * ({shift} + (int64_t)t->x_zero);"""
    return f"""{_RECOVER}
{_POOL.declaration}
static void q_pool(const float *X, {_POOL.pointer}t, float *Y) {{
    for (int64_t p = 0; p < {planes}; p++) {{
        int64_t sum = 0;
        {total}
        float v = rintf((float)sum * t->scale) + t->y_zero;
        v = v < t->y_lo ? t->y_lo : (v > t->y_hi ? t->y_hi : v);
        Y[p] = (v - t->y_zero) * t->y_scale;
    }}
}}
"""


def _gemm_source(m: int, k: int, n: int, quantized: bool) -> str:
    if quantized:  # the portable kernel requantizes in float64
        finish = """double v = rint((double)acc[j] * (double)col[j]) + (double)t->y_zero;
            v = v < t->y_lo ? t->y_lo : (v > t->y_hi ? t->y_hi : v);
            y[j] = (float)(v - t->y_zero) * t->y_scale;"""
    else:
        finish = "y[j] = (float)((double)acc[j] * (double)col[j]);"
    blocks = -(-n // _COLUMNS)
    table = _gemm_table(k, n)
    return f"""{_RECOVER}
{table.declaration}
typedef struct {{ const float *a; {table.pointer}t; float *y; }} qg_job;

/* column blocks [lo, hi) of every row: B's int8 columns, the zero point through A's sum */
static void qg_columns(void *ctx, int64_t lo, int64_t hi) {{
    const qg_job *jb = ctx;
    {table.pointer}t = jb->t;
    const int32_t *bias = t->bias, *zero = t->zero;
    const float *col = t->col;
    const int8_t *b = t->b;
    int64_t j0 = lo * {_COLUMNS}, j1 = hi * {_COLUMNS} < {n} ? hi * {_COLUMNS} : {n};
    int32_t a[{k}], acc[{n}];
    for (int64_t i = 0; i < {m}; i++) {{
        uint32_t sum = 0;
        for (int64_t p = 0; p < {k}; p++) {{
            a[p] = (int32_t)qi_centred(jb->a[i * {k} + p], t->a_inv, t->a_zero, t->a_lo, t->a_hi);
            sum += (uint32_t)a[p];
        }}
        /* unsigned: wraps as the portable kernel's int32 accumulator */
        for (int64_t j = j0; j < j1; j++) acc[j] = (int32_t)((uint32_t)bias[j] - (uint32_t)zero[j] * sum);
        for (int64_t p = 0; p < {k}; p++)
            for (int64_t j = j0; j < j1; j++) acc[j] = (int32_t)((uint32_t)acc[j] + (uint32_t)(a[p] * b[p * {n} + j]));
        float *y = jb->y + i * {n};
        for (int64_t j = j0; j < j1; j++) {{
            {finish}
        }}
    }}
}}

static void q_gemm(const float *A, {table.pointer}t, float *Y) {{
    qg_job jb = {{A, t, Y}};
    nn_parallel({blocks}, {m * n * k}, qg_columns, &jb);
}}
"""


def _gemm4_source(m: int, k: int, n: int, quantized: bool) -> str:
    """_gemm_source over B in groups of four rows (_gemm_table's grouped form): A's row as
    bytes u = q - a_lo (0..255, so unsigned for ``vpdpbusd``), its centred values being
    u - (a_zero - a_lo), whose sum with a column is taken off through the column's sum. The
    int32 sums wrap as the portable kernel's; the rest is _gemm_source's. The tasks are
    panels of 64 columns, each read once per row as one run, its four vectors of sums
    independent chains (a matrix-vector product is bound by the bytes of B it streams)."""
    if quantized:  # the portable kernel requantizes in float64
        finish = """double v = rint((double)acc[j] * (double)col[j]) + (double)t->y_zero;
            v = v < t->y_lo ? t->y_lo : (v > t->y_hi ? t->y_hi : v);
            y[j] = (float)(v - t->y_zero) * t->y_scale;"""
    else:
        finish = "y[j] = (float)((double)acc[j] * (double)col[j]);"
    kp, nb = -(-k // 4) * 4, -(-n // _PANEL) * _PANEL
    groups = kp // 4
    panels = nb // _PANEL
    table = _gemm_table(k, n, True)
    return f"""
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define QG_VNNI 1
#endif
{_RECOVER}
{table.declaration}
typedef struct {{ const float *a; {table.pointer}t; float *y; }} qg_job;

/* panels [lo, hi) of every row */
static void qg_columns(void *ctx, int64_t lo, int64_t hi) {{
    const qg_job *jb = ctx;
    {table.pointer}t = jb->t;
    const int32_t *bias = t->bias, *zero = t->zero, *bsum = t->bsum;
    const float *col = t->col;
    const int8_t *b = t->b;
    const int64_t j0 = lo * {_PANEL}, j1 = hi * {_PANEL} < {n} ? hi * {_PANEL} : {n};
    const int32_t dz = (int32_t)(t->a_zero - t->a_lo);  /* centred = u - dz */
    uint8_t u[{kp}];
    int32_t acc[{nb}];
    for (int64_t i = 0; i < {m}; i++) {{
        uint32_t usum = 0;
        for (int64_t p = 0; p < {k}; p++) {{
            u[p] = (uint8_t)(int32_t)(qi_centred(jb->a[i * {k} + p], t->a_inv, t->a_zero, t->a_lo, t->a_hi) + (float)dz);
            usum += u[p];
        }}
        for (int64_t p = {k}; p < {kp}; p++) u[p] = 0;
        const uint32_t sum = usum - (uint32_t){k} * (uint32_t)dz;  /* of the centred values */
#ifdef QG_VNNI
        for (int64_t panel = lo; panel < hi; panel++) {{
            const int8_t *bp = b + panel * {groups * _PANEL * 4};
            __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0;
            for (int64_t g = 0; g < {groups}; g++, bp += {_PANEL * 4}) {{
                int32_t four;
                memcpy(&four, u + 4 * g, 4);
                const __m512i a4 = _mm512_set1_epi32(four);
                c0 = _mm512_dpbusd_epi32(c0, a4, _mm512_loadu_si512(bp));
                c1 = _mm512_dpbusd_epi32(c1, a4, _mm512_loadu_si512(bp + 64));
                c2 = _mm512_dpbusd_epi32(c2, a4, _mm512_loadu_si512(bp + 128));
                c3 = _mm512_dpbusd_epi32(c3, a4, _mm512_loadu_si512(bp + 192));
            }}
            int32_t *at = acc + panel * {_PANEL};
            _mm512_storeu_si512(at, c0);
            _mm512_storeu_si512(at + 16, c1);
            _mm512_storeu_si512(at + 32, c2);
            _mm512_storeu_si512(at + 48, c3);
        }}
#else
        for (int64_t j = j0; j < j1; j++) acc[j] = 0;
        for (int64_t g = 0; g < {groups}; g++)
            for (int64_t j = j0; j < j1; j++) {{
                const int8_t *bj = b + ((j / {_PANEL} * {groups} + g) * {_PANEL} + j % {_PANEL}) * 4;
                acc[j] = (int32_t)((uint32_t)acc[j] + (uint32_t)(u[4 * g] * bj[0] + u[4 * g + 1] * bj[1]
                                                                 + u[4 * g + 2] * bj[2] + u[4 * g + 3] * bj[3]));
            }}
#endif
        /* unsigned: wraps as the portable kernel's int32 accumulator */
        for (int64_t j = j0; j < j1; j++)
            acc[j] = (int32_t)((uint32_t)acc[j] + (uint32_t)bias[j] - (uint32_t)zero[j] * sum - (uint32_t)dz * (uint32_t)bsum[j]);
        float *y = jb->y + i * {n};
        for (int64_t j = j0; j < j1; j++) {{
            {finish}
        }}
    }}
}}

static void q_gemm(const float *A, {table.pointer}t, float *Y) {{
    qg_job jb = {{A, t, Y}};
    nn_parallel({panels}, {m * n * k}, qg_columns, &jb);
}}
"""
