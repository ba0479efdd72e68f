"""Grouped convolutions whose groups are narrower than a vector block, over the blocked layout.

RegNet's and ResNeXt's 3x3 convolutions have groups of 4 or 8 channels in and out: with
16-float vectors a block holds several groups, so the direct convolution (each input
channel broadcast to every lane of the output block, nncc/native/blocked_conv.py) would
multiply each input by the weights of every group in the block, and an input lane's NaN or
infinity would reach another group's outputs through its zero weights.

Here output block j reads input block j only (a group's C/group = K/group = cg input and
output channels sit in the same lanes of the same block, as vl % cg == 0). For each
channel l of a group, one lane permute of an input pixel's vector puts, in every output
lane, that lane's group's l-th input channel (lane o reads lane o // cg * cg + l); a
multiply-add by the packed weights [CB][KH][KW][cg][VL] (lane o: output channel o's weight
of its group's l-th input) then adds only products of the same group, every lane useful.
One permuted input column serves every tap that reads it (kw taps of as many output
pixels at stride 1), so a row of RW outputs costs (RW - 1) * sw + kw permutes per tap row
and channel for RW * kw multiply-adds. Tasks, row tiling and edge handling are the
depthwise convolution's: (image, block, output row), tiles at fixed columns, the edge
tiles' out-of-row taps dropped at compile time.
"""

from __future__ import annotations

import numpy as np

from nncc.native.blocked_conv import Conv2d, block_row_task, block_tile_head, blocks, parallel_call, tile_epilogue, \
    vector_registers


def applies(g: Conv2d, vl: int) -> bool:
    """A grouped convolution (not depthwise) whose groups have as many input as output
    channels, fewer than a block and dividing it."""
    if g.group <= 1 or g.depthwise or g.c % g.group or g.k % g.group:
        return False
    cg, kg = g.c // g.group, g.k // g.group
    return cg == kg and 1 < cg < vl and vl % cg == 0


def pointwise(g: Conv2d) -> bool:
    """A 1x1, stride-1, unpadded convolution: over NCHW, conv_gen.grouped_pointwise's."""
    return g.kh == g.kw == 1 and g.sh == g.sw == 1 and not (g.pt or g.pl or g.pb or g.pr)


def pack_weights(w: np.ndarray, vl: int) -> np.ndarray:
    """[K, cg, KH, KW] -> [CB][KH][KW][cg][VL]: lane o of (block j, tap, l) is output channel
    j * VL + o's weight of its group's l-th input channel; zero past K."""
    k, cg, kh, kw = w.shape
    full = np.zeros((blocks(k, vl) * vl, cg, kh, kw), np.float32)
    full[:k] = w
    # [CB, VL, cg, KH, KW] -> [CB, KH, KW, cg, VL]
    return np.ascontiguousarray(full.reshape(-1, vl, cg, kh, kw).transpose(0, 3, 4, 2, 1))


# C for a permute of literal lanes: __builtin_shufflevector (clang, GCC 12 and later), else
# GCC's __builtin_shuffle with a constant index vector
PERMUTE = """#ifndef NN_PERMUTE
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define NN_PERMUTE(v, ...) __builtin_shufflevector(v, v, __VA_ARGS__)
#endif
#endif
#ifndef NN_PERMUTE
#define NN_PERMUTE(v, ...) __builtin_shuffle(v, (nn_vi){__VA_ARGS__})
#endif
#endif
"""


def tile_width(g: Conv2d, vl: int) -> int:
    """Pixels per tile: accumulators beside the kw weight vectors, the input column, its
    permute and the permute's index (AVX-512: at most 16 of 32 registers; 8 of 16), the
    row split into tiles of nearly equal width."""
    most = 16 if vector_registers(vl) == 32 else 8
    tiles = -(-g.ow // most)
    return -(-g.ow // tiles)


def narrow_group_conv(g: Conv2d, vl: int, ptrs: dict[str, str | None], act: int, p0: str, p1: str) -> tuple[str, str]:
    """(support C, call statement) for the convolution, blocked in and out."""
    has_bias = ptrs.get("b") is not None
    has_res = ptrs.get("r") is not None
    cg = g.c // g.group
    cb = blocks(g.k, vl)
    rw = tile_width(g, vl)
    plane_out = g.oh * g.ow * vl

    def lanes(l: int) -> str:
        return ", ".join(str(o // cg * cg + l) for o in range(vl))

    def tile(r_count: int) -> str:
        out = block_tile_head(g, vl, r_count, has_bias) + [f"    const float *wi = wc + i * {g.kw * cg * vl};"]
        # the taps by the input column they read: offset d from the tile's first column
        columns: dict[int, list[tuple[int, int]]] = {}
        for r in range(r_count):
            for j in range(g.kw):
                columns.setdefault(r * g.sw + j * g.dw, []).append((r, j))
        for l in range(cg):
            out.append("    {")
            out += [f"      const nn_v w{j} = nn_vload(wi + {(j * cg + l) * vl});" for j in range(g.kw)]
            for d, taps in sorted(columns.items()):
                col = f"(ow0 * {g.sw} + {d - g.pl})"
                fmas = " ".join(f"a{r}_0 = nn_vfma(p, w{j}, a{r}_0);" for r, j in taps)
                out.append(f"      if (inner || (uint64_t){col} < {g.w}) {{ "
                           f"const nn_v p = NN_PERMUTE(nn_vload(xi + {col} * {vl}), {lanes(l)}); {fmas} }}")
            out.append("    }")
        out.append("  }")
        out += ["  " + line for line in tile_epilogue(1, r_count, vl, has_res, act, p0, p1, plane_out)]
        out.append("}")
        return "\n".join(out)

    widths, task = block_row_task("narrow_task", g, vl, rw, g.kh * g.kw * cg * vl)
    support = [f"NN_REQUIRE_VL({vl});", PERMUTE] + [tile(r) for r in widths] + [task]
    work = g.n * cb * vl * g.oh * g.ow * g.kh * g.kw * cg
    return "\n".join(support) + "\n", parallel_call(ptrs, g.n * cb * g.oh, work, "narrow_task")
