"""A plugin whose kernels have bugs: ``test.buggy::Broken`` raises a TypeError and
``test.buggy::OutOfRange`` an IndexError, each from a helper inside the kernel;
``test.buggy::WrongShape`` ignores its planned output buffer and returns a [1, 1] result
where its shape function promised its input's shape.

A TypeError or IndexError raised inside a kernel is a bug in that kernel, not bad input:
the executor must let it propagate with its traceback, not turn it into a one-line
KernelError. Load with ``load_plugin("tests.plugins.buggy_plugin")``.
"""

from __future__ import annotations

import numpy as np

from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import Ctx, kernel

__version__ = "1.0"

DOMAIN = "test.buggy"


def _same_as_input(ctx: Ctx, x: TensorInfo) -> list[TensorInfo]:
    return [TensorInfo(x.dtype, x.shape)]


@kernel("Broken", since=1, domain=DOMAIN, shape=_same_as_input)
def broken(ctx: Ctx, x: np.ndarray) -> np.ndarray:
    return add_nothing(x)


def add_nothing(x: np.ndarray) -> np.ndarray:
    return x + None  # the bug: TypeError (unsupported operand types)


@kernel("OutOfRange", since=1, domain=DOMAIN, shape=_same_as_input)
def out_of_range(ctx: Ctx, x: np.ndarray) -> np.ndarray:
    return x * one_past_the_end(x)


def one_past_the_end(x: np.ndarray) -> np.ndarray:
    return x.reshape(-1)[[x.size]]  # the bug: IndexError (index out of bounds)


@kernel("WrongShape", since=1, domain=DOMAIN, shape=_same_as_input, writes_out=True)
def wrong_shape(ctx: Ctx, x: np.ndarray, out=None) -> np.ndarray:
    return x.sum(keepdims=True)  # the bug: a [1, 1] result, which would broadcast into any buffer
