"""The executor's dispatch of compiled partitions and its treatment of kernel bugs.

Each partition runs as the unit its backend makes of it (nncc.backends.unit): the example
plugin (examples/plugin_example.py) runs its partitions as one call of its own each. A
TypeError or IndexError raised inside a kernel is a bug, not bad input: it propagates
with its traceback (tests/plugins/buggy_plugin.py has such kernels). Values are checked
against onnxruntime.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import traceback

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import nncc
from nncc.backends.registry import load_plugin
from nncc.errors import KernelError
from tests.conftest import ROOT
from tests.models import layernorm_mlp
from tests.oracle import ort_run, ort_session

BUGGY = "tests.plugins.buggy_plugin"
EXAMPLE = "examples.plugin_example"  # imported from the repository root, as tests.plugins.buggy_plugin is
F = TensorProto.FLOAT


@pytest.fixture(scope="module", autouse=True)
def plugins():
    """Plugins are process-wide (and part of the cache key): unloaded afterwards."""
    load_plugin(BUGGY)
    load_plugin(EXAMPLE)
    yield sys.modules[EXAMPLE]
    from nncc.backends import registry as backends
    from nncc.kernels import registry as kernels

    backends._BACKENDS.pop("example", None)
    for module, domain in ((BUGGY, "test.buggy"), (EXAMPLE, "example")):
        backends._PLUGINS.pop(module, None)
        for key in [k for k in kernels._REGISTRY if k[0] == domain]:
            del kernels._REGISTRY[key]
        sys.modules.pop(module, None)


# -- a backend that runs its partitions its own way ------------------------------------------


def chain_model(tmp_path: pathlib.Path) -> pathlib.Path:
    """Mul and Add around a Relu: the example backend takes the two Mul/Add pairs (two
    partitions, the Relu between them), and ``mid`` is both a graph output and read later."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", F, [8], rng.standard_normal(8).astype(np.float32).tolist())
    nodes = [helper.make_node("Mul", ["x", "w"], ["m1"], name="mul1"),
             helper.make_node("Add", ["m1", "y"], ["mid"], name="add1"),
             helper.make_node("Relu", ["mid"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "x"], ["m2"], name="mul2"),
             helper.make_node("Add", ["m2", "mid"], ["out"], name="add2")]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", F, [3, 8]),
                                               helper.make_tensor_value_info("y", F, [1, 8])],
                              [helper.make_tensor_value_info("out", F, [3, 8]),
                               helper.make_tensor_value_info("mid", F, [3, 8])], [w])
    path = tmp_path / "chain.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_plugin_backend_runs_its_partitions_as_its_own_units(tmp_path, plugins):
    path = chain_model(tmp_path)
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((3, 8)).astype(np.float32),
             "y": rng.standard_normal((1, 8)).astype(np.float32)}
    session = ort_session(path)
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    compiled = nncc.compile_model(path, backends=["example", "numpy"], plugins=[EXAMPLE])
    saved = tmp_path / "chain.nncc"
    compiled.save(saved)
    for model in (compiled, nncc.load(saved)):  # in memory, and read back from its artifact
        executor = model._executor
        assert [(u.entry, u.kind) for u in executor.units] == [
            ("example_0", "example"), ("numpy_partition_1", "instructions"), ("example_2", "example")]
        assert len(executor.steps) == 3  # one call per example partition, one for the Relu
        before = plugins.ExampleUnit.runs
        for _ in range(3):  # the units' buffers are reused from run to run
            got = model.run(feeds)
            for name in want:
                np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)
        assert plugins.ExampleUnit.runs - before == 3 * 2


def test_an_outside_plugin_payload_travels_in_the_artifact_and_the_cache_entry(tmp_path, plugins):
    """Compiled by `nncc compile --plugin examples.plugin_example` in another process: the example
    backend's bytecode is its payload, in the artifact's PAYL section and byte for byte in
    the cache entry; loaded here, each of its partitions runs that bytecode (one call,
    ExampleUnit), with onnxruntime's results."""
    from nncc.plan.format import read_sections

    path = chain_model(tmp_path)
    out, cache = tmp_path / "chain.nncc", tmp_path / "cache"
    env = dict(os.environ, PYTHONPATH=str(ROOT),
               NNCC_CACHE_DIR=str(cache))
    done = subprocess.run([sys.executable, "-m", "nncc", "compile", str(path), "-o", str(out), "--plugin", EXAMPLE,
                           "--backend", "example", "--backend", "numpy"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    _, sections = read_sections(out.read_bytes())
    program = json.loads(bytes(sections[b"PROG"]))
    (backend, section, offset, length, partitions, meta), = program["payloads"]
    assert (backend, section, partitions) == ("example", "PAYL", [0, 2]) and b"CODE" not in sections
    payload = bytes(sections[b"PAYL"])[offset:offset + length]
    assert len(payload) == 4 * 7  # two Mul/Add pairs, one 7-byte instruction each
    assert [entry[0] for entry in meta["programs"]] == [0, 2]
    entries = list(cache.rglob("*.plan"))
    assert len(entries) == 1
    assert bytes(read_sections(entries[0].read_bytes())[1][b"PAYL"]) == bytes(sections[b"PAYL"])

    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((3, 8)).astype(np.float32),
             "y": rng.standard_normal((1, 8)).astype(np.float32)}
    session = ort_session(path)
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    model = nncc.load(out)
    assert [u.kind for u in model._executor.units] == ["example", "instructions", "example"]
    before = plugins.ExampleUnit.runs
    got = model.run(feeds)
    assert plugins.ExampleUnit.runs - before == 2
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)


def test_a_damaged_payload_is_refused_when_read(tmp_path, plugins):
    """The backend checks its payload when the plan is read: bytecode naming a register
    that does not exist is a clear format error, not a crash at run time."""
    from nncc.errors import PlanFormatError
    from nncc.plan import format as F

    compiled = nncc.compile_model(chain_model(tmp_path), backends=["example", "numpy"], plugins=[EXAMPLE])
    producer, sections = F.read_sections(compiled.to_bytes())
    blob = bytearray(sections[b"PAYL"])
    blob[1:3] = (999).to_bytes(2, "little")  # the first instruction's first operand
    damaged = F.assemble(producer, [(tag, bytes(blob) if tag == b"PAYL" else bytes(body))
                                    for tag, body in sections.items()])
    with pytest.raises(PlanFormatError, match="bad example bytecode for partition 0"):
        nncc.load(damaged)


def test_a_partition_whose_backend_is_not_loaded_runs_its_instructions(tmp_path, plugins):
    """The plan names its backend, but a plan never makes nncc import anything: without the
    backend, its partitions run their instructions (the plugin's kernels, still registered)."""
    from nncc.backends import registry

    path = chain_model(tmp_path)
    compiled = nncc.compile_model(path, backends=["example", "numpy"], plugins=[EXAMPLE])
    backend = registry._BACKENDS.pop("example")
    try:
        model = nncc.load(compiled.to_bytes())
    finally:
        registry._BACKENDS["example"] = backend
    assert [u.kind for u in model._executor.units] == ["instructions"] * 3
    assert len(model._executor.steps) == 5
    feeds = {"x": np.full((3, 8), 0.5, np.float32), "y": np.ones((1, 8), np.float32)}
    before = plugins.ExampleUnit.runs
    for name, value in compiled.run(feeds).items():
        np.testing.assert_allclose(model.run(feeds)[name], value, rtol=1e-6)
    assert plugins.ExampleUnit.runs - before == 2  # the compiled model's run only


def buggy_model(tmp_path: pathlib.Path, op: str) -> pathlib.Path:
    """x -> Relu -> test.buggy::op -> Neg -> y: the bug sits between two ordinary kernels."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node(op, ["r"], ["b"], name="the_buggy_node", domain="test.buggy"),
             helper.make_node("Neg", ["b"], ["y"], name="neg")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 3])],
                              [helper.make_tensor_value_info("y", F, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("test.buggy", 1)])
    path = tmp_path / f"{op}.onnx"
    onnx.save(model, str(path))
    return path


def frames(exc: BaseException) -> list[str]:
    return [frame.name for frame in traceback.extract_tb(exc.__traceback__)]


@pytest.mark.parametrize("op, error, where", [("Broken", TypeError, "add_nothing"),
                                              ("OutOfRange", IndexError, "one_past_the_end")])
def test_a_kernel_bug_keeps_its_type_and_traceback(tmp_path, op, error, where):
    model = nncc.compile_model(buggy_model(tmp_path, op), backends=["numpy"], plugins=[BUGGY])
    x = np.ones((2, 3), np.float32)
    with pytest.raises(error) as caught:
        model.run({"x": x})
    assert not isinstance(caught.value, KernelError)
    # the traceback reaches down into the kernel's own helper, where the bug is
    assert frames(caught.value)[-1] == where
    assert caught.value.__cause__ is None  # raised as is, not re-raised from a wrapper


@pytest.mark.parametrize("op, error, where", [("Broken", TypeError, "add_nothing"),
                                              ("OutOfRange", IndexError, "one_past_the_end")])
def test_a_kernel_bug_keeps_its_type_in_the_interpreter(tmp_path, op, error, where):
    with pytest.raises(error) as caught:
        nncc.load_onnx(buggy_model(tmp_path, op)).run({"x": np.ones((2, 3), np.float32)})
    assert frames(caught.value)[-1] == where


def test_a_result_of_another_shape_than_its_planned_buffer_is_an_error(tmp_path):
    """Copied into the buffer it would broadcast: [[15]] would become [[15, 15, 15], ...]."""
    model = nncc.compile_model(buggy_model(tmp_path, "WrongShape"), backends=["numpy"], plugins=[BUGGY])
    with pytest.raises(KernelError, match=r"the_buggy_node gave a result that does not fit its output.*"
                                          r"shape \[1, 1\] where \[2, 3\] was planned"):
        model.run({"x": np.arange(6, dtype=np.float32).reshape(2, 3)})


@pytest.mark.slow
def test_a_kernel_bug_is_an_internal_error_at_the_cli(tmp_path):
    """One line that says it is nncc's fault (exit 1), and the full traceback on request."""
    path = buggy_model(tmp_path, "Broken")
    env = dict(os.environ, PYTHONPATH=str(ROOT), NNCC_CACHE_DIR=str(tmp_path / "cache"))
    command = [sys.executable, "-m", "nncc", "run", str(path), "--plugin", BUGGY, "--backend", "numpy",
               "--random-inputs"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1
    assert "internal error: TypeError" in done.stderr and "the_buggy_node failed" not in done.stderr
    env["NNCC_DEBUG"] = "1"
    debug = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert debug.returncode != 0
    assert "Traceback" in debug.stderr and "in add_nothing" in debug.stderr


# -- two-phase kernels: prepared once with static shapes, then run ---------------------------


@pytest.mark.parametrize("batch, prepared", [(3, True), ("N", False)])
def test_matrix_kernels_are_prepared_once_where_shapes_are_static(tmp_path, batch, prepared):
    """Static operands: the matrix products, LayerNormalization and LogSoftmax run their
    prepared form (their plan made once); a dynamic batch keeps the general kernels. Both
    agree with onnxruntime."""
    from nncc.kernels.registry import by_key

    path = layernorm_mlp(tmp_path / f"mlp_{batch}.onnx", batch)
    model = nncc.compile_model(path, backends=["numpy"])
    plan = model._executor.plan
    general = [by_key(plan.kernels[ins.kernel]).fn for ins in plan.instructions]
    ran = [step[0] for step in model._executor.steps]
    assert [by_key(k).op_type for k in plan.kernels] == [
        "FusedMatMul", "Gemm", "LayerNormalization", "MatMul", "LogSoftmax"]
    assert [fn is not g for fn, g in zip(ran, general)] == [prepared] * 5
    session = ort_session(path)
    x = np.random.default_rng(3).standard_normal((3, 16)).astype(np.float32)
    want = session.run(None, {"x": x})[0]
    for _ in range(2):
        np.testing.assert_allclose(model.run({"x": x})["y"], want, rtol=1e-5, atol=1e-6)


def test_a_partition_that_is_not_what_its_backend_makes_runs_its_instructions(tmp_path):
    """A plan is input: one naming the example backend for the Relu partition (which that
    backend never takes) gets the instructions there, not a unit built on a wrong guess."""
    import dataclasses

    from nncc.backends.payloads import activate_payloads
    from nncc.runtime.executor import Executor

    compiled = nncc.compile_model(chain_model(tmp_path), backends=["example", "numpy"], plugins=[EXAMPLE])
    plan = dataclasses.replace(compiled._executor.plan)
    plan.partitions = [dataclasses.replace(p, backend="example") for p in plan.partitions]
    executor = Executor(plan, loaded=activate_payloads(plan, trusted=True))
    assert [u.kind for u in executor.units] == ["example", "instructions", "example"]
    feeds = {"x": np.full((3, 8), 0.5, np.float32), "y": np.ones((1, 8), np.float32)}
    for name, value in compiled.run(feeds).items():
        np.testing.assert_array_equal(executor.run(feeds)[name], value)


@pytest.mark.parametrize("batch, prepared", [(2, True), ("N", False)])
def test_convolutions_are_prepared_once_where_shapes_are_static(tmp_path, batch, prepared):
    """A Conv with bias and Relu (fused by the passes) and a strided, padded, grouped Conv:
    their geometry is worked out once with static shapes. Checked against onnxruntime."""
    from nncc.kernels.registry import by_key

    rng = np.random.default_rng(4)

    def weight(name, *shape):
        return onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], strides=[2, 2], pads=[0, 1, 1, 0], group=2)]
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", F, [batch, 3, 9, 9])],
                              [helper.make_tensor_value_info("y", F, None)],
                              [weight("w1", 4, 3, 3, 3), weight("b1", 4), weight("w2", 6, 2, 3, 3)])
    path = tmp_path / "convs.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    model = nncc.compile_model(path, backends=["numpy"])
    plan = model._executor.plan
    assert [by_key(k).op_type for k in plan.kernels] == ["FusedConv", "Conv"]
    general = [by_key(plan.kernels[ins.kernel]).fn for ins in plan.instructions]
    assert [step[0] is not g for step, g in zip(model._executor.steps, general)] == [prepared] * 2
    x = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    want = ort_run(path, {"x": x})[0]
    for _ in range(2):
        np.testing.assert_allclose(model.run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)
