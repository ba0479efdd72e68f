"""``nncc::FusedAttention(Q, K, V, [bias])``: scaled dot-product attention as one node,
made by the attention fusion (nncc.passes.attention) from the ops exporters write:
``MatMul(Q, Kᵀ) -> Mul/Div by a scalar -> Add(bias)? -> Softmax(last axis) -> MatMul(., V)``.

Each operand is read through a permutation of its stored axes, so the Transposes that split
heads (and the one that merges them back) are absorbed rather than copied:

* ``q_perm``, ``k_perm``, ``v_perm`` (ints, default identity): the logical operand is
  ``transpose(stored, perm)``; logically Q is ``[*batch, Sq, D]``, K is ``[*batch, Skv, D]``
  (not transposed) and V is ``[*batch, Skv, Dv]``;
* ``out_perm`` (ints, default identity): the stored output is ``transpose(Y, out_perm)``
  of the logical ``Y = [*batch, Sq, Dv]``;
* ``scale`` (float): the scores' multiplier;
* ``bias`` (optional input): added to the scaled scores, broadcast as the Add it came from;
* ``zero_hidden_rows`` (int, default 0): a query row whose every score is -inf gives zeros,
  as the ONNX Attention op defines it, rather than Softmax's NaN;
* ``zero_nan_rows`` (int, default 0): the probabilities Softmax makes NaN (a row whose
  scores are all -inf, or hold a NaN or +inf) are zeros, as ``Where(IsNaN(p), 0, p)``
  after the Softmax makes them; the row's output is then 0·V;
* ``head_group`` (int, default 1): grouped-query heads. On the last batch axis (the heads)
  K and V have ``1 / head_group`` as many entries as Q and the output, and query head ``h``
  reads K/V head ``h // head_group``; K and V are never copied per query head.

Batch axes broadcast as MatMul's do. The kernel computes exactly what the unfused ops did,
in the same order (scores, scale, bias, softmax, product), so the two agree to rounding.
"""

from __future__ import annotations

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import kernel
from nncc.kernels.shapes import check_broadcasts_to


def _perm(ctx, key: str, rank: int) -> list[int]:
    perm = ctx.get(key)
    if perm is None:
        return list(range(rank))
    perm = [int(p) for p in perm]
    if sorted(perm) != list(range(rank)):
        raise KernelError(f"FusedAttention: {key} {perm} is not a permutation of {rank} axes")
    return perm


def _logical_shape(ctx, key: str, shape):
    if shape is None:
        return None
    try:
        perm = _perm(ctx, key, len(shape))
    except KernelError as exc:
        raise ShapeInferenceError(str(exc)) from None
    return [shape[p] for p in perm]


def _broadcast(*dims):
    """Broadcast batch dims (None: unknown)."""
    out = None
    for d in dims:
        if d is None:
            return None
        if d == 1:
            out = out if out is not None else 1
        elif out in (None, 1):
            out = d
        elif out != d:
            raise ShapeInferenceError(f"FusedAttention: batch sizes {out} and {d} do not broadcast")
    return out


def _group(ctx) -> int:
    group = int(ctx.get("head_group", 1))
    if group < 1:
        raise KernelError(f"FusedAttention: head_group {group} must be at least 1")
    return group


def _shape(ctx, q, k, v, bias=None):
    shapes = [_logical_shape(ctx, key, info.shape) for key, info in
              (("q_perm", q), ("k_perm", k), ("v_perm", v))]
    for what, s in zip("QKV", shapes):
        if s is not None and len(s) < 2:
            raise ShapeInferenceError(f"FusedAttention: {what} must have rank >= 2, got shape {tuple(s)}")
    if any(s is None for s in shapes):
        return [TensorInfo(q.dtype, None)]
    try:
        group = _group(ctx)
    except KernelError as exc:
        raise ShapeInferenceError(str(exc)) from None
    if group > 1:  # K's and V's heads stand for `group` query heads each
        if any(len(s) < 3 for s in shapes):
            raise ShapeInferenceError("FusedAttention: grouped heads need a head axis on Q, K and V")
        shapes = [shapes[0]] + [s[:-3] + [None if s[-3] is None else s[-3] * group] + s[-2:] for s in shapes[1:]]
    ql, kl, vl = shapes
    for first, second, axes in ((ql[-1], kl[-1], "Q's and K's depths"), (kl[-2], vl[-2], "K's and V's lengths")):
        if isinstance(first, int) and isinstance(second, int) and first != second:
            raise ShapeInferenceError(f"FusedAttention: Q {ql}, K {kl} and V {vl} (logical) do not make an "
                                      f"attention: {axes} differ")
    rank = max(len(ql), len(kl), len(vl))
    batch = []
    for axis in range(rank - 2):
        dims = [s[len(s) - rank + axis] if len(s) - rank + axis >= 0 else 1 for s in shapes]
        batch.append(_broadcast(*dims))
    if all(d is not None for d in batch):  # the bias is added to the scores in place of the Add it was
        check_broadcasts_to("FusedAttention", "bias", bias, batch + [ql[-2], kl[-2]])
    y = batch + [ql[-2], vl[-1]]
    try:
        y = [y[p] for p in _perm(ctx, "out_perm", len(y))]
    except KernelError as exc:
        raise ShapeInferenceError(str(exc)) from None
    return [TensorInfo(q.dtype, tuple(y))]


def softmax_last(x: np.ndarray, zero_hidden_rows: bool) -> np.ndarray:
    top = np.max(x, axis=-1, keepdims=True)
    if zero_hidden_rows:
        top[np.isneginf(top)] = 0  # exp(-inf - 0) = 0: the row sums to 0
    np.subtract(x, top, out=x)
    np.exp(x, out=x)
    total = np.sum(x, axis=-1, keepdims=True)
    if zero_hidden_rows:
        total[total == 0] = 1
    x /= total
    return x


@kernel("FusedAttention", since=1, domain="nncc", shape=_shape)
def fused_attention(ctx, q, k, v, bias=None):
    for what, x in (("Q", q), ("K", k), ("V", v)):
        if x.ndim < 2 or x.dtype.kind != "f":
            raise KernelError(f"FusedAttention: {what} must be a floating-point tensor of rank >= 2")
    q = np.transpose(q, _perm(ctx, "q_perm", q.ndim))
    k = np.transpose(k, _perm(ctx, "k_perm", k.ndim))
    v = np.transpose(v, _perm(ctx, "v_perm", v.ndim))
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise KernelError(f"FusedAttention: Q {list(q.shape)}, K {list(k.shape)} and V {list(v.shape)} "
                          "do not make an attention")
    group = _group(ctx)
    if group > 1:
        if min(q.ndim, k.ndim, v.ndim) < 3 or k.shape[-3] != v.shape[-3] or q.shape[-3] != k.shape[-3] * group:
            raise KernelError(f"FusedAttention: Q {list(q.shape)}, K {list(k.shape)} and V {list(v.shape)} "
                              f"do not have {group} query heads to each K and V head")
        # (..., kv heads, group x Sq, D): each K and V head multiplied once, for its whole group
        q = q.reshape(q.shape[:-3] + (k.shape[-3], group * q.shape[-2], q.shape[-1]))
    try:
        scores = np.matmul(q, np.swapaxes(k, -1, -2))
        if group > 1:
            scores = scores.reshape(scores.shape[:-3] + (k.shape[-3] * group, -1, scores.shape[-1]))
        scores *= scores.dtype.type(ctx.get("scale", 1.0))
        if bias is not None:
            scores = scores + bias.astype(scores.dtype, copy=False)
        with np.errstate(invalid="ignore", over="ignore"):  # as Softmax: an all -inf row is NaN
            probs = softmax_last(scores, bool(ctx.get("zero_hidden_rows", 0)))
        if ctx.get("zero_nan_rows", 0):
            probs[np.isnan(probs)] = 0
        if group > 1:
            probs = probs.reshape(probs.shape[:-3] + (k.shape[-3], -1, probs.shape[-1]))
        y = np.matmul(probs, v)
        if group > 1:
            y = y.reshape(y.shape[:-3] + (k.shape[-3] * group, -1, y.shape[-1]))
    except ValueError as exc:  # batch axes or the bias that do not broadcast
        raise KernelError(f"FusedAttention: {exc}") from None
    return np.ascontiguousarray(np.transpose(y, _perm(ctx, "out_perm", y.ndim)))


# -- com.microsoft MultiHeadAttention ------------------------------------------------------------
# The plain form only (separate 3-D query, key and value; an optional float attention_bias),
# which the attention fusion turns into FusedAttention; this kernel runs it where the fusion
# is off (-O0 / -O1). Packed inputs, a packed bias, key padding masks, past keys and
# unidirectional attention are refused with a clear error.


def _mha_plain(ctx, inputs) -> None:
    extra = [i for i, x in enumerate(inputs) if i not in (0, 1, 2, 5) and x is not None]
    if extra or any(inputs[i] is None for i in (1, 2)) or int(ctx.get("unidirectional", 0)):
        raise KernelError("com.microsoft MultiHeadAttention: only separate query, key and value (with an optional "
                          "attention_bias) are supported, not packed inputs, a bias, a key padding mask, past "
                          "keys or unidirectional attention")
    if not ctx.get("num_heads"):
        raise KernelError("com.microsoft MultiHeadAttention: the num_heads attribute is required")


def _mha_shape(ctx, query, key=None, value=None, *rest):
    if query.shape is None or value is None or value.shape is None or len(query.shape) != 3:
        return [TensorInfo(query.dtype, None)]
    return [TensorInfo(query.dtype, (query.shape[0], query.shape[1], value.shape[2]))]


@kernel("MultiHeadAttention", since=1, domain="com.microsoft", shape=_mha_shape)
def multi_head_attention(ctx, query, key=None, value=None, bias=None, key_padding_mask=None, attention_bias=None,
                         past_key=None, past_value=None, past_sequence_length=None, cache_indirection=None):
    inputs = [query, key, value, bias, key_padding_mask, attention_bias, past_key, past_value, past_sequence_length,
              cache_indirection]
    _mha_plain(ctx, inputs)
    heads = int(ctx.get("num_heads"))
    if query.ndim != 3 or key.ndim != 3 or value.ndim != 3 or query.shape[2] % heads or value.shape[2] % heads:
        raise KernelError(f"com.microsoft MultiHeadAttention: query, key and value must be 3-D with a hidden "
                          f"size that splits into {heads} heads")
    split = [x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(0, 2, 1, 3) for x in (query, key, value)]
    scale = ctx.get("scale") or 1.0 / np.sqrt(split[0].shape[-1])
    try:
        scores = np.matmul(split[0], np.swapaxes(split[1], -1, -2)) * query.dtype.type(scale)
        if attention_bias is not None:
            scores = scores + attention_bias
        y = np.matmul(softmax_last(scores, False), split[2])
    except ValueError as exc:
        raise KernelError(f"com.microsoft MultiHeadAttention: {exc}") from None
    return np.ascontiguousarray(y.transpose(0, 2, 1, 3).reshape(query.shape[0], query.shape[1], -1))
