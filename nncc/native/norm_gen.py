"""Native C for LayerNormalization, and for a residual Add whose sum LayerNormalization
reads, as one step: ``y = LN(a + b)`` row by row, the sum written too only when something
else reads it. Each row is read from memory once: the sum (or the input) is made and
summed in one vector pass, and the variance (around the mean, as a second pass: the
accurate form) and the normalisation then run over the row while it sits in L1. Rows are
shared out over the thread pool. Every size is a literal, every loop runs on simd.h's
vectors with a scalar tail.

A residual Add that a GEMM by constant weights already takes into its store (gemm_gen) is
not seen here: that product then writes the sum, and the LayerNormalization after it runs
alone, still one read of each row.
"""

from __future__ import annotations

import math

from nncc.ir.graph import Node
from nncc.native.c_literal import c_float


def _geometry(w, node: Node) -> tuple[int, int, str | None, float]:
    shape = w.shape(node.inputs[0])
    axis = int(node.attrs.get("axis", -1)) % len(shape)
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    return math.prod(shape[:axis]), math.prod(shape[axis:]), bias, float(node.attrs.get("epsilon", 1e-5))


def _code(rows: int, n: int, eps: float, two: bool, keep_sum: bool, bias: bool) -> str:
    """The task over rows: ``x`` (plus ``x2`` when ``two``) -> ``y``; the sum also to ``s``
    when ``keep_sum``."""
    load = "nn_vadd(nn_vload(xr + i), nn_vload(x2r + i))" if two else "nn_vload(xr + i)"
    scalar = "xr[i] + x2r[i]" if two else "xr[i]"
    sum_row = "sr" if keep_sum else "yr"
    shift = "nn_vload(br + i)" if bias else "nn_vzero()"
    shift_s = "br[i]" if bias else "0.0f"
    lines = [
        "typedef struct { const float *x, *x2, *sc, *br; float *y, *s; } ln_job;",
        "static void ln_task(void *p, int64_t lo, int64_t hi) {",
        "  const ln_job *a = p;",
        "  const float *x = a->x, *x2 = a->x2, *sc = a->sc, *br = a->br; float *y = a->y, *s = a->s;",
        "  (void)x2; (void)br; (void)s;",
        "  for (int64_t r = lo; r < hi; r++) {",
        f"    const float *xr = x + r * {n}, *x2r = x2 + r * {n}; float *yr = y + r * {n}, *sr = s + r * {n};",
        "    (void)x2r; (void)sr;",
        f"    float *t = {sum_row};",  # where the row's input (the sum) stays for the later passes
        "    nn_v acc = nn_vzero(); int64_t i = 0; float total = 0.0f;",
        f"    for (; i + NN_VL <= {n}; i += NN_VL) {{ const nn_v v = {load}; nn_vstore(t + i, v); acc = nn_vadd(acc, v); }}",
        f"    for (; i < {n}; i++) {{ const float v = {scalar}; t[i] = v; total += v; }}",
        "    for (int k = 0; k < NN_VL; k++) total += acc[k];",
        f"    const float mean = total / {n}.0f;",
        "    const nn_v mv = nn_vset1(mean);",
        "    acc = nn_vzero(); total = 0.0f;",
        f"    for (i = 0; i + NN_VL <= {n}; i += NN_VL) {{ const nn_v d = nn_vsub(nn_vload(t + i), mv); "
        "acc = nn_vfma(d, d, acc); }",
        f"    for (; i < {n}; i++) {{ const float d = t[i] - mean; total += d * d; }}",
        "    for (int k = 0; k < NN_VL; k++) total += acc[k];",
        f"    const float inv = 1.0f / sqrtf(total / {n}.0f + {c_float(eps)});",
        "    const nn_v iv = nn_vset1(inv);",
        f"    for (i = 0; i + NN_VL <= {n}; i += NN_VL) nn_vstore(yr + i, "
        f"nn_vfma(nn_vmul(nn_vsub(nn_vload(t + i), mv), iv), nn_vload(sc + i), {shift}));",
        f"    for (; i < {n}; i++) yr[i] = (t[i] - mean) * inv * sc[i] + {shift_s};",
        "  }",
        "}",
    ]
    return "\n".join(lines)


def _emit(w, node: Node, x: str, x2: str | None, keep: str | None, label_reads) -> None:
    rows, n, bias, eps = _geometry(w, node)
    y = node.outputs[0]
    if rows * n == 0:
        return w.step(";", label_reads, [y] + ([keep] if keep else []))
    support = w.simd + _code(rows, n, eps, x2 is not None, keep is not None, bias is not None)
    ptrs = [w.ptr(x), w.ptr(x2) if x2 else "0", w.ptr(node.inputs[1]), w.ptr(bias) if bias else "0", w.ptr(y),
            w.ptr(keep) if keep else "0"]
    code = (f"{{ ln_job a = {{{', '.join(ptrs)}}}; "
            f"nn_parallel({rows}, {rows * n * 4}, ln_task, &a); }}")
    w.step(code, label_reads, [y] + ([keep] if keep else []), support=support)


def emit_layernorm(w, node: Node) -> None:
    """A LayerNormalization its entry accepted (nncc/native/ops/layernorm.py), as one vectorized step."""
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    _emit(w, node, node.inputs[0], None, None, [node.inputs[0], node.inputs[1], bias])


def emit_add_layernorm(w, add: Node, norm: Node) -> None:
    """``add`` and the LayerNormalization ``norm`` reading its sum as one step (the
    fusion's decision: nncc/native/ops/layernorm.py)."""
    out = add.outputs[0]
    others = [n for n in w.consumers.get(out, []) if n is not norm]
    keep = out if others or out in w.outputs else None
    w.absorbed.add(id(norm))
    bias = norm.inputs[2] if len(norm.inputs) > 2 and norm.inputs[2] else None
    _emit(w, norm, add.inputs[0], add.inputs[1], keep, [add.inputs[0], add.inputs[1], norm.inputs[1], bias])
    w.steps[-1].label = f"Add+LayerNormalization {add.name}"
