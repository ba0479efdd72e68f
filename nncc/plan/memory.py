"""Static memory planning: place intermediate buffers in one arena, reusing space by liveness.

Greedy by size (largest first), each buffer takes the lowest 64-byte aligned offset that
does not overlap any buffer alive at the same time, like TFLite's arena planner.
"""

from __future__ import annotations

import numpy as np

from nncc.plan.plan import PlanInstruction, Slot
from nncc.ir.splats import compact, is_broadcast, stores_as_splat

ALIGN = 64


def arena_slots(slots: list[Slot], instructions: list[PlanInstruction], writes_out: list[bool],
                constants, outputs) -> set[int]:
    """Slots that live in the arena: static intermediates written by kernels that accept
    preallocated outputs. Graph outputs are excluded: they are handed to the caller."""
    excluded = set(constants) | set(outputs)
    return {
        s for ins, writes in zip(instructions, writes_out) if writes for s in ins.outputs
        if s >= 0 and s not in excluded and _static(slots[s])
    }


def plan_arena(slots: list[Slot], instructions: list[PlanInstruction], writes_out: list[bool],
               op_types: list[str], constants, outputs):
    """The whole arena plan: (offsets, size, in-place concats). The arena holds
    arena_slots and the outputs of in-place Concats, with each Concat's pieces inside it."""
    planned = arena_slots(slots, instructions, writes_out, constants, outputs)
    concats = in_place_concats(slots, instructions, writes_out, planned, op_types,
                               set(constants) | set(outputs))
    planned |= {instructions[step].outputs[0] for step in concats}
    # a kernel that does not write into a given buffer may return views of its inputs
    offsets, size = plan_memory(slots, instructions, planned, set(outputs),
                                [not w and step not in concats for step, w in enumerate(writes_out)],
                                concats)
    return offsets, size, concats


def in_place_concats(slots: list[Slot], instructions: list[PlanInstruction], writes_out: list[bool],
                     planned: set[int], op_types: list[str], excluded: set[int]) -> dict[int, list[tuple[int, int]]]:
    """Concats whose inputs can be written straight into their place in the output, so the
    Concat itself copies nothing: step -> [(input slot, byte offset in the output)].

    That needs the concat axis to cut the output into contiguous pieces (every dimension
    before it is 1, as on the channel axis of a batch-1 NCHW tensor); each input an arena
    intermediate of the output's dtype, written by a kernel whose outputs are all in the
    arena (so it is handed its piece to write into), used as a piece of this Concat only.
    Densenet's growing feature maps nest: a Concat's output is a piece of the next one.
    ``planned`` are the arena slots written by kernels, ``excluded`` graph outputs and
    constants (never in the arena).
    """
    planned = set(planned)
    producer: dict[int, int] = {}
    for step, ins in enumerate(instructions):
        for slot in ins.outputs:
            if slot >= 0:
                producer[slot] = step
    claimed: set[int] = set()
    found: dict[int, list[tuple[int, int]]] = {}
    for step, (ins, op) in enumerate(zip(instructions, op_types)):
        if op != "Concat" or len(ins.outputs) != 1 or len(ins.inputs) < 2:
            continue
        out = slots[ins.outputs[0]]
        if not _static(out) or ins.outputs[0] in excluded:
            continue
        rank = len(out.shape)
        axis = int(ins.attrs.get("axis", 1))
        axis = axis + rank if axis < 0 else axis
        if not 0 <= axis < rank or any(d != 1 for d in out.shape[:axis]):
            continue
        pieces, offset, ok = [], 0, True
        for slot in ins.inputs:
            info = slots[slot] if slot >= 0 else None
            origin = producer.get(slot)
            ok = (info is not None and slot in planned and slot not in claimed and _static(info)
                  and info.dtype == out.dtype and origin is not None
                  and all(s < 0 or s in planned for s in instructions[origin].outputs)
                  and (writes_out[origin] or origin in found)
                  and all(s != slot for s, _ in pieces))
            if not ok:
                break
            pieces.append((slot, offset))
            offset += _nbytes(info)
        if ok and offset == _nbytes(out):
            found[step] = pieces
            claimed.update(slot for slot, _ in pieces)
            planned.add(ins.outputs[0])  # it can be a piece of a later Concat
    return found


def plan_memory(slots: list[Slot], instructions: list[PlanInstruction], planned: set[int],
                keep_alive: set[int], may_alias: list[bool] | None = None,
                concats: dict[int, list[tuple[int, int]]] | None = None) -> tuple[dict[int, int], int]:
    """Offsets for the ``planned`` slots and the arena size.

    ``keep_alive`` slots (graph outputs) live until the end. ``may_alias[i]`` says that
    instruction i may return views of its inputs (a Reshape, a Transpose): then each input
    must stay alive as long as any of the outputs does, or its memory could be reused
    under the view. ``concats`` (from in_place_concats) places each piece of an in-place
    Concat inside the Concat's output, which is then live for as long as any piece is.
    """
    end = len(instructions)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for step, ins in enumerate(instructions):
        for slot in ins.outputs:
            if slot >= 0:
                first.setdefault(slot, step)
                last[slot] = max(last.get(slot, step), step)
        for slot in ins.inputs:
            if slot >= 0:
                last[slot] = max(last.get(slot, step), step)
    for slot in keep_alive:
        last[slot] = end
    if may_alias is not None:
        for step in range(end - 1, -1, -1):
            ins = instructions[step]
            if not may_alias[step]:
                continue
            horizon = max((last.get(o, step) for o in ins.outputs if o >= 0), default=step)
            for slot in ins.inputs:
                if slot >= 0 and last.get(slot, step) < horizon:
                    last[slot] = horizon
    # pieces of in-place Concats: (enclosing slot, byte offset), resolved to the outermost
    inside: dict[int, tuple[int, int]] = {}
    for step, pieces in (concats or {}).items():
        for slot, offset in pieces:
            inside[slot] = (instructions[step].outputs[0], offset)

    def outermost(slot: int) -> tuple[int, int]:
        offset = 0
        while slot in inside:
            slot, at = inside[slot]
            offset += at
        return slot, offset

    for slot in inside:
        root, _ = outermost(slot)
        if slot in first:
            first[root] = min(first.get(root, first[slot]), first[slot])
            last[root] = max(last.get(root, last[slot]), last[slot])
    live = [s for s in planned if s in first and s not in inside]
    sizes = {s: _nbytes(slots[s]) for s in live}
    order = sorted(live, key=lambda s: (-sizes[s], first[s], s))
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, first, last)
    offsets: dict[int, int] = {}
    peak = 0
    for slot in order:
        size = _aligned(sizes[slot])
        lo, hi = first[slot], last[slot]
        conflicts = sorted((o, sz) for o, sz, a, b in placed if a <= hi and lo <= b)
        offset = 0
        for o, sz in conflicts:
            if offset + size <= o:
                break
            offset = max(offset, o + sz)
        offsets[slot] = offset
        placed.append((offset, size, lo, hi))
        peak = max(peak, offset + size)
    for slot in inside:
        root, offset = outermost(slot)
        if root in offsets:
            offsets[slot] = offsets[root] + offset
    return offsets, peak


def _static(slot: Slot) -> bool:
    # strings (object arrays hold references) never live in raw arena memory
    return (slot.dtype is not None and slot.dtype.kind != "O" and slot.shape is not None
            and all(isinstance(d, int) for d in slot.shape))


def _nbytes(slot: Slot) -> int:
    count = 1
    for d in slot.shape or ():
        count *= int(d)
    return count * slot.dtype.itemsize


def _aligned(n: int) -> int:
    return max(ALIGN, (n + ALIGN - 1) // ALIGN * ALIGN)


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    count = 1
    for d in shape:
        count *= int(d)
    buffer = np.empty(count * dtype.itemsize + ALIGN, dtype=np.uint8)
    start = -buffer.ctypes.data % ALIGN
    return buffer[start : start + count * dtype.itemsize].view(dtype).reshape(shape)


def aligned_constant(array: np.ndarray) -> np.ndarray:
    """``array`` itself if it is a splat (see nncc.ir.splats) or C-contiguous and aligned for its
    dtype; otherwise a C-contiguous copy on a 64-byte boundary.

    Constants then have the same layout whether a model was compiled in this process,
    loaded from bytes or memory-mapped, so kernels take the same paths and compute
    bit-identical results: numpy never hands a misaligned array (a view into an ONNX
    file's raw bytes, or into the concatenated inline constants) to BLAS, it runs its own,
    differently rounded loop; and a strided view computes differently from the contiguous
    copy an artifact stores.
    """
    if stores_as_splat(array):
        if array.flags.aligned:
            return array
        return np.broadcast_to(np.array(array[(0,) * array.ndim], dtype=array.dtype), array.shape)
    if is_broadcast(array):
        # a partial broadcast stays one: its distinct values, aligned, viewed to the shape
        return np.broadcast_to(aligned_constant(compact(array)), array.shape)
    if (array.flags.c_contiguous and array.flags.aligned) or array.dtype.hasobject:
        return array  # (object arrays cannot be placed in raw memory; no artifact holds them)
    out = aligned_empty(array.shape, array.dtype)
    out[...] = array
    out.flags.writeable = False
    return out
