"""The in-memory IR: a Graph of Nodes over named values.

Immutable by convention: passes build new Graphs instead of mutating shared ones.
Values are referred to by name; the empty string marks an omitted optional input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nncc.errors import ModelFormatError

Dim = int | str | None  # int: static; str: symbolic (dim_param); None: unknown

# What kind of value a name holds. A sequence is a Python list of arrays and an optional
# is its element or None (empty); for both, TensorInfo.dtype is the element dtype and
# the shape is unknown, so only the CPU fallback runs the nodes that touch them.
TENSOR = "tensor"
SEQUENCE = "sequence"
OPTIONAL_TENSOR = "optional_tensor"
OPTIONAL_SEQUENCE = "optional_sequence"
KINDS = (TENSOR, SEQUENCE, OPTIONAL_TENSOR, OPTIONAL_SEQUENCE)

MAX_GRAPH_DEPTH = 32  # nested subgraphs (If/Loop bodies); deeper is surely hostile

# Node attribute naming the outer-scope values a node's subgraphs read. The reader appends
# those values to the node's inputs, in this order, so every pass, the interpreter, the
# partitioner and the plan see them as ordinary inputs; kernels bind them by position.
CAPTURES = "__captures__"


@dataclass
class TensorInfo:
    """What is known about a value before it runs: dtype, shape and maybe its contents."""

    dtype: np.dtype | None
    shape: tuple[Dim, ...] | None  # None: rank unknown
    value: np.ndarray | None = None  # known at compile time (constants, folded shapes)
    kind: str = TENSOR  # one of KINDS
    # partly known contents of a shape-like value, where `value` is unknown: an object
    # array of int (static), str (a symbolic dim) or None (unknown); nncc.kernels.symbolic
    symbolic: np.ndarray | None = None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    @staticmethod
    def of(array: np.ndarray, keep_value: bool = True) -> TensorInfo:
        return TensorInfo(array.dtype, tuple(array.shape), array if keep_value else None)

    def describe(self) -> str:
        if self.kind != TENSOR:
            return f"{self.kind}({'?' if self.dtype is None else self.dtype})"
        dtype = "?" if self.dtype is None else str(self.dtype)
        if self.shape is None:
            return f"{dtype}[?]"
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{dtype}[{dims}]"


@dataclass
class Node:
    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""  # "" is the default ai.onnx domain
    name: str = ""

    def label(self) -> str:
        return f"{self.op_type} node {self.name!r}" if self.name else f"{self.op_type} node"


@dataclass
class Graph:
    nodes: list[Node]
    inputs: list[str]  # values fed at run time (initializers excluded)
    outputs: list[str]
    initializers: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, TensorInfo] = field(default_factory=dict)  # declared or inferred
    opsets: dict[str, int] = field(default_factory=lambda: {"": 1})
    name: str = ""

    def opset(self, domain: str) -> int:
        return self.opsets.get(normalize_domain(domain), 1)

    def producers(self) -> dict[str, Node]:
        return {out: node for node in self.nodes for out in node.outputs if out}

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.inputs:
                if name:
                    users.setdefault(name, []).append(node)
        return users


def normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def topological_order(graph: Graph) -> list[Node]:
    """Nodes in an order where every input is produced before use (Kahn's algorithm, the
    ready node that comes first in the file going first: linear time whatever the order).

    Keeps the file order where it is already valid, so results are deterministic.
    Raises ModelFormatError (bad input) on a cycle, a node that consumes its own output,
    or a value nobody produces, naming the node.
    """
    import heapq  # lazy: start-up

    available = set(graph.inputs) | set(graph.initializers) | {""}
    nodes = graph.nodes
    waiting: dict[str, list[int]] = {}
    remaining = [0] * len(nodes)
    ready: list[int] = []
    for i, node in enumerate(nodes):
        needs = {name for name in node.inputs if name not in available}
        remaining[i] = len(needs)
        for name in needs:
            waiting.setdefault(name, []).append(i)
        if not needs:
            ready.append(i)
    heapq.heapify(ready)
    ordered: list[Node] = []
    while ready:
        i = heapq.heappop(ready)
        ordered.append(nodes[i])
        for name in nodes[i].outputs:
            if name in available:
                continue
            available.add(name)
            for j in waiting.pop(name, ()):
                remaining[j] -= 1
                if remaining[j] == 0:
                    heapq.heappush(ready, j)
    if len(ordered) < len(nodes):
        produced = {name for node in nodes for name in node.outputs if name}
        stuck = next(node for i, node in enumerate(nodes) if remaining[i])
        missing = sorted(name for name in stuck.inputs if name not in available)
        orphans = [name for name in missing if name not in produced]
        if orphans:
            raise ModelFormatError(f"{stuck.label()} uses {orphans[0]!r}, which no node, input or "
                                   "initializer produces")
        if any(name in stuck.outputs for name in missing):
            raise ModelFormatError(f"{stuck.label()} consumes its own output {missing[0]!r}")
        raise ModelFormatError(f"the graph has a cycle through {stuck.label()} (input {missing[0]!r})")
    return ordered


def free_names(graph: Graph) -> list[str]:
    """Names ``graph`` reads but does not define: the outer-scope values a subgraph
    captures, in first-use order (nested subgraphs' captures are already node inputs)."""
    defined = set(graph.inputs) | set(graph.initializers) | {""}
    for node in graph.nodes:
        defined.update(node.outputs)
    free: dict[str, None] = {}
    for node in graph.nodes:
        for name in node.inputs:
            if name not in defined:
                free[name] = None
    for name in graph.outputs:
        if name not in defined:
            free[name] = None
    return list(free)


def closed(graph: Graph, captures: list[str]) -> Graph:
    """``graph`` with the captured outer names as extra inputs, so it runs on its own."""
    extra = [n for n in captures if n not in graph.inputs]
    return Graph(graph.nodes, list(graph.inputs) + extra, graph.outputs, graph.initializers,
                 graph.values, graph.opsets, graph.name)
