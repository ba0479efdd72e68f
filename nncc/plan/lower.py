"""Lower partitioned, compiled bytecode into a Plan over numbered slots."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from nncc._version import __version__
from nncc.errors import UnsupportedOpError
from nncc.ir.graph import Graph, TensorInfo
from nncc.kernels.registry import by_key
from nncc.plan.memory import aligned_constant, plan_arena
from nncc.plan.plan import PartitionInfo, Plan, PlanInstruction, Slot
from nncc.plan.subgraph import encode_graph

if TYPE_CHECKING:  # annotations only: the plan is below the backends that compile into it
    from nncc.backends.base import CompiledPartition


def lower(graph: Graph, infos: dict[str, TensorInfo], compiled: list[CompiledPartition],
          versions: dict[str, str], options: dict[str, Any],
          fallbacks: list[dict[str, str]]) -> tuple[Plan, dict[str, int]]:
    """The plan, and the slot of each value name (what backends' ``link`` refers to)."""
    slots: list[Slot] = []
    index: dict[str, int] = {}

    def slot_of(name: str) -> int:
        if name not in index:
            info = infos.get(name) or TensorInfo(None, None)
            index[name] = len(slots)
            slots.append(Slot(name, info.dtype, info.shape, info.kind))
        return index[name]

    inputs = [slot_of(n) for n in graph.inputs]
    constants: dict[int, np.ndarray] = {}
    for name, array in graph.initializers.items():
        constants[slot_of(name)] = aligned_constant(array)
    kernels: list[str] = []
    kernel_index: dict[str, int] = {}
    instructions: list[PlanInstruction] = []
    partitions: list[PartitionInfo] = []
    for part in compiled:
        for name, array in part.constants.items():  # read by the backend's payload only
            index[name] = len(slots)
            slots.append(Slot(name, array.dtype, tuple(array.shape)))
            constants[index[name]] = aligned_constant(array)
        first = len(instructions)
        for ins in part.instructions:
            if ins.kernel not in kernel_index:
                kernel_index[ins.kernel] = len(kernels)
                kernels.append(ins.kernel)
            attrs = {k: _attr(v, ins, slots, index, constants) for k, v in sorted(ins.attrs.items())}
            instructions.append(
                PlanInstruction(
                    kernel_index[ins.kernel],
                    [slot_of(n) if n else -1 for n in ins.inputs],
                    [slot_of(n) if n else -1 for n in ins.outputs],
                    attrs,
                    ins.node,
                )
            )
        partitions.append(
            PartitionInfo(part.backend, versions.get(part.backend, "0"), part.entry, first,
                          len(instructions) - first)
        )
    outputs = [slot_of(n) for n in graph.outputs]
    writes_out = [by_key(kernels[ins.kernel]).writes_out for ins in instructions]
    op_types = [by_key(kernels[ins.kernel]).op_type for ins in instructions]
    _, arena_bytes, _ = plan_arena(slots, instructions, writes_out, op_types, constants, outputs)
    return Plan(
        producer=__version__,
        kernels=kernels,
        slots=slots,
        inputs=inputs,
        outputs=outputs,
        constants=constants,
        instructions=instructions,
        partitions=partitions,
        arena_bytes=arena_bytes,
        options=dict(options),
        fallbacks=fallbacks,
    ), index


def _attr(value, ins, slots, index, constants):
    """Attributes become JSON values; tensors move to constant slots."""
    if isinstance(value, np.ndarray):
        slot = len(slots)
        slots.append(Slot(f"{ins.node or ins.kernel}/attr{slot}", value.dtype, tuple(value.shape)))
        constants[slot] = aligned_constant(value)
        return {"$tensor": slot}
    if isinstance(value, list):
        return [_attr(v, ins, slots, index, constants) for v in value]
    if isinstance(value, Graph):  # a subgraph: its nodes as JSON, its tensors as constants
        return encode_graph(value, lambda v: _attr(v, ins, slots, index, constants))
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    raise UnsupportedOpError(
        ins.kernel.split("::")[1], ins.kernel.split("::")[0], 0,
        f"attribute of type {type(value).__name__} (e.g. a subgraph) cannot be compiled",
    )
