"""Broadcast ("splat") constants, in one place: arrays whose zero strides repeat values.

Folded ConstantOfShape and per-channel scales made by BatchNormalization folding stay
compact through compiling, the plan and the cache: a zero stride repeats one stored value
along an axis. The passes, the memory plan, the artifact format and the run-time
expansion all decide with these functions. Strides of length-1 axes never matter.
"""

from __future__ import annotations

import numpy as np


def _repeated(array: np.ndarray) -> list[bool]:
    """Per axis: does a zero stride repeat its values along it (length above 1)?"""
    return [stride == 0 and dim > 1 for stride, dim in zip(array.strides, array.shape)]


def is_splat(array: np.ndarray) -> bool:
    """Non-empty, and every element in one memory location (a one-element array is one)."""
    return array.size > 0 and all(s == 0 for s, d in zip(array.strides, array.shape) if d != 1)


def stores_as_splat(array: np.ndarray) -> bool:
    """More than one element, all in one location: the artifact keeps one element."""
    return array.size > 1 and is_splat(array)


def is_broadcast(array: np.ndarray) -> bool:
    """More than one element, and some axis repeats its values (a splat or a partial
    broadcast): a kernel given it would copy it on every call."""
    return array.size > 1 and any(_repeated(array))


def compact(array: np.ndarray) -> np.ndarray:
    """The distinct values of a broadcast (length 1 on each repeating axis), a view; any
    other array itself. ``np.broadcast_to(compact(a), a.shape)`` gives ``a`` back."""
    repeated = _repeated(array)
    if not any(repeated):
        return array
    return array[tuple(slice(0, 1) if r else slice(None) for r in repeated)]


def stored_elements(array: np.ndarray) -> int:
    """Elements actually stored behind ``array`` (a repeating axis counts once)."""
    if array.size == 0:
        return 0
    count = 1
    for stride, dim in zip(array.strides, array.shape):
        if stride != 0:
            count *= dim
    return count
