"""A grouped 1x1 convolution over NCHW whose groups are not whole channel blocks (ShuffleNet's
pointwise layers: 4 groups of 34 channels), as one step with every size a literal.

Group g's output rows are its weights [KG, CG] times its input planes [CG, H*W]. A register
tile is KR output rows by PV vectors of pixels: per input channel it loads PV vectors of that
channel's plane and broadcasts KR weights, each feeding PV multiply-adds; a group's rows never
share a tile with another group's, so every sum runs over the group's own channels only (a
NaN or an infinity in one group never reaches another's outputs). Bias, the residual and the
activation are applied in the tile's store. The pool shares (image, group, run of pixels)
tasks: one job, where a BLAS product per group and an epilogue pass took a job each.
"""

from __future__ import annotations

import numpy as np

from nncc.native.blocked_conv import after_store, stored, vector_registers

# (rows, pixel vectors) of a tile by the register file: KR * PV accumulators, PV input
# vectors and a broadcast weight fit (AVX2's 16: 10 + 2 + 1; AVX-512's 32: 24 + 4 + 1)
TILES = {16: (5, 2), 32: (6, 4)}
TASKS = 8  # at least this many tasks a step, so two to four threads share evenly


def pack_weights(w: np.ndarray, group: int) -> np.ndarray:
    """[K, CG, 1, 1] -> [G][CG][KG]: a tile's KR weights of one input channel side by side."""
    k, cg = w.shape[:2]
    return np.ascontiguousarray(w.reshape(group, k // group, cg).transpose(0, 2, 1))


def grouped_pointwise(n: int, c: int, hw: int, k: int, group: int, vl: int, ptrs: dict[str, str | None],
                      act: int, p0: str, p1: str) -> tuple[str, str]:
    """(support C, call statement). ``ptrs``: C expressions for x [N, C, HW], w (packed),
    b (the bias [K]) and r (the residual [N, K, HW]), which may be None, and y [N, K, HW]."""
    cg, kg = c // group, k // group
    kr, pv = TILES[vector_registers(vl)]
    kr = min(kr, kg)
    run_px = pv * vl
    runs = max(1, min(-(-hw // run_px), -(-TASKS // (n * group))))  # runs of pixels per plane
    per_run = -(-(-(-hw // runs)) // run_px) * run_px  # whole tiles, the last run shorter
    runs = -(-hw // per_run)
    has_bias, has_res = ptrs.get("b") is not None, ptrs.get("r") is not None

    def tile(rows: int, vectors: int) -> str:
        """``rows`` output rows x ``vectors`` pixel vectors from pixel p."""
        name = f"tile{rows}x{vectors}"
        out = [f"static inline __attribute__((always_inline)) void {name}(const float *restrict x, "
               "const float *restrict w, const float *restrict bias, const float *restrict res, "
               "float *restrict y, int64_t p) {"]
        for r in range(rows):
            init = f"nn_vset1(bias[{r}])" if has_bias else "nn_vzero()"
            out.append("  nn_v " + ", ".join(f"a{r}_{q} = {init}" for q in range(vectors)) + ";")
        out += [f"  for (int ci = 0; ci < {cg}; ci++) {{",
                f"    const float *xc = x + ci * {hw} + p;",
                "    " + " ".join(f"const nn_v x{q} = nn_vload(xc + {q * vl});" for q in range(vectors))]
        for r in range(rows):
            out.append(f"    {{ const nn_v wr = nn_vset1(w[ci * {kg} + {r}]); "
                       + " ".join(f"a{r}_{q} = nn_vfma(x{q}, wr, a{r}_{q});" for q in range(vectors)) + " }")
        out.append("  }")
        for r in range(rows):
            for q in range(vectors):
                off = f"{r * hw} + p + {q * vl}"
                out.append(f"  nn_vstore(y + {off}, {stored(f'a{r}_{q}', f'res + {off}' if has_res else None, act, p0, p1)});")
            line = after_store(act, f"y + {r * hw} + p", vectors, vl, p0, p1)
            if line:
                out.append("  " + line)
        out.append("}")
        return "\n".join(out)

    def tail(rows: int) -> str:
        """The last pixels of a plane, fewer than a vector: each input channel's copied into a
        zero-padded vector, one tile of it, the real lanes stored (the padding's products
        are never stored, so a NaN or an infinity cannot reach them)."""
        out = [f"static inline __attribute__((always_inline)) void tail{rows}(const float *restrict x, "
               "const float *restrict w, const float *restrict bias, const float *restrict res, "
               "float *restrict y, int64_t p, int64_t end) {",
               "  const int64_t m = end - p;",
               f"  float xt[{cg * vl}] __attribute__((aligned(64)));",
               f"  for (int ci = 0; ci < {cg}; ci++)",
               f"    for (int l = 0; l < {vl}; l++) xt[ci * {vl} + l] = l < m ? x[ci * {hw} + p + l] : 0.0f;"]
        for r in range(rows):
            out.append(f"  nn_v a{r} = {f'nn_vset1(bias[{r}])' if has_bias else 'nn_vzero()'};")
        out += [f"  for (int ci = 0; ci < {cg}; ci++) {{",
                f"    const nn_v xv = nn_vload(xt + ci * {vl});"]
        out += [f"    a{r} = nn_vfma(xv, nn_vset1(w[ci * {kg} + {r}]), a{r});" for r in range(rows)]
        out.append("  }")
        out.append(f"  float rt[{vl}] __attribute__((aligned(64))) = {{0}}, yt[{vl}] __attribute__((aligned(64)));")
        for r in range(rows):
            if has_res:
                out.append(f"  for (int l = 0; l < m; l++) rt[l] = res[{r * hw} + p + l];")
            out.append(f"  nn_vstore(yt, {stored(f'a{r}', 'rt' if has_res else None, act, p0, p1)});")
            line = after_store(act, "yt", 1, vl, p0, p1)
            if line:
                out.append("  " + line)
            out.append(f"  for (int l = 0; l < m; l++) y[{r * hw} + p + l] = yt[l];")
        out.append("}")
        return "\n".join(out)

    tail_rows = kg % kr
    row_tiles = [(r0, kr) for r0 in range(0, kg - tail_rows, kr)] + ([(kg - tail_rows, tail_rows)] if tail_rows else [])
    shapes = {rows for _, rows in row_tiles}
    support = [f"NN_REQUIRE_VL({vl});"]
    for rows in sorted(shapes):
        support += [tile(rows, pv), tile(rows, 1), tail(rows)]

    def tiles(kind: str) -> list[str]:
        """Every row tile of the group at pixel p (``kind``: the tile's name after its rows)."""
        out = []
        for r0, rows in row_tiles:
            tail = kind.startswith("tail")
            out.append(f"        {kind.replace('ROWS', str(rows))}(xg, wg + {r0}, bg ? bg + {r0} : 0, "
                       f"rg ? rg + {r0 * hw} : 0, yg + {r0 * hw}, p{', p1' if tail else ''});")
        return out

    body = ["static void gpw_task(void *ctx, int64_t lo, int64_t hi) {",
            "  const float *const *a = ctx;",
            "  const float *x = a[0], *w = a[1], *b = a[2], *r = a[3];",
            "  float *y = (float *)a[4];",
            "  for (int64_t t = lo; t < hi; t++) {",
            f"    const int64_t run = t % {runs}, g = (t / {runs}) % {group}, n = t / {runs * group};",
            f"    const int64_t start = run * {per_run}, p1 = start + {per_run} < {hw} ? start + {per_run} : {hw};",
            f"    const float *xg = x + (n * {c} + g * {cg}) * {hw};",
            f"    const float *wg = w + g * {cg * kg};",
            f"    const float *bg = b ? b + g * {kg} : 0;",
            f"    const float *rg = r ? r + (n * {k} + g * {kg}) * {hw} : 0;",
            f"    float *yg = y + (n * {k} + g * {kg}) * {hw};",
            "    int64_t p = start;",
            # a tile's pixels of every input channel stay in L1 while each row tile reads them
            f"    for (; p + {run_px} <= p1; p += {run_px}) {{",
            *tiles(f"tileROWSx{pv}"),
            "    }",
            f"    for (; p + {vl} <= p1; p += {vl}) {{",
            *tiles("tileROWSx1"),
            "    }",
            "    if (p < p1) {",
            *tiles("tailROWS"),
            "    }"]
    body += ["  }", "}"]
    support.append("\n".join(body))
    args = ", ".join(ptrs.get(key) or "0" for key in ("x", "w", "b", "r"))
    call = (f"{{ const float *a[5] = {{{args}, (const float *){ptrs['y']}}}; "
            f"nn_parallel({n * group * runs}, {2 * n * k * cg * hw}, gpw_task, (void *)a); }}")
    return "\n".join(support) + "\n", call
