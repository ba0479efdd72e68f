"""Gemm -> inference BatchNormalization folded into the Gemm (how torch's TorchScript exporter
writes a Linear layer followed by BatchNorm1d, the tabular models' usual block).

With B constant and BN's four parameters constant, ``s = scale / sqrt(var + eps)`` scales B's
output columns and the bias becomes ``(beta * C - mean) * s + bias``: one product with its
bias in the epilogue instead of a product and a separate pass over its output (which a
small model's run pays for in time and, on a process's first run, in code and data its
caches no longer hold). The Relu that usually follows then fuses with the Gemm."""

from __future__ import annotations

import numpy as np

from nncc.ir.graph import Graph, Node
from nncc.passes.fusion import Rewriter, bn_foldable


def _bias(c: np.ndarray | None, n: int) -> np.ndarray | None:
    """The Gemm's C as a row of ``n`` values (a scalar or a row broadcast along the rows),
    else None (a C that varies by row is left alone)."""
    if c is None:
        return np.zeros(n)
    if c.dtype.kind != "f" or c.ndim > 2 or (c.ndim == 2 and c.shape[0] != 1):
        return None
    if c.size == 1:
        return np.full(n, float(c.reshape(-1)[0]))
    return c.reshape(-1).astype(np.float64) if c.shape[-1] == n else None


def fold_batchnorm_into_gemm(graph: Graph) -> Graph:
    """Gemm (constant B, optional constant C) -> BatchNormalization (inference mode, its
    parameters constant, the Gemm output read only by the BN) becomes one Gemm with B's
    output columns scaled by ``s`` and ``C' = (beta * C - mean) * s + bias``, beta 1."""
    rw = Rewriter(graph)
    for gemm in graph.nodes:
        if gemm.op_type != "Gemm" or gemm.domain != "" or len(gemm.outputs) != 1 or len(gemm.inputs) < 2:
            continue
        bn = rw.sole_consumer(gemm.outputs[0])
        if bn is None or bn.op_type != "BatchNormalization" or bn.domain != "" or bn.inputs[0] != gemm.outputs[0]:
            continue
        if not bn_foldable(graph, bn, rw):
            continue
        b = rw.constant(gemm.inputs[1])
        has_c = len(gemm.inputs) > 2 and bool(gemm.inputs[2])
        c = rw.constant(gemm.inputs[2]) if has_c else None
        if b is None or b.dtype.kind != "f" or b.ndim != 2 or (has_c and c is None):
            continue
        trans_b = int(gemm.attrs.get("transB", 0))
        n = b.shape[0] if trans_b else b.shape[1]
        params = [rw.constant(name) for name in bn.inputs[1:5]]
        row = _bias(c, n)
        if row is None or n == 0 or any(p is None or p.dtype.kind != "f" or p.size != n for p in params):
            continue
        scale, shift, mean, var = (p.reshape(-1).astype(np.float64) for p in params)
        factor = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
        beta = float(gemm.attrs.get("beta", 1.0))
        new_b = b * (factor[:, None] if trans_b else factor[None, :]).astype(b.dtype)
        new_c = ((beta * row - mean) * factor + shift).astype(b.dtype)
        for array in (new_b, new_c):
            array.flags.writeable = False
        stem = bn.outputs[0]
        b_name = rw.add_initializer(f"{stem}/folded_B", new_b)
        c_name = rw.add_initializer(f"{stem}/folded_C", new_c)
        attrs = dict(gemm.attrs, beta=1.0)
        fused = Node("Gemm", [gemm.inputs[0], b_name, c_name], [bn.outputs[0]], attrs, "", gemm.name or bn.name)
        rw.fuse(gemm, bn, fused)
    return rw.result()
