"""The bfloat16 GEMM by constant weights (``precision="bf16"``) on AMX tiles, for CPUs with
amx_tile and amx_bf16 (nncc/native/amx.py): ``tdpbf16ps`` multiplies a tile of 16 rows x
16 pairs of A by a tile of 16 pairs x 16 columns of B into 16 x 16 float32 sums, 512
products per instruction where ``vdpbf16ps`` makes 32.

The operands are nncc/native/gemm_bf16_gen.py's: A rounded to bfloat16 pairs in the step's
scratch at run time (rows of whole 16-pair vectors, zero past K), B packed at compile time
in panels of NR = 64 columns, each 32-bit word a pair of consecutive rows of K. A packed
panel read with a stride of 256 bytes is four B tiles side by side, so the layout is the
vdpbf16ps GEMM's, with one difference: each panel's pairs are padded with zeros to a
multiple of 16 (``PAIRS``), as are A's rows, so the last step of K reads zeros on both
sides. (B read past a panel's end would be the next panel's first pairs: finite, but A's
zeros would meet them only by luck of the layout, and at the last panel nothing.) M is
padded the same way: the scratch holds A's rows rounded up to 32, the extra ones zero, and
their sums are never stored; N by the packed panels' zero columns, whose sums are not
stored either.

One micro-tile is 32 rows x 32 columns: four C tiles (tmm0-3), two tiles of A (tmm4-5) and
two of B (tmm6-7), each tile loaded serving two products; one configuration for every
product (``CONFIG``). A panel's two halves go into a buffer of 32 x 64 floats on the
thread's stack, whose rows then go through the float32 GEMM's store (bias, Gemm's C,
activation, residual: gemm_gen.store_tile), only the valid rows and columns; a micro-tile
with only 16 valid rows or columns multiplies only the tiles it needs. The grid of
(32-row tiles x panels) is cut into rectangles per thread as in gemm_gen;
each task loads the configuration and releases the tiles when done.

The same step holds the vdpbf16ps GEMM over the same operands, which runs where the OS
refuses the tiles or ``NNCC_AMX=0`` turns them off (decided once per process: runtime.c),
and for products of fewer than AMX_MIN_ROWS rows, which a 16-row tile would mostly waste.

Arithmetic: ``tdpbf16ps`` treats bfloat16 denormal inputs as zero and flushes denormal
float32 results to zero (as ``vdpbf16ps`` does), and rounds to nearest even; docs/native.md
gives the bound, tests/test_native_bf16.py and the native fuzzer check it.
"""

from __future__ import annotations

import numpy as np

from nncc.native import amx, gemm_bf16_gen, graph_query
from nncc.native.gemm_gen import SHARES, Epilogue, Shape, act_tile_name, act_tile_source, store_tile

TILE = 16  # rows of A per tile
ROWS = 32  # rows of C per micro-tile (two tiles of A)
PAIRS = 16  # pairs of K per tile of A (64 bytes a row)
COLS = 16  # columns of C per tile
HALF = 32  # columns of C per micro-tile (two tiles of B)
# Products with fewer rows take the vdpbf16ps GEMM: a tile of 16 rows would multiply
# mostly padding, and one or two rows are bound by streaming B anyway.
AMX_MIN_ROWS = 8
CONFIG = "x_cfg"


def pack_b(b: np.ndarray, vl: int) -> np.ndarray:
    return gemm_bf16_gen.pack_b(b, vl, PAIRS)


def packed_shape(batch: tuple[int, ...], k: int, n: int, vl: int) -> tuple[int, ...]:
    return gemm_bf16_gen.packed_shape(batch, k, n, vl, PAIRS)


def scratch_bytes(s: Shape) -> int:
    """A's pairs for every micro-tile of rows: M rounded up to 32 rows (gemm_bf16_gen's row
    length is whole 16-pair vectors already)."""
    return -(-s.m // ROWS) * ROWS * gemm_bf16_gen.row_words(s.k) * 4


def _mt_kernel(name: str, s: Shape, row_tiles: int, col_tiles: int) -> str:
    """C multiplying ``row_tiles`` x 16 rows of A's pairs by ``col_tiles`` x 16 columns of a
    panel over all of K into ``buf`` (rows of 64 floats): C tile 2r + c in tmm(2r + c), A's
    row tiles in tmm4-5, B's column tiles in tmm6-7, so each tile of A and of B loaded
    serves two products (one tile of each loaded per product served twice, where a 16-row
    x 64-column micro-tile loads five per four: measured 1.04-1.6x as fast)."""
    pairs = gemm_bf16_gen.padded_pairs(s.k, PAIRS)
    stride = gemm_bf16_gen.row_words(s.k)
    nr = s.nr
    lines = [f"static inline void {name}(const uint32_t *a, const uint32_t *b, float *buf) {{"]
    lines += [f"  _tile_zero({2 * r + c});" for r in range(row_tiles) for c in range(col_tiles)]
    lines.append(f"  for (int64_t p = 0; p < {pairs}; p += {PAIRS}) {{")
    for r in range(row_tiles):
        lines.append(f"    _tile_loadd({4 + r}, a + {r * TILE * stride} + p, {stride * 4});")
        for c in range(col_tiles):
            if r == 0:
                lines.append(f"    _tile_loadd({6 + c}, b + p * {nr} + {c * COLS}, {nr * 4});")
            lines.append(f"    _tile_dpbf16ps({2 * r + c}, {4 + r}, {6 + c});")
    lines.append("  }")
    lines += [f"  _tile_stored({2 * r + c}, buf + {r * TILE * nr + c * COLS}, {nr * 4});"
              for r in range(row_tiles) for c in range(col_tiles)]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _tile_kernel(name: str, s: Shape, width: int) -> str:
    """C multiplying ``rows`` (<= 32) rows of A's pairs by a panel's first ``width``
    columns over all of K into ``buf`` (32 rows x 64 floats): 32-column halves, each by
    the _mt_kernel of as many tiles as it has valid rows and columns."""
    lines = [f"static inline void {name}(const uint32_t *a, const uint32_t *b, float *buf, int64_t rows) {{"]
    for h in range(-(-width // HALF)):
        tiles = -(-min(HALF, width - h * HALF) // COLS)
        lines.append(f"  if (rows > {TILE}) x_mt_2x{tiles}(a, b + {h * HALF}, buf + {h * HALF}); "
                     f"else x_mt_1x{tiles}(a, b + {h * HALF}, buf + {h * HALF});")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _store_kernel(name: str, s: Shape, epi: Epilogue, width: int) -> str:
    """C storing the first ``rows`` rows and ``width`` columns of ``buf`` into C with the
    epilogue, one row at a time (gemm_gen.store_tile with one row)."""
    vl, n = s.vl, s.n
    nv = -(-width // vl)
    xs = [f"x{v}" for v in range(nv)]
    lines = [f"static inline void {name}(const float *restrict buf, float *restrict c0, const float *restrict bias, "
             "const float *restrict pre0, const float *restrict post0, int64_t rows) {",
             "  const int init = 1, final = 1;", "  (void)bias; (void)pre0; (void)post0;",
             "  for (int64_t r = 0; r < rows; r++) {",
             f"    float *c = c0 + r * {n};"]
    if epi.pre is not None:
        lines.append(f"    const float *pre = pre0 + r * {n};")
    if epi.post:
        lines.append(f"    const float *post = post0 + r * {n};")
    lines.append("    nn_v " + ", ".join(f"{x} = nn_vload(buf + r * {s.nr} + {v * vl})" for v, x in enumerate(xs)) + ";")
    lines += ["  " + line for line in store_tile(s, epi, width, [xs])]
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def _widths(s: Shape) -> list[int]:
    tail = s.n - (s.panels - 1) * s.nr
    return ([s.nr] if s.panels > 1 or tail == s.nr else []) + ([tail] if tail != s.nr else [])


def _amx_source(s: Shape, epi: Epilogue, fallback: str, name: str) -> str:
    """The tiles' micro-kernels, their grid and the entry point ``name``, which calls
    ``a_vdp`` (the vdpbf16ps GEMM in ``fallback``) where the tiles are refused."""
    pairs = gemm_bf16_gen.padded_pairs(s.k, PAIRS)
    stride = gemm_bf16_gen.row_words(s.k)
    blocks = -(-s.m // ROWS)
    tail = s.n - (s.panels - 1) * s.nr
    out = [amx.tile_config(CONFIG, [(TILE, COLS * 4)] * 4 + [(TILE, PAIRS * 4)] * 2 + [(PAIRS, COLS * 4)] * 2)]
    out += [_mt_kernel(f"x_mt_{r}x{c}", s, r, c) for r in (1, 2) for c in (1, 2)]
    for width in _widths(s):
        if f"static void {act_tile_name(1, width)}(" not in fallback:  # the fallback's may be the same one
            out.append(act_tile_source(s, epi, 1, width))
        out.append(_tile_kernel(f"x_tile_{width}", s, width))
        out.append(_store_kernel(f"x_store_{width}", s, epi, width))

    def call(width: int) -> str:
        return (f"x_tile_{width}(a, bp, buf, rows); x_store_{width}(buf, g->c + i * {s.n} + j, "
                f"{'g->bias + j' if epi.bias else '0'}, {f'g->pre + i * {s.n} + j' if epi.pre is not None else '0'}, "
                f"{f'g->post + i * {s.n} + j' if epi.post else '0'}, rows);")

    if tail != s.nr and s.panels > 1:
        body = f"if (q == {s.panels - 1}) {{ {call(tail)} }} else {{ {call(s.nr)} }}"
    else:
        body = call(tail)
    out.append("\n".join([
        "typedef struct { const uint32_t *ab, *b; const float *bias, *pre, *post; float *c; int64_t tm, tn; } x_job;",
        "static void x_block(const x_job *g, int64_t t0, int64_t t1, int64_t q0, int64_t q1) {",
        f"  float buf[{ROWS * s.nr}] __attribute__((aligned(64)));",
        "  for (int64_t q = q0; q < q1; q++) {",
        f"    const uint32_t *bp = g->b + q * {pairs * s.nr};",
        f"    int64_t j = q * {s.nr};",
        "    for (int64_t t = t0; t < t1; t++) {",
        f"      int64_t i = t * {ROWS}, rows = {s.m} - i < {ROWS} ? {s.m} - i : {ROWS};",
        f"      const uint32_t *a = g->ab + i * {stride};",
        f"      {body}",
        "    }", "  }", "}",
        "/* rectangles [lo, hi) of the (row tile x panel) grid, with this thread's tiles */",
        "static void x_task(void *ctx, int64_t lo, int64_t hi) {",
        "  const x_job *g = ctx;"] + amx.task_c(CONFIG, [
            "  for (int64_t w = lo; w < hi; w++) {",
            "    int64_t jn = w % g->tn, im = w / g->tn;",
            f"    int64_t q0 = {s.panels} * jn / g->tn, q1 = {s.panels} * (jn + 1) / g->tn;",
            f"    int64_t t0 = {blocks} * im / g->tm, t1 = {blocks} * (im + 1) / g->tm;",
            "    if (q0 < q1 && t0 < t1) x_block(g, t0, t1, q0, q1);",
            "  }"]) + [
        "}",
        f"static void {name}(const float *A, const float *Bp, const float *bias, const float *pre, "
        "const float *post, float *C, char *scratch) {",
        f"  if (!{amx.PERMITTED}) {{ a_vdp(A, Bp, bias, pre, post, C, scratch); return; }}",
        "  /* A's rows in bfloat16 pairs (the vdpbf16ps GEMM's conversion), then the padding rows zero */",
        "  h_job h = {.a = A, .ab = (uint32_t *)scratch};",
        f"  nn_parallel({s.m}, {s.m * s.k}, h_convert, &h);",
        f"  memset(scratch + (size_t){s.m * stride * 4}, 0, (size_t){(blocks * ROWS - s.m) * stride * 4});",
        f"  int64_t n = nn_thread_count(), shares = n > 1 ? {SHARES} * n : 1, tm = 1, tn = 1, best = -1;",
        "  for (int64_t cn = 1; cn <= shares; cn++) {",
        f"    int64_t cm = shares / cn; if (cm > {blocks}) cm = {blocks};",
        f"    int64_t cost = ({s.panels} + cn - 1) / cn * (({blocks} + cm - 1) / cm);",
        f"    if (cn <= {s.panels} && (best < 0 || cost < best)) {{ best = cost; tm = cm; tn = cn; }}",
        "  }",
        "  x_job g = {(const uint32_t *)scratch, (const uint32_t *)Bp, bias, pre, post, C, tm, tn};",
        f"  nn_parallel(tm * tn, {s.m * s.n * s.k}, x_task, &g);",
        "}"]) + "\n")
    return "".join(out)


def source(s: Shape, epi: Epilogue, name: str) -> str:
    """File-scope C defining ``void name(A, Bp, bias, pre, post, C, scratch)`` for one
    product by B packed with ``pack_b``; ``scratch`` holds scratch_bytes(s), 64-byte
    aligned. Products of fewer than AMX_MIN_ROWS rows are the vdpbf16ps GEMM alone."""
    pairs = gemm_bf16_gen.padded_pairs(s.k, PAIRS)
    if s.m < AMX_MIN_ROWS:
        return gemm_bf16_gen.source(s, epi, name, panel_pairs=pairs)
    fallback = gemm_bf16_gen.source(s, epi, "a_vdp", panel_pairs=pairs)
    head = "#ifndef __AMX_BF16__\n#error \"AMX GEMM built without AMX-BF16\"\n#endif\n"
    return fallback + head + _amx_source(s, epi, fallback, name)


class AmxPacking:
    """gemm_gen's emitters' arithmetic on AMX tiles: the codegen's writer holds AMX when the
    compile's precision is bf16 and the target has amx_tile and amx_bf16. The arithmetic
    (and its bound) is gemm_bf16_gen.BF16's; B's panels are padded to 16 pairs."""

    name = "bf16amx"

    def form(self, vl: int) -> str:
        return f"gemm{vl}bf16amx"  # in the packed constant's name: the layout it holds

    def pack(self, b: np.ndarray, vl: int) -> np.ndarray:
        return pack_b(b, vl)

    def shape(self, batch: tuple[int, ...], k: int, n: int, vl: int) -> tuple[int, ...]:
        return packed_shape(batch, k, n, vl)

    def support(self, s: Shape, epi: Epilogue, entry: str) -> str:
        return graph_query.source("simd.h") + "\n" + source(s, epi, entry)

    def scratch(self, s: Shape) -> int:
        return scratch_bytes(s)


AMX = AmxPacking()
