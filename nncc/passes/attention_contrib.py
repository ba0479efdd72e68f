"""com.microsoft ``Attention`` (nncc.kernels.attention_contrib) as one packed GEMM and one
``nncc::FusedAttention``, part of the attention fusion (nncc.passes.attention_op)::

    input ─ FusedMatMul(constant weights, constant bias) ─ Split ─ Q, K, V (3-D, heads split by
        Reshapes the fused node reads through) ─ FusedAttention(bias = mask [+ attention_bias])

Taken: a static float32 input, constant weights (and bias), no past state, no rotary
embedding, present not read. The mask becomes the fused node's bias as the op defines it:
``mask_filter_value`` for a hidden key, float32's lowest for the keys after the query when
``unidirectional``; a constant mask (or none) is one constant bias, and a mask fed at run time
(raw ``[B, T]`` or ``[B, S, T]``, or ``[B]`` ends of right-padded keys) is turned into it by a few
small ops in the graph. A float ``attention_bias`` of rank 4 is added to it. Anything else stays
the op it was, run by its own kernel.
"""

from __future__ import annotations

import math

import numpy as np

from nncc.errors import KernelError
from nncc.ir.graph import Graph, Node
from nncc.kernels.attention_contrib import MASK_FILTER_VALUE, mask_bias, mask_kind, qkv_sizes, unsupported
from nncc.kernels.registry import Ctx
from nncc.passes.attention_nodes import F32, NNCC, Builder, fused_node, static, used

_KNOWN = {"num_heads", "qkv_hidden_sizes", "scale", "mask_filter_value", "unidirectional", "do_rotary",
          "past_present_share_buffer", "rotary_embedding_dim"}
_RUNTIME_MASKS = ("raw2", "raw3", "end")


def _constant(graph: Graph, infos, name: str) -> np.ndarray | None:
    if name in graph.initializers:
        return graph.initializers[name]
    info = infos.get(name)
    return None if info is None or info.value is None else np.asarray(info.value)


class _Bias:
    """The fused node's bias, built up from constant parts (summed at compile time) and at
    most one value computed in the graph."""

    def __init__(self, b: Builder, base: str):
        self.b, self.base = b, base
        self.nodes: list[Node] = []
        self.runtime = ""

    def op(self, op_type: str, inputs: list[str], attrs: dict | None = None) -> str:
        out = self.b.value(f"{self.base}/{op_type.lower()}")
        self.nodes.append(Node(op_type, inputs, [out], attrs or {}, "", ""))
        return out

    def const(self, short: str, array) -> str:
        return self.b.constant(f"{self.base}/{short}", np.ascontiguousarray(array))


def _runtime_mask(bias: _Bias, mask: str, kind: str, dtype, batch: int, seq: int, filter_value: float,
                  causal: bool) -> str:
    """Graph ops turning a mask fed at run time into the additive bias [B, 1, S | 1, T]."""
    if kind == "end":  # key j kept while j < the row's end
        keys = bias.const("keys", np.arange(seq, dtype=dtype).reshape(1, seq))
        ends = bias.op("Reshape", [mask, bias.const("ends_shape", np.array([batch, 1], np.int64))])
        keep = bias.op("Less", [keys, ends])
    else:
        keep = bias.op("Greater", [mask, bias.const("zero", np.zeros((), dtype))])
    flat = bias.op("Where", [keep, bias.const("keep_bias", np.zeros((), np.float32)),
                             bias.const("hide_bias", np.array(filter_value, np.float32))])
    rows = seq if kind == "raw3" else 1
    value = bias.op("Reshape", [flat, bias.const("bias_shape", np.array([batch, 1, rows, seq], np.int64))])
    if causal:  # the keys after the query: float32's lowest, over the mask
        after = np.arange(seq)[None, :] > np.arange(seq)[:, None]
        value = bias.op("Where", [bias.const("causal", after), bias.const("lowest", np.finfo(np.float32).min),
                                  value])
    return value


def rewrite_contrib_attention(graph: Graph, node: Node, infos, consumers, b: Builder) -> list[Node] | None:
    """com.microsoft Attention as the module docstring describes, or None to leave it."""
    ins = list(node.inputs) + [""] * 7
    x, weights, proj_bias, mask, past, attention_bias, past_length = ins[:7]
    if len(node.inputs) > 7 or set(node.attrs) - _KNOWN or not node.outputs or not node.outputs[0]:
        return None
    ctx = Ctx(node.attrs, 1, len(node.outputs))
    if unsupported(ctx, bool(past), bool(past_length)) or any(used(graph, consumers, o) for o in node.outputs[1:]):
        return None
    xi = infos.get(x)
    w = _constant(graph, infos, weights)
    pb = _constant(graph, infos, proj_bias) if proj_bias else None
    if not static(xi) or xi.dtype != F32 or len(xi.shape) != 3 or w is None or w.dtype != F32 or w.ndim != 2:
        return None
    if w.shape[0] != xi.shape[2] or (proj_bias and (pb is None or pb.dtype != F32 or pb.shape != (w.shape[1],))):
        return None
    try:
        hq, hk, hv = qkv_sizes(ctx, w.shape[1])
    except KernelError:
        return None  # the kernel reports it
    heads = int(node.attrs["num_heads"])
    batch, seq = xi.shape[0], xi.shape[1]
    causal = bool(int(node.attrs.get("unidirectional", 0) or 0))
    filter_value = node.attrs.get("mask_filter_value")
    filter_value = MASK_FILTER_VALUE if filter_value is None else float(filter_value)
    if attention_bias:  # checked before any part of the bias is built: nothing below gives up
        ai = infos.get(attention_bias)
        if not static(ai) or ai.dtype != F32 or len(ai.shape) != 4 or \
                any(d not in (1, want) for d, want in zip(ai.shape, (batch, heads, seq, seq))):
            return None
    base = node.name or node.outputs[0]
    bias = _Bias(b, base)
    parts: list[np.ndarray] = []
    if mask:
        mi = infos.get(mask)
        if not static(mi) or mi.dtype.kind not in "iu":
            return None
        kind = mask_kind(mi.shape, batch, seq, seq)
        value = _constant(graph, infos, mask)
        if value is not None and kind is not None:
            parts.append(mask_bias(value, batch, seq, seq, filter_value, causal))
        elif kind in _RUNTIME_MASKS and graph.opset("") >= 9:  # one bias for every layer that reads the mask
            key = ("contrib attention mask", mask, kind, filter_value, causal)
            if key not in b.made:
                b.made[key] = _runtime_mask(bias, mask, kind, mi.dtype, batch, seq, filter_value, causal)
            bias.runtime = b.made[key]
        else:
            return None
    elif causal:
        parts.append(mask_bias(None, batch, seq, seq, filter_value, True))
    if attention_bias:
        value = _constant(graph, infos, attention_bias)
        if value is not None:
            parts.append(np.asarray(value, np.float32))
        else:
            bias.runtime = bias.op("Add", [bias.runtime, attention_bias]) if bias.runtime else attention_bias
    if parts:
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        constant = bias.const("bias", total.astype(np.float32))
        bias.runtime = bias.op("Add", [bias.runtime, constant]) if bias.runtime else constant

    # the packed projection: one GEMM (with its bias: nncc's FusedMatMul), then Q, K and V apart
    proj = b.value(f"{base}/qkv")
    if proj_bias:
        project = Node("FusedMatMul", [x, weights, proj_bias], [proj], {"onnx_opset": graph.opset("")}, NNCC,
                       f"{base}/qkv")
    else:
        project = Node("MatMul", [x, weights], [proj], {}, "", f"{base}/qkv")
    qkv = [b.value(f"{base}/{part}") for part in "qkv"]
    sizes = np.array([hq, hk, hv], np.int64)
    if graph.opset("") >= 13:
        split = Node("Split", [proj, b.constant(f"{base}/qkv_sizes", sizes)], qkv, {"axis": 2}, "", "")
    else:
        split = Node("Split", [proj], qkv, {"axis": 2, "split": [int(s) for s in sizes]}, "", "")
    scale = float(node.attrs.get("scale", 0.0) or 0.0) or 1.0 / math.sqrt(hq // heads)  # 0: the default
    attrs = {"scale": float(np.float32(scale))}
    fused = fused_node(b, node, qkv, bias.runtime, attrs, 3, heads, heads)
    return [project, split] + bias.nodes + fused
