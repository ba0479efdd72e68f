"""Sampling kernels: GridSample (opsets 16, 20, 22), AffineGrid (20) and DeformConv (19, 22).

All three read an input at fractional positions. The positions are turned, one spatial
axis at a time, into a few integer taps with weights (2 for linear, 4 for cubic, 1 for
nearest); every combination of taps across the axes is then one gather of whole channel
vectors (the input is laid out channels-last for that) scaled by the product of the
weights. So a 2-D bilinear sample is four gathers over all output positions at once, with
no per-element Python loops.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.conv import attr_list, pads_attr
from nncc.kernels.registry import kernel
from nncc.kernels.shapes import known_value

_CUBIC_A = np.float32(-0.75)  # Keys' cubic convolution constant, as in PyTorch and ONNX


def _compute_dtype(*dtypes) -> np.dtype:
    """float64 when any operand is float64, else float32 (float16 and integers included)."""
    return np.dtype(np.float64) if any(np.dtype(d) == np.float64 for d in dtypes) \
        else np.dtype(np.float32)


def _channels_last(x: np.ndarray, dtype) -> np.ndarray:
    """(N, C, *spatial) as (N, prod(spatial), C) in the compute dtype: a tap is one gather
    of contiguous channel vectors."""
    n, c = x.shape[:2]
    return np.ascontiguousarray(x.reshape(n, c, -1).transpose(0, 2, 1), dtype=dtype)


def _combine_taps(xt: np.ndarray, axis_taps, sizes, out_shape) -> np.ndarray:
    """Sum over every combination of per-axis taps of weight * gathered value.

    xt: (N, P, C) channels-last input; axis_taps[i]: list of (index, weight) pairs for
    spatial axis i, each array of shape (N, Q) (indices already inside [0, sizes[i]),
    weights zero where a tap falls outside). Returns (N, C, *out_shape).
    """
    n, _, c = xt.shape
    strides = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
    batch = np.arange(n)[:, None]
    acc = None
    for combo in itertools.product(*axis_taps):
        flat = combo[0][0] * strides[0]
        weight = combo[0][1]
        for (index, w), stride in zip(combo[1:], strides[1:]):
            flat = flat + index * stride
            weight = weight * w
        term = xt[batch, flat] * weight[..., None]  # (N, Q, C)
        acc = term if acc is None else acc + term
    return acc.transpose(0, 2, 1).reshape((n, c) + tuple(out_shape))


# --------------------------------------------------------------------------- GridSample

_GS_MODES_16 = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
_GS_MODES_20 = {"linear": "linear", "nearest": "nearest", "cubic": "cubic"}
_GS_PADDING = ("zeros", "border", "reflection")


def _gs_attrs(ctx, err):
    names = _GS_MODES_20 if ctx.opset >= 20 else _GS_MODES_16
    mode = ctx.get("mode", "linear" if ctx.opset >= 20 else "bilinear")
    if mode not in names:
        raise err(f"GridSample: unknown mode {mode!r} (expected one of {', '.join(names)})")
    padding = ctx.get("padding_mode", "zeros")
    if padding not in _GS_PADDING:
        raise err(f"GridSample: unknown padding_mode {padding!r} "
                  f"(expected one of {', '.join(_GS_PADDING)})")
    return names[mode], padding, bool(ctx.get("align_corners", 0))


def _gs_check(ctx, x_shape, grid_shape, err):
    if x_shape is None or grid_shape is None:
        return
    r = len(x_shape) - 2
    if r < 1 or (ctx.opset < 20 and r != 2):
        raise err(f"GridSample: input of rank {len(x_shape)} is not supported "
                  f"({'4-D only before opset 20' if ctx.opset < 20 else 'need rank >= 3'})")
    if len(grid_shape) != r + 2:
        raise err(f"GridSample: grid of shape {grid_shape} does not match an input of rank {len(x_shape)}")
    last = grid_shape[-1]
    if isinstance(last, int) and last != r:
        raise err(f"GridSample: the grid's last axis must be {r}, got {last}")
    a, b = x_shape[0], grid_shape[0]
    if isinstance(a, int) and isinstance(b, int) and a != b:
        raise err(f"GridSample: batch sizes differ (input {a}, grid {b})")


def _gs_shape(ctx, x, grid):
    _gs_attrs(ctx, ShapeInferenceError)
    _gs_check(ctx, x.shape, grid.shape, ShapeInferenceError)
    if x.shape is None or grid.shape is None:
        return [TensorInfo(x.dtype, None)]
    return [TensorInfo(x.dtype, (x.shape[0], x.shape[1]) + tuple(grid.shape[1:-1]))]


def _reflect(v, lo: float, hi: float):
    """Fold coordinates outside [lo, hi] back in by mirroring at the borders, repeatedly."""
    span = hi - lo
    if span <= 0:
        return np.full_like(v, lo)
    below, above = v < lo, v > hi
    dist = np.where(below, lo - v, np.where(above, v - hi, 0))
    flips = np.floor(dist / span)
    rest = dist - flips * span
    even = flips % 2 == 0
    from_lo, from_hi = lo + rest, hi - rest
    folded = np.where(below, np.where(even, from_lo, from_hi), np.where(even, from_hi, from_lo))
    return np.where(below | above, folded, v).astype(v.dtype, copy=False)


def _cubic_weights(t):
    """Keys' weights of the taps at offsets -1, 0, 1, 2 from floor(x), t = x - floor(x)."""
    a = _CUBIC_A

    def near(d):  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return far(t + 1), near(t), near(1 - t), far(2 - t)


def _tap(index, weight, size, padding, lo, hi):
    """(index inside [0, size), weight) of one tap under the padding mode."""
    if padding == "zeros":
        inside = (index >= 0) & (index < size)
        return np.where(inside, index, 0), np.where(inside, weight, 0).astype(weight.dtype)
    if padding == "border":
        return np.clip(index, 0, size - 1), weight
    mirrored = np.trunc(_reflect(index.astype(np.float64), lo, hi)).astype(np.int64)
    return np.clip(mirrored, 0, size - 1), weight


def grid_sample(x: np.ndarray, grid: np.ndarray, mode: str, padding: str,
                align_corners: bool) -> np.ndarray:
    """Sample x (N, C, *spatial) at the normalized positions of grid (N, *out, r)."""
    sizes = x.shape[2:]
    r = len(sizes)
    out_shape = grid.shape[1:-1]
    n = x.shape[0]
    dtype = _compute_dtype(x.dtype, grid.dtype)
    if x.size == 0 or grid.size == 0:
        return np.zeros((n, x.shape[1]) + tuple(out_shape), dtype=x.dtype)
    g = grid.reshape(n, -1, r).astype(dtype, copy=False)
    one, two = dtype.type(1), dtype.type(2)
    xt = _channels_last(x, dtype)
    axis_taps = []
    for i, size in enumerate(sizes):
        u = g[..., r - 1 - i]  # the grid lists coordinates innermost axis first
        length = dtype.type(size)
        if align_corners:
            v = (u + one) / two * (length - one)
            lo, hi = 0.0, float(size - 1)
        else:
            v = ((u + one) * length - one) / two
            lo, hi = -0.5, size - 0.5
        # Padding applies to each tap, not to the position: for linear and nearest sampling
        # that equals clamping or mirroring the position first, and for cubic it is what
        # PyTorch and onnxruntime do (ONNX's reference clamps the position under border).
        if mode == "nearest":
            v = np.rint(v)  # ties to even, as PyTorch
            index = np.trunc(v).astype(np.int64)
            axis_taps.append([_tap(index, np.ones_like(v), size, padding, lo, hi)])
            continue
        base = np.floor(v)
        t = v - base
        base = base.astype(np.int64)
        if mode == "linear":
            pairs = [(base, one - t), (base + 1, t)]
        else:
            pairs = list(zip((base - 1, base, base + 1, base + 2), _cubic_weights(t)))
        axis_taps.append([_tap(index, w, size, padding, lo, hi) for index, w in pairs])
    y = _combine_taps(xt, axis_taps, sizes, out_shape)
    return y.astype(x.dtype, copy=False)


def _gs_kernel(ctx, x, grid):
    mode, padding, align = _gs_attrs(ctx, KernelError)
    _gs_check(ctx, x.shape, grid.shape, KernelError)
    return grid_sample(x, grid, mode, padding, align)


@kernel("GridSample", since=16, shape=_gs_shape)
def gridsample_v16(ctx, x, grid):
    return _gs_kernel(ctx, x, grid)


@kernel("GridSample", since=20, shape=_gs_shape)
def gridsample_v20(ctx, x, grid):
    return _gs_kernel(ctx, x, grid)


@kernel("GridSample", since=22, shape=_gs_shape)
def gridsample_v22(ctx, x, grid):
    return _gs_kernel(ctx, x, grid)


# --------------------------------------------------------------------------- AffineGrid


def _affine_sizes(size, theta_shape, err):
    size = np.asarray(size).reshape(-1)
    if size.size not in (4, 5):
        raise err(f"AffineGrid: size must hold 4 (2-D) or 5 (3-D) values, got {size.size}")
    dims = [int(v) for v in size]
    if any(d <= 0 for d in dims):
        raise err(f"AffineGrid: size must be positive, got {dims}")
    r = len(dims) - 2
    if theta_shape is not None:
        want = (dims[0], r, r + 1)
        if len(theta_shape) != 3 or any(isinstance(a, int) and a != b
                                        for a, b in zip(theta_shape, want)):
            raise err(f"AffineGrid: theta of shape {tuple(theta_shape)} does not match size "
                      f"{dims} (expected {want})")
    return dims


def _affine_shape(ctx, theta, size):
    value = known_value(size)
    if value is not None:
        dims = _affine_sizes(value, theta.shape, ShapeInferenceError)
        return [TensorInfo(theta.dtype, (dims[0], *dims[2:], len(dims) - 2))]
    count = size.shape[0] if size.shape and isinstance(size.shape[0], int) else None
    batch = theta.shape[0] if theta.shape else None
    if count is None:
        return [TensorInfo(theta.dtype, None)]
    if count not in (4, 5):
        raise ShapeInferenceError(f"AffineGrid: size must hold 4 (2-D) or 5 (3-D) values, "
                                  f"got {count}")
    return [TensorInfo(theta.dtype, (batch,) + (None,) * (count - 2) + (count - 2,))]


def _base_coords(length: int, align_corners: bool) -> np.ndarray:
    """Normalized positions in [-1, 1] of the pixels along one axis. A single pixel sits at
    the center, 0, in both modes, as in PyTorch (whose affine_grid the operator follows;
    onnxruntime answers 1 and ONNX's reference -1 for that 0/0 case)."""
    i = np.arange(length, dtype=np.float64)
    if align_corners:
        return -1 + 2 * i / (length - 1) if length > 1 else np.zeros(1)
    return -1 + (2 * i + 1) / length


@kernel("AffineGrid", since=20, shape=_affine_shape)
def affine_grid(ctx, theta, size):
    dims = _affine_sizes(size, theta.shape, KernelError)
    spatial = dims[2:]
    r = len(spatial)
    align = bool(ctx.get("align_corners", 0))
    # homogeneous position (x, y[, z], 1) of every output point, x along the last axis
    axes = [_base_coords(d, align) for d in reversed(spatial)]
    mesh = np.meshgrid(*axes[::-1], indexing="ij")  # each of shape spatial
    points = np.stack([m.reshape(-1) for m in mesh[::-1]] + [np.ones(math.prod(spatial))])
    grid = np.matmul(theta.astype(np.float64), points)  # (N, r, P)
    return np.ascontiguousarray(grid.transpose(0, 2, 1)).reshape(
        (dims[0], *spatial, r)).astype(theta.dtype)


# --------------------------------------------------------------------------- DeformConv


def _deform_geometry(ctx, x_shape, w_shape, err):
    """Kernel shape, strides, dilations, pads and output spatial sizes (None if unknown)."""
    r = len(x_shape) - 2
    if r < 1 or len(w_shape) != r + 2:
        raise err(f"DeformConv: input of shape {tuple(x_shape)} and weights of shape "
                  f"{tuple(w_shape)} do not match")
    k = ctx.get("kernel_shape")
    k = list(w_shape[2:]) if k is None else [int(v) for v in k]
    if len(k) != r:
        raise err(f"DeformConv: kernel_shape has {len(k)} values, expected {r}")
    strides = attr_list(ctx, "strides", r, 1, "DeformConv", err)
    dilations = attr_list(ctx, "dilations", r, 1, "DeformConv", err)
    begin, end = pads_attr(ctx, r, "DeformConv", err)
    out = []
    for i in range(r):
        size = x_shape[2 + i]
        if not isinstance(size, int) or not isinstance(k[i], int):
            out.append(None)
            continue
        if strides[i] <= 0 or dilations[i] <= 0 or k[i] <= 0:
            raise err("DeformConv: strides, dilations and kernel sizes must be positive")
        span = size + begin[i] + end[i] - ((k[i] - 1) * dilations[i] + 1)
        if span < 0:
            raise err(f"DeformConv: the kernel does not fit the padded input along axis {2 + i}")
        out.append(span // strides[i] + 1)
    return k, strides, dilations, begin, out


def _deform_shape(ctx, x, w, offset, b=None, mask=None):
    if x.shape is None or w.shape is None:
        return [TensorInfo(x.dtype, None)]
    _, _, _, _, out = _deform_geometry(ctx, x.shape, w.shape, ShapeInferenceError)
    return [TensorInfo(x.dtype, (x.shape[0], w.shape[0], *out))]


def _deform_conv(ctx, x, w, offset, b=None, mask=None):
    k, strides, dilations, begin, out = _deform_geometry(ctx, x.shape, w.shape, KernelError)
    n, c = x.shape[:2]
    sizes = x.shape[2:]
    r = len(sizes)
    oc = w.shape[0]
    group = int(ctx.get("group", 1))
    offset_group = int(ctx.get("offset_group", 1))
    taps = math.prod(k)
    q = math.prod(out)
    if group <= 0 or c % group or oc % group or w.shape[1] * group != c:
        raise KernelError(f"DeformConv: {c} input channels, weights {w.shape} and group {group} "
                          f"do not match")
    if offset_group <= 0 or c % offset_group:
        raise KernelError(f"DeformConv: {c} input channels are not divisible by "
                          f"offset_group {offset_group}")
    want = (n, offset_group * taps * r, *out)
    if offset.shape != want:
        raise KernelError(f"DeformConv: offset has shape {offset.shape}, expected {want}")
    if mask is not None and mask.shape != (n, offset_group * taps, *out):
        raise KernelError(f"DeformConv: mask has shape {mask.shape}, expected "
                          f"{(n, offset_group * taps, *out)}")
    dtype = _compute_dtype(x.dtype, w.dtype, offset.dtype)
    # sampling positions (N * offset_group, taps, Q) along each spatial axis
    off = offset.reshape(n * offset_group, taps, r, q).astype(dtype, copy=False)
    kernel_pos = np.stack(np.meshgrid(*[np.arange(kk) for kk in k], indexing="ij"))
    kernel_pos = kernel_pos.reshape(r, taps)
    out_pos = np.stack(np.meshgrid(*[np.arange(o) for o in out], indexing="ij")).reshape(r, q)
    cg = c // offset_group
    # each offset group samples its own slice of channels: fold it into the batch axis
    xt = _channels_last(x.reshape(n * offset_group, cg, *sizes), dtype)
    axis_taps = []
    for i, size in enumerate(sizes):
        base = (out_pos[i] * strides[i] - begin[i])[None, :] + (kernel_pos[i] * dilations[i])[:, None]
        v = (base[None] + off[:, :, i]).reshape(n * offset_group, taps * q)
        low = np.floor(v)
        t = v - low
        low = low.astype(np.int64)
        axis_taps.append([_tap(low, 1 - t, size, "zeros", 0, 0),
                          _tap(low + 1, t, size, "zeros", 0, 0)])
    cols = _combine_taps(xt, axis_taps, sizes, (taps, q))  # (N * og, cg, taps, Q)
    if mask is not None:
        cols = cols * mask.reshape(n * offset_group, 1, taps, q).astype(dtype, copy=False)
    cols = cols.reshape(n, group, (c // group) * taps, q)
    weights = w.reshape(group, oc // group, (c // group) * taps).astype(dtype, copy=False)
    y = np.matmul(weights[None], cols)  # (N, group, oc / group, Q)
    y = y.reshape(n, oc, *out)
    if b is not None:
        y = y + b.astype(dtype).reshape((1, oc) + (1,) * r)
    return y.astype(x.dtype, copy=False)


@kernel("DeformConv", since=19, shape=_deform_shape)
def deform_conv_v19(ctx, x, w, offset, b=None, mask=None):
    return _deform_conv(ctx, x, w, offset, b, mask)


@kernel("DeformConv", since=22, shape=_deform_shape)
def deform_conv_v22(ctx, x, w, offset, b=None, mask=None):
    return _deform_conv(ctx, x, w, offset, b, mask)
