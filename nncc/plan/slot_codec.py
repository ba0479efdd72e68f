"""The one encoding of a value's type in a plan: a slot-table entry.

    entry := [name, dtype|null, shape|null(, kind)]

dtype is numpy's str ("<f4"), or a low-precision type's name ("bfloat16",
"float8_e4m3fn", "int4"...), from a closed list; strings are "|O". shape is a list of
dims, each an int, a symbolic name or null. kind appears only when the value is not a
tensor ("sequence", "optional_tensor", "optional_sequence"; dtype is then the element's).
The program's slot table and a subgraph's inputs and outputs use it alike, written by
``encode_slot`` and read (checked) by ``decode_slot``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nncc.errors import PlanFormatError
from nncc.ir import low_precision
from nncc.ir.graph import KINDS, TENSOR
from nncc.plan.plan import Slot
from nncc.util.limits import MAX_RANK, check_shape

ALLOWED_DTYPES = {
    np.dtype(t).str: np.dtype(t)
    for t in (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
              np.uint8, np.uint16, np.uint32, np.uint64, np.bool_, np.complex64, np.complex128,
              object)  # object: ONNX strings, as Python str
}
STRING = np.dtype(object)
# The low-precision types (bfloat16, float8, float4, int4, int2) are written by name: their
# numpy str ("<V1", "<V2") says nothing. Only these names are accepted, and ml_dtypes is
# imported only when a plan names one.
LOW_PRECISION_DTYPES = frozenset(low_precision.CODES)


def dtype_key(dtype: np.dtype) -> str:
    """How ``dtype`` is written."""
    return dtype.name if low_precision.is_low_precision(dtype) else dtype.str


def dtype_from_key(key: str) -> np.dtype | None:
    """The dtype a key names, or None when it is not one a plan may hold."""
    if key in LOW_PRECISION_DTYPES:
        return low_precision.dtype_named(key)
    return ALLOWED_DTYPES.get(key)


def encode_slot(name: str, dtype: np.dtype | None, shape, kind: str = TENSOR) -> list:
    entry = [name, None if dtype is None else dtype_key(dtype), None if shape is None else list(shape)]
    if kind != TENSOR:
        entry.append(kind)
    return entry


def decode_slot(entry: Any) -> Slot:
    """A checked entry as a Slot; PlanFormatError when anything in it is off."""
    if not (type(entry) is list and len(entry) in (3, 4) and type(entry[0]) is str):
        raise PlanFormatError("bad slot entry")
    name, dtype, shape = entry[:3]
    kind = entry[3] if len(entry) == 4 else TENSOR
    if kind not in KINDS or kind == TENSOR and len(entry) == 4:
        raise PlanFormatError(f"slot {name!r} has a bad kind {kind!r}")
    if kind != TENSOR and shape is not None:
        raise PlanFormatError(f"slot {name!r} is a {kind} and cannot have a shape")
    if dtype is not None:
        dtype = dtype_from_key(dtype) if type(dtype) is str else None
        if dtype is None:
            raise PlanFormatError(f"slot {name!r} has unsupported dtype {entry[1]!r}")
    if shape is not None:
        if type(shape) is not list or len(shape) > MAX_RANK:
            raise PlanFormatError(f"slot {name!r} has a bad shape")
        for d in shape:
            if not (0 <= d < 2**40 if type(d) is int else d is None or type(d) is str):
                raise PlanFormatError(f"slot {name!r} has a bad dimension {d!r}")
        shape = tuple(shape)
        if dtype is not None:  # the static part alone must fit in memory
            check_shape([d for d in shape if type(d) is int], dtype.itemsize, f"slot {name!r}",
                        PlanFormatError)
    return Slot(name, dtype, shape, kind)
