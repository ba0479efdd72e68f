"""Building blocks of the rewrites that turn attention ops into ``nncc::FusedAttention``
(nncc.passes.attention_op, nncc.passes.attention_contrib): fresh names and constants, and the
fused node itself between the Reshapes that split heads from, and merge them back into, a
3-D ``[batch, sequence, heads x head]`` layout."""

from __future__ import annotations

import numpy as np

from nncc.ir.graph import Graph, Node, TensorInfo
from nncc.passes.cleanup import all_names, fresh_name

F32 = np.dtype(np.float32)
NNCC = "nncc"


def used(graph: Graph, consumers, name: str) -> bool:
    return bool(name) and (name in graph.outputs or bool(consumers.get(name)))


class Builder:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.taken = all_names(graph)
        self.initializers: dict[str, np.ndarray] = {}
        self.made: dict[tuple, str] = {}  # values one rewrite built that another may reuse, by what they are

    def constant(self, base: str, array: np.ndarray) -> str:
        name = fresh_name(base, self.taken)
        array.flags.writeable = False
        self.initializers[name] = array
        return name

    def value(self, base: str) -> str:
        return fresh_name(base, self.taken)


def static(info: TensorInfo | None) -> bool:
    return info is not None and info.shape is not None and all(isinstance(d, int) for d in info.shape)


def fused_node(b: Builder, node: Node, qkv: list[str], bias: str, attrs: dict, rank: int, hq: int, hkv: int):
    """The FusedAttention (for 3-D operands: between Reshapes that split and merge heads)."""
    out = node.outputs[0]
    if rank == 4:
        return [Node("FusedAttention", qkv + ([bias] if bias else []), [out], attrs, NNCC, node.name)]
    nodes, split = [], []
    for name, heads in zip(qkv, (hq, hkv, hkv)):
        shape = b.constant(f"{name}/heads_shape", np.array([0, 0, heads, -1], np.int64))
        split.append(b.value(f"{name}/heads"))
        nodes.append(Node("Reshape", [name, shape], [split[-1]], {}, "", ""))
    attrs = dict(attrs, q_perm=[0, 2, 1, 3], k_perm=[0, 2, 1, 3], v_perm=[0, 2, 1, 3], out_perm=[0, 2, 1, 3])
    merged = b.value(f"{out}/heads")
    shape = b.constant(f"{out}/merged_shape", np.array([0, 0, -1], np.int64))
    nodes.append(Node("FusedAttention", split + ([bias] if bias else []), [merged], attrs, NNCC, node.name))
    nodes.append(Node("Reshape", [merged, shape], [out], {}, "", ""))
    return nodes
