"""The backend plugin interface, after LiteRT's compiler plugins.

A backend has an identity, a ``partition`` step that selects the nodes it supports
(optionally tagging a node with an index to force a finer split), a ``compile`` step
that turns each outlined partition into bytecode: here, a list of instructions naming
registered kernels, plus the entry point that implements the partition, and a
``load_unit`` step that turns a compiled partition of a plan into the executable unit the
executor runs (nncc.backends.unit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nncc.backends.unit import Unit, UnitSource, instruction_unit
from nncc.ir.graph import Graph, Node, TensorInfo
from nncc.kernels.registry import resolve


@dataclass
class Partition:
    """An outlined sub-DAG assigned to one backend."""

    index: int
    backend: str
    nodes: list[Node]
    inputs: list[str] = field(default_factory=list)  # values read from outside
    outputs: list[str] = field(default_factory=list)  # values used outside, or graph outputs


@dataclass
class Instruction:
    kernel: str  # a registry key such as "ai.onnx::Conv::11"
    inputs: list[str]  # value names; "" for an omitted optional input
    outputs: list[str]
    attrs: dict[str, Any]
    node: str = ""  # the ONNX node's name, for diagnostics


@dataclass
class CompiledPartition:
    """A backend's bytecode for one partition and its call info (the entry point)."""

    partition: int
    backend: str
    entry: str
    instructions: list[Instruction]
    # A native unit (nncc.native.codegen.Unit) that runs the whole partition as one call in
    # place of ``instructions``, which stay as its portable form.
    native: Any = None


class Backend:
    """Subclass and register to add a backend. Identity is part of the cache key."""

    name: str = "abstract"
    version: str = "0"
    maker: str = ""
    targets: str = ""
    # A backend whose compile is slow (a C compiler run, say) is deferred by the cache's
    # stages: a miss runs the plan of the other backends at once, and this one's later.
    slow_to_build: bool = False

    def partition(self, graph: Graph, infos: dict[str, TensorInfo]) -> dict[int, int | None]:
        """Map the index (in ``graph.nodes``) of each node this backend takes to a group
        index (None: any group; nodes with different indices never share a partition)."""
        raise NotImplementedError

    def compile(self, partition: Partition, graph: Graph, infos: dict[str, TensorInfo]) -> CompiledPartition:
        """Lower one partition to instructions. The default emits one instruction per node,
        each bound to the registered kernel for the model's opset."""
        instructions = []
        for node in partition.nodes:
            definition = resolve(node.op_type, node.domain, graph.opset(node.domain))
            instructions.append(
                Instruction(definition.key, list(node.inputs), list(node.outputs), dict(node.attrs), node.name)
            )
        return CompiledPartition(partition.index, self.name, f"{self.name}_partition_{partition.index}", instructions)

    def load_unit(self, source: UnitSource) -> Unit:
        """The executable unit for one partition of a plan about to run. The default runs
        the partition's instructions, one registered kernel each; override it to run the
        partition another way (see nncc.backends.unit for the contract)."""
        return instruction_unit(source)

    def identity(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "maker": self.maker, "targets": self.targets}
