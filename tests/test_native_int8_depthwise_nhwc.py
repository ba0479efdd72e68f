"""The native int8 depthwise convolution over NHWC bytes (nncc/native/int8_depthwise_nhwc.py):
a depthwise layer on a small plane between two 1x1 convolutions of the pixel-major form
reads and writes pixels with their channels side by side. Its output must equal
onnxruntime's (a quantized convolution is exact) and, bit for bit, the NCHW kernel's
(int8_depthwise_gen) on the same model with the NHWC form turned off. Channel counts at,
below and past the 32-lane blocks, 7 x 7, 14 x 14 and odd planes, strides 1 and 2, uneven
pads, weights with zero points, uint8 and int8 activations; and the plans that give the
step one side NCHW or a float image (a scale the neighbour does not share, a second reader)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.native import int8_conv_cm, int8_conv_gen, int8_depthwise_nhwc
from nncc.native.toolchain import find_toolchain
from tests.oracle import ort_run

pytestmark = pytest.mark.skipif(find_toolchain(sanitize=False) is None, reason="no C compiler")


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _model(rng, c, h, w, stride, pads, act, *, inner_output=False, second_reader=False, residual=False):
    """Q -> 1x1 QLinearConv -> depthwise 3x3 QLinearConv -> 1x1 QLinearConv -> DQ, each
    quantizing with the scale and zero point the next recovers with (so bytes pass between
    them); ``inner_output``: the first 1x1's output also an output of the model (so it
    stays a float image); ``second_reader``: the first 1x1's output also read by a
    second depthwise layer whose output is a float image (so that value stays NCHW);
    ``residual``: the depthwise output added (QLinearAdd) to a quantized second input instead
    of the second 1x1 (so the values the add joins stay NCHW)."""
    info = np.iinfo(act)
    zero = lambda: np.array(int(rng.integers(info.min, info.max + 1)), act)  # noqa: E731
    inits = [_const("s0", np.float32(0.02)), _const("z0", zero()), _const("s1", np.float32(0.05)),
             _const("z1", zero()), _const("s2", np.float32(0.06)), _const("z2", zero()),
             
             _const("s3", np.float32(0.08)), _const("z3", zero()),
             _const("pw", rng.integers(-128, 128, (c, c, 1, 1)).astype(np.int8)),
             _const("pws", rng.uniform(0.002, 0.01, c).astype(np.float32)), _const("pwz", np.zeros(c, np.int8)),
             _const("dw", rng.integers(-128, 128, (c, 1, 3, 3)).astype(np.int8)),
             _const("dws", rng.uniform(0.005, 0.02, c).astype(np.float32)),
             _const("dwz", rng.integers(-20, 21, c).astype(np.int8)),
             _const("b", rng.integers(-3000, 3000, c).astype(np.int32)),
             _const("qw", rng.integers(-128, 128, (24, c, 1, 1)).astype(np.int8)),
             _const("qws", rng.uniform(0.002, 0.01, 24).astype(np.float32)), _const("qwz", np.zeros(24, np.int8))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s0", "z0"], ["q0"]),
             helper.make_node("QLinearConv", ["q0", "s0", "z0", "pw", "pws", "pwz", "s1", "z1"], ["q1"]),
             helper.make_node("QLinearConv", ["q1", "s1", "z1", "dw", "dws", "dwz", "s2", "z2", "b"], ["q2"],
                              group=c, kernel_shape=[3, 3], pads=pads, strides=[stride, stride]),
             helper.make_node("QLinearConv", ["q2", "s2", "z2", "qw", "qws", "qwz", "s3", "z3"], ["q3"]),
             helper.make_node("DequantizeLinear", ["q3", "s3", "z3"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])]
    if residual:
        oh, ow = (h + pads[0] + pads[2] - 3) // stride + 1, (w + pads[1] + pads[3] - 3) // stride + 1
        inputs.append(helper.make_tensor_value_info("x2", TensorProto.FLOAT, [1, c, oh, ow]))
        inits += [_const("s4", np.float32(0.1)), _const("z4", zero())]
        nodes[3:] = [helper.make_node("QuantizeLinear", ["x2", "s0", "z0"], ["qx2"]),
                     helper.make_node("QLinearAdd", ["q2", "s2", "z2", "qx2", "s0", "z0", "s4", "z4"], ["q3"],
                                      domain="com.microsoft"),
                     helper.make_node("DequantizeLinear", ["q3", "s4", "z4"], ["y"])]
    if inner_output:
        nodes.append(helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["y1"]))
        outputs.append(helper.make_tensor_value_info("y1", TensorProto.FLOAT, None))
    if second_reader:  # (onnxruntime prepacks a weight once: the second layer has its own)
        inits += [_const("dw2", rng.integers(-128, 128, (c, 1, 3, 3)).astype(np.int8)),
                  _const("dws2", rng.uniform(0.005, 0.02, c).astype(np.float32)), _const("dwz2", np.zeros(c, np.int8))]
    if second_reader:  # a depthwise reader of q1 whose own output is a float image: q1 stays NCHW bytes
        nodes += [helper.make_node("QLinearConv", ["q1", "s1", "z1", "dw2", "dws2", "dwz2", "s3", "z3"], ["r1"],
                                   group=c, kernel_shape=[3, 3]),
                  helper.make_node("DequantizeLinear", ["r1", "s3", "z3"], ["y2"])]
        outputs.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "dw", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def _compile_and_run(tmp_path, monkeypatch, model, feeds, tag, nhwc: bool, target=None):
    """Every output of the model compiled (in a cache of its own) with the NHWC depthwise
    form on or off, and the forms (input, output) the NHWC step was generated for. The 1x1
    convolutions are held to the pixel-major form (which takes any shape; the channel-major
    one takes short-K pointwise layers from 150 pixels on), so every channel count here meets
    pixel-major neighbours."""
    forms = []
    source = int8_depthwise_nhwc.source

    def spy(*args, **kwargs):
        forms.append(args[-3:-1])
        return source(*args, **kwargs)

    monkeypatch.setattr(int8_depthwise_nhwc, "source", spy)
    monkeypatch.setattr(int8_conv_cm, "preferred", lambda *args: False)
    monkeypatch.setattr(int8_conv_gen, "_MANY_POINTWISE_PIXELS", 1 << 30)
    monkeypatch.setattr(int8_depthwise_nhwc, "SMALL_PLANE", 196 if nhwc else 0)
    monkeypatch.setenv("NNCC_CACHE_DIR", str(tmp_path / f"cache-{tag}"))
    path = tmp_path / f"{tag}.onnx"
    onnx.save(model, path)
    compiled = nncc.compile_model(path, **({"target": target} if target else {}))
    assert "native" in [p.backend for p in compiled.plan.partitions]
    out = compiled.run(feeds)
    return [out[name] for name in sorted(out)], forms


def _check(tmp_path, monkeypatch, rng, c, h, w, stride, pads, act, expected_forms, target=None, **kind):
    model = _model(rng, c, h, w, stride, pads, act, **kind)
    feeds = {i.name: (rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]) * 2).astype(np.float32)
             for i in model.graph.input}
    nhwc, forms = _compile_and_run(tmp_path, monkeypatch, model, feeds, "nhwc", True, target)
    assert forms == expected_forms
    nchw, none = _compile_and_run(tmp_path, monkeypatch, model, feeds, "nchw", False, target)
    assert none == []
    reference = ort_run(model, feeds)
    names = [o.name for o in model.graph.output]
    reference = [reference[names.index(name)] for name in sorted(names)]
    for got, base, want in zip(nhwc, nchw, reference):
        np.testing.assert_array_equal(got, base)
        if kind.get("residual"):  # onnxruntime's QLinearAdd rounds its own way: within one step of y
            np.testing.assert_allclose(got, want, rtol=0, atol=0.1 * 1.0001)
        else:
            np.testing.assert_array_equal(got, want)


QUICK = {(16, 7, 7, 1), (17, 7, 7, 1), (64, 14, 14, 2), (96, 5, 9, 1), (40, 9, 6, 2)}


@pytest.mark.parametrize("c, h, w, stride", [
    pytest.param(*case, marks=[] if case in QUICK else [pytest.mark.slow])
    for case in [(16, 7, 7, 1), (17, 7, 7, 1), (64, 7, 7, 1), (96, 5, 9, 1), (40, 9, 6, 2), (64, 14, 14, 2),
                 (64, 14, 14, 1), (96, 14, 14, 1), (960, 7, 7, 1), (576, 14, 14, 2), (33, 3, 11, 2)]])
@pytest.mark.parametrize("act", [np.uint8, np.int8])
def test_nhwc_depthwise_matches_nchw_kernel_and_onnxruntime(tmp_path, monkeypatch, c, h, w, stride, act):
    rng = np.random.default_rng(c * 1000 + h * 31 + w * 7 + stride + (act == np.int8))
    pads = [1, 1, 1, 1] if stride == 1 else [1, 0, 1, 2]
    _check(tmp_path, monkeypatch, rng, c, h, w, stride, pads, act, [("nhwc", "nhwc")])


@pytest.mark.parametrize("kind, forms", [
    (dict(inner_output=True), [(None, "nhwc")]),  # its input also an output: the float image in
    (dict(second_reader=True), [("nchw", "nhwc")]),  # its input read by a second step: NCHW bytes in
    (dict(residual=True), [("nhwc", "nchw")]),  # its output joined to a quantized input: NCHW bytes out
])
def test_nhwc_depthwise_takes_either_side_in_another_form(tmp_path, monkeypatch, kind, forms):
    rng = np.random.default_rng(len(str(kind)))
    _check(tmp_path, monkeypatch, rng, 40, 7, 7, 1, [1, 0, 1, 2], np.uint8, forms, **kind)


def _has_avx2() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return " avx2" in f.read()
    except OSError:
        return False


@pytest.mark.skipif(not _has_avx2(), reason="CPU lacks AVX2 (or no /proc/cpuinfo to say)")
@pytest.mark.parametrize("c, h, w, stride", [(17, 7, 7, 1), pytest.param(64, 14, 14, 2, marks=pytest.mark.slow),
                                             pytest.param(40, 5, 9, 1, marks=pytest.mark.slow)])
def test_nhwc_depthwise_built_for_avx2_matches_too(tmp_path, monkeypatch, c, h, w, stride):
    """The same built for AVX2 without AVX-512 (x86-64-v3): its 16-channel halves."""
    rng = np.random.default_rng(c + h + stride)
    _check(tmp_path, monkeypatch, rng, c, h, w, stride, [1, 1, 1, 1], np.uint8, [("nhwc", "nhwc")],
           target="x86-64-v3")
