"""com.microsoft ``Attention``: the contrib op onnxruntime's transformer optimizer writes for
BERT-like encoders (and GPT-2, unidirectional). One input is projected by packed weights into
Q, K and V, then attended per head and the heads merged::

    [Q | K | V] = input [B, S, H_in] · weights [H_in, H + H + Hv] + bias
    scores = Q·Kᵀ · scale + mask + attention_bias      (per head; scale 0 or unset: 1/sqrt(H / heads))
    output [B, S, Hv] = softmax(scores) · V

The masks, as the op defines them: a hidden key gets ``mask_filter_value`` (-10000 unless set)
as its bias, not -inf, so a row whose keys are all hidden still averages them. mask_index may
be raw 0/1 of shape ``[B, T]`` or ``[B, S, T]`` (a value above 0 keeps the key), ``[B]``
(each row's keys end there: right padding) or ``[2 * B]`` (ends, then starts: left padding).
``unidirectional`` hides the keys after the query with float32's lowest, over any mask.

Refused with a clear error: past state, past_sequence_length, the 4-D mask, the ``[3 * B + 2]``
index form, rotary embedding and a shared past/present buffer. nncc.passes.attention_contrib
makes the forms with constant weights a GEMM and one nncc FusedAttention; this kernel runs the
rest (and everything at -O0 / -O1).
"""

from __future__ import annotations

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError, UnsupportedOpError
from nncc.ir.graph import TensorInfo
from nncc.kernels.fused_attention import softmax_last
from nncc.kernels.registry import kernel

MS = "com.microsoft"
MASK_FILTER_VALUE = -10000.0  # the op's default bias of a hidden key


def qkv_sizes(ctx, weight_columns: int | None) -> tuple[int, int, int] | None:
    """(H, H, Hv): the hidden sizes of Q, K and V, checked against the heads and the
    weights' columns (None when those are unknown)."""
    heads = int(ctx.get("num_heads") or 0)
    if heads <= 0:
        raise KernelError("com.microsoft Attention: the num_heads attribute must be positive")
    sizes = ctx.get("qkv_hidden_sizes")
    if sizes:
        sizes = [int(s) for s in sizes]
        if len(sizes) != 3 or sizes[0] != sizes[1]:
            raise KernelError(f"com.microsoft Attention: qkv_hidden_sizes {sizes} must be three sizes, "
                              "Q's and K's the same")
    elif weight_columns is None:
        return None
    else:
        if weight_columns % 3:
            raise KernelError(f"com.microsoft Attention: the weights' {weight_columns} columns do not split "
                              "into Q, K and V")
        sizes = [weight_columns // 3] * 3
    if weight_columns is not None and sum(sizes) != weight_columns:
        raise KernelError(f"com.microsoft Attention: qkv_hidden_sizes {sizes} do not add up to the weights' "
                          f"{weight_columns} columns")
    if any(s <= 0 or s % heads for s in sizes):
        raise KernelError(f"com.microsoft Attention: hidden sizes {sizes} do not split into {heads} heads")
    return sizes[0], sizes[1], sizes[2]


def unsupported(ctx, past_given: bool, past_length_given: bool) -> str | None:
    """Why this node's form is not one nncc runs, or None."""
    if past_given or past_length_given:
        return "past state"
    if int(ctx.get("do_rotary", 0) or 0):
        return "rotary embedding"
    if int(ctx.get("past_present_share_buffer", 0) or 0):
        return "a shared past and present buffer"
    return None


def mask_kind(shape, batch: int, seq: int, total: int) -> str | None:
    """Which mask_index form a shape is ('raw2', 'raw3', 'end', 'end_start'), or None."""
    shape = tuple(shape)
    if shape == (batch, total):
        return "raw2"
    if shape == (batch, seq, total):
        return "raw3"
    if shape == (batch,):
        return "end"
    if shape == (2 * batch,):
        return "end_start"
    return None


def mask_bias(mask, batch: int, seq: int, total: int, filter_value: float, causal: bool,
              dtype=np.float32) -> np.ndarray | None:
    """The additive bias the op puts on the scores for its mask and unidirectional flag:
    [B | 1, 1, S | 1, T], broadcast over the heads; None for neither."""
    dtype = np.dtype(dtype)
    bias = None
    if mask is not None:
        mask = np.asarray(mask)
        kind = mask_kind(mask.shape, batch, seq, total)
        if kind is None:
            raise KernelError(f"com.microsoft Attention: mask_index of shape {list(mask.shape)} is not supported "
                              f"(taken: [{batch}, {total}], [{batch}, {seq}, {total}], [{batch}] or [{2 * batch}])")
        if kind == "raw2":
            keep = (mask > 0)[:, None, None, :]
        elif kind == "raw3":
            keep = (mask > 0)[:, None, :, :]
        else:
            keys = np.arange(total)[None, :]
            ends = mask[:batch].astype(np.int64)[:, None]
            keep = keys < ends
            if kind == "end_start":
                keep &= keys >= mask[batch:].astype(np.int64)[:, None]
            keep = keep[:, None, None, :]
        bias = np.where(keep, dtype.type(0), dtype.type(filter_value))
    if causal:
        hidden = np.arange(total)[None, :] > np.arange(seq)[:, None]
        base = bias if bias is not None else dtype.type(0)
        bias = np.where(hidden, np.finfo(dtype).min, base).astype(dtype)
        if bias.ndim < 4:
            bias = bias.reshape((1, 1) + bias.shape[-2:])
    return bias


def _shape(ctx, x, weights, bias=None, mask=None, past=None, attention_bias=None, past_length=None):
    why = unsupported(ctx, past is not None, past_length is not None)
    if why:  # refused when compiling, as bad input, rather than when run
        raise UnsupportedOpError("Attention", MS, 1, f"{why} is not supported")
    try:
        sizes = qkv_sizes(ctx, weights.shape[1] if weights.shape is not None and len(weights.shape) == 2 else None)
    except KernelError as exc:
        raise ShapeInferenceError(str(exc)) from None
    if x.shape is None or len(x.shape) != 3 or sizes is None:
        return [TensorInfo(x.dtype, None) for _ in range(max(ctx.num_outputs, 1))]
    heads = int(ctx.get("num_heads"))
    batch, seq = x.shape[0], x.shape[1]
    known = mask is not None and mask.shape is not None and all(isinstance(d, int) for d in (*mask.shape, batch, seq))
    if known and mask_kind(mask.shape, batch, seq, seq) is None:
        raise UnsupportedOpError("Attention", MS, 1, f"mask_index of shape {list(mask.shape)} is not supported")
    outs = [TensorInfo(x.dtype, (batch, seq, sizes[2])),
            TensorInfo(x.dtype, (2, batch, heads, seq, sizes[0] // heads))]
    return outs[:max(ctx.num_outputs, 1)]


def _heads(x: np.ndarray, heads: int) -> np.ndarray:
    batch, seq, hidden = x.shape
    return x.reshape(batch, seq, heads, hidden // heads).transpose(0, 2, 1, 3)


@kernel("Attention", since=1, domain=MS, shape=_shape)
def attention(ctx, x, weights, bias=None, mask_index=None, past=None, attention_bias=None, past_length=None):
    why = unsupported(ctx, past is not None, past_length is not None)
    if why:
        raise KernelError(f"com.microsoft Attention with {why} is not supported")
    if x.ndim != 3 or weights.ndim != 2 or x.shape[2] != weights.shape[0]:
        raise KernelError(f"com.microsoft Attention: input {list(x.shape)} and weights {list(weights.shape)} "
                          "must be [batch, sequence, hidden] and [hidden, Q + K + V hidden sizes]")
    hq, hk, hv = qkv_sizes(ctx, weights.shape[1])
    heads = int(ctx.get("num_heads"))
    proj = np.matmul(x, weights)
    if bias is not None:
        if bias.shape != (weights.shape[1],):
            raise KernelError(f"com.microsoft Attention: bias {list(bias.shape)} must be [{weights.shape[1]}]")
        proj += bias
    q, k, v = (_heads(proj[..., a:b], heads) for a, b in ((0, hq), (hq, hq + hk), (hq + hk, hq + hk + hv)))
    batch, seq = x.shape[0], x.shape[1]
    scale = float(ctx.get("scale", 0.0) or 0.0) or 1.0 / np.sqrt(hq // heads)
    filter_value = ctx.get("mask_filter_value")
    filter_value = MASK_FILTER_VALUE if filter_value is None else float(filter_value)
    masked = mask_bias(mask_index, batch, seq, seq, filter_value, bool(int(ctx.get("unidirectional", 0) or 0)),
                       x.dtype)
    try:
        scores = np.matmul(q, np.swapaxes(k, -1, -2))
        scores *= scores.dtype.type(scale)
        if masked is not None:
            scores += masked
        if attention_bias is not None:
            scores += attention_bias
        with np.errstate(over="ignore", invalid="ignore"):
            y = np.matmul(softmax_last(scores, False), v)
    except ValueError as exc:  # an attention_bias that does not broadcast to the scores
        raise KernelError(f"com.microsoft Attention: {exc}") from None
    y = np.ascontiguousarray(y.transpose(0, 2, 1, 3).reshape(batch, seq, hv))
    if ctx.num_outputs < 2:
        return y
    if hk != hv:
        raise KernelError("com.microsoft Attention: present needs K and V of the same hidden size")
    return y, np.ascontiguousarray(np.stack([k, v]))
