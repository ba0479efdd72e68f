"""The pixel-major int8 convolution (nncc/native/int8_conv_gen.py) on AMX tiles, for code
built with AMX-INT8 (nncc/native/amx.py).

The convolution is a product of the gathered pixel rows (A: one row of K bytes per output
pixel) by the weights packed in int8_gemm_gen's panels, so int8_gemm_amx_gen's tiles
multiply it unchanged: 32 pixels x one 64-channel panel a block, four int32 C tiles from
two tiles of A and two of B, over K padded with zero bytes to the tile's 64 in both the
gathered rows and the packed weights. The gathered rows are padded to a multiple of 32 with
zero rows, whose sums are never stored. A zero byte adds exactly 0 to an int32 sum, so
every sum is the vpdpbusd micro-kernel's, bit for bit, and the block's sums go through the
same epilogue (``qc_finish``, six pixels at a time), so every output is the VNNI path's.

The tiles are used where the code is built with AMX-INT8 and the runtime is permitted them
(``nn_amx_permitted()``: the OS's permission, and ``NNCC_AMX=0``); otherwise the same step
runs the vpdpbusd tiles over the same padded operands.
"""

from __future__ import annotations

from nncc.native import amx, int8_gemm_amx_gen as tiles
from nncc.native.int8_gemm_gen import MR

ROWS = tiles.ROWS
NR = tiles.NR
TILE_K = tiles.TILE_K
CONFIG = "qc_cfg"


def wanted(vl: int, pixels: int) -> bool:
    """Whether the layer's operands are padded for the tiles and carry their product:
    AVX-512 code (only it may be built with AMX), and enough pixels to fill tiles."""
    return tiles.wanted(vl, pixels)


def padded_k(k: int, use_tiles: bool) -> int:
    """A gathered row's bytes and the packed weights' rows a panel."""
    step = TILE_K if use_tiles else 4
    return -(-k // step) * step


def padded_rows(pixels: int, use_tiles: bool) -> int:
    return tiles.padded_rows(pixels) if use_tiles else pixels


def source(pixels: int, m: int, kp: int, panel_stride: int, gather_here: bool, block_tail: int = 0) -> str:
    """File-scope C after int8_conv_gen's qc_job, qc_gather and qc_finish: ``qc_amx``, the
    pool task over (32-pixel block x panel) pairs, where the code is built with AMX-INT8
    (``QC_AMX`` then defined). ``gather_here``: each block's rows are gathered by its task
    (one panel), else they were gathered before. ``block_tail``: the rows are the image's own
    pixels, and the last block's ``block_tail`` rows are read from ``j->pad`` instead, a copy
    padded with zero rows to the block (the image ends with its pixels)."""
    assert kp % TILE_K == 0
    blocks, panels = -(-pixels // ROWS), -(-m // NR)
    last = m - (panels - 1) * NR
    tail = pixels - (blocks - 1) * ROWS
    gather = "        qc_gather(ctx, p0, p0 + rows);\n" if gather_here else ""
    body = [
        f"    int32_t buf[{ROWS}][{NR}] __attribute__((aligned(64)));",
        "    memset(buf, 0, sizeof buf);  /* columns a block skips are read (never stored): defined */",
        "    for (int64_t w = lo; w < hi; w++) {",
        f"        int64_t q = w / {blocks}, s = w % {blocks};  /* panel by panel, as qc_tiles */",
        f"        int64_t p0 = s * {ROWS};",
        f"        int rows = s == {blocks - 1} ? {tail} : {ROWS};",
        f"        int width = q == {panels - 1} ? {last} : {NR};",
        gather.rstrip("\n"),
        f"        const uint8_t *a = j->a + p0 * {kp};" if not block_tail else
        f"        const uint8_t *a = s == {blocks - 1} ? j->pad : j->a + p0 * {kp};",
        f"        const int8_t *bp = j->b + q * {panel_stride};",
        *tiles.block_products(),
        f"        for (int r0 = 0; r0 < rows; r0 += {MR})  /* the VNNI tiles' epilogue, {MR} pixels at a time */",
        f"            qc_finish(j, (const int32_t (*)[{NR}])buf[r0], p0 + r0, rows - r0 < {MR} ? rows - r0 : {MR}, q, width);",
        "    }"]
    return "\n".join([
        "#if defined(__AMX_TILE__) && defined(__AMX_INT8__)",
        "#include <immintrin.h>",
        "#define QC_AMX 1",
        amx.tile_config(CONFIG, [(tiles.TILE, tiles.TILE * 4)] * 8),
        tiles.micro_kernels(kp),
        "/* the (32-pixel block x panel) pairs [lo, hi) on tiles: int32 sums, then qc_finish */",
        "static void qc_amx(void *ctx, int64_t lo, int64_t hi) {",
        "    const qc_job *j = ctx;",
        *[line for line in amx.task_c(CONFIG, body) if line],
        "}",
        "#endif",
        ""])


def dispatch(pixels: int, m: int, k: int, kp: int) -> str:
    """C in the entry point's image loop, after the input's bytes (and, with several
    panels, the rows) are ready: the product on tiles, where built and permitted,
    continuing with the next image; else nothing happens and the vpdpbusd tiles follow."""
    blocks, panels = -(-pixels // ROWS), -(-m // NR)
    return (f"#ifdef QC_AMX\n        if ({amx.PERMITTED}) {{\n"
            f"            nn_parallel({blocks * panels}, {pixels * m * k}, qc_amx, &j);\n"
            f"            continue;\n        }}\n#endif\n")
