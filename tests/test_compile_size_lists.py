"""`nncc compile --dim H=8,12 --dim W=10`: one optimized cache entry per combination of the
listed sizes, each exactly the one `nncc.prepare(MODEL, stage="optimized", dims=...)`
builds (a later prepare with those dims is a hit and runs native code, right against
onnxruntime); bad lists are one-line usage errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper

import nncc
import nncc.errors
from nncc.native.toolchain import find_toolchain
from tests.models import GraphBuilder
from tests.oracle import ort_run

needs_cc = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the optimized stage has no "
                              "native code to build, and the test asks for native partitions")


@pytest.fixture
def conv_model(tmp_path):
    """Conv 3->8 (3x3, padding 1) + Relu over [1, 3, H, W]: H and W symbolic."""
    g = GraphBuilder(seed=3)
    g.inputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"]))
    y = g.node("Conv", ["x", g.weight((8, 3, 3, 3)), g.const(np.linspace(-0.5, 0.5, 8))], pads=[1, 1, 1, 1])
    g.output(g.node("Relu", [y]))
    path = tmp_path / "conv.onnx"
    g.save(path)
    return path


@pytest.mark.slow
@needs_cc
def test_every_combination_is_the_entry_prepare_would_build(cli, conv_model, tmp_path):
    code, out, err = cli("compile", conv_model, "--dim", "H=8,12", "--dim", "W=10", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert [e["dims"] for e in report["entries"]] == [{"H": 8, "W": 10}, {"H": 12, "W": 10}]
    assert [(e["cache"]["outcome"], e["cache"]["stage"]) for e in report["entries"]] == [("miss", "optimized")] * 2
    assert report["output"] is None and not list(tmp_path.glob("*.nncc"))
    assert len({e["cache"]["token"] for e in report["entries"]}) == 2
    rng = np.random.default_rng(0)
    for entry in report["entries"]:
        model, outcome = nncc.prepare(conv_model, stage="optimized", dims=entry["dims"])
        assert (outcome.outcome, outcome.token) == ("hit", entry["cache"]["token"])
        assert model.native_partitions >= 1
        x = rng.standard_normal((1, 3, entry["dims"]["H"], entry["dims"]["W"])).astype(np.float32)
        got = model.run({"x": x})
        np.testing.assert_allclose(list(got.values())[0], ort_run(conv_model, {"x": x})[0], rtol=1e-4, atol=1e-5)
    # again: every entry is a hit, one status line each
    code, out, err = cli("compile", conv_model, "--dim", "W=10", "--dim", "H=12,8")
    assert code == 0, err
    lines = err.splitlines()
    assert sum("cache hit (optimized stage)" in line for line in lines) == 2, err
    assert any(line.startswith("nncc: W=10 H=12: cache hit") for line in lines), err


@pytest.mark.parametrize("spec", ["H=", "H=0", "H=a,b", "H=8,,12", "H=-8", "=8"])
def test_a_bad_list_is_a_one_line_usage_error(cli, conv_model, spec):
    code, out, err = cli("compile", conv_model, "--dim", spec, "--dim", "W=4,8")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "--dim" in err and "Traceback" not in err, err


def test_a_name_the_model_lacks_is_a_one_line_error(cli, conv_model):
    code, out, err = cli("compile", conv_model, "--dim", "Q=4,8", "--backend", "numpy")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "'Q'" in err and "'H'" in err, err


@pytest.mark.parametrize("flag", [["-o", "conv.nncc"], ["--no-cache"], ["--force"]])
def test_flags_about_one_artifact_are_refused_with_a_list(cli, conv_model, tmp_path, flag):
    code, out, err = cli("compile", conv_model, "--dim", "H=4,8", *flag)
    assert code == 2 and len(err.strip().splitlines()) == 1 and flag[0] in err, err
    assert not (tmp_path / "conv.nncc").exists()


def test_one_size_still_needs_an_output(cli, conv_model):
    code, out, err = cli("compile", conv_model, "--dim", "H=4")
    assert code == 2 and "'-o' / '--output'" in err, err


@pytest.mark.slow
@needs_cc
def test_prepare_with_lists_builds_the_same_entries(conv_model):
    """nncc.prepare(dims={"H": [...], "W": ...}) stores the entries `nncc compile` would (a
    later prepare with each combination is a hit) and returns the model for every size."""
    model, outcome = nncc.prepare(conv_model, dims={"H": [6, 9], "W": 7})
    assert outcome.outcome == "miss"  # the model for every size is an entry of its own
    x = np.random.default_rng(1).standard_normal((1, 3, 5, 11)).astype(np.float32)  # a size not listed
    np.testing.assert_allclose(list(model.run({"x": x}).values())[0], ort_run(conv_model, {"x": x})[0],
                               rtol=1e-4, atol=1e-5)
    for h in (6, 9):
        shaped, again = nncc.prepare(conv_model, stage="optimized", dims={"H": h, "W": 7})
        assert again.outcome == "hit" and shaped.native_partitions >= 1
        x = np.random.default_rng(h).standard_normal((1, 3, h, 7)).astype(np.float32)
        np.testing.assert_allclose(list(shaped.run({"x": x}).values())[0], ort_run(conv_model, {"x": x})[0],
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dims", [{"H": []}, {"H": [0, 4]}, {"H": [4, "8"]}, {"H": [True]}])
def test_prepare_refuses_a_bad_list(conv_model, dims):
    with pytest.raises(nncc.errors.InputError, match="'H'"):
        nncc.prepare(conv_model, dims=dims)
