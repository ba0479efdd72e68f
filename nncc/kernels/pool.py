"""Pooling kernels: MaxPool (with optional Indices), AveragePool, LpPool, GlobalAveragePool,
GlobalMaxPool, and MaxUnpool (the inverse scatter of MaxPool's Indices).

Max and sum over a box window are separable, so windows are reduced one spatial axis at
a time, each pass being a loop over that axis's kernel taps only.

The fast path (1-D and 2-D pools, the shapes of real models) works on the *flattened*
input: along the last axis a tap is the array shifted by one element, along the axis
before it shifted by one row, so every tap is one long contiguous ufunc call (numpy's
SIMD loops) instead of a call per short strided row. Each pass is computed at every
position with the input's own pitch; the positions whose window crosses an edge of the
axis (padding, or a neighbouring row/channel in the flat order) are a few boundary
columns/rows, recomputed afterwards from their valid taps only. Strides are applied at
the end by one strided copy into the output (for the average, the multiplication by the
reciprocal window counts); with no stride and "same" padding the last pass writes the
output itself. Large tensors are processed a chunk of channels at a time so that the
temporaries stay in L2 while the input streams through once.

Windows covering the whole input (7x7 pools on 7x7 maps) and the global pools are one
reduction per channel: a BLAS matrix-vector product for the average, a row max for the max.

3-D pools, and geometries whose windows reach far outside the input, use the strided-view
passes of ``_separable_reduce``. MaxPool's Indices output tracks the winning tap.

Geometry-derived tables are cached per node (``ctx.scratch``) and temporaries are kept in
the executor's shared ``ctx.workspace`` keyed by shape, so a steady-state run allocates
nothing large.

Measured (kernel alone, 2-core EPYC, float32, before -> after): 3x3/2 max pool on
64x112x112 480 -> 420 us, on 192x56x56 435 -> 315 us; 3x3/1 average pool with pads on
576x14x14 530 -> 150 us, on 1024x7x7 270 -> 70 us; 7x7 average pool on 1024x7x7 65 -> 6 us.
"""

from __future__ import annotations

import itertools

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.conv import attr_list, auto_pad_mode, conv_geometry
from nncc.kernels.registry import kernel
from nncc.kernels.workspace import kept

# A fast-path axis with more boundary positions than this (windows much larger than the
# input) goes to the generic passes instead: each boundary position costs one ufunc call.
_MAX_FIXES = 8


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
    strides = attr_list(ctx, "strides", nd, 1, what, err)
    dilations = attr_list(ctx, "dilations", nd, 1, what, err)
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
    auto_pad = auto_pad_mode(ctx, what, err)
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
            sizes, _, _ = conv_geometry(x.shape[2:], ks, st, dl, pb, pe, ap, cm, what)
            out = [TensorInfo(x.dtype, (x.shape[0], x.shape[1], *sizes))]
        if with_indices and ctx.num_outputs > 1:
            out.append(TensorInfo(np.dtype(np.int64), out[0].shape))
        return out

    return shape


class _Geometry:
    """Everything a pool node derives from its attributes and input shape, computed once
    per input shape (kept in ctx.scratch)."""

    __slots__ = ("nd", "ks", "st", "dl", "pb", "pe", "need_end", "sizes", "flat", "whole", "tables")

    def __init__(self, nd, ks, st, dl, pb, pe, need_end, sizes):
        self.nd, self.ks, self.st, self.dl = nd, ks, st, dl
        self.pb, self.pe, self.need_end, self.sizes = pb, pe, need_end, sizes
        self.flat = None    # _FlatPlan of the fast path, or None
        self.whole = False  # every window is the whole input (one output per channel)
        self.tables = {}    # per-kernel derived tables (average divisors, ...)


def _geometry(ctx, x, what) -> _Geometry:
    key = ("pool.geometry", x.shape)
    g = ctx.scratch.get(key)
    if g is not None:
        return g
    if x.ndim < 3:
        raise KernelError(f"{what}: input must have rank >= 3 (N, C, spatial...), got {x.shape}")
    nd, ks, st, dl, pb, pe, ap, cm = _pool_params(ctx, x.shape, what, KernelError)
    sizes, pb, pe = conv_geometry(x.shape[2:], ks, st, dl, pb, pe, ap, cm, what, KernelError)
    # the padded input must cover every window (ceil_mode may need more than pads_end)
    need_end = [max(0, (sizes[i] - 1) * st[i] + (ks[i] - 1) * dl[i] + 1 - pb[i] - x.shape[2 + i])
                for i in range(nd)]
    g = _Geometry(nd, ks, st, dl, pb, pe, need_end, sizes)
    spatial = x.shape[2:]
    g.whole = all(sizes[i] == 1 and {t * dl[i] - pb[i] for t in range(ks[i])} >= set(range(spatial[i]))
                  for i in range(nd))
    if nd <= 2 and not g.whole:
        g.flat = _flat_plan(x.shape, ks, st, dl, pb, sizes)
    ctx.scratch[key] = g
    return g


# ----------------------------------------------------------------------------- fast path


class _AxisPass:
    """One axis of the flat separable reduction, over a contiguous array of `total`
    elements whose axis has `length` positions spaced `pitch` elements apart.

    shifts: flat offset of each tap from the output position (tap t reads the position
        t*dilation - pad_begin along the axis);
    lo, hi: the flat range where every tap stays inside the array (positions outside it
        are all boundary positions);
    fixes: (flat offset of a position, [flat offsets of its valid taps]) for every position used
        by the output and whose window leaves the axis: the flat pass reads a neighbouring
        row (or nothing) there, so these are recomputed afterwards.
    """

    __slots__ = ("shifts", "lo", "hi", "fixes")

    def __init__(self, length, pitch, total, k, d, p, s, n_out):
        taps = [t * d - p for t in range(k)]
        self.shifts = [t * pitch for t in taps]
        self.lo = max(0, -min(self.shifts))
        self.hi = min(total, total - max(self.shifts))
        self.fixes = []
        for o in range(n_out):
            pos = o * s
            valid = [t * pitch for t in taps if 0 <= pos + t < length]
            if len(valid) != k:
                self.fixes.append((pos * pitch, valid))


class _FlatPlan:
    """A 1-D/2-D pool as flat passes over chunks of whole channels (`chunk` channels at a
    time, so the temporaries stay in cache while the input streams through once)."""

    __slots__ = ("cn", "h", "w", "ho", "wo", "sh", "sw", "hr", "wr", "direct", "chunk", "passes")


# Large tensors go through the fast path in chunks of whole channels of about _CHUNK
# elements (512 KiB of float32 per temporary), so the temporaries stay in L2 while the
# input streams through once. In models (input just written by a conv, L2 cold), strided
# pools, with two temporaries, gained from chunking from two chunks on: squeezenet's 3x3/2
# on 128x55x55 390 -> 300 us, inception_v1's on 480x27x27 320 -> 267 us, 64x224x224 2x2/2
# 2200 -> 1350 us; stride-1 "same" pools (one temporary) only from _CHUNK_FROM elements.
_CHUNK = 1 << 17
_CHUNK_FROM = 1 << 19


def _flat_plan(x_shape, ks, st, dl, pb, sizes):
    """The fast path's plan for a 1-D or 2-D pool, or None when it does not apply."""
    if len(ks) == 1:  # 1-D is a 2-D pool over one row
        ks, st, dl, pb, sizes = [1, *ks], [1, *st], [1, *dl], [0, *pb], [1, *sizes]
        h, w = 1, x_shape[2]
    else:
        h, w = x_shape[2], x_shape[3]
    p = _FlatPlan()
    p.cn = x_shape[0] * x_shape[1]
    p.h, p.w = h, w
    p.ho, p.wo = sizes
    p.sh, p.sw = st
    # rows/columns of the stride-1 result the output reads; they must exist in the
    # input's own grid (not so when pads exceed the kernel extent, or with ceil_mode)
    p.hr = (p.ho - 1) * p.sh + 1
    p.wr = (p.wo - 1) * p.sw + 1
    if p.hr > h or p.wr > w or p.cn == 0 or h * w == 0:
        return None
    # no stride and a "same" output: the last pass writes the output itself
    p.direct = p.ho == h and p.wo == w and p.sh == 1 and p.sw == 1
    chunk_from = _CHUNK_FROM if p.direct else _CHUNK
    p.chunk = p.cn if p.cn * h * w <= chunk_from else max(1, min(p.cn, _CHUNK // (h * w)))
    p.passes = {}
    for cb in {p.chunk, p.cn % p.chunk} - {0}:
        total = cb * h * w
        wpass = None if ks[1] == 1 else _AxisPass(w, 1, total, ks[1], dl[1], pb[1], p.sw, p.wo)
        hpass = None if ks[0] == 1 else _AxisPass(h, w, total, ks[0], dl[0], pb[0], p.sh, p.ho)
        for ap in (wpass, hpass):
            if ap is not None and len(ap.fixes) > _MAX_FIXES:
                return None
        p.passes[cb] = (wpass, hpass)
    return p


def _combine(op, srcs, dst, init):
    """dst = op-reduction of srcs (init when there are none)."""
    if not srcs:
        dst.fill(init)
    elif len(srcs) == 1:
        np.copyto(dst, srcs[0])
    else:
        op(srcs[0], srcs[1], out=dst)
        for s in srcs[2:]:
            op(dst, s, out=dst)


def _flat_reduce(p, x, op, init, ws, out3, scale=None):
    """Run a _FlatPlan on contiguous x (cn, h, w), writing out3 (cn, ho, wo). The
    average's `scale` (a scalar, or a (chunk, ho, wo) array of reciprocal counts)
    multiplies the sums on their way into out3."""
    h, w, hw = p.h, p.w, p.h * p.w
    xf = x.reshape(-1)
    size = p.chunk * hw
    tw = kept(ws, "pool.w", (size,), x.dtype)
    th = kept(ws, "pool.h", (size,), x.dtype)
    for c0 in range(0, p.cn, p.chunk):
        cb = min(p.chunk, p.cn - c0)
        wpass, hpass = p.passes[cb]
        n = cb * hw
        cur = xf[c0 * hw:c0 * hw + n]
        o3 = out3[c0:c0 + cb]
        sc = scale if scale is None or np.ndim(scale) == 0 else scale[:cb]
        if wpass is not None:
            dst = o3.reshape(n) if p.direct and hpass is None else tw[:n]
            lo, hi = wpass.lo, wpass.hi
            if hi > lo:
                _combine(op, [cur[lo + s:hi + s] for s in wpass.shifts], dst[lo:hi], init)
            if wpass.fixes:  # boundary columns: (rows, w) views, one column each
                src2, dst2 = cur.reshape(cb * h, w), dst.reshape(cb * h, w)
                for pos, valid in wpass.fixes:
                    _combine(op, [src2[:, pos + s] for s in valid], dst2[:, pos], init)
            cur = dst
        if hpass is not None:
            dst = o3.reshape(n) if p.direct else th[:n]
            lo, hi = hpass.lo, hpass.hi
            if hi > lo:
                _combine(op, [cur[lo + s:hi + s] for s in hpass.shifts], dst[lo:hi], init)
            if hpass.fixes:  # boundary rows: (channels, w) views
                src2, dst2 = cur.reshape(cb, hw), dst.reshape(cb, hw)
                for pos, valid in hpass.fixes:
                    _combine(op, [src2[:, pos + s:pos + s + w] for s in valid], dst2[:, pos:pos + w], init)
            cur = dst
        if p.direct and (wpass is not None or hpass is not None):  # the last pass wrote o3
            if sc is not None:
                np.multiply(o3, sc, out=o3)
            continue
        view = cur.reshape(cb, h, w)[:, :p.hr:p.sh, :p.wr:p.sw]
        if sc is not None:
            np.multiply(view, sc, out=o3)
        else:
            np.copyto(o3, view)
    return out3


# ----------------------------------------------------------------------------- generic path


def _separable_reduce(x, ks, st, dl, pb, sizes, op, init, scratch=None, out=None):
    """Reduce every pooling window of x with the binary ufunc `op`, one spatial axis at a time.

    Each pass is a loop over that axis's kernel taps over strided views; taps that fall
    into the padding are clipped away instead of padding the input, and outputs whose
    window lies entirely in padding keep `init`.
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
            acc = kept(scratch, f"pool.pass{ax}", tuple(shape), y.dtype)
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


def _out_array(out, i, shape, dtype):
    """The preallocated output i when it fits (the kernels write it through flat views),
    else a fresh array (never a kept buffer); _deliver then copies into out[i]."""
    target = None if out is None else out[i]
    if target is not None and target.shape == shape and target.dtype == dtype and target.flags.c_contiguous:
        return target
    return np.empty(shape, dtype)


def _deliver(out, i, y):
    """y, in the caller's preallocated output i when one was given."""
    target = None if out is None else out[i]
    if target is None or target is y:
        return y
    np.copyto(target, y, casting="unsafe")
    return target


def _reduce(ctx, g, x, op, init, y, scale=None):
    """Pool x (contiguous where the fast path is used) into y with the binary ufunc op;
    `scale` (scalar or output-shaped map without the batch/channel axes) multiplies the result."""
    n, c = x.shape[:2]
    if y.size == 0:
        return y
    if g.whole:
        x2 = x.reshape(n * c, -1)
        y1 = y.reshape(n * c)
        if op is np.add:
            w = g.tables.get("ones")
            if w is None or w.dtype != x.dtype:
                w = g.tables["ones"] = np.full(x2.shape[1], 1 if scale is None else scale, x.dtype).ravel()
            np.dot(x2, w, out=y1)
        else:
            op.reduce(x2, axis=1, out=y1)
        return y
    fp = g.flat
    if fp is not None:
        if scale is not None and np.ndim(scale):
            # the divisors repeated over a chunk of channels: one flat multiply per chunk
            tiled = g.tables.get(("tiled", scale.dtype.str))
            if tiled is None:
                tiled = g.tables[("tiled", scale.dtype.str)] = np.ascontiguousarray(
                    np.broadcast_to(scale.reshape(1, fp.ho, fp.wo), (fp.chunk, fp.ho, fp.wo)))
            scale = tiled
        _flat_reduce(fp, x, op, init, ctx.workspace, y.reshape(fp.cn, fp.ho, fp.wo), scale)
        return y
    _separable_reduce(x, g.ks, g.st, g.dl, g.pb, g.sizes, op, init, ctx.workspace, y)
    if scale is not None:
        np.multiply(y, scale, out=y)
    return y


# ----------------------------------------------------------------------------- MaxPool


@kernel("MaxPool", since=1, shape=_pool_shape_fn("MaxPool", with_indices=True), writes_out=True)
def max_pool(ctx, x, out=None):
    g = _geometry(ctx, x, "MaxPool")
    shape = x.shape[:2] + tuple(g.sizes)
    if ctx.num_outputs > 1:
        results = _max_pool_indices(ctx, g, x)
        if out is None:
            return results
        for target, value in zip(out, results):
            if target is not None:
                np.copyto(target, value)
        return tuple(v if t is None else t for t, v in zip(out, results))
    y = _out_array(out, 0, shape, x.dtype)
    if g.flat is not None or g.whole:
        x = np.ascontiguousarray(x)
    return _deliver(out, 0, _reduce(ctx, g, x, np.maximum, _lowest(x.dtype), y))


def _max_pool_indices(ctx, g, x):
    storage_order = int(ctx.get("storage_order", 0))
    if storage_order not in (0, 1):
        raise KernelError("MaxPool: storage_order must be 0 or 1")
    nd, ks, st, dl, pb, sizes = g.nd, g.ks, g.st, g.dl, g.pb, g.sizes
    # Indices: track which tap won (strictly greater replaces, so the first maximum in
    # window order wins, as in ONNX Runtime), then turn tap numbers into flat input indices.
    low = _lowest(x.dtype)
    if any(pb) or any(g.need_end):
        padded = x.shape[:2] + tuple(x.shape[2 + i] + pb[i] + g.need_end[i] for i in range(nd))
        xp = np.full(padded, low, x.dtype)
        xp[(slice(None), slice(None)) + tuple(slice(pb[i], pb[i] + x.shape[2 + i]) for i in range(nd))] = x
    else:
        xp = x
    ntaps = int(np.prod(ks))
    tap_dtype = np.dtype(np.uint8 if ntaps <= 256 else np.int32)
    y = None
    winner = None
    for t, offs in enumerate(itertools.product(*(range(k) for k in ks))):
        sl = (slice(None), slice(None)) + tuple(
            slice(o * d, o * d + (n - 1) * s + 1, s) for o, d, n, s in zip(offs, dl, sizes, st))
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


# ----------------------------------------------------------------------------- AveragePool


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


def _avg_scale(g, x_shape, include_pad, dtype):
    """The reciprocal of each output's divisor: a scalar when all are equal, else a map
    over the spatial output positions (computed in float64, rounded once)."""
    key = ("scale", include_pad, dtype.str)
    scale = g.tables.get(key)
    if scale is None:
        count = _avg_counts(x_shape, g.ks, g.st, g.dl, g.pb, g.pe, g.sizes, include_pad)
        count = np.broadcast_to(count, tuple(g.sizes)).astype(np.float64)
        with np.errstate(divide="ignore"):
            recip = np.where(count > 0, 1.0 / np.maximum(count, 1), np.nan)
        if np.all(recip == recip.flat[0]):
            scale = dtype.type(recip.flat[0])
        else:
            scale = np.ascontiguousarray(recip.astype(dtype))
        g.tables[key] = scale
    return scale


@kernel("AveragePool", since=1, shape=_pool_shape_fn("AveragePool"), writes_out=True)
def average_pool(ctx, x, out=None):
    if x.dtype.kind != "f":
        raise KernelError(f"AveragePool: unsupported dtype {x.dtype}")
    g = _geometry(ctx, x, "AveragePool")
    # pads from auto_pad SAME_* count as padding too (ONNX Runtime semantics)
    include_pad = bool(ctx.get("count_include_pad", 0))
    shape = x.shape[:2] + tuple(g.sizes)
    out_dtype = x.dtype
    scale = _avg_scale(g, x.shape, include_pad, np.dtype(np.float32) if out_dtype == np.float16 else out_dtype)
    if out_dtype != np.float16:
        y = _reduce(ctx, g, np.ascontiguousarray(x), np.add, 0, _out_array(out, 0, shape, out_dtype), scale)
        return _deliver(out, 0, y)
    # float16 is summed in float32, through kept buffers
    x32 = kept(ctx.workspace, "pool.x32", x.shape, np.dtype(np.float32))
    np.copyto(x32, x)
    y32 = _reduce(ctx, g, x32, np.add, 0, kept(ctx.workspace, "pool.y32", shape, np.dtype(np.float32)), scale)
    y = _out_array(out, 0, shape, out_dtype)
    np.copyto(y, y32, casting="same_kind")
    return _deliver(out, 0, y)


# ----------------------------------------------------------------------------- global pools


def _global_shape(ctx, x):
    if x.shape is None:
        return [TensorInfo(x.dtype, None)]
    if len(x.shape) < 3:
        raise ShapeInferenceError(f"global pooling needs rank >= 3 (N, C, spatial...), got {x.shape}")
    return [TensorInfo(x.dtype, tuple(x.shape[:2]) + (1,) * (len(x.shape) - 2))]


@kernel("GlobalAveragePool", since=1, shape=_global_shape, writes_out=True)
def global_average_pool(ctx, x, out=None):
    if x.ndim < 3:
        raise KernelError(f"GlobalAveragePool: input must have rank >= 3, got {x.shape}")
    if x.dtype.kind != "f":
        raise KernelError(f"GlobalAveragePool: unsupported dtype {x.dtype}")
    n, c = x.shape[:2]
    shape = (n, c) + (1,) * (x.ndim - 2)
    y = _out_array(out, 0, shape, x.dtype)
    if y.size == 0:
        return _deliver(out, 0, y)
    acc = np.dtype(np.float32) if x.dtype == np.float16 else x.dtype
    if acc != x.dtype:  # float16 is summed in float32
        x32 = kept(ctx.workspace, "pool.x32", x.shape, acc)
        np.copyto(x32, x)
        x = x32
    x2 = np.ascontiguousarray(x).reshape(n * c, -1)
    size = x2.shape[1]
    if size == 0:
        y.fill(np.nan)
        return _deliver(out, 0, y)
    # one matrix-vector product with a vector of 1/size (BLAS gemv): 4-5x faster than a
    # row-wise mean on 1024x7x7
    key = ("weights", size, acc.str)
    w = ctx.scratch.get(key)
    if w is None:
        w = ctx.scratch[key] = np.full(size, 1.0 / size, acc)
    if acc == x.dtype and acc == y.dtype:
        np.dot(x2, w, out=y.reshape(n * c))
    else:
        np.copyto(y.reshape(n * c), x2 @ w, casting="same_kind")
    return _deliver(out, 0, y)


@kernel("GlobalMaxPool", since=1, shape=_global_shape, writes_out=True)
def global_max_pool(ctx, x, out=None):
    if x.ndim < 3:
        raise KernelError(f"GlobalMaxPool: input must have rank >= 3, got {x.shape}")
    n, c = x.shape[:2]
    shape = (n, c) + (1,) * (x.ndim - 2)
    y = _out_array(out, 0, shape, x.dtype)
    if y.size:
        np.maximum.reduce(x.reshape(n, c, -1), axis=2, out=y.reshape(n, c))
    return _deliver(out, 0, y)


# ----------------------------------------------------------------------------- LpPool


def _lp_shape(ctx, x):
    if "p" in ctx.attrs and float(ctx.get("p")) <= 0:
        raise ShapeInferenceError(f"LpPool: p must be positive, got {ctx.get('p')}")
    return _pool_shape_fn("LpPool")(ctx, x)


# LpPool-1 took a float p; 2 an int p with auto_pad/pads/strides; 11 changed padding
# rules the shared geometry already follows; 18 added dilations and ceil_mode.
@kernel("LpPool", since=1, shape=_lp_shape)
@kernel("LpPool", since=2, shape=_lp_shape)
@kernel("LpPool", since=11, shape=_lp_shape)
@kernel("LpPool", since=18, shape=_lp_shape)
@kernel("LpPool", since=22, shape=_lp_shape)
def lp_pool(ctx, x):
    """(sum of |x|^p over each window)^(1/p); padding contributes zeros."""
    if x.dtype.kind != "f":
        raise KernelError(f"LpPool: unsupported dtype {x.dtype}")
    p = float(ctx.get("p", 2))
    if p <= 0:
        raise KernelError(f"LpPool: p must be positive, got {p}")
    g = _geometry(ctx, x, "LpPool")
    acc = np.dtype(np.float32) if x.dtype == np.float16 else x.dtype
    a = np.abs(x, dtype=acc)
    if p == 2:
        np.square(a, out=a)
    elif p != 1:
        np.power(a, acc.type(p), out=a)
    y = _reduce(ctx, g, a, np.add, 0, np.empty(x.shape[:2] + tuple(g.sizes), acc))
    if p == 2:
        np.sqrt(y, out=y)
    elif p != 1:
        np.power(y, acc.type(1.0 / p), out=y)
    return y.astype(x.dtype, copy=False)


# ----------------------------------------------------------------------------- MaxUnpool


def _unpool_default_shape(ctx, x_shape, err):
    """(N, C, (in - 1) * stride + kernel - pads) from the attributes and X's shape."""
    nd = len(x_shape) - 2
    kernel_shape = ctx.get("kernel_shape")
    if kernel_shape is None or len(kernel_shape) != nd:
        raise err(f"MaxUnpool: attribute 'kernel_shape' must give {nd} sizes")
    strides = attr_list(ctx, "strides", nd, 1, "MaxUnpool", err)
    pads = [int(v) for v in ctx.get("pads", [0] * (2 * nd))]
    if len(pads) != 2 * nd:
        raise err(f"MaxUnpool: attribute 'pads' has {len(pads)} values, expected {2 * nd}")
    spatial = []
    for i in range(nd):
        n = x_shape[2 + i]
        size = None if not isinstance(n, int) else (n - 1) * strides[i] + int(kernel_shape[i]) - pads[i] - pads[nd + i]
        if size is not None and size < 0:
            raise err(f"MaxUnpool: pads {pads} leave no output along spatial axis {i}")
        spatial.append(size)
    return (x_shape[0], x_shape[1], *spatial)


def _unpool_shape(ctx, x, indices, output_shape=None):
    if output_shape is not None:
        value = output_shape.value
        if value is not None:
            return [TensorInfo(x.dtype, tuple(int(v) for v in np.asarray(value).reshape(-1)))]
        n = output_shape.shape[0] if output_shape.shape else None
        return [TensorInfo(x.dtype, None if not isinstance(n, int) else (None,) * n)]
    if x.shape is None:
        return [TensorInfo(x.dtype, None)]
    if len(x.shape) < 3:
        raise ShapeInferenceError(f"MaxUnpool: input must have rank >= 3 (N, C, spatial...), got {x.shape}")
    return [TensorInfo(x.dtype, _unpool_default_shape(ctx, x.shape, ShapeInferenceError))]


@kernel("MaxUnpool", since=9, shape=_unpool_shape)
@kernel("MaxUnpool", since=11, shape=_unpool_shape)
@kernel("MaxUnpool", since=22, shape=_unpool_shape)
def max_unpool(ctx, x, indices, output_shape=None):
    """Zeros, with each X value put at the flat position its index (as MaxPool's Indices
    output gives it, over the whole N*C*spatial tensor) names."""
    if x.ndim < 3:
        raise KernelError(f"MaxUnpool: input must have rank >= 3 (N, C, spatial...), got {x.shape}")
    if indices.shape != x.shape:
        raise KernelError(f"MaxUnpool: indices {indices.shape} must have the shape of X {x.shape}")
    if output_shape is not None:
        shape = tuple(int(v) for v in np.asarray(output_shape).reshape(-1))
        if len(shape) != x.ndim or any(d < 0 for d in shape):
            raise KernelError(f"MaxUnpool: output_shape {list(shape)} must give {x.ndim} non-negative sizes")
    else:
        shape = _unpool_default_shape(ctx, x.shape, KernelError)
    y = np.zeros(shape, dtype=x.dtype)
    idx = indices.reshape(-1).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= y.size):
        raise KernelError(f"MaxUnpool: an index lies outside the {y.size} output elements")
    y.reshape(-1)[idx] = x.reshape(-1)
    return y
