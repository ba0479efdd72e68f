"""Reduction kernels: ReduceX, ArgMax/ArgMin, TopK, CumSum/CumProd.

ReduceX take `axes` as an attribute up to opset 12 (ReduceSum) / 17 (the others) and as an
optional int64 input from 13 / 18 on, where `noop_with_empty_axes` also appears. Outputs keep
the input dtype: integer sums/products accumulate in the input dtype (numpy would promote to
int64), float16 accumulates in float32. Reductions over an empty set give the ONNX identity
(0 for sums, 1 for products, -inf / the dtype minimum for max, +inf / maximum for min,
-inf for log-sum and log-sum-exp); ReduceMean of an empty set is NaN (ONNX leaves it undefined).
"""

from __future__ import annotations

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.arithmetic import is_float, register, row_sums
from nncc.kernels.shapes import known_value, normalize_axis

_INT64 = np.dtype(np.int64)


# --------------------------------------------------------------------------- axes handling


def norm_axes(axes, rank: int, error=KernelError) -> tuple[int, ...]:
    out = []
    for a in axes:
        a = int(a)
        if not -rank <= a < max(rank, 1):
            raise error(f"axis {a} is out of range for rank {rank}")
        a = a + rank if a < 0 else a
        if a in out:
            raise error(f"axis {a} appears twice in axes")
        out.append(a)
    return tuple(sorted(out))


def axes_from_input(axes: np.ndarray | None) -> list[int] | None:
    """None means 'no axes given' (omitted input or empty tensor)."""
    if axes is None:
        return None
    if axes.dtype.kind not in "iu":
        raise KernelError(f"axes must be an integer tensor, got {axes.dtype}")
    flat = axes.reshape(-1)
    return None if flat.size == 0 else [int(a) for a in flat]


def _reduced_shape(shape, axes, keepdims):
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _reduce_shape_attr(ctx, x):
    keepdims = ctx.get("keepdims", 1)
    axes = ctx.get("axes")
    if x.shape is None:
        if axes is None and not keepdims:
            return [TensorInfo(x.dtype, ())]
        return [TensorInfo(x.dtype, None)]
    rank = len(x.shape)
    axes = tuple(range(rank)) if not axes else norm_axes(axes, rank, ShapeInferenceError)
    return [TensorInfo(x.dtype, _reduced_shape(x.shape, axes, keepdims))]


def _reduce_shape_input(ctx, x, axes_info=None):
    keepdims = ctx.get("keepdims", 1)
    noop = ctx.get("noop_with_empty_axes", 0)
    if axes_info is None:
        axes = None
    else:
        value = known_value(axes_info)
        if value is None:
            # Axes unknown at compile time: keepdims keeps the rank; otherwise the rank is
            # known only from a static axes length.
            if x.shape is None:
                return [TensorInfo(x.dtype, None)]
            if keepdims:
                return [TensorInfo(x.dtype, tuple(1 if d == 1 else None for d in x.shape))]
            if axes_info.shape is not None and len(axes_info.shape) == 1 \
                    and isinstance(axes_info.shape[0], int):
                n = axes_info.shape[0]
                if n == 0:
                    return [TensorInfo(x.dtype, x.shape if noop else ())]
                return [TensorInfo(x.dtype, (None,) * max(len(x.shape) - n, 0))]
            return [TensorInfo(x.dtype, None)]
        try:
            axes = axes_from_input(np.asarray(value))
        except KernelError as exc:
            raise ShapeInferenceError(str(exc)) from exc
    if axes is None:
        if noop:
            return [TensorInfo(x.dtype, x.shape)]
        if x.shape is None:
            return [TensorInfo(x.dtype, None if keepdims else ())]
        axes = range(len(x.shape))
    if x.shape is None:
        return [TensorInfo(x.dtype, None)]
    axes = norm_axes(axes, len(x.shape), ShapeInferenceError)
    return [TensorInfo(x.dtype, _reduced_shape(x.shape, axes, keepdims))]


# --------------------------------------------------------------------------- the reductions


def _acc_dtype(x: np.ndarray) -> np.dtype:
    return np.dtype(np.float32) if x.dtype == np.float16 else x.dtype


def _cast(y, dtype) -> np.ndarray:
    y = np.asarray(y)
    return y if y.dtype == dtype else y.astype(dtype)


def _empty_fill(op: str, x: np.ndarray, out_shape) -> np.ndarray:
    dt = x.dtype
    if op in ("ReduceSum", "ReduceL1", "ReduceL2", "ReduceSumSquare"):
        value = 0
    elif op == "ReduceProd":
        value = 1
    elif op == "ReduceMean":
        value = np.nan if is_float(dt) else 0
    elif op in ("ReduceMax", "ReduceLogSumExp", "ReduceLogSum"):
        value = -np.inf if is_float(dt) else (False if dt.kind == "b" else np.iinfo(dt).min)
    elif op == "ReduceMin":
        value = np.inf if is_float(dt) else (True if dt.kind == "b" else np.iinfo(dt).max)
    else:  # pragma: no cover
        raise KernelError(f"{op}: no identity for an empty reduction")
    return np.full(out_shape, value, dtype=dt)


def _trailing_sum(x, axes, keepdims):
    """Sum over a trailing block of axes of a contiguous float32/float64 array as one BLAS
    matrix-vector product (numpy's reductions are slow for many short rows); else None."""
    if x.dtype not in (np.float32, np.float64) or not x.flags.c_contiguous:
        return None
    r = x.ndim
    if axes != tuple(range(r - len(axes), r)):
        return None
    inner = int(np.prod(x.shape[r - len(axes):], dtype=np.int64))
    rows = x.size // inner if inner else 0
    if rows < 8 or inner > 65536:
        return None
    return row_sums(x.reshape(rows, inner)).reshape(_reduced_shape(x.shape, axes, keepdims))


def _sum(x, axes, keepdims):
    fast = _trailing_sum(x, axes, keepdims)
    if fast is not None:
        return fast
    return _cast(np.sum(x, axis=axes, keepdims=keepdims, dtype=_acc_dtype(x)), x.dtype)


def _mean(x, axes, keepdims):
    if x.dtype.kind == "f":
        fast = _trailing_sum(x, axes, keepdims)
        if fast is not None:
            fast *= fast.dtype.type(fast.size / x.size)
            return fast
        return _cast(np.mean(x, axis=axes, keepdims=keepdims, dtype=_acc_dtype(x)), x.dtype)
    acc = np.uint64 if x.dtype.kind == "u" else np.int64
    s = np.sum(x, axis=axes, keepdims=keepdims, dtype=acc)
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    return _cast(np.trunc(s / n), x.dtype)


def _max(x, axes, keepdims):
    return np.max(x, axis=axes, keepdims=keepdims)


def _min(x, axes, keepdims):
    return np.min(x, axis=axes, keepdims=keepdims)


def _prod(x, axes, keepdims):
    return _cast(np.prod(x, axis=axes, keepdims=keepdims, dtype=_acc_dtype(x)), x.dtype)


def _l1(x, axes, keepdims):
    return _sum(np.abs(x), axes, keepdims)


def _sum_square(x, axes, keepdims):
    w = x.astype(_acc_dtype(x), copy=False)
    return _cast(_sum(w * w, axes, keepdims), x.dtype)


def _l2(x, axes, keepdims):
    w = x.astype(np.float64) if x.dtype.kind in "iu" else x.astype(_acc_dtype(x), copy=False)
    s = np.asarray(_sum(w * w, axes, keepdims))
    np.sqrt(s, out=s)
    return _cast(np.trunc(s) if x.dtype.kind in "iu" else s, x.dtype)


def _log_sum_exp(x, axes, keepdims):
    w = x.astype(np.float64) if x.dtype.kind in "iu" else x.astype(_acc_dtype(x), copy=False)
    m = np.max(w, axis=axes, keepdims=True)
    m[~np.isfinite(m)] = 0  # all -inf (or inf/NaN) rows: no shift, the result is then exact
    e = np.exp(w - m)
    s = np.sum(e, axis=axes, keepdims=True)
    with np.errstate(divide="ignore"):
        np.log(s, out=s)
    s += m
    if not keepdims:
        s = s.reshape(_reduced_shape(x.shape, axes, False))
    if x.dtype.kind in "iu":
        s = np.rint(s)  # onnxruntime rounds integer log-sum-exp to nearest
    return _cast(s, x.dtype)


def _log_sum(x, axes, keepdims):
    w = x.astype(np.float64) if x.dtype.kind in "iu" else x.astype(_acc_dtype(x), copy=False)
    s = np.asarray(_sum(w, axes, keepdims))
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.log(s)
    if x.dtype.kind in "iu":
        s = np.trunc(s)  # onnxruntime truncates an integer log-sum (it rounds log-sum-exp)
        s[~np.isfinite(s)] = 0  # log(0): no integer value; 0 rather than an undefined cast
    return _cast(s, x.dtype)


_REDUCERS = {
    "ReduceSum": _sum,
    "ReduceMean": _mean,
    "ReduceMax": _max,
    "ReduceMin": _min,
    "ReduceProd": _prod,
    "ReduceL1": _l1,
    "ReduceL2": _l2,
    "ReduceSumSquare": _sum_square,
    "ReduceLogSumExp": _log_sum_exp,
    "ReduceLogSum": _log_sum,
}


def _run(op: str, x: np.ndarray, axes, keepdims: int) -> np.ndarray:
    axes = tuple(range(x.ndim)) if axes is None else norm_axes(axes, x.ndim)
    keepdims = bool(keepdims)
    if any(x.shape[a] == 0 for a in axes):
        return _empty_fill(op, x, _reduced_shape(x.shape, axes, keepdims))
    if x.ndim == 0:
        x = x.reshape(1)
        out = _REDUCERS[op](x, (0,), False)
        return np.asarray(out).reshape(())
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(_REDUCERS[op](x, axes, keepdims))


def _make_reduce(op: str, input_since: int):
    def reduce_attr(ctx, x):
        axes = ctx.get("axes")
        return _run(op, x, axes if axes else None, ctx.get("keepdims", 1))

    def reduce_input(ctx, x, axes=None):
        axes = axes_from_input(axes)
        if axes is None and ctx.get("noop_with_empty_axes", 0):
            return x.copy()
        return _run(op, x, axes, ctx.get("keepdims", 1))

    name = op[len("Reduce"):].lower()
    reduce_attr.__name__ = f"reduce_{name}_v1"
    reduce_input.__name__ = f"reduce_{name}_v{input_since}"
    register(op, 1, _reduce_shape_attr)(reduce_attr)
    register(op, input_since, _reduce_shape_input)(reduce_input)


for _op in _REDUCERS:
    _make_reduce(_op, 13 if _op == "ReduceSum" else 18)


# --------------------------------------------------------------------------- ArgMax / ArgMin


def _arg_shape(ctx, x):
    keepdims = ctx.get("keepdims", 1)
    if x.shape is None:
        return [TensorInfo(_INT64, None)]
    axis = normalize_axis(ctx.get("axis", 0), len(x.shape))
    return [TensorInfo(_INT64, _reduced_shape(x.shape, (axis,), keepdims))]


def _arg(op: str, fn, ctx, x):
    if x.ndim == 0:
        raise KernelError(f"{op} needs an input of rank >= 1")
    axis = ctx.get("axis", 0)
    if not -x.ndim <= axis < x.ndim:
        raise KernelError(f"{op}: axis {axis} is out of range for rank {x.ndim}")
    axis = axis + x.ndim if axis < 0 else axis
    n = x.shape[axis]
    if n == 0:
        raise KernelError(f"{op}: cannot reduce an empty axis {axis} (shape {x.shape})")
    keepdims = bool(ctx.get("keepdims", 1))
    if ctx.get("select_last_index", 0):
        idx = fn(np.flip(x, axis), axis=axis, keepdims=keepdims)
        idx = np.subtract(n - 1, idx)
    else:
        idx = fn(x, axis=axis, keepdims=keepdims)
    return _cast(idx, _INT64)


@register("ArgMax", 1, _arg_shape)
def argmax(ctx, x):
    return _arg("ArgMax", np.argmax, ctx, x)


@register("ArgMin", 1, _arg_shape)
def argmin(ctx, x):
    return _arg("ArgMin", np.argmin, ctx, x)


# --------------------------------------------------------------------------- TopK


def _topk_shape_with(ctx, x, k):
    if x.shape is None:
        return [TensorInfo(x.dtype, None), TensorInfo(_INT64, None)]
    axis = normalize_axis(ctx.get("axis", -1), len(x.shape))
    dim = x.shape[axis]
    if k is not None:
        if k < 0:
            raise ShapeInferenceError(f"TopK: k must be >= 0, got {k}")
        if isinstance(dim, int) and k > dim:
            raise ShapeInferenceError(f"TopK: k = {k} exceeds the axis length {dim}")
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    return [TensorInfo(x.dtype, shape), TensorInfo(_INT64, shape)]


def _topk_shape_v1(ctx, x):
    k = ctx.get("k")
    if k is None:
        raise ShapeInferenceError("TopK: attribute k is required before opset 10")
    return _topk_shape_with(ctx, x, int(k))


def _topk_shape_v10(ctx, x, k):
    value = known_value(k)
    if value is not None:
        value = np.asarray(value).reshape(-1)
        if value.size != 1:
            raise ShapeInferenceError(f"TopK: K must hold one value, got shape {value.shape}")
        value = int(value[0])
    return _topk_shape_with(ctx, x, value)


def _order(vals: np.ndarray, largest: bool, k: int) -> np.ndarray:
    """Positions (along the last axis) of the first k of ``vals`` sorted best first, ties by
    lower position first. The fast (unstable) sort is used, and redone stably only when two
    equal values sit among the first k + 1 (where their order or membership matters)."""
    n = vals.shape[-1]
    kk = min(k + 1, n)

    def sort(kind):
        if largest:  # ascending sort of the reversed row, read backwards
            o = np.argsort(vals[..., ::-1], axis=-1, kind=kind)[..., : n - kk - 1 : -1] \
                if kk < n else np.argsort(vals[..., ::-1], axis=-1, kind=kind)[..., ::-1]
            return np.subtract(n - 1, o)
        return np.argsort(vals, axis=-1, kind=kind)[..., :kk]

    order = sort(None)
    head = np.take_along_axis(vals, order, axis=-1)
    if np.any(head[..., 1:] == head[..., :-1]):
        order = sort("stable")
    return order[..., :k]


def _topk_partition(x2: np.ndarray, k: int, largest: bool) -> np.ndarray | None:
    """Top-k positions of each row of a 2-D array in O(n): the k-th value from np.partition
    is a threshold; when exactly k elements per row pass it (no ties at the boundary) their
    positions come from one flatnonzero. Returns None when the boundary is tied."""
    m, n = x2.shape
    if largest:
        thr = np.partition(x2, n - k, axis=-1)[:, n - k : n - k + 1]
        sel = x2 >= thr
    else:
        thr = np.partition(x2, k - 1, axis=-1)[:, k - 1 : k]
        sel = x2 <= thr
    if np.count_nonzero(sel) != m * k:
        return None
    cand = np.flatnonzero(sel).reshape(m, k)
    cand -= (np.arange(m, dtype=cand.dtype) * n)[:, None]  # ascending position within each row
    vals = np.take_along_axis(x2, cand, axis=-1)
    return np.take_along_axis(cand, _order(vals, largest, k), axis=-1)


def _topk(ctx, x: np.ndarray, k: int, largest: bool):
    if x.ndim == 0:
        raise KernelError("TopK needs an input of rank >= 1")
    axis = ctx.get("axis", -1)
    if not -x.ndim <= axis < x.ndim:
        raise KernelError(f"TopK: axis {axis} is out of range for rank {x.ndim}")
    axis = axis + x.ndim if axis < 0 else axis
    n = x.shape[axis]
    if k < 0 or k > n:
        raise KernelError(f"TopK: k = {k} must be in [0, {n}] (axis {axis} of shape {x.shape})")
    xm = np.moveaxis(x, axis, -1)
    lead = xm.shape[:-1]
    if k == 0 or xm.size == 0:
        idx = np.zeros(lead + (k,), np.int64)
    else:
        m = int(np.prod(lead, dtype=np.int64))
        use_partition = n >= 64 and 4 * k <= n
        if use_partition and x.dtype.kind == "f" and np.isnan(xm).any():
            use_partition = False  # NaN ordering: leave it to the sort (NaN as largest)
        idx = _topk_partition(xm.reshape(m, n), k, largest) if use_partition else None
        idx = _order(xm, largest, k) if idx is None else idx.reshape(lead + (k,))
    vals = np.take_along_axis(xm, idx, axis=-1)
    idx = _cast(idx, _INT64)
    return (np.ascontiguousarray(np.moveaxis(vals, -1, axis)),
            np.ascontiguousarray(np.moveaxis(idx, -1, axis)))


@register("TopK", 1, _topk_shape_v1)
def topk_v1(ctx, x):
    k = ctx.get("k")
    if k is None:
        raise KernelError("TopK: attribute k is required before opset 10")
    return _topk(ctx, x, int(k), True)


@register("TopK", 10, _topk_shape_v10)
def topk_v10(ctx, x, k):
    k = np.asarray(k).reshape(-1)
    if k.size != 1:
        raise KernelError(f"TopK: K must hold one value, got shape {k.shape}")
    largest = ctx.get("largest", 1)
    # `sorted`=0 leaves the order unspecified; a sorted result is a valid answer.
    return _topk(ctx, x, int(k[0]), bool(largest))


# --------------------------------------------------------------------------- CumSum / CumProd


def _cumulative_shape(op: str):
    def shape(ctx, x, axis):
        value = known_value(axis)
        if value is not None and x.shape is not None:
            value = np.asarray(value).reshape(-1)
            if value.size != 1:
                raise ShapeInferenceError(f"{op}: axis must hold one value, got shape {value.shape}")
            normalize_axis(int(value[0]), len(x.shape))
        return [TensorInfo(x.dtype, x.shape)]

    return shape


# name -> (element-wise ufunc, its identity, numpy's running version)
_CUMULATIVE = {"CumSum": (np.add, 0, np.cumsum), "CumProd": (np.multiply, 1, np.cumprod)}


def _cumulative(op: str, ctx, x, axis):
    a = np.asarray(axis).reshape(-1)
    if a.size != 1 or a.dtype.kind not in "iu":
        raise KernelError(f"{op}: axis must be one integer, got {a.dtype} of shape {np.shape(axis)}")
    if x.ndim == 0:
        raise KernelError(f"{op} needs an input of rank >= 1")
    ax = int(a[0])
    if not -x.ndim <= ax < x.ndim:
        raise KernelError(f"{op}: axis {ax} is out of range for rank {x.ndim}")
    ax = ax + x.ndim if ax < 0 else ax
    reverse = bool(ctx.get("reverse", 0))
    exclusive = bool(ctx.get("exclusive", 0))
    acc = _acc_dtype(x)
    n = x.shape[ax]
    with np.errstate(over="ignore", invalid="ignore"):
        if n and x.size // n >= 64 and n <= 4096:
            out = _cumulative_steps(op, x, ax, acc, reverse, exclusive)
        else:
            out = _cumulative_numpy(op, x, ax, acc, reverse, exclusive)
    return _cast(out, x.dtype)


@register("CumSum", 11, _cumulative_shape("CumSum"))
def cumsum(ctx, x, axis):
    return _cumulative("CumSum", ctx, x, axis)


@register("CumProd", 26, _cumulative_shape("CumProd"))
def cumprod(ctx, x, axis):
    return _cumulative("CumProd", ctx, x, axis)


def _cumulative_steps(op, x, ax, acc, reverse, exclusive):
    """One vectorized operation per position along the axis: numpy's cumsum runs element
    by element, far slower when the other axes are wide. Same accumulation order."""
    fn, identity, _ = _CUMULATIVE[op]
    out = np.empty(x.shape, acc)
    src = np.moveaxis(x, ax, 0)
    dst = np.moveaxis(out, ax, 0)
    n = src.shape[0]
    steps = range(n - 1, -1, -1) if reverse else range(n)
    prev = None
    for i in steps:
        if prev is None:
            if exclusive:
                dst[i] = identity
            else:
                dst[i] = src[i]
        elif exclusive:
            fn(dst[prev], src[prev], out=dst[i])
        else:
            fn(dst[prev], src[i], out=dst[i])
        prev = i
    return out


def _cumulative_numpy(op, x, ax, acc, reverse, exclusive):
    _, identity, running = _CUMULATIVE[op]
    src = np.flip(x, ax) if reverse else x
    if exclusive:
        out = np.full(x.shape, identity, acc)
        if x.shape[ax] > 1:
            head = [slice(None)] * x.ndim
            tail = [slice(None)] * x.ndim
            head[ax] = slice(1, None)
            tail[ax] = slice(None, -1)
            running(src[tuple(tail)], axis=ax, dtype=acc, out=out[tuple(head)])
    else:
        out = running(src, axis=ax, dtype=acc)
    if reverse:
        out = np.ascontiguousarray(np.flip(out, ax))
    return out
