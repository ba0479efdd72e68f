"""C literals of the values generated code bakes in."""

from __future__ import annotations

import numpy as np


def c_float(value: float) -> str:
    """A float32 literal: exactly the value float32 rounds it to, or INFINITY and NAN."""
    if value == np.inf:
        return "INFINITY"
    if value == -np.inf:
        return "(-INFINITY)"
    if value != value:
        return "NAN"
    return f"{float(np.float32(value))!r}f"
