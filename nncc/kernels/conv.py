"""Convolution kernels: Conv and ConvTranspose (1-D, 2-D, 3-D and beyond).

Strategy (all vectorized, no per-element Python loops):

* 1x1 convolutions are a plain (batched) matmul over channels.
* Depthwise convolutions (group == input channels) are a sum over kernel taps of shifted,
  strided slices times per-channel weights.
* Everything else is im2col (one strided slice copy per kernel tap into a column buffer)
  followed by ONE matmul per group (a batched matmul over groups).
* ConvTranspose is one matmul producing all tap contributions, then a col2im that adds
  each tap's plane into a strided slice of the output (a loop over kernel taps only).

The geometry helpers here (`_conv_geometry`, `_attr_list`) are also used by pool.py.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.depthwise import depthwise_conv
from nncc.kernels.registry import kernel, stand_ins
from nncc.kernels.shapes import check_size
from nncc.kernels.workspace import kept, shared
from nncc.util.limits import check_shape

_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


# --------------------------------------------------------------------------- helpers


def attr_list(ctx, name: str, n: int, default: int, what: str = "", err=ShapeInferenceError):
    """An INTS attribute of length n (spatial rank), or [default] * n when absent."""
    value = ctx.get(name)
    if value is None:
        return [default] * n
    value = [int(v) for v in value]
    if len(value) != n:
        raise err(f"{what or 'node'}: attribute {name!r} has {len(value)} values, "
                  f"expected {n} (one per spatial axis)")
    return value


def pads_attr(ctx, n: int, what: str, err=ShapeInferenceError):
    pads = ctx.get("pads")
    if pads is None:
        return [0] * n, [0] * n
    pads = [int(p) for p in pads]
    if len(pads) != 2 * n:
        raise err(f"{what}: attribute 'pads' has {len(pads)} values, expected {2 * n}")
    return pads[:n], pads[n:]


def auto_pad_mode(ctx, what: str, err=ShapeInferenceError) -> str:
    auto_pad = ctx.get("auto_pad", "NOTSET") or "NOTSET"
    if auto_pad not in _AUTO_PADS:
        raise err(f"{what}: unknown auto_pad {auto_pad!r} (expected one of {', '.join(_AUTO_PADS)})")
    return auto_pad


def conv_geometry(in_sizes, kernel, strides, dilations, pads_begin, pads_end, auto_pad,
                   ceil_mode: bool = False, what: str = "Conv", err=ShapeInferenceError):
    """Output sizes and effective (begin, end) pads for a sliding-window op.

    ``in_sizes`` entries may be None/str (unknown): the matching output is None and the
    pads are still returned when they do not depend on the input size.
    Returns (out_sizes, pads_begin, pads_end).
    """
    out, pb, pe = [], [], []
    for i, size in enumerate(in_sizes):
        k, s, d = kernel[i], strides[i], dilations[i]
        if s <= 0 or d <= 0 or (k is not None and isinstance(k, int) and k <= 0):
            raise err(f"{what}: strides, dilations and kernel sizes must be positive "
                      f"(got kernel {list(kernel)}, strides {list(strides)}, dilations {list(dilations)})")
        ek = (k - 1) * d + 1 if isinstance(k, int) else None
        known = isinstance(size, int) and ek is not None
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            if not known:
                out.append(-(-size // s) if isinstance(size, int) else None)
                pb.append(None)
                pe.append(None)
                continue
            o = -(-size // s)
            total = max(0, (o - 1) * s + ek - size)
            small, big = total // 2, total - total // 2
            b, e = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
        elif auto_pad == "VALID":
            b, e = 0, 0
            if not known:
                out.append(None)
                pb.append(b)
                pe.append(e)
                continue
            o = (size - ek) // s + 1
        else:
            b, e = pads_begin[i], pads_end[i]
            if not known:
                out.append(None)
                pb.append(b)
                pe.append(e)
                continue
            span = size + b + e - ek
            if ceil_mode:
                o = -(-span // s) + 1
                # the last window must start inside the input or the left padding
                if (o - 1) * s >= size + b:
                    o -= 1
            else:
                o = span // s + 1 if span >= 0 else 0
        if o <= 0:
            raise err(f"{what}: input spatial size {size} with kernel {k} (dilation {d}), "
                      f"stride {s} and pads ({b}, {e}) gives an empty output")
        out.append(o)
        pb.append(b)
        pe.append(e)
    return out, pb, pe


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    """float16 is computed in float32 (numpy has no float16 BLAS)."""
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def _pad_spatial(x: np.ndarray, begin, end, value=0, scratch=None) -> np.ndarray:
    """Pad (or crop, for negative pads) the spatial axes (2..) of x. No copy when all zero.
    With a workspace (zero padding only), the padded copy is a kept buffer whose border
    stays zero: every run rewrites the same interior."""
    if not any(begin) and not any(end):
        return x
    # crop negative pads first (a view)
    crop = tuple(slice(max(0, -b), x.shape[2 + i] - max(0, -e))
                 for i, (b, e) in enumerate(zip(begin, end)))
    x = x[(slice(None), slice(None)) + crop]
    b = [max(0, v) for v in begin]
    e = [max(0, v) for v in end]
    if not any(b) and not any(e):
        return x
    shape = x.shape[:2] + tuple(x.shape[2 + i] + b[i] + e[i] for i in range(len(b)))
    check_shape(shape, x.dtype.itemsize, f"the padded input {list(shape)}")  # pads come from the model
    if scratch is not None and value == 0:
        out = _scratch(scratch, ("padded", tuple(b), tuple(e)), shape, x.dtype, zero=True)
    else:
        out = np.full(shape, value, dtype=x.dtype)
    out[(slice(None), slice(None)) + tuple(slice(b[i], b[i] + x.shape[2 + i]) for i in range(len(b)))] = x
    return out


def _tap_slices(offsets, out_sizes, strides):
    """Spatial slices selecting, for one kernel tap at `offsets`, the input of every output."""
    return tuple(slice(o, o + (n - 1) * s + 1, s) for o, n, s in zip(offsets, out_sizes, strides))


def _scratch(scratch, key, shape, dtype, zero=False):
    """A buffer kept between runs in the workspace. A zeroed buffer is one per (key, shape,
    dtype): its padding stays zero only because every user of the same key writes the same
    interior positions (callers put the geometry into the key). Other buffers are views of
    one shared block per key (nncc.kernels.workspace.shared)."""
    if zero:
        return kept(scratch, key, tuple(shape), dtype, zero=True)
    return shared(scratch, key, shape, dtype)


@functools.lru_cache(maxsize=1024)
def _phase_layout(x_shape, pads_begin, pads_end, kernel_shape, strides, dilations, out_sizes):
    """The index arithmetic of the stride-phase im2col, done once per geometry: the phase
    copies (phase, source index, destination index) and each tap's (phase, shift). None
    when that layout does not fit (negative pads, or too much surplus width)."""
    nd = len(x_shape) - 2
    padded = [x_shape[2 + i] + pads_begin[i] + pads_end[i] for i in range(nd)]
    phase_sizes = tuple(-(-padded[i] // strides[i]) for i in range(nd))
    flat_len = out_sizes[0] * math.prod(phase_sizes[1:])
    # past ~20% surplus columns (a 3x3 conv on 7x7 maps has 29%) the wasted GEMM work
    # costs more than the short-row copies of the exact layout save
    if not (all(b >= 0 for b in pads_begin) and all(e >= 0 for e in pads_end)
            and flat_len <= 1.2 * math.prod(out_sizes)):
        return None
    if any(st > size for st, size in zip(strides, x_shape[2:])):  # strides past the input (or
        return None  # huge pads): one Python step per phase, more phases than input elements
    suffix = [math.prod(phase_sizes[i + 1:]) for i in range(nd)]
    tap_src = []
    for offs in itertools.product(*(range(k) for k in kernel_shape)):
        o = [k * d for k, d in zip(offs, dilations)]
        phase = int(np.ravel_multi_index([oi % si for oi, si in zip(o, strides)], strides))
        shift = sum((oi // si) * st for oi, si, st in zip(o, strides, suffix))
        tap_src.append((phase, shift))
    copies = []
    for ph, rs in enumerate(itertools.product(*(range(si) for si in strides))):
        src, dst = [slice(None), slice(None)], [slice(None), slice(None)]
        for i in range(nd):
            j0 = (rs[i] - pads_begin[i]) % strides[i]
            count = len(range(j0, x_shape[2 + i], strides[i]))
            start = (j0 + pads_begin[i] - rs[i]) // strides[i]
            src.append(slice(j0, None, strides[i]))
            dst.append(slice(start, start + count))
        copies.append((ph, tuple(src), tuple(dst)))
    need = max(sh for _, sh in tap_src) + flat_len
    return (math.prod(strides), math.prod(phase_sizes), need, flat_len, phase_sizes, tuple(copies),
            tuple(tap_src))


# A gather costs about 0.5 ns per column element, a copy per kernel tap about 2 us of call
# overhead: below this many elements per tap (and in all) one np.take is the cheaper im2col.
_GATHER_PER_TAP = 4000
_GATHER_MAX = 65536


def _gather_index(padded_shape, kernel_shape, strides, dilations, out_sizes) -> np.ndarray:
    """Flat indices into one sample of the padded input (C, *padded) giving its im2col
    columns, ordered (channel, kernel tap, output position) like the copy-based layouts."""
    c = padded_shape[0]
    flat = np.arange(math.prod(padded_shape), dtype=np.intp).reshape(padded_shape)
    taps = []
    for offs in itertools.product(*(range(k) for k in kernel_shape)):
        window = tuple(slice(o * d, o * d + (n - 1) * s + 1, s)
                       for o, d, n, s in zip(offs, dilations, out_sizes, strides))
        taps.append(flat[(slice(None),) + window].reshape(c, -1))
    index = np.stack(taps, axis=1).reshape(c * len(taps), -1)
    index.flags.writeable = False
    return index


def _im2col(x, pads_begin, pads_end, kernel_shape, strides, dilations, out_sizes, scratch=None):
    """Column buffer (N, C, K, P) of x's kernel-tap windows, and a function mapping the
    (N, M, P) matmul result to (N, M, *out_sizes).

    The padded input is split into its stride phases (one phase when the stride is 1), each
    stored flat. A kernel tap then reads ONE contiguous run of a phase for every (n, c):
    the output is computed over the phase's full row width and the few surplus columns
    are cropped afterwards. Falls back to one strided slice copy per tap when that layout
    would waste too much (tiny images with big kernels) or for negative pads.
    """
    n, c = x.shape[:2]
    nd = x.ndim - 2
    ntaps = math.prod(kernel_shape)
    columns = math.prod(out_sizes)
    if c * ntaps * columns <= min(_GATHER_PER_TAP * ntaps, _GATHER_MAX):
        # small images: one gather with precomputed indices beats a copy call per tap
        xp = np.ascontiguousarray(_pad_spatial(x, pads_begin, pads_end, scratch=scratch))
        geometry = ("gather index", tuple(xp.shape[1:]), tuple(kernel_shape), tuple(strides),
                    tuple(dilations), tuple(out_sizes))
        index = None if scratch is None else scratch.get(geometry)
        if index is None:  # kept with the executor's workspace, not process-wide
            index = _gather_index(*geometry[1:])
            if scratch is not None:
                scratch[geometry] = index
        cols = _scratch(scratch, "cols", (n, c * ntaps, columns), x.dtype)
        np.take(xp.reshape(n, -1), index, axis=1, out=cols, mode="clip")  # indices are in range
        return cols.reshape(n, c, ntaps, columns), _reshaper(out_sizes)
    layout = _phase_layout(tuple(x.shape), tuple(pads_begin), tuple(pads_end), tuple(kernel_shape),
                           tuple(strides), tuple(dilations), tuple(out_sizes))
    if layout is not None:
        nphase, total, need, flat_len, phase_sizes, copies, tap_src = layout
        buf = _phases(x, layout, pads_begin, pads_end, strides, scratch)
        cols = _phase_columns(buf, layout, 0, flat_len, scratch)

        def finish(y, target=None):
            if nd == 1 or list(phase_sizes[1:]) == list(out_sizes[1:]):
                y = y.reshape(y.shape[:2] + tuple(out_sizes))
            else:
                y = y.reshape(y.shape[:2] + (out_sizes[0],) + tuple(phase_sizes[1:]))
                y = y[(slice(None), slice(None), slice(None)) + tuple(slice(0, o) for o in out_sizes[1:])]
            if target is not None:
                np.copyto(target, y)
                return target
            return np.ascontiguousarray(y)

        return cols, finish
    xp = _pad_spatial(x, pads_begin, pads_end, scratch=scratch)
    cols = _scratch(scratch, "cols", (n, c, ntaps) + tuple(out_sizes), x.dtype)
    for t, offs in enumerate(itertools.product(*(range(k) for k in kernel_shape))):
        cols[:, :, t] = xp[(slice(None), slice(None)) + _tap_slices(
            [o * d for o, d in zip(offs, dilations)], out_sizes, strides)]
    return cols.reshape(n, c, ntaps, -1), _reshaper(out_sizes)


def _phases(x, layout, pads_begin, pads_end, strides, scratch):
    """The zero-padded input split into its stride phases, each stored flat: a kept buffer
    (its padding stays zero) that every run refills."""
    n, c = x.shape[:2]
    nphase, total, need, flat_len, phase_sizes, copies, tap_src = layout
    geometry = ("phases", tuple(x.shape), tuple(pads_begin), tuple(pads_end), tuple(strides))
    buf = _scratch(scratch, geometry, (n, c, nphase, max(total, need)), x.dtype, zero=True)
    for ph, src, dst in copies:
        view = buf[:, :, ph, :total].reshape((n, c) + phase_sizes)
        view[dst] = x[src]
    return buf


def _phase_columns(buf, layout, start: int, length: int, scratch):
    """Columns ``start`` to ``start + length`` of the phase layout's (N, C, K, flat_len)
    column matrix: one contiguous run of a phase per kernel tap."""
    n, c = buf.shape[:2]
    tap_src = layout[6]
    cols = _scratch(scratch, "cols", (n, c, len(tap_src), length), buf.dtype)
    for t, (ph, sh) in enumerate(tap_src):
        cols[:, :, t] = buf[:, :, ph, sh + start:sh + start + length]
    return cols


# Columns above this many bytes are made and multiplied a band of output rows at a time,
# unless the weights are large next to them: every GEMM call packs the weights anew, which
# for 256 or more input channels costs more than the smaller columns save. (Measured on
# vgg-sized 3x3 layers: 64 channels at 224x224 17-21% faster in 8 MiB bands, 128 at 112x112
# even, 256 at 56x56 6-8% slower.) Bands also bound the workspace: 117 MB of columns for
# light_vgg19's first layers, 600 MB for a 512x512 image, become 8 MiB.
_BAND_BYTES = 8 << 20
_BAND_WEIGHT_RATIO = 16


@functools.lru_cache(maxsize=1024)
def _band_rows(x_shape, w_bytes, itemsize, pads_begin, pads_end, kernel_shape, strides, dilations,
               out_sizes):
    """Output rows (along the first spatial axis) per band, or None for one pass: the
    phase layout applies, its columns exceed the band size, and there are rows to split."""
    layout = _phase_layout(x_shape, pads_begin, pads_end, kernel_shape, strides, dilations, out_sizes)
    if layout is None or out_sizes[0] < 2:
        return None
    n, c = x_shape[:2]
    row_bytes = n * c * math.prod(kernel_shape) * (layout[3] // out_sizes[0]) * itemsize
    band = max(_BAND_BYTES, _BAND_WEIGHT_RATIO * w_bytes)
    if row_bytes * out_sizes[0] <= band:
        return None
    return max(1, band // row_bytes)


def _conv_bands(x, w, group, kernel_shape, strides, dilations, pb, pe, out_sizes, scratch, out, rows):
    """_conv_batch with the phase layout, a band of ``rows`` output rows at a time: columns
    for the band, one GEMM, and the band's outputs written into their rows of ``out``."""
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    ntaps = math.prod(kernel_shape)
    layout = _phase_layout(tuple(x.shape), tuple(pb), tuple(pe), tuple(kernel_shape), tuple(strides),
                           tuple(dilations), tuple(out_sizes))
    phase_sizes = layout[4]
    row = layout[3] // out_sizes[0]  # columns per output row, the surplus ones included
    inner = math.prod(out_sizes[1:])
    crop = row != inner
    if out is None:
        out = np.empty((n, m) + tuple(out_sizes), x.dtype)
    flat_out = out.reshape(n, m, out_sizes[0] * inner)
    weights = w.reshape(group, m // group, cg * ntaps)
    buf = _phases(x, layout, pb, pe, strides, scratch)
    for r0 in range(0, out_sizes[0], rows):
        r1 = min(r0 + rows, out_sizes[0])
        length = (r1 - r0) * row
        cols = _phase_columns(buf, layout, r0 * row, length, scratch).reshape(n, group, cg * ntaps, length)
        if crop or group > 1:
            product = _scratch(scratch, "product", (n, m, length), x.dtype)
            np.matmul(weights, cols, out=product.reshape(n, group, m // group, length))
            band = product.reshape((n, m, r1 - r0) + tuple(phase_sizes[1:]))
            np.copyto(out[:, :, r0:r1], band[(Ellipsis,) + tuple(slice(0, o) for o in out_sizes[1:])])
        else:  # the band's rows are one contiguous run of every output channel
            np.matmul(weights[0], cols[:, 0], out=flat_out[:, :, r0 * inner:r1 * inner])
    return out


def _reshaper(out_sizes):
    """finish() for layouts whose columns are exactly the output positions: (N, M, P) to
    (N, M, *out_sizes), copied into ``target`` when given."""
    def finish(y, target=None):
        y = y.reshape(y.shape[:2] + tuple(out_sizes))
        if target is not None:
            np.copyto(target, y)
            return target
        return y

    return finish


# --------------------------------------------------------------------------- Conv


def conv_params(ctx, x_shape, w_shape, err, what="Conv"):
    if x_shape is None or len(x_shape) < 3:
        return None
    nd = len(x_shape) - 2
    kernel_shape = ctx.get("kernel_shape")
    if kernel_shape is not None:
        kernel_shape = [int(k) for k in kernel_shape]
        if len(kernel_shape) != nd:
            raise err(f"{what}: kernel_shape {kernel_shape} does not match the input's {nd} spatial axes")
    elif w_shape is not None:
        kernel_shape = list(w_shape[2:])
    else:
        kernel_shape = [None] * nd
    strides = attr_list(ctx, "strides", nd, 1, what, err)
    dilations = attr_list(ctx, "dilations", nd, 1, what, err)
    pads_begin, pads_end = pads_attr(ctx, nd, what, err)
    auto_pad = auto_pad_mode(ctx, what, err)
    group = int(ctx.get("group", 1))
    if group <= 0:
        raise err(f"{what}: group must be positive, got {group}")
    return nd, kernel_shape, strides, dilations, pads_begin, pads_end, auto_pad, group


def conv_shape(ctx, x, w, b=None):
    if x.shape is not None and len(x.shape) < 3:
        raise ShapeInferenceError(f"Conv: input X must have rank >= 3 (N, C, spatial...), got {x.shape}")
    if w.shape is not None and x.shape is not None and len(w.shape) != len(x.shape):
        raise ShapeInferenceError(f"Conv: weight rank {len(w.shape)} does not match input rank {len(x.shape)}")
    params = conv_params(ctx, x.shape, w.shape, ShapeInferenceError)
    if params is None:
        rank = None if w.shape is None else len(w.shape)
        shape = None if rank is None else (None, w.shape[0]) + (None,) * (rank - 2)
        return [TensorInfo(x.dtype, shape)]
    nd, kernel_shape, strides, dilations, pb, pe, auto_pad, group = params
    c_in = x.shape[1]
    if w.shape is not None:
        c_w = w.shape[1]
        if isinstance(c_in, int) and isinstance(c_w, int) and c_in != c_w * group:
            raise ShapeInferenceError(
                f"Conv: input has {c_in} channels but weight expects {c_w} x group {group} = {c_w * group}")
        m = w.shape[0]
        if isinstance(m, int) and m % group:
            raise ShapeInferenceError(f"Conv: {m} output channels are not divisible by group {group}")
    out, _, _ = conv_geometry(x.shape[2:], kernel_shape, strides, dilations, pb, pe, auto_pad)
    m = None if w.shape is None else w.shape[0]
    check_size("Conv", "bias B", b, m)
    return [TensorInfo(x.dtype, (x.shape[0], m, *out))]


_IM2COL_BYTES = 256 << 20


def _conv_batch(x, w, group, kernel_shape, strides, dilations, pb, pe, out_sizes, scratch=None,
                out=None):
    """Conv of a batch without bias (inputs already in the compute dtype), written into
    ``out`` (a C-contiguous (N, M, *out_sizes) array) when given."""
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    nd = x.ndim - 2
    mg = m // group
    ntaps = math.prod(kernel_shape)
    if ntaps == 1:
        # 1x1 convolution: a plain matmul over channels
        xp = _pad_spatial(x, pb, pe, scratch=scratch)
        xs = xp[(slice(None), slice(None)) + _tap_slices([0] * nd, out_sizes, strides)]
        if not xs.flags.c_contiguous and scratch is not None:  # strided: gather into a kept buffer
            gathered = _scratch(scratch, "strided", xs.shape, xs.dtype)
            np.copyto(gathered, xs)
            xs = gathered
        p = math.prod(out_sizes)
        if group == 1:
            target = None if out is None else out.reshape(n, m, p)
            y = np.matmul(w.reshape(m, c), xs.reshape(n, c, p), out=target)
        else:
            target = None if out is None else out.reshape(n, group, mg, p)
            y = np.matmul(w.reshape(group, mg, cg), xs.reshape(n, group, cg, p), out=target)
        return out if out is not None else y.reshape((n, m) + tuple(out_sizes))
    # the depthwise layout takes one Python step per stride phase: not for strides past the input
    if group == c and cg == 1 and all(st <= x.shape[2 + i] for i, st in enumerate(strides)):
        return depthwise_conv(x, w, kernel_shape, strides, dilations, pb, pe, out_sizes, scratch, out)
    rows = _band_rows(tuple(x.shape), w.nbytes, x.dtype.itemsize, tuple(pb), tuple(pe), tuple(kernel_shape),
                      tuple(strides), tuple(dilations), tuple(out_sizes))
    if rows is not None:
        return _conv_bands(x, w, group, kernel_shape, strides, dilations, pb, pe, out_sizes, scratch, out, rows)
    # im2col (one contiguous copy per kernel tap) then ONE matmul, batched over groups
    cols, finish = _im2col(x, pb, pe, kernel_shape, strides, dilations, out_sizes, scratch)
    p = cols.shape[-1]
    direct = out is not None and p == math.prod(out_sizes)  # no columns to crop
    # the product goes straight into `out`, or into a kept buffer that is then cropped
    product = out if direct else None if out is None else _scratch(scratch, "product", (n, m, p), x.dtype)
    if group == 1:
        target = None if product is None else product.reshape(n, m, p)
        y = np.matmul(w.reshape(m, cg * ntaps), cols.reshape(n, c * ntaps, p), out=target)
    else:
        target = None if product is None else product.reshape(n, group, mg, p)
        y = np.matmul(w.reshape(group, mg, cg * ntaps), cols.reshape(n, group, cg * ntaps, p), out=target)
    if direct:
        return out
    return finish(y.reshape(n, m, p), out)


def _conv_plan(ctx, x_shape, w_shape):
    """What a Conv node derives from its attributes and operand shapes: (spatial rank,
    kernel shape, strides, dilations, pads begin, pads end, group, output sizes)."""
    nd, kernel_shape, strides, dilations, pb, pe, auto_pad, group = conv_params(
        ctx, x_shape, w_shape, KernelError)
    if list(kernel_shape) != list(w_shape[2:]):
        raise KernelError(f"Conv: kernel_shape {kernel_shape} does not match weight shape {w_shape}")
    if x_shape[1] != w_shape[1] * group or w_shape[0] % group:
        raise KernelError(f"Conv: input channels {x_shape[1]}, weight {w_shape} and group {group} "
                          "are inconsistent")
    out_sizes, pb, pe = conv_geometry(x_shape[2:], kernel_shape, strides, dilations, pb, pe,
                                       auto_pad, what="Conv", err=KernelError)
    return nd, kernel_shape, strides, dilations, pb, pe, group, out_sizes


def _conv_prepare(ctx, x, w, b=None):
    """Conv's first phase, for operands of one float dtype whose im2col fits one batch:
    the geometry worked out once, so a run is the convolution and the bias alone."""
    like = stand_ins(x, w, b)
    if like is None or len(x.shape) < 3 or len(w.shape) != len(x.shape):
        return None
    dtype = x.dtype
    if _compute_dtype(dtype) != dtype or w.dtype != dtype or (b is not None and b.dtype != dtype):
        return None
    nd, kernel_shape, strides, dilations, pb, pe, group, out_sizes = _conv_plan(ctx, x.shape, w.shape)
    ntaps = math.prod(kernel_shape)
    per_sample = x.shape[1] * ntaps * math.prod(out_sizes) * dtype.itemsize if ntaps > 1 else 0
    if per_sample and _IM2COL_BYTES // per_sample < x.shape[0]:
        return None  # batches in chunks: the general kernel
    bias_shape = (w.shape[0],) + (1,) * nd

    def conv_prepared(ctx, x, w, b=None, out=None):
        target = out[0] if out is not None and out[0].dtype == dtype else None
        y = _conv_batch(x, w, group, kernel_shape, strides, dilations, pb, pe, out_sizes, ctx.workspace,
                        target)
        if b is not None:
            y += b.reshape(bias_shape)
        return y

    return conv_prepared


@kernel("Conv", since=1, shape=conv_shape, writes_out=True, prepare=_conv_prepare)
def conv(ctx, x, w, b=None, out=None):
    if x.ndim < 3 or w.ndim != x.ndim:
        raise KernelError(f"Conv: expected X and W of the same rank >= 3, got {x.shape} and {w.shape}")
    key = ("conv geometry", x.shape, w.shape)
    geometry = ctx.scratch.get(key)  # attributes and shapes are fixed: work it out once
    if geometry is None:
        geometry = ctx.scratch[key] = _conv_plan(ctx, x.shape, w.shape)
    nd, kernel_shape, strides, dilations, pb, pe, group, out_sizes = geometry
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    out_dtype = x.dtype
    cdt = _compute_dtype(x.dtype)
    if x.dtype != cdt:
        x = x.astype(cdt)
    if w.dtype != cdt:
        w = w.astype(cdt)
    ntaps = math.prod(kernel_shape)
    # bound the im2col buffer: large batches are processed in chunks of samples
    per_sample = c * ntaps * math.prod(out_sizes) * cdt.itemsize if ntaps > 1 else 0
    chunk = max(1, _IM2COL_BYTES // per_sample) if per_sample else n
    target = out[0] if out is not None and out[0].dtype == cdt else None
    if chunk >= n:
        y = _conv_batch(x, w, group, kernel_shape, strides, dilations, pb, pe, out_sizes,
                        ctx.workspace, target)
    else:
        y = np.empty((n, m) + tuple(out_sizes), dtype=cdt)
        for start in range(0, n, chunk):
            y[start:start + chunk] = _conv_batch(x[start:start + chunk], w, group, kernel_shape,
                                                 strides, dilations, pb, pe, out_sizes)
    if b is not None:
        y += b.astype(cdt, copy=False).reshape((m,) + (1,) * nd)
    return y if y.dtype == out_dtype else y.astype(out_dtype)


# --------------------------------------------------------------------------- ConvTranspose


def _convt_geometry(ctx, in_sizes, kernel_shape, err):
    """Output sizes and the begin padding (crop) for ConvTranspose.

    Returns (out_sizes, pads_begin, strides, dilations); entries may be None when unknown.
    """
    nd = len(in_sizes)
    what = "ConvTranspose"
    strides = attr_list(ctx, "strides", nd, 1, what, err)
    dilations = attr_list(ctx, "dilations", nd, 1, what, err)
    out_pad = attr_list(ctx, "output_padding", nd, 0, what, err)
    pads_begin, pads_end = pads_attr(ctx, nd, what, err)
    auto_pad = auto_pad_mode(ctx, what, err)
    output_shape = ctx.get("output_shape")
    if output_shape is not None:
        output_shape = [int(v) for v in output_shape]
        if len(output_shape) == nd + 2:  # some exporters include N and C
            output_shape = output_shape[2:]
        if len(output_shape) != nd:
            raise err(f"{what}: output_shape {output_shape} does not match the {nd} spatial axes")
    for s, d, op in zip(strides, dilations, out_pad):
        if s <= 0 or d <= 0:
            raise err(f"{what}: strides and dilations must be positive")
        if op < 0:
            raise err(f"{what}: output_padding must be non-negative")
    out, pb = [], []
    for i in range(nd):
        size, k, s, d = in_sizes[i], kernel_shape[i], strides[i], dilations[i]
        known = isinstance(size, int) and isinstance(k, int)
        ek = (k - 1) * d + 1 if isinstance(k, int) else None
        full = (size - 1) * s + out_pad[i] + ek if known else None
        if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            if output_shape is not None:
                o = output_shape[i]
            else:
                o = size * s if isinstance(size, int) else None
            if full is None or o is None:
                out.append(o)
                pb.append(None)
                continue
            total = full - o
            if auto_pad == "SAME_UPPER":
                b = total // 2
            else:
                b = total - total // 2
        elif auto_pad == "VALID":
            b = 0
            o = full
        else:
            b = pads_begin[i]
            o = None if full is None else full - pads_begin[i] - pads_end[i]
        if o is not None and o <= 0:
            raise err(f"{what}: computed output size {o} along spatial axis {i} is not positive")
        out.append(o)
        pb.append(b)
    return out, pb, strides, dilations


def _convt_shape(ctx, x, w, b=None):
    if x.shape is not None and len(x.shape) < 3:
        raise ShapeInferenceError(f"ConvTranspose: input X must have rank >= 3, got {x.shape}")
    group = int(ctx.get("group", 1))
    if group <= 0:
        raise ShapeInferenceError(f"ConvTranspose: group must be positive, got {group}")
    m = None
    if w.shape is not None and isinstance(w.shape[1], int):
        m = w.shape[1] * group
    if x.shape is None:
        rank = None if w.shape is None else len(w.shape)
        return [TensorInfo(x.dtype, None if rank is None else (None, m) + (None,) * (rank - 2))]
    nd = len(x.shape) - 2
    kernel_shape = ctx.get("kernel_shape")
    if kernel_shape is not None:
        kernel_shape = [int(k) for k in kernel_shape]
    elif w.shape is not None:
        kernel_shape = list(w.shape[2:])
    else:
        kernel_shape = [None] * nd
    if len(kernel_shape) != nd:
        raise ShapeInferenceError(f"ConvTranspose: kernel_shape {kernel_shape} does not match {nd} spatial axes")
    if w.shape is not None and isinstance(x.shape[1], int) and isinstance(w.shape[0], int) \
            and x.shape[1] != w.shape[0]:
        raise ShapeInferenceError(
            f"ConvTranspose: input has {x.shape[1]} channels but weight has {w.shape[0]}")
    out, _, _, _ = _convt_geometry(ctx, x.shape[2:], kernel_shape, ShapeInferenceError)
    return [TensorInfo(x.dtype, (x.shape[0], m, *out))]


@kernel("ConvTranspose", since=1, shape=_convt_shape)
def conv_transpose(ctx, x, w, b=None):
    if x.ndim < 3 or w.ndim != x.ndim:
        raise KernelError(f"ConvTranspose: expected X and W of the same rank >= 3, got {x.shape} and {w.shape}")
    group = int(ctx.get("group", 1))
    n, c = x.shape[:2]
    if group <= 0 or c % group or w.shape[0] != c:
        raise KernelError(f"ConvTranspose: input {x.shape}, weight {w.shape} and group {group} are inconsistent")
    nd = x.ndim - 2
    kernel_shape = list(w.shape[2:])
    out_sizes, pb, strides, dilations = _convt_geometry(ctx, x.shape[2:], kernel_shape, KernelError)
    cg = c // group
    mg = w.shape[1]
    m = mg * group
    ntaps = int(np.prod(kernel_shape))
    in_sizes = x.shape[2:]
    pin = int(np.prod(in_sizes))
    out_dtype = x.dtype
    cdt = _compute_dtype(x.dtype)
    xc = x.astype(cdt, copy=False)
    wc = w.astype(cdt, copy=False)
    # one matmul gives every tap's contribution: (g, Mg*K, Cg) @ (N, g, Cg, Pin); the weight
    # operand is a transposed view, which BLAS takes as is (no copy of the weights)
    wt = wc.reshape(group, cg, mg * ntaps).transpose(0, 2, 1)
    col = np.matmul(wt, xc.reshape(n, group, cg, pin))  # (N, g, Mg*K, Pin)
    col = col.reshape((n, group, mg, ntaps) + tuple(in_sizes))
    # buffer covering both the full (unpadded) result and the requested output window
    full = [(in_sizes[i] - 1) * strides[i] + (kernel_shape[i] - 1) * dilations[i] + 1 for i in range(nd)]
    lo = [min(0, pb[i]) for i in range(nd)]
    hi = [max(full[i], pb[i] + out_sizes[i]) for i in range(nd)]
    buf = np.zeros((n, group, mg) + tuple(h - l for h, l in zip(hi, lo)), dtype=cdt)
    for t, offs in enumerate(itertools.product(*(range(k) for k in kernel_shape))):
        dst = _tap_slices([o * d - l for o, d, l in zip(offs, dilations, lo)], in_sizes, strides)
        buf[(slice(None), slice(None), slice(None)) + dst] += col[:, :, :, t]
    buf = buf.reshape((n, m) + buf.shape[3:])
    window = tuple(slice(pb[i] - lo[i], pb[i] - lo[i] + out_sizes[i]) for i in range(nd))
    y = buf[(slice(None), slice(None)) + window]
    if y.shape != buf.shape:
        y = np.ascontiguousarray(y)
    if b is not None:
        y += b.astype(cdt, copy=False).reshape((m,) + (1,) * nd)
    return y if y.dtype == out_dtype else y.astype(out_dtype)
