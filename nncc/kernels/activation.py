"""Activation functions: elementwise non-linearities, Softmax/LogSoftmax/Hardmax, Erf and
Gelu.

Every kernel returns the dtype of its input: constants are built with ``x.dtype.type(c)``
so numpy never upcasts to float64. float16 inputs of transcendental functions are computed
in float32 and rounded once at the end (as onnxruntime does); Erf/Gelu(none) are computed
in float64 with W. J. Cody's rational approximations and cast back, except float32 Erf,
which has a cheaper rational approximation of its own (within 0.52 ulp).

Small models are dominated by the fixed cost of each kernel call, so Softmax and Erf work
out what depends only on the input's shape/dtype once per node (a plan in ``ctx.scratch``,
rebuilt when the shape or dtype changes) and use as few numpy calls as they can.
"""

from __future__ import annotations

import math

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.arithmetic import is_float, row_sums
from nncc.kernels.bounds import DTYPES as BOUND_DTYPES, bound
from nncc.kernels.registry import kernel, stand_ins
from nncc.kernels.shapes import same_as


def _work(x: np.ndarray) -> np.ndarray:
    """The array to compute on: float16 and bfloat16 are widened to float32 (rounded back by
    the caller), and a 0-d input is viewed as 1-d (numpy gives scalars, not arrays, for 0-d
    operations, and the kernels write into their intermediate results with ``out=``)."""
    x = x.reshape(1) if x.ndim == 0 else x
    return x.astype(np.float32) if x.dtype == np.float16 or x.dtype.name == "bfloat16" else x


def _done(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The result in the input's dtype and shape (see _work)."""
    y = y if y.dtype == x.dtype else y.astype(x.dtype)
    return y.reshape(()) if x.ndim == 0 else y


# ONNX FLOAT attribute defaults are float32 values; onnxruntime applies exactly those even to
# float64 tensors, so the defaults are float32-rounded here too.
_F32_0_01 = float(np.float32(0.01))
_F32_0_2 = float(np.float32(0.2))


def _check_float(op: str, x: np.ndarray) -> None:
    if not is_float(x.dtype):
        raise KernelError(f"{op} expects a floating-point input, got {x.dtype}")


# --------------------------------------------------------------------------- simple ones


def _inf(dtype: np.dtype, sign: int):
    """+-infinity for floats, the extreme finite value for integers."""
    if dtype.kind == "f":
        return dtype.type(sign * np.inf)
    info = np.iinfo(dtype)
    return dtype.type(info.max if sign > 0 else info.min)


@kernel("Relu", since=1, shape=same_as(0), writes_out=True)
def relu(ctx, x, out=None):
    if x.dtype.kind == "u":
        return x.copy()
    # np.clip with two scalar bounds is SIMD-vectorized (np.maximum(x, 0) is ~3x slower);
    # NaN propagates through it.
    w = _work(x)
    if (out is not None and x.dtype in BOUND_DTYPES and x.flags.c_contiguous
            and out[0].flags.c_contiguous):
        return bound(x, np.maximum, 0.0, out[0])  # faster still, bit-identical
    if out is not None and w.dtype == x.dtype:
        return np.clip(w, w.dtype.type(0), _inf(w.dtype, 1), out=out[0])
    return _done(np.clip(w, w.dtype.type(0), _inf(w.dtype, 1)), x)


@kernel("LeakyRelu", since=1, shape=same_as(0))
def leaky_relu(ctx, x):
    alpha = x.dtype.type(ctx.get("alpha", _F32_0_01))
    y = np.multiply(x, alpha)
    if 0 <= alpha <= 1:
        # max(x, alpha*x) == x for x >= 0 and alpha*x for x < 0 (NaN propagates).
        return np.maximum(x, y, out=y) if x.ndim else np.asarray(np.maximum(x, y))
    return np.where(x < 0, y, x)


@kernel("Sigmoid", since=1, shape=same_as(0), writes_out=True)
def sigmoid(ctx, x, out=None):
    w = _work(x)
    # 1 / (1 + exp(-x)): exp overflows to inf for very negative x, giving the correct 0.
    y = (np.negative(w, out=out[0].reshape(w.shape)) if out is not None and w.dtype == x.dtype
         else np.negative(w))
    with np.errstate(over="ignore"):
        np.exp(y, out=y)
    one = y.dtype.type(1)
    y += one
    np.divide(one, y, out=y)
    return _done(y, x)


@kernel("Tanh", since=1, shape=same_as(0), writes_out=True)
def tanh(ctx, x, out=None):
    return np.tanh(x) if out is None else np.tanh(x, out=out[0])


def _hard_sigmoid(w: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    t = w.dtype.type
    y = np.multiply(w, t(alpha))
    y += t(beta)
    return np.clip(y, t(0), t(1), out=y)


@kernel("HardSigmoid", since=1, shape=same_as(0))
def hard_sigmoid(ctx, x):
    _check_float("HardSigmoid", x)
    w = _work(x)
    return _done(_hard_sigmoid(w, ctx.get("alpha", _F32_0_2), ctx.get("beta", 0.5)), x)


@kernel("HardSwish", since=14, shape=same_as(0))
def hard_swish(ctx, x):
    _check_float("HardSwish", x)
    w = _work(x)
    y = _hard_sigmoid(w, 1.0 / 6.0, 0.5)
    y *= w
    return _done(y, x)


def _neg_part(w: np.ndarray) -> np.ndarray:
    """min(w, 0) and max(w, 0) via np.clip (SIMD; np.minimum with a scalar is ~3x slower)."""
    return np.clip(w, _inf(w.dtype, -1), w.dtype.type(0))


def _pos_part(w: np.ndarray) -> np.ndarray:
    return np.clip(w, w.dtype.type(0), _inf(w.dtype, 1))


# Elu, Selu and PRelu are computed without masks as f(min(x, 0)) + g(max(x, 0)): exact,
# since each side then adds a zero, and far faster than a masked select on mixed signs.


@kernel("Elu", since=1, shape=same_as(0))
def elu(ctx, x):
    _check_float("Elu", x)
    w = _work(x)
    y = _neg_part(w)
    np.expm1(y, out=y)
    y *= w.dtype.type(ctx.get("alpha", 1.0))
    y += _pos_part(w)
    return _done(y, x)


_SELU_ALPHA = 1.67326319217681884765625
_SELU_GAMMA = 1.05070102214813232421875


@kernel("Selu", since=1, shape=same_as(0))
def selu(ctx, x):
    _check_float("Selu", x)
    w = _work(x)
    t = w.dtype.type
    alpha = ctx.get("alpha", _SELU_ALPHA)
    gamma = ctx.get("gamma", _SELU_GAMMA)
    y = _neg_part(w)
    np.expm1(y, out=y)
    y *= t(alpha * gamma)
    p = _pos_part(w)
    p *= t(gamma)
    y += p
    return _done(y, x)


def _softplus(w: np.ndarray) -> np.ndarray:
    """log(1 + exp(w)) as max(w, 0) + log1p(exp(-|w|)), which never overflows."""
    y = np.abs(w)
    np.negative(y, out=y)
    np.exp(y, out=y)
    np.log1p(y, out=y)
    y += _pos_part(w)
    return y


@kernel("Softplus", since=1, shape=same_as(0))
def softplus(ctx, x):
    _check_float("Softplus", x)
    return _done(_softplus(_work(x)), x)


def _prelu_slope(ctx, x_shape, slope_shape):
    """Before opset 7 (no numpy broadcasting yet) a slope of shape (C,) is per channel."""
    if (ctx.opset < 7 and len(slope_shape) == 1 and len(x_shape) >= 3
            and slope_shape[0] == x_shape[1] and slope_shape[0] != 1):
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
        out_shape = np.broadcast_shapes(x.shape, slope.shape)
    except ValueError:
        out_shape = None
    if out_shape != x.shape:
        raise KernelError(f"PRelu: slope shape {slope.shape} does not broadcast to {x.shape}")
    if x.dtype.kind == "u":
        return x.copy()
    y = _neg_part(x)
    y *= slope
    y += _pos_part(x)
    return y


# --------------------------------------------------------------------------- Clip


def _clip(x, lo, hi):
    if x.dtype.kind not in "fiu":
        raise KernelError(f"Clip: unsupported dtype {x.dtype}")
    # Missing bounds become +-inf (or the integer limits); np.clip then computes
    # min(max(x, lo), hi) (so lo > hi gives hi, as onnxruntime does) in one SIMD pass.
    w = _work(x)
    t = w.dtype.type
    lo = _inf(w.dtype, -1) if lo is None else t(lo)
    hi = _inf(w.dtype, 1) if hi is None else t(hi)
    return _done(np.clip(w, lo, hi), x)


@kernel("Clip", since=1, shape=same_as(0))
def clip_v1(ctx, x):
    return _clip(x, ctx.get("min"), ctx.get("max"))


def _scalar_bound(op: str, v):
    if v is None:
        return None
    if v.size != 1:
        raise KernelError(f"{op}: min/max must be scalars, got shape {v.shape}")
    return v.reshape(()).item()


@kernel("Clip", since=11, shape=same_as(0))
def clip_v11(ctx, x, lo=None, hi=None):
    return _clip(x, _scalar_bound("Clip", lo), _scalar_bound("Clip", hi))


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


def _cody_erf(x: np.ndarray, complement: bool = False) -> np.ndarray:
    """erf(x) (or erfc(x)) of a 1-D float64 array by Cody's three intervals (elements of
    each interval gathered by index). Relative error ~1e-15; used for the tables below and
    for the far tail of erfc."""
    out = np.empty_like(x)
    ax = np.abs(x)
    is_small = ax <= _ERF_THRESH
    small = np.flatnonzero(is_small)
    big = np.flatnonzero(~is_small)  # NaN lands here and stays NaN
    r = _erf_small(np.take(x, small))
    if complement:
        np.subtract(1.0, r, out=r)
    np.put(out, small, r)
    ec = _erfc_large(np.take(ax, big))
    neg = np.take(x, big) < 0
    if complement:
        np.subtract(2.0, ec, out=ec, where=neg)  # erfc(-y) = 2 - erfc(y)
    else:
        np.subtract(1.0, ec, out=ec)
        np.negative(ec, out=ec, where=neg)
    np.put(out, big, ec)
    return out


# Fast path: table-driven Taylor expansion. With x0 = k/128 the nearest grid point and
# d = x - x0 (|d| <= 1/256),
#   erf(x0 + d) = erf(x0) + 2/sqrt(pi) exp(-x0^2) sum_{n>=1} (-1)^(n-1) H_{n-1}(x0) d^n / n!
# (H_n the physicists' Hermite polynomials; erfc's series is the same with the opposite sign).
# Cut after d^6, the remainder is below 1e-16 relative for erf on [-6, 6] and ~1e-14 relative
# for erfc on [-6, 4] (used for float64 results); cut after d^3 it is below ~1e-10 for erf and
# ~4e-8 for erfc, ample for float32/float16 results and twice as fast. The tabulated
# erf(x0)/erfc(x0) come from Cody's approximations.
# |x| >= 6 gives erf = +-1 exactly in float64; erfc(x > 4) uses Cody's asymptotic interval.
_TAB_STEP = 128
_TAB_RANGE = {False: (-6.0, 6.0), True: (-6.0, 4.0)}
_tables: dict[tuple[bool, int], tuple[list[np.ndarray], int]] = {}


def _taylor_table(complement: bool, degree: int) -> tuple[list[np.ndarray], int]:
    cached = _tables.get((complement, degree))
    if cached is not None:
        return cached
    lo, hi = _TAB_RANGE[complement]
    k = np.arange(int(lo * _TAB_STEP), int(hi * _TAB_STEP) + 1)
    x0 = k / _TAB_STEP
    rows = [_cody_erf(x0, complement)]
    scale = (2.0 / math.sqrt(math.pi)) * np.exp(-x0 * x0)
    if complement:
        scale = -scale
    h_prev, h_cur = np.ones_like(x0), 2.0 * x0  # H_0, H_1
    for n in range(1, degree + 1):
        rows.append(scale * ((-1) ** (n - 1) / math.factorial(n)) * h_prev)
        h_prev, h_cur = h_cur, 2.0 * x0 * h_cur - 2.0 * n * h_prev
    table = ([np.ascontiguousarray(r) for r in rows], int(-k[0]))
    _tables[(complement, degree)] = table
    return table


_CHUNK = 1 << 15


def erf64(x: np.ndarray, complement: bool = False, degree: int = 6) -> np.ndarray:
    """erf(x) (or erfc(x)) as float64, vectorized. With the default degree the relative
    error is ~1e-15 for erf and ~1e-14 for erfc; degree=3 (~1e-10 / ~4e-8) is meant for
    float32 results. Checked against math.erf / math.erfc in the tests."""
    return _erf_eval(np.asarray(x), np.float64, complement, degree)


def _erf_eval(x: np.ndarray, out_dtype, complement: bool, degree: int,
              scale: float = 1.0, gelu: bool = False) -> np.ndarray:
    """erf(scale*x) or erfc(scale*x) — or, with gelu, 0.5*x*erfc(scale*x) — computed in
    float64 in cache-sized chunks with reused buffers and written straight into an array of
    ``out_dtype`` (no full-size float64 temporaries)."""
    flat = x.reshape(-1)
    out = np.empty(flat.shape, out_dtype)
    rows, offset = _taylor_table(complement, degree)
    lo, hi = _TAB_RANGE[complement]
    n = min(_CHUNK, flat.size)
    t, kf, d, r = (np.empty(n, np.float64) for _ in range(4))
    idx = np.empty(n, np.intp)
    with np.errstate(invalid="ignore"):  # NaN -> index cast; take(mode="clip") keeps it safe
        for start in range(0, flat.size, _CHUNK):
            xc = flat[start:start + _CHUNK]
            m = xc.size
            tc, kc, dc, rc, ic = t[:m], kf[:m], d[:m], r[:m], idx[:m]
            if scale != 1.0:
                np.multiply(xc, scale, out=tc, dtype=np.float64)
                np.clip(tc, lo, hi, out=tc)
            else:
                np.clip(xc, lo, hi, out=tc, dtype=np.float64)
            np.multiply(tc, float(_TAB_STEP), out=kc)
            np.rint(kc, out=kc)
            np.multiply(kc, 1.0 / _TAB_STEP, out=dc)
            np.subtract(tc, dc, out=dc)
            kc += offset
            np.copyto(ic, kc, casting="unsafe")
            np.take(rows[-1], ic, mode="clip", out=rc)
            for row in rows[-2::-1]:
                rc *= dc
                np.take(row, ic, mode="clip", out=kc)
                rc += kc
            if complement:
                far = np.flatnonzero(xc > hi / scale if scale > 0 else xc < hi / scale)
                if far.size:
                    yf = np.take(xc, far).astype(np.float64) * scale
                    np.put(rc, far, _erfc_far(yf))
            else:
                np.copysign(rc, xc if scale > 0 else -xc, out=rc)  # erf is odd: erf(-0) = -0
            if gelu:
                rc *= 0.5
                rc *= xc
            out[start:start + m] = rc
    return out.reshape(x.shape)


def _erf_degree(dtype: np.dtype) -> int:
    return 6 if dtype == np.float64 else 3


# float32 fast path: erf(x) = x * P(x^2) / Q(x^2) on [-4, 4] (degree 6 / 6, fitted by
# iteratively reweighted least squares for the smallest relative error: 9.3e-10 in exact
# arithmetic). Beyond |x| = 4, erf(x) rounds to +-1 in float32 (erfc(3.92) < 2**-25), so x
# is clamped there. It is evaluated in float64 with few numpy calls, however small the input:
# the powers of x^2 are the rows of one matrix, and P and Q are a single (2, 7) x (7, n)
# BLAS product. Results are within 0.52 ulp of the exact erf over the whole float32 range
# (tested against math.erf); NaN propagates through the clamp.
_ERF32_PQ = np.array([
    [1.1283791681433823, 0.16689985706365873, 0.05093779177356234, 0.0029558372178698183,
     0.00030574287476393177, -2.896699627148318e-07, -4.484531838419581e-08],
    [1.0, 0.48124451928400275, 0.1055570168467869, 0.013491003060928507,
     0.001039809047412788, 4.0995304355130884e-05, -6.202012795812013e-07],
])
_ERF32_LO, _ERF32_HI = np.array(-4.0), np.array(4.0)
_ERF32_CHUNK = 4096


class _Erf32Buffers:
    """A node's float64 work buffers for chunks of n elements, with the row views the
    evaluation uses (making a view costs as much as a small ufunc call)."""

    __slots__ = ("n", "t", "m", "s", "pq", "p", "q")

    def __init__(self, n: int):
        self.n = n
        self.t = np.empty(n)  # clamped x
        self.m = np.empty((7, n))  # 1, s, s^2, ..., s^6 with s = x^2
        self.m[0] = 1.0
        self.s = list(self.m)
        self.pq = np.empty((2, n))
        self.p, self.q = self.pq

    def shorter(self, k: int) -> "_Erf32Buffers":
        """Buffers for a last chunk of k < n elements (views of these)."""
        b = _Erf32Buffers.__new__(_Erf32Buffers)
        b.n, b.t, b.m = k, self.t[:k], self.m[:, :k]
        b.s = list(b.m)
        b.pq = np.empty((2, k))
        b.p, b.q = b.pq
        return b


def _erf32(ctx, x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """erf of a float32 array into the float32 array ``out`` of the same size."""
    flat = x.reshape(-1)
    target = out.reshape(-1)
    size = flat.size
    n = min(size, _ERF32_CHUNK)
    bufs = ctx.scratch.get("erf32 buffers")
    if bufs is None or bufs.n != n:
        bufs = ctx.scratch["erf32 buffers"] = _Erf32Buffers(n)
    mul = np.multiply
    for start in range(0, size, n):
        xc = flat[start:start + n]
        b = bufs if xc.size == n else bufs.shorter(xc.size)
        t, s = b.t, b.s
        t[...] = xc  # to float64
        t.clip(_ERF32_LO, _ERF32_HI, out=t)
        mul(t, t, out=s[1])
        mul(s[1], s[1], out=s[2])
        mul(s[1], s[2], out=s[3])
        mul(s[2], s[2], out=s[4])
        mul(s[1], s[4], out=s[5])
        mul(s[2], s[4], out=s[6])
        np.dot(_ERF32_PQ, b.m, out=b.pq)
        mul(b.p, t, out=b.p)
        np.divide(b.p, b.q, out=b.p)
        target[start:start + n] = b.p
    return out


@kernel("Erf", since=9, shape=same_as(0), writes_out=True)
def erf(ctx, x, out=None):
    if x.dtype == np.float32 and x.size:
        if out is not None and out[0].dtype == np.float32 and out[0].flags.c_contiguous:
            return _erf32(ctx, x, out[0])
        return _erf32(ctx, x, np.empty(x.shape, np.float32))
    # Integer inputs (allowed since opset 13) truncate toward zero like a C cast.
    return _erf_eval(x, x.dtype, False, _erf_degree(x.dtype))


@kernel("Gelu", since=20, shape=same_as(0))
def gelu(ctx, x):
    _check_float("Gelu", x)
    approximate = ctx.get("approximate", "none")
    if approximate == "none":
        # 0.5 * x * (1 + erf(x / sqrt(2))) == x * 0.5 * erfc(-x / sqrt(2)): no cancellation.
        return _erf_eval(x, x.dtype, True, _erf_degree(x.dtype),
                         scale=-1.0 / math.sqrt(2.0), gelu=True)
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
        return _done(inner, x)
    raise KernelError(f"Gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


@kernel("Gelu", since=1, domain="nncc", shape=same_as(0))
def nncc_gelu(ctx, x):
    """nncc::Gelu: ONNX Gelu (which needs opset 20) at any opset, for the GELU a graph spells
    out in elementwise ops after a product nncc does not fuse it into (passes/fusion.py)."""
    return gelu(ctx, x)


# The activations passes/fusion.py recognises in their spelled-out forms, as nncc ops for
# models whose opset predates the ONNX op (HardSwish: 14, Mish: 18; SiLU is ONNX Swish, 24).


@kernel("HardSwish", since=1, domain="nncc", shape=same_as(0))
def nncc_hard_swish(ctx, x):
    """nncc::HardSwish: ONNX HardSwish, x * max(0, min(1, x / 6 + 1 / 2)), at any opset."""
    return hard_swish(ctx, x)


@kernel("Mish", since=1, domain="nncc", shape=same_as(0))
def nncc_mish(ctx, x):
    """nncc::Mish: ONNX Mish, x * tanh(softplus(x)), at any opset."""
    return mish(ctx, x)


@kernel("Silu", since=1, domain="nncc", shape=same_as(0))
def nncc_silu(ctx, x):
    """nncc::Silu: x * sigmoid(x) (ONNX Swish with alpha 1), at any opset."""
    _check_float("Silu", x)
    return _done(_swish(_work(x), 1.0), x)


# --------------------------------------------------------------------------- Softmax family


def _softmax_shape(ctx, x):
    if x.shape is not None:
        default = -1 if ctx.opset >= 13 else 1
        rank = len(x.shape)
        axis = ctx.get("axis", default)
        # opset < 13 coerces to 2-D, where axis == rank is allowed (a [N, 1] view).
        limit = rank + 1 if ctx.opset < 13 else rank
        if not -rank <= axis < max(limit, 1):
            raise ShapeInferenceError(f"axis {axis} is out of range for rank {rank}")
    return [TensorInfo(x.dtype, x.shape)]


def _softmax_rows(w2: np.ndarray, log: bool) -> np.ndarray:
    """(Log-)softmax of each row of a C-contiguous float32/float64 matrix."""
    # fmax.reduce skips NaN, but a NaN then reaches the row's sum, so the row is still NaN.
    y = np.subtract(w2, np.fmax.reduce(w2, axis=1, keepdims=True))
    if log:
        s = row_sums(np.exp(y))
        np.log(s, out=s)
        y -= s[:, None]
        return y
    np.exp(y, out=y)
    s = row_sums(y)
    np.divide(y.dtype.type(1), s, out=s)
    y *= s[:, None]
    return y


def _softmax_axis(w: np.ndarray, axis: int, log: bool) -> np.ndarray:
    """Numerically stable (log-)softmax of w along one axis; w is float32/float64."""
    if axis == w.ndim - 1 and w.flags.c_contiguous:
        n = w.shape[-1]
        return _softmax_rows(w.reshape(-1, n), log).reshape(w.shape)
    y = np.subtract(w, np.max(w, axis=axis, keepdims=True))
    if log:
        s = np.exp(y).sum(axis=axis, keepdims=True)
        np.log(s, out=s)
        y -= s
        return y
    np.exp(y, out=y)
    y /= y.sum(axis=axis, keepdims=True)
    return y


class _SoftmaxPlan:
    """A (Log)Softmax node's parameters for one input shape/dtype: ``rows`` x ``cols`` is
    the row-major matrix whose rows are normalized, when the fast path applies."""

    __slots__ = ("key", "rows", "cols", "ones")

    def __init__(self, ctx, key, x, log: bool, coerce_2d: bool):
        _check_float("LogSoftmax" if log else "Softmax", x)
        rank = x.ndim
        self.key = key
        self.rows = None  # no fast path
        if coerce_2d:
            axis = ctx.get("axis", 1)
            if not -rank <= axis <= rank:
                raise KernelError(f"axis {axis} is out of range for rank {rank}")
            axis = axis + rank if axis < 0 else axis
        else:
            axis = ctx.get("axis", -1)
            if not -rank <= axis < max(rank, 1):
                raise KernelError(f"axis {axis} is out of range for rank {rank}")
            axis = axis + rank if axis < 0 else axis
            if axis != rank - 1:
                return
        if x.dtype in (np.float32, np.float64) and x.size > 0 and rank > 0:
            self.rows = math.prod(x.shape[:axis])
            self.cols = math.prod(x.shape[axis:])
            self.ones = np.ones((self.cols, 1), x.dtype)  # row sums by one BLAS product


def _softmax(ctx, x, log: bool, coerce_2d: bool, out=None):
    key = (x.shape, x.dtype)
    plan = ctx.scratch.get("softmax plan")
    if plan is None or plan.key != key:
        plan = ctx.scratch["softmax plan"] = _SoftmaxPlan(ctx, key, x, log, coerce_2d)
    if plan.rows is None:
        return _softmax_general(ctx, x, log, coerce_2d)
    return _softmax_rows_planned(plan, x, log, out)


def _softmax_rows_planned(plan: _SoftmaxPlan, x, log: bool, out):
    """The fast path: ``x`` as the plan's rows x cols matrix, each row normalized."""
    x2 = x.reshape(plan.rows, plan.cols)
    target = out[0] if out is not None else None
    # fmax.reduce skips NaN, but a NaN then reaches the row's sum, so the row is still NaN.
    peak = np.fmax.reduce(x2, axis=1, keepdims=True)
    if target is not None and target.dtype == x.dtype and target.flags.c_contiguous:
        y = np.subtract(x2, peak, out=target.reshape(plan.rows, plan.cols))
    else:
        target = None
        y = np.subtract(x2, peak)
    if log:
        s = np.dot(np.exp(y), plan.ones)
        np.log(s, out=s)
        y -= s
    else:
        np.exp(y, out=y)
        s = np.dot(y, plan.ones)  # (rows, 1)
        np.reciprocal(s, out=s)
        y *= s
    return target if target is not None else y.reshape(x.shape)


def _softmax_narrow(x: np.ndarray, axis: int) -> np.ndarray:
    """Softmax of a float16/bfloat16 tensor as its defining function body computes it, each
    node in the tensor's own type: the difference from the row's maximum, its exponential,
    the row sum and the quotient are each rounded to the type. ONNX's stored results for
    these types are made this way (numpy sums float16 in float32 and rounds once; ml_dtypes
    adds bfloat16 one rounded addition at a time), and so are those of expanded graphs that
    hold a Softmax node; widening the whole computation and rounding once differs from them
    by an ulp."""
    y = np.exp(x - np.max(x, axis=axis, keepdims=True))
    y /= y.sum(axis=axis, keepdims=True)
    return y


def _softmax_general(ctx, x, log: bool, coerce_2d: bool):
    rank = x.ndim
    narrow = x.dtype == np.float16 or x.dtype.name == "bfloat16"
    if narrow and not log and x.size > 0 and rank > 0:
        axis = ctx.get("axis", 1 if coerce_2d else -1)
        axis = axis + rank if axis < 0 else axis
        if coerce_2d:
            return _softmax_narrow(x.reshape(math.prod(x.shape[:axis]), -1), 1).reshape(x.shape)
        return _softmax_narrow(x, axis)
    w = _work(x)
    if coerce_2d:
        axis = ctx.get("axis", 1)
        axis = axis + rank if axis < 0 else axis
        n = math.prod(x.shape[:axis])
        d = math.prod(x.shape[axis:])
        if x.size == 0:
            return x.copy()
        y = _softmax_rows(np.ascontiguousarray(w).reshape(n, d), log).reshape(x.shape)
    else:
        axis = ctx.get("axis", -1)
        if rank == 0:
            y = _softmax_axis(w.reshape(1), 0, log).reshape(())
        elif x.size == 0:
            return x.copy()
        else:
            y = _softmax_axis(w, axis + rank if axis < 0 else axis, log)
    return _done(y, x)


def _softmax_prepare(log: bool, coerce_2d: bool):
    """(Log)Softmax's first phase: with a static input, the plan made once; a run is then
    the fast path alone (or None: the general kernel)."""

    def prepare(ctx, x):
        like = stand_ins(x)
        if like is None:
            return None
        plan = _SoftmaxPlan(ctx, (x.shape, x.dtype), like[0], log, coerce_2d)
        if plan.rows is None:
            return None

        def softmax_prepared(ctx, x, out=None):
            return _softmax_rows_planned(plan, x, log, out)

        return softmax_prepared

    return prepare


@kernel("Softmax", since=1, shape=_softmax_shape, writes_out=True, prepare=_softmax_prepare(False, True))
def softmax_v1(ctx, x, out=None):
    return _softmax(ctx, x, False, True, out)


@kernel("Softmax", since=13, shape=_softmax_shape, writes_out=True, prepare=_softmax_prepare(False, False))
def softmax_v13(ctx, x, out=None):
    return _softmax(ctx, x, False, False, out)


@kernel("LogSoftmax", since=1, shape=_softmax_shape, writes_out=True, prepare=_softmax_prepare(True, True))
def log_softmax_v1(ctx, x, out=None):
    return _softmax(ctx, x, True, True, out)


@kernel("LogSoftmax", since=13, shape=_softmax_shape, writes_out=True, prepare=_softmax_prepare(True, False))
def log_softmax_v13(ctx, x, out=None):
    return _softmax(ctx, x, True, False, out)


# --------------------------------------------------------------------------- Hardmax


@kernel("Hardmax", since=1, shape=_softmax_shape)
def hardmax_v1(ctx, x):
    # Before opset 13 the input is coerced to 2-D at `axis` (default 1) and the maximum
    # taken over each whole row.
    _check_float("Hardmax", x)
    rank = x.ndim
    axis = ctx.get("axis", 1)
    if not -rank <= axis <= rank:
        raise KernelError(f"Hardmax: axis {axis} is out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    rows = math.prod(x.shape[:axis])
    return _hardmax_rows(x.reshape(rows, -1) if x.size else x, 1).reshape(x.shape)


@kernel("Hardmax", since=13, shape=_softmax_shape)
def hardmax_v13(ctx, x):
    _check_float("Hardmax", x)
    rank = x.ndim
    axis = ctx.get("axis", -1)
    if not -rank <= axis < max(rank, 1):
        raise KernelError(f"Hardmax: axis {axis} is out of range for rank {rank}")
    if rank == 0:
        return np.ones((), x.dtype)
    return _hardmax_rows(x, axis + rank if axis < 0 else axis)


def _hardmax_rows(x: np.ndarray, axis: int) -> np.ndarray:
    """1 at the first maximum along ``axis`` (a NaN counts as the maximum), 0 elsewhere."""
    y = np.zeros(x.shape, x.dtype)
    if x.size:
        first = np.argmax(x, axis=axis, keepdims=True)
        np.put_along_axis(y, first, x.dtype.type(1), axis=axis)
    return y


# --------------------------------------------------------------------------- more elementwise


@kernel("Softsign", since=1, shape=same_as(0))
def softsign(ctx, x):
    _check_float("Softsign", x)
    w = _work(x)
    d = np.abs(w)
    d += w.dtype.type(1)
    return _done(np.divide(w, d, out=d), x)


@kernel("ThresholdedRelu", since=10, shape=same_as(0))
def thresholded_relu(ctx, x):
    _check_float("ThresholdedRelu", x)
    w = _work(x)
    alpha = w.dtype.type(ctx.get("alpha", 1.0))
    return _done(np.where(w > alpha, w, w.dtype.type(0)), x)


@kernel("Shrink", since=9, shape=same_as(0))
def shrink(ctx, x):
    if x.dtype.kind not in "iu" and not is_float(x.dtype):
        raise KernelError(f"Shrink expects a numeric input, got {x.dtype}")
    # Integers are shifted by the float bias and truncated toward zero, as onnxruntime does.
    w = x.astype(np.float64) if x.dtype.kind in "iu" else _work(x)
    lambd = float(ctx.get("lambd", 0.5))
    bias = w.dtype.type(ctx.get("bias", 0.0))
    y = np.where(w < -lambd, w + bias, np.where(w > lambd, w - bias, w.dtype.type(0)))
    with np.errstate(invalid="ignore"):  # integers out of range wrap like any numpy cast
        return _done(y, x)


def _celu(w: np.ndarray, alpha: float) -> np.ndarray:
    # max(0, x) + min(0, alpha * (exp(x / alpha) - 1)); the second term is
    # alpha * expm1(min(x, 0) / alpha) for alpha > 0.
    t = w.dtype.type
    y = _neg_part(w)
    y /= t(alpha)
    np.expm1(y, out=y)
    y *= t(alpha)
    y += _pos_part(w)
    return y


@kernel("Celu", since=12, shape=same_as(0))
def celu(ctx, x):
    _check_float("Celu", x)
    alpha = float(ctx.get("alpha", 1.0))
    if alpha == 0:
        raise KernelError("Celu: alpha must not be 0")
    w = _work(x)
    if alpha < 0:  # outside the usual range: the formula as written
        with np.errstate(over="ignore"):
            t = w.dtype.type
            y = _pos_part(w) + np.minimum(t(0), t(alpha) * np.expm1(w / t(alpha)))
        return _done(y, x)
    with np.errstate(over="ignore"):
        return _done(_celu(w, alpha), x)


@kernel("Mish", since=18, shape=same_as(0))
def mish(ctx, x):
    _check_float("Mish", x)
    w = _work(x)
    y = _softplus(w)
    np.tanh(y, out=y)
    y *= w
    return _done(y, x)


def _swish(w: np.ndarray, alpha: float) -> np.ndarray:
    """w * sigmoid(alpha * w); exp overflowing to inf gives the correct 0."""
    t = w.dtype.type
    y = np.multiply(w, t(-alpha))
    with np.errstate(over="ignore"):
        np.exp(y, out=y)
    y += t(1)
    return np.divide(w, y, out=y)


@kernel("Swish", since=24, shape=same_as(0))
def swish(ctx, x):
    _check_float("Swish", x)
    return _done(_swish(_work(x), float(ctx.get("alpha", 1.0))), x)


def _swiglu_shape(ctx, a, b):
    if a.shape is not None and b.shape is not None and len(a.shape) == len(b.shape):
        for da, db in zip(a.shape, b.shape):
            if isinstance(da, int) and isinstance(db, int) and da != db:
                raise ShapeInferenceError(
                    f"SwiGLU: A {a.describe()} and B {b.describe()} must have the same shape")
    elif a.shape is not None and b.shape is not None:
        raise ShapeInferenceError(
            f"SwiGLU: A {a.describe()} and B {b.describe()} must have the same shape")
    return [TensorInfo(a.dtype, a.shape if a.shape is not None else b.shape)]


@kernel("SwiGLU", since=28, shape=_swiglu_shape)
def swiglu(ctx, a, b):
    _check_float("SwiGLU", a)
    if a.shape != b.shape or a.dtype != b.dtype:
        raise KernelError(f"SwiGLU: A ({a.dtype}, {a.shape}) and B ({b.dtype}, {b.shape}) "
                          "must have the same dtype and shape")
    y = _swish(_work(a), float(ctx.get("alpha", 1.0)))
    y *= _work(b)
    return _done(y, a)
