"""RNN, GRU and LSTM as native code (nncc/native/recurrent_gen.py) against onnxruntime.

The fuzzer's recurrent cases (tests/native_fuzz_cases.py) pinned to the corners: every op,
direction and layout, clip, GRU's linear_before_reset 0 and 1, LSTM's peepholes and
input_forget, initial states fed at run time, outputs in several subsets, a batch beyond
one product tile, hidden sizes off the vector width; all in one model that must become a
single native partition (no recurrence left to numpy). Their tolerance is the fuzzer's:
|nncc - onnxruntime| <= 1e-6 * (input + hidden + 2) * max(1, max |onnxruntime|) + 1e-5
|onnxruntime| per element (a gate is a sum of that many float32 products; sigmoid and tanh
keep errors from growing over time; a wrong index, gate or direction is off by the order of
the values themselves). Then the forms check() takes or leaves that the fuzzer never draws,
each against onnxruntime within 2e-5 + 2e-5 |onnxruntime|.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.frontend.onnx import parse_model
from nncc.native import recurrent_gen
from nncc.native.toolchain import find_toolchain
from nncc.passes.shape_inference import infer_shapes
from tests import native_fuzz_cases as F
from tests.models import benchmark_model
from tests.oracle import ort_session

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")

ATOL = RTOL = 2e-5
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


PINNED = [  # geometry keys each case fixes; the rest drawn from the fuzz generator
    dict(op="LSTM", seq=7, batch=1, input=5, hidden=20, direction="forward", layout=0, clip=None, bias=True,
         initial=False, peepholes=False, input_forget=0, outputs=[True, True, True]),
    dict(op="LSTM", seq=5, batch=3, input=9, hidden=33, direction="reverse", layout=1, initial=True,
         peepholes=False, outputs=[True, True, True]),
    dict(op="LSTM", seq=6, batch=2, input=4, hidden=17, direction="bidirectional", layout=0, clip=0.7,
         peepholes=True, input_forget=0, outputs=[True, True, True]),
    dict(op="LSTM", seq=4, batch=5, input=3, hidden=16, direction="bidirectional", layout=1, input_forget=1,
         peepholes=True, initial=True, outputs=[False, True, True]),
    dict(op="LSTM", seq=3, batch=2, input=6, hidden=8, bias=False, outputs=[False, False, True]),
    dict(op="GRU", seq=8, batch=2, input=7, hidden=19, lbr=0, direction="forward", layout=0,
         outputs=[True, True]),
    dict(op="GRU", seq=8, batch=1, input=7, hidden=40, lbr=1, direction="bidirectional", initial=True,
         outputs=[True, True]),
    dict(op="GRU", seq=5, batch=4, input=3, hidden=9, lbr=0, direction="reverse", layout=1, clip=0.5,
         outputs=[False, True]),
    dict(op="GRU", seq=3, batch=3, input=2, hidden=70, lbr=1, layout=1, clip=1.5, bias=False,
         outputs=[True, False]),
    dict(op="GRU", seq=6, batch=2, input=5, hidden=11, lbr=0, direction="bidirectional", initial=True, layout=1,
         outputs=[True, True]),
    dict(op="RNN", seq=9, batch=2, input=4, hidden=13, direction="bidirectional", initial=True, layout=0,
         outputs=[True, True]),
    dict(op="RNN", seq=1, batch=1, input=1, hidden=1, layout=1, clip=0.3, outputs=[True, True]),
    dict(op="LSTM", seq=2, batch=9, input=40, hidden=70, direction="bidirectional", layout=0, initial=True,
         outputs=[True, True, True]),
]


def _cases():
    cases = []
    for i, given in enumerate(PINNED):
        case = F.Case(98, i, "recurrent", {})
        F.recurrent(case, np.random.default_rng([98, i]), **given)
        cases.append(case)
    return cases


@pytest.mark.slow
def test_recurrent_matches_onnxruntime(tmp_path):
    cases = _cases()
    path = tmp_path / "recurrent.onnx"
    onnx.save(F.batch_model(cases), str(path))
    model = nncc.compile_model(path)
    # every node in one native partition: no recurrence left to numpy
    assert len(model.plan.partitions) == 1 and model.native_partitions == 1
    got = model.run(F.feeds(cases))
    want = F.run_onnxruntime(cases)
    reports = [r for case in cases if (r := F.judge(case, got, want, F.native_outputs(model)))]
    assert not reports, "\n".join(reports)


@pytest.mark.slow
def test_stacked_lstm_of_the_benchmark_is_one_native_partition(tmp_path):
    """benchmarks/real_models.py's LSTM (each layer's Y squeezed into the next) at small
    sizes: both layers and the Squeezes between them in one native partition."""
    model = benchmark_model("lstm(seq=9, inp=6, hidden=21, layers=3)", tmp_path)
    feeds = {"x": np.random.default_rng(3).standard_normal((9, 1, 6)).astype(np.float32)}
    _compare(tmp_path, model, feeds, native=True)


def recurrent_model(op, seq, batch, inp, hidden, acts=None, seq_lens=None):
    """(model, feeds): one forward node of constant weights, X a graph input."""
    rng = np.random.default_rng(5)
    g = GATES[op]
    inits = [numpy_helper.from_array(rng.uniform(-0.5, 0.5, shape).astype(np.float32), name)
             for name, shape in (("W", (1, g * hidden, inp)), ("R", (1, g * hidden, hidden)))]
    ins = ["X", "W", "R"]
    if seq_lens is not None:
        ins += ["", "L"]
        inits.append(numpy_helper.from_array(np.asarray(seq_lens, np.int32), "L"))
    attrs = dict(hidden_size=hidden)
    if acts is not None:
        attrs["activations"] = acts
    node = helper.make_node(op, ins, ["Y", "Y_h"], **attrs)
    graph = helper.make_graph([node], "recurrent", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                                                  [seq, batch, inp])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("Y", "Y_h")],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model, {"X": rng.standard_normal((seq, batch, inp)).astype(np.float32)}


def _why(model) -> str | None:
    graph = parse_model(model.SerializeToString())
    infos = infer_shapes(graph)
    node = next(n for n in graph.nodes if recurrent_gen.handles(n))
    return recurrent_gen.check(node, graph, infos)


def _compare(tmp_path, model, feeds, native: bool):
    path = tmp_path / "rnn.onnx"
    onnx.save(model, str(path))
    compiled = nncc.compile_model(path)
    assert len(compiled.plan.partitions) == 1 and (compiled.native_partitions == 1) == native
    got = compiled.run(feeds)
    session = ort_session(model)
    for name, want in zip([o.name for o in session.get_outputs()], session.run(None, feeds)):
        np.testing.assert_allclose(got[name], want, rtol=RTOL, atol=ATOL, err_msg=name)


def test_full_sequence_lens_and_default_activations_spelled_out_are_native(tmp_path):
    model, feeds = recurrent_model("LSTM", 4, 2, 3, 10, acts=["Sigmoid", "Tanh", "Tanh"], seq_lens=[4, 4])
    assert _why(model) is None
    _compare(tmp_path, model, feeds, native=True)


@pytest.mark.parametrize("options, reason", [
    (dict(acts=["Relu"]), "activations"),
    (dict(seq_lens=[3, 2]), "sequence_lens"),
])
def test_forms_that_stay_portable(tmp_path, options, reason):
    model, feeds = recurrent_model("RNN", 4, 2, 3, 5, **options)
    why = _why(model)
    assert why is not None and reason in why
    _compare(tmp_path, model, feeds, native=False)  # still right, by the portable kernel


def test_computed_weights_stay_portable():
    model, _ = recurrent_model("GRU", 3, 1, 2, 4)
    graph = model.graph
    w = next(i for i in graph.initializer if i.name == "W")
    graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, list(w.dims)))
    graph.initializer.remove(w)
    assert "W is not a constant" in _why(model)


@pytest.mark.slow
@pytest.mark.parametrize("op, lbr, widened", [("LSTM", 0, True), ("GRU", 0, True), ("RNN", 0, True),
                                              ("GRU", 1, False)])
def test_precision_bf16_computes_the_node_of_bfloat16_weights(tmp_path, op, lbr, widened):
    """Under precision bf16 the projection is the compile's bfloat16 GEMM and R is widened
    from bfloat16 (GRU with linear_before_reset keeps R float32: its panel is an odd number
    of vectors). The oracle: onnxruntime's float32 node given the weights rounded to
    bfloat16 by ml_dtypes (and X too where the arithmetic rounds the GEMM's A), which nncc
    must match to float32's tolerance; against the unrounded node it must differ."""
    import ml_dtypes

    from nncc.native.precision import arithmetic

    model, feeds = recurrent_model(op, 12, 2, 24, 40)
    if lbr:
        model.graph.node[0].attribute.append(helper.make_attribute("linear_before_reset", 1))
    path = tmp_path / "rnn.onnx"
    onnx.save(model, str(path))
    compiled = nncc.compile_model(path, precision="bf16")
    assert compiled.native_partitions == 1
    forms = {s.name.partition("#")[0]: s.name.partition("#")[2] for s in compiled.plan.slots if "#" in s.name}
    assert "bf16" in forms["W"] and ("bf16w" in forms["R"]) == widened, forms
    got = compiled.run(feeds)

    def rounded(a):
        return a.astype(ml_dtypes.bfloat16).astype(np.float32)

    low = onnx.ModelProto()
    low.CopyFrom(model)
    for init in low.graph.initializer:
        if init.name in ("W", "R") and (init.name == "W" or widened):
            init.CopyFrom(numpy_helper.from_array(rounded(numpy_helper.to_array(init)), init.name))
    low_feeds = dict(feeds)
    if arithmetic("bf16", "native") != "bf16w":  # a bfloat16 dot product rounds X as well
        low_feeds["X"] = rounded(feeds["X"])
    session, exact = ort_session(low), ort_session(model)
    names = [o.name for o in session.get_outputs()]
    for name, want, unrounded in zip(names, session.run(None, low_feeds), exact.run(None, feeds)):
        np.testing.assert_allclose(got[name], want, rtol=RTOL, atol=ATOL, err_msg=name)
        assert np.max(np.abs(got[name] - unrounded)) > 1e-4, name  # bfloat16 did change the node


@pytest.mark.slow
def test_precision_auto_keeps_a_recurrent_node_float32_under_a_tight_tolerance(tmp_path):
    """precision auto names W and R apart (each a weight it can keep float32): under a
    tolerance bfloat16 cannot meet both stay float32 and the node then matches onnxruntime's
    float32 to float32's tolerance; under a loose one both stay bfloat16."""
    from nncc.preparing.deviation import PLAN_KEY

    model, feeds = recurrent_model("LSTM", 12, 2, 24, 40)
    path = tmp_path / "rnn.onnx"
    onnx.save(model, str(path))
    tight = nncc.compile_model(path, precision="auto", tolerance=1e-5)
    assert sorted(tight.plan.options[PLAN_KEY]["float32_layers"]) == ["R", "W"]
    assert not any("bf16" in s.name for s in tight.plan.slots)
    got = tight.run(feeds)
    session = ort_session(model)
    for name, want in zip([o.name for o in session.get_outputs()], session.run(None, feeds)):
        np.testing.assert_allclose(got[name], want, rtol=RTOL, atol=ATOL, err_msg=name)
    loose = nncc.compile_model(path, precision="auto", tolerance=1.0)
    assert loose.plan.options[PLAN_KEY]["float32_layers"] == []
    assert sum("bf16" in s.name for s in loose.plan.slots) == 2
