"""Attention fused into one node (nncc/passes/attention.py) and run as one native kernel
(nncc/native/attention_gen.py) or the portable one (nncc/kernels/fused_attention.py),
against onnxruntime. The geometries are the fuzzer's attention cases
(tests/native_fuzz_cases.py) pinned to the corners: one query (a decoder's next token),
512 tokens, odd head counts and head sizes, batch > 1 with a padding mask fed at run time,
constant causal masks of -1e9 and -inf (whose hidden key blocks the kernel skips), a
window mask of -100 (terms below the normal floats), heads
flattened into a 3-D batch, grouped-query heads (K and V repeated per query head, read
unrepeated). Then the near misses the pass must leave as they are.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.frontend.onnx import parse_model
from nncc.native.toolchain import find_toolchain
from nncc.passes.attention import fuse_attention
from tests import native_fuzz_cases as F
from tests.oracle import ort_run

FUSED = "nncc::FusedAttention::1"

PINNED = [  # (geometry keys the case fixes); the rest drawn from the case's generator
    dict(batch=1, heads=8, d=64, dv=64, sq=128, skv=128, split="transpose", mask="causal", scale="mul", merge=True),
    dict(batch=1, heads=3, d=17, dv=17, sq=512, skv=512, split="transpose", mask="causal_inf", scale="div",
         merge=True),
    dict(batch=2, heads=5, d=80, dv=33, sq=1, skv=65, split="transpose", mask="padding", scale="mul_first",
         merge=False),
    dict(batch=3, heads=2, d=8, dv=8, sq=33, skv=130, split="given", mask="padding", scale="", merge=True),
    dict(batch=2, heads=3, d=1, dv=5, sq=200, skv=7, split="rank3", mask="random", scale="mul", merge=False),
    dict(batch=1, heads=1, d=3, dv=16, sq=65, skv=64, split="given", mask="causal", scale="div", merge=False),
    dict(batch=2, heads=2, d=32, dv=32, sq=64, skv=1, split="transpose", mask="", scale="mul", merge=True),
    # grouped-query heads, K and V repeated per query head as exporters write it
    dict(batch=2, heads=9, kv_heads=3, d=17, dv=17, sq=33, skv=65, split="transpose", mask="padding", scale="mul",
         merge=True),
    dict(batch=1, heads=5, kv_heads=1, d=8, dv=5, sq=1, skv=130, split="given", mask="", scale="div", merge=False),
    dict(batch=1, heads=6, kv_heads=2, d=64, dv=64, sq=200, skv=200, split="transpose", mask="causal", scale="mul",
         merge=True),
    # torch's scaled_dot_product_attention: the scale split over Q and Kᵀ, the NaN guard after
    # the Softmax (with a sample whose keys are all hidden, when the case draws one)
    dict(batch=2, heads=4, d=64, dv=64, sq=64, skv=64, split="transpose", mask="padding", scale="split", guard=True,
         merge=True),
    dict(batch=1, heads=8, kv_heads=4, d=32, dv=32, sq=64, skv=64, split="given", mask="causal_inf", scale="split",
         guard=True, merge=True),
    dict(batch=2, heads=3, d=17, dv=5, sq=33, skv=130, split="rank3", mask="", scale="split", guard=True, merge=False),
    # Swin's shifted windows: 49-token windows, a mask of -100 fed at run time (the hidden
    # terms e^-100 fall below float32's normal range, where the kernel writes 0)
    dict(batch=4, heads=8, d=24, dv=24, sq=49, skv=49, split="transpose", mask="window", scale="mul", merge=True),
]


def _cases():
    cases = []
    for i, given in enumerate(PINNED):
        case = F.Case(97, i, "attention", {}, opt_level=2)
        F.attention(case, np.random.default_rng([97, i]), **given)
        cases.append(case)
    return cases


def _fused_nodes(path) -> list:
    from nncc.passes.pipeline import run_passes

    graph = run_passes(parse_model(open(path, "rb").read()), 2)
    return [n for n in graph.nodes if n.op_type == "FusedAttention"]


def _fused_count(path) -> int:
    return len(_fused_nodes(path))


def _head_groups(path) -> list[int]:
    return [int(n.attrs.get("head_group", 1)) for n in _fused_nodes(path)]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["native", "numpy"])
def test_fused_attention_matches_onnxruntime(tmp_path, backend):
    if backend == "native" and find_toolchain() is None:
        pytest.skip("no C compiler: the native backend takes nothing")
    cases = _cases()
    path = tmp_path / "attention.onnx"
    onnx.save(F.batch_model(cases), str(path))
    assert _fused_count(path) == len(cases)  # every pattern became one node
    groups = [c.geometry["heads"] // c.geometry["kv_heads"] for c in cases]
    assert _head_groups(path) == groups  # repeated K and V read unrepeated
    model = nncc.compile_model(path, backends=(backend,) if backend == "numpy" else ("native", "numpy"))
    assert FUSED in model.plan.kernels
    got = model.run(F.feeds(cases))
    native = F.native_outputs(model) if backend == "native" else {n for c in cases for n in c.outputs}
    want = F.run_onnxruntime(cases)
    reports = [r for case in cases if (r := F.judge(case, got, want, native))]
    assert not reports, "\n".join(reports)


# -- near misses ----------------------------------------------------------------------------------


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(
        nodes, "near_miss",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _attention_nodes(softmax_axis=-1, scale="s", extra_probs_reader=False):
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Mul", ["scores", scale], ["scaled"]),
             helper.make_node("Softmax", ["scaled"], ["probs"], axis=softmax_axis),
             helper.make_node("MatMul", ["probs", "v"], ["y"])]
    if extra_probs_reader:
        nodes.append(helper.make_node("Relu", ["probs"], ["probs_too"]))
    return nodes


def _guarded_nodes(fill: str):
    """The pattern with a guard after the Softmax that puts ``fill`` where p is NaN."""
    nodes = _attention_nodes()
    nodes[-1:] = [helper.make_node("IsNaN", ["probs"], ["nan"]),
                  helper.make_node("Where", ["nan", fill, "probs"], ["guarded"]),
                  helper.make_node("MatMul", ["guarded", "v"], ["y"])]
    return nodes


INPUTS = [("q", [2, 3, 6, 4]), ("kt", [2, 3, 4, 6]), ("v", [2, 3, 6, 5])]
NEAR_MISSES = {
    "softmax over the keys' other axis": (_attention_nodes(softmax_axis=-2), ["y"], [("s", 0.5)]),
    "a scale that varies per key": (_attention_nodes(), ["y"], [("s", np.linspace(0.1, 1.0, 6))]),
    "the probabilities read twice": (_attention_nodes(extra_probs_reader=True), ["y", "probs_too"], [("s", 0.5)]),
    "the scores a graph output": (_attention_nodes(), ["y", "scores"], [("s", 0.5)]),
    "a NaN guard that fills another value": (_guarded_nodes("one"), ["y"], [("s", 0.5), ("one", 1.0)]),
}


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_near_misses_are_left_as_they_are(name, tmp_path):
    nodes, outputs, inits = NEAR_MISSES[name]
    model = _model(nodes, INPUTS, outputs, inits)
    graph = parse_model(model.SerializeToString())
    after = fuse_attention(graph)
    assert [(n.op_type, n.inputs, n.outputs) for n in after.nodes] == \
        [(n.op_type, n.inputs, n.outputs) for n in graph.nodes]
    feeds = {n: np.random.default_rng(1).standard_normal(s).astype(np.float32) for n, s in INPUTS}
    onnx.save(model, str(tmp_path / "m.onnx"))
    got = nncc.compile_model(tmp_path / "m.onnx").run(feeds)
    want = ort_run(model, feeds, outputs)
    for n, w in zip(outputs, want):
        np.testing.assert_allclose(got[n], w, rtol=1e-5, atol=1e-6)


def test_the_pattern_itself_fuses():
    """The near misses' own baseline: the same graph with a scalar scale and a last-axis
    Softmax does become one node (so the tests above fail for the reason they name)."""
    model = _model(_attention_nodes(), INPUTS, ["y"], [("s", 0.5)])
    after = fuse_attention(parse_model(model.SerializeToString()))
    assert [n.op_type for n in after.nodes] == ["FusedAttention"]
    assert after.nodes[0].attrs["scale"] == 0.5


def test_the_guard_that_fills_zeros_fuses():
    """The baseline of the guard's near miss: Where(IsNaN(p), 0, p) joins the node."""
    model = _model(_guarded_nodes("zero"), INPUTS, ["y"], [("s", 0.5), ("zero", 0.0)])
    after = fuse_attention(parse_model(model.SerializeToString()))
    assert [n.op_type for n in after.nodes] == ["FusedAttention"]
    assert after.nodes[0].attrs["zero_nan_rows"] == 1


# -- the ONNX Attention op ------------------------------------------------------------------------

ATTENTION_OPS = [  # (name, Q, K, V shapes, mask (shape, kind) or None, attributes)
    ("4-D causal", [2, 3, 5, 8], [2, 3, 7, 8], [2, 3, 7, 4], None, dict(is_causal=1)),
    ("4-D float mask fed at run time", [1, 2, 65, 16], [1, 2, 65, 16], [1, 2, 65, 16], ([1, 1, 65, 65], "float"),
     dict(scale=0.3)),
    ("4-D one key head, constant boolean mask, a row with no key", [2, 4, 3, 8], [2, 1, 9, 8], [2, 1, 9, 5],
     ([3, 9], "bool"), {}),
    ("3-D heads in the hidden axis, causal and a constant mask", [2, 33, 15], [2, 33, 15], [2, 33, 10],
     ([33, 33], "constant"), dict(q_num_heads=5, kv_num_heads=5, is_causal=1)),
    ("4-D grouped-query heads, two query heads to each, causal", [2, 6, 5, 8], [2, 3, 7, 8], [2, 3, 7, 4], None,
     dict(is_causal=1)),
    ("3-D grouped-query heads, three to each of three, float mask", [1, 70, 45], [1, 70, 15], [1, 70, 21],
     ([1, 1, 70, 70], "float"), dict(q_num_heads=9, kv_num_heads=3)),
    ("3-D grouped-query heads, seven to one K and V head", [2, 9, 7 * 16], [2, 130, 16], [2, 130, 16], None,
     dict(q_num_heads=7, kv_num_heads=1)),
]


def _attention_op_model(q, k, v, mask, attrs, rng):
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in (("q", q), ("k", k), ("v", v))]
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in (("q", q), ("k", k), ("v", v))}
    inits, names = [], ["q", "k", "v"]
    if mask is not None:
        shape, kind = mask
        names.append("mask")
        if kind == "float":
            inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, shape))
            feeds["mask"] = np.where(rng.random(shape) < 0.3, -np.inf, rng.standard_normal(shape)).astype(np.float32)
            feeds["mask"][..., 0] = 0.0
        elif kind == "bool":
            keep = rng.random(shape) < 0.6
            keep[0, :] = False  # the first query sees no key: zeros, as the op defines
            inits.append(numpy_helper.from_array(keep, "mask"))
        else:
            inits.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), "mask"))
    node = helper.make_node("Attention", names, ["y"], **attrs)
    graph = helper.make_graph([node], "attention_op", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                              None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model, feeds


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["native", "numpy"])
@pytest.mark.parametrize("case", ATTENTION_OPS, ids=[c[0] for c in ATTENTION_OPS])
def test_onnx_attention_op_runs_fused(tmp_path, case, backend):
    if backend == "native" and find_toolchain() is None:
        pytest.skip("no C compiler: the native backend takes nothing")
    _, q, k, v, mask, attrs = case
    model, feeds = _attention_op_model(q, k, v, mask, attrs, np.random.default_rng(3))
    path = tmp_path / "attention_op.onnx"
    onnx.save(model, str(path))
    assert _fused_count(path) == 1
    hq = attrs.get("q_num_heads", q[1])
    hkv = attrs.get("kv_num_heads", k[1])
    assert _head_groups(path) == ([hq // hkv] if hkv not in (hq, 1) else [1])  # K and V read, not repeated
    compiled = nncc.compile_model(path, backends=(backend,) if backend == "numpy" else ("native", "numpy"))
    assert FUSED in compiled.plan.kernels
    if backend == "native":
        assert "y" in F.native_outputs(compiled)
    got = compiled.run(feeds)["y"]
    want = ort_run(model, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("q, k, attrs, opset", [
    ([1, 6, 3, 8], [1, 4, 5, 8], {}, 23),  # K and V heads that do not divide the query's
    ([1, 2, 3, 8], [1, 2, 5, 8], {"softcap": 5.0}, 23),
    ([1, 2, 3, 8], [1, 2, 5, 8], {"is_causal": 1, "left_window_size": 2}, 25),
    ([1, 2, 3, 8], [1, 2, 5, 8], {"softmax_precision": 11}, 23),  # double
], ids=["heads that do not group", "softcap", "sliding window", "double softmax"])
def test_attention_op_forms_left_to_its_kernel(q, k, attrs, opset):
    model, _ = _attention_op_model(q, k, k, None, attrs, np.random.default_rng(0))
    model.opset_import[0].version = opset
    after = fuse_attention(parse_model(model.SerializeToString()))
    assert [n.op_type for n in after.nodes] == ["Attention"]


# -- com.microsoft MultiHeadAttention ---------------------------------------------------------------


def _mha_model(attention_bias: bool, packed_bias: bool = False):
    b, s, length, n, h, hv = 2, 7, 9, 3, 8, 5
    shapes = {"q": [b, s, n * h], "k": [b, length, n * h], "v": [b, length, n * hv], "ab": [1, n, s, length],
              "pb": [n * (2 * h + hv)]}
    names = ["q", "k", "v", "pb" if packed_bias else "", "", "ab" if attention_bias else ""]
    used = [x for x in names if x]
    node = helper.make_node("MultiHeadAttention", names, ["y"], domain="com.microsoft", num_heads=n)
    graph = helper.make_graph([node], "mha", [helper.make_tensor_value_info(x, TensorProto.FLOAT, shapes[x])
                                              for x in used],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    rng = np.random.default_rng(5)
    return model, {x: rng.standard_normal(shapes[x]).astype(np.float32) for x in used}


@pytest.mark.parametrize("opt_level", [2, 0])
@pytest.mark.parametrize("attention_bias", [True, False])
def test_multi_head_attention_matches_onnxruntime(tmp_path, attention_bias, opt_level):
    model, feeds = _mha_model(attention_bias)
    path = tmp_path / "mha.onnx"
    onnx.save(model, str(path))
    assert _fused_count(path) == 1
    compiled = nncc.compile_model(path, opt_level=opt_level)
    assert (FUSED in compiled.plan.kernels) == (opt_level == 2)  # -O0: its own kernel
    got = compiled.run(feeds)["y"]
    want = ort_run(model, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


def test_multi_head_attention_forms_not_supported_are_clear_errors(tmp_path):
    from nncc.errors import NnccError

    model, feeds = _mha_model(False, packed_bias=True)
    path = tmp_path / "mha.onnx"
    onnx.save(model, str(path))
    assert _fused_count(path) == 0
    with pytest.raises(NnccError, match="MultiHeadAttention: only separate query, key and value"):
        nncc.compile_model(path).run(feeds)


@pytest.mark.parametrize("attrs, k_shape", [
    ({"q_perm": [0, 0, 1, 2]}, [1, 2, 5, 4]),  # not a permutation
    ({"out_perm": [0, 1, 2]}, [1, 2, 5, 4]),  # the wrong rank
    ({}, [1, 2, 5, 3]),  # Q and K heads of different sizes
    ({"head_group": 2}, [1, 2, 5, 4]),  # two K heads of two query heads each, but Q has two heads
    ({"head_group": 0}, [1, 2, 5, 4]),
])
def test_a_fused_attention_node_in_a_model_that_makes_no_attention_is_a_clear_error(tmp_path, attrs, k_shape):
    """The nncc domain is open to any model: a FusedAttention nncc's pass did not write is
    checked like any op, never trusted by the native generator."""
    from nncc.errors import NnccError

    shapes = {"q": [1, 2, 3, 4], "k": k_shape, "v": [1, 2, 5, 6]}
    node = helper.make_node("FusedAttention", ["q", "k", "v"], ["y"], domain="nncc", scale=0.5, **attrs)
    graph = helper.make_graph([node], "hostile", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                                                  for n, s in shapes.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("nncc", 1)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "hostile.onnx"))
    feeds = {n: np.zeros(s, np.float32) for n, s in shapes.items()}
    with pytest.raises(NnccError, match="FusedAttention"):
        nncc.compile_model(tmp_path / "hostile.onnx").run(feeds)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["native", "numpy"])
def test_a_decoders_next_token_step_over_cached_keys_fuses_and_matches(tmp_path, backend):
    """A KV-cache decoder step as exporters write it: the new token's key and value are
    appended to the past ones (Concat on the sequence axis, both outputs of the model),
    and its one query row attends to all of them, keys read through a Transpose."""
    if backend == "native" and find_toolchain() is None:
        pytest.skip("no C compiler: the native backend takes nothing")
    heads, dh, past = 3, 16, 37
    nodes = [helper.make_node("Concat", ["past_k", "k"], ["present_k"], axis=2),
             helper.make_node("Concat", ["past_v", "v"], ["present_v"], axis=2),
             helper.make_node("Transpose", ["present_k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Mul", ["scores", "s"], ["scaled"]),
             helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
             helper.make_node("MatMul", ["probs", "present_v"], ["y"])]
    inputs = [("q", [1, heads, 1, dh]), ("k", [1, heads, 1, dh]), ("v", [1, heads, 1, dh]),
              ("past_k", [1, heads, past, dh]), ("past_v", [1, heads, past, dh])]
    outputs = ["y", "present_k", "present_v"]
    model = _model(nodes, inputs, outputs, [("s", dh ** -0.5)])
    assert [n.op_type for n in fuse_attention(parse_model(model.SerializeToString())).nodes].count(
        "FusedAttention") == 1
    onnx.save(model, str(tmp_path / "step.onnx"))
    compiled = nncc.compile_model(tmp_path / "step.onnx",
                                  backends=("numpy",) if backend == "numpy" else ("native", "numpy"))
    if backend == "native":
        assert compiled.native_partitions == len(compiled.plan.partitions) == 1
    rng = np.random.default_rng(7)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in inputs}
    got = compiled.run(feeds)
    want = ort_run(model, feeds, outputs)
    for n, w in zip(outputs, want):
        np.testing.assert_allclose(got[n], w, rtol=1e-5, atol=1e-6)


def test_heads_repeated_as_a_whole_are_not_taken_for_grouped_heads(tmp_path):
    """K and V tiled as a whole (query head h reads K/V head h % Hkv, not h // group): the
    Unsqueeze is on the axis before the heads. The fused node must keep reading the repeated
    copies, and the result must still match onnxruntime."""
    kv, group, s, d = 2, 3, 9, 8

    def tiled(x):
        return [helper.make_node("Unsqueeze", [x, "axis1"], [f"{x}_lone"]),
                helper.make_node("Expand", [f"{x}_lone", "wide"], [f"{x}_wide"]),
                helper.make_node("Reshape", [f"{x}_wide", "merged"], [f"{x}_rep"])]

    nodes = tiled("k") + tiled("v") + [
        helper.make_node("Transpose", ["k_rep"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Mul", ["scores", "s"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v_rep"], ["y"])]
    inputs = [("q", [1, kv * group, s, d]), ("k", [1, kv, s, d]), ("v", [1, kv, s, d])]
    model = _model(nodes, inputs, ["y"], [("s", 0.3)])
    model.graph.initializer.extend([numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (
        ("axis1", [1]), ("wide", [1, group, kv, s, d]), ("merged", [1, kv * group, s, d]))])
    onnx.save(model, str(tmp_path / "tiled.onnx"))
    assert _head_groups(tmp_path / "tiled.onnx") == [1]
    rng = np.random.default_rng(9)
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n, shape in inputs}
    got = nncc.compile_model(tmp_path / "tiled.onnx").run(feeds)["y"]
    want = ort_run(model, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
