"""The compile pipeline: passes, shape inference, partitioning, backend compile, lowering."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from nncc.errors import NnccError
from nncc.ir.graph import Graph, topological_order

PREFERENCES = ("fast-single-answer", "sustained-speed", "low-power")


class OptionError(NnccError):
    exit_code = 2


@dataclass(frozen=True)
class CompileOptions:
    """Everything that changes the compiled result (and so belongs in a cache key)."""

    preference: str = "fast-single-answer"
    opt_level: int = 2
    backends: tuple[str, ...] = ("numpy",)
    plugins: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self):
        if self.preference not in PREFERENCES:
            raise OptionError(f"unknown preference {self.preference!r}; choose from {', '.join(PREFERENCES)}")
        if self.opt_level not in (0, 1, 2):
            raise OptionError(f"optimization level must be 0, 1 or 2, not {self.opt_level}")

    @property
    def threads(self) -> int:
        """BLAS threads at run time: low-power keeps to one core."""
        return 1 if self.preference == "low-power" else 0  # 0: library default

    def as_dict(self) -> dict:
        return {
            "preference": self.preference,
            "opt_level": self.opt_level,
            "backends": list(self.backends),
            "plugins": list(self.plugins),
            "threads": self.threads,
        }


def compile_graph(graph: Graph, options: CompileOptions):
    """Graph -> Plan."""
    from nncc.backends.registry import get_backend, load_plugin
    from nncc.partition import partition_graph
    from nncc.passes.pipeline import run_passes
    from nncc.passes.pack import pack_constants
    from nncc.passes.shape_inference import infer_shapes
    from nncc.plan.lower import lower
    from nncc.util import progress

    for module in options.plugins:
        load_plugin(module)
    backends = [get_backend(name) for name in options.backends if name != "cpu"]
    fallback = get_backend("cpu")
    try:
        topological_order(graph)  # a cyclic graph, or one reading values nobody produces
    except ValueError as exc:  # (also from inside a subgraph), fails before any pass runs
        from nncc.errors import ModelFormatError

        raise ModelFormatError(str(exc)) from None
    progress.describe(f"optimizing {len(graph.nodes)} nodes (-O{options.opt_level})")
    graph = run_passes(graph, options.opt_level)
    if options.preference == "sustained-speed":
        graph = pack_constants(graph)
    try:
        graph = replace(graph, nodes=topological_order(graph))
    except ValueError as exc:
        from nncc.errors import ModelFormatError

        raise ModelFormatError(str(exc)) from None
    progress.describe("inferring shapes")
    infos = infer_shapes(graph)
    progress.describe("partitioning")
    result = partition_graph(graph, infos, backends, fallback)
    owners = {b.name: b for b in backends + [fallback]}
    compiled = []
    for i, p in enumerate(result.partitions):
        progress.describe(f"compiling partition {i + 1}/{len(result.partitions)} ({p.backend})")
        compiled.append(owners[p.backend].compile(p, graph, infos))
    progress.describe("lowering")
    versions = {name: b.version for name, b in owners.items()}
    plan_options = options.as_dict()
    plan_options["opsets"] = dict(sorted(graph.opsets.items()))
    fallbacks = [{"node": n, "op": op, "reason": why} for n, op, why in result.fallbacks]
    return lower(graph, infos, compiled, versions, plan_options, fallbacks)
