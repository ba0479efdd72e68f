"""Temporary buffers kept between runs in an executor's shared workspace (Ctx.workspace).

One kernel runs at a time, so every node asking for the same (key, shape, dtype) can share
one buffer: a model needs one per distinct temporary, and a steady-state run allocates
nothing. Callers rewrite a buffer's contents before each use.

Every kept buffer is cut from slabs of at least SLAB bytes. numpy backs allocations that
large with transparent huge pages, so the first run faults the workspace in as a few 2 MiB
pages instead of thousands of 4 KiB ones (light_resnet50: about 4,600 page faults on the
first run otherwise, each costly in a VM).
"""

from __future__ import annotations

import math

import numpy as np

from nncc.util.limits import check_shape

SLAB = 8 << 20
ALIGN = 64
_SLABS = ("workspace slabs",)  # the workspace key of [current slab, bytes used]


def carve(workspace: dict | None, shape, dtype, zero: bool = False) -> np.ndarray:
    """A new C-contiguous, 64-byte aligned buffer that lives as long as ``workspace``
    (zero-filled with ``zero``); a plain new array when there is no workspace."""
    dtype = np.dtype(dtype)
    if workspace is None:
        check_shape((shape,) if isinstance(shape, (int, np.integer)) else shape, dtype.itemsize, "a temporary buffer")
        return np.zeros(shape, dtype) if zero else np.empty(shape, dtype)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape)
    nbytes = check_shape(shape, dtype.itemsize, f"a temporary buffer of shape {list(shape)}")  # before allocating
    need = -(-max(nbytes, 1) // ALIGN) * ALIGN
    held = workspace.get(_SLABS)
    if held is None or held[1] + need > held[0].nbytes:
        raw = np.empty(max(SLAB, need) + ALIGN, np.uint8)
        start = -raw.ctypes.data % ALIGN
        held = workspace[_SLABS] = [raw[start:start + max(SLAB, need)], 0]
    slab, used = held
    held[1] = used + need
    buf = slab[used:used + nbytes].view(dtype).reshape(shape)
    if zero:
        buf.fill(0)
    return buf


def kept(workspace: dict | None, key, shape, dtype, zero: bool = False) -> np.ndarray:
    """The workspace's buffer for (key, shape, dtype), made on first use (zero-filled then
    with ``zero``); a fresh array when there is no workspace (a kernel called outside an
    executor)."""
    dtype = np.dtype(dtype)
    if workspace is None:
        return np.zeros(shape, dtype) if zero else np.empty(shape, dtype)
    full = (key, shape, dtype.str)
    buf = workspace.get(full)
    if buf is None:
        buf = workspace[full] = carve(workspace, shape, dtype, zero=zero)
    return buf


def shared(workspace: dict | None, key, shape, dtype) -> np.ndarray:
    """A view of ONE block per ``key``, grown to the largest request: every node asking
    under the same key (every Conv's im2col columns, say) reuses the same memory, which is
    fewer pages to fault in on the first run and a buffer still in cache on the next. Two
    buffers a kernel holds at once need two keys."""
    dtype = np.dtype(dtype)
    if workspace is None:
        return np.empty(shape, dtype)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape)
    view_key = ("shared view", key, shape, dtype.str)
    buf = workspace.get(view_key)
    if buf is None:
        nbytes = math.prod(shape) * dtype.itemsize
        block = workspace.get(("shared block", key))
        if block is None or block.nbytes < nbytes:
            # grow (first runs only); the views cut from the old block are forgotten
            for stale in [k for k in workspace if k[:2] == ("shared view", key)]:
                del workspace[stale]
            block = workspace[("shared block", key)] = carve(workspace, (max(nbytes, 64),), np.uint8)
        buf = workspace[view_key] = block[:nbytes].view(dtype).reshape(shape)
    return buf
