"""Intel AMX tiles for generated kernels: whether a target may use them, and the C a kernel
needs to use them (a tile configuration per shape, and the per-thread discipline).

AMX has eight tile registers (tmm0-7) of up to 16 rows of 64 bytes, and a matrix unit that
multiplies them (``tdpbf16ps``: bfloat16 pairs, ``tdpbssd`` and kin: int8 quadruples),
adding into float32 or int32 tiles. Using them takes three things:

- Permission. Linux gives a process the tiles' 8 KB register state only on request
  (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); a process that uses a tile
  without it dies of SIGILL. The runtime asks once per library, on the first call that
  wants tiles (``nn_amx_permitted()`` in runtime.c, thread-safe), and a kernel that is
  refused computes the same product without tiles. ``NNCC_AMX=0`` (or off, no, false)
  never asks: the code then always takes its path without tiles.
- A configuration per thread. Tile shapes are set by ``ldtilecfg`` from a 64-byte record
  (``tile_config``), per thread: every task a pool thread runs loads the configuration it
  needs before its first tile instruction.
- A release. ``tilerelease`` after the task returns the tiles to their initial state, so
  the kernel need not save 8 KB of dirty tile state at every context switch of a thread
  that is done with them.

Code for a target uses AMX only where the target's features include amx_tile and the
instructions' own feature (``usable``): for "native", the host's; the named x86-64 levels
include neither, so their code never does.
"""

from __future__ import annotations

from nncc.native.toolchain import required_features

TILE_ROWS = 16  # rows a tile holds at most
TILE_BYTES = 64  # bytes per row at most
TILES = 8  # tile registers

# the runtime's (runtime.c) answer to whether this process may use the tiles; prelude.h
# declares it
PERMITTED = "nn_amx_permitted()"


def usable(target: str, feature: str = "amx_bf16") -> bool:
    """Whether code for ``target`` may use AMX tiles with the instructions of ``feature``
    (amx_bf16 or amx_int8, as /proc/cpuinfo names them)."""
    features = set(required_features(target))
    return "amx_tile" in features and feature in features


def tile_config(name: str, shapes: list[tuple[int, int]]) -> str:
    """C of a palette-1 tile configuration named ``name`` for ``ldtilecfg``:
    ``shapes[i]`` = (rows, bytes per row) of tmm i; the tiles not named are unused (0 x 0)."""
    if len(shapes) > TILES:
        raise ValueError(f"AMX has {TILES} tiles, not {len(shapes)}")
    record = [0] * 64
    record[0] = 1  # palette 1: eight tiles of up to 16 rows x 64 bytes
    for i, (rows, colsb) in enumerate(shapes):
        if not (0 < rows <= TILE_ROWS and 0 < colsb <= TILE_BYTES and colsb % 4 == 0):
            raise ValueError(f"tile {i}: {rows} rows of {colsb} bytes is not a tile")
        record[16 + 2 * i] = colsb & 0xFF  # bytes per row, 16 bits each from byte 16
        record[17 + 2 * i] = colsb >> 8
        record[48 + i] = rows  # rows, a byte each from byte 48
    body = ", ".join(str(b) for b in record)
    return f"static const unsigned char {name}[64] __attribute__((aligned(64))) = {{{body}}};\n"


def task_head(name: str, input_type: str, floats: int) -> list[str]:
    """The first C lines of a tile convolution's pool task ``name``: its arguments (the
    rounded input as ``input_type`` words, the packed weights, bias, residual, output) by
    their names xb, wp, bp, rp and yp, and a stack buffer of ``floats`` tile sums."""
    return [f"static void {name}(void *q_, int64_t lo, int64_t hi) {{",
            "  const float *const *a = q_;",
            f"  const {input_type} *xb = (const {input_type} *)a[0];",
            "  const uint32_t *wp = (const uint32_t *)a[1];",
            "  const float *bp = a[2], *rp = a[3];",
            "  float *yp = (float *)a[4];",
            f"  float buf[{floats}] __attribute__((aligned(64)));"]


def task_c(config: str, body: list[str]) -> list[str]:
    """C lines of a pool task's body that uses tiles: the thread loads ``config`` first and
    releases the tiles after ``body`` (lines)."""
    return [f"  _tile_loadconfig({config});"] + body + ["  _tile_release();"]
