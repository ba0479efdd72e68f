"""Per-channel affine kernel in the private "nncc" domain, produced by the
``batchnorm_to_scale_shift`` pass (nncc.passes.fusion).

* ``ScaleShift(X, scale, shift)``: ``Y = X * scale + shift`` where ``scale`` and ``shift``
  are 1-D of length C, broadcast along axis 1 of X (shape (N, C, D1, ...), rank >= 2).
  This is inference BatchNormalization with its statistics folded, plus any per-channel
  constant Mul / Add / Sub that followed it.

Attributes: the fused activation of ``FusedConv`` (see nncc.kernels.fused): ``activation``
(Relu, LeakyRelu, Clip, Sigmoid, Tanh, HardSigmoid, HardSwish, Silu or Mish; absent or "" for none),
``activation_alpha``, ``activation_beta``, ``activation_min``, ``activation_max``.

Y has X's dtype; float32 and float64 compute in X's dtype, float16 in float32 (as
BatchNormalization does) and is rounded back once.
"""

from __future__ import annotations

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.fused import apply_activation
from nncc.kernels.registry import kernel



def _label(ctx) -> str:
    return f"ScaleShift node {ctx.name!r}" if ctx.name else "ScaleShift"


def _scale_shift_shape(ctx, x, scale, shift):
    for what, info in (("scale", scale), ("shift", shift)):
        if info is None:
            raise ShapeInferenceError(f"{_label(ctx)}: input {what!r} is required")
        if info.shape is not None and len(info.shape) != 1:
            raise ShapeInferenceError(f"{_label(ctx)}: {what} must be 1-D, got shape {info.shape}")
    if x.shape is not None:
        if len(x.shape) < 2:
            raise ShapeInferenceError(f"{_label(ctx)}: X must have rank >= 2, got shape {x.shape}")
        c = x.shape[1]
        for what, info in (("scale", scale), ("shift", shift)):
            n = None if info.shape is None else info.shape[0]
            if isinstance(c, int) and isinstance(n, int) and n != c:
                raise ShapeInferenceError(
                    f"{_label(ctx)}: {what} has {n} values but X has {c} channels (shape {x.shape})")
    return [TensorInfo(x.dtype, x.shape)]


def _views(ctx, x: np.ndarray, scale: np.ndarray, shift: np.ndarray, cdt: np.dtype):
    """``scale`` and ``shift`` shaped (C, 1, ..., 1) to broadcast along axis 1 of ``x``,
    in the compute dtype, made once per node and kept in its scratch. Parameters already in
    the compute dtype (what the pass produces) become views, which always show the current
    contents; converted copies are only kept for plan constants."""
    if x.ndim < 2:
        raise KernelError(f"{_label(ctx)}: X must have rank >= 2, got shape {x.shape}")
    key = (x.ndim, x.shape[1], cdt.str)
    cached = ctx.scratch.get("scale/shift views")
    if cached is not None and cached[0] == key and cached[1] is scale and cached[2] is shift:
        return cached[3], cached[4]
    c = x.shape[1]
    for what, p in (("scale", scale), ("shift", shift)):
        if p.ndim != 1 or p.shape[0] != c:
            raise KernelError(f"{_label(ctx)}: {what} must be 1-D of length {c} (X is {x.shape}), "
                              f"got shape {p.shape}")
    shape = (c,) + (1,) * (x.ndim - 2)
    s = scale.astype(cdt, copy=False).reshape(shape)
    b = shift.astype(cdt, copy=False).reshape(shape)
    views = scale.dtype == cdt and shift.dtype == cdt
    if views or (ctx.is_constant(1) and ctx.is_constant(2)):
        ctx.scratch["scale/shift views"] = (key, scale, shift, s, b)
    return s, b


@kernel("ScaleShift", since=1, domain="nncc", shape=_scale_shift_shape, writes_out=True)
def scale_shift(ctx, x, scale, shift, out=None):
    if x.dtype.kind != "f":
        raise KernelError(f"{_label(ctx)}: X must be a floating-point tensor, got {x.dtype}")
    cdt = np.dtype(np.float32) if x.dtype == np.float16 else x.dtype
    s, b = _views(ctx, x, scale, shift, cdt)
    target = out[0] if out is not None else None
    if target is None or target.dtype != x.dtype or target.shape != x.shape:
        target = np.empty(x.shape, x.dtype)
    if cdt == x.dtype:
        np.multiply(x, s, out=target)
        np.add(target, b, out=target)
    else:  # float16: compute in float32 and round once, as BatchNormalization does
        y = x.astype(cdt) * s
        y += b
        np.copyto(target, y, casting="same_kind")
    return apply_activation(ctx, target)
