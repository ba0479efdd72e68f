"""Recurrent ops: RNN, GRU and LSTM (every direction, layout 0/1, sequence_lens, clip,
the activations/activation_alpha/activation_beta attributes, LSTM peepholes and input_forget).

How the kernels run:
  * the input projection W @ X^T of every timestep is one BLAS call per direction; the
    input-side biases (and the recurrence biases where the equations allow) are added in the
    pass that lays the projection out step-major;
  * the reverse direction is turned into a forward one by reversing each batch entry's valid
    prefix (``sequence_lens``) of X, and its outputs are reversed back at the end, so both
    directions of a bidirectional op advance together: one Python iteration per timestep with
    batched matmuls over the direction axis;
  * internally states are [H, B] ("features x batch"), so every gate of R @ h is a contiguous
    block and the elementwise work runs on contiguous memory;
  * entries whose sequence has ended keep their state (masked copy) and get zeros in Y; the
    final states of empty sequences (sequence_lens 0) are zeros, as onnxruntime gives.

float16 is computed in float32 and rounded once at the end; float32 and float64 in their own type.

Activation parameters follow the ONNX text ("consumed in the order of activation functions",
defaults of the corresponding ONNX operators) read as onnxruntime does: an activation takes the
next alpha (beta) only if it uses one. When an activation is given without its parameter:
LeakyRelu alpha 0.01, HardSigmoid 0.2/0.5, Elu 1.0, ThresholdedRelu 1.0, Affine 1.0/0.0 and
ScaledTanh 1.0/1.0 (onnxruntime uses 0 for the last three). ``clip`` bounds the input of every
gate activation; LSTM's cell state is not clipped before h() (as in onnxruntime).
"""

from __future__ import annotations

import functools

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import kernel

# --------------------------------------------------------------------------- activations
# Each function writes f(x) into ``out`` (which may be ``x`` itself, or a strided view of a
# larger scratch buffer). Inputs are always kernel-owned scratch arrays.


_HALF = {np.dtype(np.float32): np.float32(0.5), np.dtype(np.float64): np.float64(0.5)}


def _sigmoid(x, out, a, b):
    # 1/(1 + e^-x) as (1 + tanh(x/2)) / 2: never overflows (no np.errstate needed around the
    # loops), within 6e-8 of the exact float32 value. Typed scalars: a Python float costs
    # more per call.
    half = _HALF[out.dtype]
    np.multiply(x, half, out=out)
    np.tanh(out, out=out)
    out *= half
    out += half


def _tanh(x, out, a, b):
    np.tanh(x, out=out)


def _relu(x, out, a, b):
    np.maximum(x, 0, out=out)


def _affine(x, out, a, b):
    np.multiply(x, a, out=out)
    out += b


def _leaky_relu(x, out, a, b):
    neg = x < 0
    scaled = np.multiply(x, a)
    if out is not x:
        np.copyto(out, x)
    np.copyto(out, scaled, where=neg)


def _thresholded_relu(x, out, a, b):
    below = x < a
    if out is not x:
        np.copyto(out, x)
    np.copyto(out, 0, where=below)


def _scaled_tanh(x, out, a, b):
    np.multiply(x, b, out=out)
    np.tanh(out, out=out)
    out *= a


def _hard_sigmoid(x, out, a, b):
    np.multiply(x, a, out=out)
    out += b
    np.clip(out, 0, 1, out=out)


def _elu(x, out, a, b):
    neg = x < 0
    e = np.minimum(x, 0)
    np.expm1(e, out=e)
    e *= a
    if out is not x:
        np.copyto(out, x)
    np.copyto(out, e, where=neg)


def _softsign(x, out, a, b):
    d = np.abs(x)
    d += 1
    np.divide(x, d, out=out)


def _softplus(x, out, a, b):
    np.logaddexp(x, 0, out=out)   # log(1 + e^x) without overflow


# name -> (function, uses alpha, uses beta, default alpha, default beta)
_ACTIVATIONS = {
    "sigmoid": (_sigmoid, False, False, 0.0, 0.0),
    "tanh": (_tanh, False, False, 0.0, 0.0),
    "relu": (_relu, False, False, 0.0, 0.0),
    "affine": (_affine, True, True, 1.0, 0.0),
    "leakyrelu": (_leaky_relu, True, False, float(np.float32(0.01)), 0.0),
    "thresholdedrelu": (_thresholded_relu, True, False, 1.0, 0.0),
    "scaledtanh": (_scaled_tanh, True, True, 1.0, 1.0),
    "hardsigmoid": (_hard_sigmoid, True, True, float(np.float32(0.2)), 0.5),
    "elu": (_elu, True, False, 1.0, 0.0),
    "softsign": (_softsign, False, False, 0.0, 0.0),
    "softplus": (_softplus, False, False, 0.0, 0.0),
}

_DEFAULT_ACTIVATIONS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


def _directions(op: str, ctx, err) -> tuple[str, int]:
    direction = ctx.get("direction", "forward")
    if direction not in _DIRECTIONS:
        raise err(f"{op}: direction must be forward, reverse or bidirectional, got {direction!r}")
    return direction, _DIRECTIONS[direction]


def _layout(op: str, ctx, err) -> int:
    layout = ctx.get("layout", 0)
    if layout not in (0, 1):
        raise err(f"{op}: layout must be 0 or 1, got {layout}")
    return layout


def _parse_activations(op: str, ctx, num_directions: int, err) -> list[list[tuple]]:
    """Per direction, the list of (function, alpha, beta) for f, g(, h)."""
    per_dir = len(_DEFAULT_ACTIVATIONS[op])
    names = ctx.get("activations")
    if names is None or len(names) == 0:
        names = _DEFAULT_ACTIVATIONS[op] * num_directions
    if isinstance(names, str):
        names = [names]
    alphas = list(ctx.get("activation_alpha") or [])
    betas = list(ctx.get("activation_beta") or [])
    if len(names) not in (per_dir, per_dir * num_directions):
        raise err(f"{op}: expected {per_dir * num_directions} activations for "
                  f"{num_directions} direction(s), got {len(names)}")
    parsed = []
    ai = bi = 0
    for name in names:
        entry = _ACTIVATIONS.get(str(name).lower())
        if entry is None:
            raise err(f"{op}: unsupported activation {name!r} (expected one of "
                      "Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, "
                      "HardSigmoid, Elu, Softsign, Softplus)")
        fn, uses_alpha, uses_beta, alpha, beta = entry
        if uses_alpha and ai < len(alphas):
            alpha = float(alphas[ai])
            ai += 1
        if uses_beta and bi < len(betas):
            beta = float(betas[bi])
            bi += 1
        parsed.append((fn, alpha, beta))
    if len(parsed) == per_dir:  # one set given for a bidirectional op: both directions use it
        parsed = parsed * num_directions
    return [parsed[d * per_dir:(d + 1) * per_dir] for d in range(num_directions)]


class _Act:
    """One activation slot (f, g or h), applied in place over [n, B] or stacked [D, n, B] arrays."""

    __slots__ = ("entries", "same", "clip", "fn", "a", "b")

    def __init__(self, entries: list[tuple], clip, squeezed: bool, dtype: np.dtype):
        t = dtype.type
        self.entries = [(fn, t(a), t(b)) for fn, a, b in entries]
        # squeezed: the direction axis was dropped (one direction); or both directions agree.
        self.same = squeezed or all(e == entries[0] for e in entries)
        self.fn, self.a, self.b = self.entries[0]
        self.clip = None if clip is None else t(clip)

    def __call__(self, x, out=None):
        if out is None:
            out = x
        if self.clip is not None:
            np.clip(x, -self.clip, self.clip, out=out)
            x = out
        if self.same:
            self.fn(x, out, self.a, self.b)
        else:
            for d, (fn, a, b) in enumerate(self.entries):
                fn(x[d], out[d], a, b)
        return out


# --------------------------------------------------------------------------- shapes


def _shape_fn(op: str):
    gates = _GATES[op]
    n_state = 2 if op == "LSTM" else 1

    def shape(ctx, x, w=None, r=None, b=None, seq=None, init_h=None, *rest):
        err = ShapeInferenceError
        _, num_dir = _directions(op, ctx, err)
        layout = _layout(op, ctx, err)
        _parse_activations(op, ctx, num_dir, err)
        if op == "GRU" and ctx.get("linear_before_reset", 0) not in (0, 1):
            raise err("GRU: linear_before_reset must be 0 or 1")
        if x is None or w is None or r is None:
            raise err(f"{op}: inputs X, W and R are required")
        for name, info, rank in (("X", x, 3), ("W", w, 3), ("R", r, 3)):
            if info.shape is not None and len(info.shape) != rank:
                raise err(f"{op}: {name} must have rank {rank}, got shape {info.shape}")
        hidden = ctx.get("hidden_size")
        if hidden is not None and hidden <= 0:
            raise err(f"{op}: hidden_size must be positive, got {hidden}")
        if hidden is None and r.shape is not None and isinstance(r.shape[2], int):
            hidden = r.shape[2]
        if hidden is None and r.shape is not None and isinstance(r.shape[1], int):
            hidden = r.shape[1] // gates
        if hidden is None and w.shape is not None and isinstance(w.shape[1], int):
            hidden = w.shape[1] // gates
        if isinstance(hidden, int):
            expect = {"W": (num_dir, gates * hidden, None), "R": (num_dir, gates * hidden, hidden)}
            for name, info in (("W", w), ("R", r)):
                if info.shape is None:
                    continue
                for got, want in zip(info.shape, expect[name]):
                    if isinstance(got, int) and want is not None and got != want:
                        raise err(f"{op}: {name} has shape {info.shape}, expected "
                                  f"[{num_dir}, {gates * hidden}, "
                                  f"{'input_size' if name == 'W' else hidden}] "
                                  f"(num_directions={num_dir}, hidden_size={hidden})")
        if x.dtype is not None and x.dtype.kind != "f":
            raise err(f"{op}: X must be a floating-point tensor, got {x.dtype}")
        if isinstance(hidden, int):
            extra = [("B", b, 2 * gates * hidden)]
            if op == "LSTM" and len(rest) >= 2:
                extra.append(("P", rest[1], 3 * hidden))
            for name, info, width in extra:
                if info is None or info.shape is None:
                    continue
                if len(info.shape) != 2 or any(
                        isinstance(got, int) and got != want
                        for got, want in zip(info.shape, (num_dir, width))):
                    raise err(f"{op}: {name} has shape {info.shape}, expected [{num_dir}, {width}]")
        seq_len = batch = None
        if x.shape is not None:
            seq_len, batch = (x.shape[0], x.shape[1]) if layout == 0 else (x.shape[1], x.shape[0])
        if batch is None and init_h is not None and init_h.shape is not None and len(init_h.shape) == 3:
            batch = init_h.shape[1] if layout == 0 else init_h.shape[0]
        if batch is None and seq is not None and seq.shape is not None and len(seq.shape) == 1:
            batch = seq.shape[0]
        dtype = x.dtype
        if layout == 0:
            y = (seq_len, num_dir, batch, hidden)
            state = (num_dir, batch, hidden)
        else:
            y = (batch, seq_len, num_dir, hidden)
            state = (batch, num_dir, hidden)
        outs = [TensorInfo(dtype, y)] + [TensorInfo(dtype, state) for _ in range(n_state)]
        return outs[:max(ctx.num_outputs, 1)]

    return shape


# --------------------------------------------------------------------------- common driver
# Internally everything is transposed to "features x batch": states are [D, H, B] and the
# gates of a step are R @ h = [D, gates*H, B], so every gate is a contiguous [H, B] block.
# (With batch last, elementwise work runs on contiguous memory: ufuncs over the strided
# column slices of a [B, gates*H] layout cost about twice as much at small sizes.)
# With one direction the D axis is dropped from the loop arrays ("squeezed").


class _Prepared:
    __slots__ = ("dtype", "out_dtype", "layout", "T", "B", "H", "D", "squeeze", "xw", "r",
                 "steps", "invalid", "min_len", "rev_index", "reverse", "full", "mm")


def _compute_dtype(op: str, x: np.ndarray) -> np.dtype:
    if x.dtype == np.float16:
        return np.dtype(np.float32)
    if x.dtype in (np.float32, np.float64):
        return x.dtype
    raise KernelError(f"{op}: X must be float16, float32 or float64, got {x.dtype}")


def _state_input(op: str, name: str, v, p: _Prepared) -> np.ndarray:
    """initial_h / initial_c as a new contiguous [D, H, B] array of the compute dtype."""
    want = (p.D, p.B, p.H) if p.layout == 0 else (p.B, p.D, p.H)
    if v is None:
        return np.zeros((p.D, p.H, p.B), p.dtype)
    if v.shape != want:
        raise KernelError(f"{op}: {name} has shape {v.shape}, expected {list(want)}")
    v = v.transpose(0, 2, 1) if p.layout == 0 else v.transpose(1, 2, 0)
    return np.array(v, dtype=p.dtype, order="C")  # always a copy: the loop never writes inputs


def _prepare(op: str, ctx, x, w, r, b, seq_lens, x_bias_fn) -> _Prepared:
    """Validate, and project every timestep of every direction at once.

    ``x_bias_fn(b_cast, H)`` gives the [D, gates*H] bias folded into the projection (or None).
    With constant W, R and B and no sequence lengths, everything but the projection is
    worked out once per node and input shape (a recurrent cell stepped by the caller runs
    this for every step: the checks and conversions were a third of gru_cell's time).
    """
    reusable = seq_lens is None and ctx.is_constant(1) and ctx.is_constant(2) and (
        b is None or ctx.is_constant(3))
    held = ctx.scratch.get("recurrent plan") if reusable else None
    if (held is not None and held[0] == (x.shape, x.dtype) and held[1] is w and held[2] is r
            and held[3] is b):
        p, bias, wc = held[4:]
    else:
        p, bias, wc = _prepare_static(op, ctx, x, w, r, b, seq_lens, x_bias_fn)
        if reusable:
            ctx.scratch["recurrent plan"] = ((x.shape, x.dtype), w, r, b, p, bias, wc)
    _project(p, x, wc, bias)
    return p


def _prepare_static(op: str, ctx, x, w, r, b, seq_lens, x_bias_fn):
    """Everything of _prepare that does not read X's values: (_Prepared, folded bias, W in
    the compute dtype)."""
    err = KernelError
    direction, num_dir = _directions(op, ctx, err)
    layout = _layout(op, ctx, err)
    gates = _GATES[op]
    p = _Prepared()
    p.dtype = _compute_dtype(op, x)
    p.out_dtype = x.dtype
    p.layout = layout
    if x.ndim != 3 or w.ndim != 3 or r.ndim != 3:
        raise err(f"{op}: X, W and R must have rank 3, got {x.shape}, {w.shape}, {r.shape}")
    if layout == 0:
        T, B, I = x.shape
    else:
        B, T, I = x.shape
    H = r.shape[2]
    hidden = ctx.get("hidden_size")
    if hidden is not None and hidden != H:
        raise err(f"{op}: hidden_size={hidden} but R has shape {r.shape}")
    G = gates * H
    if w.shape != (num_dir, G, I):
        raise err(f"{op}: W has shape {w.shape}, expected {[num_dir, G, I]}")
    if r.shape != (num_dir, G, H):
        raise err(f"{op}: R has shape {r.shape}, expected {[num_dir, G, H]}")
    if b is not None and b.shape != (num_dir, 2 * G):
        raise err(f"{op}: B has shape {b.shape}, expected {[num_dir, 2 * G]}")
    p.T, p.B, p.H, p.D = T, B, H, num_dir
    p.squeeze = num_dir == 1
    reverse = [direction == "reverse"] if num_dir == 1 else [False, True]
    p.reverse = reverse
    rc = r.astype(p.dtype, copy=False)
    p.r = rc[0] if p.squeeze else rc
    # the step matmul: np.dot has less call overhead than np.matmul for the squeezed 2-D case
    p.mm = np.dot if p.squeeze else np.matmul

    # sequence lengths
    if seq_lens is not None:
        if seq_lens.shape != (B,):
            raise err(f"{op}: sequence_lens has shape {seq_lens.shape}, expected [{B}]")
        if seq_lens.dtype.kind not in "iu":
            raise err(f"{op}: sequence_lens must be an integer tensor, got {seq_lens.dtype}")
        lengths = seq_lens.astype(np.int64)
        if B and (lengths.min() < 0 or lengths.max() > T):
            raise err(f"{op}: sequence_lens must lie in [0, {T}], got {lengths.tolist()}")
    else:
        lengths = None
    p.full = lengths is None or B == 0 or bool((lengths == T).all())
    if p.full:
        p.steps, p.min_len, p.invalid, p.rev_index = T, T, None, None
    else:
        p.steps = int(lengths.max())
        p.min_len = int(lengths.min())
        steps = np.arange(T)[:, None]
        p.invalid = steps >= lengths[None, :]                         # [T, B]
        # step s of a reversed sequence reads timestep L-1-s; padding maps to itself
        p.rev_index = np.where(p.invalid, steps, lengths[None, :] - 1 - steps)

    bias = x_bias_fn(None if b is None else b.astype(p.dtype, copy=False), H)
    wc = w.astype(p.dtype, copy=False)
    return p, bias, wc


def _project(p: _Prepared, x, wc, bias) -> None:
    """The projection W @ X^T of every timestep: one matmul per direction, [G, T*B], then laid
    out step-major as xw [T, D, G, B] so that step s reads one contiguous block (worth the
    copy: adding a strided [G, B] slice costs about 3x a contiguous one, twice per GRU step),
    with the folded bias added in that same pass. A reversed direction reverses the rows of
    X (input_size wide) rather than those of the projection (gates * hidden_size wide)."""
    T, B, num_dir, reverse = p.T, p.B, p.D, p.reverse
    G, I = wc.shape[1], wc.shape[2]
    xt = x if p.layout == 0 else x.transpose(1, 0, 2)                   # [T, B, I]
    rows: dict[bool, np.ndarray] = {}
    xw = np.empty((T, num_dir, G, B), p.dtype)
    for d in range(num_dir):
        rev = reverse[d]
        if rev not in rows:
            src = xt
            if rev:
                src = xt[::-1] if p.full else np.take_along_axis(xt, p.rev_index[:, :, None], axis=0)
            rows[rev] = np.ascontiguousarray(src, dtype=p.dtype).reshape(T * B, I)
        proj = np.matmul(wc[d], rows[rev].T).reshape(G, T, B).transpose(1, 0, 2)
        if bias is None:
            np.copyto(xw[:, d], proj)
        else:
            np.add(proj, bias[d][:, None], out=xw[:, d])
    p.xw = xw[:, 0] if p.squeeze else xw


def _finish(p: _Prepared, hs: np.ndarray, states: list[np.ndarray], num_outputs: int):
    """hs: [T, D, H, B] step-major outputs (rows past each sequence's end hold garbage);
    states: final [D, H, B] states. Returns Y, Y_h(, Y_c) in the requested layout."""
    finals = []  # copied out first: a final state may be a view into hs, zeroed below
    for s in states[:max(num_outputs - 1, 0)]:
        if not p.full and p.min_len == 0:
            # an empty sequence has no last output: zeros, as onnxruntime gives (not initial_h)
            s = np.where(p.invalid[0], p.dtype.type(0), s)
        s = s.transpose(0, 2, 1) if p.layout == 0 else s.transpose(2, 0, 1)
        finals.append(np.array(s, dtype=p.out_dtype, order="C"))
    outs = []
    if num_outputs >= 1:
        if not p.full:
            np.copyto(hs, 0, where=p.invalid[:, None, None, :])
        if p.layout == 0:
            y = np.empty((p.T, p.D, p.B, p.H), p.out_dtype)
            yd = [y[:, d] for d in range(p.D)]                           # [T, B, H]
        else:
            y = np.empty((p.B, p.T, p.D, p.H), p.out_dtype)
            yd = [y[:, :, d].transpose(1, 0, 2) for d in range(p.D)]     # [T, B, H] views
        for d, rev in enumerate(p.reverse):
            src = hs[:, d]                                               # [T, H, B]
            if rev:
                src = src[::-1] if p.full else np.take_along_axis(src, p.rev_index[:, None, :], axis=0)
            np.copyto(yd[d], src.transpose(0, 2, 1), casting="same_kind")
        outs.append(y)
    outs += finals
    return tuple(outs) if len(outs) > 1 else outs[0]


def _col(v: np.ndarray, squeeze: bool) -> np.ndarray:
    """[D, n] per-direction vector as a column broadcastable against [D, n, B] (or [n, B])."""
    return v[0][:, None] if squeeze else v[:, :, None]


def _acts(op, ctx, p: _Prepared) -> tuple:
    def key(name):
        v = ctx.get(name)
        return tuple(v) if isinstance(v, list) else v

    return _acts_for(op, key("activations"), key("activation_alpha"), key("activation_beta"),
                     ctx.get("clip"), p.D, p.dtype)


@functools.lru_cache(maxsize=256)
def _acts_for(op, activations, alphas, betas, clip, num_dir, dtype) -> tuple:
    """The (f, g(, h)) activation slots for these attribute values, built once."""
    attrs = {"activations": activations, "activation_alpha": alphas, "activation_beta": betas}
    parsed = _parse_activations(op, _Attrs(attrs), num_dir, KernelError)
    acts = [_Act([parsed[d][k] for d in range(num_dir)], clip, num_dir == 1, dtype)
            for k in range(len(parsed[0]))]
    if op == "LSTM":
        # clip bounds the gate pre-activations; the cell state fed to h() is not clipped
        # (onnxruntime's reading of "applied to the input of activations").
        acts[2].clip = None
    return tuple(acts)


class _Attrs:
    """The ``ctx.get`` interface over a plain dict (for the cached activation parser)."""

    def __init__(self, attrs: dict):
        self.attrs = attrs

    def get(self, key, default=None):
        value = self.attrs.get(key)
        return default if value is None else value


def _loop_state(p: _Prepared, state: np.ndarray) -> np.ndarray:
    return state[0] if p.squeeze else state


def _hs_buffer(p: _Prepared) -> tuple[np.ndarray, np.ndarray]:
    """The [T, D, H, B] buffer every step writes its new hidden state into, and its loop view."""
    hs = (np.empty if p.full else np.zeros)((p.T, p.D, p.H, p.B), p.dtype)
    return hs, (hs[:, 0] if p.squeeze else hs)


def _unsqueeze(p: _Prepared, state: np.ndarray) -> np.ndarray:
    return state[None] if p.squeeze else state


# --------------------------------------------------------------------------- RNN
# In the loops ``h`` / ``c`` are [H, B] (one direction) or [2, H, B]; each step writes the new
# hidden state straight into its row of the Y buffer. Batch entries whose sequence has ended
# (step s >= L) get their old state back (masked copy; ``invalid[s]`` is a [B] row that
# broadcasts over directions and hidden units, as both directions step through a sequence
# in the same order).


def _rnn_bias(b, H):
    return None if b is None else b[:, :H] + b[:, H:]


def _rnn(ctx, x, w, r, b=None, seq_lens=None, initial_h=None):
    p = _prepare("RNN", ctx, x, w, r, b, seq_lens, _rnn_bias)
    (f,) = _acts("RNN", ctx, p)
    h = _loop_state(p, _state_input("RNN", "initial_h", initial_h, p))
    hs, hsv = _hs_buffer(p)
    xw, rr, invalid, min_len, mm = p.xw, p.r, p.invalid, p.min_len, p.mm
    for s in range(p.steps):
        out = hsv[s]
        mm(rr, h, out=out)
        out += xw[s]
        f(out)
        if s >= min_len:
            np.copyto(out, h, where=invalid[s])
        h = out
    return _finish(p, hs, [_unsqueeze(p, h)], ctx.num_outputs)


# --------------------------------------------------------------------------- GRU


def _gru(ctx, x, w, r, b=None, seq_lens=None, initial_h=None):
    lbr = ctx.get("linear_before_reset", 0)
    if lbr not in (0, 1):
        raise KernelError(f"GRU: linear_before_reset must be 0 or 1, got {lbr}")

    def bias(bb, H):
        if bb is None:
            return None
        folded = bb[:, :3 * H] + bb[:, 3 * H:]
        if lbr:  # Rbh stays inside r * (R_h h + Rbh): fold only Wbh
            folded[:, 2 * H:] = bb[:, 2 * H:3 * H]
        return folded

    p = _prepare("GRU", ctx, x, w, r, b, seq_lens, bias)
    f, g = _acts("GRU", ctx, p)
    H = p.H
    h = _loop_state(p, _state_input("GRU", "initial_h", initial_h, p))
    hs, hsv = _hs_buffer(p)
    x_zr, x_h = p.xw[..., :2 * H, :], p.xw[..., 2 * H:, :]
    rr, invalid, min_len, mm = p.r, p.invalid, p.min_len, p.mm
    lead = h.shape[:-2]
    if lbr:
        rbh = None if b is None else _col(b[:, 5 * H:].astype(p.dtype), p.squeeze)
        gt = np.empty(lead + (3 * H, p.B), p.dtype)    # scratch, reused every step
        zr, z, rg, hh = gt[..., :2 * H, :], gt[..., :H, :], gt[..., H:2 * H, :], gt[..., 2 * H:, :]
        for s in range(p.steps):
            mm(rr, h, out=gt)                         # [.., 3H, B]
            zr += x_zr[s]
            f(zr)
            if rbh is not None:
                hh += rbh
            hh *= rg                                  # r * (R_h h + Rbh)
            hh += x_h[s]
            g(hh)
            out = hsv[s]
            np.subtract(h, hh, out=out)               # h' = (1-z) hh + z h = hh + z (h - hh)
            out *= z
            out += hh
            if s >= min_len:
                np.copyto(out, h, where=invalid[s])
            h = out
    else:
        r_zr, r_h = rr[..., :2 * H, :], rr[..., 2 * H:, :]
        zr = np.empty(lead + (2 * H, p.B), p.dtype)    # scratch, reused every step
        hh = np.empty(lead + (H, p.B), p.dtype)
        z, rg = zr[..., :H, :], zr[..., H:, :]
        for s in range(p.steps):
            mm(r_zr, h, out=zr)                       # [.., 2H, B]
            zr += x_zr[s]
            f(zr)
            rg *= h                                   # r * h
            mm(r_h, rg, out=hh)
            hh += x_h[s]
            g(hh)
            out = hsv[s]
            np.subtract(h, hh, out=out)
            out *= z
            out += hh
            if s >= min_len:
                np.copyto(out, h, where=invalid[s])
            h = out
    return _finish(p, hs, [_unsqueeze(p, h)], ctx.num_outputs)


# --------------------------------------------------------------------------- LSTM


def _lstm(ctx, x, w, r, b=None, seq_lens=None, initial_h=None, initial_c=None, peep=None):
    input_forget = ctx.get("input_forget", 0)

    def bias(bb, H):
        return None if bb is None else bb[:, :4 * H] + bb[:, 4 * H:]

    p = _prepare("LSTM", ctx, x, w, r, b, seq_lens, bias)
    f, g, hact = _acts("LSTM", ctx, p)
    H = p.H
    h = _loop_state(p, _state_input("LSTM", "initial_h", initial_h, p))
    c = _loop_state(p, _state_input("LSTM", "initial_c", initial_c, p))
    if peep is not None:
        if peep.shape != (p.D, 3 * H):
            raise KernelError(f"LSTM: P has shape {peep.shape}, expected {[p.D, 3 * H]}")
        pc = peep.astype(p.dtype)
        p_i, p_o, p_f = (_col(pc[:, k * H:(k + 1) * H], p.squeeze) for k in range(3))
    hs, hsv = _hs_buffer(p)
    xw, rr, invalid, min_len, mm = p.xw, p.r, p.invalid, p.min_len, p.mm
    gt = np.empty(h.shape[:-2] + (4 * H, p.B), p.dtype)   # scratch buffers, reused every step
    gi, go, gf, gc = (gt[..., k * H:(k + 1) * H, :] for k in range(4))
    gates_iof = gt[..., :3 * H, :]
    cbuf = (np.empty_like(h), np.empty_like(h))
    tmp = np.empty_like(h)
    for s in range(p.steps):
        mm(rr, h, out=gt)                             # [.., 4H, B], gates i, o, f, c
        gt += xw[s]
        if peep is None:
            f(gates_iof)                              # i, o, f in one pass
        else:
            gi += np.multiply(p_i, c, out=tmp)
            gf += np.multiply(p_f, c, out=tmp)
            f(gi)
            f(gf)
        if input_forget:
            np.subtract(1, gi, out=gf)
        g(gc)
        gc *= gi
        c_new = np.multiply(gf, c, out=cbuf[s & 1])   # never the buffer holding c
        c_new += gc
        if peep is not None:
            go += np.multiply(p_o, c_new, out=tmp)
            f(go)
        out = hsv[s]
        hact(c_new, out)
        out *= go
        if s >= min_len:
            np.copyto(out, h, where=invalid[s])
            np.copyto(c_new, c, where=invalid[s])
        h, c = out, c_new
    return _finish(p, hs, [_unsqueeze(p, h), _unsqueeze(p, c)], ctx.num_outputs)


# --------------------------------------------------------------------------- registration
# One registration per op covers every version: the later versions only removed the unused
# output_sequence attribute (7), added linear_before_reset to GRU (3, default 0 = the
# version-1 equations), added layout (14, default 0) and bfloat16 (22).


@kernel("RNN", since=1, shape=_shape_fn("RNN"))
def rnn(ctx, x, w, r, b=None, sequence_lens=None, initial_h=None):
    return _rnn(ctx, x, w, r, b, sequence_lens, initial_h)


@kernel("GRU", since=1, shape=_shape_fn("GRU"))
def gru(ctx, x, w, r, b=None, sequence_lens=None, initial_h=None):
    return _gru(ctx, x, w, r, b, sequence_lens, initial_h)


@kernel("LSTM", since=1, shape=_shape_fn("LSTM"))
def lstm(ctx, x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None):
    return _lstm(ctx, x, w, r, b, sequence_lens, initial_h, initial_c, p)
