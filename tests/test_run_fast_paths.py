"""The per-run fast paths of a small native model (feeds that match the last ones that
passed skip their checks; a native call's outputs are stored without the general path)
keep every promise of the slow ones: results right against onnxruntime, every run's
outputs fresh arrays the caller owns, and changed feeds checked again in full."""

from __future__ import annotations

import numpy as np
import pytest

import nncc
from nncc.errors import InputError
from nncc.native.toolchain import find_toolchain
from tests.models import GraphBuilder
from tests.oracle import ort_run


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Gemm 16x16 (bias) + Relu over [1, 16], and a second output (Sigmoid) from the Gemm."""
    g = GraphBuilder(seed=4)
    x = g.input((1, 16))
    y = g.node("Gemm", [x, g.weight((16, 16)), g.const(np.linspace(-1, 1, 16))])
    g.output(g.node("Relu", [y]))
    g.output(g.node("Sigmoid", [y]))
    path = tmp_path_factory.mktemp("small") / "small.onnx"
    g.save(path)
    return path


@pytest.fixture(scope="module", params=["native", "portable"])
def model(request, small, module_isolated):
    """One prepared model per route for the whole file: each test feeds it as a caller would,
    whatever runs came before (the fast paths' promises hold after any history)."""
    if request.param == "native" and find_toolchain() is None:
        pytest.skip("no C compiler: there is no native plan to run")
    stage = "optimized" if request.param == "native" else "quick"
    model, _ = nncc.prepare(small, stage=stage, background=None)
    assert (model.native_partitions >= 1) == (request.param == "native")
    return model


def test_outputs_are_right_and_never_shared_between_runs(model, small):
    rng = np.random.default_rng(0)
    seen = []
    for _ in range(4):
        x = rng.standard_normal((1, 16)).astype(np.float32)
        got = model.run({"x0": x})
        for value, want in zip(got.values(), ort_run(small, {"x0": x})):
            np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)
        seen.append((got, {k: v.copy() for k, v in got.items()}))
    for got, kept in seen:  # later runs wrote nothing into an earlier run's arrays
        for name in got:
            np.testing.assert_array_equal(got[name], kept[name])
    assert len({id(got[name]) for got, _ in seen for name in got}) == 4 * 2


def test_the_same_array_fed_again_gives_the_new_values(model, small):
    x = np.zeros((1, 16), np.float32)
    model.run({"x0": x})
    x[:] = np.arange(16, dtype=np.float32) / 8 - 1  # in place: the same object, new contents
    got = list(model.run({"x0": x}).values())
    np.testing.assert_allclose(got[0], ort_run(small, {"x0": x})[0], rtol=1e-5, atol=1e-6)


def test_the_same_strided_view_fed_again_gives_its_base_arrays_new_values(model, small):
    """A view the native call cannot read in place is copied; the copy is of this run's
    values: the same view object fed again after its base changed gives the new results."""
    base = np.zeros((1, 32), np.float32)
    view = base[:, ::2]
    model.run({"x0": view})
    base[:] = np.linspace(-2, 2, 32, dtype=np.float32)  # the view's values change, the object stays
    got = list(model.run({"x0": view}).values())
    np.testing.assert_allclose(got[0], ort_run(small, {"x0": np.ascontiguousarray(view)})[0], rtol=1e-5, atol=1e-6)


def test_changed_feeds_are_checked_again_after_one_passed(model):
    x = np.ones((1, 16), np.float32)
    model.run({"x0": x})
    with pytest.raises(InputError, match="dtype float64"):
        model.run({"x0": x.astype(np.float64)})
    with pytest.raises(InputError, match="shape"):
        model.run({"x0": np.ones((2, 16), np.float32)})
    with pytest.raises(InputError, match="missing input"):
        model.run({})
    with pytest.raises(InputError, match="unknown input"):
        model.run({"x0": x, "y": x})
    model.run({"x0": x[:, ::1]})  # a view of the same dtype and shape passes as before


def test_caller_outputs_still_receive_the_results(model, small):
    x = np.full((1, 16), 0.5, np.float32)
    names = list(model.output_infos)
    target = np.empty((1, 16), np.float32)
    got = model.run({"x0": x}, outputs={names[0]: target})
    assert got[names[0]] is target
    np.testing.assert_allclose(target, ort_run(small, {"x0": x})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op, attrs", [("Relu", {}), ("Softmax", {"axis": 1}), ("Erf", {})])
def test_a_model_of_one_step_runs_it_directly_and_keeps_every_promise(tmp_path, op, attrs):
    """One portable step writing into its planned output: each run's results right, and
    the caller's alone (the native model of one call is the ``model`` fixture's)."""
    g = GraphBuilder(seed=6, opset=18)
    x = g.input((4, 6))
    g.output(g.node(op, [x], **attrs))
    path = tmp_path / f"{op}.onnx"
    g.save(path)
    model = nncc.compile_model(path, backends=("numpy",))
    assert model.executor._one_call is not None  # the path under test
    names = [o.name for o in g.outputs]
    kept = []
    for seed in range(3):
        feeds = {"x0": np.random.default_rng(seed).standard_normal((4, 6)).astype(np.float32)}
        got = model.run(feeds)
        for name, want in zip(names, ort_run(path, feeds, names)):
            np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-7, err_msg=name)
        kept.append((got, {n: v.copy() for n, v in got.items()}))
    for got, copies in kept:  # a later run wrote nothing into an earlier run's results
        for name in names:
            np.testing.assert_array_equal(got[name], copies[name])


def test_a_native_models_constants_are_bound_before_its_first_run(small, monkeypatch, module_isolated):
    """The addresses of a one-call native model's constants (the Gemm's weight and bias)
    are taken when the model is built, so its first run takes only the feed's, as every
    later run does; and that first run is right against onnxruntime."""
    if find_toolchain() is None:
        pytest.skip("no C compiler: there is no native plan to run")
    from nncc.backends.native_step import NativeStep

    taken = []
    original = NativeStep._input_pointer
    monkeypatch.setattr(NativeStep, "_input_pointer",
                        lambda self, array, index: taken.append(index) or original(self, array, index))
    model, _ = nncc.prepare(small, stage="optimized", background=None)
    assert model.native_partitions == 1
    built = len(taken)
    assert built >= 2  # the weight and the bias, bound while the model was built
    x = np.random.default_rng(8).standard_normal((1, 16)).astype(np.float32)
    got = model.run({"x0": x})
    assert len(taken) == built + 1  # the first run takes the feed's address only
    for value, want in zip(got.values(), ort_run(small, {"x0": x})):
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)


def test_a_fixed_size_models_first_run_skips_the_full_feed_check_and_still_refuses_other_feeds(
        small, monkeypatch, module_isolated):
    """Every input of the model is a tensor of known dtype and shape, so its first run's
    feeds pass as a later run's do, without the full check; feeds of another dtype or
    shape, or another name, are still checked in full and refused, on a first run too."""
    import nncc.runtime.feeds as feeds_module

    checked = []
    original = feeds_module.check_feeds
    monkeypatch.setattr(feeds_module, "check_feeds", lambda *a: checked.append(1) or original(*a))
    x = np.random.default_rng(9).standard_normal((1, 16)).astype(np.float32)
    model = nncc.compile_model(small, backends=("numpy",))
    got = model.run({"x0": x})
    assert checked == []  # the first run: no full check
    for value, want in zip(got.values(), ort_run(small, {"x0": x})):
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)
    for bad, message in [({"x0": x.astype(np.float64)}, "dtype float64"), ({"x0": x[:, :8]}, "shape"),
                         ({"x1": x}, "unknown input"), ({}, "missing input")]:
        fresh = nncc.compile_model(small, backends=("numpy",))
        with pytest.raises(InputError, match=message):
            fresh.run(bad)  # its first run
    assert len(checked) == 4


def test_a_native_models_first_outputs_are_made_and_bound_before_its_first_run_then_the_callers(
        small, module_isolated):
    """A one-call native model allocates its first run's outputs when it is built (their
    memory faulted in with the arena, their addresses taken): the first run writes its
    results into those very arrays and hands them to the caller, and every later run
    writes fresh ones, never the caller's."""
    if find_toolchain() is None:
        pytest.skip("no C compiler: there is no native plan to run")
    model, _ = nncc.prepare(small, stage="optimized", background=None)
    executor = model.executor
    assert model.native_partitions == 1 and executor.first_outputs is not None
    made = executor.first_outputs
    step = executor.steps[0][0]
    assert [array.shape for array in made] == [(1, 16), (1, 16)]
    assert all(held is array for held, array in zip(step.held[-len(made):], made))  # bound already
    rng = np.random.default_rng(10)
    x = rng.standard_normal((1, 16)).astype(np.float32)
    first = model.run({"x0": x})
    assert [id(v) for v in first.values()] == [id(a) for a in made]
    assert executor.first_outputs is None
    kept = {name: value.copy() for name, value in first.items()}
    for value, want in zip(first.values(), ort_run(small, {"x0": x})):
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)
    y = rng.standard_normal((1, 16)).astype(np.float32)
    second = model.run({"x0": y})
    assert not any(v is a for v in second.values() for a in made)
    for value, want in zip(second.values(), ort_run(small, {"x0": y})):
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)
    for name in first:  # the second run left the first run's results alone
        np.testing.assert_array_equal(first[name], kept[name])


def test_a_native_models_run_hands_the_call_only_its_feeds_and_keeps_every_promise(small, module_isolated):
    """A one-call native model's run gives the call only the feeds' arrays (its constants
    bound once): a strided view fed in place of a dense array, a fresh array, and a mapping
    that is not a dict (the general path) all give onnxruntime's results, and every run's
    outputs stay the caller's."""
    if find_toolchain() is None:
        pytest.skip("no C compiler: there is no native plan to run")
    from types import MappingProxyType

    model, _ = nncc.prepare(small, stage="optimized", background=None)
    assert model.executor._fed is not None  # the path under test
    rng = np.random.default_rng(9)
    wide = rng.standard_normal((1, 32)).astype(np.float32)
    feeds = [{"x0": wide[:, ::2]}, {"x0": rng.standard_normal((1, 16)).astype(np.float32)},
             MappingProxyType({"x0": rng.standard_normal((1, 16)).astype(np.float32)})]
    kept = []
    for feed in feeds:
        got = model.run(feed)
        for value, want in zip(got.values(), ort_run(small, {"x0": np.ascontiguousarray(feed["x0"])})):
            np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)
        kept.append((got, {n: v.copy() for n, v in got.items()}))
    for got, copies in kept:
        for name, value in got.items():
            np.testing.assert_array_equal(value, copies[name])
