"""The int8 residual stream as bytes (nncc/native/int8_bytes.py): a QLinearAdd whose inputs
are read only by native int8 steps recovering with the scale and zero point they were
quantized with takes them as bytes, and stores its own output as bytes when its readers
qualify, so projection -> QAdd -> QAdd -> convolution stays bytes end to end; a
QLinearGlobalAveragePool reads bytes too. The values one QAdd joins share one layout: NHWC
between pixel-major convolutions, NCHW otherwise.

Oracles: the portable plan (nncc/kernels/qimage.py's arithmetic, itself tested against
onnxruntime), which the native outputs must equal bit for bit; and onnxruntime on the same
file, whose QLinearAdd and QLinearGlobalAveragePool round in fixed point: an integer one
off there may move a later convolution's output, so the comparison allows a few output
steps on a small share of the elements.
"""

from __future__ import annotations


import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import nncc
from nncc.backends.base import Partition
from nncc.frontend.onnx import parse_model
from nncc.native.codegen import generate
from nncc.passes.pipeline import run_passes
from nncc.passes.shape_inference import infer_shapes
from tests.int8_qchain import MS, QChain
from tests.oracle import ort_run

def residual_model(rng, act, c: int, m: int, hw: tuple[int, int], pool: bool, batch: int = 1, weights=np.int8):
    """Q -> 1x1 convolution (c -> m) -> q1; q1 -> 1x1 -> q2; QLinearAdd(q2, q1) -> q3;
    q3 -> 1x1 -> q4; QLinearAdd(q4, q3) -> q5; then QLinearGlobalAveragePool of q5 (``pool``)
    or a 1x1 convolution of q5. Each convolution quantizes with the scale
    and zero point its readers recover with; ``weights``: int8 weights with zero points 0,
    or uint8 ones with zero points around 128. Returns the model and an input."""
    chain = QChain(rng, act, weights)
    chain.quantize("x", "q0", 0.02)
    chain.conv("q0", "q1", c, m)
    chain.conv("q1", "q2", m, m)
    chain.add("q2", "q1", "q3")
    chain.conv("q3", "q4", m, m)
    chain.add("q4", "q3", "q5")
    if pool:
        chain.nodes.append(helper.make_node("QLinearGlobalAveragePool",
                                            ["q5", "q5s", "q5z", *chain.scalars("q6", chain.scales["q5"] * 0.5)],
                                            ["q6"], domain=MS))
    else:
        chain.conv("q5", "q6", m, m)
    chain.nodes.append(helper.make_node("DequantizeLinear", ["q6", "q6s", "q6z"], ["y"]))
    shape = [batch, c, *hw]
    return chain.model("residual", shape), (rng.standard_normal(shape) * 3).astype(np.float32)


def _byte_images(model) -> tuple[dict, dict]:
    """The native unit's byte images, and each QuantizeLinear / QConv / QAdd output by its
    producer's kind and position (quantize0, conv0, conv1, add0...)."""
    graph = run_passes(parse_model(model.SerializeToString()), 2)
    part = Partition(0, "native", list(graph.nodes), list(graph.inputs), list(graph.outputs))
    unit = generate(part, graph, infer_shapes(graph), "entry", 16)
    names, counts = {}, {}
    for node in graph.nodes:
        kind = {"QuantizeDequantize": "quantize", "QConv": "conv", "QAdd": "add"}.get(node.op_type)
        if kind:
            names[f"{kind}{counts.get(kind, 0)}"] = node.outputs[0]
            counts[kind] = counts.get(kind, 0) + 1
    return unit.byte_images, names


def _check_outputs(tmp_path, model, x, scale):
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    portable = nncc.compile_model(path, backends=("numpy",)).run({"x": x})["y"]
    compiled = nncc.compile_model(path)
    assert all(p.backend == "native" for p in compiled.plan.partitions)
    got = compiled.run({"x": x})["y"]
    np.testing.assert_array_equal(got, portable)  # the portable kernels' arithmetic, bit for bit
    expected = ort_run(model, {"x": x})[0]
    steps = np.abs(got.astype(np.float64) - expected) / scale
    # onnxruntime's fixed-point QLinearAdd may round an integer the other way (one step),
    # which the next convolution carries on: most elements agree, none by much
    assert np.mean(steps > 0.5) < 0.1 and steps.max() <= 8.5, (np.mean(steps > 0.5), steps.max())


@pytest.mark.slow
@pytest.mark.parametrize("act", [np.uint8, np.int8], ids=["uint8", "int8"])
def test_residual_adds_read_and_write_bytes_nchw(tmp_path, act):
    """Channel-major convolutions (few channels over many pixels): every value of the
    stream, the quantized input and the adds' included, is NCHW bytes; the pooled sum reads
    them."""
    rng = np.random.default_rng(11)
    model, x = residual_model(rng, act, 5, 12, (9, 11), pool=True, batch=2)
    images, names = _byte_images(model)
    assert images == {names[v]: "nchw" for v in ("quantize0", "conv0", "conv1", "add0", "conv2", "add1")}
    scale = float(numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "q6s")))
    _check_outputs(tmp_path, model, x, scale)


@pytest.mark.slow
@pytest.mark.parametrize("act", [np.uint8, np.int8], ids=["uint8", "int8"])
def test_residual_adds_between_pixel_major_convolutions_share_nhwc(tmp_path, act):
    """Pixel-major convolutions (many channels over few pixels): the values the adds join
    are NHWC together, written and read whole pixels at a time; the quantized input, which
    no pixel-major step writes, is NCHW bytes."""
    rng = np.random.default_rng(12)
    model, x = residual_model(rng, act, 8, 64, (5, 6), pool=False)
    images, names = _byte_images(model)
    assert images == {names["quantize0"]: "nchw", **{names[v]: "nhwc" for v in ("conv0", "conv1", "add0", "conv2", "add1")}}
    scale = float(numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "q6s")))
    _check_outputs(tmp_path, model, x, scale)


@pytest.mark.slow
@pytest.mark.parametrize("act, weights, m, hw", [(np.uint8, np.uint8, 64, (7, 7)), (np.int8, np.int8, 128, (8, 8)),
                                                  (np.uint8, np.int8, 64, (3, 11)), (np.uint8, np.uint8, 128, (2, 3))],
                         ids=["u8u8-64-49px", "s8s8-128-64px", "u8s8-64-33px", "u8u8-128-6px"])
def test_pixel_major_1x1_reads_its_nhwc_input_in_place(tmp_path, act, weights, m, hw):
    """A 1x1 stride-1 pixel-major convolution over NHWC bytes whose channels fill whole tile
    rows (64, 128) multiplies the image's pixels where they are, no copy or gather: pixels at,
    past and below whole 32-pixel blocks (the tiles' last block read from a zero-padded copy),
    a batch of two, and uint8 weights with zero points (each pixel's sum of bytes needed)."""
    rng = np.random.default_rng(13 + m)
    model, x = residual_model(rng, act, 16, m, hw, pool=False, batch=2, weights=weights)
    images, names = _byte_images(model)
    assert images == {names["quantize0"]: "nchw", **{names[v]: "nhwc" for v in ("conv0", "conv1", "add0", "conv2", "add1")}}
    scale = float(numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "q6s")))
    _check_outputs(tmp_path, model, x, scale)
