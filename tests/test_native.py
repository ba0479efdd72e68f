"""The native backend: generated C for whole partitions, checked against onnxruntime, and
every way native code is kept from running when it must not (no compiler, another ISA, an
untrusted or tampered artifact, a tampered cache entry, a failed or killed build)."""

from __future__ import annotations

import gc
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.errors import PlanFormatError
from nncc.native.toolchain import find_toolchain
from nncc.plan.format import serialize
from tests.conftest import FIXTURES
from tests.models import mlp
from tests.oracle import ort_session

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler on this machine: the native "
                                "backend selects nothing, which the no-compiler tests cover with CC set")

RTOL, ATOL = 1e-4, 1e-4


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _save(tmp_path, model, name="m.onnx") -> pathlib.Path:
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def _ort(path, feeds):
    session = ort_session(path)
    return session.run(None, feeds)


def _check(path, feeds, expect_native=True, **options):
    want = _ort(path, feeds)
    model = nncc.compile_model(path, **options)
    if expect_native:
        assert model.native_partitions >= 1, "the native backend took nothing"
    got = model.run(feeds)
    got = [got[name] for name in model.output_names]
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL * max(1.0, float(np.abs(w).max())))
    return model


def _rand(rng, shape):
    return np.asarray(rng.standard_normal(shape), dtype=np.float32)


# -- ops, against onnxruntime -----------------------------------------------------------

CONVS = [
    # (C, K, H, W, kernel, stride, pad, dilation, group, bias)
    (3, 8, 17, 19, 3, 1, 1, 1, 1, True),
    (8, 16, 16, 16, 3, 2, 1, 1, 1, False),
    (4, 6, 9, 11, 5, 2, 2, 1, 2, True),
    (16, 16, 12, 12, 3, 1, 1, 1, 16, True),     # depthwise
    (16, 16, 13, 13, 3, 2, 1, 1, 16, True),     # depthwise, stride 2
    (8, 8, 10, 10, 3, 1, 2, 2, 8, False),       # depthwise, dilated
    (8, 12, 7, 7, 1, 1, 0, 1, 1, True),         # 1x1: a direct GEMM
    (8, 12, 8, 8, 1, 2, 0, 1, 1, True),         # 1x1 stride 2: through im2col
    (3, 4, 10, 9, 3, 1, 0, 2, 1, True),         # dilated
    (3, 5, 6, 7, 7, 3, 3, 1, 1, True),          # kernel larger than the stride
]


@pytest.mark.slow
@pytest.mark.parametrize("c, k, h, w, ks, stride, pad, dil, group, bias", CONVS)
@pytest.mark.parametrize("act", ["", "Relu", "Clip"])
def test_conv(tmp_path, c, k, h, w, ks, stride, pad, dil, group, bias, act):
    rng = np.random.default_rng(c * 131 + k * 7 + ks)
    inits = [numpy_helper.from_array(_rand(rng, (k, c // group, ks, ks)), "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(_rand(rng, (k,)), "b"))
        ins.append("b")
    nodes = [helper.make_node("Conv", ins, ["y" if not act else "c"], kernel_shape=[ks, ks], strides=[stride] * 2,
                              pads=[pad] * 4, dilations=[dil] * 2, group=group)]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    elif act == "Clip":
        inits += [numpy_helper.from_array(np.float32(0.0), "lo"), numpy_helper.from_array(np.float32(0.5), "hi")]
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
    oh = (h + 2 * pad - dil * (ks - 1) - 1) // stride + 1
    ow = (w + 2 * pad - dil * (ks - 1) - 1) // stride + 1
    path = _save(tmp_path, _model(nodes, [_f32("x", [2, c, h, w])], [_f32("y", [2, k, oh, ow])], inits))
    _check(path, {"x": _rand(rng, (2, c, h, w))})


@pytest.mark.parametrize("act", ["", "Relu", "Clip"])
@pytest.mark.parametrize("shortcut_conv", [False, True])
def test_residual_conv_add_activation(tmp_path, act, shortcut_conv):
    """Conv -> Add(residual) -> activation is one epilogue; both operands may be convs."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(_rand(rng, (8, 8, 3, 3)), "w"), numpy_helper.from_array(_rand(rng, (8,)), "b"),
             numpy_helper.from_array(_rand(rng, (8, 8, 1, 1)), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    other = "x"
    if shortcut_conv:
        nodes.append(helper.make_node("Conv", ["x", "w2"], ["s"], kernel_shape=[1, 1]))
        other = "s"
    nodes.append(helper.make_node("Add", ["c", other], ["a" if act else "y"]))
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["a"], ["y"]))
    elif act == "Clip":
        inits += [numpy_helper.from_array(np.float32(-0.5), "lo"), numpy_helper.from_array(np.float32(1.0), "hi")]
        nodes.append(helper.make_node("Clip", ["a", "lo", "hi"], ["y"]))
    path = _save(tmp_path, _model(nodes, [_f32("x", [1, 8, 9, 9])], [_f32("y", [1, 8, 9, 9])], inits))
    _check(path, {"x": _rand(rng, (1, 8, 9, 9))})


GEMMS = [
    # (M, K, N, transA, transB, alpha, beta, C shape)
    (5, 7, 3, 0, 0, 1.0, 1.0, (3,)),
    (5, 7, 3, 1, 0, 0.5, 2.0, (1, 3)),
    (5, 7, 3, 0, 1, 1.0, 0.25, (5, 1)),
    (4, 6, 9, 1, 1, 2.0, 1.0, (1,)),
    (4, 6, 9, 0, 1, 1.0, 1.0, None),
]


@pytest.mark.parametrize("m, k, n, ta, tb, alpha, beta, cshape", GEMMS)
def test_gemm(tmp_path, m, k, n, ta, tb, alpha, beta, cshape):
    rng = np.random.default_rng(m * 10 + n)
    inits = [numpy_helper.from_array(_rand(rng, (n, k) if tb else (k, n)), "b")]
    ins = ["a", "b"]
    if cshape is not None:
        inits.append(numpy_helper.from_array(_rand(rng, cshape), "c"))
        ins.append("c")
    node = helper.make_node("Gemm", ins, ["y"], transA=ta, transB=tb, alpha=alpha, beta=beta)
    a_shape = (k, m) if ta else (m, k)
    path = _save(tmp_path, _model([node], [_f32("a", list(a_shape))], [_f32("y", [m, n])], inits))
    _check(path, {"a": _rand(rng, a_shape)})


MATMULS = [((3, 5), (5, 4)), ((2, 3, 5), (5, 4)), ((2, 3, 4, 5), (2, 3, 5, 6)), ((2, 1, 4, 5), (3, 5, 6)),
           ((4, 5), (2, 5, 3)), ((1, 3, 4, 5), (2, 1, 5, 2))]


@pytest.mark.parametrize("sa, sb", MATMULS)
@pytest.mark.parametrize("bias", [False, True])
def test_matmul(tmp_path, sa, sb, bias):
    rng = np.random.default_rng(len(sa) * 7 + len(sb))
    out = np.matmul(np.zeros(sa, np.float32), np.zeros(sb, np.float32)).shape
    nodes = [helper.make_node("MatMul", ["a", "b"], ["m" if bias else "y"])]
    inits = []
    if bias:
        inits.append(numpy_helper.from_array(_rand(rng, (out[-1],)), "bias"))
        nodes.append(helper.make_node("Add", ["m", "bias"], ["y"]))
    path = _save(tmp_path, _model(nodes, [_f32("a", list(sa)), _f32("b", list(sb))], [_f32("y", list(out))], inits))
    _check(path, {"a": _rand(rng, sa), "b": _rand(rng, sb)})


BROADCASTS = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((2, 3, 4), (3, 1)), ((1, 3, 1), (2, 1, 4)),
              ((2, 3, 4, 5), (1, 3, 1, 1)), ((5,), ()), ((), (2, 2))]


@pytest.mark.slow
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"])
@pytest.mark.parametrize("sa, sb", BROADCASTS)
def test_binary_broadcast(tmp_path, op, sa, sb):
    rng = np.random.default_rng(3)
    out = np.broadcast_shapes(sa, sb)
    node = helper.make_node(op, ["a", "b"], ["y"])
    path = _save(tmp_path, _model([node], [_f32("a", list(sa)), _f32("b", list(sb))], [_f32("y", list(out))]))
    a, b = _rand(rng, sa), _rand(rng, sb)
    if op == "Pow":
        a = np.asarray(np.abs(a) + 0.5, dtype=np.float32)
    if op == "Div":
        b = np.where(np.abs(b) < 0.1, 1.0, b).astype(np.float32)
    _check(path, {"a": a, "b": b})


@pytest.mark.slow
@pytest.mark.parametrize("op, attrs", [("Relu", {}), ("Sigmoid", {}), ("Tanh", {}), ("Erf", {}), ("Exp", {}),
                                       ("Neg", {}), ("Abs", {}), ("Sqrt", {}), ("Log", {}), ("Reciprocal", {}),
                                       ("LeakyRelu", {"alpha": 0.2}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
                                       ("HardSwish", {}), ("Softsign", {})])
def test_unary(tmp_path, op, attrs):
    rng = np.random.default_rng(4)
    x = _rand(rng, (3, 17))
    if op in ("Sqrt", "Log"):
        x = np.abs(x) + 0.1
    if op == "Reciprocal":
        x = np.where(np.abs(x) < 0.1, 1.0, x).astype(np.float32)
    path = _save(tmp_path, _model([helper.make_node(op, ["x"], ["y"], **attrs)], [_f32("x", [3, 17])],
                                  [_f32("y", [3, 17])]))
    _check(path, {"x": x})


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset, axis", [(13, -1), (13, 2), (11, 1), (11, 2), (11, -1)])
def test_softmax(tmp_path, op, opset, axis):
    rng = np.random.default_rng(6)
    node = helper.make_node(op, ["x"], ["y"], axis=axis)
    path = _save(tmp_path, _model([node], [_f32("x", [2, 3, 7])], [_f32("y", [2, 3, 7])], opset=opset))
    _check(path, {"x": _rand(rng, (2, 3, 7)) * 4})


@pytest.mark.parametrize("axis, bias", [(-1, True), (-1, False), (1, True)])
def test_layer_norm(tmp_path, axis, bias):
    rng = np.random.default_rng(7)
    shape = (2, 5, 6)
    n = int(np.prod(shape[axis:])) if axis >= 0 else shape[-1]
    norm_shape = shape[axis:] if axis >= 0 else shape[-1:]
    inits = [numpy_helper.from_array(_rand(rng, norm_shape), "s")]
    ins = ["x", "s"]
    if bias:
        inits.append(numpy_helper.from_array(_rand(rng, norm_shape), "b"))
        ins.append("b")
    assert n == int(np.prod(norm_shape))
    node = helper.make_node("LayerNormalization", ins, ["y"], axis=axis, epsilon=1e-5)
    path = _save(tmp_path, _model([node], [_f32("x", list(shape))], [_f32("y", list(shape))], inits))
    _check(path, {"x": _rand(rng, shape) * 3 + 1})


POOLS = [("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
         ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2])),
         ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
         ("MaxPool", dict(kernel_shape=[3, 3], dilations=[2, 2])),
         ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
         ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
         ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
         ("GlobalAveragePool", {})]


@pytest.mark.parametrize("op, attrs", POOLS)
def test_pool(tmp_path, op, attrs):
    rng = np.random.default_rng(8)
    x = _rand(rng, (2, 3, 11, 10))
    want_shape = _ort_shape(op, attrs, x)
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    path = _save(tmp_path, _model([node], [_f32("x", list(x.shape))], [_f32("y", list(want_shape))]))
    _check(path, {"x": x})


def _ort_shape(op, attrs, x):
    model = _model([helper.make_node(op, ["x"], ["y"], **attrs)], [_f32("x", list(x.shape))], [_f32("y", None)])
    session = ort_session(model)
    return session.run(None, {"x": x})[0].shape


@pytest.mark.parametrize("perm", [[0, 2, 1, 3], [3, 2, 1, 0], [0, 1, 3, 2], [1, 0, 2, 3]])
def test_transpose_reshape(tmp_path, perm):
    """Transpose, then Reshape (an alias inside the partition) feeding a MatMul."""
    rng = np.random.default_rng(9)
    shape = [2, 3, 4, 5]
    out = [shape[p] for p in perm]
    inits = [numpy_helper.from_array(np.array([-1, out[-1]], np.int64), "shape"),
             numpy_helper.from_array(_rand(rng, (out[-1], 3)), "w")]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Transpose", ["r"], ["t"], perm=perm),
             helper.make_node("Reshape", ["t", "shape"], ["f"]), helper.make_node("MatMul", ["f", "w"], ["y"])]
    rows = int(np.prod(out)) // out[-1]
    path = _save(tmp_path, _model(nodes, [_f32("x", shape)], [_f32("y", [rows, 3])], inits))
    _check(path, {"x": _rand(rng, shape)})


def test_reshape_to_a_graph_output_is_copied(tmp_path):
    """A Reshape whose result leaves the partition writes into the caller's buffer."""
    inits = [numpy_helper.from_array(np.array([6, 4], np.int64), "shape")]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["y"]),
             helper.make_node("Sigmoid", ["r"], ["z"])]
    path = _save(tmp_path, _model(nodes, [_f32("x", [2, 3, 4])], [_f32("y", [6, 4]), _f32("z", [2, 3, 4])], inits))
    _check(path, {"x": _rand(np.random.default_rng(1), (2, 3, 4))})


# -- whole models, both backends, against onnxruntime ------------------------------------

MODELS = ["mlp", "resnet_block", "mobilenet", "transformer"]


@pytest.mark.parametrize("name", MODELS)
def test_fixture_models_native_and_numpy(name):
    path = FIXTURES / f"{name}.onnx"
    rng = np.random.default_rng(11)
    session = ort_session(path)
    feeds = {}
    for i in session.get_inputs():
        shape = [d if isinstance(d, int) else 2 for d in i.shape]
        feeds[i.name] = _rand(rng, shape)
    want = session.run(None, feeds)
    for backends in (("native", "numpy"), ("numpy",)):
        model = nncc.compile_model(path, backends=list(backends))
        if backends[0] == "native" and model.plan.inputs and all(
                isinstance(d, int) for s in model.plan.inputs for d in model.plan.slots[s].shape):
            assert model.native_partitions >= 1
        got = model.run(feeds)
        for g, w in zip([got[n] for n in model.output_names], want):
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3)


# -- fallbacks --------------------------------------------------------------------------
# On a static model: symbolic dimensions (the mlp fixture's batch) keep a model portable.


@pytest.fixture
def static_mlp(tmp_path_factory) -> pathlib.Path:
    return _save(tmp_path_factory.mktemp("static"), mlp([4, 64], 32, 10, seed=21, softmax=True), "static_mlp.onnx")


def _mlp_feeds():
    return {"x": np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)}


def test_no_compiler_runs_the_portable_plan(monkeypatch, static_mlp):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    model = nncc.compile_model(static_mlp)
    assert not model.plan.payloads and model.native_partitions == 0
    reference = nncc.compile_model(static_mlp, backends=["numpy"])
    np.testing.assert_array_equal(model.run(_mlp_feeds())["probs"], reference.run(_mlp_feeds())["probs"])


def test_failing_compiler_is_recorded_and_portable(tmp_path, monkeypatch, capfd, static_mlp):
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'unit.c:1: error: the compiler broke' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    model = nncc.compile_model(static_mlp)
    err = capfd.readouterr().err
    assert "the compiler broke" in err and "portable plan" in err
    assert model.native_partitions == 0 and "compiler broke" in model.plan.options["native_error"]
    np.testing.assert_allclose(model.run(_mlp_feeds())["probs"],
                               nncc.compile_model(static_mlp, backends=["numpy"]).run(_mlp_feeds())["probs"])


@pytest.mark.slow
def test_compiler_that_hangs_times_out(tmp_path, monkeypatch, capfd, static_mlp):
    slow = tmp_path / "cc"
    slow.write_text("#!/bin/sh\nsleep 60\n")
    slow.chmod(0o755)
    monkeypatch.setenv("CC", str(slow))
    monkeypatch.setenv("NNCC_CC_TIMEOUT", "1")  # the setting, resolved by the compile and carried to the compiler
    model = nncc.compile_model(static_mlp)
    assert "timed out" in capfd.readouterr().err
    assert model.native_partitions == 0


def test_untrusted_artifact_runs_portable_with_one_warning(tmp_path, capfd, monkeypatch, static_mlp):
    path = tmp_path / "mlp.nncc"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "builder"))  # signed by someone else's key
    nncc.compile_model(static_mlp).save(path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "runner"))
    capfd.readouterr()
    untrusted = nncc.load(path)
    err = capfd.readouterr().err
    assert untrusted.native_partitions == 0
    assert err.count("nncc: warning:") == 1 and "--trust-native" in err
    trusted = nncc.load(path, trust_native=True)
    assert trusted.native_partitions == 1 and capfd.readouterr().err == ""
    np.testing.assert_allclose(untrusted.run(_mlp_feeds())["probs"], trusted.run(_mlp_feeds())["probs"],
                               rtol=1e-5, atol=1e-6)


def test_artifact_built_for_missing_cpu_features_runs_portable(tmp_path, capfd, static_mlp):
    plan = nncc.compile_model(static_mlp).plan
    plan.options["native"] = dict(plan.options["native"], features=["sse2", "nncc_future_isa"])
    path = tmp_path / "future.nncc"
    path.write_bytes(serialize(plan))
    capfd.readouterr()
    model = nncc.load(path, trust_native=True)
    assert model.native_partitions == 0
    assert "nncc_future_isa" in capfd.readouterr().err
    np.testing.assert_allclose(model.run(_mlp_feeds())["probs"],
                               nncc.compile_model(static_mlp, backends=["numpy"]).run(_mlp_feeds())["probs"],
                               rtol=1e-5, atol=1e-6)


def _code_range(artifact: bytes) -> tuple[int, int]:
    import struct

    count = struct.unpack_from("<I", artifact, 12)[0]
    for i in range(count):
        tag, _, offset, length, _ = struct.unpack_from("<4sIQQ32s", artifact, 32 + i * 56)
        if tag == b"CODE":
            return offset, length
    raise AssertionError("no CODE section")


def test_tampered_code_section_in_an_artifact_is_never_loaded(tmp_path, static_mlp):
    data = bytearray(nncc.compile_model(static_mlp).to_bytes())
    offset, length = _code_range(bytes(data))
    data[offset + length // 2] ^= 0x01
    with pytest.raises(PlanFormatError, match="CODE fails its checksum"):
        nncc.load(bytes(data), trust_native=True)


@pytest.mark.slow
def test_tampered_code_in_the_cache_is_never_loaded(tmp_path, capfd, static_mlp):
    from nncc.cache.store import Cache

    cache_dir = tmp_path / "cache"
    model, first = nncc.prepare(static_mlp, cache_dir=cache_dir, stage="optimized")
    assert first.outcome == "miss" and model.native_partitions == 1
    plan_path = Cache(str(cache_dir)).paths(first.token)[0]
    raw = bytearray(pathlib.Path(plan_path).read_bytes())
    offset, length = _code_range(bytes(raw))
    raw[offset + 100] ^= 0xFF
    pathlib.Path(plan_path).write_bytes(bytes(raw))
    capfd.readouterr()
    again, second = nncc.prepare(static_mlp, cache_dir=cache_dir, stage="optimized")
    assert second.outcome == "recompiled"
    assert "does not match its recorded hash" in capfd.readouterr().err
    assert again.native_partitions == 1  # rebuilt, from fresh and verified bytes
    np.testing.assert_allclose(again.run(_mlp_feeds())["probs"], model.run(_mlp_feeds())["probs"])


def test_code_from_a_previous_model_is_never_reused(tmp_path):
    """Each library is loaded from its own memory file: after one model is dropped, the
    next one's code must not resolve to the first one's (dlopen matches loaded names)."""
    rng = np.random.default_rng(12)
    paths = []
    for i, scale in enumerate((1.0, -3.0)):
        w = numpy_helper.from_array((_rand(rng, (6, 4)) * scale), "w")
        paths.append(_save(tmp_path, _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_f32("x", [2, 6])],
                                            [_f32("y", [2, 4])], [w]), f"m{i}.onnx"))
    x = _rand(rng, (2, 6))
    first = nncc.compile_model(paths[0])
    first.run({"x": x})
    del first
    gc.collect()
    _check(paths[1], {"x": x})


@pytest.mark.slow
def test_token_covers_the_compiler_and_target(tmp_path, monkeypatch, static_mlp):
    from nncc.model import prepare

    cache_dir = tmp_path / "cache"
    _, a = prepare(static_mlp, cache_dir=cache_dir)
    _, b = prepare(static_mlp, cache_dir=cache_dir, target="x86-64-v2")
    wrapper = tmp_path / "cc"
    wrapper.write_text(f"#!/bin/sh\nexec {find_toolchain().path} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    model, c = prepare(static_mlp, cache_dir=cache_dir, stage="optimized")
    assert (a.outcome, b.outcome, c.outcome) == ("miss", "miss", "miss")
    assert len({a.token, b.token, c.token}) == 3
    assert model.native_partitions == 1


@pytest.mark.slow  # a killed native build; test_cache_concurrency kills writers too
def test_sigkill_during_a_native_build_leaves_the_cache_consistent(tmp_path, static_mlp):
    """A compile killed while the C compiler runs stores nothing half-built: verify is
    clean and the next run compiles and succeeds."""
    slow = tmp_path / "cc"
    slow.write_text(f"#!/bin/sh\ntouch {tmp_path}/started\nsleep 30\nexec {find_toolchain().path} \"$@\"\n")
    slow.chmod(0o755)
    cache_dir = tmp_path / "cache"
    env = dict(os.environ, CC=str(slow), NNCC_CACHE_DIR=str(cache_dir))
    proc = subprocess.Popen([sys.executable, "-m", "nncc", "run", str(static_mlp), "--stage", "optimized",
                             "--random-inputs"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        for _ in range(600):
            if (tmp_path / "started").exists():
                break
            time.sleep(0.05)
        assert (tmp_path / "started").exists(), "the compiler was never started"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    env.pop("CC")
    verify = subprocess.run([sys.executable, "-m", "nncc", "cache", "verify"], env=env,
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    again = subprocess.run([sys.executable, "-m", "nncc", "run", str(static_mlp),
                            "--random-inputs"], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and "miss" in again.stderr


@pytest.mark.slow
def test_cli_trust_native_flag(tmp_path, static_mlp):
    artifact = tmp_path / "mlp.nncc"
    env = dict(os.environ, NNCC_CACHE_DIR=str(tmp_path / "cache"))
    subprocess.run([sys.executable, "-m", "nncc", "compile", str(static_mlp), "-o", str(artifact)],
                   env=dict(env, XDG_CONFIG_HOME=str(tmp_path / "builder")), check=True, capture_output=True)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "runner")  # another user: the builder's signature is not theirs
    plain = subprocess.run([sys.executable, "-m", "nncc", "run", str(artifact), "--random-inputs", "--json"],
                           env=env, capture_output=True, text=True)
    trusted = subprocess.run([sys.executable, "-m", "nncc", "run", str(artifact), "--random-inputs",
                              "--json", "--trust-native"], env=env, capture_output=True, text=True)
    assert plain.returncode == trusted.returncode == 0
    assert "--trust-native" in plain.stderr and "warning" not in trusted.stderr
    inspect = subprocess.run([sys.executable, "-m", "nncc", "inspect", str(artifact), "--json"], env=env,
                             capture_output=True, text=True)
    import json

    report = json.loads(inspect.stdout)
    assert [p["native"] for p in report["partitions"]] == [True]
    assert "warning" not in inspect.stderr  # inspecting never runs, so never asks for trust


def test_clip_with_a_non_scalar_bound_stays_portable(tmp_path):
    """Found by fuzzing: Clip bounds must be scalars; the native backend does not take a
    Clip with a vector bound (its C has the bound as a literal), so compiling it ends, if
    at all, in nncc's own error, never a crash in code generation."""
    from nncc.errors import NnccError

    inits = [numpy_helper.from_array(np.zeros(4, np.float32), "lo")]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Clip", ["r", "lo"], ["y"])]
    path = _save(tmp_path, _model(nodes, [_f32("x", [3, 4])], [_f32("y", [3, 4])], inits))
    try:
        nncc.compile_model(path)
    except NnccError:
        pass  # refusing the model is right too; any other exception is a bug


@pytest.mark.parametrize("shapes, taken", [([(2, 3, 4)] * 3, True), ([(2, 3, 4), (4,)], False)])
def test_sum(tmp_path, shapes, taken):
    """Sum of same-shape operands is generated; with broadcasting it stays portable."""
    rng = np.random.default_rng(13)
    names = [f"x{i}" for i in range(len(shapes))]
    nodes = [helper.make_node("Relu", [names[0]], ["r"]), helper.make_node("Sum", ["r", *names[1:]], ["y"])]
    path = _save(tmp_path, _model(nodes, [_f32(n, list(s)) for n, s in zip(names, shapes)], [_f32("y", [2, 3, 4])]))
    model = _check(path, {n: _rand(rng, s) for n, s in zip(names, shapes)})
    kernels = [model.plan.kernels[i.kernel] for i in model.plan.instructions]
    native = [model.plan.partitions[i] for i in model.plan.code_partitions()]
    summed = any("Sum" in kernels[i] for p in native for i in range(p.first, p.first + p.count))
    assert summed == taken


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(tmp_path, axis):
    rng = np.random.default_rng(14)
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for i, s in enumerate(shapes):
        s[axis] += i  # unequal widths along the axis
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    names = [f"x{i}" for i in range(3)]
    nodes = [helper.make_node("Relu", [n], [f"r{n}"]) for n in names]
    nodes.append(helper.make_node("Concat", [f"r{n}" for n in names], ["y"], axis=axis))
    path = _save(tmp_path, _model(nodes, [_f32(n, s) for n, s in zip(names, shapes)], [_f32("y", out)]))
    _check(path, {n: _rand(rng, s) for n, s in zip(names, shapes)})


def test_residual_as_a_sum_of_two(tmp_path):
    """Some exporters write a residual connection as Sum(conv, x): one epilogue as for Add."""
    rng = np.random.default_rng(15)
    inits = [numpy_helper.from_array(_rand(rng, (8, 8, 3, 3)), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Sum", ["c", "x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    path = _save(tmp_path, _model(nodes, [_f32("x", [1, 8, 9, 9])], [_f32("y", [1, 8, 9, 9])], inits))
    _check(path, {"x": _rand(rng, (1, 8, 9, 9))})
