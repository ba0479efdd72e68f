"""ConvTranspose, 1-D and 2-D, as a GEMM by the weights then a scatter (col2im).

Per image and group, one product gives every tap's contribution at every input pixel:
``cols[(m, kh, kw), (h, w)] = sum_c W[c, m, kh, kw] * x[c, h, w]`` (nn_gemm, the weights
packed at compile time as ``[group, Mg*kH*kW, Cg]``). Each output channel's plane then
starts from its bias and adds, for every tap, the column values at
``oh = h*sh - pad_top + kh*dh``, ``ow = w*sw - pad_left + kw*dw`` that land inside it:
output channels are independent, so the scatter runs over the thread pool by channel.
Strides, dilations, pads (negative ones too, from an ``output_shape``), output_padding and
groups are literals; the output's size is the shape inference's. A 1-D ConvTranspose is
the 2-D one with a height of 1. A 2-D ungrouped one whose readers all take the
channel-blocked layout scatters into that layout instead (``emit_blocked``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nncc.native import kernel
from nncc.native.graph_query import CONV_OPS, const_value


@dataclass(frozen=True)
class Geometry:
    n: int
    c: int
    h: int
    w: int
    m: int  # output channels
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    top: int  # begin padding: output row 0 is row ``top`` of the uncropped result
    left: int
    group: int


def refused(node, graph, infos) -> str | None:
    """Why this ConvTranspose cannot be written (None: it can)."""
    rank = len(infos[node.inputs[0]].shape)
    if rank not in (3, 4):
        return "only 1-D and 2-D ConvTranspose"
    if const_value(graph, infos, node.inputs[1]) is None:
        return "ConvTranspose weights are not a constant"
    if 0 in infos[node.inputs[0]].shape or 0 in infos[node.inputs[1]].shape or 0 in infos[node.outputs[0]].shape:
        return "an empty ConvTranspose"
    return None


def geometry(node, infos) -> Geometry:
    x, w, y = (infos[name].shape for name in (node.inputs[0], node.inputs[1], node.outputs[0]))
    one = len(x) == 3  # 1-D: a height of 1
    if one:
        x, w, y = (*x[:2], 1, x[2]), (*w[:2], 1, w[2]), (*y[:2], 1, y[2])
    a = node.attrs
    nd = 1 if one else 2

    def per_axis(key, default):
        values = [int(v) for v in (a.get(key) or [default] * nd)]
        return [default] + values if one else values

    strides, dilations, out_pad = per_axis("strides", 1), per_axis("dilations", 1), per_axis("output_padding", 0)
    pads = [int(v) for v in (a.get("pads") or [0] * 2 * nd)]
    begin = ([0] if one else []) + pads[:nd]
    auto = a.get("auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    tops = []
    for i in range(2):
        size, k, s, d, o = x[2 + i], w[2 + i], strides[i], dilations[i], y[2 + i]
        full = (size - 1) * s + out_pad[i] + (k - 1) * d + 1
        if a.get("output_shape") is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
            total = full - o  # what is cropped: the same rule as the portable kernel's
            tops.append(total // 2 if auto == "SAME_UPPER" else total - total // 2)
        elif auto == "VALID":
            tops.append(0)
        else:
            tops.append(begin[i])
    if one:
        tops[0] = 0
    return Geometry(x[0], x[1], x[2], x[3], y[1], y[2], y[3], w[2], w[3], strides[0], strides[1],
                    dilations[0], dilations[1], tops[0], tops[1], int(a.get("group", 1)))


def writes_blocked(writer, node, g: Geometry) -> bool:
    """Whether the output goes straight into the channel-blocked layout: a 2-D, ungrouped
    ConvTranspose whose every reader takes that layout (a convolution, or a Concat, which
    joins blocked inputs blocked), as a decoder's upsampling is, with a constant bias or
    none; its scatter then adds whole blocks of channels at once, and no reorder follows."""
    y = node.outputs[0]
    users = writer.consumers.get(y, [])
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    if g.group != 1 or len(writer.shape(y)) != 4 or y in writer.outputs or not users or \
            (bias and const_value(writer.graph, writer.infos, bias) is None):  # packed to whole blocks
        return False
    return all((u.domain, u.op_type) in CONV_OPS or
               ((u.domain, u.op_type) == ("", "Concat") and int(u.attrs.get("axis", 1)) % 4 == 1) for u in users)


def emit(writer, node) -> None:
    g = geometry(node, writer.infos)
    if writes_blocked(writer, node, g):
        return emit_blocked(writer, node, g)
    x, y = node.inputs[0], node.outputs[0]
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    cg, mg, taps, pixels = g.c // g.group, g.m // g.group, g.kh * g.kw, g.h * g.w
    weights = np.asarray(const_value(writer.graph, writer.infos, node.inputs[1]), np.float32)
    packed = writer.pack(node.inputs[1], "convT",
                         weights.reshape(g.group, cg, mg * taps).transpose(0, 2, 1))
    rows = mg * taps
    scratch = rows * pixels * 4
    px, pw, py = writer.ptr(x), writer.ptr(packed), writer.ptr(y)
    start = f"j->b[j->g * {mg} + m]" if bias else "0.0f"
    fields = "const float *cols; " + ("const float *b; " if bias else "") + "float *y; int64_t g;"
    support = f"""typedef struct {{ {fields} }} ct_job;
static void ct_scatter(void *ctx, int64_t lo, int64_t hi) {{
    const ct_job *j = ctx;
    for (int64_t m = lo; m < hi; m++) {{
        float *plane = j->y + m * {g.oh * g.ow};
        const float start = {start};
        for (int64_t i = 0; i < {g.oh * g.ow}; i++) plane[i] = start;
        for (int64_t t = 0; t < {taps}; t++) {{
            const int64_t th = t / {g.kw}, tw = t % {g.kw};
            const float *col = j->cols + (m * {taps} + t) * {pixels};
            for (int64_t h = 0; h < {g.h}; h++) {{
                const int64_t oh = h * {g.sh} - {g.top} + th * {g.dh};
                if (oh < 0 || oh >= {g.oh}) continue;
                for (int64_t w = 0; w < {g.w}; w++) {{
                    const int64_t ow = w * {g.sw} - {g.left} + tw * {g.dw};
                    if (ow >= 0 && ow < {g.ow}) plane[oh * {g.ow} + ow] += col[h * {g.w} + w];
                }}
            }}
        }}
    }}
}}
"""
    cols = kernel.SCRATCH
    job = f"ct_job job = {{(const float *){cols}, {writer.ptr(bias) + ', ' if bias else ''}" \
          f"{py} + (n * {g.m} + grp * {mg}) * {g.oh * g.ow}, grp}};"
    code = f"""for (int64_t n = 0; n < {g.n}; n++) {{
    for (int64_t grp = 0; grp < {g.group}; grp++) {{
        nn_gemm(0, 0, {rows}, {pixels}, {cg}, 1.0f, {pw} + grp * {rows * cg}, {cg},
                {px} + (n * {g.c} + grp * {cg}) * {pixels}, {pixels}, 0.0f, (float *){cols}, {pixels});
        {job}
        nn_parallel({mg}, {mg * taps * pixels}, ct_scatter, &job);
    }}
}}"""
    writer.step(code, [x, packed, bias], [y], scratch=scratch, support=support, blas=True)


def emit_blocked(writer, node, g: Geometry) -> None:
    """The product transposed, then scattered into the blocked layout [N, M/VL, OH, OW, VL].
    ``cols[(h, w), (kh, kw, m)]`` (x read transposed by nn_gemm; the weights packed as
    ``[C, kH*kW, MB*VL]``, zero past M) puts a channel block's VL values of one tap at one
    input pixel side by side, so each lands on its output pixel as one vector add. A task
    per output channel block starts its plane from the bias, adds every tap, and zeroes the
    padding lanes of the last block (a reorder into the layout writes them as zeros too);
    blocks split the work, so no two threads write one cache line."""
    vl = writer.vl
    x, y = node.inputs[0], node.outputs[0]
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    taps, pixels, area = g.kh * g.kw, g.h * g.w, g.oh * g.ow
    mb = -(-g.m // vl)
    width = mb * vl
    weights = np.asarray(const_value(writer.graph, writer.infos, node.inputs[1]), np.float32)
    packed = np.zeros((g.c, taps, width), np.float32)
    packed[:, :, :g.m] = weights.reshape(g.c, g.m, taps).transpose(0, 2, 1)
    packed_w = writer.pack(node.inputs[1], f"convT{vl}c", packed)
    packed_b = writer.pack(bias, f"bias{vl}c", pack_bias(writer, bias, width)) if bias else None
    pw = writer.ptr(packed_w)
    row = taps * width  # floats per input pixel in cols
    buf = writer.blocked_buffer(y)
    px, py = writer.ptr(x), writer.ptr(buf)
    start = "nn_vload(j->b + blk * %d)" % vl if bias else "nn_vzero()"
    fields = "const float *cols; " + ("const float *b; " if bias else "") + "float *y;"
    padding = ""
    if g.m % vl:
        padding = f"""        if (blk == {mb - 1})
            for (int64_t i = 0; i < {area}; i++)
                for (int l = {g.m % vl}; l < {vl}; l++) yb[i * {vl} + l] = 0.0f;
"""
    support = f"""NN_REQUIRE_VL({vl});
typedef struct {{ {fields} }} ctb_job;
static void ctb_scatter(void *ctx, int64_t lo, int64_t hi) {{
    const ctb_job *j = ctx;
    for (int64_t blk = lo; blk < hi; blk++) {{
        float *yb = j->y + blk * {area * vl};
        const nn_v start = {start};
        for (int64_t i = 0; i < {area}; i++) nn_vstore(yb + i * {vl}, start);
        for (int64_t t = 0; t < {taps}; t++) {{
            const int64_t th = t / {g.kw}, tw = t % {g.kw};
            const float *col = j->cols + t * {width} + blk * {vl};
            for (int64_t h = 0; h < {g.h}; h++) {{
                const int64_t oh = h * {g.sh} - {g.top} + th * {g.dh};
                if (oh < 0 || oh >= {g.oh}) continue;
                for (int64_t w = 0; w < {g.w}; w++) {{
                    const int64_t ow = w * {g.sw} - {g.left} + tw * {g.dw};
                    if (ow < 0 || ow >= {g.ow}) continue;
                    float *o = yb + (oh * {g.ow} + ow) * {vl};
                    nn_vstore(o, nn_vadd(nn_vload(o), nn_vload(col + (h * {g.w} + w) * {row})));
                }}
            }}
        }}
{padding}    }}
}}
"""
    cols = kernel.SCRATCH
    job = f"ctb_job job = {{(const float *){cols}, {writer.ptr(packed_b) + ', ' if bias else ''}" \
          f"{py} + n * {mb * area * vl}}};"
    code = f"""for (int64_t n = 0; n < {g.n}; n++) {{
    nn_gemm(1, 0, {pixels}, {row}, {g.c}, 1.0f, {px} + n * {g.c * pixels}, {pixels}, {pw}, {row}, 0.0f,
            (float *){cols}, {row});
    {job}
    nn_parallel({mb}, {mb * vl * taps * pixels}, ctb_scatter, &job);
}}"""
    writer.step(code, [x, packed_w, packed_b], [buf], scratch=pixels * row * 4, support=writer.simd + support,
                blas=True)


def pack_bias(writer, bias: str, width: int) -> np.ndarray:
    """The bias zero-padded to whole channel blocks."""
    values = np.asarray(const_value(writer.graph, writer.infos, bias), np.float32).reshape(-1)
    out = np.zeros(width, np.float32)
    out[:values.size] = values
    return out
