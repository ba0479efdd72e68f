"""Optional kernels: an optional value is its element (a tensor or a sequence) or None."""

from __future__ import annotations

import numpy as np

from nncc.errors import KernelError
from nncc.ir.graph import OPTIONAL_SEQUENCE, OPTIONAL_TENSOR, SEQUENCE, TENSOR, TensorInfo
from nncc.kernels.registry import kernel


def _optional_shape(ctx, value=None):
    if value is None:  # the element type is in the `type` attribute, which nncc does not read
        return [TensorInfo(None, None, kind=OPTIONAL_TENSOR)]
    kind = OPTIONAL_SEQUENCE if value.kind in (SEQUENCE, OPTIONAL_SEQUENCE) else OPTIONAL_TENSOR
    return [TensorInfo(value.dtype, None, kind=kind)]


def _optional(ctx, value=None):
    return value


def _has_element_shape(ctx, value=None):
    return [TensorInfo(np.dtype(np.bool_), ())]


def _has_element(ctx, value=None):
    return np.array(value is not None)


def _get_element_shape(ctx, value):
    if value is None:
        return [TensorInfo(None, None)]
    if value.kind in (SEQUENCE, OPTIONAL_SEQUENCE):
        return [TensorInfo(value.dtype, None, kind=SEQUENCE)]
    if value.kind == TENSOR:  # from opset 18 a plain tensor passes through
        return [TensorInfo(value.dtype, value.shape)]
    return [TensorInfo(value.dtype, None)]


def _get_element(ctx, value):
    if value is None:
        raise KernelError("OptionalGetElement: the optional is empty")
    return value


for _since in (15, 28):
    kernel("Optional", since=_since, shape=_optional_shape)(_optional)
for _since in (15, 18, 28):
    kernel("OptionalHasElement", since=_since, shape=_has_element_shape)(_has_element)
    kernel("OptionalGetElement", since=_since, shape=_get_element_shape)(_get_element)
