"""Resize (opsets 10, 11, 13, 18, 19) and the deprecated Upsample (7, 9, 10): nearest, linear
and cubic, with antialiasing.

Interpolation is separable: each resized axis is processed in turn. Per axis, the source
coordinate of every output position is computed once (a small float32 vector, as ONNX
Runtime computes it, so ties in nearest mode resolve the same way); nearest
mode is then a single gather (np.take) and linear/cubic a short sum over filter taps of
gathers times per-position weights (2 taps for linear, 4 for cubic, more when
antialiasing a downscale). No per-element Python loops.
"""

from __future__ import annotations

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import kernel
from nncc.kernels.shapes import known_value
from nncc.util.limits import check_shape

_MODES = ("nearest", "linear", "cubic")
_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_crop_and_resize")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_POLICIES = ("stretch", "not_larger", "not_smaller")


# --------------------------------------------------------------------------- attributes / plan


def resize_axes(ctx, rank, err):
    axes = ctx.get("axes") if ctx.opset >= 18 else None
    if axes is None:
        return list(range(rank))
    out = []
    for a in axes:
        a = int(a)
        if not -rank <= a < rank:
            raise err(f"Resize: axis {a} is out of range for rank {rank}")
        out.append(a + rank if a < 0 else a)
    if len(set(out)) != len(out):
        raise err(f"Resize: duplicate axes {list(axes)}")
    return out


def is_present(arr):
    return arr is not None and np.asarray(arr).size > 0


def resize_plan(ctx, in_shape, scales, sizes, err):
    """Output sizes and per-axis scale factors (float32, as ONNX Runtime) for every axis.

    in_shape entries may be None/str; output sizes are then None where they depend on them.
    """
    rank = len(in_shape)
    axes = resize_axes(ctx, rank, err)
    policy = ctx.get("keep_aspect_ratio_policy", "stretch") if ctx.opset >= 18 else "stretch"
    if policy not in _POLICIES:
        raise err(f"Resize: unknown keep_aspect_ratio_policy {policy!r}")
    has_scales, has_sizes = is_present(scales), is_present(sizes)
    if has_scales and has_sizes:
        raise err("Resize: only one of 'scales' and 'sizes' may be given")
    if not has_scales and not has_sizes:
        raise err("Resize: one of 'scales' and 'sizes' must be given")
    out_sizes = list(in_shape)
    factors = [1.0] * rank
    if has_scales:
        scales = np.asarray(scales, dtype=np.float32).reshape(-1)
        if scales.size != len(axes):
            raise err(f"Resize: 'scales' has {scales.size} values, expected {len(axes)}")
        if np.any(scales <= 0):
            raise err(f"Resize: scales must be positive, got {scales.tolist()}")
        for a, s in zip(axes, scales):
            factors[a] = s
            d = in_shape[a]
            if isinstance(d, int):
                out_sizes[a] = int(np.floor(np.float32(d) * s))  # float32 product, as ONNX Runtime
            elif s != 1:
                out_sizes[a] = None
        return out_sizes, factors
    sizes = np.asarray(sizes, dtype=np.int64).reshape(-1)
    if sizes.size != len(axes):
        raise err(f"Resize: 'sizes' has {sizes.size} values, expected {len(axes)}")
    if np.any(sizes <= 0):
        raise err(f"Resize: sizes must be positive, got {sizes.tolist()}")
    sizes = sizes.tolist()
    known = all(isinstance(in_shape[a], int) for a in axes)
    if policy == "stretch":
        for a, s in zip(axes, sizes):
            out_sizes[a] = int(s)
            d = in_shape[a]
            factors[a] = np.float32(s) / np.float32(d) if isinstance(d, int) and d > 0 else None
        return out_sizes, factors
    if not known:
        for a in axes:
            out_sizes[a] = None
            factors[a] = None
        return out_sizes, factors
    ratios = [np.float32(s) / np.float32(in_shape[a]) for a, s in zip(axes, sizes)]
    scale = min(ratios) if policy == "not_larger" else max(ratios)
    for a in axes:
        factors[a] = scale
        out_sizes[a] = int(np.floor(scale * np.float32(in_shape[a]) + np.float32(0.5)))  # round half up
    return out_sizes, factors


# --------------------------------------------------------------------------- per-axis math


def _source_coords(mode, out_n, in_n, scale, roi_lo, roi_hi):
    """Source coordinate (float32) of each of the out_n output positions along one axis."""
    y = np.arange(out_n, dtype=np.float32)
    scale = np.float32(scale)
    roi_lo, roi_hi = np.float32(roi_lo), np.float32(roi_hi)
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = out_n / (scale * in_n)
        offset = in_n / 2 * (1 - adjustment)
        return offset + (y + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (y + 0.5) / scale - 0.5 if out_n > 1 else np.zeros(out_n)
    if mode == "align_corners":
        return y * (in_n - 1) / (out_n - 1) if out_n > 1 else np.zeros(out_n)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_crop_and_resize":
        if out_n > 1:
            return roi_lo * (in_n - 1) + y * (roi_hi - roi_lo) * (in_n - 1) / (out_n - 1)
        return np.full(out_n, 0.5 * (roi_lo + roi_hi) * (in_n - 1))
    raise KernelError(f"Resize: unknown coordinate_transformation_mode {mode!r}")


def _cubic_kernel(d, a):
    d = np.abs(d)
    d2 = d * d
    d3 = d2 * d
    near = (a + 2) * d3 - (a + 3) * d2 + 1
    far = a * d3 - 5 * a * d2 + 8 * a * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def filter_taps(mode, x, in_n, scale, antialias, cubic_a, exclude_outside):
    """(indices, weights) of shape (taps, out_n) for linear/cubic along one axis."""
    # x = base + r with r in (0, 1] (an exact integer x uses r = 1), as the ONNX reference does
    base = np.ceil(x) - 1
    r = x - base
    support = 1.0 if mode == "linear" else 2.0
    s = min(scale, 1.0) if antialias else 1.0
    start = int(np.floor(-support / s)) + 1
    n = 2 - 2 * start
    k = np.arange(start, start + n, dtype=np.float64)[:, None]
    dist = (k - r[None, :]) * s
    if mode == "linear":
        w = np.clip(1.0 - np.abs(dist), 0.0, 1.0)
    else:
        w = _cubic_kernel(dist, cubic_a)
    idx = (base[None, :] + k).astype(np.int64)
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= in_n), 0.0, w)
    if antialias or exclude_outside:
        total = w.sum(axis=0, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, in_n - 1), w


def _nearest_index(x, nearest_mode, opset10_down):
    if opset10_down is not None:
        # Resize-10: asymmetric; ceil when downsampling, floor when upsampling (as ONNX Runtime)
        return np.ceil(x) if opset10_down else np.floor(x)
    if nearest_mode == "round_prefer_floor":
        return np.ceil(x - 0.5)
    if nearest_mode == "round_prefer_ceil":
        return np.floor(x + 0.5)
    if nearest_mode == "floor":
        return np.floor(x)
    if nearest_mode == "ceil":
        return np.ceil(x)
    raise KernelError(f"Resize: unknown nearest_mode {nearest_mode!r}")


def _bshape(ndim, axis, n):
    shape = [1] * ndim
    shape[axis] = n
    return shape


def source_coords(in_n, out_n, scale, opts, roi_lo, roi_hi):
    """Source coordinates along one axis and the tf_crop_and_resize extrapolation mask."""
    x = _source_coords(opts["coord"], out_n, in_n, scale, roi_lo, roi_hi)
    outside = None
    if opts["coord"] == "tf_crop_and_resize":
        outside = (x < 0) | (x > in_n - 1)
        if not outside.any():
            outside = None
    return x, outside


def nearest_plan(in_n, out_n, scale, opts, roi_lo, roi_hi):
    x, outside = source_coords(in_n, out_n, scale, opts, roi_lo, roi_hi)
    idx = _nearest_index(x, opts["nearest_mode"], opts["opset10_down"](scale))
    return np.clip(idx, 0, in_n - 1).astype(np.intp), outside


def _extrapolate(y, axis, outside, value):
    if outside is None:
        return y
    if not y.flags.writeable or y.base is not None:
        y = y.copy()
    mask = outside.reshape(_bshape(y.ndim, axis, outside.size))
    np.copyto(y, np.asarray(value, dtype=y.dtype), where=mask)
    return y


def _resize_nearest(data, plans, opts):
    """plans: {axis: (indices, outside)}. Integer-factor upsampling axes use np.repeat."""
    for a in sorted(plans, reverse=True):  # innermost axis first: fewer, longer copies
        idx, outside = plans[a]
        in_n, out_n = data.shape[a], idx.size
        if outside is None and out_n % in_n == 0 and np.array_equal(idx, np.arange(out_n) // (out_n // in_n)):
            data = np.repeat(data, out_n // in_n, axis=a)
        else:
            data = _extrapolate(np.take(data, idx, axis=a), a, outside, opts["extrapolation"])
    return data


def _resize_axis(data, axis, out_n, scale, opts, roi_lo, roi_hi):
    """Linear / cubic interpolation along one axis."""
    in_n = data.shape[axis]
    x, outside = source_coords(in_n, out_n, scale, opts, roi_lo, roi_hi)
    idx, w = filter_taps(opts["mode"], x, in_n, scale, opts["antialias"], opts["cubic_a"],
                          opts["exclude_outside"])
    cdt = data.dtype
    ntaps = idx.shape[0]
    if in_n <= 64 * ntaps:
        # small axis: one BLAS matmul with the dense (out_n, in_n) interpolation matrix
        mat = np.zeros((out_n, in_n), dtype=np.float64)
        np.add.at(mat, (np.broadcast_to(np.arange(out_n), idx.shape), idx), w)
        mat = mat.astype(cdt)
        if axis == data.ndim - 1:
            y = np.matmul(data, mat.T)
        else:
            pre = int(np.prod(data.shape[:axis], dtype=np.int64))
            post = int(np.prod(data.shape[axis + 1:], dtype=np.int64))
            y = np.matmul(mat, data.reshape(pre, in_n, post))
            y = y.reshape(data.shape[:axis] + (out_n,) + data.shape[axis + 1:])
    else:
        # large axis: a sum over the few filter taps of gathers times weights
        y = None
        for t in range(ntaps):
            wt = w[t].astype(cdt).reshape(_bshape(data.ndim, axis, out_n))
            term = np.take(data, idx[t].astype(np.intp), axis=axis)
            term *= wt
            if y is None:
                y = term
            else:
                y += term
    return _extrapolate(y, axis, outside, opts["extrapolation"])


# --------------------------------------------------------------------------- kernels


def resize_options(ctx, err):
    mode = ctx.get("mode", "nearest")
    if mode not in _MODES:
        raise err(f"Resize: unknown mode {mode!r} (expected one of {', '.join(_MODES)})")
    if ctx.opset < 11:
        if mode == "cubic":
            raise err("Resize: mode 'cubic' needs opset >= 11")
        coord, nearest_mode = "asymmetric", None
    else:
        coord = ctx.get("coordinate_transformation_mode", "half_pixel")
        nearest_mode = ctx.get("nearest_mode", "round_prefer_floor")
        if coord not in _COORD_MODES:
            raise err(f"Resize: unknown coordinate_transformation_mode {coord!r}")
        if nearest_mode not in _NEAREST_MODES:
            raise err(f"Resize: unknown nearest_mode {nearest_mode!r}")
    return {
        "mode": mode,
        "coord": coord,
        "nearest_mode": nearest_mode,
        "opset10_down": (lambda s: s < 1.0) if ctx.opset < 11 else (lambda s: None),
        "antialias": bool(ctx.get("antialias", 0)) if ctx.opset >= 18 else False,
        "cubic_a": float(ctx.get("cubic_coeff_a", -0.75)),
        "exclude_outside": bool(ctx.get("exclude_outside", 0)),
        "extrapolation": float(ctx.get("extrapolation_value", 0.0)),
    }


def _resize(ctx, x, roi, scales, sizes):
    opts = resize_options(ctx, KernelError)
    if x.ndim == 0:
        raise KernelError("Resize: input must have rank >= 1")
    out_sizes, factors = resize_plan(ctx, x.shape, scales, sizes, KernelError)
    # scales or sizes from the model: the output (and its per-axis tables) checked before allocating
    check_shape(out_sizes, max(4, x.dtype.itemsize), f"Resize output {list(out_sizes)}")
    axes = resize_axes(ctx, x.ndim, KernelError)
    roi_full = None
    if opts["coord"] == "tf_crop_and_resize":
        if not is_present(roi):
            raise KernelError("Resize: coordinate_transformation_mode 'tf_crop_and_resize' needs 'roi'")
        roi = np.asarray(roi, dtype=np.float32).reshape(-1)
        if roi.size != 2 * len(axes):
            raise KernelError(f"Resize: 'roi' has {roi.size} values, expected {2 * len(axes)}")
        roi_full = {a: (roi[i], roi[len(axes) + i]) for i, a in enumerate(axes)}
    if opts["mode"] != "nearest" and x.dtype.kind not in "fiu":
        raise KernelError(f"Resize: mode {opts['mode']!r} does not support dtype {x.dtype}")
    out_dtype = x.dtype
    data = x
    if opts["mode"] != "nearest":
        data = x.astype(np.float64 if x.dtype == np.float64 else np.float32, copy=False)
    plans = {}
    for a in axes:
        lo, hi = roi_full[a] if roi_full is not None else (0.0, 1.0)
        if (out_sizes[a] == data.shape[a] and factors[a] == 1.0 and lo == 0.0 and hi == 1.0
                and opts["coord"] != "half_pixel_symmetric"):
            continue
        if out_sizes[a] == 0 or data.shape[a] == 0:
            return np.zeros([out_sizes[i] for i in range(x.ndim)], dtype=out_dtype)
        if opts["mode"] == "nearest":
            plans[a] = nearest_plan(data.shape[a], out_sizes[a], factors[a], opts, lo, hi)
        else:
            data = _resize_axis(data, a, out_sizes[a], factors[a], opts, lo, hi)
    if plans:
        data = _resize_nearest(data, plans, opts)
    if data.dtype != out_dtype:
        if out_dtype.kind in "iu":
            info = np.iinfo(out_dtype)
            data = np.clip(data, info.min, info.max)
        data = data.astype(out_dtype)
    elif data is x:
        data = x.copy()
    return data


def _resize_shape(ctx, x, roi=None, scales=None, sizes=None):
    opts_err = ShapeInferenceError
    resize_options(ctx, opts_err)
    if x.shape is None:
        return [TensorInfo(x.dtype, None)]
    rank = len(x.shape)
    sv, zv = known_value(scales), known_value(sizes)
    if (scales is not None and sv is None and (sizes is None or (zv is not None and zv.size == 0))) \
            or (sizes is not None and zv is None and (scales is None or (sv is not None and sv.size == 0))):
        # the relevant input is not known at compile time: rank only (non-resized axes kept)
        axes = set(resize_axes(ctx, rank, opts_err))
        return [TensorInfo(x.dtype, tuple(None if i in axes else d for i, d in enumerate(x.shape)))]
    if scales is not None and sv is None or sizes is not None and zv is None:
        return [TensorInfo(x.dtype, (None,) * rank)]
    out_sizes, _ = resize_plan(ctx, tuple(x.shape), sv, zv, opts_err)
    return [TensorInfo(x.dtype, tuple(out_sizes))]


def _resize10_shape(ctx, x, scales):
    return _resize_shape(ctx, x, None, scales, None)


@kernel("Resize", since=10, shape=_resize10_shape)
def resize_10(ctx, x, scales):
    return _resize(ctx, x, None, scales, None)


def resize(ctx, x, roi=None, scales=None, sizes=None):
    return _resize(ctx, x, roi, scales, sizes)


# Opset 11 added roi/sizes and the coordinate modes; 13 made roi/scales optional; 18 added
# axes, antialias and keep_aspect_ratio_policy; 19 added half_pixel_symmetric. One
# implementation reads each attribute only where its opset defines it.
for _since in (11, 13, 18, 19):
    kernel("Resize", since=_since, shape=_resize_shape)(resize)


# --------------------------------------------------------------------------- Upsample


# Upsample (deprecated by Resize at opset 10) is Resize-10: asymmetric source coordinates,
# nearest rounding down (its scales are >= 1), linear clamped at the edges. Upsample-7
# takes its scales as an attribute, 9 and 10 as an input.
def _upsample7_scales(ctx, err):
    scales = ctx.get("scales")
    if scales is None:
        raise err("Upsample: attribute 'scales' is required")
    return np.asarray(scales, dtype=np.float32)


def _upsample_check(ctx, scales, err):
    if scales is not None and np.any(np.asarray(scales, dtype=np.float32) < 1):
        raise err(f"Upsample: scales must be >= 1, got {np.asarray(scales).tolist()}")


def _upsample7_shape(ctx, x):
    scales = _upsample7_scales(ctx, ShapeInferenceError)
    _upsample_check(ctx, scales, ShapeInferenceError)
    return _resize_shape(ctx, x, None, TensorInfo(scales.dtype, scales.shape, scales), None)


@kernel("Upsample", since=7, shape=_upsample7_shape)
def upsample_7(ctx, x):
    scales = _upsample7_scales(ctx, KernelError)
    _upsample_check(ctx, scales, KernelError)
    return _resize(ctx, x, None, scales, None)


def _upsample_shape(ctx, x, scales):
    _upsample_check(ctx, known_value(scales), ShapeInferenceError)
    return _resize_shape(ctx, x, None, scales, None)


@kernel("Upsample", since=9, shape=_upsample_shape)
@kernel("Upsample", since=10, shape=_upsample_shape)
def upsample(ctx, x, scales):
    _upsample_check(ctx, scales, KernelError)
    return _resize(ctx, x, None, scales, None)
