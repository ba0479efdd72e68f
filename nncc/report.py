"""Facts about a compiled plan for `nncc inspect`, as plain JSON-ready data."""

from __future__ import annotations

from collections import Counter

from nncc.plan.format import FORMAT_VERSION, INLINE_LIMIT
from nncc.plan.memory import is_splat
from nncc.plan.plan import Plan


def plan_stage(plan: Plan) -> str:
    """The cache stage a plan was compiled as: a quick plan is marked so; any other is a
    full compile (nncc/cache/stages.py)."""
    return "quick" if plan.options.get("stage") == "quick" else "optimized"


def describe_plan(plan: Plan, artifact_bytes: int | None = None) -> dict:
    partitions = []
    native = {c.partition for c in plan.native} if plan.code is not None else set()
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
            "native": index in native,  # runs as one call into the CODE section, when allowed
            "nodes": part.count,
            "ops": dict(sorted(ops.items())),
        })
    # classified as serialize() stores them: a splat is one element, whatever its shape
    splats = [a for a in plan.constants.values() if is_splat(a)]
    dense = [a for a in plan.constants.values() if not is_splat(a)]
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
        "native_code_bytes": len(plan.code) if plan.native and plan.code is not None else 0,
        "peak_activation_bytes": plan.arena_bytes,
        "constants": {
            "inline": {"count": len(inline), "bytes": int(sum(a.nbytes for a in inline))},
            "referenced": {"count": len(referenced), "bytes": int(sum(a.nbytes for a in referenced))},
            "splat": {"count": len(splats), "bytes": int(sum(a.itemsize for a in splats)),
                      "expanded_bytes": int(sum(a.nbytes for a in splats))},
        },
        "artifact_bytes": artifact_bytes,
    }


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
