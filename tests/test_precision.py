"""What a precision below float32 costs, measured at compile time (nncc/preparing/
calibration.py): the recorded deviation against one computed here from onnxruntime's
outputs, --tolerance failing a compile that exceeds it (one line, exit 2, nothing written
and nothing cached), --precision auto keeping float32 the layer whose bfloat16 rounding
matters, --calibration feeds, and where the figures are shown (inspect, cache ls).

Two models. ``mlp``: three layers of fan-in-scaled normal weights, where bfloat16 costs
about 2^-8 of the outputs' scale. ``cancelling``: its first layer's columns come in pairs
that differ by 2^-10 of their value, and a Sub (float32 in every precision) takes each
pair's difference; rounded to bfloat16's 8 significant bits both weight columns of a pair
become one number, so the differences, the model's whole signal, vanish. Rounding the
layer's input instead (what a CPU with a bfloat16 dot product also does) changes both
columns of a pair alike and keeps the signal, so on every CPU that one layer is the one
bfloat16 cannot hold. A second layer of normal weights follows, where bfloat16 costs what
it costs in ``mlp``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import nncc
from nncc.compiler import CompileOptions
from nncc.native.toolchain import find_toolchain
from nncc.preparing.deviation import PLAN_KEY
from nncc.preparing.token import token_context
from nncc.runtime.random_inputs import random_feeds
from tests.models import GraphBuilder
from tests.oracle import ort_outputs

pytestmark = pytest.mark.skipif(find_toolchain() is None,
                                reason="no C compiler: below float32 is native code only, so nothing to measure")

TOLERANCE = 1e-2


def relative(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |a|: the measure docs/native.md defines, computed here."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(a)))


def mlp(path) -> GraphBuilder:
    g = GraphBuilder(seed=1, name="mlp")
    h = g.input((16, 256))
    for shape in ((256, 256), (256, 128)):
        h = g.node("Relu", [g.node("MatMul", [h, g.weight(shape)])])
    g.output(g.node("MatMul", [h, g.weight((128, 32))]))
    g.save(path)
    return g


def cancelling(path) -> tuple[GraphBuilder, str]:
    """(the model, its first layer's weights: the one layer bfloat16 cannot hold)."""
    g = GraphBuilder(seed=2, name="cancelling")
    x = g.input((8, 64))
    base = g.rng.standard_normal((64, 16)) / 8
    first = g.const(np.concatenate([base, base * (1 + 2.0**-10)], axis=1))
    pairs = g.node("MatMul", [x, first])
    low = g.node("Slice", [pairs, g.ints([0]), g.ints([16]), g.ints([1])])
    high = g.node("Slice", [pairs, g.ints([16]), g.ints([32]), g.ints([1])])
    h = g.node("Sub", [high, low])
    g.output(g.node("MatMul", [h, g.weight((16, 16))]))
    g.save(path)
    return g, first


def outputs_of(compiled, feeds) -> dict:
    return compiled.run(feeds)


def check_of(plan) -> dict:
    return plan.options[PLAN_KEY]


@pytest.mark.slow
def test_the_recorded_deviation_is_the_one_onnxruntime_gives_on_the_same_inputs(tmp_path):
    path = tmp_path / "mlp.onnx"
    mlp(path)
    compiled = nncc.compile_model(path, precision="bf16")
    check = check_of(compiled.plan)
    assert check["inputs"] == 1 and check["feeds"] == "random" and check["float32_layers"] == []
    feeds = random_feeds(compiled.input_infos, 0)  # the input the check ran on: nncc's seeded random feed
    want = ort_outputs(str(path), feeds)
    got = outputs_of(compiled, feeds)
    worst = max(relative(want[n], got[n]) for n in want)
    (recorded,) = check["deviation"].values()
    assert 2.0**-12 < worst < 2.0**-5, worst  # bfloat16's cost: neither nothing nor a broken product
    assert abs(recorded - worst) <= 1e-3 * worst + 1e-6, (recorded, worst)
    # float32 records nothing: its deviation is not a question
    assert PLAN_KEY not in nncc.compile_model(path).plan.options


@pytest.mark.slow
def test_auto_keeps_the_cancelling_layer_float32_and_meets_the_tolerance(tmp_path):
    path = tmp_path / "cancelling.onnx"
    g, first = cancelling(path)
    rng = np.random.default_rng(3)
    feeds = {"x0": rng.standard_normal((8, 64)).astype(np.float32)}  # not the inputs the check ran on
    (name,) = [o.name for o in g.outputs]
    want = ort_outputs(str(path), feeds)[name]

    plain = nncc.compile_model(path, precision="bf16")
    assert relative(want, outputs_of(plain, feeds)[name]) > 0.5  # the construction: bfloat16 loses the signal
    assert check_of(plain.plan)["deviation"][name] > 0.5

    auto = nncc.compile_model(path, precision="auto", tolerance=TOLERANCE)
    check = check_of(auto.plan)
    assert check["float32_layers"] == [first] and check["tolerance"] == TOLERANCE
    assert check["deviation"][name] <= TOLERANCE
    packed = sorted(s.name for s in auto.plan.slots if "#gemm" in s.name)
    assert sum("bf16" in s for s in packed) == 1 and any(s.startswith(first + "#") and "bf16" not in s for s in packed)
    off = relative(want, outputs_of(auto, feeds)[name])
    assert 0 < off <= TOLERANCE, off  # the other layers still compute in bfloat16, within the tolerance

    # where bfloat16 is within the tolerance, auto keeps nothing float32
    mlp_path = tmp_path / "mlp.onnx"
    mlp(mlp_path)
    assert check_of(nncc.compile_model(mlp_path, precision="auto").plan)["float32_layers"] == []


def test_a_compile_over_the_tolerance_fails_in_one_line_and_writes_nothing(tmp_path, cli):
    path = tmp_path / "cancelling.onnx"
    cancelling(path)
    out, dep = tmp_path / "m.nncc", tmp_path / "m.d"
    code, _, err = cli("compile", path, "-o", out, "--depfile", dep, "--precision", "bf16",
                       "--tolerance", TOLERANCE)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith("nncc: error: precision bf16 deviates from float32 by ") and "tolerance 0.01" in lines[-1]
    assert not any("Traceback" in line for line in lines)
    assert not out.exists() and not dep.exists()
    code, listing, err = cli("cache", "ls", "--json")
    assert code == 0 and json.loads(listing)["entries"] == [], "a compile over its tolerance was cached"
    # the same model within a looser tolerance compiles, and says what it costs
    code, _, err = cli("compile", path, "-o", out, "--precision", "bf16", "--tolerance", "10")
    assert code == 0 and out.exists(), err
    assert "deviation from float32: " in err and "tolerance 10" in err


def test_the_deviation_is_shown_by_inspect_and_cache_ls(tmp_path, cli):
    path = tmp_path / "mlp.onnx"
    mlp(path)
    out = tmp_path / "m.nncc"
    code, _, err = cli("compile", path, "-o", out, "--precision", "bf16", "--tolerance", TOLERANCE)
    assert code == 0, err
    recorded = check_of(nncc.load(out).plan)["deviation"]
    code, text, _ = cli("inspect", out, "--json")
    assert code == 0 and json.loads(text)["options"][PLAN_KEY]["deviation"] == recorded
    code, text, _ = cli("inspect", out)
    assert "deviation from float32: " in text and "tolerance 0.01" in text
    code, text, _ = cli("cache", "ls", "--json")
    (entry,) = json.loads(text)["entries"]
    assert entry["precision"] == "bf16" and entry[PLAN_KEY]["deviation"] == recorded
    code, text, _ = cli("cache", "ls", "--wide")
    assert "deviation" in text and f"bf16 {max(recorded.values()):.3g}" in text


def test_calibration_feeds_are_what_the_deviation_is_measured_on(tmp_path, cli):
    path = tmp_path / "mlp.onnx"
    g = mlp(path)
    folder = tmp_path / "feeds"
    folder.mkdir()
    rng = np.random.default_rng(4)
    feeds = [{"x0": (rng.standard_normal((16, 256)) * scale).astype(np.float32)} for scale in (0.5, 3.0, 1.0)]
    for i, f in enumerate(feeds):
        np.savez(folder / f"feed{i}.npz", **f)
    compiled = nncc.compile_model(path, precision="bf16", calibration=str(folder))
    check = check_of(compiled.plan)
    assert check["feeds"] == "calibration" and check["inputs"] == 3
    (name,) = [o.name for o in g.outputs]
    independent = max(relative(ort_outputs(str(path), f)[name], compiled.run(f)[name]) for f in feeds)
    assert abs(check["deviation"][name] - independent) <= 1e-3 * independent + 1e-6
    # the feeds are in the token by content: other feeds, another entry
    before = token_context(CompileOptions(precision="bf16", calibration=str(folder)))
    np.savez(folder / "feed0.npz", x0=feeds[1]["x0"])
    assert before != token_context(CompileOptions(precision="bf16", calibration=str(folder)))
    # a folder without feeds, or a bad tolerance, is bad input
    empty = tmp_path / "empty"
    empty.mkdir()
    for extra in (["--calibration", empty], ["--tolerance", "-1"]):
        code, _, err = cli("compile", path, "-o", tmp_path / "x.nncc", "--precision", "bf16", *extra)
        assert code == 2 and err.strip().splitlines()[-1].startswith("nncc: error: "), err
        assert not (tmp_path / "x.nncc").exists()


def test_the_measure_follows_its_definition_on_zeros_and_non_finite_values():
    from nncc.preparing.calibration import relative as measured

    a = np.array([2.0, -4.0, np.nan, np.inf])
    assert measured(a, np.array([2.5, -4.0, np.nan, np.inf])) == pytest.approx(0.5 / 4)  # over a's finite values
    assert measured(a, np.array([2.0, -4.0, 1.0, np.inf])) == np.inf  # a NaN that b lost
    assert measured(a, np.array([np.inf, -4.0, np.nan, np.inf])) == np.inf  # b not finite where a is
    assert measured(np.zeros(3), np.zeros(3)) == 0.0 and measured(np.zeros(3), np.ones(3)) == np.inf
