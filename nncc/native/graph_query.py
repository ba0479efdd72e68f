"""Small facts about a partition's graph that the C generators share (the partition
writer in nncc/native/codegen.py and the kernels it delegates to): which ops are which,
a value's compile-time contents, broadcast strides, and the C sources shipped with nncc.
A leaf: it imports nothing else of nncc's native code."""

from __future__ import annotations

import importlib.resources

import numpy as np

from nncc.ir.graph import Graph, Node

CONV_OPS = {("", "Conv"), ("nncc", "FusedConv")}
AFFINE_OPS = {("nncc", "ScaleShift")}
MATMUL_OPS = {("", "MatMul"), ("nncc", "FusedMatMul")}
GEMM_OPS = {("", "Gemm"), ("nncc", "FusedGemm")}


def const_value(graph: Graph, infos, name: str):
    """The value's contents when known at compile time (an initializer or a folded value)."""
    if name in graph.initializers:
        return graph.initializers[name]
    info = infos.get(name)
    return None if info is None else info.value


def scalar_const(graph: Graph, infos, name: str) -> float | None:
    """The value as a float when it is one number known at compile time."""
    value = const_value(graph, infos, name)
    if value is None or np.size(value) != 1:
        return None
    return float(np.asarray(value).reshape(()))


def is_pair_sum(node: Node) -> bool:
    """Add, or a Sum of two: what a residual connection is exported as."""
    return not node.domain and (node.op_type == "Add" or (node.op_type == "Sum" and len(node.inputs) == 2))


def batch_strides(shape, batch, matrix: int) -> list[int]:
    """Offsets (in elements) per batch index of an operand whose batch dims broadcast."""
    shape = [1] * (len(batch) - len(shape)) + list(shape)
    strides, step = [0] * len(batch), matrix
    for d in range(len(batch) - 1, -1, -1):
        strides[d] = 0 if shape[d] == 1 and batch[d] != 1 else step
        step *= shape[d]
    return strides


def source(name: str) -> str:
    """A C source shipped in nncc/native (the prelude, the runtime, the SIMD layer)."""
    return importlib.resources.files("nncc.native").joinpath(name).read_text()
