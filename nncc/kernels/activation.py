"""Activation functions: elementwise non-linearities, Softmax/LogSoftmax, Erf and Gelu.

Every kernel returns the dtype of its input: constants are built with ``x.dtype.type(c)``
so numpy never upcasts to float64. float16 inputs of transcendental functions are computed
in float32 and rounded once at the end (as onnxruntime does); Erf/Gelu(none) are computed
in float64 with W. J. Cody's rational approximations and cast back.
"""

from __future__ import annotations

import math

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import kernel
from nncc.kernels.shapes import normalize_axis, same_as


def _work(x: np.ndarray) -> np.ndarray:
    """The array to compute on: float16 is widened to float32 (rounded back by the caller)."""
    return x.astype(np.float32) if x.dtype == np.float16 else x


def _done(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return y if y.dtype == dtype else y.astype(dtype)


def _check_float(op: str, x: np.ndarray) -> None:
    if x.dtype.kind != "f":
        raise KernelError(f"{op} expects a floating-point input, got {x.dtype}")


# --------------------------------------------------------------------------- simple ones


@kernel("Relu", since=1, shape=same_as(0))
def relu(ctx, x):
    return np.maximum(x, x.dtype.type(0))


@kernel("LeakyRelu", since=1, shape=same_as(0))
def leaky_relu(ctx, x):
    alpha = x.dtype.type(ctx.get("alpha", 0.01))
    y = np.multiply(x, alpha)
    if 0 <= alpha <= 1:
        # max(x, alpha*x) == x for x >= 0 and alpha*x for x < 0 (NaN propagates).
        return np.maximum(x, y, out=y)
    return np.where(x < 0, y, x)


@kernel("Sigmoid", since=1, shape=same_as(0))
def sigmoid(ctx, x):
    w = _work(x)
    # 1 / (1 + exp(-x)): exp overflows to inf for very negative x, giving the correct 0.
    y = np.negative(w)
    with np.errstate(over="ignore"):
        np.exp(y, out=y)
    y += y.dtype.type(1)
    np.reciprocal(y, out=y)
    return _done(y, x.dtype)


@kernel("Tanh", since=1, shape=same_as(0))
def tanh(ctx, x):
    return np.tanh(x)


def _hard_sigmoid_into(w: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    t = w.dtype.type
    y = np.multiply(w, t(alpha))
    y += t(beta)
    np.maximum(y, t(0), out=y)
    np.minimum(y, t(1), out=y)
    return y


@kernel("HardSigmoid", since=1, shape=same_as(0))
def hard_sigmoid(ctx, x):
    return _hard_sigmoid_into(x, ctx.get("alpha", 0.2), ctx.get("beta", 0.5))


@kernel("HardSwish", since=14, shape=same_as(0))
def hard_swish(ctx, x):
    y = _hard_sigmoid_into(x, 1.0 / 6.0, 0.5)
    y *= x
    return y


@kernel("Elu", since=1, shape=same_as(0))
def elu(ctx, x):
    w = _work(x)
    y = np.minimum(w, w.dtype.type(0))
    np.expm1(y, out=y)
    y *= w.dtype.type(ctx.get("alpha", 1.0))
    np.copyto(y, w, where=w > 0)
    return _done(y, x.dtype)


_SELU_ALPHA = 1.67326319217681884765625
_SELU_GAMMA = 1.05070102214813232421875


@kernel("Selu", since=1, shape=same_as(0))
def selu(ctx, x):
    w = _work(x)
    t = w.dtype.type
    alpha = ctx.get("alpha", _SELU_ALPHA)
    gamma = ctx.get("gamma", _SELU_GAMMA)
    y = np.minimum(w, t(0))
    np.expm1(y, out=y)
    y *= t(alpha * gamma)
    np.copyto(y, np.multiply(w, t(gamma)), where=w > 0)
    return _done(y, x.dtype)


@kernel("Softplus", since=1, shape=same_as(0))
def softplus(ctx, x):
    # log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)), which never overflows.
    w = _work(x)
    y = np.abs(w)
    np.negative(y, out=y)
    np.exp(y, out=y)
    np.log1p(y, out=y)
    y += np.maximum(w, w.dtype.type(0))
    return _done(y, x.dtype)


def _prelu_slope(ctx, x_shape, slope_shape):
    """Opset < 7 models (Caffe2 style) may give a per-channel slope of shape (C,)."""
    if (ctx.opset < 7 and len(slope_shape) == 1 and len(x_shape) >= 3
            and slope_shape[0] == x_shape[1] and slope_shape[0] != x_shape[-1]
            and slope_shape[0] != 1):
        return tuple(slope_shape) + (1,) * (len(x_shape) - 2)
    return None


def _prelu_shape(ctx, x, slope):
    return [TensorInfo(x.dtype, x.shape)]


@kernel("PRelu", since=1, shape=_prelu_shape)
def prelu(ctx, x, slope):
    shape = _prelu_slope(ctx, x.shape, slope.shape)
    if shape is not None:
        slope = slope.reshape(shape)
    if slope.dtype != x.dtype:
        slope = slope.astype(x.dtype)
    try:
        y = np.multiply(x, slope)
    except ValueError as exc:
        raise KernelError(f"PRelu: slope shape {slope.shape} does not broadcast to {x.shape}") from exc
    if y.shape != x.shape:
        raise KernelError(f"PRelu: slope shape {slope.shape} does not broadcast to {x.shape}")
    np.copyto(y, x, where=x >= 0)
    return y


# --------------------------------------------------------------------------- Clip


def _clip(x, lo, hi):
    y = x
    if lo is not None:
        y = np.maximum(y, lo)
    if hi is not None:
        y = np.minimum(y, hi, out=y if y is not x else None)
    return y.copy() if y is x else y


@kernel("Clip", since=1, shape=same_as(0))
def clip_v1(ctx, x):
    t = x.dtype.type
    lo, hi = ctx.get("min"), ctx.get("max")
    return _clip(x, None if lo is None else t(lo), None if hi is None else t(hi))


def _scalar_bound(op: str, v, x):
    if v is None:
        return None
    if v.size != 1:
        raise KernelError(f"{op}: min/max must be scalars, got shape {v.shape}")
    return x.dtype.type(v.reshape(()))


@kernel("Clip", since=11, shape=same_as(0))
def clip_v11(ctx, x, lo=None, hi=None):
    return _clip(x, _scalar_bound("Clip", lo, x), _scalar_bound("Clip", hi, x))


# --------------------------------------------------------------------------- Erf / Gelu
# W. J. Cody, "Rational Chebyshev approximations for the error function",
# Math. Comp. 23 (1969) 631-637; coefficients from his CALERF routine (netlib specfun).

_ERF_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
          3.20937758913846947e03, 1.85777706184603153e-1)
_ERF_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
          2.84423683343917062e03)
_ERF_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
          2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03,
          2.05107837782607147e03, 1.23033935479799725e03, 2.15311535474403846e-8)
_ERF_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
          1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
          3.43936767414372164e03, 1.23033935480374942e03)
_ERF_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
          1.60837851487422766e-2, 6.58749161529837803e-4, 1.63153871373020978e-2)
_ERF_Q = (2.56852019228982242e00, 1.87295284992346047e00, 5.27905102951428412e-1,
          6.05183413124413191e-2, 2.33520497626869185e-3)
_RSQRTPI = 0.5641895835477562869480794515607725858440
_ERF_THRESH = 0.46875


def _ratio(t: np.ndarray, num_lead: float, num: tuple, den: tuple) -> np.ndarray:
    """Cody's Horner loop: xnum = lead*t; xden = t; then (xnum + num[i])*t, (xden + den[i])*t;
    finally (xnum + num[-1]) / (xden + den[-1]). Works in place on fresh arrays."""
    xnum = t * num_lead
    xden = t.copy()
    for cn, cd in zip(num[:-1], den[:-1]):
        xnum += cn
        xnum *= t
        xden += cd
        xden *= t
    xnum += num[-1]
    xden += den[-1]
    xnum /= xden
    return xnum


def _exp_neg_sq(y: np.ndarray) -> np.ndarray:
    """exp(-y*y). Without Cody's argument splitting the relative error is ~|y*y| * 2**-53,
    at most ~1e-13 for y <= 30 and ~2e-15 where erf itself is not yet 1."""
    e = y * y
    np.negative(e, out=e)
    np.exp(e, out=e)
    return e


def _erfc_mid(y: np.ndarray) -> np.ndarray:
    """erfc(y) for 0.46875 < y <= 4."""
    r = _ratio(y, _ERF_C[8], _ERF_C[:8], _ERF_D)
    r *= _exp_neg_sq(y)
    return r


def _erfc_far(y: np.ndarray) -> np.ndarray:
    """erfc(y) for y > 4 (NaN propagates; inf gives 0)."""
    y = np.minimum(y, 30.0)  # erfc(30) underflows to 0 in float64
    inv = 1.0 / (y * y)
    r = _ratio(inv, _ERF_P[5], _ERF_P[:5], _ERF_Q)
    r *= inv
    np.subtract(_RSQRTPI, r, out=r)
    r /= y
    r *= _exp_neg_sq(y)
    return r


def _erfc_large(y: np.ndarray) -> np.ndarray:
    """erfc(y) for 1-D float64 y > 0.46875 (or NaN)."""
    far = np.flatnonzero(~(y <= 4.0))  # NaN goes to the far branch and stays NaN
    if far.size == 0:
        return _erfc_mid(y)
    if far.size == y.size:
        return _erfc_far(y)
    out = _erfc_mid(np.minimum(y, 4.0))
    np.put(out, far, _erfc_far(np.take(y, far)))
    return out


def _erf_small(x: np.ndarray) -> np.ndarray:
    """erf(x) for |x| <= 0.46875."""
    z = x * x
    r = _ratio(z, _ERF_A[4], _ERF_A[:4], _ERF_B)
    r *= x
    return r


_CHUNK = 1 << 15


def erf64(x: np.ndarray, complement: bool = False) -> np.ndarray:
    """erf(x) (or erfc(x)) of a float64 array, vectorized; relative error ~1e-15.

    Works in cache-sized chunks; inside a chunk the elements of each of Cody's intervals
    are gathered by index (a masked select in numpy is much slower than take/put).
    """
    x = np.asarray(x, dtype=np.float64)
    flat = x.reshape(-1)
    out = np.empty_like(flat)
    for start in range(0, flat.size, _CHUNK):
        _erf_chunk(flat[start:start + _CHUNK], out[start:start + _CHUNK], complement)
    return out.reshape(x.shape)


def _erf_chunk(xc: np.ndarray, oc: np.ndarray, complement: bool) -> None:
    ax = np.abs(xc)
    is_small = ax <= _ERF_THRESH
    big = np.flatnonzero(~is_small)
    if big.size < xc.size:
        small = np.flatnonzero(is_small) if big.size else None
        r = _erf_small(xc if small is None else np.take(xc, small))
        if complement:
            np.subtract(1.0, r, out=r)
        if small is None:
            oc[...] = r
            return
        np.put(oc, small, r)
    if big.size == 0:
        return
    if big.size == xc.size:
        ec = _erfc_large(ax)
        neg = xc < 0
    else:
        ec = _erfc_large(np.take(ax, big))
        neg = np.take(xc, big) < 0
    if complement:
        np.subtract(2.0, ec, out=ec, where=neg)  # erfc(-y) = 2 - erfc(y)
    else:
        np.subtract(1.0, ec, out=ec)
        np.negative(ec, out=ec, where=neg)
    if big.size == xc.size:
        oc[...] = ec
    else:
        np.put(oc, big, ec)


@kernel("Erf", since=9, shape=same_as(0))
def erf(ctx, x):
    # Integer inputs (allowed since opset 13) truncate toward zero like a C cast.
    return _done(erf64(x), x.dtype)


@kernel("Gelu", since=20, shape=same_as(0))
def gelu(ctx, x):
    _check_float("Gelu", x)
    approximate = ctx.get("approximate", "none")
    if approximate == "none":
        # 0.5 * x * (1 + erf(x / sqrt(2))) == x * 0.5 * erfc(-x / sqrt(2)): no cancellation.
        t = np.multiply(x, -1.0 / math.sqrt(2.0), dtype=np.float64)
        phi = erf64(t, complement=True)
        phi *= 0.5
        phi *= x
        return _done(phi, x.dtype)
    if approximate == "tanh":
        w = _work(x)
        c = w.dtype.type
        inner = w * w
        inner *= c(0.044715)
        inner += c(1)
        inner *= w
        inner *= c(math.sqrt(2.0 / math.pi))
        np.tanh(inner, out=inner)
        inner += c(1)
        inner *= w
        inner *= c(0.5)
        return _done(inner, x.dtype)
    raise KernelError(f"Gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


# --------------------------------------------------------------------------- Softmax family


def _softmax_shape(ctx, x):
    if x.shape is not None:
        default = -1 if ctx.opset >= 13 else 1
        rank = len(x.shape)
        axis = ctx.get("axis", default)
        # opset < 13 coerces to 2-D, where axis == rank is allowed (a [N, 1] view).
        limit = rank + 1 if ctx.opset < 13 else rank
        if not -rank <= axis < max(limit, 1):
            raise ShapeInferenceError(f"Softmax: axis {axis} is out of range for rank {rank}")
    return [TensorInfo(x.dtype, x.shape)]


def _softmax_last(w: np.ndarray, axis: int, log: bool) -> np.ndarray:
    """Numerically stable (log-)softmax of w along one axis; w is float32/float64."""
    y = np.subtract(w, np.max(w, axis=axis, keepdims=True))
    if log:
        s = np.exp(y).sum(axis=axis, keepdims=True)
        np.log(s, out=s)
        y -= s
        return y
    np.exp(y, out=y)
    y /= y.sum(axis=axis, keepdims=True)
    return y


def _softmax(ctx, x, log: bool, coerce_2d: bool):
    _check_float("LogSoftmax" if log else "Softmax", x)
    rank = x.ndim
    w = _work(x)
    if coerce_2d:
        axis = ctx.get("axis", 1)
        if not -rank <= axis <= rank:
            raise KernelError(f"axis {axis} is out of range for rank {rank}")
        axis = axis + rank if axis < 0 else axis
        n = math.prod(x.shape[:axis])
        d = math.prod(x.shape[axis:])
        if x.size == 0:
            return x.copy()
        y = _softmax_last(w.reshape(n, d), 1, log).reshape(x.shape)
    else:
        axis = ctx.get("axis", -1)
        if not -rank <= axis < max(rank, 1):
            raise KernelError(f"axis {axis} is out of range for rank {rank}")
        if rank == 0:
            y = _softmax_last(w.reshape(1), 0, log).reshape(())
        elif x.size == 0:
            return x.copy()
        else:
            y = _softmax_last(w, axis, log)
    return _done(y, x.dtype)


@kernel("Softmax", since=1, shape=_softmax_shape)
def softmax_v1(ctx, x):
    return _softmax(ctx, x, log=False, coerce_2d=True)


@kernel("Softmax", since=13, shape=_softmax_shape)
def softmax_v13(ctx, x):
    return _softmax(ctx, x, log=False, coerce_2d=False)


@kernel("LogSoftmax", since=1, shape=_softmax_shape)
def log_softmax_v1(ctx, x):
    return _softmax(ctx, x, log=True, coerce_2d=True)


@kernel("LogSoftmax", since=13, shape=_softmax_shape)
def log_softmax_v13(ctx, x):
    return _softmax(ctx, x, log=True, coerce_2d=False)
