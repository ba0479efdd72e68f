"""Recurrent kernels (RNN, GRU, LSTM) and the gru_cell fixture against independent oracles.

Oracles:
  * onnxruntime (CPUExecutionProvider) on one-node models at realistic shapes (sequence 16,
    batch 4, input 32, hidden 64) for every direction and option combination. onnxruntime
    rejects layout=1 ("batchwise recurrent operations are not supported"), so for layout 1 the
    oracle runs the layout-0 op on the transposed inputs and transposes its outputs back, which
    is exactly how the ONNX spec defines layout 1;
  * onnx.reference for float64 (onnxruntime has no double GRU/LSTM/RNN kernels);
  * for the gru_cell fixture, the same step loop through onnxruntime, and one GRU node over the
    whole sequence in onnxruntime (the recurrence computed by a different program path).

The kernel is called directly, and its shape function is checked against the shapes of the
oracle's outputs.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from tests import onnx_backend
from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import Ctx, resolve
from tests.conftest import FIXTURES, ROOT
from tests.oracle import ort_session

T, B, I, H = 16, 4, 32, 64
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
N_OUT = {"RNN": 2, "GRU": 2, "LSTM": 3}
RTOL, ATOL = 1e-4, 1e-5

_ELEM = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.int32): TensorProto.INT32,
}


def _session(model: onnx.ModelProto):
    return ort_session(model)


def _one_node(op, inputs, attrs, n_out, opset=14, out_names=None):
    names = ["" if a is None else f"in{i}" for i, a in enumerate(inputs)]
    while names and names[-1] == "":
        names.pop()
    outs = out_names or [f"out{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, **attrs)
    graph_inputs = [helper.make_tensor_value_info(n, _ELEM[a.dtype], a.shape)
                    for n, a in zip(names, inputs) if n]
    graph = helper.make_graph([node], "g", graph_inputs,
                              [helper.make_empty_tensor_value_info(o) for o in outs if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    feeds = {n: a for n, a in zip(names, inputs) if n}
    return model, feeds


def run_ort(op, inputs, attrs, n_out, opset=14):
    model, feeds = _one_node(op, inputs, attrs, n_out, opset)
    return _session(model).run(None, feeds)


def run_ort_any_layout(op, inputs, attrs, n_out):
    """onnxruntime as the oracle; layout 1 emulated by transposing to and from layout 0."""
    if attrs.get("layout", 0) == 0:
        return run_ort(op, inputs, attrs, n_out)
    t = [None if a is None else a.transpose(1, 0, 2) for a in inputs[5:7]]   # initial_h/c
    ins = [inputs[0].transpose(1, 0, 2)] + list(inputs[1:5]) + t + list(inputs[7:])
    outs = run_ort(op, ins, {**attrs, "layout": 0}, n_out)
    return [outs[0].transpose(2, 0, 1, 3)] + [o.transpose(1, 0, 2) for o in outs[1:]]


def run_nncc(op, inputs, attrs, n_out, opset=14):
    k = resolve(op, "", opset)
    ctx = Ctx(dict(attrs), opset, n_out)
    got = k.fn(ctx, *inputs)
    got = got if isinstance(got, tuple) else (got,)
    infos = [None if a is None else TensorInfo(a.dtype, tuple(a.shape)) for a in inputs]
    return got, k.shape(ctx, *infos)


def make_inputs(op, rng, direction="forward", layout=0, bias=True, seq=False, init=True,
                peephole=False, dtype=np.float32, t=T, b=B, i=I, h=H):
    g, d = GATES[op], 2 if direction == "bidirectional" else 1
    x = rng.standard_normal((t, b, i) if layout == 0 else (b, t, i))
    w = rng.standard_normal((d, g * h, i)) / np.sqrt(i)
    r = rng.standard_normal((d, g * h, h)) / np.sqrt(h)
    bb = rng.standard_normal((d, 2 * g * h)) * 0.3 if bias else None
    lens = np.array([t, t // 2 + 1, 1, t - 3][:b], np.int32) if seq else None
    state = (d, b, h) if layout == 0 else (b, d, h)
    h0 = rng.standard_normal(state) if init else None
    ins = [x, w, r, bb, lens, h0]
    if op == "LSTM":
        ins.append(rng.standard_normal(state) if init else None)
        ins.append(rng.standard_normal((d, 3 * h)) * 0.5 if peephole else None)
    return [a if a is None or a.dtype == np.int32 else a.astype(dtype) for a in ins]


def check(op, inputs, attrs, rtol=RTOL, atol=ATOL):
    n = N_OUT[op]
    want = run_ort_any_layout(op, inputs, attrs, n)
    got, pred = run_nncc(op, inputs, attrs, n)
    assert len(got) == n
    for g, w, p in zip(got, want, pred):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
        assert p.dtype == w.dtype and p.shape == w.shape


# -- realistic shapes, every direction and option combination --------------------------

DIRECTIONS = ["forward", "reverse", "bidirectional"]


@pytest.mark.parametrize("seq", [False, True], ids=["full", "seq_lens"])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_directions_layouts_sequence_lens(op, direction, layout, seq):
    rng = np.random.default_rng(11)
    ins = make_inputs(op, rng, direction, layout, seq=seq)
    check(op, ins, {"direction": direction, "hidden_size": H, "layout": layout})


@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("bias,init,seq", [(True, True, False), (False, False, False),
                                           (True, False, True), (False, True, True)])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_gru_options(direction, bias, init, seq, lbr):
    rng = np.random.default_rng(12)
    ins = make_inputs("GRU", rng, direction, bias=bias, init=init, seq=seq)
    check("GRU", ins, {"direction": direction, "hidden_size": H, "linear_before_reset": lbr})


@pytest.mark.parametrize("variant", ["plain", "peepholes", "input_forget", "both", "bare"])
@pytest.mark.parametrize("seq", [False, True], ids=["full", "seq_lens"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_lstm_options(direction, seq, variant):
    rng = np.random.default_rng(13)
    ins = make_inputs("LSTM", rng, direction, seq=seq, peephole=variant in ("peepholes", "both"),
                      bias=variant != "bare", init=variant != "bare")
    attrs = {"direction": direction, "hidden_size": H}
    if variant in ("input_forget", "both"):
        attrs["input_forget"] = 1
    check("LSTM", ins, attrs)


@pytest.mark.parametrize("bias,init", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_rnn_options(direction, bias, init):
    rng = np.random.default_rng(14)
    check("RNN", make_inputs("RNN", rng, direction, bias=bias, init=init),
          {"direction": direction, "hidden_size": H})


ACTIVATION_CASES = [
    ("RNN", "forward", {"activations": ["Relu"]}),
    ("RNN", "forward", {"activations": ["LeakyRelu"], "activation_alpha": [0.2], "clip": 1.0}),
    ("RNN", "bidirectional", {"activations": ["Relu", "Tanh"]}),
    ("RNN", "forward", {"activations": ["Sigmoid"]}),
    ("GRU", "forward", {"activations": ["HardSigmoid", "LeakyRelu"],
                        "activation_alpha": [0.3, 0.2], "activation_beta": [0.4]}),
    ("GRU", "forward", {"activations": ["HardSigmoid", "LeakyRelu"]}),   # default alpha/beta
    ("GRU", "forward", {"activations": ["Sigmoid", "Relu"]}),
    ("GRU", "forward", {"activations": ["Sigmoid", "Affine"], "activation_alpha": [0.5],
                        "activation_beta": [0.1]}),
    ("GRU", "forward", {"activations": ["Sigmoid", "Softplus"]}),
    ("GRU", "forward", {"activations": ["Sigmoid", "ThresholdedRelu"], "activation_alpha": [0.1]}),
    ("GRU", "forward", {"activations": ["sigmoid", "tanh"]}),                # case-insensitive
    ("GRU", "forward", {"clip": 0.7}),
    ("GRU", "reverse", {"clip": 0.7, "linear_before_reset": 1}),
    ("GRU", "bidirectional", {"activations": ["Sigmoid", "Tanh", "HardSigmoid", "Softsign"]}),
    ("GRU", "bidirectional", {"activations": ["Sigmoid", "ScaledTanh", "Sigmoid", "Elu"],
                              "activation_alpha": [0.8, 0.6], "activation_beta": [1.5]}),
    ("LSTM", "forward", {"clip": 0.5}),
    ("LSTM", "forward", {"activations": ["HardSigmoid", "Tanh", "Softsign"]}),
    ("LSTM", "forward", {"activations": ["Sigmoid", "LeakyRelu", "Affine"],
                         "activation_alpha": [0.1, 0.5], "activation_beta": [0.2]}),
    ("LSTM", "bidirectional", {"activations": ["Sigmoid", "Tanh", "Tanh",
                                               "HardSigmoid", "Relu", "Tanh"]}),
]


@pytest.mark.parametrize("op,direction,attrs", ACTIVATION_CASES,
                         ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(ACTIVATION_CASES)])
def test_activation_attributes_and_clip(op, direction, attrs):
    rng = np.random.default_rng(15)
    ins = make_inputs(op, rng, direction, peephole=op == "LSTM")
    check(op, ins, {"direction": direction, "hidden_size": H, **attrs})


def test_lstm_clip_with_peepholes_and_sequence_lens():
    rng = np.random.default_rng(16)
    ins = make_inputs("LSTM", rng, "bidirectional", seq=True, peephole=True)
    check("LSTM", ins, {"direction": "bidirectional", "hidden_size": H, "clip": 0.5})


def test_hidden_size_attribute_is_optional():
    rng = np.random.default_rng(17)
    ins = make_inputs("GRU", rng)
    want = run_ort("GRU", ins, {"hidden_size": H}, 2)
    got, pred = run_nncc("GRU", ins, {}, 2)
    for g, w, p in zip(got, want, pred):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
        assert p.shape == w.shape


def test_float16_inputs():
    rng = np.random.default_rng(18)
    ins = make_inputs("LSTM", rng, "bidirectional", dtype=np.float16, peephole=True)
    check("LSTM", ins, {"direction": "bidirectional", "hidden_size": H}, rtol=1e-2, atol=2e-3)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_float64_against_onnx_reference(op):
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(19)
    ins = make_inputs(op, rng, "bidirectional", dtype=np.float64, peephole=op == "LSTM")
    attrs = {"direction": "bidirectional", "hidden_size": H}
    if op == "GRU":
        attrs["linear_before_reset"] = 1
    n = N_OUT[op]
    model, feeds = _one_node(op, ins, attrs, n)
    want = ReferenceEvaluator(model).run(None, feeds)
    got, pred = run_nncc(op, ins, attrs, n)
    for g, w, p in zip(got, want, pred):
        assert g.dtype == np.float64 and g.shape == w.shape and p.dtype == np.float64
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


# -- optional outputs through the whole nncc pipeline -----------------------------------


@pytest.mark.parametrize("op,outs", [
    ("GRU", ["", "Y_h"]),
    ("GRU", ["Y"]),
    ("LSTM", ["", "", "Y_c"]),
    ("LSTM", ["", "Y_h"]),
    ("RNN", ["Y", "Y_h"]),
])
def test_optional_outputs_through_nncc(op, outs):
    rng = np.random.default_rng(20)
    ins = make_inputs(op, rng, "reverse", seq=True)
    attrs = {"direction": "reverse", "hidden_size": H}
    model, feeds = _one_node(op, ins, attrs, len(outs), out_names=outs)
    want = _session(model).run(None, feeds)
    got = onnx_backend.prepare(model).run([feeds[n] for n in sorted(feeds)])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def test_kernel_does_not_mutate_inputs():
    rng = np.random.default_rng(21)
    ins = make_inputs("LSTM", rng, "bidirectional", seq=True, peephole=True)
    before = [None if a is None else a.copy() for a in ins]
    run_nncc("LSTM", ins, {"direction": "bidirectional", "hidden_size": H, "clip": 3.0}, 3)
    for a, b in zip(ins, before):
        if a is not None:
            np.testing.assert_array_equal(a, b)


def test_sequence_lens_pads_y_with_zeros_and_keeps_last_valid_state():
    rng = np.random.default_rng(22)
    ins = make_inputs("GRU", rng, "bidirectional", seq=True)
    lens = ins[4]
    got, _ = run_nncc("GRU", ins, {"direction": "bidirectional", "hidden_size": H}, 2)
    y, y_h = got
    for bi, n in enumerate(lens):
        assert not y[n:, :, bi].any()                       # padding is zero
        np.testing.assert_array_equal(y_h[0, bi], y[n - 1, 0, bi])   # forward: last valid step
        np.testing.assert_array_equal(y_h[1, bi], y[0, 1, bi])       # reverse: ends at t = 0


# -- shape functions ---------------------------------------------------------------------


def _shape(op, attrs, infos, n_out=None, opset=14):
    k = resolve(op, "", opset)
    return k.shape(Ctx(dict(attrs), opset, n_out or N_OUT[op]), *infos)


def _f32(*shape):
    return TensorInfo(np.dtype(np.float32), tuple(shape))


def test_shape_symbolic_dims_layout_0():
    out = _shape("LSTM", {"hidden_size": 20, "direction": "bidirectional"},
                 [_f32("S", "N", 10), _f32(2, 80, 10), _f32(2, 80, 20)])
    assert [o.shape for o in out] == [("S", 2, "N", 20), (2, "N", 20), (2, "N", 20)]
    assert all(o.dtype == np.float32 for o in out)


def test_shape_layout_1_and_hidden_from_r():
    out = _shape("GRU", {"layout": 1}, [_f32(3, 7, 5), _f32(1, 24, 5), _f32(1, 24, 8)])
    assert [o.shape for o in out] == [(3, 7, 1, 8), (3, 1, 8)]


def test_shape_unknown_x_shape_keeps_rank():
    out = _shape("RNN", {"hidden_size": 4}, [TensorInfo(np.dtype(np.float32), None),
                                             _f32(1, 4, 3), _f32(1, 4, 4)])
    assert [o.shape for o in out] == [(None, 1, None, 4), (1, None, 4)]


def test_shape_batch_from_initial_h_when_x_batch_unknown():
    out = _shape("GRU", {"hidden_size": 4},
                 [_f32(5, None, 3), _f32(1, 12, 3), _f32(1, 12, 4), None, None, _f32(1, 6, 4)])
    assert out[1].shape == (1, 6, 4)


def test_shape_respects_declared_output_count():
    infos = [_f32(5, 2, 3), _f32(1, 16, 3), _f32(1, 16, 4)]
    assert len(_shape("LSTM", {"hidden_size": 4}, infos, n_out=1)) == 1
    assert len(_shape("LSTM", {"hidden_size": 4}, infos, n_out=2)) == 2


@pytest.mark.parametrize("attrs,infos,message", [
    ({"direction": "sideways"}, None, "direction"),
    ({"layout": 2}, None, "layout"),
    ({"activations": ["Sigmoid"]}, None, "activations"),
    ({"activations": ["Sigmoid", "Swish"]}, None, "unsupported activation"),
    ({"hidden_size": 5}, None, "W has shape.*hidden_size=5"),
    ({"direction": "bidirectional"}, None, "W has shape"),
    ({}, [_f32(5, 2, 3), _f32(1, 12, 3), _f32(1, 12, 4), _f32(1, 12)], "B has shape"),
    ({}, [TensorInfo(np.dtype(np.int64), (5, 2, 3)), _f32(1, 12, 3), _f32(1, 12, 4)],
     "floating-point"),
    ({}, [_f32(5, 3), _f32(1, 12, 3), _f32(1, 12, 4)], "rank 3"),
    ({"linear_before_reset": 2}, None, "linear_before_reset"),
])
def test_shape_errors(attrs, infos, message):
    infos = infos or [_f32(5, 2, 3), _f32(1, 12, 3), _f32(1, 12, 4)]
    with pytest.raises(ShapeInferenceError, match=message):
        _shape("GRU", attrs, infos)


# -- kernel errors -----------------------------------------------------------------------


def _small(op="GRU", **kw):
    return make_inputs(op, np.random.default_rng(23), t=5, b=2, i=3, h=4, **kw)


@pytest.mark.parametrize("mutate,attrs,message", [
    (lambda ins: ins.__setitem__(4, np.array([6, 1], np.int32)), {}, "sequence_lens"),
    (lambda ins: ins.__setitem__(4, np.array([1, 2, 3], np.int32)), {}, "sequence_lens"),
    (lambda ins: ins.__setitem__(5, np.zeros((1, 3, 4), np.float32)), {}, "initial_h"),
    (lambda ins: ins.__setitem__(3, np.zeros((1, 12), np.float32)), {}, "B has shape"),
    (lambda ins: None, {"hidden_size": 8}, "hidden_size"),
    (lambda ins: None, {"direction": "bidirectional"}, "W has shape"),
    (lambda ins: None, {"activations": ["Sigmoid", "Gelu"]}, "unsupported activation"),
    (lambda ins: ins.__setitem__(0, ins[0].astype(np.int32)), {}, "float"),
])
def test_kernel_errors(mutate, attrs, message):
    ins = _small()
    mutate(ins)
    with pytest.raises(KernelError, match=message):
        run_nncc("GRU", ins, attrs, 2)


def test_lstm_peephole_shape_error():
    ins = _small("LSTM")
    ins[7] = np.zeros((1, 4), np.float32)
    with pytest.raises(KernelError, match="P has shape"):
        run_nncc("LSTM", ins, {}, 3)


# -- the gru_cell fixture: stateful stepping -----------------------------------------------

CELL = FIXTURES / "gru_cell.onnx"
STEPS = 20


def _cell_weights():
    model = onnx.load(str(CELL))
    gru = next(n for n in model.graph.node if n.op_type == "GRU")
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    attrs = {a.name: helper.get_attribute_value(a) for a in gru.attribute}
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
    return [inits[name] for name in gru.input[1:4]], attrs


def test_gru_cell_fixture_is_small_and_valid():
    data = CELL.read_bytes()
    assert len(data) < 2 * 1024 * 1024
    model = onnx.load_from_string(data)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8
    assert {o.domain: o.version for o in model.opset_import}[""] == 17
    assert [i.name for i in model.graph.input] == ["x", "h_in"]
    assert [o.name for o in model.graph.output] == ["y", "h_out"]


def test_gru_cell_fixture_regenerates_identically():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_fixtures", ROOT / "fixtures" / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.gru_cell().SerializeToString(deterministic=True) == CELL.read_bytes()


def test_gru_cell_stepping_matches_onnxruntime_and_a_whole_sequence_gru():
    rng = np.random.default_rng(24)
    xs = rng.standard_normal((STEPS, 1, 1, 16)).astype(np.float32)
    h0 = (rng.standard_normal((1, 1, 32)) * 0.5).astype(np.float32)

    compiled = nncc.compile_model(CELL)
    session = _session(onnx.load(str(CELL)))
    h_nncc, h_ort = h0, h0
    hs_nncc, ys_nncc, hs_ort, ys_ort = [], [], [], []
    for k in range(STEPS):
        got = compiled.run({"x": xs[k], "h_in": h_nncc})
        y, h_ort = session.run(["y", "h_out"], {"x": xs[k], "h_in": h_ort})
        h_nncc = got["h_out"]
        assert got["y"].shape == (1, 1, 8) and h_nncc.shape == (1, 1, 32)
        hs_nncc.append(h_nncc)
        ys_nncc.append(got["y"])
        hs_ort.append(h_ort)
        ys_ort.append(y)
    # the same step loop in onnxruntime
    np.testing.assert_allclose(np.concatenate(hs_nncc), np.concatenate(hs_ort), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.concatenate(ys_nncc), np.concatenate(ys_ort), rtol=1e-4, atol=1e-5)

    # one GRU node over the whole 20-step sequence in onnxruntime: the state after step k is
    # Y[k], and the final one is Y_h
    (w, r, b), attrs = _cell_weights()
    x_seq = xs.reshape(STEPS, 1, 16)
    y_all, y_h = run_ort("GRU", [x_seq, w, r, b, None, h0], attrs, 2, opset=17)
    np.testing.assert_allclose(h_nncc, y_h, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.concatenate(hs_nncc).reshape(STEPS, 32),
                               y_all.reshape(STEPS, 32), rtol=1e-4, atol=1e-5)
    assert np.abs(h_nncc).max() > 0.05   # the state did not die out


def test_gru_cell_state_is_not_aliased_between_runs():
    compiled = nncc.compile_model(CELL)
    x = np.ones((1, 1, 16), np.float32)
    h = np.zeros((1, 1, 32), np.float32)
    first = compiled.run({"x": x, "h_in": h})["h_out"]
    kept = first.copy()
    compiled.run({"x": x, "h_in": first})
    np.testing.assert_array_equal(first, kept)       # feeding h_out back never overwrites it
    np.testing.assert_array_equal(h, 0)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_empty_sequences_give_zero_final_states(op):
    # The spec leaves a zero sequence length open; onnxruntime returns zero Y_h/Y_c for it.
    rng = np.random.default_rng(25)
    ins = make_inputs(op, rng, "bidirectional", seq=True)
    ins[4] = np.array([0, 5, T, 0], np.int32)
    check(op, ins, {"direction": "bidirectional", "hidden_size": H})


# -- the per-node plan a stepped cell reuses ------------------------------------------------


def _gru_model(tmp_path, weights_as_inputs: bool):
    rng = np.random.default_rng(11)
    D, H, I = 1, 8, 5
    w = rng.standard_normal((D, 3 * H, I)).astype(np.float32)
    r = rng.standard_normal((D, 3 * H, H)).astype(np.float32)
    b = rng.standard_normal((D, 6 * H)).astype(np.float32)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, I]),
              helper.make_tensor_value_info("h0", TensorProto.FLOAT, [D, 2, H])]
    inits = [numpy_helper.from_array(a, n) for n, a in (("w", w), ("r", r), ("b", b))]
    if weights_as_inputs:
        inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in (("w", w), ("r", r))]
        inits = inits[2:]
    graph = helper.make_graph(
        [helper.make_node("GRU", ["x", "w", "r", "b", "", "h0"], ["", "h"], hidden_size=H)], "gru",
        inputs, [helper.make_tensor_value_info("h", TensorProto.FLOAT, [D, 2, H])], inits)
    path = tmp_path / "gru.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8), path)
    return path, w, r


@pytest.mark.parametrize("weights_as_inputs", [False, True])
def test_stepped_cell_reuses_its_plan_only_for_constant_weights(tmp_path, weights_as_inputs):
    path, w, r = _gru_model(tmp_path, weights_as_inputs)
    # the plan is the portable kernel's: constant weights would otherwise make the node native
    model = nncc.compile_model(path, backends=("numpy",))
    session = ort_session(path)
    rng = np.random.default_rng(12)
    h = np.zeros((1, 2, 8), np.float32)
    for step in range(4):  # new x and h each step; with runtime weights, new weights too
        feeds = {"x": rng.standard_normal((1, 2, 5)).astype(np.float32), "h0": h}
        if weights_as_inputs:
            feeds["w"] = (w * (1 + step)).astype(np.float32)
            feeds["r"] = (r / (1 + step)).astype(np.float32)
        want = session.run(None, feeds)[0]
        got = model.run(feeds)["h"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        h = got
    plans = [s[1].scratch.get("recurrent plan") for s in model._executor.steps]
    assert any(p is not None for p in plans) is (not weights_as_inputs)
