"""Native code for the data-movement, reduction and normalisation ops of convnets
(nncc/native/plain_ops.py), against onnxruntime: each op on many random shapes and
attributes (size-1 and empty axes, negative steps, negative pads, every Resize mode) in
one model per op, so one compile covers them all; the model must run as a single native
partition with no node left to numpy. Then whole models that must become one native
partition: light_inception_v1 (with random weights), an EfficientNet-like and a
U-Net-like network built here. And what check() must refuse.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.native.codegen import ALIASES
from nncc.native.toolchain import find_toolchain
from tests.conftest import light_models_dir
from tests.models import GraphBuilder
from tests.oracle import ort_run

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: the native backend takes nothing")


def _ort(path, feeds, names):
    return ort_run(path, feeds, names, optimized=False)


def assert_one_native_partition(compiled) -> None:
    """No node left to numpy, one native partition (a case the passes turned into an
    Identity, such as a pad of zeros, is a free view the native backend leaves alone)."""
    plan = compiled.plan
    assert plan.fallbacks == [], plan.fallbacks
    assert compiled.native_partitions == 1
    for part in plan.partitions:
        if part.backend != "native":
            ops = {plan.kernels[i.kernel] for i in plan.instructions[part.first:part.first + part.count]}
            assert all(op.split("::")[1] in ALIASES for op in ops), ops


def check_native(tmp_path, g: GraphBuilder, opset: int, rtol: float = 1e-4, atol: float = 1e-5, oracle=_ort):
    """Compile, assert one native partition and no fallback, compare every output with
    ``oracle`` (onnxruntime unless it lacks the case)."""
    model = g.model(opset)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    compiled = nncc.compile_model(path)
    assert_one_native_partition(compiled)
    names = [o.name for o in model.graph.output]
    want = oracle(path, g.feeds, names)
    got = compiled.run(g.feeds)
    for name, w in zip(names, want):
        node = next(n for n in model.graph.node if name in n.output)
        shapes = [g.feeds[i].shape for i in node.input if i in g.feeds]
        assert got[name].shape == w.shape, (node.op_type, shapes)
        np.testing.assert_allclose(got[name], w, rtol=rtol, atol=atol * max(1.0, float(np.abs(w).max(initial=0))),
                                   err_msg=f"{node.op_type} of {shapes} {helper.printable_node(node)}")
    return compiled


def _shape(rng, rank, lo=1, hi=7):
    return [int(v) for v in rng.integers(lo, hi + 1, rank)]


# -- ops -----------------------------------------------------------------------------------------


def _lrn_by_the_spec(path, feeds, names):
    """LRN as the ONNX spec writes it, for the even sizes onnxruntime refuses
    (onnx.reference's LRN loops over the batch axis instead of the channels)."""
    model = onnx.load(path)
    out = []
    for name in names:
        node = next(n for n in model.graph.node if name in n.output)
        a = {at.name: helper.get_attribute_value(at) for at in node.attribute}
        x = feeds[node.input[0]].astype(np.float64)
        size, c = a["size"], x.shape[1]
        sq = np.zeros_like(x)
        for ch in range(c):
            lo, hi = max(0, ch - (size - 1) // 2), min(c - 1, ch + (size - 1) - (size - 1) // 2)
            sq[:, ch] = (x[:, lo:hi + 1] ** 2).sum(axis=1)
        out.append((x / (a["bias"] + a["alpha"] / size * sq) ** a["beta"]).astype(np.float32))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("even", [False, True])
def test_lrn(tmp_path, even):
    """onnxruntime takes odd sizes only: even ones (a window one wider after the channel
    than before it) are checked against the spec's formula."""
    g = GraphBuilder(seed=1 + even)
    for i in range(12 if not even else 6):
        shape = _shape(g.rng, 4)
        shape[1] = [1, 2, 5, 9, 16][i % 5]
        beta = [0.75, 0.5, float(g.rng.uniform(0.1, 1.5))][i % 3]
        size = int(g.rng.integers(0, 4)) * 2 + (2 if even else 1)
        g.case("LRN", shape, size=size, alpha=float(g.rng.uniform(1e-4, 1.0)), beta=beta,
               bias=float(g.rng.uniform(0.5, 2.0)), scale=2.0)
    if not even:
        g.case("LRN", [1, 64, 56, 56], size=5, alpha=1e-4, beta=0.75)  # inception_v1's, parallel over channels
    check_native(tmp_path, g, 17, oracle=_lrn_by_the_spec if even else _ort)


def _pads(rng, shape, mode):
    before, after = [], []
    for d in shape:
        limit = {"reflect": d - 1, "edge": 3, "wrap": d, "constant": 3}[mode]
        low = -(d // 2) if mode == "constant" else 0  # negative pads crop (constant mode)
        before.append(int(rng.integers(low, limit + 1)))
        after.append(int(rng.integers(low, limit + 1)))
    return before + after


@pytest.mark.slow
@pytest.mark.parametrize("opset", [19, pytest.param(11, marks=pytest.mark.slow)])  # older opsets: slow
def test_pad(tmp_path, opset):
    g = GraphBuilder(seed=2 + opset)
    modes = ["constant", "reflect", "edge"] + (["wrap"] if opset >= 19 else [])
    for i in range(16):
        mode = modes[i % len(modes)]
        shape = _shape(g.rng, int(g.rng.integers(1, 5)))
        if i % 5 == 4:
            shape[-1] = 1  # a size-1 axis: reflect may not pad it
        pads = _pads(g.rng, shape, mode)
        extra = [g.ints(pads)]
        if mode == "constant" and i % 2:
            extra.append(g.const(np.float32(g.rng.standard_normal())))
        g.case("Pad", shape, *extra, mode=mode)
    if opset >= 18:  # pads for some axes only, negative axes
        g.case("Pad", [2, 3, 4, 5], g.ints([1, 2, 0, 1]), "", g.ints([-1, 1]), mode="reflect")
        g.case("Pad", [1, 8, 6, 6], g.ints([0, 0, 1, 1, 0, 0, 1, 1]), mode="constant")
    check_native(tmp_path, g, opset)


def _slice_args(rng, shape):
    axes = [int(a) for a in rng.permutation(len(shape))[: int(rng.integers(1, len(shape) + 1))]]
    starts, ends, steps = [], [], []
    for a in axes:
        d = shape[a]
        step = int(rng.choice([1, 1, 2, 3, -1, -2]))
        kind = rng.integers(0, 5)
        if kind == 0:  # the whole axis, with the huge bounds exporters write
            start, end = (0, 2**63 - 1) if step > 0 else (-1, -(2**63))
        elif kind == 1:  # empty
            start, end = (d, d) if step > 0 else (0, 0)
        else:
            start, end = int(rng.integers(-d - 2, d + 3)), int(rng.integers(-d - 2, d + 3))
        starts.append(start)
        ends.append(end)
        steps.append(step)
    return starts, ends, [a - len(shape) if rng.integers(0, 2) else a for a in axes], steps


def test_slice(tmp_path):
    g = GraphBuilder(seed=3)
    for _ in range(20):
        shape = _shape(g.rng, int(g.rng.integers(1, 5)))
        starts, ends, axes, steps = _slice_args(g.rng, shape)
        g.case("Slice", shape, g.ints(starts), g.ints(ends), g.ints(axes), g.ints(steps))
    g.case("Slice", [1, 3, 4, 5], g.ints([1]), g.ints([3]))  # axes and steps omitted
    g.case("Slice", [1, 32, 20, 20], g.ints([0, 1]), g.ints([32, 20]), g.ints([1, 2]), g.ints([2, 2]))
    check_native(tmp_path, g, 17)


@pytest.mark.slow
@pytest.mark.parametrize("opset", [18, pytest.param(11, marks=pytest.mark.slow)])
def test_split(tmp_path, opset):
    g = GraphBuilder(seed=4)
    for i in range(10):
        shape = _shape(g.rng, int(g.rng.integers(1, 5)))
        axis = int(g.rng.integers(-len(shape), len(shape)))
        d = shape[axis]
        cuts = sorted(g.rng.integers(0, d + 1, int(g.rng.integers(0, 3))).tolist())
        sizes = np.diff([0, *cuts, d]).tolist()  # may hold zeros: empty outputs
        if opset >= 13:
            g.case("Split", shape, g.ints(sizes), n_out=len(sizes), axis=axis)
        else:
            g.case("Split", shape, n_out=len(sizes), axis=axis, split=sizes)
    if opset >= 18:
        g.case("Split", [2, 6, 3], n_out=3, axis=1, num_outputs=3)  # equal parts
        g.case("Split", [2, 7, 3], n_out=3, axis=1, num_outputs=3)  # uneven: 3, 3, 1
    else:
        g.case("Split", [2, 6, 3], n_out=3, axis=1)  # equal parts
    check_native(tmp_path, g, opset)


COORDS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"]
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


@pytest.mark.slow
def test_resize_nearest(tmp_path):
    g = GraphBuilder(seed=5)
    empty = g.const(np.zeros(0, np.float32))
    for i in range(20):
        rank = [4, 4, 3, 2][i % 4]
        shape = _shape(g.rng, rank)
        coord, mode = COORDS[i % len(COORDS)], NEAREST[(i // len(COORDS)) % len(NEAREST)]
        if i % 3:
            scales = [1.0] * (rank - 2) + [float(g.rng.choice([0.5, 0.6, 1.0, 1.5, 2.0, 3.0, 2.7])) for _ in range(2)]
            g.case("Resize", shape, empty, g.const(scales), mode="nearest",
                   coordinate_transformation_mode=coord, nearest_mode=mode)
        else:
            sizes = shape[:-2] + _shape(g.rng, 2, 1, 12)
            g.case("Resize", shape, empty, "", g.ints(sizes), mode="nearest",
                   coordinate_transformation_mode=coord, nearest_mode=mode)
    # what torch writes for nn.Upsample(scale_factor=2) and F.interpolate(size=...)
    g.case("Resize", [1, 16, 14, 14], empty, g.const([1, 1, 2, 2]), mode="nearest",
           coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    g.case("Resize", [1, 3, 5, 7], "", "", g.ints([9, 4]), mode="nearest", axes=[2, 3],
           keep_aspect_ratio_policy="not_larger")
    roi = g.const([0.1, 0.2, 0.9, 1.3])
    g.case("Resize", [1, 2, 6, 5], roi, "", g.ints([7, 8]), axes=[2, 3], mode="nearest",
           coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-3.0)
    check_native(tmp_path, g, 19)


@pytest.mark.slow
def test_resize_linear_and_cubic(tmp_path):
    g = GraphBuilder(seed=6)
    empty = g.const(np.zeros(0, np.float32))
    for i in range(16):
        rank = [4, 4, 3][i % 3]
        shape = _shape(g.rng, rank)
        coord = COORDS[i % len(COORDS)]
        mode = "cubic" if i % 4 == 3 else "linear"
        antialias = i % 5 == 2
        if mode == "cubic":  # onnxruntime's cubic: 4-D, upsampling unless antialiased
            rank, shape = 4, _shape(g.rng, 4)
        choices = [0.5, 0.75, 1.0, 1.5, 2.0, 3.0] if mode == "linear" or antialias else [1.0, 1.5, 2.0, 3.0]
        scales = [1.0] * (rank - 2) + [float(g.rng.choice(choices)) for _ in range(2)]
        attrs = dict(mode=mode, coordinate_transformation_mode=coord)
        if antialias:
            attrs["antialias"] = 1
        if mode == "cubic" and i % 8 == 3:
            attrs.update(exclude_outside=1, cubic_coeff_a=-0.5)
        g.case("Resize", shape, empty, g.const(scales), **attrs)
    # torch's bilinear upsampling (align_corners False and True), and a 3-axis trilinear one
    g.case("Resize", [1, 8, 10, 12], empty, g.const([1, 1, 2, 2]), mode="linear",
           coordinate_transformation_mode="pytorch_half_pixel")
    g.case("Resize", [1, 4, 7, 9], empty, "", g.ints([1, 4, 13, 17]), mode="linear",
           coordinate_transformation_mode="align_corners")
    g.case("Resize", [1, 2, 3, 4, 5], empty, g.const([1, 1, 2, 1.5, 0.6]), mode="linear")
    roi = g.const([0.0, 0.0, 0.1, 0.2, 1.0, 1.0, 0.8, 1.2])
    g.case("Resize", [1, 2, 6, 5], roi, g.const([1, 1, 1.5, 2.0]), mode="linear",
           coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=2.5)
    check_native(tmp_path, g, 19)


@pytest.mark.slow  # three more compiles; opset 19 Resize stays quick
def test_resize_older_opsets_and_upsample(tmp_path):
    for opset, op in ((10, "Resize"), (13, "Resize"), (9, "Upsample")):
        g = GraphBuilder(seed=7)
        for mode in ("nearest", "linear"):
            for scales in ([1, 1, 2, 3], [1, 1, 1.5, 2.5], [1, 2, 2, 1]):
                if op == "Resize" and opset >= 11:
                    g.case(op, [1, 3, 4, 5], "", g.const(scales), mode=mode)
                else:
                    g.case(op, [1, 3, 4, 5], g.const(scales), mode=mode)
        if op == "Resize":
            g.case(op, [1, 3, 6, 8], *([""] if opset >= 11 else []), g.const([1, 1, 0.5, 0.4]))
        (tmp_path / str(opset)).mkdir()
        check_native(tmp_path / str(opset), g, opset)


REDUCES = ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL1",
           "ReduceL2"]


@pytest.mark.slow
@pytest.mark.parametrize("opset", [18, pytest.param(13, marks=pytest.mark.slow)])
def test_reduce(tmp_path, opset):
    g = GraphBuilder(seed=8)
    for i in range(24):
        op = REDUCES[i % len(REDUCES)]
        shape = _shape(g.rng, int(g.rng.integers(1, 5)), 1, 6)
        count = int(g.rng.integers(0, len(shape) + 1))
        axes = [int(a) for a in g.rng.permutation(len(shape))[:count]]
        axes = [a - len(shape) if g.rng.integers(0, 2) else a for a in axes]
        keepdims = int(i % 3 != 0)
        scale = 0.5 if op == "ReduceProd" else 1.0
        if opset >= 18 or op == "ReduceSum":
            extra = [g.ints(axes)] if axes else []
            g.case(op, shape, *extra, keepdims=keepdims, scale=scale)
        elif axes:
            g.case(op, shape, keepdims=keepdims, axes=axes, scale=scale)
        else:
            g.case(op, shape, keepdims=keepdims, scale=scale)
    # squeeze-and-excite's mean over H and W, channels-first mean, and an empty axes list
    g.case("ReduceMean", [2, 24, 14, 14], *([g.ints([2, 3])] if opset >= 18 else []),
           **({} if opset >= 18 else {"axes": [2, 3]}), keepdims=1)
    g.case("ReduceMax", [2, 5, 40, 40], *([g.ints([1])] if opset >= 18 else []),
           **({} if opset >= 18 else {"axes": [1]}), keepdims=0)
    if opset >= 18:
        g.case("ReduceSum", [3, 4], g.ints(np.zeros(0, np.int64)), noop_with_empty_axes=1)
    check_native(tmp_path, g, opset)


@pytest.mark.slow
def test_softmax_inner_axis(tmp_path):
    g = GraphBuilder(seed=9)
    for i in range(10):
        shape = _shape(g.rng, int(g.rng.integers(2, 5)))
        axis = int(g.rng.integers(0, len(shape) - 1)) - (len(shape) if i % 2 else 0)
        g.case("Softmax" if i % 3 else "LogSoftmax", shape, axis=axis, scale=4.0)
    g.case("Softmax", [2, 21, 9, 70], axis=1)  # per-pixel class scores: more than 64 columns
    g.case("LogSoftmax", [1, 5, 1], axis=1)
    check_native(tmp_path, g, 17)


@pytest.mark.slow
def test_expand_tile_gather(tmp_path):
    g = GraphBuilder(seed=10)
    for _ in range(6):
        shape = _shape(g.rng, int(g.rng.integers(1, 4)))
        small = [d if g.rng.integers(0, 2) else 1 for d in shape][int(g.rng.integers(0, len(shape))):]
        g.case("Expand", small, g.ints(shape))
        g.case("Tile", shape, g.ints(g.rng.integers(0, 4, len(shape))))
        axis = int(g.rng.integers(0, len(shape)))
        idx = g.rng.integers(-shape[axis], shape[axis], _shape(g.rng, int(g.rng.integers(0, 3)), 1, 4))
        g.case("Gather", shape, g.ints(idx), axis=axis)
    check_native(tmp_path, g, 17)


# -- what check() refuses ------------------------------------------------------------------------


def test_invalid_or_unknown_geometry_is_left_to_numpy(tmp_path):
    """A reflect pad wider than the axis less one (invalid ONNX), a pad value that is a
    runtime input, Slice bounds that are (so the output shape is unknown), and LRN of 3-D
    data stay with numpy, each with its reason."""
    g = GraphBuilder(seed=11)
    g.case("Pad", [2, 3], g.ints([0, 3, 0, 0]), mode="reflect")
    g.case("Pad", [2, 3], g.ints([0, 1, 1, 0]), g.input([]), mode="constant")
    g.case("Slice", [5, 4], g.ints([1]), g.input([1]))
    g.inputs[3] = helper.make_tensor_value_info("x3", TensorProto.INT64, [1])
    g.feeds["x3"] = np.array([3], np.int64)
    g.case("LRN", [2, 3, 4], size=3)
    path = tmp_path / "m.onnx"
    onnx.save(g.model(19), path)
    compiled = nncc.compile_model(path, backends=["native"])  # refused nodes fall back, with the reason
    reasons = sorted(f["reason"] for f in compiled.plan.fallbacks)
    assert len(reasons) == 4 and compiled.native_partitions == 0, reasons
    for expected in ("reflect pads (3, 0) larger than the axis (3) less one", "Pad value is not a constant",
                     "is not a static float32 tensor", "LRN of other than 4-D data"):
        assert any(expected in r for r in reasons), (expected, reasons)


# -- whole models ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_light_inception_v1_is_one_native_partition(tmp_path):
    """The real file, its splat weights replaced by random ones (so every layer matters),
    its logits exposed: one native partition, LRN included, equal to onnxruntime."""
    model = onnx.load(light_models_dir() / "light_inception_v1.onnx")
    rng = np.random.default_rng(12)
    shapes = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    keep = []
    for node in model.graph.node:
        if node.op_type == "ConstantOfShape":
            shape = [int(d) for d in shapes[node.input[0]]]
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            value = rng.standard_normal(shape) * (np.sqrt(2.0 / fan_in) if len(shape) > 1 else 0.1)
            model.graph.initializer.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
        else:
            keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    logits = next(n for n in keep if n.op_type == "Softmax").input[0]
    model.graph.output.append(helper.make_tensor_value_info(logits, TensorProto.FLOAT, None))
    g = GraphBuilder(seed=12)
    inits = {i.name for i in model.graph.initializer}
    data = next(i for i in model.graph.input if i.name not in inits)
    g.feeds = {data.name: g.rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}
    path = tmp_path / "inception.onnx"
    onnx.save(model, path)
    compiled = nncc.compile_model(path)
    assert_one_native_partition(compiled)
    assert len(compiled.plan.partitions) == 1
    got = compiled.run(g.feeds)
    want = _ort(path, g.feeds, [logits])[0]
    np.testing.assert_allclose(got[logits], want, rtol=1e-3, atol=1e-4 * float(np.abs(want).max()))


def _efficientnet_block(g: GraphBuilder, x: str, c: int, expand: int, act: str) -> str:
    """MBConv: 1x1 expand, depthwise 3x3, squeeze-and-excite, 1x1 project, residual."""
    def activation(v):
        if act == "silu":
            return g.node("Mul", [v, g.node("Sigmoid", [v])])
        if act == "hardswish":
            return g.node("HardSwish", [v])
        return g.node("Mul", [v, g.node("HardSigmoid", [v], alpha=1 / 6, beta=0.5)])
    e = c * expand
    h = activation(g.node("Conv", [x, g.weight([e, c, 1, 1]), g.weight([e])], kernel_shape=[1, 1]))
    h = activation(g.node("Conv", [h, g.weight([e, 1, 3, 3]), g.weight([e])], kernel_shape=[3, 3],
                          pads=[1, 1, 1, 1], group=e))
    s = g.node("ReduceMean", [h, g.ints([2, 3])], keepdims=1)
    s = activation(g.node("Conv", [s, g.weight([e // 4, e, 1, 1]), g.weight([e // 4])], kernel_shape=[1, 1]))
    s = g.node("Sigmoid", [g.node("Conv", [s, g.weight([e, e // 4, 1, 1]), g.weight([e])], kernel_shape=[1, 1])])
    h = g.node("Mul", [h, s])
    h = g.node("Conv", [h, g.weight([c, e, 1, 1])], kernel_shape=[1, 1])
    return g.node("Add", [h, x])


@pytest.mark.slow
def test_efficientnet_like_model_is_one_native_partition(tmp_path):
    """SiLU (x * Sigmoid(x)), HardSwish and x * HardSigmoid(x), depthwise convolutions,
    squeeze-and-excite with ReduceMean over H and W and a broadcast Mul, BatchNorm after
    the stem (folded into it), GELU written with Erf, then global pooling, Flatten and
    the classifier."""
    g = GraphBuilder(seed=13, weight_gain=np.sqrt(2.0))
    x = g.input([2, 3, 32, 32])
    h = g.node("Conv", [x, g.weight([16, 3, 3, 3])], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    bn = [g.const(g.rng.uniform(0.5, 1.5, 16)), g.const(g.rng.standard_normal(16) * 0.1),
          g.const(g.rng.standard_normal(16) * 0.1), g.const(g.rng.uniform(0.5, 1.5, 16))]
    h = g.node("BatchNormalization", [h, *bn])
    h = g.node("Mul", [h, g.node("Sigmoid", [h])])
    for act in ("silu", "hardswish", "hardsigmoid"):
        h = _efficientnet_block(g, h, 16, 4, act)
    # GELU as torch exports it: x * 0.5 * (1 + erf(x / sqrt(2)))
    erf = g.node("Erf", [g.node("Div", [h, g.const(np.float32(np.sqrt(2.0)))])])
    h = g.node("Mul", [g.node("Mul", [h, g.const(np.float32(0.5))]),
                       g.node("Add", [erf, g.const(np.float32(1.0))])])
    h = g.node("Flatten", [g.node("GlobalAveragePool", [h])])
    y = g.node("Gemm", [h, g.weight([10, 16]), g.weight([10])], transB=1)
    g.output(g.node("Softmax", [y], axis=-1))
    check_native(tmp_path, g, 18)


@pytest.mark.slow
def test_unet_like_model_is_one_native_partition(tmp_path):
    """Encoder (conv, max pool), decoder (nearest and bilinear Resize upsampling, Pad to
    the skip's size, Concat with the skip, a Slice crop), a channel Split, a per-pixel
    Softmax over classes."""
    g = GraphBuilder(seed=14, weight_gain=np.sqrt(2.0))
    x = g.input([1, 3, 30, 30])

    def conv(v, cin, cout):
        return g.node("Relu", [g.node("Conv", [v, g.weight([cout, cin, 3, 3]), g.weight([cout])], kernel_shape=[3, 3],
                                      pads=[1, 1, 1, 1])])

    e1 = conv(x, 3, 8)                                                     # 30x30
    e2 = conv(g.node("MaxPool", [e1], kernel_shape=[2, 2], strides=[2, 2]), 8, 16)  # 15x15
    e3 = conv(g.node("MaxPool", [e2], kernel_shape=[2, 2], strides=[2, 2]), 16, 32)  # 7x7
    empty = g.const(np.zeros(0, np.float32))
    u2 = g.node("Resize", [e3, empty, g.const([1, 1, 2, 2])], mode="nearest",
                coordinate_transformation_mode="asymmetric", nearest_mode="floor")  # 14x14
    u2 = g.node("Pad", [u2, g.ints([0, 0, 0, 1, 0, 0, 1, 0])], mode="reflect")  # 15x15
    d2 = conv(g.node("Concat", [u2, e2], axis=1), 48, 16)
    u1 = g.node("Resize", [d2, empty, g.const([1, 1, 2, 2])], mode="linear",
                coordinate_transformation_mode="pytorch_half_pixel")  # 30x30
    d1 = conv(g.node("Concat", [u1, e1], axis=1), 24, 8)
    a, b = g.node_outputs("Split", [d1, g.ints([4, 4])], 2, axis=1)
    d1 = g.node("Concat", [g.node("Mul", [a, g.node("Sigmoid", [b])]), b], axis=1)
    crop = g.node("Slice", [d1, g.ints([1, 1]), g.ints([-1, -1]), g.ints([2, 3])])  # 28x28
    logits = g.node("Conv", [crop, g.weight([5, 8, 1, 1]), g.weight([5])], kernel_shape=[1, 1])
    g.output(g.node("Softmax", [logits], axis=1))
    check_native(tmp_path, g, 17)
