"""Whether a compiled plan can stand alone as a C library, and what its one call needs.

A plan stands alone when every instruction belongs to one native partition, and that
partition reads only the model's inputs and constants and writes every model output
itself: the library is then that partition's entry point and nncc's C runtime, nothing
of Python. Anything else is refused with the nodes that keep it from standing alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nncc.backends.native import native_calls
from nncc.errors import NnccError

INPUT, CONSTANT, OUTPUT = 0, 1, 2  # what an argument of the entry point is (c_api's table)


class NotExportable(NnccError):
    """The model cannot stand alone as a C library (bad input for `nncc export`).
    ``nodes``: one line per node that keeps it from standing alone, and why."""

    exit_code = 2

    def __init__(self, message: str, nodes: list[str] | None = None):
        super().__init__(message)
        self.nodes = list(nodes or [])


@dataclass(frozen=True)
class Tensor:
    """``shape``: one sample's when the library takes a batch; ``batch_axis``: the axis that
    scales with the batch (None: every sample reads or writes the whole tensor)."""

    name: str
    shape: tuple[int, ...]
    batch_axis: int | None = None


@dataclass
class Standalone:
    """The one call a library makes: ``symbol(args, workspace)`` with ``args`` bound by
    ``bindings`` ((INPUT, i), (CONSTANT, k), (OUTPUT, j)); ``constants`` in weights order."""

    inputs: list[Tensor]
    outputs: list[Tensor]
    symbol: str
    bindings: list[tuple[int, int]]
    constants: list[np.ndarray]
    workspace: int
    features: tuple[str, ...]
    objects: list[str]  # the kernel objects' keys, in link order
    sanitized: bool
    batch: str | None = None  # the batch's dimension name, when the library takes one at run time


def standalone(plan, batch=None) -> Standalone:
    """The plan's one call, or NotExportable naming what keeps it from standing alone.
    ``batch``: the run-time batch (nncc.export.batch.Batch) of the plan for one sample."""
    _refuse_symbolic(plan)
    native = plan.payloads.get("native")
    calls = native_calls(native, plan) if native is not None else {}
    foreign = [p for i, p in enumerate(plan.partitions) if i not in calls]
    if foreign or len(calls) != 1:
        nodes = _portable_nodes(plan, calls)
        failed = plan.options.get("native_error")
        why = f" (the native build failed: {failed})" if failed else ""
        raise NotExportable(f"the model is not one native partition ({len(calls)} native, "
                            f"{len(plan.partitions) - len(calls)} other){why}: only a model that runs entirely "
                            f"as native code can stand alone; {len(nodes)} node(s) do not:", nodes)
    (call,) = calls.values()
    inputs, outputs = list(plan.inputs), list(plan.outputs)
    written = call.args[call.n_inputs:]
    bindings, constants = [], []
    for slot in call.args[:call.n_inputs]:
        if slot in inputs:
            bindings.append((INPUT, inputs.index(slot)))
        elif slot in plan.constants:
            bindings.append((CONSTANT, len(constants)))
            constants.append(np.ascontiguousarray(plan.constants[slot], dtype=np.float32))
        else:  # an intermediate another partition made: cannot happen with one partition
            raise NotExportable(f"the native call reads {plan.slots[slot].name!r}, which no input or constant holds")
    unread = [plan.slots[s].name for s in inputs if s not in call.args[:call.n_inputs]]
    if unread:
        raise NotExportable(f"input(s) {', '.join(unread)} are not read by the native code "
                            "(an exported library takes only inputs its code reads)")
    for slot in written:
        bindings.append((OUTPUT, outputs.index(slot)) if slot in outputs else (OUTPUT, -1))
    stray = [plan.slots[s].name for s in outputs if s not in written or outputs.count(s) > 1]
    if stray or (OUTPUT, -1) in bindings:
        raise NotExportable(f"output(s) {', '.join(stray) or '(an intermediate)'} are not written by the native "
                            "code once each (an output that is an input, a constant or repeated)")
    for slot in inputs:
        info = plan.slots[slot]
        if info.dtype != np.float32:
            raise NotExportable(f"input {info.name!r} is {info.dtype}, not float32")
    native_info = plan.options.get("native") or {}
    flags = native_info.get("flags") or []
    axes_in, axes_out = (batch.inputs, batch.outputs) if batch is not None else ({}, {})
    return Standalone([_tensor(plan, s, axes_in) for s in inputs], [_tensor(plan, s, axes_out) for s in outputs],
                      call.symbol, bindings, constants, call.workspace, tuple(native_info.get("features") or ()),
                      list(native_info.get("objects") or ()), "-fsanitize=address,undefined" in flags,
                      batch.dim if batch is not None else None)


def _tensor(plan, slot: int, batch_axes: dict) -> Tensor:
    info = plan.slots[slot]
    return Tensor(info.name, tuple(int(d) for d in info.shape), batch_axes.get(info.name))


def _refuse_symbolic(plan) -> None:
    for slot in list(plan.inputs) + list(plan.outputs):
        info = plan.slots[slot]
        symbolic = [d for d in (info.shape or ()) if type(d) is not int]
        if info.shape is None or symbolic:
            dims = ", ".join(str(d) for d in symbolic if d is not None) or "?"
            raise NotExportable(f"{info.name!r} has symbolic dimension(s) {dims}: fix them with "
                                f"--dim NAME=SIZE")


def _portable_nodes(plan, calls: dict) -> list[str]:
    """The nodes outside a native call, each with why no native code took it."""
    why = {(f.get("node"), f.get("op")): f.get("reason") for f in plan.fallbacks if isinstance(f, dict)}
    lines = []
    for index, part in enumerate(plan.partitions):
        if index in calls:
            continue
        for instruction in plan.instructions[part.first:part.first + part.count]:
            kernel = plan.kernels[instruction.kernel]
            op = kernel.split("::")[1] if kernel.count("::") >= 2 else kernel
            reason = why.get((instruction.node, op)) or f"runs on the {part.backend} backend (`nncc inspect` says why)"
            lines.append(f"{instruction.node or '(unnamed)'} ({op}): {reason}")
    return lines
