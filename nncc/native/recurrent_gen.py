"""Native C for float32 RNN, GRU and LSTM with constant weights: one step per node.

The step runs in two parts. First the input projection of every time step and direction,
``X·Wᵀ + bias``, as ONE packed GEMM (gemm_gen's, W packed at compile time), into a scratch
matrix of [rows of X, directions x gates x hidden]. The biases fold into it: W's and R's
(the recurrence bias is added every step anyway), except GRU's Rb of the candidate gate
with linear_before_reset, which the reset gate multiplies, so it stays in the step.

Then the recurrence, one time step at a time (both directions of a bidirectional node
advance together, the reverse one walking time backwards). A step is one pass shared out
over the thread pool: each task takes one direction and one block of U hidden units, and
computes h·Rᵀ for the gates of just those units and every batch row (R is packed so that
the G gates of a block of units are G x U consecutive columns of one panel, K = hidden
deep), then the gates themselves, the new cell and hidden state, and Y. No task reads what
another writes in the same step: the hidden state is double-buffered (all of the old one
feeds every unit), the cell state of a unit belongs to its task. GRU without
linear_before_reset needs r ⊙ h of every unit before its candidate gate's product, so its
step is two passes: the update and reset gates (and r ⊙ h), then the candidate gate.

At batch 1 a step is bound by reading all of R (1 MB for an LSTM of hidden 256) from L2:
one thread runs as fast as onnxruntime's, two split R over two cores' caches.

Under precision bf16 the projection is the packed GEMM of the compile's bfloat16
arithmetic (the writer's packing: AMX tiles, vdpbf16ps or widened weights), and R is kept
in bfloat16 and widened to float32 in registers (one shift or one mask per vector, two
columns to a 32-bit word as gemm_bf16_gen's widened weights): the step reads half the
bytes, while the hidden state and every sum stay float32, so R's rounding (at most 2^-8
of each weight) is the recurrence's only error beyond float32's. A panel whose width is an
odd number of vectors (GRU with linear_before_reset: three gates of one vector) keeps R
float32.

Every index is in range by construction: time t < S, batch row b < B, unit j = j0 + i with
i < min(U, H - j0), direction d < D, so a projection row is below S x B and a state below
D x B x H; a task's panel of R starts at task x H x G x U, below the packed D x blocks x H x
G x U; the zero columns past H in the last block are multiplied but never read.

The equations, clip and LSTM's peepholes and input_forget are the portable kernel's
(nncc/kernels/recurrent.py): clip bounds each gate's input before its activation, the cell
state is not clipped before h(). Activations are the default Sigmoid and Tanh (others stay
portable), with prelude.h's vectorizable nn_sigmoid and nn_tanh. sequence_lens is taken
only when absent or a constant with every entry the full sequence (the same equations).
"""

from __future__ import annotations

import numpy as np

from nncc.ir.graph import Graph, Node, TensorInfo
from nncc.native import gemm_gen
from nncc.native.gemm_bf16_gen import to_bf16
from nncc.native.c_literal import c_float
from nncc.native.graph_query import const_value
from nncc.native.kernel import scratch_arg

F32 = np.dtype(np.float32)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULT_ACTS = {"RNN": ["tanh"], "GRU": ["sigmoid", "tanh"], "LSTM": ["sigmoid", "tanh", "tanh"]}
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}
RB = 4  # batch rows per product tile: RB x (G x U / VL) accumulators stay in registers
MAX_SCRATCH_FLOATS = 1 << 27  # the projection and states of one node (512 MB): beyond stays portable


def handles(node: Node) -> bool:
    return not node.domain and node.op_type in GATES


class _Node:
    """One recurrent node's operands (names, "" when absent) and sizes."""

    def __init__(self, node: Node, shape_of):
        op = self.op = node.op_type
        self.g = GATES[op]
        ins = list(node.inputs) + [""] * (8 - len(node.inputs))
        self.x, self.w, self.r, self.b, self.seq_lens, self.h0 = ins[:6]
        self.c0, self.p = (ins[6], ins[7]) if op == "LSTM" else ("", "")
        outs = list(node.outputs) + [""] * 3
        self.y, self.yh = outs[:2]
        self.yc = outs[2] if op == "LSTM" else ""
        attrs = node.attrs
        self.direction = attrs.get("direction", "forward")
        if isinstance(self.direction, bytes):
            self.direction = self.direction.decode()
        self.d = DIRECTIONS.get(self.direction, 0)
        self.layout = int(attrs.get("layout", 0))
        self.lbr = int(attrs.get("linear_before_reset", 0)) if op == "GRU" else 0
        self.input_forget = int(attrs.get("input_forget", 0)) if op == "LSTM" else 0
        clip = attrs.get("clip")
        self.clip = None if clip is None else float(clip)
        xs = shape_of(self.x)
        self.seq, self.batch = (xs[0], xs[1]) if self.layout == 0 else (xs[1], xs[0])
        self.inp = xs[2]
        self.h = shape_of(self.r)[2]

    def row(self, t: str, b: str) -> str:
        """C of X's (and the projection's) row of time t, batch entry b."""
        return f"({t}) * {self.batch} + ({b})" if self.layout == 0 else f"({b}) * {self.seq} + ({t})"

    def state_shape(self) -> tuple[int, int, int]:
        return (self.d, self.batch, self.h) if self.layout == 0 else (self.batch, self.d, self.h)

    def y_shape(self) -> tuple[int, int, int, int]:
        return ((self.seq, self.d, self.batch, self.h) if self.layout == 0
                else (self.batch, self.seq, self.d, self.h))


def _acts_are_default(node: Node, op: str, d: int) -> bool:
    names = node.attrs.get("activations")
    if not names:
        return True
    names = [(n.decode() if isinstance(n, bytes) else str(n)).lower() for n in names]
    return names in (DEFAULT_ACTS[op], DEFAULT_ACTS[op] * d)


def check(node: Node, graph: Graph, infos: dict[str, TensorInfo]) -> str | None:
    """None when the node can become C, else why not."""
    op = node.op_type
    if len(node.inputs) < 3 or not all(node.inputs[:3]):
        return f"{op} without X, W and R"  # the portable kernel reports it
    for name in [node.inputs[0]] + [o for o in node.outputs if o]:
        info = infos.get(name)
        if info is None or info.dtype != F32 or not info.is_static:
            return f"value {name!r} is not a static float32 tensor"
    if len(infos[node.inputs[0]].shape) != 3:
        return "X is not of rank 3"
    attrs = node.attrs
    if attrs.get("direction", "forward") not in (*DIRECTIONS, *(k.encode() for k in DIRECTIONS)):
        return "an unknown direction"
    if int(attrs.get("layout", 0)) not in (0, 1):
        return "an unknown layout"
    if op == "GRU" and int(attrs.get("linear_before_reset", 0)) not in (0, 1):
        return "linear_before_reset other than 0 or 1"
    weights = {}
    for role, name in (("W", node.inputs[1]), ("R", node.inputs[2])):
        value = const_value(graph, infos, name)
        if value is None or np.asarray(value).dtype != F32 or np.ndim(value) != 3:
            return f"{role} is not a constant float32 tensor of rank 3"
        weights[role] = np.asarray(value)
    n = _Node(node, lambda name: np.shape(weights["R"]) if name == node.inputs[2] else infos[name].shape)
    g, h, d = n.g, n.h, n.d
    if 0 in (n.seq, n.batch, n.inp, h):
        return "an empty sequence, batch, input or hidden state"
    if weights["W"].shape != (d, g * h, n.inp) or weights["R"].shape != (d, g * h, h):
        return "W or R of another shape than the directions, gates, hidden and input sizes give"
    if attrs.get("hidden_size") is not None and int(attrs["hidden_size"]) != h:
        return "hidden_size that R does not have"
    if not _acts_are_default(node, op, d):
        return f"activations {attrs.get('activations')!r} (only the default {DEFAULT_ACTS[op]})"
    if n.clip is not None and not n.clip >= 0.0:
        return "a clip that is not a non-negative number"
    for role, name, shape in (("B", n.b, (d, 2 * g * h)), ("P", n.p, (d, 3 * h))):
        if name:
            value = const_value(graph, infos, name)
            if value is None or np.asarray(value).dtype != F32 or np.shape(value) != shape:
                return f"{role} is not a constant float32 tensor of shape {list(shape)}"
    if n.seq_lens:
        lens = const_value(graph, infos, n.seq_lens)
        if lens is None or np.shape(lens) != (n.batch,) or np.any(np.asarray(lens) != n.seq):
            return "sequence_lens other than absent or a constant of the full length for every entry"
    for name in (n.h0, n.c0):
        if name:
            info = infos.get(name)
            if info is None or info.dtype != F32 or not info.is_static or tuple(info.shape) != n.state_shape():
                return f"initial state {name!r} is not a static float32 tensor of shape {list(n.state_shape())}"
    for name, shape in ((n.y, n.y_shape()), (n.yh, n.state_shape()), (n.yc, n.state_shape())):
        if name and tuple(infos[name].shape) != shape:
            return f"output {name!r} of another shape than {list(shape)}"
    if _scratch_floats(n) > MAX_SCRATCH_FLOATS:
        return "a projection too large for one step's scratch"
    return None


def _pad16(n: int) -> int:
    return -(-n // 16) * 16


def _scratch_floats(n: _Node) -> int:
    """The step's scratch: the projection, the two hidden states, the cell state (and GRU's
    z and r ⊙ h), each on a 64-byte boundary."""
    states = n.d * n.batch * n.h
    extra = 2 if n.op == "GRU" and not n.lbr else 0  # z and r ⊙ h
    return (_pad16(n.seq * n.batch * n.d * n.g * n.h) + _pad16(2 * states) + _pad16(states) * (1 + extra))


def _unit_block(g: int, vl: int) -> int:
    """U, the hidden units per task: a panel of G x U columns is at least four vectors wide."""
    return vl * max(1, 4 // g)


def pack_recurrence(r: np.ndarray, gates: list[int], h: int, u: int) -> np.ndarray:
    """R [D, G*H, H] (the rows of ``gates`` only) as [D, blocks, H (k), len(gates) * U]:
    column q * U + i of block ub is gate gates[q] of unit ub * U + i, zero past H."""
    dirs = r.shape[0]
    blocks = -(-h // u)
    out = np.zeros((dirs, blocks, h, len(gates) * u), np.float32)
    for q, gate in enumerate(gates):
        rows = r[:, gate * h:(gate + 1) * h, :]  # [D, H (unit), H (k)]
        padded = np.zeros((dirs, blocks * u, h), np.float32)
        padded[:, :h] = rows
        # [D, blocks, U, K] -> [D, blocks, K, U]
        out[..., q * u:(q + 1) * u] = padded.reshape(dirs, blocks, u, h).transpose(0, 1, 3, 2)
    return out


def pack_recurrence_bf16(packed: np.ndarray, vl: int) -> np.ndarray:
    """pack_recurrence's [D, blocks, H, GU] in bfloat16, two columns to a 32-bit word: word j
    of the u-th pair of vectors of a row holds column 2u * VL + j (low half) and
    (2u + 1) * VL + j (high half); [D, blocks, H, GU / 2] words, carried as float32."""
    *lead, gu = packed.shape
    halves = to_bf16(packed).reshape(*lead, gu // (2 * vl), 2, vl).astype(np.uint32)
    words = (halves[..., 0, :] | (halves[..., 1, :] << 16)).reshape(*lead, gu // 2)
    return np.ascontiguousarray(words).view(np.float32)


def _dot_source(name: str, rows: int, h: int, gu: int, vl: int, widened: bool = False) -> str:
    """``name(hs, rp, s)``: s[r][0..GU) = Σ_k hs[r * H + k] · rp[k * GU + ...] for ``rows``
    batch rows; one row keeps two sets of sums (even and odd k) so products overlap.
    ``widened``: rp holds pack_recurrence_bf16's words, GU / 2 to a row of k."""
    nv = gu // vl
    sets = 2 if rows == 1 else 1
    rp_type = "uint32_t" if widened else "float"
    lines = [(f"static inline __attribute__((always_inline)) void {name}(const float *restrict hs, "
              f"const {rp_type} *restrict rp, float *restrict s) {{"),
             f"  nn_v a[{sets}][{rows}][{nv}];",
             (f"  for (int q = 0; q < {sets}; q++) for (int r = 0; r < {rows}; r++) for (int v = 0; v < {nv}; v++) "
              "a[q][r][v] = nn_vzero();"),
             "  int64_t k = 0;"]

    def k_step(q: int, k: str) -> list[str]:
        if widened:
            load = [f"    {{ const uint32_t *bp = rp + ({k}) * {gu // 2}; nn_v bv[{nv}];",
                    f"      for (int u = 0; u < {nv // 2}; u++) {{ rnn_vu x; memcpy(&x, bp + u * NN_VL, sizeof x);",
                    "        bv[2 * u] = (nn_v)(x << 16); bv[2 * u + 1] = (nn_v)(x & 0xFFFF0000u); }"]
        else:
            load = [f"    {{ const float *bp = rp + ({k}) * {gu}; nn_v bv[{nv}];",
                    f"      for (int v = 0; v < {nv}; v++) bv[v] = nn_vload(bp + v * NN_VL);"]
        return load + [
                f"      for (int r = 0; r < {rows}; r++) {{ const nn_v hv = nn_vset1(hs[r * {h} + ({k})]);",
                f"        for (int v = 0; v < {nv}; v++) a[{q}][r][v] = nn_vfma(hv, bv[v], a[{q}][r][v]); }} }}"]

    if sets == 2:
        lines.append(f"  for (; k + 2 <= {h}; k += 2) {{")
        lines += k_step(0, "k") + k_step(1, "k + 1")
        lines.append("  }")
    lines.append(f"  for (; k < {h}; k++) {{")
    lines += k_step(0, "k")
    lines.append("  }")
    if sets == 2:
        lines.append(f"  for (int v = 0; v < {nv}; v++) a[0][0][v] = nn_vadd(a[0][0][v], a[1][0][v]);")
    lines.append(f"  for (int r = 0; r < {rows}; r++) for (int v = 0; v < {nv}; v++) "
                 f"nn_vstore(s + r * {gu} + v * NN_VL, a[0][r][v]);")
    lines.append("}")
    return "\n".join(lines)


def _task_source(n: _Node, name: str, dot: str, gates: int, u: int, body: list[str], src: str,
                 widened: bool = False) -> tuple[str, int]:
    """A pass of one time step over tasks (direction, block of U units): the product of
    ``src`` (the old hidden state, or r ⊙ h) with the block's packed R, then ``body``, the C
    of one unit (j of the node, i of the block) of batch row b: the block's sums in sr (gate
    q of unit i at sr[q * U + i]), the row's projection in xg, the unit's place in the
    direction-major states at ``at``. Returns the C and the number of tasks."""
    h, batch = n.h, n.batch
    blocks = -(-h // u)
    gu = gates * u
    tail = batch % RB
    reverse = "d == 1" if n.direction == "bidirectional" else ("1" if n.direction == "reverse" else "0")
    calls = []
    if batch >= RB:
        calls.append(f"if (rows == {RB}) {dot}_{RB}(hs, rp, s);")
    if tail:
        calls.append(f"if (rows == {tail}) {dot}_{tail}(hs, rp, s);")
    lines = [
        f"static void {name}(void *p, int64_t lo, int64_t hi) {{",
        "  const rnn_ctx *c = p;",
        "  for (int64_t task = lo; task < hi; task++) {",
        f"    const int64_t d = task / {blocks}, j0 = task % {blocks} * {u};",
        f"    const int64_t nu = {h} - j0 < {u} ? {h} - j0 : {u};",
        f"    const int64_t t = ({reverse}) ? {n.seq - 1} - c->t : c->t;",
        (f"    const uint32_t *rp = (const uint32_t *)c->{src}_r + (task * {h}) * {gu // 2};" if widened else
         f"    const float *rp = c->{src}_r + (task * {h}) * {gu};"),
        f"    const float *ho = c->h + c->cur * {n.d * batch * h} + d * {batch * h};",
        f"    float *hn = c->h + (1 - c->cur) * {n.d * batch * h} + d * {batch * h};",
        "    (void)hn; (void)ho; (void)t;",
        f"    for (int64_t b0 = 0; b0 < {batch}; b0 += {RB}) {{",
        f"      const int64_t rows = {batch} - b0 < {RB} ? {batch} - b0 : {RB};",
        f"      const float *hs = {'ho' if src == 'h' else 'c->rh + d * ' + str(batch * h)} + b0 * {h};",
        f"      float s[{RB * gu}];",
        "      " + " ".join(calls),
        "      for (int64_t r = 0; r < rows; r++) {",
        "        const int64_t b = b0 + r;",
        f"        const float *xg = c->xp + ({n.row('t', 'b')}) * {n.d * n.g * h} + d * {n.g * h};",
        f"        const float *sr = s + r * {gu};",
        "        (void)xg; (void)sr;",
        "        for (int64_t i = 0; i < nu; i++) {",
        f"          const int64_t j = j0 + i, at = (d * {batch} + b) * {h} + j;",
        "          (void)at;",
    ]
    lines += ["          " + line for line in body]
    lines += ["        }", "      }", "    }", "  }", "}"]
    return "\n".join(lines), n.d * blocks


def _y_index(n: _Node) -> str:
    if n.layout == 0:
        return f"((t * {n.d} + d) * {n.batch} + b) * {n.h} + j"
    return f"((b * {n.seq} + t) * {n.d} + d) * {n.h} + j"


def _state_index(n: _Node, d: str, b: str, j: str) -> str:
    """C of an element of initial_h / Y_h in the node's layout."""
    if n.layout == 0:
        return f"(({d}) * {n.batch} + ({b})) * {n.h} + ({j})"
    return f"(({b}) * {n.d} + ({d})) * {n.h} + ({j})"


def _clip(n: _Node, expr: str) -> str:
    if n.clip is None:
        return expr
    return f"rnn_clip({expr})"


def _bodies(n: _Node) -> list[tuple[str, str, int, list[str], str]]:
    """Per pass of a step: (task name, dot name, gates in its product, body, source of the
    product: "h" for the old hidden state, "rh" for r ⊙ h). UNITS stands for U."""
    h = n.h

    def pre(slot: int, gate: int, extra: str = "") -> str:
        """A gate's input: its sum (``slot`` in the block's product) plus its projection,
        clipped when the node clips."""
        return _clip(n, f"sr[{slot} * UNITS + i] + xg[{gate * h} + j]{extra}")

    def peep(k: int, state: str) -> str:  # P holds the i, o, f peepholes
        return f" + c->pp[d * {3 * h} + {k * h} + j] * {state}" if n.p else ""

    new_h = [f"hn[b * {h} + j] = hv;"] + ([f"c->y[{_y_index(n)}] = hv;"] if n.y else [])
    if n.op == "RNN":
        return [("rnn_step", "rnn_dot", 1, [f"const float hv = nn_tanh({pre(0, 0)});"] + new_h, "h")]
    if n.op == "LSTM":  # gates i, o, f, c
        forget = "1.0f - ig" if n.input_forget else f"nn_sigmoid({pre(2, 2, peep(2, 'cp'))})"
        body = [
            "const float cp = c->c[at];",
            f"const float ig = nn_sigmoid({pre(0, 0, peep(0, 'cp'))});",
            f"const float fg = {forget};",
            f"const float gg = nn_tanh({pre(3, 3)});",
            "const float cn = fg * cp + ig * gg;",
            "c->c[at] = cn;",
            f"const float og = nn_sigmoid({pre(1, 1, peep(1, 'cn'))});",
            "const float hv = og * nn_tanh(cn);",
        ]
        return [("rnn_step", "rnn_dot", 4, body + new_h, "h")]
    # GRU: gates z, r, h (the candidate); h' = (1 - z) n + z h, as n + z (h - n)
    if n.lbr:  # n = tanh(x_n + r (R_n h + Rb_n))
        rbh = f" + c->rb[d * {h} + j]" if n.b else ""
        body = [
            f"const float zg = nn_sigmoid({pre(0, 0)});",
            f"const float rg = nn_sigmoid({pre(1, 1)});",
            f"const float nh = nn_tanh({_clip(n, f'xg[{2 * h} + j] + rg * (sr[2 * UNITS + i]{rbh})')});",
            f"const float hv = nh + zg * (ho[b * {h} + j] - nh);",
        ]
        return [("rnn_step", "rnn_dot", 3, body + new_h, "h")]
    # n = tanh(x_n + R_n (r ⊙ h)): z and r ⊙ h of every unit first
    first = [f"c->z[at] = nn_sigmoid({pre(0, 0)});",
             f"c->rh[at] = nn_sigmoid({pre(1, 1)}) * ho[b * {h} + j];"]
    second = [f"const float nh = nn_tanh({pre(0, 2)});",
              f"const float hv = nh + c->z[at] * (ho[b * {h} + j] - nh);"]
    return [("rnn_gates", "rnn_dot", 2, first, "h"), ("rnn_cand", "rnn_dotc", 1, second + new_h, "rh")]


def _projection_bias(n: _Node, b: np.ndarray | None) -> np.ndarray | None:
    """The bias the projection adds: Wb + Rb of every gate, but Wb alone for GRU's candidate
    gate with linear_before_reset (its Rb is added inside the reset gate's product)."""
    if b is None:
        return None
    gh = n.g * n.h
    folded = b[:, :gh] + b[:, gh:]
    if n.op == "GRU" and n.lbr:
        folded[:, 2 * n.h:] = b[:, 2 * n.h:gh]
    return folded.reshape(-1)


def emit(w, node: Node) -> None:
    """A node that check() accepted, as one step."""
    n = _Node(node, w.shape)
    vl, h, batch, dirs, g = w.vl, n.h, n.batch, n.d, n.g
    graph, infos = w.graph, w.infos
    wv = np.asarray(const_value(graph, infos, n.w), np.float32)
    rv = np.asarray(const_value(graph, infos, n.r), np.float32)
    bv = np.asarray(const_value(graph, infos, n.b), np.float32) if n.b else None
    cols = dirs * g * h
    rows = n.seq * batch
    # the projection: X [rows, I] by W of every direction as one [I, D*G*H] matrix
    wt = np.ascontiguousarray(wv.transpose(2, 0, 1).reshape(n.inp, cols))
    # the writer's packing: the compile's arithmetic for this node's weights (float32, or
    # bfloat16 under precision bf16 unless precision auto kept W float32)
    packing = getattr(w, "packing", gemm_gen.F32)
    low = packing is not gemm_gen.F32
    wp = w.pack(n.w, f"rnn-x{vl}" if not low else f"rnn-x-{packing.form(vl)}", packing.pack(wt, vl))
    bias = _projection_bias(n, bv)
    bias_name = None
    if bias is not None:
        bias_name = w.pack(n.b, f"rnn-b{vl}-{n.op}{n.lbr}", gemm_gen.pack_row(bias, cols, vl))
    shape = gemm_gen.Shape(rows, cols, n.inp, n.inp, 1, vl)
    support = [packing.support(shape, gemm_gen.Epilogue(bias=bias is not None), "rnn_xproj")]
    if low:  # R's words, two bfloat16 columns each, as a vector of the ISA's width
        support.append("typedef uint32_t rnn_vu __attribute__((vector_size(NN_VL * 4)));")
    gemm_scratch = packing.scratch(shape)
    if n.clip is not None:
        bound = c_float(n.clip)
        support.append(f"static inline float rnn_clip(float v) {{ return v < -{bound} ? -{bound} : "
                       f"(v > {bound} ? {bound} : v); }}")
    support.append("typedef struct { const float *xp, *h_r, *rh_r, *rb, *pp; float *h, *c, *z, *rh, *y; "
                   "int64_t t, cur; } rnn_ctx;")
    packed_r = {}
    passes = []
    for name, dot, gates, body, src in _bodies(n):
        u = _unit_block(gates, vl)
        if n.op == "GRU" and not n.lbr:
            chosen = [0, 1] if src == "h" else [2]
        else:
            chosen = list(range(g))
        gu = gates * u
        # whole pairs of vectors to a panel's row, and R not kept float32 by precision auto
        # (which names W and R apart: calibration.low_layers lists both)
        widened = low and (gu // vl) % 2 == 0 and n.r not in getattr(w, "keep_f32", ())
        form = f"rnn-r{vl}-{''.join(map(str, chosen))}" + ("bf16w" if widened else "")
        packed = pack_recurrence(rv, chosen, h, u)
        packed_r[src] = w.pack(n.r, form, pack_recurrence_bf16(packed, vl) if widened else packed)
        for r in sorted({min(RB, batch), batch % RB} - {0}):
            support.append(_dot_source(f"{dot}_{r}", r, h, gu, vl, widened))
        body = [line.replace("UNITS", str(u)) for line in body]  # the block's width, known here
        text, tasks = _task_source(n, name, dot, gates, u, body, src, widened)
        support.append(text)
        passes.append((name, tasks, 2 * batch * h * gu * tasks))
    states = dirs * batch * h
    xp_floats = _pad16(rows * cols)
    lstm, gru0 = n.op == "LSTM", n.op == "GRU" and not n.lbr
    rb = None
    if n.op == "GRU" and n.lbr and bv is not None:
        rb = w.pack(n.b, "rnn-rbh", np.ascontiguousarray(bv[:, 5 * h:6 * h]))
    # the peepholes as a constant of the step (a folded value need not be an argument)
    peep = w.pack(n.p, "rnn-p", np.asarray(const_value(graph, infos, n.p), np.float32)) if n.p else None

    def ptr(name: str | None) -> str:
        return w.ptr(name) if name else "0"

    init_h = f"{ptr(n.h0)}[{_state_index(n, 'd', 'b', 'j')}]" if n.h0 else "0.0f"
    init_c = f"{ptr(n.c0)}[{_state_index(n, 'd', 'b', 'j')}]" if n.c0 else "0.0f"
    final = f"hs + {(n.seq % 2) * states}"
    state_bytes = 4 * _scratch_floats(n)
    scratch = state_bytes + gemm_scratch  # the GEMM's (a bfloat16 arithmetic's rounded X) after the states
    code = [
        "{",
        f"  float *xp = (float *){scratch_arg(scratch)};",
        f"  float *hs = xp + {xp_floats}, *cs = hs + {_pad16(2 * states)};",
        # GRU's z and r ⊙ h only where the scratch has them
        (f"  float *zs = cs + {_pad16(states)}, *rh = zs + {_pad16(states)};" if gru0 else
         "  float *zs = 0, *rh = 0;"),
        "  (void)cs; (void)zs; (void)rh;",
        (f"  rnn_xproj({w.ptr(n.x)}, {w.ptr(wp)}, {ptr(bias_name)}, 0, 0, xp, (char *)xp + {state_bytes});"
         if gemm_scratch else f"  rnn_xproj({w.ptr(n.x)}, {w.ptr(wp)}, {ptr(bias_name)}, 0, 0, xp);"),
        (f"  for (int64_t d = 0; d < {dirs}; d++) for (int64_t b = 0; b < {batch}; b++) "
         f"for (int64_t j = 0; j < {h}; j++) {{"),
        f"    hs[(d * {batch} + b) * {h} + j] = {init_h};",
        f"    cs[(d * {batch} + b) * {h} + j] = {init_c};" if lstm else "",
        "  }",
        (f"  rnn_ctx a = {{xp, {w.ptr(packed_r['h'])}, {ptr(packed_r.get('rh'))}, {ptr(rb)}, {ptr(peep)}, "
         f"hs, cs, zs, rh, {ptr(n.y)}, 0, 0}};"),
        f"  for (int64_t t = 0; t < {n.seq}; t++) {{",
        "    a.t = t; a.cur = t & 1;",
    ]
    code += [f"    nn_parallel({tasks}, {work}, {name}, &a);" for name, tasks, work in passes]
    code.append("  }")
    for out, state in ((n.yh, final), (n.yc, "cs")):
        if out:
            code.append(f"  for (int64_t d = 0; d < {dirs}; d++) for (int64_t b = 0; b < {batch}; b++) "
                        f"for (int64_t j = 0; j < {h}; j++) "
                        f"{w.ptr(out)}[{_state_index(n, 'd', 'b', 'j')}] = ({state})[(d * {batch} + b) * {h} + j];")
    code.append("}")
    reads = [n.x, wp, bias_name, packed_r["h"], packed_r.get("rh"), rb, peep, n.h0, n.c0]
    writes = [o for o in (n.y, n.yh, n.yc) if o]
    w.step("\n".join(line for line in code if line), reads, writes, scratch, support="\n".join(support))
