"""Structural checks of a model before any pass runs: what no pass or kernel could make
sense of is bad input (ModelFormatError, naming the node and op), never an exception from
deep inside a pass."""

from __future__ import annotations

from nncc.errors import ModelFormatError, UnsupportedOpError
from nncc.ir.graph import Graph, topological_order
from nncc.kernels.attributes import attribute_problem
from nncc.kernels.registry import resolve


def validate_graph(graph: Graph) -> None:
    """Raise ModelFormatError for a cycle, a node consuming its own output, a value
    nobody produces or produced twice, or a node whose inputs its kernel cannot take (a required input
    given as the empty name, too few or too many inputs), or an attribute of the wrong
    type. Unknown ops are left to the partitioner, which reports them (or a pass removes
    them as dead code)."""
    topological_order(graph)
    defined = set(graph.inputs) | set(graph.initializers)
    for node in graph.nodes:
        for name in node.outputs:
            if name in defined:  # ONNX graphs are single-assignment
                raise ModelFormatError(f"{node.label()} writes {name!r}, which is already defined "
                                       "(an input, an initializer or another node's output)")
            if name:
                defined.add(name)
        check_node(node, graph)


def check_node(node, graph: Graph) -> None:
    """A node's attributes and inputs, and those of every node in its subgraphs (an If's
    or a Loop's branches), which a native compile writes as code like any other node."""
    check_attributes(node)
    for value in node.attrs.values():
        for sub in value if isinstance(value, list) else [value]:
            if isinstance(sub, Graph):
                for inner in sub.nodes:
                    check_node(inner, graph)  # a subgraph runs at its model's opsets
    try:
        definition = resolve(node.op_type, node.domain, graph.opset(node.domain))
    except UnsupportedOpError:
        return
    why = definition.check_inputs([bool(name) for name in node.inputs], node.label())
    if why:
        raise ModelFormatError(why)


def check_attributes(node) -> None:
    for name, value in node.attrs.items():
        why = attribute_problem(node.op_type, node.domain, name, value)
        if why:
            raise ModelFormatError(f"{node.label()}: {why}")
