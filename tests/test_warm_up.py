"""A small model that is one native call is run on zeros while it is prepared
(nncc.runtime.warm_up), so that its first real run finds its code and data warm: the
caller's results are unchanged by it (checked against onnxruntime), the first run's
outputs are the caller's own arrays, and a model above the bound is not run at all."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from nncc.model import prepare
from nncc.native.toolchain import find_toolchain
from nncc.runtime.warm_up import WARM_UP_BYTES, WARM_UP_RUNS
from tests.models import mlp
from tests.oracle import ort_outputs

needs_cc = pytest.mark.skipif(find_toolchain() is None,
                              reason="no C compiler on this machine: no native plan can be built")


def _prepared_twice(path, cache):
    prepare(path, cache_dir=cache, stage="optimized")
    model, outcome = prepare(path, cache_dir=cache, stage="optimized")
    assert outcome.outcome == "hit" and model.native_partitions == 1
    return model


@pytest.mark.slow
@needs_cc
def test_a_small_native_model_is_warmed_up_and_its_first_results_are_the_callers_and_right(tmp_path):
    path = tmp_path / "mlp.onnx"
    path.write_bytes(mlp([8, 64], 128, 10, seed=5, second_bias=True).SerializeToString())
    model = _prepared_twice(path, tmp_path / "cache")
    assert 1 <= model.warmed_up <= WARM_UP_RUNS
    rng = np.random.default_rng(2)
    first_feeds = {"x": rng.standard_normal((8, 64)).astype(np.float32)}
    second_feeds = {"x": rng.standard_normal((8, 64)).astype(np.float32)}
    first = model.run(first_feeds)["y"]
    kept = first.copy()
    second = model.run(second_feeds)["y"]
    assert second is not first
    np.testing.assert_array_equal(first, kept)  # no later run (nor the warm-up) writes into the caller's array
    np.testing.assert_allclose(first, ort_outputs(path, first_feeds)["y"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(second, ort_outputs(path, second_feeds)["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@needs_cc
def test_integer_indices_warmed_up_as_zeros_leave_the_gather_results_right(tmp_path):
    rng = np.random.default_rng(7)
    table = rng.standard_normal((20, 16)).astype(np.float32)
    weight = rng.standard_normal((16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
         helper.make_node("MatMul", ["rows", "w"], ["y"])],
        "embed", [helper.make_tensor_value_info("ids", TensorProto.INT64, [6, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 3, 8])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(weight, "w")])
    path = tmp_path / "embed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    model = _prepared_twice(path, tmp_path / "cache")
    assert model.warmed_up >= 1
    feeds = {"ids": rng.integers(0, 20, (6, 3)).astype(np.int64)}
    np.testing.assert_allclose(model.run(feeds)["y"], ort_outputs(path, feeds)["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@needs_cc
def test_a_model_whose_run_touches_more_than_the_bound_is_not_run_ahead(tmp_path):
    hidden = 2048
    assert 64 * hidden * 4 * 2 < WARM_UP_BYTES < (hidden * hidden) * 4  # the second weight alone is over it
    path = tmp_path / "wide.onnx"
    path.write_bytes(mlp([2, 64], hidden, hidden, seed=1, scale=hidden ** -0.5).SerializeToString())  # outputs near 1
    model = _prepared_twice(path, tmp_path / "cache")
    assert model.warmed_up == 0
    feeds = {"x": np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)}
    np.testing.assert_allclose(model.run(feeds)["y"], ort_outputs(path, feeds)["y"], rtol=1e-4, atol=1e-4)
