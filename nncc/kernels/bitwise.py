"""Bitwise kernels on integer tensors: BitShift, BitwiseAnd/Or/Xor/Not.

BitShift follows the opset-28 rules, which extend opset 11's unsigned-only operator to
signed types without changing any unsigned result: a right shift of a signed value is
arithmetic; a shift by a negative amount or by at least the bit width gives what the sign
extension alone leaves (-1 for a right shift of a negative value, else 0). numpy's own
shifts are only defined for amounts in [0, width), so out-of-range amounts are replaced
before shifting and their results selected afterwards.
"""

from __future__ import annotations

import numpy as np

from nncc.errors import KernelError
from nncc.kernels.arithmetic import binary_shape, check_same_dtype, register
from nncc.kernels.shapes import same_as


def _check_int(op: str, *arrays: np.ndarray) -> None:
    for a in arrays:
        if a.dtype.kind not in "iu":
            raise KernelError(f"{op} expects integer inputs, got {a.dtype}")
    if len(arrays) == 2:
        check_same_dtype(op, *arrays)


def _broadcast_error(op: str, a: np.ndarray, b: np.ndarray) -> KernelError:
    return KernelError(f"{op}: cannot broadcast shapes {a.shape} and {b.shape}")


@register("BitShift", 11, binary_shape())
def bitshift(ctx, x, y):
    direction = ctx.get("direction")
    if isinstance(direction, bytes):
        direction = direction.decode()
    if direction not in ("LEFT", "RIGHT"):
        raise KernelError(f"BitShift: direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    _check_int("BitShift", x, y)
    try:
        np.broadcast_shapes(x.shape, y.shape)
    except ValueError:
        raise _broadcast_error("BitShift", x, y) from None
    bits = x.dtype.itemsize * 8
    valid = y < bits
    if y.dtype.kind == "i":
        valid &= y >= 0
    shift = y if valid.all() else np.where(valid, y, y.dtype.type(0))
    if direction == "LEFT":
        z = np.left_shift(x, shift)
        fill = x.dtype.type(0)
    else:
        z = np.right_shift(x, shift)
        # the sign extension alone: all ones (-1) for a negative signed value, else 0
        fill = np.right_shift(x, x.dtype.type(bits - 1)) if x.dtype.kind == "i" else x.dtype.type(0)
    if shift is not y:
        z = np.where(valid, z, fill)
    return z.astype(x.dtype, copy=False)


def _make_binary(op: str, fn) -> None:
    def binary(ctx, a, b):
        _check_int(op, a, b)
        try:
            return fn(a, b)
        except ValueError:
            raise _broadcast_error(op, a, b) from None

    binary.__name__ = op.lower()
    register(op, 18, binary_shape())(binary)


_make_binary("BitwiseAnd", np.bitwise_and)
_make_binary("BitwiseOr", np.bitwise_or)
_make_binary("BitwiseXor", np.bitwise_xor)


@register("BitwiseNot", 18, same_as(0))
def bitwise_not(ctx, x):
    _check_int("BitwiseNot", x)
    return np.invert(x)
