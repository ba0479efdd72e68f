"""MatMul and Gemm, and nncc's fused forms with an activation: nncc's packed GEMM when the
weights are constant (gemm_gen), else nn_gemm over the operands (matmul_gen)."""

from __future__ import annotations

from nncc.native import gemm_gen
from nncc.native.activations import CODES
from nncc.native.graph_query import GEMM_OPS, MATMUL_OPS
from nncc.native.ops.entry import NativeOp


def _activation_refused(node, graph, infos) -> str | None:
    """An activation neither nn_act nor (for constant weights) the packed GEMM applies."""
    if node.attrs.get("activation", "") not in CODES and not gemm_gen.takes(node, graph, infos):
        return f"activation {node.attrs.get('activation')!r}"
    return None


class MatMul(NativeOp):
    ops = frozenset(MATMUL_OPS)

    def refuse(self, node, graph, infos) -> str | None:
        why = _activation_refused(node, graph, infos)
        if why is not None:
            return why
        a, b = (infos[n].shape for n in node.inputs[:2])
        if len(a) < 2 or len(b) < 2:
            return "MatMul of a vector"
        if len(node.inputs) > 2 and node.inputs[2] and len(infos[node.inputs[2]].shape) > 1:
            return "bias of rank > 1"
        return None

    def render(self, writer, node, plan) -> None:
        writer.matmul(node)


class Gemm(NativeOp):
    ops = frozenset(GEMM_OPS)

    def refuse(self, node, graph, infos) -> str | None:
        return _activation_refused(node, graph, infos)

    def render(self, writer, node, plan) -> None:
        writer.gemm(node)


MATMUL = MatMul()
GEMM = Gemm()
