"""Detection kernels (NonMaxSuppression, RoiAlign) against onnxruntime through both nncc
routes, on shapes and attributes beyond ONNX's node cases."""

from __future__ import annotations

import numpy as np
import pytest

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels import detection
from nncc.kernels.registry import Ctx, resolve
from tests.one_node import check_against_ort

rng = np.random.default_rng(5)


def f32(v):
    return np.array(v, dtype=np.float32)


def i64(v):
    return np.array(v, dtype=np.int64)


def random_boxes(batches, count, center):
    """Boxes of many overlaps: corners in either order, or center/size with some empty."""
    if center:
        xy = rng.uniform(0, 10, (batches, count, 2))
        wh = rng.uniform(0, 4, (batches, count, 2))
        wh[:, ::7] = 0  # boxes without area never suppress nor get suppressed
        return np.concatenate([xy, wh], axis=-1).astype(np.float32)
    a = rng.uniform(0, 10, (batches, count, 2))
    b = a + rng.uniform(-4, 4, (batches, count, 2))
    return np.concatenate([a, b], axis=-1).astype(np.float32)


# --------------------------------------------------------------------------- NonMaxSuppression


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("limit,iou,score", [(5, 0.3, 0.2), (100, 0.5, None), (3, 0.0, 0.9),
                                             (1000, 0.7, 0.0)])
def test_nms_matches_onnxruntime(center, limit, iou, score):
    boxes = random_boxes(3, 80, center)
    scores = rng.uniform(0, 1, (3, 4, 80)).astype(np.float32)
    scores[:, :, 10:20] = 0.5  # ties: the lower box index goes first
    inputs = [boxes, scores, i64([limit]), f32([iou]), None if score is None else f32([score])]
    check_against_ort("NonMaxSuppression", inputs, 11, {"center_point_box": center},
                      constant=(2, 3, 4))


def test_nms_optional_inputs_and_opset10():
    boxes = random_boxes(1, 30, 0)
    scores = rng.uniform(0, 1, (1, 2, 30)).astype(np.float32)
    for inputs in ([boxes, scores], [boxes, scores, i64(0)], [boxes, scores, i64(4)],
                   [boxes, scores, i64(4), f32(0.1)]):
        check_against_ort("NonMaxSuppression", inputs, 10, {})


def test_nms_identical_boxes_keep_one_per_class():
    boxes = np.tile(f32([0, 0, 1, 1]), (1, 12, 1))
    scores = rng.uniform(0, 1, (1, 3, 12)).astype(np.float32)
    check_against_ort("NonMaxSuppression", [boxes, scores, i64(12), f32(0.5)], 11, {})


def test_nms_shape_is_dynamic_and_inputs_are_checked():
    out = resolve("NonMaxSuppression", "", 11).shape(
        Ctx({}, 11), TensorInfo(np.dtype(np.float32), (1, 5, 4)),
        TensorInfo(np.dtype(np.float32), (1, 2, 5)))[0]
    assert out.dtype == np.int64 and out.shape == (None, 3)
    with pytest.raises(ShapeInferenceError, match=r"\[batches, boxes, 4\]"):
        resolve("NonMaxSuppression", "", 11).shape(
            Ctx({}, 11), TensorInfo(np.dtype(np.float32), (1, 5, 5)),
            TensorInfo(np.dtype(np.float32), (1, 2, 5)))
    with pytest.raises(KernelError, match="do not match"):
        resolve("NonMaxSuppression", "", 11).fn(
            Ctx({}, 11), np.zeros((1, 5, 4), np.float32), np.zeros((1, 2, 6), np.float32))


# --------------------------------------------------------------------------- RoiAlign

ROIS = f32([[0, 0, 5, 5], [2.5, 1.2, 11.3, 13.7], [-3, -2, 4, 20], [6, 6, 6.2, 6.1],
            [1, 1, 13, 11], [9, 9, 30, 30], [4, 7, 2, 3]])
BATCH = i64([0, 2, 1, 0, 2, 1, 0])


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("transform", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("ratio", [0, 1, 3])
def test_roialign_matches_onnxruntime(mode, transform, ratio):
    x = rng.standard_normal((3, 5, 12, 14)).astype(np.float32)
    attrs = {"mode": mode, "coordinate_transformation_mode": transform,
             "sampling_ratio": ratio, "output_height": 3, "output_width": 4,
             "spatial_scale": 0.9}
    check_against_ort("RoiAlign", [x, ROIS, BATCH], 16, attrs, rtol=1e-5, atol=1e-5)


def test_roialign_opset10_has_no_half_pixel_shift():
    x = rng.standard_normal((3, 2, 10, 9)).astype(np.float64)
    check_against_ort("RoiAlign", [x, ROIS.astype(np.float64), BATCH], 10,
                      {"output_height": 2, "output_width": 5, "spatial_scale": 0.5},
                      rtol=1e-10, atol=1e-10)


def test_roialign_many_rois_run_in_blocks():
    # enough RoIs and channels for the gathered samples to exceed one block
    x = rng.standard_normal((2, 64, 20, 20)).astype(np.float32)
    corners = rng.uniform(0, 20, (300, 2, 2)).astype(np.float32)
    rois = np.concatenate([corners.min(axis=1), corners.max(axis=1)], axis=1)
    batch = rng.integers(0, 2, 300).astype(np.int64)
    check_against_ort("RoiAlign", [x, rois, batch], 16,
                      {"output_height": 7, "output_width": 7, "sampling_ratio": 2},
                      rtol=1e-5, atol=1e-5)


def test_roialign_huge_roi_runs_a_few_output_rows_at_a_time(monkeypatch):
    # with a small block, one RoI's samples (7 x 7 bins of 6 x 6 points) exceed one block
    monkeypatch.setattr(detection, "_BLOCK_ELEMENTS", 1 << 14)
    x = rng.standard_normal((1, 8, 40, 40)).astype(np.float32)
    rois = f32([[0, 0, 40, 40], [10, 20, 13, 24]])
    for mode in ("avg", "max"):
        check_against_ort("RoiAlign", [x, rois, i64([0, 0])], 16,
                          {"output_height": 7, "output_width": 7, "mode": mode},
                          rtol=1e-5, atol=1e-5)


def test_roialign_rejects_bad_batch_index():
    with pytest.raises(KernelError, match="batch indices"):
        resolve("RoiAlign", "", 16).fn(Ctx({}, 16), np.zeros((1, 1, 4, 4), np.float32),
                                       f32([[0, 0, 1, 1]]), i64([1]))
    with pytest.raises(ShapeInferenceError, match="mode"):
        resolve("RoiAlign", "", 16).shape(Ctx({"mode": "sum"}, 16),
                                          TensorInfo(np.dtype(np.float32), (1, 1, 4, 4)),
                                          TensorInfo(np.dtype(np.float32), (1, 4)),
                                          TensorInfo(np.dtype(np.int64), (1,)))
