"""nncc::ScaleShift and the batchnorm_to_scale_shift pass.

Inference BatchNormalization that is not after a Conv, with the per-channel constant
Mul / Add / Sub after it and an activation, becomes one ScaleShift node. Every rewritten
model is compared with onnxruntime running the original, unfused model.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.compiler import CompileOptions, compile_graph
from nncc.errors import KernelError, ShapeInferenceError
from nncc.frontend.onnx import parse_model
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import Ctx, resolve
from nncc.model import CompiledModel
from nncc.passes.fusion import batchnorm_to_scale_shift
from nncc.passes.pipeline import passes_for, run_passes
from nncc.passes.shape_inference import infer_shapes
from nncc.runtime.interpreter import Interpreter
from tests.conftest import light_models_dir
from tests.oracle import ort_outputs

TOL = dict(rtol=1e-4, atol=1e-5)
C = 6


def rand(seed, *shape, dtype=np.float32, low=None):
    rng = np.random.default_rng(seed)
    a = rng.random(shape) + low if low is not None else rng.standard_normal(shape)
    return a.astype(dtype)


def bn_params(seed=0, c=C, dtype=np.float32):
    return {"scale": rand(seed, c, dtype=dtype), "bias": rand(seed + 1, c, dtype=dtype),
            "mean": rand(seed + 2, c, dtype=dtype), "var": rand(seed + 3, c, dtype=dtype, low=0.1)}


def make_model(nodes, x_shape, y_name, initializers, *, opset=17, elem=TensorProto.FLOAT,
               extra_inputs=(), extra_outputs=()):
    inputs = [helper.make_tensor_value_info("x", elem, list(x_shape))]
    inputs += [helper.make_tensor_value_info(n, elem, list(s)) for n, s in extra_inputs]
    outputs = [helper.make_tensor_value_info(n, elem, list(x_shape)) for n in [y_name, *extra_outputs]]
    inits = [numpy_helper.from_array(np.asarray(a), name) for name, a in initializers.items()]
    graph = helper.make_graph(nodes, "scale_shift", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def bn_node(x="x", y="b", name="bn", **attrs):
    return helper.make_node("BatchNormalization", [x, "scale", "bias", "mean", "var"], [y],
                            name=name, **attrs)


def chain_model(tail, x_shape=(2, C, 5, 4), consts=None, **kw):
    """x -> BatchNormalization -> ``tail`` nodes; the last node writes "y"."""
    nodes = [bn_node()] + tail
    return make_model(nodes, x_shape, "y", {**bn_params(), **(consts or {})}, **kw)


def feeds_for(model, seed=5):
    graph = parse_model(model.SerializeToString())
    feeds = {}
    for name in graph.inputs:
        info = graph.values[name]
        feeds[name] = rand(seed, *info.shape, dtype=info.dtype)
        seed += 1
    return feeds


def optimize(model):
    return run_passes(parse_model(model.SerializeToString()), 2)


def check(model, tol=TOL):
    """-O2 graph (interpreted, with every value checked against its inferred info) and the
    compiled plan (arena outputs) both match onnxruntime on the original model."""
    feeds = feeds_for(model)
    want = ort_outputs(model, feeds)
    graph = optimize(model)
    infos = infer_shapes(graph, {k: TensorInfo(v.dtype, v.shape) for k, v in feeds.items()})
    got = Interpreter(graph).run({k: v.copy() for k, v in feeds.items()}, expected=infos)
    planned = CompiledModel(compile_graph(parse_model(model.SerializeToString()), CompileOptions())).run(feeds)
    for name, w in want.items():
        assert got[name].dtype == w.dtype and got[name].shape == w.shape, name
        np.testing.assert_allclose(got[name], w, err_msg=name, **tol)
        np.testing.assert_allclose(planned[name], w, err_msg=f"compiled: {name}", **tol)
    return graph


def ops(graph):
    return [n.op_type for n in graph.nodes]


def scale_shift_node(graph):
    (node,) = [n for n in graph.nodes if n.op_type == "ScaleShift"]
    assert node.domain == "nncc"
    return node


# -- the rewrite --------------------------------------------------------------------------


def test_pass_runs_after_the_conv_folds_and_before_activation_fusion():
    names = [p.name for p in passes_for(2)]
    assert names.index("fold_batchnorm_into_conv") < names.index("batchnorm_to_scale_shift")
    assert names.index("fold_scale_shift_into_conv") < names.index("batchnorm_to_scale_shift")
    assert names.index("batchnorm_to_scale_shift") < names.index("fuse_activation")
    assert "batchnorm_to_scale_shift" not in [p.name for p in passes_for(1)]


def test_bn_mul_add_relu_becomes_one_scale_shift(tmp_path):
    consts = {"m": rand(10, C, 1, 1), "a": rand(11, 1, C, 1, 1)}
    model = chain_model([helper.make_node("Mul", ["b", "m"], ["bm"]),
                         helper.make_node("Add", ["bm", "a"], ["ba"]),
                         helper.make_node("Relu", ["ba"], ["y"])], consts=consts)
    graph = check(model)
    assert ops(graph) == ["ScaleShift"]
    node = scale_shift_node(graph)
    assert node.attrs == {"activation": "Relu"} and node.name == "bn"
    assert node.inputs[0] == "x" and node.outputs == ["y"]
    for name in node.inputs[1:]:
        assert graph.initializers[name].shape == (C,) and graph.initializers[name].dtype == np.float32
    # through the whole compiler: the plan runs ScaleShift, writing into the arena/outputs
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    compiled = nncc.compile_model(path)
    assert [k.split("::")[1] for k in compiled.plan.kernels] == ["ScaleShift"]
    feeds = feeds_for(model)
    np.testing.assert_allclose(compiled.run(feeds)["y"], ort_outputs(model, feeds)["y"], **TOL)


@pytest.mark.parametrize("tail, consts, remaining", [
    # constants on either side, scalar / (C,) -> (C,1,1) / rank-4 per-channel shapes
    (["Mul(m,b)", "Sub(bm,a)"], {"m": rand(10, 1, C, 1, 1), "a": rand(11, C, 1, 1)}, []),
    (["Sub(a,b)", "Mul(bm,m)"], {"m": np.array(1.5, np.float32), "a": rand(11, C, 1, 1)}, []),
    (["Add(a,b)", "Add(bm,m)", "Mul(ba,c)"],
     {"a": rand(11, C, 1, 1), "m": np.array([0.25], np.float32), "c": rand(12, C, 1, 1)}, []),
    (["Mul(b,m)"], {"m": rand(10, 1, 1, 1)}, []),
    # the last Mul varies over space: it stays, the rest fuses
    (["Add(b,a)", "Mul(bm,m)"], {"a": rand(11, C, 1, 1), "m": rand(10, 1, 5, 4)}, ["Mul"]),
])
def test_per_channel_mul_add_sub_are_absorbed(tail, consts, remaining):
    nodes, prev = [], "b"
    outs = ["bm", "ba", "y"]
    for i, spec in enumerate(tail):
        op, args = spec[:-1].split("(")
        a, b = args.split(",")
        out = "y" if i == len(tail) - 1 else outs[i]
        nodes.append(helper.make_node(op, [a, b], [out]))
    graph = check(chain_model(nodes, consts=consts))
    assert ops(graph) == ["ScaleShift"] + remaining
    assert "activation" not in scale_shift_node(graph).attrs


@pytest.mark.parametrize("act, attrs, inputs, consts", [
    ("Clip", {}, ["lo", "hi"], {"lo": np.array(-0.5, np.float32), "hi": np.array(1.0, np.float32)}),
    ("Clip", {}, ["lo"], {"lo": np.array(0.0, np.float32)}),
    ("LeakyRelu", {"alpha": 0.2}, [], {}),
    ("Sigmoid", {}, [], {}),
    ("HardSwish", {}, [], {}),
])
def test_activations_fuse_into_scale_shift(act, attrs, inputs, consts):
    model = chain_model([helper.make_node("Add", ["b", "a"], ["ba"]),
                         helper.make_node(act, ["ba"] + inputs, ["y"], **attrs)],
                        consts={"a": rand(11, C, 1, 1), **consts})
    graph = check(model)
    assert ops(graph) == ["ScaleShift"]
    assert scale_shift_node(graph).attrs["activation"] == act


@pytest.mark.parametrize("x_shape", [(3, C), (2, C, 7), (1, C, 2, 3, 4)])
def test_other_ranks(x_shape):
    tail = [helper.make_node("Relu", ["b"], ["y"])]
    graph = check(chain_model(tail, x_shape=x_shape))
    assert ops(graph) == ["ScaleShift"]


def test_float64_and_old_opsets():
    model = make_model([bn_node(), helper.make_node("Mul", ["b", "m"], ["bm"]),
                        helper.make_node("Relu", ["bm"], ["y"])],
                       (2, C, 3, 3), "y", {**bn_params(dtype=np.float64), "m": rand(9, C, 1, 1, dtype=np.float64)},
                       elem=TensorProto.DOUBLE)
    graph = check(model, tol=dict(rtol=1e-10, atol=1e-12))
    assert ops(graph) == ["ScaleShift"]
    assert graph.initializers[scale_shift_node(graph).inputs[1]].dtype == np.float64
    model = chain_model([helper.make_node("Mul", ["b", "m"], ["bm"]),
                         helper.make_node("Relu", ["bm"], ["y"])], consts={"m": rand(9, C, 1, 1)}, opset=9)
    assert ops(check(model)) == ["ScaleShift"]


def test_bn_output_that_is_a_graph_output_still_becomes_scale_shift():
    model = make_model([bn_node(y="b")], (2, C, 3, 3), "b", bn_params())
    graph = check(model)
    assert ops(graph) == ["ScaleShift"] and graph.nodes[0].outputs == ["b"]


# -- what must stay -----------------------------------------------------------------------


def test_run_time_parameters_are_not_rewritten():
    params = bn_params()
    del params["mean"]
    model = make_model([bn_node(), helper.make_node("Relu", ["b"], ["y"])], (2, C, 3, 3), "y", params,
                       extra_inputs=[("mean", (C,))])
    graph = check(model)
    assert ops(graph) == ["BatchNormalization", "Relu"]


@pytest.mark.parametrize("m", [rand(10, C, 5, 4), rand(10, 1, 1, 5, 4), rand(10, 2, C, 1, 1),
                               rand(10, 1, 1, 1, 1, 1)])
def test_mul_by_a_tensor_not_per_channel_is_not_absorbed(m):
    model = chain_model([helper.make_node("Mul", ["b", "m"], ["bm"]),
                         helper.make_node("Relu", ["bm"], ["y"])], consts={"m": m})
    graph = check(model)
    assert ops(graph) == ["ScaleShift", "Mul", "Relu"]


def test_run_time_mul_operand_is_not_absorbed():
    model = make_model([bn_node(), helper.make_node("Mul", ["b", "m"], ["y"])], (2, C, 3, 3), "y",
                       bn_params(), extra_inputs=[("m", (C, 1, 1))])
    assert ops(check(model)) == ["ScaleShift", "Mul"]


def test_intermediate_used_twice_is_not_absorbed():
    # the BN output feeds the Mul and a second node
    model = make_model([bn_node(), helper.make_node("Mul", ["b", "m"], ["bm"]),
                        helper.make_node("Relu", ["bm"], ["y"]),
                        helper.make_node("Sigmoid", ["b"], ["z"])],
                       (2, C, 3, 3), "y", {**bn_params(), "m": rand(10, C, 1, 1)}, extra_outputs=["z"])
    graph = check(model)
    assert ops(graph) == ["ScaleShift", "Mul", "Relu", "Sigmoid"]
    # the Mul output is also a graph output: the Mul fuses, the Relu does not
    model = make_model([bn_node(), helper.make_node("Mul", ["b", "m"], ["bm"]),
                        helper.make_node("Relu", ["bm"], ["y"])],
                       (2, C, 3, 3), "y", {**bn_params(), "m": rand(10, C, 1, 1)}, extra_outputs=["bm"])
    graph = check(model)
    assert ops(graph) == ["ScaleShift", "Relu"]
    assert "activation" not in graph.nodes[0].attrs


def test_training_mode_is_not_rewritten():
    nodes = [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"],
                              ["b", "rm", "rv"], training_mode=1),
             helper.make_node("Relu", ["b"], ["y"])]
    model = make_model(nodes, (2, C, 3, 3), "y", bn_params(), opset=15)
    graph = parse_model(model.SerializeToString())
    assert ops(batchnorm_to_scale_shift(graph)) == ["BatchNormalization", "Relu"]
    assert "BatchNormalization" in ops(run_passes(graph, 2))
    # opset 9: extra outputs mean training mode
    nodes = [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"],
                              ["b", "rm", "rv", "sm", "sv"]),
             helper.make_node("Relu", ["b"], ["y"])]
    graph = parse_model(make_model(nodes, (2, C, 3, 3), "y", bn_params(), opset=9).SerializeToString())
    assert ops(batchnorm_to_scale_shift(graph)) == ["BatchNormalization", "Relu"]


def test_float16_is_left_alone():
    model = make_model([bn_node(), helper.make_node("Relu", ["b"], ["y"])], (2, C, 3, 3), "y",
                       bn_params(dtype=np.float16), elem=TensorProto.FLOAT16)
    assert ops(optimize(model)) == ["BatchNormalization", "Relu"]


def test_bn_after_conv_still_folds_into_the_conv():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), bn_node(x="c"),
             helper.make_node("Relu", ["b"], ["y"])]
    model = make_model(nodes, (1, 3, 6, 6), "y", {**bn_params(), "w": rand(20, C, 3, 3, 3)})
    graph = check(model, tol=dict(rtol=1e-3, atol=1e-4))
    assert ops(graph) == ["FusedConv"]


def test_input_graph_is_not_modified():
    model = chain_model([helper.make_node("Mul", ["b", "m"], ["y"])], consts={"m": rand(10, C, 1, 1)})
    graph = parse_model(model.SerializeToString())
    before = [(n.op_type, list(n.inputs), list(n.outputs), dict(n.attrs)) for n in graph.nodes]
    inits = dict(graph.initializers)
    after = batchnorm_to_scale_shift(graph)
    assert after is not graph and ops(after) == ["ScaleShift"]
    assert [(n.op_type, list(n.inputs), list(n.outputs), dict(n.attrs)) for n in graph.nodes] == before
    assert graph.initializers == inits


# -- the kernel itself --------------------------------------------------------------------


def _kernel():
    return resolve("ScaleShift", "nncc", 1)


def test_kernel_writes_into_out_and_reuses_its_views():
    k = _kernel()
    x = rand(1, 2, C, 4, 3)
    s, b = rand(2, C), rand(3, C)
    ctx = Ctx({"activation": "Relu"}, 1, 1, "n")
    out = np.full(x.shape, np.nan, np.float32)
    y = k.fn(ctx, x, s, b, out=(out,))
    assert y is out
    want = np.maximum(x * s.reshape(C, 1, 1) + b.reshape(C, 1, 1), 0)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
    # other parameter arrays on the same node (a writable run-time input) are used, not stale ones
    s2 = rand(4, C)
    np.testing.assert_allclose(k.fn(ctx, x, s2, b), np.maximum(x * s2.reshape(C, 1, 1) + b.reshape(C, 1, 1), 0),
                               rtol=1e-6, atol=1e-6)
    s2 *= 2  # same array, new contents
    np.testing.assert_allclose(k.fn(ctx, x, s2, b), np.maximum(x * s2.reshape(C, 1, 1) + b.reshape(C, 1, 1), 0),
                               rtol=1e-6, atol=1e-6)


def test_kernel_and_shape_errors():
    k = _kernel()
    ctx = Ctx({}, 1, 1, "bn7")
    with pytest.raises(KernelError, match="bn7.*length 6"):
        k.fn(ctx, rand(1, 2, C, 3), rand(2, C + 1), rand(3, C))
    with pytest.raises(KernelError, match="rank >= 2"):
        k.fn(ctx, rand(1, C), rand(2, C), rand(3, C))
    f32 = np.dtype(np.float32)
    with pytest.raises(ShapeInferenceError, match="5 values but X has 6 channels"):
        k.shape(ctx, TensorInfo(f32, (1, C, 2)), TensorInfo(f32, (5,)), TensorInfo(f32, (C,)))
    (info,) = k.shape(ctx, TensorInfo(f32, ("n", C, None)), TensorInfo(f32, (C,)), TensorInfo(f32, (C,)))
    assert info.dtype == f32 and info.shape == ("n", C, None)
    (info,) = k.shape(ctx, TensorInfo(f32, None), TensorInfo(f32, (C,)), TensorInfo(f32, (C,)))
    assert info.shape is None


# -- light_densenet121 ---------------------------------------------------------------------


@pytest.mark.slow
def test_densenet121_matches_onnxruntime():
    path = light_models_dir() / "light_densenet121.onnx"
    if not path.exists():
        pytest.skip(f"{path.name} is not in this onnx wheel")
    compiled = nncc.compile_model(path)
    kernels = [compiled.plan.kernels[i.kernel].split("::")[1] for i in compiled.plan.instructions]
    assert kernels.count("ScaleShift") == 62
    assert not {"BatchNormalization", "Mul", "Add", "Relu"} & set(kernels)
    relu = [i for i in compiled.plan.instructions if compiled.plan.kernels[i.kernel].endswith("::ScaleShift::1")]
    assert all(i.attrs.get("activation") == "Relu" for i in relu)
    model = onnx.load(str(path))
    x = np.random.default_rng(3).random((1, 3, 224, 224)).astype(np.float32)
    want = ort_outputs(model, {"data_0": x})
    got = compiled.run({"data_0": x})
    for name, w in want.items():
        assert np.abs(w).max() > 0.1  # a meaningful comparison (no softmax saturation)
        np.testing.assert_allclose(got[name], w, rtol=1e-3, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("act, node_inputs, consts", [
    ("Relu", [], {}),
    ("Clip", ["lo", "hi"], {"lo": np.array(-0.25, np.float32), "hi": np.array(0.5, np.float32)}),
])
def test_kernel_activation_on_special_values_matches_onnxruntime(act, node_inputs, consts):
    # long enough for whole bound rows and a tail; NaN, infinities and signed zeros included
    x = rand(8, 1, 2, 16384 + 37)
    x[0, 0, :6] = [np.nan, -np.inf, np.inf, -0.0, 0.0, -3.0]
    x[0, 1, -3:] = [np.nan, -np.inf, -0.0]
    model = make_model([helper.make_node(act, ["x"] + node_inputs, ["y"])], x.shape, "y", consts)
    want = ort_outputs(model, {"x": x})["y"]
    attrs = {"activation": act}
    if act == "Clip":
        attrs.update(activation_min=-0.25, activation_max=0.5)
    ones, zeros = np.ones(2, np.float32), np.zeros(2, np.float32)
    got = _kernel().fn(Ctx(attrs, 1, 1, "n"), x, ones, zeros, out=(np.empty_like(x),))
    np.testing.assert_array_equal(got, want)
