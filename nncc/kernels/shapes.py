"""Helpers shared by shape functions: broadcasting, axes, reading compile-time values."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from nncc.errors import ShapeInferenceError
from nncc.ir.graph import Dim, TensorInfo


def broadcast(*shapes: tuple[Dim, ...] | None) -> tuple[Dim, ...] | None:
    """Multidirectional (numpy-style) broadcast of possibly symbolic shapes."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for axis in range(rank):
        dims = [s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0]
        known = {d for d in dims if isinstance(d, int) and d != 1}
        if len(known) > 1:
            raise ShapeInferenceError(f"cannot broadcast shapes {', '.join(map(str, shapes))}")
        if known:
            out.append(known.pop())
        elif all(d == 1 for d in dims):
            out.append(1)
        else:
            symbolic = [d for d in dims if d != 1]
            out.append(symbolic[0] if len(set(symbolic)) == 1 else None)
    return tuple(out)


def same_as(index: int = 0):
    """Shape function: one output with the dtype and shape of input ``index``."""

    def shape(ctx, *infos):
        info = infos[index]
        return [TensorInfo(info.dtype, info.shape)]

    return shape


def broadcast_to_output(dtype: np.dtype | None = None):
    """Shape function: broadcast all given inputs; dtype of input 0 unless ``dtype``."""

    def shape(ctx, *infos):
        present = [i for i in infos if i is not None]
        out_dtype = np.dtype(dtype) if dtype is not None else present[0].dtype
        return [TensorInfo(out_dtype, broadcast(*(i.shape for i in present)))]

    return shape


def normalize_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeInferenceError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def normalize_axes(axes: Sequence[int], rank: int) -> list[int]:
    return [normalize_axis(int(a), rank) for a in axes]


def known_value(info: TensorInfo | None) -> np.ndarray | None:
    """The compile-time contents of an input, or None when unknown or omitted."""
    return None if info is None else info.value


def numel(shape: tuple[Dim, ...] | None) -> int | None:
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return int(np.prod(shape, dtype=np.int64))


def check_size(op: str, what: str, info: TensorInfo | None, *sizes: Dim) -> None:
    """ShapeInferenceError unless the operand ``info`` (None: omitted) holds one of ``sizes``
    values when its size is known; a size not known here (None or a name) accepts any. An
    artifact's operands are sized by their declared shapes, so a kernel's own check on a
    scale, zero point or bias comes too late for a plan that declares one of gigabytes."""
    n = None if info is None else numel(info.shape)
    if n is None or n in sizes or not all(isinstance(s, int) for s in sizes):
        return
    wanted = " or ".join(str(s) for s in dict.fromkeys(sizes))
    raise ShapeInferenceError(f"{op}: {what} of shape {tuple(info.shape)} should hold {wanted} value"
                              f"{'' if wanted == '1' else 's'}")


def check_broadcasts_to(op: str, what: str, info: TensorInfo | None, target) -> None:
    """ShapeInferenceError unless ``info``'s shape broadcasts to ``target`` without growing it
    (as the operand of an in-place add must); unknown dimensions agree with anything."""
    if info is None or info.shape is None or target is None:
        return
    fits = len(info.shape) <= len(target) and all(
        not isinstance(d, int) or not isinstance(t, int) or d in (1, t)
        for d, t in zip(reversed(info.shape), reversed(target)))
    if not fits:
        raise ShapeInferenceError(f"{op}: {what} of shape {tuple(info.shape)} does not broadcast to "
                                  f"{tuple(target)}")
