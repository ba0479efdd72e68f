"""Arithmetic kernels: binary/variadic elementwise math with broadcasting, unary math.

Outputs keep the input dtype exactly (ONNX ties the operands to one type T; Pow's exponent
may differ from 12 on and the result has the base's dtype). Integer Div truncates toward
zero like C, as ONNX specifies. Opsets < 7 use the legacy `broadcast`/`axis` attributes,
where B is aligned with A starting at `axis`.

Shape functions of these (cheap) elementwise ops also propagate small compile-time values
(e.g. shape arithmetic such as Shape -> Gather -> Mul -> Concat -> Reshape), computed by the
kernel itself on the known inputs.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from nncc.errors import KernelError, NnccError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import kernel
from nncc.kernels.shapes import broadcast

# Largest known input (elements) for which shape functions compute the output's value.
VALUE_LIMIT = 64


# --------------------------------------------------------------------------- shared helpers
# (also imported by logic.py and reduce.py, which belong to the same family)


def with_value(shape_fn: Callable, kernel_fn: Callable, limit: int = VALUE_LIMIT) -> Callable:
    """Wrap a shape function so it also sets ``value`` when every present input's value is
    known and small: the kernel runs on those values (nearly free)."""

    def shape(ctx, *infos):
        outs = shape_fn(ctx, *infos)
        present = [i for i in infos if i is not None]
        if not present or any(i.value is None or np.size(i.value) > limit for i in present):
            return outs
        try:
            with np.errstate(all="ignore"):
                res = kernel_fn(ctx, *(None if i is None else np.asarray(i.value) for i in infos))
        except (NnccError, ValueError, TypeError, IndexError, ArithmeticError):
            return outs
        res = res if isinstance(res, tuple) else (res,)
        done = []
        for info, r in zip(outs, res):
            r = np.asarray(r)
            if info.dtype == r.dtype and (info.shape is None or len(info.shape) == r.ndim):
                info = TensorInfo(info.dtype, tuple(r.shape), r)
            done.append(info)
        return done + list(outs[len(done):])

    return shape


def register(op: str, since: int, shape_fn: Callable, *, value: bool = True,
             writes_out: bool = False) -> Callable:
    """``@kernel`` whose shape function also propagates small known values."""

    def deco(fn):
        kernel(op, since, shape=with_value(shape_fn, fn) if value else shape_fn,
               writes_out=writes_out)(fn)
        return fn

    return deco


def legacy_axis(ctx, rank_a: int | None) -> int | None:
    """Opset < 7 `broadcast=1` with an explicit `axis`: where B's dims start inside A."""
    if not ctx.get("broadcast", 0):
        return None
    axis = ctx.get("axis")
    if axis is None or rank_a is None:
        return None
    if not -rank_a <= axis < max(rank_a, 1):
        raise ShapeInferenceError(f"legacy broadcast axis {axis} is out of range for rank {rank_a}")
    return axis + rank_a if axis < 0 else axis


def legacy_align(ctx, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Reshape B for opset < 7 broadcasting (B's shape is a contiguous run of A's from
    `axis`); without `axis`, suffix matching is numpy broadcasting already."""
    try:
        axis = legacy_axis(ctx, a.ndim)
    except ShapeInferenceError as exc:
        raise KernelError(str(exc)) from exc
    if axis is None or b.ndim == 0:
        return b
    pad = a.ndim - axis - b.ndim
    if pad < 0:
        raise KernelError(f"legacy broadcast: B of shape {b.shape} does not fit A {a.shape} at axis {axis}")
    return b.reshape(b.shape + (1,) * pad) if pad else b


def binary_shape(dtype=None) -> Callable:
    """Multidirectional broadcast of two (or more) inputs; dtype of A unless given."""

    def shape(ctx, *infos):
        present = [i for i in infos if i is not None]
        out_dtype = np.dtype(dtype) if dtype is not None else present[0].dtype
        return [TensorInfo(out_dtype, broadcast(*(i.shape for i in present)))]

    return shape


def legacy_binary_shape(dtype=None) -> Callable:
    """Opset < 7: with broadcast=1, B is broadcast to A (output has A's shape)."""

    def shape(ctx, a, b):
        out_dtype = np.dtype(dtype) if dtype is not None else a.dtype
        if ctx.get("broadcast", 0):
            axis = legacy_axis(ctx, a.rank)
            if axis is not None and b.shape is not None and a.shape is not None:
                if a.rank - axis - len(b.shape) < 0:
                    raise ShapeInferenceError(
                        f"legacy broadcast: B {b.describe()} does not fit A {a.describe()} at axis {axis}")
            if a.shape is None:
                return [TensorInfo(out_dtype, None)]
            if axis is None and b.shape is not None:
                return [TensorInfo(out_dtype, broadcast(a.shape, b.shape))]
            return [TensorInfo(out_dtype, a.shape)]
        return [TensorInfo(out_dtype, broadcast(a.shape, b.shape))]

    return shape


def check_same_dtype(op: str, a: np.ndarray, b: np.ndarray) -> None:
    # Strings may arrive as numpy str arrays of different widths or as object arrays.
    if a.dtype != b.dtype and not (a.dtype.kind in "USO" and b.dtype.kind in "USO"):
        raise KernelError(f"{op}: inputs must have the same dtype, got {a.dtype} and {b.dtype}")


def _broadcast_or_raise(op: str, fn, a, b, **kw):
    try:
        return fn(a, b, **kw)
    except ValueError as exc:
        raise KernelError(f"{op}: cannot broadcast shapes {a.shape} and {b.shape}") from exc


def is_float(dtype: np.dtype) -> bool:
    """A floating-point dtype, counting ml_dtypes' bfloat16 (whose numpy kind is 'V')."""
    return dtype.kind == "f" or dtype.name == "bfloat16"


def widened(x: np.ndarray) -> np.ndarray:
    """The array to compute a float function on: float16 and bfloat16 become float32
    (the caller rounds the result back once)."""
    return x if x.dtype.kind == "f" and x.dtype.itemsize >= 4 else x.astype(np.float32)


_ONES: dict[tuple[int, np.dtype], np.ndarray] = {}


def row_sums(a2: np.ndarray) -> np.ndarray:
    """Sums of the rows of a C-contiguous float32/float64 matrix as a BLAS matrix-vector
    product: much faster than np.sum for short rows (numpy's per-row overhead)."""
    key = (a2.shape[1], a2.dtype)
    ones = _ONES.get(key)
    if ones is None:
        if len(_ONES) > 64:
            _ONES.clear()
        ones = _ONES[key] = np.ones(a2.shape[1], a2.dtype)
        ones.flags.writeable = False
    return a2 @ ones


# --------------------------------------------------------------------------- Add/Sub/Mul/Div


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "i" and b.dtype.kind == "i":
        # C-style truncation: r = fmod(a, b) has a's sign, so (a - r) / b is exact.
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            r = np.fmod(a, b)
            q = np.asarray(np.subtract(a, r))  # 0-d operands give a numpy scalar: not writable
            np.floor_divide(q, b, out=q)
        return q
    if a.dtype.kind in "ub":
        with np.errstate(divide="ignore"):
            return np.floor_divide(a, b)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.divide(a, b)


_BINARY = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": _div,
}


def _quiet_divisor(ctx, b: np.ndarray) -> bool:
    """Whether float division by ``b`` can raise no floating-point error (every entry finite
    with |b| >= 1: no division by zero, no overflow, no invalid operation), so numpy's error
    state need not be changed around it. Decided once for a plan constant."""
    known = ctx.scratch.get("quiet divisor")
    if known is not None and known[0] is b and ctx.is_constant(1):
        return known[1]
    if not ctx.is_constant(1) or b.size > 64:
        return False
    with np.errstate(invalid="ignore"):
        quiet = bool(np.all(np.abs(b) >= 1) and np.all(np.isfinite(b)))
    ctx.scratch["quiet divisor"] = (b, quiet)
    return quiet


def _make_binary(op: str, fn):
    def binary_v7(ctx, a, b, out=None):
        if a.dtype != b.dtype:
            check_same_dtype(op, a, b)
        try:
            if fn is not _div:
                if out is None:
                    return fn(a, b)
                with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                    return fn(a, b, out=out[0])
            if a.dtype.kind not in "fc":
                return _div(a, b)
            if _quiet_divisor(ctx, b):
                return np.divide(a, b) if out is None else np.divide(a, b, out=out[0])
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                return np.divide(a, b) if out is None else np.divide(a, b, out=out[0])
        except ValueError as exc:
            raise KernelError(f"{op}: cannot broadcast shapes {a.shape} and {b.shape}") from exc

    def binary_v1(ctx, a, b):
        check_same_dtype(op, a, b)
        return _broadcast_or_raise(op, fn, a, legacy_align(ctx, a, b))

    binary_v1.__name__ = f"{op.lower()}_v1"
    binary_v7.__name__ = f"{op.lower()}_v7"
    register(op, 1, legacy_binary_shape())(binary_v1)
    register(op, 7, binary_shape(), writes_out=True)(binary_v7)


for _op, _fn in _BINARY.items():
    _make_binary(_op, _fn)


# --------------------------------------------------------------------------- Pow


def _int_pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Integer base and exponent; a negative exponent gives 1/x**|y| truncated (0 unless
    |x| == 1) instead of numpy's error."""
    y = y.astype(x.dtype, copy=False)
    if y.dtype.kind == "i" and (y < 0).any():
        neg = y < 0
        ypos = np.where(neg, 0, y)
        res = np.power(x, ypos)
        one = x.dtype.type(1)
        odd = (y & 1).astype(bool)
        inv = np.where(x == 1, one, np.where(x == -1, np.where(odd, x.dtype.type(-1), one), x.dtype.type(0)))
        return np.where(neg, inv, res)
    with np.errstate(over="ignore"):
        return np.power(x, y)


def _pow(x: np.ndarray, y: np.ndarray, e: float | None = None) -> np.ndarray:
    """x ** y; ``e``: y's single value when already known."""
    if x.dtype.kind == "f":
        if y.size == 1 and y.ndim <= x.ndim:
            e = float(y.reshape(-1)[0]) if e is None else e
            if e == 2.0:
                return np.multiply(x, x)
            if e == 1.0:
                return x.copy()
            if e == 0.5:
                with np.errstate(invalid="ignore"):
                    return np.sqrt(x)
            if e == 3.0:
                r = np.multiply(x, x)
                r *= x
                return r
        if y.dtype != x.dtype:
            y = y.astype(x.dtype)
        with np.errstate(all="ignore"):
            return np.power(x, y)
    if x.dtype.kind in "iu":
        if y.dtype.kind == "f":
            with np.errstate(all="ignore"):
                return np.power(x.astype(np.float64), y.astype(np.float64)).astype(x.dtype)
        return _int_pow(x, y)
    raise KernelError(f"Pow: unsupported base dtype {x.dtype}")


@register("Pow", 1, legacy_binary_shape())
def pow_v1(ctx, x, y):
    return _broadcast_or_raise("Pow", _pow, x, legacy_align(ctx, x, y))


@register("Pow", 7, binary_shape())
def pow_v7(ctx, x, y):
    # A constant one-element exponent is read once.
    known = ctx.scratch.get("pow exponent")
    if known is not None and known[0] is y and ctx.is_constant(1):
        e = known[1]
    elif y.size == 1 and ctx.is_constant(1) and y.dtype.kind in "fiu":
        e = float(y.reshape(-1)[0])
        ctx.scratch["pow exponent"] = (y, e)
    else:
        e = None
    return _broadcast_or_raise("Pow", _pow, x, y, e=e)


# --------------------------------------------------------------------------- Mod


@register("Mod", 10, binary_shape())
def mod(ctx, a, b):
    check_same_dtype("Mod", a, b)
    fmod = ctx.get("fmod", 0)
    if fmod not in (0, 1):
        raise KernelError(f"Mod: fmod must be 0 or 1, got {fmod}")
    fn = np.fmod if fmod else np.mod
    with np.errstate(divide="ignore", invalid="ignore"):
        return _broadcast_or_raise("Mod", fn, a, b)


# --------------------------------------------------------------------------- unary


def _same(ctx, x):
    return [TensorInfo(x.dtype, x.shape)]


def _float_only(op: str, x: np.ndarray) -> None:
    if x.dtype.kind != "f":
        raise KernelError(f"{op} expects a floating-point input, got {x.dtype}")


@register("Neg", 1, _same)
def neg(ctx, x):
    return np.negative(x)


@register("Abs", 1, _same)
def abs_(ctx, x):
    return np.abs(x)


@register("Sqrt", 1, _same)
def sqrt(ctx, x):
    _float_only("Sqrt", x)
    with np.errstate(invalid="ignore"):
        return np.sqrt(x)


@register("Exp", 1, _same)
def exp(ctx, x):
    _float_only("Exp", x)
    with np.errstate(over="ignore", under="ignore"):
        return np.exp(x)


@register("Log", 1, _same)
def log(ctx, x):
    _float_only("Log", x)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(x)


@register("Reciprocal", 1, _same)
def reciprocal(ctx, x):
    _float_only("Reciprocal", x)
    with np.errstate(divide="ignore", over="ignore"):
        return np.reciprocal(x)


@register("Floor", 1, _same)
def floor(ctx, x):
    _float_only("Floor", x)
    return np.floor(x)


@register("Ceil", 1, _same)
def ceil(ctx, x):
    _float_only("Ceil", x)
    return np.ceil(x)


@register("Round", 11, _same)
def round_(ctx, x):
    _float_only("Round", x)
    return np.rint(x)  # halves go to the even neighbour, as ONNX specifies


@register("Sign", 9, _same)
def sign(ctx, x):
    if x.dtype.kind not in "fiu":
        raise KernelError(f"Sign expects a numeric input, got {x.dtype}")
    return np.sign(x)  # NaN stays NaN


# --------------------------------------------------------------------------- variadic


def _variadic_shape(ctx, *infos):
    if not infos or any(i is None for i in infos):
        raise ShapeInferenceError("variadic op needs at least one input and no omitted ones")
    return binary_shape()(ctx, *infos)


def _fold(op: str, fn, arrays, target=None) -> np.ndarray:
    if not arrays:
        raise KernelError(f"{op} needs at least one input")
    first = arrays[0]
    for a in arrays[1:]:
        check_same_dtype(op, first, a)
    if len(arrays) == 1:
        if target is not None:
            np.copyto(target, first)
            return target
        return first.copy()
    if target is not None:
        out = _broadcast_or_raise(op, fn, arrays[0], arrays[1], out=target)
    else:
        out = _broadcast_or_raise(op, fn, arrays[0], arrays[1])
    for a in arrays[2:]:
        if np.broadcast_shapes(out.shape, a.shape) == out.shape:
            fn(out, a, out=out)  # accumulate in place into our own fresh array
        else:
            out = _broadcast_or_raise(op, fn, out, a)
    return out


@register("Sum", 1, _variadic_shape, writes_out=True)
def sum_(ctx, *arrays, out=None):
    return _fold("Sum", np.add, arrays, None if out is None else out[0])


@register("Mean", 1, _variadic_shape)
def mean(ctx, *arrays):
    out = _fold("Mean", np.add, arrays)
    n = len(arrays)
    if out.dtype.kind == "f":
        out /= out.dtype.type(n)
        return out
    return (out // n).astype(out.dtype)


@register("Max", 1, _variadic_shape)
def max_(ctx, *arrays):
    return _fold("Max", np.maximum, arrays)


@register("Min", 1, _variadic_shape)
def min_(ctx, *arrays):
    return _fold("Min", np.minimum, arrays)
