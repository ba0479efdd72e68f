"""Temporary buffers kept between runs in an executor's shared workspace (Ctx.workspace).

One kernel runs at a time, so every node asking for the same (key, shape, dtype) can share
one buffer: a model needs one per distinct temporary, and a steady-state run allocates
nothing. Callers rewrite a buffer's contents before each use.
"""

from __future__ import annotations

import numpy as np


def kept(workspace: dict | None, key, shape, dtype) -> np.ndarray:
    """The workspace's buffer for (key, shape, dtype), made on first use; a fresh array
    when there is no workspace (a kernel called outside an executor)."""
    dtype = np.dtype(dtype)
    if workspace is None:
        return np.empty(shape, dtype)
    full = (key, shape, dtype.str)
    buf = workspace.get(full)
    if buf is None:
        buf = workspace[full] = np.empty(shape, dtype)
    return buf
