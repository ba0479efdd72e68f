"""Plans for the concrete input shapes of a model with dynamic dimensions.

A model exported with dynamic axes (batch, sequence length) compiles to a plan whose
intermediates have symbolic or unknown shapes: the executor cannot place them in its arena,
so every run allocates them, and two-phase kernels never get to prepare. Once the input
shapes are known, though, most shapes follow from them. ``specialize`` re-runs the
kernels' own shape functions over the plan's instructions with the concrete input shapes
(evaluating small shape arithmetic, Shape -> Gather -> Concat -> Reshape, on the way) and
returns a copy of the plan in which every value whose shape and dtype that determines is
static. Values whose shape depends on data (NonZero, a Loop's outputs, a Reshape target
read from an input tensor) stay dynamic and are allocated per run, as before.

``ShapePlans`` keeps one executor per input shape, least recently used first out, with a
bound. A model prepared through the cache looks up, on a shape's first run, whether the
cache already holds the native plan for those sizes, and runs it at once when it does;
when it does not, it asks for that plan to be built in the background. Otherwise a shape
is specialised on its second run (a shape seen once costs nothing extra), and a shape
whose specialisation fails (a shape function refusing these sizes) runs the general plan,
which reports any real error itself.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace

import numpy as np

from nncc.errors import NnccError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import Ctx, by_key
from nncc.plan.plan import Plan, Slot
from nncc.runtime.executor import Executor
from nncc.util.limits import LimitError

SEEN_BEFORE_SPECIALIZING = 2  # runs of one input shape before it gets its own plan


def specialize(plan: Plan, shapes: dict[int, tuple[int, ...]], decode_attr) -> Plan | None:
    """The plan with every value static that the input shapes ``shapes`` (input slot ->
    shape) determine, or None when nothing more becomes static or a shape function refuses
    these sizes. ``decode_attr`` turns a plan attribute into what kernels take (tensor
    references into arrays, subgraphs into graphs): the executor's."""
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
            args = [None if s < 0 else infos.get(s, _declared(slots[s])) for s in ins.inputs]
            names = [slots[s].name if s >= 0 else "" for s in ins.outputs]
            label = f"{definition.op_type} node {ins.node!r}" if ins.node else definition.op_type
            for slot, info in zip(ins.outputs, infer_outputs(definition, ctx, args, label, names)):
                if slot >= 0:
                    infos[slot] = info
    except (NnccError, ValueError, TypeError, IndexError, ArithmeticError):
        return None  # these sizes are refused: the general plan runs, and says so if it is an error
    specialized = [_narrowed(slot, infos.get(i)) for i, slot in enumerate(slots)]
    if all(new is old for new, old in zip(specialized, slots)):
        return None
    return replace(plan, slots=specialized, arena_bytes=0)


def _declared(slot: Slot) -> TensorInfo:
    return TensorInfo(slot.dtype, slot.shape, kind=slot.kind)


def _narrowed(slot: Slot, info: TensorInfo | None) -> Slot:
    """The slot with the inferred static shape, where the plan's own is not static and the
    inference agrees with everything the plan declares (dtype, rank, fixed sizes)."""
    if info is None or slot.kind != "tensor" or info.kind != "tensor" or not info.is_static:
        return slot
    if slot.shape is not None and all(isinstance(d, int) for d in slot.shape):
        return slot
    if slot.dtype is not None and info.dtype != slot.dtype:
        return slot
    if slot.shape is not None and (len(slot.shape) != len(info.shape) or any(
            isinstance(d, int) and d != n for d, n in zip(slot.shape, info.shape))):
        return slot
    return Slot(slot.name, np.dtype(info.dtype), tuple(int(d) for d in info.shape), slot.kind)


def shape_plans(executor, limit: int | None, natives=None) -> "ShapePlans | None":
    """The per-shape plans of a model with dynamic input dimensions, keeping at most
    ``limit`` (the run.shape_plans setting, resolved by the caller), or None (static
    inputs, or ``limit`` None: off). ``natives``: see ShapePlans."""
    plan = executor.plan
    dynamic = [(s, plan.slots[s].name) for s in plan.inputs
               if plan.slots[s].kind == "tensor" and not is_static(plan.slots[s])]
    if not dynamic or not limit:
        return None
    return ShapePlans(executor, dynamic, limit, natives)


def is_static(slot: Slot) -> bool:
    """A slot whose dtype and every dimension are known."""
    return slot.dtype is not None and slot.shape is not None and all(isinstance(d, int) for d in slot.shape)


class ShapePlans:
    """Executors for the concrete input shapes a dynamic model runs with, at most
    ``limit`` kept (least recently used out). ``dynamic``: (slot, name) of each input
    with a dynamic dimension, in the order the shape keys list them."""

    def __init__(self, executor, dynamic: list[tuple[int, str]], limit: int, natives=None):
        self.general = executor
        self.limit = limit
        self._dynamic = dynamic
        self._plans: OrderedDict[tuple, object] = OrderedDict()
        self._seen: OrderedDict[tuple, int] = OrderedDict()  # shapes not specialised yet: runs
        # a shape's native plan through the cache (nncc.preparing.shapes, through nncc.model):
        # ``find(dims)`` -> the executor of the cached plan for those sizes, or None (no
        # compile); ``build(dims, deliver)`` builds it in the background, and deliver
        # takes its executor, if this process is to run it
        self.natives = natives
        self._native_requests = 0
        self._lookups = 0
        self._lock = threading.Lock()  # a background build delivers while runs look up

    def __len__(self) -> int:
        return sum(1 for executor in self._plans.values() if executor is not None)

    def shapes(self) -> list[tuple]:
        """The input shapes that have a plan of their own, least recently used first."""
        return [key for key, executor in self._plans.items() if executor is not None]

    def executor_for(self, feeds) -> object:
        """The executor for these feeds: a specialised one when their shapes have (or now
        get) one, the general one otherwise (and for anything but plain arrays)."""
        key = []
        for _, name in self._dynamic:
            value = feeds.get(name)
            if not isinstance(value, np.ndarray):  # a memory domain's buffer belongs to the general plan
                return self.general
            key.append(value.shape)
        key = tuple(key)
        plans = self._plans
        with self._lock:
            if key in plans:
                plans.move_to_end(key)
                return plans[key] or self.general
            seen = self._seen.pop(key, 0) + 1
            if seen < SEEN_BEFORE_SPECIALIZING:
                self._seen[key] = seen
                if len(self._seen) > 4 * self.limit:  # remember a bounded number of one-off shapes
                    self._seen.popitem(last=False)
        if seen == 1:  # a shape met for the first time: its native plan may be in the cache already
            found = self._find_native(key)
            if found is not None:
                self._keep(key, found)
                return found
            if seen < SEEN_BEFORE_SPECIALIZING:
                return self.general
        executor = self._build(key)
        with self._lock:
            if plans.get(key) is None:  # a background build may have delivered meanwhile
                self._keep(key, executor, locked=True)  # None too: a shape that cannot be specialised is not retried
            executor = plans[key]
        return executor or self.general

    def _keep(self, key: tuple, executor, locked: bool = False) -> None:
        """Keep ``executor`` as the shape's plan, the least recently used out past the bound."""
        if not locked:
            with self._lock:
                return self._keep(key, executor, locked=True)
        self._plans[key] = executor
        self._plans.move_to_end(key)
        self._seen.pop(key, None)
        while len(self._plans) > self.limit:
            self._plans.popitem(last=False)

    def _find_native(self, key: tuple):
        """The executor of the shape's native plan from the cache, or None; when the cache
        has none, its build is asked for now: the entry is what a later process wants."""
        dims = self.dims(key) if self.natives is not None else None
        if dims is None or self._lookups >= 4 * self.limit:  # ever-new shapes: not a lookup per run
            return None
        self._lookups += 1
        found = self.natives.find(dims)
        if found is not None and found.native_partitions:
            return found
        self._request_native(key, dims)
        return None

    def dims(self, key: tuple) -> dict[str, int] | None:
        """The sizes these input shapes give the inputs' symbolic dimension names, or None
        when a dynamic dimension has no name or one name gets two sizes."""
        dims: dict[str, int] = {}
        for (slot, _), shape in zip(self._dynamic, key):
            for dim, size in zip(self.general.plan.slots[slot].shape or (), shape):
                if isinstance(dim, int):
                    continue
                if not isinstance(dim, str) or dims.setdefault(dim, int(size)) != size:
                    return None
        return dims

    def _request_native(self, key: tuple, dims: dict[str, int]) -> None:
        """Ask for the shape's native plan, at most ``limit`` times per model: each is a
        compile, and a workload of ever-new shapes must not turn into a compile per run."""
        if self._native_requests >= self.limit:
            return
        self._native_requests += 1
        self.natives.build(dims, lambda executor: self._deliver(key, executor))

    def _deliver(self, key: tuple, executor) -> None:
        """A shape's native plan is ready: its executor (which holds its native code
        loaded) becomes the shape's plan."""
        if executor is None or not executor.native_partitions:
            return
        self._keep(key, executor)

    def _build(self, key: tuple):
        general = self.general
        shapes = {slot: shape for (slot, _), shape in zip(self._dynamic, key)}
        if any(len(shape) != len(general.plan.slots[slot].shape or shape) for slot, shape in shapes.items()):
            return None  # a wrong rank: the general plan's input check says so
        plan = specialize(general.plan, shapes, general.decode_attr)
        if plan is None:
            return None
        try:
            return Executor(plan, loaded=general.loaded, shared=general)
        except LimitError:  # this shape's arena does not fit: run it the general way
            return None
