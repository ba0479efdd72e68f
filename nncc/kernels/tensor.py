"""Tensor manipulation kernels: Concat, Split, Slice, Gather(Elements), Reshape, Flatten,
Transpose, Squeeze, Unsqueeze, Expand, Tile, Pad, Identity, Dropout, DepthToSpace, SpaceToDepth.

Their shape functions matter as much as the kernels: exported models compute shapes at run
time with chains such as Shape -> Gather -> Unsqueeze -> Concat -> Reshape, and the ops
here carry those values, exact or partly symbolic, through nncc.kernels.symbolic.

At run time the kernels keep what they derive from attributes, input shapes and small
integer operands (Reshape's shape, Slice's starts/ends, Pad's pads, Split's sizes ...) in a
per-node plan in ``ctx.scratch``, keyed by the shapes and by the operands' *contents* (a
computed operand may be a new array, or the same buffer refilled), so a steady-state call
skips parsing and validation.
"""

from __future__ import annotations

import math

import numpy as np

from nncc.errors import IndexRangeError, KernelError, ShapeInferenceError
from nncc.ir.graph import Dim, TensorInfo
from nncc.kernels.registry import kernel
from nncc.kernels.shapes import broadcast, known_value
from nncc.kernels.symbolic import dim_product, fold, merge_dim, operand_length, shape_operand, static_numel
from nncc.util.limits import check_shape

_BIG = 2**31 - 1  # slice bounds at or beyond this mean "to the end" whatever the dim


# --------------------------------------------------------------------------------------
# shared private helpers (also used by nncc.kernels.generators)


def _ints(array, what: str, err=KernelError) -> list[int]:
    array = np.asarray(array)
    kind = array.dtype.kind
    if kind not in "iub":
        raise err(f"{what} must be integers, got {array.dtype}")
    values = array.reshape(-1).tolist()  # python ints
    return [int(v) for v in values] if kind == "b" else values


def _contents(array) -> list | None:
    """A small integer operand's entries (python ints), the part of a kernel's cache key
    that depends on its contents: compared by value, since a computed operand may be a new
    array or the same buffer refilled. None when absent; raises _NotInts for another dtype
    (the kernel then takes its general, validating path)."""
    if array is None:
        return None
    if array.dtype.kind not in "iu":
        raise _NotInts
    return array.reshape(-1).tolist()


class _NotInts(Exception):
    pass


def _axis(axis: int, rank: int, err=KernelError, extra: int = 0) -> int:
    """Normalize ``axis`` into [0, rank + extra)."""
    limit = rank + extra
    if not -limit <= axis < limit:
        raise err(f"axis {axis} is out of range for rank {rank}")
    return axis + limit if axis < 0 else axis


def _axes(axes, rank: int, err=KernelError, extra: int = 0) -> list[int]:
    out = [_axis(int(a), rank, err, extra) for a in axes]
    if len(set(out)) != len(out):
        raise err(f"axes {list(axes)} contain duplicates")
    return out


def tensor_info(dtype, shape) -> TensorInfo:
    return TensorInfo(None if dtype is None else np.dtype(dtype),
                      None if shape is None else tuple(shape))


def _dtype(info):
    return None if info is None else info.dtype


# --------------------------------------------------------------------------------------
# Concat


def _concat_axis(ctx) -> int:
    axis = ctx.get("axis")
    if axis is None:
        if ctx.opset >= 4:
            raise ShapeInferenceError("Concat requires the 'axis' attribute")
        axis = 1
    return int(axis)


def _concat_shape(ctx, *infos):
    present = [i for i in infos if i is not None]
    if not present:
        raise ShapeInferenceError("Concat needs at least one input")
    dtype = present[0].dtype
    shapes = [i.shape for i in present]
    known = [s for s in shapes if s is not None]
    if not known:
        return [tensor_info(dtype, None)]
    rank = len(known[0])
    if any(len(s) != rank for s in known):
        raise ShapeInferenceError(f"Concat inputs have different ranks: {known}")
    axis = _axis(_concat_axis(ctx), rank, ShapeInferenceError)
    out: list[Dim] = []
    for a in range(rank):
        if a != axis:
            out.append(merge_dim([s[a] for s in known]))
        elif len(known) != len(shapes):
            out.append(None)
        else:
            out.append(_concat_dim([s[a] for s in known]))
    return fold(ctx, concat, infos, [tensor_info(dtype, out)], symbolic=True)


def _concat_dim(dims) -> Dim:
    if any(d is None for d in dims):
        return None
    static = sum(d for d in dims if isinstance(d, int))
    symbols = [d for d in dims if isinstance(d, str)]
    if not symbols:
        return static
    if len(symbols) == 1 and static == 0:
        return symbols[0]
    return None


@kernel("Concat", since=1, shape=_concat_shape)
def concat(ctx, *inputs):
    try:
        key = tuple([x.shape for x in inputs])
    except AttributeError:  # an omitted input
        return _concat(ctx, inputs)
    plan = ctx.scratch.get("concat plan")
    if plan is None or plan[0] != key:
        _concat(ctx, inputs, check_only=True)
        plan = ctx.scratch["concat plan"] = (key, _axis(_concat_axis(ctx), inputs[0].ndim))
    if len(inputs) == 1:
        return inputs[0].view()
    return np.concatenate(inputs, axis=plan[1])


def _concat(ctx, inputs, check_only: bool = False):
    arrays = [x for x in inputs if x is not None]
    if not arrays:
        raise KernelError("Concat needs at least one input")
    rank = arrays[0].ndim
    if any(x.ndim != rank for x in arrays):
        raise KernelError(f"Concat inputs have different ranks: {[x.shape for x in arrays]}")
    axis = _axis(_concat_axis(ctx), rank)
    first = arrays[0].shape
    for x in arrays:
        if x.shape[:axis] != first[:axis] or x.shape[axis + 1:] != first[axis + 1:]:
            raise KernelError(
                f"Concat inputs must match except on axis {axis}: {[x.shape for x in arrays]}")
    if check_only:
        return None
    if len(arrays) == 1:
        return arrays[0].view()
    return np.concatenate(arrays, axis=axis)


# --------------------------------------------------------------------------------------
# Split


def _split_sizes(ctx, dim: Dim, split: list[int] | None, err) -> list[Dim]:
    if split is not None:
        if any(s < 0 for s in split):
            raise err(f"Split sizes {split} must be non-negative")
        if isinstance(dim, int) and sum(split) != dim:
            raise err(f"Split sizes {split} do not add up to the axis length {dim}")
        if len(split) != ctx.num_outputs:
            raise err(f"Split has {len(split)} sizes but {ctx.num_outputs} outputs")
        return list(split)
    num = ctx.get("num_outputs") if ctx.opset >= 18 else None
    if num is None:
        num = ctx.num_outputs
    elif num != ctx.num_outputs:
        raise err(f"Split num_outputs={num} but the node has {ctx.num_outputs} outputs")
    if num < 1:
        raise err("Split needs at least one output")
    if not isinstance(dim, int):
        return [dim if num == 1 else None] * num
    if dim % num == 0:
        return [dim // num] * num
    if ctx.opset < 18:
        raise err(f"Split cannot divide axis length {dim} into {num} equal parts")
    chunk = -(-dim // num)
    last = dim - chunk * (num - 1)
    if last < 0:
        raise err(f"Split cannot divide axis length {dim} into {num} outputs")
    return [chunk] * (num - 1) + [last]


def _split_list(ctx, split_value) -> list[int] | None:
    if split_value is not None:
        return split_value
    attr = ctx.get("split")
    return None if attr is None else [int(s) for s in attr]


def _split_shape(ctx, x, split=None):
    dtype = x.dtype
    if split is not None:
        sizes_in = known_value(split)
        if sizes_in is None:
            n = ctx.num_outputs
            if x.shape is None:
                return [tensor_info(dtype, None) for _ in range(n)]
            axis = _axis(ctx.get("axis", 0), len(x.shape), ShapeInferenceError)
            return [tensor_info(dtype, x.shape[:axis] + (None,) + x.shape[axis + 1:]) for _ in range(n)]
        sizes_in = _ints(sizes_in, "Split sizes", ShapeInferenceError)
    else:
        sizes_in = None
    listed = _split_list(ctx, sizes_in)
    if x.shape is None:
        n = len(listed) if listed is not None else ctx.num_outputs
        return [tensor_info(dtype, None) for _ in range(n)]
    axis = _axis(ctx.get("axis", 0), len(x.shape), ShapeInferenceError)
    sizes = _split_sizes(ctx, x.shape[axis], listed, ShapeInferenceError)
    outs = [tensor_info(dtype, x.shape[:axis] + (s,) + x.shape[axis + 1:]) for s in sizes]
    return fold(ctx, split_kernel, [x, split], outs, symbolic=True)


def split_kernel(ctx, x, split=None):
    # The output slices depend on the input shape and the split sizes' contents.
    if split is None:
        contents = None
    elif split.dtype == np.int64 and split.ndim == 1:
        contents = split.tolist()
    else:
        return _split(ctx, x, split)
    plan = ctx.scratch.get("split plan")
    if plan is None or plan[0] != x.shape or plan[1] != contents:
        plan = ctx.scratch["split plan"] = (x.shape, contents, _split_index(ctx, x, split))
    return tuple(x[index] for index in plan[2])


def _split(ctx, x, split=None):
    return tuple(x[index] for index in _split_index(ctx, x, split))


def _split_index(ctx, x, split) -> list[tuple]:
    """The index tuple selecting each output."""
    axis = _axis(ctx.get("axis", 0), x.ndim)
    listed = _split_list(ctx, None if split is None else _ints(split, "Split sizes"))
    sizes = _split_sizes(ctx, x.shape[axis], listed, KernelError)
    lead = (slice(None),) * axis
    outs, start = [], 0
    for size in sizes:
        outs.append(lead + (slice(start, start + size),))
        start += size
    return outs


for _since in (1, 13, 18):
    kernel("Split", since=_since, shape=_split_shape)(split_kernel)


# --------------------------------------------------------------------------------------
# Slice


def slice_bounds(dim: int, start: int, end: int, step: int) -> tuple[slice, int]:
    """ONNX clamping of one axis' start/end/step; returns the python slice and its length."""
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start = min(max(start, 0), dim)
        end = min(max(end, 0), dim)
        length = max(0, -(-(end - start) // step))
        return slice(start, end, step), length
    start = min(max(start, 0), dim - 1)
    end = min(max(end, -1), dim - 1)
    length = max(0, -(-(start - end) // -step)) if dim > 0 else 0
    return slice(start, end if end >= 0 else None, step), length


def slice_spec(ctx, rank: int, starts, ends, axes, steps, err):
    """Validated (axis, start, end, step) tuples; any of the lists may be None (default)."""
    if len(starts) != len(ends):
        raise err(f"Slice starts {starts} and ends {ends} differ in length")
    if axes is None:
        axes = list(range(len(starts)))
    if steps is None:
        steps = [1] * len(starts)
    if len(axes) != len(starts) or len(steps) != len(starts):
        raise err("Slice starts, ends, axes and steps must have the same length")
    axes = _axes(axes, rank, err)
    if any(s == 0 for s in steps):
        raise err("Slice steps must not be 0")
    return list(zip(axes, starts, ends, steps))


def slice_inputs(ctx, starts, ends, axes, steps, err=KernelError):
    if ctx.opset < 10:
        starts, ends, axes = ctx.get("starts"), ctx.get("ends"), ctx.get("axes")
        if starts is None or ends is None:
            raise err("Slice requires the 'starts' and 'ends' attributes")
        return list(starts), list(ends), None if axes is None else list(axes), None
    return (_ints(starts, "Slice starts", err), _ints(ends, "Slice ends", err),
            None if axes is None else _ints(axes, "Slice axes", err),
            None if steps is None else _ints(steps, "Slice steps", err))


def _slice_shape(ctx, data, starts=None, ends=None, axes=None, steps=None):
    dtype = data.dtype
    if data.shape is None:
        return [tensor_info(dtype, None)]
    rank = len(data.shape)
    if ctx.opset >= 10:
        values = [known_value(i) for i in (starts, ends)]
        extra = [None if i is None else known_value(i) for i in (axes, steps)]
        unknown_axes = axes is not None and extra[0] is None
        if any(v is None for v in values) or (steps is not None and extra[1] is None):
            if unknown_axes:
                return [tensor_info(dtype, (None,) * rank)]
            if extra[0] is not None:
                touched = set(_axes(_ints(extra[0], "Slice axes", ShapeInferenceError),
                                    rank, ShapeInferenceError))
            else:
                count = operand_length(starts)
                if count is None:
                    return [tensor_info(dtype, (None,) * rank)]
                touched = set(range(count))
            return [tensor_info(dtype, tuple(None if a in touched else d
                                      for a, d in enumerate(data.shape)))]
        if unknown_axes:
            return [tensor_info(dtype, (None,) * rank)]
        lists = slice_inputs(ctx, values[0], values[1], extra[0], extra[1], ShapeInferenceError)
    else:
        lists = slice_inputs(ctx, None, None, None, None, ShapeInferenceError)
    out = list(data.shape)
    for axis, start, end, step in slice_spec(ctx, rank, *lists, ShapeInferenceError):
        dim = out[axis]
        if isinstance(dim, int):
            out[axis] = slice_bounds(dim, start, end, step)[1]
        elif step == 1 and (start == 0 or start <= -_BIG) and end >= _BIG:
            pass  # the whole (symbolic) axis
        elif step == -1 and (start == -1 or start >= _BIG) and end <= -_BIG:
            pass  # the whole axis reversed
        else:
            out[axis] = None
    return fold(ctx, slice_kernel, [data, starts, ends, axes, steps], [tensor_info(dtype, out)],
                 symbolic=True)


def slice_kernel(ctx, data, starts=None, ends=None, axes=None, steps=None):
    try:
        key = (data.shape, _contents(starts), _contents(ends), _contents(axes), _contents(steps))
    except _NotInts:
        return _slice(ctx, data, starts, ends, axes, steps)
    plan = ctx.scratch.get("slice plan")
    if plan is None or plan[0] != key:
        plan = ctx.scratch["slice plan"] = (key, _slice_index(ctx, data, starts, ends, axes, steps))
    return data[plan[1]]


def _slice(ctx, data, starts=None, ends=None, axes=None, steps=None):
    return data[_slice_index(ctx, data, starts, ends, axes, steps)]


def _slice_index(ctx, data, starts, ends, axes, steps) -> tuple:
    lists = slice_inputs(ctx, starts, ends, axes, steps)
    index = [slice(None)] * data.ndim
    for axis, start, end, step in slice_spec(ctx, data.ndim, *lists, KernelError):
        index[axis] = slice_bounds(data.shape[axis], start, end, step)[0]
    return tuple(index)


for _since in (1, 10):
    kernel("Slice", since=_since, shape=_slice_shape)(slice_kernel)


# --------------------------------------------------------------------------------------
# Gather, GatherElements


def _gather_shape(ctx, data, indices):
    if data.shape is None or indices.shape is None:
        return [tensor_info(data.dtype, None)]
    axis = _axis(ctx.get("axis", 0), len(data.shape), ShapeInferenceError)
    shape = data.shape[:axis] + indices.shape + data.shape[axis + 1:]
    return fold(ctx, gather, [data, indices], [tensor_info(data.dtype, shape)], symbolic=True)


@kernel("Gather", since=1, shape=_gather_shape)
def gather(ctx, data, indices):
    # Indices that are a plan constant (the same object each run) are checked once.
    plan = ctx.scratch.get("gather plan")
    if plan is not None and plan[0] is indices and plan[1] == data.shape and ctx.is_constant(1):
        return data[plan[2]] if plan[2] is not None else np.take(data, indices, axis=plan[3])
    result = _gather(ctx, data, indices)
    if isinstance(indices, np.ndarray) and ctx.is_constant(1):
        axis = _axis(ctx.get("axis", 0), data.ndim)
        view = (slice(None),) * axis + (int(indices),) if indices.ndim == 0 else None
        ctx.scratch["gather plan"] = (indices, data.shape, view, axis)
    return result


def _gather(ctx, data, indices):
    axis = _axis(ctx.get("axis", 0), data.ndim)
    dim = data.shape[axis]
    indices = np.asarray(indices)
    if indices.dtype.kind not in "iu":
        raise KernelError(f"Gather indices must be integers, got {indices.dtype}")
    if indices.ndim == 0:
        i = int(indices)
        if not -dim <= i < dim:
            raise IndexRangeError(f"Gather index {i} is out of range for axis length {dim}")
        return data[(slice(None),) * axis + (i,)]  # a view
    if indices.size:
        low, high = int(indices.min()), int(indices.max())
        if low < -dim or high >= dim:
            bad = low if low < -dim else high
            raise IndexRangeError(f"Gather index {bad} is out of range for axis length {dim}")
    return np.take(data, indices, axis=axis)


def _gather_elements_shape(ctx, data, indices):
    if data.shape is not None and indices.shape is not None:
        if len(data.shape) != len(indices.shape):
            raise ShapeInferenceError("GatherElements data and indices must have the same rank")
        _axis(ctx.get("axis", 0), len(data.shape), ShapeInferenceError)
    out = tensor_info(data.dtype, indices.shape)
    return fold(ctx, gather_elements, [data, indices], [out])


@kernel("GatherElements", since=11, shape=_gather_elements_shape)
def gather_elements(ctx, data, indices):
    if data.ndim != indices.ndim:
        raise KernelError("GatherElements data and indices must have the same rank")
    axis = _axis(ctx.get("axis", 0), data.ndim)
    dim = data.shape[axis]
    if indices.size:
        low, high = int(indices.min()), int(indices.max())
        if low < -dim or high >= dim:
            bad = low if low < -dim else high
            raise KernelError(f"GatherElements index {bad} is out of range for axis length {dim}")
        if low < 0:
            indices = np.where(indices < 0, indices + dim, indices)
    for a in range(data.ndim):
        if a != axis and indices.shape[a] > data.shape[a]:
            raise KernelError(f"GatherElements indices shape {indices.shape} exceeds data "
                              f"shape {data.shape} outside axis {axis}")
    # One flat take: offset = sum_k i_k * stride_k (i_axis = index), 3x faster than
    # np.take_along_axis's fancy indexing over every dim.
    data = np.ascontiguousarray(data)
    strides = [s // data.itemsize for s in data.strides] if data.itemsize else [0] * data.ndim
    flat = indices.astype(np.int64) * strides[axis]
    for a, n in enumerate(indices.shape):
        if a != axis and n > 1:
            shape = [1] * indices.ndim
            shape[a] = n
            flat += (np.arange(n, dtype=np.int64) * strides[a]).reshape(shape)
    return np.take(data.reshape(-1), flat)


# --------------------------------------------------------------------------------------
# Reshape, Flatten


def _reshape_target(in_shape, target, allowzero: bool, err) -> tuple[Dim, ...]:
    """Output dims for ``target`` (entries int/str/None); ``in_shape`` may be symbolic."""
    if sum(1 for t in target if t == -1) > 1:
        raise err(f"Reshape shape {target} has more than one -1")
    out: list[Dim] = []
    for i, t in enumerate(target):
        if isinstance(t, int) and t < -1:
            raise err(f"Reshape shape {target} has an invalid dim {t}")
        if t == 0 and not allowzero:
            if in_shape is None:
                out.append(None)
            elif i >= len(in_shape):
                raise err(f"Reshape shape {target} copies dim {i} of a rank-{len(in_shape)} input")
            else:
                out.append(in_shape[i])
        else:
            out.append(t)
    if allowzero and 0 in out and -1 in out:
        raise err(f"Reshape shape {target} has both 0 and -1 while allowzero=1")
    if in_shape is None:
        return tuple(None if d == -1 else d for d in out)
    known_out = [d for d in out if d != -1]
    if -1 not in out:
        total_in, total_out = static_numel(in_shape), static_numel(known_out)
        if total_in is not None and total_out is not None and total_in != total_out:
            raise err(f"cannot reshape {tuple(in_shape)} to {tuple(target)}")
        return tuple(out)
    inferred = _infer_minus_one(in_shape, known_out, err, target)
    return tuple(inferred if d == -1 else d for d in out)


def _infer_minus_one(in_shape, known_out, err, target) -> Dim:
    if any(d is None for d in in_shape) or any(d is None for d in known_out):
        return None
    p_in = math.prod(d for d in in_shape if isinstance(d, int))
    p_out = math.prod(d for d in known_out if isinstance(d, int))
    remaining = [d for d in in_shape if isinstance(d, str)]
    for symbol in (d for d in known_out if isinstance(d, str)):
        if symbol not in remaining:
            return None
        remaining.remove(symbol)
    if p_out == 0:
        if p_in == 0 and not remaining:
            raise err(f"Reshape cannot infer -1 in {tuple(target)} for an empty input")
        return None
    if not remaining:
        if p_in % p_out:
            raise err(f"cannot reshape {tuple(in_shape)} to {tuple(target)}")
        return p_in // p_out
    if len(remaining) == 1 and p_in == p_out:
        return remaining[0]
    return None


def _reshape_shape(ctx, data, shape=None):
    allowzero = bool(ctx.get("allowzero", 0))
    if ctx.opset < 5:
        target = ctx.get("shape")
        if target is None:
            raise ShapeInferenceError("Reshape requires the 'shape' attribute")
        target = [int(t) for t in target]
    else:
        if shape is None:
            raise ShapeInferenceError("Reshape requires its 'shape' input")
        target = shape_operand(shape)
        if target is None:
            length = operand_length(shape)
            return [tensor_info(data.dtype, None if length is None else (None,) * length)]
    dims = _reshape_target(data.shape, target, allowzero, ShapeInferenceError)
    return fold(ctx, reshape, [data, shape], [tensor_info(data.dtype, dims)], symbolic=True)


def _reshape_dims(ctx, data, shape):
    target = ([int(t) for t in ctx.get("shape")] if ctx.opset < 5
              else _ints(shape, "Reshape shape"))
    dims = _reshape_target(data.shape, target, bool(ctx.get("allowzero", 0)), KernelError)
    if -1 in target and None in dims:
        raise KernelError(f"cannot reshape {data.shape} to {tuple(target)}")
    return dims


def reshape(ctx, data, shape=None):
    # The target dims depend on the input shape and the shape operand's contents (compared
    # by value: a computed shape tensor may be a new array, or the same buffer refilled).
    if shape is None:
        contents = None
    elif shape.dtype == np.int64 and shape.ndim == 1:
        contents = shape.tolist()
    else:
        return data.reshape(_reshape_dims(ctx, data, shape))
    plan = ctx.scratch.get("reshape plan")
    if plan is None or plan[0] != data.shape or plan[1] != contents:
        plan = ctx.scratch["reshape plan"] = (data.shape, contents, _reshape_dims(ctx, data, shape))
    return data.reshape(plan[2])


for _since in (1, 5):
    kernel("Reshape", since=_since, shape=_reshape_shape)(reshape)


def _flatten_axis(ctx, rank: int, err) -> int:
    axis = int(ctx.get("axis", 1))
    if not -rank <= axis <= rank:
        raise err(f"Flatten axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _flatten_shape(ctx, x):
    if x.shape is None:
        return [tensor_info(x.dtype, (None, None))]
    axis = _flatten_axis(ctx, len(x.shape), ShapeInferenceError)
    dims = (dim_product(x.shape[:axis]), dim_product(x.shape[axis:]))
    return fold(ctx, flatten, [x], [tensor_info(x.dtype, dims)], symbolic=True)


@kernel("Flatten", since=1, shape=_flatten_shape)
def flatten(ctx, x):
    axis = _flatten_axis(ctx, x.ndim, KernelError)
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


# --------------------------------------------------------------------------------------
# Transpose


def _perm(ctx, rank: int, err) -> list[int]:
    perm = ctx.get("perm")
    if perm is None:
        return list(range(rank))[::-1]
    perm = [int(p) for p in perm]
    if sorted(perm) != list(range(rank)):
        raise err(f"Transpose perm {perm} is not a permutation of {rank} axes")
    return perm


def _transpose_shape(ctx, x):
    if x.shape is None:
        perm = ctx.get("perm")
        return [tensor_info(x.dtype, None if perm is None else (None,) * len(perm))]
    perm = _perm(ctx, len(x.shape), ShapeInferenceError)
    return fold(ctx, transpose, [x], [tensor_info(x.dtype, tuple(x.shape[p] for p in perm))])


@kernel("Transpose", since=1, shape=_transpose_shape)
def transpose(ctx, x):
    plan = ctx.scratch.get("transpose plan")
    if plan is None or plan[0] != x.ndim:
        plan = ctx.scratch["transpose plan"] = (x.ndim, tuple(_perm(ctx, x.ndim, KernelError)))
    return x.transpose(plan[1])


# --------------------------------------------------------------------------------------
# Squeeze, Unsqueeze


def _axes_operand(ctx, axes_info, attr_until: int):
    """(axes list or None, known flag) from the attribute (< attr_until) or the input."""
    if ctx.opset < attr_until:
        axes = ctx.get("axes")
        return (None if axes is None else [int(a) for a in axes]), True
    if axes_info is None:
        return None, True
    value = known_value(axes_info)
    if value is None:
        return None, False
    return _ints(value, "axes", ShapeInferenceError), True


def _squeeze_shape(ctx, data, axes=None):
    listed, known = _axes_operand(ctx, axes, 13)
    if data.shape is None or not known:
        return [tensor_info(data.dtype, None)]
    rank = len(data.shape)
    if not listed:  # absent or empty axes: every size-1 dim (as onnxruntime does)
        if any(not isinstance(d, int) for d in data.shape):
            return [tensor_info(data.dtype, None)]
        drop = {a for a, d in enumerate(data.shape) if d == 1}
    else:
        drop = set(_axes(listed, rank, ShapeInferenceError))
        for a in drop:
            if isinstance(data.shape[a], int) and data.shape[a] != 1:
                raise ShapeInferenceError(f"Squeeze axis {a} has size {data.shape[a]}, not 1")
    shape = tuple(d for a, d in enumerate(data.shape) if a not in drop)
    return fold(ctx, squeeze, [data, axes], [tensor_info(data.dtype, shape)], symbolic=True)


def squeeze(ctx, data, axes=None):
    return _cached_reshape(ctx, "squeeze plan", _squeeze_dims, data, axes)


def _cached_reshape(ctx, name: str, dims_fn, data, operand):
    """data.reshape(dims_fn(ctx, data, operand)), the dims kept per input shape and
    operand contents."""
    try:
        key = (data.shape, _contents(operand))
    except _NotInts:
        return data.reshape(dims_fn(ctx, data, operand))
    plan = ctx.scratch.get(name)
    if plan is None or plan[0] != key:
        plan = ctx.scratch[name] = (key, dims_fn(ctx, data, operand))
    return data.reshape(plan[1])


def _squeeze_dims(ctx, data, axes=None) -> tuple:
    listed = ctx.get("axes") if ctx.opset < 13 else (None if axes is None else _ints(axes, "axes"))
    if not listed:
        drop = {a for a, d in enumerate(data.shape) if d == 1}
    else:
        drop = set(_axes(listed, data.ndim))
        for a in drop:
            if data.shape[a] != 1:
                raise KernelError(f"Squeeze axis {a} has size {data.shape[a]}, not 1")
    return tuple(d for a, d in enumerate(data.shape) if a not in drop)


def _unsqueeze_dims(shape, listed, err) -> tuple:
    rank = len(shape) + len(listed)
    axes = set(_axes(listed, len(shape), err, extra=len(listed)))
    rest = iter(shape)
    return tuple(1 if a in axes else next(rest) for a in range(rank))


def _unsqueeze_shape(ctx, data, axes=None):
    listed, known = _axes_operand(ctx, axes, 13)
    if listed is None and known:
        raise ShapeInferenceError("Unsqueeze requires axes")
    if data.shape is None:
        return [tensor_info(data.dtype, None)]
    if not known:
        length = operand_length(axes)
        return [tensor_info(data.dtype, None if length is None else (None,) * (len(data.shape) + length))]
    shape = _unsqueeze_dims(data.shape, listed, ShapeInferenceError)
    return fold(ctx, unsqueeze, [data, axes], [tensor_info(data.dtype, shape)], symbolic=True)


def unsqueeze(ctx, data, axes=None):
    return _cached_reshape(ctx, "unsqueeze plan", _unsqueeze_target, data, axes)


def _unsqueeze_target(ctx, data, axes=None) -> tuple:
    listed = ctx.get("axes") if ctx.opset < 13 else (None if axes is None else _ints(axes, "axes"))
    if listed is None:
        raise KernelError("Unsqueeze requires axes")
    return _unsqueeze_dims(data.shape, listed, KernelError)


for _since in (1, 13):
    kernel("Squeeze", since=_since, shape=_squeeze_shape)(squeeze)
    kernel("Unsqueeze", since=_since, shape=_unsqueeze_shape)(unsqueeze)


# --------------------------------------------------------------------------------------
# Expand, Tile


def _expand_shape(ctx, x, shape):
    target = shape_operand(shape)
    if target is None:
        length = operand_length(shape)
        if length is None or x.shape is None:
            return [tensor_info(x.dtype, None)]
        rank = max(length, len(x.shape))
        dims: list[Dim] = [None] * rank
        for i, d in enumerate(x.shape):  # a static dim other than 1 survives any broadcast
            if isinstance(d, int) and d != 1:
                dims[rank - len(x.shape) + i] = d
        return [tensor_info(x.dtype, dims)]
    if any(isinstance(t, int) and t < 0 for t in target):
        raise ShapeInferenceError(f"Expand shape {target} has negative dims")
    if x.shape is None:
        return [tensor_info(x.dtype, None)]
    try:
        dims = broadcast(tuple(x.shape), tuple(target))
    except ShapeInferenceError:
        raise ShapeInferenceError(f"Expand cannot broadcast {x.shape} to {tuple(target)}") from None
    return fold(ctx, expand, [x, shape], [tensor_info(x.dtype, dims)])


@kernel("Expand", since=8, shape=_expand_shape)
def expand(ctx, x, shape):
    try:
        key = (x.shape, _contents(shape))
    except _NotInts:
        return _expand(ctx, x, shape)
    plan = ctx.scratch.get("expand plan")
    if plan is None or plan[0] != key:
        plan = (key, _expand(ctx, x, shape).shape, None, None)
    elif plan[2] is x:
        return plan[3].view()  # a new view of the same memory (x's current contents)
    y = np.broadcast_to(x, plan[1])  # a read-only view
    # keep the view of a plan constant; any other x is not kept alive
    ctx.scratch["expand plan"] = (key, plan[1]) + ((x, y) if ctx.is_constant(0) else (None, None))
    return y


def _expand(ctx, x, shape):
    target = _ints(shape, "Expand shape")
    try:
        out_shape = np.broadcast_shapes(x.shape, tuple(target))
    except ValueError:
        raise KernelError(f"Expand cannot broadcast {x.shape} to {tuple(target)}") from None
    return np.broadcast_to(x, out_shape)  # a read-only view


def _tile_repeats(ctx, rank: int, repeats, axis=None, err=KernelError) -> list[int]:
    if ctx.opset < 6:  # Tile-1: (input, tiles, axis) scalars
        count, where = _ints(repeats, "Tile tiles", err), _ints(axis, "Tile axis", err)
        out = [1] * rank
        out[_axis(where[0], rank, err)] = count[0]
        return out
    reps = _ints(repeats, "Tile repeats", err)
    if len(reps) != rank:
        raise err(f"Tile repeats {reps} must have one entry per input dim ({rank})")
    if any(r < 0 for r in reps):
        raise err(f"Tile repeats {reps} must be non-negative")
    return reps


def _tile_shape(ctx, x, repeats, axis=None):
    if x.shape is None:
        return [tensor_info(x.dtype, None)]
    rank = len(x.shape)
    reps_value = known_value(repeats)
    if reps_value is None or (ctx.opset < 6 and known_value(axis) is None):
        return [tensor_info(x.dtype, (None,) * rank)]
    reps = _tile_repeats(ctx, rank, reps_value, known_value(axis), ShapeInferenceError)
    dims = [d * r if isinstance(d, int) else (d if r == 1 else (0 if r == 0 else None))
            for d, r in zip(x.shape, reps)]
    return fold(ctx, tile, [x, repeats, axis], [tensor_info(x.dtype, dims)])


@kernel("Tile", since=1, shape=_tile_shape)
def tile(ctx, x, repeats, axis=None):
    try:
        key = (x.shape, _contents(repeats), _contents(axis))
    except _NotInts:
        key = None
    plan = ctx.scratch.get("tile plan")
    if key is None or plan is None or plan[0] != key:
        reps = _tile_repeats(ctx, x.ndim, repeats, axis)
        if all(r == 1 for r in reps):
            return x.view()
        # the output viewed with an axis of repeats before each axis of x, and x (with a
        # length-1 axis there) copied into it by broadcasting: one copy (np.tile makes one
        # per axis)
        split = tuple(d for dim in x.shape for d in (1, dim))
        spread = tuple(d for rd in zip(reps, x.shape) for d in rd)
        merged = tuple(r * d for r, d in zip(reps, x.shape))
        check_shape(merged, x.dtype.itemsize, f"Tile output {list(merged)}")  # before allocating
        plan = (key, split, spread, merged)
        if key is not None:
            ctx.scratch["tile plan"] = plan
    y = np.empty(plan[3], x.dtype)
    np.copyto(y.reshape(plan[2]), x.reshape(plan[1]))
    return y


# --------------------------------------------------------------------------------------
# Pad


_PAD_MODES = ("constant", "reflect", "edge", "wrap")


def pad_widths(ctx, rank: int, pads, axes, err) -> list[tuple[int, int]]:
    if ctx.opset < 11:
        pads = ctx.get("pads") if ctx.opset >= 2 else ctx.get("paddings")
        if pads is None:
            raise err("Pad requires the 'pads' attribute")
        pads, axes = [int(p) for p in pads], None
    else:
        pads = _ints(pads, "Pad pads", err)
        axes = None if axes is None else _ints(axes, "Pad axes", err)
    axes = list(range(rank)) if axes is None else _axes(axes, rank, err)
    if len(pads) != 2 * len(axes):
        raise err(f"Pad pads {pads} must have 2 entries per padded axis ({len(axes)})")
    widths = [(0, 0)] * rank
    for i, a in enumerate(axes):
        widths[a] = (pads[i], pads[i + len(axes)])
    return widths


def pad_mode(ctx, err) -> str:
    mode = ctx.get("mode", "constant")
    if mode not in _PAD_MODES or (mode == "wrap" and ctx.opset < 19):
        raise err(f"unsupported Pad mode {mode!r}")
    return mode


def _pad_shape(ctx, data, pads=None, constant_value=None, axes=None):
    pad_mode(ctx, ShapeInferenceError)
    if data.shape is None:
        return [tensor_info(data.dtype, None)]
    rank = len(data.shape)
    if ctx.opset >= 11:
        pads_value = known_value(pads)
        axes_value = None if axes is None else known_value(axes)
        if pads_value is None or (axes is not None and axes_value is None):
            if axes is None:
                return [tensor_info(data.dtype, (None,) * rank)]
            if axes_value is None:
                return [tensor_info(data.dtype, (None,) * rank)]
            touched = set(_axes(_ints(axes_value, "Pad axes", ShapeInferenceError), rank,
                                ShapeInferenceError))
            return [tensor_info(data.dtype, tuple(None if a in touched else d
                                           for a, d in enumerate(data.shape)))]
    else:
        pads_value = axes_value = None
    widths = pad_widths(ctx, rank, pads_value, axes_value, ShapeInferenceError)
    dims: list[Dim] = []
    for d, (b, e) in zip(data.shape, widths):
        if isinstance(d, int):
            if d + b + e < 0:
                raise ShapeInferenceError(f"Pad pads {widths} remove more than dim {d}")
            dims.append(d + b + e)
        else:
            dims.append(d if b == e == 0 else None)
    return fold(ctx, pad, [data, pads, constant_value, axes], [tensor_info(data.dtype, dims)])


class _PadPlan:
    """A Pad node's geometry for one input shape and pads/axes contents: the input is copied
    into the interior of the output, then the border slabs of each padded axis are filled."""

    __slots__ = ("key", "mode", "crop", "noop", "out_shape", "interior", "borders")

    def __init__(self, ctx, key, data, pads, axes):
        self.key = key
        self.mode = mode = pad_mode(ctx, KernelError)
        widths = pad_widths(ctx, data.ndim, pads, axes, KernelError)
        shape = data.shape
        self.crop = None
        if any(b < 0 or e < 0 for b, e in widths):  # negative pads crop
            crop = []
            for d, (b, e) in zip(shape, widths):
                start, stop = max(-b, 0), d - max(-e, 0)
                if stop < start:
                    raise KernelError(f"Pad pads {widths} remove more than dim {d}")
                crop.append(slice(start, stop))
            self.crop = tuple(crop)
            shape = tuple(s.stop - s.start for s in crop)
            widths = [(max(b, 0), max(e, 0)) for b, e in widths]
        self.noop = all(b == 0 and e == 0 for b, e in widths)
        self.out_shape = tuple(d + b + e for d, (b, e) in zip(shape, widths))
        check_shape(self.out_shape, data.dtype.itemsize, f"Pad output {list(self.out_shape)}")  # pads from the model
        self.interior = interior = tuple(slice(b, b + d) for d, (b, _) in zip(shape, widths))
        # Per padded axis, in order (as np.pad does: an axis' border spans the borders of
        # the axes padded before it): (destination slab, source region, source positions).
        # Constant mode fills the slabs with the value; the others copy the positions np.pad
        # reads (np.pad of an arange), which lie in the region's interior along the axis.
        self.borders = []
        for a, (d, (b, e)) in enumerate(zip(shape, widths)):
            if not (b or e):
                continue
            if mode != "constant" and d == 0:
                raise KernelError(f"Pad mode {mode!r} cannot pad an empty axis")
            region = tuple(slice(None) if k <= a else interior[k] for k in range(len(shape)))
            index = np.pad(np.arange(d, dtype=np.intp), (b, e), mode=mode) + b \
                if mode != "constant" else None
            for lo, hi in ((0, b), (b + d, b + d + e)):
                if hi > lo:
                    slab = region[:a] + (slice(lo, hi),) + region[a + 1:]
                    source = None if index is None else _as_slice(index[lo:hi])
                    if isinstance(source, slice):  # a strided (or broadcast) copy
                        source = region[:a] + (source,) + region[a + 1:]
                    self.borders.append((a, slab, region, source))


def _as_slice(positions: np.ndarray):
    """The positions as a slice when they are one position repeated (the copy then
    broadcasts) or a run with step +-1, else the array itself (for np.take)."""
    first, last = int(positions[0]), int(positions[-1])
    if np.all(positions == first):
        return slice(first, first + 1)
    step = 1 if last > first else -1
    if np.array_equal(positions, np.arange(first, last + step, step)):
        return slice(first, last + step if last + step >= 0 else None, step)
    return positions


def pad(ctx, data, pads=None, constant_value=None, axes=None):
    if data.dtype.kind not in "biuf":
        return _pad(ctx, data, pads, constant_value, axes)
    try:
        key = (data.shape, _contents(pads), _contents(axes))
    except _NotInts:
        return _pad(ctx, data, pads, constant_value, axes)
    plan = ctx.scratch.get("pad plan")
    if plan is None or plan.key != key:
        plan = ctx.scratch["pad plan"] = _PadPlan(ctx, key, data, pads, axes)
    if plan.crop is not None:
        data = data[plan.crop]
    if plan.noop:
        return data.view()
    out = np.empty(plan.out_shape, data.dtype)
    out[plan.interior] = data
    if plan.mode == "constant":
        value = pad_value(ctx, constant_value)
        if not (isinstance(value, np.generic) and value.dtype == data.dtype):
            value = np.array(value).astype(data.dtype)  # as the general path converts it
        for _, slab, _, _ in plan.borders:
            out[slab] = value
    else:
        for axis, slab, region, source in plan.borders:
            if isinstance(source, tuple):
                out[slab] = out[source]
            else:
                out[slab] = np.take(out[region], source, axis=axis)
    return out


def pad_value(ctx, constant_value):
    """The constant mode's fill value: the attribute before opset 11, then the optional input."""
    if ctx.opset < 11:
        return ctx.get("value", 0.0)
    if constant_value is None or constant_value.size == 0:
        return 0
    return constant_value.reshape(-1)[0]


def _pad(ctx, data, pads=None, constant_value=None, axes=None):
    mode = pad_mode(ctx, KernelError)
    widths = pad_widths(ctx, data.ndim, pads, axes, KernelError)
    if any(b < 0 or e < 0 for b, e in widths):  # negative pads crop
        crop = []
        for d, (b, e) in zip(data.shape, widths):
            start, stop = max(-b, 0), d - max(-e, 0)
            if stop < start:
                raise KernelError(f"Pad pads {widths} remove more than dim {d}")
            crop.append(slice(start, stop))
        data = data[tuple(crop)]
        widths = [(max(b, 0), max(e, 0)) for b, e in widths]
    if all(b == 0 and e == 0 for b, e in widths):
        return data.view()
    out_shape = tuple(d + b + e for d, (b, e) in zip(data.shape, widths))
    check_shape(out_shape, data.dtype.itemsize, f"Pad output {list(out_shape)}")  # pads from the model
    if mode == "constant":
        value = pad_value(ctx, constant_value)
        if data.dtype == object:
            out = np.full(out_shape, "" if value == 0 else value, dtype=object)
        else:
            fill = np.array(value).astype(data.dtype)
            out = np.empty(out_shape, dtype=data.dtype) if fill else np.zeros(out_shape, data.dtype)
            if fill:
                out.fill(fill)
        out[tuple(slice(b, b + d) for d, (b, _) in zip(data.shape, widths))] = data
        return out
    for d, (b, e) in zip(data.shape, widths):
        if (b or e) and d == 0:
            raise KernelError(f"Pad mode {mode!r} cannot pad an empty axis")
    return np.pad(data, widths, mode=mode)


for _since in (1, 2, 11, 18, 19):
    kernel("Pad", since=_since, shape=_pad_shape)(pad)


# --------------------------------------------------------------------------------------
# Identity, Dropout


def _identity_shape(ctx, x):
    if x is None or not isinstance(x, TensorInfo):
        return [x]
    if x.kind != "tensor":  # a sequence or optional passes through as it is
        return [TensorInfo(x.dtype, x.shape, kind=x.kind)]
    out = tensor_info(x.dtype, x.shape)
    return fold(ctx, identity, [x], [out], symbolic=True)


@kernel("Identity", since=1, shape=_identity_shape)
def identity(ctx, x):
    return x.view() if isinstance(x, np.ndarray) else x


def _dropout_shape(ctx, data, ratio=None, training_mode=None):
    outs = [tensor_info(data.dtype, data.shape)]
    if ctx.num_outputs > 1:
        outs.append(tensor_info(np.bool_ if ctx.opset >= 10 else data.dtype, data.shape))
    if ctx.opset >= 12 and training_mode is not None:
        training = known_value(training_mode)
        if training is None or bool(np.asarray(training).reshape(-1)[0]):
            return outs  # may be random: never folded
    return fold(ctx, dropout, [data], outs)


@kernel("Dropout", since=1, shape=_dropout_shape)
def dropout(ctx, data, ratio=None, training_mode=None):
    """Inference: the identity. Training mode (opset >= 12 input) drops at random."""
    mask_dtype = np.bool_ if ctx.opset >= 10 else data.dtype
    training = (ctx.opset >= 12 and training_mode is not None
                and bool(np.asarray(training_mode).reshape(-1)[0]))
    rate = 0.5 if ratio is None else float(np.asarray(ratio).reshape(-1)[0])
    if training and rate != 0:
        if not 0 <= rate < 1:
            raise KernelError(f"Dropout ratio {rate} must be in [0, 1)")
        seed = ctx.get("seed")
        rng = np.random.RandomState(seed) if seed is not None else np.random.RandomState()
        keep = rng.uniform(0, 1.0, data.shape) >= rate
        out = (keep * data * (1.0 / (1.0 - rate))).astype(data.dtype)
        return (out, keep) if ctx.num_outputs > 1 else out
    if ctx.num_outputs > 1:
        return data.view(), np.ones(data.shape, dtype=mask_dtype)
    return data.view()


# --------------------------------------------------------------------------------------
# DepthToSpace, SpaceToDepth


def _blocksize(ctx, err) -> int:
    size = ctx.get("blocksize")
    if size is None or int(size) < 1:
        raise err("blocksize must be a positive integer")
    return int(size)


def _block_mode(ctx, err) -> str:
    mode = ctx.get("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise err(f"unsupported mode {mode!r}")
    return mode


def _depth_to_space_shape(ctx, x):
    bs = _blocksize(ctx, ShapeInferenceError)
    _block_mode(ctx, ShapeInferenceError)
    if x.shape is None:
        return [tensor_info(x.dtype, (None,) * 4)]
    if len(x.shape) != 4:
        raise ShapeInferenceError(f"DepthToSpace expects a 4-D input, got {x.shape}")
    b, c, h, w = x.shape
    if isinstance(c, int) and c % (bs * bs):
        raise ShapeInferenceError(f"DepthToSpace channels {c} not divisible by blocksize^2")
    scale = lambda d, f: d * f if isinstance(d, int) else (d if f == 1 else None)  # noqa: E731
    c_out = c // (bs * bs) if isinstance(c, int) else (c if bs == 1 else None)
    return fold(ctx, depth_to_space, [x], [tensor_info(x.dtype, (b, c_out, scale(h, bs), scale(w, bs)))])


@kernel("DepthToSpace", since=1, shape=_depth_to_space_shape)
def depth_to_space(ctx, x):
    bs, mode = _blocksize(ctx, KernelError), _block_mode(ctx, KernelError)
    if x.ndim != 4 or x.shape[1] % (bs * bs):
        raise KernelError(f"DepthToSpace cannot rearrange {x.shape} with blocksize {bs}")
    b, c, h, w = x.shape
    if mode == "DCR":
        tmp = x.reshape(b, bs, bs, c // (bs * bs), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        tmp = x.reshape(b, c // (bs * bs), bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    return tmp.reshape(b, c // (bs * bs), h * bs, w * bs)


def _space_to_depth_shape(ctx, x):
    bs = _blocksize(ctx, ShapeInferenceError)
    _block_mode(ctx, ShapeInferenceError)
    if x.shape is None:
        return [tensor_info(x.dtype, (None,) * 4)]
    if len(x.shape) != 4:
        raise ShapeInferenceError(f"SpaceToDepth expects a 4-D input, got {x.shape}")
    b, c, h, w = x.shape
    for d in (h, w):
        if isinstance(d, int) and d % bs:
            raise ShapeInferenceError(f"SpaceToDepth spatial dim {d} not divisible by {bs}")
    shrink = lambda d: d // bs if isinstance(d, int) else (d if bs == 1 else None)  # noqa: E731
    c_out = c * bs * bs if isinstance(c, int) else (c if bs == 1 else None)
    return fold(ctx, space_to_depth, [x], [tensor_info(x.dtype, (b, c_out, shrink(h), shrink(w)))])


@kernel("SpaceToDepth", since=1, shape=_space_to_depth_shape)
def space_to_depth(ctx, x):
    bs, mode = _blocksize(ctx, KernelError), _block_mode(ctx, KernelError)
    if x.ndim != 4 or x.shape[2] % bs or x.shape[3] % bs:
        raise KernelError(f"SpaceToDepth cannot rearrange {x.shape} with blocksize {bs}")
    b, c, h, w = x.shape
    tmp = x.reshape(b, c, h // bs, bs, w // bs, bs)
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    return tmp.transpose(perm).reshape(b, c * bs * bs, h // bs, w // bs)
