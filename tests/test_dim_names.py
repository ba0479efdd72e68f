"""Symbolic dimension names as exporters write them: paddle2onnx's `[-1, 3, '?', '?']` is two
independent unknown sizes (nncc runs it at non-square sizes, as onnxruntime does, through
the general plan, a shape plan and the cache's prepare), while a real name repeated on two
axes binds them, and a run that breaks it is one error naming both axes. Its unnamed batch
(-1, or no size at all) is named per axis too, so it is a symbolic dimension like any
other: a sample axis, fixed by `--dim x:0=N`."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import nncc
from nncc.errors import InputError
from nncc.native.toolchain import find_toolchain
from tests.models import GraphBuilder
from tests.oracle import ort_run


def _conv(path, shape):
    """Conv 3->4 (3x3, padding 1) + Relu over an input of ``shape``, output declared alike."""
    g = GraphBuilder(seed=11)
    g.inputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, shape))
    y = g.node("Conv", ["x", g.weight((4, 3, 3, 3)), g.const(np.linspace(-0.2, 0.2, 4))], pads=[1, 1, 1, 1])
    out = g.node("Relu", [y])
    model = g.save(path)
    del model.graph.output[:]  # declared as the exporter does: the input's names again
    model.graph.output.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, [shape[0], 4, *shape[2:]]))
    onnx.save(model, str(path))
    return path


@pytest.fixture
def paddle_style(tmp_path):
    return _conv(tmp_path / "paddle_style.onnx", [-1, 3, "?", "?"])


def _check(model, path, shape, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    got = list(model.run({"x": x}).values())[0]
    np.testing.assert_allclose(got, ort_run(path, {"x": x})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_question_marks_bind_independently(paddle_style):
    model = nncc.compile_model(paddle_style)
    for shape in [(1, 3, 48, 192), (2, 3, 30, 20), (1, 3, 48, 192)]:  # the repeat runs a shape plan
        _check(model, paddle_style, shape)
    assert {d for info in model.input_infos.values() for d in info.shape if isinstance(d, str)} == {"x:0", "x:2", "x:3"}


def test_question_marks_through_the_cache(paddle_style):
    model, outcome = nncc.prepare(paddle_style)
    assert outcome.outcome == "miss"
    _check(model, paddle_style, (1, 3, 17, 40), seed=1)
    again, outcome = nncc.prepare(paddle_style)
    assert outcome.outcome == "hit"
    _check(again, paddle_style, (1, 3, 40, 17), seed=2)


def test_a_placeholder_axis_can_be_fixed_by_its_name(paddle_style, cli, tmp_path):
    code, out, err = cli("compile", paddle_style, "--dim", "x:2=16", "--dim", "x:3=24", "-o", tmp_path / "m.nncc")
    assert code == 0, err
    _check(nncc.load(tmp_path / "m.nncc"), paddle_style, (1, 3, 16, 24), seed=3)


def test_a_real_name_on_two_axes_is_one_size(tmp_path):
    path = _conv(tmp_path / "square.onnx", [1, 3, "side", "side"])
    model = nncc.compile_model(path)
    _check(model, path, (1, 3, 20, 20))
    with pytest.raises(InputError) as caught:
        model.run({"x": np.zeros((1, 3, 48, 192), np.float32)})
    message = str(caught.value)
    assert "input 'x' axis 3 has size 192" in message and "input 'x' axis 2 has 48" in message
    assert "'side'" in message and "\n" not in message


needs_cc = pytest.mark.skipif(find_toolchain() is None,
                              reason="no C compiler on this machine: no native plan can be built")


@pytest.mark.parametrize("batch", [-1, None], ids=["minus_one", "absent"])
def test_an_unnamed_batch_is_named_per_axis(tmp_path, batch):
    path = _conv(tmp_path / "unnamed.onnx", [batch, 3, 12, 12])
    dim = onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim[0]
    assert not dim.HasField("dim_param") and (dim.dim_value == -1 if batch == -1 else not dim.HasField("dim_value"))
    model = nncc.compile_model(path)
    assert model.input_infos["x"].shape == ("x:0", 3, 12, 12)
    assert model.output_infos[model.output_names[0]].shape[1:] == (4, 12, 12)  # outputs are not renamed
    for batch_size in (1, 3):
        _check(model, path, (batch_size, 3, 12, 12), seed=batch_size)


@needs_cc
def test_an_unnamed_batch_is_a_sample_axis_run_natively(tmp_path):
    path = _conv(tmp_path / "batch.onnx", [-1, 3, 12, 12])
    model = nncc.compile_model(path)
    for batch_size in (1, 3, 2):
        _check(model, path, (batch_size, 3, 12, 12), seed=batch_size)
        assert model.last_run_native_partitions >= 1, batch_size  # the plan for one sample, looped
    assert model.sample_axes == ["x:0"]


def test_an_unnamed_batch_can_be_fixed_by_its_name(paddle_style, cli, tmp_path):
    code, out, err = cli("compile", paddle_style, "--dim", "x:0=2", "--dim", "x:2=16", "--dim", "x:3=24",
                         "-o", tmp_path / "m.nncc")
    assert code == 0, err
    model = nncc.load(tmp_path / "m.nncc")
    assert model.input_infos["x"].shape == (2, 3, 16, 24)
    _check(model, paddle_style, (2, 3, 16, 24), seed=4)


def test_an_unnamed_batch_keys_the_cache_by_its_size(paddle_style):
    for batch_size, outcome in ((2, "miss"), (2, "hit"), (3, "miss")):
        model, prepared = nncc.prepare(paddle_style, dims={"x:0": batch_size, "x:2": 10, "x:3": 14})
        assert prepared.outcome == outcome, batch_size
        _check(model, paddle_style, (batch_size, 3, 10, 14), seed=batch_size)
