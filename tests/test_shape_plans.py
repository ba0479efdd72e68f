"""Plans per concrete input shape for models with dynamic dimensions (nncc.runtime.specialize,
nncc.preparing.shapes): a shape run twice gets a plan whose values are static and placed in the
arena; values whose shapes depend on data stay dynamic; at most ``run.shape_plans`` are
kept, least recently used out; a model prepared through the cache gets the shape's native
plan built in the background and kept in the cache for the next process. Every output is
checked against onnxruntime."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
from onnx import TensorProto, helper
import pytest

from nncc.model import compile_model, prepare
from tests.conftest import ROOT
from tests.oracle import ort_session


SHAPE_OPS = ROOT / "fixtures" / "shape_ops.onnx"  # x [N, 3, 8, 8]; Shape/Gather/Concat/Reshape, Range, Expand
TRANSFORMER = ROOT / "fixtures" / "transformer.onnx"  # tokens [1, S, 64]


def _oracle(path, feeds):
    session = ort_session(path)
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _check(model, path, feeds):
    expected = _oracle(path, feeds)
    got = model.run(feeds)
    for name, want in expected.items():
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


def _feeds(shape, seed=0):
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def _executor(model, key):
    return model._shape_plans._plans[key]


def test_a_shape_run_twice_gets_a_static_plan_with_planned_buffers():
    model = compile_model(SHAPE_OPS, backends=("numpy",))
    general = model._executor
    _check(model, SHAPE_OPS, _feeds((3, 3, 8, 8)))
    assert model.shape_plans == []  # one run of a shape costs nothing extra
    _check(model, SHAPE_OPS, _feeds((3, 3, 8, 8), seed=1))
    assert model.shape_plans == [((3, 3, 8, 8),)]
    specialised = _executor(model, ((3, 3, 8, 8),))
    slots = specialised.plan.slots
    assert all(s.shape is not None and all(isinstance(d, int) for d in s.shape) for s in slots)
    assert [slots[s].shape for s in specialised.plan.outputs] == [(3, 192), (3, 3, 5, 11)]
    assert len(specialised.buffers) > len(general.buffers)
    for seed in range(2, 4):  # it is the plan that runs from now on, and it stays right
        _check(model, SHAPE_OPS, _feeds((3, 3, 8, 8), seed))
    _check(model, SHAPE_OPS, _feeds((5, 3, 8, 8)))  # another shape: the general plan still runs it


def test_a_sequence_length_axis_transformer_is_specialised_per_length():
    model = compile_model(TRANSFORMER, backends=("numpy",))
    for length in (7, 7, 12, 12, 7):
        feeds = {"tokens": np.random.default_rng(length).standard_normal((1, length, 64)).astype(np.float32)}
        _check(model, TRANSFORMER, feeds)
    assert model.shape_plans == [((1, 12, 64),), ((1, 7, 64),)]  # least recently used first


def test_at_most_the_setting_many_are_kept_least_recently_used_out(monkeypatch):
    monkeypatch.setenv("NNCC_SHAPE_PLANS", "2")
    model = compile_model(SHAPE_OPS, backends=("numpy",))
    for n in (1, 2, 3):
        for seed in (0, 1):
            _check(model, SHAPE_OPS, _feeds((n, 3, 8, 8), seed))
    assert model.shape_plans == [((2, 3, 8, 8),), ((3, 3, 8, 8),)]
    _check(model, SHAPE_OPS, _feeds((2, 3, 8, 8), 5))  # used again: now the most recent
    assert model.shape_plans == [((3, 3, 8, 8),), ((2, 3, 8, 8),)]


def test_off_keeps_every_run_on_the_general_plan(monkeypatch):
    monkeypatch.setenv("NNCC_SHAPE_PLANS", "off")
    model = compile_model(SHAPE_OPS, backends=("numpy",))
    for seed in range(3):
        _check(model, SHAPE_OPS, _feeds((2, 3, 8, 8), seed))
    assert model.shape_plans == []


def test_a_bad_setting_is_one_line_and_exit_2(tmp_path):
    env = dict(os.environ, NNCC_SHAPE_PLANS="many")
    proc = subprocess.run([sys.executable, "-m", "nncc", "run", str(SHAPE_OPS), "--no-cache"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 2
    assert "NNCC_SHAPE_PLANS" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2  # the error, and at most its hint


def _nonzero_model(path):
    """y = x * 2 (static once N is known); idx = NonZero(x > 0) ([2, count]: data decides)."""
    nodes = [helper.make_node("Mul", ["x", "two"], ["y"]),
             helper.make_node("Greater", ["x", "zero"], ["mask"]),
             helper.make_node("NonZero", ["mask"], ["idx"]),
             helper.make_node("Cast", ["idx"], ["idx_f"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["idx_f"], ["total"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "nonzero", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, [2, None]),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, [])],
        initializer=[helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
                     helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
    import onnx

    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_values_whose_shape_depends_on_data_stay_dynamic(tmp_path):
    path = _nonzero_model(tmp_path / "nonzero.onnx")
    model = compile_model(path, backends=("numpy",))
    for seed in range(5):  # one shape, a different count of positive values each run
        _check(model, path, _feeds((3, 4), seed))
    specialised = _executor(model, ((3, 4),))
    slots = {s.name: s for s in specialised.plan.slots}
    assert slots["y"].shape == (3, 4)
    assert not all(isinstance(d, int) for d in slots["idx"].shape)
    counts = {int((_feeds((3, 4), seed)["x"] > 0).sum()) for seed in range(5)}
    assert len(counts) > 1  # the runs above really had different NonZero sizes


def test_caller_output_buffers_and_memory_domains_still_work():
    model = compile_model(SHAPE_OPS, backends=("numpy",))
    feeds = _feeds((2, 3, 8, 8))
    expected = _oracle(SHAPE_OPS, feeds)
    for _ in range(3):
        out = np.empty((2, 192), np.float32)
        got = model.run(feeds, outputs={"flat": out})
        assert got["flat"] is out
        np.testing.assert_allclose(out, expected["flat"], rtol=1e-5)
    assert model.shape_plans == [((2, 3, 8, 8),)]
    buffer = model.allocate([("input", "x")], shape=(2, 3, 8, 8))  # a domain buffer: the general plan's
    buffer.copy_from(feeds["x"])
    got = model.run({"x": buffer})
    np.testing.assert_allclose(got["mixed"], expected["mixed"], rtol=1e-5)


def test_a_wrong_rank_is_still_the_input_error():
    from nncc.errors import InputError

    model = compile_model(SHAPE_OPS, backends=("numpy",))
    for _ in range(2):
        with pytest.raises(InputError, match="x"):
            model.run(_feeds((2, 3, 8)))
    assert model.shape_plans == []


# -- native plans through the cache -------------------------------------------------------------

from nncc.native.toolchain import find_toolchain  # noqa: E402

needs_cc = pytest.mark.skipif(find_toolchain() is None,
                              reason="no C compiler on this machine: no native plan can be built")


def _join_shape_builds():
    for thread in threading.enumerate():
        if thread.name.startswith("nncc-shape-"):
            thread.join()


def _entries(cache):
    import sqlite3

    with sqlite3.connect(cache / "index.sqlite3") as db:
        return db.execute("SELECT COUNT(*) FROM entries").fetchone()[0]


SHAPE_SCRIPT = """
import sys, threading
import numpy as np
from nncc.model import prepare
model, outcome = prepare(sys.argv[1], cache_dir=sys.argv[2])
feeds = {"tokens": np.load(sys.argv[3])}
before = model.native_partitions
model.run(feeds); model.run(feeds)  # the second run of the shape asks for its native plan
[t.join() for t in threading.enumerate() if t.name.startswith("nncc-shape-")]
np.save(sys.argv[4], model.run(feeds)["hidden"])
print(outcome.outcome, before, model._shape_plans._plans[(feeds["tokens"].shape,)].native_partitions)
"""


@pytest.mark.slow
@needs_cc
def test_a_prepared_dynamic_model_gets_the_shape_native_plan_from_the_cache(tmp_path):
    # fresh processes: the token depends on the plugins a process has loaded
    cache = tmp_path / "cache"
    tokens = np.random.default_rng(0).standard_normal((1, 9, 64)).astype(np.float32)
    np.save(tmp_path / "tokens.npy", tokens)
    want = _oracle(TRANSFORMER, {"tokens": tokens})
    env = dict(os.environ, NNCC_UPGRADE_AFTER="2")
    seen = []
    for run in range(2):
        out = tmp_path / f"out{run}.npy"
        proc = subprocess.run([sys.executable, "-c", SHAPE_SCRIPT, str(TRANSFORMER), str(cache),
                               str(tmp_path / "tokens.npy"), str(out)], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        outcome, before, after = proc.stdout.split()
        seen.append(outcome)
        assert int(before) == 0  # dynamic: the general plan has no native code
        assert int(after) >= 1  # the shape's plan does
        np.testing.assert_allclose(np.load(out), want["hidden"], rtol=1e-4, atol=1e-5)
        assert _entries(cache) == 2  # the model's entry and the entry for S=9
    assert seen == ["miss", "hit"]  # the second process compiled nothing: S=9's entry was found


@needs_cc
def test_no_native_plan_is_built_when_upgrades_are_off(tmp_path):
    cache = tmp_path / "cache"  # conftest sets NNCC_UPGRADE_AFTER=off
    model, _ = prepare(TRANSFORMER, cache_dir=cache)
    feeds = {"tokens": np.ones((1, 5, 64), np.float32)}
    for _ in range(3):
        _check(model, TRANSFORMER, feeds)
    _join_shape_builds()
    assert model.shape_plans == [((1, 5, 64),)]
    assert _executor(model, ((1, 5, 64),)).native_partitions == 0
    assert _entries(cache) == 1


@needs_cc
def test_a_cache_folder_removed_since_prepare_is_not_created_again(tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("NNCC_UPGRADE_AFTER", "2")
    cache = tmp_path / "cache"
    model, _ = prepare(TRANSFORMER, cache_dir=cache)
    shutil.rmtree(cache)  # as nncc bench removes its temporary cache
    feeds = {"tokens": np.ones((1, 6, 64), np.float32)}
    for _ in range(3):
        _check(model, TRANSFORMER, feeds)
    _join_shape_builds()
    assert not cache.exists()
    assert model.shape_plans == [((1, 6, 64),)]  # the portable plan for the shape still serves
