"""The channel-major int8 convolution reading NHWC bytes in place (nncc/native/int8_conv_cm.py,
int8_bytes.py): an inverted residual's stream written by pixel-major projections and QAdds
stays NHWC while its pointwise expansions take the channel-major form, which packs its
operand from whole pixels (a transpose in 4-byte units, 16 x 16 words at a time on AVX-512,
plain C on the AVX2 and baseline targets).

Oracles as tests/test_native_int8_residual.py's: the portable plan bit for bit, and
onnxruntime within the few output steps its fixed-point QLinearAdd may move.
"""

from __future__ import annotations

import platform

import numpy as np
import onnx
import pytest
from onnx import helper

import nncc
from nncc.native.int8_conv_gen import pixel_major
from nncc.native.toolchain import find_toolchain, missing_features, required_features
from nncc.passes.pipeline import run_passes
from nncc.frontend.onnx import parse_model
from nncc.passes.shape_inference import infer_shapes
from tests.oracle import ort_run
from tests.int8_qchain import QChain
from tests.test_native_int8_residual import _byte_images

pytestmark = pytest.mark.skipif(find_toolchain(sanitize=False) is None, reason="no C compiler")
X86 = platform.machine() in ("x86_64", "AMD64")
# the host's best (AVX-512: the 16 x 16 transpose), AVX2 (the plain-C packing, the pairs
# kernel) where the host runs it, and the baseline x86-64 (plain C throughout)
TARGETS = ["native"] + (["x86-64"] if X86 else []) + (
    ["x86-64-v3"] if X86 and not missing_features(required_features("x86-64-v3")) else [])


def expansion_model(rng, act, c: int, e: int, hw: tuple[int, int], weights=np.int8, batch: int = 1):
    """Q -> 1x1 (8 -> e) -> q1 -> projection (e -> c) -> q2; q2 -> expansion (c -> e) -> q3 ->
    projection (e -> c) -> q4; QLinearAdd(q4, q2) -> q5; q5 -> expansion (c -> e) -> q6 ->
    DequantizeLinear. Each value quantizes with the scale and zero point its readers recover
    with; ``weights``: int8 with zero points 0, or uint8 with zero points around 128."""
    chain = QChain(rng, act, weights)
    chain.quantize("x", "q0", 0.02)
    chain.conv("q0", "q1", 8, e)
    chain.conv("q1", "q2", e, c)
    chain.conv("q2", "q3", c, e)
    chain.conv("q3", "q4", e, c)
    chain.add("q4", "q2", "q5")
    chain.conv("q5", "q6", c, e)
    chain.nodes.append(helper.make_node("DequantizeLinear", ["q6", "q6s", "q6z"], ["y"]))
    shape = [batch, 8, *hw]
    return chain.model("expansions", shape), (rng.standard_normal(shape) * 3).astype(np.float32), chain.scales["q6"]


def _forms(model) -> list[bool]:
    """Whether each QConv of the model takes the pixel-major form, in order."""
    graph = run_passes(parse_model(model.SerializeToString()), 2)
    infos = infer_shapes(graph)
    return [pixel_major(graph, infos, node) for node in graph.nodes if node.op_type == "QConv"]


# channels a whole 64-byte block, and fewer or more than one, not a multiple of 4 (the last
# word padded); pixels below, at and past a multiple of 64 (the channel-major tile) and of
# 16. (96 channels, MobileNetV2's, do not come up: its projections to 96 are channel-major,
# whose 6-channel slivers waste less than the pixel-major form's 64-channel panels.)
CASES = [(64, 192, (14, 14), np.uint8, np.int8), (125, 288, (13, 20), np.uint8, np.uint8),
         (62, 192, (16, 16), np.uint8, np.uint8), (64, 192, (9, 29), np.int8, np.int8)]


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("c, e, hw, act, weights", CASES, ids=["c64-196px", "c125-260px", "c62-256px", "c64-261px"])
def test_channel_major_expansions_read_the_nhwc_stream(tmp_path, target, c, e, hw, act, weights):
    """The projections (K = e) are pixel-major and the expansions (K = c, many pixels)
    channel-major; the stream (q2, q4, q5) is NHWC bytes nonetheless, and the outputs are
    the portable plan's bit for bit, uint8 weights with zero points (the pixels' sums over
    K, its padding bytes zero) included."""
    rng = np.random.default_rng(c + hw[1])
    model, x, scale = expansion_model(rng, act, c, e, hw, weights, batch=2)
    assert _forms(model)[1:] == [True, False, True, False]  # (the stem,) projection, expansion, projection, expansion
    images, names = _byte_images(model)
    # the stream NHWC; the expansion's output, which a pixel-major projection reads, NCHW
    assert {v: images[names[v]] for v in ("conv1", "conv2", "conv3", "add0")} == \
        {"conv1": "nhwc", "conv2": "nchw", "conv3": "nhwc", "add0": "nhwc"}
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    portable = nncc.compile_model(path, backends=("numpy",)).run({"x": x})["y"]
    compiled = nncc.compile_model(path, target=target)
    assert all(p.backend == "native" for p in compiled.plan.partitions)
    got = compiled.run({"x": x})["y"]
    np.testing.assert_array_equal(got, portable)
    expected = ort_run(model, {"x": x})[0]
    steps = np.abs(got.astype(np.float64) - expected) / scale
    # onnxruntime's fixed-point QLinearAdd may round an integer the other way (one step)
    assert np.mean(steps > 0.5) < 0.1 and steps.max() <= 8.5, (np.mean(steps > 0.5), steps.max())
