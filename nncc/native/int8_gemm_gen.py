"""com.microsoft DynamicQuantizeMatMul as one native int8 GEMM step, C code generated per layer.

``Y = float(int32 (Aq - a_zero)(B - b_zero)) * (a_scale * b_scale) + bias``, where A
(float32, any batch dims folded into M rows) is quantized in the step itself exactly as
DynamicQuantizeLinear does: one range for the whole tensor (always including 0; NaN when A
holds a NaN, so every result is NaN), scale = (max - min) / 255, zero point = round(-min /
scale), u8 = saturate(round(x / scale) + zero), rounding half to even. B is a constant int8 matrix, packed at compile time (below) with its
column sums, so the zero points cost nothing in the inner loop:

    sum_k (a - za)(b - zb) = sum_k a*b - zb * rowsum(a) - za * colsum(b) + K * za * zb

The product accumulates u8 x s8 in int32: on AVX-512 VNNI with ``vpdpbusd`` (four products
summed into each int32 lane, no saturation); on AVX2 with ``vpmaddubsw`` (two u8 x s8
products summed into an int16 lane, saturating) and ``vpmaddwd`` by ones (two int16 lanes
into int32). Saturation is ruled out at compile time: B is split into a main part whose
pairs of rows (2p, 2p + 1) cannot saturate in any column (opposite signs, or the same sign
with |b0| + |b1| <= PAIR_BOUND, so a pair's sum is within 255 * 128 < 2**15 whatever A
holds), and a sparse remainder (one weight of each same-sign pair over the bound) whose products join the sums exactly, a scalar product per row and
entry; elsewhere with plain C that the C compiler vectorises. Every partial sum stays below 2**31 for K <= MAX_K, so the int32
result is exact, as is MatMulInteger's. The dequantisation, per-column scale and bias
are the epilogue, written once per output element, each rounded as the unfused graph rounds
it (no fused multiply-add): the result is the portable kernel's (nncc/kernels/
qlinear_contrib.py), bit for bit.

Layout of the packed B, chosen from the vector width the code is built for (``pairs``):
panels of NR = 64 columns, K zero-padded to a multiple of 4, zero beyond B.
- Quads (AVX-512 and the plain C): int8; in a panel, for each group of four rows of K, 64
  columns of four consecutive values: byte ((panel * G + group) * 64 + column) * 4 + t
  holds B[4 * group + t, 64 * panel + column].
- Pairs (AVX2, 8-float vectors): int8, the main part of B (split_pairs); a panel is four
  slices of CHUNK = 16 columns (two ymm of int32 lanes), and a slice, for each group of
  four rows of K, 16 columns of four consecutive values: byte (((panel * 4 + slice) * G +
  group) * 16 + column) * 4 + t holds main[4 * group + t, 64 * panel + 16 * slice + column].
  After the panel's 4 * G * 64 bytes, its remainder: an int32 count, the 64-bit mask of
  the panel's columns that have entries (two uint32, low half first), then that many
  uint32 entries (row k in bits 0-15, column in the panel in bits 16-21, bit 23 set on
  the first entry of its column, the int8 value in bits 24-31), then zeros up to the
  capacity every panel shares (the most entries any panel has), the panel's bytes rounded
  up to 64. Where the entries would cost more than a
  second pass of the micro-kernel (remainder_capacity: DENSE), the panel's remainder
  follows its main part instead, whole and in the same layout.
A second constant holds, per padded column, the column sum and zero point of B (int32) and
its scale and bias (float32).
"""

from __future__ import annotations

import math

import numpy as np

from nncc.native import int8_gemm_amx_gen
from nncc.native.c_struct import Field, Struct
from nncc.native.graph_query import const_value
from nncc.native.kernel import scratch_arg

NR = 64  # columns per panel: four AVX-512 vectors of int32 lanes
MR = 6  # rows per micro-tile: 24 accumulators of the 32 vector registers
MAX_K = 16384  # |each partial sum| <= 4 * 255 * 128 * K < 2**31
CHUNK = 16  # pairs layout: columns of a slice, two ymm of int32 sums (6 rows: 12 of the 16 registers)
PAIR_BOUND = 128  # pairs layout: |b0| + |b1| of the main part's same-sign pairs; 255 * 128 fits int16
DENSE = -1  # a remainder capacity: the remainder packed whole, as the main part, and multiplied as it is
ENTRIES_PER_GROUP = 3  # the channel-major form's remainder entries a sliver may have per group of K
# the GEMM's costs on one Zen 3 core, ns: a remainder entry (measured); a tile's masked add of its
# sums to the entries' columns (counted: 48 vector steps and the masks); a group of K over a panel (measured)
ENTRY_NS, MASKING_NS, GROUP_NS = 3.2, 10.0, 16.6
ENTRY = "q_dynamic_matmul"
assert int8_gemm_amx_gen.NR == NR  # the tiles read these panels


def check(node, graph, infos) -> str | None:
    """None when the node can become C, else why not."""
    inputs = list(node.inputs) + [""] * (5 - len(node.inputs))
    a, b, b_scale, b_zero, bias = inputs[:5]
    out = node.outputs[0] if node.outputs else ""
    ia, io = infos.get(a), infos.get(out)
    if ia is None or io is None or not ia.is_static or not io.is_static:
        return "a dynamically shaped input or output"
    if ia.dtype != np.float32 or io.dtype != np.float32 or len(ia.shape) < 2:
        return "A is not a float32 matrix"
    bv = const_value(graph, infos, b)
    if bv is None or bv.dtype != np.int8 or bv.ndim != 2:
        return "B is not a constant int8 matrix"
    k, n = bv.shape
    if ia.shape[-1] != k or tuple(io.shape) != tuple(ia.shape[:-1]) + (n,):
        return "shapes that do not match"  # the portable kernel says which
    if 0 in ia.shape or n == 0 or k > MAX_K:
        return "an empty product or K above the exact int32 range"
    for name, dtype in ((b_scale, np.float32), (b_zero, np.int8), (bias, np.float32)):
        if not name:
            continue
        value = const_value(graph, infos, name)
        if value is None or value.dtype != dtype or value.size not in ((1, n) if name != bias else (n,)):
            return "scales, zero points or bias that are not constants of the expected shape"
    if not b_scale:
        return "no b_scale"
    return None


def pairs_layout(vl: int) -> bool:
    """Whether code built for ``vl`` floats per vector (nncc/native/isa.py) multiplies B in
    the int16 pairs layout: AVX2 (8), which has no ``vpdpbusd``."""
    return vl == 8


def split_pairs(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(main, rest), int8, main + rest == b: no pair of rows (2p, 2p + 1) of main can
    saturate ``vpmaddubsw`` in any column (B's rows are taken as zero past an odd K). The
    bytes of A are unsigned, so a pair's sum lies between 255 times the sum of its negative
    weights and 255 times the sum of its positive ones: a pair of opposite signs (or with a
    0) can never saturate, whatever its weights, and one of the same sign cannot while
    |b0| + |b1| <= PAIR_BOUND. Where a pair of the same sign is over, main keeps the larger
    weight and shrinks the other towards 0 until the pair fits, so rest holds at most one
    weight of a pair, that one's shrinkage. Telling the signs apart halves the remainder of
    trained weights against bounding every pair's |b0| + |b1|."""
    w = np.zeros((-(-b.shape[0] // 2) * 2, b.shape[1]), np.int32)
    w[:b.shape[0]] = b
    w0, w1 = w[0::2], w[1::2]
    big0 = np.abs(w0) >= np.abs(w1)
    room = PAIR_BOUND - np.maximum(np.abs(w0), np.abs(w1))  # left for the smaller one, >= 0
    over = (np.abs(w0) + np.abs(w1) > PAIR_BOUND) & (np.sign(w0) == np.sign(w1))
    main = w.copy()
    main[0::2] = np.where(over & ~big0, np.sign(w0) * room, w0)
    main[1::2] = np.where(over & big0, np.sign(w1) * room, w1)
    main, rest = main[:b.shape[0]], (w - main)[:b.shape[0]]
    return main.astype(np.int8), rest.astype(np.int8)


def remainder_capacity(b: np.ndarray) -> int:
    """The most remainder entries (split_pairs) any panel of B has: every panel's room; or
    DENSE where a second pass of the micro-kernel over the remainder packed whole (its
    pairs are within the bound: one weight of each is 0) costs less than the entries and
    the masked add of the tile's sums they need (ENTRY_NS, MASKING_NS, GROUP_NS: six
    scalar products and their sums an entry, 12 multiply steps of 4 slices a group).
    Weights quantized from a trained layer stay far below with K past a few dozen (0.2% of
    pairs, 0.06 entries a group); uniformly drawn ones have about 32 a group."""
    rest = split_pairs(b)[1] != 0
    padded = np.zeros((rest.shape[0], -(-rest.shape[1] // NR) * NR), bool)
    padded[:, :rest.shape[1]] = rest
    most = int(padded.reshape(rest.shape[0], -1, NR).sum(axis=(0, 2)).max(initial=0))
    return DENSE if most and most * ENTRY_NS + MASKING_NS > GROUP_NS * -(-b.shape[0] // 4) else most


def pack_b(b: np.ndarray, pairs: bool = False) -> np.ndarray:
    """The int8 matrix [K, N] in the micro-kernel's layout (module docstring): int8 quads,
    or the pairs layout's panels, each its main part and its remainder entries."""
    k, n = b.shape
    groups, panels = -(-k // 4), -(-n // NR)
    if not pairs:  # [G, 4, P, NR] -> [P, G, NR, 4]
        padded = np.zeros((groups * 4, panels * NR), np.int8)
        padded[:k, :n] = b
        return np.ascontiguousarray(padded.reshape(groups, 4, panels, NR).transpose(2, 0, 3, 1)).reshape(-1)
    main, rest = split_pairs(b)

    def slices(part):  # [G, 4, P, 4, CHUNK] -> [P, 4, G, CHUNK, 4]
        padded = np.zeros((groups * 4, panels * NR), np.int8)
        padded[:k, :n] = part
        shape = (groups, 4, panels, NR // CHUNK, CHUNK)
        return np.ascontiguousarray(padded.reshape(shape).transpose(2, 3, 0, 4, 1)).reshape(panels, -1)
    mains = slices(main)
    capacity = remainder_capacity(b)
    if capacity == DENSE:  # each panel's main part, then its remainder in the same layout
        return np.concatenate([mains, slices(rest)], axis=1).reshape(-1)
    stride = panel_bytes(groups, True, capacity)
    out = np.zeros((panels, stride), np.uint8)
    out[:, :mains.shape[1]] = mains.view(np.uint8)
    rows, cols = np.nonzero(rest)
    for panel in range(panels):
        mine = (cols >= panel * NR) & (cols < (panel + 1) * NR)
        r, c = rows[mine], cols[mine]
        column = (c - panel * NR).astype(np.uint32)
        first = np.zeros(len(c), np.uint32)  # the first entry of its column, in the order they are added
        first[np.unique(column, return_index=True)[1]] = 1
        words = (r.astype(np.uint32) | (column << 16) | (first << 23)
                 | (rest[r, c].view(np.uint8).astype(np.uint32) << 24))
        touched = np.bitwise_or.reduce(np.uint64(1) << column.astype(np.uint64), initial=np.uint64(0))
        head = np.array([len(words), int(touched) & 0xFFFFFFFF, int(touched) >> 32], np.uint32)
        block = np.concatenate([head, words.astype(np.uint32)])
        out[panel, mains.shape[1]:mains.shape[1] + 4 * block.size] = block.view(np.uint8)
    return out.reshape(-1).view(np.int8)


def panel_bytes(groups: int, pairs: bool, capacity: int = 0) -> int:
    """The bytes of one packed panel of B with ``groups`` groups of four rows of K; in the
    pairs layout, with room for ``capacity`` remainder entries (remainder_capacity), or with
    the remainder whole (DENSE)."""
    if not pairs:
        return groups * NR * 4
    if capacity == DENSE:
        return 2 * groups * NR * 4
    return -(-(groups * NR * 4 + 12 + 4 * capacity) // 64) * 64


def columns(n: int) -> Struct:
    """The table of B's ``n`` columns (padded to whole panels): each column's sum and zero
    point, its scale and the bias."""
    np_ = -(-n // NR) * NR
    return Struct(f"nn_q8_gemm_columns_{np_}", (Field("colsum", "int32_t", np_), Field("zero", "int32_t", np_),
                                                 Field("scale", "float", np_), Field("bias", "float", np_)))


def column_table(b: np.ndarray, b_scale: np.ndarray, b_zero, bias) -> np.ndarray:
    """The bytes of ``columns`` for B, its scale, zero point and bias (absent: 0)."""
    n = b.shape[1]
    per_column = lambda v, dtype: np.broadcast_to(np.asarray(0 if v is None else v, dtype).reshape(-1), (n,))  # noqa: E731
    return columns(n).pack(colsum=b.astype(np.int32).sum(axis=0), zero=per_column(b_zero, np.int32),
                           scale=per_column(b_scale, np.float32), bias=per_column(bias, np.float32))


def as_floats(data: np.ndarray) -> np.ndarray:
    """Bytes carried in a float32 array (every constant the entry point takes is one)."""
    raw = np.zeros(-(-data.nbytes // 4) * 4, np.uint8)
    raw[:data.nbytes] = data.view(np.uint8).reshape(-1)
    return raw.view(np.float32)


def vnni_sums(tile_rows: int, groups: int, loads: list[str], row_bytes, vector_unsigned: bool) -> str:
    """C for a ``vpdpbusd`` micro-tile: ``tile_rows`` rows of four int32 vectors each, summed
    over ``groups`` groups of four bytes of K, stored to ``acc``. ``loads``: the four vectors
    of group g; ``row_bytes(r)``: a pointer to row r's four bytes of group g, broadcast;
    ``vector_unsigned``: whether the loaded vectors are the unsigned operand.

    Two bodies, chosen by ``rows`` at run time: the whole tile with no test in its loop, and
    a partial one with a test per row. Every sum is a named variable, and the loop's count
    is hidden from the optimizer: given a constant count, GCC 12 (its loop header copying)
    kept the 24 sums in memory, a store and a load around every product, at half speed."""
    def body(guarded: bool) -> str:
        names = [[f"c{r}_{v}" for v in range(4)] for r in range(tile_rows)]
        zero = ", ".join(f"{n} = _mm512_setzero_si512()" for row in names for n in row)
        lines = [f"__m512i {zero};", f"int64_t groups = {groups};",
                 "__asm__(\"\" : \"+r\"(groups));  /* an unknown count to the optimizer (see above) */",
                 "for (int64_t g = 0; g < groups; g++) {"]
        lines += [f"    const __m512i v{v} = {load};" for v, load in enumerate(loads)]
        for r, row in enumerate(names):
            guard = f"if (rows > {r}) " if guarded and r else ""
            products = " ".join(
                f"{n} = _mm512_dpbusd_epi32({n}, {f'v{v}, s' if vector_unsigned else f's, v{v}'});"
                for v, n in enumerate(row))
            lines.append(f"    {guard}{{ int32_t four; memcpy(&four, {row_bytes(r)}, 4); "
                         f"const __m512i s = _mm512_set1_epi32(four); {products} }}")
        lines.append("}")
        for r, row in enumerate(names):
            guard = f"if (rows > {r}) " if guarded and r else ""
            lines.append(guard + "{ " + " ".join(f"_mm512_storeu_si512(acc[{r}] + {16 * v}, {n});"
                                                   for v, n in enumerate(row)) + " }")
        return "\n        ".join(lines)
    return f"""if (rows == {tile_rows}) {{
        {body(False)}
    }} else {{
        {body(True)}
    }}"""


def pair_sums(kp: int, capacity: int) -> str:
    """C for the AVX2 micro-kernel over the pairs layout (module docstring): the body of
    ``q_dots``. Per slice of CHUNK columns, MR rows x 2 vectors of int32 sums: per group of
    four rows of K, each row's four bytes of A broadcast to every 32-bit lane,
    ``vpmaddubsw`` by a vector of the main part's bytes (no pair can saturate), then
    ``vpmaddwd`` by ones sums each lane's two pairs into int32. The panel's remainder
    entries come first, into ``acc`` by 32-bit stores: the first entry of a column sets its
    products in every row, the later ones add theirs; then the sums are added to the
    columns the panel's mask says have entries, and stored over the others: a 32-bit load
    of a value a vector store has just written waits for the store to reach the cache (the
    entries added after the products' vector stores ran three to five times slower on Zen
    3), and by the time the sums are added the entries' stores have long left. The first
    entry's setting, not zeroing the tile before, saves 384 stores a tile. Rows past ``rows`` read row 0 again (A has no
    bytes beyond its rows) and are never read back. The loop's count is hidden from the
    optimizer, as in vnni_sums."""
    groups = kp // 4
    names = [[f"c{r}_{h}" for h in range(2)] for r in range(MR)]
    declare = ", ".join(f"{n} = {{0}}" for row in names for n in row)
    store = " ".join(f"memcpy(acc[{r}] + col + {8 * h}, &{n}, 32);" for r, row in enumerate(names)
                     for h, n in enumerate(row))
    if capacity > 0:  # the sums added to the entries' columns (below), if the panel has any
        masks = " ".join(f"const q_v8i m{h} = -((((q_v8i){{0}} + (int32_t)((touched >> (col + {8 * h})) & 0xff)) >> lanes) & 1);"
                         for h in range(2))
        added = " ".join(f"{{ q_v8i t; memcpy(&t, acc[{r}] + col + {8 * h}, 32); t = (t & m{h}) + {n}; "
                         f"memcpy(acc[{r}] + col + {8 * h}, &t, 32); }}" for r, row in enumerate(names)
                         for h, n in enumerate(row))
        store = f"if (count) {{ {masks} {added} }} else {{ {store} }}"
    products = "\n".join(
        f"                    {{ int32_t four; memcpy(&four, ar{r} + 4 * g, 4); const q_v8i s = {{four, four, four, four, four, four, four, four}}; "
        f"{row[0]} += __builtin_ia32_pmaddwd256(__builtin_ia32_pmaddubsw256((q_v32b)s, v0), ones); "
        f"{row[1]} += __builtin_ia32_pmaddwd256(__builtin_ia32_pmaddubsw256((q_v32b)s, v1), ones); }}"
        for r, row in enumerate(names))
    rows_at = " ".join(f"const uint8_t *ar{r} = a + (rows > {r} ? {r * kp} : 0);" for r in range(MR))
    remainder = "" if capacity in (0, DENSE) else f"""
    const uint32_t *rest = (const uint32_t *)(bp + {groups * NR * 4});  /* the count, the mask, the entries */
    const uint32_t count = rest[0];
    const uint64_t touched = rest[1] | (uint64_t)rest[2] << 32;  /* the columns with entries */
    const q_v8i lanes = {{0, 1, 2, 3, 4, 5, 6, 7}};
    for (uint32_t e = 3; e < count + 3; e++) {{  /* every row, unrolled: rows past ``rows`` are never read */
        uint32_t entry = rest[e];
        int32_t k = (int32_t)(entry & 0xffff), col = (int32_t)((entry >> 16) & 63), value = (int8_t)(entry >> 24);
        /* all ones, or 0 on the column's first entry: what acc held before (another
         * tile's) is dropped without a branch */
        int32_t keep = (int32_t)((entry >> 23) & 1) - 1;
        {" ".join(f"acc[{r}][col] = (acc[{r}][col] & keep) + (int32_t)ar{r}[k] * value;" for r in range(MR))}
    }}"""
    return f"""typedef int16_t q_v16s __attribute__((vector_size(32)));
    typedef int32_t q_v8i __attribute__((vector_size(32)));
    typedef char q_v32b __attribute__((vector_size(32)));
    const q_v16s ones = {{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}};
    {rows_at}{remainder}
    for (int col = 0; col < {NR}; col += {CHUNK}) {{
        q_v8i {declare};
        for (int part = 0; part < {2 if capacity == DENSE else 1}; part++) {{  /* the main part, then a DENSE remainder */
            const int8_t *bc = bp + part * {groups * NR * 4} + (col / {CHUNK}) * {groups * CHUNK * 4};
            int64_t n = {groups};
            __asm__("" : "+r"(n));  /* an unknown count to the optimizer (see vnni_sums) */
            for (int64_t g = 0; g < n; g++) {{
                q_v32b v0, v1;
                memcpy(&v0, bc + g * {CHUNK * 4}, 32);
                memcpy(&v1, bc + g * {CHUNK * 4} + 32, 32);
{products}
            }}
        }}
        {store}
    }}"""


def dots_source(kp: int, groups: int, pairs: bool = False, capacity: int = 0) -> str:
    """File-scope C: ``q_dots(a, bp, rows, acc)``, the int32 dot products of ``rows`` (at
    most MR) u8 rows of A, ``kp`` bytes apart, with one panel of packed B (``groups``
    groups of four rows of K, in the pairs layout when ``pairs``, its panels with room for
    ``capacity`` remainder entries), into ``acc[MR][NR]``."""
    if pairs:
        return f"""#if !defined(__AVX2__)
#error "B packed in pairs for AVX2, built for a target without it"
#endif
/* int32 dot products of ``rows`` quantized rows with one panel of B, into acc[MR][NR] (rows
 * past ``rows`` hold anything); out of line, as below */
static __attribute__((noinline)) void q_dots(const uint8_t *a, const int8_t *bp, int rows,
                                                         int32_t acc[{MR}][{NR}]) {{
    {pair_sums(kp, capacity)}
}}

"""
    return f"""/* int32 dot products of ``rows`` quantized rows with one panel of B, into acc[rows][NR]; out of
 * line, so the tile loop's epilogue constants do not crowd its 24 sums out of the registers */
static __attribute__((noinline)) void q_dots(const uint8_t *a, const int8_t *bp, int rows,
                                                         int32_t acc[{MR}][{NR}]) {{
#ifdef Q_VNNI
    {vnni_sums(MR, groups, [f"_mm512_loadu_si512(bp + g * {NR * 4} + {64 * v})" for v in range(4)],
               lambda r: f"a + {r * kp} + g * 4", vector_unsigned=False)}
#else
    for (int r = 0; r < rows; r++) {{
        int32_t *c = acc[r];
        for (int col = 0; col < {NR}; col++) c[col] = 0;
        const uint8_t *ar = a + r * {kp};
        for (int64_t g = 0; g < {groups}; g++) {{
            const int8_t *bg = bp + g * {NR * 4};
            int32_t a0 = ar[4 * g], a1 = ar[4 * g + 1], a2 = ar[4 * g + 2], a3 = ar[4 * g + 3];
            for (int col = 0; col < {NR}; col++)
                c[col] += a0 * bg[4 * col] + a1 * bg[4 * col + 1] + a2 * bg[4 * col + 2] + a3 * bg[4 * col + 3];
        }}
    }}
#endif
}}

"""


def source(m: int, n: int, k: int, name: str, pairs: bool = False, capacity: int = 0, tiles: bool = False) -> str:
    """File-scope C defining ``void name(A, Bp, table, Y, scratch)``, B packed in the pairs
    layout when ``pairs``, with room for ``capacity`` remainder entries a panel; ``tiles``:
    B packed with K padded to whole tiles (padded_k), and the AMX product beside the
    vpdpbusd one where the code is built with AMX-INT8 (int8_gemm_amx_gen)."""
    kp = padded_k(k, tiles)  # A's row stride and B's rows a panel
    groups = -(-k // 4)  # the groups vpdpbusd multiplies: never the tiles' zero padding
    panels = -(-n // NR)
    slivers = -(-m // MR)
    rowsum_bytes = -(-m * 4 // 64) * 64
    tail = m - (slivers - 1) * MR
    last = n - (panels - 1) * NR
    table = columns(n)
    tail_range = "" if (m * k) % 8 == 0 else f"""    for (; i < {m * k}; i++) {{
        float v = A[i];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        nan |= v != v;
    }}
"""
    return f"""
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define Q_VNNI 1
#endif
{table.declaration}
typedef struct {{ const float *a; uint8_t *aq; int32_t *rowsum; const int8_t *b; const int32_t *colsum, *bzero;
                  const float *bscale, *bias; float *y; float scale, zero; int32_t azero; }} q_job;

/* rows [lo, hi) of A quantized with the tensor's scale and zero point, K padded with zeros */
static void q_quantize(void *ctx, int64_t lo, int64_t hi) {{
    const q_job *j = ctx;
    const float scale = j->scale, zero = j->zero;  /* locals: the stores below cannot change them */
    for (int64_t i = lo; i < hi; i++) {{
        const float *restrict a = j->a + i * {k};
        uint8_t *restrict q = j->aq + i * {kp};
        int32_t sum = 0;
        for (int64_t p = 0; p < {k}; p++) {{
            float v = rintf(a[p] / scale) + zero;  /* half to even, the default rounding mode */
            v = v > 0.0f ? v : 0.0f;  /* NaN (over a NaN scale, or an infinite a over an infinite one) to 0 */
            v = v < 255.0f ? v : 255.0f;
            q[p] = (uint8_t)(int32_t)v;
        }}
        for (int64_t p = 0; p < {k}; p++) sum += q[p];  /* apart: each loop vectorises alone */
        for (int64_t p = {k}; p < {kp}; p++) q[p] = 0;
        j->rowsum[i] = sum;
    }}
}}

{dots_source(kp, groups, pairs, capacity)}/* rows [i0, i0 + rows) of panel q from their int32 dot products ``acc``: zero-point
 * corrections, scales, bias (the first ``width`` columns) */
static inline void q_store(const q_job *j, const int32_t (*acc)[{NR}], int64_t i0, int rows, int64_t q, int width) {{
    const int32_t *cs = j->colsum + q * {NR}, *zb = j->bzero + q * {NR};
    const float *bs = j->bscale + q * {NR}, *bias = j->bias + q * {NR};
    int32_t za = j->azero, kza = {k} * za;
    int32_t fixed[{NR}];  /* the terms no row changes, and each column's scale, once a tile */
    float scale[{NR}];
    for (int col = 0; col < {NR}; col++) {{
        fixed[col] = kza * zb[col] - za * cs[col];
        scale[col] = j->scale * bs[col];
    }}
    for (int r = 0; r < rows; r++) {{
        int32_t rs = j->rowsum[i0 + r];
        float *y = j->y + (i0 + r) * {n} + q * {NR};
        float t[{NR}];
        for (int col = 0; col < {NR}; col++) {{
            int32_t exact = acc[r][col] - zb[col] * rs + fixed[col];
            t[col] = (float)exact * scale[col];
        }}
        /* the product rounded on its own, then the bias added, as the unfused graph
         * computes it: the compiler may not contract the two into one multiply-add */
        __asm__ volatile("" : : "r"(t) : "memory");
        for (int col = 0; col < width; col++) y[col] = t[col] + bias[col];
    }}
}}

/* the (row sliver x panel) tiles [lo, hi): dot products, then q_store */
static void q_tiles(void *ctx, int64_t lo, int64_t hi) {{
    const q_job *j = ctx;
    int32_t acc[{MR}][{NR}];
    for (int64_t w = lo; w < hi; w++) {{
        /* panel by panel: a panel of B stays in L2 while every sliver of A passes it */
        int64_t q = w / {slivers}, s = w % {slivers};
        int64_t i0 = s * {MR};
        int rows = s == {slivers - 1} ? {tail} : {MR};
        int width = q == {panels - 1} ? {last} : {NR};
        q_dots(j->aq + i0 * {kp}, j->b + q * {panel_bytes(kp // 4, pairs, capacity)}, rows, acc);
        q_store(j, (const int32_t (*)[{NR}])acc, i0, rows, q, width);
    }}
}}
{int8_gemm_amx_gen.source(m, n, kp) if tiles else ""}
static void {name}(const float *A, const int8_t *Bp, {table.pointer}table, float *Y, char *scratch) {{
    /* the range of the whole tensor, always including 0 (so 0 is exact); a NaN anywhere
     * makes it NaN, as DynamicQuantizeLinear's max and min (the portable kernel's) */
    /* eight lanes at a time (the compiler does not vectorise a float min reduction); 32-byte
     * vectors, which every x86 target with AVX holds in one register: GCC splits a 64-byte
     * one into scalars on AVX2, which made this scan a fifth of a BERT layer's time */
    typedef float q_vf __attribute__((vector_size(32)));
    typedef int32_t q_vi __attribute__((vector_size(32)));
    q_vf los = {{0}}, his = {{0}};
    q_vi nans = {{0}};
    int64_t i = 0;
    for (; i + 8 <= {m * k}; i += 8) {{
        q_vf v;
        memcpy(&v, A + i, sizeof v);
        q_vi below = v < los, above = v > his;
        los = (q_vf)((below & (q_vi)v) | (~below & (q_vi)los));
        his = (q_vf)((above & (q_vi)v) | (~above & (q_vi)his));
        nans |= v != v;
    }}
    float lo = 0.0f, hi = 0.0f;
    int nan = 0;
    for (int t = 0; t < 8; t++) {{
        lo = los[t] < lo ? los[t] : lo;
        hi = his[t] > hi ? his[t] : hi;
        nan |= nans[t] != 0;
    }}
{tail_range}
    /* NaN: every quantized value 0, the zero point 255 and every product NaN, below */
    float scale = nan ? NAN : (hi - lo) / 255.0f;
    if (scale == 0.0f) scale = 1.0f;  /* all zeros: any scale, zero point 0 */
    float zero = 0.0f - lo / scale;
    /* NaN (the scale NaN, or infinities of both signs in A) to 255, as onnxruntime's min(255, zero) gives it */
    zero = nearbyintf(zero < 0.0f ? 0.0f : (zero > 255.0f || zero != zero ? 255.0f : zero));
    q_job j = {{A, (uint8_t *)(scratch + {rowsum_bytes}), (int32_t *)scratch, Bp,
               table->colsum, table->zero, table->scale, table->bias, Y, scale, zero, (int32_t)zero}};
    nn_parallel({m}, {m * k}, q_quantize, &j);
{int8_gemm_amx_gen.dispatch(m, n, k, kp) if tiles else ""}    nn_parallel({slivers * panels}, {m * n * k}, q_tiles, &j);
}}
"""


def padded_k(k: int, tiles: bool = False) -> int:
    """A quantized row's bytes and B's rows a panel: K rounded up to a group of four, or
    to a tile's 64 bytes where the AMX product may read them (zeros on both sides)."""
    step = int8_gemm_amx_gen.TILE_K if tiles else 4
    return -(-k // step) * step


def scratch_bytes(m: int, k: int, tiles: bool = False) -> int:
    """The row sums, then A quantized: with ``tiles``, its rows rounded up to the AMX
    product's 32-row blocks (the padding rows zero)."""
    rows = int8_gemm_amx_gen.padded_rows(m) if tiles else m
    return -(-m * 4 // 64) * 64 + rows * padded_k(k, tiles)


def emit(w, node) -> None:
    """The step of the native code generator (nncc/native/codegen.py) for the node."""
    inputs = list(node.inputs) + [""] * (5 - len(node.inputs))
    a, b, b_scale, b_zero, bias = inputs[:5]
    w.as_plain(a)
    bv = np.asarray(const_value(w.graph, w.infos, b))
    k, n = bv.shape
    value = lambda name: None if not name else np.asarray(const_value(w.graph, w.infos, name))  # noqa: E731
    pairs = pairs_layout(w.vl)
    tiles = int8_gemm_amx_gen.wanted(w.vl, m := math.prod(w.shape(a)[:-1]))
    packed = pack_b(np.pad(bv, ((0, padded_k(k, tiles) - k), (0, 0))) if tiles else bv, pairs)
    bp = w.pack(b, "int8 bounded pair panels" if pairs else "int8 tile panels" if tiles else "int8 panels",
                as_floats(packed))
    table = w.pack(b, f"int8 columns {b_scale}|{b_zero}|{bias}",
                   column_table(bv, value(b_scale), value(b_zero), value(bias)))
    out = node.outputs[0]
    scratch = scratch_bytes(m, k, tiles)
    code = f"{ENTRY}({w.ptr(a)}, {w.ptr(bp)}, {w.ptr(table)}, {w.ptr(out)}, {scratch_arg(scratch)});"
    w.step(code, [a, (bp, "const int8_t *"), (table, columns(n).pointer)], [out], scratch,
           support=source(m, n, k, ENTRY, pairs, remainder_capacity(bv) if pairs else 0, tiles))
