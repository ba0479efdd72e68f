"""Depthwise convolution (group == input channels, one input channel per group).

Called by the Conv kernel (nncc.kernels.conv) with the geometry already resolved.

A depthwise convolution has no weights shared between channels, so it cannot be one big
matrix product; it is a per-channel weighted sum of the K = prod(kernel_shape) shifted
copies ("taps") of the channel's input, done as

1. one copy of the input into a *staging* buffer kept between runs (zero padding written
   once, only the interior rewritten),
2. one long copy per group of taps into a tap-major column buffer ``cols[K, channels * P]``
   (P = the output grid of one channel; all taps of a stride phase form one group),
3. one batched matrix-vector product: for every channel, ``w[c] (mult x K) @ cols[:, c]
   (K x P)``, written straight into the output.

The staging layout makes every tap one long strided run across all channels, so step 2
is a handful of long copies instead of one short copy per channel and tap:

* The last spatial axis keeps the input's own row pitch (or ``stride * output width``):
  a tap shifted by ``e`` columns reads the flat buffer shifted by ``e`` elements, and a
  horizontal stride ``s`` is a read with element stride ``s``. Reads that wrap into a
  neighbouring row (left/right padding) are zeroed in ``cols`` afterwards: a few columns
  of the output grid, one strided fill per kernel column (the "wrap fix").
* The first spatial axis is split into its stride phases (rows a, a+s, a+2s, ... of every
  channel stored together), each phase block holding all channels one after the other
  with a few zero rows after each channel. Those zero rows are the top and bottom padding
  of the neighbouring channels, so a tap shifted by ``d`` rows is the same flat run for
  every channel, and the output grid of a channel has exactly the output's rows.
* Middle axes (3-D and up) are stored zero-padded and split into stride phases; the
  output grid then has surplus positions along them, cropped at the end.

With no middle axes and an output as wide as the grid (e.g. "same" padding at stride 1
or 2), the matrix-vector product writes the output directly; otherwise it goes to a kept
buffer and is cropped into the output.

Two copy tricks matter for the short rows of real feature maps: rows are copied as single
opaque items (a void dtype of one row's bytes) rather than element by element, and a
stride-2 float32 tap read (every other element) is an int64 -> int32 cast of the pairs,
which keeps each pair's first float, instead of numpy's much slower strided copy.

Everything geometry-dependent (layout, views, buffers) is built once per shape and kept in
``scratch`` (the executor's workspace): a steady-state run allocates nothing.
"""

from __future__ import annotations

import itertools
import math
import sys

import numpy as np
from numpy.lib.stride_tricks import as_strided

from nncc.kernels.workspace import carve, kept

# Channels are processed in chunks whose column buffer stays about this size (L2-sized:
# the copy, the wrap fix and the product then work in cache).
_CHUNK_BYTES = 512 << 10


def depthwise_conv(x, w, kernel_shape, strides, dilations, pads_begin, pads_end, out_sizes,
                   scratch=None, out=None):
    """Conv without bias of x (N, C, *spatial) with w (M, 1, *kernel_shape), M a multiple
    of C (output channel m reads input channel m // (M // C)); written into ``out`` (a
    C-contiguous (N, M, *out_sizes) array) when given. ``scratch`` (a dict kept between
    runs) holds the per-geometry plan and its buffers."""
    pads_begin, pads_end = list(pads_begin), list(pads_end)
    if min(pads_begin) < 0 or min(pads_end) < 0:  # negative pads crop the input
        x = x[(slice(None), slice(None)) + tuple(
            slice(max(0, -b), x.shape[2 + i] - max(0, -e))
            for i, (b, e) in enumerate(zip(pads_begin, pads_end)))]
        pads_begin = [max(0, p) for p in pads_begin]
        pads_end = [max(0, p) for p in pads_end]
    key = ("depthwise plan", x.shape, x.dtype.str, w.shape[0], tuple(kernel_shape), tuple(strides),
           tuple(dilations), tuple(pads_begin), tuple(pads_end), tuple(out_sizes))
    plan = None if scratch is None else scratch.get(key)
    if plan is None:
        plan = _Plan(x.shape, x.dtype, w.shape[0], list(kernel_shape), list(strides), list(dilations),
                     pads_begin, pads_end, list(out_sizes), scratch)
        if scratch is not None:
            scratch[key] = plan
    return plan.run(x, w, out)


def _rows(a: np.ndarray):
    """``a`` seen as an array of whole rows (a void item per last-axis row), or None when
    its last axis is not contiguous."""
    if a.ndim == 0 or a.shape[-1] == 0 or (a.strides[-1] != a.itemsize and a.shape[-1] > 1):
        return None
    try:
        return a.view(np.dtype((np.void, a.shape[-1] * a.itemsize)))[..., 0]
    except ValueError:
        return None


def _ranges(flags):
    """(start, stop) runs of True in a list of booleans."""
    runs, start = [], None
    for i, f in enumerate(list(flags) + [False]):
        if f and start is None:
            start = i
        elif not f and start is not None:
            runs.append((start, i))
            start = None
    return runs


class _Plan:
    """Buffers and precomputed views for one geometry (shape, dtype, attributes)."""

    def __init__(self, x_shape, dtype, m, kernel_shape, strides, dilations, pb, pe, out_sizes, scratch):
        n, c = x_shape[:2]
        nc = n * c
        spatial = list(x_shape[2:])
        nd = len(spatial)
        dtype = np.dtype(dtype)
        isz = dtype.itemsize
        mult = m // c
        ntaps = math.prod(kernel_shape)
        # last axis: row pitch wst = sl * wg, wg = columns of the output grid
        width, sl, dl, kw, pl, wo = spatial[-1], strides[-1], dilations[-1], kernel_shape[-1], pb[-1], out_sizes[-1]
        wg = max(wo, -(-width // sl))
        wst = sl * wg
        # first axis (when there is another one): stride phases, channels separated by zero rows
        if nd > 1:
            s0, d0, p0, k0, h0, o0 = strides[0], dilations[0], pb[0], kernel_shape[0], spatial[0], out_sizes[0]
            used = [len(range(a, h0, s0)) for a in range(s0)]
            deltas = [(k * d0 - p0) // s0 for k in range(k0)]
            rows = max(o0 + max(0, max(deltas)), max(used) + max(0, -min(deltas)))
        else:
            s0, o0, rows, used = 1, 1, 1, [1]
        mid = list(range(1, nd - 1))
        qm = [-(-(spatial[i] + pb[i] + pe[i]) // strides[i]) for i in mid]
        slab = math.prod(qm) * wst                   # staging elements per row of the first axis
        chan = rows * slab                           # ... per channel of one phase
        gchan = chan // sl                           # output grid positions per channel
        pv = o0 * math.prod(qm) * wg                 # ... of which the product computes these
        phase_shape = (s0,) + tuple(strides[i] for i in mid)
        nph = math.prod(phase_shape)
        pblock = nc * chan
        msuffix = [math.prod(qm[j + 1:]) * wst for j in range(len(mid))]

        def start(offs):
            """Flat offset of a tap's first read (channel 0, output position 0)."""
            phase, at = [0], 0
            if nd > 1:
                h = offs[0] * d0 - p0
                phase, at = [h % s0], (h // s0) * slab
            for j, i in enumerate(mid):
                v = offs[i] * dilations[i]
                phase.append(v % strides[i])
                at += (v // strides[i]) * msuffix[j]
            return int(np.ravel_multi_index(phase, phase_shape)) * pblock + at + offs[-1] * dl - pl

        starts = [start(offs) for offs in itertools.product(*(range(k) for k in kernel_shape))]
        total = nph * pblock
        slack = max(0, -min(starts))
        # a stride-2 float32 read is done as int64 reads (pairs) cast to int32: numpy's
        # strided element copy is several times slower than that contiguous cast
        pairs = sl == 2 and isz == 4 and sys.byteorder == "little"
        tail = max(0, max(starts) + sl * (nc * gchan - 1) + 1 + pairs - total)
        self.buf = buf = carve(scratch, (slack + total + tail,), dtype, zero=True)
        body = buf[slack:slack + total].reshape((nph, nc, rows) + tuple(qm) + (wst,))

        # interior copies, one per phase: (destination, source index into x as (N*C, *spatial))
        self.copies = []
        whole = wst == width and s0 == 1 and not mid  # each channel's rows are one contiguous run
        for ph, rs in enumerate(itertools.product(*(range(s) for s in phase_shape))):
            src, dst = [slice(None)], [ph, slice(None)]
            if nd > 1:
                src.append(slice(rs[0], None, s0))
                dst.append(slice(0, used[rs[0]]))
            else:
                dst.append(0)
            for j, i in enumerate(mid):
                j0 = (rs[1 + j] - pb[i]) % strides[i]
                cnt = len(range(j0, spatial[i], strides[i]))
                first = (j0 + pb[i]) // strides[i]
                src.append(slice(j0, None, strides[i]))
                dst.append(slice(first, first + cnt))
            view = body[tuple(dst) + (slice(0, width),)]
            if view.size:
                rows_view = None if whole else _rows(view)
                self.copies.append((view, rows_view, tuple(src)))

        # taps of one phase form an evenly spaced grid along every axis: one copy per phase
        groups = []
        for rs in itertools.product(*(range(s) for s in phase_shape)):
            sel, count, step = [], [], []
            for i in range(nd):
                if i == nd - 1:
                    members = list(range(kw))
                elif i == 0:
                    members = [k for k in range(k0) if (k * d0 - p0) % s0 == rs[0]]
                else:
                    r = rs[1 + mid.index(i)]
                    members = [k for k in range(kernel_shape[i]) if (k * dilations[i]) % strides[i] == r]
                if not members:
                    break
                gap = members[1] - members[0] if len(members) > 1 else 1
                if i == nd - 1:
                    delta = gap * dl
                elif i == 0:
                    delta = (gap * d0 // s0) * slab
                else:
                    delta = (gap * dilations[i] // strides[i]) * msuffix[mid.index(i)]
                sel.append(slice(members[0], members[-1] + 1, gap))
                count.append(len(members))
                step.append(delta)
            else:
                first = int(np.ravel_multi_index(tuple(s.start for s in sel), kernel_shape))
                groups.append((tuple(sel), tuple(count), tuple(step), starts[first]))

        # wrap fix: output columns whose read lands on data of a neighbouring row
        regions = []
        for kj in range(kw):
            e = kj * dl - pl
            bad = [not 0 <= sl * j + e < wst and (sl * j + e) % wst < width for j in range(wo)]
            regions += [(kj, a, b) for a, b in _ranges(bad)]

        # channel chunks bounding the column buffer; a chunk is a run of channels of one
        # sample, or every channel of every sample at once when they fit
        per = ntaps * gchan * isz
        cb = max(1, _CHUNK_BYTES // per)
        if cb >= nc:
            spans = [(None, 0, c)]
        else:
            cb = min(cb, c)
            cb = -(-c // -(-c // cb))  # even chunks
            spans = [(i, b0, min(c, b0 + cb)) for i in range(n) for b0 in range(0, c, cb)]
        most = max((b1 - b0) * (n if i is None else 1) for i, b0, b1 in spans)
        cols_all = kept(scratch, "depthwise cols", ntaps * most * gchan, dtype)
        self.grid = (o0,) + tuple(qm) + (wg,)
        self.exact = (o0,) + tuple(out_sizes[1:-1]) + (wo,) if nd > 1 else (1, wo)
        self.direct = self.grid == self.exact
        prod_all = None if self.direct else kept(scratch, "depthwise product", most * mult * pv, dtype)
        self.crop = (Ellipsis,) + tuple(slice(0, o) for o in self.exact[1:])
        kh = ntaps // kw
        self.chunks = []
        for i, b0, b1 in spans:
            nn = n if i is None else 1
            nb = (b1 - b0) * nn
            first = 0 if i is None else i * c + b0
            cols = cols_all[:ntaps * nb * gchan].reshape(ntaps, nb * gchan)
            per_tap = cols.reshape(tuple(kernel_shape) + (nb * gchan,))
            copies = []
            for sel, count, step, base in groups:
                at = slack + first * chan + base
                if pairs:
                    # every other float32: the low halves of int64 pairs, by an integer cast
                    src = np.ndarray(count + (nb * gchan,), np.int64, buf, at * isz,
                                     tuple(s * isz for s in step) + (2 * isz,))
                    copies.append((per_tap[sel].view(np.int32), src))
                else:
                    src = as_strided(buf[at:], count + (nb * gchan,),
                                     tuple(s * isz for s in step) + (sl * isz,), writeable=False)
                    copies.append((per_tap[sel], src))
            fixes = []
            if regions:
                grid_rows = cols.reshape(kh, kw, nb * gchan // wg, wg)
                widths = {b - a for _, a, b in regions}
                offsets = [kj * nb * gchan + a for kj, a, _ in regions]
                gaps = {offsets[k + 1] - offsets[k] for k in range(len(offsets) - 1)}
                if len(regions) > 1 and len(widths) == 1 and len(gaps) == 1:
                    # all regions as one view: (kernel rows, region, grid rows, width)
                    kj, a, _ = regions[0]
                    st = grid_rows.strides
                    fixes.append(as_strided(grid_rows[:, kj, :, a:], (kh, len(regions)) + grid_rows.shape[2:3]
                                            + (widths.pop(),), (st[0], gaps.pop() * isz, st[2], st[3])))
                else:
                    fixes.extend(grid_rows[:, kj, :, a:b] for kj, a, b in regions)
            mat = cols.reshape(ntaps, nn, b1 - b0, gchan)[..., :pv].transpose(1, 2, 0, 3)
            prod = None if self.direct else prod_all[:nb * mult * pv].reshape(nn, b1 - b0, mult, pv)
            self.chunks.append((slice(None) if i is None else slice(i, i + 1), b0, b1, copies, fixes, mat, prod))
        self.dims = (n, c, m, mult, ntaps) + tuple(out_sizes)

    def run(self, x, w, out=None):
        n, c, m, mult, ntaps = self.dims[:5]
        if out is not None and not out.flags.c_contiguous:  # not expected: the product needs rows
            np.copyto(out, self.run(x, w))
            return out
        if out is None:
            out = np.empty((n, m) + self.dims[5:], x.dtype)
        xr = x.reshape((n * c,) + x.shape[2:])
        xrows = None
        for dst, dst_rows, src in self.copies:
            if dst_rows is not None:
                if xrows is None:
                    xrows = _rows(xr)
                if xrows is not None:
                    dst_rows[...] = xrows[src]
                    continue
            dst[...] = xr[src + (slice(None),)]
        w3 = w.reshape(c, mult, ntaps)
        o4 = out.reshape(n, c, mult, -1)
        for ns, b0, b1, copies, fixes, mat, prod in self.chunks:
            for dst, src in copies:
                np.copyto(dst, src, casting="unsafe")
            for f in fixes:
                f[...] = 0
            target = o4[ns, b0:b1]
            if prod is None:
                np.matmul(w3[b0:b1], mat, out=target)
            else:
                np.matmul(w3[b0:b1], mat, out=prod)
                dst = target.reshape(prod.shape[:3] + self.exact)
                src = prod.reshape(prod.shape[:3] + self.grid)[self.crop]
                dst_rows, src_rows = _rows(dst), _rows(src)
                if dst_rows is not None and src_rows is not None:
                    dst_rows[...] = src_rows
                else:
                    np.copyto(dst, src)
        return out
