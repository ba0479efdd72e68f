"""Indexing and data movement kernels: Trilu, Scatter, ScatterElements, ScatterND,
GatherND, TensorScatter, OneHot, Compress, NonZero, Unique, ReverseSequence, CenterCropPad,
BitCast, Col2Im.

Every index computation is one vectorized numpy operation: scatters build a full index
tuple (or a flat row index) and assign through it, with ``ufunc.at`` where a reduction must
combine duplicate indices; gathers flatten the indexed axes into one. Indices are checked
against their axis and negative ones counted from the end, as ONNX says.

NonZero, Compress and Unique have output shapes that depend on input contents: their
shape functions compute the result when the inputs are known at compile time, else leave
those dims unknown (the node then runs on the CPU fallback with dynamic shapes).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.dtypes import onnx_type_name, to_numpy
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import kernel
from nncc.kernels.shapes import known_value
from nncc.kernels.symbolic import FOLD_LIMIT, freeze
from nncc.kernels.tensor import tensor_info


def _axis(axis, rank, what, err=KernelError, extra=0):
    limit = rank + extra
    axis = int(axis)
    if not -limit <= axis < max(limit, 1):
        raise err(f"{what}: axis {axis} is out of range for rank {rank}")
    return axis + limit if axis < 0 else axis


def _indices(indices, dims, what):
    """int64 copy of ``indices`` with negative entries counted from the end of the axes
    ``dims`` (broadcast against the indices' last axes); out-of-range entries are an error."""
    if indices.dtype.kind not in "iu":
        raise KernelError(f"{what}: indices must be integers, got {indices.dtype}")
    idx = indices.astype(np.int64)
    dims = np.asarray(dims, dtype=np.int64)
    bad = (idx < -dims) | (idx >= dims)
    if bad.any():
        raise KernelError(f"{what}: index {int(idx[bad][0])} is out of range for axes of size {dims.tolist()}")
    return np.where(idx < 0, idx + dims, idx)


def _from_contents(ctx, fn, infos, dtypes):
    """Output infos computed by running the kernel on inputs known at compile time (their
    contents decide the shapes), or None when some input is unknown. Small results keep
    their value."""
    args = []
    for info in infos:
        if info is None:
            args.append(None)
        elif info.value is None:
            return None
        else:
            args.append(info.value)
    try:
        results = fn(ctx, *args)
    except KernelError as error:
        raise ShapeInferenceError(str(error)) from None
    results = results if isinstance(results, tuple) else (results,)
    outs = []
    for result, dtype in zip(results, dtypes):
        value = freeze(np.array(result, copy=True)) if result.size <= FOLD_LIMIT else None
        outs.append(TensorInfo(np.dtype(dtype) if dtype is not None else result.dtype, tuple(result.shape), value))
    return outs


def _same(ctx, x, *rest):
    return [tensor_info(x.dtype, x.shape)]


# --------------------------------------------------------------------------------------
# Trilu


@kernel("Trilu", since=14, shape=_same)
def trilu(ctx, x, k=None):
    if x.ndim < 2:
        raise KernelError(f"Trilu: input must have rank >= 2, got shape {x.shape}")
    if k is not None and np.asarray(k).size != 1:
        raise KernelError(f"Trilu: k must be a scalar, got shape {np.shape(k)}")
    k = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    return np.triu(x, k) if int(ctx.get("upper", 1)) else np.tril(x, k)


# --------------------------------------------------------------------------------------
# Scatter, ScatterElements, ScatterND, TensorScatter


_REDUCERS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _reduction(ctx, what, err=KernelError):
    """The reduction ufunc (None to overwrite), checking the opset defines the mode."""
    mode = ctx.get("reduction", "none") if ctx.opset >= 16 else "none"
    allowed = ("none", "add", "mul") if ctx.opset < 18 else ("none", "add", "mul", "max", "min")
    if mode not in allowed:
        raise err(f"{what}: reduction {mode!r} is not defined at opset {ctx.opset} "
                  f"(expected one of {', '.join(allowed)})")
    return _REDUCERS.get(mode)


def _scatter_shape(what):
    def shape(ctx, data, indices, updates):
        _reduction(ctx, what, ShapeInferenceError)
        return [tensor_info(data.dtype, data.shape)]

    return shape


def _scatter_elements(ctx, data, indices, updates, what):
    reducer = _reduction(ctx, what)
    if indices.shape != updates.shape:
        raise KernelError(f"{what}: indices {indices.shape} and updates {updates.shape} must have the same shape")
    if indices.ndim != data.ndim:
        raise KernelError(f"{what}: indices have rank {indices.ndim}, data rank {data.ndim}")
    axis = _axis(ctx.get("axis", 0), data.ndim, what)
    for i, (n, m) in enumerate(zip(indices.shape, data.shape)):
        if i != axis and n > m:
            raise KernelError(f"{what}: indices {indices.shape} exceed data {data.shape} along axis {i}")
    where = list(np.indices(indices.shape, sparse=True))
    where[axis] = _indices(indices, data.shape[axis], what)
    out = data.copy()
    if reducer is None:
        out[tuple(where)] = updates
    else:
        reducer.at(out, tuple(where), updates)
    return out


@kernel("ScatterElements", since=11, shape=_scatter_shape("ScatterElements"))
@kernel("ScatterElements", since=13, shape=_scatter_shape("ScatterElements"))
@kernel("ScatterElements", since=16, shape=_scatter_shape("ScatterElements"))
@kernel("ScatterElements", since=18, shape=_scatter_shape("ScatterElements"))
def scatter_elements(ctx, data, indices, updates):
    return _scatter_elements(ctx, data, indices, updates, "ScatterElements")


@kernel("Scatter", since=9, shape=_scatter_shape("Scatter"))
@kernel("Scatter", since=11, shape=_scatter_shape("Scatter"))
def scatter(ctx, data, indices, updates):
    return _scatter_elements(ctx, data, indices, updates, "Scatter")


@kernel("ScatterND", since=11, shape=_scatter_shape("ScatterND"))
@kernel("ScatterND", since=13, shape=_scatter_shape("ScatterND"))
@kernel("ScatterND", since=16, shape=_scatter_shape("ScatterND"))
@kernel("ScatterND", since=18, shape=_scatter_shape("ScatterND"))
def scatter_nd(ctx, data, indices, updates):
    reducer = _reduction(ctx, "ScatterND")
    if indices.ndim < 1:
        raise KernelError("ScatterND: indices must have rank >= 1")
    k = indices.shape[-1]
    if k > data.ndim:
        raise KernelError(f"ScatterND: indices address {k} axes, data has rank {data.ndim}")
    rest = data.shape[k:]
    if updates.shape != indices.shape[:-1] + rest:
        raise KernelError(f"ScatterND: updates have shape {updates.shape}, expected {indices.shape[:-1] + rest}")
    idx = _indices(indices.reshape(-1, k), data.shape[:k], "ScatterND")
    rows = np.ravel_multi_index(tuple(idx.T), data.shape[:k]) if k else np.zeros(len(idx), np.int64)
    out = data.copy()
    flat = out.reshape((-1,) + rest)
    values = updates.reshape((-1,) + rest)
    if reducer is None:
        flat[rows] = values
    else:
        reducer.at(flat, rows, values)
    return out


def _tensor_scatter_shape(ctx, cache, update, write_indices=None):
    if ctx.get("mode", "linear") not in ("linear", "circular"):
        raise ShapeInferenceError(f"TensorScatter: unknown mode {ctx.get('mode')!r}")
    return [tensor_info(cache.dtype, cache.shape)]


@kernel("TensorScatter", since=24, shape=_tensor_scatter_shape)
def tensor_scatter(ctx, cache, update, write_indices=None):
    mode = ctx.get("mode", "linear")
    if mode not in ("linear", "circular"):
        raise KernelError(f"TensorScatter: unknown mode {mode!r}")
    if cache.ndim < 2 or update.ndim != cache.ndim:
        raise KernelError(f"TensorScatter: cache {cache.shape} and update {update.shape} need the same rank >= 2")
    axis = _axis(ctx.get("axis", -2), cache.ndim, "TensorScatter")
    if axis == 0:
        raise KernelError("TensorScatter: axis must not be the batch axis 0")
    if any(u != c for i, (u, c) in enumerate(zip(update.shape, cache.shape)) if i != axis):
        raise KernelError(f"TensorScatter: update {update.shape} differs from cache {cache.shape} outside axis {axis}")
    batch, length, steps = cache.shape[0], cache.shape[axis], update.shape[axis]
    if write_indices is None:
        start = np.zeros(batch, np.int64)
    else:
        start = np.asarray(write_indices).astype(np.int64).reshape(-1)
        if start.size != batch:
            raise KernelError(f"TensorScatter: write_indices has {start.size} entries, batch is {batch}")
    pos = start[:, None] + np.arange(steps, dtype=np.int64)[None, :]
    if mode == "circular":
        pos %= max(length, 1)
    elif pos.size and (pos.min() < 0 or pos.max() >= length):
        raise KernelError(f"TensorScatter: writes reach position {int(pos.max())} of a sequence axis of {length}")
    out = cache.copy()
    # the sequence axis next to the batch axis: one fancy assignment per (batch, step)
    view = np.moveaxis(out, axis, 1)
    view[np.arange(batch)[:, None], pos] = np.moveaxis(update, axis, 1)
    return out


# --------------------------------------------------------------------------------------
# GatherND


def _gather_nd_shape(ctx, data, indices):
    b = int(ctx.get("batch_dims", 0)) if ctx.opset >= 12 else 0
    if data.shape is None or indices.shape is None or not isinstance(indices.shape[-1] if indices.shape else None, int):
        return [tensor_info(data.dtype, None)]
    k = indices.shape[-1]
    if b + k > len(data.shape):
        raise ShapeInferenceError(f"GatherND: batch_dims {b} + index depth {k} exceed data rank {len(data.shape)}")
    return [tensor_info(data.dtype, tuple(indices.shape[:-1]) + tuple(data.shape[b + k:]))]


@kernel("GatherND", since=11, shape=_gather_nd_shape)
@kernel("GatherND", since=12, shape=_gather_nd_shape)
@kernel("GatherND", since=13, shape=_gather_nd_shape)
def gather_nd(ctx, data, indices):
    b = int(ctx.get("batch_dims", 0)) if ctx.opset >= 12 else 0
    if indices.ndim < 1 or b < 0 or b >= indices.ndim:
        raise KernelError(f"GatherND: batch_dims {b} needs indices of rank > {b}, got {indices.shape}")
    k = indices.shape[-1]
    if b + k > data.ndim:
        raise KernelError(f"GatherND: batch_dims {b} + index depth {k} exceed data rank {data.ndim}")
    if data.shape[:b] != indices.shape[:b]:
        raise KernelError(f"GatherND: batch dims of data {data.shape} and indices {indices.shape} differ")
    batch = math.prod(data.shape[:b])
    dims, rest = data.shape[b:b + k], data.shape[b + k:]
    idx = _indices(indices.reshape(batch, -1, k), dims, "GatherND")
    rows = np.ravel_multi_index(tuple(np.moveaxis(idx, -1, 0)), dims) if k else np.zeros(idx.shape[:2], np.int64)
    flat = data.reshape((batch, math.prod(dims)) + rest)
    out = flat[np.arange(batch)[:, None], rows]
    return out.reshape(indices.shape[:-1] + rest)


# --------------------------------------------------------------------------------------
# OneHot


def _onehot_shape(ctx, indices, depth, values):
    if indices.shape is None:
        return [tensor_info(values.dtype, None)]
    rank = len(indices.shape)
    axis = _axis(ctx.get("axis", -1), rank, "OneHot", ShapeInferenceError, extra=1)
    d = known_value(depth)
    n = None if d is None else _depth(d, ShapeInferenceError)
    shape = list(indices.shape)
    shape.insert(axis, n)
    return [tensor_info(values.dtype, shape)]


def _depth(depth, err):
    depth = np.asarray(depth)
    if depth.size != 1:
        raise err(f"OneHot: depth must have one element, got shape {depth.shape}")
    n = int(depth.reshape(-1)[0])
    if n < 1:
        raise err(f"OneHot: depth must be positive, got {n}")
    return n


@kernel("OneHot", since=9, shape=_onehot_shape)
@kernel("OneHot", since=11, shape=_onehot_shape)
@kernel("OneHot", since=28, shape=_onehot_shape)
def onehot(ctx, indices, depth, values):
    n = _depth(depth, KernelError)
    if values.size != 2:
        raise KernelError(f"OneHot: values must be [off, on], got shape {values.shape}")
    off, on = values.reshape(-1)
    axis = _axis(ctx.get("axis", -1), indices.ndim, "OneHot", extra=1)
    idx = indices.astype(np.int64)
    if ctx.opset >= 11:  # negative indices count from the end; other out-of-range ones select nothing
        idx = np.where(idx < 0, idx + n, idx)
    shape = [1] * (indices.ndim + 1)
    shape[axis] = n
    hot = np.expand_dims(idx, axis) == np.arange(n, dtype=np.int64).reshape(shape)
    return np.where(hot, on, off).astype(values.dtype)


# --------------------------------------------------------------------------------------
# Compress, NonZero, Unique: shapes from contents


def _compress_shape(ctx, x, condition):
    known = _from_contents(ctx, compress, [x, condition], [x.dtype])
    if known is not None:
        return known
    axis = ctx.get("axis")
    if axis is None:
        return [tensor_info(x.dtype, (None,))]
    if x.shape is None:
        return [tensor_info(x.dtype, None)]
    axis = _axis(axis, len(x.shape), "Compress", ShapeInferenceError)
    shape = list(x.shape)
    shape[axis] = None
    return [tensor_info(x.dtype, shape)]


@kernel("Compress", since=9, shape=_compress_shape)
@kernel("Compress", since=11, shape=_compress_shape)
@kernel("Compress", since=28, shape=_compress_shape)
def compress(ctx, x, condition):
    if condition.ndim != 1:
        raise KernelError(f"Compress: condition must be 1-D, got shape {condition.shape}")
    axis = ctx.get("axis")
    if axis is None:
        x, axis = x.reshape(-1), 0
    else:
        axis = _axis(axis, x.ndim, "Compress")
    n = x.shape[axis]
    if condition.size > n:
        raise KernelError(f"Compress: condition has {condition.size} entries, axis {axis} only {n}")
    # a shorter condition selects nothing beyond its end
    return np.compress(condition.astype(bool), x, axis=axis)


def _nonzero_shape(ctx, x):
    known = _from_contents(ctx, nonzero, [x], [np.int64])
    if known is not None:
        return known
    return [tensor_info(np.int64, (None if x.shape is None else max(len(x.shape), 1), None))]


@kernel("NonZero", since=9, shape=_nonzero_shape)
@kernel("NonZero", since=13, shape=_nonzero_shape)
def nonzero(ctx, x):
    # a scalar counts as a one-element vector (numpy refuses nonzero on 0-d arrays)
    return np.array(np.nonzero(np.atleast_1d(x)), dtype=np.int64).reshape(max(x.ndim, 1), -1)


def _unique_shape(ctx, x):
    known = _from_contents(ctx, unique, [x], [x.dtype, np.int64, np.int64, np.int64])
    if known is not None:
        return known[:max(ctx.num_outputs, 1)]
    axis = ctx.get("axis")
    if axis is None or x.shape is None:
        y = tensor_info(x.dtype, (None,) if axis is None else None)
        inverse = None if x.shape is None else math.prod(x.shape) if x.is_static else None
    else:
        axis = _axis(axis, len(x.shape), "Unique", ShapeInferenceError)
        shape = list(x.shape)
        shape[axis] = None
        y = tensor_info(x.dtype, shape)
        inverse = x.shape[axis] if isinstance(x.shape[axis], int) else None
    outs = [y, tensor_info(np.int64, (None,)), tensor_info(np.int64, (inverse,)), tensor_info(np.int64, (None,))]
    return outs[:max(ctx.num_outputs, 1)]


@kernel("Unique", since=11, shape=_unique_shape)
@kernel("Unique", since=28, shape=_unique_shape)
def unique(ctx, x):
    axis = ctx.get("axis")
    if axis is None:
        flat = x.reshape(-1)
        y, first, inverse, counts = np.unique(flat, return_index=True, return_inverse=True, return_counts=True)
    else:
        axis = _axis(axis, x.ndim, "Unique")
        y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True,
                                              axis=axis)
    inverse = inverse.reshape(-1)
    if not int(ctx.get("sorted", 1)):
        # order of first occurrence: permute the sorted result and renumber the inverse
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y = np.take(y, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    outs = (y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64))
    return outs[:max(ctx.num_outputs, 1)]


# --------------------------------------------------------------------------------------
# ReverseSequence


def _reverse_sequence_axes(ctx, rank, err):
    batch = _axis(ctx.get("batch_axis", 1), rank, "ReverseSequence", err)
    time = _axis(ctx.get("time_axis", 0), rank, "ReverseSequence", err)
    if batch == time or batch > 1 or time > 1:
        raise err(f"ReverseSequence: batch_axis {batch} and time_axis {time} must be 0 and 1 in some order")
    return batch, time


def _reverse_sequence_shape(ctx, x, lengths):
    if x.shape is not None:
        if len(x.shape) < 2:
            raise ShapeInferenceError(f"ReverseSequence: input must have rank >= 2, got {x.shape}")
        _reverse_sequence_axes(ctx, len(x.shape), ShapeInferenceError)
    return [tensor_info(x.dtype, x.shape)]


@kernel("ReverseSequence", since=10, shape=_reverse_sequence_shape)
@kernel("ReverseSequence", since=28, shape=_reverse_sequence_shape)
def reverse_sequence(ctx, x, lengths):
    if x.ndim < 2:
        raise KernelError(f"ReverseSequence: input must have rank >= 2, got {x.shape}")
    batch_axis, time_axis = _reverse_sequence_axes(ctx, x.ndim, KernelError)
    batch, steps = x.shape[batch_axis], x.shape[time_axis]
    lengths = np.asarray(lengths).astype(np.int64).reshape(-1)
    if lengths.size != batch:
        raise KernelError(f"ReverseSequence: sequence_lens has {lengths.size} entries, batch is {batch}")
    if lengths.size and (lengths.min() < 0 or lengths.max() > steps):
        raise KernelError(f"ReverseSequence: sequence lengths must lie in [0, {steps}], got {lengths.tolist()}")
    t = np.arange(steps, dtype=np.int64)[None, :]
    n = lengths[:, None]
    source = np.where(t < n, n - 1 - t, t)  # (batch, time): the step each output reads
    xt = np.moveaxis(x, (batch_axis, time_axis), (0, 1))
    y = xt[np.arange(batch)[:, None], source]
    return np.ascontiguousarray(np.moveaxis(y, (0, 1), (batch_axis, time_axis)))


# --------------------------------------------------------------------------------------
# CenterCropPad


def _crop_axes(ctx, rank, count, err):
    axes = ctx.get("axes")
    axes = list(range(rank)) if axes is None else [_axis(a, rank, "CenterCropPad", err) for a in axes]
    if len(set(axes)) != len(axes):
        raise err(f"CenterCropPad: duplicate axes {axes}")
    if count is not None and count != len(axes):
        raise err(f"CenterCropPad: shape has {count} entries for {len(axes)} axes")
    return axes


def _center_crop_pad_shape(ctx, x, shape):
    target = known_value(shape)
    if x.shape is None:
        return [tensor_info(x.dtype, None)]
    rank = len(x.shape)
    dims = list(x.shape)
    if target is None:
        for a in _crop_axes(ctx, rank, None, ShapeInferenceError):
            dims[a] = None
        return [tensor_info(x.dtype, dims)]
    target = [int(v) for v in np.asarray(target).reshape(-1)]
    for a, t in zip(_crop_axes(ctx, rank, len(target), ShapeInferenceError), target):
        dims[a] = t
    return [tensor_info(x.dtype, dims)]


@kernel("CenterCropPad", since=18, shape=_center_crop_pad_shape)
def center_crop_pad(ctx, x, shape):
    target = [int(v) for v in np.asarray(shape).reshape(-1)]
    axes = _crop_axes(ctx, x.ndim, len(target), KernelError)
    if any(t < 0 for t in target):
        raise KernelError(f"CenterCropPad: target shape {target} has negative entries")
    out_shape = list(x.shape)
    src = [slice(None)] * x.ndim
    dst = [slice(None)] * x.ndim
    for a, t in zip(axes, target):
        n = x.shape[a]
        out_shape[a] = t
        if t < n:  # crop: the window starts half the excess in, rounded down
            start = (n - t) // 2
            src[a] = slice(start, start + t)
        elif t > n:  # pad: the odd extra element goes to the end
            start = (t - n) // 2
            dst[a] = slice(start, start + n)
    out = np.zeros(out_shape, dtype=x.dtype)
    out[tuple(dst)] = x[tuple(src)]
    return out


# --------------------------------------------------------------------------------------
# BitCast


def _bitcast_dtype(ctx, source, err):
    code = ctx.get("to")
    if code is None:
        raise err("BitCast requires the 'to' attribute")
    dtype = to_numpy(int(code))
    if dtype is None or dtype == object:
        raise err(f"BitCast to {onnx_type_name(int(code))} is not supported")
    if source is not None and (source == object or np.dtype(source).itemsize != dtype.itemsize):
        raise err(f"BitCast from {source} to {dtype} changes the element width")
    return dtype


def _bitcast_shape(ctx, x):
    return [tensor_info(_bitcast_dtype(ctx, x.dtype, ShapeInferenceError), x.shape)]


@kernel("BitCast", since=26, shape=_bitcast_shape)
def bitcast(ctx, x):
    dtype = _bitcast_dtype(ctx, x.dtype, KernelError)
    # bytes are little endian by the spec, as numpy's native order on supported hosts
    return np.array(x, order="C").view(dtype)  # a C-ordered copy (keeps 0-d arrays 0-d)


# --------------------------------------------------------------------------------------
# Col2Im


def _col2im_params(ctx, image, block, err):
    nd = len(image)
    if len(block) != nd:
        raise err(f"Col2Im: image_shape {image} and block_shape {block} differ in length")
    if any(v <= 0 for v in image) or any(v <= 0 for v in block):
        raise err(f"Col2Im: image_shape {image} and block_shape {block} must be positive")
    dilations = [int(v) for v in ctx.get("dilations", [1] * nd)]
    strides = [int(v) for v in ctx.get("strides", [1] * nd)]
    pads = [int(v) for v in ctx.get("pads", [0] * (2 * nd))]
    if len(dilations) != nd or len(strides) != nd or len(pads) != 2 * nd:
        raise err(f"Col2Im: dilations, strides and pads must have {nd}, {nd} and {2 * nd} values")
    if min(dilations + strides) < 1 or min(pads) < 0:
        raise err("Col2Im: dilations and strides must be positive and pads non-negative")
    padded = [image[i] + pads[i] + pads[nd + i] for i in range(nd)]
    blocks = [(padded[i] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(nd)]
    if any(b < 1 for b in blocks):
        raise err(f"Col2Im: block_shape {block} does not fit the padded image {padded}")
    return dilations, strides, pads, padded, blocks


def _col2im_shape(ctx, x, image_shape, block_shape):
    image, block = known_value(image_shape), known_value(block_shape)
    if x.shape is None or image is None or block is None:
        n = None if image_shape.shape is None else image_shape.shape[0]
        if x.shape is None or not isinstance(n, int):
            return [tensor_info(x.dtype, None)]
        return [tensor_info(x.dtype, (x.shape[0], None) + (None,) * n)]
    image = [int(v) for v in np.asarray(image).reshape(-1)]
    block = [int(v) for v in np.asarray(block).reshape(-1)]
    _col2im_params(ctx, image, block, ShapeInferenceError)
    if len(x.shape) != 3:
        raise ShapeInferenceError(f"Col2Im: input must be (N, C * prod(block_shape), L), got {x.shape}")
    c = x.shape[1] // math.prod(block) if isinstance(x.shape[1], int) else None
    return [tensor_info(x.dtype, (x.shape[0], c, *image))]


@kernel("Col2Im", since=18, shape=_col2im_shape)
def col2im(ctx, x, image_shape, block_shape):
    image = [int(v) for v in np.asarray(image_shape).reshape(-1)]
    block = [int(v) for v in np.asarray(block_shape).reshape(-1)]
    dilations, strides, pads, padded, blocks = _col2im_params(ctx, image, block, KernelError)
    nd, taps = len(image), math.prod(block)
    if x.ndim != 3 or x.shape[1] % taps or x.shape[2] != math.prod(blocks):
        raise KernelError(f"Col2Im: input {x.shape} must be (N, C * {taps}, {math.prod(blocks)})")
    n, c = x.shape[0], x.shape[1] // taps
    cols = x.reshape((n, c, *block, *blocks))
    acc = np.zeros((n, c, *padded), dtype=x.dtype)
    # one strided add per block tap: every column's element lands on its image position
    for tap in itertools.product(*(range(b) for b in block)):
        window = tuple(slice(t * d, t * d + (m - 1) * s + 1, s)
                       for t, d, m, s in zip(tap, dilations, blocks, strides))
        acc[(slice(None), slice(None)) + window] += cols[(slice(None), slice(None)) + tap]
    crop = tuple(slice(pads[i], pads[i] + image[i]) for i in range(nd))
    return np.ascontiguousarray(acc[(slice(None), slice(None)) + crop])
