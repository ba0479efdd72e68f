"""The native backend: each partition becomes one C entry point, built with the system C
compiler into a shared object that travels as this backend's payload (machine code, so in
the artifact's CODE section, signed and trusted as code).

``compile`` returns both forms of a partition: the portable instructions (what the
portable backend would run, kept in every plan so a machine without the ISA, or an
untrusted artifact, still runs) and the C unit that replaces them when the native code may
be loaded. ``link`` builds every unit into one shared object. Without a compiler the
backend selects nothing and every node stays portable. ``activate`` loads the verified
code (nncc.native.activate); ``load_unit`` makes a partition one call into its entry
point when it was loaded, and its instructions otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from nncc.backends.base import Backend, CompiledPartition, Partition
from nncc.backends.native_options import NAME, NativeOptions
from nncc.backends.unit import Call, Unit, UnitSource
from nncc.errors import PlanFormatError
from nncc.ir.graph import Graph, TensorInfo
from nncc.native.precision import arithmetic, say_if_unavailable
from nncc.native.toolchain import NativeBuildError, find_toolchain, is_sanitized
from nncc.plan.plan import BackendPayload, Plan
from nncc.util.notice import warn

MAX_WORKSPACE = 2**40  # bytes of scratch a native call may ask for
NATIVE_OP = "NativeCall"  # the op type of a native call in the executor's program
# what a native call's inputs may hold: float32, the integer indices a Gather reads, and
# the bool condition of an If (its outputs are float32 only)
INPUT_TYPES = tuple(np.dtype(t) for t in (np.float32, np.int32, np.int64, np.bool_))


@dataclass
class NativeCall:
    """A partition that runs as one C entry point of the payload, in place of its portable
    instructions: ``args`` are the slots whose buffers it receives (the partition's inputs,
    then its outputs), ``workspace`` the bytes of scratch it needs."""

    partition: int
    symbol: str
    args: list[int]
    n_inputs: int
    workspace: int

    def entry(self) -> list:
        return [self.partition, self.symbol, self.args, self.n_inputs, self.workspace]


class NativeBackend(Backend):
    name = NAME
    version = "1"
    maker = "nncc"
    targets = "cpu (generated C, system compiler, BLAS)"
    slow_to_build = True
    payload_is_code = True
    code_noun = "native code"
    options_type = NativeOptions  # the target ISA and how the C compiler runs

    def __init__(self, toolchain=None, precision: str = "f32", objects=None, keep_f32: tuple[str, ...] = ()):
        self.toolchain = toolchain
        self.precision = precision  # of the GEMM by constant weights: the arithmetic (precision.ARITHMETICS)
        self.objects = objects  # where compiled objects are kept and found; None: this process's memory
        self.keep_f32 = keep_f32  # weights whose products stay float32 whatever the precision

    def for_compile(self, options) -> "NativeBackend":
        native = self.own_options(options)
        toolchain = toolchain_for(native)
        say_if_unavailable(options.precision, toolchain is not None)  # once per process: the compile asked for it
        return NativeBackend(toolchain, arithmetic(options.precision, native.target), keep_f32=options.keep_f32)

    def build_tool(self, options) -> dict | None:
        toolchain = toolchain_for(self.own_options(options))
        return None if toolchain is None else toolchain.key()

    def keeping_objects(self, store) -> "NativeBackend":
        return NativeBackend(self.toolchain, self.precision, store, self.keep_f32)

    def compile_facts(self, options) -> dict:
        """A compiler update or another ISA must miss the cache, and so must bfloat16
        arithmetic, named by kind (only when asked for: every float32 compile keeps its token)."""
        facts = {"toolchain": self.build_tool(options)}
        if options.precision != "f32":
            facts["precision"] = options.precision
            facts["arithmetic"] = arithmetic(options.precision, self.own_options(options).target)  # ARITHMETICS
        return facts

    def partition(self, graph: Graph, infos: dict[str, TensorInfo]) -> dict[int, int | None]:
        """Every node C can be generated for, except reshape-like nodes with no generated
        neighbour: on their own they are free views in the portable plan, and a native
        call would copy."""
        if self.toolchain is None:
            return {}
        from nncc.native.codegen import ALIASES, check  # lazy: codegen

        ok = {i for i, node in enumerate(graph.nodes) if check(node, graph, infos) is None}
        chosen = {i for i in ok if graph.nodes[i].op_type not in ALIASES or graph.nodes[i].domain}
        producer = {o: i for i, n in enumerate(graph.nodes) for o in n.outputs if o}
        consumers: dict[str, list[int]] = {}
        for i, n in enumerate(graph.nodes):
            for name in n.inputs:
                consumers.setdefault(name, []).append(i)
        grew = True
        while grew:  # reshape chains between generated nodes join them
            grew = False
            for i in sorted(ok - chosen):
                node = graph.nodes[i]
                near = {producer.get(node.inputs[0])} | set(consumers.get(node.outputs[0], []))
                if near & chosen:
                    chosen.add(i)
                    grew = True
        return {i: None for i in sorted(chosen)}

    def reject_reason(self, node, graph: Graph, infos: dict[str, TensorInfo]) -> str | None:
        if self.toolchain is None:
            return "no C compiler"
        from nncc.native.codegen import ALIASES, check  # lazy: codegen

        why = check(node, graph, infos)
        if why is None and node.op_type in ALIASES and not node.domain:  # the one node partition() leaves
            return "a reshape-like node with no native neighbour: a free view in the portable plan"
        return why

    def crossing_refused(self, name: str, readers, graph: Graph, infos: dict[str, TensorInfo]) -> str | None:
        """Why value ``name`` cannot enter (``readers``: the partition's nodes reading it) or
        leave (no readers) a native partition: its arguments are float32 (a mask stays inside)."""
        from nncc.native.arguments import crossing_refused  # lazy: codegen

        return crossing_refused(name, readers, graph, infos)

    def compile(self, partition: Partition, graph: Graph, infos: dict[str, TensorInfo]) -> CompiledPartition:
        from nncc.native.codegen import generate  # lazy: codegen
        from nncc.native.isa import vector_floats  # lazy: codegen

        portable = super().compile(partition, graph, infos)
        symbol = f"nncc_partition_{partition.index}"
        portable.entry = symbol
        unit = generate(partition, graph, infos, symbol, vector_floats(self.toolchain.target), self.precision,
                        keep_f32=self.keep_f32)
        portable.payload = unit
        portable.constants = dict(unit.constants)  # packed weights: read by native code only
        return portable

    def link(self, plan: Plan, compiled: list[tuple[int, CompiledPartition]],
             slots: dict[str, int]) -> BackendPayload | None:
        """One shared object for all native partitions, linked from an object per
        translation unit (the keys are recorded, so a cache entry knows which objects it was
        built from). A compiler failure keeps the plan portable and is recorded in it, so a
        cached entry does not retry on every run."""
        from nncc.native.build import build  # lazy: codegen
        from nncc.native.codegen import translation_units  # lazy: codegen
        from nncc.util import progress  # lazy: start-up

        units = [(index, part.payload) for index, part in compiled if part.payload is not None]
        if not units:
            return None
        progress.describe(f"building native code for {len(units)} partition(s)")
        try:
            code, objects = build(self.toolchain, translation_units([u for _, u in units]), self.objects)
        except NativeBuildError as exc:
            warn(f"{exc}; running the portable plan")
            plan.options["native_error"] = str(exc)
            return None
        # "blas": whether the code calls BLAS, which must then keep to one thread during a call
        plan.options["native"] = dict(self.toolchain.identity(), objects=objects,
                                      blas=any(u.blas for _, u in units))
        low_attention = [name for _, u in units for name in u.low_attention]
        if low_attention:  # precision auto may keep these float32 too (calibration.low_layers)
            plan.options["bf16_attention"] = low_attention
        calls = [NativeCall(index, unit.symbol, [slots[n] for n in unit.args], unit.n_inputs, unit.workspace)
                 for index, unit in units]
        return BackendPayload(self.name, [c.partition for c in calls], {"calls": [c.entry() for c in calls]},
                              code, code=True)

    def check_payload(self, payload: BackendPayload, plan: Plan) -> None:
        native_calls(payload, plan)

    def check_loadable(self, payload: BackendPayload, plan: Plan, origin: str) -> None:
        """Code built with sanitizers loads only into a process started with their runtime."""
        if is_sanitized(plan.options.get("native")):
            from nncc.native.activate import require_sanitizer_runtime  # lazy: codegen

            require_sanitizer_runtime(origin)

    def activate(self, payload: BackendPayload, plan: Plan, origin: str):
        from nncc.native.activate import load_native  # lazy: start-up (only a plan with native code)

        return load_native(plan, payload, native_calls(payload, plan), origin)

    def load_unit(self, source: UnitSource) -> Unit:
        call = None if source.loaded is None else source.loaded.calls.get(source.index)
        if call is None:
            return super().load_unit(source)
        from nncc.backends.native_step import NativeStep  # lazy: start-up

        library = source.loaded
        step = NativeStep(library.function(call.symbol), call, source.partition.entry,
                          pooled=library.threads > 1 and library.blas, sanitized=library.sanitized,
                          input_types=[source.plan.slots[s].dtype for s in call.args[:call.n_inputs]],
                          scratch_failure=library.scratch_failure)
        args = call.args
        return Unit(source.partition.entry, [Call(step, args[:call.n_inputs], args[call.n_inputs:],
                                                  call.symbol, 1, op_type=NATIVE_OP, domain="nncc")],
                    kind="native")


def toolchain_for(native: NativeOptions):
    """The C compiler the native options ask for (target, sanitize mode, time-out, $CC,
    jobs: the command's resolved settings), or None when there is none."""
    return find_toolchain(native.target, native.sanitize, native.cc_timeout, native.cc, native.cc_jobs)


def native_calls(payload: BackendPayload, plan: Plan) -> dict[int, NativeCall]:
    """The payload's call table, checked: each call names one of the payload's partitions
    once, an entry point of our own naming, and arguments that are that partition's static
    float32 slots (inputs may be int32 or int64 indices, or an If's bool condition, too); outputs are never constants
    or graph inputs. The code itself is checked
    by whoever loads it."""
    meta = payload.meta
    entries = meta.get("calls") if type(meta) is dict and set(meta) == {"calls"} else None
    if type(entries) is not list:
        raise PlanFormatError("the native payload has no call table")
    slots, calls = plan.slots, {}
    inputs = set(plan.inputs)
    for entry in entries:
        if not (type(entry) is list and len(entry) == 5 and type(entry[1]) is str and type(entry[2]) is list
                and all(type(x) is int for x in (entry[0], entry[3], entry[4], *entry[2]))):
            raise PlanFormatError("bad native call entry")
        part, symbol, args, n_inputs, workspace = entry
        if part not in payload.partitions or part in calls or not safe_symbol(symbol):
            raise PlanFormatError(f"bad native call for partition {part}")
        if not all(0 <= s < len(slots) for s in args) or not 0 <= n_inputs <= len(args):
            raise PlanFormatError(f"native call for partition {part} names slots out of range")
        if not 0 <= workspace <= MAX_WORKSPACE:
            raise PlanFormatError("bad native workspace size")
        for i, s in enumerate(args):
            info = slots[s]
            types = INPUT_TYPES if i < n_inputs else (np.float32,)  # integer indices come in, never go out
            if (info.kind != "tensor" or info.dtype not in types or info.shape is None
                    or not all(type(d) is int for d in info.shape)):
                raise PlanFormatError(f"native argument slot {s} is not a static float32 tensor"
                                      + (" (or int32, int64, bool input)" if i < n_inputs else ""))
        if any(s in plan.constants or s in inputs for s in args[n_inputs:]):
            raise PlanFormatError(f"native call for partition {part} writes a constant or an input")
        calls[part] = NativeCall(part, symbol, list(args), n_inputs, workspace)
    return calls


def safe_symbol(name: str) -> bool:
    """Entry names an artifact may ask the loader to resolve: only ours."""
    return re.fullmatch(r"nncc_partition_[0-9]{1,6}", name) is not None
