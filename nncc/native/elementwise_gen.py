"""The partition writer's elementwise and data-movement steps over NCHW (plain) buffers:
unary and broadcasting binary ops, Sum, Concat, Transpose, Softmax over contiguous rows,
and the reshape-like ops that alias their input. Which node gets which step is its entry's
decision (nncc/native/ops).

A mixin of the partition writer (nncc/native/codegen.py): it uses its ``step``, ``ptr``,
``shape``, ``graph``, ``infos``, ``alias`` and ``outputs`` members.
"""

from __future__ import annotations

import math

import numpy as np

from nncc.ir.graph import Node
from nncc.native.activations import CODES
from nncc.native.c_literal import c_float
from nncc.native.concat_slices import Slice
from nncc.native.graph_query import batch_strides, const_value

UNARY = {
    "Relu": "(v < 0.0f ? 0.0f : v)", "Sigmoid": "nn_sigmoid(v)", "Tanh": "nn_tanh(v)",
    "Erf": "nn_erf(v)", "Exp": "nn_exp(v)", "Log": "logf(v)", "Sqrt": "sqrtf(v)", "Neg": "(-v)",
    "Abs": "fabsf(v)", "Reciprocal": "(1.0f / v)", "Identity": "v", "Softsign": "(v / (1.0f + fabsf(v)))",
}
BINARY = {"Add": "(a + b)", "Sub": "(a - b)", "Mul": "(a * b)", "Div": "(a / b)", "Pow": "powf(a, b)",
          "Max": "(a > b || a != a ? a : b)", "Min": "(a < b || a != a ? a : b)"}
# the activations as ops of their own, whose parameters (attributes or constant inputs) are
# literals in their expression (``unary_expr``)
PARAMETRIC = ("Clip", "LeakyRelu", "HardSigmoid", "HardSwish")
ALIASES = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"}
GELU_OPS = {("", "Gelu"), ("nncc", "Gelu")}  # nncc's: a GELU spelled out in ops (passes/fusion.py)
GELU_FORMS = {  # approximate -> simd.h's function of a vector, as a product's epilogue applies it (gemm_gen)
    "none": "nn_vgelu_erf",
    "tanh": "nn_vgelu_tanh",
}
_GELU_CHUNK = 4096  # elements per task
POW_BY = {2.0: "(v * v)", 3.0: "(v * v * v)", 0.5: "sqrtf(v)", 1.0: "v", -1.0: "(1.0f / v)"}  # constant exponents


class ElementwiseSteps:
    """Steps of elementwise ops, Sum, Concat, Transpose and the aliasing ops."""

    def reshape(self, node: Node) -> None:
        src, out = node.inputs[0], node.outputs[0]
        if out in self.outputs:  # the caller's buffer: copy into it
            size = math.prod(self.shape(out))
            self.step(f"memcpy({self.ptr(out)}, {self.ptr(src)}, {size} * sizeof(float));", [src], [out])
        else:
            self.alias[out] = src

    def unary(self, node: Node, expr: str | None = None) -> None:
        """One loop ``y[i] = expr(v = x[i])``: the node's own expression unless given."""
        expr = expr or self.unary_expr(node)
        x, y = node.inputs[0], node.outputs[0]
        size = math.prod(self.shape(y))
        self.step(f"for (int64_t i = 0; i < {size}; i++) {{ float v = {self.ptr(x)}[i]; "
                  f"{self.ptr(y)}[i] = {expr}; }}", [x], [y])

    def gelu(self, node: Node) -> None:
        """GELU over the pool, a chunk per task: a transformer's largest elementwise step."""
        x, y = node.inputs[0], node.outputs[0]
        size = math.prod(self.shape(y))
        gelu = GELU_FORMS[node.attrs.get("approximate", "none")]
        chunks = -(-size // _GELU_CHUNK)
        support = f"""typedef struct {{ const float *x; float *y; }} gelu_job;
static void gelu_chunks(void *ctx, int64_t lo, int64_t hi) {{
    const gelu_job *j = ctx;
    int64_t i = lo * {_GELU_CHUNK}, end = hi * {_GELU_CHUNK} < {size} ? hi * {_GELU_CHUNK} : {size};
    for (; i + NN_VL <= end; i += NN_VL) nn_vstore(j->y + i, {gelu}(nn_vload(j->x + i)));
    if (i < end) {{  /* the last, partial vector: through a buffer, never past the tensor */
        float t[NN_VL] = {{0}};
        memcpy(t, j->x + i, (size_t)(end - i) * sizeof(float));
        nn_vstore(t, {gelu}(nn_vload(t)));
        memcpy(j->y + i, t, (size_t)(end - i) * sizeof(float));
    }}
}}
"""
        self.step(f"gelu_job job = {{{self.ptr(x)}, {self.ptr(y)}}}; nn_parallel({chunks}, {size * 16}, gelu_chunks, &job);",
                  [x], [y], support=self.simd + support)

    def unary_expr(self, node: Node) -> str:
        op = node.op_type
        if op == "Clip":
            lo, hi = self.clip_bounds(node)
            return f"(v < {c_float(lo)} ? {c_float(lo)} : (v > {c_float(hi)} ? {c_float(hi)} : v))"
        if op == "LeakyRelu":
            return f"(v >= 0.0f ? v : v * {c_float(float(node.attrs.get('alpha', 0.01)))})"
        if op == "HardSigmoid":
            return f"nn_act({CODES['HardSigmoid']}, v, {c_float(float(node.attrs.get('alpha', 0.2)))}, {c_float(float(node.attrs.get('beta', 0.5)))})"
        if op == "HardSwish":
            return f"nn_act({CODES['HardSwish']}, v, 0.0f, 0.0f)"
        return UNARY[op]

    def clip_bounds(self, node: Node):
        lo, hi = -np.inf, np.inf
        if self.graph.opset(node.domain) < 11:
            return float(node.attrs.get("min", lo)), float(node.attrs.get("max", hi))
        if len(node.inputs) > 1 and node.inputs[1]:
            lo = float(np.asarray(const_value(self.graph, self.infos, node.inputs[1])).reshape(()))
        if len(node.inputs) > 2 and node.inputs[2]:
            hi = float(np.asarray(const_value(self.graph, self.infos, node.inputs[2])).reshape(()))
        return lo, hi

    def binary(self, node: Node, expr: str) -> None:
        a, b = node.inputs
        y = node.outputs[0]
        out = self.shape(y)
        sa = _broadcast_strides(self.shape(a), out)
        sb = _broadcast_strides(self.shape(b), out)
        self.broadcast_loop(list(out), sa, sb, a, b, y, expr)

    def broadcast_loop(self, out, sa, sb, a: str, b: str, y: str, expr: str) -> None:
        """One step ``y[i] = expr(a[...], b[...])`` over ``out`` (dense), reading a and b
        with the element strides ``sa`` and ``sb`` (0 where broadcast)."""
        dims, sa, sb = _collapse(list(out), sa, sb)
        pa, pb, py = self.ptr(a), self.ptr(b), self.ptr(y)
        lines = []
        depth = len(dims)
        # index arithmetic with literal strides: the innermost loop is unit-stride or a splat
        for d in range(depth):
            lines.append(f"{'  ' * d}for (int64_t i{d} = 0; i{d} < {dims[d]}; i{d}++) {{")
        ia = " + ".join(f"i{d} * {sa[d]}" for d in range(depth) if sa[d]) or "0"
        ib = " + ".join(f"i{d} * {sb[d]}" for d in range(depth) if sb[d]) or "0"
        iy = " + ".join(f"i{d} * {_row_stride(dims, d)}" for d in range(depth)) or "0"
        lines.append(f"{'  ' * depth}float a = {pa}[{ia}], b = {pb}[{ib}]; {py}[{iy}] = {expr};")
        for d in range(depth - 1, -1, -1):
            lines.append(f"{'  ' * d}}}")
        self.step("\n".join(lines), [a, b], [y])

    def sum(self, node: Node) -> None:
        """Same-shape operands (check() says so): one pass adding them all."""
        y = node.outputs[0]
        size = math.prod(self.shape(y))
        terms = " + ".join(f"{self.ptr(x)}[i]" for x in node.inputs)
        self.step(f"for (int64_t i = 0; i < {size}; i++) {self.ptr(y)}[i] = {terms};", list(node.inputs), [y])

    def concat(self, node: Node) -> None:
        """Each input's rows copied into its place in the output's rows. Where the axis is
        the outermost one larger than 1, each input is one range of the output: copies
        the plan may drop, its producer writing there (nncc/native/concat_slices.py)."""
        y = node.outputs[0]
        out = self.shape(y)
        axis = int(node.attrs.get("axis", 1)) % len(out)
        outer, row = math.prod(out[:axis]), math.prod(out[axis:])
        inputs = self.concat_inputs(node, blocked=False)
        self.joined_as(node)
        if outer == 1 and row:
            slices, offset = [], 0
            for x in inputs:
                width = math.prod(self.shape(x))
                if width:
                    slices.append(Slice(x, y, offset, width))
                offset += width
            self.copy_slices(slices)
            return
        lines, offset = [], 0
        for x in inputs:
            width = math.prod(self.shape(x)[axis:])
            if width:
                lines.append(f"for (int64_t o = 0; o < {outer}; o++) memcpy({self.ptr(y)} + o * {row} + {offset}, "
                             f"{self.ptr(x)} + o * {width}, {width} * sizeof(float));")
            offset += width
        self.step("\n".join(lines), inputs, [y])

    def concat_inputs(self, node: Node, blocked: bool) -> list[str]:
        """``node``'s inputs, the longest leading run of them that an earlier Concat on the
        same axis joined (in this partition, in the layout asked for, under the same guard)
        replaced by that Concat's output: a dense block exported as the Concat of every
        layer so far, at each layer, becomes a chain, each Concat the previous one plus the
        new layer, which the plan then nests into one buffer."""
        axis = int(node.attrs.get("axis", 1)) % len(self.shape(node.outputs[0]))
        inputs = list(node.inputs)
        for k in range(len(inputs) - 1, 1, -1):
            earlier = self.joined.get((axis, tuple(inputs[:k]), self.guard))
            if earlier is None:
                continue
            if (earlier in self.blocked) if blocked else (earlier not in self.blocked or earlier in self.plain_ready):
                return [earlier, *inputs[k:]]
        return inputs

    def joined_as(self, node: Node) -> None:
        """Record ``node``'s output as the join of its inputs (``concat_inputs``)."""
        axis = int(node.attrs.get("axis", 1)) % len(self.shape(node.outputs[0]))
        self.joined[(axis, tuple(node.inputs), self.guard)] = node.outputs[0]

    def softmax_rows(self, node: Node, rows: int, n: int, log: bool) -> None:
        """Softmax (``log``: LogSoftmax) of each of ``rows`` contiguous rows of ``n``."""
        self.step(f"nn_softmax_rows({self.ptr(node.inputs[0])}, {self.ptr(node.outputs[0])}, "
                  f"{rows}, {n}, {int(log)});", node.inputs[:1], node.outputs[:1])

    def transpose(self, node: Node) -> None:
        x, y = node.inputs[0], node.outputs[0]
        shape = self.shape(x)
        perm = node.attrs.get("perm") or list(range(len(shape)))[::-1]
        strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        out_shape = [shape[p] for p in perm]
        out_strides = [strides[p] for p in perm]
        self.step(f"static const int64_t sh[] = {{{', '.join(map(str, out_shape))}}}; "
                  f"static const int64_t st[] = {{{', '.join(map(str, out_strides))}}}; "
                  f"nn_transpose({self.ptr(x)}, {self.ptr(y)}, {len(shape)}, sh, st);", [x], [y])


def _broadcast_strides(shape, out) -> list[int]:
    """Element strides of ``shape`` read in ``out``'s index space (0 where broadcast)."""
    return batch_strides(shape, out, 1)


def _collapse(dims, sa, sb):
    """Merge adjacent axes that every operand walks contiguously, and drop size-1 axes."""
    keep = [d for d in range(len(dims)) if dims[d] != 1]
    dims, sa, sb = [dims[d] for d in keep], [sa[d] for d in keep], [sb[d] for d in keep]
    if not dims:
        return [1], [0], [0]
    out_d, out_a, out_b = [dims[0]], [sa[0]], [sb[0]]
    for d in range(1, len(dims)):
        merge = all(prev == cur * dims[d] for prev, cur in ((out_a[-1], sa[d]), (out_b[-1], sb[d]))
                    if not (prev == 0 and cur == 0))
        if merge and all((p == 0) == (c == 0) for p, c in ((out_a[-1], sa[d]), (out_b[-1], sb[d]))):
            out_d[-1] *= dims[d]
            out_a[-1], out_b[-1] = sa[d], sb[d]
        else:
            out_d.append(dims[d]); out_a.append(sa[d]); out_b.append(sb[d])  # noqa: E702
    return out_d, out_a, out_b


def _row_stride(dims, d) -> int:
    return math.prod(dims[d + 1:])
