"""Partitioning across backends (DOMAIN.md section 3): selection, grouping into maximal
acyclic sub-DAGs, forced splits by group index, CPU fallback with reasons, and a
third-party plugin (tests/plugins/mulsub_plugin.py) loaded in-process and with --plugin.

The oracle for values is onnxruntime (or numpy for the plugin's custom op, which
onnxruntime does not know); the oracle for partitions is the expected list written out
by hand from the rules in nncc/partition.py's docstring.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import nncc
from nncc.backends.registry import PluginError, get_backend, load_plugin, register_backend
from nncc.errors import OptionError, PlanFormatError, ShapeInferenceError
from tests.conftest import FIXTURES, ROOT
from tests.oracle import ort_outputs

PLUGIN = "tests.plugins.mulsub_plugin"
MULSUB = ("mulsub", "numpy")
F, I64 = TensorProto.FLOAT, TensorProto.INT64


@pytest.fixture(scope="module", autouse=True)
def plugin():
    """The plugin, loaded for this module only: loaded plugins are process-wide (and part
    of the cache key), so it is unloaded afterwards for the tests that follow."""
    load_plugin(PLUGIN)
    yield sys.modules[PLUGIN]
    from nncc.backends import registry as backends
    from nncc.kernels import registry as kernels

    backends._PLUGINS.pop(PLUGIN, None)
    for name in ("mulsub", "mulsub-grouped"):
        backends._BACKENDS.pop(name, None)
    for key in [k for k in kernels._REGISTRY if k[0] == "test.mulsub"]:
        del kernels._REGISTRY[key]
    sys.modules.pop(PLUGIN, None)  # a later load_plugin imports (and registers) afresh


# -- helpers -------------------------------------------------------------------------------


def make_model(path: pathlib.Path, nodes, inputs, outputs, *, opsets=(("", 17),)) -> pathlib.Path:
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def node(op, ins, outs, name, domain="", **attrs):
    return helper.make_node(op, ins, outs, name=name, domain=domain, **attrs)


def partitions_of(compiled) -> list[tuple[str, list[str]]]:
    """(backend, [op of each instruction's kernel key]) per partition, in plan order."""
    plan = compiled.plan
    return [
        (p.backend, [plan.kernels[i.kernel].split("::")[1] for i in plan.instructions[p.first:p.first + p.count]])
        for p in plan.partitions
    ]


def kernel_keys(compiled, partition: int) -> list[str]:
    plan = compiled.plan
    p = plan.partitions[partition]
    return [plan.kernels[i.kernel] for i in plan.instructions[p.first:p.first + p.count]]


def node_names(compiled, partition: int) -> list[str]:
    plan = compiled.plan
    p = plan.partitions[partition]
    return [i.node for i in plan.instructions[p.first:p.first + p.count]]


def assert_matches_ort(compiled, path, feeds):
    want = ort_outputs(path, feeds)
    got = compiled.run(feeds)
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


def partition_edges(plan) -> dict[int, set[int]]:
    """The contracted graph: partition -> partitions reading what it writes."""
    writer = {}
    for index, p in enumerate(plan.partitions):
        for ins in plan.instructions[p.first:p.first + p.count]:
            for s in ins.outputs:
                if s >= 0:
                    writer[s] = index
    edges = {i: set() for i in range(len(plan.partitions))}
    for index, p in enumerate(plan.partitions):
        for ins in plan.instructions[p.first:p.first + p.count]:
            for s in ins.inputs:
                if s in writer and writer[s] != index:
                    edges[writer[s]].add(index)
    return edges


def reachable(edges, start) -> set[int]:
    seen, todo = set(), [start]
    while todo:
        for nxt in edges[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def assert_partition_dag(plan):
    """Plan order is a topological order of the contracted graph (so it is acyclic), and
    no two partitions of the same backend could be merged without creating a cycle."""
    edges = partition_edges(plan)
    for src, dsts in edges.items():
        assert all(dst > src for dst in dsts), f"partition {src} feeds an earlier partition"
    n = len(plan.partitions)
    for a in range(n):
        for b in range(a + 1, n):
            if plan.partitions[a].backend != plan.partitions[b].backend:
                continue
            # merging a and b is only illegal if a path a -> x -> ... -> b leaves them
            via_other = any(b in reachable(edges, x) for x in edges[a] if x != b)
            assert via_other, f"partitions {a} and {b} ({plan.partitions[a].backend}) could be one"


# -- the plugin's identity and registration ---------------------------------------------------


def test_plugin_backend_identity(plugin):
    backend = get_backend("mulsub")
    assert isinstance(backend, plugin.MulSubBackend)
    assert backend.identity() == {
        "name": "mulsub", "version": "1.0", "maker": "nncc test suite",
        "targets": "float32 Mul and Sub (numpy)",
    }
    from nncc.backends.registry import loaded_plugins

    assert loaded_plugins()[PLUGIN] == "1.0"


def test_unknown_backend_and_plugin_are_clear_errors(tmp_path):
    path = make_model(tmp_path / "m.onnx", [node("Relu", ["x"], ["y"], "r")], [("x", F, [2])], [("y", F, [2])])
    with pytest.raises(PluginError, match="unknown backend 'nope'"):
        nncc.compile_model(path, backends=("nope", "numpy"))
    with pytest.raises(PluginError, match="cannot load plugin 'tests.plugins.no_such_module'"):
        nncc.compile_model(path, plugins=("tests.plugins.no_such_module",))


# -- exact partitions ----------------------------------------------------------------------


@pytest.fixture
def mixed_model(tmp_path):
    """Mul/Sub mixed with other ops and an int64 Mul that mulsub must not take."""
    nodes = [
        node("Mul", ["x", "y"], ["m1"], "m1"),
        node("Sub", ["m1", "x"], ["s1"], "s1"),
        node("Relu", ["s1"], ["r1"], "r1"),
        node("Mul", ["r1", "y"], ["m2"], "m2"),
        node("Mul", ["i", "i"], ["ii"], "ii"),  # int64: numpy's
        node("Add", ["m2", "x"], ["a1"], "a1"),
        node("Sub", ["a1", "y"], ["out"], "s2"),
    ]
    path = make_model(
        tmp_path / "mixed.onnx", nodes,
        [("x", F, [2, 3]), ("y", F, [2, 3]), ("i", I64, [2, 3])],
        [("out", F, [2, 3]), ("ii", I64, [2, 3])],
    )
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal((2, 3)).astype(np.float32),
        "y": rng.standard_normal((2, 3)).astype(np.float32),
        "i": rng.integers(-50, 50, (2, 3)).astype(np.int64),
    }
    return path, feeds


MULSUB_PASSED = [
    {"node": "r1", "op": "Relu", "reason": "mulsub: takes only Mul and Sub"},
    {"node": "ii", "op": "Mul", "reason": "mulsub: value 'i' has dtype int64, not float32"},
    {"node": "a1", "op": "Add", "reason": "mulsub: takes only Mul and Sub"},
]


def test_mulsub_takes_float32_mul_and_sub_only(mixed_model):
    path, feeds = mixed_model
    compiled = nncc.compile_model(path, backends=MULSUB, plugins=(PLUGIN,), opt_level=0)
    # m1,s1 -> mulsub #0; r1 and the int64 Mul -> numpy #1 (ii depends on nothing);
    # m2 cannot join #0 (r1 in between) -> mulsub #2; a1 cannot join #1 -> numpy #3; s2 -> #4
    assert partitions_of(compiled) == [
        ("mulsub", ["Mul", "Sub"]),
        ("numpy", ["Relu", "Mul"]),
        ("mulsub", ["Mul"]),
        ("numpy", ["Add"]),
        ("mulsub", ["Sub"]),
    ]
    assert node_names(compiled, 0) == ["m1", "s1"]
    assert node_names(compiled, 1) == ["r1", "ii"]
    # mulsub's instructions are bound to its own kernels, in its own domain
    assert kernel_keys(compiled, 0) == ["test.mulsub::Mul::1", "test.mulsub::Sub::1"]
    assert kernel_keys(compiled, 2) == ["test.mulsub::Mul::1"]
    assert kernel_keys(compiled, 1)[1].startswith("ai.onnx::Mul::")
    parts = compiled.plan.partitions
    assert [(p.backend, p.backend_version, p.entry) for p in parts[:3]] == [
        ("mulsub", "1.0", "mulsub_module_0"), ("numpy", "1", "numpy_partition_1"),
        ("mulsub", "1.0", "mulsub_module_2")]
    assert compiled.plan.fallbacks == MULSUB_PASSED  # every node outside mulsub's partitions says why
    assert_partition_dag(compiled.plan)
    assert_matches_ort(compiled, path, feeds)
    # and the same after a round trip through the artifact
    reloaded = nncc.load(compiled.to_bytes())
    for name, value in compiled.run(feeds).items():
        np.testing.assert_array_equal(reloaded.run(feeds)[name], value)


def test_backend_priority_order_decides(mixed_model):
    path, feeds = mixed_model
    compiled = nncc.compile_model(path, backends=("numpy", "mulsub"), plugins=(PLUGIN,), opt_level=0)
    assert [b for b, _ in partitions_of(compiled)] == ["numpy"]  # numpy asked first takes all
    assert_matches_ort(compiled, path, feeds)


def test_a_plugin_backends_own_option_reaches_it_and_the_token(mixed_model, plugin):
    """A plugin backend's own option (its record, MulSubOptions) is a keyword like the
    native backend's target: it reaches the backend's compile and, through the backend's
    facts, the cache token."""
    from nncc.preparing.compiling import compile_options
    from nncc.preparing.token import token_context

    path, feeds = mixed_model
    compiled = nncc.compile_model(path, backends=MULSUB, plugins=(PLUGIN,), opt_level=0, mulsub_ops=["Sub"])
    taken = [i for i, (backend, _) in enumerate(partitions_of(compiled)) if backend == "mulsub"]
    assert [name for i in taken for name in node_names(compiled, i)] == ["s1", "s2"]
    assert {"node": "m1", "op": "Mul", "reason": "mulsub: takes only Sub"} in compiled.plan.fallbacks
    assert_matches_ort(compiled, path, feeds)
    plain = {"backends": MULSUB, "plugins": (PLUGIN,)}
    assert token_context(compile_options(dict(plain, mulsub_ops=["Sub"]))) != token_context(compile_options(plain))
    with pytest.raises(OptionError, match=r"mulsub_ops must name some of Mul, Sub, not \['Div'\]"):
        nncc.compile_model(path, backends=MULSUB, plugins=(PLUGIN,), mulsub_ops=["Div"])


def test_independent_chains_share_one_partition(tmp_path):
    nodes = [
        node("Mul", ["x", "x"], ["a"], "a"),
        node("Sub", ["y", "y"], ["b"], "b"),  # independent of a: same partition
        node("Relu", ["a"], ["ra"], "ra"),
        node("Relu", ["b"], ["rb"], "rb"),
        node("Mul", ["a", "b"], ["c"], "c"),  # only mulsub values in: joins #0 too
    ]
    path = make_model(tmp_path / "m.onnx", nodes, [("x", F, [4]), ("y", F, [4])],
                      [("ra", F, [4]), ("rb", F, [4]), ("c", F, [4])])
    compiled = nncc.compile_model(path, backends=MULSUB, plugins=(PLUGIN,), opt_level=0)
    assert partitions_of(compiled) == [("mulsub", ["Mul", "Sub", "Mul"]), ("numpy", ["Relu", "Relu"])]
    feeds = {"x": np.arange(4, dtype=np.float32), "y": np.ones(4, np.float32)}
    assert_matches_ort(compiled, path, feeds)


def test_merging_through_a_numpy_node_would_cycle(tmp_path):
    """m1 -> Relu -> m2 with m1 also feeding m2: one mulsub partition {m1, m2} would need
    the numpy Relu's output and feed it at once. Two mulsub partitions it must be."""
    nodes = [
        node("Mul", ["x", "x"], ["m1"], "m1"),
        node("Relu", ["m1"], ["r"], "r"),
        node("Mul", ["r", "m1"], ["m2"], "m2"),
    ]
    path = make_model(tmp_path / "m.onnx", nodes, [("x", F, [3])], [("m2", F, [3])])
    compiled = nncc.compile_model(path, backends=MULSUB, plugins=(PLUGIN,), opt_level=0)
    assert partitions_of(compiled) == [("mulsub", ["Mul"]), ("numpy", ["Relu"]), ("mulsub", ["Mul"])]
    assert_partition_dag(compiled.plan)
    assert_matches_ort(compiled, path, {"x": np.array([-2, 0.5, 3], np.float32)})


def test_no_cycle_through_a_partition_that_grew(tmp_path):
    """a1 and a2 end in one mulsub partition A; a2 reads numpy's b1, so A depends on b1's
    partition B. x2 reads only a1, but joining B would make B -> A -> B: a node-level
    dependency check misses it (x2 does not depend on b1), a partition-level one does not."""
    nodes = [
        node("Mul", ["x", "x"], ["a1"], "a1"),
        node("Relu", ["x"], ["b1"], "b1"),
        node("Mul", ["b1", "b1"], ["a2"], "a2"),
        node("Relu", ["a1"], ["x2"], "x2"),
    ]
    path = make_model(tmp_path / "m.onnx", nodes, [("x", F, [3])], [("a2", F, [3]), ("x2", F, [3])])
    compiled = nncc.compile_model(path, backends=MULSUB, plugins=(PLUGIN,), opt_level=0)
    assert partitions_of(compiled) == [("numpy", ["Relu"]), ("mulsub", ["Mul", "Mul"]), ("numpy", ["Relu"])]
    assert node_names(compiled, 0) == ["b1"] and node_names(compiled, 2) == ["x2"]
    assert_partition_dag(compiled.plan)
    assert_matches_ort(compiled, path, {"x": np.array([-2, 0.5, 3], np.float32)})


def test_group_indices_force_a_split(tmp_path, plugin):
    class Grouped(plugin.MulSubBackend):
        name = "mulsub-grouped"

        def group(self, index, node):
            return int(node.name[1]) if node.name.startswith("g") else None

    register_backend(Grouped)
    nodes = [
        node("Mul", ["x", "x"], ["a"], "g0_a"),
        node("Sub", ["a", "x"], ["b"], "g1_b"),
        node("Mul", ["b", "x"], ["c"], "g1_c"),
        node("Sub", ["c", "a"], ["d"], "g0_d"),  # group 0 again, but after group 1: own partition
    ]
    path = make_model(tmp_path / "m.onnx", nodes, [("x", F, [3])], [("d", F, [3])])
    plain = nncc.compile_model(path, backends=MULSUB, plugins=(PLUGIN,), opt_level=0)
    assert partitions_of(plain) == [("mulsub", ["Mul", "Sub", "Mul", "Sub"])]
    grouped = nncc.compile_model(path, backends=("mulsub-grouped", "numpy"), opt_level=0)
    assert partitions_of(grouped) == [
        ("mulsub-grouped", ["Mul"]), ("mulsub-grouped", ["Sub", "Mul"]), ("mulsub-grouped", ["Sub"]),
    ]
    assert [node_names(grouped, i) for i in range(3)] == [["g0_a"], ["g1_b", "g1_c"], ["g0_d"]]
    assert_matches_ort(grouped, path, {"x": np.array([-2, 0.5, 3], np.float32)})


# -- fallback ------------------------------------------------------------------------------


def test_dynamic_shapes_fall_back_to_the_portable_backend_with_reasons(tmp_path):
    nodes = [
        node("Mul", ["x", "x"], ["m"], "m"),  # float32: mulsub takes it, shape or not
        node("Relu", ["m"], ["r"], "r"),  # dynamic shape: numpy does not select it, but runs it
        node("Mul", ["i", "i"], ["ii"], "ii"),  # int64 and dynamic: nobody selects it -> numpy
    ]
    path = make_model(tmp_path / "m.onnx", nodes, [("x", F, ["N", 3]), ("i", I64, ["N"])],
                      [("r", F, ["N", 3]), ("ii", I64, ["N"])])
    compiled = nncc.compile_model(path, backends=MULSUB, plugins=(PLUGIN,), opt_level=0)
    assert partitions_of(compiled) == [("mulsub", ["Mul"]), ("numpy", ["Relu", "Mul"])]
    assert compiled.plan.fallbacks == [
        {"node": "r", "op": "Relu",
         "reason": "mulsub: takes only Mul and Sub; numpy: value 'm' has no static shape"},
        {"node": "ii", "op": "Mul",
         "reason": "mulsub: value 'i' has dtype int64, not float32; numpy: value 'i' has no static shape"},
    ]
    for n in (1, 5):
        feeds = {"x": np.linspace(-1, 1, 3 * n, dtype=np.float32).reshape(n, 3),
                 "i": np.arange(n, dtype=np.int64)}
        assert_matches_ort(compiled, path, feeds)


def test_fixture_fallbacks_name_the_node_and_reason():
    compiled = nncc.compile_model(FIXTURES / "mlp.onnx")  # batch dim N is symbolic
    assert compiled.plan.fallbacks, "mlp has a symbolic batch: something must fall back"
    for entry in compiled.plan.fallbacks:
        assert set(entry) == {"node", "op", "reason"}
        assert entry["node"] and entry["op"] and "no static shape" in entry["reason"]
    assert {p.backend for p in compiled.plan.partitions} == {"numpy"}  # the fallback is the portable backend


def test_cpu_is_another_name_for_the_portable_backend(tmp_path):
    """`--backend cpu` selects the portable backend: the same partitions, recorded under
    its name, as `--backend numpy` makes."""
    path = FIXTURES / "mlp.onnx"
    by_alias = nncc.compile_model(path, backends=("cpu",))
    by_name = nncc.compile_model(path, backends=("numpy",))
    assert {p.backend for p in by_alias.plan.partitions} == {"numpy"}
    assert [(p.backend, p.first, p.count) for p in by_alias.plan.partitions] == \
        [(p.backend, p.first, p.count) for p in by_name.plan.partitions]
    both = nncc.compile_model(path, backends=("native", "cpu", "numpy"))  # named twice: asked once
    assert len({p.backend for p in both.plan.partitions} - {"native"}) == 1


def test_plugin_on_a_fixture(tmp_path):
    """mobilenet.onnx's squeeze-excite and HardSwish paths have float32 Muls: mulsub takes
    every one of them, in partitions that keep the graph acyclic."""
    path = FIXTURES / "mobilenet.onnx"
    compiled = nncc.compile_model(path, backends=MULSUB, plugins=(PLUGIN,), opt_level=0)
    parts = partitions_of(compiled)
    taken = [ops for backend, ops in parts if backend == "mulsub"]
    assert taken and all(set(ops) <= {"Mul", "Sub"} for ops in taken)
    model = onnx.load(path)
    n_mul_sub = sum(n.op_type in ("Mul", "Sub") for n in model.graph.node)
    assert sum(len(ops) for ops in taken) == n_mul_sub
    assert_partition_dag(compiled.plan)
    x = np.random.default_rng(1).standard_normal((1, 3, 64, 64)).astype(np.float32)
    want = ort_outputs(path, {"x": x})["logits"]
    np.testing.assert_allclose(compiled.run({"x": x})["logits"], want, rtol=1e-3, atol=1e-4)


# -- random DAGs: always acyclic, maximal, and right --------------------------------------

OPS = ("Mul", "Sub", "Relu", "Abs", "Add")


@st.composite
def dags(draw):
    n = draw(st.integers(2, 12))
    nodes = []
    for k in range(n):
        op = draw(st.sampled_from(OPS))
        pool = ["x"] + [f"v{j}" for j in range(k)]
        a = draw(st.sampled_from(pool))
        b = draw(st.sampled_from(pool))
        nodes.append((op, [a] if op in ("Relu", "Abs") else [a, b]))
    return nodes


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(spec=dags())
def test_random_dags_partition_acyclic_maximal_and_correct(spec, tmp_path_factory):
    nodes = [node(op, ins, [f"v{k}"], f"v{k}") for k, (op, ins) in enumerate(spec)]
    used = {i for _, ins in spec for i in ins}
    outs = [f"v{k}" for k in range(len(spec)) if f"v{k}" not in used] or [f"v{len(spec) - 1}"]
    path = make_model(tmp_path_factory.mktemp("dag") / "m.onnx", nodes, [("x", F, [5])],
                      [(o, F, [5]) for o in outs])
    compiled = nncc.compile_model(path, backends=MULSUB, plugins=(PLUGIN,), opt_level=0)
    assert sum(p.count for p in compiled.plan.partitions) == len(spec)
    for backend, ops in partitions_of(compiled):
        assert (backend == "mulsub") == (set(ops) <= {"Mul", "Sub"}), (backend, ops)
    assert_partition_dag(compiled.plan)
    x = np.array([-1.5, -0.25, 0.0, 0.5, 2.0], np.float32)
    assert_matches_ort(compiled, path, {"x": x})


# -- the custom op with a typed interface --------------------------------------------------


def scaled_add_model(tmp_path, **attrs):
    nodes = [node("ScaledAdd", ["a", "b"], ["c"], "sa", domain="test.mulsub", **attrs),
             node("Sub", ["c", "a"], ["d"], "sub")]
    return make_model(tmp_path / "sa.onnx", nodes, [("a", F, [2, 3]), ("b", F, [3])],
                      [("d", F, [2, 3])], opsets=(("", 17), ("test.mulsub", 1)))


@pytest.mark.parametrize("attrs,alpha", [({}, 1.0), ({"alpha": 2.5}, 2.5)])
def test_custom_op_with_typed_interface(tmp_path, plugin, attrs, alpha):
    schema = plugin.SCHEMAS[("test.mulsub", "ScaledAdd")]
    assert (schema.inputs, schema.outputs) == (("A", "B"), ("C",))
    assert [(a.name, a.type, a.default) for a in schema.attributes] == [("alpha", float, 1.0)]
    path = scaled_add_model(tmp_path, **attrs)
    compiled = nncc.compile_model(path, backends=MULSUB, plugins=(PLUGIN,), opt_level=0)
    assert partitions_of(compiled) == [("numpy", ["ScaledAdd"]), ("mulsub", ["Sub"])]
    assert kernel_keys(compiled, 0) == ["test.mulsub::ScaledAdd::1"]
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([1, -2, 4], np.float32)
    got = compiled.run({"a": a, "b": b})["d"]
    np.testing.assert_allclose(got, (a + np.float32(alpha) * b) - a, rtol=1e-6)
    assert got.dtype == np.float32
    again = nncc.load(compiled.to_bytes()).run({"a": a, "b": b})["d"]
    np.testing.assert_array_equal(again, got)


@pytest.mark.parametrize("attrs,message", [
    ({"alpha": 2}, "attribute 'alpha' must be float, not int"),
    ({"alpha": "x"}, "attribute 'alpha' must be float, not str"),
    ({"beta": 1.0}, "has no attribute 'beta'"),
])
def test_custom_op_interface_is_enforced_at_compile_time(tmp_path, attrs, message):
    path = scaled_add_model(tmp_path, **attrs)
    with pytest.raises(ShapeInferenceError, match=message):
        nncc.compile_model(path, backends=MULSUB, plugins=(PLUGIN,), opt_level=0)


# -- the CLI, in fresh processes -------------------------------------------------------------


def nncc_cli(*args, check=True):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-m", "nncc", *map(str, args)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, env=env)
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.mark.slow
def test_cli_plugin_inspect_and_compile(mixed_model, tmp_path):
    path, feeds = mixed_model
    flags = ["--plugin", PLUGIN, "--backend", "mulsub", "--backend", "numpy", "-O", "0"]
    report = json.loads(nncc_cli("inspect", path, *flags, "--json").stdout)
    assert [(p["backend"], p["ops"], p["nodes"]) for p in report["partitions"]] == [
        ("mulsub", {"Mul": 1, "Sub": 1}, 2), ("numpy", {"Mul": 1, "Relu": 1}, 2),
        ("mulsub", {"Mul": 1}, 1), ("numpy", {"Add": 1}, 1), ("mulsub", {"Sub": 1}, 1),
    ]
    assert [p["entry"] for p in report["partitions"]][:2] == ["mulsub_module_0", "numpy_partition_1"]
    assert report["fallbacks"] == MULSUB_PASSED
    assert report["options"]["plugins"] == [PLUGIN]
    assert report["options"]["backends"] == ["mulsub", "numpy"]

    out = tmp_path / "mixed.nncc"
    nncc_cli("compile", path, "-o", out, *flags)
    in_process = nncc.compile_model(path, backends=MULSUB, plugins=(PLUGIN,), opt_level=0)
    assert out.read_bytes() == in_process.to_bytes()
    # the artifact names plugin kernels; inspecting it needs the plugin, named by the user
    again = json.loads(nncc_cli("inspect", out, "--plugin", PLUGIN, "--json").stdout)
    assert again["partitions"] == report["partitions"]
    assert again["artifact_bytes"] == out.stat().st_size


def test_cli_fallbacks_reported(tmp_path):
    report = json.loads(nncc_cli("inspect", FIXTURES / "mlp.onnx", "--json").stdout)
    assert report["fallbacks"] and all("no static shape" in f["reason"] for f in report["fallbacks"])
    assert {p["backend"] for p in report["partitions"]} == {"numpy"}


@pytest.mark.slow
def test_artifact_never_imports_the_plugin_it_names(mixed_model, tmp_path):
    """Loading an artifact whose kernels come from a plugin, without --plugin: a clear
    PlanFormatError, and the plugin module (named in the artifact's options) stays unimported."""
    path, _ = mixed_model
    out = tmp_path / "mixed.nncc"
    nncc.compile_model(path, backends=MULSUB, plugins=(PLUGIN,), opt_level=0).save(out)
    script = (
        "import sys, nncc\n"
        "from nncc.errors import PlanFormatError\n"
        f"try:\n    nncc.load({str(out)!r})\nexcept PlanFormatError as e:\n    print('refused:', e)\n"
        f"assert {PLUGIN!r} not in sys.modules and 'tests.plugins' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                            timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 0, result.stderr
    assert f"refused: {out}: plan uses kernel 'test.mulsub::Mul::1', which is not registered" in result.stdout
    assert "--plugin" in result.stdout
    # the CLI says the same, in one line, exit code 2
    failed = nncc_cli("inspect", out, "--json", check=False)
    assert failed.returncode == 2 and "not registered" in failed.stderr and "Traceback" not in failed.stderr


def test_plugin_kernels_missing_in_process_is_plan_format_error(mixed_model):
    """The same refusal in-process, when the kernels a plan names are not registered."""
    from nncc.kernels.registry import _REGISTRY

    path, _ = mixed_model
    raw = nncc.compile_model(path, backends=MULSUB, plugins=(PLUGIN,), opt_level=0).to_bytes()
    saved = _REGISTRY.pop(("test.mulsub", "Mul"))
    try:
        with pytest.raises(PlanFormatError, match="test.mulsub::Mul::1"):
            nncc.load(raw)
    finally:
        _REGISTRY[("test.mulsub", "Mul")] = saved


def test_cli_run_artifact_with_plugin(mixed_model, tmp_path):
    path, feeds = mixed_model
    out = tmp_path / "mixed.nncc"
    nncc.compile_model(path, backends=MULSUB, plugins=(PLUGIN,), opt_level=0).save(out)
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **feeds)
    result = nncc_cli("run", out, "--plugin", PLUGIN, "--inputs", inputs, "--output", tmp_path / "o.npz",
                      check=False)
    assert result.returncode == 0, result.stderr
    want = ort_outputs(path, feeds)
    with np.load(tmp_path / "o.npz") as got:
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


# -- entry-point plugins (an installed package declaring an nncc.backends entry point) -----


def _fake_distribution(root, group="nncc.backends"):
    """A distribution's metadata as pip installs it: a .dist-info folder on sys.path."""
    info = root / "mulsub_plugin_pkg-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mulsub-plugin-pkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\nmulsub = {PLUGIN}:MulSubBackend\n")
    return root


@pytest.mark.slow
def test_entry_point_plugin_is_found_without_plugin_flag(mixed_model, tmp_path):
    path, _ = mixed_model
    site = _fake_distribution(tmp_path / "site")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(site)]))
    flags = ["--backend", "mulsub", "--backend", "numpy", "-O", "0", "--json"]
    done = subprocess.run([sys.executable, "-m", "nncc", "inspect", path, *flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {p["backend"] for p in report["partitions"]} == {"mulsub", "numpy"}
    # without the installed metadata the backend does not exist
    bare = nncc_cli("inspect", path, *flags, check=False)
    assert bare.returncode != 0 and "mulsub" in bare.stderr


def _imported(stderr: str) -> set[str]:
    """The modules a ``python -X importtime`` process imported."""
    return {line.rsplit("|", 1)[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.slow  # an installed entry point and CLI processes
def test_entry_points_are_read_only_for_a_backend_not_built_in(mixed_model, tmp_path):
    """With a plugin installed, a run on the built-in backends (a miss, then a hit) never
    reads the installed packages' metadata (importlib.metadata is not even imported);
    naming the installed backend reads it (the test above shows it is then found)."""
    path, _ = mixed_model
    site = _fake_distribution(tmp_path / "site")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(site)]),
               NNCC_CACHE_DIR=str(tmp_path / "cache"))

    def run(*flags):
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "nncc", "run", path, "--random-inputs",
                               *flags], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        return _imported(done.stderr), done.stderr

    for outcome in ("cache miss", "cache hit"):
        imported, stderr = run()
        assert outcome in stderr
        assert "importlib.metadata" not in imported
    imported, _ = run("--backend", "mulsub", "--backend", "numpy")
    assert "importlib.metadata" in imported
