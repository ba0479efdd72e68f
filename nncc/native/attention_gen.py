"""Native C for ``nncc::FusedAttention`` (nncc.kernels.fused_attention): one kernel per
geometry that computes softmax(Q·Kᵀ·scale + bias)·V without ever writing the score matrix.

Flash-attention style: each task takes one (batch, head) and a block of BQ query rows, and
walks the keys in blocks of BK. Per key block it packs K transposed (so the scores of a row
are vectors over keys), computes the BQ x BK scores in registers, scales them and adds the
bias, then folds them into a running softmax (online: a row's maximum and sum so far, its
output rescaled when the maximum grows) and adds probabilities·V into the output rows. The
exponentials are vectors, 0 below e^-87 rather than denormal (simd.h's ``nn_vexp_normal``:
a denormal result costs a microcode assist, and a mask of -100 made every hidden term one),
while K and V are finite: a term that small then moves no output by more than itself. Where
they hold a NaN or an infinity the scalar exponential keeps its denormals, so that a hidden
key's infinite V still gives an infinity, as the unfused ops do, not 0 * inf.
The scores of a block live in L1; a row is divided by its sum once, at the end. Tasks are
(batch x heads x query blocks), claimed in chunks by the thread pool's threads.

Every operand is read through the strides its permutation gives (nncc.kernels.fused_attention),
so the Transposes that split and merge heads cost nothing. Grouped-query heads (``head_group``)
read K and V at head ``h // head_group``: consecutive query heads of a group find the same K and
V block already packed, so a group packs its K and V once and nothing is copied per head. A
constant bias that hides whole key blocks from a query block (a causal mask, a window) is read at
compile time: those blocks are skipped while K and V are finite (a NaN or an infinity in a hidden
key still reaches the rows, as 0 * NaN and NaN scores do in the unfused ops). A key is hidden when its bias is at most ``HIDDEN``
(exporters write -1e4, -1e9, float32's lowest or -inf): its probability is exp(score + bias -
max), which is 0 in float32 unless scores reach a magnitude near the bias. Skipping is only used
when every query row keeps at least one key, so a row never loses all its terms.

Per-task buffers (the packed K and V, the scores, the output rows) are the thread's scratch
(``nn_scratch``, runtime.c), kept for its life: no step allocates once each thread has run it,
any head size runs, and the sanitize mode gives each request a block of exactly its size. When
memory runs out the task does nothing and the call fails with a status, never returning rows it
did not compute.
"""

from __future__ import annotations

import math

import numpy as np

from nncc.ir.graph import Graph, Node, TensorInfo
from nncc.native import attention_bf16_gen
from nncc.native.c_literal import c_float
from nncc.native.graph_query import const_value
from nncc.native.isa import REGISTERS_BY_WIDTH

F32 = np.dtype(np.float32)
BQ = 32  # query rows per task
BK = 64  # keys per block (a multiple of every vector width)
HIDDEN = -1e8  # a bias at or below this hides its key (see the module docstring)
MAX_TILE_FLOATS = 1 << 24  # per-task buffers beyond this (only absurd head sizes) stay portable


def _perm(node: Node, key: str, rank: int) -> list[int]:
    perm = node.attrs.get(key)
    return list(range(rank)) if perm is None else [int(p) for p in perm]


def _strides(shape) -> list[int]:
    return [math.prod(shape[i + 1:]) for i in range(len(shape))]


class _Geometry:
    """Sizes and element strides of every operand in logical (batch..., row, column) order."""

    def __init__(self, node: Node, shape_of):
        q, k, v = node.inputs[:3]
        bias = node.inputs[3] if len(node.inputs) > 3 and node.inputs[3] else None
        logical = {}
        for key, name in (("q_perm", q), ("k_perm", k), ("v_perm", v)):
            shape = list(shape_of(name))
            perm = _perm(node, key, len(shape))
            st = _strides(shape)
            logical[key] = ([shape[p] for p in perm], [st[p] for p in perm])
        out_shape = list(shape_of(node.outputs[0]))
        out_perm = _perm(node, "out_perm", len(out_shape))
        ost = _strides(out_shape)
        o_sizes, o_strides = [0] * len(out_shape), [0] * len(out_shape)
        for j, axis in enumerate(out_perm):
            o_sizes[axis], o_strides[axis] = out_shape[j], ost[j]
        self.rank = len(o_sizes)
        self.group = int(node.attrs.get("head_group", 1))
        self.batch = o_sizes[:-2]
        self.sq, self.dv = o_sizes[-2], o_sizes[-1]
        (qs, qst), (ks, kst), (vs, vst) = logical["q_perm"], logical["k_perm"], logical["v_perm"]
        self.skv, self.d = ks[-2], ks[-1]
        self.q = self._fit(qs, qst)
        self.k = self._fit(ks, kst)
        self.v = self._fit(vs, vst)
        self.o = (o_strides[:-2], o_strides[-2], o_strides[-1])
        self.bias = None
        if bias is not None:
            bshape = list(shape_of(bias))
            self.bias = self._fit(bshape, _strides(bshape))

    def _fit(self, sizes, strides):
        """(batch strides against the output's batch, row stride, column stride); an axis
        of size 1 (or missing) is broadcast: stride 0."""
        pad = self.rank - len(sizes)
        sizes, strides = [1] * pad + list(sizes), [0] * pad + list(strides)
        fitted = [0 if s == 1 else st for s, st in zip(sizes, strides)]
        return fitted[:-2], fitted[-2], fitted[-1]

    @property
    def groups(self) -> int:
        return math.prod(self.batch)

    def tile_floats(self, vl: int) -> int:
        dvp = -(-self.dv // vl) * vl
        keys = -(-self.skv // BK) * BK
        return keys * (self.d + dvp) + BQ * BK + BQ * dvp + 3 * BQ


def _inconsistent(node: Node, infos) -> str | None:
    """Why the operands do not make one attention (a node nncc's pass did not write), or None."""
    logical = []
    for key, name in zip(("q_perm", "k_perm", "v_perm"), node.inputs[:3]):
        shape = infos[name].shape
        perm = _perm(node, key, len(shape))
        if len(shape) < 2 or sorted(perm) != list(range(len(shape))):
            return f"{key} {perm} is not a permutation of the operand's axes"
        logical.append([shape[p] for p in perm])
    (q, k, v), out = logical, infos[node.outputs[0]].shape
    group = int(node.attrs.get("head_group", 1))
    if group < 1:
        return "head_group below 1"
    if group > 1:  # each K and V head stands for `group` query heads on the head axis
        if min(len(q), len(k), len(v)) < 3 or k[-3] != v[-3] or q[-3] != k[-3] * group:
            return f"Q, K and V without {group} query heads to each K and V head"
        k, v = k[:-3] + [q[-3]] + k[-2:], v[:-3] + [q[-3]] + v[-2:]
    rank = max(len(q), len(k), len(v))
    out_perm = _perm(node, "out_perm", len(out))
    if len(out) != rank or sorted(out_perm) != list(range(rank)):
        return "out_perm does not match the output"
    y = [0] * rank
    for j, axis in enumerate(out_perm):
        y[axis] = out[j]
    if q[-1] != k[-1] or k[-2] != v[-2] or y[-2] != q[-2] or y[-1] != v[-1]:
        return "Q, K and V that do not make an attention"
    operands = [q, k, v]
    if len(node.inputs) > 3 and node.inputs[3]:
        operands.append(list(infos[node.inputs[3]].shape[:-2]) + [0, 0])
        bias = infos[node.inputs[3]].shape
        if len(bias) > rank or any(b not in (1, want) for b, want in zip(bias[::-1], [k[-2], q[-2]])):
            return "a bias that does not broadcast to the scores"
    for shape in operands:
        if len(shape) > rank or any(d not in (1, want) for d, want in zip(shape[-3::-1], y[-3::-1])):
            return "batch axes that do not broadcast to the output's"
    return None


def check(node: Node, graph: Graph, infos: dict[str, TensorInfo]) -> str | None:
    names = [n for n in node.inputs if n] + [o for o in node.outputs if o]
    for name in names:
        info = infos.get(name)
        if info is None or info.dtype != F32 or not info.is_static:
            return f"value {name!r} is not a static float32 tensor"
    if len(node.inputs) < 3 or any(not n for n in node.inputs[:3]) or len(node.outputs) != 1:
        return "FusedAttention without Q, K and V"
    why = _inconsistent(node, infos)
    if why:
        return why  # the portable kernel reports it
    geo = _Geometry(node, lambda name: infos[name].shape)
    if geo.skv == 0:
        return "attention over no keys"
    if geo.tile_floats(16) > MAX_TILE_FLOATS:
        return "head sizes too large for one task's buffers"
    return None


def _hidden_ranges(node: Node, graph: Graph, infos, geo: _Geometry) -> tuple[list[int], list[int]] | None:
    """Per query block, the key blocks [lo, hi) a constant bias leaves visible; None when
    the bias is not a constant, hides nothing, or hides every key of some row."""
    if len(node.inputs) < 4 or not node.inputs[3]:
        return None
    value = const_value(graph, infos, node.inputs[3])
    if value is None:
        return None
    bias = np.asarray(value, np.float32)
    lead = bias.shape[:-2] if bias.ndim > 2 else ()
    visible = np.broadcast_to(bias, lead + (geo.sq, geo.skv)) > HIDDEN
    visible = visible.reshape(-1, geo.sq, geo.skv).any(axis=0)  # visible for any batch or head
    if not visible.any(axis=1).all() or visible.all():
        return None
    blocks = -(-geo.skv // BK)
    lo, hi = [], []
    for i0 in range(0, geo.sq, BQ):
        cols = np.flatnonzero(visible[i0:i0 + BQ].any(axis=0))
        lo.append(int(cols[0]) // BK)
        hi.append(min(blocks, int(cols[-1]) // BK + 1))
    return lo, hi


def _offsets(geo: _Geometry) -> list[str]:
    """C computing each operand's offset (oq, ok, ov, oo, ob) for the batch index g; with
    grouped heads, K and V at the head axis (the last batch axis) are read at h / group."""
    lines = ["int64_t rem = g, oq = 0, ok = 0, ov = 0, oo = 0, ob = 0; (void)ob;"]
    bias = geo.bias[0] if geo.bias else [0] * len(geo.batch)
    for a in range(len(geo.batch) - 1, -1, -1):
        kv_index = f"(i / {geo.group})" if geo.group > 1 and a == len(geo.batch) - 1 else "i"
        terms = [f"{var} += {kv_index if var in ('ok', 'ov') else 'i'} * {st[a]};" for var, st in
                 (("oq", geo.q[0]), ("ok", geo.k[0]), ("ov", geo.v[0]), ("oo", geo.o[0]), ("ob", bias)) if st[a]]
        lines.append(f"{{ int64_t i = rem % {geo.batch[a]}; rem /= {geo.batch[a]}; (void)i; {' '.join(terms)} }}")
    return lines


def _score_rows(name: str, rows: int, geo: _Geometry, nv: int, cv: int) -> str:
    """A register tile: ``rows`` query rows against the packed key block, stored to s; the
    block's ``nv`` vectors of keys are taken ``cv`` at a time, so rows x cv sums, the cv
    vectors of K they share and a broadcast of Q fit the ISA's registers."""
    qs, qd = geo.q[1], geo.q[2]
    body = [f"static inline void {name}(const float *qp, const float *kt, float *s) {{"]
    body.append(f"  for (int c = 0; c < {nv}; c += {cv}) {{")
    body.append(f"    nn_v acc[{rows}][{cv}];")
    body.append(f"    for (int u = 0; u < {rows}; u++) for (int w = 0; w < {cv}; w++) acc[u][w] = nn_vzero();")
    body.append(f"    for (int64_t d = 0; d < {geo.d}; d++) {{")
    body.append(f"      const float *kr = kt + d * {BK} + c * NN_VL;")
    body.append(f"      nn_v kv[{cv}];")
    body.append(f"      for (int w = 0; w < {cv}; w++) kv[w] = nn_vload(kr + w * NN_VL);")
    body.append(f"      for (int u = 0; u < {rows}; u++) {{")
    body.append(f"        const nn_v qv = nn_vset1(qp[u * {qs} + d * {qd}]);")
    body.append(f"        for (int w = 0; w < {cv}; w++) acc[u][w] = nn_vfma(qv, kv[w], acc[u][w]);")
    body.append("      }")
    body.append("    }")
    body.append(f"    for (int u = 0; u < {rows}; u++) for (int w = 0; w < {cv}; w++) "
                f"nn_vstore(s + u * {BK} + (c + w) * NN_VL, acc[u][w]);")
    body.append("  }")
    body.append("}")
    return "\n".join(body)


def _pv_code(vl: int, dvp: int, most: int) -> str:
    """``_pv(o, p, vb, al, cols)``: R rows of o = o * alpha + p·V over the block's keys, R
    and a chunk of output vectors at a time, so each load of V feeds R multiply-adds."""
    nvec = dvp // vl
    out = []
    for rows in range(1, most + 1):
        lines = [f"static inline void att_pv{rows}(float *o, const float *p, const float *vb, const float *al, "
                 "int64_t cols) {"]
        for c in range(0, nvec, 4):
            u = min(4, nvec - c)
            base = c * vl
            lines.append("  {")
            lines.append(f"    nn_v a[{rows}][{u}];")
            lines.append(f"    for (int r = 0; r < {rows}; r++) for (int x = 0; x < {u}; x++) "
                         f"a[r][x] = nn_vmul(nn_vload(o + r * {dvp} + {base} + x * NN_VL), nn_vset1(al[r]));")
            lines.append("    for (int64_t jj = 0; jj < cols; jj++) {")
            lines.append(f"      const float *vr = vb + jj * {dvp} + {base};")
            lines.append(f"      nn_v v[{u}];")
            lines.append(f"      for (int x = 0; x < {u}; x++) v[x] = nn_vload(vr + x * NN_VL);")
            lines.append(f"      for (int r = 0; r < {rows}; r++) {{")
            lines.append(f"        const nn_v pv = nn_vset1(p[r * {BK} + jj]);")
            lines.append(f"        for (int x = 0; x < {u}; x++) a[r][x] = nn_vfma(pv, v[x], a[r][x]);")
            lines.append("      }")
            lines.append("    }")
            lines.append(f"    for (int r = 0; r < {rows}; r++) for (int x = 0; x < {u}; x++) "
                         f"nn_vstore(o + r * {dvp} + {base} + x * NN_VL, a[r][x]);")
            lines.append("  }")
        lines.append("}")
        out.append("\n".join(lines))
    return "\n".join(out)


def arithmetic(w, node: Node, geo: _Geometry) -> str:
    """What the step's two products compute in: "f32", "bf16" (vdpbf16ps) or "bf16amx"
    (AMX tiles, vdpbf16ps where the OS refuses them), from the writer's arithmetic for
    products by weights (nncc/native/precision.py). Precision auto keeps an attention
    float32 by naming its output (calibration.low_layers lists it so); a short query
    block stays float32 on a CPU with tiles (attention_bf16_gen.AMX_MIN_ROWS)."""
    kind = getattr(getattr(w, "low_packing", None), "name", "f32")
    if kind not in ("bf16", "bf16amx") or w.vl != 16 or node.outputs[0] in getattr(w, "keep_f32", ()):
        return "f32"
    if kind == "bf16amx" and geo.sq < attention_bf16_gen.AMX_MIN_ROWS:
        return "f32"
    return kind


def emit(w, node: Node) -> None:
    geo = _Geometry(node, w.shape)
    q, k, v = node.inputs[:3]
    bias = node.inputs[3] if len(node.inputs) > 3 and node.inputs[3] else None
    out = node.outputs[0]
    reads = [q, k, v] + ([bias] if bias else [])
    if geo.groups * geo.sq * geo.dv == 0:
        return w.step(";", reads, [out])
    vl = w.vl
    nv = BK // vl
    dvp = -(-geo.dv // vl) * vl
    qblocks, kblocks = -(-geo.sq // BQ), -(-geo.skv // BK)
    tasks = geo.groups * qblocks
    scale = float(node.attrs.get("scale", 1.0))
    ranges = _hidden_ranges(node, w.graph, w.infos, geo)
    # sums per register tile: three quarters of the ISA's vector registers (24 of AVX-512's
    # 32, 12 of AVX2's 16), the rest for the operands; the scores take the key block 4 vectors
    # at a time when 6 rows of them fit (AVX-512), else 2 (a 6 x 2 tile: one row of 8 vectors
    # loaded all of K for each row's 8 multiply-adds, bound by loads)
    budget = REGISTERS_BY_WIDTH[vl] * 3 // 4
    cv = min(nv, 4 if budget >= 24 else 2)
    group = max(1, min(6, budget // cv))
    pv_rows = max(1, min(6, budget // min(4, dvp // vl)))
    ks, kd, vs, vd = geo.k[1], geo.k[2], geo.v[1], geo.v[2]
    os_, od = geo.o[1], geo.o[2]
    tables = []
    if ranges is not None:
        tables.append(f"static const int32_t att_lo[{qblocks}] = {{{', '.join(map(str, ranges[0]))}}};")
        tables.append(f"static const int32_t att_hi[{qblocks}] = {{{', '.join(map(str, ranges[1]))}}};")
    support = [w.simd, f"NN_REQUIRE_VL({vl});",
               *(_score_rows(f"att_rows{r}", r, geo, nv, cv) for r in range(1, group + 1)), _pv_code(vl, dvp, pv_rows)]
    support += tables
    # hidden blocks are skipped only while K and V are finite: a NaN or an infinity there
    # reaches every row as the unfused ops compute it (0 * NaN, NaN scores)
    lo, hi = (("(kv_finite ? att_lo[qb] : 0)", f"(kv_finite ? att_hi[qb] : {kblocks})") if ranges is not None
              else ("0", str(kblocks)))
    kfloats, vfloats = kblocks * BK * geo.d, kblocks * BK * dvp
    floats = kfloats + vfloats + BQ * BK + BQ * dvp + 3 * BQ
    floats = -(-floats // 16) * 16
    # the buffer is the thread's, left as its last task left it: everything read is written
    # first (the output rows are zeroed per task, m, l and al set per row), and the pads the
    # vector loops read past K's last key and V's last column are zeroed when packed (the
    # scores of the keys past the end are then set to -inf, the columns past dv dropped)
    v_pad = (f"for (int64_t c = {geo.dv}; c < {dvp}; c++) vall[j * {dvp} + c] = 0.0f;" if dvp > geo.dv else "")
    tail = geo.skv % BK
    k_pad = (f"for (int64_t d = 0; d < {geo.d}; d++) memset(kall + {(kblocks - 1) * BK * geo.d} + d * {BK} + "
             f"{tail}, 0, {BK - tail} * sizeof(float));" if tail else "")
    if geo.bias is not None:
        bs, bj = geo.bias[1], geo.bias[2]
        add_bias = (f"const float *br = bias + ob + (i0 + r) * {bs} + j0 * {bj}; "
                    f"for (int64_t jj = 0; jj < cols; jj++) sr[jj] = sr[jj] * {c_float(scale)} + br[jj * {bj}];")
    else:
        add_bias = f"for (int64_t jj = 0; jj < cols; jj++) sr[jj] *= {c_float(scale)};"
    # a row that saw no key: 0/0, NaN as Softmax gives, or zeros as ONNX Attention defines
    inverse = "l[r] == 0.0f ? 0.0f : 1.0f / l[r]" if node.attrs.get("zero_hidden_rows") else "1.0f / l[r]"
    # Where(IsNaN(p), 0, p) after the Softmax: a row whose probabilities are NaN (its sum is
    # 0: every score -inf, or NaN: a NaN or +inf score) has all of them 0, so its output is
    # the sum of 0 * V over the keys (NaN where V holds a NaN or an infinity, as there)
    nan_rows = ""
    if node.attrs.get("zero_nan_rows"):
        nan_rows = (f"if (!(l[r] > 0.0f && l[r] < INFINITY)) {{ for (int64_t c = 0; c < {geo.dv}; c++) {{ "
                    f"float z = 0.0f; for (int64_t j = 0; j < {geo.skv}; j++) z += 0.0f * vp[j * {vs} + c * {vd}]; "
                    f"y[c * {od}] = z; }} continue; }}")
    kind = arithmetic(w, node, geo)
    if kind != "f32":
        tiles = kind == "bf16amx"
        score_rows, pv_rows = 6, max(1, min(6, 24 // min(4, dvp // vl)))
        support = [w.simd, f"NN_REQUIRE_VL({vl});", *tables]
        support += attention_bf16_gen.support(geo, dvp, tiles, score_rows, pv_rows)
        parts = dict(offsets=_offsets(geo), lo=lo, hi=hi, add_bias=add_bias, inverse=inverse, nan_rows=nan_rows)
        support.append(attention_bf16_gen.task(geo, dvp, tiles, parts, score_rows, pv_rows))
        w.step(_launch(w, geo, q, k, v, bias, out, tasks), reads, [out], support="\n".join(support))
        w.low_attention.append(out)
        return
    body = f"""
typedef struct {{ const float *q, *k, *v, *bias; float *out; }} att_args;

static void att_task(void *p, int64_t lo, int64_t hi) {{
  const att_args *a = p;
  const float *bias = a->bias; (void)bias;
  float *buf = nn_scratch(NN_SCRATCH_ATTENTION, {floats});
  if (!buf) return;  /* recorded: the call fails after this step */
  float *kall = buf, *vall = kall + {kfloats}, *s = vall + {vfloats}, *o = s + {BQ * BK}, *m = o + {BQ * dvp};
  float *l = m + {BQ}, *al = l + {BQ};
  int64_t packed_k = -1, packed_v = -1;  /* where the packed K and V were read from */
  int kv_finite = 1;  /* whether the packed K and V hold only finite values */
  for (uint64_t t = (uint64_t)lo; t < (uint64_t)hi; t++) {{
    const int64_t g = (int64_t)(t / {qblocks}), qb = (int64_t)(t % {qblocks}), i0 = qb * {BQ};
    const int64_t rows = {geo.sq} - i0 < {BQ} ? {geo.sq} - i0 : {BQ};
    {' '.join(_offsets(geo))}
    const float *qp = a->q + oq + i0 * {geo.q[1]}, *kp = a->k + ok, *vp = a->v + ov;
    for (int64_t r = 0; r < rows; r++) {{ m[r] = -INFINITY; l[r] = 0.0f; }}
    memset(o, 0, {BQ * dvp} * sizeof(float));
    if (ok != packed_k || ov != packed_v) {{  /* K transposed per block of keys, V as rows of whole vectors */
      kv_finite = 1;
      for (int64_t j = 0; j < {geo.skv}; j++) {{
        float *kc = kall + (j / {BK}) * {BK * geo.d} + j % {BK};
        for (int64_t d = 0; d < {geo.d}; d++) {{ float x = kp[j * {ks} + d * {kd}]; kc[d * {BK}] = x; kv_finite &= x - x == 0.0f; }}
        for (int64_t c = 0; c < {geo.dv}; c++) {{ float x = vp[j * {vs} + c * {vd}]; vall[j * {dvp} + c] = x; kv_finite &= x - x == 0.0f; }}
        {v_pad}
      }}
      {k_pad}
      packed_k = ok;
      packed_v = ov;
    }}
    for (int64_t jb = {lo}; jb < {hi}; jb++) {{
      const int64_t j0 = jb * {BK}, cols = {geo.skv} - j0 < {BK} ? {geo.skv} - j0 : {BK};
      const float *kt = kall + jb * {BK * geo.d}, *vb = vall + j0 * {dvp};
      int64_t r = 0;
      for (; r + {group} <= rows; r += {group}) att_rows{group}(qp + r * {geo.q[1]}, kt, s + r * {BK});
      switch (rows - r) {{ {' '.join(f"case {i}: att_rows{i}(qp + r * {geo.q[1]}, kt, s + r * {BK}); break;" for i in range(1, group))} default: break; }}
      for (r = 0; r < rows; r++) {{
        float *sr = s + r * {BK};
        {add_bias}
        for (int64_t jj = cols; jj < {BK}; jj++) sr[jj] = -INFINITY;
        nn_v mv = nn_vload(sr);
        for (int x = 1; x < {nv}; x++) mv = nn_vmax(mv, nn_vload(sr + x * NN_VL));
        float mx = m[r];
        for (int x = 0; x < NN_VL; x++) mx = mv[x] > mx ? mv[x] : mx;
        if (mx == -INFINITY) {{ for (int64_t jj = 0; jj < {BK}; jj++) sr[jj] = 0.0f; al[r] = 1.0f; continue; }}
        if (kv_finite) for (int x = 0; x < {nv}; x++) nn_vstore(sr + x * NN_VL, nn_vexp_normal(nn_vload(sr + x * NN_VL) - nn_vset1(mx)));
        else for (int64_t jj = 0; jj < {BK}; jj++) sr[jj] = nn_exp(sr[jj] - mx);  /* e^-100 * inf stays inf */
        nn_v sv = nn_vload(sr);
        for (int x = 1; x < {nv}; x++) sv = nn_vadd(sv, nn_vload(sr + x * NN_VL));
        float sum = 0.0f;
        for (int x = 0; x < NN_VL; x++) sum += sv[x];
        const float alpha = nn_exp(m[r] - mx);
        l[r] = l[r] * alpha + sum;
        m[r] = mx;
        al[r] = alpha;
      }}
      for (r = 0; r + {pv_rows} <= rows; r += {pv_rows}) att_pv{pv_rows}(o + r * {dvp}, s + r * {BK}, vb, al + r, cols);
      switch (rows - r) {{ {' '.join(f"case {i}: att_pv{i}(o + r * {dvp}, s + r * {BK}, vb, al + r, cols); break;" for i in range(1, pv_rows))} default: break; }}
    }}
    for (int64_t r = 0; r < rows; r++) {{
      const float inv = {inverse};
      float *y = a->out + oo + (i0 + r) * {os_};
      {nan_rows}
      for (int64_t c = 0; c < {geo.dv}; c++) y[c * {od}] = o[r * {dvp} + c] * inv;
    }}
  }}
}}
"""
    support.append(body)
    w.step(_launch(w, geo, q, k, v, bias, out, tasks), reads, [out], support="\n".join(support))


def _launch(w, geo: _Geometry, q, k, v, bias, out, tasks: int) -> str:
    pointers = [w.ptr(q), w.ptr(k), w.ptr(v), w.ptr(bias) if bias else "0", w.ptr(out)]
    work = geo.groups * geo.sq * geo.skv * (geo.d + geo.dv) * 2
    return f"att_args a = {{{', '.join(pointers)}}}; nn_parallel({tasks}, {work}, att_task, &a);"
