"""Elementwise steps over typed buffers: masks (bool values, one byte each, 0 or 1) and the
values they select between.

The comparisons (Equal, Less, Greater, LessOrEqual, GreaterOrEqual) read float32, int32
or int64 (an attention mask fed as int64) and write a mask; IsNaN and IsInf read float32;
Not, And, Or and Xor read and write masks; Where(cond, x, y) reads a mask and two float32
tensors. Every operand broadcasts to the output, read at
literal strides (0 along a broadcast axis). The C follows IEEE 754 as ONNX does: the build
has no -ffast-math, so a comparison with NaN is false (Equal(NaN, NaN) too), and Where
copies -inf and NaN through unchanged.

A mask never leaves its partition (nncc/native/arguments.py), so its buffer is a slice
of the workspace: the kernel's parameter says ``uint8_t``. A bool constant the node reads
is packed as float32 0/1 (every packed constant is float32) and read as ``!= 0``; an
integer constant is packed as float32 when float32 holds it exactly, and read back as int64.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np

from nncc.native.c_emit import CWriter
from nncc.native.graph_query import batch_strides, const_value

MASK_READ, MASK_WRITE = "const uint8_t *", "uint8_t *"
BOOL = np.dtype(np.bool_)

COMPARE = {"Equal": "a == b", "Less": "a < b", "Greater": "a > b", "LessOrEqual": "a <= b",
           "GreaterOrEqual": "a >= b"}
LOGIC = {"And": "a & b", "Or": "a | b", "Xor": "a ^ b"}  # of 0/1 values
OPS = {*COMPARE, *LOGIC, "Not", "IsNaN", "IsInf", "Where"}


def expression(node) -> str:
    """The C expression of the node's output element over its operands a, b (and c)."""
    op = node.op_type
    if op in COMPARE:
        return COMPARE[op]
    if op in LOGIC:
        return LOGIC[op]
    if op == "Not":
        return "!a"
    if op == "IsNaN":
        return "a != a"
    if op == "IsInf":
        positive, negative = node.attrs.get("detect_positive", 1), node.attrs.get("detect_negative", 1)
        tests = ([f"a == {_INF}"] if positive else []) + ([f"a == -{_INF}"] if negative else [])
        return " || ".join(tests) or "0"
    if op == "Where":
        return "a ? b : c"
    raise ValueError(f"no mask expression for {op}")


_INF = "(float)INFINITY"


INTEGERS = {np.dtype(np.int32): "int32_t", np.dtype(np.int64): "int64_t"}
EXACT_IN_FLOAT = 2**24  # an integer constant packed as float32 must come back exactly


@dataclass(frozen=True)
class Operand:
    name: str  # the buffer (a packed constant's name for a bool or integer constant)
    load: str  # how an element is read: "float", "mask", "packed mask", "int32_t", "int64_t", "packed int"

    @property
    def ctype(self) -> str:
        if self.load == "mask":
            return MASK_READ
        return f"const {self.load} *" if self.load in INTEGERS.values() else "const float *"


def operands(writer, node) -> list[Operand]:
    """How the step reads each input: float32, a mask buffer, or a bool constant packed
    as float32 0/1."""
    out = []
    for name in node.inputs:
        info = writer.infos[name]
        if info.dtype not in (BOOL, *INTEGERS):
            out.append(Operand(name, "float"))
            continue
        value = const_value(writer.graph, writer.infos, name)
        if value is None:
            out.append(Operand(name, "mask" if info.dtype == BOOL else INTEGERS[info.dtype]))
        else:  # exact: a bool, or an integer within EXACT_IN_FLOAT (the entry checks it)
            packed = writer.pack(name, "mask" if info.dtype == BOOL else "int", np.asarray(value, np.float32))
            out.append(Operand(packed, "packed mask" if info.dtype == BOOL else "packed int"))
    return out


def emit(writer, node) -> None:
    """One step: ``y[i] = expression(a, b, c)`` over the output's index space."""
    y = node.outputs[0]
    out_shape = list(writer.shape(y))
    mask_out = writer.infos[y].dtype == BOOL
    reads = operands(writer, node)
    strides = [batch_strides(writer.infos[node.inputs[i]].shape, out_shape, 1) for i in range(len(reads))]
    dims, strides = collapse(out_shape, strides)
    c = CWriter()
    if math.prod(out_shape) == 0:
        c.comment("an empty output")
    else:
        loops = ExitStack()
        for d, size in enumerate(dims):
            loops.enter_context(c.loop(f"i{d}", size))
        names = "abc"
        for k, operand in enumerate(reads):
            index = " + ".join(f"i{d} * {s}" for d, s in enumerate(strides[k]) if s) or "0"
            element = f"{writer.ptr(operand.name)}[{index}]"
            if operand.load == "float":
                c.line(f"float {names[k]} = {element};")
            elif operand.load == "mask":
                c.line(f"int {names[k]} = {element};")
            elif operand.load == "packed mask":
                c.line(f"int {names[k]} = {element} != 0.0f;")
            else:  # integers compare as int64: exactly
                c.line(f"int64_t {names[k]} = (int64_t){element};")
        flat = " + ".join(f"i{d} * {math.prod(dims[d + 1:])}" for d in range(len(dims)))
        cast = "(uint8_t)" if mask_out else ""
        c.line(f"{writer.ptr(y)}[{flat}] = {cast}({expression(node)});")
        loops.close()
    writer.step(c.text(), [(o.name, o.ctype) for o in reads], [(y, MASK_WRITE if mask_out else "float *")])


def collapse(dims: list[int], strides: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 axes and merge adjacent axes every operand walks the same way (all
    contiguous, or all broadcast along both)."""
    keep = [d for d in range(len(dims)) if dims[d] != 1]
    dims = [dims[d] for d in keep]
    strides = [[s[d] for d in keep] for s in strides]
    if not dims:
        return [1], [[0] for _ in strides]
    out_dims, out_strides = [dims[0]], [[s[0]] for s in strides]
    for d in range(1, len(dims)):
        if all((s[d] == 0 and o[-1] == 0) or (s[d] != 0 and o[-1] == s[d] * dims[d])
               for s, o in zip(strides, out_strides)):
            out_dims[-1] *= dims[d]
            for s, o in zip(strides, out_strides):
                o[-1] = s[d]
        else:
            out_dims.append(dims[d])
            for s, o in zip(strides, out_strides):
                o.append(s[d])
    return out_dims, out_strides
