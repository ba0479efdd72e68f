"""A tabular model's integer index paths in native code: categorical columns picked out of
an int64 or int32 input by constant indices (a negative one among them), each looked up in
an embedding table, concatenated with numeric columns into a Gemm. The whole model is one
native partition, at a fixed batch and through the plan for one sample at any batch, and
gives onnxruntime's outputs; an id outside its table fails the run with one clear error
(exit 2 from the CLI), natively as portably, and never reads outside the table."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

import nncc
from nncc.errors import IndexRangeError
from nncc.native.toolchain import find_toolchain
from nncc.report import describe_plan
from tests.models import GraphBuilder
from tests.oracle import ort_run

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")

ROWS, WIDTH, NUMERIC = 11, 6, 5  # table rows, embedding width, numeric columns
COLUMNS = [0, 2, -1]  # the categorical columns looked up, of 4 (-1: the last, counted from the end)
INT_TYPES = {np.int64: TensorProto.INT64, np.int32: TensorProto.INT32}


def tabular(batch, dtype=np.int64, seed: int = 3) -> GraphBuilder:
    """``batch``: a size, or a name for a symbolic batch dimension. The feeds have 7 rows
    when the batch is symbolic; ids run over the tables' rows, negative ones included."""
    m = GraphBuilder(18, seed, "tabular")
    rows = batch if isinstance(batch, int) else 7
    m.inputs.append(helper.make_tensor_value_info("categorical", INT_TYPES[dtype], [batch, 4]))
    m.feeds["categorical"] = m.rng.integers(-ROWS, ROWS, (rows, 4)).astype(dtype)
    m.inputs.append(helper.make_tensor_value_info("numeric", TensorProto.FLOAT, [batch, NUMERIC]))
    m.feeds["numeric"] = m.rng.standard_normal((rows, NUMERIC)).astype(np.float32)
    looked_up = []
    for column in COLUMNS:
        ids = m.node("Gather", ["categorical", m.ints(column)], axis=1)
        looked_up.append(m.node("Gather", [m.weight([ROWS, WIDTH]), ids]))
    features = m.node("Concat", [*looked_up, "numeric"], axis=1)
    hidden = m.node("Relu", [m.node("Gemm", [features, m.weight([8, len(COLUMNS) * WIDTH + NUMERIC]),
                                              m.weight([8])], transB=1)])
    m.output(m.node("Gemm", [hidden, m.weight([1, 8]), m.weight([1])], transB=1))
    return m


def one_native_partition(plan) -> None:
    """What `nncc inspect` reports: one partition, native code, nothing left portable."""
    facts = describe_plan(plan)
    assert [p["native"] for p in facts["partitions"]] == [True], facts["partitions"]
    assert plan.fallbacks == []


def compare(got, want) -> None:
    # the rows are copied exactly; the Gemms' sums may round in another order than onnxruntime's
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("batch", [1, 7, 32])
def test_picked_columns_and_their_embeddings_are_one_native_partition(tmp_path, batch, dtype):
    m = tabular(batch, dtype)
    path = tmp_path / "m.onnx"
    m.save(path)
    compiled = nncc.compile_model(path)
    one_native_partition(compiled.plan)
    name = m.outputs[0].name
    (want,) = ort_run(path, m.feeds, [name])
    compare(compiled.run(m.feeds)[name], want)


@pytest.mark.parametrize("opt_level", [0, 2])
def test_casts_slices_views_and_joins_between_the_picks_and_the_lookup_stay_native(tmp_path, opt_level):
    """int32 ids cast to int64, a run of columns sliced off, two of them picked and joined,
    flattened, squeezed and unsqueezed, then looked up: the rows onnxruntime gives, exactly."""
    m = GraphBuilder(18, 4, "joined")
    m.inputs.append(helper.make_tensor_value_info("categorical", TensorProto.INT32, [7, 4]))
    m.feeds["categorical"] = m.rng.integers(-ROWS, ROWS, (7, 4)).astype(np.int32)
    ids = m.node("Cast", ["categorical"], to=TensorProto.INT64)
    ids = m.node("Slice", [ids, m.ints([1]), m.ints([4]), m.ints([1])])  # columns 1 to 3
    joined = m.node("Concat", [m.node("Gather", [ids, m.ints([0])], axis=1),
                               m.node("Gather", [ids, m.ints([-1])], axis=1)], axis=1)
    flat = m.node("Squeeze", [m.node("Flatten", [joined], axis=0), m.ints([0])])
    rows = m.node("Gather", [m.weight([ROWS, WIDTH]), m.node("Unsqueeze", [flat, m.ints([1])])])
    m.output(m.node("Relu", [rows]))
    path = tmp_path / "m.onnx"
    m.save(path)
    compiled = nncc.compile_model(path, opt_level=opt_level)
    one_native_partition(compiled.plan)
    name = m.outputs[0].name
    (want,) = ort_run(path, m.feeds, [name])
    np.testing.assert_array_equal(compiled.run(m.feeds)[name], want)


def test_a_dynamic_batch_runs_the_native_plan_of_one_sample(tmp_path):
    m = tabular("batch")
    path = tmp_path / "m.onnx"
    m.save(path)
    one_native_partition(nncc.compile_model(path, dims={"batch": 1}).plan)
    compiled = nncc.compile_model(path)
    name = m.outputs[0].name
    rng = np.random.default_rng(9)
    for rows in (1, 7, 32, 7):
        feeds = {"categorical": rng.integers(-ROWS, ROWS, (rows, 4)).astype(np.int64),
                 "numeric": rng.standard_normal((rows, NUMERIC)).astype(np.float32)}
        got = compiled.run(feeds)[name]
        assert compiled.last_run_native_partitions == 1, rows
        (want,) = ort_run(path, feeds, [name])
        compare(got, want)


def out_of_range(m: GraphBuilder) -> list[dict]:
    """The model's feeds with one id past each end of the tables, and one far past."""
    feeds = []
    for bad in (ROWS, -ROWS - 1, 2**40):
        ids = m.feeds["categorical"].copy()
        ids[-1, 2] = bad  # column 2: looked up
        feeds.append({**m.feeds, "categorical": ids})
    return feeds


@pytest.mark.slow
def test_an_id_outside_its_table_fails_the_run_with_a_clear_error(tmp_path):
    m = tabular(4)
    path = tmp_path / "m.onnx"
    m.save(path)
    compiled = nncc.compile_model(path)
    portable = nncc.compile_model(path, backends=("numpy",))
    assert compiled.native_partitions == 1 and portable.native_partitions == 0
    name = m.outputs[0].name
    for feeds in out_of_range(m):
        for model in (compiled, portable):
            with pytest.raises(IndexRangeError, match="out of range"):
                model.run(feeds)
    # a refused run leaves the model as it was
    (want,) = ort_run(path, m.feeds, [name])
    compare(compiled.run(m.feeds)[name], want)


@pytest.mark.slow
@pytest.mark.parametrize("route", [["--stage", "optimized"], ["--backend", "numpy"]], ids=["native", "portable"])
def test_the_cli_refuses_an_id_outside_its_table_in_one_line_with_exit_2(tmp_path, route):
    m = tabular(4)
    path = tmp_path / "m.onnx"
    m.save(path)
    np.savez(tmp_path / "feeds.npz", **out_of_range(m)[0])
    run = subprocess.run([sys.executable, "-m", "nncc", "run", str(path), "--inputs", str(tmp_path / "feeds.npz"),
                          "--cache-dir", str(tmp_path / "cache"), *route], capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("nncc: error:")]  # after the cache's note
    assert len(errors) == 1 and "out of range" in errors[0] and "Traceback" not in run.stderr, run.stderr
