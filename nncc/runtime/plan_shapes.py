"""A loaded artifact's declared shapes, checked against its kernels' rules before anything
is allocated for them.

An artifact is untrusted: its slots declare the dtypes and shapes that size the arena,
the dense copies of broadcast constants and `--random-inputs`. Each instruction's shape
function runs on the declared infos of its inputs, and every output must agree with its
declared slot. A plan whose shapes contradict each other (a 3 GB broadcast constant as the
bias of 128 values, an input wider than the weights it meets) is then bad input, found
in a few milliseconds, instead of a kernel failing after gigabytes were allocated.

Each instruction is checked on its own, from declared slots, so a symbolic dimension
(a name) agrees with any size; instructions that run subgraphs are left to their
kernels, which check their bodies' values as they run.
"""

from __future__ import annotations

import numpy as np

from nncc.errors import NnccError, PlanFormatError
from nncc.ir.graph import TensorInfo
from nncc.ir.splats import is_broadcast
from nncc.kernels.registry import Ctx, by_key
from nncc.plan.plan import Plan
from nncc.plan.subgraph import is_graph

# Constants up to this many bytes are shown to shape functions with their values (shape
# arithmetic reads them: Reshape's target, Slice's bounds); larger ones by dtype and shape.
VALUE_BYTES = 1 << 16


def check_plan_shapes(plan: Plan) -> None:
    """Raise PlanFormatError (bad input) at the first instruction whose declared inputs and
    outputs contradict its kernel's shape function."""
    opsets = plan.options.get("opsets", {})
    for ins in plan.instructions:
        definition = by_key(plan.kernels[ins.kernel])
        if definition is None or _runs_subgraphs(ins.attrs):
            continue  # an unknown kernel is the reader's to report
        label = f"{definition.op_type} node {ins.node!r}" if ins.node else f"{definition.op_type} node"
        ctx = Ctx({k: _attr(v, plan) for k, v in ins.attrs.items()},
                  int(opsets.get(definition.domain, definition.since)), len(ins.outputs), ins.node)
        infos = [None if s < 0 else _info(plan, s) for s in ins.inputs]
        try:
            inferred = list(definition.shape(ctx, *infos))
        except NnccError as exc:
            raise _inconsistent(f"{label}: {exc}") from None
        except Exception:  # noqa: BLE001 - a shape function defeated by odd infos proves nothing
            continue
        for slot, info in zip(ins.outputs, inferred):
            if slot >= 0:
                _check_output(label, plan.slots[slot], info)


def _inconsistent(detail: str) -> PlanFormatError:
    return PlanFormatError(f"the plan's declared shapes contradict its operators: {detail}")


def _info(plan: Plan, slot: int) -> TensorInfo:
    declared = plan.slots[slot]
    value = plan.constants.get(slot)
    if value is not None and (is_broadcast(value) or value.nbytes > VALUE_BYTES):
        value = None
    return TensorInfo(declared.dtype, declared.shape, value, kind=declared.kind)


def _attr(value, plan: Plan):
    if isinstance(value, dict):
        return plan.constants.get(value.get("$tensor"))
    if isinstance(value, list):
        return [_attr(v, plan) for v in value]
    return value


def _runs_subgraphs(attrs: dict) -> bool:
    return any(is_graph(v) or (isinstance(v, list) and any(is_graph(x) for x in v))
               for v in attrs.values() if isinstance(v, (dict, list)))


def _check_output(label: str, declared, inferred: TensorInfo) -> None:
    name = declared.name
    if declared.kind != inferred.kind or declared.kind != "tensor":
        return  # sequences and optionals: their element types are the kernels' to check
    if declared.dtype is not None and inferred.dtype is not None and np.dtype(declared.dtype) != inferred.dtype:
        raise _inconsistent(f"{label}: output {name!r} is declared {declared.dtype}, "
                            f"the operator makes {inferred.dtype}")
    if declared.shape is None or inferred.shape is None:
        return
    fixed = [(d, i) for d, i in zip(declared.shape, inferred.shape) if isinstance(d, int) and isinstance(i, int)]
    if len(declared.shape) != len(inferred.shape) or any(d != i for d, i in fixed):
        shown = TensorInfo(declared.dtype, declared.shape).describe()
        raise _inconsistent(f"{label}: output {name!r} is declared {shown}, "
                            f"the operator makes {inferred.describe()}")
