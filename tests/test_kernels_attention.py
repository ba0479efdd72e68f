"""Attention-family kernels (Attention, RotaryEmbedding, LinearAttention, CausalConvWithState,
FlexAttention) beyond ONNX's node suite.

Oracles:
  * onnxruntime for Attention (opsets 23-25) and RotaryEmbedding-23, including a real-size
    case (batch 2, 8 query heads over 2 KV heads, sequence 128, head size 64, causal);
    where onnxruntime refuses an input the spec allows (an attn_mask shorter than the keys),
    the oracle runs the equivalent input the spec defines it as (the mask padded with False);
  * onnx.reference for the ops onnxruntime does not implement (LinearAttention and
    CausalConvWithState of opset 27, FlexAttention of ai.onnx.preview), plus a property
    that does not depend on any implementation: running a sequence in one call equals
    running it in pieces with the state carried over.

Every model runs by both nncc routes: the interpreter, and compile -> artifact bytes -> load
-> executor, so shape functions and plan serialization are exercised too.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
import pytest

from nncc.compiler import CompileOptions, compile_graph
from nncc.errors import NnccError
from nncc.frontend.onnx import parse_model
from nncc.runtime.interpreter import Interpreter
from tests.one_node_graphs import one_node as shared_one_node
from tests.one_node_graphs import run_nncc
from tests.oracle import ort_run


def one_node(op, inputs, n_out, attrs, opset, domain="", outs=None):
    opsets = {"": opset} if not domain else {"": 26, domain: 1}
    return shared_one_node(op, inputs, n_out, attrs, opsets, domain=domain, outs=outs)


def check(op, inputs, n_out, attrs, opset=23, oracle=None, rtol=1e-5, atol=1e-5, outs=None):
    model, feeds, names = one_node(op, inputs, n_out, attrs, opset, outs=outs)
    expected = oracle() if oracle is not None else ort_run(model, feeds)
    for got in run_nncc(model, feeds, names):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert g.dtype == e.dtype and g.shape == e.shape
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)


rng = np.random.default_rng(7)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def heads_last(x):
    """(batch, heads, seq, head) -> (batch, seq, heads * head), the 3-D layout."""
    b, h, s, d = x.shape
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(b, s, h * d))


# --------------------------------------------------------------------------- Attention


def test_real_size_causal_gqa_4d():
    q, k, v = rand(2, 8, 128, 64), rand(2, 2, 128, 64), rand(2, 2, 128, 64)
    check("Attention", [q, k, v], 1, {"is_causal": 1})


def test_real_size_causal_gqa_3d():
    q, k, v = rand(2, 8, 128, 64), rand(2, 2, 128, 64), rand(2, 2, 128, 64)
    check("Attention", [heads_last(q), heads_last(k), heads_last(v)], 1,
          {"is_causal": 1, "q_num_heads": 8, "kv_num_heads": 2})


@pytest.mark.parametrize("mode", [0, 1, 3])
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_cache_mask_softcap_and_qk_output_modes(mode, mask_kind):
    """Decode-style step: 3 new queries over 5 cached + 3 new keys, a batch/head-broadcast
    mask, softcap, and each qk_matmul_output mode; present_key/value are the concatenation."""
    q, k, v = rand(2, 4, 3, 16), rand(2, 2, 3, 16), rand(2, 2, 3, 12)
    past_k, past_v = rand(2, 2, 5, 16), rand(2, 2, 5, 12)
    mask = rng.random((2, 1, 3, 8)) > 0.3 if mask_kind == "bool" else rand(3, 8)
    check("Attention", [q, k, v, mask, past_k, past_v], 4,
          {"is_causal": 1, "qk_matmul_output_mode": mode, "softcap": 2.0, "scale": 0.2})


@pytest.mark.parametrize("mask_shape", [(2, 4, 3, 8), (4, 3, 8), (2, 1, 1, 8), (8,)])
def test_gqa_masks_per_query_head_and_batch(mask_shape):
    """Masks broadcast right-aligned against (batch, q_heads, q_len, total): per query head
    in a grouped-query layout, per batch, a rank-3 (heads, q, kv) mask and a rank-1 one.
    onnxruntime refuses rank 1 and a broadcast q_len: its oracle gets the mask broadcast
    to the full shape, which the spec makes the same input."""
    q, k, v = rand(2, 4, 3, 8), rand(2, 2, 3, 8), rand(2, 2, 3, 8)
    past_k, past_v = rand(2, 2, 5, 8), rand(2, 2, 5, 8)
    mask = rng.random(mask_shape) > 0.3
    mask[..., 0] = True  # every row keeps a key
    for m, attrs in ((mask, {}), (np.where(mask, 0.5, -3.0).astype(np.float32), {"is_causal": 1})):
        full = np.ascontiguousarray(np.broadcast_to(m, (2, 4, 3, 8)))
        oracle, feeds, _ = one_node("Attention", [q, k, v, full, past_k, past_v], 3, attrs, 23)
        check("Attention", [q, k, v, m, past_k, past_v], 3, attrs, oracle=lambda: ort_run(oracle, feeds))


def test_qk_output_with_mask_added():
    """Mode 2 adds the mask: masked entries are -inf here, where onnxruntime writes the
    lowest float instead; the finite entries must agree and the masked set must match."""
    q, k, v = rand(1, 2, 4, 8), rand(1, 2, 4, 8), rand(1, 2, 4, 8)
    mask = rng.random((4, 4)) > 0.4
    model, feeds, names = one_node("Attention", [q, k, v, mask], 4, {"qk_matmul_output_mode": 2}, 23,
                                   outs=["y", "", "", "qk"])
    expected = ort_run(model, feeds)
    lowest = np.finfo(np.float32).min
    for y, qk in run_nncc(model, feeds, names):
        np.testing.assert_allclose(y, expected[0], rtol=1e-5, atol=1e-6)
        masked = np.isneginf(qk)
        np.testing.assert_array_equal(masked, expected[1] == lowest)
        np.testing.assert_array_equal(masked, np.broadcast_to(~mask, qk.shape))
        np.testing.assert_allclose(qk[~masked], expected[1][~masked], rtol=1e-5, atol=1e-6)


def test_fully_masked_row_gives_zeros():
    q, k, v = rand(1, 2, 3, 8), rand(1, 2, 3, 8), rand(1, 2, 3, 8)
    mask = np.ones((3, 3), bool)
    mask[1] = False
    check("Attention", [q, k, v, mask], 1, {}, opset=24)
    model, feeds, names = one_node("Attention", [q, k, v, mask], 1, {}, 24)
    for (y,) in run_nncc(model, feeds, names):
        assert np.all(y[:, :, 1] == 0) and np.all(np.isfinite(y))


def test_short_mask_is_padded_as_masked():
    """A mask shorter than the keys counts as False (or -inf) for the missing keys: the
    oracle is onnxruntime on the explicitly padded mask."""
    q, k, v = rand(2, 2, 3, 8), rand(2, 2, 6, 8), rand(2, 2, 6, 8)
    for short, padded in (
        (rng.random((3, 4)) > 0.2, None),
        (rand(3, 4), None),
    ):
        if short.dtype == np.bool_:
            padded = np.concatenate([short, np.zeros((3, 2), bool)], axis=1)
        else:
            padded = np.concatenate([short, np.full((3, 2), -np.inf, np.float32)], axis=1)
        full, feeds, _ = one_node("Attention", [q, k, v, padded], 1, {}, 24)
        check("Attention", [q, k, v, short], 1, {}, opset=24, oracle=lambda: ort_run(full, feeds))


def test_nonpad_kv_seqlen_causal():
    q, k, v = rand(2, 4, 3, 8), rand(2, 2, 6, 8), rand(2, 2, 6, 8)
    lengths = np.array([4, 6], np.int64)
    check("Attention", [q, k, v, None, None, None, lengths], 1, {"is_causal": 1}, opset=24)


@pytest.mark.parametrize("attrs", [
    {"is_causal": 1, "left_window_size": 2},
    {"left_window_size": 1, "right_window_size": 2},
    {"is_causal": 1, "left_window_size": 0},
])
def test_sliding_window(attrs):
    q, k, v = rand(2, 4, 6, 8), rand(2, 1, 6, 8), rand(2, 1, 6, 8)
    check("Attention", [q, k, v], 1, attrs, opset=25)


def test_float16_with_float32_softmax():
    q, k, v = (rand(2, 4, 16, 32, dtype=np.float16) for _ in range(3))
    check("Attention", [q, k, v], 1, {"softmax_precision": 1, "is_causal": 1}, rtol=5e-3, atol=2e-3)


def test_shape_function_matches_outputs_with_cache():
    q, k, v = rand(2, 5, 24), rand(2, 5, 12), rand(2, 5, 18)
    past_k, past_v = rand(2, 2, 3, 6), rand(2, 2, 3, 9)
    model, feeds, names = one_node("Attention", [q, k, v, None, past_k, past_v], 4,
                                   {"q_num_heads": 4, "kv_num_heads": 2}, 23)
    plan = compile_graph(parse_model(model.SerializeToString()), CompileOptions())
    shapes = {s.name: s.shape for s in plan.slots}
    assert shapes["out0"] == (2, 5, 36)
    assert shapes["out1"] == (2, 2, 8, 6) and shapes["out2"] == (2, 2, 8, 9)
    assert shapes["out3"] == (2, 4, 5, 8)
    check("Attention", [q, k, v, None, past_k, past_v], 4, {"q_num_heads": 4, "kv_num_heads": 2})


@pytest.mark.parametrize("inputs, attrs, opset", [
    ([rand(1, 3, 8), rand(1, 3, 8), rand(1, 3, 8)], {}, 23),  # 3-D without head counts
    ([rand(1, 3, 2, 8), rand(1, 2, 2, 8), rand(1, 2, 2, 8)], {}, 23),  # 3 heads over 2
    ([rand(1, 2, 2, 8), rand(1, 2, 2, 8), rand(1, 2, 2, 8)], {"q_num_heads": 2}, 25),
])
def test_bad_attention_inputs_are_clear_errors(inputs, attrs, opset):
    model, feeds, _ = one_node("Attention", inputs, 1, attrs, opset)
    with pytest.raises(NnccError):
        Interpreter(parse_model(model.SerializeToString())).run(feeds)


# --------------------------------------------------------------------------- RotaryEmbedding


@pytest.mark.parametrize("attrs", [{}, {"interleaved": 1}, {"rotary_embedding_dim": 8},
                                   {"interleaved": 1, "rotary_embedding_dim": 8}])
def test_rotary_4d_with_position_ids(attrs):
    half = attrs.get("rotary_embedding_dim", 32) // 2
    x = rand(2, 8, 128, 32)
    cos, sin = rand(256, half), rand(256, half)
    positions = rng.integers(0, 256, (2, 128)).astype(np.int64)
    check("RotaryEmbedding", [x, cos, sin, positions], 1, attrs)


def test_rotary_3d_without_position_ids():
    x = rand(2, 10, 64)
    cos, sin = rand(2, 10, 8), rand(2, 10, 8)
    check("RotaryEmbedding", [x, cos, sin], 1, {"num_heads": 4})


def test_rotary_float16():
    x = rand(1, 4, 16, 16, dtype=np.float16)
    cos, sin = rand(32, 8, dtype=np.float16), rand(32, 8, dtype=np.float16)
    positions = np.arange(16, dtype=np.int64)[None] + 3
    check("RotaryEmbedding", [x, cos, sin, positions], 1, {"interleaved": 1}, rtol=2e-3, atol=2e-3)


def test_rotary_position_out_of_range_is_a_clear_error():
    model, feeds, _ = one_node("RotaryEmbedding", [rand(1, 1, 2, 4), rand(4, 2), rand(4, 2),
                                                   np.array([[0, 4]], np.int64)], 1, {}, 23)
    with pytest.raises(NnccError, match="position_ids"):
        Interpreter(parse_model(model.SerializeToString())).run(feeds)


# --------------------------------------------------------------------------- opset 27 and preview


def reference(model, feeds):
    return ReferenceEvaluator(model).run(None, feeds)


def check_reference(op, inputs, n_out, attrs, opset=27, domain="", rtol=1e-5, atol=1e-5):
    model, feeds, names = one_node(op, inputs, n_out, attrs, opset, domain=domain)
    expected = reference(model, feeds)
    for got in run_nncc(model, feeds, names):
        for g, e in zip(got, expected):
            assert g.dtype == e.dtype and g.shape == e.shape
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
def test_linear_attention_rules_with_gqa(rule):
    b, t, hq, hkv, dk, dv = 2, 12, 6, 2, 8, 4
    q, k, v = rand(b, t, hq * dk), rand(b, t, hkv * dk) * 0.3, rand(b, t, hkv * dv)
    decay = -np.abs(rand(b, t, hkv * dk)) if rule in ("gated", "gated_delta") else None
    beta = 1 / (1 + np.exp(-rand(b, t, hkv))) if rule in ("delta", "gated_delta") else None
    past = rand(b, hkv, dk, dv)
    check_reference("LinearAttention", [q, k, v, past, decay, beta], 2,
                    {"q_num_heads": hq, "kv_num_heads": hkv, "update_rule": rule})


def test_linear_attention_in_pieces_equals_one_call():
    b, t, h, dk, dv = 1, 9, 2, 4, 4
    q, k, v = rand(b, t, h * dk), rand(b, t, h * dk) * 0.3, rand(b, t, h * dv)
    decay, beta = -np.abs(rand(b, t, h)), 1 / (1 + np.exp(-rand(b, t, h)))
    attrs = {"q_num_heads": h, "kv_num_heads": h}

    def run(part, state):
        inputs = [q[:, part], k[:, part], v[:, part], state, decay[:, part], beta[:, part]]
        model, feeds, names = one_node("LinearAttention", inputs, 2, attrs, 27)
        return Interpreter(parse_model(model.SerializeToString())).run(feeds).values()

    y_all, s_all = run(slice(0, t), np.zeros((b, h, dk, dv), np.float32))
    y1, s1 = run(slice(0, 4), np.zeros((b, h, dk, dv), np.float32))
    y2, s2 = run(slice(4, t), s1)
    np.testing.assert_allclose(np.concatenate([y1, y2], axis=1), y_all, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s2, s_all, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("activation", ["none", "silu"])
def test_causal_conv_with_state(activation):
    x, w, bias, past = rand(3, 16, 20), rand(16, 1, 5), rand(16), rand(3, 16, 4)
    check_reference("CausalConvWithState", [x, w, bias, past], 2, {"activation": activation})


def test_causal_conv_in_pieces_equals_one_call():
    x, w = rand(2, 4, 10), rand(4, 1, 3)

    def run(part, state):
        model, feeds, names = one_node("CausalConvWithState", [x[:, :, part], w, None, state], 2, {}, 27)
        return Interpreter(parse_model(model.SerializeToString())).run(feeds).values()

    y_all, s_all = run(slice(0, 10), None)
    y1, s1 = run(slice(0, 6), None)
    y2, s2 = run(slice(6, 10), s1)
    np.testing.assert_allclose(np.concatenate([y1, y2], axis=2), y_all, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(s2, s_all)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_flex_attention_gqa_without_modifiers(dtype):
    q, k, v = rand(2, 6, 5, 16, dtype=dtype), rand(2, 3, 7, 16, dtype=dtype), rand(2, 3, 7, 8, dtype=dtype)
    check_reference("FlexAttention", [q, k, v], 1, {"scale": 0.3}, domain="ai.onnx.preview")


def test_flex_attention_score_mod_runs_the_subgraph():
    """A score_mod that adds a bias, by both routes: the compiled one carries the subgraph
    attribute through the plan's bytes."""
    bias = np.linspace(-1, 1, 5 * 7, dtype=np.float32).reshape(1, 1, 5, 7)
    score_mod = helper.make_graph(
        [helper.make_node("Add", ["s", "bias"], ["s_out"])], "score_mod",
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("s_out", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(bias, "bias")])
    q, k, v = rand(1, 2, 5, 8), rand(1, 2, 7, 8), rand(1, 2, 7, 8)
    model, feeds, names = one_node("FlexAttention", [q, k, v], 1, {"score_mod": score_mod}, 26,
                                   domain="ai.onnx.preview")
    expected = reference(model, feeds)
    interpreted, compiled = run_nncc(model, feeds, names)
    np.testing.assert_allclose(interpreted[0], expected[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(compiled[0], expected[0], rtol=1e-5, atol=1e-6)
    # the score_mod is applied: without it the result differs
    plain, _, _ = one_node("FlexAttention", [q, k, v], 1, {}, 26, domain="ai.onnx.preview")
    assert not np.allclose(reference(plain, feeds)[0], expected[0], rtol=1e-3, atol=1e-4)
