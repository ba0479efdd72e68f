"""Validation of the arrays a caller feeds to a model, against its declared inputs."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from nncc.errors import InputError
from nncc.ir import low_precision
from nncc.ir.graph import TensorInfo


def check_feeds(declared: Mapping[str, TensorInfo], feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Return the feeds as arrays, or raise InputError naming the first bad input.

    Symbolic dimensions (dim_param) must be bound consistently across inputs.
    """
    unknown = [name for name in feeds if name not in declared]
    if unknown:
        raise InputError(
            f"unknown input {unknown[0]!r}; the model's inputs are: {', '.join(declared) or '(none)'}"
        )
    bound: dict[str, tuple[int, str]] = {}
    arrays: dict[str, np.ndarray] = {}
    for name, info in declared.items():
        if name not in feeds:
            raise InputError(f"missing input {name!r} (expected {info.describe()})")
        value = feeds[name]
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        if (info.dtype is not None and array.dtype.kind == "V" and array.dtype.names is None
                and array.dtype.itemsize == info.dtype.itemsize and low_precision.is_low_precision(info.dtype)):
            # .npy files keep bfloat16, float8... only as raw bytes ("<V2"): take them as declared
            array = array.view(info.dtype)
        if info.dtype is not None and array.dtype != info.dtype:
            raise InputError(
                f"input {name!r} has dtype {array.dtype}, expected {info.dtype}"
            )
        if info.shape is not None:
            _check_shape(name, info, array, bound)
        arrays[name] = array
    return arrays


def _check_shape(name: str, info: TensorInfo, array: np.ndarray, bound: dict) -> None:
    def mismatch() -> InputError:
        expected = "[" + ",".join("?" if d is None else str(d) for d in info.shape) + "]"
        got = "[" + ",".join(map(str, array.shape)) + "]"
        return InputError(f"input {name!r} has shape {got}, expected {expected}")

    if array.ndim != len(info.shape):
        raise mismatch()
    for dim, size in zip(info.shape, array.shape):
        if type(dim) is int:
            if dim != size:
                raise mismatch()
        elif isinstance(dim, str):
            previous = bound.setdefault(dim, (size, name))
            if previous[0] != size:
                raise InputError(
                    f"input {name!r} binds dimension {dim!r} to {size}, "
                    f"but input {previous[1]!r} bound it to {previous[0]}"
                )
