"""ConvTranspose, 1-D and 2-D, as a GEMM by the weights then a scatter (col2im).

Per image and group, one product gives every tap's contribution at every input pixel:
``cols[(m, kh, kw), (h, w)] = sum_c W[c, m, kh, kw] * x[c, h, w]`` (nn_gemm, the weights
packed at compile time as ``[group, Mg*kH*kW, Cg]``). Each output channel's plane then
starts from its bias and adds, for every tap, the column values at
``oh = h*sh - pad_top + kh*dh``, ``ow = w*sw - pad_left + kw*dw`` that land inside it:
output channels are independent, so the scatter runs over the thread pool by channel.
Strides, dilations, pads (negative ones too, from an ``output_shape``), output_padding and
groups are literals; the output's size is the shape inference's. A 1-D ConvTranspose is
the 2-D one with a height of 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nncc.native import kernel
from nncc.native.graph_query import const_value


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


def emit(writer, node) -> None:
    g = geometry(node, writer.infos)
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
