"""Sampling kernels (GridSample, AffineGrid, DeformConv) against onnxruntime through both
nncc routes, on shapes and attributes beyond ONNX's node cases. Where onnxruntime has no
kernel (cubic 5-D and 3-D GridSample), ONNX's reference implementation is the oracle, in
the padding mode where it agrees with onnxruntime and PyTorch."""

from __future__ import annotations

import itertools

import numpy as np
from onnx import reference
import pytest

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import Ctx, resolve
from tests.one_node import check_against, check_against_ort


rng = np.random.default_rng(11)


def normal(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def uniform(lo, hi, *shape, dtype=np.float32):
    return rng.uniform(lo, hi, shape).astype(dtype)


def reference_run(op, inputs, opset, attrs):
    from tests.one_node import make_model

    model, feeds = make_model(op, inputs, opset, attrs)
    return reference.ReferenceEvaluator(model).run(None, feeds)


# --------------------------------------------------------------------------- GridSample


@pytest.mark.parametrize("mode,padding,align", list(itertools.product(
    ["linear", "nearest", "cubic"], ["zeros", "border", "reflection"], [0, 1])))
def test_gridsample_2d_matches_onnxruntime(mode, padding, align):
    # positions well outside [-1, 1] exercise every padding mode, repeated reflections too
    x = normal(2, 3, 5, 7)
    grid = uniform(-2.5, 2.5, 2, 4, 6, 2)
    check_against_ort("GridSample", [x, grid], 20,
                      {"mode": mode, "padding_mode": padding, "align_corners": align},
                      rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode,padding,align", list(itertools.product(
    ["linear", "nearest"], ["zeros", "border", "reflection"], [0, 1])))
def test_gridsample_3d_matches_onnxruntime(mode, padding, align):
    x = normal(2, 2, 4, 5, 6, dtype=np.float64)
    grid = uniform(-1.8, 1.8, 2, 3, 4, 2, 3, dtype=np.float64)
    check_against_ort("GridSample", [x, grid], 22,
                      {"mode": mode, "padding_mode": padding, "align_corners": align},
                      rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_gridsample_opset16_mode_names(mode):
    x = normal(1, 4, 6, 6)
    grid = uniform(-1.2, 1.2, 1, 5, 3, 2)
    check_against_ort("GridSample", [x, grid], 16, {"mode": mode, "padding_mode": "border"},
                      rtol=1e-5, atol=1e-5)


def test_gridsample_nearest_ties_round_to_even():
    # positions exactly halfway between pixels: x = 0.5, 1.5, 2.5 ... with align_corners=1
    x = normal(1, 1, 1, 6)
    u = (np.arange(11, dtype=np.float32) / 2) / 5 * 2 - 1
    grid = np.stack([u, np.zeros_like(u)], axis=-1).reshape(1, 1, 11, 2).astype(np.float32)
    check_against_ort("GridSample", [x, grid], 20, {"mode": "nearest", "align_corners": 1})


@pytest.mark.parametrize("align", [0, 1])
def test_gridsample_cubic_volumetric_matches_reference(align):
    x = normal(1, 2, 4, 5, 3)
    grid = uniform(-1.3, 1.3, 1, 2, 3, 4, 3)
    attrs = {"mode": "cubic", "align_corners": align}
    expected = reference_run("GridSample", [x, grid], 20, attrs)
    check_against(expected, "GridSample", [x, grid], 20, attrs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "cubic", "nearest"])
def test_gridsample_one_spatial_axis_matches_reference(mode):
    x = normal(2, 3, 9)
    grid = uniform(-1.2, 1.2, 2, 5, 1)
    attrs = {"mode": mode, "padding_mode": "zeros"}
    expected = reference_run("GridSample", [x, grid], 20, attrs)
    check_against(expected, "GridSample", [x, grid], 20, attrs, rtol=1e-5, atol=1e-5)


def test_gridsample_rejects_bad_attributes_and_shapes():
    x = TensorInfo(np.dtype(np.float32), (1, 2, 4, 4))
    grid = TensorInfo(np.dtype(np.float32), (1, 3, 3, 2))
    shape = resolve("GridSample", "", 20).shape
    with pytest.raises(ShapeInferenceError, match="unknown mode 'bilinear'"):
        shape(Ctx({"mode": "bilinear"}, 20), x, grid)  # the opset-16 name is gone in 20
    with pytest.raises(ShapeInferenceError, match="padding_mode"):
        shape(Ctx({"padding_mode": "wrap"}, 20), x, grid)
    with pytest.raises(ShapeInferenceError, match="last axis must be 2"):
        shape(Ctx({}, 20), x, TensorInfo(np.dtype(np.float32), (1, 3, 3, 3)))
    with pytest.raises(KernelError, match="batch sizes differ"):
        resolve("GridSample", "", 20).fn(Ctx({}, 20), normal(2, 1, 3, 3), normal(1, 2, 2, 2))


# --------------------------------------------------------------------------- AffineGrid


@pytest.mark.parametrize("size", [(2, 3, 5, 7), (1, 1, 1, 4), (3, 2, 4, 3, 5), (1, 1, 2, 1, 3)])
@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid_matches_onnxruntime(size, align):
    if align and 1 in size[2:]:
        pytest.skip("a one-pixel axis with align_corners is 0/0: see the test below")
    r = len(size) - 2
    theta = normal(size[0], r, r + 1)
    size = np.array(size, dtype=np.int64)
    # size known when compiling (static output) and fed at run time (dynamic output)
    for constant in ((1,), ()):
        check_against_ort("AffineGrid", [theta, size], 20, {"align_corners": align},
                          constant=constant, rtol=1e-5, atol=1e-6)


def test_affine_grid_one_pixel_axis_with_align_corners_is_centered():
    """Oracle: PyTorch's affine_grid, which the operator cites, puts the single position of
    a one-pixel axis at 0 (onnxruntime answers 1 and ONNX's reference -1). Expected values
    written out by hand for the identity transform."""
    theta = np.array([[[1, 0, 0], [0, 1, 0]]], dtype=np.float32)
    expected = np.array([[[[-1, 0], [0, 0], [1, 0]]]], dtype=np.float32)
    check_against([expected], "AffineGrid", [theta, np.array([1, 1, 1, 3], dtype=np.int64)],
                  20, {"align_corners": 1})


def test_affine_grid_rejects_mismatched_theta():
    with pytest.raises(ShapeInferenceError, match="does not match size"):
        resolve("AffineGrid", "", 20).shape(
            Ctx({}, 20), TensorInfo(np.dtype(np.float32), (2, 3, 4)),
            TensorInfo.of(np.array([2, 1, 4, 4], dtype=np.int64)))


# --------------------------------------------------------------------------- DeformConv


@pytest.mark.parametrize("group,offset_group,strides,pads,dilations", [
    (1, 1, [1, 1], [0, 0, 0, 0], [1, 1]),
    (2, 2, [2, 1], [1, 2, 0, 1], [1, 1]),
    (1, 4, [1, 2], [1, 1, 1, 1], [2, 1]),
    (4, 1, [1, 1], [2, 2, 2, 2], [2, 2]),
])
@pytest.mark.parametrize("with_mask", [False, True])
def test_deform_conv_matches_onnxruntime(group, offset_group, strides, pads, dilations,
                                         with_mask):
    n, c, oc, k = 2, 4, 8, (3, 2)
    x = normal(n, c, 9, 8)
    w = normal(oc, c // group, *k)
    b = normal(oc)
    oh = (9 + pads[0] + pads[2] - (dilations[0] * (k[0] - 1) + 1)) // strides[0] + 1
    ow = (8 + pads[1] + pads[3] - (dilations[1] * (k[1] - 1) + 1)) // strides[1] + 1
    # offsets of a few pixels move many taps off the map
    offset = normal(n, offset_group * k[0] * k[1] * 2, oh, ow) * 2
    mask = uniform(0, 1, n, offset_group * k[0] * k[1], oh, ow) if with_mask else None
    attrs = {"group": group, "offset_group": offset_group, "strides": strides, "pads": pads,
             "dilations": dilations, "kernel_shape": list(k)}
    check_against_ort("DeformConv", [x, w, offset, b, mask], 22, attrs, constant=(1, 3),
                      rtol=1e-4, atol=1e-4)


def test_deform_conv_mask_without_bias_and_kernel_shape_from_weights():
    x = normal(1, 3, 7, 7)
    w = normal(5, 3, 2, 3)
    offset = normal(1, 2 * 3 * 2, 6, 5)
    mask = uniform(0, 1, 1, 2 * 3, 6, 5)
    check_against_ort("DeformConv", [x, w, offset, None, mask], 19, {}, rtol=1e-4, atol=1e-4)


def test_deform_conv_with_zero_offsets_is_conv():
    """Oracle: onnxruntime's Conv. Without offsets or mask, a deformable convolution samples
    the plain convolution's taps; this covers a 3-D case too, which onnxruntime's DeformConv
    does not run."""
    x = normal(1, 4, 5, 6, 7)
    w = normal(6, 2, 3, 2, 3)
    attrs = {"group": 2, "strides": [1, 2, 1], "pads": [1, 0, 1, 1, 0, 1], "dilations": [1, 1, 2]}
    expected = check_against_ort("Conv", [x, w], 18, attrs, rtol=1e-4, atol=1e-4)
    offset = np.zeros((1, 3 * 2 * 3 * 3) + expected[0].shape[2:], dtype=np.float32)
    check_against(expected, "DeformConv", [x, w, offset], 19, attrs, rtol=1e-4, atol=1e-4)


def test_deform_conv_checks_offset_shape():
    with pytest.raises(KernelError, match="offset has shape"):
        resolve("DeformConv", "", 19).fn(Ctx({}, 19), normal(1, 2, 5, 5), normal(3, 2, 3, 3),
                                         normal(1, 17, 3, 3))
