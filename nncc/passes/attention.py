"""Attention fusion (-O2): scaled dot-product attention as exporters write it becomes one
``nncc::FusedAttention`` node (nncc.kernels.fused_attention), which the native backend runs
as one kernel that never materialises the score matrix.

The pattern, matched from each Softmax over the last axis::

    [Transpose] Q  -> [Mul by a scalar constant] ──┐
    [Transpose] Kᵀ -> [Mul by a scalar constant] ──┴ MatMul -> [Mul or Div by a scalar
        constant] -> [Add(bias)] -> Softmax(last axis) -> [Where(IsNaN(p), 0, p)]
        -> MatMul(., [Transpose] V) -> [Transpose]

A Transpose feeding Q, Kᵀ or V, or reading the result, is absorbed as the node's ``*_perm``
attribute when the fused node is its only reader. The scalars Q and Kᵀ are multiplied by
(torch's scaled_dot_product_attention scales each by the fourth root of the depth) join
the scores' scale. ``Where(IsNaN(p), 0, p)`` (the same function's guard for a row whose
keys are all masked) becomes the node's ``zero_nan_rows``. Every intermediate (scores, scaled,
biased, probabilities) must be read by the next op alone and be no graph output; anything
else leaves the graph as it was. Only float32 attention is fused (what the native kernel
computes; other dtypes keep their exact unfused rounding). The ONNX Attention op becomes
the same node where it can (nncc.passes.attention_op); K and V repeated per query head
(grouped-query heads) are read unrepeated (nncc.passes.attention_gqa).
"""

from __future__ import annotations

import numpy as np

from nncc.errors import NnccError
from nncc.ir.graph import Graph, Node
from nncc.passes.attention_gqa import read_repeated_heads
from nncc.passes.attention_op import attention_op_to_fused
from nncc.passes.fusion import NNCC, Rewriter
from nncc.passes.shape_inference import infer_shapes

F32 = np.dtype(np.float32)


def _producer_map(graph: Graph) -> dict[str, Node]:
    return {out: node for node in graph.nodes for out in node.outputs if out}


def _plain(node: Node | None, op: str, inputs: int) -> bool:
    return (node is not None and node.domain == "" and node.op_type == op and len(node.inputs) == inputs
            and len(node.outputs) == 1 and bool(node.outputs[0]))


def _scalar(rw: Rewriter, name: str) -> float | None:
    value = rw.constant(name)
    if value is None or value.size != 1 or value.dtype != F32 or value.ndim > 4:
        return None
    return float(value.reshape(-1)[0])


def _inverse(perm: list[int]) -> list[int]:
    out = [0] * len(perm)
    for i, p in enumerate(perm):
        out[p] = i
    return out


class _Match:
    def __init__(self, graph: Graph, rw: Rewriter, infos):
        self.graph, self.rw, self.infos = graph, rw, infos
        self.producer = _producer_map(graph)
        self.absorbed: list[Node] = []

    def rank(self, name: str) -> int | None:
        info = self.infos.get(name)
        return None if info is None or info.shape is None else len(info.shape)

    def f32(self, name: str) -> bool:
        info = self.infos.get(name)
        return info is not None and info.dtype == F32

    def only_into(self, value: str, node: Node) -> bool:
        return self.rw.sole_consumer(value) is node

    def operand(self, name: str, reader: Node, swap: bool) -> tuple[str, list[int]] | None:
        """(stored value, perm) for a logical operand ``name`` read by ``reader``: through a
        Transpose that only ``reader`` reads, else ``name`` itself. ``swap``: ``name`` is Kᵀ,
        so the last two logical axes are exchanged."""
        rank = self.rank(name)
        if rank is None or rank < 2:
            return None
        perm = list(range(rank))
        source = name
        node = self.producer.get(name)
        if _plain(node, "Transpose", 1) and self.only_into(name, reader) and id(node) not in self.rw.drop:
            inner = node.attrs.get("perm")
            inner = list(range(rank))[::-1] if inner is None else [int(p) for p in inner]
            if sorted(inner) == perm:
                perm, source = inner, node.inputs[0]
                self.absorbed.append(node)
        if swap:
            perm = perm[:-2] + [perm[-1], perm[-2]]
        return source, perm


def _softmax_last(graph: Graph, node: Node, rank: int | None) -> bool:
    if rank is None or not _plain(node, "Softmax", 1):
        return False
    opset = graph.opset("")
    axis = int(node.attrs.get("axis", -1 if opset >= 13 else 1))
    return axis % rank == rank - 1 if -rank <= axis < rank else False


def _scaled_operand(m: _Match, name: str, scores: Node) -> tuple[float, str, Node] | None:
    """(factor, the value multiplied, the Mul) when ``name``, an operand of the scores'
    MatMul read by it alone, is a float32 value times a scalar constant of no higher rank."""
    mul = m.producer.get(name)
    if not _plain(mul, "Mul", 2) or not m.only_into(name, scores) or id(mul) in m.rw.drop:
        return None
    a, b = mul.inputs
    if a == b:
        return None
    factor = _scalar(m.rw, b)
    if factor is None:
        factor, a = _scalar(m.rw, a), b
    # a factor that is not finite would turn a zero of Q or Kᵀ into NaN, which the scale does not
    if factor is None or not np.isfinite(factor) or not m.f32(a) or m.rank(a) != m.rank(name):
        return None
    return factor, a, mul


def _nan_guard(m: _Match, softmax: Node) -> tuple[str, list[Node]]:
    """(the probabilities the product reads, the guard's nodes): ``Where(IsNaN(p), 0, p)``
    after the Softmax when that is the only use of p and of its IsNaN, else (p, [])."""
    p = softmax.outputs[0]
    users = m.rw.consumers.get(p, [])
    if p in m.rw.pinned or len(users) != 2:
        return p, []
    isnan = next((n for n in users if _plain(n, "IsNaN", 1)), None)
    where = next((n for n in users if _plain(n, "Where", 3)), None)
    if isnan is None or where is None or m.rw.sole_consumer(isnan.outputs[0]) is not where:
        return p, []
    zero = m.rw.constant(where.inputs[1])
    if where.inputs[0] != isnan.outputs[0] or where.inputs[2] != p or zero is None or zero.size != 1 \
            or zero.dtype != F32 or zero.reshape(-1)[0] != 0 or m.rank(where.outputs[0]) != m.rank(p):
        return p, []
    return where.outputs[0], [isnan, where]


def _fuse_one(m: _Match, softmax: Node) -> tuple[Node, list[Node]] | None:
    rw = m.rw
    rank = m.rank(softmax.inputs[0])
    if not _softmax_last(m.graph, softmax, rank) or not m.f32(softmax.inputs[0]):
        return None
    chain: list[Node] = [softmax]
    value = softmax.inputs[0]
    bias, scale = "", 1.0
    node = m.producer.get(value)
    if _plain(node, "Add", 2) and m.only_into(value, softmax):
        a, b = node.inputs
        for scores_side, other in ((a, b), (b, a)):
            upstream = m.producer.get(scores_side)
            if upstream is not None and upstream.op_type in ("Mul", "Div", "MatMul") and not upstream.domain \
                    and scores_side != other:
                bias_rank = m.rank(other)
                if bias_rank is None or bias_rank > rank or not m.f32(other):
                    continue
                bias, value = other, scores_side
                chain.append(node)
                break
        else:
            return None
        node = m.producer.get(value)
        if not m.only_into(value, chain[-1]):
            return None
    if (_plain(node, "Mul", 2) or _plain(node, "Div", 2)) and m.only_into(value, chain[-1]):
        a, b = node.inputs
        factor = _scalar(rw, b)
        if node.op_type == "Mul" and factor is None:
            factor, a = _scalar(rw, a), b
        if factor is None or (node.op_type == "Div" and factor == 0.0):
            return None
        scale = factor if node.op_type == "Mul" else 1.0 / factor
        chain.append(node)
        value = a
        node = m.producer.get(value)
        if not m.only_into(value, chain[-1]):
            return None
    if not _plain(node, "MatMul", 2) or not m.only_into(value, chain[-1]):
        return None
    scores = node
    chain.append(scores)
    operands = []  # Q and Kᵀ: (the value, its reader), past a scalar Mul that joins the scale
    for name in scores.inputs:
        found = _scaled_operand(m, name, scores)
        if found is None:
            operands.append((name, scores))
            continue
        factor, value, mul = found
        scale *= factor
        chain.append(mul)
        operands.append((value, mul))
    probs, guard = _nan_guard(m, softmax)
    product = rw.sole_consumer(probs)
    if not _plain(product, "MatMul", 2) or product.inputs[0] != probs:
        return None
    chain += guard + [product]
    if m.rank(product.outputs[0]) != rank or any(id(n) in rw.drop or id(n) in rw.replace for n in chain):
        return None
    m.absorbed = []
    q = m.operand(*operands[0], swap=False)
    k = m.operand(*operands[1], swap=True)
    v = m.operand(product.inputs[1], product, swap=False)
    if q is None or k is None or v is None or not all(m.f32(n) for n in (q[0], k[0], v[0])):
        return None
    out, out_perm = product.outputs[0], list(range(rank))
    after = rw.sole_consumer(out)
    if _plain(after, "Transpose", 1) and id(after) not in rw.drop:
        perm = after.attrs.get("perm")
        perm = list(range(rank))[::-1] if perm is None else [int(p) for p in perm]
        if sorted(perm) == out_perm:
            out, out_perm = after.outputs[0], perm
            m.absorbed.append(after)
    attrs = {"scale": float(np.float32(scale))}
    if guard:
        attrs["zero_nan_rows"] = 1
    for key, perm in (("q_perm", q[1]), ("k_perm", k[1]), ("v_perm", v[1]), ("out_perm", out_perm)):
        if perm != list(range(len(perm))):
            attrs[key] = perm
    inputs = [q[0], k[0], v[0]] + ([bias] if bias else [])
    fused = Node("FusedAttention", inputs, [out], attrs, NNCC, scores.name or softmax.name)
    return fused, chain + m.absorbed


def fuse_attention(graph: Graph) -> Graph:
    """Each attention pattern (module docstring), and each ONNX Attention op that
    nncc.passes.attention_op takes, becomes one ``nncc::FusedAttention``."""
    if not any(_plain(n, "Softmax", 1) or n.op_type in ("Attention", "MultiHeadAttention") for n in graph.nodes):
        return Rewriter(graph).result()
    try:
        infos = infer_shapes(graph)
    except NnccError:
        return Rewriter(graph).result()  # shapes unknown: leave everything as it is
    graph = attention_op_to_fused(graph, infos)
    rw = Rewriter(graph)
    softmaxes = [n for n in graph.nodes if _plain(n, "Softmax", 1)]
    m = _Match(graph, rw, infos)
    position = {id(node): i for i, node in enumerate(graph.nodes)}
    for softmax in softmaxes:
        found = _fuse_one(m, softmax)
        if found is None:
            continue
        fused, nodes = found
        # in the place of the last op it replaces: each of its inputs was read by one of
        # them, so is made before, and each reader of its output came after that op
        last = max(nodes, key=lambda n: position[id(n)])
        rw.replace[id(last)] = fused
        rw.drop.update(id(n) for n in nodes if n is not last)
    return read_repeated_heads(rw.result(), infos)


__all__ = ["fuse_attention"]
