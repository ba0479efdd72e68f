"""Normalization kernels: BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, RMSNormalization, MeanVarianceNormalization, LpNormalization, LRN.

Per-channel statistics are folded into one scale and one shift so the big tensor is
touched by a single multiply and a single in-place add. float16 inputs are computed in
float32 and cast back.

LayerNormalization keeps a per-node plan (``ctx.scratch``) for its input shapes/dtypes; for
float32 (stash_type float32, the default) and float64 it then computes in that precision
with row means and variances as BLAS products (two passes: the variance is of the centred
rows) and normalizes in place.
"""

from __future__ import annotations

import math

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import kernel, stand_ins
from nncc.kernels.shapes import normalize_axis
from nncc.kernels.workspace import shared


def _acc(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype == np.float16 else np.dtype(dtype)


def _channel_shape(x_ndim: int, param: np.ndarray) -> tuple:
    """Broadcast shape for a per-channel (C,) parameter, or a per-activation (C, D1, ...) one."""
    if param.ndim <= 1:
        return (-1,) + (1,) * max(0, x_ndim - 2)
    return param.shape  # BatchNormalization spatial=0 (opset < 9): shape (C, D1, ...)


# --------------------------------------------------------------------------- BatchNormalization


def _bn_training(ctx) -> bool:
    if ctx.opset >= 14:
        return bool(ctx.get("training_mode", 0))
    if ctx.opset < 7 and ctx.get("is_test") is not None:
        return not bool(ctx.get("is_test")) and ctx.num_outputs > 1
    return ctx.num_outputs > 1


def _bn_shape(ctx, x, scale, b, mean, var):
    if x.shape is not None and len(x.shape) < 2:
        raise ShapeInferenceError(f"BatchNormalization: input must have rank >= 2, got {x.shape}")
    out = [TensorInfo(x.dtype, x.shape)]
    if ctx.num_outputs > 1:
        c = None if x.shape is None else x.shape[1]
        stat_dtype = mean.dtype if mean is not None else x.dtype
        for _ in range(1, ctx.num_outputs):
            out.append(TensorInfo(stat_dtype, (c,) if mean is None or mean.shape is None
                                  or len(mean.shape) <= 1 else mean.shape))
    return out


@kernel("BatchNormalization", since=1, shape=_bn_shape)
def batch_normalization(ctx, x, scale, b, mean, var):
    if x.ndim < 2:
        raise KernelError(f"BatchNormalization: input must have rank >= 2, got {x.shape}")
    eps = float(ctx.get("epsilon", 1e-5))
    acc = np.float64 if x.dtype == np.float64 else np.float32
    training = _bn_training(ctx)
    extra = ()
    if training:
        axes = (0,) + tuple(range(2, x.ndim))
        xa = x.astype(acc, copy=False)
        bmean = xa.mean(axis=axes)
        bvar = xa.var(axis=axes)
        momentum = float(ctx.get("momentum", 0.9))
        run_mean = mean.astype(acc) * momentum + bmean * (1 - momentum)
        run_var = var.astype(acc) * momentum + bvar * (1 - momentum)
        use_mean, use_var = bmean, bvar
        sdt = mean.dtype
        if ctx.opset >= 14:
            extra = (run_mean.astype(sdt), run_var.astype(sdt))
        else:
            extra = (run_mean.astype(sdt), run_var.astype(sdt), bmean.astype(sdt), bvar.astype(sdt))
        extra = extra[:ctx.num_outputs - 1]
    else:
        use_mean, use_var = mean.astype(acc), var.astype(acc)
    a = scale.astype(acc) / np.sqrt(use_var + acc(eps))
    shift = b.astype(acc) - use_mean * a
    shape = _channel_shape(x.ndim, scale)
    a = a.reshape(shape)
    shift = shift.reshape(shape)
    cdt = _acc(x.dtype)
    y = x.astype(cdt, copy=False) * a.astype(cdt)
    y += shift.astype(cdt)
    y = y.astype(x.dtype, copy=False)
    return (y,) + extra if extra else y


# --------------------------------------------------------------------------- InstanceNormalization


def _instnorm_shape(ctx, x, scale, b):
    return [TensorInfo(x.dtype, x.shape)]


@kernel("InstanceNormalization", since=1, shape=_instnorm_shape)
def instance_normalization(ctx, x, scale, b):
    if x.ndim < 3:
        raise KernelError(f"InstanceNormalization: input must have rank >= 3, got {x.shape}")
    eps = float(ctx.get("epsilon", 1e-5))
    cdt = _acc(x.dtype)
    n, c = x.shape[:2]
    xf = x.reshape(n, c, -1).astype(cdt, copy=False)
    mean = xf.mean(axis=2, keepdims=True)
    var = np.square(xf - mean).mean(axis=2, keepdims=True)
    a = scale.astype(cdt).reshape(1, c, 1) / np.sqrt(var + cdt.type(eps))
    shift = b.astype(cdt).reshape(1, c, 1) - mean * a
    y = xf * a
    y += shift
    return y.reshape(x.shape).astype(x.dtype, copy=False)


# --------------------------------------------------------------------------- LayerNormalization

_STASH = {1: np.float32, 10: np.float16, 11: np.float64}


def _stash_dtype(ctx, err):
    stash = int(ctx.get("stash_type", 1))
    if stash not in _STASH:
        raise err(f"LayerNormalization: unsupported stash_type {stash} (supported: 1 float, 10 float16, 11 double)")
    return np.dtype(_STASH[stash])


def _layernorm_shape(ctx, x, scale, b=None):
    out = [TensorInfo(x.dtype, x.shape)]
    sdt = _stash_dtype(ctx, ShapeInferenceError)
    stat = None
    if x.shape is not None:
        axis = normalize_axis(int(ctx.get("axis", -1)), len(x.shape))
        stat = tuple(x.shape[:axis]) + (1,) * (len(x.shape) - axis)
    if ctx.num_outputs > 1:
        out += [TensorInfo(sdt, stat) for _ in range(1, ctx.num_outputs)]
    return out


class _LayerNormPlan:
    """A LayerNormalization node's parameters for one set of input shapes/dtypes."""

    __slots__ = ("key", "fast", "axis", "rows", "cols", "eps", "sdt", "inv_n", "stat_shape",
                 "sq", "flat")

    def __init__(self, ctx, key, x, scale, b):
        try:
            axis = normalize_axis(int(ctx.get("axis", -1)), x.ndim)
        except ShapeInferenceError as e:
            raise KernelError(f"LayerNormalization: {e}") from None
        self.key = key
        self.axis = axis
        self.sdt = _stash_dtype(ctx, KernelError)
        self.rows = math.prod(x.shape[:axis])
        self.cols = math.prod(x.shape[axis:])
        self.stat_shape = x.shape[:axis] + (1,) * (x.ndim - axis)
        trailing = x.shape[axis:]
        dt = x.dtype
        # The hot path: float32 (with the default float32 stash type) or float64, computed in
        # that precision, Scale/B covering exactly the normalized axes, no empty rows.
        self.fast = (dt in (np.float32, np.float64) and np.promote_types(self.sdt, dt) == dt
                     and self.cols > 0 and scale.shape == trailing and scale.dtype == dt
                     and (b is None or (b.shape == trailing and b.dtype == dt)))
        if not self.fast:
            return
        self.eps = np.array(float(ctx.get("epsilon", 1e-5)), dtype=dt)
        # a (cols, 1) column of 1/n: each row's mean is then one BLAS product, already
        # shaped to broadcast over the row (numpy's mean is far slower on short rows)
        self.inv_n = np.full((self.cols, 1), 1.0 / self.cols, dtype=dt)
        self.sq = shared(ctx.workspace, "layernorm sq", (self.rows, self.cols), dt)
        self.flat = len(trailing) == 1  # Scale/B broadcast over the rows as they are


def _layernorm_prepare(ctx, x, scale, b=None):
    """LayerNormalization's first phase: with static inputs, the plan made once; a run is
    then the fast path alone (or None: the general kernel)."""
    like = stand_ins(x, scale, b)
    if like is None:
        return None
    x, scale, b = like
    key = (x.shape, x.dtype, scale.shape, scale.dtype, None if b is None else (b.shape, b.dtype))
    plan = _LayerNormPlan(ctx, key, x, scale, b)
    if not plan.fast:
        return None

    def layer_normalization_prepared(ctx, x, scale, b=None, out=None):
        return _layer_norm_fast(ctx, plan, x, scale, b, out)

    return layer_normalization_prepared


@kernel("LayerNormalization", since=17, shape=_layernorm_shape, writes_out=True, prepare=_layernorm_prepare)
def layer_normalization(ctx, x, scale, b=None, out=None):
    key = (x.shape, x.dtype, scale.shape, scale.dtype, None if b is None else (b.shape, b.dtype))
    plan = ctx.scratch.get("layernorm plan")
    if plan is None or plan.key != key:
        plan = ctx.scratch["layernorm plan"] = _LayerNormPlan(ctx, key, x, scale, b)
    if not plan.fast:
        return _layer_normalization(ctx, plan, x, scale, b)
    return _layer_norm_fast(ctx, plan, x, scale, b, out)


def _layer_norm_fast(ctx, plan: _LayerNormPlan, x, scale, b, out):
    """The hot path: float32/float64, Scale and B covering exactly the normalized axes."""
    rows, cols = plan.rows, plan.cols
    x2 = x.reshape(rows, cols)
    mean = np.dot(x2, plan.inv_n)  # (rows, 1)
    target = out[0] if out is not None else None
    if target is not None and target.dtype == x.dtype and target.flags.c_contiguous:
        d = np.subtract(x2, mean, out=target.reshape(rows, cols))
    else:
        target = None
        d = np.subtract(x2, mean)
    inv = np.dot(np.multiply(d, d, out=plan.sq), plan.inv_n)  # the variance, (rows, 1)
    np.add(inv, plan.eps, out=inv)
    np.sqrt(inv, out=inv)
    np.reciprocal(inv, out=inv)
    d *= inv
    if not plan.flat:
        scale = scale.reshape(cols)
        b = None if b is None else b.reshape(cols)
    d *= scale
    if b is not None:
        d += b
    y = target if target is not None else d.reshape(x.shape)
    if ctx.num_outputs == 1:
        return y
    sdt = plan.sdt
    outs = (y, mean.reshape(plan.stat_shape).astype(sdt), inv.reshape(plan.stat_shape).astype(sdt))
    return outs[:ctx.num_outputs]


def _layer_normalization(ctx, plan, x, scale, b):
    """The general case: any stash type, float16 inputs, broadcast Scale/B."""
    axis = plan.axis
    eps = float(ctx.get("epsilon", 1e-5))
    sdt = plan.sdt
    # compute in the stash precision, or in the input's when it is wider
    cdt = np.promote_types(sdt, x.dtype) if x.dtype.kind == "f" else sdt
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    xf = x.reshape(rows, -1).astype(cdt, copy=False)
    mean = xf.mean(axis=1, keepdims=True)
    d = xf - mean
    var = np.einsum("ij,ij->i", d, d)[:, None] / cdt.type(max(d.shape[1], 1))
    inv = 1.0 / np.sqrt(var + cdt.type(eps))
    d *= inv
    trailing = x.shape[axis:]
    if (d.dtype == x.dtype and scale.shape == trailing and scale.dtype == x.dtype
            and (b is None or (b.shape == trailing and b.dtype == x.dtype))):
        # common case: Scale/B cover exactly the normalized axes, apply them in place
        d *= scale.reshape(-1)
        if b is not None:
            d += b.reshape(-1)
        y = d.reshape(x.shape)
    else:
        y = d.reshape(x.shape).astype(x.dtype, copy=False)
        y = y * scale.astype(x.dtype, copy=False)
        if b is not None:
            y += b.astype(x.dtype, copy=False)
        if y.shape != x.shape:
            raise KernelError(f"LayerNormalization: Scale {scale.shape} / B do not broadcast to X {x.shape}")
    if ctx.num_outputs == 1:
        return y
    stat_shape = x.shape[:axis] + (1,) * (x.ndim - axis)
    outs = (y, mean.reshape(stat_shape).astype(sdt), inv.reshape(stat_shape).astype(sdt))
    return outs[:ctx.num_outputs]


# --------------------------------------------------------------------------- GroupNormalization


def _stage_one_dtype(ctx, x_dtype: np.dtype, err) -> np.dtype:
    """Where statistics are computed: the stash type (from the opsets that have one), or
    the input's type when that is wider, as for LayerNormalization; float16 and bfloat16
    inputs without a stash type are computed in float32."""
    if ctx.get("stash_type") is None and ctx.opset < 21:
        return np.dtype(np.float64) if x_dtype == np.float64 else np.dtype(np.float32)
    sdt = _stash_dtype(ctx, err)
    return np.promote_types(sdt, x_dtype) if x_dtype.kind == "f" else sdt


def _groupnorm_shape(ctx, x, scale, bias):
    groups = ctx.get("num_groups")
    if groups is None or int(groups) <= 0:
        raise ShapeInferenceError("GroupNormalization: attribute 'num_groups' is required and must be positive")
    if x.shape is not None:
        if len(x.shape) < 2:
            raise ShapeInferenceError(f"GroupNormalization: X must have rank >= 2, got {x.describe()}")
        c = x.shape[1]
        if isinstance(c, int) and c % int(groups):
            raise ShapeInferenceError(
                f"GroupNormalization: {c} channels do not divide into {groups} groups")
        want = int(groups) if ctx.opset < 21 else c
        for name, p in (("scale", scale), ("bias", bias)):
            if p.shape is not None and isinstance(want, int) and tuple(p.shape) != (want,):
                raise ShapeInferenceError(
                    f"GroupNormalization: {name} must have shape ({want},), got {p.describe()}")
    return [TensorInfo(x.dtype, x.shape)]


@kernel("GroupNormalization", since=18, shape=_groupnorm_shape)
def group_normalization(ctx, x, scale, bias):
    # Opset 18 has one scale and bias per group, opset 21 one per channel.
    groups = ctx.get("num_groups")
    if groups is None or int(groups) <= 0:
        raise KernelError("GroupNormalization: attribute 'num_groups' is required and must be positive")
    groups = int(groups)
    if x.ndim < 2:
        raise KernelError(f"GroupNormalization: X must have rank >= 2, got shape {x.shape}")
    n, c = x.shape[:2]
    if c % groups:
        raise KernelError(f"GroupNormalization: {c} channels do not divide into {groups} groups")
    per_channel = ctx.opset >= 21
    want = c if per_channel else groups
    if scale.shape != (want,) or bias.shape != (want,):
        raise KernelError(f"GroupNormalization: scale and bias must have shape ({want},), "
                          f"got {scale.shape} and {bias.shape}")
    cdt = _stage_one_dtype(ctx, x.dtype, KernelError)
    if x.size == 0:
        return x.copy()
    xs = x.reshape(n, groups, -1).astype(cdt, copy=False)
    d = xs - xs.mean(axis=2, keepdims=True)
    var = np.square(d).mean(axis=2, keepdims=True)
    d /= np.sqrt(var + cdt.type(float(ctx.get("epsilon", 1e-5))))
    if not per_channel:
        scale, bias = np.repeat(scale, c // groups), np.repeat(bias, c // groups)
    # stage two in the input's type (float16/bfloat16 widened, rounded once at the end)
    odt = _acc(x.dtype) if x.dtype.name != "bfloat16" else np.dtype(np.float32)
    y = d.reshape(n, c, -1).astype(x.dtype).astype(odt, copy=False)
    y = y * scale.astype(odt).reshape(1, c, 1)
    y += bias.astype(odt).reshape(1, c, 1)
    return y.reshape(x.shape).astype(x.dtype, copy=False)


# --------------------------------------------------------------------------- RMSNormalization


def _rmsnorm_shape(ctx, x, scale):
    _stash_dtype(ctx, ShapeInferenceError)
    if x.shape is not None:
        normalize_axis(int(ctx.get("axis", -1)), len(x.shape))
    return [TensorInfo(scale.dtype, x.shape)]


@kernel("RMSNormalization", since=23, shape=_rmsnorm_shape)
def rms_normalization(ctx, x, scale):
    # X / sqrt(mean(X^2 over axis..end) + epsilon) in the stage-one type, then times Scale
    # (which broadcasts to X) in Scale's type, the output's.
    try:
        axis = normalize_axis(int(ctx.get("axis", -1)), x.ndim)
    except ShapeInferenceError as e:
        raise KernelError(f"RMSNormalization: {e}") from None
    cdt = _stage_one_dtype(ctx, x.dtype, KernelError)
    xs = x.astype(cdt, copy=False)
    axes = tuple(range(axis, x.ndim))
    ms = np.square(xs).mean(axis=axes, keepdims=True)
    ms += cdt.type(float(ctx.get("epsilon", 1e-5)))
    np.sqrt(ms, out=ms)
    y = (xs / ms).astype(x.dtype, copy=False)
    odt = scale.dtype
    wide = np.dtype(np.float32) if odt == np.float16 or odt.name == "bfloat16" else odt
    try:
        out = np.multiply(y.astype(wide, copy=False), scale.astype(wide, copy=False))
    except ValueError:
        out = None
    if out is None or out.shape != x.shape:
        raise KernelError(f"RMSNormalization: Scale of shape {scale.shape} does not broadcast to X {x.shape}")
    return out.astype(odt, copy=False)


# --------------------------------------------------------------------------- MeanVarianceNormalization


def _same_shape(ctx, x):
    return [TensorInfo(x.dtype, x.shape)]


@kernel("MeanVarianceNormalization", since=9, shape=_same_shape)
def mean_variance_normalization(ctx, x):
    # (X - E[X]) / (sqrt(Var[X]) + 1e-9) over `axes` (default [0, 2, 3]); the variance is
    # that of the centred values (the definition's E[X^2] - E[X]^2, without the rounding
    # loss of subtracting two close numbers).
    axes = ctx.get("axes", [0, 2, 3])
    try:
        axes = tuple(sorted({normalize_axis(int(a), x.ndim) for a in axes}))
    except ShapeInferenceError as e:
        raise KernelError(f"MeanVarianceNormalization: {e}") from None
    cdt = _acc(x.dtype) if x.dtype.name != "bfloat16" else np.dtype(np.float32)
    xs = x.astype(cdt, copy=False)
    d = xs - xs.mean(axis=axes, keepdims=True)
    std = np.sqrt(np.square(d).mean(axis=axes, keepdims=True))
    std += cdt.type(1e-9)
    d /= std
    return d.astype(x.dtype, copy=False)


# --------------------------------------------------------------------------- LpNormalization


@kernel("LpNormalization", since=1, shape=_same_shape)
def lp_normalization(ctx, x):
    p = int(ctx.get("p", 2))
    if p not in (1, 2):
        raise KernelError(f"LpNormalization: p must be 1 or 2, got {p}")
    try:
        axis = normalize_axis(int(ctx.get("axis", -1)), x.ndim)
    except ShapeInferenceError as e:
        raise KernelError(f"LpNormalization: {e}") from None
    cdt = _acc(x.dtype) if x.dtype.name != "bfloat16" else np.dtype(np.float32)
    xs = x.astype(cdt, copy=False)
    if p == 1:
        norm = np.abs(xs).sum(axis=axis, keepdims=True)
    else:
        norm = np.sqrt(np.square(xs).sum(axis=axis, keepdims=True))
    # a zero norm (all zeros along the axis) gives zeros, not NaN
    zero = norm == 0
    norm[zero] = 1
    return (xs / norm).astype(x.dtype, copy=False)


# --------------------------------------------------------------------------- LRN


def _lrn_shape(ctx, x):
    return [TensorInfo(x.dtype, x.shape)]


@kernel("LRN", since=1, shape=_lrn_shape)
def lrn(ctx, x):
    size = ctx.get("size")
    if size is None or int(size) <= 0:
        raise KernelError("LRN: attribute 'size' is required and must be positive")
    size = int(size)
    if x.ndim < 3:
        raise KernelError(f"LRN: input must have rank >= 3, got {x.shape}")
    alpha = float(ctx.get("alpha", 1e-4))
    beta = float(ctx.get("beta", 0.75))
    bias = float(ctx.get("bias", 1.0))
    cdt = _acc(x.dtype)
    xc = x.astype(cdt, copy=False)
    sq = np.square(xc)
    c = x.shape[1]
    lo = (size - 1) // 2
    hi = size - 1 - lo
    # windowed channel sum: one shifted slice of the zero-padded squares per window tap
    pad = [(0, 0)] * x.ndim
    pad[1] = (lo, hi)
    sqp = np.pad(sq, pad) if size > 1 else sq
    s = sqp[:, 0:c].copy()
    for t in range(1, size):
        s += sqp[:, t:t + c]
    s *= cdt.type(alpha / size)
    s += cdt.type(bias)
    if beta == 0.75:
        d = np.sqrt(s)
        d *= np.sqrt(d)
    else:
        d = np.power(s, cdt.type(beta))
    return (xc / d).astype(x.dtype, copy=False)
