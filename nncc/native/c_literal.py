"""C literals of the values generated code bakes in."""

from __future__ import annotations

import math

import numpy as np


def c_float(value: float) -> str:
    """A float32 literal: exactly the value float32 rounds it to (a value beyond float32's
    range rounds to INFINITY), or NAN."""
    value = float(np.float32(value))
    if value != value:
        return "NAN"
    if value in (math.inf, -math.inf):
        return "INFINITY" if value > 0 else "(-INFINITY)"
    return f"{value!r}f"
