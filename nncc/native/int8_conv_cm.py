"""The channel-major form of the native int8 convolution (nncc/native/int8_conv_gen.py):
output channels x pixels, for layers with few output channels over many pixels (a
MobileNet's early 1x1 layers), where the pixel-major form's 64-channel panels would be
mostly padding and its stores would transpose.

The input image is quantized into padded byte planes (C x Hp x Wp, the padding the zero
point), then packed as A4: for each group of four rows of K (K ordered channel, kernel row,
kernel column, as the weights lie), the pixels' four bytes side by side, pixels padded to a
multiple of 64. A pointwise layer (1x1, stride 1, unpadded) packs A straight from its input;
from NHWC bytes (int8_bytes: an inverted-residual stream between pixel-major projections)
that is a transpose in 4-byte units, each pixel's channels 4g..4g+3 one word, 16 pixels x 16
words at a time on AVX-512. ``vpdpbusd`` multiplies 64 pixels' bytes (four vectors) by one output
channel's four weight bytes broadcast, six channels at a time. On AVX2 (``pairs``) 8 pixels'
bytes are a vector, ``vpmaddubsw`` by a channel's four weight bytes broadcast sums each
pixel's two pairs of products into int16 lanes and ``vpmaddwd`` by ones adds the two into
the pixel's int32 lane; the weights are split as int8_gemm_gen splits B (split_pairs), so
no pair saturates, and a sliver's few remainder entries are added to its sums exactly
after the products. Plain C elsewhere. The
epilogue is int8_conv_gen's (zero points through the pixels' and channels' sums, the int32
bias, float32 requantization, the output's image), vectorised over 64 pixels and stored
contiguously in NCHW.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nncc.native import int8_tables
from nncc.native.c_emit import CWriter
from nncc.native.c_struct import Struct
from nncc.native.int8_bytes import byte_store, image_at
from nncc.native.int8_gemm_gen import DENSE, ENTRIES_PER_GROUP, split_pairs, vnni_sums

MRC = 6  # output channels per micro-tile
NP = 64  # pixels per micro-tile: four AVX-512 vectors of int32 lanes


def preferred(pixels: int, channels: int, pixel_rows: int, channel_panel: int) -> bool:
    """Whether the channel-major form wastes less padding than the pixel-major one."""
    def up(v, to):
        return -(-v // to) * to
    return up(pixels, NP) * up(channels, MRC) < up(pixels, pixel_rows) * up(channels, channel_panel)


def table(m: int) -> Struct:
    """The layer's table: its scalars, then per output channel (padded to MRC) the weights'
    sum, zero point (shifted with them), int32 bias and multiplier."""
    return int8_tables.columns(-(-m // MRC) * MRC)


def remainder_capacity(matrix: np.ndarray) -> int:
    """The most remainder entries (int8_gemm_gen.split_pairs, along K) any sliver of MRC
    output channels of the [M, K] weights has: every sliver's room in the pairs layout; or
    DENSE past ENTRIES_PER_GROUP per group of four rows of K, where a second pass over the
    remainder rows costs less (an entry here is 64 pixels' products, vectorised, a group
    4 x 16 pixels' micro-kernel steps)."""
    rest = split_pairs(matrix.T)[1].T != 0
    padded = np.zeros((-(-rest.shape[0] // MRC) * MRC, rest.shape[1]), bool)
    padded[:rest.shape[0]] = rest
    most = int(padded.reshape(-1, MRC * rest.shape[1]).sum(axis=1).max(initial=0))
    return DENSE if most > ENTRIES_PER_GROUP * -(-matrix.shape[1] // 4) else most


def sliver_bytes(k: int, pairs: bool, capacity: int) -> int:
    """The packed bytes of MRC output channels' weights: MRC rows of K padded to whole
    groups of four; in the pairs layout then an int32 count and ``capacity`` uint32
    remainder entries (row k in bits 0-15, the channel in the sliver in bits 16-23, the int8
    value in bits 24-31), rounded up to 64 bytes; or, DENSE, the remainder's MRC rows."""
    rows = MRC * (-(-k // 4) * 4)
    if pairs and capacity == DENSE:
        return 2 * rows
    return -(-(rows + 4 + 4 * capacity) // 64) * 64 if pairs else rows


def pack_weights(matrix: np.ndarray, pairs: bool = False) -> np.ndarray:
    """[M, K] int8 -> slivers of MRC zero-padded rows of Kp bytes (sliver_bytes); in the
    pairs layout the rows hold the main part and each sliver its remainder entries."""
    m, k = matrix.shape
    kp, slivers = -(-k // 4) * 4, -(-m // MRC)
    main, rest = split_pairs(matrix.T) if pairs else (matrix.T, None)
    rows = np.zeros((slivers * MRC, kp), np.int8)
    rows[:m, :k] = main.T
    if not pairs:
        return rows.reshape(-1)
    rest = rest.T
    capacity = remainder_capacity(matrix)
    if capacity == DENSE:  # each sliver's main rows, then its remainder's
        rests = np.zeros((slivers * MRC, kp), np.int8)
        rests[:m, :k] = rest
        return np.concatenate([rows.reshape(slivers, -1), rests.reshape(slivers, -1)], axis=1).reshape(-1)
    stride = sliver_bytes(k, True, capacity)
    out = np.zeros((slivers, stride), np.uint8)
    out[:, :MRC * kp] = rows.reshape(slivers, -1).view(np.uint8)
    channels, ks = np.nonzero(rest)
    for sliver in range(slivers):
        mine = channels // MRC == sliver
        o, kk = channels[mine], ks[mine]
        words = (kk.astype(np.uint32) | ((o - sliver * MRC).astype(np.uint32) << 16)
                 | (rest[o, kk].view(np.uint8).astype(np.uint32) << 24))
        block = np.concatenate([np.array([len(words)], np.uint32), words.astype(np.uint32)])
        out[sliver, MRC * kp:MRC * kp + 4 * block.size] = block.view(np.uint8)
    return out.reshape(-1).view(np.int8)


@dataclass(frozen=True)
class Layer:
    """One channel-major int8 convolution: an ``n``-image batch of ``c`` x ``h`` x ``w``
    into ``m`` x ``oh`` x ``ow``, a ``kh`` x ``kw`` kernel at strides ``sh``, ``sw`` and
    dilations ``dh``, ``dw``, padded ``pt`` rows above and ``pl`` columns left.
    ``zero_points``: some weight zero point is not 0, so the pixels' sums are needed;
    ``byte_in``: the input is stored as bytes, NCHW, or NHWC with ``nhwc_in`` (a pointwise
    layer only); ``byte_out``: store the output as bytes, q
    plus this shift (int8_bytes); ``pairs``: the weights are in the AVX2 kernel's layout,
    with room for ``capacity`` remainder entries a sliver (sliver_bytes)."""

    n: int
    c: int
    h: int
    w: int
    m: int
    kh: int
    kw: int
    oh: int
    ow: int
    sh: int
    sw: int
    dh: int
    dw: int
    pt: int
    pl: int
    zero_points: bool = True
    byte_in: bool = False
    byte_out: int | None = None
    pairs: bool = False
    capacity: int = 0
    nhwc_in: bool = False

    def __post_init__(self):
        assert not self.nhwc_in or (self.byte_in and self.pointwise), "NHWC bytes are read by a pointwise layer only"

    @property
    def padded(self) -> tuple[int, int]:
        """Rows and columns of an input plane with its padding (what the taps reach)."""
        return (max(self.h + self.pt, (self.oh - 1) * self.sh + (self.kh - 1) * self.dh + 1),
                max(self.w + self.pl, (self.ow - 1) * self.sw + (self.kw - 1) * self.dw + 1))

    @property
    def k(self) -> int:
        return self.c * self.kh * self.kw

    @property
    def kp(self) -> int:  # K padded to whole groups of four bytes
        return -(-self.k // 4) * 4

    @property
    def sliver_bytes(self) -> int:  # the packed weights of MRC output channels
        return sliver_bytes(self.k, self.pairs, self.capacity)

    @property
    def p(self) -> int:  # output pixels per image
        return self.oh * self.ow

    @property
    def p64(self) -> int:  # pixels padded to whole micro-tiles
        return -(-self.p // NP) * NP

    @property
    def slivers(self) -> int:  # micro-tiles of output channels
        return -(-self.m // MRC)

    @property
    def pointwise(self) -> bool:
        """A 1x1 stride-1 unpadded layer: A is packed straight from the input."""
        return (self.kh == self.kw == 1 and self.sh == self.sw == 1 and (self.oh, self.ow) == (self.h, self.w)
                and self.pt == self.pl == 0)

    @property
    def planes_bytes(self) -> int:
        hp, wp = self.padded
        return _up64((self.c + 1) * hp * wp)

    @property
    def a_bytes(self) -> int:
        return _up64(self.kp * self.p64)

    @property
    def scratch_bytes(self) -> int:
        """The padded byte planes, A, and the pixels' sums."""
        return self.planes_bytes + self.a_bytes + self.p64 * 4


def _up64(n: int) -> int:
    return -(-n // 64) * 64


def source(name: str, quantize_byte: str, layer: Layer) -> str:
    """File-scope C defining ``void name(X, W, table, Y, scratch)`` for ``layer``
    (``quantize_byte``: int8_conv_gen's q_byte, which recovers a pixel's byte)."""
    c = CWriter()
    c.directive("#if defined(__AVX512VNNI__) && defined(__AVX512BW__)")
    c.directive("#include <immintrin.h>")
    c.directive("#define Q_VNNI 1")
    c.directive("#endif")
    c.raw(quantize_byte)
    t = table(layer.m)
    c.raw(t.declaration)
    c.line(f"typedef struct {{ const float *x; uint8_t *planes, *a; int32_t *colsum; const int8_t *w; "
           f"{t.pointer}t; float *y; }} qm_job;", "")
    _planes(c, layer)
    _pack(c, layer)
    if layer.zero_points:
        _sums(c, layer)
    if layer.nhwc_in:
        _pack_nhwc(c, layer)
    elif layer.pointwise:
        _pack_direct(c, layer)
    _dots(c, layer)
    _tiles(c, layer, t)
    _entry(c, name, layer, t)
    return "\n" + c.text()


def _recover(c: CWriter) -> None:
    """Locals the input's bytes are recovered with (q_byte's arguments)."""
    c.line("const float inv = j->t->x_inv, zero = j->t->x_zero, qlo = j->t->x_lo, qhi = j->t->x_hi, "
           "shift = j->t->x_shift;")


def _planes(c: CWriter, layer: Layer) -> None:
    hp, wp = layer.padded
    c.comment("channels [lo, hi): the padded byte planes; plane C stays all zero bytes (K's padding)")
    with c.function("static void qm_planes(void *ctx, int64_t lo, int64_t hi)"):
        c.line("const qm_job *j = ctx;")
        _recover(c)
        c.line("const uint8_t pad = (uint8_t)(int32_t)(zero + shift);")
        with c.loop("ch", "hi", "lo"):
            c.line(f"uint8_t *plane = j->planes + ch * {hp * wp};")
            with c.when(f"ch == {layer.c}"):
                c.line(f"memset(plane, 0, {hp * wp});", "continue;")
            c.line(f"memset(plane, pad, {hp * wp});")
            if layer.byte_in:  # the bytes are q plus the shift already: a copy per image row
                c.line(f"const uint8_t *src = (const uint8_t *)j->x + ch * {layer.h * layer.w};")
                with c.loop("ih", layer.h):
                    c.line(f"memcpy(plane + (ih + {layer.pt}) * {wp} + {layer.pl}, src + ih * {layer.w}, {layer.w});")
            else:
                c.line(f"const float *src = j->x + ch * {layer.h * layer.w};")
                with c.loop("ih", layer.h), c.loop("iw", layer.w):
                    c.line(f"plane[(ih + {layer.pt}) * {wp} + iw + {layer.pl}] = "
                           f"q_byte(src[ih * {layer.w} + iw], inv, zero, qlo, qhi, shift);")
    c.line("")


def _pack(c: CWriter, layer: Layer) -> None:
    hp, wp = layer.padded
    plane = hp * wp
    c.comment("groups [lo, hi) of four K rows: each pixel's four bytes side by side")
    with c.function("static void qm_pack(void *ctx, int64_t lo, int64_t hi)"):
        c.line("const qm_job *j = ctx;")
        with c.loop("g", "hi", "lo"):
            c.line("const uint8_t *src[4];")
            with c.loop("t", 4, ctype="int"):
                c.line("int64_t k = 4 * g + t;")
                with c.when(f"k >= {layer.k}"):
                    c.line(f"src[t] = j->planes + {layer.c * plane};", "continue;")
                c.line(f"int64_t ch = k / {layer.kh * layer.kw}, i = (k / {layer.kw}) % {layer.kh}, jj = k % {layer.kw};",
                       f"src[t] = j->planes + ch * {plane} + i * {layer.dh * wp} + jj * {layer.dw};")
            c.line(f"uint8_t *out = j->a + g * {layer.p64 * 4};")
            with c.loop("oy", layer.oh):
                row = layer.sh * wp
                c.line(f"const uint8_t *s0 = src[0] + oy * {row}, *s1 = src[1] + oy * {row};",
                       f"const uint8_t *s2 = src[2] + oy * {row}, *s3 = src[3] + oy * {row};",
                       f"uint8_t *d = out + oy * {layer.ow * 4};")
                with c.loop("ox", layer.ow):
                    c.line(*(f"d[4 * ox{f' + {b}' if b else ''}] = s{b}[ox * {layer.sw}];" for b in range(4)))
            c.line(f"memset(out + {layer.p * 4}, 0, {(layer.p64 - layer.p) * 4});")
    c.line("")


def _sums(c: CWriter, layer: Layer) -> None:
    c.comment("pixels [lo, hi): the sum of each pixel's bytes over K (for the weights' zero points)")
    with c.function("static void qm_sums(void *ctx, int64_t lo, int64_t hi)"):
        c.line("const qm_job *j = ctx;")
        with c.loop("q", "hi", "lo"):
            c.line("int32_t s = 0;")
            with c.loop("g", layer.kp // 4):
                c.line(f"const uint8_t *b = j->a + (g * {layer.p64} + q) * 4;", "s += b[0] + b[1] + b[2] + b[3];")
            c.line("j->colsum[q] = s;")
    c.line("")


def _pack_direct(c: CWriter, layer: Layer) -> None:
    """A pointwise layer's A straight from the input: each pixel's four bytes composed as one
    32-bit word, so the loop runs in whole vectors (storing the bytes one by one extracted
    them a lane at a time)."""
    p, x_type = layer.p, "uint8_t" if layer.byte_in else "float"
    full, rest = divmod(layer.c, 4)

    def pack_loop(channels: int) -> None:  # the group's channels, composed into each pixel's word
        with c.block(""):
            reads = "".join(f", *x{t} = x0 + {t * p}" for t in range(1, channels))
            c.line(f"const {x_type} *x0 = (const {x_type} *)j->x + 4 * g * {p}{reads};")
            byte = "(uint32_t)x{t}[q]" if layer.byte_in else "(uint32_t)q_byte(x{t}[q], inv, zero, qlo, qhi, shift)"
            word = " | ".join(byte.format(t=t) + f" << {8 * t}" for t in range(channels))
            c.line(f"for (int64_t q = 0; q < {p}; q++) out[q] = {word};")

    c.line("typedef uint32_t qm_word __attribute__((may_alias));", "")
    c.comment("groups [lo, hi) of four channels of a pointwise layer, packed straight from the input")
    with c.function("static void qm_pack_direct(void *ctx, int64_t lo, int64_t hi)"):
        c.line("const qm_job *j = ctx;")
        _recover(c)
        with c.loop("g", "hi", "lo"):
            c.line(f"qm_word *out = (qm_word *)(j->a + g * {layer.p64 * 4});")
            with c.when(f"g < {full}"):
                pack_loop(4)
            if rest:
                with c.otherwise():
                    pack_loop(rest)
            c.line(f"memset(out + {p}, 0, {(layer.p64 - p) * 4});")
    c.line("")


WORDS = 16  # the NHWC transpose's block: 16 pixels x 16 words (64 channels), one vector a row


def _transpose_words(c: CWriter) -> None:
    """r[0..15] (16 x 16 int32) transposed in place: pairs of rows interleaved by words,
    then by double words (each 128-bit lane holds four rows' word of one column), then the
    lanes gathered in two rounds of ``vshufi32x4``."""
    for i in range(0, 16, 2):
        c.line(f"t[{i}] = _mm512_unpacklo_epi32(r[{i}], r[{i + 1}]); t[{i + 1}] = _mm512_unpackhi_epi32(r[{i}], r[{i + 1}]);")
    for a in range(0, 16, 4):  # r[a + col]: lane L holds column 4L + col of rows a..a+3
        c.line(f"r[{a}] = _mm512_unpacklo_epi64(t[{a}], t[{a + 2}]); r[{a + 1}] = _mm512_unpackhi_epi64(t[{a}], t[{a + 2}]);",
               f"r[{a + 2}] = _mm512_unpacklo_epi64(t[{a + 1}], t[{a + 3}]); r[{a + 3}] = _mm512_unpackhi_epi64(t[{a + 1}], t[{a + 3}]);")
    for base in (0, 8):  # t[base + col]: lanes 0, 2 of rows' blocks; t[base + 4 + col]: lanes 1, 3
        for col in range(4):
            x, y = base + col, base + 4 + col
            c.line(f"t[{x}] = _mm512_shuffle_i32x4(r[{x}], r[{y}], 0x88); t[{y}] = _mm512_shuffle_i32x4(r[{x}], r[{y}], 0xdd);")
    for col in range(4):  # column 4L + col: lane L of each block of four rows
        c.line(f"r[{col}] = _mm512_shuffle_i32x4(t[{col}], t[{8 + col}], 0x88); "
               f"r[{4 + col}] = _mm512_shuffle_i32x4(t[{4 + col}], t[{12 + col}], 0x88);",
               f"r[{8 + col}] = _mm512_shuffle_i32x4(t[{col}], t[{8 + col}], 0xdd); "
               f"r[{12 + col}] = _mm512_shuffle_i32x4(t[{4 + col}], t[{12 + col}], 0xdd);")


def _pack_nhwc(c: CWriter, layer: Layer) -> None:
    """A pointwise layer's A from NHWC bytes: group g's word for pixel q is the 4 bytes at
    q * C + 4g, a transpose of the [pixels x C / 4] word image; on AVX-512 16 x 16 words a
    step (masked loads: K's padding bytes and the pixels past the image are zeros, as in
    _pack_direct); plain C elsewhere."""
    p, p64, ch, groups = layer.p, layer.p64, layer.c, layer.kp // 4
    c.line("typedef uint32_t qm_word __attribute__((may_alias));", "")
    c.comment(f"blocks [lo, hi) of {WORDS} pixels of a pointwise layer: A from the input's NHWC bytes")
    with c.function("static void qm_pack_nhwc(void *ctx, int64_t lo, int64_t hi)"):
        c.line("const qm_job *j = ctx;", "const uint8_t *x = (const uint8_t *)j->x;")
        with c.loop("b", "hi", "lo"):
            c.line(f"const int64_t q0 = b * {WORDS};",
                   f"const int n = q0 + {WORDS} <= {p} ? {WORDS} : q0 < {p} ? (int)({p} - q0) : 0;  /* pixels in the image */")
            c.directive("#ifdef Q_VNNI")
            c.line(f"__m512i r[{WORDS}], t[{WORDS}];")
            for c0 in range(0, ch, 4 * WORDS):
                size = min(4 * WORDS, ch - c0)
                load = "_mm512_loadu_si512(src)" if size == 64 else \
                    f"_mm512_maskz_loadu_epi8((__mmask64){(1 << size) - 1:#x}ull, src)"
                with c.block(""):
                    with c.loop("i", WORDS, ctype="int"):
                        c.line(f"const uint8_t *src = x + (q0 + i) * {ch} + {c0};",
                               f"r[i] = i < n ? {load} : _mm512_setzero_si512();")
                    _transpose_words(c)
                    with c.loop("g", -(-size // 4), ctype="int"):
                        c.line(f"_mm512_storeu_si512(j->a + (({c0 // 4} + g) * {p64} + q0) * 4, r[g]);")
            c.directive("#else")
            with c.loop("g", groups):
                c.line(f"qm_word *out = (qm_word *)(j->a + (g * {p64} + q0) * 4);",
                       f"const int bytes = {ch} - 4 * (int)g < 4 ? {ch} - 4 * (int)g : 4;")
                with c.loop("i", WORDS, ctype="int"):
                    c.line("uint32_t word = 0;")
                    with c.when("i < n"):
                        c.line(f"for (int t = 0; t < bytes; t++) word |= (uint32_t)x[(q0 + i) * {ch} + 4 * g + t] << (8 * t);")
                    c.line("out[i] = word;")
            c.directive("#endif")
    c.line("")


def _dots(c: CWriter, layer: Layer) -> None:
    groups, p64, kp = layer.kp // 4, layer.p64, layer.kp
    c.comment("int32 dot products of 64 pixels with ``rows`` output channels, into acc[rows][64]; out of line, "
              "so the tile loop's epilogue constants do not crowd its 24 sums out of the registers")
    with c.function(f"static __attribute__((noinline)) void qm_dots(const uint8_t *a, const int8_t *w, int rows, "
                    f"int32_t acc[{MRC}][{NP}])"):
        if layer.pairs:
            c.raw(_pair_sums(layer))
            return
        c.directive("#ifdef Q_VNNI")
        c.raw(vnni_sums(MRC, groups, [f"_mm512_loadu_si512(a + g * {p64 * 4} + {64 * v})" for v in range(4)],
                        lambda r: f"w + {r * kp} + g * 4", vector_unsigned=True))
        c.directive("#else")
        with c.loop("r", "rows", ctype="int"):
            c.line("int32_t *c = acc[r];", f"for (int q = 0; q < {NP}; q++) c[q] = 0;")
            with c.loop("g", groups):
                c.line(f"const uint8_t *ag = a + g * {p64 * 4};", f"const int8_t *wg = w + r * {kp} + g * 4;",
                       "int32_t w0 = wg[0], w1 = wg[1], w2 = wg[2], w3 = wg[3];")
                with c.loop("q", NP, ctype="int"):
                    c.line("c[q] += ag[4 * q] * w0 + ag[4 * q + 1] * w1 + ag[4 * q + 2] * w2 + ag[4 * q + 3] * w3;")
        c.directive("#endif")
    c.line("")


def _pair_sums(layer: Layer) -> str:
    """The AVX2 body of qm_dots (module docstring): per 16 pixels, MRC channels x 2 vectors
    of 8 pixels' int32 sums; per group of four rows of K, ``vpmaddubsw`` of the pixels'
    bytes by a channel's four weight bytes broadcast, then ``vpmaddwd`` by ones. Every
    padded channel's weights are 0, so all MRC are computed. Then the sliver's remainder
    entries, each added to its channel's 64 sums, or (DENSE) a second pass over its rows.
    The loop's count is hidden from the optimizer, as in vnni_sums."""
    groups, p64, kp = layer.kp // 4, layer.p64, layer.kp
    names = [[f"c{r}_{h}" for h in range(2)] for r in range(MRC)]
    zero = ", ".join(f"{n} = {{0}}" for row in names for n in row)
    products = "\n".join(
        f"                {{ int32_t four; memcpy(&four, w + {r * kp} + 4 * g, 4); "
        f"const q_v8i s = {{four, four, four, four, four, four, four, four}}; "
        f"{row[0]} += __builtin_ia32_pmaddwd256(__builtin_ia32_pmaddubsw256(v0, (q_v32b)s), ones); "
        f"{row[1]} += __builtin_ia32_pmaddwd256(__builtin_ia32_pmaddubsw256(v1, (q_v32b)s), ones); }}"
        for r, row in enumerate(names))
    store = "\n".join(f"        memcpy(acc[{r}] + q0, &{row[0]}, 32); memcpy(acc[{r}] + q0 + 8, &{row[1]}, 32);"
                       for r, row in enumerate(names))
    remainder = "" if layer.capacity in (0, DENSE) else f"""
    const uint32_t *rest = (const uint32_t *)(w + {MRC * kp});  /* the count, then the entries */
    for (uint32_t e = 1; e <= rest[0]; e++) {{
        uint32_t entry = rest[e];
        int32_t k = (int32_t)(entry & 0xffff), value = (int8_t)(entry >> 24);
        int32_t *c = acc[(entry >> 16) & 0xff];
        const uint8_t *ak = a + (k / 4) * {p64 * 4} + k % 4;
        for (int q = 0; q < {NP}; q++) c[q] += (int32_t)ak[4 * q] * value;
    }}"""
    return f"""#if !defined(__AVX2__)
#error "weights packed in pairs for AVX2, built for a target without it"
#endif
    typedef int16_t q_v16s __attribute__((vector_size(32)));
    typedef int32_t q_v8i __attribute__((vector_size(32)));
    typedef char q_v32b __attribute__((vector_size(32)));
    const q_v16s ones = {{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}};
    const int8_t *const w0 = w;
    (void)rows;
    for (int q0 = 0; q0 < {NP}; q0 += 16) {{
        q_v8i {zero};
        for (int part = 0; part < {2 if layer.capacity == DENSE else 1}; part++) {{  /* the main rows, then a DENSE remainder's */
            const int8_t *w = w0 + part * {MRC * kp};
            int64_t n = {groups};
            __asm__("" : "+r"(n));  /* an unknown count to the optimizer (see vnni_sums) */
            for (int64_t g = 0; g < n; g++) {{
                q_v32b v0, v1;  /* pixels q0..q0+7 and q0+8..q0+15, four bytes each */
                memcpy(&v0, a + g * {p64 * 4} + q0 * 4, 32);
                memcpy(&v1, a + g * {p64 * 4} + q0 * 4 + 32, 32);
{products}
            }}
        }}
{store}
    }}{remainder}
"""


def _tiles(c: CWriter, layer: Layer, t: Struct) -> None:
    slivers, blocks = layer.slivers, layer.p64 // NP
    colsum = "(int64_t)zw[o] * (int64_t)j->colsum[p0 + q]" if layer.zero_points else "0"
    if layer.byte_out is None:
        out_type, to_out = "float", "(v - yzero) * yscale"
    else:
        out_type, to_out = "uint8_t", byte_store(layer.byte_out)
    c.comment("the (pixel block x channel sliver) tiles [lo, hi)")
    with c.function("static void qm_tiles(void *ctx, int64_t lo, int64_t hi)"):
        c.line("const qm_job *j = ctx;",
               f"{t.pointer}t = j->t;",
               "const float zero = t->x_zero + t->x_shift, yscale = t->y_scale, yzero = t->y_zero, "
               "qlo = t->y_lo, qhi = t->y_hi;",
               "const int32_t za = (int32_t)zero;",
               "const int32_t *ws = t->w_sum, *zw = t->w_zero, *bias = t->bias;",
               "const float *mult = t->mult;",
               f"int32_t acc[{MRC}][{NP}];")
        with c.loop("task", "hi", "lo"):
            c.line(f"int64_t b = task / {slivers}, s = task % {slivers};",
                   f"int64_t p0 = b * {NP}, m0 = s * {MRC};",
                   f"int rows = s == {slivers - 1} ? {layer.m - (slivers - 1) * MRC} : {MRC};",
                   f"int width = b == {blocks - 1} ? {layer.p - (blocks - 1) * NP} : {NP};",
                   f"qm_dots(j->a + p0 * 4, j->w + s * {layer.sliver_bytes}, rows, acc);")
            with c.loop("r", "rows", ctype="int"):
                c.line("int64_t o = m0 + r;")
                c.comment("unsigned: wraps as the portable kernel's int32 accumulator")
                c.line(f"uint32_t fixed = (uint32_t)bias[o] - (uint32_t)za * (uint32_t)ws[o] "
                       f"+ (uint32_t)({layer.k} * za) * (uint32_t)zw[o];")
                c.directive("#ifdef Q_VNNI")
                c.raw(_wide_epilogue(layer))
                c.directive("#else")
                c.line(f"{out_type} out[{NP}];")
                with c.loop("q", NP, ctype="int"):
                    c.line(f"uint32_t e = (uint32_t)acc[r][q] + fixed - (uint32_t)({colsum});",
                           "float v = rintf((float)(int32_t)e * mult[o]) + yzero;",
                           "v = v < qlo ? qlo : v; v = v > qhi ? qhi : v;",
                           f"out[q] = {to_out};")
                c.line(f"memcpy(({out_type} *)j->y + o * {layer.p} + p0, out, width * sizeof *out);")
                c.directive("#endif")
    c.line("")


def _wide_epilogue(layer: Layer) -> str:
    """The loop over a channel's 64 pixels on AVX-512 (where the sums are VNNI's): four
    vectors of 16, the float32 value clamped to the output's range less its zero point before
    it is rounded (the bounds are integers, so that is the clamp of the rounded value the
    portable kernel takes), stored under a mask of the block's width: bytes through
    ``vpmovdb``, or floats."""
    colsum = ("e = _mm512_sub_epi32(e, _mm512_mullo_epi32(_mm512_set1_epi32(zw[o]), "
              "_mm512_loadu_si512(j->colsum + p0 + 16 * v)));") if layer.zero_points else ""
    if layer.byte_out is None:
        store = f"""_mm512_mask_storeu_ps(j->y + o * {layer.p} + p0 + 16 * v, part,
                    _mm512_mul_ps(_mm512_roundscale_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), ys));"""
    else:
        store = f"""_mm_mask_storeu_epi8((uint8_t *)j->y + o * {layer.p} + p0 + 16 * v, part,
                    _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(f), centre)));"""
    return f"""                {{
                    const __m512i fx = _mm512_set1_epi32((int32_t)fixed);
                    const __m512 mv = _mm512_set1_ps(mult[o]), flo = _mm512_set1_ps(qlo - yzero), fhi = _mm512_set1_ps(qhi - yzero);
                    const __m512 ys = _mm512_set1_ps(yscale);
                    const __m512i centre = _mm512_set1_epi32((int32_t)(yzero + {float(layer.byte_out or 0)}f));
                    (void)ys; (void)centre;
                    for (int v = 0; v < 4; v++) {{
                        const int left = width - 16 * v;
                        const __mmask16 part = left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
                        __m512i e = _mm512_add_epi32(_mm512_loadu_si512(acc[r] + 16 * v), fx);
                        {colsum}
                        const __m512 f = _mm512_min_ps(fhi, _mm512_max_ps(flo, _mm512_mul_ps(_mm512_cvtepi32_ps(e), mv)));
                        {store}
                    }}
                }}
"""


def _entry(c: CWriter, name: str, layer: Layer, t: Struct) -> None:
    hp, wp = layer.padded
    kp, p64, planes = layer.kp, layer.p64, layer.planes_bytes
    with c.function(f"static void {name}(const float *X, const int8_t *W, {t.pointer}table, float *Y, "
                    "char *scratch)"):
        c.line(f"qm_job j = {{0, (uint8_t *)scratch, (uint8_t *)(scratch + {planes}), "
               f"(int32_t *)(scratch + {planes + layer.a_bytes}), W, table, 0}};")
        with c.loop("img", layer.n):
            c.line(f"j.x = {image_at('X', layer.c * layer.h * layer.w, layer.byte_in, const=True)};",
                   f"j.y = {image_at('Y', layer.m * layer.p, layer.byte_out is not None)};")
            if layer.nhwc_in:
                c.line(f"nn_parallel({p64 // WORDS}, {kp * p64}, qm_pack_nhwc, &j);")
            elif layer.pointwise:
                c.line(f"nn_parallel({kp // 4}, {kp * p64}, qm_pack_direct, &j);")
            else:
                c.line(f"nn_parallel({layer.c + 1}, {layer.c * hp * wp}, qm_planes, &j);",
                       f"nn_parallel({kp // 4}, {kp * p64}, qm_pack, &j);")
            if layer.zero_points:
                c.line(f"nn_parallel({p64}, {p64 * kp}, qm_sums, &j);")
            c.line(f"nn_parallel({layer.slivers * (p64 // NP)}, {layer.p * layer.m * layer.k}, qm_tiles, &j);")
