"""Grouped-query heads as exporters write them, read in place by ``nncc::FusedAttention``.

A model whose K and V have fewer heads than Q repeats each K and V head for its group of
query heads before the attention (``repeat_kv``)::

    K [B, Hkv, S, D] -> Unsqueeze(axis 2) -> Expand to [B, Hkv, g, S, D] -> Reshape to [B, Hkv·g, S, D]

Query head ``h`` then reads the copy of K/V head ``h // g``. When both K and V of a fused
attention come from such a chain with the same ``g``, the node reads the unrepeated K and V
with ``head_group = g`` instead (nncc.kernels.fused_attention), so the copies are never made:
dead-code elimination removes the chains left unread.
"""

from __future__ import annotations

import numpy as np

from nncc.ir.graph import Graph, Node
from nncc.passes.attention_nodes import NNCC, static
from nncc.passes.cleanup import rebuild


def _axes(graph: Graph, infos, node: Node) -> list[int] | None:
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    if len(node.inputs) > 1 and node.inputs[1]:
        name = node.inputs[1]
        value = graph.initializers.get(name)
        if value is None and infos.get(name) is not None:
            value = infos[name].value
        return None if value is None else [int(a) for a in np.asarray(value).reshape(-1)]
    return None


def _plain(node: Node | None, op_type: str) -> bool:
    return node is not None and node.domain == "" and node.op_type == op_type and bool(node.inputs)


def _repeated(graph: Graph, infos, producer, node: Node, index: int, key: str) -> tuple[str, int] | None:
    """(the unrepeated K or V, the group size) when input ``index`` of ``node`` is a
    repeat_kv chain whose head axis the node reads as its heads; else None."""
    name = node.inputs[index]
    info = infos.get(name)
    if not static(info) or len(info.shape) != 4:
        return None
    perm = node.attrs.get(key)
    if perm is not None and [int(p) for p in perm[:2]] != [0, 1]:
        return None  # the stored head axis must stay the logical head axis
    reshape = producer.get(name)
    expand = producer.get(reshape.inputs[0]) if _plain(reshape, "Reshape") else None
    unsqueeze = producer.get(expand.inputs[0]) if _plain(expand, "Expand") else None
    if not _plain(unsqueeze, "Unsqueeze") or _axes(graph, infos, unsqueeze) not in ([2], [-3]):
        return None
    source = unsqueeze.inputs[0]
    src, lone, wide = infos.get(source), infos.get(unsqueeze.outputs[0]), infos.get(expand.outputs[0])
    if not all(static(i) for i in (src, lone, wide)) or len(src.shape) != 4 or src.dtype != info.dtype:
        return None
    batch, heads, seq, size = src.shape
    group = wide.shape[2] if len(wide.shape) == 5 else 0
    if tuple(lone.shape) != (batch, heads, 1, seq, size) or tuple(wide.shape) != (batch, heads, group, seq, size):
        return None
    if group < 2 or tuple(info.shape) != (batch, heads * group, seq, size):
        return None
    return source, group


def _query_heads(infos, node: Node, heads: int) -> bool:
    """Whether Q has ``heads`` heads on its logical head axis (not one, broadcast)."""
    info = infos.get(node.inputs[0])
    if not static(info) or len(info.shape) < 3:
        return False
    perm = node.attrs.get("q_perm") or range(len(info.shape))
    return info.shape[int(list(perm)[-3])] == heads


def read_repeated_heads(graph: Graph, infos) -> Graph:
    """Each FusedAttention whose K and V are repeated per query head reads them unrepeated."""
    fused = [n for n in graph.nodes if n.domain == NNCC and n.op_type == "FusedAttention"
             and int(n.attrs.get("head_group", 1)) == 1 and len(n.inputs) >= 3]
    if not fused:
        return graph
    producer = graph.producers()
    replaced: dict[int, Node] = {}
    for node in fused:
        k = _repeated(graph, infos, producer, node, 1, "k_perm")
        v = _repeated(graph, infos, producer, node, 2, "v_perm")
        if k is None or v is None or k[1] != v[1] or not _query_heads(infos, node, infos[node.inputs[1]].shape[1]):
            continue
        inputs = [node.inputs[0], k[0], v[0]] + list(node.inputs[3:])
        replaced[id(node)] = Node(node.op_type, inputs, list(node.outputs), dict(node.attrs, head_group=k[1]),
                                  node.domain, node.name)
    if not replaced:
        return graph
    return rebuild(graph, nodes=[replaced.get(id(n), n) for n in graph.nodes])
