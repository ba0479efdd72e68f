"""Facts about a compiled plan for `nncc inspect`, as plain JSON-ready data."""

from __future__ import annotations

import re
from collections import Counter

from nncc.plan.format import FORMAT_VERSION, INLINE_LIMIT
from nncc.ir.splats import stores_as_splat
from nncc.plan.plan import Plan


def plan_stage(plan: Plan) -> str:
    """The cache stage a plan was compiled as: a quick plan is marked so; any other is a
    full compile (nncc/preparing/stages.py)."""
    return "quick" if plan.options.get("stage") == "quick" else "optimized"


def describe_plan(plan: Plan, artifact_bytes: int | None = None) -> dict:
    partitions = []
    native = plan.code_partitions()
    for index, part in enumerate(plan.partitions):
        ops = Counter(
            plan.kernels[ins.kernel].split("::")[1]
            for ins in plan.instructions[part.first : part.first + part.count]
        )
        partitions.append({
            "index": index,
            "backend": part.backend,
            "backend_version": part.backend_version,
            "entry": part.entry,
            "native": index in native,  # runs as one call into compiled code, when allowed
            "nodes": part.count,
            "ops": dict(sorted(ops.items())),
        })
    # classified as serialize() stores them: a splat is one element, whatever its shape
    splats = [a for a in plan.constants.values() if stores_as_splat(a)]
    dense = [a for a in plan.constants.values() if not stores_as_splat(a)]
    inline = [a for a in dense if a.nbytes <= INLINE_LIMIT]
    referenced = [a for a in dense if a.nbytes > INLINE_LIMIT]
    return {
        "format_version": FORMAT_VERSION,
        "producer": plan.producer,
        "options": plan.options,
        "stage": plan_stage(plan),
        "inputs": [_slot(plan, s) for s in plan.inputs],
        "outputs": [_slot(plan, s) for s in plan.outputs],
        "instructions": len(plan.instructions),
        "partitions": partitions,
        "fallbacks": plan.fallbacks,
        "fallback_groups": group_fallbacks(plan.fallbacks),
        "native_code_bytes": sum(len(p.data) for p in plan.payloads.values() if p.code),
        "peak_activation_bytes": plan.arena_bytes,
        "dynamic_values": dynamic_values(plan),
        "constants": {
            "inline": {"count": len(inline), "bytes": int(sum(a.nbytes for a in inline))},
            "referenced": {"count": len(referenced), "bytes": int(sum(a.nbytes for a in referenced))},
            "splat": {"count": len(splats), "bytes": int(sum(a.itemsize for a in splats)),
                      "expanded_bytes": int(sum(a.nbytes for a in splats))},
        },
        "artifact_bytes": artifact_bytes,
    }


_VALUE_NAME = re.compile(r"""value (?:'[^']*'|"[^"]*") (?:is |has )?""")


def group_fallbacks(fallbacks: list[dict]) -> list[dict]:
    """Fallback nodes grouped by their reason with the value names taken out, most nodes
    first: a dynamic model has one reason for dozens of nodes ("no static shape")."""
    groups: dict[str, Counter] = {}
    for entry in fallbacks:
        groups.setdefault(_VALUE_NAME.sub("", entry["reason"]), Counter())[entry["op"]] += 1
    return [{"reason": reason, "nodes": sum(ops.values()), "ops": dict(sorted(ops.items()))}
            for reason, ops in sorted(groups.items(), key=lambda item: -sum(item[1].values()))]


def dynamic_values(plan: Plan) -> int:
    """How many values the plan computes without a static shape: they are allocated at run
    time, so the planned arena is not the peak activation memory."""
    fixed = set(plan.inputs) | set(plan.constants)
    return sum(1 for index, slot in enumerate(plan.slots)
               if index not in fixed and (slot.shape is None or not all(isinstance(d, int) for d in slot.shape)))


def _slot(plan: Plan, index: int) -> dict:
    slot = plan.slots[index]
    entry = {
        "name": slot.name,
        "dtype": None if slot.dtype is None else str(slot.dtype),
        "shape": None if slot.shape is None else list(slot.shape),
    }
    if slot.kind != "tensor":  # a sequence or optional: dtype is its elements'
        entry["kind"] = slot.kind
    return entry
