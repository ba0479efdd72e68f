"""The backend plugin interface, after LiteRT's compiler plugins.

A backend is named once (``name``, plus ``aliases`` users may type) and is asked, in the
order the user lists backends, through these hooks:

* ``for_compile(options)``: the backend as configured for one compile (the native backend
  finds its C compiler here); ``compile_facts(options)``: what else changes its output
  (a compiler's version, an option only it reads such as the native precision), merged
  into the options a cache key covers.
* ``options_type``: the frozen record of the options only this backend reads (the native
  backend's: nncc.backends.native_options), or None. The compile options carry one record
  per backend, by its name (``CompileOptions.backend_options``); ``default_options()`` is
  the record when a compile gives none, ``options_from(given, **changes)`` checks one (a
  record or its plain JSON form, with keyword options such as ``target=`` over it, which
  ``option_names()`` lists), and ``own_options(options)`` finds it in a compile's options.
  The cache token sees a record only through ``compile_facts``.
* ``check_options(options)``: why compile options are wrong for this backend (beyond
  its own record, which checks itself), asked of every registered backend when options
  are made.
* ``build_tool(options)``: the key of the tool a slow backend builds with here (a C
  compiler), or None when it has none: what a failed build is recorded against, and
  whether a later, optimized stage can be built at all.
* ``keeping_objects(store)``: the backend, set up to keep and find what it builds (the
  native backend's compiled objects) in ``store``, the cache's object store the caller
  opened; by default the store is not used.
* ``partition(graph, infos)``: the nodes it takes, each with an optional group index.
* ``compile(partition, graph, infos)``: one outlined partition -> ``CompiledPartition``:
  portable instructions naming registered kernels (always kept: they run wherever the
  backend's own form cannot), an entry point, and optionally the backend's own in-memory
  form (``payload``) with extra constants it reads (``constants``).
* ``link(plan, compiled, slots)``: after every partition is lowered into the plan, the
  backend's compiled partitions -> one ``BackendPayload`` stored in the artifact (and so in
  the cache entry): its bytes, JSON ``meta`` describing them, the partitions it covers,
  and whether the bytes are machine code (``payload_is_code``: then they are signed and
  trusted like native code). None: nothing to store (the partitions run portably).
* ``check_payload(payload, plan)``: when a plan is read, its payload's meta checked
  against the plan (a plan is input like any file); raises PlanFormatError.
* ``activate(payload, plan, origin)``: when a plan is loaded and the payload may run (a
  code payload only when trusted; nncc.backends.payloads decides), the loaded form handed
  to ``load_unit`` as ``source.loaded``, or None to run the partitions' instructions.
* ``check_loadable(payload, plan, origin)``: raise when a trusted payload could never be
  loaded in this process (native code built with sanitizers, in a process without their
  runtime), checked before anything is written or loaded.
* ``load_unit(source)``: one partition of a plan about to run -> the executable unit the
  executor runs (nncc.backends.unit).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nncc.backends.unit import Unit, UnitSource, instruction_unit
from nncc.errors import OptionError
from nncc.ir.graph import Graph, Node, TensorInfo
from nncc.kernels.registry import resolve
from nncc.plan.plan import BackendPayload, Plan


@dataclass
class Partition:
    """An outlined sub-DAG assigned to one backend."""

    index: int
    backend: str
    nodes: list[Node]
    inputs: list[str] = field(default_factory=list)  # values read from outside
    outputs: list[str] = field(default_factory=list)  # values used outside, or graph outputs


@dataclass
class Instruction:
    kernel: str  # a registry key such as "ai.onnx::Conv::11"
    inputs: list[str]  # value names; "" for an omitted optional input
    outputs: list[str]
    attrs: dict[str, Any]
    node: str = ""  # the ONNX node's name, for diagnostics


@dataclass
class CompiledPartition:
    """A backend's bytecode for one partition and its call info (the entry point)."""

    partition: int
    backend: str
    entry: str
    instructions: list[Instruction]
    # The backend's own form of the partition, in memory, for its ``link`` (the native
    # backend's C unit): it replaces ``instructions`` at run time when it may.
    payload: Any = None
    # Constants only the payload reads (packed weights), by value name: lowering gives
    # them slots, so they travel with the plan's other constants.
    constants: dict[str, np.ndarray] = field(default_factory=dict)


class Backend:
    """Subclass and register to add a backend. Identity is part of the cache key."""

    name: str = "abstract"
    aliases: tuple[str, ...] = ()  # other names that select this backend
    version: str = "0"
    maker: str = ""
    targets: str = ""
    # A backend whose compile is slow (a C compiler run, say) is deferred by the cache's
    # stages: a miss runs the plan of the other backends at once, and this one's later.
    slow_to_build: bool = False
    # Its payload is machine code: it runs only when trusted (signed, or nncc's own cache).
    payload_is_code: bool = False
    code_noun: str = "compiled code"  # what warnings call its payload
    # The frozen dataclass of the options only this backend reads, or None: it owns none.
    options_type: type | None = None

    def for_compile(self, options) -> "Backend":
        """This backend set up for one compile with ``options`` (nncc.compiler.CompileOptions)."""
        return self

    def check_options(self, options) -> str | None:
        """Why ``options`` are wrong for this backend (one clause), or None."""
        return None

    def default_options(self):
        """This backend's option record when a compile gives none (None: it owns none)."""
        return None if self.options_type is None else self.options_type()

    def option_names(self) -> tuple[str, ...]:
        """The keyword options that are this backend's own (``compile_model(path,
        target=...)``): the fields of its record."""
        return () if self.options_type is None else tuple(f.name for f in dataclasses.fields(self.options_type))

    def options_from(self, given=None, **changes):
        """This backend's option record: ``given`` (a record, its plain JSON form, or None
        for the defaults) with ``changes`` (keyword options it owns) over it, checked."""
        if self.options_type is None:
            if given is None and not changes:
                return None
            raise OptionError(f"backend {self.name!r} takes no options")
        if given is None:
            record = self.default_options()
        elif isinstance(given, self.options_type):
            record = given
        elif isinstance(given, dict):
            unknown = sorted(set(given) - set(self.option_names()))
            if unknown:
                raise OptionError(f"backend {self.name!r} has no option {unknown[0]!r}; "
                                  f"its options: {', '.join(self.option_names())}")
            record = self.options_type(**given)
        else:
            raise OptionError(f"backend {self.name!r} takes its options as a {self.options_type.__name__} "
                              f"or a dict, not {type(given).__name__}")
        return dataclasses.replace(record, **changes) if changes else record

    def own_options(self, options):
        """This backend's record in the compile ``options`` (nncc.compiler.CompileOptions),
        else its default."""
        record = options.options_of(self.name)
        return self.default_options() if record is None else record

    def build_tool(self, options) -> dict[str, Any] | None:
        """The JSON key of the tool this backend builds with for ``options`` here (a C
        compiler's), or None when there is none."""
        return None

    def keeping_objects(self, store) -> "Backend":
        """This backend keeping what it builds in ``store`` (``load(key)`` -> bytes or None,
        ``save(key, bytes)``: nncc.cache.objects.CacheObjects) for one compile."""
        return self

    def compile_facts(self, options) -> dict[str, Any]:
        """JSON facts, beyond the options, that change what this backend compiles."""
        return {}

    def partition(self, graph: Graph, infos: dict[str, TensorInfo]) -> dict[int, int | None]:
        """Map the index (in ``graph.nodes``) of each node this backend takes to a group
        index (None: any group; nodes with different indices never share a partition)."""
        raise NotImplementedError

    def compile(self, partition: Partition, graph: Graph, infos: dict[str, TensorInfo]) -> CompiledPartition:
        """Lower one partition to instructions. The default emits one instruction per node,
        each bound to the registered kernel for the model's opset."""
        instructions = []
        for node in partition.nodes:
            definition = resolve(node.op_type, node.domain, graph.opset(node.domain))
            instructions.append(
                Instruction(definition.key, list(node.inputs), list(node.outputs), dict(node.attrs), node.name)
            )
        return CompiledPartition(partition.index, self.name, f"{self.name}_partition_{partition.index}", instructions)

    def link(self, plan: Plan, compiled: list[tuple[int, CompiledPartition]],
             slots: dict[str, int]) -> BackendPayload | None:
        """The payload of this backend's partitions (``compiled``: (partition index in the
        plan, compiled partition)); ``slots`` maps value names to the plan's slots."""
        return None

    def check_payload(self, payload: BackendPayload, plan: Plan) -> None:
        """Raise PlanFormatError when ``payload`` does not fit ``plan``."""

    def check_loadable(self, payload: BackendPayload, plan: Plan, origin: str) -> None:
        """Raise (an NnccError) when the trusted ``payload`` could never be activated in this
        process; checked without loading it."""

    def activate(self, payload: BackendPayload, plan: Plan, origin: str) -> Any:
        """The payload made ready to run (given to ``load_unit`` as ``source.loaded``), or
        None: the partitions run their instructions."""
        return None

    def load_unit(self, source: UnitSource) -> Unit:
        """The executable unit for one partition of a plan about to run. The default runs
        the partition's instructions, one registered kernel each; override it to run the
        partition another way (see nncc.backends.unit for the contract)."""
        return instruction_unit(source)

    def identity(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "maker": self.maker, "targets": self.targets}
