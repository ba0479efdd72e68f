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
bound. On a shape's first run:

1. A model prepared through the cache looks up whether the cache already holds the native
   plan for those sizes, and runs it at once when it does.
2. Else, when a leading symbolic dimension is a sample axis at these other sizes
   (nncc.runtime.sample_axis), the plan for one sample runs every count of samples
   (nncc.runtime.sample_loop): found in the cache or asked for once (in the background),
   or, for compile_model, compiled now. A size that recurs runs the faster of the loop and
   its portable plan (timed once each: the loop pays the per-run overhead once per
   sample), and gets its own, batched, native plan in the background, which takes over.
3. Else the shape's native plan is asked for in the background, and the shape is
   specialised (portable) on its second run (a shape seen once costs nothing extra); a
   shape whose specialisation fails (a shape function refusing these sizes) runs the
   general plan, which reports any real error itself.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace

import numpy as np

from nncc.ir.graph import TensorInfo
from nncc.plan.plan import Plan, Slot
from nncc.runtime.executor import Executor
from nncc.runtime.shape_infos import infer_infos
from nncc.util.limits import LimitError

SEEN_BEFORE_SPECIALIZING = 2  # runs of one input shape before it gets its own plan


def specialize(plan: Plan, shapes: dict[int, tuple[int, ...]], decode_attr) -> Plan | None:
    """The plan with every value static that the input shapes ``shapes`` (input slot ->
    shape) determine, or None when nothing more becomes static or a shape function refuses
    these sizes. ``decode_attr`` turns a plan attribute into what kernels take (tensor
    references into arrays, subgraphs into graphs): the executor's."""
    infos = infer_infos(plan, shapes, decode_attr)
    if infos is None:
        return None
    slots = plan.slots
    specialized = [_narrowed(slot, infos.get(i)) for i, slot in enumerate(slots)]
    if all(new is old for new, old in zip(specialized, slots)):
        return None
    return replace(plan, slots=specialized, arena_bytes=0)


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


def _rest_key(dims: dict[str, int], name: str) -> tuple:
    """What a sample loop is kept by: its dimension, and the sizes of all others."""
    return (name, tuple(sorted((k, v) for k, v in dims.items() if k != name)))


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
        # takes its executor, if this process is to run it; ``exact``: whether fixed-size
        # plans are looked up (True) or only compiled for one sample (compile_model);
        # ``builds_native``: whether a plan for one sample is worth asking for at all
        self.natives = natives
        self._native_requests = 0
        self._requested: set[frozenset] = set()  # the sizes whose native plan was asked for
        self._lookups = 0
        self._separations: dict[tuple, object] = {}  # (dim, other sizes) -> Separation or None
        self.rejections: dict[tuple, str] = {}  # (dim, other sizes) -> why it is no sample axis
        self._loops: dict[tuple, object] = {}  # (dim, other sizes) -> the loop (None: on its way)
        self._lock = threading.Lock()  # a background build delivers while runs look up
        # (shape key, executor) of the last run that found its shape's plan kept: the same
        # shapes again are one tuple compare; anything that changes the kept plans drops it
        self._last_hit: tuple | None = None

    def __len__(self) -> int:
        return sum(1 for executor in self._plans.values() if executor is not None)

    def shapes(self) -> list[tuple]:
        """The input shapes that have a plan of their own, least recently used first."""
        return [key for key, executor in self._plans.items() if executor is not None]

    def executors(self) -> list:
        """The plans of those shapes, in the same order."""
        return [executor for executor in self._plans.values() if executor is not None]

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
        hit = self._last_hit
        if hit is not None and hit[0] == key:  # still the most recently used: nothing to reorder
            return hit[1]
        plans = self._plans
        with self._lock:
            if key in plans:
                plans.move_to_end(key)
                executor = plans[key] or self.general
                self._last_hit = (key, executor)
                return executor
            seen = self._seen.pop(key, 0) + 1
            if seen < SEEN_BEFORE_SPECIALIZING:
                self._seen[key] = seen
                if len(self._seen) > 4 * self.limit:  # remember a bounded number of one-off shapes
                    self._seen.popitem(last=False)
        dims = self.dims(key) if self.natives is not None else None
        if seen == 1 and dims is not None and self.natives.exact:
            found = self._find_native(dims)  # the cache may hold this very shape's native plan
            if found is not None:
                self._keep(key, found)
                return found
        loop = self._sample_loop(key, dims)  # or the plan of one sample, for any count of them
        if seen == 1 and dims is not None and self.natives.exact:
            # the entry a later process wants: loaded while it prepares, its first run of this
            # shape then needs no lookup, no sample-axis analysis and no loop; here too, once
            # built, it replaces the loop or the general plan
            self._request_native(key, dims)
        if loop is not None:
            if seen >= SEEN_BEFORE_SPECIALIZING:  # a size that recurs: its own plan, batched, in the background,
                portable = self._build(key)  # and meanwhile the faster of the loop and its portable plan
                if portable is not None:
                    from nncc.runtime.sample_loop import FasterOf  # lazy: start-up (dynamic models only)

                    loop = FasterOf(loop, portable)
                self._keep(key, loop)
                if self.natives.exact:
                    self._request_native(key, dims)
            return loop
        if seen < SEEN_BEFORE_SPECIALIZING:
            return self.general
        executor = self._build(key)
        with self._lock:
            if plans.get(key) is None:  # a background build may have delivered meanwhile
                self._keep(key, executor, locked=True)  # None too: a shape that cannot be specialised is not retried
            executor = plans[key]
        return executor or self.general

    def adopt(self, found: list[tuple[dict[str, int], object]]) -> None:
        """Keep the native plans of shapes an earlier process ran, loaded while the model was
        prepared ((sizes, executor), most recently used first): such a shape's first run
        then finds its plan kept, as a later run does, instead of looking it up then."""
        for dims, executor in reversed(found):
            key = self.key_of(dims)
            if key is not None and executor is not None and executor.native_partitions:
                with self._lock:
                    self._keep(key, executor, locked=True)
                    self._last_hit = (key, executor)  # the most recently used: its first run is one compare

    def key_of(self, dims: dict[str, int]) -> tuple | None:
        """The input shapes (the shape key) these sizes of the symbolic dimensions give, or
        None when they leave a dimension unknown or name one the inputs do not have."""
        key = []
        for slot, _ in self._dynamic:
            shape = self.general.plan.slots[slot].shape
            if shape is None or not all(isinstance(d, int) or d in dims for d in shape):
                return None
            key.append(tuple(d if isinstance(d, int) else dims[d] for d in shape))
        key = tuple(key)
        return key if self.dims(key) == dims else None

    def _keep(self, key: tuple, executor, locked: bool = False) -> None:
        """Keep ``executor`` as the shape's plan, the least recently used out past the bound."""
        if not locked:
            with self._lock:
                return self._keep(key, executor, locked=True)
        self._last_hit = None
        self._plans[key] = executor
        self._plans.move_to_end(key)
        self._seen.pop(key, None)
        while len(self._plans) > self.limit:
            self._plans.popitem(last=False)

    def _find_native(self, dims: dict[str, int]):
        """The executor of the native plan for these sizes from the cache, or None."""
        if self._lookups >= 4 * self.limit:  # ever-new shapes: not a lookup per run
            return None
        self._lookups += 1
        found = self.natives.find(dims)
        return found if found is not None and found.native_partitions else None

    # -- the sample loop: one plan for every batch size ----------------------------------------

    def _candidates(self) -> list[str]:
        from nncc.runtime.sample_axis import batch_candidates  # lazy: start-up (dynamic models only)

        return batch_candidates(self.general.plan, [slot for slot, _ in self._dynamic])

    def _separation(self, dims: dict[str, int], name: str):
        """The Separation of dimension ``name`` at the other sizes of ``dims``, or None;
        analysed once per name and other sizes (nncc.runtime.sample_axis)."""
        if name not in dims:
            return None
        rest = _rest_key(dims, name)
        if rest not in self._separations:
            if len(self._separations) >= 4 * self.limit:
                return None
            from nncc.runtime.sample_axis import Rejected, find_separation  # lazy: start-up (dynamic models only)

            general = self.general
            try:
                found = find_separation(general.plan, lambda n: self._input_shapes(dims | {name: n}), name,
                                        general.decode_attr)
            except Rejected as exc:
                found = None
                self.rejections[rest] = str(exc)
            self._separations[rest] = found
        return self._separations[rest]

    def _input_shapes(self, dims: dict[str, int]) -> dict[int, tuple[int, ...]]:
        slots = self.general.plan.slots
        return {slot: tuple(dims[d] if isinstance(d, str) else d for d in slots[slot].shape)
                for slot, _ in self._dynamic}

    def _sample_loop(self, key: tuple, dims: dict[str, int] | None):
        """The sample loop for these sizes, when one of the batch dimensions separates the
        samples and the plan for one sample is ready; asks for that plan (once) if not."""
        if dims is None or not self.natives.builds_native:
            return None
        from nncc.runtime.sample_loop import SampleLoop  # lazy: start-up (dynamic models only)

        for name in self._candidates():
            separation = self._separation(dims, name)
            if separation is None:
                continue
            rest = _rest_key(dims, name)
            if rest not in self._loops:
                self._loops[rest] = None  # asked for: a background build delivers it
                one = dims | {name: 1}
                if self.natives.exact:  # a lookup in the cache
                    found = self.natives.find(one) if self._lookups < 4 * self.limit else None
                    self._lookups += 1
                else:  # a compile (compile_model): at most ``limit`` of them, like background builds
                    found = self.natives.find(one) if self._native_requests < self.limit else None
                    self._native_requests += 1
                if found is not None and found.native_partitions:
                    self._loops[rest] = SampleLoop(found, separation, self.general)
                elif self.natives.exact and self._native_requests < self.limit:
                    self._native_requests += 1
                    self._requested.add(frozenset(one.items()))
                    self.natives.build(one, lambda executor: self._deliver_loop(rest, separation, executor))
            return self._loops[rest]
        return None

    def _deliver_loop(self, rest: tuple, separation, executor) -> None:
        """The plan for one sample is ready: the loop over it runs every size of these
        other dimensions from now on, the shapes that got a portable plan meanwhile too."""
        if executor is None or not executor.native_partitions:
            return
        from nncc.runtime.sample_loop import FasterOf, SampleLoop  # lazy: start-up (dynamic models only)

        loop = SampleLoop(executor, separation, self.general)
        with self._lock:
            self._last_hit = None
            self._loops[rest] = loop
            for key, kept in list(self._plans.items()):
                dims = self.dims(key)
                if (dims is not None and _rest_key(dims, separation.dim) == rest
                        and (kept is None or not kept.native_partitions)):
                    self._plans[key] = loop if kept is None else FasterOf(loop, kept)  # a size that recurred

    @property
    def sample_axes(self) -> list[str]:
        """The dimensions found to be sample axes so far (at the other sizes run)."""
        return sorted({s.dim for s in self._separations.values() if s is not None})

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
        compile, and a workload of ever-new shapes must not turn into a compile per run; once
        per sizes (the plan for one sample may be the very one)."""
        sizes = frozenset(dims.items())
        if self._native_requests >= self.limit or sizes in self._requested:
            return
        self._native_requests += 1
        self._requested.add(sizes)
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
