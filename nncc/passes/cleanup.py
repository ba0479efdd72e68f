"""Removal of inference no-ops (Identity, inference-mode Dropout, a Cast to the type its input
already has), plus helpers shared by passes.

Every pass is a function Graph -> Graph returning a NEW Graph: the input graph's node list,
dicts and Node objects are never modified (unchanged Nodes may be shared by both graphs).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import numpy as np

from nncc.errors import NnccError
from nncc.ir.graph import Graph, Node
from nncc.passes.shape_inference import infer_shapes

# --------------------------------------------------------------------------- shared helpers


def rebuild(graph: Graph, **changes) -> Graph:
    """A new Graph like ``graph`` with ``changes``; lists and dicts not replaced are copied."""
    fields = {
        "nodes": list(graph.nodes),
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "initializers": dict(graph.initializers),
        "values": dict(graph.values),
        "opsets": dict(graph.opsets),
    }
    fields.update(changes)
    return dataclasses.replace(graph, **fields)


def _subgraphs(value) -> Iterable[Graph]:
    if isinstance(value, Graph):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, Graph):
                yield item


def node_subgraphs(node: Node) -> list[Graph]:
    return [g for value in node.attrs.values() for g in _subgraphs(value)]


def subgraph_references(graph: Graph) -> set[str]:
    """Names used anywhere inside subgraphs (If/Loop/Scan bodies) of ``graph``'s nodes.

    An over-approximation of the outer values they capture: passes treat these names as
    used by something they cannot rewrite (never renamed, removed or fused away).
    """
    names: set[str] = set()
    stack = [g for node in graph.nodes for g in node_subgraphs(node)]
    while stack:
        sub = stack.pop()
        names.update(sub.outputs)
        for node in sub.nodes:
            names.update(n for n in node.inputs if n)
            stack.extend(node_subgraphs(node))
    return names


def all_names(graph: Graph) -> set[str]:
    names = set(graph.inputs) | set(graph.outputs) | set(graph.initializers) | set(graph.values)
    for node in graph.nodes:
        names.update(node.inputs)
        names.update(node.outputs)
    names.discard("")
    return names


def fresh_name(base: str, taken: set[str]) -> str:
    """``base`` (or ``base_2``, ``base_3`` ...) not yet in ``taken``; the result is added to it."""
    name, i = base, 1
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


def frozen(array) -> np.ndarray:
    """``array`` as a read-only ndarray, never changing the flags of the caller's object."""
    array = np.asarray(array)
    if array.flags.writeable:
        array = array.view()
        array.flags.writeable = False
    return array


# --------------------------------------------------------------------------- the pass


def _same_type_casts(graph: Graph) -> set[int]:
    """The Casts whose input already has the type they cast to (the float32-to-float32 Cast
    an RMSNorm export writes): identities. Types come from shape inference, run only when
    the graph has a Cast; without it (inference failed) every Cast stays."""
    casts = [node for node in graph.nodes if node.domain == "" and node.op_type in ("Cast", "CastLike")
             and node.inputs and node.inputs[0] and len(node.outputs) == 1 and node.outputs[0]]
    if not casts:
        return set()
    try:
        infos = infer_shapes(graph)
    except NnccError:
        return set()
    same = set()
    for node in casts:
        src, dst = infos.get(node.inputs[0]), infos.get(node.outputs[0])
        if src is not None and dst is not None and src.dtype is not None and src.dtype == dst.dtype:
            same.add(id(node))
    return same


def _is_noop(node: Node, graph: Graph, used: set[str], casts: set[int]) -> bool:
    if node.domain != "" or not node.inputs or not node.inputs[0] or not node.outputs:
        return False
    if id(node) in casts:
        return True
    if node.op_type == "Identity":
        return len(node.outputs) == 1 and bool(node.outputs[0])
    if node.op_type != "Dropout":
        return False
    if not node.outputs[0]:
        return False
    # The mask output must be absent or unused (no consumer, not a graph output).
    if len(node.outputs) > 1 and node.outputs[1] and node.outputs[1] in used:
        return False
    if graph.opset("") >= 12 and len(node.inputs) > 2 and node.inputs[2]:
        training = graph.initializers.get(node.inputs[2])
        if training is None or training.size != 1 or bool(np.asarray(training).reshape(-1)[0]):
            return False  # training mode (or unknown at compile time): random, keep it
    return True


def remove_noops(graph: Graph) -> Graph:
    """Remove Identity, inference-mode Dropout and Casts to their input's own type, rewiring
    consumers to their inputs.

    When a removed node's output is a graph output, the output name is kept: the producer
    of the input is renamed to it, or, when the input is a graph input, an initializer,
    another graph output or a value a subgraph captures, an Identity is kept.
    """
    graph_outputs = set(graph.outputs)
    captured = subgraph_references(graph)
    used = {n for node in graph.nodes for n in node.inputs if n} | graph_outputs | captured
    casts = _same_type_casts(graph)
    candidates = []
    for node in graph.nodes:
        if not _is_noop(node, graph, used, casts):
            continue
        if node.outputs[0] in captured:
            continue
        candidates.append(node)
    if not candidates:
        return rebuild(graph)

    removed = {id(node) for node in candidates}
    # alias: output of a removed node -> the value it forwards (chains resolved lazily).
    alias: dict[str, str] = {node.outputs[0]: node.inputs[0] for node in candidates}

    def source(name: str) -> str:
        seen = 0
        while name in alias and seen <= len(alias):
            name = alias[name]
            seen += 1
        return name

    produced = {out for node in graph.nodes if id(node) not in removed for out in node.outputs if out}
    fixed = set(graph.inputs) | set(graph.initializers) | graph_outputs | captured
    rename: dict[str, str] = {}
    kept: list[tuple[str, str]] = []
    for out in dict.fromkeys(graph.outputs):
        if out not in alias:
            continue
        src = source(out)
        if src in produced and src not in fixed and src not in rename:
            rename[src] = out
        else:
            kept.append((src, out))

    def resolve(name: str) -> str:
        if not name:
            return name
        src = source(name)
        return rename.get(src, src)

    nodes: list[Node] = []
    for node in graph.nodes:
        if id(node) in removed:
            continue
        inputs = [resolve(n) for n in node.inputs]
        outputs = [rename.get(n, n) for n in node.outputs]
        if inputs != node.inputs or outputs != node.outputs:
            node = dataclasses.replace(node, inputs=inputs, outputs=outputs, attrs=dict(node.attrs))
        nodes.append(node)
    for src, out in kept:
        nodes.append(Node("Identity", [rename.get(src, src)], [out], name=f"{out}/identity"))
    values = dict(graph.values)
    for name in alias:
        if name not in graph_outputs:
            values.pop(name, None)
    for src, out in rename.items():
        if out not in values and src in values:
            values[out] = values[src]
        values.pop(src, None)
    return rebuild(graph, nodes=nodes, values=values)
