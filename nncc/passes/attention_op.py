"""The ONNX ``Attention`` op (opset 23 on) as ``nncc::FusedAttention``, part of the attention
fusion (nncc.passes.attention), so the operator gets the same native kernel as the pattern
exporters spell out.

Taken: float32 Q, K, V, 4-D (``[batch, heads, seq, head]``) or 3-D (``[batch, seq, heads x
head]``, split by a Reshape to 4-D that the fused node reads through a permutation, and
merged back by one after it); K and V with the query's head count, one head, or grouped-query
heads (a count that divides the query's: the fused node's ``head_group``); no past
key or value, no ``nonpad_kv_seqlen``, no softcap, no sliding window, a float32 softmax;
only Y read. The mask: a float one
(added, as the op adds it), or a constant boolean one (made a constant 0 / -inf bias);
``is_causal`` (keys after the query hidden, the op's upper-left alignment) becomes a
constant bias when the sizes are static, added to a constant mask. A query row whose keys
are all hidden gives zeros, as the op defines (``zero_hidden_rows``). Anything else stays
the op it was, run by its own kernel.

com.microsoft ``Attention`` (packed input projection, key padding masks, unidirectional)
becomes a GEMM and the same node (nncc.passes.attention_contrib).

com.microsoft ``MultiHeadAttention`` (what onnxruntime's transformer optimizer writes)
becomes the same node in its plain form: separate 3-D query, key and value, an optional
float ``attention_bias``, no packed bias, key padding mask or past, not unidirectional.
"""

from __future__ import annotations

import math

import numpy as np

from nncc.ir.graph import Graph, Node, TensorInfo
from nncc.passes.attention_contrib import rewrite_contrib_attention
from nncc.passes.attention_nodes import F32, NNCC, Builder, fused_node, static, used
from nncc.passes.cleanup import rebuild

_KNOWN = {"is_causal", "kv_num_heads", "q_num_heads", "qk_matmul_output_mode", "scale", "softcap",
          "softmax_precision", "left_window_size", "right_window_size"}


def _plain_attributes(attrs) -> bool:
    """No softcap, no sliding window, a float32 softmax, nothing this rewrite does not know."""
    if set(attrs) - _KNOWN or float(attrs.get("softcap", 0.0)) != 0.0:
        return False
    if int(attrs.get("left_window_size", -1)) != -1 or int(attrs.get("right_window_size", -1)) != -1:
        return False
    return int(attrs.get("softmax_precision", 1) or 1) == 1  # 0 (unset) or FLOAT


def _rewrite(graph: Graph, node: Node, infos, consumers, b: Builder) -> list[Node] | None:
    ins = list(node.inputs) + [""] * 7
    q, k, v, mask = ins[:4]
    if not (q and k and v) or any(ins[4:7]) or not _plain_attributes(node.attrs):
        return None
    if any(used(graph, consumers, o) for o in node.outputs[1:]) or not node.outputs or not node.outputs[0]:
        return None
    qi, ki, vi = (infos.get(n) for n in (q, k, v))
    if not all(static(i) and i.dtype == F32 for i in (qi, ki, vi)):
        return None
    rank = len(qi.shape)
    if rank != len(ki.shape) or rank != len(vi.shape) or rank not in (3, 4):
        return None
    if rank == 4 and (node.attrs.get("q_num_heads") is not None or node.attrs.get("kv_num_heads") is not None):
        return None  # the op's own kernel says whether that is allowed
    if rank == 3:
        hq, hkv = node.attrs.get("q_num_heads"), node.attrs.get("kv_num_heads")
        if not hq or not hkv or qi.shape[2] % hq or ki.shape[2] % hkv or vi.shape[2] % hkv:
            return None
        batch, sq, skv = qi.shape[0], qi.shape[1], ki.shape[1]
        d = qi.shape[2] // hq
        if ki.shape[2] // hkv != d:
            return None
    else:
        batch, hq, sq, d = qi.shape
        hkv, skv = ki.shape[1], ki.shape[2]
        if ki.shape[3] != d or vi.shape[2] != skv:
            return None
    if hkv <= 0 or hq % hkv or ki.shape[0] != batch or vi.shape[0] != batch:
        return None
    if rank == 4 and hkv not in (hq, 1) and vi.shape[1] != hkv:
        return None
    bias_parts: list[np.ndarray] = []
    runtime_mask = ""
    if mask:
        mi = infos.get(mask)
        if not static(mi) or not mi.shape or mi.shape[-1] != skv or len(mi.shape) > 4:
            return None
        try:
            np.broadcast_shapes(mi.shape, (batch, hq, sq, skv))
        except ValueError:
            return None
        if np.broadcast_shapes(mi.shape, (batch, hq, sq, skv)) != (batch, hq, sq, skv):
            return None
        value = graph.initializers.get(mask)
        if value is None and mi.value is not None:
            value = mi.value
        if mi.dtype == np.bool_:
            if value is None:
                return None
            bias_parts.append(np.where(np.asarray(value), np.float32(0), np.float32(-np.inf)))
        elif mi.dtype == F32:
            if value is not None:
                bias_parts.append(np.asarray(value, np.float32))
            else:
                runtime_mask = mask
        else:
            return None
    if int(node.attrs.get("is_causal", 0)):
        if runtime_mask:
            return None
        bias_parts.append(np.where(np.arange(skv)[None, :] > np.arange(sq)[:, None],
                                   np.float32(-np.inf), np.float32(0)))
    bias = runtime_mask
    if bias_parts:
        total = bias_parts[0]
        for part in bias_parts[1:]:
            total = total + part
        bias = b.constant(f"{node.name or 'attention'}/bias", np.ascontiguousarray(total, np.float32))
    scale = node.attrs.get("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    attrs = {"scale": float(np.float32(scale)), "zero_hidden_rows": 1}
    if hkv not in (hq, 1):  # one K and V head broadcasts as a batch axis does
        attrs["head_group"] = hq // hkv
    return fused_node(b, node, [q, k, v], bias, attrs, rank, hq, hkv)


_MHA_KNOWN = {"num_heads", "scale", "mask_filter_value", "unidirectional"}


def _rewrite_mha(graph: Graph, node: Node, infos, consumers, b: Builder) -> list[Node] | None:
    """com.microsoft MultiHeadAttention with separate 3-D query, key and value, no packed
    bias, no key padding mask, no past, not unidirectional; a float attention_bias added."""
    ins = list(node.inputs) + [""] * 8
    q, k, v, packed_bias, padding, bias = ins[:6]
    heads = node.attrs.get("num_heads")
    if not (q and k and v) or packed_bias or padding or any(ins[6:]) or set(node.attrs) - _MHA_KNOWN:
        return None
    if not heads or int(node.attrs.get("unidirectional", 0)):
        return None
    if any(used(graph, consumers, o) for o in node.outputs[1:]) or not node.outputs or not node.outputs[0]:
        return None
    qi, ki, vi = (infos.get(n) for n in (q, k, v))
    if not all(static(i) and i.dtype == F32 and len(i.shape) == 3 for i in (qi, ki, vi)):
        return None
    heads = int(heads)
    if qi.shape[2] % heads or ki.shape[2] != qi.shape[2] or vi.shape[2] % heads or ki.shape[1] != vi.shape[1]:
        return None
    batch, sq, skv = qi.shape[0], qi.shape[1], ki.shape[1]
    if ki.shape[0] != batch or vi.shape[0] != batch:
        return None
    if bias:
        bi = infos.get(bias)
        if not static(bi) or bi.dtype != F32 or len(bi.shape) != 4 or \
                np.broadcast_shapes(bi.shape, (batch, heads, sq, skv)) != (batch, heads, sq, skv):
            return None
    scale = node.attrs.get("scale")
    scale = 1.0 / math.sqrt(qi.shape[2] // heads) if not scale else float(scale)  # 0: the default
    attrs = {"scale": float(np.float32(scale))}
    return fused_node(b, node, [q, k, v], bias, attrs, 3, heads, heads)


_REWRITES = {("", "Attention"): _rewrite, ("com.microsoft", "MultiHeadAttention"): _rewrite_mha,
             ("com.microsoft", "Attention"): rewrite_contrib_attention}


def attention_op_to_fused(graph: Graph, infos) -> Graph:
    """Each ONNX Attention the module docstring describes becomes ``nncc::FusedAttention``."""
    ops = [n for n in graph.nodes if (n.domain, n.op_type) in _REWRITES]
    if not ops:
        return graph
    consumers = graph.consumers()
    b = Builder(graph)
    replaced: dict[int, list[Node]] = {}
    for node in ops:
        nodes = _REWRITES[(node.domain, node.op_type)](graph, node, infos, consumers, b)
        if nodes is not None:
            replaced[id(node)] = nodes
    if not replaced:
        return graph
    nodes = [m for n in graph.nodes for m in replaced.get(id(n), [n])]
    initializers = dict(graph.initializers)
    initializers.update(b.initializers)
    values = dict(graph.values)
    for name, array in b.initializers.items():
        values[name] = TensorInfo.of(array, keep_value=False)
    opsets = dict(graph.opsets)
    opsets.setdefault(NNCC, 1)
    return rebuild(graph, nodes=nodes, initializers=initializers, values=values, opsets=opsets)
