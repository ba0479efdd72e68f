"""Quantized ops on float images, in the private "nncc" domain (made by
nncc/passes/qlinear_float.py).

A uint8 or int8 tensor q with scale s and zero point z is carried as its float image
DQ(q) = float32(q - z) * s. The image is exact in float32 and gives q back exactly:
image / s = (q - z)(1 + e) with |e| <= 2**-23 and |q - z| <= 255, so rounding it lands on
q - z. So every value between quantized ops stays float32, and QOperator and QDQ graphs
reduce to the same ops:

* ``QuantizeDequantize(x, scale, zero)``: QuantizeLinear then DequantizeLinear, one step.
* ``QConv(x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero, [bias])``: QLinearConv
  (inputs in its order, its attributes) on the image of x, giving the image of y.
* ``QAdd``, ``QGlobalAveragePool``, ``QGemm``, ``QMatMul``: com.microsoft QLinearAdd,
  QLinearGlobalAveragePool, QGemm and ONNX QLinearMatMul likewise (QGemm without y_scale
  gives its float result as it is).

Each recovers its integer inputs from their images with its own scales and zero points, as
``recover`` does: x times float32(1 / scale), rounded half to even, plus the zero point,
saturated. For an image that is QuantizeLinear's result without a division: x * (1 / s) =
(q - z)(1 + e) with |e| < 2**-22, far from any rounding boundary (the pass only forms
images whose scales keep them normal floats). Then each computes what the integer op
computes. QConv requantizes as onnxruntime does, in float32:
rint(float32(acc) * float32(x_scale * w_scale / y_scale)) + y_zero, saturated. (QLinearConv's
kernel rounds the product in float64: the two may differ by one quantization step where the
product lies within float32 rounding of a tie; the native int8 convolution computes QConv's
float32 form, bit for bit.)
"""

from __future__ import annotations

import numpy as np

from nncc.errors import KernelError
from nncc.ir.graph import TensorInfo
from nncc.kernels import qlinear_contrib
from nncc.kernels.conv import conv_shape
from nncc.kernels.linalg import gemm_shape, matmul_shape
from nncc.kernels.quantize import integer_conv, check_integer_input, qgemm, qlinear_add, qlinear_matmul
from nncc.kernels.registry import kernel
from nncc.kernels.shapes import broadcast, check_size

F32 = np.dtype(np.float32)
NNCC = "nncc"
QUANTIZED = (np.dtype(np.uint8), np.dtype(np.int8))


def _zero_dtype(zero, op: str) -> np.dtype:
    if zero is None or np.asarray(zero).dtype not in QUANTIZED:
        raise KernelError(f"{op}: zero points must be uint8 or int8")
    return np.asarray(zero).dtype


def quantize(x: np.ndarray, scale, zero, op: str) -> np.ndarray:
    """QuantizeLinear: float32 x / scale, rounded half to even, plus the zero point,
    saturated to the zero point's type (an exact image gives its q back)."""
    dtype = _zero_dtype(zero, op)
    if x.dtype != F32:
        raise KernelError(f"{op}: expected a float32 image, got {x.dtype}")
    scale = np.asarray(scale, F32)
    zero = np.asarray(zero)
    if scale.size != 1 or zero.size != 1:
        raise KernelError(f"{op}: the image's scale and zero point must be scalars")
    info = np.iinfo(dtype)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = np.rint(x / scale.reshape(())) + np.float32(zero.reshape(()))
        q = np.clip(q, info.min, info.max)
        q = np.where(np.isnan(q), info.min, q)
    return q.astype(dtype)


def reciprocal(scale) -> float:
    """float32(1 / scale), the factor images are recovered by (native code uses the same)."""
    return float(np.float32(1) / np.float32(np.asarray(scale, np.float32).reshape(())))


def recover(x: np.ndarray, scale, zero, op: str) -> np.ndarray:
    """The integers of an image: x * float32(1 / scale), rounded half to even, plus the
    zero point, saturated to the zero point's type (NaN to the lowest value)."""
    dtype = _zero_dtype(zero, op)
    if x.dtype != F32:
        raise KernelError(f"{op}: expected a float32 image, got {x.dtype}")
    if np.size(scale) != 1 or np.size(zero) != 1:
        raise KernelError(f"{op}: the image's scale and zero point must be scalars")
    info = np.iinfo(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.rint(x * np.float32(reciprocal(scale))) + np.float32(np.asarray(zero).reshape(()))
        q = np.clip(q, info.min, info.max)
        q = np.where(np.isnan(q), info.min, q)
    return q.astype(dtype)


def image(q: np.ndarray, scale, zero) -> np.ndarray:
    """DequantizeLinear of q: float32(q - zero) * scale."""
    scale = np.asarray(scale, F32).reshape(())
    diff = q.astype(np.int32) - np.int32(np.asarray(zero).reshape(()))
    return diff.astype(F32) * scale


def _scalars(op: str, **infos) -> None:
    """Each named operand (a scale or zero point of an image) holds one value."""
    for what, info in infos.items():
        check_size(op, what, info, 1)


def _quantize_dequantize_shape(ctx, x, scale, zero):
    _scalars("QuantizeDequantize", scale=scale, zero_point=zero)
    return [TensorInfo(F32, x.shape)]


# -------------------------------------------------------------- QuantizeDequantize


@kernel("QuantizeDequantize", since=1, domain=NNCC, shape=_quantize_dequantize_shape)
def quantize_dequantize(ctx, x, scale, zero):
    return image(quantize(x, scale, zero, "QuantizeDequantize"), scale, zero)


# ------------------------------------------------------------------------- QConv


def requantize_f32(acc: np.ndarray, multiplier: np.ndarray, zero, dtype: np.dtype) -> np.ndarray:
    """onnxruntime's requantization: float32(acc) * multiplier in float32, rounded half to
    even, plus the zero point, saturated."""
    info = np.iinfo(dtype)
    values = np.rint(acc.astype(F32) * multiplier) + np.float32(np.asarray(zero).reshape(()))
    return np.clip(values, info.min, info.max).astype(dtype)


def _qconv_shape(ctx, x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero, b=None):
    shape = conv_shape(ctx, x, w, b)[0].shape  # b: one value per output channel
    _scalars("QConv", x_scale=x_scale, x_zero_point=x_zero, y_scale=y_scale, y_zero_point=y_zero)
    m = None if w.shape is None else w.shape[0]
    check_size("QConv", "w_scale", w_scale, 1, m)
    check_size("QConv", "w_zero_point", w_zero, 1, m)
    return [TensorInfo(F32, shape)]


@kernel("QConv", since=1, domain=NNCC, shape=_qconv_shape)
def qconv(ctx, x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero, b=None):
    op = "QConv"
    xq = recover(x, x_scale, x_zero, op)
    check_integer_input(op, w, w_zero)
    out_dtype = _zero_dtype(y_zero, op)
    acc = integer_conv(ctx, xq, w, x_zero, w_zero, op)
    m = w.shape[0]
    channel = (1, m) + (1,) * (x.ndim - 2)
    if b is not None:
        if b.dtype != np.int32 or b.size != m:
            raise KernelError(f"{op}: bias must be int32 with one value per output channel ({m})")
        acc = acc + b.astype(acc.dtype).reshape(channel)
    if np.size(w_scale) not in (1, m):
        raise KernelError(f"{op}: w_scale has {np.size(w_scale)} entries for {m} output channels")
    multiplier = multipliers(x_scale, w_scale, y_scale, m).reshape(channel)
    return image(requantize_f32(acc, multiplier, y_zero, out_dtype), y_scale, y_zero)


def multipliers(x_scale, w_scale, y_scale, m: int) -> np.ndarray:
    """float32(x_scale * w_scale / y_scale) per output channel, as onnxruntime forms it."""
    ws = np.broadcast_to(np.asarray(w_scale, F32).reshape(-1), (m,))
    return np.asarray(x_scale, F32).reshape(()) * ws / np.asarray(y_scale, F32).reshape(())


# ------------------------------------------------- the other ops, through their kernels


def _qadd_shape(ctx, a, a_scale, a_zero, b, b_scale, b_zero, c_scale, c_zero):
    _scalars("QAdd", a_scale=a_scale, a_zero_point=a_zero, b_scale=b_scale, b_zero_point=b_zero,
             c_scale=c_scale, c_zero_point=c_zero)
    return [TensorInfo(F32, broadcast(a.shape, b.shape))]


@kernel("QAdd", since=1, domain=NNCC, shape=_qadd_shape)
def qadd(ctx, a, a_scale, a_zero, b, b_scale, b_zero, c_scale, c_zero):
    aq, bq = recover(a, a_scale, a_zero, "QAdd"), recover(b, b_scale, b_zero, "QAdd")
    return image(qlinear_add(ctx, aq, a_scale, a_zero, bq, b_scale, b_zero, c_scale, c_zero), c_scale, c_zero)


def _qpool_shape(ctx, x, x_scale, x_zero, y_scale, y_zero):
    _scalars("QGlobalAveragePool", x_scale=x_scale, x_zero_point=x_zero, y_scale=y_scale, y_zero_point=y_zero)
    return [TensorInfo(F32, qlinear_contrib.global_pool_shape(ctx, x, x_scale, x_zero, y_scale, y_zero)[0].shape)]


@kernel("QGlobalAveragePool", since=1, domain=NNCC, shape=_qpool_shape)
def qglobal_average_pool(ctx, x, x_scale, x_zero, y_scale, y_zero):
    xq = recover(x, x_scale, x_zero, "QGlobalAveragePool")
    y = qlinear_contrib.qlinear_global_average_pool(ctx, xq, x_scale, x_zero, y_scale, y_zero)
    return image(y, y_scale, y_zero)


def _qgemm_shape(ctx, a, a_scale, a_zero, b, b_scale, b_zero, c=None, y_scale=None, y_zero=None):
    shape = gemm_shape(ctx, a, b, c)[0].shape  # c: broadcast to the product
    _scalars("QGemm", a_scale=a_scale, a_zero_point=a_zero, y_scale=y_scale, y_zero_point=y_zero)
    columns = None if shape is None else shape[1]
    check_size("QGemm", "b_scale", b_scale, 1, columns)  # B's quantization: per tensor or per column
    check_size("QGemm", "b_zero_point", b_zero, 1, columns)
    return [TensorInfo(F32, shape)]


@kernel("QGemm", since=1, domain=NNCC, shape=_qgemm_shape)
def qgemm_image(ctx, a, a_scale, a_zero, b, b_scale, b_zero, c=None, y_scale=None, y_zero=None):
    aq = recover(a, a_scale, a_zero, "QGemm")
    y = qgemm(ctx, aq, a_scale, a_zero, b, b_scale, b_zero, c, y_scale, y_zero)
    return y if y_scale is None else image(y, y_scale, y_zero)


def _qmatmul_shape(ctx, a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero):
    shape = matmul_shape(ctx, a, b)[0].shape
    _scalars("QMatMul", a_scale=a_scale, a_zero_point=a_zero, y_scale=y_scale, y_zero_point=y_zero)
    columns = None if b.shape is None or not b.shape else b.shape[-1]
    check_size("QMatMul", "b_scale", b_scale, 1, columns)
    check_size("QMatMul", "b_zero_point", b_zero, 1, columns)
    return [TensorInfo(F32, shape)]


@kernel("QMatMul", since=1, domain=NNCC, shape=_qmatmul_shape)
def qmatmul(ctx, a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero):
    aq = recover(a, a_scale, a_zero, "QMatMul")
    if np.size(a_scale) != 1:
        raise KernelError("QMatMul: a_scale must be a scalar")
    y = qlinear_matmul(ctx, aq, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero)
    return image(y, y_scale, y_zero)

