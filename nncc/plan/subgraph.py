"""Subgraph attributes (If/Loop/Scan bodies) in a plan: a canonical JSON description of the
subgraph's nodes, checked on load like the rest of the program and rebuilt into a Graph
that the control-flow kernel runs. Nothing in it is ever evaluated as code.

    {"$graph": {"name": str,
                "inputs":  [value, ...],   "outputs": [value, ...],
                "initializers": [[name, {"$tensor": constant slot}], ...],
                "nodes": [[op_type, domain, [input name|"", ...], [output name|"", ...],
                           attrs, node name], ...]}}
    value := [name, dtype|null, shape|null(, kind)]   a slot-table entry (nncc.plan.slot_codec)

Nodes are listed in an order where every input is defined before use: by a subgraph
input, an initializer, an earlier node, or an outer value named in the holding node's
``__captures__`` attribute. Node attributes use the same encoding as instruction
attributes, nested subgraphs included (at most MAX_GRAPH_DEPTH deep).
"""

from __future__ import annotations

from typing import Any, Callable

from nncc.errors import PlanFormatError, UnsupportedOpError
from nncc.ir.graph import (
    CAPTURES,
    MAX_GRAPH_DEPTH,
    Graph,
    Node,
    TensorInfo,
    closed,
    free_names,
    normalize_domain,
    topological_order,
)
from nncc.plan.slot_codec import decode_slot, encode_slot

GRAPH_KEY = "$graph"
_FIELDS = {"name", "inputs", "outputs", "initializers", "nodes"}


def value_entry(name: str, info: TensorInfo | None) -> list:
    """A subgraph input's or output's slot-table entry."""
    info = info or TensorInfo(None, None)
    return encode_slot(name, info.dtype, info.shape, info.kind)


def encode_graph(graph: Graph, attr: Callable[[Any], Any]) -> dict:
    """``graph`` as JSON; ``attr`` encodes an attribute value (tensors to constant slots)."""
    order = topological_order(closed(graph, free_names(graph)))
    return {GRAPH_KEY: {
        "name": graph.name,
        "inputs": [value_entry(n, graph.values.get(n)) for n in graph.inputs],
        "outputs": [value_entry(n, graph.values.get(n)) for n in graph.outputs],
        "initializers": [[n, attr(a)] for n, a in sorted(graph.initializers.items())],
        "nodes": [[node.op_type, node.domain, list(node.inputs), list(node.outputs),
                   {k: attr(v) for k, v in sorted(node.attrs.items())}, node.name]
                  for node in order],
    }}


def is_graph(value: Any) -> bool:
    return type(value) is dict and GRAPH_KEY in value


def decode_graph(value: dict, constants: dict, opsets: dict, attr: Callable[[Any], Any]) -> Graph:
    """The Graph a checked description stands for; ``attr`` decodes attribute values."""
    desc = value[GRAPH_KEY]
    values = {}
    for entry in desc["inputs"] + desc["outputs"]:
        slot = decode_slot(entry)
        values[slot.name] = TensorInfo(slot.dtype, slot.shape, kind=slot.kind)
    initializers = {name: constants[ref["$tensor"]] for name, ref in desc["initializers"]}
    nodes = [Node(op, list(ins), list(outs), {k: attr(v) for k, v in attrs.items()},
                  normalize_domain(domain), name)
             for op, domain, ins, outs, attrs, name in desc["nodes"]]
    return Graph(nodes, [e[0] for e in desc["inputs"]], [e[0] for e in desc["outputs"]],
                 initializers, values, dict(opsets), desc["name"])


class GraphChecker:
    """Checks subgraph descriptions: every field's type, every name defined before use,
    every constant slot and every kernel (resolved at the plan's opsets)."""

    def __init__(self, constants: dict, opsets: dict, check_entry: Callable[[Any], Any]):
        self.constants = constants
        self.opsets = opsets
        self.check_entry = check_entry  # the slot-table entry check of the loader

    def attrs(self, attrs: Any, inputs: list, check_value: Callable[[Any], Any], depth: int) -> None:
        """Check a node's (or an instruction's) attributes, subgraphs included."""
        captures = attrs.get(CAPTURES)
        if captures is not None and not (type(captures) is list and len(captures) <= len(inputs)
                                         and all(type(c) is str and c for c in captures)):
            raise PlanFormatError("bad captured-value list")
        for key, value in attrs.items():
            if is_graph(value):
                self.graph(value, set(captures or []), depth + 1)
            elif type(value) is list and any(is_graph(v) for v in value):
                for item in value:
                    if not is_graph(item):
                        raise PlanFormatError(f"attribute {key!r} mixes subgraphs and values")
                    self.graph(item, set(captures or []), depth + 1)
            else:
                check_value(value)

    def graph(self, value: dict, outer: set, depth: int) -> None:
        if depth > MAX_GRAPH_DEPTH:
            raise PlanFormatError(f"subgraphs nested deeper than {MAX_GRAPH_DEPTH} levels")
        desc = value[GRAPH_KEY]
        if set(value) != {GRAPH_KEY} or type(desc) is not dict or set(desc) != _FIELDS:
            raise PlanFormatError("bad subgraph description")
        if type(desc["name"]) is not str:
            raise PlanFormatError("bad subgraph name")
        for key in ("inputs", "outputs", "initializers", "nodes"):
            if type(desc[key]) is not list:
                raise PlanFormatError(f"subgraph field {key!r} is not a list")
        defined = set(outer)
        for entry in desc["inputs"]:
            defined.add(self.check_entry(entry).name)
        for entry in desc["outputs"]:
            self.check_entry(entry)
        for entry in desc["initializers"]:
            if not (type(entry) is list and len(entry) == 2 and type(entry[0]) is str
                    and type(entry[1]) is dict and set(entry[1]) == {"$tensor"}
                    and type(entry[1]["$tensor"]) is int and entry[1]["$tensor"] in self.constants):
                raise PlanFormatError("subgraph initializer does not name a constant")
            defined.add(entry[0])
        for entry in desc["nodes"]:
            self.node(entry, defined, depth)
        for entry in desc["outputs"]:
            if entry[0] not in defined:
                raise PlanFormatError(f"subgraph output {entry[0]!r} is never defined")

    def node(self, entry: Any, defined: set, depth: int) -> None:
        if not (type(entry) is list and len(entry) == 6 and type(entry[0]) is str
                and type(entry[1]) is str and type(entry[2]) is list and type(entry[3]) is list
                and type(entry[4]) is dict and type(entry[5]) is str
                and all(type(n) is str for n in entry[2] + entry[3])):
            raise PlanFormatError("bad subgraph node")
        op, domain, inputs, outputs, attrs, _ = entry
        from nncc.kernels.registry import resolve  # lazy: start-up

        domain = normalize_domain(domain)
        try:
            resolve(op, domain, int(self.opsets.get(domain, 1)))
        except UnsupportedOpError:
            raise PlanFormatError(f"a subgraph uses op {op!r} (domain {domain!r}), "
                                  "which has no registered kernel") from None
        for name in inputs:
            if name and name not in defined:
                raise PlanFormatError(f"a subgraph reads {name!r} before it is defined")
        self.attrs(attrs, inputs, self._value_check(), depth)
        defined.update(n for n in outputs if n)

    def _value_check(self):
        def check(value, depth=0):
            kind = type(value)
            if kind in (int, str, float, bool) or value is None:
                return
            if depth > 4:
                raise PlanFormatError("attribute nested too deeply")
            if kind is dict:
                if set(value) != {"$tensor"} or type(value["$tensor"]) is not int \
                        or value["$tensor"] not in self.constants:
                    raise PlanFormatError("attribute tensor does not name a constant")
                return
            if kind is list:
                for item in value:
                    check(item, depth + 1)
                return
            raise PlanFormatError("bad attribute value")
        return check
