"""Detection kernels: NonMaxSuppression (opsets 10, 11) and RoiAlign (10, 16, 22).

NonMaxSuppression is greedy and so sequential in the boxes it selects, but each step is
one vectorized IoU of the chosen box against every remaining candidate of its class.
RoiAlign takes the RoIs in groups of equal sampling grids (the adaptive grid follows each
RoI's size) and computes every sampling point of a group's RoIs and bins at once: the four
bilinear corners of all points are gathered as whole channel vectors, a bounded block of
RoIs at a time.
"""

from __future__ import annotations

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import kernel

# --------------------------------------------------------------------------- NonMaxSuppression


def _nms_shape(ctx, boxes, scores, *rest):
    if boxes.shape is not None and (len(boxes.shape) != 3 or (
            isinstance(boxes.shape[2], int) and boxes.shape[2] != 4)):
        raise ShapeInferenceError(f"NonMaxSuppression: boxes must have shape "
                                  f"[batches, boxes, 4], got {boxes.shape}")
    if scores.shape is not None and len(scores.shape) != 3:
        raise ShapeInferenceError(f"NonMaxSuppression: scores must have shape "
                                  f"[batches, classes, boxes], got {scores.shape}")
    return [TensorInfo(np.dtype(np.int64), (None, 3))]


def _optional_scalar(value, what: str, kind: str):
    if value is None or np.asarray(value).size == 0:
        return None
    value = np.asarray(value)
    if value.size != 1 or value.dtype.kind not in kind:
        raise KernelError(f"NonMaxSuppression: {what} must be a scalar, got "
                          f"{value.dtype}{list(value.shape)}")
    return value.reshape(-1)[0]


def _corners(boxes: np.ndarray, center_point_box: int):
    """(y_min, x_min, y_max, x_max) of each box, each of the boxes' leading shape."""
    if center_point_box:  # [x_center, y_center, width, height]
        xc, yc, w, h = (boxes[..., i] for i in range(4))
        return yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2
    y1, x1, y2, x2 = (boxes[..., i] for i in range(4))  # any two opposite corners
    return np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)


def _suppressed(corners, areas, chosen: int, others: np.ndarray, threshold) -> np.ndarray:
    """Which of the boxes `others` overlap box `chosen` by IoU strictly above threshold.
    Boxes without area, or not overlapping, never suppress."""
    y0, x0, y1, x1 = corners
    iy = np.minimum(y1[chosen], y1[others]) - np.maximum(y0[chosen], y0[others])
    ix = np.minimum(x1[chosen], x1[others]) - np.maximum(x0[chosen], x0[others])
    inter = np.where((iy > 0) & (ix > 0), iy * ix, 0)
    union = areas[chosen] + areas[others] - inter
    valid = (inter > 0) & (areas[chosen] > 0) & (areas[others] > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return valid & (inter / np.where(valid, union, 1) > threshold)


@kernel("NonMaxSuppression", since=10, shape=_nms_shape)
def non_max_suppression(ctx, boxes, scores, max_output_boxes_per_class=None,
                        iou_threshold=None, score_threshold=None):
    if boxes.ndim != 3 or boxes.shape[2] != 4:
        raise KernelError(f"NonMaxSuppression: boxes must have shape [batches, boxes, 4], "
                          f"got {boxes.shape}")
    if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise KernelError(f"NonMaxSuppression: scores of shape {scores.shape} do not match "
                          f"boxes of shape {boxes.shape}")
    center = int(ctx.get("center_point_box", 0))
    if center not in (0, 1):
        raise KernelError(f"NonMaxSuppression: center_point_box must be 0 or 1, got {center}")
    limit = _optional_scalar(max_output_boxes_per_class, "max_output_boxes_per_class", "iu")
    limit = 0 if limit is None else max(int(limit), 0)
    iou = _optional_scalar(iou_threshold, "iou_threshold", "f")
    iou = boxes.dtype.type(0) if iou is None else iou
    floor = _optional_scalar(score_threshold, "score_threshold", "f")
    selected = []
    if limit == 0:
        return np.zeros((0, 3), dtype=np.int64)
    corners = _corners(boxes, center)
    areas = (corners[2] - corners[0]) * (corners[3] - corners[1])
    for b in range(boxes.shape[0]):
        box_corners = tuple(c[b] for c in corners)
        for k in range(scores.shape[1]):
            s = scores[b, k]
            candidates = np.flatnonzero(s > floor) if floor is not None else np.arange(s.size)
            # highest score first; equal scores keep the lower box index first
            order = candidates[np.argsort(-s[candidates], kind="stable")]
            kept = 0
            while order.size and kept < limit:
                chosen = order[0]
                selected.append((b, k, chosen))
                kept += 1
                rest = order[1:]
                order = rest[~_suppressed(box_corners, areas[b], chosen, rest, iou)]
    return np.array(selected, dtype=np.int64).reshape(-1, 3)


@kernel("NonMaxSuppression", since=11, shape=_nms_shape)
def non_max_suppression_v11(ctx, boxes, scores, max_output_boxes_per_class=None,
                            iou_threshold=None, score_threshold=None):
    return non_max_suppression(ctx, boxes, scores, max_output_boxes_per_class, iou_threshold,
                               score_threshold)


# --------------------------------------------------------------------------- RoiAlign

# Elements of the gathered block (RoIs x sampling points x 4 corners x channels) to hold
# at once; more RoIs are processed in blocks of this size.
_BLOCK_ELEMENTS = 1 << 22


def _roi_attrs(ctx, err):
    mode = ctx.get("mode", "avg")
    if mode not in ("avg", "max"):
        raise err(f"RoiAlign: unknown mode {mode!r} (expected avg or max)")
    if ctx.opset >= 16:
        transform = ctx.get("coordinate_transformation_mode", "half_pixel")
    else:
        transform = "output_half_pixel"  # opset 10 did not shift by half a pixel
    if transform not in ("half_pixel", "output_half_pixel"):
        raise err(f"RoiAlign: unknown coordinate_transformation_mode {transform!r}")
    height, width = int(ctx.get("output_height", 1)), int(ctx.get("output_width", 1))
    ratio = int(ctx.get("sampling_ratio", 0))
    if height <= 0 or width <= 0 or ratio < 0:
        raise err(f"RoiAlign: output_height ({height}) and output_width ({width}) must be "
                  f"positive and sampling_ratio ({ratio}) non-negative")
    return mode, transform == "half_pixel", height, width, ratio, float(ctx.get("spatial_scale", 1.0))


def _roi_shape(ctx, x, rois, batch_indices):
    _, _, height, width, _, _ = _roi_attrs(ctx, ShapeInferenceError)
    if x.shape is not None and len(x.shape) != 4:
        raise ShapeInferenceError(f"RoiAlign expects a 4-D input, got {x.shape}")
    if rois.shape is not None and (len(rois.shape) != 2 or (
            isinstance(rois.shape[1], int) and rois.shape[1] != 4)):
        raise ShapeInferenceError(f"RoiAlign: rois must have shape [num_rois, 4], got {rois.shape}")
    count = rois.shape[0] if rois.shape is not None else None
    if batch_indices.shape is not None and len(batch_indices.shape) == 1 and count is None:
        count = batch_indices.shape[0]
    channels = x.shape[1] if x.shape is not None else None
    return [TensorInfo(x.dtype, (count, channels, height, width))]


def _axis_samples(start, bin_size, grid: int, bins: np.ndarray, dtype):
    """Sample positions along one axis in the given bins of RoIs sharing a grid size:
    (R, len(bins), grid)."""
    g = np.arange(grid, dtype=dtype)
    p = bins.astype(dtype)
    return (start[:, None, None] + p[None, :, None] * bin_size[:, None, None]
            + (g[None, None, :] + dtype.type(0.5)) * bin_size[:, None, None] / dtype.type(grid))


def _axis_corners(pos, size: int, dtype):
    """Low/high tap indices and weights of bilinear interpolation along one axis, with the
    weights zeroed where a position lies beyond one pixel outside the map."""
    outside = (pos < -1) | (pos > size)
    pos = np.maximum(pos, 0)
    low = np.trunc(pos).astype(np.int64)
    at_edge = low >= size - 1
    low = np.where(at_edge, size - 1, low)
    high = np.where(at_edge, size - 1, low + 1)
    pos = np.where(at_edge, low.astype(dtype), pos)
    frac = (pos - low).astype(dtype)
    w_high = np.where(outside, 0, frac).astype(dtype)
    w_low = np.where(outside, 0, 1 - frac).astype(dtype)
    return (low, w_low), (high, w_high)


def _roi_block(xt, rows, batch_indices, y0, x0, bin_h, bin_w, gh, gw, bins_y, pw, h, w, mode,
               dtype):
    """Pooled (R, C, len(bins_y), pw) values of the RoIs `rows` (all with a gh x gw
    sampling grid) in the output rows bins_y."""
    r, c, ph = rows.size, xt.shape[2], bins_y.size
    taps_y = _axis_corners(_axis_samples(y0[rows], bin_h[rows], gh, bins_y, dtype), h, dtype)
    taps_x = _axis_corners(_axis_samples(x0[rows], bin_w[rows], gw, np.arange(pw), dtype), w,
                           dtype)
    batch = batch_indices[rows].reshape(r, 1)
    values = []  # per bilinear corner: (R, ph * gh * pw * gw, C)
    for iy, wy in taps_y:
        for ix, wx in taps_x:
            flat = iy[:, :, :, None, None] * w + ix[:, None, None, :, :]
            weight = wy[:, :, :, None, None] * wx[:, None, None, :, :]
            values.append(xt[batch, flat.reshape(r, -1)] * weight.reshape(r, -1, 1))
    if mode == "avg":
        total = (values[0] + values[1] + values[2] + values[3]).reshape(r, ph, gh, pw, gw, c)
        pooled = total.sum(axis=(2, 4)) / dtype.type(gh * gw)
    else:  # the largest weighted corner over all sampling points of a bin
        best = np.maximum(np.maximum(values[0], values[1]), np.maximum(values[2], values[3]))
        pooled = best.reshape(r, ph, gh, pw, gw, c).max(axis=(2, 4))
    return pooled.transpose(0, 3, 1, 2)


@kernel("RoiAlign", since=10, shape=_roi_shape)
def roi_align(ctx, x, rois, batch_indices):
    mode, half_pixel, ph, pw, ratio, scale = _roi_attrs(ctx, KernelError)
    if x.ndim != 4:
        raise KernelError(f"RoiAlign expects a 4-D input, got {x.shape}")
    if rois.ndim != 2 or rois.shape[1] != 4:
        raise KernelError(f"RoiAlign: rois must have shape [num_rois, 4], got {rois.shape}")
    batch_indices = np.asarray(batch_indices).reshape(-1).astype(np.int64)
    if batch_indices.size != rois.shape[0]:
        raise KernelError(f"RoiAlign: {batch_indices.size} batch indices for "
                          f"{rois.shape[0]} rois")
    n, c, h, w = x.shape
    if batch_indices.size and (batch_indices.min() < 0 or batch_indices.max() >= n):
        raise KernelError(f"RoiAlign: batch indices must lie in [0, {n}), got "
                          f"{batch_indices.min()}..{batch_indices.max()}")
    dtype = np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)
    count = rois.shape[0]
    y = np.zeros((count, c, ph, pw), dtype=dtype)
    if count == 0 or c == 0:
        return y.astype(x.dtype)
    boxes = rois.astype(dtype) * dtype.type(scale) - dtype.type(0.5 if half_pixel else 0)
    x0, y0, x1, y1 = (boxes[:, i] for i in range(4))
    roi_w, roi_h = x1 - x0, y1 - y0
    if not half_pixel:  # malformed RoIs become 1x1
        roi_w, roi_h = np.maximum(roi_w, 1), np.maximum(roi_h, 1)
    bin_h, bin_w = roi_h / dtype.type(ph), roi_w / dtype.type(pw)
    if ratio > 0:
        grid_h = grid_w = np.full(count, ratio, dtype=np.int64)
    else:
        grid_h = np.ceil(roi_h / dtype.type(ph)).astype(np.int64)
        grid_w = np.ceil(roi_w / dtype.type(pw)).astype(np.int64)
    xt = np.ascontiguousarray(x.reshape(n, c, h * w).transpose(0, 2, 1), dtype=dtype)
    # RoIs are processed in groups of equal sampling grids (adaptive grids follow the RoI
    # size), so no sample is computed for nothing; a RoI without samples stays 0.
    sampled = (grid_h > 0) & (grid_w > 0)
    keys = np.where(sampled, grid_h * (max(int(grid_w.max()), 0) + 1) + grid_w, -1)
    for key in np.unique(keys[sampled]):
        members = np.flatnonzero(keys == key)
        gh, gw = int(grid_h[members[0]]), int(grid_w[members[0]])
        per_bin_row = gh * pw * gw * 4 * c
        block = max(1, _BLOCK_ELEMENTS // (ph * per_bin_row))
        # a RoI too large for one block is taken a few output rows at a time
        bin_rows = ph if block > 1 else max(1, min(ph, _BLOCK_ELEMENTS // per_bin_row))
        for lo in range(0, members.size, block):
            rows = members[lo:lo + block]
            for top in range(0, ph, bin_rows):
                bins_y = np.arange(top, min(top + bin_rows, ph))
                y[rows, :, top:top + bins_y.size] = _roi_block(
                    xt, rows, batch_indices, y0, x0, bin_h, bin_w, gh, gw, bins_y, pw, h, w,
                    mode, dtype)
    return y.astype(x.dtype, copy=False)


@kernel("RoiAlign", since=16, shape=_roi_shape)
def roi_align_v16(ctx, x, rois, batch_indices):
    return roi_align(ctx, x, rois, batch_indices)


@kernel("RoiAlign", since=22, shape=_roi_shape)
def roi_align_v22(ctx, x, rois, batch_indices):
    return roi_align(ctx, x, rois, batch_indices)
