"""Ops outside the tuned set that exporters write, each either native or removed by a pass, so
a model that holds them stays one native partition: the float32-to-float32 Cast of RMSNorm
exports, GlobalMaxPool, activations recognised by what they compute (HardSwish, SiLU, Mish
in their spellings), 1-D convolutions. Each model is built with onnx.helper and its outputs
are checked against onnxruntime running the model as written."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto
import pytest

import nncc
from nncc.errors import NnccError
from nncc.frontend.onnx import parse_model
from nncc.ir.graph import Graph, Node, TensorInfo
from nncc.native import codegen
from nncc.native.toolchain import find_toolchain
from nncc.passes.pipeline import run_passes
from tests.models import GraphBuilder
from tests.oracle import ort_run

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")


class Model(GraphBuilder):
    def __init__(self, opset: int = 18, seed: int = 0):
        super().__init__(opset, seed, "longtail")

    def optimized(self, tmp_path, level: int = 2) -> Graph:
        return run_passes(parse_model(self.save(tmp_path / "m.onnx").SerializeToString()), level)


def onnxruntime_outputs(path, feeds, names):
    return dict(zip(names, ort_run(path, feeds, names)))


def compile_and_compare(tmp_path, m: Model, rtol=1e-5, atol=1e-5, **options):
    """The model compiled by nncc, its outputs checked against onnxruntime's (``atol`` is
    relative to the output's largest magnitude)."""
    path = tmp_path / "m.onnx"
    m.save(path)
    compiled = nncc.compile_model(path, **options)
    names = [o.name for o in m.outputs]
    want = onnxruntime_outputs(path, m.feeds, names)
    got = compiled.run(m.feeds)
    for name in names:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol,
                                   atol=atol * max(1.0, float(np.nanmax(np.abs(want[name]), initial=0))),
                                   err_msg=name)
    return compiled


def assert_one_native_partition(compiled):
    plan = compiled.plan
    assert compiled.native_partitions == 1, [(p.backend, p.count) for p in plan.partitions]
    assert all(p.backend == "native" for p in plan.partitions), plan.fallbacks
    assert plan.fallbacks == []


def op_types(graph: Graph) -> list[str]:
    return [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in graph.nodes]


# -- Cast ---------------------------------------------------------------------------------------------


def _rms_norm(m: Model, cast_to: int = TensorProto.FLOAT) -> str:
    """LLaMA's RMSNorm as exported: x -> Cast(to=FLOAT) -> Pow 2 -> ReduceMean -> + eps ->
    Sqrt -> Div -> Mul by the weight."""
    x = m.input([2, 7, 64], scale=3.0)
    xc = m.node("Cast", [x], to=cast_to)
    sq = m.node("Pow", [xc, m.const(2.0)])
    mean = m.node("ReduceMean", [sq, m.const([-1], np.int64)], keepdims=1)
    root = m.node("Sqrt", [m.node("Add", [mean, m.const(1e-6)])])
    return m.node("Mul", [m.node("Div", [xc, root]), m.weight([64])])


def test_a_float32_to_float32_cast_is_removed_at_O1(tmp_path):
    m = Model()
    m.output(_rms_norm(m))
    assert "Cast" not in op_types(m.optimized(tmp_path, level=1))
    assert "Cast" in op_types(m.optimized(tmp_path, level=0))


@pytest.mark.slow
def test_an_rms_norm_export_is_one_native_partition(tmp_path):
    m = Model()
    m.output(_rms_norm(m))
    assert_one_native_partition(compile_and_compare(tmp_path, m))


def test_a_same_type_cast_left_by_O0_is_native_too(tmp_path):
    m = Model()
    m.output(_rms_norm(m))
    assert_one_native_partition(compile_and_compare(tmp_path, m, opt_level=0))


def test_a_cast_that_is_the_models_output_keeps_its_name(tmp_path):
    m = Model()
    x = m.input([3, 5])
    m.output(m.node("Cast", [m.node("Relu", [x])], to=TensorProto.FLOAT))
    compiled = compile_and_compare(tmp_path, m)
    assert_one_native_partition(compiled)


@pytest.mark.parametrize("to,dtype", [(TensorProto.DOUBLE, "float64"), (TensorProto.FLOAT16, "float16"),
                                      (TensorProto.INT16, "int16")])
def test_a_cast_to_another_type_stays_portable_saying_why(tmp_path, to, dtype):
    held = "float32, int32, int64, uint8 and bool"
    """Types native code does not hold (float32, int32, int64, uint8 and bool it does:
    tests/test_native_casts.py)."""
    graph = Graph(nodes=[], inputs=[], outputs=[], initializers={}, opsets={"": 18})
    f32 = np.dtype(np.float32)
    infos = {"x": TensorInfo(f32, (2, 3)), "y": TensorInfo(np.dtype(dtype), (2, 3))}
    node = Node("Cast", ["x"], ["y"], {"to": to}, name="n")
    assert codegen.check(node, graph, infos) == \
        f"a Cast from float32 to {dtype}: native code holds {held} values only"
    back = Node("Cast", ["y"], ["x"], {"to": TensorProto.FLOAT}, name="n")
    assert codegen.check(back, graph, infos) == \
        f"a Cast from {dtype} to float32: native code holds {held} values only"
    # and the model still runs, the Casts on the portable backend, which the plan says why
    m = Model(seed=2)
    x = m.input([4, 6], scale=4.0)
    there = m.node("Cast", [x], to=to)
    m.output(m.node("Mul", [m.node("Cast", [there], to=TensorProto.FLOAT), m.const(0.5)]))
    compiled = compile_and_compare(tmp_path, m, backends=("native",))
    assert [(f["op"], f["reason"]) for f in compiled.plan.fallbacks] == [
        ("Cast", f"native: a Cast from float32 to {dtype}: native code holds {held} values only"),
        ("Cast", f"native: a Cast from {dtype} to float32: native code holds {held} values only")]


# -- GlobalMaxPool ------------------------------------------------------------------------------------


def _nan_channels(x: np.ndarray) -> np.ndarray:
    """x with NaN at one scattered place in every third channel (first, middle or last
    position: in a vector's lanes and in the scalar tail) and every value NaN in channel 1."""
    x = x.copy()
    flat = x.reshape(x.shape[0], x.shape[1], -1)
    n = flat.shape[2]
    for c in range(0, x.shape[1], 3):
        flat[:, c, (0, n // 2, n - 1)[c // 3 % 3]] = np.nan
    flat[:, 1] = np.nan
    return x


def _global_max_model(blocked: bool, shape) -> Model:
    m = Model(seed=11)
    x = m.input(shape)
    if blocked:  # after a convolution: over the channel-blocked layout
        kernel = [3] * (len(shape) - 2)
        x = m.node("Conv", [x, m.weight([shape[1], shape[1]] + kernel)], pads=[1] * 2 * len(kernel))
    m.output(m.node("GlobalMaxPool", [x]))
    return m


@pytest.mark.slow
@pytest.mark.parametrize("blocked,shape", [(False, [2, 19, 5, 7]), (True, [2, 19, 5, 7]), (False, [3, 10, 33]),
                                           (True, [1, 8, 16, 16])])
def test_global_max_pool_is_native(tmp_path, blocked, shape):
    m = _global_max_model(blocked, shape)
    assert_one_native_partition(compile_and_compare(tmp_path, m, rtol=0, atol=0 if not blocked else 1e-6))


@pytest.mark.slow
def test_global_max_pool_propagates_nan(tmp_path):
    """A NaN anywhere in a channel makes its maximum NaN, in the plain and the blocked step,
    as the ONNX reference evaluator computes it. onnxruntime agrees on a channel of NaN only:
    its vectorised loop drops a NaN in most positions (1.32), and its maximum of a channel of
    -inf is -FLT_MAX, so it is no oracle for the NaN placement."""
    from onnx.reference import ReferenceEvaluator

    for blocked in (False, True):
        m = Model(seed=4)
        x = m.input([2, 13, 6, 6])
        m.feeds[x] = _nan_channels(m.feeds[x])
        if blocked:  # a depthwise identity convolution: the blocked layout, NaN carried through
            x = m.node("Conv", [x, m.const(np.ones([13, 1, 1, 1]))], group=13)
        m.output(m.node("GlobalMaxPool", [x]))
        path = tmp_path / f"gmp{blocked}.onnx"
        model = m.save(path)
        compiled = nncc.compile_model(path)
        assert_one_native_partition(compiled)
        got = compiled.run(m.feeds)[m.outputs[0].name]
        want = ReferenceEvaluator(model).run(None, m.feeds)[0]
        assert np.isnan(want[:, ::3]).all() and np.isnan(want[:, 1]).all()
        np.testing.assert_array_equal(got, want)  # NaN where the oracle has NaN, equal elsewhere
        ort_all_nan = onnxruntime_outputs(path, m.feeds, [m.outputs[0].name])[m.outputs[0].name][:, 1]
        assert np.isnan(ort_all_nan).all()


# -- activations recognised by what they compute ---------------------------------------------------


def _hard_swish_div(m, x):  # x * Clip(x + 3, 0, 6) / 6
    gate = m.node("Clip", [m.node("Add", [x, m.const(3.0)]), m.const(0.0), m.const(6.0)])
    return m.node("Div", [m.node("Mul", [x, gate]), m.const(6.0)])


def _hard_swish_times_sixth(m, x):  # (Clip(3 + x, 0, 6) * (1/6)) * x
    gate = m.node("Clip", [m.node("Add", [m.const(3.0), x]), m.const(0.0), m.const(6.0)])
    return m.node("Mul", [m.node("Mul", [gate, m.const(1.0 / 6.0)]), x])


def _hard_swish_div_gate(m, x):  # x * Div(Clip(x + 3, 0, 6), 6)
    gate = m.node("Clip", [m.node("Add", [x, m.const(3.0)]), m.const(0.0), m.const(6.0)])
    return m.node("Mul", [x, m.node("Div", [gate, m.const(6.0)])])


def _hard_sigmoid_times_x(m, x):  # HardSigmoid(x) * x, as PyTorch exports hardswish before opset 14
    return m.node("Mul", [m.node("HardSigmoid", [x], alpha=1.0 / 6.0, beta=0.5), x])


def _silu(m, x):
    return m.node("Mul", [x, m.node("Sigmoid", [x])])


def _mish_softplus(m, x):
    return m.node("Mul", [m.node("Tanh", [m.node("Softplus", [x])]), x])


def _mish_log_exp(m, x):  # Softplus spelled Log(1 + Exp(x))
    softplus = m.node("Log", [m.node("Add", [m.const(1.0), m.node("Exp", [x])])])
    return m.node("Mul", [x, m.node("Tanh", [softplus])])


SPELLINGS = {  # name -> (build, what it computes)
    "hardswish x*clip/6": (_hard_swish_div, "HardSwish"),
    "hardswish clip*(1/6)*x": (_hard_swish_times_sixth, "HardSwish"),
    "hardswish x*div(clip,6)": (_hard_swish_div_gate, "HardSwish"),
    "hardswish hardsigmoid*x": (_hard_sigmoid_times_x, "HardSwish"),
    "silu": (_silu, "Silu"),
    "mish softplus": (_mish_softplus, "Mish"),
    "mish log(1+exp)": (_mish_log_exp, "Mish"),
}


def _fused_op(what: str, opset: int) -> str:
    """The one node a spelling becomes: the ONNX op where the opset has one, else nncc's."""
    if what == "HardSwish" and opset >= 14 or what == "Mish" and opset >= 18:
        return what
    return f"nncc::{what}"


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_a_spelled_activation_becomes_one_native_node(tmp_path, spelling, opset):
    build, what = SPELLINGS[spelling]
    m = Model(opset=opset, seed=3)
    x = m.input([4, 9, 31], scale=4.0)  # past HardSwish's knees at -3 and 3
    m.output(build(m, m.node("Add", [x, x])))  # after a value no product can take it into
    assert op_types(m.optimized(tmp_path)) == ["Add", _fused_op(what, opset)]
    assert_one_native_partition(compile_and_compare(tmp_path, m, rtol=2e-5, atol=2e-6))


@pytest.mark.slow
@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_a_spelled_activation_after_a_product_goes_into_its_epilogue(tmp_path, spelling):
    build, what = SPELLINGS[spelling]
    m = Model(opset=13, seed=8)
    y = m.node("Conv", [m.input([1, 12, 9, 9], scale=2.0), m.weight([16, 12, 3, 3]), m.weight([16])],
               pads=[1, 1, 1, 1])
    m.output(build(m, y))
    z = m.node("MatMul", [m.input([5, 24], scale=2.0), m.weight([24, 20])])
    m.output(build(m, z))
    graph = m.optimized(tmp_path)
    assert op_types(graph) == ["nncc::FusedConv", "nncc::FusedMatMul"]
    assert [n.attrs["activation"] for n in graph.nodes] == [what, what]
    assert_one_native_partition(compile_and_compare(tmp_path, m, rtol=2e-5, atol=2e-6))


CONV_FORMS = {  # the convolution kernels whose epilogues apply an activation lane by lane
    "direct": dict(x=[1, 12, 9, 9], w=[16, 12, 3, 3], group=1),
    "winograd": dict(x=[1, 64, 24, 24], w=[64, 64, 3, 3], group=1),
    "depthwise": dict(x=[1, 24, 10, 10], w=[24, 1, 3, 3], group=24),
    "grouped": dict(x=[1, 12, 8, 8], w=[12, 4, 3, 3], group=3),
    "grouped_blocks": dict(x=[1, 32, 9, 9], w=[32, 16, 3, 3], group=2),  # whole blocks: blocked
}


@pytest.mark.slow
@pytest.mark.parametrize("what", ["Silu", pytest.param("Mish", marks=pytest.mark.slow)])  # Mish: the same epilogues
@pytest.mark.parametrize("form", sorted(CONV_FORMS))
def test_silu_and_mish_in_every_convolution_epilogue(tmp_path, form, what):
    """The activation after the store, as sigmoid and tanh: direct, Winograd, depthwise and
    grouped (the runtime's) convolutions, with a residual Add before it too."""
    f = CONV_FORMS[form]
    build = _silu if what == "Silu" else _mish_softplus
    m = Model(opset=13, seed=21)
    x = m.input(f["x"], scale=2.0)
    y = m.node("Conv", [x, m.weight(f["w"]), m.weight([f["w"][0]])], pads=[1, 1, 1, 1], group=f["group"])
    m.output(build(m, y))
    y2 = m.node("Conv", [x, m.weight(f["w"])], pads=[1, 1, 1, 1], group=f["group"])
    m.output(build(m, m.node("Add", [y2, x] if f["w"][0] == f["x"][1] else [y2, y2])))
    assert_one_native_partition(compile_and_compare(tmp_path, m, rtol=2e-5, atol=5e-6))


@pytest.mark.parametrize("what", ["Silu", "Mish"])
def test_a_convolutions_vector_activation_at_the_extremes(tmp_path, what):
    """The activations a convolution applies vector by vector after its store, on values
    from -200 to 200 and on NaN and the infinities, against onnxruntime's spelled-out form:
    the exponential's clamps (below -87, above 20 or 88) and NaN's way through."""
    m = Model(opset=13, seed=3)
    x = m.input([1, 8, 4, 8])
    m.feeds[x] = np.concatenate([np.linspace(-200, 200, 248), [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30,
                                                               -87.5]]).astype(np.float32).reshape(1, 8, 4, 8)
    eye = np.eye(8, dtype=np.float32).reshape(8, 8, 1, 1)  # the convolution passes x through
    y = m.node("Conv", [x, m.const(eye)])
    m.output((_silu if what == "Silu" else _mish_softplus)(m, y))
    path = tmp_path / "m.onnx"
    m.save(path)
    compiled = nncc.compile_model(path)
    assert_one_native_partition(compiled)
    name = m.outputs[0].name
    (want,) = ort_run(path, m.feeds, [name])
    np.testing.assert_allclose(compiled.run(m.feeds)[name], want, rtol=1e-5, atol=1e-6)  # NaN where it has NaN


def _near_misses():
    def clip_bound(m, x):  # 6.5 where HardSwish has 6
        gate = m.node("Clip", [m.node("Add", [x, m.const(3.0)]), m.const(0.0), m.const(6.5)])
        return m.node("Div", [m.node("Mul", [x, gate]), m.const(6.0)])

    def shift(m, x):  # + 2.5 where HardSwish has + 3
        gate = m.node("Clip", [m.node("Add", [x, m.const(2.5)]), m.const(0.0), m.const(6.0)])
        return m.node("Div", [m.node("Mul", [x, gate]), m.const(6.0)])

    def default_hard_sigmoid(m, x):  # HardSigmoid's own alpha 0.2: not HardSwish
        return m.node("Mul", [m.node("HardSigmoid", [x]), x])

    def swish_two(m, x):  # x * Sigmoid(2x)
        return m.node("Mul", [x, m.node("Sigmoid", [m.node("Mul", [x, m.const(2.0)])])])

    def silu_inner_read(m, x):  # the gate is an output too
        gate = m.node("Sigmoid", [x])
        m.output(gate)
        return m.node("Mul", [x, gate])

    def mish_inner_read(m, x):
        softplus = m.node("Softplus", [x])
        m.output(softplus)
        return m.node("Mul", [m.node("Tanh", [softplus]), x])

    return {f.__name__: f for f in (clip_bound, shift, default_hard_sigmoid, swish_two, silu_inner_read,
                                    mish_inner_read)}


NEAR_MISSES = _near_misses()


@pytest.mark.parametrize("miss", sorted(NEAR_MISSES))
def test_a_near_miss_stays_as_it_is(tmp_path, miss):
    m = Model(opset=18, seed=6)
    x = m.input([3, 40], scale=4.0)
    s = m.node("Add", [x, x])
    m.output(NEAR_MISSES[miss](m, s))
    before = op_types(m.optimized(tmp_path, level=1))
    assert op_types(m.optimized(tmp_path)) == before
    compile_and_compare(tmp_path, m, rtol=2e-5, atol=2e-6)


# -- 1-D convolutions ---------------------------------------------------------------------------------


def _gelu_erf(m, x):  # as torch.onnx writes nn.GELU() at opset 17
    e = m.node("Erf", [m.node("Div", [x, m.const(np.sqrt(2.0))])])
    return m.node("Mul", [m.node("Mul", [x, m.node("Add", [e, m.const(1.0)])]), m.const(0.5)])


def _whisper_stem(m, mels=80, frames=120, width=96):
    """Whisper's encoder stem: Conv1d(k3, pad 1) -> GELU -> Conv1d(k3, stride 2, pad 1) -> GELU."""
    x = m.input([1, mels, frames])
    y = m.node("Conv", [x, m.weight([width, mels, 3]), m.weight([width])], kernel_shape=[3], pads=[1, 1])
    y = _gelu_erf(m, y)
    y = m.node("Conv", [y, m.weight([width, width, 3]), m.weight([width])], kernel_shape=[3], pads=[1, 1],
               strides=[2])
    return _gelu_erf(m, y)


@pytest.mark.slow
def test_a_whisper_style_conv1d_stem_is_one_native_partition(tmp_path):
    m = Model(opset=17, seed=12)
    m.output(_whisper_stem(m))
    graph = m.optimized(tmp_path)
    assert [n for n in op_types(graph) if n != "Unsqueeze" and n != "Squeeze"] == \
        ["Conv", "nncc::Gelu", "Conv", "nncc::Gelu"]
    assert all(len(graph.initializers[n.inputs[1]].shape) == 4 for n in graph.nodes if n.op_type == "Conv")
    assert_one_native_partition(compile_and_compare(tmp_path, m, rtol=1e-4, atol=1e-5))


@pytest.mark.parametrize("case", [
    dict(kernel_shape=[5], pads=[2, 1], strides=[3], dilations=[2]),
    dict(kernel_shape=[3], group=4),  # grouped
    dict(kernel_shape=[7], group=16, pads=[3, 3]),  # depthwise
    dict(kernel_shape=[4], pads=[0, 3], strides=[2]),
    dict(kernel_shape=[1]),
])
def test_conv1d_geometries_match_onnxruntime_natively(tmp_path, case):
    m = Model(opset=13, seed=len(str(case)))  # opset 13: Unsqueeze's axes as an input; 11 below
    group = case.get("group", 1)
    y = m.node("Conv", [m.input([2, 16, 37]), m.weight([16, 16 // group, case["kernel_shape"][0]])], **case)
    m.output(m.node("Relu", [y]))  # fused into the convolution first, then made 2-D
    compiled = compile_and_compare(tmp_path, m, rtol=1e-4, atol=1e-5)
    assert_one_native_partition(compiled)


def test_conv1d_at_an_opset_with_axes_as_attributes(tmp_path):
    m = Model(opset=11, seed=1)
    y = m.node("Conv", [m.input([1, 6, 20]), m.weight([8, 6, 3])], kernel_shape=[3], pads=[1, 1])
    m.output(m.node("GlobalMaxPool", [m.node("Sigmoid", [y])]))
    graph = m.optimized(tmp_path)
    assert {n.op_type: n.attrs.get("axes") for n in graph.nodes if n.op_type in ("Unsqueeze", "Squeeze")} == \
        {"Unsqueeze": [2], "Squeeze": [2]}
    assert_one_native_partition(compile_and_compare(tmp_path, m, rtol=1e-4, atol=1e-5))


def test_a_conv1d_with_weights_computed_at_run_time_stays_1d(tmp_path):
    m = Model(opset=13, seed=2)
    w = m.input([4, 3, 3])
    m.output(m.node("Conv", [m.input([1, 3, 10]), w]))
    graph = m.optimized(tmp_path)
    assert op_types(graph) == ["Conv"]
    compile_and_compare(tmp_path, m, rtol=1e-4, atol=1e-5)


# -- Pad before a convolution -----------------------------------------------------------------------


def _padded_conv(m: Model, pads, conv_pads=None, value=None, mode=None, axes=None, rank=4):
    spatial = [9] * (rank - 2)
    x = m.input([2, 5] + spatial)
    inputs = [x, m.const(pads, np.int64)]
    if value is not None or axes is not None:
        inputs.append(m.const(value if value is not None else 0.0) if value is not None else "")
    if axes is not None:
        inputs.append(m.const(axes, np.int64))
    padded = m.node("Pad", inputs, **({"mode": mode} if mode else {}))
    attrs = {"pads": conv_pads} if conv_pads else {}
    return m.node("Conv", [padded, m.weight([7, 5] + [3] * (rank - 2)), m.weight([7])], **attrs)


FOLDED_PADS = {  # name -> (Pad's pads, Conv's own pads, value, axes, rank)
    "symmetric": ([0, 0, 1, 1, 0, 0, 1, 1], None, None, None, 4),
    "asymmetric, onto the conv's own": ([0, 0, 0, 2, 0, 0, 1, 0], [1, 0, 0, 1], 0.0, None, 4),
    "spatial axes listed": ([1, 2, 0, 1], None, None, [2, 3], 4),
    "negative axes listed": ([2, 1], None, None, [-1], 4),
    "1-D": ([0, 0, 2, 0, 0, 1], None, None, None, 3),
}


@pytest.mark.parametrize("name", sorted(FOLDED_PADS))
def test_a_zero_pad_before_a_conv_becomes_its_pads(tmp_path, name):
    pads, conv_pads, value, axes, rank = FOLDED_PADS[name]
    m = Model(opset=18, seed=len(name))
    m.output(_padded_conv(m, pads, conv_pads, value, axes=axes, rank=rank))
    graph = m.optimized(tmp_path)
    assert "Pad" not in op_types(graph)
    assert_one_native_partition(compile_and_compare(tmp_path, m, rtol=1e-4, atol=1e-5))


NOT_FOLDED = {
    "a pad value of 1": dict(pads=[0, 0, 1, 1, 0, 0, 1, 1], value=1.0),
    "reflect": dict(pads=[0, 0, 1, 1, 0, 0, 1, 1], mode="reflect"),
    "batch padded": dict(pads=[1, 0, 1, 1, 0, 0, 1, 1]),
    "a crop": dict(pads=[0, 0, -1, 1, 0, 0, 1, 1]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NOT_FOLDED))
def test_a_pad_the_conv_cannot_do_stays(tmp_path, name):
    m = Model(opset=18, seed=3)
    m.output(_padded_conv(m, **NOT_FOLDED[name]))
    assert "Pad" in op_types(m.optimized(tmp_path))
    compile_and_compare(tmp_path, m, rtol=1e-4, atol=1e-5)


def test_a_pad_read_elsewhere_stays(tmp_path):
    m = Model(opset=18, seed=4)
    y = _padded_conv(m, [0, 0, 1, 1, 0, 0, 1, 1])
    m.output(y)
    m.output(m.nodes[-2].output[0])  # the padded value is an output too
    assert "Pad" in op_types(m.optimized(tmp_path))
    compile_and_compare(tmp_path, m, rtol=1e-4, atol=1e-5)


def test_a_pad_with_attributes_before_opset_11_folds_too(tmp_path):
    m = Model(opset=10, seed=9)
    padded = m.node("Pad", [m.input([1, 4, 8, 8])], pads=[0, 0, 2, 1, 0, 0, 0, 1])
    m.output(m.node("Conv", [padded, m.weight([6, 4, 3, 3])]))
    assert op_types(m.optimized(tmp_path)) == ["Conv"]
    assert_one_native_partition(compile_and_compare(tmp_path, m, rtol=1e-4, atol=1e-5))


@pytest.mark.parametrize("spelling", ["silu", "mish softplus", "mish log(1+exp)"])
def test_the_portable_plan_of_a_fused_silu_or_mish_matches_onnxruntime(tmp_path, spelling):
    """The fused nodes' numpy kernels (what runs without a compiler or an untrusted artifact)."""
    build, what = SPELLINGS[spelling]
    m = Model(opset=13, seed=5)
    y = m.node("Conv", [m.input([2, 6, 7, 7], scale=3.0), m.weight([8, 6, 3, 3])], pads=[1, 1, 1, 1])
    m.output(build(m, y))
    m.output(build(m, m.node("Gemm", [m.input([4, 10], scale=3.0), m.weight([10, 6])])))
    compiled = compile_and_compare(tmp_path, m, rtol=2e-5, atol=2e-6, backends=("numpy",))
    assert compiled.native_partitions == 0
    assert {n.op_type: n.attrs.get("activation") for n in m.optimized(tmp_path).nodes} == \
        {"FusedConv": what, "FusedGemm": what}


def test_a_pad_with_an_axis_out_of_range_is_reported_not_folded(tmp_path):
    m = Model(opset=18, seed=4)
    m.output(_padded_conv(m, [1, 1], axes=[6]))  # 6 % 4 would be a spatial axis
    assert "Pad" in op_types(m.optimized(tmp_path))
    with pytest.raises(NnccError, match="axes|axis"):
        nncc.compile_model(tmp_path / "m.onnx").run(m.feeds)
