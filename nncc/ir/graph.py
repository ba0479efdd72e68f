"""The in-memory IR: a Graph of Nodes over named values.

Immutable by convention: passes build new Graphs instead of mutating shared ones.
Values are referred to by name; the empty string marks an omitted optional input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

Dim = int | str | None  # int: static; str: symbolic (dim_param); None: unknown


@dataclass
class TensorInfo:
    """What is known about a value before it runs: dtype, shape and maybe its contents."""

    dtype: np.dtype | None
    shape: tuple[Dim, ...] | None  # None: rank unknown
    value: np.ndarray | None = None  # known at compile time (constants, folded shapes)

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
    """Nodes in an order where every input is produced before use (Kahn's algorithm).

    Keeps the file order where it is already valid, so results are deterministic.
    Raises ValueError on a cycle or a value nobody produces.
    """
    available = set(graph.inputs) | set(graph.initializers) | {""}
    pending = list(graph.nodes)
    ordered: list[Node] = []
    while pending:
        progressed = []
        rest = []
        for node in pending:
            if all(name in available for name in node.inputs):
                progressed.append(node)
                available.update(node.outputs)
            else:
                rest.append(node)
        if not progressed:
            missing = sorted({n for node in rest for n in node.inputs if n not in available})
            raise ValueError(
                f"graph has a cycle or uses values nobody produces: {', '.join(missing[:5])}"
            )
        ordered.extend(progressed)
        pending = rest
    return ordered
