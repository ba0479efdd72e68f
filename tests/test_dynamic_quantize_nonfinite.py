"""A dynamically quantized product (quantize_dynamic's DynamicQuantizeLinear, MatMulInteger,
Cast, Mul, Add chain, and the com.microsoft DynamicQuantizeMatMul it fuses into) fed NaN and
infinities, native and portable, against onnxruntime and the onnx reference evaluator.

DynamicQuantizeLinear's range is max(x) and min(x) widened to include 0: a NaN makes it NaN,
so the scale and every result are NaN (the reference evaluator's reading). onnxruntime's
vector min/max instead loses a NaN, or the values that went before it in its lane, by where
it lies; the NaN input below puts the NaN after the -inf in every lane layout (64 elements
apart), where onnxruntime loses the -inf and comes to NaN everywhere too. Infinities without
NaN have one answer in all three: the scale is infinite, and only rows holding an infinity
keep a non-zero integer product."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

import nncc
from nncc.native.toolchain import find_toolchain
from tests.models import GraphBuilder
from tests.native_fuzz_cases import native_outputs
from tests.oracle import exact_integer_session

M, K, N = 4, 64, 5
PLANTED = {  # flat position in A -> value
    "nan": {10: -np.inf, 30: np.inf, 10 + K: np.nan},
    "inf": {10: -np.inf, 30: np.inf},
}
ROUTES = [pytest.param(None, id="native", marks=pytest.mark.skipif(
    find_toolchain(sanitize=False) is None, reason="no C compiler: there is no native code to check")),
    pytest.param(("numpy",), id="portable")]


def _model(fused: bool) -> tuple[onnx.ModelProto, np.ndarray]:
    g = GraphBuilder(opset=17, seed=3)
    a = g.input([M, K], scale=2.0)
    w = g.const(g.rng.integers(-128, 128, (K, N)), np.int8)
    scale = g.const(g.rng.uniform(0.005, 0.05, N))
    bias = g.const(g.rng.standard_normal(N))
    if fused:
        g.output(g.node("DynamicQuantizeMatMul", [a, w, scale, "", bias], domain="com.microsoft"))
    else:
        q, q_scale, q_zero = g.node_outputs("DynamicQuantizeLinear", [a], 3)
        product = g.node("Cast", [g.node("MatMulInteger", [q, w, q_zero])], to=onnx.TensorProto.FLOAT)
        g.output(g.node("Add", [g.node("Mul", [product, g.node("Mul", [q_scale, scale])]), bias]))
    return g.model(domains=["com.microsoft"] if fused else ()), g.feeds[a]


def _planted(a: np.ndarray, which: str) -> np.ndarray:
    flat = a.reshape(-1).copy()
    for at, value in PLANTED[which].items():
        flat[at] = value
    return flat.reshape(a.shape)


@pytest.mark.parametrize("backends", ROUTES)
@pytest.mark.parametrize("which", sorted(PLANTED))
@pytest.mark.parametrize("fused", [False, True], ids=["chain", "DynamicQuantizeMatMul"])
def test_nan_and_infinities_give_what_onnxruntime_gives(tmp_path, fused, which, backends):
    model, a = _model(fused)
    a = _planted(a, which)
    onnx.save(model, str(tmp_path / "m.onnx"))
    options = {} if backends is None else {"backends": backends}
    compiled = nncc.compile_model(tmp_path / "m.onnx", opt_level=2, **options)
    (name,) = [o.name for o in model.graph.output]
    got = compiled.run({model.graph.input[0].name: a})[name]
    if backends is None:
        assert name in native_outputs(compiled)
    session = exact_integer_session(model)  # its integer products exact, as nncc's
    (want,) = session.run(None, {model.graph.input[0].name: a})
    np.testing.assert_array_equal(got, want)
    if which == "nan":
        assert np.isnan(got).all()
    else:
        assert np.isinf(got[0]).all() and np.isnan(got[1:]).all()  # only row 0 holds infinities
    if not fused:  # the evaluator knows no com.microsoft op
        with np.errstate(invalid="ignore"):
            (ref,) = ReferenceEvaluator(model).run(None, {model.graph.input[0].name: a})
        np.testing.assert_array_equal(got, ref)
