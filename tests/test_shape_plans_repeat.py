"""A dynamic model's run whose input shapes equal the last run's reuses that run's plan
without looking it up again (nncc.runtime.specialize.ShapePlans): every run still gets its
own shape's plan when the shapes alternate, the least recently used order stays that of
the runs, and a plan delivered later for the same shape (its native plan, built in the
background) takes over from the next run. Outputs are checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from nncc.model import CompiledModel, compile_model, compile_plan
from nncc.native.toolchain import find_toolchain
from tests.conftest import ROOT
from tests.oracle import ort_run

TRANSFORMER = ROOT / "fixtures" / "transformer.onnx"  # tokens [1, S, 64] -> hidden


class HeldBuilds:
    """The cache side of a dynamic model's native plans (``natives`` of ShapePlans), as a
    cache without the shape's entry: a lookup finds nothing, and a build is held until the
    test delivers it, so it lands exactly between two runs."""

    exact = True
    builds_native = True

    def __init__(self):
        self.waiting: dict[tuple, object] = {}  # the sizes asked for -> their deliver

    def find(self, dims):
        return None

    def build(self, dims, deliver):
        self.waiting[tuple(sorted(dims.items()))] = deliver


def _tokens(length: int, seed: int) -> dict[str, np.ndarray]:
    return {"tokens": np.random.default_rng(seed).standard_normal((1, length, 64)).astype(np.float32)}


def _check(model, feeds) -> None:
    (want,) = ort_run(TRANSFORMER, feeds, ["hidden"])
    np.testing.assert_allclose(model.run(feeds)["hidden"], want, rtol=1e-4, atol=1e-5)


def _model(natives=None) -> CompiledModel:
    return CompiledModel(compile_plan(TRANSFORMER, None, {"backends": ("numpy",)}), trust_native=True,
                         natives=natives, shape_plans_limit=4)


def test_alternating_shapes_each_run_their_own_plan_in_run_order():
    model = _model()
    for length in (7, 7, 12, 12):  # each shape's second run gives it a plan of its own
        _check(model, _tokens(length, length))
    plans = {length: model._shape_plans._plans[((1, length, 64),)] for length in (7, 12)}
    assert plans[7] is not plans[12] and None not in plans.values()
    for seed, length in enumerate((7, 7, 12, 7, 12, 12, 7)):
        _check(model, _tokens(length, 100 + seed))
        assert model._last is plans[length]
    assert model.shape_plans == [((1, 12, 64),), ((1, 7, 64),)]  # 7 ran last: the most recently used


def test_a_shape_never_specialised_keeps_counting_its_runs():
    model = _model()
    _check(model, _tokens(5, 0))
    assert model.shape_plans == []
    _check(model, _tokens(5, 1))  # the same shape again is its second run, not a remembered general plan
    assert model.shape_plans == [((1, 5, 64),)]


@pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: no native plan to deliver")
def test_a_native_plan_delivered_for_the_last_shape_runs_from_the_next_run():
    natives = HeldBuilds()
    model = _model(natives)
    for seed in range(3):  # asks for S=9's native plan, then runs its portable plan (the last one twice)
        _check(model, _tokens(9, seed))
    portable = model._last
    assert portable is not model.executor and portable.native_partitions == 0
    native = compile_model(TRANSFORMER, dims={"S": 9}).executor
    assert native.native_partitions >= 1
    natives.waiting[(("S", 9),)](native)  # the background build lands between two runs
    _check(model, _tokens(9, 3))
    assert model._last is native
    assert model.last_run_native_partitions == native.native_partitions
