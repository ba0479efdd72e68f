"""The compile pipeline: passes, shape inference, partitioning, backend compile, lowering."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from nncc.errors import ModelFormatError, OptionError

if TYPE_CHECKING:
    from nncc.ir.graph import Graph

# The one list: nncc.settings checks run.preference (and --preference) against it, so this
# module stays cheap to import (the graph, and numpy with it, load with the first compile).
PREFERENCES = ("fast-single-answer", "sustained-speed", "low-power")
# The arithmetic of native products by constant weights: f32 (exact against the float32
# reference), bf16 (bfloat16 products where the CPU has AVX-512 BF16, else bfloat16 weights:
# nncc.native.precision), or auto (bf16, with the layers that cost the most accuracy kept
# float32 until the outputs are within the tolerance: nncc.preparing.calibration); the same
# one list for nncc.settings and --precision.
PRECISIONS = ("f32", "bf16", "auto")
AUTO_TOLERANCE = 1e-2  # precision auto's tolerance when none is given


@dataclass(frozen=True)
class CompileOptions:
    """Everything that changes the compiled result (and so belongs in a cache key), and
    each backend's own options (``backend_options``: the native backend's target ISA and
    how its C compiler runs, which the command resolves from its settings), which only
    that backend reads and which reach the cache key through its ``compile_facts``."""

    preference: str = "fast-single-answer"
    opt_level: int = 2
    backends: tuple[str, ...] = ("native", "numpy")
    plugins: tuple[str, ...] = field(default_factory=tuple)
    dims: tuple[tuple[str, int], ...] = ()  # symbolic input dimensions fixed to a size (a dict works too)
    precision: str = "f32"  # PRECISIONS: bf16 changes native code, so the native backend's facts name it
    # the largest relative deviation from float32 an output may have (nncc.preparing.calibration)
    tolerance: float | None = None
    calibration: str | None = None  # a folder of .npz feeds the deviation is measured on; None: random inputs
    keep_f32: tuple[str, ...] = ()  # weights whose products stay float32 (what precision auto chose)
    # each backend's own option record by the backend's name, sorted (a dict works too, and
    # a record's plain JSON form): nncc.backends.base.Backend.options_from checks it
    backend_options: tuple[tuple[str, object], ...] = ()

    def __post_init__(self):
        from nncc.backends.registry import registered_backends  # lazy: start-up

        pairs = self.dims.items() if isinstance(self.dims, dict) else self.dims
        object.__setattr__(self, "dims", tuple(sorted((str(k), v) for k, v in pairs)))
        for name, size in self.dims:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise OptionError(f"dimension {name!r} must be a non-negative integer, not {size!r}")

        if self.preference not in PREFERENCES:
            raise OptionError(f"unknown preference {self.preference!r}; choose from {', '.join(PREFERENCES)}")
        if self.precision not in PRECISIONS:
            raise OptionError(f"unknown precision {self.precision!r}; choose from {', '.join(PRECISIONS)}")
        tolerance = self.tolerance
        if tolerance is not None and (isinstance(tolerance, bool) or not isinstance(tolerance, (int, float))
                                      or not tolerance >= 0 or tolerance == float("inf")):
            raise OptionError(f"the tolerance must be a finite number of at least 0, not {tolerance!r}")
        object.__setattr__(self, "keep_f32", tuple(sorted(self.keep_f32)))
        if self.calibration is not None:
            calibration_files(self.calibration)  # an empty or missing folder is bad input, now
        if self.opt_level not in (0, 1, 2):
            raise OptionError(f"optimization level must be 0, 1 or 2, not {self.opt_level}")
        object.__setattr__(self, "backend_options", backend_records(self.backend_options, self.plugins))
        for backend in registered_backends():
            problem = backend.check_options(self)
            if problem:
                raise OptionError(problem)

    @classmethod
    def from_keywords(cls, keywords: dict, resolved=None) -> "CompileOptions":
        """The options keyword options name, as the public API takes them: this record's
        fields, and each backend's own options by their names (``target=``: the native
        backend's), set in that backend's record. A backend given no record gets the one
        ``resolved()`` returns for it (the command's settings, resolved only when a record
        is missing), else its default. A keyword nobody takes is bad input."""
        from nncc.backends.registry import load_plugin, registered_backends  # lazy: start-up

        names = {f.name for f in dataclasses.fields(cls)}
        own = {k: v for k, v in keywords.items() if k in names}
        rest = {k: v for k, v in keywords.items() if k not in names}
        records = dict(backend_records(own.pop("backend_options", ()), own.get("plugins", ())))
        if rest:  # a plugin's backend may own them
            for module in own.get("plugins", ()):
                load_plugin(module)
        settled, taken = None, set()
        for backend in registered_backends():
            if backend.options_type is None:
                continue
            mine = {k: rest[k] for k in backend.option_names() if k in rest}  # each owner of a name takes it
            taken.update(mine)
            given = records.get(backend.name)
            if given is None:
                if settled is None:
                    settled = dict(backend_records(resolved() if resolved is not None else ()))
                given = settled.get(backend.name)
            records[backend.name] = backend.options_from(given, **mine)
        unknown = sorted(set(rest) - taken)
        if unknown:
            raise OptionError(f"unknown compile option {unknown[0]!r}")
        return cls(**own, backend_options=records)

    def options_of(self, backend: str):
        """The option record of the backend named ``backend``, or None when none was given."""
        return dict(self.backend_options).get(backend)

    @property
    def threads(self) -> int:
        """BLAS threads at run time: low-power keeps to one core."""
        return 1 if self.preference == "low-power" else 0  # 0: library default

    def as_dict(self) -> dict:
        options = {
            "preference": self.preference,
            "opt_level": self.opt_level,
            "backends": list(self.backends),
            "plugins": list(self.plugins),
            "threads": self.threads,
        }
        if self.dims:  # only when given: the tokens of every other compile stay as they were
            options["dims"] = dict(self.dims)
        if self.tolerance is not None:  # a compile over it fails, and auto's choice depends on it
            options["tolerance"] = float(self.tolerance)
        if self.calibration is not None:  # the feeds by content: other feeds, another measure
            options["calibration"] = calibration_digest(self.calibration)
        if self.keep_f32:
            options["keep_f32"] = list(self.keep_f32)
        from nncc.backends.registry import loaded_backend  # lazy: start-up

        for name in self.backends:  # what else changes a backend's output (a compiler, its own options)
            backend = loaded_backend(name)
            if backend is not None:
                options.update(backend.compile_facts(self))
        return options


def backend_records(given, plugins=()) -> tuple[tuple[str, object], ...]:
    """Backends' option records (a dict, or (name, record) pairs) by each backend's own
    name, sorted, each checked by its backend: a record, or its plain JSON form. A name no
    backend has is bad input (the ``plugins`` modules are loaded to look for it)."""
    from nncc.backends.registry import get_backend, load_plugin, loaded_backend  # lazy: start-up

    records = {}
    for pair in given.items() if isinstance(given, dict) else given:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[0], str)):
            raise OptionError(f"backend options are (backend name, options) pairs, not {pair!r}")
        name, record = pair
        backend = loaded_backend(name)
        if backend is None:
            for module in plugins:
                load_plugin(module)
            backend = get_backend(name)
        records[backend.name] = backend.options_from(record)
    return tuple(sorted(records.items(), key=lambda item: item[0]))


def calibration_files(folder: str) -> list[str]:
    """The .npz files of a calibration folder, sorted; none, or no folder, is bad input."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".npz"))
    except OSError as exc:
        raise OptionError(f"cannot read the calibration folder {folder}: {exc.strerror or exc}") from None
    if not names:
        raise OptionError(f"the calibration folder {folder} holds no .npz feeds")
    return [os.path.join(folder, n) for n in names]


def calibration_digest(folder: str) -> str:
    """The calibration feeds' names and bytes, hashed: what a cache token needs of them."""
    digest = hashlib.sha256()
    for path in calibration_files(folder):
        with open(path, "rb") as f:
            data = f.read()
        digest.update(f"{os.path.basename(path)}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def compile_graph(graph: Graph, options: CompileOptions, objects=None):
    """Graph -> Plan. ``objects``: where the backends keep and find what they build (the
    open cache's object store, nncc.cache.objects.CacheObjects); None: this process's
    memory."""
    from nncc.backends.registry import get_backend, load_plugin, portable_backend  # lazy: start-up
    from nncc.ir.graph import topological_order  # lazy: start-up
    from nncc.partition import partition_graph  # lazy: start-up
    from nncc.passes.pipeline import run_passes  # lazy: start-up
    from nncc.passes.pack import pack_constants  # lazy: start-up
    from nncc.passes.shape_inference import infer_shapes  # lazy: start-up
    from nncc.passes.validate import validate_graph  # lazy: start-up
    from nncc.plan.lower import lower  # lazy: start-up
    from nncc.util import progress  # lazy: start-up

    for module in options.plugins:
        load_plugin(module)
    if options.dims:
        from nncc.ir.dims import specialize  # lazy: start-up

        graph = specialize(graph, dict(options.dims))
    fallback = portable_backend()
    backends = list({id(b): b.for_compile(options) for b in map(get_backend, options.backends)}.values())
    if objects is not None:
        backends = [b.keeping_objects(objects) for b in backends]
    try:
        topological_order(graph)  # a cyclic graph, or one reading values nobody produces
    except ValueError as exc:  # (also from inside a subgraph), fails before any pass runs
        raise ModelFormatError(str(exc)) from None
    progress.describe(f"optimizing {len(graph.nodes)} nodes (-O{options.opt_level})")
    validate_graph(graph)  # a cycle, a missing value, a required input left empty: bad input, before any pass
    graph = run_passes(graph, options.opt_level)
    if options.preference == "sustained-speed":
        graph = pack_constants(graph)
    graph = replace(graph, nodes=topological_order(graph))
    progress.describe("inferring shapes")
    infos = infer_shapes(graph)
    progress.describe("partitioning")
    result = partition_graph(graph, infos, backends, fallback)
    owners = {b.name: b for b in [fallback, *backends]}
    compiled = []
    for i, p in enumerate(result.partitions):
        progress.describe(f"compiling partition {i + 1}/{len(result.partitions)} ({p.backend})")
        compiled.append(owners[p.backend].compile(p, graph, infos))
    progress.describe("lowering")
    versions = {name: b.version for name, b in owners.items()}
    plan_options = options.as_dict()
    plan_options["opsets"] = dict(sorted(graph.opsets.items()))
    fallbacks = [{"node": n, "op": op, "reason": why} for n, op, why in result.fallbacks]
    plan, slots = lower(graph, infos, compiled, versions, plan_options, fallbacks)
    for name, backend in owners.items():  # each backend's payload, after every partition is lowered
        mine = [(i, part) for i, part in enumerate(compiled) if part.backend == name]
        payload = backend.link(plan, mine, slots) if mine else None
        if payload is not None:
            plan.payloads[name] = payload
    return plan
