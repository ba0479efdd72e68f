"""The native backend: each partition becomes one C entry point, built with the system C
compiler into a shared object that travels in the artifact's CODE section.

``compile`` returns both forms of a partition: the portable instructions (what the numpy
backend would run, kept in every plan so a machine without the ISA, or an untrusted
artifact, still runs) and the C unit that replaces them when the native code may be
loaded. Without a compiler the backend selects nothing and every node stays portable.
``load_unit`` makes a partition one call into its entry point when the plan's native code
was verified and loaded, and its instructions otherwise.
"""

from __future__ import annotations

import re

from nncc.backends.base import Backend, CompiledPartition, Partition
from nncc.backends.unit import Call, Unit, UnitSource
from nncc.ir.graph import Graph, TensorInfo


class NativeBackend(Backend):
    name = "native"
    version = "1"
    maker = "nncc"
    targets = "cpu (generated C, system compiler, BLAS)"
    slow_to_build = True

    def __init__(self, toolchain=None):
        self.toolchain = toolchain

    def partition(self, graph: Graph, infos: dict[str, TensorInfo]) -> dict[int, int | None]:
        """Every node C can be generated for, except reshape-like nodes with no generated
        neighbour: on their own they are free views in the portable plan, and a native
        call would copy."""
        if self.toolchain is None:
            return {}
        from nncc.native.codegen import ALIASES, check

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
        from nncc.native.codegen import check

        return check(node, graph, infos)

    def compile(self, partition: Partition, graph: Graph, infos: dict[str, TensorInfo]) -> CompiledPartition:
        from nncc.native.codegen import generate
        from nncc.native.isa import vector_floats

        portable = super().compile(partition, graph, infos)
        symbol = f"nncc_partition_{partition.index}"
        portable.entry = symbol
        portable.native = generate(partition, graph, infos, symbol, vector_floats(self.toolchain.target))
        return portable

    def load_unit(self, source: UnitSource) -> Unit:
        call = native_call(source)
        if call is None:
            return super().load_unit(source)
        from nncc.runtime.native_step import NativeStep

        step = NativeStep(source.native.function(call.symbol), call, source.partition.entry,
                          pooled=source.native.threads > 1 and source.native.blas,
                          sanitized=source.native.sanitized)
        args = call.args
        return Unit(source.partition.entry, [Call(step, args[:call.n_inputs], args[call.n_inputs:],
                                                  call.symbol, 1, op_type=NATIVE_OP, domain="nncc")],
                    kind="native")


NATIVE_OP = "NativeCall"  # the op type of a native call in the executor's program


def native_call(source: UnitSource):
    """The plan's native call (nncc.plan.plan.NativeCall) for this partition, when its
    native code is loaded; else None."""
    if source.native is None:
        return None
    return next((c for c in source.plan.native if c.partition == source.index), None)


def safe_symbol(name: str) -> bool:
    """Entry names an artifact may ask the loader to resolve: only ours."""
    return re.fullmatch(r"nncc_partition_[0-9]{1,6}", name) is not None
