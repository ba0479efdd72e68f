"""The native ops in precedence order: the first entry whose ``takes`` matches a node owns
it, for the check and for the writing alike. Adding an op is one module with its entry,
listed here. ``FUSIONS`` are tried, in order, before a node's own entry writes it."""

from __future__ import annotations

import math

from nncc.ir.graph import Graph, Node, TensorInfo
from nncc.native.ops import (affine, attention, cast, conditional, conv, conv_transpose, data_movement, elementwise,
                             gather_indices, gelu, int8_conv, int8_matmul, layernorm, masks, matmul, pool, qimage,
                             recurrent, residual, rounding, self_gated, softmax, sum_concat, transpose)
from nncc.native.ops.entry import Fusion, NativeOp

ENTRIES: list[NativeOp] = [
    # entries that check their own values (quantized, integer or optional inputs)
    gather_indices.ENTRY,  # before data_movement: it takes a Gather whose indices are not constants
    gather_indices.CONCAT,  # before sum_concat: it takes a Concat of integers
    gather_indices.SLICE,  # before data_movement: it takes a Slice of integers
    data_movement.ENTRY,  # before softmax: it takes Softmax over an inner axis
    int8_matmul.ENTRY,
    int8_conv.ENTRY,
    qimage.ENTRY,
    recurrent.ENTRY,
    cast.ENTRY,  # names the types it refuses
    masks.ENTRY,  # bool values: checks each input's type
    # an If on a run-time condition: its branch nodes are checked as any node is, below
    conditional.If(lambda node, graph, infos: node_refused(node, graph, infos)),
    # entries over static float32 values
    conv.ENTRY,
    conv_transpose.ENTRY,
    affine.ENTRY,
    matmul.GEMM,
    matmul.MATMUL,
    attention.ENTRY,
    gelu.ENTRY,
    self_gated.ENTRY,
    elementwise.ENTRY,
    rounding.ENTRY,
    sum_concat.SUM,
    sum_concat.CONCAT,
    softmax.ENTRY,
    layernorm.ENTRY,
    pool.ENTRY,
    transpose.ENTRY,
]
FUSIONS: list[Fusion] = [layernorm.ADD_LAYERNORM, residual.ENTRY]


def owner(node: Node, graph: Graph, infos: dict[str, TensorInfo]) -> NativeOp | None:
    """The entry that checks and writes ``node``, or None: no C generator for it."""
    return next((entry for entry in ENTRIES if entry.takes(node, graph, infos)), None)


# Generated loops are unrolled per tile of a row, and element moves keep a table per axis:
# an output beyond these (only a damaged or hostile model has one) stays portable, whose
# kernels refuse it with a clear error.
MAX_ELEMENTS = 1 << 31
MAX_EXTENT = 1 << 24


def node_refused(node: Node, graph: Graph, infos: dict[str, TensorInfo]) -> str | None:
    """Why no entry writes ``node`` (None: one does): the size limits every node gets, a
    node inside an If's branch too, then the checks of the entry that owns it."""
    if _too_large(node, infos):
        return "an output too large for generated code"  # the portable plan reports it
    entry = owner(node, graph, infos)
    if entry is None:
        return f"no C generator for {node.domain + '::' if node.domain else ''}{node.op_type}"
    return entry.check(node, graph, infos)


def _too_large(node: Node, infos: dict[str, TensorInfo]) -> bool:
    """An output beyond MAX_ELEMENTS, or an axis beyond MAX_EXTENT (generated code unrolls
    tiles and tables along an axis): only a damaged or hostile model has one."""
    for name in [o for o in node.outputs if o]:
        info = infos.get(name)
        if info is not None and info.is_static and info.shape and (
                math.prod(info.shape) > MAX_ELEMENTS or max(info.shape) > MAX_EXTENT):
            return True
    return False


def native_ops() -> list[str]:
    """Every op some entry may take ("Conv", "nncc::FusedConv", ...): whether it does
    depends on the node's shapes, values and attributes."""
    names = {op if not domain else f"{domain}::{op}" for entry in ENTRIES for domain, op in entry.ops}
    return sorted(names, key=lambda name: ("::" in name, name))
