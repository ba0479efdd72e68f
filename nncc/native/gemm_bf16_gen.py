"""The packed GEMM of nncc/native/gemm_gen.py in bfloat16 (``precision="bf16"``): for CPUs
with AVX-512 BF16 the products by constant weights take half the instructions and half
the weight bytes, at bfloat16's accuracy; elsewhere the weights alone are bfloat16.

B is rounded to bfloat16 at compile time (to nearest, ties to even) and packed in the
layout ``vdpbf16ps`` multiplies: panels of NR columns as in the float32 GEMM, but each
32-bit lane holds a pair of consecutive rows of K (row 2p in the low half, 2p + 1 in the
high half), K padded with a zero row when odd. At run time the step first rounds A the
same way into its scratch, one row of K/2 pairs per row of A (A read through its two
strides, so a transposed A costs nothing more). The micro-kernel broadcasts one pair of A
per row and multiplies it with NV vectors of pairs of B, each ``vdpbf16ps`` adding two
exact products per lane to the float32 sums. The sums, the epilogue (bias, Gemm's C,
activation, residual), the blocking and the threading are the float32 GEMM's.

Each product thus sees its inputs rounded to 8 significant bits (each off by at most 2^-8
of itself, so the product by about 2^-7) and sums in float32: per output element the error
is at most about 2^-7 * sum_k |a_ik * b_kj| (docs/native.md gives the exact bound, which
tests/test_native_bf16.py and the native fuzzer check).

Where the CPU lacks AVX-512 BF16 (``BF16W``, nncc/native/precision.py) only the weights are
bfloat16: B is rounded at compile time and packed as the float32 GEMM's panels, but two
columns to a 32-bit word (column j of each pair of vectors in the low half, j + VL in the
high half), so the micro-kernel streams half the bytes. It widens them in registers, one
load, one shift and one mask per two vectors of B, and multiplies float32 A by them with
the float32 GEMM's FMAs, sums and epilogue. Only B's rounding is an error: at most
2^-8 * sum_k |a_ik * b_kj| plus float32 sums (docs/native.md).
"""

from __future__ import annotations

import numpy as np

from nncc.native import graph_query
from nncc.native.gemm_gen import (PARTIAL_VECTOR_C, TILES, Epilogue, Shape, blocking, grid_source, k_loop,
                                   kernel_head, store_tile)

# Rows per micro-tile: 6 x 4 vectors keep 24 sums in registers, B's 4 vectors beside them
# and A's pair as the instruction's broadcast operand. NV (so NR, and the bias row's
# padding) is the float32 GEMM's. Measured on Zen 4 (benchmarks/bench_gemm.py, one thread,
# M in {64, 128, 512}, K, N in {512, 2048}): 6 rows ran at 200-225 GFLOP/s, 4 and 7 rows
# up to 10% slower, 8 rows (32 sums: spills) 25-30% slower; K blocks of 512 pairs matched
# or beat 256, 384, 768 and 1024.
MR = 6
KC_MAX = 512  # pairs of K per block when K is long: MR rows of A pairs (12 KB) stay in L1
L2_ROWS_BYTES = 384 * 1024  # the rows of A pairs a thread keeps in L2 per K block (MC)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> the bits of bfloat16 (uint16), rounded to nearest, ties to even; a NaN
    stays a (quiet) NaN, a value beyond bfloat16's range becomes infinity."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(x)
    rounded[nan] = (bits[nan] >> 16) | 0x40
    return rounded.astype(np.uint16)


def pack_b(b: np.ndarray, vl: int, pair_multiple: int = 1) -> np.ndarray:
    """``b`` as [..., K, N] (already transposed and scaled) in bfloat16 pairs, panels of NR
    columns: [..., NP, ceil(K/2), NR] 32-bit words, carried as float32 (every constant the
    entry point takes is one). ``pair_multiple``: the pairs of each panel padded with zeros
    to a multiple of it (the AMX GEMM reads whole tiles of 16 pairs)."""
    nr = TILES[vl][1] * vl
    *batch, k, n = b.shape
    panels, pairs = -(-n // nr), padded_pairs(k, pair_multiple)
    padded = np.zeros((*batch, pairs * 2, panels * nr), np.uint16)
    padded[..., :k, :n] = to_bf16(b)
    low = padded[..., 0::2, :].astype(np.uint32)
    high = padded[..., 1::2, :].astype(np.uint32)
    words = (low | (high << 16)).reshape(*batch, pairs, panels, nr)
    return np.ascontiguousarray(np.moveaxis(words, -2, -3)).view(np.float32)


def padded_pairs(k: int, pair_multiple: int = 1) -> int:
    """Pairs of K per packed panel: ceil(K/2), rounded up to ``pair_multiple``."""
    return -(-k // (2 * pair_multiple)) * pair_multiple


def packed_shape(batch: tuple[int, ...], k: int, n: int, vl: int, pair_multiple: int = 1) -> tuple[int, ...]:
    nr = TILES[vl][1] * vl
    return (*batch, -(-n // nr), padded_pairs(k, pair_multiple), nr)


def row_words(k: int) -> int:
    """32-bit words per row of A's pairs: whole vectors, and never a multiple of 4 KB (rows
    that far apart share the L1 sets the micro-kernel's rows are read through)."""
    words = -(-k // 32) * 16
    return words + 16 if words % 1024 == 0 else words


def scratch_bytes(s: Shape) -> int:
    return s.m * row_words(s.k) * 4


def _micro_kernel(name: str, s: Shape, rows: int, width: int, epi: Epilogue) -> str:
    vl, nr = s.vl, s.nr
    nv = -(-width // vl)
    stride = row_words(s.k)
    acc, out = kernel_head(name, "uint32_t", rows, nv)

    def step(q: int, p: str) -> list[str]:
        lines = [f"    {{ const uint32_t *bp = b + ({p}) * {nr};"]
        lines += [f"      __m512bh b{v} = h_load(bp + {v * vl});" for v in range(nv)]
        for r in range(rows):
            lines.append(f"      __m512bh a{r} = (__m512bh)_mm512_set1_epi32((int)a[{r * stride} + ({p})]);")
            lines += [f"      {acc[q][r][v]} = (nn_v)_mm512_dpbf16_ps((__m512){acc[q][r][v]}, a{r}, b{v});"
                      for v in range(nv)]
        lines.append("    }")
        return lines

    out += k_loop(step, acc)
    out += store_tile(s, epi, width, acc[0])
    out.append("}")
    return "\n".join(out) + "\n"


def _convert(s: Shape) -> str:
    """C rounding rows [lo, hi) of A to bfloat16 pairs (32 floats per conversion; the last
    ones, and a strided A, through a zeroed buffer, so K's padding is zero)."""
    stride = row_words(s.k)
    full = s.k // 32 if s.sak == 1 else 0  # conversions read straight from a row of A
    return f"""
static void h_convert(void *ctx, int64_t lo, int64_t hi) {{
  const h_job *g = ctx;
  for (int64_t i = lo; i < hi; i++) {{
    const float *a = g->a + i * {s.sai};
    uint32_t *row = g->ab + i * {stride};
    int64_t p = 0;
    for (; p < {full}; p++) {{
      __m512 x0 = _mm512_loadu_ps(a + p * 32), x1 = _mm512_loadu_ps(a + p * 32 + 16);
      _mm512_storeu_si512(row + p * 16, (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
    }}
    for (; p < {-(-s.k // 32)}; p++) {{
      float t[32] = {{0}};
      int64_t n = {s.k} - p * 32 < 32 ? {s.k} - p * 32 : 32;
      for (int64_t e = 0; e < n; e++) t[e] = a[(p * 32 + e) * {s.sak}];
      __m512 x0 = _mm512_loadu_ps(t), x1 = _mm512_loadu_ps(t + 16);
      _mm512_storeu_si512(row + p * 16, (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
    }}
    for (p = {-(-s.k // 32) * 16}; p < {stride}; p++) row[p] = 0;
  }}
}}
"""


def _blocking(s: Shape) -> tuple[int, int]:
    """(KC, MC): pairs of K per block and rows per block of A."""
    pairs = -(-s.k // 2)
    kc = pairs
    if pairs > KC_MAX and s.m > MR:
        blocks = -(-pairs // KC_MAX)
        kc = -(-pairs // blocks)
    mc = max(MR, L2_ROWS_BYTES // (kc * 4) // MR * MR)
    return kc, mc


def source(s: Shape, epi: Epilogue, name: str, panel_pairs: int | None = None) -> str:
    """File-scope C defining ``void name(A, Bp, bias, pre, post, C, scratch)`` for one
    product; the pointers the epilogue does not use may be null. ``scratch`` holds
    scratch_bytes(s) for A's pairs, 64-byte aligned. ``panel_pairs``: the pairs each packed
    panel holds, when padded beyond ceil(K/2) (pack_b's ``pair_multiple``)."""
    pairs = -(-s.k // 2)
    stride = panel_pairs or pairs
    kc, mc = _blocking(s)
    head = ["#include <immintrin.h>\n#ifndef __AVX512BF16__\n#error \"bfloat16 GEMM built without AVX-512 BF16\"\n"
            "#endif\n", PARTIAL_VECTOR_C,
            "static inline __m512bh h_load(const uint32_t *p) { __m512i v; memcpy(&v, p, sizeof v); "
            "return (__m512bh)v; }\n",
            "typedef struct { const float *a; uint32_t *ab; const float *b, *bias, *pre, *post; float *c; "
            "int64_t tm, tn; } h_job;\n", _convert(s)]
    kernels, driver = grid_source(
        s, epi, name, "h", lambda kernel, rows, width: _micro_kernel(kernel, s, rows, width, epi),
        pairs, kc, mc,
        b_line=f"const uint32_t *bp = (const uint32_t *)g->b + q * {stride * s.nr} + k0 * {s.nr};",
        a_line=f"const uint32_t *a = g->ab + i * {row_words(s.k)} + k0;",
        lead=[], scratch_param=", char *scratch",
        calls=["h_job g = {A, (uint32_t *)scratch, Bp, bias, pre, post, C, tm, tn};",
               f"nn_parallel({s.m}, {s.m * s.k}, h_convert, &g);",
               f"nn_parallel(tm * tn, {s.m * s.n * s.k // 2}, h_task, &g);"])
    return f"NN_REQUIRE_VL({s.vl});\n" + "".join(head + kernels + [driver])


class Bf16Packing:
    """What gemm_gen's emitters ask of the arithmetic they generate (gemm_gen.F32Packing is
    the float32 one): the codegen's writer holds BF16 when the compile's precision is bf16."""

    name = "bf16"

    def form(self, vl: int) -> str:
        return f"gemm{vl}bf16"  # in the packed constant's name: the layout it holds

    def pack(self, b: np.ndarray, vl: int) -> np.ndarray:
        return pack_b(b, vl)

    def shape(self, batch: tuple[int, ...], k: int, n: int, vl: int) -> tuple[int, ...]:
        return packed_shape(batch, k, n, vl)

    def support(self, s: Shape, epi: Epilogue, entry: str) -> str:
        return graph_query.source("simd.h") + "\n" + source(s, epi, entry)

    def scratch(self, s: Shape) -> int:
        return scratch_bytes(s)


BF16 = Bf16Packing()


# -- bfloat16 weights widened to float32 (CPUs without AVX-512 BF16) ---------------------------


def pack_b_weights(b: np.ndarray, vl: int) -> np.ndarray:
    """``b`` as [..., K, N] (already transposed and scaled) in bfloat16, the float32 GEMM's
    panels of NR columns with two columns to a word: [..., NP, K, NR / 2] words, word j of
    the u-th pair of vectors holding column 2u * VL + j (low half) and (2u + 1) * VL + j
    (high half); carried as float32 like every constant the entry point takes."""
    vectors = TILES[vl][1]  # per panel, an even count at every width
    nr = vectors * vl
    *batch, k, n = b.shape
    panels = -(-n // nr)
    padded = np.zeros((*batch, k, panels * nr), np.float32)
    padded[..., :n] = b
    halves = to_bf16(padded).reshape(*batch, k, panels, vectors // 2, 2, vl).astype(np.uint32)
    words = (halves[..., 0, :] | (halves[..., 1, :] << 16)).reshape(*batch, k, panels, nr // 2)
    return np.ascontiguousarray(np.moveaxis(words, -2, -3)).view(np.float32)


# the load of a pair of B's vectors as bfloat16 words: GCC's generic vectors, so one text
# serves every width (a shift and a mask make the two float32 vectors)
WIDEN_C = """
typedef uint32_t w_vu __attribute__((vector_size(NN_VL * 4)));
static inline w_vu w_load(const uint32_t *p) { w_vu v; memcpy(&v, p, sizeof v); return v; }
"""


def _weights_kernel(name: str, s: Shape, epi: Epilogue, rows: int, width: int) -> str:
    """C for a tile of ``rows`` x ``width`` (<= NR) columns of C over one block of K, B's
    vectors widened from bfloat16 pairs."""
    vl, words = s.vl, s.nr // 2
    nv = -(-width // vl)
    acc, out = kernel_head(name, "float", rows, nv, b_operand="uint32_t")

    def step(q: int, p: str) -> list[str]:
        lines = [f"    {{ const uint32_t *bp = b + ({p}) * {words};"]
        for u in range(-(-nv // 2)):
            lines.append(f"      w_vu x{u} = w_load(bp + {u * vl});")
            lines.append(f"      nn_v b{2 * u} = (nn_v)(x{u} << 16);")
            if 2 * u + 1 < nv:
                lines.append(f"      nn_v b{2 * u + 1} = (nn_v)(x{u} & 0xFFFF0000u);")
        for r in range(rows):
            lines.append(f"      nn_v a{r} = nn_vset1(a[{r * s.sai} + ({p}) * {s.sak}]);")
            lines += [f"      {acc[q][r][v]} = nn_vfma(a{r}, b{v}, {acc[q][r][v]});" for v in range(nv)]
        lines.append("    }")
        return lines

    out += k_loop(step, acc)
    out += store_tile(s, epi, width, acc[0])
    out.append("}")
    return "\n".join(out) + "\n"


def weights_source(s: Shape, epi: Epilogue, name: str) -> str:
    """File-scope C defining ``void name(A, Bp, bias, pre, post, C)`` for one product by
    bfloat16 weights (pack_b_weights); the pointers the epilogue does not use may be null."""
    kc, mc = blocking(s)
    words = s.nr // 2
    kernels, driver = grid_source(
        s, epi, name, "w", lambda kernel, rows, width: _weights_kernel(kernel, s, epi, rows, width),
        s.k, kc, mc,
        b_line=f"const uint32_t *bp = (const uint32_t *)g->b + q * {s.k * words} + k0 * {words};",
        a_line=f"const float *a = g->a + i * {s.sai} + k0 * {s.sak};",
        lead=["typedef struct { const float *a, *b, *bias, *pre, *post; float *c; int64_t tm, tn; } w_job;"],
        scratch_param="", calls=["w_job g = {A, Bp, bias, pre, post, C, tm, tn};",
                                 f"nn_parallel(tm * tn, {s.m * s.n * s.k}, w_task, &g);"])
    return f"NN_REQUIRE_VL({s.vl});\n" + "".join([PARTIAL_VECTOR_C, WIDEN_C] + kernels + [driver])


class Bf16WeightsPacking:
    """gemm_gen's emitters' arithmetic with bfloat16 weights widened to float32: the
    codegen's writer holds BF16W when the compile's precision is bf16 and the target lacks
    AVX-512 BF16."""

    name = "bf16w"

    def form(self, vl: int) -> str:
        return f"gemm{vl}bf16w"  # in the packed constant's name: the layout it holds

    def pack(self, b: np.ndarray, vl: int) -> np.ndarray:
        return pack_b_weights(b, vl)

    def shape(self, batch: tuple[int, ...], k: int, n: int, vl: int) -> tuple[int, ...]:
        nr = TILES[vl][1] * vl
        return (*batch, -(-n // nr), k, nr // 2)

    def support(self, s: Shape, epi: Epilogue, entry: str) -> str:
        return graph_query.source("simd.h") + "\n" + weights_source(s, epi, entry)

    def scratch(self, s: Shape) -> int:
        return 0


BF16W = Bf16WeightsPacking()
