"""Dead-code elimination: nodes none of whose outputs reach a graph output are dropped,
and so are initializers (and value infos) nothing uses any more. Graph inputs stay: they
are the model's interface even when unused.
"""

from __future__ import annotations

from nncc.ir.graph import Graph
from nncc.passes.cleanup import rebuild, subgraph_references


def eliminate_dead_code(graph: Graph) -> Graph:
    live: set[str] = set(graph.outputs) | subgraph_references(graph)
    producers = graph.producers()
    keep: set[int] = set()
    stack = list(live)
    while stack:  # walk back from the outputs; each node is visited once
        node = producers.get(stack.pop())
        if node is None or id(node) in keep:
            continue
        keep.add(id(node))
        for name in node.inputs:
            if name and name not in live:
                live.add(name)
                stack.append(name)
    nodes = [node for node in graph.nodes if id(node) in keep]
    initializers = {name: array for name, array in graph.initializers.items() if name in live}
    known = live | set(graph.inputs)
    for node in nodes:
        known.update(node.outputs)
    values = {name: info for name, info in graph.values.items() if name in known}
    return rebuild(graph, nodes=nodes, initializers=initializers, values=values)
