"""Convolutions over the channel-blocked layout, as C with every size a literal.

The blocked layout (NCHWc) stores an activation [N, C, H, W] as [N, C/VL, H, W, VL]: VL
channels (the vector width, nncc/native/isa.py) side by side, so one vector load reads one
pixel of VL channels, the channel count is rounded up to a whole block, and the extra lanes
of the last block hold values no real lane ever depends on (every kernel here skips them).

A direct convolution computes a tile of RW output pixels x OCB channel blocks in registers
(the micro-kernel): for each input channel it loads OCB weight vectors and broadcasts RW
input values, so each loaded value feeds several multiply-adds. Weights are packed at
compile time into the order the micro-kernel streams them, [OCG][ICB][KH][KW][LB][OCB*VL],
and bias, the residual add and the activation are applied in the tile's store. Output rows
are split into tiles at fixed columns; the tiles that touch the left or right padding are
calls with literal positions, so the compiler drops the taps that fall outside the input
at compile time, and the interior runs a loop with no checks at all. Rows' taps are
clipped at run time (once per row). The work is shared over the pool as (image, channel
group, chunk of output rows) tasks, or (image, chunk of rows) ones sweeping every channel
group where the input outweighs the weights, so a batch is part of the same tiling.

A depthwise convolution is the same tiling with one vector of channels per pixel and no
broadcast: every tap is a vector multiply-add of input and weight. A grouped convolution
whose groups are whole blocks is the direct one per group: a tile's channel blocks stay in
one group, and its task reads that group's input blocks only. Groups narrower than a block
have a kernel of their own (nncc/native/narrow_group_conv.py): a broadcast input channel
here would be multiplied by every group's weights in the block.

Under precision bf16, where vdpbf16ps pays, the direct convolution over a blocked input
multiplies pairs of input channels in bfloat16 (nncc/native/conv_bf16.py): the same tiling
over words of two channels, its input rounded into scratch first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nncc.native import conv_bf16
from nncc.native.activations import CODES, SCALAR_ONLY


@dataclass(frozen=True)
class Conv2d:
    """One 2-D convolution's geometry: input [n, c, h, w], output [n, k, oh, ow]."""

    n: int
    c: int
    h: int
    w: int
    k: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    pt: int  # pads: top, left, bottom, right
    pl: int
    pb: int
    pr: int
    group: int = 1

    @property
    def depthwise(self) -> bool:
        return self.group == self.c == self.k

    def whole_block_groups(self, vl: int) -> bool:
        """A grouped convolution whose every group's input and output channels are whole
        blocks: each output block then reads its own group's input blocks only, so it runs
        as a dense convolution over those (the weights [K, C/group, KH, KW] are already
        that dense convolution's)."""
        return self.group > 1 and not self.depthwise and (self.c // self.group) % vl == 0 \
            and (self.k // self.group) % vl == 0

    def interior(self) -> tuple[int, int]:
        """Output columns [lo, hi) whose every tap lies inside the input row."""
        lo = -(-self.pl // self.sw)
        hi = (self.w - 1 + self.pl - (self.kw - 1) * self.dw) // self.sw + 1
        hi = min(max(hi, lo), self.ow)
        return min(lo, self.ow), hi


def blocks(channels: int, vl: int) -> int:
    return -(-channels // vl)


# ---------------------------------------------------------------------------- packing


def pack_direct_weights(w: np.ndarray, vl: int, ocb: int, plain_input: bool) -> np.ndarray:
    """[K, C, KH, KW] -> [OCG][ICB][KH][KW][LB][OCB*VL], zero where channels are padding.
    LB (lanes per input block) is VL for a blocked input, C for a plain (NCHW) one."""
    k, c, kh, kw = w.shape
    kb = blocks(k, vl)
    lb = c if plain_input else vl
    icb = blocks(c, lb)
    full = np.zeros((kb * vl, icb * lb, kh, kw), np.float32)
    full[:k, :c] = w
    # [OCG, OCB*VL, ICB, LB, KH, KW] -> [OCG, ICB, KH, KW, LB, OCB*VL]
    grouped = full.reshape(kb // ocb, ocb * vl, icb, lb, kh, kw)
    return np.ascontiguousarray(grouped.transpose(0, 2, 4, 5, 3, 1))


def pack_depthwise_weights(w: np.ndarray, vl: int) -> np.ndarray:
    """[C, 1, KH, KW] -> [CB][KH][KW][VL]."""
    c, _, kh, kw = w.shape
    full = np.zeros((blocks(c, vl) * vl, kh, kw), np.float32)
    full[:c] = w[:, 0]
    return np.ascontiguousarray(full.reshape(-1, vl, kh, kw).transpose(0, 2, 3, 1))


def pack_channels(v: np.ndarray, channels: int, vl: int) -> np.ndarray:
    """A per-channel vector (bias), zero-padded to whole blocks."""
    out = np.zeros(blocks(channels, vl) * vl, np.float32)
    out[:channels] = np.asarray(v, np.float32).reshape(-1)
    return out


# ---------------------------------------------------------------------------- choices


def vector_registers(vl: int) -> int:
    """The vector registers of the ISA whose vectors hold ``vl`` floats (nncc/native/isa.py):
    32 zmm with AVX-512, 16 ymm with AVX2 (and 16 xmm or NEON q registers otherwise)."""
    return 32 if vl == 16 else 16


# The register tiles, by the size of the vector register file, in this one place:
# (accumulators of a direct tile, its most channel blocks, pixels of a depthwise tile). A
# direct tile's accumulators, its OCB weight vectors and one broadcast fit the file
# (AVX-512: 24 + 4 + 1 of 32). With AVX2, 10 accumulators, not 12: the compiler keeps a
# row's taps' weight vectors live too, and a 2-block tile 6 pixels wide ran slower than one
# 5 wide (measured on 3x3 stride-2 layers: 5 wide took 0.75-0.8 of the time 4 wide did,
# 6 wide 1.2); a depthwise tile leaves room for its weight vector, the input vector and the
# epilogue's constants.
TILES = {32: (24, 4, 12), 16: (10, 3, 8)}


def choose_tiling(g: Conv2d, vl: int) -> tuple[int, int]:
    """(OCB, RW): channel blocks and pixels per micro-kernel tile, within the register
    file's budget (TILES)."""
    budget, most, _ = TILES[vector_registers(vl)]
    kb = blocks(g.k // g.group, vl)  # a tile's channel blocks stay inside one group
    width = _row_width(g)

    def widest_cheapest(ocb: int) -> tuple[float, int]:
        """(cost per channel block of a row, width) of the cheapest tile width for ``ocb``."""
        widest = budget // ocb
        if width <= widest:
            return _row_cost(width, width, ocb) / ocb, width
        # the width whose tiles, the row's last partial one included, cost least
        best = min(range(max(1, widest // 2), widest + 1), key=lambda r: (_row_cost(width, r, ocb), -r))
        return _row_cost(width, best, ocb) / ocb, best

    # the channel blocks whose tiles cost least per block: 2 x 5 pixels (10 accumulators)
    # before 3 x 3 (9, each step below the multiply-add's latency), the larger on a tie
    options = {ocb: widest_cheapest(ocb) for ocb in range(1, most + 1) if kb % ocb == 0}
    ocb = min(options, key=lambda o: (options[o][0], -o))
    return ocb, options[ocb][1]


# FMA slots (two a cycle) a tile's step takes at least, however few its accumulators: the
# multiply-add's latency, as each accumulator waits for its previous one. A tile of fewer
# accumulators runs no faster than this, so narrowing every tile to spare the last one its
# waste (a row of 32 as eight tiles of 4, 8 accumulators with 2 channel blocks) costs more
# than the waste does (six tiles of 5 and one of 2).
FMA_LATENCY_SLOTS = 10


def _row_cost(width: int, r: int, ocb: int) -> int:
    """FMA slots per input channel and tap of a row of ``width`` pixels in tiles of ``r``:
    each tile's multiply-adds, its loads (two a cycle too) or the latency, whichever bounds."""
    def tile(p: int) -> int:
        return max(ocb * p, ocb + p, FMA_LATENCY_SLOTS)
    return width // r * tile(r) + (tile(width % r) if width % r else 0)


def sweeps_groups(g: Conv2d, vl: int, ocb: int, weights_per_image: bool) -> bool:
    """Whether a task of the direct convolution takes every channel group over its rows
    (the input read once, each row reused by every group while in L2) rather than one group
    over them (each group's weights read once): where the input's bytes exceed the weights'.
    On the AVX2 EPYC, ResNet-50's early layers ran in 0.63-0.77 of the time they took with
    one group a task (256 to 64 channels over 56 x 56: 1.80 ms to 1.39 at one thread)."""
    if weights_per_image or g.group > 1:
        return False
    ocg = blocks(g.k, vl) // ocb
    weights = g.k * g.c * g.kh * g.kw
    image = g.n * g.c * g.h * g.w
    return ocg > 1 and image > weights


def _flat(g: Conv2d) -> bool:
    """A 1x1, stride-1, unpadded convolution reads its input as one long row per image."""
    return g.kh == g.kw == 1 and g.sh == g.sw == 1 and not (g.pt or g.pl or g.pb or g.pr)


def _row_width(g: Conv2d) -> int:
    return g.oh * g.ow if _flat(g) else g.ow


# ---------------------------------------------------------------------------- C text


@dataclass(frozen=True)
class _Addressing:
    """Element strides (in floats) of the input as the micro-kernel reads it."""

    n: int  # per image
    c: int  # per input channel block
    h: int  # per input row
    w: int  # per input column
    lane: int  # per channel within a block
    lanes: int  # LB: channels per block
    blocks: int  # ICB
    last: int  # channels in the last block


def _input_addressing(g: Conv2d, vl: int, plain: bool) -> _Addressing:
    """Of a group's input channels (all of them, ungrouped): ``blocks`` counts one group's."""
    if plain:
        return _Addressing(g.c * g.h * g.w, g.c * g.h * g.w, g.w, 1, g.h * g.w, g.c, 1, g.c)
    icb = blocks(g.c, vl)
    if g.group > 1:  # whole_block_groups: every group's blocks are full
        return _Addressing(icb * g.h * g.w * vl, g.h * g.w * vl, g.w * vl, vl, 1, vl, icb // g.group, vl)
    return _Addressing(icb * g.h * g.w * vl, g.h * g.w * vl, g.w * vl, vl, 1, vl, icb, g.c - (icb - 1) * vl)


def _pair_addressing(a: _Addressing) -> _Addressing:
    """A blocked input's addressing in 32-bit words of bfloat16 pairs (nncc/native/conv_bf16.py):
    every stride and block halved, the last block's channels rounded up to whole pairs."""
    return _Addressing(a.n // 2, a.c // 2, a.h // 2, a.w // 2, 1, a.lanes // 2, a.blocks, -(-a.last // 2))


# The activations nn_vact cannot compute (SCALAR_ONLY) are applied after the store, so their
# constants and temporaries never compete with a tile's accumulators for registers. Those
# simd.h has a vector function for run it vector by vector; the lane-by-lane loop (which
# the compiler vectorizes, but with every range check of the scalar exp) cost several times
# the convolution itself in a SiLU network's depthwise layers.
VECTOR_AFTER_STORE = {CODES["Sigmoid"]: "nn_vsigmoid", CODES["Silu"]: "nn_vsilu", CODES["Mish"]: "nn_vmish"}


def stored(v: str, residual: str | None, act: int, p0: str, p1: str) -> str:
    """The vector a store writes: ``v`` plus the residual vector at ``residual`` (a C
    pointer expression), activated (the SCALAR_ONLY ones are applied after the store, by
    ``after_store``)."""
    if residual:
        v = f"nn_vadd({v}, nn_vload({residual}))"
    if act and act not in SCALAR_ONLY:
        v = f"nn_vact({act}, {v}, {p0}, {p1})"
    return v


def after_store(act: int, start: str, vectors: int | str, vl: int, p0: str, p1: str) -> str:
    """C applying a SCALAR_ONLY activation in place to ``vectors`` vectors stored from the
    C pointer ``start``; empty for any other activation (``stored`` applied it)."""
    if act not in SCALAR_ONLY:
        return ""
    if act in VECTOR_AFTER_STORE:
        return (f"for (int64_t q = 0; q < {vectors}; q++) {{ float *e = {start} + q * {vl}; "
                f"nn_vstore(e, {VECTOR_AFTER_STORE[act]}(nn_vload(e))); }}")
    return (f"for (int64_t q = 0; q < ({vectors}) * {vl}; q++) {{ float *e = {start} + q; "
            f"*e = nn_act({act}, *e, {p0}, {p1}); }}")


def tile_epilogue(ocb: int, rw: int, vl: int, has_res: bool, act: int, p0: str, p1: str, plane: int) -> list[str]:
    """Stores of the accumulators ``a{r}_{o}`` to y (+ residual r), activation applied."""
    lines = []
    for o in range(ocb):
        for r in range(rw):
            off = f"{o * plane} + (ow0 + {r}) * {vl}"
            lines.append(f"nn_vstore(y + {off}, {stored(f'a{r}_{o}', f'res + {off}' if has_res else None, act, p0, p1)});")
    for o in range(ocb):
        lines.append(after_store(act, f"y + {o * plane} + ow0 * {vl}", rw, vl, p0, p1))
    return [line for line in lines if line]


def _row_taps(g: Conv2d, indent: str) -> list[str]:
    """C computing, for output row ``oh``, its first input row ``ih0`` and the taps
    [i0, i1) that fall inside the input."""
    return [f"{indent}const int64_t ih0 = oh * {g.sh} - {g.pt};",
            f"{indent}const int i0 = ih0 >= 0 ? 0 : (int)((-ih0 + {g.dh - 1}) / {g.dh});",
            f"{indent}const int64_t top = {g.h - 1} - ih0;",
            f"{indent}const int i1 = top < 0 ? 0 : (top / {g.dh} + 1 < {g.kh} ? (int)(top / {g.dh} + 1) : {g.kh});"]


def _column_tiles(width: int, rw: int, lo: int, hi: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """Tiles of ``rw`` columns at multiples of rw: (all starts, those wholly inside the
    interior [lo, hi), those left of them, those right of them)."""
    starts = list(range(0, width, rw))
    inner = [s for s in starts if s >= lo and s + rw <= hi]
    left = [s for s in starts if not inner or s < inner[0]]
    right = [s for s in starts if inner and s > inner[-1]]
    return starts, inner, left, right


L2_WEIGHTS = 384 * 1024  # bytes of packed weights a task keeps hot while it sweeps its rows
# Bytes of one group's packed weights a row's tiles stream from L1 (a quarter of 32 KiB). A
# chunk that small costs a load and a store of the tile's partial sums per chunk, far less
# than streaming the weights from L2: on the AVX2 EPYC the layers whose weights outweigh
# their input (ResNet-50's last stages) ran at 0.74-0.9 of the time chunks sized for L2 took.
L1_WEIGHTS = 8 * 1024
TASKS = 8  # at least this many tasks per convolution, so two to four threads share evenly


def direct_conv(g: Conv2d, vl: int, plain_input: bool, ptrs: dict[str, str | None],
                act: int, p0: str, p1: str, weights_per_image: bool = False, bf16: bool = False) -> tuple[str, str]:
    """(support C, call statement) for a direct convolution writing the blocked layout.
    ``ptrs``: C expressions for x (input), w (packed weights), b (packed bias), r (the
    blocked residual) and y; b and r may be None.

    A task is (image, channel group, chunk of output rows), or (image, chunk of output
    rows) over every channel group where the input outweighs the weights (``sweeps_groups``).
    It sweeps its rows once per chunk of input channels, the chunk sized so one group's
    packed weights for it stay in L1 while a row's tiles reuse them (and every group's the
    task sweeps in L2 over its rows); partial sums wait in the output, and the bias, residual and
    activation are applied by the last chunk's store. ``weights_per_image``: each image
    has weights of its own (Winograd's 36 products)."""
    has_bias, has_res = ptrs.get("b") is not None, ptrs.get("r") is not None
    ocb, rw = choose_tiling(g, vl)
    flat = _flat(g)
    a = _input_addressing(g, vl, plain_input)
    if bf16:
        if plain_input or weights_per_image:
            raise ValueError("the bfloat16 convolution reads a blocked input")
        a = _pair_addressing(a)
    kb = blocks(g.k, vl)
    ocg = kb // ocb
    per_block = g.kh * g.kw * a.lanes * ocb * vl  # packed floats per input block and group
    plane = g.oh * g.ow * vl  # floats per output channel block
    full_blocks = a.blocks if a.last == a.lanes else a.blocks - 1
    # a grouped convolution's channel group g reads its own convolution group's input blocks
    group_x = f" + g / {ocg // g.group} * {a.blocks * a.c}" if g.group > 1 else ""
    if flat:  # one long row per image, cut into rows of whole tiles
        pixels = g.oh * g.ow
        roww = rw * max(1, min(16, -(-pixels // rw) // 4 or 1))
        rows, last_w = -(-pixels // roww), pixels - (-(-pixels // roww) - 1) * roww
        lo, hi, width = 0, roww, roww
    else:
        rows, width = g.oh, g.ow
        lo, hi = g.interior()
    # Which operand a task keeps: when the input is larger than the weights (the early,
    # wide layers), a task is a chunk of rows over every channel group, so each row's input
    # is read from memory once and reused by every group while in L2; otherwise a task is
    # one group over a chunk of rows, so each group's weights are read once.
    gpt = ocg if sweeps_groups(g, vl, ocb, weights_per_image) else 1
    groups = ocg // gpt
    row_chunks = min(rows, max(1, -(-TASKS // (g.n * groups))))
    rows_per = -(-rows // row_chunks)
    row_chunks = -(-rows // rows_per)
    # A chunk of input channels: one group's packed weights for it stay in L1 while a row's
    # tiles reuse them, and every group a task sweeps keeps its chunk in L2 over the rows.
    kc = max(1, min(a.blocks, L1_WEIGHTS // (per_block * 4), L2_WEIGHTS // (per_block * 4 * gpt)))
    nkc = -(-a.blocks // kc)

    def tile(r_count: int) -> str:
        """The micro-kernel for ``r_count`` pixels starting at column ow0 (pixel ow0 of a
        flat row); ``inner`` (a literal at each call) says every tap is inside the row."""
        out = [f"static inline __attribute__((always_inline)) void tile{r_count}(const float *restrict x, "
               "const float *restrict wg, const float *restrict bias, const float *restrict res, "
               "float *restrict y, int64_t xrow, int64_t ow0, int i0, int i1, const int inner, "
               "int cb0, int cb1, int first, int last) {"]
        for o in range(ocb):
            init = f"nn_vload(bias + {o * vl})" if has_bias else "nn_vzero()"
            out.append(f"  const nn_v b{o} = first ? {init} : nn_vzero();")
            out.append("  nn_v " + ", ".join(f"a{r}_{o} = first ? b{o} : nn_vload(y + {o * plane} + (ow0 + {r}) * {vl})"
                                            for r in range(r_count)) + ";")

        def block(lanes: int, icb: str) -> list[str]:
            body = ["    for (int i = i0; i < i1; i++) {",
                    f"      const float *xi = x + xrow + ({icb}) * {a.c} + i * {g.dh * a.h};",
                    f"      const float *wi = wg + (({icb}) * {g.kh} + i) * {g.kw * a.lanes * ocb * vl};",
                    "      #pragma GCC unroll 4",
                    f"      for (int l = 0; l < {lanes}; l++) {{"]
            for j in range(g.kw):
                for o in range(ocb):
                    body.append(f"        const nn_v w{j}_{o} = nn_vload(wi + ({j * a.lanes} + l) * {ocb * vl} + {o * vl});")
                for r in range(r_count):
                    col = f"((ow0 + {r}) * {g.sw} + {j * g.dw - g.pl})"
                    fmas = " ".join(conv_bf16.fma(f"a{r}_{o}", "xv", f"w{j}_{o}") if bf16 else
                                    f"a{r}_{o} = nn_vfma(xv, w{j}_{o}, a{r}_{o});" for o in range(ocb))
                    load = f"const nn_v xv = nn_vset1(xi[{col} * {a.w} + l * {a.lane}]);"
                    if flat:
                        body.append(f"        {{ {load} {fmas} }}")
                    else:
                        body.append(f"        if (inner || (uint64_t){col} < {g.w}) {{ {load} {fmas} }}")
            body += ["      }", "    }"]
            return body

        if full_blocks:
            out.append(f"  for (int icb = cb0; icb < (cb1 < {full_blocks} ? cb1 : {full_blocks}); icb++) {{")
            out += block(a.lanes, "icb")
            out.append("  }")
        if full_blocks < a.blocks:
            out.append(f"  if (cb1 == {a.blocks}) {{")
            out += block(a.last, str(a.blocks - 1))
            out.append("  }")
        out.append("  if (!last) {")
        out += [f"    nn_vstore(y + {o * plane} + (ow0 + {r}) * {vl}, a{r}_{o});"
                for o in range(ocb) for r in range(r_count)]
        out.append("    return;")
        out.append("  }")
        out += ["  " + line for line in tile_epilogue(ocb, r_count, vl, has_res, act, p0, p1, plane)]
        out.append("}")
        return "\n".join(out)

    starts, inner, left, right = _column_tiles(width, rw, lo, hi)
    widths = {min(rw, width - s) for s in starts}
    if flat and last_w % rw:
        widths.add(last_w % rw)
    support = [f"NN_REQUIRE_VL({vl});"] + [tile(r) for r in sorted(widths)]
    convert = ""
    if bf16:
        cvt_support, cvt_call = conv_bf16.convert(g.n, g.c, g.h, g.w, vl)
        support = [conv_bf16.HEADER, cvt_support] + support
        convert = f"{{ const float *cvt_in[2] = {{{ptrs['x']}, (const float *)({ptrs['xb']})}}; {cvt_call} }}\n"
        ptrs = {**ptrs, "x": f"(const float *)({ptrs['xb']})"}

    def call(s: int, inner_flag: int, pos: str | None = None, w: int | None = None) -> str:
        """Edge tiles get literal positions, so their out-of-row taps vanish at compile time."""
        return (f"tile{w or min(rw, width - s)}(x, wg, bias, res, y, xrow, {pos or s}, i0, i1, {inner_flag}, "
                "cb0, cb1, kc == 0, kc == NKC - 1);")

    body = [f"#define NKC {nkc}",
            "static void conv_task(void *p, int64_t lo, int64_t hi) {",
            "  const float *const *a = p;",
            "  const float *x = a[0], *wp = a[1], *bp = a[2], *rp = a[3];",
            "  float *yp = (float *)a[4];",
            "  for (int64_t t = lo; t < hi; t++) {",
            f"    const int64_t rc = t % {row_chunks}, gc = (t / {row_chunks}) % {groups}, n = t / {row_chunks * groups};",
            f"    const int64_t r1 = (rc + 1) * {rows_per} < {rows} ? (rc + 1) * {rows_per} : {rows};",
            "    for (int kc = 0; kc < NKC; kc++) {",
            f"      const int cb0 = kc * {kc}, cb1 = cb0 + {kc} < {a.blocks} ? cb0 + {kc} : {a.blocks};",
            f"      for (int64_t oh = rc * {rows_per}; oh < r1; oh++) {{",
            f"      for (int64_t g = gc * {gpt}; g < gc * {gpt} + {gpt}; g++) {{",
            f"        const float *wg = wp + ({'n * %d + ' % ocg if weights_per_image else ''}g) * {a.blocks * per_block};",
            f"        const float *bias = bp ? bp + g * {ocb * vl} : 0;"]
    if flat:
        body += [f"        const int64_t yo = (n * {kb} + g * {ocb}) * {plane} + oh * {roww * vl};",
                 "        float *y = yp + yo;",
                 "        const float *res = rp ? rp + yo : 0;",
                 f"        const int64_t xrow = n * {a.n} + oh * {roww * a.w}{group_x};",
                 "        const int i0 = 0, i1 = 1;",
                 f"        if (oh < {rows - 1}) {{",
                 f"          for (int64_t q = 0; q < {roww // rw}; q++) {call(0, 1, f'q * {rw}', rw)}",
                 "        } else {"]
        if last_w // rw:
            body.append(f"          for (int64_t q = 0; q < {last_w // rw}; q++) {call(0, 1, f'q * {rw}', rw)}")
        if last_w % rw:
            body.append(f"          {call(0, 1, str(last_w // rw * rw), last_w % rw)}")
        body.append("        }")
    else:
        body += _row_taps(g, "        ")
        body += [f"        const int64_t yo = (n * {kb} + g * {ocb}) * {plane} + oh * {g.ow * vl};",
                 "        float *y = yp + yo;",
                 "        const float *res = rp ? rp + yo : 0;",
                 f"        const int64_t xrow = n * {a.n} + ih0 * {a.h}{group_x};"]
        body += [f"        {call(s, 0)}" for s in left]
        if inner:
            body.append(f"        for (int64_t q = 0; q < {len(inner)}; q++) {call(inner[0], 1, f'{inner[0]} + q * {rw}')}")
        body += [f"        {call(s, 0)}" for s in right]
    body += ["      }", "      }", "    }", "  }", "}"]
    support.append("\n".join(body))
    total = g.n * groups * row_chunks
    flops = 2 * g.n * g.k * g.oh * g.ow * (g.c // g.group) * g.kh * g.kw
    return "\n".join(support) + "\n", convert + parallel_call(ptrs, total, flops // (2 if bf16 else 1), "conv_task")


def depthwise_conv(g: Conv2d, vl: int, ptrs: dict[str, str | None], act: int, p0: str, p1: str) -> tuple[str, str]:
    """(support C, call statement) for a depthwise convolution, blocked in and out."""
    has_bias, has_res = ptrs.get("b") is not None, ptrs.get("r") is not None
    cb = blocks(g.c, vl)
    rw = min(g.ow, TILES[vector_registers(vl)][2])
    plane_out = g.oh * g.ow * vl

    def tile(r_count: int) -> str:
        out = block_tile_head(g, vl, r_count, has_bias)
        for j in range(g.kw):
            out.append(f"    const nn_v w{j} = nn_vload(wc + (i * {g.kw} + {j}) * {vl});")
            for r in range(r_count):
                col = f"((ow0 + {r}) * {g.sw} + {j * g.dw - g.pl})"
                out.append(f"    if (inner || (uint64_t){col} < {g.w}) "
                           f"a{r}_0 = nn_vfma(nn_vload(xi + {col} * {vl}), w{j}, a{r}_0);")
        out.append("  }")
        out += ["  " + line for line in tile_epilogue(1, r_count, vl, has_res, act, p0, p1, plane_out)]
        out.append("}")
        return "\n".join(out)

    widths, task = block_row_task("dw_task", g, vl, rw, g.kh * g.kw * vl)
    support = [f"NN_REQUIRE_VL({vl});"] + [tile(r) for r in widths] + [task]
    work = g.n * cb * vl * g.oh * g.ow * g.kh * g.kw
    return "\n".join(support) + "\n", parallel_call(ptrs, g.n * cb * g.oh, work, "dw_task")


def block_tile_head(g: Conv2d, vl: int, r_count: int, has_bias: bool) -> list[str]:
    """The opening of ``tile{r_count}``, the row tile block_row_task calls: its signature, the
    accumulators a{r}_0 started at the bias, and the loop over the kernel's rows that reads
    input row ``xi``."""
    return [f"static inline __attribute__((always_inline)) void tile{r_count}(const float *restrict x, "
            "const float *restrict wc, const float *restrict bias, const float *restrict res, "
            "float *restrict y, int64_t xrow, int64_t ow0, int i0, int i1, const int inner) {",
            f"  const nn_v b = {'nn_vload(bias)' if has_bias else 'nn_vzero()'};",
            "  nn_v " + ", ".join(f"a{r}_0 = b" for r in range(r_count)) + ";",
            "  for (int i = i0; i < i1; i++) {",
            f"    const float *xi = x + xrow + i * {g.dh * g.w * vl};"]


def block_row_task(task: str, g: Conv2d, vl: int, rw: int, block_floats: int) -> tuple[list[int], str]:
    """(the tile widths it calls, the C of the task ``task``) of a convolution whose output
    block c reads input block c only (depthwise, narrow groups): a task is (image, block,
    output row), its tiles ``tile{width}`` (the caller's) at fixed columns, the edge tiles'
    out-of-row taps dropped at compile time; ``block_floats``: the packed weights per block."""
    cb = blocks(g.k, vl)
    plane_in, plane_out = g.h * g.w * vl, g.oh * g.ow * vl
    lo, hi = g.interior()
    starts, inner, left, right = _column_tiles(g.ow, rw, lo, hi)

    def call(s: int, inner_flag: int, pos: str | None = None) -> str:
        return f"tile{min(rw, g.ow - s)}(x, wc, bias, res, y, xrow, {pos or s}, i0, i1, {inner_flag});"

    body = [f"static void {task}(void *p, int64_t lo, int64_t hi) {{",
            "  const float *const *a = p;",
            "  const float *xp = a[0], *wp = a[1], *bp = a[2], *rp = a[3];",
            "  float *yp = (float *)a[4];",
            "  for (int64_t t = lo; t < hi; t++) {",
            f"    const int64_t oh = t % {g.oh}, c = (t / {g.oh}) % {cb}, n = t / {g.oh * cb};",
            *_row_taps(g, "    "),
            f"    const float *x = xp + (n * {cb} + c) * {plane_in};",
            f"    const float *wc = wp + c * {block_floats};",
            f"    const float *bias = bp ? bp + c * {vl} : 0;",
            f"    const int64_t yo = (n * {cb} + c) * {plane_out} + oh * {g.ow * vl};",
            "    float *y = yp + yo;",
            "    const float *res = rp ? rp + yo : 0;",
            f"    const int64_t xrow = ih0 * {g.w * vl};"]
    body += [f"    {call(s, 0)}" for s in left]
    if inner:
        body.append(f"    for (int64_t q = 0; q < {len(inner)}; q++) {call(inner[0], 1, f'{inner[0]} + q * {rw}')}")
    body += [f"    {call(s, 0)}" for s in right]
    body += ["  }", "}"]
    return sorted({min(rw, g.ow - s) for s in starts}), "\n".join(body)


def parallel_call(ptrs: dict[str, str | None], tasks: int, work: int, task: str) -> str:
    """The step's statement: the pointers packed for the task, then the pool runs it."""
    args = ", ".join(ptrs.get(k) or "0" for k in ("x", "w", "b", "r"))
    return (f"{{ const float *a[5] = {{{args}, (const float *){ptrs['y']}}}; "
            f"nn_parallel({tasks}, {work}, {task}, (void *)a); }}")
