"""Plan dataclasses: what a compiled model is, independent of how it is stored."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

Dim = int | str | None


@dataclass
class Slot:
    """A buffer slot: one value of the program."""

    name: str
    dtype: np.dtype | None
    shape: tuple[Dim, ...] | None
    kind: str = "tensor"  # or a sequence or optional (see nncc.ir.graph.KINDS)


@dataclass
class PlanInstruction:
    kernel: int  # index into Plan.kernels
    inputs: list[int]  # slot indices; -1 for an omitted optional input
    outputs: list[int]  # slot indices; -1 for an omitted optional output
    attrs: dict[str, Any]  # JSON values; tensors as {"$tensor": slot of a constant}
    node: str = ""


@dataclass
class PartitionInfo:
    """Call info of one partition: which backend's entry point runs which instructions."""

    backend: str
    backend_version: str
    entry: str
    first: int  # first instruction
    count: int


@dataclass
class NativeCall:
    """A partition that runs as one C entry point of the plan's native code, in place of
    its portable instructions: ``args`` are the slots whose buffers it receives (the
    partition's inputs, then its outputs), ``workspace`` the bytes of scratch it needs."""

    partition: int
    symbol: str
    args: list[int]
    n_inputs: int
    workspace: int


@dataclass(frozen=True)
class ArtifactSeal:
    """An artifact's signature as read (not yet checked): which key signed it, the MAC,
    and the message the MAC must cover, made from the artifact's own section table."""

    scheme: int
    fingerprint: bytes
    mac: bytes
    message: bytes


@dataclass
class Plan:
    producer: str
    kernels: list[str]
    slots: list[Slot]
    inputs: list[int]
    outputs: list[int]
    constants: dict[int, np.ndarray]
    instructions: list[PlanInstruction]
    partitions: list[PartitionInfo]
    arena: dict[int, int] = field(default_factory=dict)  # slot -> byte offset in the arena
    arena_bytes: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    fallbacks: list[dict[str, str]] = field(default_factory=list)
    native: list[NativeCall] = field(default_factory=list)
    code: bytes | None = None  # the shared object the native calls live in
    seal: ArtifactSeal | None = None  # the artifact's signature, when it was read from a signed one

    def slot_names(self, indices: list[int]) -> list[str]:
        return [self.slots[i].name for i in indices]
