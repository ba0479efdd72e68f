"""What the kernels' shape functions say of every value of a plan, given its input shapes:
the shapes, and the contents that follow from shapes and constants (the small shape
arithmetic an export writes, Shape -> Gather -> Concat -> Reshape)."""

from __future__ import annotations

from nncc.errors import NnccError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import Ctx, by_key
from nncc.plan.plan import Plan, Slot


def infer_infos(plan: Plan, shapes: dict[int, tuple[int, ...]], decode_attr) -> dict[int, TensorInfo] | None:
    """What the kernels' shape functions say of every slot (slot -> TensorInfo: shape, and
    contents where they follow from shapes and constants) when the inputs have the shapes
    ``shapes``, or None when a shape function refuses these sizes."""
    from nncc.passes.shape_inference import infer_outputs  # lazy: start-up

    slots = plan.slots
    infos: dict[int, TensorInfo] = {slot: TensorInfo.of(array) for slot, array in plan.constants.items()}
    for slot, shape in shapes.items():
        infos[slot] = TensorInfo(slots[slot].dtype, tuple(shape), kind=slots[slot].kind)
    opsets = plan.options.get("opsets", {})
    try:
        for ins in plan.instructions:
            definition = by_key(plan.kernels[ins.kernel])
            if definition is None:
                return None
            opset = int(opsets.get(definition.domain, definition.since))
            ctx = Ctx({k: decode_attr(v) for k, v in ins.attrs.items()}, opset, len(ins.outputs),
                      ins.node)
            args = [None if s < 0 else infos.get(s, declared_info(slots[s])) for s in ins.inputs]
            names = [slots[s].name if s >= 0 else "" for s in ins.outputs]
            label = f"{definition.op_type} node {ins.node!r}" if ins.node else definition.op_type
            for slot, info in zip(ins.outputs, infer_outputs(definition, ctx, args, label, names)):
                if slot >= 0:
                    infos[slot] = info
    except (NnccError, ValueError, TypeError, IndexError, ArithmeticError):
        return None  # these sizes are refused: the general plan runs, and says so if it is an error
    return infos


def declared_info(slot: Slot) -> TensorInfo:
    return TensorInfo(slot.dtype, slot.shape, kind=slot.kind)
