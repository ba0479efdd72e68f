"""Which values may cross the edge of a native partition. Every argument of a native call
is a static float32 tensor (the call table is checked for it when a plan is loaded), so a
value of another type, a bool mask or an integer from a Cast, lives only inside one
partition, in its workspace. The partitioner asks ``crossing_refused`` about every input
and output of a native partition and moves the nodes on such an edge to the portable
backend (nncc/partition.py).

A partition input of another type is still fine when no node reads it as data: a
constant (the entries pack what they read of it as float32) or a value only the
compile-time parts of a node look at (a Reshape's shape, Clip's bounds). And int32 and
int64 inputs come in as they are (``index_argument``: a Gather's run-time indices, token
ids); a native call writes float32 values only."""

from __future__ import annotations

import numpy as np

from nncc.ir.graph import Graph, Node, TensorInfo
from nncc.native.graph_query import const_value
from nncc.native.ops import registry
from nncc.native.ops.entry import static_f32

INDEX_TYPES = (np.dtype(np.int32), np.dtype(np.int64))


def crossing_refused(name: str, readers: list[Node], graph: Graph, infos: dict[str, TensorInfo]) -> str | None:
    """Why ``name`` cannot be an argument of a native partition: ``readers``, the nodes of
    the partition that read it (an input), or none (an output, which the code writes)."""
    info = infos.get(name)
    if static_f32(info) or (readers and index_argument(graph, infos, name)):
        return None
    if readers and (const_value(graph, infos, name) is not None or not any(
            name in _data_inputs(node, graph, infos) for node in readers)):
        return None
    kind = "unknown" if info is None or info.dtype is None else str(info.dtype)
    return f"its {kind} value {name!r} would cross a native partition's edge (native arguments are float32)"


def index_argument(graph: Graph, infos: dict[str, TensorInfo], name: str) -> bool:
    """An int32 or int64 value known only at run time with a static shape: passed to native
    code as it is (a constant of that type is read at compile time instead)."""
    info = infos.get(name)
    return (info is not None and info.dtype in INDEX_TYPES and info.is_static
            and const_value(graph, infos, name) is None)


def _data_inputs(node: Node, graph: Graph, infos: dict[str, TensorInfo]) -> list[str]:
    entry = registry.owner(node, graph, infos)
    return list(node.inputs) if entry is None else entry.data_inputs(node)
