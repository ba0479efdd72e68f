"""Plan dataclasses: what a compiled model is, independent of how it is stored."""

from __future__ import annotations

import copy
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
class BackendPayload:
    """What one backend stores beside its partitions' portable instructions, made by its
    ``link`` and read back by its ``activate``: ``data`` (the native backend's shared
    object, another backend's bytecode), ``meta`` (JSON the backend describes it with, e.g.
    its table of entry points) and the partitions it implements. ``code``: the data is
    machine code, so it runs only from someone the user trusts (a signed artifact, or
    nncc's own cache), exactly as the trust rules say."""

    backend: str
    partitions: list[int]
    meta: Any
    data: bytes
    code: bool = False


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
    # the portable program's intermediates in bytes, as planned at compile time: a figure for
    # reports and a bound checked on read; the executor plans the arena again for the program
    # it runs (native calls change what is alive at once), so no layout is stored
    arena_bytes: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    fallbacks: list[dict[str, str]] = field(default_factory=list)
    payloads: dict[str, BackendPayload] = field(default_factory=dict)  # by backend name
    seal: ArtifactSeal | None = None  # the artifact's signature, when it was read from a signed one

    @property
    def carries_code(self) -> bool:
        """Whether any backend's payload is machine code (then it is signed and trusted
        like native code always was)."""
        return any(p.code for p in self.payloads.values())

    @property
    def recorded_threads(self) -> int | None:
        """The thread count the plan was compiled for (CompileOptions.threads: low-power
        is 1), or None: the libraries' own count."""
        chosen = self.options.get("threads") if isinstance(self.options, dict) else None
        if isinstance(chosen, int) and not isinstance(chosen, bool) and chosen > 0:
            return chosen
        return None

    def code_partitions(self) -> set[int]:
        """The partitions a code payload implements (they run as one call each, when allowed)."""
        return {i for p in self.payloads.values() if p.code for i in p.partitions}

    def without_code(self) -> "Plan":
        """A copy without its code payloads: every partition of theirs runs its instructions."""
        plan = copy.copy(self)
        plan.payloads = {name: p for name, p in self.payloads.items() if not p.code}
        plan.options = dict(self.options)
        return plan

    def slot_names(self, indices: list[int]) -> list[str]:
        return [self.slots[i].name for i in indices]
