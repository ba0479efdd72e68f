"""Pooling kernels: MaxPool (with optional Indices), AveragePool, GlobalAveragePool, GlobalMaxPool.

Windows are reduced with a loop over kernel taps only: each tap is one strided slice of
the padded input (a view), combined into the output with one vectorized ufunc call.
Average-pool divisors are separable (a product of per-axis counts), so they are computed
per axis and broadcast.
"""

from __future__ import annotations

import itertools

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.conv import _attr_list, _auto_pad, _conv_geometry, _pad_spatial, _scratch, _tap_slices
from nncc.kernels.registry import kernel


def _pool_params(ctx, x_shape, what, err):
    nd = len(x_shape) - 2
    kernel_shape = ctx.get("kernel_shape")
    if kernel_shape is None:
        raise err(f"{what}: attribute 'kernel_shape' is required")
    kernel_shape = [int(k) for k in kernel_shape]
    if len(kernel_shape) != nd:
        raise err(f"{what}: kernel_shape {kernel_shape} does not match the input's {nd} spatial axes")
    if any(k <= 0 for k in kernel_shape):
        raise err(f"{what}: kernel_shape {kernel_shape} must be positive")
    strides = _attr_list(ctx, "strides", nd, 1, what, err)
    dilations = _attr_list(ctx, "dilations", nd, 1, what, err)
    pads = ctx.get("pads")
    if pads is None:
        pb, pe = [0] * nd, [0] * nd
    else:
        pads = [int(p) for p in pads]
        if len(pads) != 2 * nd:
            raise err(f"{what}: attribute 'pads' has {len(pads)} values, expected {2 * nd}")
        if any(p < 0 for p in pads):
            raise err(f"{what}: pads must be non-negative, got {pads}")
        pb, pe = pads[:nd], pads[nd:]
        for i in range(nd):
            if pb[i] >= (kernel_shape[i] - 1) * dilations[i] + 1 or pe[i] >= (kernel_shape[i] - 1) * dilations[i] + 1:
                # A window entirely in the padding has no input element; ONNX Runtime rejects it too.
                raise err(f"{what}: pads {pads} must be smaller than the kernel extent along each axis")
    auto_pad = _auto_pad(ctx, what, err)
    ceil_mode = bool(ctx.get("ceil_mode", 0))
    return nd, kernel_shape, strides, dilations, pb, pe, auto_pad, ceil_mode


def _pool_shape_fn(what, with_indices=False):
    def shape(ctx, x):
        if x.shape is None:
            out = [TensorInfo(x.dtype, None)]
        else:
            if len(x.shape) < 3:
                raise ShapeInferenceError(f"{what}: input must have rank >= 3 (N, C, spatial...), got {x.shape}")
            nd, ks, st, dl, pb, pe, ap, cm = _pool_params(ctx, x.shape, what, ShapeInferenceError)
            sizes, _, _ = _conv_geometry(x.shape[2:], ks, st, dl, pb, pe, ap, cm, what)
            out = [TensorInfo(x.dtype, (x.shape[0], x.shape[1], *sizes))]
        if with_indices and ctx.num_outputs > 1:
            out.append(TensorInfo(np.dtype(np.int64), out[0].shape))
        return out

    return shape


def _prepare(ctx, x, what):
    if x.ndim < 3:
        raise KernelError(f"{what}: input must have rank >= 3 (N, C, spatial...), got {x.shape}")
    nd, ks, st, dl, pb, pe, ap, cm = _pool_params(ctx, x.shape, what, KernelError)
    sizes, pb, pe = _conv_geometry(x.shape[2:], ks, st, dl, pb, pe, ap, cm, what, KernelError)
    # the padded input must cover every window (ceil_mode may need more than pads_end)
    need_end = [max(0, (sizes[i] - 1) * st[i] + (ks[i] - 1) * dl[i] + 1 - pb[i] - x.shape[2 + i])
                for i in range(nd)]
    return nd, ks, st, dl, pb, pe, need_end, sizes


def _taps(ks, dl, sizes, st):
    for offs in itertools.product(*(range(k) for k in ks)):
        yield offs, (slice(None), slice(None)) + _tap_slices([o * d for o, d in zip(offs, dl)], sizes, st)


def _separable_reduce(x, ks, st, dl, pb, sizes, op, init, scratch=None, out=None):
    """Reduce every pooling window of x with the binary ufunc `op`, one spatial axis at a time.

    Max and sum over a box window are separable, so each axis is reduced in turn (outer axes
    first, whose passes run over contiguous rows). Each pass is a loop over that axis's
    kernel taps only; taps that fall into the padding are clipped away instead of padding
    the input, and outputs whose window lies entirely in padding keep `init`.
    """
    y = x
    last = len(ks) - 1
    for ax in range(len(ks)):
        axis = 2 + ax
        n_in, n_out, s = y.shape[axis], sizes[ax], st[ax]
        taps = []
        for t in range(ks[ax]):
            off = t * dl[ax] - pb[ax]
            o_lo = 0 if off >= 0 else (-off + s - 1) // s
            o_hi = min(n_out, (n_in - 1 - off) // s + 1) if n_in - 1 - off >= 0 else 0
            if o_hi > o_lo:
                taps.append((o_lo, o_hi, off))
        pre = (slice(None),) * axis
        full = [t for t in taps if t[0] == 0 and t[1] == n_out]
        shape = list(y.shape)
        shape[axis] = n_out
        # partial results go to buffers kept between runs; the last pass into `out`
        if ax == last:
            acc = out if out is not None else np.empty(shape, y.dtype)  # never a kept buffer
        else:
            acc = _scratch(scratch, f"pass{ax}", shape, y.dtype)
        if full:
            taps.remove(full[0])
            off = full[0][2]
            np.copyto(acc, y[pre + (slice(off, off + (n_out - 1) * s + 1, s),)])
        else:
            acc.fill(init)
        for o_lo, o_hi, off in taps:
            dst = acc[pre + (slice(o_lo, o_hi),)]
            op(dst, y[pre + (slice(o_lo * s + off, (o_hi - 1) * s + off + 1, s),)], out=dst)
        y = acc
    return y


def _lowest(dtype):
    if dtype.kind == "f":
        return -np.inf
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    if dtype.kind == "b":
        return False
    raise KernelError(f"MaxPool: unsupported dtype {dtype}")


@kernel("MaxPool", since=1, shape=_pool_shape_fn("MaxPool", with_indices=True), writes_out=True)
def max_pool(ctx, x, out=None):
    nd, ks, st, dl, pb, pe, need_end, sizes = _prepare(ctx, x, "MaxPool")
    want_indices = ctx.num_outputs > 1
    if not want_indices:
        return _separable_reduce(x, ks, st, dl, pb, sizes, np.maximum, _lowest(x.dtype),
                                 ctx.workspace, None if out is None else out[0])
    storage_order = int(ctx.get("storage_order", 0))
    if storage_order not in (0, 1):
        raise KernelError("MaxPool: storage_order must be 0 or 1")
    # Indices: track which tap won (strictly greater replaces, so the first maximum in
    # window order wins, as in ONNX Runtime), then turn tap numbers into flat input indices.
    xp = _pad_spatial(x, pb, need_end, _lowest(x.dtype))
    ntaps = int(np.prod(ks))
    tap_dtype = np.dtype(np.uint8 if ntaps <= 256 else np.int32)
    y = None
    winner = None
    for t, (_, sl) in enumerate(_taps(ks, dl, sizes, st)):
        v = xp[sl]
        if y is None:
            y = v.copy()
            winner = np.zeros(y.shape, dtype=tap_dtype)
            continue
        # taps come in increasing order, so max(winner, t * improved) is the last tap that
        # strictly improved the running maximum (cheaper than a masked copy)
        improved = np.greater(v, y)
        np.maximum(winner, np.multiply(improved, tap_dtype.type(t), dtype=tap_dtype), out=winner)
        np.maximum(y, v, out=y)
    spatial = x.shape[2:]
    if storage_order == 1:  # column-major flat index of the spatial coordinates
        mult = [int(np.prod(spatial[:i])) for i in range(nd)]
    else:
        mult = [int(np.prod(spatial[i + 1:])) for i in range(nd)]
    # flat input offset of each tap, and of each window's origin
    tap_coords = np.stack(np.unravel_index(np.arange(ntaps), ks), axis=1)  # (K, nd)
    tap_offset = (tap_coords * np.asarray(dl) * np.asarray(mult)).sum(axis=1).astype(np.int64)
    n, c = x.shape[:2]
    origin = (np.arange(n * c, dtype=np.int64) * int(np.prod(spatial))).reshape((n, c) + (1,) * nd)
    for i in range(nd):
        start = (np.arange(sizes[i], dtype=np.int64) * st[i] - pb[i]) * mult[i]
        origin = origin + start.reshape([sizes[i] if j == i else 1 for j in range(nd)])
    idx = np.take(tap_offset, winner)
    idx += origin
    return y, idx


def _avg_counts(x_shape, ks, st, dl, pb, pe, sizes, include_pad):
    """Per-output-position divisor: product over axes of the number of taps counted."""
    nd = len(ks)
    count = None
    for i in range(nd):
        n_in = x_shape[2 + i]
        pos = (np.arange(sizes[i])[:, None] * st[i] - pb[i]) + np.arange(ks[i])[None, :] * dl[i]
        lo, hi = (-pb[i], n_in + pe[i]) if include_pad else (0, n_in)
        c = ((pos >= lo) & (pos < hi)).sum(axis=1)
        shape = [1] * nd
        shape[i] = sizes[i]
        c = c.reshape(shape)
        count = c if count is None else count * c
    return count


@kernel("AveragePool", since=1, shape=_pool_shape_fn("AveragePool"), writes_out=True)
def average_pool(ctx, x, out=None):
    if x.dtype.kind != "f":
        raise KernelError(f"AveragePool: unsupported dtype {x.dtype}")
    nd, ks, st, dl, pb, pe, need_end, sizes = _prepare(ctx, x, "AveragePool")
    # pads from auto_pad SAME_* count as padding too (ONNX Runtime semantics)
    include_pad = bool(ctx.get("count_include_pad", 0))
    out_dtype = x.dtype
    acc_dtype = np.dtype(np.float32) if x.dtype == np.float16 else x.dtype
    target = out[0] if out is not None and out[0].dtype == acc_dtype else None
    y = _separable_reduce(x.astype(acc_dtype, copy=False), ks, st, dl, pb, sizes, np.add, 0,
                          ctx.workspace, target)
    key = ("counts", x.shape)  # this node's own table: its geometry is fixed
    count = ctx.scratch.get(key)
    if count is None:
        count = ctx.scratch[key] = _avg_counts(x.shape, ks, st, dl, pb, pe, sizes, include_pad)
    if np.all(count == count.flat[0]):
        y *= acc_dtype.type(1.0 / count.flat[0]) if count.flat[0] else acc_dtype.type(np.nan)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            y /= count.astype(acc_dtype)
    return y if y.dtype == out_dtype else y.astype(out_dtype)


def _global_shape(ctx, x):
    if x.shape is None:
        return [TensorInfo(x.dtype, None)]
    if len(x.shape) < 3:
        raise ShapeInferenceError(f"global pooling needs rank >= 3 (N, C, spatial...), got {x.shape}")
    return [TensorInfo(x.dtype, tuple(x.shape[:2]) + (1,) * (len(x.shape) - 2))]


@kernel("GlobalAveragePool", since=1, shape=_global_shape)
def global_average_pool(ctx, x):
    if x.ndim < 3:
        raise KernelError(f"GlobalAveragePool: input must have rank >= 3, got {x.shape}")
    n, c = x.shape[:2]
    flat = x.reshape(n, c, -1)
    acc = np.float32 if x.dtype == np.float16 else x.dtype
    y = flat.mean(axis=2, dtype=acc)
    return y.astype(x.dtype, copy=False).reshape((n, c) + (1,) * (x.ndim - 2))


@kernel("GlobalMaxPool", since=1, shape=_global_shape)
def global_max_pool(ctx, x):
    if x.ndim < 3:
        raise KernelError(f"GlobalMaxPool: input must have rank >= 3, got {x.shape}")
    n, c = x.shape[:2]
    return x.reshape(n, c, -1).max(axis=2).reshape((n, c) + (1,) * (x.ndim - 2))
