"""The pixel-major int8 convolution's NHWC byte image built 16 channels x 16 pixels at a time
(nncc/native/int8_transpose.py) from the NCHW bytes a depthwise step stores, or from a float
image: pure data movement and q_byte's recovery, so every output must be onnxruntime's
QLinearConv result bit for bit, and the bits of the byte-by-byte loop it replaces. The
layers straddle the blocks: channels below, at and past 16 and its multiples, image rows
and whole unpadded images of fewer than 16 pixels, exactly 16 and past them, padding
around the pixels, a batch of two.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.native import int8_conv_cm, int8_conv_gen, int8_transpose
from nncc.native.int8_gemm_gen import MR, NR
from nncc.native.toolchain import find_toolchain

# (batch, channels, height, width, output channels, the ungrouped layer's kernel, its pads)
LAYERS = [(1, 16, 4, 4, 64, 1, 0),     # one block of pixels, one of channels, no padding
          (2, 17, 5, 7, 96, 1, 0),     # 35 pixels: two blocks and 3 bytewise; channels past a block
          (1, 40, 7, 7, 128, 1, 0),    # 49 pixels of 7-pixel rows, as one run; two panels
          (1, 33, 9, 16, 64, 3, 1),    # rows of exactly 16 pixels, padded
          (1, 48, 6, 21, 64, 3, 1),    # rows of 21: a block and 5 bytewise, padded
          (1, 15, 8, 8, 64, 1, 0)]     # 15 channels: the byte-by-byte loop throughout


def _sources(c, h, w, m, k, pad, byte_in):
    return int8_conv_gen._conv_source("q_conv", 1, c, h, w, m, k, k, h, w, 1, 1, 1, 1, pad, pad, byte_in=byte_in)


def test_the_layers_read_their_inputs_through_the_blocks_where_they_have_16_channels():
    for n, c, h, w, m, k, pad in LAYERS:
        assert not int8_conv_cm.preferred(h * w, m, MR, NR), "a layer of the channel-major form"
        for byte_in, call in (("nchw", "qt_nhwc("), (None, "qt_nhwc_float(")):
            text = _sources(c, h, w, m, k, pad, byte_in)
            assert (call in text) == (c >= 16), (c, byte_in)
            assert ("qc_transpose_blocks, &j" in text) == (c >= 16 and pad == 0), (c, pad, byte_in)
    assert "qt_" not in _sources(32, 5, 5, 64, 1, 0, "nhwc")  # NHWC bytes are copied whole


def _model(rng, path):
    """Per LAYERS entry i, two chains from input x{i}: QuantizeLinear -> depthwise 3x3
    QLinearConv (its output NCHW bytes) -> the ungrouped QLinearConv -> y{i}; and
    QuantizeLinear -> the ungrouped QLinearConv on the float image -> f{i}. uint8 and int8
    activations, per-channel weight scales, int32 bias."""
    nodes, inputs, outputs, inits = [], [], [], []

    def conv(i, tag, x_names, c, m, k, pad, group):
        weights = rng.integers(-127, 128, (m, c // group, k, k)).astype(np.int8)
        w_scale = rng.uniform(0.002, 0.02, m).astype(np.float32)
        act = np.uint8 if i % 2 == 0 else np.int8
        y_scale = np.float32(0.02 * 0.01 * np.sqrt(c // group * k * k) * rng.uniform(20, 60))
        zero = int(rng.integers(60, 196)) if act == np.uint8 else int(rng.integers(-20, 21))
        values = {f"w{tag}": weights, f"ws{tag}": w_scale, f"wz{tag}": np.zeros(m, np.int8),
                  f"ys{tag}": np.array(y_scale), f"yz{tag}": np.array(zero, act),
                  f"b{tag}": rng.integers(-3000, 3000, m).astype(np.int32)}
        inits.extend(numpy_helper.from_array(value, name) for name, value in values.items())
        nodes.append(helper.make_node("QLinearConv", [*x_names, f"w{tag}", f"ws{tag}", f"wz{tag}", f"ys{tag}",
                                                      f"yz{tag}", f"b{tag}"], [f"q{tag}"], kernel_shape=[k, k],
                                      pads=[pad] * 4, group=group))
        return [f"q{tag}", f"ys{tag}", f"yz{tag}"]

    for i, (n, c, h, w, m, k, pad) in enumerate(LAYERS):
        act = np.uint8 if i % 2 == 0 else np.int8
        zero = int(rng.integers(60, 196)) if act == np.uint8 else int(rng.integers(-20, 21))
        inits += [numpy_helper.from_array(np.array(np.float32(0.02)), f"xs{i}"),
                  numpy_helper.from_array(np.array(zero, act), f"xz{i}")]
        nodes.append(helper.make_node("QuantizeLinear", [f"x{i}", f"xs{i}", f"xz{i}"], [f"xq{i}"]))
        x = [f"xq{i}", f"xs{i}", f"xz{i}"]
        for out, chain in ((f"y{i}", conv(i, f"p{i}", conv(i, f"d{i}", x, c, c, 3, 1, c), c, m, k, pad, 1)),
                           (f"f{i}", conv(i, f"g{i}", x, c, m, k, pad, 1))):
            nodes.append(helper.make_node("DequantizeLinear", chain, [out]))
            outputs.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, None))
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, (n, c, h, w)))
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.slow  # compiles C
@pytest.mark.skipif(find_toolchain(sanitize=False) is None, reason="no C compiler: the int8 convolutions stay portable")
def test_transposed_images_give_onnxruntimes_result_and_the_bytewise_bits(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    path = tmp_path / "q.onnx"
    _model(rng, path)
    feeds = {f"x{i}": (rng.standard_normal((n, c, h, w)) * 2.0).astype(np.float32)
             for i, (n, c, h, w, *_) in enumerate(LAYERS)}
    feeds["x1"][0, 3, 2, :3] = [np.inf, -np.inf, 1e30]  # saturate at both ends
    monkeypatch.setenv("NNCC_CACHE_DIR", str(tmp_path / "cache"))
    model = nncc.compile_model(path)
    assert model.native_partitions >= 1
    got = model.run(feeds)
    # the byte-by-byte loop: no layer takes the blocks
    monkeypatch.setattr(int8_transpose, "wanted", lambda byte_in, c: False)
    monkeypatch.setenv("NNCC_CACHE_DIR", str(tmp_path / "bytewise-cache"))
    bytewise = nncc.compile_model(path).run(feeds)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    for i, layer in enumerate(LAYERS):
        for name in (f"y{i}", f"f{i}"):
            assert np.count_nonzero(expected[name]) > expected[name].size // 4, "a layer that says little"
            np.testing.assert_array_equal(got[name], expected[name], err_msg=f"{name}: layer {layer}")
            np.testing.assert_array_equal(got[name], bytewise[name], err_msg=f"{name}: layer {layer}")
