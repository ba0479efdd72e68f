"""Executable units: what a compiled partition becomes when a plan is prepared to run.

A backend's ``compile`` turns a partition into its stored form: portable instructions, an
entry point's name, and any form of its own, stored as the backend's payload (the native
backend's shared object in the CODE section) and made ready by its ``activate``. When a plan is prepared, the backend that compiled each partition turns it into
a ``Unit`` (``Backend.load_unit``), and the executor runs the units in order over the
plan's buffers. It knows nothing else of backends, so a third-party backend that executes
differently needs no change to it:

* the portable backend (numpy): one call per instruction, each a registered kernel (the
  default, ``instruction_unit``);
* the native backend: one call into the partition's verified C entry point;
* anything else: any calls that read the partition's inputs and write its outputs
  (examples/plugin_example.py runs its partition as one call of its own).

A call is kernel-shaped. With ``writes_out`` it is ``fn(ctx, *inputs, out=outputs)`` and
fills the preallocated arrays ``outputs`` (returning them); the executor passes
``out=`` whenever it could plan every output's buffer, and otherwise calls ``fn(ctx,
*inputs)``, which returns fresh arrays (one, or a tuple). ``inputs`` are the arrays of the
call's input slots, None for an omitted optional input (slot -1). The executor runs one
inference at a time, so a call may keep scratch state between runs; the arrays it is
given may change from one run to the next. ``ctx`` (nncc.kernels.registry.Ctx) carries the
call's ``attrs`` (decoded: tensor references become arrays), its opset and a workspace
shared by all calls. A TypeError or IndexError escaping a call is a bug and propagates as
such; bad values are reported by raising an NnccError (KernelError). A call may have a
first phase, ``prepare(ctx, *infos)``, that the executor runs once where every input's
dtype and shape are certain, and that returns the function to run instead (the contract
is ``nncc.kernels.registry.kernel``'s).

A partition whose backend is not loaded in this process runs its instructions (they are
always the portable form): nothing is ever imported because a plan names it. A plan is
input like any file: the reader checked its instructions against the kernels they name,
not against what a backend's own compile would have made, so ``load_unit`` checks what it
relies on and, where the partition is not what it expects, returns ``instruction_unit``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from nncc.errors import PlanFormatError
from nncc.kernels.registry import by_key
from nncc.plan.plan import PartitionInfo, Plan, PlanInstruction


@dataclass
class Call:
    """One step of the executor's program."""

    fn: Callable
    inputs: list[int]  # slots; -1 for an omitted optional input
    outputs: list[int]  # slots; -1 for an omitted optional output
    label: str  # names the call in errors: the node, or the partition's entry point
    opset: int  # ctx.opset
    attrs: dict[str, Any] = field(default_factory=dict)  # the plan's JSON attribute values
    writes_out: bool = True  # accepts out= (then its outputs can live in the arena)
    op_type: str = ""  # what memory planning and list checks know calls by ("Concat", ...)
    domain: str = ""
    # a first phase, run once with static input infos (nncc.kernels.registry.kernel)
    prepare: Callable | None = None


@dataclass
class Unit:
    """One partition, ready to run: its entry point and the calls that implement it."""

    entry: str
    calls: list[Call]
    kind: str = "instructions"  # how it runs: "instructions", "native", or a backend's own word


@dataclass
class UnitSource:
    """What a backend's ``load_unit`` is given: one partition of a plan about to run."""

    plan: Plan
    index: int  # the partition's index in plan.partitions
    partition: PartitionInfo
    loaded: Any = None  # what the backend's ``activate`` made of its payload, or None
    _readers: dict[int, set[int]] | None = field(default=None, repr=False)  # slot -> partitions

    @property
    def instructions(self) -> list[PlanInstruction]:
        first, count = self.partition.first, self.partition.count
        return self.plan.instructions[first : first + count]

    def boundary(self) -> tuple[list[int], list[int]]:
        """(inputs, outputs): the slots the partition reads from outside, in the order it
        first reads them, and the slots it writes that are read elsewhere or are graph
        outputs, in the order it writes them."""
        readers = self._readers if self._readers is not None else _readers(self.plan)
        produced: dict[int, None] = {}
        read: dict[int, None] = {}
        for ins in self.instructions:
            for s in ins.inputs:
                if s >= 0 and s not in produced:
                    read[s] = None
            for s in ins.outputs:
                if s >= 0:
                    produced[s] = None
        graph_outputs = set(self.plan.outputs)
        outputs = [s for s in produced
                   if s in graph_outputs or readers.get(s, set()) - {self.index}]
        return list(read), outputs


def _readers(plan: Plan) -> dict[int, set[int]]:
    readers: dict[int, set[int]] = {}
    for index, part in enumerate(plan.partitions):
        for ins in plan.instructions[part.first : part.first + part.count]:
            for s in ins.inputs:
                readers.setdefault(s, set()).add(index)
    return readers


def sources(plan: Plan, loaded: dict[str, Any] | None = None) -> list[UnitSource]:
    """One source per partition, sharing one map of which partitions read each slot.
    ``loaded``: backend name -> its activated payload."""
    readers = _readers(plan)
    loaded = loaded or {}
    return [UnitSource(plan, i, part, loaded.get(part.backend), readers)
            for i, part in enumerate(plan.partitions)]


def instruction_calls(plan: Plan, instructions: list[PlanInstruction]) -> list[Call]:
    """One call per instruction: its registered kernel."""
    opsets = plan.options.get("opsets", {})
    calls = []
    for ins in instructions:
        definition = by_key(plan.kernels[ins.kernel])
        if definition is None:  # deserialize already checked; a Plan built in memory may not be
            raise PlanFormatError(f"kernel {plan.kernels[ins.kernel]!r} is not registered")
        calls.append(Call(definition.fn, ins.inputs, ins.outputs, ins.node or definition.op_type,
                          int(opsets.get(definition.domain, definition.since)), ins.attrs,
                          definition.writes_out, definition.op_type, definition.domain,
                          definition.prepare))
    return calls


def instruction_unit(source: UnitSource) -> Unit:
    """The default unit: the partition's instructions, each run by its registered kernel."""
    return Unit(source.partition.entry, instruction_calls(source.plan, source.instructions))
