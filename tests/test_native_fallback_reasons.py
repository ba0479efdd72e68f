"""Every node outside a native partition says why: a partition boundary no refusal explains
would be a silent split of the model. Several models (the fixtures with their symbolic
dimensions fixed, models holding ops the registry has no entry for, a reshape alone between
two portable nodes) are compiled with the default backends, and every node of every
portable partition must appear in the plan's fallbacks with the native backend's reason;
no node of a native partition may. `nncc inspect` prints the reasons with their counts,
names each node at -v, and carries them in --json."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto

import nncc
from nncc.backends.base import Backend
from nncc.backends.portable import PortableBackend
from nncc.frontend.onnx import parse_model
from nncc.native.toolchain import find_toolchain
from nncc.partition import partition_graph
from nncc.passes.shape_inference import infer_shapes
from tests.conftest import FIXTURES
from tests.models import GraphBuilder

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")


def node_names(plan, partition) -> list[str]:
    """How the fallbacks name each node of ``partition``: its name, or its first output's."""
    return [ins.node or f"output {plan.slots[ins.outputs[0]].name!r}"
            for ins in plan.instructions[partition.first:partition.first + partition.count]]


def assert_every_portable_node_has_a_reason(plan) -> dict[str, str]:
    """The fallbacks by node name, after checking they cover exactly the nodes outside
    native partitions, each with the native backend's reason."""
    reasons = {f["node"]: f["reason"] for f in plan.fallbacks}
    native = plan.code_partitions()
    portable_nodes, native_nodes = [], []
    for index, partition in enumerate(plan.partitions):
        (native_nodes if index in native else portable_nodes).extend(node_names(plan, partition))
    assert all(portable_nodes) and all(native_nodes), "every instruction names its node"
    silent = [n for n in portable_nodes if n not in reasons]
    assert not silent, f"portable nodes with no reason: {silent}"
    assert not set(native_nodes) & set(reasons), "a native node listed as a fallback"
    for name in portable_nodes:
        assert reasons[name].startswith("native: ") and len(reasons[name]) > len("native: "), reasons[name]
    return reasons


@pytest.mark.slow
@pytest.mark.parametrize("fixture, dims", [
    ("shape_ops", {"N": 2}), ("transformer", {"S": 8}), ("mlp", {"N": 3}), ("mlp", {}),
    ("mobilenet", {}), ("resnet_block", {}), ("gru_cell", {}),
])
def test_fixtures_name_a_reason_for_every_portable_node(fixture, dims):
    compiled = nncc.compile_model(FIXTURES / f"{fixture}.onnx", dims=dims)
    assert_every_portable_node_has_a_reason(compiled.plan)


def mixed_model() -> GraphBuilder:
    """Native convolutions around ops with no C generator (CumSum, for one), a bool mask,
    and a float Reshape alone between two CumSums: the model splits, and every split has
    its reason."""
    m = GraphBuilder(18, 3, "mixed")
    x = m.input([1, 4, 6, 6])
    conv = m.node("Relu", [m.node("Conv", [x, m.weight([4, 4, 3, 3])], pads=[1, 1, 1, 1])])
    axis = m.const(1, np.int64)
    summed = m.node("CumSum", [m.node("Reshape", [m.node("CumSum", [conv, axis]), m.const([1, 144], np.int64)]),
                               axis])
    mask = m.node("Not", [m.node("IsNaN", [summed])])
    picked = m.node("Where", [mask, summed, m.const(0.0)])
    m.output(m.node("Softmax", [m.node("Mul", [picked, m.const(2.0)])], axis=-1))
    return m


@pytest.mark.slow
def test_unsupported_ops_and_a_lone_reshape_are_each_explained(tmp_path):
    m = mixed_model()
    path = tmp_path / "mixed.onnx"
    m.save(path)
    compiled = nncc.compile_model(path)
    reasons = assert_every_portable_node_has_a_reason(compiled.plan)
    by_op: dict[str, list[str]] = {}
    for f in compiled.plan.fallbacks:
        by_op.setdefault(f["op"], []).append(reasons[f["node"]])
    assert compiled.native_partitions >= 1 and len(compiled.plan.partitions) >= 3
    assert by_op["CumSum"] == ["native: no C generator for CumSum"] * 2
    assert by_op["Reshape"] == ["native: a reshape-like node with no native neighbour: a free view in the "
                                "portable plan"]


def test_a_backend_ahead_of_the_owner_that_gives_no_reason_is_named(tmp_path):
    """A plugin backend without reject_reason still leaves a reason naming it."""
    class Picky(Backend):
        name = "picky"

        def partition(self, graph, infos):
            return {i: None for i, n in enumerate(graph.nodes) if n.op_type == "Relu"}

    m = GraphBuilder(18, 0, "picky")
    m.output(m.node("Neg", [m.node("Relu", [m.input([2, 3])])]))
    graph = parse_model(m.save(tmp_path / "p.onnx").SerializeToString())
    numpy = PortableBackend()
    result = partition_graph(graph, infer_shapes(graph), [Picky(), numpy], numpy)
    assert [(p.backend, [n.op_type for n in p.nodes]) for p in result.partitions] == \
        [("picky", ["Relu"]), ("numpy", ["Neg"])]
    assert [(op, why) for _, op, why in result.fallbacks] == [("Neg", "picky: passed on it without saying why")]


def test_inspect_prints_reasons_with_counts_names_nodes_at_v_and_in_json(tmp_path, cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one line per reason: rich wraps at the width
    m = mixed_model()
    path = tmp_path / "mixed.onnx"
    m.save(path)
    code, out, err = cli("inspect", path, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["fallbacks"] and all(set(f) == {"node", "op", "reason"} for f in report["fallbacks"])
    assert sum(g["nodes"] for g in report["fallback_groups"]) == len(report["fallbacks"])
    portable = sum(p["nodes"] for p in report["partitions"] if not p["native"])
    assert portable == len(report["fallbacks"])  # each node outside native code, once
    code, text, err = cli("inspect", path)
    flat = " ".join(text.split())
    assert code == 0, err
    assert f"{len(report['fallbacks'])} fallback node(s)" in flat
    for group in report["fallback_groups"]:
        count = f"{group['nodes']} node{'s' if group['nodes'] > 1 else ''}: "
        assert count + " ".join(group["reason"].split()) in flat, (group, flat)
    assert all(f["node"].startswith("output '") for f in report["fallbacks"])  # the builder names no node
    assert not any(f"({f['node']})" in flat for f in report["fallbacks"])  # names only at -v
    code, verbose, err = cli("inspect", path, "-v")
    flat = " ".join(verbose.split())
    for f in report["fallbacks"]:
        assert f"{f['op']} ({f['node']}): " in flat, (f, flat)


def test_a_cast_fallback_names_its_types(tmp_path):
    """A Cast the native code cannot hold names both types (a refusal of the entry itself)."""
    m = GraphBuilder(18, 1, "cast")
    x = m.input([2, 5])
    there = m.node("Cast", [x], to=TensorProto.DOUBLE)
    m.output(m.node("Relu", [m.node("Cast", [m.node("Sqrt", [there])], to=TensorProto.FLOAT)]))
    m.save(tmp_path / "c.onnx")
    compiled = nncc.compile_model(tmp_path / "c.onnx")
    reasons = assert_every_portable_node_has_a_reason(compiled.plan)
    assert any("double" in r or "float64" in r for r in reasons.values()), reasons
