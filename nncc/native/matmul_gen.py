"""The partition writer's MatMul and Gemm steps when nncc's packed GEMM does not take the
node (weights that are not constant): nn_gemm calls over the operands as they are, with a
bias copied in first and the fused activation applied after.

A mixin of the partition writer (nncc/native/codegen.py): it uses its ``step``, ``ptr``
and ``shape`` members and the convolution steps' ``_activation``.
"""

from __future__ import annotations

import math

from nncc.ir.graph import Node
from nncc.native import gemm_gen
from nncc.native.c_literal import c_float
from nncc.native.graph_query import batch_strides

class MatmulSteps:
    """Steps of MatMul and Gemm over nn_gemm."""

    def matmul(self, node: Node) -> None:
        if gemm_gen.emit_matmul(self, node):  # by constant weights: nncc's packed GEMM
            return
        a, b = node.inputs[:2]
        bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
        sa, sb, so = self.shape(a), self.shape(b), self.shape(node.outputs[0])
        m, k = sa[-2], sa[-1]
        nn = sb[-1]
        y = self.ptr(node.outputs[0])
        lines = []
        if len(sb) == 2:  # weights: fold the batch of A into M
            rows = math.prod(so[:-1])
            if bias:
                lines.append(f"for (int64_t r = 0; r < {rows}; r++) memcpy({y} + r * {nn}, {self.ptr(bias)}, "
                             f"{nn} * sizeof(float));")
            lines.append(f"nn_gemm(0, 0, {rows}, {nn}, {k}, 1.0f, {self.ptr(a)}, {k}, {self.ptr(b)}, {nn}, "
                         f"{'1.0f' if bias else '0.0f'}, {y}, {nn});")
        else:
            batch = so[:-2]
            ea = batch_strides(sa[:-2], batch, m * k)
            eb = batch_strides(sb[:-2], batch, k * nn)
            total = math.prod(batch)
            lines.append(f"for (int64_t t = 0; t < {total}; t++) {{")
            lines.append("  int64_t rem = t, oa = 0, ob = 0;")
            for d in range(len(batch) - 1, -1, -1):
                lines.append(f"  {{ int64_t i = rem % {batch[d]}; rem /= {batch[d]}; oa += i * {ea[d]}; "
                             f"ob += i * {eb[d]}; }}")
            if bias:
                lines.append(f"  for (int64_t r = 0; r < {m}; r++) memcpy({y} + t * {m * nn} + r * {nn}, "
                             f"{self.ptr(bias)}, {nn} * sizeof(float));")
            lines.append(f"  nn_gemm(0, 0, {m}, {nn}, {k}, 1.0f, {self.ptr(a)} + oa, {k}, {self.ptr(b)} + ob, "
                         f"{nn}, {'1.0f' if bias else '0.0f'}, {y} + t * {m * nn}, {nn});")
            lines.append("}")
        code, p0, p1 = self._activation(node.attrs)
        if code:
            lines.append(f"nn_epilogue({y}, 0, 0, 1, {math.prod(so)}, {code}, {c_float(p0)}, {c_float(p1)});")
        self.step("\n".join(lines), [a, b, bias], node.outputs[:1], blas=True)

    def gemm(self, node: Node) -> None:
        if gemm_gen.emit_gemm(self, node):  # by constant weights: nncc's packed GEMM
            return
        a, b = node.inputs[:2]
        c = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
        at = node.attrs
        ta, tb = int(at.get("transA", 0)), int(at.get("transB", 0))
        alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
        sa, sb = self.shape(a), self.shape(b)
        m, k = (sa[1], sa[0]) if ta else (sa[0], sa[1])
        nn = sb[0] if tb else sb[1]
        y = self.ptr(node.outputs[0])
        lines = []
        if c and beta != 0.0:  # C broadcast to [M, N], scaled, then the product added to it
            cm, cn = ([1, 1] + list(self.shape(c)))[-2:]
            row = "r" if cm > 1 else "0"
            col = "j" if cn > 1 else "0"
            lines.append(f"for (int64_t r = 0; r < {m}; r++) for (int64_t j = 0; j < {nn}; j++) "
                         f"{y}[r * {nn} + j] = {c_float(beta)} * {self.ptr(c)}[{row} * {cn} + {col}];")
        lines.append(f"nn_gemm({ta}, {tb}, {m}, {nn}, {k}, {c_float(alpha)}, {self.ptr(a)}, {sa[1]}, {self.ptr(b)}, "
                     f"{sb[1]}, {'1.0f' if c and beta != 0.0 else '0.0f'}, {y}, {nn});")
        code, p0, p1 = self._activation(at)
        if code:
            lines.append(f"nn_epilogue({y}, 0, 0, 1, {m * nn}, {code}, {c_float(p0)}, {c_float(p1)});")
        self.step("\n".join(lines), [a, b, c], node.outputs[:1], blas=True)
