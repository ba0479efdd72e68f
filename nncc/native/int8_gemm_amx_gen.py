"""The int8 GEMM of DynamicQuantizeMatMul (nncc/native/int8_gemm_gen.py) on AMX tiles, for
code built with AMX-INT8 (nncc/native/amx.py): ``tdpbusd`` multiplies a tile of 16 rows x
64 unsigned bytes of A by a tile of 16 groups of four K x 16 columns of signed bytes of B
into 16 x 16 int32 sums, 1024 products per instruction where ``vpdpbusd`` makes 64.

The operands are the vpdpbusd GEMM's, padded: B's panels of NR = 64 columns hold, per group
of four rows of K, 64 columns of four bytes (256 bytes), so a panel read with a stride of
256 bytes is four B tiles side by side. K is padded with zero rows to a multiple of 64
(TILE_K) in B and with zero bytes in A's quantized rows, so the last step of K multiplies
zeros on both sides, and a tile never reads past a panel. A's quantized rows are padded to
a multiple of 32 (ROWS) with zero rows, whose sums are never stored. A zero byte times
anything adds exactly 0 to an int32 sum, so every sum is the vpdpbusd GEMM's, bit for bit,
and so is every output: both go through the same epilogue (int8_gemm_gen's q_store).

One block is 32 rows x one panel: two 32-column halves, each four C tiles (tmm0-3) from
two tiles of A (tmm4-5) and two of B (tmm6-7), each tile loaded serving two products, as
nncc/native/gemm_amx_gen.py does; a half with only 16 valid rows or columns multiplies
only the tiles it needs. The int32 sums go to a buffer of 32 x 64 on the thread's stack,
then through q_store. Each pool task loads the tile configuration and releases the tiles
when done (amx.task_c).

Whether the tiles are used is decided twice: at build time, by the target (the code is
compiled only where ``__AMX_INT8__`` is defined, as -march gives it for a target with
amx_tile and amx_int8); at run time, by ``nn_amx_permitted()`` (the OS's permission, and
``NNCC_AMX=0``). Otherwise the step runs the vpdpbusd GEMM over the same padded operands.
Products of fewer than AMX_MIN_ROWS rows always do: a 16-row tile would mostly multiply
padding.
"""

from __future__ import annotations

from nncc.native import amx

NR = 64  # int8_gemm_gen's columns per panel: four B tiles of 16 columns
TILE = 16  # rows of A per tile, columns of C per tile
TILE_K = 64  # bytes of K per row of an A tile (16 groups of four, the rows of a B tile)
ROWS = 32  # rows of A per block (two tiles)
HALF = 32  # columns per half panel (two B tiles)
AMX_MIN_ROWS = 8
CONFIG = "q_cfg"


def wanted(vl: int, m: int) -> bool:
    """Whether the step for code with ``vl`` floats per vector and ``m`` rows of A packs
    for the tiles and carries their product: AVX-512 code (only it may be built with
    AMX), and enough rows to fill tiles."""
    return vl == 16 and m >= AMX_MIN_ROWS


def padded_rows(m: int) -> int:
    return -(-m // ROWS) * ROWS


def _micro(rows: int, cols: int, kp: int) -> str:
    """C of ``q_mt_{rows}x{cols}``: ``rows`` tiles of A (16 rows each, ``kp`` bytes apart)
    by ``cols`` tiles of B (a panel's columns from ``b``) over all of K, int32 sums into
    ``buf`` (rows of NR)."""
    lines = [f"static inline void q_mt_{rows}x{cols}(const uint8_t *a, const int8_t *b, int32_t *buf) {{"]
    lines += [f"    _tile_zero({2 * r + c});" for r in range(rows) for c in range(cols)]
    lines.append(f"    for (int64_t p = 0; p < {kp}; p += {TILE_K}) {{")
    for r in range(rows):
        lines.append(f"        _tile_loadd({4 + r}, a + {r * TILE * kp} + p, {kp});")
        for c in range(cols):
            if r == 0:  # a group of four bytes of K is a row of NR * 4 bytes of the panel
                lines.append(f"        _tile_loadd({6 + c}, b + p * {NR} + {c * TILE * 4}, {NR * 4});")
            lines.append(f"        _tile_dpbusd({2 * r + c}, {4 + r}, {6 + c});")
    lines.append("    }")
    lines += [f"    _tile_stored({2 * r + c}, buf + {r * TILE * NR + c * TILE}, {NR * 4});"
              for r in range(rows) for c in range(cols)]
    lines.append("}")
    return "\n".join(lines) + "\n"


def micro_kernels(kp: int) -> str:
    """C of the four micro-kernels ``q_mt_{1,2}x{1,2}`` over all of K (``kp`` bytes)."""
    return "".join(_micro(r, c, kp) for r in (1, 2) for c in (1, 2))


def block_products() -> list[str]:
    """C lines: one block's int32 sums into ``buf[ROWS][NR]``, from ``a`` (its first row of
    A, ``rows`` valid) and ``bp`` (the panel, ``width`` valid columns), multiplying only the
    tiles that hold valid rows and columns."""
    halves = []
    for h in range(NR // HALF):
        lo = h * HALF
        pick = (f"if (rows > {TILE}) {{ if (width > {lo + TILE}) q_mt_2x2(a, b, out); else q_mt_2x1(a, b, out); }} "
                f"else {{ if (width > {lo + TILE}) q_mt_1x2(a, b, out); else q_mt_1x1(a, b, out); }}")
        halves.append(f"        if (width > {lo}) {{ const int8_t *b = bp + {lo * 4}; int32_t *out = &buf[0][{lo}]; "
                      f"{pick} }}")
    return halves


def source(m: int, n: int, kp: int) -> str:
    """File-scope C after int8_gemm_gen's q_job and q_store: ``q_amx``, the pool task over
    (block x panel) pairs, where the code is built with AMX-INT8 (``Q_AMX`` then
    defined). ``kp``: A's row stride and B's rows a panel, a multiple of TILE_K."""
    assert kp % TILE_K == 0
    blocks, panels = -(-m // ROWS), -(-n // NR)
    last = n - (panels - 1) * NR
    tail = m - (blocks - 1) * ROWS
    halves = block_products()
    body = [
        f"    int32_t buf[{ROWS}][{NR}] __attribute__((aligned(64)));",
        "    memset(buf, 0, sizeof buf);  /* columns a block skips are read (never stored): defined */",
        "    for (int64_t w = lo; w < hi; w++) {",
        f"        int64_t q = w / {blocks}, s = w % {blocks};  /* panel by panel, as q_tiles */",
        f"        int64_t i0 = s * {ROWS};",
        f"        int rows = s == {blocks - 1} ? {tail} : {ROWS};",
        f"        int width = q == {panels - 1} ? {last} : {NR};",
        f"        const uint8_t *a = j->aq + i0 * {kp};",
        f"        const int8_t *bp = j->b + q * {kp // 4 * NR * 4};",
        *halves,
        f"        q_store(j, (const int32_t (*)[{NR}])buf, i0, rows, q, width);",
        "    }"]
    return "\n".join([
        "#if defined(__AMX_TILE__) && defined(__AMX_INT8__)",
        "#include <immintrin.h>",
        "#define Q_AMX 1",
        amx.tile_config(CONFIG, [(TILE, TILE * 4)] * 8),
        micro_kernels(kp),
        "/* the (32-row block x panel) pairs [lo, hi) on tiles: int32 sums, then q_store */",
        "static void q_amx(void *ctx, int64_t lo, int64_t hi) {",
        "    const q_job *j = ctx;",
        *amx.task_c(CONFIG, body),
        "}",
        "#endif",
        ""])


def dispatch(m: int, n: int, k: int, kp: int) -> str:
    """C in the entry point, after A is quantized: the product on tiles, where built and
    permitted, returning; else nothing happens and the vpdpbusd product follows."""
    blocks, panels = -(-m // ROWS), -(-n // NR)
    pad = (padded_rows(m) - m) * kp
    zero = f"        memset(j.aq + {m * kp}, 0, {pad});  /* the last block's padding rows */\n" if pad else ""
    return (f"#ifdef Q_AMX\n    if ({amx.PERMITTED}) {{\n{zero}"
            f"        nn_parallel({blocks * panels}, {m * n * k}, q_amx, &j);\n        return;\n    }}\n#endif\n")
