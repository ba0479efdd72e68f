"""Which products keep bfloat16 weights where the CPU has no bfloat16 dot product
(``precision="bf16"`` on a target without AVX-512 BF16: the weights are widened to float32
on every read). A product whose weights are read by more than
nncc.native.precision.WIDENED_ROWS_MAX rows of A (per weight matrix) keeps them float32,
since widening them again for every tile of rows costs more than the halved bytes save;
the others keep bfloat16 weights. Checked: which packed weights hold which layout, every
result against onnxruntime's float32 (the bfloat16-weights bound, or float32's own sums
for the layers kept float32), the record and what inspect and cache ls --wide say, and
that a target with a bfloat16 dot product keeps every layer in bfloat16.
"""

from __future__ import annotations

import json

import numpy as np
from onnx import numpy_helper
import pytest

import nncc
from nncc.backends.base import Partition
from nncc.frontend.onnx import parse_model
from nncc.native.codegen import generate
from nncc.native.precision import WIDENED_ROWS_MAX, WIDENING_COSTS, weights_pay
from nncc.native.toolchain import find_toolchain, missing_features, required_features
from nncc.passes.pipeline import run_passes
from nncc.passes.shape_inference import infer_shapes
from nncc.preparing.deviation import PLAN_KEY
from tests.models import GraphBuilder
from tests.oracle import ort_outputs
from tests.test_native_bf16_weights import bound

TARGET = "x86-64-v3"  # AVX2 and FMA, no AVX-512 BF16: the widened-weights arithmetic
needs_target = pytest.mark.skipif(find_toolchain() is None or bool(missing_features(required_features(TARGET))),
                                  reason=f"no C compiler, or this CPU cannot run {TARGET} code")
K, N = 96, 40


def products(path) -> tuple[GraphBuilder, dict]:
    """Products by constant weights at row counts on both sides of the boundary: (the
    model, output -> (its weights' name, A as a row-major matrix per weight matrix, the
    weights per matrix, whether they should stay float32))."""
    g = GraphBuilder(seed=7, name="widening")
    cases = {}

    def matmul(a_shape, w_shape):
        a, w = g.input(a_shape), g.weight(w_shape)
        y = g.node("MatMul", [a, w])
        g.output(y)
        wv = value(g, w)
        av = g.feeds[a]
        rows = int(np.prod(a_shape[:-1])) // int(np.prod(w_shape[:-2], dtype=np.int64))
        cases[y] = (w, av, wv, rows > WIDENED_ROWS_MAX)

    matmul((1, K), (K, N))  # one-row decoding: reading the weights bounds it
    matmul((WIDENED_ROWS_MAX, K), (K, N))  # the last row count that keeps bfloat16 weights
    matmul((WIDENED_ROWS_MAX + 1, K), (K, N))  # the first that does not
    matmul((3, 67, K), (K, N))  # a batch of A folds into the rows: 201
    matmul((3, 100, K), (3, K, N))  # a weight matrix per batch: 100 rows each
    a = g.input((K, 200))  # Gemm with a transposed A: 200 rows
    w = g.weight((K, N))
    y = g.node("Gemm", [a, w], transA=1)
    g.output(y)
    cases[y] = (w, g.feeds[a].T, value(g, w), True)
    g.save(path)
    return g, cases


def value(g: GraphBuilder, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(t) for t in g.inits if t.name == name)


def forms(plan) -> dict[str, str]:
    """Packed GEMM weights by name: their layout (the form after '#')."""
    return {s.name.partition("#")[0]: s.name.partition("#")[2] for s in plan.slots if "#gemm" in s.name}


@needs_target
def test_many_rows_keep_float32_weights_and_every_result_is_within_its_bound(tmp_path):
    path = tmp_path / "widening.onnx"
    g, cases = products(path)
    compiled = nncc.compile_model(path, precision="bf16", target=TARGET)
    assert compiled.native_partitions == len(compiled.plan.partitions)
    layout = forms(compiled.plan)
    for out, (w, _, _, stays) in cases.items():
        assert layout[w] == ("gemm8" if stays else "gemm8bf16w"), (out, layout[w])
    want = ort_outputs(str(path), g.feeds)
    got = compiled.run(g.feeds)
    for out, (_, a, w, stays) in cases.items():
        a = a.reshape(*w.shape[:-2], -1, K) if w.ndim == 3 else a.reshape(-1, K)
        terms = np.abs(a.astype(np.float64)) @ np.abs(w.astype(np.float64))
        sums = (K + 2) * 2.0**-24 * terms.reshape(want[out].shape) + 1e-30  # float32's own sums
        err = np.abs(got[out].astype(np.float64) - want[out])
        if stays:
            assert (err <= sums).all(), f"{out}: off by {err.max():.3g}: not float32 weights"
        else:
            assert (err <= bound(a, w, K).reshape(err.shape) + 1e-30).all(), f"{out}: off by {err.max():.3g}"
            assert not (err <= sums).all(), f"{out}: float32's result, not bfloat16 weights'"
    check = compiled.plan.options[PLAN_KEY]
    stayed = [w for w, _, _, stays in cases.values() if stays]
    assert check["bfloat16_layers"] == len(cases) - len(stayed)
    assert check["float32_widening"] == {"layers": stayed, "why": WIDENING_COSTS}
    assert check["float32_layers"] == []  # none kept by precision auto


@needs_target
def test_inspect_and_cache_ls_say_how_many_layers_stayed_float32_and_why(tmp_path, cli):
    path = tmp_path / "widening.onnx"
    _, cases = products(path)
    stayed = sum(stays for *_, stays in cases.values())
    out = tmp_path / "m.nncc"
    code, _, err = cli("compile", path, "-o", out, "--precision", "bf16", "--target", TARGET)
    assert code == 0, err
    said = (f"{len(cases) - stayed} layer(s) with bfloat16 weights, {stayed} kept float32 "
            "(no bf16 dot product on this CPU: widening costs more than it saves)")
    assert said in err  # compile's own line
    code, text, _ = cli("inspect", out)
    assert code == 0 and said in " ".join(text.replace("│", " ").split())  # as rich wraps it
    code, text, _ = cli("inspect", out, "--json")
    assert len(json.loads(text)["options"][PLAN_KEY]["float32_widening"]["layers"]) == stayed
    code, text, _ = cli("cache", "ls", "--wide")
    assert code == 0 and f"({len(cases) - stayed} bf16, {stayed} f32)" in text


def _unit(path, vl: int, arithmetic: str):
    graph = run_passes(parse_model(path.read_bytes()), 2)
    part = Partition(0, "native", list(graph.nodes), list(graph.inputs), list(graph.outputs))
    return generate(part, graph, infer_shapes(graph), "entry", vl, arithmetic)


def test_a_bfloat16_dot_product_keeps_every_layer_bfloat16(tmp_path):
    """Generated C only (this CPU need not run it): with vdpbf16ps (AVX-512 BF16) every
    product's weights are bfloat16 whatever its rows; widened, the rule splits them."""
    path = tmp_path / "widening.onnx"
    _, cases = products(path)
    dot = {name.partition("#")[0]: name.partition("#")[2] for name in _unit(path, 16, "bf16").constants
           if "#gemm" in name}
    assert {dot[w] for w, *_ in cases.values()} == {"gemm16bf16"}
    widened = {name.partition("#")[0]: name.partition("#")[2] for name in _unit(path, 8, "bf16w").constants
               if "#gemm" in name}
    assert {w for w, *_, stays in cases.values() if stays} == {w for w, f in widened.items() if f == "gemm8"}
    assert all(weights_pay("bf16", rows) for rows in (1, WIDENED_ROWS_MAX + 1, 1 << 20))
