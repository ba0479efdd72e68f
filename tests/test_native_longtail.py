"""Ops outside the tuned set that exporters write, each either native or removed by a pass, so
a model that holds them stays one native partition: the float32-to-float32 Cast of RMSNorm
exports, GlobalMaxPool, activations recognised by what they compute (HardSwish, SiLU, Mish
in their spellings), 1-D convolutions. Each model is built with onnx.helper and its outputs
are checked against onnxruntime running the model as written."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import nncc  # noqa: E402
from nncc.frontend.onnx import parse_model  # noqa: E402
from nncc.ir.graph import Graph, Node, TensorInfo  # noqa: E402
from nncc.native import codegen  # noqa: E402
from nncc.native.toolchain import find_toolchain  # noqa: E402
from nncc.passes.pipeline import run_passes  # noqa: E402

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")


class Model:
    """A model under construction, with seeded random inputs and weights."""

    def __init__(self, opset: int = 18, seed: int = 0):
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inputs, self.outputs, self.inits, self.feeds = [], [], [], [], {}

    def input(self, shape, scale: float = 1.0) -> str:
        name = f"x{len(self.inputs)}"
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        self.feeds[name] = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return name

    def const(self, value, dtype=np.float32) -> str:
        name = f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def weight(self, shape) -> str:
        return self.const(self.rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:])))

    def node(self, op, inputs, **attrs) -> str:
        out = f"y{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], **attrs))
        return out

    def output(self, name: str) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))

    def save(self, path) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "longtail", self.inputs, self.outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 8
        onnx.save(model, path)
        return model

    def optimized(self, tmp_path, level: int = 2) -> Graph:
        return run_passes(parse_model(self.save(tmp_path / "m.onnx").SerializeToString()), level)


def onnxruntime_outputs(path, feeds, names):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, feeds)))


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


@pytest.mark.parametrize("to,dtype", [(TensorProto.INT64, "int64"), (TensorProto.INT32, "int32"),
                                      (TensorProto.BOOL, "bool")])
def test_a_cast_to_another_type_stays_portable_saying_why(tmp_path, to, dtype):
    graph = Graph(nodes=[], inputs=[], outputs=[], initializers={}, opsets={"": 18})
    f32 = np.dtype(np.float32)
    infos = {"x": TensorInfo(f32, (2, 3)), "y": TensorInfo(np.dtype(dtype), (2, 3))}
    node = Node("Cast", ["x"], ["y"], {"to": to}, name="n")
    assert codegen.check(node, graph, infos) == \
        f"a Cast from float32 to {dtype}: native code holds float32 values only"
    back = Node("Cast", ["y"], ["x"], {"to": TensorProto.FLOAT}, name="n")
    assert codegen.check(back, graph, infos) == \
        f"a Cast from {dtype} to float32: native code holds float32 values only"
    # and the model still runs, the Casts on the portable backend, which the plan says why
    m = Model(seed=2)
    x = m.input([4, 6], scale=4.0)
    there = m.node("Cast", [x], to=to)
    m.output(m.node("Mul", [m.node("Cast", [there], to=TensorProto.FLOAT), m.const(0.5)]))
    compiled = compile_and_compare(tmp_path, m, backends=("native",))
    assert [(f["op"], f["reason"]) for f in compiled.plan.fallbacks] == [
        ("Cast", f"native: a Cast from float32 to {dtype}: native code holds float32 values only"),
        ("Cast", f"native: a Cast from {dtype} to float32: native code holds float32 values only")]


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


@pytest.mark.parametrize("blocked,shape", [(False, [2, 19, 5, 7]), (True, [2, 19, 5, 7]), (False, [3, 10, 33]),
                                           (True, [1, 8, 16, 16])])
def test_global_max_pool_is_native(tmp_path, blocked, shape):
    m = _global_max_model(blocked, shape)
    assert_one_native_partition(compile_and_compare(tmp_path, m, rtol=0, atol=0 if not blocked else 1e-6))


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
