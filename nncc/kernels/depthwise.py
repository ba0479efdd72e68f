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


class _Layout:
    """The staging layout of one geometry: sizes of the output grid, the stride phases and
    the channel blocks, and where each tap's first read starts (see the module docstring)."""

    def __init__(self, x_shape, dtype, m, kernel_shape, strides, dilations, pb, pe, out_sizes):
        self.n, self.c = x_shape[:2]
        self.nc = self.n * self.c
        self.spatial = spatial = list(x_shape[2:])
        self.nd = nd = len(spatial)
        self.isz = np.dtype(dtype).itemsize
        self.mult = m // self.c
        self.ntaps = math.prod(kernel_shape)
        self.kernel_shape, self.strides, self.dilations, self.pb = kernel_shape, strides, dilations, pb
        # last axis: row pitch wst = sl * wg, wg = columns of the output grid
        self.width, self.sl, self.dl, self.kw, self.pl, self.wo = (
            spatial[-1], strides[-1], dilations[-1], kernel_shape[-1], pb[-1], out_sizes[-1])
        self.wg = max(self.wo, -(-self.width // self.sl))
        self.wst = self.sl * self.wg
        # first axis (when there is another one): stride phases, channels separated by zero rows
        if nd > 1:
            s0, self.d0, self.p0, self.k0, h0, o0 = (strides[0], dilations[0], pb[0], kernel_shape[0],
                                                     spatial[0], out_sizes[0])
            self.used = [len(range(a, h0, s0)) for a in range(s0)]
            deltas = [(k * self.d0 - self.p0) // s0 for k in range(self.k0)]
            self.rows = max(o0 + max(0, max(deltas)), max(self.used) + max(0, -min(deltas)))
        else:
            s0, o0, self.rows, self.used = 1, 1, 1, [1]
        self.s0, self.o0 = s0, o0
        self.mid = mid = list(range(1, nd - 1))
        self.qm = qm = [-(-(spatial[i] + pb[i] + pe[i]) // strides[i]) for i in mid]
        self.slab = math.prod(qm) * self.wst         # staging elements per row of the first axis
        self.chan = self.rows * self.slab            # ... per channel of one phase
        self.gchan = self.chan // self.sl            # output grid positions per channel
        self.pv = o0 * math.prod(qm) * self.wg       # ... of which the product computes these
        self.phase_shape = (s0,) + tuple(strides[i] for i in mid)
        self.nph = math.prod(self.phase_shape)
        self.pblock = self.nc * self.chan
        self.msuffix = [math.prod(qm[j + 1:]) * self.wst for j in range(len(mid))]
        self.starts = [self._start(offs) for offs in itertools.product(*(range(k) for k in kernel_shape))]

    def _start(self, offs) -> int:
        """Flat offset of a tap's first read (channel 0, output position 0)."""
        phase, at = [0], 0
        if self.nd > 1:
            h = offs[0] * self.d0 - self.p0
            phase, at = [h % self.s0], (h // self.s0) * self.slab
        for j, i in enumerate(self.mid):
            v = offs[i] * self.dilations[i]
            phase.append(v % self.strides[i])
            at += (v // self.strides[i]) * self.msuffix[j]
        return (int(np.ravel_multi_index(phase, self.phase_shape)) * self.pblock + at
                + offs[-1] * self.dl - self.pl)

    def phases(self):
        return itertools.product(*(range(s) for s in self.phase_shape))

    def interior_copies(self, body) -> list:
        """Per stride phase: (destination in the staging body, its rows or None, source
        index into x seen as (N*C, *spatial))."""
        copies = []
        whole = self.wst == self.width and self.s0 == 1 and not self.mid  # channels' rows contiguous
        for ph, rs in enumerate(self.phases()):
            src, dst = [slice(None)], [ph, slice(None)]
            if self.nd > 1:
                src.append(slice(rs[0], None, self.s0))
                dst.append(slice(0, self.used[rs[0]]))
            else:
                dst.append(0)
            for j, i in enumerate(self.mid):
                stride = self.strides[i]
                j0 = (rs[1 + j] - self.pb[i]) % stride
                cnt = len(range(j0, self.spatial[i], stride))
                first = (j0 + self.pb[i]) // stride
                src.append(slice(j0, None, stride))
                dst.append(slice(first, first + cnt))
            view = body[tuple(dst) + (slice(0, self.width),)]
            if view.size:
                copies.append((view, None if whole else _rows(view), tuple(src)))
        return copies

    def tap_groups(self) -> list:
        """The taps of one phase form an evenly spaced grid along every axis, so one copy
        per phase: (kernel selection, count and element step per axis, first read)."""
        groups = []
        for rs in self.phases():
            sel, count, step = [], [], []
            for i in range(self.nd):
                if i == self.nd - 1:
                    members = list(range(self.kw))
                elif i == 0:
                    members = [k for k in range(self.k0) if (k * self.d0 - self.p0) % self.s0 == rs[0]]
                else:
                    r = rs[1 + self.mid.index(i)]
                    members = [k for k in range(self.kernel_shape[i])
                               if (k * self.dilations[i]) % self.strides[i] == r]
                if not members:
                    break
                gap = members[1] - members[0] if len(members) > 1 else 1
                if i == self.nd - 1:
                    delta = gap * self.dl
                elif i == 0:
                    delta = (gap * self.d0 // self.s0) * self.slab
                else:
                    delta = (gap * self.dilations[i] // self.strides[i]) * self.msuffix[self.mid.index(i)]
                sel.append(slice(members[0], members[-1] + 1, gap))
                count.append(len(members))
                step.append(delta)
            else:
                first = int(np.ravel_multi_index(tuple(s.start for s in sel), self.kernel_shape))
                groups.append((tuple(sel), tuple(count), tuple(step), self.starts[first]))
        return groups

    def wrap_regions(self) -> list:
        """(kernel column, first, stop) output columns whose read lands on data of a
        neighbouring row: zeroed after the tap copies (the wrap fix)."""
        regions = []
        for kj in range(self.kw):
            e = kj * self.dl - self.pl
            bad = [not 0 <= self.sl * j + e < self.wst and (self.sl * j + e) % self.wst < self.width
                   for j in range(self.wo)]
            regions += [(kj, a, b) for a, b in _ranges(bad)]
        return regions

    def channel_spans(self) -> list:
        """Channel chunks bounding the column buffer, (sample or None, first, stop): a run
        of channels of one sample, or every channel of every sample at once when they fit."""
        n, c = self.n, self.c
        cb = max(1, _CHUNK_BYTES // (self.ntaps * self.gchan * self.isz))
        if cb >= self.nc:
            return [(None, 0, c)]
        cb = min(cb, c)
        cb = -(-c // -(-c // cb))  # even chunks
        return [(i, b0, min(c, b0 + cb)) for i in range(n) for b0 in range(0, c, cb)]


def _wrap_fixes(cols, regions, layout: _Layout, nb: int) -> list:
    """Views of ``cols`` to zero for the wrap regions: one view for evenly spaced regions
    of one width, else one per region."""
    if not regions:
        return []
    kh = layout.ntaps // layout.kw
    grid_rows = cols.reshape(kh, layout.kw, nb * layout.gchan // layout.wg, layout.wg)
    widths = {b - a for _, a, b in regions}
    offsets = [kj * nb * layout.gchan + a for kj, a, _ in regions]
    gaps = {offsets[k + 1] - offsets[k] for k in range(len(offsets) - 1)}
    if len(regions) > 1 and len(widths) == 1 and len(gaps) == 1:
        # all regions as one view: (kernel rows, region, grid rows, width)
        kj, a, _ = regions[0]
        st = grid_rows.strides
        return [as_strided(grid_rows[:, kj, :, a:], (kh, len(regions)) + grid_rows.shape[2:3]
                           + (widths.pop(),), (st[0], gaps.pop() * layout.isz, st[2], st[3]))]
    return [grid_rows[:, kj, :, a:b] for kj, a, b in regions]


class _Plan:
    """Buffers and precomputed views for one geometry (shape, dtype, attributes)."""

    def __init__(self, x_shape, dtype, m, kernel_shape, strides, dilations, pb, pe, out_sizes, scratch):
        dtype = np.dtype(dtype)
        layout = _Layout(x_shape, dtype, m, kernel_shape, strides, dilations, pb, pe, out_sizes)
        body = self._staging(layout, dtype, scratch)
        self.copies = layout.interior_copies(body)
        spans = layout.channel_spans()
        most = max((b1 - b0) * (layout.n if i is None else 1) for i, b0, b1 in spans)
        self.grid = (layout.o0,) + tuple(layout.qm) + (layout.wg,)
        self.exact = (layout.o0,) + tuple(out_sizes[1:-1]) + (layout.wo,) if layout.nd > 1 else (1, layout.wo)
        self.direct = self.grid == self.exact
        self.crop = (Ellipsis,) + tuple(slice(0, o) for o in self.exact[1:])
        cols_all = kept(scratch, "depthwise cols", layout.ntaps * most * layout.gchan, dtype)
        prod_all = None if self.direct else kept(scratch, "depthwise product", most * layout.mult * layout.pv,
                                                 dtype)
        groups, regions = layout.tap_groups(), layout.wrap_regions()
        self.chunks = [self._chunk(layout, span, groups, regions, cols_all, prod_all) for span in spans]
        self.dims = (layout.n, layout.c, m, layout.mult, layout.ntaps) + tuple(out_sizes)

    def _staging(self, layout: _Layout, dtype, scratch):
        """The zeroed staging buffer (kept, with room before and after for the taps' first
        and last reads) and its body, (phase, N*C, rows, *middle, row pitch)."""
        starts = layout.starts
        total = layout.nph * layout.pblock
        self.slack = max(0, -min(starts))
        # a stride-2 float32 read is done as int64 reads (pairs) cast to int32: numpy's
        # strided element copy is several times slower than that contiguous cast
        self.pairs = layout.sl == 2 and layout.isz == 4 and sys.byteorder == "little"
        tail = max(0, max(starts) + layout.sl * (layout.nc * layout.gchan - 1) + 1 + self.pairs - total)
        self.buf = carve(scratch, (self.slack + total + tail,), dtype, zero=True)
        return self.buf[self.slack:self.slack + total].reshape(
            (layout.nph, layout.nc, layout.rows) + tuple(layout.qm) + (layout.wst,))

    def _chunk(self, layout: _Layout, span, groups, regions, cols_all, prod_all) -> tuple:
        """One channel chunk's tap copies (into its columns), wrap fixes, product operands."""
        i, b0, b1 = span
        n, c, gchan, isz, buf = layout.n, layout.c, layout.gchan, layout.isz, self.buf
        nn = n if i is None else 1
        nb = (b1 - b0) * nn
        first = 0 if i is None else i * c + b0
        cols = cols_all[:layout.ntaps * nb * gchan].reshape(layout.ntaps, nb * gchan)
        per_tap = cols.reshape(tuple(layout.kernel_shape) + (nb * gchan,))
        copies = []
        for sel, count, step, base in groups:
            at = self.slack + first * layout.chan + base
            if self.pairs:
                # every other float32: the low halves of int64 pairs, by an integer cast
                src = np.ndarray(count + (nb * gchan,), np.int64, buf, at * isz,
                                 tuple(s * isz for s in step) + (2 * isz,))
                copies.append((per_tap[sel].view(np.int32), src))
            else:
                src = as_strided(buf[at:], count + (nb * gchan,),
                                 tuple(s * isz for s in step) + (layout.sl * isz,), writeable=False)
                copies.append((per_tap[sel], src))
        fixes = _wrap_fixes(cols, regions, layout, nb)
        mat = cols.reshape(layout.ntaps, nn, b1 - b0, gchan)[..., :layout.pv].transpose(1, 2, 0, 3)
        prod = None if self.direct else prod_all[:nb * layout.mult * layout.pv].reshape(
            nn, b1 - b0, layout.mult, layout.pv)
        return (slice(None) if i is None else slice(i, i + 1), b0, b1, copies, fixes, mat, prod)

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
