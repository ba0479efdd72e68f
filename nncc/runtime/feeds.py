"""Validation of the arrays a caller feeds to a model, against its declared inputs."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from nncc.errors import InputError
from nncc.ir import low_precision
from nncc.ir.graph import OPTIONAL_SEQUENCE, OPTIONAL_TENSOR, SEQUENCE, TENSOR, TensorInfo


def as_value(value):
    """A kernel result as the runtime keeps it: arrays stay, a sequence stays a list, an
    empty optional stays None, and anything else (a numpy scalar) becomes an array."""
    if type(value) is np.ndarray or isinstance(value, (np.ndarray, list)) or value is None:
        return value
    return np.asarray(value)


def check_feeds(declared: Mapping[str, TensorInfo], feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Return the feeds as arrays, or raise InputError naming the first bad input.

    Symbolic dimensions (dim_param) must be bound consistently across inputs: one name is
    one size in a run (a placeholder such as "?" is a name per axis, nncc.frontend.dim_names).
    """
    unknown = [name for name in feeds if name not in declared]
    if unknown:
        raise InputError(
            f"unknown input {unknown[0]!r}; the model's inputs are: {', '.join(declared) or '(none)'}"
        )
    bound: dict[str, tuple[int, str, int]] = {}  # name -> (size, input, axis) of its first binding
    arrays: dict[str, np.ndarray] = {}
    for name, info in declared.items():
        if name not in feeds:
            if info.kind in (OPTIONAL_TENSOR, OPTIONAL_SEQUENCE):
                arrays[name] = None  # an optional input left out is empty
                continue
            raise InputError(f"missing input {name!r} (expected {info.describe()})")
        value = feeds[name]
        if info.kind != TENSOR:
            arrays[name] = _check_other(name, info, value)
            continue
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        if info.dtype is not None and info.dtype.kind == "O" and array.dtype.kind == "U":
            array = array.astype(object)  # strings: numpy's fixed-width form becomes str objects
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


class FeedChecker:
    """check_feeds for one model, remembering the last feeds that passed as they were (plain
    arrays of the declared dtypes, nothing converted or left out): a run whose arrays have
    those names, dtypes and shapes again passes without the checks, which would find the
    same. Anything else is checked in full. A model whose every input is a tensor of known
    dtype and shape (a plan for fixed sizes) starts with those as passed: no other plain
    arrays could pass, so its first run is checked as cheaply as a later one."""

    __slots__ = ("declared", "passed")

    def __init__(self, declared: Mapping[str, TensorInfo]):
        self.declared = declared
        self.passed: tuple | None = None  # ((name, dtype, shape), ...) of the last feeds that passed
        if all(info.kind == TENSOR and info.dtype is not None and info.is_static for info in declared.values()):
            self.passed = tuple((name, np.dtype(info.dtype), tuple(info.shape)) for name, info in declared.items())

    def unchanged(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray] | None:
        """The feeds as a dict when they match the last ones that passed, else None."""
        return dict(feeds) if self.matches(feeds) else None

    def matches(self, feeds: Mapping[str, object]) -> bool:
        """Whether the feeds are plain arrays with the names, dtypes and shapes of the last
        ones that passed (nothing else among them)."""
        passed = self.passed
        if passed is None or len(feeds) != len(passed):
            return False
        for name, dtype, shape in passed:
            value = feeds.get(name)
            if type(value) is not np.ndarray or value.dtype is not dtype or value.shape != shape:
                return False
        return True

    def __call__(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        arrays = self.unchanged(feeds)
        if arrays is not None:
            return arrays
        arrays = check_feeds(self.declared, feeds)
        if len(arrays) == len(feeds) and all(type(a) is np.ndarray and a is feeds.get(n) for n, a in arrays.items()):
            self.passed = tuple((name, array.dtype, array.shape) for name, array in arrays.items())
        return arrays


def _check_other(name: str, info: TensorInfo, value: object):
    """A sequence (a list of arrays) or an optional (None, or its element) input."""
    if info.kind in (OPTIONAL_TENSOR, OPTIONAL_SEQUENCE):
        if value is None:
            return None
        element = TensorInfo(info.dtype, None, kind=SEQUENCE if info.kind == OPTIONAL_SEQUENCE else TENSOR)
        if element.kind == TENSOR:
            return check_feeds({name: element}, {name: value})[name]
        return _check_other(name, element, value)
    if not isinstance(value, (list, tuple)):
        raise InputError(f"input {name!r} must be a sequence (a list of arrays), not {type(value).__name__}")
    items = [v if isinstance(v, np.ndarray) else np.asarray(v) for v in value]
    for item in items:
        if info.dtype is not None and item.dtype != info.dtype:
            raise InputError(f"input {name!r} holds an array of dtype {item.dtype}, expected {info.dtype}")
    return items


def _check_shape(name: str, info: TensorInfo, array: np.ndarray, bound: dict) -> None:
    def mismatch() -> InputError:
        expected = "[" + ",".join("?" if d is None else str(d) for d in info.shape) + "]"
        got = "[" + ",".join(map(str, array.shape)) + "]"
        return InputError(f"input {name!r} has shape {got}, expected {expected}")

    if array.ndim != len(info.shape):
        raise mismatch()
    for axis, (dim, size) in enumerate(zip(info.shape, array.shape)):
        if type(dim) is int:
            if dim != size:
                raise mismatch()
        elif isinstance(dim, str):
            previous = bound.setdefault(dim, (size, name, axis))
            if previous[0] != size:
                raise InputError(
                    f"input {name!r} axis {axis} has size {size}, but input {previous[1]!r} axis "
                    f"{previous[2]} has {previous[0]}: the model names both dimension {dim!r}, one size"
                )
