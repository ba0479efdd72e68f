"""The executor's static memory plan: intermediates live in one arena allocated once,
steady-state runs allocate nothing for them, views never outlive the memory they read,
and caller-provided output arrays receive results in place."""

import tracemalloc

import numpy as np
import onnx
from onnx import TensorProto, helper
import pytest

import nncc
from nncc.errors import InputError
from tests.conftest import FIXTURES, light_models_dir
from tests.oracle import ort_session


def _oracle(path, feeds):
    session = ort_session(path)
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal([d if isinstance(d, int) else 2 for d in info.shape]).astype(info.dtype)
            for name, info in model.input_infos.items()}


def test_intermediates_are_planned_into_one_arena():
    model = nncc.compile_model(FIXTURES / "resnet_block.onnx", backends=["numpy"])  # the portable executor
    executor = model._executor
    assert executor.buffers, "conv/matmul intermediates should live in the arena"
    for view in executor.buffers.values():
        assert np.shares_memory(view, executor.arena)
    assert model.plan.arena_bytes > 0


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["resnet_block", "mobilenet", "transformer", "mlp"])
def test_steady_state_reuses_buffers_and_stays_correct(fixture):
    path = FIXTURES / f"{fixture}.onnx"
    model = nncc.compile_model(path)
    feeds = _feeds(model)
    targets = {name: np.empty([d if isinstance(d, int) else 2 for d in model._executor.plan.slots[s].shape],
                              model._executor.plan.slots[s].dtype)
               for name, s in zip(model.output_names, model._executor.plan.outputs)}
    arena_before = model._executor.arena.ctypes.data
    model.run(feeds, outputs=targets)  # warm-up: kernels fill their scratch buffers
    expected = _oracle(path, feeds)
    for run in range(3):
        result = model.run(feeds, outputs=targets)
        for name, value in result.items():
            assert value is targets[name]
            np.testing.assert_allclose(value, expected[name], rtol=1e-3, atol=1e-4)
    assert model._executor.arena.ctypes.data == arena_before


@pytest.mark.slow
@pytest.mark.parametrize("backends", [["numpy"], ["native", "numpy"]])
def test_steady_state_allocates_no_activation_buffers(backends):
    # light_resnet50's activations are 0.2-3 MB each. Once warmed up (kernels keep their
    # scratch buffers), a run with its outputs in caller memory allocates none of them:
    # numpy reports its data buffers to tracemalloc, and the transient peak of a whole
    # run stays below 256 KiB (numpy's own small ufunc/BLAS buffers).
    from tests.conftest import light_models_dir

    model = nncc.compile_model(light_models_dir() / "light_resnet50.onnx", backends=backends)
    feeds = _feeds(model)
    targets = {"gpu_0/softmax_1": np.empty((1, 1000), np.float32)}
    model.run(feeds, outputs=targets)
    model.run(feeds, outputs=targets)
    if backends == ["numpy"]:  # activations in the arena
        assert model._executor.arena.nbytes > 8 << 20
    else:  # activations in the native code's workspace, allocated once
        assert model.native_partitions == 1
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        model.run(feeds, outputs=targets)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - before < 256 << 10, peak - before


def test_views_keep_their_source_alive(tmp_path):
    # Conv -> Reshape (a view) -> another Conv long after: the planner must not hand the
    # first Conv's memory to a later buffer while the Reshape view still reads it.
    rng = np.random.default_rng(3)
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, [8, 4, 3, 3], rng.standard_normal(288).astype(np.float32))
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, [8, 8, 3, 3], rng.standard_normal(576).astype(np.float32))
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, -1])
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["a", "shape"], ["flat"]),
        helper.make_node("Conv", ["a", "w2"], ["b"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["b", "w2"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["c", "shape"], ["cflat"]),
        helper.make_node("Add", ["flat", "cflat"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "alias", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 512])], [w1, w2, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "alias.onnx"
    onnx.save(model, path)
    compiled = nncc.compile_model(path, opt_level=0)
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    for _ in range(2):
        got = compiled.run({"x": x})["y"]
        np.testing.assert_allclose(got, _oracle(path, {"x": x})["y"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bad, message", [
    (np.empty((1, 10), np.float64), "dtype"),
    (np.empty((2, 10), np.float32), "shape"),
    (np.empty((1, 20), np.float32)[:, ::2], "C-contiguous"),
    ("readonly", "read-only"),
])
def test_unusable_output_buffers_are_refused_before_running(bad, message):
    model = nncc.compile_model(FIXTURES / "resnet_block.onnx")
    if isinstance(bad, str):
        bad = np.empty((1, 10), np.float32)
        bad.flags.writeable = False
    with pytest.raises(InputError, match=message):
        model.run(_feeds(model), outputs={"logits": bad})
    with pytest.raises(InputError, match="unknown output"):
        model.run(_feeds(model), outputs={"nope": np.empty((1, 10), np.float32)})


# -- in-place Concat: producers write straight into their piece of the Concat's output ------


def _concat_model(tmp_path, nodes, inputs, output_shape, name="concat"):
    rng = np.random.default_rng(5)
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4, 3, 3], rng.standard_normal(144).astype(np.float32))
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)], [w])
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _conv(src, dst):
    return helper.make_node("Conv", [src, "w"], [dst], pads=[1, 1, 1, 1])


def _check(path, expect_in_place):
    compiled = nncc.compile_model(path, opt_level=0, backends=["numpy"])  # the portable executor's arena
    executor = compiled._executor
    assert len(executor.concats) == expect_in_place
    feeds = _feeds(compiled)
    want = _oracle(path, feeds)["y"]
    for _ in range(2):  # the second run reuses every buffer
        np.testing.assert_allclose(compiled.run(feeds)["y"], want, rtol=1e-4, atol=1e-4)
    return executor


def test_densenet_style_concats_nest_in_place(tmp_path):
    # a growing feature map: each Concat's output is a piece of the next, read in between
    nodes = [_conv("x", "a"), _conv("a", "b"), helper.make_node("Concat", ["a", "b"], ["ab"], axis=1),
             helper.make_node("Relu", ["ab"], ["r"]),
             helper.make_node("Conv", ["r", "w8"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["ab", "c"], ["abc"], axis=1),
             helper.make_node("Sigmoid", ["abc"], ["y"])]
    path = _concat_model(tmp_path, nodes, [("x", [1, 4, 6, 6])], [1, 12, 6, 6], "nested")
    model = onnx.load(path)
    rng = np.random.default_rng(6)
    model.graph.initializer.append(helper.make_tensor(
        "w8", TensorProto.FLOAT, [4, 8, 3, 3], rng.standard_normal(288).astype(np.float32)))
    onnx.save(model, path)
    executor = _check(path, expect_in_place=2)
    slots = {executor.plan.slots[s].name: s for s in executor.buffers}
    outer = executor.buffers[slots["abc"]]
    for piece in ("a", "b", "ab", "c"):
        assert np.shares_memory(executor.buffers[slots[piece]], outer), piece


@pytest.mark.parametrize("case", ["axis with a leading dim > 1", "same input twice", "graph input",
                                  "graph output"])
def test_concats_that_must_copy(tmp_path, case):
    if case == "axis with a leading dim > 1":
        nodes = [_conv("x", "a"), _conv("a", "b"), helper.make_node("Concat", ["a", "b"], ["y"], axis=2)]
        nodes[-1].output[0] = "c"
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
        shape = [1, 4, 12, 6]
    elif case == "same input twice":
        nodes = [_conv("x", "a"), helper.make_node("Concat", ["a", "a"], ["c"], axis=1),
                 helper.make_node("Relu", ["c"], ["y"])]
        shape = [1, 8, 6, 6]
    elif case == "graph input":
        nodes = [_conv("x", "a"), helper.make_node("Concat", ["a", "x"], ["c"], axis=1),
                 helper.make_node("Relu", ["c"], ["y"])]
        shape = [1, 8, 6, 6]
    else:
        nodes = [_conv("x", "a"), _conv("a", "b"), helper.make_node("Concat", ["a", "b"], ["y"], axis=1)]
        shape = [1, 8, 6, 6]
    path = _concat_model(tmp_path, nodes, [("x", [1, 4, 6, 6])], shape, "copy")
    _check(path, expect_in_place=0)


def test_light_densenet_concats_copy_nothing():
    path = light_models_dir() / "light_densenet121.onnx"
    executor = nncc.compile_model(path, backends=["numpy"])._executor  # the portable executor's arena
    concats = [i for i, ins in enumerate(executor.plan.instructions)
               if executor.plan.kernels[ins.kernel].split("::")[1] == "Concat"]
    assert len(concats) == 58 and sorted(executor.concats) == concats
