"""Zero-copy I/O and executor-managed buffers with roles (NNAPI memory domains)."""

import threading

import numpy as np
import onnx
from onnx import TensorProto, helper
import pytest

import nncc
from nncc.errors import InputError
from tests.models import relu_model


def _save(tmp_path, name, nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


@pytest.fixture
def cell(tmp_path):
    """h_out = tanh(h_in @ W + x): a recurrent cell with a state in and a state out."""
    w = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32) * 0.3
    nodes = [helper.make_node("MatMul", ["h_in", "w"], ["hw"]),
             helper.make_node("Add", ["hw", "x"], ["pre"]),
             helper.make_node("Tanh", ["pre"], ["h_out"])]
    path = _save(tmp_path, "cell", nodes, [_vi("x", [1, 8]), _vi("h_in", [1, 8])], [_vi("h_out", [1, 8])],
                 [helper.make_tensor("w", TensorProto.FLOAT, [8, 8], w.ravel())])
    return nncc.compile_model(path), w


@pytest.fixture
def identity(tmp_path):
    path = _save(tmp_path, "ident", [helper.make_node("Identity", ["x"], ["y"])],
                 [_vi("x", [4, 16])], [_vi("y", [4, 16])])
    return nncc.compile_model(path, opt_level=0)


def test_outputs_are_written_into_caller_memory(cell):
    model, w = cell
    out = np.empty((1, 8), np.float32)
    x, h = np.ones((1, 8), np.float32), np.zeros((1, 8), np.float32)
    result = model.run({"x": x, "h_in": h}, outputs={"h_out": out})
    assert result["h_out"] is out
    np.testing.assert_allclose(out, np.tanh(h @ w + x), rtol=1e-6)


def test_memory_mapped_input_is_read_in_place(identity, tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(64, dtype=np.float32).reshape(4, 16))
    mapped = np.load(path, mmap_mode="r")
    y = identity.run({"x": mapped})["y"]
    assert np.shares_memory(y, mapped)  # the executor handed the mapped buffer straight on


def test_stateful_steps_through_a_domain_buffer_equal_feeding_back_by_hand(cell):
    model, _ = cell
    state = model.allocate([("output", "h_out"), ("input", "h_in")])
    assert state.shape == (1, 8) and state.dtype == np.float32
    state.copy_from(np.zeros((1, 8), np.float32))
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((20, 1, 8)).astype(np.float32)
    by_hand = np.zeros((1, 8), np.float32)
    for x in xs:
        model.run({"x": x, "h_in": state}, outputs={"h_out": state})
        by_hand = model.run({"x": x, "h_in": by_hand})["h_out"]
    np.testing.assert_array_equal(state.copy_to(), by_hand)


@pytest.mark.parametrize("roles, kind, name", [
    ([("output", "h_out")], "input", "h_in"),      # declared only as an output
    ([("input", "x")], "input", "h_in"),           # declared for another input
    ([("input", "h_in")], "output", "h_out"),     # declared only as an input
])
def test_uses_outside_the_declared_roles_are_refused_before_running(cell, roles, kind, name):
    model, _ = cell
    buffer = model.allocate(roles)
    buffer.copy_from(np.zeros((1, 8), np.float32))
    out = np.full((1, 8), 7.0, np.float32)
    feeds = {"x": np.zeros((1, 8), np.float32), "h_in": np.zeros((1, 8), np.float32)}
    outputs = {"h_out": out}
    (feeds if kind == "input" else outputs)[name] = buffer
    with pytest.raises(InputError, match=name):
        model.run(feeds, outputs=outputs)
    if kind == "input":
        np.testing.assert_array_equal(out, 7.0)  # nothing ran, nothing was written


def test_a_buffer_of_one_model_cannot_be_used_by_another(cell, tmp_path):
    model, _ = cell
    twin = nncc.compile_model(tmp_path / "cell.onnx")
    buffer = model.allocate([("input", "h_in")])
    buffer.copy_from(np.zeros((1, 8), np.float32))
    with pytest.raises(InputError, match="h_in"):
        twin.run({"x": np.zeros((1, 8), np.float32), "h_in": buffer})


def test_allocate_validates_roles_and_shapes(cell):
    model, _ = cell
    with pytest.raises(InputError, match="no input 'nope'"):
        model.allocate([("input", "nope")])
    with pytest.raises(InputError, match="role"):
        model.allocate([("state", "h_in")])
    with pytest.raises(InputError, match="dimension"):
        model.allocate([("input", "h_in")], shape=(2, 8))
    fresh = model.allocate([("input", "h_in")])  # static roles: allocated, zero-filled
    np.testing.assert_array_equal(fresh.copy_to(), np.zeros((1, 8), np.float32))
    with pytest.raises(InputError, match="cannot copy"):
        fresh.copy_from(np.zeros((2, 8), np.float32))


def test_concurrent_reads_are_safe_and_concurrent_writes_do_not_crash(cell):
    model, _ = cell
    state = model.allocate([("output", "h_out"), ("input", "h_in")])
    state.copy_from(np.zeros((1, 8), np.float32))
    errors = []

    def reader():
        try:
            for _ in range(200):
                assert state.copy_to().shape == (1, 8)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def writer(seed):
        try:
            x = np.random.default_rng(seed).standard_normal((1, 8)).astype(np.float32)
            for _ in range(50):
                model.run({"x": x, "h_in": state}, outputs={"h_out": state})
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    threads += [threading.Thread(target=writer, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors
    assert np.all(np.abs(state.copy_to()) <= 1.0)  # contents are some tanh output


def test_a_buffer_with_unknown_dimensions_takes_the_first_output_shape(tmp_path):
    path = relu_model(tmp_path / "relu.onnx", ["N", 4], opset=17)
    model = nncc.compile_model(path)
    buffer = model.allocate([("output", "y"), ("input", "x")])
    assert buffer.shape is None
    with pytest.raises(InputError, match="no contents"):
        buffer.copy_to()
    x = np.array([[-1, 2, -3, 4], [5, -6, 7, -8], [1, 1, -1, -1]], np.float32)
    model.run({"x": x}, outputs={"y": buffer})
    assert buffer.shape == (3, 4)
    np.testing.assert_array_equal(buffer.copy_to(), np.maximum(x, 0))
    model.run({"x": buffer}, outputs={"y": buffer})  # now bound: read and written in one run
    np.testing.assert_array_equal(buffer.copy_to(), np.maximum(x, 0))
