"""Cast between float32, int32, int64, uint8 and bool inside a partition: one loop over the
elements, each buffer typed as its values are (a bool is one byte, 0 or 1, as masks are:
nncc/native/mask_gen.py).

ONNX leaves a float's conversion to an integer it does not fit (NaN, an infinity, out of
range) undefined, and in C it is undefined behaviour. The code never performs one: a float
is converted only inside the target's range, rounding toward zero as ONNX asks, and any
other float gives the integer x86's conversion instructions give, which is what
onnxruntime and numpy produce on this CPU: the most negative int32 or int64. uint8 takes
the low byte of the int32 conversion (300.5 -> 44, -1.5 -> 255, NaN -> 0), bool is "not
zero" (NaN -> true). Integers convert to float32 rounding to nearest, and to a narrower
integer by their low bytes."""

from __future__ import annotations

import math

import numpy as np

CTYPES = {np.dtype(np.float32): "float", np.dtype(np.int32): "int32_t", np.dtype(np.int64): "int64_t",
          np.dtype(np.uint8): "uint8_t", np.dtype(np.bool_): "uint8_t"}
FLOAT = np.dtype(np.float32)
BOOL = np.dtype(np.bool_)

# a float inside [low, high) converts exactly; each bound is a power of two, exact in float32
_RANGE = {np.dtype(np.int32): ("-2147483648.0f", "2147483648.0f", "INT32_MIN"),
          np.dtype(np.int64): ("-9223372036854775808.0f", "9223372036854775808.0f", "INT64_MIN")}


def conversion(src: np.dtype, dst: np.dtype) -> str:
    """The C expression of ``v`` (of type ``src``) converted to ``dst``."""
    if dst == BOOL:
        return "(uint8_t)(v != 0)"
    if src == FLOAT and dst in _RANGE:
        low, high, indefinite = _RANGE[dst]
        return f"(v >= {low} && v < {high} ? ({CTYPES[dst]})v : {indefinite})"
    if src == FLOAT and dst == np.dtype(np.uint8):
        low, high, indefinite = _RANGE[np.dtype(np.int32)]
        return f"(uint8_t)(uint32_t)(v >= {low} && v < {high} ? (int32_t)v : {indefinite})"
    if src != FLOAT and dst != FLOAT and np.dtype(dst).itemsize < np.dtype(src).itemsize:
        unsigned = {1: "uint8_t", 4: "uint32_t"}[np.dtype(dst).itemsize]
        return f"({CTYPES[dst]})({unsigned})(uint64_t)v"  # the low bytes, defined for every value
    return f"({CTYPES[dst]})v"


def emit(writer, node) -> None:
    x, y = node.inputs[0], node.outputs[0]
    src, dst = writer.infos[x].dtype, writer.infos[y].dtype
    size = math.prod(writer.shape(y))
    writer.step(f"for (int64_t i = 0; i < {size}; i++) {{ {CTYPES[src]} v = {writer.ptr(x)}[i]; "
                f"{writer.ptr(y)}[i] = {conversion(src, dst)}; }}",
                [(x, f"const {CTYPES[src]} *")], [(y, f"{CTYPES[dst]} *")])
