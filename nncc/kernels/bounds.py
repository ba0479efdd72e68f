"""Elementwise bounds (Relu, Clip) at numpy's full speed.

``np.maximum(y, 0)`` against a scalar runs numpy's slow strided loop: measured 4-5x slower
than against a contiguous array of zeros (numpy 2.4, AVX-512). ``bound`` applies the bound
to flat rows of ROW elements against a cached read-only row of the value instead, with
exactly the same ufunc, hence bit-identical results (NaN, infinities and signed zeros
included).
"""

from __future__ import annotations

import numpy as np

ROW = 16384
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_ROWS: dict = {}


def _row(dtype: np.dtype, value: float) -> np.ndarray:
    key = (dtype.str, value)
    row = _ROWS.get(key)
    if row is None:
        if len(_ROWS) > 64:
            _ROWS.clear()
        row = np.full(ROW, value, dtype)
        row.flags.writeable = False
        _ROWS[key] = row
    return row


def bound(y: np.ndarray, ufunc, value: float, out: np.ndarray | None = None) -> np.ndarray:
    """``ufunc(y, value, out=out)`` (np.maximum or np.minimum) for a C-contiguous float32
    or float64 ``y`` and ``out`` (default: ``y`` itself, in place); returns ``out``."""
    if out is None:
        out = y
    row = _row(y.dtype, value)
    flat, dst = y.reshape(-1), out.reshape(-1)
    rows = flat.size // ROW
    if rows:
        ufunc(flat[:rows * ROW].reshape(rows, ROW), row, out=dst[:rows * ROW].reshape(rows, ROW))
    tail = rows * ROW
    if tail < flat.size:
        ufunc(flat[tail:], row[:flat.size - tail], out=dst[tail:])
    return out
