"""The symbolic shape engine: the contents of shape-like values, as far as compile-time
shape inference can know them.

Exported models compute shapes at run time with chains such as Shape -> Gather ->
Unsqueeze -> Concat -> Reshape, and shape inference must predict those values. Two
TensorInfo fields carry them:

* ``value``: the exact contents, set when every input's contents are known and the
  output is small (<= ``FOLD_LIMIT`` elements). It is computed by running the kernel
  itself on the known inputs (``fold``), so shape function and kernel cannot disagree.
* ``symbolic``: partly symbolic contents, an object ndarray whose entries are int, str
  (a symbolic dim) or None (an unknown dim). Shape sets it when its input's shape is only
  partly static; the ops that merely move entries around (Gather, Slice, Concat, Squeeze,
  Unsqueeze, Reshape, Flatten, Identity, integer Cast) carry it by running their kernels
  on it. When such a chain selects only static entries the result becomes a real
  ``value`` again; Reshape, Expand, Tile and ConstantOfShape read symbolic entries as
  output dims (``shape_operand``). A TensorInfo made anew without it merely loses
  precision, never correctness.
"""

from __future__ import annotations

import math

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import Dim, TensorInfo
from nncc.kernels.shapes import known_value

FOLD_LIMIT = 1024  # outputs up to this many elements get their value computed at compile time


def static_numel(shape) -> int | None:
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return math.prod(shape)


def freeze(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def symbolic_contents(info: TensorInfo | None) -> np.ndarray | None:
    return None if info is None else info.symbolic


def set_contents(info: TensorInfo, contents: np.ndarray) -> TensorInfo:
    """Attach computed contents: a real value if every entry is an int, else symbolic."""
    contents = np.asarray(contents)
    if contents.dtype == object:
        if all(isinstance(v, (int, np.integer)) for v in contents.flat):
            dtype = info.dtype if info.dtype is not None else np.dtype(np.int64)
            info.value = freeze(np.array(contents.tolist(), dtype=dtype).reshape(contents.shape))
        else:
            info.symbolic = contents
    else:
        dtype = info.dtype if info.dtype is not None else contents.dtype
        info.value = freeze(np.array(contents, dtype=dtype, copy=True))
    info.shape = tuple(contents.shape)
    return info


def symbolic_array(dims) -> np.ndarray:
    out = np.empty(len(dims), dtype=object)
    out[:] = list(dims)
    return out


def fold(ctx, fn, infos, outs: list[TensorInfo], symbolic: bool = False) -> list[TensorInfo]:
    """Compute the outputs' contents with the kernel ``fn`` when every input is known.

    ``symbolic`` allows partly symbolic inputs (object arrays), for kernels that only move
    entries around. Only small outputs of known static shape are computed.
    """
    for out in outs:
        size = static_numel(out.shape)
        if size is None or size > FOLD_LIMIT:
            return outs
    args, partial = [], False
    for info in infos:
        if info is None:
            args.append(None)
        elif info.value is not None:
            args.append(info.value)
        elif symbolic and symbolic_contents(info) is not None:
            args.append(symbolic_contents(info))
            partial = True
        else:
            return outs
    if partial:
        try:
            results = fn(ctx, *args)
        except Exception:  # symbolic evaluation is best effort only
            return outs
    else:
        try:
            results = fn(ctx, *args)
        except KernelError as error:
            raise ShapeInferenceError(str(error)) from None
    results = results if isinstance(results, tuple) else (results,)
    for out, result in zip(outs, results):
        if result is not None:
            # indexing an object array may hand back a bare entry: keep it an object array
            set_contents(out, np.asarray(result, dtype=object) if partial else result)
    return outs


def shape_operand(info: TensorInfo | None) -> list[Dim] | None:
    """Entries of a 1-D shape-like input: ints, str (symbolic dims), None (unknown)."""
    value = known_value(info)
    if value is not None:
        return [int(v) for v in np.asarray(value).reshape(-1)]
    sym = symbolic_contents(info)
    if sym is not None:
        return [v if isinstance(v, str) or v is None else int(v) for v in sym.reshape(-1)]
    return None


def operand_length(info: TensorInfo | None) -> int | None:
    """Static length of a 1-D input whose contents are unknown."""
    if info is None or info.shape is None or len(info.shape) != 1:
        return None
    return info.shape[0] if isinstance(info.shape[0], int) else None


def dim_product(dims) -> Dim:
    """Product of possibly symbolic dims: an int, a lone symbol, or None."""
    if 0 in [d for d in dims if isinstance(d, int)]:
        return 0
    if any(d is None for d in dims):
        return None
    static = math.prod(d for d in dims if isinstance(d, int))
    symbols = [d for d in dims if isinstance(d, str)]
    if not symbols:
        return static
    return symbols[0] if len(symbols) == 1 and static == 1 else None


def merge_dim(dims) -> Dim:
    """The one dim several inputs must share: a static one wins, then a common symbol."""
    static = {d for d in dims if isinstance(d, int)}
    if len(static) > 1:
        raise ShapeInferenceError(f"dimensions {sorted(static)} should be equal")
    if static:
        return static.pop()
    symbols = {d for d in dims if isinstance(d, str)}
    if len(symbols) == 1 and None not in dims:
        return symbols.pop()
    return None
