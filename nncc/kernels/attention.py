"""Attention-family kernels: Attention (23-25), RotaryEmbedding (23), the sequence mixers
of opset 27 (CausalConvWithState, LinearAttention) and FlexAttention (ai.onnx.preview).

Attention follows the operator's pattern step by step in the input dtype (Q and K are each
scaled by sqrt(scale) before their product, softcap comes before the mask, softmax may run
at `softmax_precision`), so results agree with other runtimes to rounding. Grouped-query
heads are never copied: Q is viewed as (batch, kv_heads, group * q_len, head) and multiplied
against each KV head once. A query row whose mask allows no key gives zeros, not NaN.
"""

from __future__ import annotations

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.dtypes import to_numpy
from nncc.ir.graph import Dim, TensorInfo
from nncc.kernels.registry import kernel


def _mul(a: Dim, b: Dim) -> Dim:
    return a * b if isinstance(a, int) and isinstance(b, int) else None


def _add(a: Dim, b: Dim) -> Dim:
    return a + b if isinstance(a, int) and isinstance(b, int) else None


def _div(a: Dim, b: int, what: str) -> Dim:
    if not isinstance(a, int):
        return None
    if b <= 0 or a % b:
        raise ShapeInferenceError(f"{what} of size {a} does not split into {b} heads")
    return a // b


# --------------------------------------------------------------------------- Attention


def _heads(ctx, rank: int) -> tuple[int | None, int | None]:
    q_heads, kv_heads = ctx.get("q_num_heads"), ctx.get("kv_num_heads")
    if rank == 3:
        if not q_heads or not kv_heads:
            raise KernelError("Attention: 3-D inputs need the q_num_heads and kv_num_heads attributes")
    elif ctx.opset >= 25 and (q_heads is not None or kv_heads is not None):
        raise KernelError("Attention: q_num_heads and kv_num_heads must not be set for 4-D inputs")
    return q_heads, kv_heads


def _attention_shape(ctx, q, k, v, mask=None, past_key=None, past_value=None, nonpad=None):
    if q.shape is None or k.shape is None or v.shape is None:
        return [TensorInfo(q.dtype, None) for _ in range(max(ctx.num_outputs, 1))]
    if not len(q.shape) == len(k.shape) == len(v.shape) or len(q.shape) not in (3, 4):
        raise ShapeInferenceError("Q, K and V must all be 3-D or all 4-D")
    try:
        q_heads, kv_heads = _heads(ctx, len(q.shape))
    except KernelError as exc:
        raise ShapeInferenceError(str(exc)) from None
    if len(q.shape) == 3:
        batch, q_len = q.shape[0], q.shape[1]
        kv_len = k.shape[1]
        head = _div(k.shape[2], kv_heads, "K's hidden size")
        v_head = _div(v.shape[2], kv_heads, "V's hidden size")
        _div(q.shape[2], q_heads, "Q's hidden size")
        y = TensorInfo(q.dtype, (batch, q_len, _mul(v_head, q_heads)))
    else:
        batch, q_heads, q_len = q.shape[0], q.shape[1], q.shape[2]
        kv_heads, kv_len, head = k.shape[1], k.shape[2], k.shape[3]
        v_head = v.shape[3]
        y = TensorInfo(q.dtype, (batch, q_heads, q_len, v_head))
    total = kv_len if past_key is None else _add(past_key.shape[2] if past_key.shape else None, kv_len)
    outs = [
        y,
        TensorInfo(k.dtype, (batch, kv_heads, total, head)),
        TensorInfo(v.dtype, (batch, kv_heads, total, v_head)),
        TensorInfo(q.dtype, (batch, q_heads, q_len, total)),
    ]
    return outs[: max(ctx.num_outputs, 1)]


def _to_4d(x: np.ndarray, heads: int, what: str) -> np.ndarray:
    batch, length, hidden = x.shape
    if hidden % heads:
        raise KernelError(f"Attention: {what}'s hidden size {hidden} does not split into {heads} heads")
    return x.reshape(batch, length, heads, hidden // heads).transpose(0, 2, 1, 3)


def _allowed_band(q_len: int, kv_len: int, offset, left: int, right: int, causal: bool):
    """Which keys each query may see under causal masking and a sliding window, as bool of
    shape (q, kv) or, for a per-batch offset, (batch, 1, q, kv); None when unrestricted.
    Query i sits at absolute position i + offset."""
    if not causal and left < 0 and right < 0:
        return None
    i = np.arange(q_len).reshape(q_len, 1)
    j = np.arange(kv_len).reshape(1, kv_len)
    if np.ndim(offset):
        i = i + np.asarray(offset, np.int64).reshape(-1, 1, 1, 1)
    else:
        i = i + int(offset)
    diff = i - j  # how far key j lies behind the query
    allowed = np.ones(diff.shape, bool)
    if causal:
        allowed &= diff >= 0
    if left >= 0:
        allowed &= diff <= left
    if right >= 0:
        allowed &= -diff <= right
    return allowed


def _bias(ctx, mask, q_len: int, kv_len: int, dtype, offset) -> np.ndarray | None:
    """The additive bias (0 or -inf from boolean masks, causal masking and windows; float
    masks as given), broadcastable to (batch, q_heads, q_len, kv_len); None for none."""
    neg_inf = dtype.type(-np.inf)
    bias = None
    if mask is not None:
        pad = kv_len - mask.shape[-1]
        if pad < 0:
            raise KernelError(
                f"Attention: attn_mask's last dimension {mask.shape[-1]} exceeds the {kv_len} keys")
        if mask.dtype == np.bool_:
            bias = np.where(mask, dtype.type(0), neg_inf)
        else:
            bias = mask.astype(dtype, copy=False)
        if pad:
            widths = [(0, 0)] * (bias.ndim - 1) + [(0, pad)]
            bias = np.pad(bias, widths, constant_values=neg_inf)
    left = int(ctx.get("left_window_size", -1)) if ctx.opset >= 25 else -1
    right = int(ctx.get("right_window_size", -1)) if ctx.opset >= 25 else -1
    if left < -1 or right < -1:
        raise KernelError("Attention: window sizes must be -1 or nonnegative")
    band = _allowed_band(q_len, kv_len, offset, left, right, bool(ctx.get("is_causal", 0)))
    if band is not None:
        banded = np.where(band, dtype.type(0), neg_inf)
        bias = banded if bias is None else bias + banded
    return bias


def _is_float(dtype: np.dtype) -> bool:
    """numpy floats, and ml_dtypes' bfloat16 (which numpy sees as a void kind)."""
    return dtype.kind == "f" or dtype.name == "bfloat16"


def _softmax_rows(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; an all -inf row gives zeros (no NaN, no warning)."""
    top = np.max(x, axis=-1, keepdims=True)
    top[np.isneginf(top)] = 0
    x = np.subtract(x, top, out=x if x.flags.writeable else None)
    np.exp(x, out=x)
    total = np.sum(x, axis=-1, keepdims=True)
    total[total == 0] = 1
    x /= total
    return x


def _softcap(x: np.ndarray, cap: float) -> np.ndarray:
    cap = x.dtype.type(cap)
    return np.tanh(x / cap) * cap


def _attention(ctx, q, k, v, mask=None, past_key=None, past_value=None, nonpad=None):
    if not q.ndim == k.ndim == v.ndim or q.ndim not in (3, 4):
        raise KernelError(f"Attention: Q, K and V must all be 3-D or all 4-D, got ranks "
                          f"{q.ndim}, {k.ndim} and {v.ndim}")
    if (past_key is None) != (past_value is None):
        raise KernelError("Attention: past_key and past_value must be given together")
    if nonpad is not None and past_key is not None:
        raise KernelError("Attention: nonpad_kv_seqlen cannot be combined with past_key/past_value")
    dtype = q.dtype
    if not _is_float(dtype):
        raise KernelError(f"Attention: unsupported input dtype {dtype}")
    three_d = q.ndim == 3
    q_heads, kv_heads = _heads(ctx, q.ndim)
    if three_d:
        q, k, v = _to_4d(q, q_heads, "Q"), _to_4d(k, kv_heads, "K"), _to_4d(v, kv_heads, "V")
    batch, q_heads, q_len, head = q.shape
    kv_heads = k.shape[1]
    if k.shape[3] != head or k.shape[0] != batch or v.shape[:3] != k.shape[:3]:
        raise KernelError(f"Attention: K {k.shape} and V {v.shape} do not fit Q {q.shape}")
    if q_heads % kv_heads:
        raise KernelError(f"Attention: {q_heads} query heads are not a multiple of {kv_heads} KV heads")
    if past_key is not None:
        k = np.concatenate((past_key, k), axis=2)
        v = np.concatenate((past_value, v), axis=2)
    present_key, present_value = k, v
    kv_len = k.shape[2]

    scale = ctx.get("scale")
    if scale is None:
        scale = 1.0 / np.sqrt(head)
    root = dtype.type(np.sqrt(scale))
    group = q_heads // kv_heads
    # (batch, kv_heads, group * q_len, head) @ (batch, kv_heads, head, kv_len): one product
    # per KV head covers its whole group of query heads
    qg = (q * root).reshape(batch, kv_heads, group * q_len, head)
    kt = (k * root).transpose(0, 1, 3, 2)
    # (numpy multiplies bfloat16 in float32: round back to the operator's type)
    scores = np.matmul(qg, kt).astype(dtype, copy=False).reshape(batch, q_heads, q_len, kv_len)

    mode = int(ctx.get("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        raise KernelError(f"Attention: qk_matmul_output_mode must be 0 to 3, not {mode}")
    wanted = ctx.num_outputs > 3
    qk_out = scores if mode == 0 and wanted else None  # the raw product
    softcap = float(ctx.get("softcap", 0.0) or 0.0)
    if softcap > 0:
        scores = _softcap(scores, softcap)
    if mode == 1 and wanted:
        qk_out = scores

    if past_key is not None:
        offset = past_key.shape[2]
    elif nonpad is not None:
        offset = nonpad.reshape(-1).astype(np.int64) - q_len
    else:
        offset = 0
    bias = _bias(ctx, mask, q_len, kv_len, dtype, offset)
    if nonpad is not None:
        keep = np.arange(kv_len) < nonpad.reshape(-1, 1, 1, 1)
        padding = np.where(keep, dtype.type(0), dtype.type(-np.inf))
        bias = padding if bias is None else bias + padding
    logits = scores if bias is None else scores + bias
    if mode == 2 and wanted:
        qk_out = logits
    if logits is qk_out:  # the softmax below works in place
        logits = logits.copy()

    precision = ctx.get("softmax_precision")
    work = dtype
    if precision is not None:
        work = to_numpy(int(precision))
        if work is None or work.kind != "f":
            raise KernelError(f"Attention: softmax_precision {precision} is not supported")
    probs = _softmax_rows(logits.astype(work, copy=False))
    if bias is not None:
        dead = np.isneginf(np.max(bias, axis=-1, keepdims=True))
        if dead.any():
            probs = np.where(dead, work.type(0), probs)
    probs = probs.astype(dtype, copy=False)
    if mode == 3:
        qk_out = probs

    # (batch, kv_heads, group * q_len, kv_len) @ (batch, kv_heads, kv_len, v_head)
    v_head = v.shape[3]
    pg = np.broadcast_to(probs, (batch, q_heads, q_len, kv_len)).reshape(
        batch, kv_heads, group * q_len, kv_len)
    y = np.matmul(pg, v).astype(dtype, copy=False).reshape(batch, q_heads, q_len, v_head)
    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(batch, q_len, q_heads * v_head)
    results = [y, present_key, present_value,
               None if qk_out is None else np.broadcast_to(
                   qk_out, (batch, q_heads, q_len, kv_len)).astype(dtype)]
    results = [np.ascontiguousarray(r) if r is not None else r for r in results]
    return tuple(results[: max(ctx.num_outputs, 1)]) if ctx.num_outputs > 1 else results[0]


for _since in (23, 24, 25):
    kernel("Attention", _since, shape=_attention_shape)(_attention)


# --------------------------------------------------------------------------- RotaryEmbedding


def _rotary_shape(ctx, x, cos, sin, position_ids=None):
    return [TensorInfo(x.dtype, x.shape)]


@kernel("RotaryEmbedding", 23, shape=_rotary_shape)
def rotary_embedding(ctx, x, cos, sin, position_ids=None):
    if x.ndim == 4:  # (batch, heads, seq, head) -> (batch, seq, heads, head)
        xs = x.transpose(0, 2, 1, 3)
    elif x.ndim == 3:
        heads = int(ctx.get("num_heads", 0))
        if heads <= 0 or x.shape[2] % heads:
            raise KernelError("RotaryEmbedding: a 3-D input needs num_heads dividing its hidden size")
        xs = x.reshape(x.shape[0], x.shape[1], heads, x.shape[2] // heads)
    else:
        raise KernelError(f"RotaryEmbedding: input must be 3-D or 4-D, got shape {x.shape}")
    head = xs.shape[3]
    dim = int(ctx.get("rotary_embedding_dim", 0)) or head
    if dim > head or dim % 2:
        raise KernelError(f"RotaryEmbedding: rotary_embedding_dim {dim} does not fit head size {head}")
    half = dim // 2
    if position_ids is not None:
        if np.any(position_ids < 0) or np.any(position_ids >= cos.shape[0]):
            raise KernelError("RotaryEmbedding: position_ids out of range of the caches")
        cos, sin = cos[position_ids], sin[position_ids]  # (batch, seq, half)
    if cos.shape[-1] != half or sin.shape[-1] != half:
        raise KernelError(
            f"RotaryEmbedding: the caches' last dimension must be {half}, got {cos.shape[-1]}")
    cos = cos[..., None, :].astype(x.dtype, copy=False)  # broadcast over heads
    sin = sin[..., None, :].astype(x.dtype, copy=False)
    out = np.array(xs, dtype=x.dtype, order="C")
    if ctx.get("interleaved", 0):
        x1, x2 = xs[..., 0:dim:2], xs[..., 1:dim:2]
        out[..., 0:dim:2] = cos * x1 - sin * x2
        out[..., 1:dim:2] = sin * x1 + cos * x2
    else:
        x1, x2 = xs[..., :half], xs[..., half:dim]
        out[..., :half] = cos * x1 - sin * x2
        out[..., half:dim] = sin * x1 + cos * x2
    if x.ndim == 4:
        return np.ascontiguousarray(out.transpose(0, 2, 1, 3))
    return out.reshape(x.shape)


# --------------------------------------------------------------------------- CausalConvWithState


def _causal_conv_shape(ctx, x, weight, bias=None, past_state=None):
    k = weight.shape[2] if weight.shape is not None and len(weight.shape) == 3 else None
    state = None
    if x.shape is not None and len(x.shape) == 3:
        state = (x.shape[0], x.shape[1], k - 1 if isinstance(k, int) else None)
    return [TensorInfo(x.dtype, x.shape), TensorInfo(x.dtype, state)]


def _silu(x: np.ndarray) -> np.ndarray:
    wide = x.astype(np.float32) if x.dtype.itemsize < 4 else x
    return wide / (1 + np.exp(-wide))


@kernel("CausalConvWithState", 27, shape=_causal_conv_shape)
def causal_conv_with_state(ctx, x, weight, bias=None, past_state=None):
    """Depthwise 1-D convolution over time that sees only the past: the carried state (or
    zeros) is prepended, and its last k - 1 steps are the next state."""
    activation = ctx.get("activation", "none") or "none"
    if activation not in ("none", "silu", "swish"):
        raise KernelError(f"CausalConvWithState: unknown activation {activation!r}")
    if x.ndim != 3 or weight.ndim != 3 or weight.shape[1] != 1 or weight.shape[0] != x.shape[1]:
        raise KernelError(f"CausalConvWithState: input {x.shape} needs weight (channels, 1, k), "
                          f"got {weight.shape}")
    batch, channels, _ = x.shape
    k = weight.shape[2]
    if k < 1:
        raise KernelError("CausalConvWithState: the kernel size must be at least 1")
    if past_state is None:
        past_state = np.zeros((batch, channels, k - 1), dtype=x.dtype)
    elif past_state.shape != (batch, channels, k - 1):
        raise KernelError(f"CausalConvWithState: past_state must have shape "
                          f"{(batch, channels, k - 1)}, got {past_state.shape}")
    padded = np.concatenate([past_state.astype(x.dtype, copy=False), x], axis=2)
    wide = np.float32 if x.dtype.itemsize < 4 else x.dtype
    windows = np.lib.stride_tricks.sliding_window_view(padded, k, axis=2)  # (b, c, length, k)
    out = np.einsum("bclk,ck->bcl", windows.astype(wide, copy=False),
                    weight[:, 0, :].astype(wide, copy=False))
    if bias is not None:
        out += bias.astype(wide, copy=False)[:, None]
    out = out.astype(x.dtype, copy=False)
    if activation != "none":
        out = _silu(out).astype(x.dtype, copy=False)
    present = np.ascontiguousarray(padded[:, :, padded.shape[2] - (k - 1):])
    return out, present


# --------------------------------------------------------------------------- LinearAttention

_RULES = ("linear", "gated", "delta", "gated_delta")


def _linear_attention_shape(ctx, q, k, v, past_state=None, decay=None, beta=None):
    q_heads, kv_heads = int(ctx.get("q_num_heads", 0) or 0), int(ctx.get("kv_num_heads", 0) or 0)
    if q_heads <= 0 or kv_heads <= 0:
        raise ShapeInferenceError("LinearAttention needs q_num_heads and kv_num_heads")
    state_dtype = q.dtype if past_state is None else past_state.dtype
    if q.shape is None or v.shape is None or len(q.shape) != 3 or len(v.shape) != 3:
        return [TensorInfo(q.dtype, None), TensorInfo(state_dtype, None)]
    d_k = _div(q.shape[2], q_heads, "query's hidden size")
    d_v = _div(v.shape[2], kv_heads, "value's hidden size")
    return [TensorInfo(q.dtype, (q.shape[0], q.shape[1], _mul(d_v, q_heads))),
            TensorInfo(state_dtype, (q.shape[0], kv_heads, d_k, d_v))]


def _heads_first(x: np.ndarray, heads: int, what: str) -> np.ndarray:
    """(batch, time, heads * d) -> (batch, heads, time, d) in float32."""
    b, t, hd = x.shape
    if hd % heads:
        raise KernelError(f"LinearAttention: {what}'s last dimension {hd} does not split into {heads} heads")
    return x.reshape(b, t, heads, hd // heads).transpose(0, 2, 1, 3).astype(np.float32)


@kernel("LinearAttention", 27, shape=_linear_attention_shape)
def linear_attention(ctx, q, k, v, past_state=None, decay=None, beta=None):
    """Recurrent linear attention: a (d_k, d_v) state per KV head is decayed (gated rules),
    corrected toward the new value (delta rules), extended by k v^T and read by q, one
    time step after another (each step vectorized over batch and heads), in float32."""
    rule = ctx.get("update_rule", "gated_delta") or "gated_delta"
    if rule not in _RULES:
        raise KernelError(f"LinearAttention: unknown update_rule {rule!r}")
    q_heads, kv_heads = int(ctx.get("q_num_heads", 0) or 0), int(ctx.get("kv_num_heads", 0) or 0)
    if q_heads <= 0 or kv_heads <= 0 or q_heads % kv_heads:
        raise KernelError(f"LinearAttention: q_num_heads {q_heads} must be a positive multiple "
                          f"of kv_num_heads {kv_heads}")
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gated != (decay is not None):
        raise KernelError(f"LinearAttention: update_rule {rule!r} "
                          f"{'needs' if gated else 'forbids'} the decay input")
    if delta != (beta is not None):
        raise KernelError(f"LinearAttention: update_rule {rule!r} "
                          f"{'needs' if delta else 'forbids'} the beta input")
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise KernelError("LinearAttention: query, key and value must be (batch, time, heads * d)")
    b, t, _ = q.shape
    q4 = _heads_first(q, q_heads, "query")
    k4 = _heads_first(k, kv_heads, "key")
    v4 = _heads_first(v, kv_heads, "value")
    d_k, d_v = q4.shape[3], v4.shape[3]
    if k4.shape != (b, kv_heads, t, d_k) or v4.shape[:3] != (b, kv_heads, t):
        raise KernelError(f"LinearAttention: key {k.shape} and value {v.shape} do not fit query {q.shape}")
    group = q_heads // kv_heads
    gate = None
    if gated:
        if decay.ndim != 3 or decay.shape[:2] != (b, t) or decay.shape[2] not in (kv_heads, kv_heads * d_k):
            raise KernelError(f"LinearAttention: decay must be (batch, time, {kv_heads}) or "
                              f"(batch, time, {kv_heads * d_k}), got {decay.shape}")
        per = 1 if decay.shape[2] == kv_heads else d_k
        gate = np.exp(decay.reshape(b, t, kv_heads, per).transpose(0, 2, 1, 3).astype(np.float32))
    rate = None
    if delta:
        if beta.ndim != 3 or beta.shape[:2] != (b, t) or beta.shape[2] not in (kv_heads, 1):
            raise KernelError(f"LinearAttention: beta must be (batch, time, {kv_heads}) or "
                              f"(batch, time, 1), got {beta.shape}")
        rate = beta.reshape(b, t, beta.shape[2], 1).transpose(0, 2, 1, 3).astype(np.float32)
    if past_state is not None:
        if past_state.shape != (b, kv_heads, d_k, d_v):
            raise KernelError(f"LinearAttention: past_state must have shape {(b, kv_heads, d_k, d_v)}, "
                              f"got {past_state.shape}")
        state_dtype = past_state.dtype
        state = past_state.astype(np.float32)  # a copy: updated in place below
    else:
        state_dtype = q.dtype
        state = np.zeros((b, kv_heads, d_k, d_v), np.float32)
    scale = ctx.get("scale") or 1.0 / np.sqrt(d_k)
    # queries grouped by their KV head: (b, kv_heads, group, t, d_k)
    qg = q4.reshape(b, kv_heads, group, t, d_k) * np.float32(scale)
    out = np.empty((b, kv_heads, group, t, d_v), np.float32)
    for i in range(t):
        k_t, v_t = k4[:, :, i, :], v4[:, :, i, :]
        if gate is not None:
            state *= gate[:, :, i, :, None]
        if rate is not None:
            recalled = np.matmul(k_t[:, :, None, :], state)[:, :, 0, :]  # S^T k
            v_t = rate[:, :, i, :] * (v_t - recalled)
        state += k_t[:, :, :, None] * v_t[:, :, None, :]
        out[:, :, :, i, :] = np.matmul(qg[:, :, :, i, :], state)
    y = out.reshape(b, q_heads, t, d_v).transpose(0, 2, 1, 3).reshape(b, t, q_heads * d_v)
    return y.astype(q.dtype), state.astype(state_dtype)


# --------------------------------------------------------------------------- FlexAttention


def _flex_shape(ctx, q, k, v):
    if q.shape is None or v.shape is None:
        return [TensorInfo(q.dtype, None)]
    if len(q.shape) != 4 or len(v.shape) != 4:
        raise ShapeInferenceError("FlexAttention expects 4-D Q, K and V")
    return [TensorInfo(q.dtype, (q.shape[0], q.shape[1], q.shape[2], v.shape[3]))]


def _modifier(ctx, name: str):
    """The `score_mod` / `prob_mod` subgraph as a function of one array, or None."""
    graph = ctx.get(name)
    if graph is None:
        return None
    runner = ctx.scratch.get(name)
    if runner is None:
        from nncc.runtime.interpreter import Interpreter  # lazy: start-up (the runtime imports the kernels)

        if len(graph.inputs) != 1 or len(graph.outputs) != 1:
            raise KernelError(f"FlexAttention: {name} must have one input and one output")
        runner = ctx.scratch[name] = Interpreter(graph)

    def apply(x: np.ndarray) -> np.ndarray:
        out = runner.run({runner.graph.inputs[0]: x})[runner.graph.outputs[0]]
        if out.shape != x.shape:
            raise KernelError(f"FlexAttention: {name} changed the shape {x.shape} to {out.shape}")
        return out.astype(x.dtype, copy=False)

    return apply


@kernel("FlexAttention", 1, "ai.onnx.preview", shape=_flex_shape)
def flex_attention(ctx, q, k, v):
    """Scaled dot-product attention whose scores and probabilities may be rewritten by the
    `score_mod` and `prob_mod` subgraphs; softmax runs at `softmax_precision` (float32
    unless the inputs are double)."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise KernelError("FlexAttention expects 4-D Q, K and V")
    if not _is_float(q.dtype):
        raise KernelError(f"FlexAttention: unsupported input dtype {q.dtype}")
    dtype = q.dtype
    batch, q_heads, q_len, head = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    if k.shape[0] != batch or k.shape[3] != head or v.shape[:3] != k.shape[:3]:
        raise KernelError(f"FlexAttention: K {k.shape} and V {v.shape} do not fit Q {q.shape}")
    if kv_heads == 0 or q_heads % kv_heads:
        raise KernelError(f"FlexAttention: {q_heads} query heads are not a multiple of {kv_heads} KV heads")
    precision = ctx.get("softmax_precision")
    if precision is not None:
        work = to_numpy(int(precision))
        if work is None or work.kind != "f":
            raise KernelError(f"FlexAttention: softmax_precision {precision} is not supported")
    else:
        work = np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)
    scale = ctx.get("scale")
    if scale is None:
        scale = 1.0 / np.sqrt(head)
    root = dtype.type(np.sqrt(np.float32(scale)))
    group = q_heads // kv_heads
    qg = (q * root).reshape(batch, kv_heads, group * q_len, head)
    kt = (k * root).transpose(0, 1, 3, 2)
    scores = np.matmul(qg, kt).astype(dtype, copy=False).reshape(batch, q_heads, q_len, kv_len)
    scores = scores.astype(work)
    score_mod, prob_mod = _modifier(ctx, "score_mod"), _modifier(ctx, "prob_mod")
    if score_mod is not None:
        scores = np.array(score_mod(scores), dtype=work)
    probs = _softmax_rows(scores)
    if prob_mod is not None:
        probs = prob_mod(probs)
    probs = probs.astype(dtype, copy=False).reshape(batch, kv_heads, group * q_len, kv_len)
    y = np.matmul(probs, v).astype(dtype, copy=False)
    return y.reshape(batch, q_heads, q_len, v.shape[3])
