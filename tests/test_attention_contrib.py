"""com.microsoft Attention (the contrib op onnxruntime's transformer optimizer writes for BERT
and GPT-2) against onnxruntime: rewritten at -O2 into one packed GEMM and one nncc
FusedAttention that runs natively (nncc/passes/attention_contrib.py), and run by its own
portable kernel at -O0 (nncc/kernels/attention_contrib.py), in every mask form the op
defines that nncc takes. The forms nncc does not take are clear one-line errors.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.frontend.onnx import parse_model
from nncc.native.toolchain import find_toolchain
from nncc.passes.pipeline import run_passes
from tests import native_fuzz_cases as F
from tests.models import benchmark_model
from tests.oracle import ort_run

BATCH, SEQ, HIDDEN_IN = 2, 37, 24


def _mask(form: str, rng) -> np.ndarray | None:
    """mask_index in one of the op's forms; the first batch row keeps every key, the second hides some."""
    lengths = np.array([SEQ, 23], np.int32)
    if form == "raw2":
        return (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
    if form == "raw3":
        mask = (rng.random((BATCH, SEQ, SEQ)) < 0.7).astype(np.int32)
        mask[:, :, 0] = 1
        mask[1, 4, :] = 0  # a query that sees no key: every score gets the filter value
        return mask
    if form == "end":
        return lengths
    if form == "end_start":
        return np.concatenate([lengths, np.array([0, 5], np.int32)])
    return None


CASES = {  # name: (attributes, q/k/v hidden sizes, mask form, mask constant?, projection bias?, attention_bias?)
    "no mask": (dict(num_heads=4), (16, 16, 16), "", False, True, False),
    "key padding mask fed at run time": (dict(num_heads=3), (24, 24, 24), "raw2", False, True, False),
    "3-D mask fed at run time, a row with no key": (dict(num_heads=2), (16, 16, 16), "raw3", False, True, False),
    "sequence ends fed at run time": (dict(num_heads=4, mask_filter_value=-1e9), (32, 32, 32), "end", False, True,
                                      False),
    "unidirectional": (dict(num_heads=5, unidirectional=1), (15, 15, 15), "", False, True, False),
    "unidirectional over a padding mask fed at run time": (dict(num_heads=2, unidirectional=1), (16, 16, 16), "raw2",
                                                           False, True, False),
    "constant mask, unidirectional, custom scale": (dict(num_heads=2, unidirectional=1, scale=0.2), (8, 8, 8),
                                                    "raw2", True, True, False),
    "V of another hidden size, no projection bias": (dict(num_heads=4, qkv_hidden_sizes=[16, 16, 28]),
                                                     (16, 16, 28), "", False, False, False),
    "attention_bias fed at run time over a padding mask": (dict(num_heads=3), (12, 12, 12), "raw2", False, True,
                                                           True),
}


def _model(attrs, sizes, form, constant_mask, proj_bias, attention_bias, rng):
    heads = attrs["num_heads"]
    weights = (rng.standard_normal((HIDDEN_IN, sum(sizes))) / np.sqrt(HIDDEN_IN)).astype(np.float32)
    inits = [numpy_helper.from_array(weights, "w")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, SEQ, HIDDEN_IN])]
    feeds = {"x": rng.standard_normal((BATCH, SEQ, HIDDEN_IN)).astype(np.float32)}
    names = ["x", "w", "", "", "", ""]
    if proj_bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(sum(sizes)).astype(np.float32), "b"))
        names[2] = "b"
    mask = _mask(form, rng)
    if mask is not None:
        names[3] = "mask"
        if constant_mask:
            inits.append(numpy_helper.from_array(mask, "mask"))
        else:
            inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT32, list(mask.shape)))
            feeds["mask"] = mask
    if attention_bias:
        names[5] = "ab"
        inputs.append(helper.make_tensor_value_info("ab", TensorProto.FLOAT, [1, heads, SEQ, SEQ]))
        feeds["ab"] = rng.standard_normal((1, heads, SEQ, SEQ)).astype(np.float32)
    while not names[-1]:
        names.pop()
    node = helper.make_node("Attention", names, ["y"], domain="com.microsoft", **attrs)
    graph = helper.make_graph([node], "contrib_attention", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model, feeds


def _onnxruntime(model, feeds):
    return ort_run(model, feeds)[0]


def _ops_after_passes(path) -> list[str]:
    return [n.op_type for n in run_passes(parse_model(open(path, "rb").read()), 2).nodes]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_contrib_attention_fuses_runs_natively_and_matches_onnxruntime(tmp_path, name):
    if find_toolchain() is None:
        pytest.skip("no C compiler: the native backend takes nothing")
    model, feeds = _model(*CASES[name], np.random.default_rng(11))
    path = tmp_path / "attention.onnx"
    onnx.save(model, str(path))
    ops = _ops_after_passes(path)
    assert "Attention" not in ops and ops.count("FusedAttention") == 1
    assert "FusedMatMul" in ops or "MatMul" in ops  # the packed projection: one GEMM
    compiled = nncc.compile_model(path)
    assert "y" in F.native_outputs(compiled)
    np.testing.assert_allclose(compiled.run(feeds)["y"], _onnxruntime(model, feeds), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("name", list(CASES) + ["left and right padding (not fused)"])
def test_contrib_attention_kernel_matches_onnxruntime(tmp_path, name):
    """-O0: the op's own portable kernel, including the [2 * B] form the rewrite leaves."""
    if name in CASES:
        spec = CASES[name]
    else:
        spec = (dict(num_heads=2), (16, 16, 16), "end_start", False, True, False)
    model, feeds = _model(*spec, np.random.default_rng(12))
    path = tmp_path / "attention.onnx"
    onnx.save(model, str(path))
    if name not in CASES:
        assert "Attention" in _ops_after_passes(path)  # left to its kernel even at -O2
    compiled = nncc.compile_model(path, opt_level=0)
    assert "com.microsoft::Attention::1" in compiled.plan.kernels
    np.testing.assert_allclose(compiled.run(feeds)["y"], _onnxruntime(model, feeds), rtol=1e-4, atol=2e-5)


def test_present_is_computed_when_read(tmp_path):
    """The present output (K and V stacked) is read: the node stays whole, and its kernel
    gives both outputs as onnxruntime does."""
    model, feeds = _model(dict(num_heads=4), (16, 16, 16), "raw2", False, True, False, np.random.default_rng(13))
    model.graph.node[0].output.append("present")
    model.graph.output.append(helper.make_tensor_value_info("present", TensorProto.FLOAT, None))
    path = tmp_path / "present.onnx"
    onnx.save(model, str(path))
    assert "Attention" in _ops_after_passes(path)
    got = nncc.compile_model(path).run(feeds)
    want = ort_run(model, feeds, ["y", "present"])
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(got["present"], want[1], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("form", ["past", "4-D mask"])
def test_a_form_nncc_does_not_take_is_a_one_line_error(tmp_path, form):
    """Past state, a 4-D mask: `nncc run` says what is unsupported in one line and exits 2,
    before any run."""
    model, feeds = _model(dict(num_heads=2), (16, 16, 16), "", False, True, False, np.random.default_rng(14))
    node = model.graph.node[0]
    del node.input[3:]
    if form == "past":
        node.input.extend(["", "past"])
        model.graph.input.append(helper.make_tensor_value_info("past", TensorProto.FLOAT, [2, BATCH, 2, 3, 8]))
        feeds["past"] = np.zeros((2, BATCH, 2, 3, 8), np.float32)
        expected = "past state is not supported"
    else:
        node.input.append("mask")
        model.graph.input.append(helper.make_tensor_value_info("mask", TensorProto.INT32, [BATCH, 1, SEQ, SEQ]))
        feeds["mask"] = np.ones((BATCH, 1, SEQ, SEQ), np.int32)
        expected = f"mask_index of shape [{BATCH}, 1, {SEQ}, {SEQ}] is not supported"
    path = tmp_path / "unsupported.onnx"
    onnx.save(model, str(path))
    np.savez(tmp_path / "feeds.npz", **feeds)
    run = subprocess.run([sys.executable, "-m", "nncc", "run", str(path), "--inputs", str(tmp_path / "feeds.npz")],
                         capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nncc: error:") and expected in lines[0], run.stderr


@pytest.mark.slow
def test_a_bert_from_onnxruntimes_transformer_optimizer_runs_fused_and_natively(tmp_path):
    """A small BERT exported with a padding mask, as onnxruntime's transformer optimizer leaves
    it (benchmarks/real_models.py: its attention fusion on, the fusions into contrib ops nncc
    has no kernel for off): every com.microsoft Attention becomes a native FusedAttention,
    and the output matches onnxruntime on a padded batch."""
    model = benchmark_model('ort_fused(_transformer("bert_small", 7, causal=False, seq=24, d=64, heads=4, ff=128, '
                            'layers=2, padding_mask=True), 4, 64)', tmp_path)
    assert [n.op_type for n in model.graph.node if n.domain == "com.microsoft"] == ["Attention"] * 2
    path = tmp_path / "bert_ort_fused.onnx"
    onnx.save(model, str(path))
    ops = _ops_after_passes(path)
    assert "Attention" not in ops and ops.count("FusedAttention") == 2
    assert ops.count("Less") == 1  # the sequence ends made a bias once, for both layers
    compiled = nncc.compile_model(path)
    rng = np.random.default_rng(15)
    feeds = {"hidden_in": rng.standard_normal((1, 24, 64)).astype(np.float32),
             "attention_mask": (np.arange(24) < 17).astype(np.int64)[None, :]}
    if find_toolchain() is not None:
        assert "hidden_out" in F.native_outputs(compiled)
    np.testing.assert_allclose(compiled.run(feeds)["hidden_out"], _onnxruntime(model, feeds), rtol=1e-4, atol=1e-4)
