"""Trigonometric and hyperbolic kernels: Sin, Cos, Tan, their inverses, and the hyperbolic
functions with theirs.

Each is numpy's ufunc, so out-of-domain inputs give NaN (asin(2), acosh(0.5)) and the poles
give infinities (atanh(1)), as IEEE arithmetic and onnxruntime do. float16 and bfloat16 are
computed in float32 and rounded once at the end. Small constant inputs are folded at
compile time (window functions build their tables from Cos of a Range).
"""

from __future__ import annotations

import numpy as np

from nncc.errors import KernelError
from nncc.kernels.arithmetic import is_float, register, widened
from nncc.kernels.shapes import same_as

def _make(op: str, since: int, fn) -> None:
    def unary(ctx, x, out=None):
        if not is_float(x.dtype):
            raise KernelError(f"{op} expects a floating-point input, got {x.dtype}")
        w = widened(x)
        with np.errstate(all="ignore"):
            if out is not None and w is x:
                return fn(x, out=out[0])
            y = fn(w)
        return y if y.dtype == x.dtype else y.astype(x.dtype)

    unary.__name__ = op.lower()
    register(op, since, same_as(0), writes_out=True)(unary)


for _op, _since, _fn in (
    ("Sin", 7, np.sin), ("Cos", 7, np.cos), ("Tan", 7, np.tan),
    ("Asin", 7, np.arcsin), ("Acos", 7, np.arccos), ("Atan", 7, np.arctan),
    ("Sinh", 9, np.sinh), ("Cosh", 9, np.cosh),
    ("Asinh", 9, np.arcsinh), ("Acosh", 9, np.arccosh), ("Atanh", 9, np.arctanh),
):
    _make(_op, _since, _fn)
