"""If on a condition known only at run time: both branches become steps of the partition,
each under a guard the entry point tests once per call (the writer's ``branch``), so the
choice costs one byte read instead of a trip through the portable interpreter.

Taken when the condition is a bool scalar, each branch's outputs have the If's static
float32 shapes, and every branch node is one some entry writes (``refused``: the registry's
check of a node). A branch's own values are renamed under the If's output, so two branches
(or a branch and the outer graph) that use the same names never share a buffer; the outer
values a branch reads keep their names and are inputs of the partition, as the If's
trailing inputs (nncc.ir.graph's CAPTURES). A subgraph inside a branch is refused: one
level of guards is all the writer keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nncc.errors import NnccError
from nncc.ir.graph import CAPTURES, Graph, Node, TensorInfo, closed
from nncc.native.ops.entry import NativeOp, static_f32

BRANCHES = (("then_branch", True), ("else_branch", False))  # (attribute, the condition that runs it)
BOOL = np.dtype(np.bool_)
UNKNOWN = TensorInfo(None, None)


@dataclass
class Branch:
    """One branch, renamed apart: its nodes, outputs, constants and the infos of its values."""

    nodes: list[Node]
    outputs: list[str]
    constants: dict[str, np.ndarray]
    infos: dict[str, TensorInfo]

    def scope(self, outer: Graph) -> Graph:
        """The branch as a graph the entries can check its nodes against."""
        return Graph(self.nodes, [], self.outputs, self.constants, opsets=outer.opsets)


class If(NativeOp):
    ops = frozenset({("", "If")})
    float_values = False  # the condition is a bool; the branch nodes check their own values
    own_layout = True  # the branches read the outer values in the layout their nodes want

    def __init__(self, refused):
        self.refused = refused  # (node, graph, infos) -> why no entry writes a branch node

    def data_inputs(self, node: Node) -> list[str]:
        return list(node.inputs[1:])  # the condition is tested as one byte, never read as data

    def check(self, node: Node, graph: Graph, infos: dict[str, TensorInfo]) -> str | None:
        cond = infos.get(node.inputs[0]) if node.inputs and node.inputs[0] else None
        if cond is None or cond.dtype != BOOL or not cond.is_static or int(np.prod(cond.shape)) != 1:
            return "a condition that is not a bool scalar"
        branches = {}
        for key, _ in BRANCHES:
            branches[key] = branch_of(node, key, infos)
            if isinstance(branches[key], str):
                return f"its {key}: {branches[key]}"
        then, other = (branches[key] for key, _ in BRANCHES)
        for a, b, name in zip(then.outputs, other.outputs, node.outputs):
            shown = [(x.infos.get(o) or infos.get(o) or UNKNOWN).describe() for x, o in ((then, a), (other, b))]
            if shown[0] != shown[1]:
                return f"branches whose outputs differ ({shown[0]} and {shown[1]})"
            if not static_f32(infos.get(name)) or shown[0] != infos[name].describe():
                return f"branch outputs ({shown[0]}) that are not the If's static float32 output"
        for key, branch in branches.items():
            scope, seen = branch.scope(graph), {**infos, **branch.infos}
            for inner in branch.nodes:
                why = self.refused(inner, scope, seen)
                if why is not None:
                    return f"its {key}: {inner.op_type}: {why}"
        return None

    def plan(self, writer, node: Node) -> list[tuple[bool, Branch]]:
        return [(taken, branch_of(node, key, writer.infos)) for key, taken in BRANCHES]

    def render(self, writer, node: Node, plan) -> None:
        for taken, branch in plan:
            writer.branch(node.inputs[0], taken, branch, list(node.outputs))


def branch_of(node: Node, key: str, infos: dict[str, TensorInfo]) -> Branch | str:
    """Subgraph ``key`` of ``node`` renamed apart, with its values inferred from the outer
    ones it reads; or why it cannot be written as native steps."""
    from nncc.passes.shape_inference import infer_shapes  # lazy: codegen (only a partition with an If)

    graph = node.attrs.get(key)
    if not isinstance(graph, Graph):
        return "not a subgraph"
    nested = next((n for n in graph.nodes if any(isinstance(v, Graph) for v in n.attrs.values())), None)
    if nested is not None:
        return f"a nested {nested.op_type} (one level of branches is written natively)"
    if graph.inputs or len(graph.outputs) != len(node.outputs):
        return "inputs of its own, or not one output per output of the If"
    captures = list(node.attrs.get(CAPTURES) or [])
    try:
        inferred = infer_shapes(closed(graph, captures), {name: infos[name] for name in captures if name in infos})
    except NnccError as exc:  # the If stays portable, whose kernel reports it when it runs
        return f"its shapes could not be inferred ({exc})"
    own = set(graph.initializers) | {o for n in graph.nodes for o in n.outputs if o}
    prefix = f"{node.outputs[0]}|{key}|"

    def rename(name: str) -> str:
        return prefix + name if name in own else name

    nodes = [Node(n.op_type, [rename(i) if i else i for i in n.inputs], [rename(o) if o else o for o in n.outputs],
                  n.attrs, n.domain, n.name and prefix + n.name) for n in graph.nodes]
    return Branch(nodes, [rename(o) for o in graph.outputs],
                  {rename(k): v for k, v in graph.initializers.items()},
                  {rename(k): v for k, v in inferred.items() if k in own})
