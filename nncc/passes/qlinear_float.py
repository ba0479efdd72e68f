"""Quantized graphs carry their uint8/int8 tensors as exact float images (-O2).

A quantized tensor q (scale s, zero point z) between quantized ops becomes its image
DQ(q) = float32(q - z) * s, which is exact and gives q back exactly (nncc/kernels/
qimage.py), so every value stays float32 and both ways of writing a quantized model reduce
to the same nncc-domain ops:

* QOperator: QuantizeLinear(x) -> ``QuantizeDequantize`` (the image of the quantized x);
  QLinearConv, QLinearAdd, QLinearGlobalAveragePool, QGemm and QLinearMatMul on images ->
  ``QConv``, ``QAdd``, ``QGlobalAveragePool``, ``QGemm``, ``QMatMul``; MaxPool and the
  reshape-like ops of a quantized tensor run on its image (DQ is increasing, so a maximum
  commutes with it); DequantizeLinear of an image is the image itself.
* QDQ: Q -> DQ pairs become ``QuantizeDequantize``, a DequantizeLinear's output is an
  image, and Conv / Gemm of an image by dequantized constant weights (and int32 bias),
  Add of two images and GlobalAveragePool of one, each followed only by a QuantizeLinear,
  become the quantized op itself, as onnxruntime fuses them: exact integer arithmetic in
  place of the float op on dequantized values (which may round one quantization step
  differently where a value lies within float rounding of a tie).

Where a quantized tensor is still needed as such (a graph output, an op not rewritten),
QuantizeLinear of its image gives it back exactly.
"""

from __future__ import annotations

import numpy as np

from nncc.ir.graph import Graph, Node, topological_order
from nncc.passes.cleanup import all_names, fresh_name, rebuild, subgraph_references

NNCC = "nncc"
MICROSOFT = "com.microsoft"
_QUANTIZED = (np.dtype(np.uint8), np.dtype(np.int8))
# ops that move or select elements: they commute with an increasing DQ
_SMALLEST = float(np.finfo(np.float32).tiny)  # a scale's range, see qparams
_LARGEST = float(np.finfo(np.float32).max) / 512
_MOVES = ("MaxPool", "Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Identity")


def _plain_quantize(node: Node) -> bool:
    """A QuantizeLinear that divides in float32 into its zero point's type (no
    output_dtype or precision attribute asking otherwise)."""
    return not any(int(node.attrs.get(name, 0)) for name in ("output_dtype", "precision", "block_size"))


class _Rewrite:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.consts = graph.initializers
        self.producers = graph.producers()
        self.consumers = graph.consumers()
        self.captured = subgraph_references(graph)  # read by name inside a subgraph: left as written
        self.pinned = set(graph.outputs) | self.captured
        self.taken = all_names(graph)
        self.images: dict[str, tuple[str, str, str]] = {}  # quantized value -> (image, scale, zero)
        self.params: dict[str, tuple[str, str]] = {}  # float image -> (scale, zero)
        self.alias: dict[str, str] = {}  # value -> the image that now stands for it
        self.gone: set[str] = set()  # quantized values no node produces any more
        self.made: set[str] = set()  # images this pass named
        self.skip: set[int] = set()  # nodes folded into an earlier rewrite
        self.out: list[Node] = []
        self.changed = False

    # -- facts about constants ---------------------------------------------------------

    def const(self, name: str) -> np.ndarray | None:
        return self.consts.get(name) if name else None

    def qparams(self, scale: str, zero: str) -> bool:
        """A constant float32 scalar scale in the normal range and a uint8/int8 scalar zero."""
        s, z = self.const(scale), self.const(zero)
        if s is None or z is None or s.dtype != np.float32 or s.size != 1 or z.dtype not in _QUANTIZED or z.size != 1:
            return False
        # an image (q - z) * s stays a normal float, and 1 / s is finite: images are exact
        value = float(s.reshape(()))
        return _SMALLEST <= value <= _LARGEST

    def same(self, a: tuple[str, ...], b: tuple[str, ...]) -> bool:
        for x, y in zip(a, b):
            if x == y:
                continue
            vx, vy = self.const(x), self.const(y)
            if vx is None or vy is None or vx.dtype != vy.dtype or vx.size != vy.size:
                return False
            if not np.array_equal(vx.reshape(-1), vy.reshape(-1)):
                return False
        return True

    def dequantized_const(self, name: str, dtypes) -> Node | None:
        """The DequantizeLinear of a constant (of one of ``dtypes``) that produces ``name``."""
        node = self.producers.get(name)
        if node is None or node.op_type != "DequantizeLinear" or node.domain != "":
            return None
        q = self.const(node.inputs[0])
        if q is None or q.dtype not in dtypes or int(node.attrs.get("block_size", 0)):
            return None
        s = self.const(node.inputs[1])
        if s is None or s.dtype != np.float32 or s.ndim > 1:
            return None
        z = self.const(node.inputs[2]) if len(node.inputs) > 2 else None
        if z is not None and (z.dtype != q.dtype or z.size != s.size):
            return None
        if s.size > 1 and int(node.attrs.get("axis", 1)) % q.ndim != 0:
            return None  # per output channel only
        return node

    # -- emitting ----------------------------------------------------------------------

    def fresh(self, base: str) -> str:
        name = fresh_name(base + "_image", self.taken)
        self.taken.add(name)
        self.made.add(name)
        return name

    def emit_image_op(self, op: str, inputs: list[str], quantized_out: str, scale: str, zero: str,
                      attrs: dict, name: str, domain: str = NNCC) -> None:
        """``op`` producing the image of ``quantized_out``."""
        out = self.fresh(quantized_out)
        self.out.append(Node(op, inputs, [out], attrs, domain, name))
        self.images[quantized_out] = (out, scale, zero)
        self.params[out] = (scale, zero)
        self.gone.add(quantized_out)
        self.changed = True

    def materialize(self, node: Node) -> None:
        """QuantizeLinear of the image for every quantized value ``node`` reads that no
        node produces any more."""
        for name in node.inputs:
            if name in self.gone:
                self.restore(name)

    def restore(self, name: str) -> None:
        img, s, z = self.images[name]
        self.out.append(Node("QuantizeLinear", [img, s, z], [name], {}, "", f"{name}_restored"))
        self.gone.discard(name)

    def image_of(self, quantized: str, scale: str, zero: str) -> str | None:
        """The image of ``quantized`` when the reader's scale and zero are the image's."""
        found = self.images.get(quantized)
        if found is None or not self.qparams(scale, zero) or not self.same(found[1:], (scale, zero)):
            return None
        return found[0]

    def float_image(self, name: str, scale: str | None = None, zero: str | None = None):
        """(scale, zero) of a float value known to be an image (matching the given ones)."""
        found = self.params.get(name)
        if found is None or (scale is not None and not self.same(found, (scale, zero))):
            return None
        return found

    def sole_quantize(self, value: str) -> Node | None:
        """The QuantizeLinear that alone reads ``value``, with constant scalar params."""
        users = self.consumers.get(value, [])
        if value in self.pinned or len(users) != 1:
            return None
        q = users[0]
        if q.op_type != "QuantizeLinear" or q.domain != "" or len(q.inputs) < 3 or q.inputs[0] != value:
            return None
        if not self.qparams(q.inputs[1], q.inputs[2]) or not _plain_quantize(q):
            return None
        return q

    # -- the rewrites --------------------------------------------------------------------

    def run(self) -> Graph:
        for node in topological_order(self.graph):
            if id(node) in self.skip:
                continue
            node = Node(node.op_type, [self.alias.get(i, i) for i in node.inputs], list(node.outputs),
                        node.attrs, node.domain, node.name)
            if not self.rewrite(node):
                self.materialize(node)
                self.out.append(node)
        return self.finish()

    def rewrite(self, node: Node) -> bool:
        op, domain, ins = node.op_type, node.domain, list(node.inputs) + [""] * 9
        if self.captured & set(node.outputs):
            return False
        if domain == "" and op == "QuantizeLinear":
            return self.quantize_linear(node, ins)
        if domain == "" and op == "DequantizeLinear":
            return self.dequantize_linear(node, ins)
        if domain == "" and op == "QLinearConv":
            x = self.image_of(ins[0], ins[1], ins[2])
            if x is None or not self.qparams(ins[6], ins[7]):
                return False
            self.emit_image_op("QConv", [x] + node.inputs[1:], node.outputs[0], ins[6], ins[7],
                               dict(node.attrs), node.name)
            return True
        if domain == MICROSOFT and op == "QLinearAdd":
            a, b = self.image_of(ins[0], ins[1], ins[2]), self.image_of(ins[3], ins[4], ins[5])
            if a is None or b is None or not self.qparams(ins[6], ins[7]):
                return False
            self.emit_image_op("QAdd", [a, ins[1], ins[2], b] + ins[4:8], node.outputs[0], ins[6], ins[7],
                               {}, node.name)
            return True
        if domain == MICROSOFT and op == "QLinearGlobalAveragePool":
            x = self.image_of(ins[0], ins[1], ins[2])
            if x is None or int(node.attrs.get("channels_last", 0)) or not self.qparams(ins[3], ins[4]):
                return False
            self.emit_image_op("QGlobalAveragePool", [x] + ins[1:5], node.outputs[0], ins[3], ins[4], {},
                               node.name)
            return True
        if domain == MICROSOFT and op == "QGemm":
            return self.qgemm(node, ins)
        if domain == "" and op == "QLinearMatMul":
            a = self.image_of(ins[0], ins[1], ins[2])
            if a is None or not self.qparams(ins[6], ins[7]):
                return False
            self.emit_image_op("QMatMul", [a] + node.inputs[1:8], node.outputs[0], ins[6], ins[7], {}, node.name)
            return True
        if domain == "" and op in _MOVES:
            return self.move(node)
        if domain == "" and op == "Conv":
            return self.qdq_conv(node, ins)
        if domain == "" and op == "Gemm":
            return self.qdq_gemm(node, ins)
        if domain == "" and op == "Add" and len(node.inputs) == 2:
            return self.qdq_add(node)
        if domain == "" and op == "GlobalAveragePool":
            return self.qdq_pool(node)
        return False

    def quantize_linear(self, node: Node, ins: list[str]) -> bool:
        x, s, z = ins[:3]
        if not self.qparams(s, z) or not _plain_quantize(node):
            return False
        q = node.outputs[0]
        if self.float_image(x, s, z) is not None:  # Q(DQ(q)) = q: the image already is
            self.images[q] = (x, s, z)
            self.gone.add(q)
            self.changed = True
            return True
        self.emit_image_op("QuantizeDequantize", [x, s, z], q, s, z, {}, node.name)
        return True

    def dequantize_linear(self, node: Node, ins: list[str]) -> bool:
        q, s, z = ins[:3]
        img = self.image_of(q, s, z)
        if img is not None:
            self.alias[node.outputs[0]] = img
            self.changed = True
            return True
        if self.qparams(s, z):  # a dequantized value is an image, whatever made q
            self.params[node.outputs[0]] = (s, z)
        return False

    def move(self, node: Node) -> bool:
        if len([o for o in node.outputs if o]) != 1:
            return False
        data = node.inputs[0]
        found = self.images.get(data)
        if found is not None:
            img, s, z = found
            self.emit_image_op(node.op_type, [img] + node.inputs[1:], node.outputs[0], s, z, dict(node.attrs),
                               node.name, "")
            return True
        if data in self.params:  # a float image moved is still an image
            self.params[node.outputs[0]] = self.params[data]
        return False

    def qgemm(self, node: Node, ins: list[str]) -> bool:
        a = self.image_of(ins[0], ins[1], ins[2])
        if a is None:
            return False
        inputs = [a] + node.inputs[1:]
        if ins[7]:
            if not self.qparams(ins[7], ins[8]):
                return False
            self.emit_image_op("QGemm", inputs, node.outputs[0], ins[7], ins[8], dict(node.attrs), node.name)
            return True
        self.out.append(Node("QGemm", inputs, list(node.outputs), dict(node.attrs), NNCC, node.name))
        self.changed = True
        return True

    # -- QDQ: an op between dequantized inputs and one QuantizeLinear ----------------------

    def _weights(self, w_name: str, b_name: str, x_scale: str, out_axis_size_at: int):
        """(w_q, w_scale, w_zero, bias_q) from DequantizeLinear of constants, the bias on
        the accumulator's scale (x_scale * w_scale) with zero point 0; or None."""
        wdq = self.dequantized_const(w_name, _QUANTIZED)
        if wdq is None:
            return None
        w = self.const(wdq.inputs[0])
        ws = self.const(wdq.inputs[1])
        if ws.size not in (1, w.shape[out_axis_size_at]):
            return None
        wz = wdq.inputs[2] if len(wdq.inputs) > 2 else ""
        bias = ""
        if b_name:
            bdq = self.dequantized_const(b_name, (np.dtype(np.int32),))
            if bdq is None:
                return None
            bz = self.const(bdq.inputs[2]) if len(bdq.inputs) > 2 else None
            bs = self.const(bdq.inputs[1])
            if bz is not None and bz.any():
                return None
            expected = self.const(x_scale).astype(np.float32).reshape(()) * ws.reshape(-1)
            n = max(bs.size, expected.size)
            if bs.size not in (1, n) or expected.size not in (1, n):
                return None
            if not np.allclose(np.broadcast_to(bs.reshape(-1), (n,)), np.broadcast_to(expected, (n,)), rtol=1e-6, atol=0):
                return None  # a bias on another scale than the accumulator's
            bias = bdq.inputs[0]
        return wdq.inputs[0], wdq.inputs[1], wz, bias

    def _fuse(self, node: Node, op: str, inputs: list[str], q: Node, attrs: dict) -> bool:
        if q.outputs[0] in self.captured:
            return False
        self.skip.add(id(q))
        self.emit_image_op(op, inputs, q.outputs[0], q.inputs[1], q.inputs[2], attrs, node.name)
        return True

    def qdq_conv(self, node: Node, ins: list[str]) -> bool:
        x = self.float_image(ins[0])
        q = self.sole_quantize(node.outputs[0])
        if x is None or q is None:
            return False
        found = self._weights(ins[1], ins[2], x[0], 0)
        if found is None:
            return False
        w, ws, wz, bias = found
        inputs = [ins[0], x[0], x[1], w, ws, wz, q.inputs[1], q.inputs[2]] + ([bias] if bias else [])
        return self._fuse(node, "QConv", inputs, q, dict(node.attrs))

    def qdq_gemm(self, node: Node, ins: list[str]) -> bool:
        a = self.float_image(ins[0])
        q = self.sole_quantize(node.outputs[0])
        if a is None or q is None or float(node.attrs.get("beta", 1.0)) != 1.0 or int(node.attrs.get("transA", 0)):
            return False
        trans_b = int(node.attrs.get("transB", 0))
        found = self._weights(ins[1], ins[2], a[0], 0 if trans_b else 1)
        if found is None or (ins[2] and self.const(self.producers[ins[2]].inputs[0]).ndim != 1):
            return False
        w, ws, wz, bias = found
        attrs = {"transB": trans_b, "alpha": float(node.attrs.get("alpha", 1.0))}
        return self._fuse(node, "QGemm", [ins[0], a[0], a[1], w, ws, wz, bias, q.inputs[1], q.inputs[2]], q, attrs)

    def qdq_add(self, node: Node) -> bool:
        a, b = (self.float_image(i) for i in node.inputs)
        q = self.sole_quantize(node.outputs[0])
        if a is None or b is None or q is None:
            return False
        inputs = [node.inputs[0], a[0], a[1], node.inputs[1], b[0], b[1], q.inputs[1], q.inputs[2]]
        return self._fuse(node, "QAdd", inputs, q, {})

    def qdq_pool(self, node: Node) -> bool:
        x = self.float_image(node.inputs[0])
        q = self.sole_quantize(node.outputs[0])
        if x is None or q is None:
            return False
        return self._fuse(node, "QGlobalAveragePool", [node.inputs[0], x[0], x[1], q.inputs[1], q.inputs[2]], q, {})

    # -- the result ----------------------------------------------------------------------

    def finish(self) -> Graph:
        graph = self.graph
        if not self.changed:
            return rebuild(graph)
        renamed: dict[str, str] = {}
        for out in graph.outputs:
            if out in self.gone:
                self.restore(out)
            elif out in self.alias:
                target = self.alias[out]
                if target in self.made and target not in renamed:
                    renamed[target] = out  # the op writes the graph output itself
                else:
                    self.out.append(Node("Identity", [renamed.get(target, target)], [out], {}, "", out))
        nodes = [Node(n.op_type, [renamed.get(i, i) for i in n.inputs], [renamed.get(o, o) for o in n.outputs],
                      n.attrs, n.domain, n.name) for n in self.out]
        opsets = dict(graph.opsets)
        opsets.setdefault(NNCC, 1)
        return rebuild(graph, nodes=nodes, opsets=opsets)


def carry_quantized_as_float(graph: Graph) -> Graph:
    return _Rewrite(graph).run()
