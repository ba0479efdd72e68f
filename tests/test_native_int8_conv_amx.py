"""The pixel-major int8 convolution on AMX tiles (nncc/native/int8_conv_amx_gen.py), where
the CPU has amx_tile and amx_int8: its integer sums are exact and its epilogue is the
vpdpbusd path's, so each output must be onnxruntime's QLinearConv result (which requantizes
in float32 as nncc does) bit for bit, and the same bits the vpdpbusd tiles compute, both
where ``NNCC_AMX=0`` turns the tiles off at run time (what the runtime also does when Linux
refuses them) and in code compiled without the tiles' padding at all. The layers straddle
every remainder: output pixels below, at and past the 32-pixel block, K (channels x taps)
not a multiple of 4 or of the tile's 64 bytes, output channels not a multiple of the
16-channel tile or the 64-channel panel (one panel, whose rows each task gathers, and
several, gathered in a pass of their own), stride 2, a batch of two.
"""

from __future__ import annotations


import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.native import amx, int8_conv_amx_gen, int8_conv_cm
from nncc.native.int8_gemm_gen import MR, NR
from nncc.native.toolchain import find_toolchain
from tests.test_native_int8_amx import runs_with_tiles_on_and_off

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    find_toolchain(sanitize=False) is None or not amx.usable("native", "amx_int8"),
    reason="no C compiler, or this CPU lacks amx_tile or amx_int8 (the vpdpbusd convolution then runs, which "
           "tests/test_native_fuzz.py's qconv kinds check)")]

# (batch, input channels, height, width, output channels, kernel, stride): pixels = the output's H x W
LAYERS = [(1, 3, 3, 3, 64, 1, 1),      # 9 pixels: one block, mostly padding rows
          (1, 16, 4, 8, 48, 1, 1),     # 32 pixels, K 16 (a quarter of a tile)
          (1, 65, 5, 7, 70, 1, 1),     # 35 pixels, K 65, two panels
          (2, 7, 9, 11, 63, 3, 1),     # K 63, 99 pixels, 63 channels
          (1, 32, 14, 14, 190, 3, 2),  # K 288, stride 2, three panels
          (1, 100, 7, 7, 128, 1, 1)]   # 49 pixels, K 100


def _model(rng, path):
    """One QuantizeLinear -> QLinearConv -> DequantizeLinear per LAYERS entry (input x{i},
    output y{i}): int8 weights, some at their extremes, per-channel scales and bias on
    alternate layers, uint8 and int8 activations."""
    nodes, inputs, outputs, inits = [], [], [], []
    for i, (n, c, h, w, m, k, stride) in enumerate(LAYERS):
        act = TensorProto.UINT8 if i % 2 == 0 else TensorProto.INT8
        act_np = np.uint8 if act == TensorProto.UINT8 else np.int8
        weights = np.where(rng.random((m, c, k, k)) < 0.2, rng.choice([-127, 127], (m, c, k, k)),
                           rng.integers(-127, 128, (m, c, k, k))).astype(np.int8)
        w_scale = (rng.uniform(0.002, 0.02, m) if i % 2 else np.array(0.01)).astype(np.float32)
        x_scale = np.float32(rng.uniform(0.01, 0.03))
        y_scale = np.float32(x_scale * 0.01 * np.sqrt(c * k * k) * rng.uniform(20, 60))
        zero = (lambda: int(rng.integers(60, 196))) if act_np == np.uint8 else (lambda: int(rng.integers(-20, 21)))
        values = {f"xs{i}": np.array(x_scale), f"xz{i}": np.array(zero(), act_np), f"w{i}": weights,
                  f"ws{i}": w_scale, f"wz{i}": np.zeros(w_scale.shape, np.int8),
                  f"ys{i}": np.array(y_scale, np.float32), f"yz{i}": np.array(zero(), act_np)}
        names = [f"xq{i}", f"xs{i}", f"xz{i}", f"w{i}", f"ws{i}", f"wz{i}", f"ys{i}", f"yz{i}"]
        if i % 2 == 0:
            values[f"b{i}"] = rng.integers(-3000, 3000, m).astype(np.int32)
            names.append(f"b{i}")
        inits += [numpy_helper.from_array(value, name) for name, value in values.items()]
        nodes += [helper.make_node("QuantizeLinear", [f"x{i}", f"xs{i}", f"xz{i}"], [f"xq{i}"]),
                  helper.make_node("QLinearConv", names, [f"yq{i}"], kernel_shape=[k, k], strides=[stride, stride],
                                   pads=[k // 2] * 4),
                  helper.make_node("DequantizeLinear", [f"yq{i}", f"ys{i}", f"yz{i}"], [f"y{i}"])]
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, (n, c, h, w)))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_every_layer_takes_the_pixel_major_form():
    for n, c, h, w, m, k, stride in LAYERS:
        pixels = -(-h // stride) * -(-w // stride)
        assert int8_conv_amx_gen.wanted(16, pixels)
        assert not int8_conv_cm.preferred(pixels, m, MR, NR), (n, c, h, w, m, k, stride)


def test_tiles_give_onnxruntimes_result_and_the_vpdpbusd_bits(tmp_path, monkeypatch):
    rng = np.random.default_rng(12)
    path = tmp_path / "q.onnx"
    _model(rng, path)
    feeds = {f"x{i}": (rng.standard_normal((n, c, h, w)) * 2.0).astype(np.float32)
             for i, (n, c, h, w, *_) in enumerate(LAYERS)}
    runs = runs_with_tiles_on_and_off(path, feeds, tmp_path)
    # compiled without the tiles' padding or product: the vpdpbusd convolution alone
    monkeypatch.setattr(int8_conv_amx_gen, "wanted", lambda vl, pixels: False)
    monkeypatch.setenv("NNCC_CACHE_DIR", str(tmp_path / "plain-cache"))
    runs["plain"] = nncc.compile_model(path).run(feeds)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    for i, layer in enumerate(LAYERS):
        name = f"y{i}"
        assert np.count_nonzero(expected[name]) > expected[name].size // 4, "a layer that says little"
        for label, got in runs.items():
            np.testing.assert_array_equal(got[name], expected[name], err_msg=f"{label}: layer {layer}")
