"""Optimizer kernels of ai.onnx.preview.training: Momentum, Adagrad and Adam.

Each takes the learning rate R and the update count T (scalars), then n tensors to
optimize, their n gradients and the n (or 2n, for Adam) accumulators, and returns the n
updated tensors followed by the updated accumulators. Scalar factors are computed in
double precision; the tensors keep their own dtype.
"""

from __future__ import annotations

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import kernel

TRAINING = "ai.onnx.preview.training"


def _groups(op: str, tensors: tuple, per: int) -> int:
    if len(tensors) % per:
        raise KernelError(f"{op}: after R and T, the inputs must come in {per} groups of equal size")
    return len(tensors) // per


def _optimizer_shape(op: str, per: int):
    def shape(ctx, r, t, *tensors):
        if len(tensors) % per:
            raise ShapeInferenceError(f"{op}: after R and T, the inputs must come in {per} equal groups")
        n = len(tensors) // per
        outs = [TensorInfo(info.dtype, info.shape) for info in tensors[:n]]
        outs += [TensorInfo(info.dtype, info.shape) for info in tensors[2 * n:]]
        return outs

    return shape


def _scalars(r, t) -> tuple[float, int]:
    if r.size != 1 or t.size != 1:
        raise KernelError("the learning rate R and the update count T must be scalars")
    return float(r.reshape(())), int(t.reshape(()))


def _check(op: str, x, g, *states):
    for other in (g, *states):
        if other.shape != x.shape:
            raise KernelError(f"{op}: tensor of shape {x.shape} has a companion of shape {other.shape}")


@kernel("Momentum", 1, TRAINING, shape=_optimizer_shape("Momentum", 3))
def momentum(ctx, r, t, *tensors):
    n = _groups("Momentum", tensors, 3)
    rate, step = _scalars(r, t)
    alpha, beta = float(ctx.get("alpha", 0.0)), float(ctx.get("beta", 0.0))
    norm = float(ctx.get("norm_coefficient", 0.0))
    mode = ctx.get("mode", "standard")
    if mode not in ("standard", "nesterov"):
        raise KernelError(f"Momentum: mode must be 'standard' or 'nesterov', not {mode!r}")
    beta_now = beta if step > 0 else 1.0  # the first update takes the whole gradient
    xs, vs = [], []
    for x, g, v in zip(tensors[:n], tensors[n:2 * n], tensors[2 * n:]):
        _check("Momentum", x, g, v)
        dtype = x.dtype.type
        g_reg = dtype(norm) * x + g
        v_new = dtype(alpha) * v + dtype(beta_now) * g_reg
        if mode == "standard":
            x_new = x - dtype(rate) * v_new
        else:
            x_new = x - dtype(rate) * (g_reg + dtype(alpha) * v_new)
        xs.append(x_new.astype(x.dtype, copy=False))
        vs.append(v_new.astype(v.dtype, copy=False))
    return tuple(xs + vs)


@kernel("Adagrad", 1, TRAINING, shape=_optimizer_shape("Adagrad", 3))
def adagrad(ctx, r, t, *tensors):
    n = _groups("Adagrad", tensors, 3)
    rate, step = _scalars(r, t)
    decay = float(ctx.get("decay_factor", 0.0))
    epsilon = float(ctx.get("epsilon", 1e-6))
    norm = float(ctx.get("norm_coefficient", 0.0))
    rate = rate / (1.0 + step * decay)
    xs, hs = [], []
    for x, g, h in zip(tensors[:n], tensors[n:2 * n], tensors[2 * n:]):
        _check("Adagrad", x, g, h)
        dtype = x.dtype.type
        g_reg = dtype(norm) * x + g
        h_new = h + g_reg * g_reg
        x_new = x - dtype(rate) * g_reg / (np.sqrt(h_new) + dtype(epsilon))
        xs.append(x_new.astype(x.dtype, copy=False))
        hs.append(h_new.astype(h.dtype, copy=False))
    return tuple(xs + hs)


@kernel("Adam", 1, TRAINING, shape=_optimizer_shape("Adam", 4))
def adam(ctx, r, t, *tensors):
    n = _groups("Adam", tensors, 4)
    rate, step = _scalars(r, t)
    alpha, beta = float(ctx.get("alpha", 0.9)), float(ctx.get("beta", 0.999))
    epsilon = float(ctx.get("epsilon", 1e-6))
    norm = float(ctx.get("norm_coefficient", 0.0))
    norm_post = float(ctx.get("norm_coefficient_post", 0.0))
    if step > 0:  # bias correction of both running averages
        rate = rate * np.sqrt(1.0 - beta**step) / (1.0 - alpha**step)
    xs, vs, hs = [], [], []
    groups = zip(tensors[:n], tensors[n:2 * n], tensors[2 * n:3 * n], tensors[3 * n:])
    for x, g, v, h in groups:
        _check("Adam", x, g, v, h)
        dtype = x.dtype.type
        g_reg = dtype(norm) * x + g
        v_new = dtype(alpha) * v + dtype(1.0 - alpha) * g_reg
        h_new = dtype(beta) * h + dtype(1.0 - beta) * (g_reg * g_reg)
        x_new = x - dtype(rate) * (v_new / (np.sqrt(h_new) + dtype(epsilon)))
        x_new = dtype(1.0 - norm_post) * x_new
        xs.append(x_new.astype(x.dtype, copy=False))
        vs.append(v_new.astype(v.dtype, copy=False))
        hs.append(h_new.astype(h.dtype, copy=False))
    return tuple(xs + vs + hs)
