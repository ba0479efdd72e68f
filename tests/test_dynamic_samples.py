"""The batch axis as a run-time size (nncc.runtime.sample_axis, nncc.runtime.sample_loop): a
model whose symbolic batch dimension N only separates samples runs every N through the
native plan compiled for N = 1, one run per sample; a model where N mixes samples, or is
used as data, is rejected and still right through the general plan. Every output is
checked against onnxruntime, at several N including one that is not a power of two."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from nncc.model import compile_model, prepare
from nncc.native.toolchain import find_toolchain
from tests.models import GraphBuilder
from tests.oracle import ort_outputs

needs_cc = pytest.mark.skipif(find_toolchain() is None,
                              reason="no C compiler on this machine: no native plan can be built")

SIZES = (1, 2, 5, 7)


def _dynamic(builder: GraphBuilder, path, dims: dict[int, str], **axes) -> None:
    """Save ``builder``'s model with input axes made symbolic: ``dims`` (axis -> name) for
    every input, or per input name as keyword arguments."""
    model = builder.save(path)
    for value in model.graph.input:
        for axis, name in axes.get(value.name, dims).items():
            value.type.tensor_type.shape.dim[axis].dim_param = name
    onnx.save(model, path)


def _feeds(builder: GraphBuilder, sizes: dict[str, dict[int, int]], seed: int):
    """Random feeds shaped like the builder's, with the given axes resized."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, value in builder.feeds.items():
        shape = list(value.shape)
        for axis, size in sizes.get(name, {}).items():
            shape[axis] = size
        feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _check(model, path, feeds, rtol=1e-4, atol=1e-5):
    want = ort_outputs(path, feeds)
    got = model.run(feeds)
    for name, expected in want.items():
        np.testing.assert_allclose(got[name], expected, rtol=rtol, atol=atol, err_msg=name)


def mlp(path):
    b = GraphBuilder(seed=1)
    x = b.input((3, 16))
    h = b.node("Gemm", [x, b.weight((24, 16)), b.weight((24,))], transB=1)
    h = b.node("Relu", [h])
    h = b.node("MatMul", [h, b.weight((24, 10))])
    h = b.node("Add", [h, b.weight((10,))])
    b.output(b.node("Softmax", [h], axis=-1))
    _dynamic(b, path, {0: "N"})
    return b


def mlp_batchnorm(path):
    """A tabular MLP as exported: BatchNormalization over the features of [N, F] rows, which
    compiles to a per-channel scale and shift (the channel is axis 1, the batch axis 0)."""
    b = GraphBuilder(seed=4)
    x = b.input((3, 16))
    h = b.node("Gemm", [x, b.weight((24, 16)), b.weight((24,))], transB=1)
    h = b.node("BatchNormalization", [h, b.const(np.linspace(0.5, 1.5, 24)), b.const(np.full(24, 0.1)),
                                      b.const(np.linspace(-0.2, 0.2, 24)), b.const(np.full(24, 0.9))])
    h = b.node("Relu", [h])
    b.output(b.node("Gemm", [h, b.weight((4, 24)), b.weight((4,))], transB=1))
    _dynamic(b, path, {0: "N"})
    return b


def convnet(path):
    b = GraphBuilder(seed=2)
    x = b.input((2, 3, 12, 12))
    h = b.node("Conv", [x, b.weight((8, 3, 3, 3)), b.weight((8,))], pads=[1, 1, 1, 1])
    h = b.node("Relu", [h])
    h = b.node("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])
    h = b.node("Conv", [h, b.weight((8, 8, 3, 3))], pads=[1, 1, 1, 1])
    h = b.node("BatchNormalization", [h, b.const(np.full(8, 1.1)), b.const(np.full(8, 0.1)),
                                      b.const(np.linspace(-0.2, 0.2, 8)), b.const(np.full(8, 0.9))])
    h = b.node("Relu", [h])
    h = b.node("Flatten", [h], axis=1)  # [N, 8 * 6 * 6]
    b.output(b.node("Gemm", [h, b.weight((5, 288)), b.weight((5,))], transB=1))
    _dynamic(b, path, {0: "N"})
    return b


def transformer(path, dim=16, heads=2):
    """A pre-norm attention block over x [N, S, dim]; the head split and merge read N and S
    from Shape, as exports write them."""
    b = GraphBuilder(seed=3)
    x = b.input((2, 5, dim))
    h = b.node("LayerNormalization", [x, b.const(np.ones(dim)), b.const(np.zeros(dim))], axis=-1)
    shape = b.node("Shape", [x])
    n = b.node("Gather", [shape, b.const([0], np.int64)], axis=0)
    s = b.node("Gather", [shape, b.const([1], np.int64)], axis=0)
    split = b.node("Concat", [n, s, b.const([heads, dim // heads], np.int64)], axis=0)
    merge = b.node("Concat", [n, s, b.const([dim], np.int64)], axis=0)

    def heads_of(weight, perm):
        y = b.node("MatMul", [h, weight])
        return b.node("Transpose", [b.node("Reshape", [y, split])], perm=perm)

    q = heads_of(b.weight((dim, dim)), [0, 2, 1, 3])  # [N, H, S, d]
    k = heads_of(b.weight((dim, dim)), [0, 2, 3, 1])  # [N, H, d, S]
    v = heads_of(b.weight((dim, dim)), [0, 2, 1, 3])
    scores = b.node("Div", [b.node("MatMul", [q, k]), b.const(np.sqrt(dim // heads))])
    attended = b.node("MatMul", [b.node("Softmax", [scores], axis=-1), v])  # [N, H, S, d]
    merged = b.node("Reshape", [b.node("Transpose", [attended], perm=[0, 2, 1, 3]), merge])
    out = b.node("Add", [x, b.node("MatMul", [merged, b.weight((dim, dim))])])
    b.output(out)
    _dynamic(b, path, {0: "N", 1: "S"})
    return b


@needs_cc
@pytest.mark.parametrize("make", [mlp, mlp_batchnorm, convnet], ids=["mlp", "mlp_batchnorm", "convnet"])
def test_a_sample_axis_runs_every_batch_size_through_the_native_plan_for_one(tmp_path, make):
    path = tmp_path / "model.onnx"
    builder = make(path)
    model = compile_model(path)
    assert model.native_partitions == 0  # the general plan, dynamic in N, has none
    for n in SIZES:
        _check(model, path, _feeds(builder, {"x0": {0: n}}, seed=n))
        assert model.last_run_native_partitions >= 1, n  # the loop over the plan for N = 1 ran
    assert model.sample_axes == ["N"]
    for n in (7, 2):  # recurring sizes: the loop and the portable plan each run, timed, then the faster
        for seed in range(5):
            _check(model, path, _feeds(builder, {"x0": {0: n}}, seed=10 * seed + n))


@pytest.mark.slow
@needs_cc
def test_a_transformer_block_separates_its_batch_but_not_its_sequence(tmp_path):
    path = tmp_path / "block.onnx"
    builder = transformer(path)
    model = compile_model(path)
    for length in (5, 3):
        for n in SIZES:
            _check(model, path, _feeds(builder, {"x0": {0: n, 1: length}}, seed=n * 10 + length))
            assert model.last_run_native_partitions >= 1, (n, length)
    assert model.sample_axes == ["N"]  # S mixes positions through the attention


@needs_cc
def test_two_batched_inputs_multiplied_sample_by_sample(tmp_path):
    path = tmp_path / "bmm.onnx"
    b = GraphBuilder(seed=8)
    x, y = b.input((2, 4, 8)), b.input((2, 8, 3))
    b.output(b.node("Relu", [b.node("MatMul", [x, y])]))
    _dynamic(b, path, {0: "N"})
    model = compile_model(path)
    for n in SIZES:
        _check(model, path, _feeds(b, {"x0": {0: n}, "x1": {0: n}}, seed=n))
        assert model.last_run_native_partitions >= 1, n
    assert model.sample_axes == ["N"]


def test_the_sample_loop_fills_caller_output_buffers(tmp_path):
    path = tmp_path / "mlp.onnx"
    builder = mlp(path)
    model = compile_model(path)
    feeds = _feeds(builder, {"x0": {0: 6}}, seed=4)
    want = ort_outputs(path, feeds)
    name = next(iter(want))
    out = np.full((6, 10), np.nan, np.float32)
    got = model.run(feeds, outputs={name: out})
    assert got[name] is out
    np.testing.assert_allclose(out, want[name], rtol=1e-4, atol=1e-5)


def _rejected_models():
    """Models where N is no sample axis, each with why."""

    def folded(b, x):  # the batch folded into the features: out[4N]
        return b.node("Mul", [b.node("Reshape", [x, b.const([-1], np.int64)]), b.const(2.0)])

    def batch_mean(b, x):  # every sample minus the mean over the batch
        return b.node("Sub", [x, b.node("ReduceMean", [x, b.const([0], np.int64)], keepdims=1)])

    def per_count(b, x):  # x / N, N read from Shape and used as data
        n = b.node("Gather", [b.node("Shape", [x]), b.const(0, np.int64)], axis=0)
        return b.node("Div", [x, b.node("Cast", [n], to=onnx.TensorProto.FLOAT)])

    def inward(b, x):  # [N, 3, 4] -> [3, N, 4]
        return b.node("Transpose", [b.node("Reshape", [x, b.const([-1, 3, 4], np.int64)])], perm=[1, 0, 2])

    def stacked(b, x):  # [x; 2x] along the batch axis
        return b.node("Concat", [x, b.node("Mul", [x, b.const(2.0)])], axis=0)

    def flattened_softmax(b, x):  # [N, 12] -> [1, 12N], normalised over every sample at once
        return b.node("Softmax", [b.node("Reshape", [x, b.const([1, -1], np.int64)])], axis=-1)

    def gram(b, x):  # x^T x: the product contracts the batch axis
        return b.node("MatMul", [b.node("Transpose", [x], perm=[1, 0]), x])

    def positions(b, x):  # x + b for sample b: Range(0, N) used as data
        n = b.node("Gather", [b.node("Shape", [x]), b.const(0, np.int64)], axis=0)
        ramp = b.node("Range", [b.const(0, np.int64), n, b.const(1, np.int64)])
        ramp = b.node("Unsqueeze", [b.node("Cast", [ramp], to=onnx.TensorProto.FLOAT), b.const([1], np.int64)])
        return b.node("Add", [x, ramp])

    return {"folded": folded, "batch_mean": batch_mean, "per_count": per_count, "inward": inward,
            "stacked": stacked, "flattened_softmax": flattened_softmax, "gram": gram, "positions": positions}


@pytest.mark.parametrize("name", sorted(_rejected_models()))
def test_a_dimension_that_mixes_samples_is_rejected_and_still_right(tmp_path, name):
    path = tmp_path / f"{name}.onnx"
    b = GraphBuilder(seed=5)
    x = b.input((2, 12))
    b.output(b.node("Relu", [_rejected_models()[name](b, x)]))
    _dynamic(b, path, {0: "N"})
    model = compile_model(path)
    for n in (1, 2, 5, 7, 5):
        _check(model, path, _feeds(b, {"x0": {0: n}}, seed=n))
    assert model.sample_axes == []
    # no plan for one sample runs it: the general plan does (its static scalar arithmetic,
    # such as a Cast of the batch size, may itself be native)
    assert model.last_run_native_partitions == model.native_partitions


def test_rejections_say_why(tmp_path):
    from nncc.runtime.sample_axis import Rejected, find_separation

    path = tmp_path / "mean.onnx"
    b = GraphBuilder(seed=6)
    x = b.input((2, 4))
    b.output(b.node("Sub", [x, b.node("ReduceMean", [x, b.const([0], np.int64)], keepdims=1)]))
    _dynamic(b, path, {0: "N"})
    general = compile_model(path, backends=("numpy",)).executor
    slot = general.plan.inputs[0]
    with pytest.raises(Rejected, match="reduces along the batch axis"):
        find_separation(general.plan, lambda n: {slot: (n, 4)}, "N", general.decode_attr)


@needs_cc
def test_prepare_runs_the_cached_plan_for_one_sample_at_every_size_from_the_first_run(tmp_path):
    path = tmp_path / "convnet.onnx"
    builder = convnet(path)
    cache = tmp_path / "cache"
    one, _ = prepare(path, cache_dir=cache, stage="optimized", dims={"N": 1})  # as `nncc compile --dim N=1`
    assert one.native_partitions >= 1
    model, _ = prepare(path, cache_dir=cache)  # conftest turns background builds off: only the lookup serves
    for n in (3, 6):
        _check(model, path, _feeds(builder, {"x0": {0: n}}, seed=n))
        assert model.last_run_native_partitions == one.native_partitions


@pytest.mark.slow
@needs_cc
def test_prepare_builds_the_plan_for_one_sample_in_the_background(tmp_path, monkeypatch):
    import threading

    monkeypatch.setenv("NNCC_UPGRADE_AFTER", "2")
    path = tmp_path / "mlp.onnx"
    builder = mlp(path)
    model, _ = prepare(path, cache_dir=tmp_path / "cache")
    _check(model, path, _feeds(builder, {"x0": {0: 4}}, seed=1))  # portable; the plan for N = 1 is asked for
    for seed in (1, 2):  # a size run twice before it is ready gets its portable plan
        _check(model, path, _feeds(builder, {"x0": {0: 6}}, seed=seed))
    for thread in threading.enumerate():
        if thread.name.startswith("nncc-shape-"):
            thread.join()
    native = []
    for seed in range(4):  # ... and once it is ready, the loop and that plan each run, timed, then the faster
        _check(model, path, _feeds(builder, {"x0": {0: 6}}, seed=seed + 3))
        native.append(model.last_run_native_partitions)
    assert max(native) >= 1, native  # the loop ran
    for n in (4, 9):  # the shape seen before and a new one: both through the loop now
        _check(model, path, _feeds(builder, {"x0": {0: n}}, seed=n + 1))
        assert model.last_run_native_partitions >= 1, n
    for thread in threading.enumerate():  # N = 4 recurred: its own batched plan is on its way
        if thread.name.startswith("nncc-shape-"):
            thread.join()
    _check(model, path, _feeds(builder, {"x0": {0: 4}}, seed=3))
    assert model.last_run_native_partitions >= 1


@pytest.mark.slow
@needs_cc
def test_a_later_process_runs_the_batch_size_an_earlier_one_ran_through_its_own_plan(tmp_path, monkeypatch):
    """The first process of a batch size asks for that size's own native plan as well as the
    plan for one sample, so a later process's prepare keeps it and its first run of that
    size needs no lookup, no sample-axis analysis and no loop."""
    import threading

    monkeypatch.setenv("NNCC_UPGRADE_AFTER", "0")
    path = tmp_path / "mlp.onnx"
    builder = mlp(path)
    cache = tmp_path / "cache"
    first, _ = prepare(path, cache_dir=cache)
    _check(first, path, _feeds(builder, {"x0": {0: 5}}, seed=1))
    for thread in threading.enumerate():
        if thread.name.startswith("nncc-"):
            thread.join()
    later, outcome = prepare(path, cache_dir=cache)
    assert outcome.outcome == "hit"
    assert ((5, 16),) in later.shape_plans, later.shape_plans  # kept by the prepare, before any run
    _check(later, path, _feeds(builder, {"x0": {0: 5}}, seed=2))
    assert later.last_run_native_partitions >= 1
    assert later.shape_plans[-1] == ((5, 16),)  # its own plan ran, not the loop over the plan for one sample


def test_inspect_says_which_dims_are_sample_axes(tmp_path, cli):
    import json

    separable, mixing = tmp_path / "mlp.onnx", tmp_path / "stacked.onnx"
    mlp(separable)
    b = GraphBuilder(seed=7)
    x = b.input((2, 12))
    b.output(_rejected_models()["stacked"](b, x))
    _dynamic(b, mixing, {0: "N"})
    code, out, _ = cli("inspect", separable, "--json")
    assert code == 0
    assert json.loads(out)["sample_axes"]["N"]["sample_axis"] is True
    code, out, _ = cli("inspect", mixing, "--json")
    assert code == 0
    found = json.loads(out)["sample_axes"]["N"]
    assert found["sample_axis"] is False and "along the batch axis" in found["reason"]
    code, out, _ = cli("inspect", separable)
    assert code == 0 and "N: a sample axis" in " ".join(out.split())


@needs_cc
def test_without_the_cache_prepare_compiles_the_plan_for_one_sample_as_compile_model_does(tmp_path):
    path = tmp_path / "mlp.onnx"
    builder = mlp(path)
    model, outcome = prepare(path, use_cache=False)
    assert outcome.outcome == "disabled"
    for n in (3, 5):
        _check(model, path, _feeds(builder, {"x0": {0: n}}, seed=n))
        assert model.last_run_native_partitions >= 1, n
