"""The run-time batch of an exported library.

A library's code is compiled for fixed sizes. One symbolic dimension may still stay open:
a batch that separates the samples (nncc.runtime.sample_axis proves it: each batched
input and output has one axis that scales with the batch, with only size-1 axes before it,
so each sample's part of a buffer is one contiguous chunk). The library is then the plan
compiled for one sample, and its C API runs any count of samples over it, one chunk after
another. Every other symbolic dimension must be fixed with --dim.
"""

from __future__ import annotations

from dataclasses import dataclass

from nncc.export.standalone import NotExportable
from nncc.runtime.sample_axis import Rejected, describe_sample_axes, find_separation, plain_attr


@dataclass(frozen=True)
class Batch:
    """``dim``: the batch's name; ``inputs`` and ``outputs``: tensor name -> the axis
    that scales with the batch (None: the tensor is the same for every sample)."""

    dim: str
    inputs: dict[str, int | None]
    outputs: dict[str, int | None]


def symbolic_dims(plan) -> list[str]:
    """The names of the inputs' symbolic dimensions; NotExportable for an input whose rank
    or a dimension has no name (nothing can fix it)."""
    names = []
    for slot in plan.inputs:
        info = plan.slots[slot]
        if info.shape is None or any(d is None for d in info.shape):
            raise NotExportable(f"input {info.name!r} has an unknown rank or an unnamed dimension: an exported "
                                "library needs every size but a batch's")
        names += [d for d in info.shape if type(d) is not int and d not in names]
    return sorted(names)


def find_batch(plan) -> Batch | None:
    """The batch ``plan`` (compiled with the sizes --dim fixed) leaves open: None when every
    size is fixed; NotExportable when a symbolic dimension is not one batch axis."""
    names = symbolic_dims(plan)
    if not names:
        return None
    if len(names) > 1:
        axes = [d for d, found in describe_sample_axes(plan).items() if found["sample_axis"]]
        stays = axes if len(axes) == 1 else []  # the one batch that may stay open
        keep = f" ({stays[0]} may stay: it is a batch axis)" if stays else ""
        fix = [d for d in names if d not in stays]
        raise NotExportable(f"symbolic dimension(s) {', '.join(fix)} must be fixed with --dim NAME=SIZE: an exported "
                            f"library takes only one size at run time, a batch of samples{keep}")
    dim = names[0]
    slots = [s for s in plan.inputs if plan.slots[s].kind == "tensor"]

    def shapes_at(n):
        return {s: tuple(n if d == dim else d for d in plan.slots[s].shape) for s in slots}

    try:
        found = find_separation(plan, shapes_at, dim, lambda value: plain_attr(plan, value))
    except Rejected as exc:
        raise NotExportable(f"symbolic dimension {dim} is not a batch of independent samples ({exc}): fix it "
                            f"with --dim {dim}=SIZE") from None
    name = {slot: plan.slots[slot].name for slot in (*found.inputs, *found.outputs)}
    return Batch(dim, {name[s]: axis for s, axis in found.inputs.items()},
                 {name[s]: axis for s, axis in found.outputs.items()})
