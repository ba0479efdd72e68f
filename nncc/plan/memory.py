"""Static memory planning: place intermediate buffers in one arena, reusing space by liveness.

Greedy by size (largest first), each buffer takes the lowest 64-byte aligned offset that
does not overlap any buffer alive at the same time, like TFLite's arena planner.
"""

from __future__ import annotations

from nncc.plan.plan import PlanInstruction, Slot

ALIGN = 64


def plan_memory(slots: list[Slot], instructions: list[PlanInstruction], planned: set[int],
                keep_alive: set[int]) -> tuple[dict[int, int], int]:
    """Offsets for the ``planned`` slots and the arena size. ``keep_alive`` slots (graph
    outputs) live until the end."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    end = len(instructions)
    for step, ins in enumerate(instructions):
        for slot in ins.outputs:
            if slot in planned:
                first.setdefault(slot, step)
                last[slot] = max(last.get(slot, step), step)
        for slot in ins.inputs:
            if slot in planned:
                last[slot] = step
    for slot in keep_alive & planned:
        last[slot] = end
    sizes = {s: _nbytes(slots[s]) for s in first}
    order = sorted(first, key=lambda s: (-sizes[s], first[s], s))
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, first, last)
    offsets: dict[int, int] = {}
    peak = 0
    for slot in order:
        size = _aligned(sizes[slot])
        lo, hi = first[slot], last[slot]
        conflicts = sorted((o, s) for o, s, a, b in placed if a <= hi and lo <= b)
        offset = 0
        for o, s in conflicts:
            if offset + size <= o:
                break
            offset = max(offset, o + s)
        offsets[slot] = offset
        placed.append((offset, size, lo, hi))
        peak = max(peak, offset + size)
    return offsets, peak


def _nbytes(slot: Slot) -> int:
    count = 1
    for d in slot.shape or ():
        count *= int(d)
    return count * slot.dtype.itemsize


def _aligned(n: int) -> int:
    return max(ALIGN, (n + ALIGN - 1) // ALIGN * ALIGN)
