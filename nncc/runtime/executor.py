"""Runs a Plan over its slots, with no access to the source model.

Each partition runs as the unit its backend makes of it (nncc.backends.unit): the
executor runs the units' calls in order, knowing nothing else of backends. A call with a
first phase (a kernel's ``prepare``) is prepared here, once, where its inputs' dtypes and
shapes are certain. Intermediates whose calls accept preallocated outputs live in one
arena, allocated once and reused by liveness (nncc.plan.memory), so a steady-state run
allocates nothing for them; graph outputs go into arrays the caller provides, or fresh
ones. One inference runs at a time per executor (calls keep scratch state between runs).
A program of one call (a small model that is one native partition) is run directly, its
arguments found at load, without the general loop over slots.
"""

from __future__ import annotations

import math
import threading
from typing import Mapping

import numpy as np

from nncc.backends.registry import loaded_backend
from nncc.errors import InputError, KernelError, NnccError
from nncc.ir.graph import TensorInfo
from nncc.backends.unit import Call, Unit, instruction_calls, instruction_unit, sources
from nncc.kernels.registry import Ctx
from nncc.plan.memory import aligned_empty, plan_arena
from nncc.plan.plan import Plan
from nncc.plan.subgraph import decode_graph, is_graph
from nncc.runtime.domain import DomainBuffer
from nncc.runtime.expansion import expanded, is_broadcast
from nncc.runtime.feeds import FeedChecker, as_value, check_feeds
from nncc.util.limits import LimitError, check_bytes

# a one-call program's outputs up to this many bytes are made when it is built, not by its
# first run (for a model that runs in microseconds their allocation and first touch count)
FIRST_OUTPUTS_AHEAD = 4 << 20


class Executor:
    def __init__(self, plan: Plan, loaded: dict | None = None, shared: "Executor | None" = None):
        """``loaded``: backend name -> its activated payload (nncc.backends.payloads), whose
        partitions then run the backend's own way (native code: one call each); without
        one, a partition runs its portable instructions.
        ``shared``: an executor of the same program (a plan differing only in its slots'
        shapes, nncc.runtime.specialize) whose units, expanded constants and lock this one
        uses too: the calls may keep scratch state, so both never run at once."""
        self.plan = plan
        self.loaded = loaded or {}
        if shared is not None:
            self.units = shared.units
            program = [call for unit in self.units for call in unit.calls]
        else:
            program = self._program(self.loaded)
        self.buffers = self._arena(program, [c.writes_out for c in program], [c.op_type for c in program])
        self.output_slots = set(plan.outputs)
        self.steps = []
        workspace: dict = {}  # temporary buffers shared by all kernels (one runs at a time)
        release = self._release_plan(program)
        # Lists (sequences) exist only in plans with a kernel that makes them; there, a step
        # whose kernel takes tensors only checks its arguments, so a plan whose kernel ids
        # were changed cannot hand a list to a tensor kernel.
        makes_lists = any(c.op_type in LIST_MAKERS for c in program)
        # values that hold exactly their declared dtype and shape on every run: constants,
        # checked inputs, and the outputs of steps given planned buffers (grown below)
        certain = set(plan.constants) | {s for s in plan.inputs if self.is_static(s)}
        for call, freed in zip(program, release):
            attrs = {k: self.decode_attr(v) for k, v in call.attrs.items()}
            ctx = Ctx(attrs, call.opset, len(call.outputs), call.label)
            ctx.workspace = workspace
            ctx.constant_inputs = frozenset(i for i, s in enumerate(call.inputs) if s in plan.constants)
            outs = tuple(call.outputs)
            fn = call.fn
            if len(self.steps) in self.concats:  # its inputs were written in place
                fn = _concatenated
            elif call.prepare is not None and all(s < 0 or s in certain for s in call.inputs):
                fn = self._prepared(call, ctx) or fn
            # preallocated outputs for this step, when every output can have one
            planned = (call.writes_out or fn is _concatenated) and all(
                s < 0 or s in self.buffers or (s in self.output_slots and self.is_static(s))
                for s in outs)
            # an arena-only step gets the same output arrays every run: built once here
            fixed = (tuple(None if s < 0 else self.buffers[s] for s in outs)
                     if planned and all(s < 0 or s in self.buffers for s in outs) else None)
            if planned:  # its results are stored in (or copied into) those buffers
                certain.update(outs)
                # per output: (slot, its arena view or None, the shape and dtype of a fresh array)
                planned = tuple((s, None if s < 0 else self.buffers.get(s),
                                 None if s < 0 else plan.slots[s].shape, None if s < 0 else plan.slots[s].dtype)
                                for s in outs)
            # the one output needs no bookkeeping beyond storing it (not a graph output)
            single = len(outs) == 1 and outs[0] >= 0 and outs[0] not in self.output_slots
            # slot -1 (an omitted optional input) reads the None kept at the end of env
            tensor_only = makes_lists and call.op_type not in LIST_TAKERS
            self.steps.append((fn, ctx, tuple(s if s >= 0 else -1 for s in call.inputs), outs,
                               call.label, planned, fixed, single, tuple(freed), tensor_only))
        self.native_partitions = sum(1 for unit in self.units if unit.kind == "native")
        self.input_infos = {
            plan.slots[s].name: TensorInfo(plan.slots[s].dtype, plan.slots[s].shape, kind=plan.slots[s].kind)
            for s in plan.inputs
        }
        self.input_slots = [(s, plan.slots[s].name) for s in plan.inputs]
        self._feeds = FeedChecker(self.input_infos)
        self.output_names = plan.slot_names(plan.outputs)
        self._output_names_by_slot = [(s, plan.slots[s].name) for s in plan.outputs]
        self._output_slot = {name: s for s, name in self._output_names_by_slot}
        if shared is not None:
            self.template, self._lock = shared.template, shared._lock
        else:
            self.template: list[np.ndarray | None] = [None] * (len(plan.slots) + 1)
            try:
                dense = expanded(plan.constants)
            except MemoryError:  # within the bound, but not available right now
                raise LimitError("expanding this model's constants needs more memory than is available") from None
            for slot, array in dense.items():
                self.template[slot] = array
            self._lock = threading.Lock()
        self.first_outputs = None  # a one-call program's outputs for its next run, made ahead (_as_one_call)
        self._fed = None  # a one-call native program's feed arguments: (argument index, feed name), ...
        self._one_call = self._as_one_call()

    def _as_one_call(self) -> tuple | None:
        """A program that is one call writing every graph output into a planned buffer (a
        small model that is one native partition), as what a run needs of it, found once:
        (fn, ctx, where each argument comes from: a feed's name or the constant itself,
        the planned outputs, (output name, position in the call's outputs)), else None."""
        if len(self.steps) != 1:
            return None
        fn, ctx, ins, outs, _, planned, _, _, _, tensor_only = self.steps[0]
        if not planned or tensor_only or not all(s in outs for s in self.plan.outputs):
            return None
        feeds = dict(self.input_slots)
        arguments = tuple((feeds[s], None) if s in feeds else (None, self.template[s]) for s in ins)
        results = tuple((name, outs.index(s)) for s, name in self._output_names_by_slot)
        bind = getattr(fn, "bind_constants", None)
        if bind is not None:  # the constants' addresses taken now, not by the first run
            bind({i: constant for i, (name, constant) in enumerate(arguments) if name is None})
            if hasattr(fn, "call_fed") and not fn.sanitized:  # a run hands it only the feeds (_run_fed)
                self._fed = tuple((i, name) for i, (name, _) in enumerate(arguments) if name is not None)
        # small outputs, the first run's, allocated now (and faulted in with the arena,
        # nncc.model.scratch), their addresses taken: the caller owns them after that run,
        # and later runs get fresh ones. Larger ones are left to the run: their allocation is
        # a small part of it, and a plan whose outputs could never be allocated (a run would
        # refuse its inputs first) must still load
        self._make_first_outputs(fn, planned)
        return fn, ctx, arguments, planned, results

    def _make_first_outputs(self, fn, planned) -> None:
        fresh = sum(math.prod(shape) * np.dtype(dtype).itemsize for s, view, shape, dtype in planned
                    if s >= 0 and view is None)
        if fresh <= FIRST_OUTPUTS_AHEAD:
            self.first_outputs = _outputs_for(planned, None)
            bind = getattr(fn, "bind_outputs", None)
            if bind is not None:
                bind(self.first_outputs)

    @property
    def runs_as_one_call(self) -> bool:
        """Whether a run fed plain arrays is one call of native code and nothing else."""
        return self._one_call is not None

    def remake_first_outputs(self) -> None:
        """Make the next run's outputs ahead again (after a run nobody asked for took them)."""
        if self._one_call is not None and self.first_outputs is None:
            fn, _, _, planned, _ = self._one_call
            self._make_first_outputs(fn, planned)

    def _program(self, loaded) -> list[Call]:
        """The calls this executor runs: each partition's unit, made by the backend that
        compiled it (nncc.backends.unit), in the plan's order. ``self.units`` keeps them."""
        plan = self.plan
        ends = [p.first + p.count for p in plan.partitions]
        tiled = [p.first for p in plan.partitions] == [0, *ends[:-1]] and (ends[-1] if ends else 0) == len(
            plan.instructions)
        if not tiled:  # a plan built in memory without partitions: its instructions as they are
            self.units = [Unit("", instruction_calls(plan, plan.instructions))]
        else:
            self.units = [_unit(source) for source in sources(plan, loaded)]
        return [call for unit in self.units for call in unit.calls]

    def _prepared(self, call: Call, ctx: Ctx):
        """The call's first phase, run now: its specialized kernel, or None."""
        slots = self.plan.slots
        infos = [None if s < 0 else TensorInfo(slots[s].dtype, slots[s].shape) for s in call.inputs]
        try:
            return call.prepare(ctx, *infos)
        except NnccError:  # the kernel itself reports it, should the node ever run
            return None

    def is_static(self, slot: int) -> bool:
        """Whether the slot's dtype and every dimension are known ahead of the run."""
        info = self.plan.slots[slot]
        return info.dtype is not None and info.shape is not None and all(isinstance(d, int) for d in info.shape)

    def _arena(self, program, writes_out: list[bool], op_types: list[str]) -> dict[int, np.ndarray]:
        """One aligned block for all planned intermediates, and a view per slot. The plan
        is recomputed here rather than trusted from the file: it is cheap, and a planning
        mistake can then never come from outside. It is made for the program that runs, so
        a native call's inputs and outputs, live at once, never share memory."""
        plan = self.plan
        offsets, size, self.concats = plan_arena(plan.slots, program, writes_out, op_types,
                                                 plan.constants, plan.outputs)
        # checked before anything is allocated: an impossible size is bad input, not a MemoryError
        expand = sum(a.nbytes for a in plan.constants.values() if is_broadcast(a))
        check_bytes(size + expand, f"running this model ({size:,} bytes of intermediates, {expand:,} bytes "
                                   "of expanded constants)")
        try:
            self.arena = aligned_empty((size,), np.uint8)
        except MemoryError:  # within the bound, but not available right now
            raise LimitError(f"this model's {size:,} bytes of intermediates are more than is available") from None
        views = {}
        for slot, offset in offsets.items():
            info = plan.slots[slot]
            nbytes = math.prod(info.shape) * info.dtype.itemsize
            views[slot] = self.arena[offset : offset + nbytes].view(info.dtype).reshape(info.shape)
        return views

    def decode_attr(self, value):
        """A plan attribute as kernels take it: tensor references as arrays, subgraphs as
        Graphs."""
        if isinstance(value, dict):
            if is_graph(value):  # a subgraph, rebuilt for its control-flow kernel to run
                return decode_graph(value, self.plan.constants, self.plan.options.get("opsets", {}),
                                    self.decode_attr)
            return self.plan.constants[value["$tensor"]]
        if isinstance(value, list):
            return [self.decode_attr(v) for v in value]
        return value


    def _release_plan(self, program) -> list[list[int]]:
        keep = set(self.plan.outputs) | set(self.plan.constants)
        last: dict[int, int] = {}
        for step, ins in enumerate(program):
            for s in ins.inputs:
                if s >= 0:
                    last[s] = step
        release: list[list[int]] = [[] for _ in program]
        for slot, step in last.items():
            if slot not in keep:
                release[step].append(slot)
        return release

    def run(self, feeds: Mapping[str, object],
            outputs: Mapping[str, object] | None = None) -> dict[str, np.ndarray]:
        """Run one inference. ``outputs`` maps output names to caller-owned arrays (or
        DomainBuffers) that the results are written into, with no copy where the producing
        kernel writes in place. Every buffer is validated before any kernel runs."""
        if not outputs:
            if self._fed is not None and type(feeds) is dict and self._feeds.matches(feeds):
                with self._lock:  # the shortest path: a small model's run is mostly this Python
                    result = self._run_fed(feeds)
                if result is not None:
                    return result
            arrays = self._feeds.unchanged(feeds)  # the same names, dtypes and shapes as the last run's
            if arrays is None and not any(isinstance(v, DomainBuffer) for v in feeds.values()):
                arrays = self._feeds(feeds)  # plain arrays in, fresh results out
            if arrays is not None:
                with self._lock:
                    if self._one_call is not None:
                        return self._run_one_call(arrays)
                    return self._run(arrays, {})
        outputs = dict(outputs or {})
        fed_buffers = {id(v) for v in feeds.values() if isinstance(v, DomainBuffer)}
        plain_feeds = {name: self._domain_input(name, v) if isinstance(v, DomainBuffer) else v
                       for name, v in feeds.items()}
        arrays = check_feeds(self.input_infos, plain_feeds)
        domain_outputs, adopting = {}, {}
        for name, value in list(outputs.items()):
            if isinstance(value, DomainBuffer):
                target = self._domain_output(name, value, id(value) in fed_buffers)
                if target is None:  # dimensions still unknown: the buffer takes this result's
                    adopting[name] = outputs.pop(name)
                else:
                    outputs[name] = target
                    domain_outputs[name] = value
        targets = self._output_targets(outputs, arrays)
        with self._lock:
            results = self._run(arrays, targets)
        for name, buffer in domain_outputs.items():
            buffer.commit(results[name])
        for name, buffer in adopting.items():
            buffer.copy_from(results[name])
        return results

    # -- memory domains ---------------------------------------------------------------------

    def allocate(self, roles, shape=None, dtype=None) -> DomainBuffer:
        """An executor-managed buffer usable in the given roles of this model only."""
        roles = [tuple(r) for r in roles]
        if not roles:
            raise InputError("a buffer needs at least one role")
        outputs = {self.plan.slots[s].name: self.plan.slots[s] for s in self.plan.outputs}
        infos = []
        for role in roles:
            if len(role) != 2 or role[0] not in ("input", "output"):
                raise InputError(f"bad role {role!r}: expected ('input', NAME) or ('output', NAME)")
            kind, name = role
            info = self.input_infos.get(name) if kind == "input" else outputs.get(name)
            if info is None:
                names = list(self.input_infos) if kind == "input" else list(outputs)
                raise InputError(f"the model has no {kind} {name!r}; its {kind}s are: {', '.join(names)}")
            infos.append((role, info))
        if shape is not None or dtype is not None:  # the caller's request is one more role to agree with
            infos.append((("requested", "buffer"), TensorInfo(
                None if dtype is None else np.dtype(dtype),
                None if shape is None else tuple(None if d is None else int(d) for d in shape))))
        dtypes = {info.dtype for _, info in infos if info.dtype is not None}
        if len(dtypes) > 1:
            raise InputError(f"{_roles(infos)} disagree on the dtype; one buffer has one dtype")
        if not dtypes:
            raise InputError(f"{_roles(infos)}: no dtype is known; pass one")
        ranks = {len(info.shape) for _, info in infos if info.shape is not None}
        if len(ranks) > 1:
            raise InputError(f"{_roles(infos)} disagree on the rank; one buffer has one shape")
        rank = ranks.pop() if ranks else None
        dims = None
        if rank is not None:
            dims = []
            for axis in range(rank):
                known = {info.shape[axis] for _, info in infos
                         if info.shape is not None and isinstance(info.shape[axis], int)}
                if len(known) > 1:
                    raise InputError(f"{_roles(infos)} differ in dimension {axis} "
                                     f"({' vs '.join(map(str, sorted(known)))}); one buffer has one shape")
                dims.append(known.pop() if known else None)
        return DomainBuffer(self, roles, dtypes.pop(), None if dims is None else tuple(dims))

    def _domain_input(self, name: str, buffer: DomainBuffer) -> np.ndarray:
        if not buffer.allows(self, "input", name):
            raise InputError(f"buffer passed as input {name!r} was not allocated for that role of this model")
        array = buffer.current()
        if array is None:
            raise InputError(f"buffer passed as input {name!r} has no contents yet")
        return array

    def _domain_output(self, name: str, buffer: DomainBuffer, also_read: bool) -> np.ndarray | None:
        if not buffer.allows(self, "output", name):
            raise InputError(f"buffer passed as output {name!r} was not allocated for that role of this model")
        slot = self._output_slot[name]
        shape = self.plan.slots[slot].shape if self.is_static(slot) else buffer.shape
        if shape is None:
            return None
        return buffer.target(tuple(shape), also_read)

    def _run_one_call(self, arrays) -> dict[str, np.ndarray]:
        """_run for a program of one call (_as_one_call) fed plain arrays, with no
        caller's buffers: its arguments and fresh outputs straight into the call."""
        fn, ctx, arguments, planned, results = self._one_call
        args = [arrays[name] if name is not None else constant for name, constant in arguments]
        try:
            out = self.first_outputs
            if out is None:
                out = _outputs_for(planned, None)
            else:
                self.first_outputs = None  # the caller's from now on
            result = fn(ctx, *args, out=out)
        except Exception as exc:
            _raise_kernel_failure(self.steps[0][4], exc)
            raise
        if result is not out and not (len(out) == 1 and result is out[0]):  # not written in place (or
            # one output's array returned as it is): stored as the general run stores it
            env, outs, label = self.template.copy(), self.steps[0][3], self.steps[0][4]
            try:
                self._store(env, outs, result, out, {}, label)
            except (ValueError, TypeError) as exc:  # a result that does not fit its planned buffer
                raise KernelError(f"{label} gave a result that does not fit its output: {exc}") from exc
            return {name: env[s] for s, name in self._output_names_by_slot}
        return {name: out[i] for name, i in results}

    def _run_fed(self, feeds: dict) -> dict[str, np.ndarray] | None:
        """_run_one_call for a native call whose constants are bound (``self._fed``), given
        the caller's dict of checked feeds: only the feeds go to the call, no list of
        arguments is built. None when the call declines (the sanitize mode)."""
        fn, _, _, planned, results = self._one_call
        out = self.first_outputs
        if out is None:
            out = _outputs_for(planned, None)
        try:
            if fn.call_fed(self._fed, feeds, out) is None:
                return None
        except Exception as exc:
            _raise_kernel_failure(self.steps[0][4], exc)
            raise
        self.first_outputs = None  # the caller's from now on
        return {name: out[i] for name, i in results}

    def _run(self, arrays, targets) -> dict[str, np.ndarray]:
        env = self.template.copy()
        for slot, name in self.input_slots:
            env[slot] = arrays[name]
        for fn, ctx, ins, outs, label, planned, fixed, single, release, tensor_only in self.steps:
            args = [env[s] for s in ins]
            if tensor_only and any(type(a) is list for a in args):
                raise KernelError(f"{label} was given a sequence, but takes tensors only")
            out = fixed
            try:
                if fixed is not None:
                    result = fn(ctx, *args, out=fixed)
                elif planned:
                    out = _outputs_for(planned, targets)
                    result = fn(ctx, *args, out=out)
                else:
                    result = fn(ctx, *args)
            except Exception as exc:
                _raise_kernel_failure(label, exc)
                raise
            # the common cases first: the kernel wrote into its planned buffer, or returned
            # one fresh array for an intermediate
            if single and (result is out[0] if out is not None else type(result) is np.ndarray):
                env[outs[0]] = result
            elif result is out and out is not None:  # wrote every planned buffer (a native call)
                for slot, value in zip(outs, out):
                    if slot >= 0:
                        env[slot] = value
            else:
                try:
                    self._store(env, outs, result, out, targets, label)
                except (ValueError, TypeError) as exc:  # a result that does not fit its planned buffer
                    raise KernelError(f"{label} gave a result that does not fit its output: {exc}") from exc
            for slot in release:
                env[slot] = None
        return {slots_name: env[s] for s, slots_name in self._output_names_by_slot}

    def _store(self, env, outs, result, out, targets, label) -> None:
        if not isinstance(result, tuple):
            result = (result,)
        for i, (slot, value) in enumerate(zip(outs, result)):
            if slot < 0:
                continue
            if out is not None and out[i] is not None and value is not out[i]:
                if np.shape(value) != out[i].shape:  # copyto would broadcast it silently
                    raise ValueError(f"shape {list(np.shape(value))} where {list(out[i].shape)} was planned")
                np.copyto(out[i], value)  # a kernel that could not write in place
                value = out[i]
            elif slot in targets and value is not targets[slot]:
                if np.shape(value) != targets[slot].shape:  # copyto would broadcast, or fail in numpy's words
                    raise _wrong_buffer(self.plan.slots[slot].name, targets[slot].shape, list(np.shape(value)))
                np.copyto(targets[slot], value)
                value = targets[slot]
            env[slot] = as_value(value)

    def _output_targets(self, outputs: Mapping[str, np.ndarray], arrays) -> dict[int, np.ndarray]:
        """Validate caller-provided output arrays before anything runs: a static output's
        shape exactly; a dynamic one's rank, fixed sizes, and the sizes of symbolic
        dimensions the inputs bind (an output [N, 3] fed an input [N, 3] of [2, 3] is [2, 3])."""
        by_name = self._output_slot
        targets = {}
        bound = None
        for name, array in outputs.items():
            if name not in by_name:
                raise InputError(f"unknown output {name!r}; the model's outputs are: {', '.join(by_name)}")
            info = self.plan.slots[by_name[name]]
            if not isinstance(array, np.ndarray):
                raise InputError(f"output buffer {name!r} must be a numpy array, not {type(array).__name__}")
            if info.dtype is not None and array.dtype != info.dtype:
                raise InputError(f"output buffer {name!r} has dtype {array.dtype}, expected {info.dtype}")
            if self.is_static(by_name[name]) and tuple(array.shape) != tuple(info.shape):
                raise _wrong_buffer(name, array.shape, list(info.shape))
            if not self.is_static(by_name[name]) and info.shape is not None:
                if bound is None:
                    bound = _bound_dims(self.input_infos, arrays)
                expected = [bound.get(d, d) if isinstance(d, str) else d for d in info.shape]
                if len(array.shape) != len(expected) or any(
                        isinstance(e, int) and e != n for e, n in zip(expected, array.shape)):
                    raise _wrong_buffer(name, array.shape, expected)
            if not array.flags.writeable:
                raise InputError(f"output buffer {name!r} is read-only")
            if not array.flags.c_contiguous:
                raise InputError(f"output buffer {name!r} is not C-contiguous")
            targets[by_name[name]] = array
        return targets


# Kernels that can produce a list (a sequence value), and those that may be given one.
LIST_MAKERS = {"SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceErase", "SplitToSequence",
               "SequenceMap", "Optional", "OptionalGetElement", "If", "Loop", "Scan"}
LIST_TAKERS = LIST_MAKERS | {"SequenceAt", "SequenceLength", "ConcatFromSequence", "OptionalHasElement",
                             "Identity"}


def _unit(source):
    """A partition's unit, made by its backend when that backend is loaded in this process
    (nothing is imported because a plan names it); its instructions otherwise."""
    backend = loaded_backend(source.partition.backend)
    return instruction_unit(source) if backend is None else backend.load_unit(source)


def _concatenated(ctx, *inputs, out):
    """An in-place Concat (nncc.plan.memory.in_place_concats): its inputs' producers
    wrote them into their places in ``out`` already."""
    return out[0]


def _roles(infos) -> str:
    """The roles of a buffer with their types, for messages: "output 'h' float32[1, 16]
    and input 'x' float32[1, 8]"."""
    described = [f"{kind} {name!r} {_type(info)}" if kind != "requested" else f"the requested {_type(info)}"
                 for (kind, name), info in infos]
    return ", ".join(described[:-1]) + " and " + described[-1] if len(described) > 1 else described[0]


def _type(info) -> str:
    dtype = "?" if info.dtype is None else str(info.dtype)
    if info.shape is None:
        return f"{dtype}[?]"
    return f"{dtype}[{', '.join('?' if d is None else str(d) for d in info.shape)}]"


def _bound_dims(declared, arrays) -> dict[str, int]:
    """Symbolic dimension name -> the size this run's inputs give it."""
    bound: dict[str, int] = {}
    for name, info in declared.items():
        value = arrays.get(name)
        if info.shape is None or not isinstance(value, np.ndarray) or value.ndim != len(info.shape):
            continue
        for dim, size in zip(info.shape, value.shape):
            if isinstance(dim, str):
                bound.setdefault(dim, int(size))
    return bound


def _wrong_buffer(name: str, shape, expected) -> InputError:
    """A caller's output buffer of the wrong shape. ``expected``: sizes, with the names of
    symbolic dimensions this run does not fix."""
    want = "[" + ", ".join(str(d) for d in expected) + "]"
    return InputError(f"output buffer {name!r} has shape {list(shape)}, but this run's output {name!r} "
                      f"has shape {want}",
                      hint=f"pass an array of shape {want} for {name!r}, or leave it out of outputs= "
                           "to receive a new array")


def _raise_kernel_failure(label: str, exc: Exception) -> None:
    """Raise what a kernel's exception means to the caller of a run, the step's label in
    front; return for one that is a bug in the kernel (a TypeError, an IndexError), which
    the caller then re-raises as it is, with its traceback."""
    if isinstance(exc, LimitError):
        raise LimitError(f"{label}: {exc}", hint=exc.hint) from None
    if isinstance(exc, NnccError):
        raise exc
    if isinstance(exc, (ValueError, FloatingPointError)):  # numpy refusing these values
        raise KernelError(f"{label} failed: {exc}") from exc
    if isinstance(exc, MemoryError):  # numpy refused an allocation before touching it: too big for this machine
        raise LimitError(f"{label} needs more memory than this machine can give") from None


def _outputs_for(planned, targets) -> tuple:
    """A planned step's output arrays: its arena views, the caller's arrays, else fresh
    ones (a graph output the caller owns: never the previous run's)."""
    if not targets:  # the common run: no caller's arrays (a list, not a generator: a tiny model feels it)
        return tuple([None if s < 0 else view if view is not None else np.empty(shape, dtype)
                      for s, view, shape, dtype in planned])
    return tuple(None if s < 0 else view if view is not None else targets[s] if s in targets
                 else np.empty(shape, dtype) for s, view, shape, dtype in planned)
