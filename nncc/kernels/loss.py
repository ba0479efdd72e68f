"""Loss kernels: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both take scores of shape (N, C, d1, ..., dk) and integer targets of shape (N, d1, ..., dk).
An element whose target equals `ignore_index` contributes nothing and has weight 0 (its
target need not be a valid class). With reduction "mean" the sum of the weighted losses is
divided by the sum of the weights applied (the count of elements not ignored when there
are no class weights). float16 and bfloat16 are computed in float32.
"""

from __future__ import annotations

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import kernel

_REDUCTIONS = ("none", "sum", "mean")


def _reduction(ctx, err) -> str:
    reduction = ctx.get("reduction", "mean")
    if isinstance(reduction, bytes):
        reduction = reduction.decode()
    if reduction not in _REDUCTIONS:
        raise err(f"reduction must be one of {', '.join(_REDUCTIONS)}, got {reduction!r}")
    return reduction


def _loss_info(ctx, op, scores, target):
    reduction = _reduction(ctx, ShapeInferenceError)
    if scores.shape is not None and len(scores.shape) < 2:
        raise ShapeInferenceError(f"{op}: scores must have rank >= 2, got {scores.describe()}")
    if reduction != "none":
        return TensorInfo(scores.dtype, ())
    if target.shape is not None:
        return TensorInfo(scores.dtype, target.shape)
    if scores.shape is not None:
        return TensorInfo(scores.dtype, (scores.shape[0],) + tuple(scores.shape[2:]))
    return TensorInfo(scores.dtype, None)


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype == np.float16 or dtype.name == "bfloat16" else dtype


def _nll(op: str, ctx, logp: np.ndarray, target: np.ndarray, weight) -> np.ndarray:
    """The loss from log-probabilities ``logp`` (already in the compute dtype)."""
    reduction = _reduction(ctx, KernelError)
    if logp.ndim < 2:
        raise KernelError(f"{op}: scores must have rank >= 2, got shape {logp.shape}")
    n, c = logp.shape[:2]
    if target.shape != (n,) + logp.shape[2:]:
        raise KernelError(f"{op}: target of shape {target.shape} does not match "
                          f"scores of shape {logp.shape}")
    if target.dtype.kind not in "iu":
        raise KernelError(f"{op}: target must be an integer tensor, got {target.dtype}")
    if weight is not None and weight.shape != (c,):
        raise KernelError(f"{op}: weight must have shape ({c},), got {weight.shape}")
    ignore = ctx.get("ignore_index")
    ignored = None if ignore is None else target == ignore
    t = target.astype(np.int64, copy=False)
    if ignored is not None and ignored.any():
        t = np.where(ignored, 0, t)
    if t.size and (t.min() < 0 or t.max() >= c):
        bad = t[(t < 0) | (t >= c)].reshape(-1)[0]
        raise KernelError(f"{op}: target class {bad} is out of range [0, {c})")
    picked = np.take_along_axis(logp, t[:, None], axis=1)[:, 0]
    if weight is None:
        w = None if ignored is None else (~ignored).astype(logp.dtype)
    else:
        w = weight.astype(logp.dtype)[t]
        if ignored is not None:
            w[ignored] = 0
    loss = np.negative(picked) if w is None else np.negative(picked) * w
    if reduction == "none":
        return loss
    total = loss.sum(dtype=logp.dtype)
    if reduction == "sum":
        return total
    count = logp.dtype.type(loss.size) if w is None else w.sum(dtype=logp.dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.divide(total, count)  # nothing counted: 0 / 0 is NaN


def _nll_shape(ctx, scores, target, weight=None):
    return [_loss_info(ctx, "NegativeLogLikelihoodLoss", scores, target)]


@kernel("NegativeLogLikelihoodLoss", since=12, shape=_nll_shape)
def negative_log_likelihood_loss(ctx, scores, target, weight=None):
    cdt = _compute_dtype(scores.dtype)
    loss = _nll("NegativeLogLikelihoodLoss", ctx, scores.astype(cdt, copy=False), target, weight)
    return np.asarray(loss).astype(scores.dtype, copy=False)


def _sce_shape(ctx, scores, labels, weights=None):
    out = [_loss_info(ctx, "SoftmaxCrossEntropyLoss", scores, labels)]
    if ctx.num_outputs > 1:
        out.append(TensorInfo(scores.dtype, scores.shape))
    return out


def _log_softmax_classes(x: np.ndarray) -> np.ndarray:
    """log(softmax(x)) along axis 1, shifted by the maximum so exp never overflows."""
    peak = np.max(x, axis=1, keepdims=True)
    peak[~np.isfinite(peak)] = 0
    y = x - peak
    s = np.exp(y).sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        np.log(s, out=s)
    y -= s
    return y


@kernel("SoftmaxCrossEntropyLoss", since=12, shape=_sce_shape)
def softmax_cross_entropy_loss(ctx, scores, labels, weights=None):
    if scores.ndim < 2:
        raise KernelError(f"SoftmaxCrossEntropyLoss: scores must have rank >= 2, got shape {scores.shape}")
    cdt = _compute_dtype(scores.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        logp = _log_softmax_classes(scores.astype(cdt, copy=False) if cdt != scores.dtype
                                    else scores)
    loss = np.asarray(_nll("SoftmaxCrossEntropyLoss", ctx, logp, labels, weights))
    loss = loss.astype(scores.dtype, copy=False)
    if ctx.num_outputs > 1:
        return loss, logp.astype(scores.dtype, copy=False)
    return loss
