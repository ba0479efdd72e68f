"""An If on a condition known only at run time runs inside the native partition: both
branches are written as native steps, the entry point runs one of them per call. Each model
runs with the condition true and false and matches onnxruntime; where the branches are
native-compilable the plan is one native partition with no fallback. An If nncc cannot
write natively (branch outputs of different shapes, a nested If, a branch node no native
entry takes) stays portable, says why in the plan and in `nncc inspect`, and is still right."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import nncc
from nncc.native.toolchain import find_toolchain
from tests.conftest import ROOT
from tests.models import GraphBuilder
from tests.oracle import ort_run
from tests.test_native_sanitize import have_sanitizer_runtime, sanitized_env

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")


class Model(GraphBuilder):
    """A GraphBuilder with a bool scalar input and If nodes whose branches are built by
    GraphBuilders of their own, their names prefixed apart from the outer graph's."""

    def __init__(self, seed: int = 0):
        super().__init__(17, seed, "if")

    def flag(self) -> str:
        name = f"flag{len(self.inputs)}"
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.BOOL, []))
        self.feeds[name] = np.array(True)
        return name

    def branch(self, build, prefix: str):
        """A subgraph: ``build(b)`` adds nodes to a fresh builder ``b`` (reading outer names
        as they are, its own prefixed apart) and returns its output names."""
        b = BranchBuilder(prefix, self.opset, int(self.rng.integers(1 << 30)))
        outputs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in build(b)]
        return helper.make_graph(b.nodes, prefix.strip("_"), [], outputs, b.inits)

    def if_node(self, cond: str, then, other, count: int = 1) -> list[str]:
        return self.node_outputs("If", [cond], count, then_branch=self.branch(then, "then_"),
                                 else_branch=self.branch(other, "else_"))


class BranchBuilder(GraphBuilder):
    """A GraphBuilder whose names start with ``prefix``: a subgraph's own names, apart
    from the outer graph's and the other branch's."""

    def __init__(self, prefix: str, opset: int, seed: int):
        super().__init__(opset, seed)
        self.prefix = prefix

    def node(self, op, inputs, domain: str = "", **attrs) -> str:
        (out,) = self.node_outputs(op, inputs, 1, domain, **attrs)
        return out

    def node_outputs(self, op, inputs, count: int, domain: str = "", **attrs) -> list[str]:
        outs = [f"{self.prefix}y{len(self.nodes)}_{i}" for i in range(count)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, domain=domain, **attrs))
        return outs

    def const(self, value, dtype=np.float32) -> str:
        name = f"{self.prefix}c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name


def conv_act(x: str, channels: int, activation: str):
    def build(b: GraphBuilder) -> list[str]:
        return [b.node(activation, [b.node("Conv", [x, b.weight([channels, channels, 3, 3]), b.weight([channels])],
                                           pads=[1, 1, 1, 1])])]
    return build


def corpus_pattern(batch=1) -> Model:
    """The corpus's if_on_scalar: a conv trunk, an If whose branches are each a Conv and an
    activation over the trunk's output, then a classifier head."""
    m = Model(1)
    x = m.input([batch, 3, 16, 16])
    flag = m.flag()
    t = m.node("Relu", [m.node("Conv", [x, m.weight([16, 3, 3, 3]), m.weight([16])], strides=[2, 2],
                               pads=[1, 1, 1, 1])])
    t = m.node("Relu", [m.node("Conv", [t, m.weight([16, 16, 3, 3]), m.weight([16])], pads=[1, 1, 1, 1])])
    (y,) = m.if_node(flag, conv_act(t, 16, "Sigmoid"), conv_act(t, 16, "Relu"))
    y = m.node("Flatten", [m.node("GlobalAveragePool", [y])])
    m.output(m.node("Gemm", [y, m.weight([5, 16]), m.weight([5])], transB=1))
    return m


def save(tmp_path, m: Model, name: str = "m.onnx"):
    path = tmp_path / name
    m.save(path)
    return path


def assert_matches_both_ways(path, compiled, m: Model, flag: str) -> None:
    """Every output equals onnxruntime's with the condition true, then false."""
    names = [o.name for o in m.outputs]
    for value in (True, False):
        feeds = dict(m.feeds, **{flag: np.array(value)})
        got = compiled.run(feeds)
        for name, want in zip(names, ort_run(path, feeds, names)):
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()),
                                       err_msg=f"{name} with the condition {value}")


def assert_one_native_partition(compiled) -> None:
    assert compiled.native_partitions == 1 and len(compiled.plan.partitions) == 1, compiled.plan.fallbacks
    assert compiled.plan.fallbacks == []


@pytest.mark.slow
def test_the_corpus_pattern_is_one_native_partition(tmp_path):
    m = corpus_pattern()
    path = save(tmp_path, m)
    compiled = nncc.compile_model(path)
    assert_one_native_partition(compiled)
    assert_matches_both_ways(path, compiled, m, "flag1")


@pytest.mark.slow
def test_branches_reading_different_outer_values(tmp_path):
    """Each branch reads an outer value the other does not (and one both read): all three
    are inputs of the partition, and the branch not taken never touches its own."""
    m = Model(2)
    x, z = m.input([2, 8]), m.input([2, 8])
    flag = m.flag()
    a, b = m.node("Relu", [x]), m.node("Sigmoid", [z])
    (y,) = m.if_node(flag, lambda g: [g.node("Tanh", [g.node("Add", [a, x])])],
                     lambda g: [g.node("Mul", [b, g.node("Add", [x, g.weight([2, 8])])])])
    m.output(m.node("Add", [y, x]))
    path = save(tmp_path, m)
    compiled = nncc.compile_model(path)
    assert_one_native_partition(compiled)
    assert_matches_both_ways(path, compiled, m, flag)


def chains() -> Model:
    """Several ops per branch, two outputs each, and a MatMul by constant weights in one."""
    m = Model(3)
    x = m.input([4, 16])
    flag = m.flag()
    h = m.node("Relu", [x])

    def then(g: GraphBuilder) -> list[str]:
        y = g.node("Relu", [g.node("Add", [g.node("MatMul", [h, g.weight([16, 16])]), g.weight([16])])])
        return [g.node("Mul", [y, g.weight([16])]), g.node("Softmax", [y], axis=-1)]

    def other(g: GraphBuilder) -> list[str]:
        y = g.node("Sub", [g.node("Sigmoid", [h]), g.weight([16])])
        return [g.node("Abs", [g.node("Tanh", [y])]), g.node("Neg", [y])]

    y0, y1 = m.if_node(flag, then, other, count=2)
    m.output(m.node("Add", [y0, y1]))
    m.output(y1)
    return m


@pytest.mark.slow
def test_branches_that_are_chains_of_several_ops(tmp_path):
    m = chains()
    path = save(tmp_path, m)
    compiled = nncc.compile_model(path)
    assert_one_native_partition(compiled)
    assert_matches_both_ways(path, compiled, m, "flag1")


def test_a_branch_that_returns_an_outer_value(tmp_path):
    """A branch whose output is an outer value (through an Identity: onnxruntime refuses
    an outer value returned as it is) or one of its own constants is copied into the If's
    output when it is taken."""
    m = Model(4)
    x = m.input([3, 5])
    flag = m.flag()
    a = m.node("Exp", [x])
    (y,) = m.if_node(flag, lambda g: [g.node("Identity", [a])], lambda g: [g.weight([3, 5])])
    m.output(m.node("Mul", [y, x]))
    path = save(tmp_path, m)
    compiled = nncc.compile_model(path)
    assert_one_native_partition(compiled)
    assert_matches_both_ways(path, compiled, m, flag)


@pytest.mark.slow
def test_a_condition_computed_in_the_graph(tmp_path):
    """The condition is a Greater of a scalar input: its mask stays in the workspace, and
    the If tests it there."""
    m = Model(5)
    x, s = m.input([2, 3, 8, 8]), m.input([])
    cond = m.node("Greater", [s, m.const(0.0)])
    (y,) = m.if_node(cond, conv_act(x, 3, "Relu"), conv_act(x, 3, "Tanh"))
    m.output(m.node("Add", [y, x]))
    path = save(tmp_path, m)
    compiled = nncc.compile_model(path)
    assert_one_native_partition(compiled)
    for value in (1.5, -1.5):
        feeds = dict(m.feeds, **{s: np.array(value, np.float32)})
        (want,) = ort_run(path, feeds, [m.outputs[0].name])
        np.testing.assert_allclose(compiled.run(feeds)[m.outputs[0].name], want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [2, 5])
def test_a_dynamic_batch_at_two_sizes(tmp_path, batch):
    """The corpus pattern with a symbolic batch: fixed at each size it is one native
    partition, and the dynamic compile runs both sizes right."""
    m = corpus_pattern(batch)
    m.inputs[0] = helper.make_tensor_value_info(m.inputs[0].name, TensorProto.FLOAT, ["N", 3, 16, 16])
    path = save(tmp_path, m)
    fixed = nncc.compile_model(path, dims={"N": batch})
    assert_one_native_partition(fixed)
    assert_matches_both_ways(path, fixed, m, "flag1")
    assert_matches_both_ways(path, nncc.compile_model(path), m, "flag1")


def portable_if(tmp_path, cli, m: Model, flag: str, why: str):
    """The model compiles with its If outside every native partition, the reason naming
    ``why``; it runs right both ways, and `nncc inspect` counts the reason."""
    path = save(tmp_path, m)
    compiled = nncc.compile_model(path)
    reasons = [f["reason"] for f in compiled.plan.fallbacks if f["op"] == "If"]
    assert len(reasons) == 1 and why in reasons[0] and reasons[0].startswith("native: "), compiled.plan.fallbacks
    assert_matches_both_ways(path, compiled, m, flag)
    code, out, err = cli("inspect", path, "--json")
    assert code == 0, err
    groups = [g for g in json.loads(out)["fallback_groups"] if why in g["reason"]]
    assert len(groups) == 1 and groups[0]["nodes"] == 1, out


def test_branch_outputs_of_different_shapes_stay_portable(tmp_path, cli):
    m = Model(6)
    x = m.input([2, 8])
    flag = m.flag()
    (y,) = m.if_node(flag, lambda g: [g.node("Relu", [x])],
                     lambda g: [g.node("Slice", [x, g.ints([0]), g.ints([4]), g.ints([1])])])
    m.output(m.node("Sigmoid", [y]))
    portable_if(tmp_path, cli, m, flag, "branches whose outputs differ (float32[2,8] and float32[2,4])")


def test_a_nested_if_stays_portable(tmp_path, cli):
    m = Model(7)
    x = m.input([2, 8])
    flag, inner = m.flag(), m.flag()
    m.feeds[inner] = np.array(False)

    def nested(g: GraphBuilder) -> list[str]:
        inside = Model(8)
        return g.node_outputs("If", [inner], 1, then_branch=inside.branch(lambda b: [b.node("Relu", [x])], "in_then_"),
                              else_branch=inside.branch(lambda b: [b.node("Neg", [x])], "in_else_"))

    (y,) = m.if_node(flag, nested, lambda g: [g.node("Exp", [x])])
    m.output(m.node("Sigmoid", [y]))
    portable_if(tmp_path, cli, m, flag, "a nested If")


def test_a_branch_node_no_entry_takes_stays_portable(tmp_path, cli):
    m = Model(9)
    x = m.input([2, 8])
    flag = m.flag()
    (y,) = m.if_node(flag, lambda g: [g.node("Relu", [x])],
                     lambda g: [g.node("CumSum", [x, g.ints(1)])])
    m.output(m.node("Sigmoid", [y]))
    portable_if(tmp_path, cli, m, flag, "its else_branch: CumSum: no C generator for CumSum")


def test_a_branch_node_too_large_for_generated_code_stays_portable(tmp_path, cli):
    """A branch node gets the size limits every node gets: an axis longer than generated
    code unrolls (only a damaged or hostile model has one) keeps the If portable."""
    m = Model(10)
    x = m.input([1, 1])
    flag = m.flag()
    long_axis = m.ints([1, (1 << 24) + 1])
    (y,) = m.if_node(flag, lambda g: [g.node("ReduceMax", [g.node("Expand", [x, long_axis])], axes=[1])],
                     lambda g: [g.node("Neg", [x])])
    m.output(m.node("Sigmoid", [y]))
    portable_if(tmp_path, cli, m, flag, "its then_branch: Expand: an output too large for generated code")


CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import nncc

    model = nncc.compile_model(sys.argv[1])
    assert model.native_partitions == 1 and len(model.plan.partitions) == 1, model.plan.fallbacks
    with np.load(sys.argv[2]) as saved:
        feeds = {name: saved[name] for name in saved.files}
    got = {}
    for value in (True, False):
        feeds[sys.argv[4]] = np.array(value)
        got.update((f"{value}:{name}", y) for name, y in model.run(feeds).items())
    np.savez(sys.argv[3], **got)
""")


@pytest.mark.slow
@pytest.mark.parametrize("sanitized", [
    False, pytest.param(True, marks=[
        pytest.mark.slow,  # a sanitized build
        pytest.mark.skipif(not have_sanitizer_runtime(), reason="the compiler has no ASan/UBSan runtime to preload")])])
def test_nan_and_inf_through_both_branches(tmp_path, sanitized):
    """NaN, +inf and -inf in the input of the corpus pattern and of the chains: both
    branches give onnxruntime's outputs, NaN where it has NaN; built with AddressSanitizer
    and UBSan, the guarded blocks and the workspace shared between them read and write
    nothing out of bounds."""
    env = sanitized_env()
    if not sanitized:
        env = {k: v for k, v in env.items() if k not in ("LD_PRELOAD", "NNCC_NATIVE_SANITIZE")}
    for m, flag in ((corpus_pattern(), "flag1"), (chains(), "flag1")):
        x = m.inputs[0].name
        flat = m.feeds[x].reshape(-1)
        flat[[1, 7, 20]] = [np.nan, np.inf, -np.inf]
        path = save(tmp_path, m)
        np.savez(tmp_path / "feeds.npz", **m.feeds)
        done = subprocess.run([sys.executable, "-c", CHILD, str(path), str(tmp_path / "feeds.npz"),
                               str(tmp_path / "out.npz"), flag], env=env, cwd=str(ROOT), capture_output=True,
                              text=True)
        report = [line for line in done.stderr.splitlines() if "runtime error" in line or "ERROR" in line]
        assert done.returncode == 0, "\n".join(report) or done.stderr[-3000:]
        names = [o.name for o in m.outputs]
        with np.load(tmp_path / "out.npz") as got:
            for value in (True, False):
                feeds = dict(m.feeds, **{flag: np.array(value)})
                for name, want in zip(names, ort_run(path, feeds, names)):
                    np.testing.assert_allclose(got[f"{value}:{name}"], want, rtol=1e-4, atol=1e-4, equal_nan=True,
                                               err_msg=f"{name} with the condition {value}")
