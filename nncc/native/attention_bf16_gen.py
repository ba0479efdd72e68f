"""The fused attention's two products in bfloat16 (``precision="bf16"``): the task of
nncc/native/attention_gen.py with Q·Kᵀ and P·V multiplied as bfloat16 pairs into float32
sums, on AMX tiles (``tdpbf16ps``) where the CPU has them, else on ``vdpbf16ps``.

What is rounded, to nearest even, and where:

- Q, once per task: its BQ rows as rows of pairs of consecutive head elements (QW words a
  row, the pairs padded with zeros to a multiple of 16, a tile's depth), the rows past the
  query block zero.
- K and V, when a (batch, head) is packed (a grouped head's K and V once per group, as in
  float32): per block of BK keys, K as [pair of head elements][key] words (a pair of Q's
  row times a word of K is two terms of a score) and V as [pair of keys][column] words.
  Every pad is zero, so tiles and vectors read past the head size or the last key add
  exact zeros.
- P, after the softmax of a block: each row's BK probabilities as BK / 2 words of pairs of
  keys (``vcvtne2ps2bf16``), the rows past the query block zero.

The scale, the bias, the online maximum and sum and the final division stay float32, as
does the sum of a row (of the probabilities before their rounding). The exponentials are
simd.h's vector ones (0 below e^-87), as in the float32 kernel. Where an operand's row is contiguous, 32
floats are rounded by one vcvtne2ps2bf16 (K's pairs scattered to their keys, V's two keys
interleaved into pairs); other strides are read one element at a time. Both layouts are read
by both instructions: a tile row of 16 words is a vector, so AMX and vdpbf16ps share the
packing, and a task whose thread the OS refuses the tiles (``nn_amx_permitted``) runs the
vdpbf16ps code on the same buffers.

On tiles a block's scores are two halves of 32 keys, each 2 x 2 C tiles (tmm0-3) from two
tiles of Q's rows (tmm4-5) and two of K (tmm6-7) per 16 pairs of the head, stored into the
float32 score rows; P·V loads the output rows (rescaled by the online softmax first) as C
tiles, 32 columns at a time, and adds two tiles of P by two of V per 16 pairs of keys. A
query block of at most 16 rows multiplies only the first row of tiles, a key block of at
most 32 keys only its first half.

Arithmetic and bound: each of Q, K, V and P is off by at most 2^-8 of itself (bfloat16
denormals read as zero, denormal sums flushed, as in nncc/native/gemm_bf16_gen.py);
docs/native.md derives the output's bound, tests/test_native_bf16.py and the fuzz kind
attention_bf16 check it.
"""

from __future__ import annotations

from nncc.native import amx

BQ, BK = 32, 64  # attention_gen's blocks: query rows per task, keys per block
PAIRS = 16  # pairs per tile row (64 bytes)
KEY_PAIRS = BK // 2
CONFIG = "att_cfg"
# Query blocks shorter than this stay float32 on a CPU with tiles: a 16-row tile would
# multiply mostly padding (one decoded token, a handful of rows), and vdpbf16ps issues
# there at a quarter of the FMA's rate (nncc.native.precision.SLOW_DOT).
AMX_MIN_ROWS = 8


def q_words(d: int) -> int:
    """Words per row of Q's pairs (and pairs per key of K): ceil(d / 2) padded to 16."""
    return -(-d // (2 * PAIRS)) * PAIRS


def scratch_floats(geo, dvp: int) -> int:
    """The task's buffer in 4-byte units: packed K and V, Q's and P's pairs, the scores,
    the output rows, and the softmax's m, l and alpha."""
    kblocks, qw = -(-geo.skv // BK), q_words(geo.d)
    return kblocks * BK * qw + kblocks * KEY_PAIRS * dvp + BQ * qw + BQ * KEY_PAIRS + BQ * BK + BQ * dvp + 3 * BQ


def _round_c() -> str:
    # float32 -> bfloat16 bits, to nearest even (a NaN kept a quiet NaN); a denormal may
    # stay one: both instructions read it as zero, as vcvtne2ps2bf16 would have made it
    return ("static inline uint32_t att_bf(float x) { uint32_t b; memcpy(&b, &x, 4); "
            "return x != x ? (b >> 16) | 0x40u : (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16; }\n"
            "static inline uint32_t att_pair(float lo, float hi) { return att_bf(lo) | att_bf(hi) << 16; }\n"
            "static inline __m512 att_dp(__m512 acc, uint32_t a, const uint32_t *b) { __m512i v; "
            "memcpy(&v, b, sizeof v); return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32((int)a), (__m512bh)v); }\n")


def _vdp_scores(rows: int, qw: int, pairs: int) -> str:
    """``att_sv{rows}``: rows of scores against a packed key block, 4 vectors of keys each
    (rows x 4 sums in registers), over the head's ``pairs`` pairs."""
    return "\n".join([
        f"static inline void att_sv{rows}(const uint32_t *q, const uint32_t *kt, float *s) {{",
        f"  __m512 acc[{rows}][4];",
        f"  for (int u = 0; u < {rows}; u++) for (int w = 0; w < 4; w++) acc[u][w] = _mm512_setzero_ps();",
        f"  for (int64_t p = 0; p < {pairs}; p++)",
        f"    for (int u = 0; u < {rows}; u++) for (int w = 0; w < 4; w++) "
        f"acc[u][w] = att_dp(acc[u][w], q[u * {qw} + p], kt + p * {BK} + w * 16);",
        f"  for (int u = 0; u < {rows}; u++) for (int w = 0; w < 4; w++) _mm512_storeu_ps(s + u * {BK} + w * 16, acc[u][w]);",
        "}"])


def _vdp_pv(rows: int, dvp: int) -> str:
    """``att_pvv{rows}``: rows of o = o * alpha + P·V over ``pairs`` pairs of keys, 4
    output vectors at a time."""
    nvec = dvp // 16
    lines = [f"static inline void att_pvv{rows}(float *o, const uint32_t *pb, const uint32_t *vb, const float *al, "
             "int64_t pairs) {"]
    for c in range(0, nvec, 4):
        u, base = min(4, nvec - c), c * 16
        lines += [
            "  {",
            f"    __m512 a[{rows}][{u}];",
            f"    for (int r = 0; r < {rows}; r++) for (int x = 0; x < {u}; x++) "
            f"a[r][x] = _mm512_mul_ps(_mm512_loadu_ps(o + r * {dvp} + {base} + x * 16), _mm512_set1_ps(al[r]));",
            "    for (int64_t p = 0; p < pairs; p++)",
            f"      for (int r = 0; r < {rows}; r++) for (int x = 0; x < {u}; x++) "
            f"a[r][x] = att_dp(a[r][x], pb[r * {KEY_PAIRS} + p], vb + p * {dvp} + {base} + x * 16);",
            f"    for (int r = 0; r < {rows}; r++) for (int x = 0; x < {u}; x++) "
            f"_mm512_storeu_ps(o + r * {dvp} + {base} + x * 16, a[r][x]);",
            "  }"]
    lines.append("}")
    return "\n".join(lines)


def _amx_scores(qw: int) -> str:
    """``att_st(q, kt, s, two, halves)``: the block's scores on tiles, ``two`` tiles of
    query rows (1 or 2) by ``halves`` halves of 32 keys."""
    lines = ["static inline void att_st(const uint32_t *q, const uint32_t *kt, float *s, int two, int halves) {",
             "  for (int h = 0; h < halves; h++) {",
             "    _tile_zero(0); _tile_zero(1);",
             "    if (two) { _tile_zero(2); _tile_zero(3); }",
             f"    for (int64_t p = 0; p < {qw}; p += {PAIRS}) {{",
             f"      _tile_loadd(4, q + p, {qw * 4});",
             f"      _tile_loadd(6, kt + p * {BK} + h * 32, {BK * 4});",
             f"      _tile_loadd(7, kt + p * {BK} + h * 32 + 16, {BK * 4});",
             "      _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);",
             f"      if (two) {{ _tile_loadd(5, q + {16 * qw} + p, {qw * 4}); _tile_dpbf16ps(2, 5, 6); "
             "_tile_dpbf16ps(3, 5, 7); }",
             "    }",
             f"    _tile_stored(0, s + h * 32, {BK * 4}); _tile_stored(1, s + h * 32 + 16, {BK * 4});",
             f"    if (two) {{ _tile_stored(2, s + {16 * BK} + h * 32, {BK * 4}); "
             f"_tile_stored(3, s + {16 * BK} + h * 32 + 16, {BK * 4}); }}",
             "  }", "}"]
    return "\n".join(lines)


def _amx_pv(dvp: int) -> str:
    """``att_pvt(o, pb, vb, two, halves)``: o += P·V on tiles, the output rows as C tiles,
    32 columns at a time, over ``halves`` halves of the block's 32 pairs of keys."""
    lines = ["static inline void att_pvt(float *o, const uint32_t *pb, const uint32_t *vb, int two, int halves) {"]
    for c0 in range(0, dvp, 32):
        wide = dvp - c0 >= 32
        lines += [
            "  {",
            f"    _tile_loadd(0, o + {c0}, {dvp * 4});" + (f" _tile_loadd(1, o + {c0 + 16}, {dvp * 4});" if wide else ""),
            f"    if (two) {{ _tile_loadd(2, o + {16 * dvp + c0}, {dvp * 4});"
            + (f" _tile_loadd(3, o + {16 * dvp + c0 + 16}, {dvp * 4});" if wide else "") + " }",
            "    for (int h = 0; h < halves; h++) {",
            f"      _tile_loadd(4, pb + h * {PAIRS}, {KEY_PAIRS * 4});",
            f"      _tile_loadd(6, vb + h * {PAIRS * dvp} + {c0}, {dvp * 4});",
            "      _tile_dpbf16ps(0, 4, 6);",
            (f"      _tile_loadd(7, vb + h * {PAIRS * dvp} + {c0 + 16}, {dvp * 4}); _tile_dpbf16ps(1, 4, 7);"
             if wide else ""),
            f"      if (two) {{ _tile_loadd(5, pb + {16 * KEY_PAIRS} + h * {PAIRS}, {KEY_PAIRS * 4}); "
            "_tile_dpbf16ps(2, 5, 6);" + (" _tile_dpbf16ps(3, 5, 7);" if wide else "") + " }",
            "    }",
            f"    _tile_stored(0, o + {c0}, {dvp * 4});" + (f" _tile_stored(1, o + {c0 + 16}, {dvp * 4});" if wide else ""),
            f"    if (two) {{ _tile_stored(2, o + {16 * dvp + c0}, {dvp * 4});"
            + (f" _tile_stored(3, o + {16 * dvp + c0 + 16}, {dvp * 4});" if wide else "") + " }",
            "  }"]
    lines.append("}")
    return "\n".join(line for line in lines if line)


def support(geo, dvp: int, tiles: bool, score_rows: int, pv_rows: int) -> list[str]:
    """The C functions the bfloat16 task calls: the rounding, the vdpbf16ps products (every
    CPU with bfloat16 runs them; with tiles, where the OS refuses them) and, with
    ``tiles``, the AMX products and their configuration."""
    qw = q_words(geo.d)
    head = ["#include <immintrin.h>\n#ifndef __AVX512BF16__\n#error \"bfloat16 attention built without AVX-512 BF16\"\n"
            "#endif\n", _round_c()]
    head += [_vdp_scores(r, qw, -(-geo.d // 2)) for r in range(1, score_rows + 1)]
    head += [_vdp_pv(r, dvp) for r in range(1, pv_rows + 1)]
    if tiles:
        head.append("#ifndef __AMX_BF16__\n#error \"AMX attention built without AMX-BF16\"\n#endif\n")
        head.append(amx.tile_config(CONFIG, [(16, 64)] * 8))
        head += [_amx_scores(qw), _amx_pv(dvp)]
    return head


def task(geo, dvp: int, tiles: bool, parts: dict, score_rows: int, pv_rows: int) -> str:
    """C of ``att_task`` in bfloat16: attention_gen's task with its two products replaced.
    ``parts``: the float32 task's shared pieces (offsets, the key block range, the bias, the
    final inverse and the NaN rows), as C text."""
    qw, kblocks, qblocks = q_words(geo.d), -(-geo.skv // BK), -(-geo.sq // BQ)
    ks, kd, vs, vd = geo.k[1], geo.k[2], geo.v[1], geo.v[2]
    qs, qd = geo.q[1], geo.q[2]
    kwords, vwords = kblocks * BK * qw, kblocks * KEY_PAIRS * dvp
    floats = -(-scratch_floats(geo, dvp) // 16) * 16
    d, dv, skv = geo.d, geo.dv, geo.skv
    half = d // 2
    odd_k = f"kc[{half * BK}] = att_bf(kr[{(d - 1) * kd}]); kv_finite &= kr[{(d - 1) * kd}] - kr[{(d - 1) * kd}] == 0.0f;" \
        if d % 2 else ""
    odd_q = f"qr[{half}] = att_bf(qs_[{(d - 1) * qd}]);" if d % 2 else ""
    # 32 contiguous floats rounded by one vcvtne2ps2bf16 where a row's elements are adjacent
    q_vec = (f"for (; e + 16 <= {half}; e += 16) _mm512_storeu_si512(qr + e, (__m512i)_mm512_cvtne2ps_pbh("
             "_mm512_loadu_ps(qs_ + 2 * e + 16), _mm512_loadu_ps(qs_ + 2 * e)));") if qd == 1 else ""
    k_vec = (f"for (; e + 16 <= {half}; e += 16) {{ const __m512 x0 = _mm512_loadu_ps(kr + 2 * e), "
             "x1 = _mm512_loadu_ps(kr + 2 * e + 16); fin &= att_finite(x0) & att_finite(x1); "
             f"_mm512_i32scatter_epi32(kc + e * {BK}, att_kidx, (__m512i)_mm512_cvtne2ps_pbh(x1, x0), 4); }}"
             ) if kd == 1 else ""
    v_vec = ("for (; c + 16 <= " + str(dv) + "; c += 16) { const __m512 x0 = _mm512_loadu_ps(v0 + c), "
             "x1 = second ? _mm512_loadu_ps(v1 + c) : _mm512_setzero_ps(); fin &= att_finite(x0) & att_finite(x1); "
             "_mm512_storeu_si512(vc + c, _mm512_permutexvar_epi16(att_vidx, "
             "(__m512i)_mm512_cvtne2ps_pbh(x1, x0))); }") if vd == 1 else ""
    start, end = ((f"  if (tiles) _tile_loadconfig({CONFIG});", "  if (tiles) _tile_release();") if tiles else ("", ""))
    score_calls = " ".join(f"case {i}: att_sv{i}(qpair + r * {qw}, kt, s + r * {BK}); break;" for i in range(1, score_rows))
    pv_calls = " ".join(f"case {i}: att_pvv{i}(o + r * {dvp}, pb + r * {KEY_PAIRS}, vb, al + r, pairs); break;"
                        for i in range(1, pv_rows))
    return f"""
typedef struct {{ const float *q, *k, *v, *bias; float *out; }} att_args;

/* One row's scores of a block (scaled, biased, -inf past the last key) into the online
   softmax: its maximum m, sum l and the factor al the output row is rescaled by; the
   probabilities overwrite the scores and are rounded into the row's pairs pr. A NaN score
   makes the row NaN, as the float32 kernel does. */
static inline void att_soft(float *sr, uint32_t *pr, float *m, float *l, float *al) {{
  nn_v mv = nn_vload(sr);
  for (int x = 1; x < {BK // 16}; x++) mv = nn_vmax(mv, nn_vload(sr + x * 16));
  float mx = _mm512_reduce_max_ps((__m512)mv);
  mx = mx > *m ? mx : *m;
  if (mx == -INFINITY) {{  /* every key so far hidden: no terms, nothing to rescale */
    for (int64_t jj = 0; jj < {BK}; jj++) sr[jj] = 0.0f;
    *al = 1.0f;
  }} else {{
    nn_v sv = nn_vzero();
    for (int x = 0; x < {BK // 16}; x++) {{
      const nn_v e = nn_vexp_normal(nn_vload(sr + x * 16) - nn_vset1(mx));
      nn_vstore(sr + x * 16, e);
      sv = nn_vadd(sv, e);
    }}
    const float alpha = nn_exp(*m - mx);
    *l = *l * alpha + _mm512_reduce_add_ps((__m512)sv);
    *m = mx;
    *al = alpha;
  }}
  for (int x = 0; x < {BK // 32}; x++)
    _mm512_storeu_si512(pr + x * 16, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(sr + x * 32 + 16),
                                                                 _mm512_loadu_ps(sr + x * 32)));
}}

/* a vector's finite lanes; K's 16 pairs to 16 keys' rows (BK words apart); the bfloat16
   halves of two vectors interleaved into pairs (V: key j's column in the low half, j + 1's
   in the high) */
static inline __mmask16 att_finite(__m512 x) {{ return _mm512_cmp_ps_mask(_mm512_sub_ps(x, x), _mm512_setzero_ps(), _CMP_EQ_OQ); }}
#define att_kidx _mm512_setr_epi32({', '.join(str(i * BK) for i in range(16))})
#define att_vidx _mm512_set_epi16({', '.join(str(16 + i if p else i) for i in range(15, -1, -1) for p in (1, 0))})

/* Q's first ``rows`` rows as pairs (the others are left as they are: zero) */
static inline void att_pack_q(const float *qp, uint32_t *qpair, int64_t rows) {{
  for (int64_t r = 0; r < rows; r++) {{
    const float *qs_ = qp + r * {qs};
    uint32_t *qr = qpair + r * {qw};
    int64_t e = 0;
    {q_vec}
    for (; e < {half}; e++) qr[e] = att_pair(qs_[2 * e * {qd}], qs_[(2 * e + 1) * {qd}]);
    {odd_q}
  }}
}}

/* K as [pair][key] and V as [pair of keys][column] per block, pads zero; whether every
   value read was finite */
static inline int att_pack_kv(const float *kp, const float *vp, uint32_t *kall, uint32_t *vall) {{
  int kv_finite = 1;
  __mmask16 fin = 0xFFFF;  /* the vector loops' lanes of finite values */
  memset(kall, 0, {kwords + vwords} * sizeof(uint32_t));
  for (int64_t j = 0; j < {skv}; j++) {{
    const float *kr = kp + j * {ks};
    uint32_t *kc = kall + (j / {BK}) * {BK * qw} + j % {BK};
    int64_t e = 0;
    {k_vec}
    for (; e < {half}; e++) {{
      const float x0 = kr[2 * e * {kd}], x1 = kr[(2 * e + 1) * {kd}];
      kc[e * {BK}] = att_pair(x0, x1);
      kv_finite &= (x0 - x0 == 0.0f) & (x1 - x1 == 0.0f);
    }}
    {odd_k}
  }}
  for (int64_t j = 0; j < {skv}; j += 2) {{
    const float *v0 = vp + j * {vs}, *v1 = v0 + {vs};
    const int second = j + 1 < {skv};
    uint32_t *vc = vall + (j / {BK}) * {KEY_PAIRS * dvp} + (j % {BK}) / 2 * {dvp};
    int64_t c = 0;
    {v_vec}
    for (; c < {dv}; c++) {{
      const float x0 = v0[c * {vd}], x1 = second ? v1[c * {vd}] : 0.0f;
      vc[c] = att_pair(x0, x1);
      kv_finite &= (x0 - x0 == 0.0f) & (x1 - x1 == 0.0f);
    }}
  }}
  return kv_finite && fin == 0xFFFF;
}}

static void att_task(void *p, int64_t lo, int64_t hi) {{
  const att_args *a = p;
  const float *bias = a->bias; (void)bias;
  float *buf = nn_scratch(NN_SCRATCH_ATTENTION, {floats});
  if (!buf) return;  /* recorded: the call fails after this step */
  const int tiles = {amx.PERMITTED if tiles else "0"}; (void)tiles;
  uint32_t *kall = (uint32_t *)buf, *vall = kall + {kwords}, *qpair = vall + {vwords}, *pb = qpair + {BQ * qw};
  float *s = buf + {kwords + vwords + BQ * qw + BQ * KEY_PAIRS}, *o = s + {BQ * BK}, *m = o + {BQ * dvp};
  float *l = m + {BQ}, *al = l + {BQ};
  int64_t packed_k = -1, packed_v = -1;  /* where the packed K and V were read from */
  int kv_finite = 1;  /* whether the packed K and V hold only finite values (before rounding) */
{start}
  for (uint64_t t = (uint64_t)lo; t < (uint64_t)hi; t++) {{
    const int64_t g = (int64_t)(t / {qblocks}), qb = (int64_t)(t % {qblocks}), i0 = qb * {BQ};
    const int64_t rows = {geo.sq} - i0 < {BQ} ? {geo.sq} - i0 : {BQ};
    {' '.join(parts['offsets'])}
    const float *qp = a->q + oq + i0 * {qs}, *kp = a->k + ok, *vp = a->v + ov;
    for (int64_t r = 0; r < rows; r++) {{ m[r] = -INFINITY; l[r] = 0.0f; }}
    memset(o, 0, {BQ * dvp} * sizeof(float));
    /* Q's rows as pairs, once per task; the rows past the block and P's rows zero */
    memset(qpair, 0, {BQ * qw + BQ * KEY_PAIRS} * sizeof(uint32_t));
    att_pack_q(qp, qpair, rows);
    if (ok != packed_k || ov != packed_v) {{  /* K as [pair][key] and V as [pair of keys][column], per block */
      kv_finite = att_pack_kv(kp, vp, kall, vall);
      packed_k = ok;
      packed_v = ov;
    }}
    for (int64_t jb = {parts['lo']}; jb < {parts['hi']}; jb++) {{
      const int64_t j0 = jb * {BK}, cols = {skv} - j0 < {BK} ? {skv} - j0 : {BK};
      const uint32_t *kt = kall + jb * {BK * qw}, *vb = vall + jb * {KEY_PAIRS * dvp};
      const int64_t pairs = (cols + 1) / 2;
      int64_t r = 0;
      if (tiles) att_st(qpair, kt, s, rows > 16, cols > 32 ? 2 : 1);
      else {{
        for (; r + {score_rows} <= rows; r += {score_rows}) att_sv{score_rows}(qpair + r * {qw}, kt, s + r * {BK});
        switch (rows - r) {{ {score_calls} default: break; }}
      }}
      for (r = 0; r < rows; r++) {{
        float *sr = s + r * {BK};
        {parts['add_bias']}
        for (int64_t jj = cols; jj < {BK}; jj++) sr[jj] = -INFINITY;
        att_soft(sr, pb + r * {KEY_PAIRS}, m + r, l + r, al + r);
      }}
      if (tiles) {{
        for (r = 0; r < rows; r++) if (al[r] != 1.0f) for (int64_t c = 0; c < {dvp}; c++) o[r * {dvp} + c] *= al[r];
        att_pvt(o, pb, vb, rows > 16, cols > 32 ? 2 : 1);
      }} else {{
        for (r = 0; r + {pv_rows} <= rows; r += {pv_rows}) att_pvv{pv_rows}(o + r * {dvp}, pb + r * {KEY_PAIRS}, vb, al + r, pairs);
        switch (rows - r) {{ {pv_calls} default: break; }}
      }}
    }}
    for (int64_t r = 0; r < rows; r++) {{
      const float inv = {parts['inverse']};
      float *y = a->out + oo + (i0 + r) * {geo.o[1]};
      {parts['nan_rows']}
      for (int64_t c = 0; c < {dv}; c++) y[c * {geo.o[2]}] = o[r * {dvp} + c] * inv;
    }}
  }}
{end}
}}
"""
