"""carry_quantized_as_float: QOperator and QDQ graphs become nncc-domain ops on exact float
images, and compute what onnxruntime computes running the file.

The oracle is onnxruntime: it runs QLinearConv itself, and fuses a QDQ-wrapped Conv into
the same integer convolution. nncc's QConv requantizes in float32 as onnxruntime does, so a
convolution's output is compared for equality; after QLinearAdd (whose vectorised form in
onnxruntime is fixed point) one quantization step is allowed.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.frontend.onnx import parse_model
from nncc.kernels.qimage import image, quantize, recover
from nncc.native.toolchain import missing_features, required_features
from nncc.passes.pipeline import run_passes
from tests.oracle import ort_run

U8, S8 = TensorProto.UINT8, TensorProto.INT8


def _onnxruntime(model: onnx.ModelProto, feeds: dict) -> list:
    return ort_run(model, feeds)


def _const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _conv_weights(rng, m, cg, k, w_signed, per_channel, asymmetric):
    lo, hi = (-128, 127) if w_signed else (0, 255)
    w = rng.integers(lo, hi + 1, (m, cg, k, k)).astype(np.int8 if w_signed else np.uint8)
    count = m if per_channel else 1
    shape = (count,) if per_channel else ()
    scale = (rng.uniform(0.002, 0.02, count).astype(np.float32)).reshape(shape)
    if asymmetric:
        zero = rng.integers(lo // 4 if w_signed else 100, hi // 4 if w_signed else 156, count)
    else:
        zero = np.zeros(count, np.int64) + (0 if w_signed else 128)
    return w, scale, zero.astype(w.dtype).reshape(shape)


GEOMETRIES = {
    # name: (n, c, h, w, m, k, stride, pad, dilation, group)
    "3x3": (1, 16, 9, 9, 24, 3, 1, 1, 1, 1),
    "1x1-odd": (2, 5, 7, 6, 11, 1, 1, 0, 1, 1),
    "7x7-stride2": (1, 3, 20, 19, 8, 7, 2, 3, 1, 1),
    "dilated": (1, 6, 11, 11, 7, 3, 1, 2, 2, 1),
    "depthwise": (1, 12, 10, 10, 12, 3, 2, 1, 1, 12),
    # rows long enough for the native depthwise code's row-by-row quantizing, stride 1 and 2
    "depthwise-long-rows": (1, 5, 6, 41, 5, 3, 1, 1, 1, 5),
    "depthwise-long-rows-stride2": (1, 3, 7, 38, 3, 3, 2, 1, 1, 3),
    "grouped": (1, 8, 8, 8, 6, 3, 1, 1, 1, 2),
    # many output channels over few pixels: the native code's pixel-major form (the others
    # take its channel-major form)
    "wide-3x3": (2, 8, 5, 5, 70, 3, 1, 1, 1, 1),
}
WEIGHTS = {
    "s8-per-channel": (True, True, False),
    "u8-per-tensor-asymmetric": (False, False, True),
    "s8-per-channel-asymmetric": (True, True, True),
}


def qlinear_conv_model(geometry, weights, x_signed=False, seed=0):
    """QuantizeLinear -> QLinearConv -> DequantizeLinear, with a bias."""
    n, c, h, w_, m, k, stride, pad, dilation, group = GEOMETRIES[geometry]
    rng = np.random.default_rng(seed)
    w, w_scale, w_zero = _conv_weights(rng, m, c // group, k, *WEIGHTS[weights])
    x_zero = np.array(-3 if x_signed else 121, np.int8 if x_signed else np.uint8)
    y_zero = np.array(5 if x_signed else 97, x_zero.dtype)
    inits = [_const("xs", np.float32(0.05)), _const("xz", x_zero), _const("w", w), _const("ws", w_scale),
             _const("wz", w_zero), _const("ys", np.float32(0.11)), _const("yz", y_zero),
             _const("b", rng.integers(-3000, 3000, m).astype(np.int32))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("QLinearConv", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["yq"],
                              kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4,
                              dilations=[dilation, dilation], group=group),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    graph = helper.make_graph(nodes, "qconv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w_])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((n, c, h, w_)).astype(np.float32) * 3
    return model, x


def _all_native(compiled) -> bool:
    """Every partition of the plan is native code (nothing left to numpy)."""
    return all(p.backend == "native" for p in compiled.plan.partitions)


def _ops(model):
    graph = run_passes(parse_model(model.SerializeToString()), 2)
    return [(n.domain, n.op_type) for n in graph.nodes]


@pytest.mark.slow
@pytest.mark.parametrize("weights", list(WEIGHTS))
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_qlinear_conv_as_image_matches_onnxruntime_exactly(tmp_path, geometry, weights):
    # int8 activations once (onnxruntime pairs them with int8 weights only)
    model, x = qlinear_conv_model(geometry, weights, x_signed=geometry == "1x1-odd" and weights.startswith("s8"))
    assert _ops(model) == [("nncc", "QuantizeDequantize"), ("nncc", "QConv")]
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    expected = _onnxruntime(model, {"x": x})[0]
    portable = nncc.compile_model(path, backends=("numpy",)).run({"x": x})["y"]
    assert portable.dtype == np.float32 and portable.shape == expected.shape
    np.testing.assert_array_equal(portable, expected)
    compiled = nncc.compile_model(path)
    # groups other than depthwise stay portable
    assert compiled.native_partitions == 1 and _all_native(compiled) == (geometry != "grouped")
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], expected)


def test_depthwise_sum_beyond_float32_integers_is_exact(tmp_path):
    """A 17x17 depthwise kernel (289 taps) at the extremes: every product is 255 * 255, so the
    sum (18,792,225, odd) is above 2**24, where float32 no longer holds every integer. The
    bias cancels it down to 100, and y_scale = x_scale * w_scale makes the multiplier 1, so a
    sum off by one would show as 99 or 101."""
    c, k = 3, 17
    full = k * k * 255 * 255
    x_scale, w_scale = np.float32(0.5), np.float32(0.25)
    inits = [_const("xs", x_scale), _const("xz", np.uint8(255)), _const("w", np.zeros((c, 1, k, k), np.uint8)),
             _const("ws", w_scale), _const("wz", np.uint8(255)), _const("ys", x_scale * w_scale),
             _const("yz", np.uint8(20)), _const("b", np.full(c, 100 - full, np.int32))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("QLinearConv", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["yq"],
                              kernel_shape=[k, k], group=c),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    graph = helper.make_graph(nodes, "qconv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, k, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    x = np.full((1, c, k, k), -1000.0, np.float32)  # quantizes to 0: 0 - 255 per pixel
    expected = _onnxruntime(model, {"x": x})[0]
    np.testing.assert_array_equal(expected, np.full((1, c, 1, 1), 100 * x_scale * w_scale, np.float32))
    compiled = nncc.compile_model(path)
    assert _all_native(compiled)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], expected)


def _qdq_conv_model(seed=0, residual=True):
    """The QDQ form onnxruntime's quantizer writes: Q -> DQ around every activation, weights
    and int32 bias through DequantizeLinear; a second Conv, a residual Add, pooling and a
    Gemm head, each followed by Q -> DQ."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def q_dq(src, scale, zero, out):
        inits.extend([_const(f"{out}_s", np.float32(scale)), _const(f"{out}_z", np.uint8(zero))])
        nodes.append(helper.make_node("QuantizeLinear", [src, f"{out}_s", f"{out}_z"], [f"{out}_q"]))
        nodes.append(helper.make_node("DequantizeLinear", [f"{out}_q", f"{out}_s", f"{out}_z"], [out]))

    def conv(src, src_scale, m, c, out, scale, zero):
        w = rng.integers(-127, 128, (m, c, 3, 3)).astype(np.int8)
        ws = rng.uniform(0.002, 0.01, m).astype(np.float32)
        b = rng.integers(-2000, 2000, m).astype(np.int32)
        inits.extend([_const(f"{out}_w", w), _const(f"{out}_ws", ws), _const(f"{out}_wz", np.zeros(m, np.int8)),
                      _const(f"{out}_b", b), _const(f"{out}_bs", np.float32(src_scale) * ws),
                      _const(f"{out}_bz", np.zeros(m, np.int32))])
        nodes.append(helper.make_node("DequantizeLinear", [f"{out}_w", f"{out}_ws", f"{out}_wz"], [f"{out}_wf"], axis=0))
        nodes.append(helper.make_node("DequantizeLinear", [f"{out}_b", f"{out}_bs", f"{out}_bz"], [f"{out}_bf"], axis=0))
        nodes.append(helper.make_node("Conv", [src, f"{out}_wf", f"{out}_bf"], [f"{out}_f"], pads=[1, 1, 1, 1]))
        q_dq(f"{out}_f", scale, zero, out)

    q_dq("x", 0.04, 128, "x0")
    conv("x0", 0.04, 8, 4, "c1", 0.08, 120)
    conv("c1", 0.08, 8, 8, "c2", 0.07, 130)
    last, last_scale = "c2", 0.07
    if residual:
        nodes.append(helper.make_node("Add", ["c2", "c1"], ["a_f"]))
        q_dq("a_f", 0.1, 125, "a")
        last, last_scale = "a", 0.1
    nodes.append(helper.make_node("GlobalAveragePool", [last], ["p_f"]))
    q_dq("p_f", 0.02, 128, "p")
    nodes.append(helper.make_node("Flatten", ["p"], ["flat"]))
    w = rng.integers(-127, 128, (5, 8)).astype(np.int8)
    inits.extend([_const("g_w", w), _const("g_ws", np.float32(0.01)), _const("g_wz", np.int8(0)),
                  _const("g_b", rng.integers(-500, 500, 5).astype(np.int32)),
                  _const("g_bs", np.float32(np.float32(0.02) * np.float32(0.01))), _const("g_bz", np.int32(0))])
    nodes.append(helper.make_node("DequantizeLinear", ["g_w", "g_ws", "g_wz"], ["g_wf"]))
    nodes.append(helper.make_node("DequantizeLinear", ["g_b", "g_bs", "g_bz"], ["g_bf"]))
    nodes.append(helper.make_node("Gemm", ["flat", "g_wf", "g_bf"], ["g_f"], transB=1))
    q_dq("g_f", 0.05, 128, "y")
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 9, 9])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, rng.standard_normal((2, 4, 9, 9)).astype(np.float32) * 3


@pytest.mark.slow
def test_qdq_graph_becomes_the_quantized_ops_and_matches_onnxruntime(tmp_path):
    model, x = _qdq_conv_model()
    ops = _ops(model)
    assert ops == [("nncc", "QuantizeDequantize"), ("nncc", "QConv"), ("nncc", "QConv"), ("nncc", "QAdd"),
                   ("nncc", "QGlobalAveragePool"), ("", "Flatten"), ("nncc", "QGemm")]
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    expected = _onnxruntime(model, {"x": x})[0]
    portable = nncc.compile_model(path, backends=("numpy",)).run({"x": x})["y"]
    np.testing.assert_allclose(portable, expected, rtol=0, atol=0.05 * 1.0001)  # one output step
    native = nncc.compile_model(path)
    assert native.native_partitions == 1 and _all_native(native)
    np.testing.assert_array_equal(native.run({"x": x})["y"], portable)  # the same arithmetic


def test_qdq_convolutions_alone_match_onnxruntime_exactly(tmp_path):
    model, x = _qdq_conv_model(residual=False)
    # the convolutions' output, before pooling
    cut = helper.make_tensor_value_info("c2", TensorProto.FLOAT, None)
    model.graph.output.insert(0, cut)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    expected = _onnxruntime(model, {"x": x})[0]
    got = nncc.compile_model(path, backends=("numpy",)).run({"x": x})["c2"]
    np.testing.assert_array_equal(got, expected)


def test_images_give_their_quantized_values_back_exactly():
    """The premise: Q(DQ(q)) = q for every q, by division (QuantizeLinear) and by the
    reciprocal (how the image ops recover their integers), at scales over the whole range
    the pass accepts (normal floats, up to float32's largest / 512)."""
    rng = np.random.default_rng(4)
    tiny, large = np.finfo(np.float32).tiny, np.finfo(np.float32).max / 512
    scales = [np.float32(10.0 ** rng.uniform(-37.9, 35.8)) for _ in range(300)] + [np.float32(tiny), np.float32(large)]
    for dtype in (np.uint8, np.int8):
        q = np.arange(np.iinfo(dtype).min, np.iinfo(dtype).max + 1).astype(dtype)
        for scale in scales:
            zero = np.array(rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1), dtype)
            img = image(q, scale, zero)
            np.testing.assert_array_equal(quantize(img, scale, zero, "test"), q)
            np.testing.assert_array_equal(recover(img, scale, zero, "test"), q)


def test_quantized_values_still_needed_are_restored(tmp_path):
    """A quantized tensor that is a graph output keeps its exact integer values."""
    model, x = qlinear_conv_model("3x3", "s8-per-channel")
    model.graph.output.append(helper.make_tensor_value_info("yq", U8, None))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    expected = _onnxruntime(model, {"x": x})
    got = nncc.compile_model(path, backends=("numpy",)).run({"x": x})
    assert got["yq"].dtype == np.uint8
    np.testing.assert_array_equal(got["yq"], expected[1])
    np.testing.assert_array_equal(got["y"], expected[0])


# the classifier's shape: one row by 1000 columns, whole panels of 64 columns and a part one
HEAD = [(3, 37, 300), pytest.param((1, 1030, 1000), marks=pytest.mark.slow)]
# AVX-512 without VNNI: the grouped panels summed by the plain C loop
TARGETS = ["native", pytest.param("x86-64-v4", marks=[pytest.mark.slow, pytest.mark.skipif(
    bool(missing_features(required_features("x86-64-v4"))), reason="this CPU cannot run x86-64-v4 code")])]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", HEAD)
@pytest.mark.parametrize("b_type", [np.uint8, np.int8])
def test_qgemm_head_native_is_the_portable_kernel_bit_for_bit(tmp_path, b_type, shape, target):
    """com.microsoft QGemm (the QOperator head) with per-column scales and zero points:
    the native step's int8 B and zero-point correction give the portable kernel's values,
    and both match onnxruntime within one output step."""
    rng = np.random.default_rng(9)
    rows, k, n = shape
    y_scale = np.float32(0.2 * np.sqrt(k / 37))  # the sums grow as the root of K: few saturate
    lo, hi = np.iinfo(b_type).min, np.iinfo(b_type).max
    b = rng.integers(lo, hi + 1, (n, k)).astype(b_type)
    inits = [_const("xs", np.float32(0.05)), _const("xz", np.uint8(120)), _const("b", b),
             _const("bs", rng.uniform(0.002, 0.01, n).astype(np.float32)),
             _const("bz", rng.integers(lo // 8 + (0 if lo < 0 else 100), hi // 8 + (0 if lo < 0 else 100), n)
                    .astype(b_type)),
             _const("c", rng.integers(-4000, 4000, n).astype(np.int32)), _const("ys", y_scale),
             _const("yz", np.uint8(128))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("QGemm", ["xq", "xs", "xz", "b", "bs", "bz", "c", "ys", "yz"], ["yq"], domain="com.microsoft",
                              transB=1, alpha=1.0),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    graph = helper.make_graph(nodes, "qgemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    x = rng.standard_normal((rows, k)).astype(np.float32) * 3
    portable = nncc.compile_model(path, backends=("numpy",)).run({"x": x})["y"]
    native = nncc.compile_model(path, target=target)
    assert _all_native(native)
    np.testing.assert_array_equal(native.run({"x": x})["y"], portable)
    np.testing.assert_allclose(portable, _onnxruntime(model, {"x": x})[0], rtol=0, atol=float(y_scale) * 1.0001)


def _chain_model(rng, x_signed: bool):
    """Q -> pointwise -> depthwise -> 3x3 -> pointwise -> DQ (QOperator), each quantizing with
    the scale and zero point the next recovers with; the depthwise output is also an output
    of the model. The first layer takes the channel-major form (24 channels over 99 pixels),
    the last two the pixel-major one (40 and 64 channels over 30 pixels)."""
    act = np.int8 if x_signed else np.uint8
    c, layers = 6, [(24, 1, 1, 1), (24, 3, 2, 24), (40, 3, 1, 1), (64, 1, 1, 1)]  # (m, k, stride, group)
    inits = [_const("s0", np.float32(0.04)), _const("z0", np.array(-7 if x_signed else 120, act))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s0", "z0"], ["q0"])]
    for i, (m, k, stride, group) in enumerate(layers, start=1):
        w, w_scale, w_zero = _conv_weights(rng, m, c // group, k, True, True, False)
        inits += [_const(f"w{i}", w), _const(f"ws{i}", w_scale), _const(f"wz{i}", w_zero),
                  _const(f"s{i}", np.float32(0.04 * (1 + i))), _const(f"z{i}", np.array(3 * i if x_signed else 100 + i, act)),
                  _const(f"b{i}", rng.integers(-2000, 2000, m).astype(np.int32))]
        nodes.append(helper.make_node("QLinearConv", [f"q{i - 1}", f"s{i - 1}", f"z{i - 1}", f"w{i}", f"ws{i}", f"wz{i}",
                                                      f"s{i}", f"z{i}", f"b{i}"], [f"q{i}"], kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[k // 2] * 4, group=group))
        c = m
    nodes += [helper.make_node("DequantizeLinear", ["q4", "s4", "z4"], ["y"]),
              helper.make_node("DequantizeLinear", ["q2", "s2", "z2"], ["inner"])]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 9, 11])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "inner")],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.slow
@pytest.mark.parametrize("x_signed", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["uint8", "int8"])  # the quick tier takes the signed (shifted) form
def test_values_only_int8_convolutions_read_pass_between_them_as_bytes(tmp_path, x_signed):
    """The quantized input, read only by the first convolution, and the first convolution's
    output, read only by the depthwise one with the same scale and zero point, are handed
    over as bytes, NCHW; the depthwise output, also an output of the model, stays a float
    image; between the last two, both pixel-major, the bytes are NHWC. Both outputs are
    onnxruntime's exactly."""
    from nncc.backends.base import Partition
    from nncc.native.codegen import generate
    from nncc.passes.shape_inference import infer_shapes

    rng = np.random.default_rng(3)
    model = _chain_model(rng, x_signed)
    graph = run_passes(parse_model(model.SerializeToString()), 2)
    qconvs = [n for n in graph.nodes if n.op_type == "QConv"]
    assert len(qconvs) == 4
    part = Partition(0, "native", list(graph.nodes), list(graph.inputs), list(graph.outputs))
    unit = generate(part, graph, infer_shapes(graph), "entry", 16)
    quantize = [n for n in graph.nodes if n.op_type == "QuantizeDequantize"]
    assert len(quantize) == 1
    assert unit.byte_images == {quantize[0].outputs[0]: "nchw", qconvs[0].outputs[0]: "nchw",
                                qconvs[2].outputs[0]: "nhwc"}
    path = tmp_path / "chain.onnx"
    onnx.save(model, path)
    x = rng.standard_normal((2, 6, 9, 11)).astype(np.float32) * 3
    expected = dict(zip(("y", "inner"), _onnxruntime(model, {"x": x})))
    compiled = nncc.compile_model(path)
    assert _all_native(compiled)
    got = compiled.run({"x": x})
    for name in ("y", "inner"):
        np.testing.assert_array_equal(got[name], expected[name])


@pytest.mark.parametrize("x_signed", [False, True], ids=["uint8", "int8"])
@pytest.mark.parametrize("geometry", ["3x3", "1x1-odd", "depthwise", "wide-3x3"])
def test_non_finite_and_huge_inputs_quantize_as_onnxruntime_does(tmp_path, geometry, x_signed):
    """NaN quantizes to the lowest value and infinities and huge values saturate (the
    native QuantizeLinear before each form of the int8 convolution), as onnxruntime's
    QuantizeLinear does."""
    model, x = qlinear_conv_model(geometry, "s8-per-channel", x_signed=x_signed)
    flat = x.reshape(-1)
    flat[::7] = np.nan
    flat[1::11] = np.inf
    flat[2::13] = -np.inf
    flat[3::17] = 1e30
    flat[4::19] = -1e30
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    expected = _onnxruntime(model, {"x": x})[0]
    compiled = nncc.compile_model(path)
    assert _all_native(compiled)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], expected)
