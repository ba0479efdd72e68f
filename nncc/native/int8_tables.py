"""The tables the native int8 convolutions read (nncc/native/int8_conv_gen.py, its
channel-major form int8_conv_cm.py, the depthwise int8_depthwise_gen.py), each a C struct
(nncc/native/c_struct.py) filled at compile time: the layer's quantization scalars, then
its per-channel arrays.

The scalars: 1 / x_scale (the image's integers are recovered by it), x_zero, x's range, the
shift that makes x unsigned, y_scale, y_zero and y's range.
"""

from __future__ import annotations

import numpy as np

from nncc.kernels.qimage import reciprocal
from nncc.native.c_struct import Field, Struct

SCALARS = tuple(Field(name, "float") for name in
                ("x_inv", "x_zero", "x_lo", "x_hi", "x_shift", "y_scale", "y_zero", "y_lo", "y_hi"))


def quantized_range(dtype) -> tuple[float, float]:
    info = np.iinfo(dtype)
    return float(info.min), float(info.max)


def scalars(xs, xz, ys, yz) -> dict:
    """The values of SCALARS for a layer's activation scales and zero points."""
    xlo, xhi = quantized_range(np.asarray(xz).dtype)
    ylo, yhi = quantized_range(np.asarray(yz).dtype)
    return {"x_inv": reciprocal(xs), "x_zero": float(np.asarray(xz).reshape(())), "x_lo": xlo, "x_hi": xhi,
            "x_shift": 128.0 if np.asarray(xz).dtype == np.int8 else 0.0,
            "y_scale": np.float32(ys).reshape(()), "y_zero": float(np.asarray(yz).reshape(())),
            "y_lo": ylo, "y_hi": yhi}


def columns(n: int) -> Struct:
    """A convolution by a weight matrix, ``n`` output channels (padded to its tiles): per
    channel the weights' sum, their zero point (shifted with them), the int32 bias and the
    requantization multiplier (0 in the padding)."""
    return Struct(f"nn_q8_columns_{n}", SCALARS + (
        Field("w_sum", "int32_t", n), Field("w_zero", "int32_t", n), Field("bias", "int32_t", n),
        Field("mult", "float", n)))


def depthwise(channels: int, pairs: int) -> Struct:
    """A depthwise convolution: each channel's taps in pairs, weights less their zero point
    as two int16 in an int32 word (int8_depthwise_gen.pair_weights), then per channel the
    int32 bias and the multiplier."""
    return Struct(f"nn_q8_depthwise_{channels}x{pairs}p", SCALARS + (
        Field("pairs", "int32_t", channels * pairs), Field("bias", "int32_t", channels),
        Field("mult", "float", channels)))
