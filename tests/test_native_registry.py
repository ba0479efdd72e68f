"""The native op registry (nncc/native/ops): the entry that accepts a node in check() is the
one that writes it, for a handful of representative ops run natively against
onnxruntime; a node no entry takes is refused by name; the activation codes the Python
table gives agree with what the generated C computes (onnxruntime again, through every
fused form); and adding an op is one entry, shown by registering a throwaway one.
"""

from __future__ import annotations

import numpy as np
import pytest

import nncc
from nncc.ir.graph import Graph, Node, TensorInfo
from nncc.native import codegen
from nncc.native.activations import CODES
from nncc.native.ops import registry
from nncc.native.ops.entry import NativeOp
from nncc.native.toolchain import find_toolchain
from tests.models import GraphBuilder
from tests.oracle import ort_run

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")

OPSET = 18


class Model(GraphBuilder):
    def __init__(self, seed: int = 0):
        super().__init__(OPSET, seed, "registry")


def native_ops_of(compiled) -> set[str]:
    """The ops of every instruction inside a native partition, named as the registry lists
    them ("Conv", "nncc::FusedConv"); the plan names its kernels "domain::op::version"."""
    plan = compiled.plan
    names = set()
    for part in plan.partitions:
        if part.backend == "native":
            for ins in plan.instructions[part.first:part.first + part.count]:
                domain, op, _ = plan.kernels[ins.kernel].split("::")
                names.add(op if domain in ("", "ai.onnx") else f"{domain}::{op}")
    return names


def onnxruntime_outputs(path, feeds, names):
    return dict(zip(names, ort_run(path, feeds, names)))


def compile_and_compare(tmp_path, m: Model, rtol=1e-4, atol=1e-5):
    path = tmp_path / "m.onnx"
    m.save(path)
    compiled = nncc.compile_model(path)
    names = [o.name for o in m.outputs]
    want = onnxruntime_outputs(path, m.feeds, names)
    got = compiled.run(m.feeds)
    for name in names:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol,
                                   atol=atol * max(1.0, float(np.abs(want[name]).max(initial=0))), err_msg=name)
    return compiled


# -- every listed op has its entry ------------------------------------------------------------------


def test_every_listed_op_is_owned_by_an_entry_that_lists_it():
    """The list of native ops comes from the entries, and a node of each listed op is owned by
    an entry declaring it (the first in precedence, as check and the writer both ask)."""
    listed = registry.native_ops()
    assert {"Conv", "MatMul", "Gemm", "LSTM", "Pad", "Softmax", "nncc::FusedConv", "nncc::FusedAttention",
            "com.microsoft::DynamicQuantizeMatMul"} <= set(listed)
    graph = Graph(nodes=[], inputs=[], outputs=[], initializers={}, opsets={"": OPSET})
    for name in listed:
        domain, _, op = name.rpartition("::")
        node = Node(op, [], [], {}, name="n", domain=domain)
        owner = registry.owner(node, graph, {})
        if op in ("Softmax", "LogSoftmax"):  # the inner-axis entry needs the shape to take one
            assert owner is not None
            continue
        assert owner is not None and (domain, op) in owner.ops, name


REPRESENTATIVE = {
    # one small graph per entry family: op -> (build(model) -> output, the op's name in the plan)
    "Conv": (lambda m: m.node("Conv", [m.input([1, 5, 9, 9]), m.weight([6, 5, 3, 3])], pads=[1, 1, 1, 1]),
             "Conv"),
    "MaxPool": (lambda m: m.node("MaxPool", [m.input([1, 3, 8, 8])], kernel_shape=[3, 3], strides=[2, 2]),
                "MaxPool"),
    "Gemm": (lambda m: m.node("Gemm", [m.input([5, 12]), m.weight([7, 12]), m.weight([7])], transB=1), "Gemm"),
    "MatMul": (lambda m: m.node("MatMul", [m.input([2, 4, 6]), m.input([2, 6, 3])]), "MatMul"),
    "Pad": (lambda m: m.node("Pad", [m.input([2, 3, 4]), m.const([0, 1, 2, 1, 0, 0], np.int64)], mode="reflect"),
            "Pad"),
    "Softmax": (lambda m: m.node("Softmax", [m.input([3, 10])]), "Softmax"),
    "LayerNormalization": (lambda m: m.node("LayerNormalization", [m.input([4, 16]), m.weight([16]), m.weight([16])]),
                           "LayerNormalization"),
    "Transpose": (lambda m: m.node("Transpose", [m.input([2, 3, 4])], perm=[2, 0, 1]), "Transpose"),
    "Concat": (lambda m: m.node("Concat", [m.input([2, 3]), m.input([2, 5])], axis=1), "Concat"),
    "Pow": (lambda m: m.node("Pow", [m.input([3, 7]), m.const(3.0)]), "Pow"),
    "Clip": (lambda m: m.node("Clip", [m.input([3, 7]), m.const(-0.5), m.const(0.25)]), "Clip"),
}


@pytest.mark.parametrize("op", sorted(REPRESENTATIVE))
def test_the_entry_that_accepts_a_node_writes_it(tmp_path, op):
    build, plan_op = REPRESENTATIVE[op]
    m = Model(seed=len(op))
    m.output(build(m))
    compiled = compile_and_compare(tmp_path, m)
    assert compiled.plan.fallbacks == []
    assert plan_op in native_ops_of(compiled), native_ops_of(compiled)


# -- refusals ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("domain, op, named", [("", "Hardmax", "Hardmax"),
                                               ("com.example", "Frobnicate", "com.example::Frobnicate")])
def test_a_node_no_entry_takes_is_refused_naming_its_op(domain, op, named):
    graph = Graph(nodes=[], inputs=[], outputs=[], initializers={}, opsets={"": OPSET, domain: 1})
    infos = {"x": TensorInfo(np.dtype(np.float32), (2, 3)), "y": TensorInfo(np.dtype(np.float32), (2, 3))}
    node = Node(op, ["x"], ["y"], {}, name="n", domain=domain)
    assert registry.owner(node, graph, infos) is None
    assert codegen.check(node, graph, infos) == f"no C generator for {named}"


def test_an_entry_says_why_it_refuses(tmp_path):
    """A Transpose of int32 values is its entry's, which refuses it for that value."""
    graph = Graph(nodes=[], inputs=[], outputs=[], initializers={}, opsets={"": OPSET})
    infos = {"x": TensorInfo(np.dtype(np.int32), (2, 3)), "y": TensorInfo(np.dtype(np.float32), (2, 3))}
    node = Node("Transpose", ["x"], ["y"], {}, name="n")
    assert codegen.check(node, graph, infos) == "value 'x' is not a static float32 tensor"


# -- the activation table ------------------------------------------------------------------------------

ACTIVATIONS = {  # op -> attributes (Clip's bounds are inputs)
    "Relu": {}, "Sigmoid": {}, "Tanh": {}, "LeakyRelu": {"alpha": 0.15}, "HardSigmoid": {"alpha": 0.3, "beta": 0.4},
    "HardSwish": {}, "Clip": {}, "Mish": {}, "Silu": {},
}


def _activation(m: Model, op: str, x: str) -> str:
    if op == "Clip":
        return m.node("Clip", [x, m.const(-0.3), m.const(0.6)])
    if op == "Silu":  # no ONNX op before Swish at opset 24: as exporters spell it
        return m.node("Mul", [x, m.node("Sigmoid", [x])])
    return m.node(op, [x], **ACTIVATIONS[op])


def test_the_table_lists_every_activation_the_tests_run():
    assert set(CODES) == {""} | set(ACTIVATIONS)


@pytest.mark.slow
@pytest.mark.parametrize("form", ["Conv", "MatMul by weights", "MatMul of two inputs", "Gemm by weights"])
def test_fused_activations_match_onnxruntime(tmp_path, form):
    """Each activation after a product, which the passes fuse into it: its code reaches C
    from the Python table (nn_act, nn_vact in the micro-kernels, the runtime's epilogues)."""
    m = Model(seed=7)
    fused = {"Conv": "nncc::FusedConv", "Gemm by weights": "nncc::FusedGemm"}.get(form, "nncc::FusedMatMul")
    for op in ACTIVATIONS:
        if form == "Conv":
            y = m.node("Conv", [m.input([1, 4, 7, 7]), m.weight([8, 4, 3, 3])], pads=[1, 1, 1, 1])
        elif form == "MatMul by weights":
            y = m.node("MatMul", [m.input([5, 24]), m.weight([24, 20])])
        elif form == "Gemm by weights":
            y = m.node("Gemm", [m.input([5, 24]), m.weight([24, 20])])
        else:
            y = m.node("MatMul", [m.input([5, 24]), m.input([24, 20])])
        m.output(_activation(m, op, y))
    compiled = compile_and_compare(tmp_path, m)
    assert fused in native_ops_of(compiled)
    assert compiled.plan.fallbacks == []


@pytest.mark.slow
def test_activation_ops_over_the_blocked_layout_match_onnxruntime(tmp_path):
    """The activations as ops of their own after a convolution (a blocked output) and on
    plain rows: the same codes through the unary expressions."""
    m = Model(seed=3)
    conv = m.node("Conv", [m.input([1, 8, 6, 6]), m.weight([8, 8, 1, 1])])
    twice = m.node("Add", [conv, conv])  # not fusable into the convolution: the activations read its blocks
    rows = m.input([4, 33])
    for op in ACTIVATIONS:
        m.output(_activation(m, op, twice))
        m.output(_activation(m, op, rows))
    compiled = compile_and_compare(tmp_path, m)
    assert {"HardSigmoid", "HardSwish", "LeakyRelu", "Clip"} <= native_ops_of(compiled)


# -- adding an op ---------------------------------------------------------------------------------------


class Softplus(NativeOp):
    """A throwaway entry: ONNX Softplus, log(1 + e^x), as one elementwise loop."""

    ops = frozenset({("", "Softplus")})

    def render(self, writer, node, plan) -> None:
        writer.unary(node, "(v > 20.0f ? v : log1pf(expf(v)))")


@pytest.fixture
def with_softplus(monkeypatch):
    monkeypatch.setattr(registry, "ENTRIES", [Softplus(), *registry.ENTRIES])


def test_softplus_is_not_native_without_its_entry(tmp_path):
    m = Model(seed=5)
    m.output(m.node("Softplus", [m.input([3, 40])]))
    path = tmp_path / "m.onnx"
    m.save(path)
    assert "Softplus" not in native_ops_of(nncc.compile_model(path))


def test_adding_an_op_is_one_entry(tmp_path, with_softplus):
    m = Model(seed=5)
    x = m.input([3, 40])
    m.feeds[x] *= 10.0  # past the cut-over at 20 too
    m.output(m.node("Softplus", [x]))
    path = tmp_path / "m.onnx"
    m.save(path)
    compiled = nncc.compile_model(path)
    assert "Softplus" in native_ops_of(compiled)
    got = compiled.run(m.feeds)[m.outputs[0].name]
    x64 = m.feeds[x].astype(np.float64)
    np.testing.assert_allclose(got, np.logaddexp(0.0, x64), rtol=1e-6, atol=1e-6)
