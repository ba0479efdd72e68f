"""Depthwise convolution (group == input channels, one input channel per group).

Called by the Conv kernel (nncc.kernels.conv) with the geometry already resolved.
"""

from __future__ import annotations

import itertools
import math

import numpy as np


def depthwise_conv(x, w, kernel_shape, strides, dilations, pads_begin, pads_end, out_sizes,
                   scratch=None, out=None):
    """Conv without bias of x (N, C, *spatial) with w (M, 1, *kernel_shape), M a multiple
    of C (output channel m reads input channel m // (M // C)); written into ``out`` (a
    C-contiguous (N, M, *out_sizes) array) when given."""
    n, c = x.shape[:2]
    m = w.shape[0]
    mult = m // c
    nd = x.ndim - 2
    if any(pads_begin) or any(pads_end):
        padded = np.zeros((n, c) + tuple(x.shape[2 + i] + pads_begin[i] + pads_end[i] for i in range(nd)),
                          x.dtype)
        padded[(slice(None), slice(None)) + tuple(
            slice(pads_begin[i], pads_begin[i] + x.shape[2 + i]) for i in range(nd))] = x
    else:
        padded = x
    xs = padded if mult == 1 else np.repeat(padded, mult, axis=1)
    y = out if out is not None else np.empty((n, m) + tuple(out_sizes), x.dtype)
    y[...] = 0
    weights = w.reshape(m, math.prod(kernel_shape))
    for t, offs in enumerate(itertools.product(*(range(k) for k in kernel_shape))):
        window = xs[(slice(None), slice(None)) + tuple(
            slice(o * d, o * d + (size - 1) * s + 1, s)
            for o, d, size, s in zip(offs, dilations, out_sizes, strides))]
        y += window * weights[:, t].reshape((m,) + (1,) * nd)
    return y
