"""nncc's own GEMM for a product by a constant matrix (weights): C code generated per layer.

``C = act(A·B + bias + beta·P) + R`` where B is known at compile time and packed then into
the micro-kernel's layout: panels of NR columns (NR = NV vectors), each K rows deep and
contiguous, the last one zero-padded; the transposition of B and Gemm's alpha are folded
into the packing, a bias into a padded row. A is read in place through two literal strides
(row-major with any row length, or transposed), so nothing is copied at run time. P is
Gemm's C as a full matrix, R a residual connection (the Add after the product), both added
in the micro-kernel's store with the bias and the activation: C is written once.

The micro-kernel keeps MR x NV vectors of C in registers (24 of the 32 AVX-512 registers,
12 of the 16 AVX2 ones) and walks K with one broadcast of A and NV loads of B per step.
Every size is a literal in the generated code. The loops around it: K in blocks when it is
long and M is not tiny (a block of A rows stays in L2 while the panels of B stream past
it), then blocks of MC rows, panels, and slivers of MR rows. The (row sliver x panel) grid
is cut into a few rectangles per thread, chosen at run time for the pool's size, which the
threads claim one after another as they come free (nn_parallel's chunks, one rectangle each).
One or two rows (a decoder's next token) use a kernel that splits K over several
accumulators instead: that product is a pass over the packed B, bound by memory.

Nothing is touched outside A's rows, the packed B and bias, and C, P, R's [M, N]: a partial
vector at the end of a row is stored (and P, R loaded) through a small buffer, copying only
its valid floats (the same code under AddressSanitizer, which checks that copy exactly).
The code uses only nncc/native/simd.h's operations, no ISA intrinsics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nncc.native import graph_query
from nncc.native.activations import VECTOR_CODES
from nncc.native.c_literal import c_float
from nncc.native.kernel import SCRATCH

# (MR, NV) per vector width: the accumulator tile. Measured on Zen 4 (benchmarks/bench_gemm.py,
# one thread): 6 x 64 beat 12 x 32, 8 x 32, 8 x 48 and 14 x 32 on the layers with K >= 1024
# (rows of A a multiple of 4 KB apart share L1 sets, so fewer rows at once) and matched
# them elsewhere; at M in {1, 64, 128, 512} and K, N in {512, 768, 1024, 2048, 3072} it ran
# at 1.1-1.9x numpy's matmul and faster than the BLAS path it replaced at every shape, so
# OpenBLAS is kept only for products whose B is computed at run time.
TILES = {16: (6, 4), 8: (6, 2), 4: (6, 2)}
# rectangles of the grid per thread, claimed as threads come free (the pool's chunks, as
# many per thread: one rectangle each): on a machine shared with other work a thread the OS
# holds back leaves its part to the others instead of making the whole product wait for it;
# more would cut the panels of B into more pieces each thread reads
SHARES = 4
# K steps ahead that each step of a micro-kernel prefetches the panel's next rows (a
# panel row is NR floats): the hardware's streamer stops at every 4 KB page of B and
# restarts only after misses, which a first run from L3 (the caller's own work between
# runs took L2) pays at each page; in L1 the prefetch takes a load slot the FMAs leave idle
PREFETCH_STEPS = 16
KC_MAX = 384  # K per block when K is long: MR rows of A (9 KB) stay in L1 while a block runs
L2_ROWS_BYTES = 384 * 1024  # the rows of A a thread keeps in L2 per K block (MC)

VECTOR_ACTS = VECTOR_CODES  # applied to the accumulators in the micro-kernel (nn_vact)
# applied to the stored tile after the store (act_tile_source), each by simd.h's function of
# a vector where there is one: the scalar forms' selects and clamps, vectorized by the
# compiler, cost 1.3x (SiLU) to 2.7x (GELU's tanh form) as many cycles
SCALAR_ACTS = {
    "Sigmoid": "nn_sigmoid(v)",
    "Tanh": "nn_tanh(v)",
    "Silu": "(v * nn_sigmoid(v))",
    "Mish": "(v * nn_tanh(v > 20.0f ? v : log1pf(nn_exp(v))))",
    "Gelu": "nn_gelu_erf(v)",
    "GeluTanh": "(0.5f * v * (1.0f + nn_tanh(0.797884561f * (v + 0.044715f * v * v * v))))",
}
TILE_VECTOR_ACTS = {"Sigmoid": "nn_vsigmoid", "Silu": "nn_vsilu", "Mish": "nn_vmish", "Gelu": "nn_vgelu_erf",
                    "GeluTanh": "nn_vgelu_tanh"}


def act_tile_name(rows: int, width: int) -> str:
    return f"g_act_{rows}x{width}"


def act_tile_source(s: Shape, epi: Epilogue, rows: int, width: int) -> str:
    """C of ``void g_act_RxW(c, post)``: a SCALAR_ACTS activation over a stored tile of rows x
    width floats (plus the residual's tile, when the epilogue has one), the tile's store calls
    it once. Out of line: inlined into the micro-kernel, the activation's constants took the
    accumulators' registers, or its loop was not vectorized at all (llama's SiLU cost more
    than its GEMM); and once per tile with literal sizes, not per row, because a row of the
    AVX2 tile is only two vectors. Empty when the epilogue has none."""
    if epi.act not in SCALAR_ACTS:
        return ""
    head = (f"__attribute__((noinline)) static void {act_tile_name(rows, width)}(float *restrict c, "
            f"const float *restrict post) {{\n  (void)post;\n")
    vector = TILE_VECTOR_ACTS.get(epi.act)
    if vector is None:
        tail = f" + post[r * {s.n} + j]" if epi.post else ""
        return (head + f"  for (int r = 0; r < {rows}; r++) for (int j = 0; j < {width}; j++) {{ "
                f"float v = c[r * {s.n} + j]; c[r * {s.n} + j] = {SCALAR_ACTS[epi.act]}{tail}; }}\n}}\n")
    full, lanes = width // s.vl * s.vl, width % s.vl
    lines = [head, f"  for (int r = 0; r < {rows}; r++) {{\n    float *cr = c + r * {s.n};\n"]
    if epi.post:
        lines.append(f"    const float *pr = post + r * {s.n};\n")
    if full:
        add = " + nn_vload(pr + j)" if epi.post else ""
        lines.append(f"    for (int j = 0; j < {full}; j += {s.vl}) nn_vstore(cr + j, {vector}(nn_vload(cr + j)){add});\n")
    if lanes:  # the tile's last, partial vector: never read or written past its lanes
        add = f" + g_loadn(pr + {full}, {lanes})" if epi.post else ""
        lines.append(f"    g_storen(cr + {full}, {vector}(g_loadn(cr + {full}, {lanes})){add}, {lanes});\n")
    return "".join(lines) + "  }\n}\n"


@dataclass(frozen=True)
class Epilogue:
    act: str = ""  # a VECTOR_ACTS or SCALAR_ACTS name
    p0: float = 0.0
    p1: float = 0.0
    bias: bool = False  # a packed, padded row of N added to every row
    pre: float | None = None  # scale of an [M, N] matrix added before the activation
    post: bool = False  # an [M, N] matrix added after the activation


def activation(attrs) -> tuple[str, float, float] | None:
    """(name, p0, p1) of a fused node's activation attributes, or None if not handled here."""
    act = attrs.get("activation", "") or ""
    if act == "Gelu":
        approx = attrs.get("activation_approximate", "none")
        return ({"none": "Gelu", "tanh": "GeluTanh"}.get(approx), 0.0, 0.0) if approx in ("none", "tanh") else None
    if act == "Clip":
        return act, float(attrs.get("activation_min", -np.inf)), float(attrs.get("activation_max", np.inf))
    if act == "LeakyRelu":
        return act, float(attrs.get("activation_alpha", 0.01)), 0.0
    if act == "HardSigmoid":
        return act, float(attrs.get("activation_alpha", 0.2)), float(attrs.get("activation_beta", 0.5))
    if act in VECTOR_ACTS or act in SCALAR_ACTS:
        return act, 0.0, 0.0
    return None


@dataclass(frozen=True)
class Shape:
    """One product's sizes and how A is read: element (i, p) at ``A[i * sai + p * sak]``."""

    m: int
    n: int
    k: int
    sai: int
    sak: int
    vl: int

    @property
    def mr(self) -> int:
        return TILES[self.vl][0]

    @property
    def nr(self) -> int:
        return TILES[self.vl][1] * self.vl

    @property
    def panels(self) -> int:
        return -(-self.n // self.nr)


def pack_b(b: np.ndarray, vl: int) -> np.ndarray:
    """``b`` as [..., K, N] (already transposed and scaled) into panels: [..., NP, K, NR]."""
    nr = TILES[vl][1] * vl
    *batch, k, n = b.shape
    panels = -(-n // nr)
    padded = np.zeros((*batch, k, panels * nr), np.float32)
    padded[..., :n] = b
    out = padded.reshape(*batch, k, panels, nr)
    return np.ascontiguousarray(np.moveaxis(out, -2, -3))


def pack_row(row: np.ndarray, n: int, vl: int) -> np.ndarray:
    """A bias (anything that broadcasts to [N]) as N floats, zero-padded to whole panels."""
    nr = TILES[vl][1] * vl
    out = np.zeros(-(-n // nr) * nr, np.float32)
    out[:n] = np.broadcast_to(np.asarray(row, np.float32).reshape(-1), (n,))
    return out


# the C of a partial vector's load and store, which the store of every GEMM tile uses
PARTIAL_VECTOR_C = """
/* the first n floats of a vector: through a small buffer (n is a literal, so this is a few
 * moves), never touching memory past them; AddressSanitizer checks the copy exactly */
static inline nn_v g_loadn(const float *p, int n) {
    float t[NN_VL] = {0};
    memcpy(t, p, (size_t)n * sizeof(float));
    return nn_vload(t);
}
static inline void g_storen(float *p, nn_v v, int n) {
    float t[NN_VL];
    nn_vstore(t, v);
    memcpy(p, t, (size_t)n * sizeof(float));
}
"""


def _micro_kernel(name: str, s: Shape, epi: Epilogue, rows: int, width: int) -> str:
    """C for a tile of ``rows`` x ``width`` (<= NR) columns of C over one block of K."""
    vl, nr = s.vl, s.nr
    nv = -(-width // vl)
    acc, out = kernel_head(name, "float", rows, nv)

    def step(q: int, p: str) -> list[str]:
        lines = [f"    {{ const float *bp = b + ({p}) * {nr};"]
        lines += [f"      nn_v b{v} = nn_vload(bp + {v * vl});" for v in range(nv)]
        lines += [f"      __builtin_prefetch(bp + {PREFETCH_STEPS * nr + line * 16}, 0, 3);" for line in range(max(1, nr // 16))]
        for r in range(rows):
            lines.append(f"      nn_v a{r} = nn_vset1(a[{r * s.sai} + ({p}) * {s.sak}]);")
            lines += [f"      {acc[q][r][v]} = nn_vfma(a{r}, b{v}, {acc[q][r][v]});" for v in range(nv)]
        lines.append("    }")
        return lines

    out += k_loop(step, acc)
    out += store_tile(s, epi, width, acc[0])
    out.append("}")
    return "\n".join(out) + "\n"


def kernel_head(name: str, operand: str, rows: int, nv: int,
                b_operand: str | None = None) -> tuple[list[list[list[str]]], list[str]]:
    """A micro-kernel's signature (A of C type ``operand``, B of ``b_operand``, else the
    same) and its zeroed sums: (the sums' names [set][row][vector], the C lines). One or two
    rows keep 4 or 2 sets of sums over K, so enough products are in flight."""
    split = {1: 4, 2: 2}.get(rows, 1)
    acc = [[[f"c{q}_{r}_{v}" for v in range(nv)] for r in range(rows)] for q in range(split)]
    out = [f"static inline __attribute__((always_inline)) void {name}(const {operand} *restrict a, "
           f"const {b_operand or operand} *restrict b, float *restrict c, const float *restrict bias, const float *restrict pre, "
           "const float *restrict post, int64_t kc, int init, int final) {"]
    out.append("  nn_v " + ", ".join(f"{x} = nn_vzero()" for q in acc for r in q for x in r) + ";")
    return acc, out


def k_loop(step, acc: list[list[list[str]]]) -> list[str]:
    """The walk over K around a micro-kernel's ``step(q, p)`` (the C of one K step into
    the sums ``acc[q]``): one step per set of sums at a time, so the products of one step
    need not wait for the last, then the rest one at a time, then the sets added into the
    first. Shared by the float32 and the bfloat16 kernels."""
    split = len(acc)
    out = ["  int64_t p = 0;"]
    if split > 1:
        out.append(f"  for (; p + {split} <= kc; p += {split}) {{")
        for q in range(split):
            out += step(q, f"p + {q}")
        out.append("  }")
    out.append("  for (; p < kc; p++) {")
    out += step(0, "p")
    out.append("  }")
    for q in range(1, split):
        for r, row in enumerate(acc[q]):
            for v, x in enumerate(row):
                out.append(f"  {acc[0][r][v]} = nn_vadd({acc[0][r][v]}, {x});")
    return out


def store_tile(s: Shape, epi: Epilogue, width: int, acc: list[list[str]]) -> list[str]:
    """C storing a tile's sums (``acc[r][v]``: row r, vector v) into ``c``: added to what
    earlier K blocks stored unless ``init``, and, when ``final``, the bias, Gemm's C
    (``pre``), the activation and the residual (``post``). Any micro-kernel whose sums are
    nn_v vectors of float32 ends with it."""
    vl = s.vl
    rows, nv = len(acc), len(acc[0])
    lanes = width - (nv - 1) * vl  # of the last vector
    out = []
    scalar_act = SCALAR_ACTS.get(epi.act)
    code = VECTOR_ACTS.get(epi.act, 0)
    for r in range(rows):
        out.append("  {")
        out.append(f"    float *cr = c + {r * s.n};")

        def load(base: str, v: int) -> str:
            at = f"{base} + {r * s.n + v * vl}"
            return f"nn_vload({at})" if v < nv - 1 or lanes == vl else f"g_loadn({at}, {lanes})"

        xs = [acc[r][v] for v in range(nv)]
        out.append("    if (!init) { " + " ".join(f"{x} = nn_vadd({x}, {load('c', v)});" for v, x in enumerate(xs)) + " }")
        final = []
        if epi.bias:
            final += [f"{x} = nn_vadd({x}, nn_vload(bias + {v * vl}));" for v, x in enumerate(xs)]
        if epi.pre is not None:
            final += [f"{x} = nn_vfma({load('pre', v)}, nn_vset1({c_float(epi.pre)}), {x});" for v, x in enumerate(xs)]
        if code:
            final += [f"{x} = nn_vact({code}, {x}, {c_float(epi.p0)}, {c_float(epi.p1)});" for v, x in enumerate(xs)]
        if epi.post and scalar_act is None:
            final += [f"{x} = nn_vadd({x}, {load('post', v)});" for v, x in enumerate(xs)]
        if final:
            out.append("    if (final) { " + " ".join(final) + " }")
        for v, x in enumerate(xs):
            if v < nv - 1 or lanes == vl:
                out.append(f"    nn_vstore(cr + {v * vl}, {x});")
            else:
                out.append(f"    g_storen(cr + {v * vl}, {x}, {lanes});")
        out.append("  }")
    if scalar_act is not None:
        out.append(f"  if (final) {act_tile_name(rows, width)}(c, {'post' if epi.post else 'NULL'});")
    return out


def blocking(s: Shape) -> tuple[int, int]:
    """(KC, MC): K per block and rows per block of A (float32 rows, whatever B holds)."""
    kc = s.k
    if s.k > KC_MAX and s.m > s.mr:
        blocks = -(-s.k // KC_MAX)
        kc = -(-s.k // blocks)
    mc = max(s.mr, L2_ROWS_BYTES // (kc * 4) // s.mr * s.mr)
    return kc, mc


def source(s: Shape, epi: Epilogue, name: str) -> str:
    """File-scope C defining ``void name(A, Bp, bias, pre, post, C)`` for one product; the
    pointers the epilogue does not use may be null."""
    kc, mc = blocking(s)
    kernels, driver = grid_source(
        s, epi, name, "g", lambda kernel, rows, width: _micro_kernel(kernel, s, epi, rows, width),
        s.k, kc, mc,
        b_line=f"const float *bp = g->b + q * {s.k * s.nr} + k0 * {s.nr};",
        a_line=f"const float *a = g->a + i * {s.sai} + k0 * {s.sak};",
        lead=["typedef struct { const float *a, *b, *bias, *pre, *post; float *c; int64_t tm, tn; } g_job;"],
        scratch_param="", calls=["g_job g = {A, Bp, bias, pre, post, C, tm, tn};",
                                 f"nn_parallel(tm * tn, {s.m * s.n * s.k}, g_task, &g);"])
    return f"NN_REQUIRE_VL({s.vl});\n" + "".join([PARTIAL_VECTOR_C] + kernels + [driver])


def grid_source(s: Shape, epi: Epilogue, name: str, prefix: str, micro_kernel, k_extent: int, kc: int, mc: int,
                b_line: str, a_line: str, lead: list[str], scratch_param: str,
                calls: list[str]) -> tuple[list[str], str]:
    """What the float32 and bfloat16 GEMMs share: (one micro-kernel per (rows, width) tile the
    product needs, from ``micro_kernel(name, rows, width)``; the C around them). Around them:
    K in blocks of ``kc`` (of ``k_extent``: floats, or bfloat16 pairs), blocks of ``mc`` rows,
    panels and slivers of one thread's rectangle (``b_line`` and ``a_line`` point ``bp`` and
    ``a`` at the block's operands), the task over the pool, and the entry point, which
    splits the grid and runs ``calls`` (``scratch_param``: its parameters after C). ``lead``:
    C lines before the rest (the job's type, when not declared earlier). The job type ends
    with ``int64_t tm, tn``: the split."""
    mr, nr, n = s.mr, s.nr, s.n
    blocks = -(-s.m // mr)  # row slivers
    tail_cols = n - (s.panels - 1) * nr
    tail_rows = s.m % mr
    kernels = []
    variants = {}  # (rows, width) -> kernel name
    for rows in ([mr] if s.m >= mr else []) + ([tail_rows] if tail_rows else []):
        for width in ([nr] if s.panels > 1 or tail_cols == nr else []) + ([tail_cols] if tail_cols != nr else []):
            variants[(rows, width)] = f"{prefix}_tile_{rows}x{width}"
            kernels.append(act_tile_source(s, epi, rows, width))  # what its store calls
            kernels.append(micro_kernel(variants[(rows, width)], rows, width))

    def call(rows: int, width: int) -> str:
        return (f"{variants[(rows, width)]}(a, bp, cp, {'bias + j' if epi.bias else '0'}, "
                f"{'pre + i * ' + str(n) + ' + j' if epi.pre is not None else '0'}, "
                f"{'post + i * ' + str(n) + ' + j' if epi.post else '0'}, kc, init, final);")

    def by_rows(width: int) -> str:
        if (mr, width) in variants and (tail_rows, width) in variants:
            return f"if (i + {mr} <= i1) {call(mr, width)} else {call(tail_rows, width)}"
        return call(mr if (mr, width) in variants else tail_rows, width)

    body = lead + [
        f"static void {prefix}_block(const {prefix}_job *g, int64_t r0, int64_t r1, int64_t q0, int64_t q1) {{",
        "  const float *bias = g->bias, *pre = g->pre, *post = g->post;",
        f"  for (int64_t k0 = 0; k0 < {k_extent}; k0 += {kc}) {{",
        f"    int64_t kc = {k_extent} - k0 < {kc} ? {k_extent} - k0 : {kc};",
        f"    int init = k0 == 0, final = k0 + kc == {k_extent};",
        f"    for (int64_t i0 = r0; i0 < r1; i0 += {mc}) {{",
        f"      int64_t i1 = i0 + {mc} < r1 ? i0 + {mc} : r1;",
        "      for (int64_t q = q0; q < q1; q++) {",
        f"        {b_line}",
        f"        int64_t j = q * {nr};",
        f"        for (int64_t i = i0; i < i1; i += {mr}) {{",
        f"          {a_line}",
        f"          float *cp = g->c + i * {n} + j;",
    ]
    if tail_cols != nr and s.panels > 1:
        body.append(f"          if (q == {s.panels - 1}) {{ {by_rows(tail_cols)} }}")
        body.append(f"          else {{ {by_rows(nr)} }}")
    else:
        body.append("          " + by_rows(tail_cols))
    body += [
        "        }", "      }", "    }", "  }", "}",
        "/* rectangles [lo, hi) of the grid, as the pool's threads claim them */",
        f"static void {prefix}_task(void *ctx, int64_t lo, int64_t hi) {{",
        f"  {prefix}_job *g = ctx;",
        "  for (int64_t w = lo; w < hi; w++) {",
        "    int64_t jn = w % g->tn, im = w / g->tn;",
        f"    int64_t q0 = {s.panels} * jn / g->tn, q1 = {s.panels} * (jn + 1) / g->tn;",
        f"    int64_t r0 = {blocks} * im / g->tm * {mr}, r1 = {blocks} * (im + 1) / g->tm * {mr};",
        f"    if (r1 > {s.m}) r1 = {s.m};",
        f"    if (q0 < q1 && r0 < r1) {prefix}_block(g, r0, r1, q0, q1);",
        "  }",
        "}",
        f"static void {name}(const float *A, const float *Bp, const float *bias, const float *pre, "
        f"const float *post, float *C{scratch_param}) {{",
        "  /* the (row sliver x panel) grid in tm x tn rectangles, SHARES per thread of the pool,",
        "   * the split with the smallest rectangle */",
        f"  int64_t t = nn_thread_count(), shares = t > 1 ? {SHARES} * t : 1, tm = 1, tn = 1, best = -1;",
        "  for (int64_t cn = 1; cn <= shares; cn++) {",
        f"    int64_t cm = shares / cn; if (cm > {blocks}) cm = {blocks};",
        f"    int64_t cost = ({s.panels} + cn - 1) / cn * (({blocks} + cm - 1) / cm);",
        f"    if (cn <= {s.panels} && (best < 0 || cost < best)) {{ best = cost; tm = cm; tn = cn; }}",
        "  }",
    ] + [f"  {line}" for line in calls] + ["}"]
    return kernels, "\n".join(body) + "\n"


# -- the steps of the native code generator (nncc/native/codegen.py) -------------------------

ENTRY = "g_gemm"


class F32Packing:
    """What the emitters below ask of the arithmetic they generate: the packed B's layout
    (named in the packed constant's name), its packing and shape, the step's C and its
    scratch. This one is float32; nncc/native/gemm_bf16_gen.py has the bfloat16 ones."""

    name = "f32"

    def form(self, vl: int) -> str:
        return f"gemm{vl}"

    def pack(self, b: np.ndarray, vl: int) -> np.ndarray:
        return pack_b(b, vl)

    def shape(self, batch: tuple[int, ...], k: int, n: int, vl: int) -> tuple[int, ...]:
        nr = TILES[vl][1] * vl
        return (*batch, -(-n // nr), k, nr)

    def support(self, s: Shape, epi: Epilogue, entry: str) -> str:
        return graph_query.source("simd.h") + "\n" + source(s, epi, entry)

    def scratch(self, s: Shape) -> int:
        return 0


F32 = F32Packing()


def _packed(w, b: str, form: str, matrix: np.ndarray, packing, batch: tuple[int, ...], k: int, n: int) -> str:
    """The packed constant of B for ``packing``, checked to hold the layout its kernel
    reads: a constant packed for other arithmetic never reaches this code."""
    name = w.pack(b, form, packing.pack(matrix, w.vl))  # the form (so the name) says the layout
    if tuple(w.shape(name)) != packing.shape(batch, k, n, w.vl):
        raise AssertionError(f"packed {name!r} is not in the {packing.name} GEMM's layout")
    return name


def _entry_args(packing, s: Shape) -> tuple[str, int]:
    """The scratch argument the entry point takes after C, and the bytes it needs."""
    scratch = packing.scratch(s)
    return (f", {SCRATCH}" if scratch else ""), scratch


def _residual(w, node, out: str):
    """(Add, its other operand) when ``out`` is read only by an Add of the same shape whose
    other operand is computed before ``node``: the product's store adds it (a residual
    connection), and the Add is not emitted."""
    add = w.only_consumer(out)
    if add is None or not graph_query.is_pair_sum(add) or len(add.inputs) != 2 or add.inputs[0] == add.inputs[1]:
        return None
    other = add.inputs[1] if add.inputs[0] == out else add.inputs[0]
    if not other or other in w.deferred or w.shape(other) != w.shape(out) or w.shape(add.outputs[0]) != w.shape(out):
        return None
    here = next(i for i, n in enumerate(w.nodes) if n is node)
    if any(other in n.outputs for n in w.nodes[here:]):
        return None
    return add, other


def _with_residual(w, node, out: str):
    found = _residual(w, node, out)
    if found is None:
        return out, None
    add, other = found
    w.absorbed.add(id(add))
    w.as_plain(other)  # the residual is read row-major, whatever layout it was made in
    return add.outputs[0], other


def emit_matmul(w, node) -> bool:
    """MatMul / FusedMatMul by a constant B as a packed GEMM step; False: not handled here.
    The writer's ``packing`` says the arithmetic (F32, or gemm_bf16_gen's BF16 or BF16W)."""
    packing = getattr(w, "packing", F32)
    a, b = node.inputs[:2]
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    b_value = graph_query.const_value(w.graph, w.infos, b)
    act = activation(node.attrs)
    bias_value = graph_query.const_value(w.graph, w.infos, bias) if bias else None
    if b_value is None or act is None or (bias and bias_value is None):
        return False
    sa, sb, so = w.shape(a), w.shape(b), w.shape(node.outputs[0])
    m, k, n = sa[-2], sa[-1], sb[-1]
    if 0 in (m, k, n) or 0 in so:
        return False
    matrix = np.asarray(b_value, np.float32).reshape(-1, k, n)
    bp = _packed(w, b, packing.form(w.vl), matrix, packing, matrix.shape[:1], k, n)
    b_size = math.prod(w.shape(bp)[1:])
    bias_name = w.pack(bias, f"row{n}/{w.vl}", pack_row(bias_value, n, w.vl)) if bias else None
    target, other = _with_residual(w, node, node.outputs[0])
    epi = Epilogue(*act, bias=bias is not None, post=other is not None)
    y = w.ptr(target)
    s = Shape(math.prod(so[:-1]), n, k, k, 1, w.vl) if len(sb) == 2 else Shape(m, n, k, k, 1, w.vl)
    scratch_arg, scratch = _entry_args(packing, s)
    args = lambda oa, ob, oc: (f"{ENTRY}({w.ptr(a)}{oa}, {w.ptr(bp)}{ob}, {w.ptr(bias_name) if bias else '0'}, 0, "  # noqa: E731
                               f"{w.ptr(other) + oc if other else '0'}, {y}{oc}{scratch_arg});")
    if len(sb) == 2:  # weights: the batch of A folds into M
        code = args("", "", "")
    else:
        batch = so[:-2]
        ea = graph_query.batch_strides(sa[:-2], batch, m * k)
        eb = graph_query.batch_strides(sb[:-2], batch, b_size)
        lines = [f"for (int64_t t = 0; t < {math.prod(batch)}; t++) {{", "  int64_t rem = t, oa = 0, ob = 0;"]
        for d in range(len(batch) - 1, -1, -1):
            lines.append(f"  {{ int64_t i = rem % {batch[d]}; rem /= {batch[d]}; oa += i * {ea[d]}; ob += i * {eb[d]}; }}")
        lines += ["  " + args(" + oa", " + ob", f" + t * {m * n}"), "}"]
        code = "\n".join(lines)
    w.step(code, [a, bp, bias_name, other], [target], scratch, support=packing.support(s, epi, ENTRY))
    return True


def emit_gemm(w, node) -> bool:
    """Gemm / FusedGemm by a constant B as a packed GEMM step; False: not handled here.
    The writer's ``packing`` says the arithmetic (F32, or gemm_bf16_gen's BF16 or BF16W)."""
    packing = getattr(w, "packing", F32)
    a, b = node.inputs[:2]
    c = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    at = node.attrs
    ta, tb = int(at.get("transA", 0)), int(at.get("transB", 0))
    alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
    b_value = graph_query.const_value(w.graph, w.infos, b)
    act = activation(at)
    if b_value is None or act is None:
        return False
    sa, sb = w.shape(a), w.shape(b)
    m, k = (sa[1], sa[0]) if ta else (sa[0], sa[1])
    n = sb[0] if tb else sb[1]
    if 0 in (m, k, n):
        return False
    matrix = np.asarray(b_value, np.float32)
    matrix = matrix.T if tb else matrix
    if alpha != 1.0:
        matrix = matrix * np.float32(alpha)
    form = packing.form(w.vl) + ("T" if tb else "") + (f"*{alpha!r}" if alpha != 1.0 else "")
    bp = _packed(w, b, form, matrix, packing, (), k, n)
    bias_name = pre_name = None
    pre = None
    if c and beta != 0.0:
        c_value = graph_query.const_value(w.graph, w.infos, c)
        cm, cn = ([1, 1] + list(w.shape(c)))[-2:]
        if c_value is not None and cm == 1:  # one row for all: a bias, scaled now
            row = np.asarray(c_value, np.float32).reshape(-1) * np.float32(beta)
            bias_name = w.pack(c, f"row{n}/{w.vl}*{beta!r}", pack_row(row, n, w.vl))
        elif (cm, cn) == (m, n):
            pre_name, pre = c, beta
        elif c_value is not None:  # a column for all: spelled out as the matrix
            full = np.broadcast_to(np.asarray(c_value, np.float32).reshape(cm, cn), (m, n))
            pre_name, pre = w.pack(c, f"full{m}x{n}", full), beta
        else:
            return False
    target, other = _with_residual(w, node, node.outputs[0])
    epi = Epilogue(*act, bias=bias_name is not None, pre=pre, post=other is not None)
    s = Shape(m, n, k, 1 if ta else k, m if ta else 1, w.vl)
    scratch_arg, scratch = _entry_args(packing, s)
    code = (f"{ENTRY}({w.ptr(a)}, {w.ptr(bp)}, {w.ptr(bias_name) if bias_name else '0'}, "
            f"{w.ptr(pre_name) if pre_name else '0'}, {w.ptr(other) if other else '0'}, {w.ptr(target)}"
            f"{scratch_arg});")
    w.step(code, [a, bp, bias_name, pre_name, other], [target], scratch, support=packing.support(s, epi, ENTRY))
    return True


def takes(node, graph, infos) -> bool:
    """Whether emit_matmul / emit_gemm generate ``node`` (for activations only they apply)."""
    if activation(node.attrs) is None or graph_query.const_value(graph, infos, node.inputs[1]) is None:
        return False
    shapes = [infos[name].shape for name in node.inputs[:2] + node.outputs[:1]]
    if any(0 in shape for shape in shapes):
        return False
    extra = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    if extra is None or graph_query.const_value(graph, infos, extra) is not None:
        return True
    if (node.domain, node.op_type) in graph_query.MATMUL_OPS or float(node.attrs.get("beta", 1.0)) == 0.0:
        return False if (node.domain, node.op_type) in graph_query.MATMUL_OPS else True
    return tuple(infos[extra].shape) == tuple(infos[node.outputs[0]].shape)
