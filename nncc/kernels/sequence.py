"""Sequence kernels: a sequence is a Python list of arrays, never changed in place (every
op builds a new list), holding copies of the tensors put into it."""

from __future__ import annotations

import numpy as np

from nncc.errors import KernelError
from nncc.ir.dtypes import to_numpy
from nncc.ir.graph import SEQUENCE, TENSOR, TensorInfo
from nncc.kernels.registry import kernel
from nncc.kernels.shapes import normalize_axis
from nncc.kernels.subgraphs import body_infos, required, run_body, split_args, subgraph


def _sequence_of(dtype) -> list[TensorInfo]:
    return [TensorInfo(None if dtype is None else np.dtype(dtype), None, kind=SEQUENCE)]


def _element_dtype(info: TensorInfo | None):
    return None if info is None else info.dtype


def _position(value, length: int, default: int, upper: int) -> int:
    """A position input (int32/int64 scalar, negative counts from the back) in [0, upper)."""
    if value is None:
        return default
    index = int(np.asarray(value).reshape(-1)[0])
    if index < 0:
        index += length
    if not 0 <= index < upper:
        raise KernelError(f"sequence position {int(np.asarray(value).reshape(-1)[0])} is out of "
                          f"range for a sequence of length {length}")
    return index


def _sequence(value) -> list:
    if not isinstance(value, list):
        raise KernelError(f"expected a sequence, got {type(value).__name__}")
    return value


@kernel("SequenceEmpty", since=11, shape=lambda ctx: _sequence_of(to_numpy(int(ctx.get("dtype", 1)))))
def sequence_empty(ctx):
    return []


@kernel("SequenceConstruct", since=11,
        shape=lambda ctx, *infos: _sequence_of(_element_dtype(infos[0]) if infos else None))
def sequence_construct(ctx, *tensors):
    return [np.array(t) for t in tensors]


@kernel("SequenceInsert", since=11, shape=lambda ctx, seq, *rest: _sequence_of(_element_dtype(seq)))
def sequence_insert(ctx, seq, tensor, position=None):
    seq = _sequence(seq)
    index = _position(position, len(seq), len(seq), len(seq) + 1)
    return seq[:index] + [np.array(tensor)] + seq[index:]


@kernel("SequenceAt", since=11,
        shape=lambda ctx, seq, position: [TensorInfo(_element_dtype(seq), None)])
def sequence_at(ctx, seq, position):
    seq = _sequence(seq)
    return seq[_position(position, len(seq), 0, len(seq))]


@kernel("SequenceErase", since=11, shape=lambda ctx, seq, *rest: _sequence_of(_element_dtype(seq)))
def sequence_erase(ctx, seq, position=None):
    seq = _sequence(seq)
    index = _position(position, len(seq), len(seq) - 1, len(seq))
    if not seq:
        raise KernelError("SequenceErase: the sequence is empty")
    return seq[:index] + seq[index + 1:]


@kernel("SequenceLength", since=11,
        shape=lambda ctx, seq: [TensorInfo(np.dtype(np.int64), ())])
def sequence_length(ctx, seq):
    return np.array(len(_sequence(seq)), dtype=np.int64)


def _split_shape(ctx, data, split=None):
    return _sequence_of(_element_dtype(data))


def _split_to_sequence(ctx, data, split=None):
    axis = normalize_axis(int(ctx.get("axis", 0)), data.ndim)
    length = data.shape[axis]
    if split is None:
        pieces = np.split(data, length, axis=axis) if length else []
        if not int(ctx.get("keepdims", 1)):
            pieces = [np.squeeze(p, axis=axis) for p in pieces]
        return [np.array(p) for p in pieces]
    split = np.asarray(split)
    if split.ndim == 0:
        size = int(split)
        if size <= 0:
            raise KernelError(f"SplitToSequence: split size {size} must be positive")
        sizes = [size] * (length // size) + ([length % size] if length % size else [])
    else:
        sizes = [int(s) for s in split.reshape(-1)]
        if any(s < 0 for s in sizes) or sum(sizes) != length:
            raise KernelError(f"SplitToSequence: split {sizes} does not add up to {length}")
    bounds = np.cumsum(sizes)[:-1]
    return [np.array(p) for p in np.split(data, bounds, axis=axis)]


for _since in (11, 24):
    kernel("SplitToSequence", since=_since, shape=_split_shape)(_split_to_sequence)


@kernel("ConcatFromSequence", since=11,
        shape=lambda ctx, seq: [TensorInfo(_element_dtype(seq), None)])
def concat_from_sequence(ctx, seq):
    seq = _sequence(seq)
    if not seq:
        raise KernelError("ConcatFromSequence: the sequence is empty")
    axis = int(required(ctx, "axis"))
    try:
        if int(ctx.get("new_axis", 0)):
            return np.stack(seq, axis=normalize_axis(axis, seq[0].ndim + 1))
        return np.concatenate(seq, axis=normalize_axis(axis, seq[0].ndim))
    except ValueError as exc:
        raise KernelError(f"ConcatFromSequence: {exc}") from None


def _sequence_map_shape(ctx, *infos):
    (seq, *extra), outer = split_args(ctx, infos)

    def element(info):
        if info is None:
            return None
        return TensorInfo(info.dtype, None) if info.kind == SEQUENCE else info

    outs = body_infos(ctx, "body", [element(seq)] + [element(i) for i in extra], outer)
    return [TensorInfo(o.dtype if o.kind == TENSOR else None, None, kind=SEQUENCE) for o in outs]


@kernel("SequenceMap", since=17, shape=_sequence_map_shape, deterministic=False)
def sequence_map(ctx, *args):
    (seq, *extra), outer = split_args(ctx, args)
    seq = _sequence(seq)
    for other in extra:
        if isinstance(other, list) and len(other) != len(seq):
            raise KernelError(f"SequenceMap: sequences of lengths {len(seq)} and {len(other)}")
    results: list[list] = [[] for _ in subgraph(ctx, "body").outputs]
    for i, item in enumerate(seq):
        feeds = [item] + [other[i] if isinstance(other, list) else other for other in extra]
        for values, value in zip(results, run_body(ctx, "body", feeds, outer)):
            values.append(np.array(value))
    return tuple(results)
