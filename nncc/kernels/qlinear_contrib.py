"""The com.microsoft quantized ops onnxruntime's quantizer writes besides QLinearAdd and
QGemm: QLinearMul, QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat,
QLinearSigmoid, QLinearLeakyRelu, and the float-output products DynamicQuantizeMatMul
and MatMulIntegerToFloat. Semantics follow onnxruntime's contrib operator documentation.

What is integer stays integer: sums and products of values minus their zero points are
exact (int32, or int64 where a long reduction could overflow), rounding is half to even
and results saturate to the output type. The scale arithmetic is float32, in the order
onnxruntime's reference formulas state it; where onnxruntime's vectorised code folds the
scales in another order (QLinearMul, QLinearAveragePool), a value lying within float32
rounding of a tie can land one quantization step away, never more (the tests hold nncc
to that bound).
"""

from __future__ import annotations

import math

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir.graph import TensorInfo
from nncc.kernels.quantize import (accumulator_type, centered, check_integer_input, integer_matmul,
                                   dynamic_quantize_linear)
from nncc.kernels.registry import Ctx, kernel, resolve
from nncc.kernels.linalg import matmul_shape
from nncc.kernels.shapes import broadcast, check_size
from nncc.kernels.symbolic import fold

F32 = np.dtype(np.float32)
MS = "com.microsoft"


def _scalar(param, name: str, op: str) -> np.float32:
    if param is None or np.size(param) != 1:
        raise KernelError(f"{op}: {name} must be a scalar")
    return np.float32(np.asarray(param).reshape(()))


def _zero(param, op: str) -> int:
    """A zero point as an int (an omitted one is 0)."""
    if param is None:
        return 0
    if np.size(param) != 1:
        raise KernelError(f"{op}: zero points must be scalars")
    return int(np.asarray(param).reshape(()))


def _quantized(values: np.ndarray, zero: int, dtype: np.dtype) -> np.ndarray:
    """Float values on the output scale: rounded half to even, plus the zero point,
    saturated to ``dtype`` (NaN to the lowest value, as onnxruntime)."""
    info = np.iinfo(dtype)
    with np.errstate(invalid="ignore"):
        q = np.rint(values) + np.float32(zero)
        q = np.clip(q, info.min, info.max)
        q = np.where(np.isnan(q), info.min, q)
    return q.astype(dtype)


def _out_dtype(zero, default) -> np.dtype:
    return default if zero is None or zero.dtype is None else zero.dtype


def _quantize(values: np.ndarray, scale: np.float32, zero: int, dtype: np.dtype) -> np.ndarray:
    """QuantizeLinear in float32: values / scale, rounded, plus the zero point."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return _quantized(values.astype(F32, copy=False) / scale, zero, dtype)


def _dequantize(x: np.ndarray, scale: np.float32, zero: int) -> np.ndarray:
    return (x.astype(np.int32) - np.int32(zero)).astype(F32) * scale


# ------------------------------------------------------------------------ QLinearMul


def _qlinear_mul_shape(ctx, a, a_scale, a_zero, b, b_scale, b_zero, c_scale, c_zero=None):
    out = TensorInfo(_out_dtype(c_zero, a.dtype), broadcast(a.shape, b.shape))
    return fold(ctx, qlinear_mul, [a, a_scale, a_zero, b, b_scale, b_zero, c_scale, c_zero], [out])


@kernel("QLinearMul", since=1, domain=MS, shape=_qlinear_mul_shape)
def qlinear_mul(ctx, a, a_scale, a_zero, b, b_scale, b_zero, c_scale, c_zero=None):
    """C = (A - a_zero)(B - b_zero) * (a_scale * b_scale / c_scale) + c_zero: the integer
    product is exact, its multiplier one float32 constant."""
    op = "QLinearMul"
    check_integer_input(op, a, b, a_zero, b_zero, c_zero)
    multiplier = _scalar(a_scale, "A_scale", op) * _scalar(b_scale, "B_scale", op) / _scalar(c_scale, "C_scale", op)
    product = centered(a, _zero(a_zero, op), np.int32) * centered(b, _zero(b_zero, op), np.int32)
    return _quantized(product.astype(F32) * multiplier, _zero(c_zero, op), _out_dtype(c_zero, a.dtype))


# --------------------------------------------------------------- elementwise by table


def _table_shape(op):
    def shape(ctx, x, x_scale, x_zero, y_scale, y_zero=None):
        return [TensorInfo(_out_dtype(y_zero, x.dtype), x.shape)]
    return shape


def _lookup(ctx, op: str, fn, x, x_scale, x_zero, y_scale, y_zero):
    """y = quantize(fn(dequantize(x))) for every possible 8-bit x, then looked up: the
    table onnxruntime builds, so each value is exactly one float32 evaluation of fn."""
    check_integer_input(op, x, x_zero, y_zero)
    out = _out_dtype(y_zero, x.dtype)
    xs, ys = _scalar(x_scale, "X_scale", op), _scalar(y_scale, "Y_scale", op)
    xz, yz = _zero(x_zero, op), _zero(y_zero, op)
    key = ("lookup", x.dtype.str, out.str, float(xs), xz, float(ys), yz)
    table = ctx.scratch.get(key)
    if table is None:
        info = np.iinfo(x.dtype)
        every = np.arange(info.min, info.max + 1, dtype=np.int32).astype(x.dtype)
        with np.errstate(over="ignore"):
            table = _quantize(fn(_dequantize(every, xs, xz)), ys, yz, out)
        ctx.scratch[key] = table
    index = x.astype(np.int32) - np.iinfo(x.dtype).min
    return table[index]


def _sigmoid(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (np.float32(1) / (np.float32(1) + np.exp(-v))).astype(F32)


@kernel("QLinearSigmoid", since=1, domain=MS, shape=_table_shape("QLinearSigmoid"))
def qlinear_sigmoid(ctx, x, x_scale, x_zero, y_scale, y_zero=None):
    return _lookup(ctx, "QLinearSigmoid", _sigmoid, x, x_scale, x_zero, y_scale, y_zero)


@kernel("QLinearLeakyRelu", since=1, domain=MS, shape=_table_shape("QLinearLeakyRelu"))
def qlinear_leaky_relu(ctx, x, x_scale, x_zero, y_scale, y_zero=None):
    alpha = np.float32(ctx.get("alpha", 0.01))
    return _lookup(ctx, "QLinearLeakyRelu", lambda v: np.where(v >= 0, v, v * alpha).astype(F32),
                   x, x_scale, x_zero, y_scale, y_zero)


# ------------------------------------------------------------------------ pooling


def _channels_last(ctx) -> bool:
    return bool(int(ctx.get("channels_last", 0)))


def global_pool_shape(ctx, x, x_scale, x_zero, y_scale, y_zero=None):
    dtype = _out_dtype(y_zero, x.dtype)
    if x.shape is None:
        return [TensorInfo(dtype, None)]
    if len(x.shape) < 3:
        raise ShapeInferenceError(f"QLinearGlobalAveragePool needs rank >= 3, got {x.shape}")
    ones = (1,) * (len(x.shape) - 2)
    shape = (x.shape[0],) + ones + (x.shape[-1],) if _channels_last(ctx) else tuple(x.shape[:2]) + ones
    return [TensorInfo(dtype, shape)]


@kernel("QLinearGlobalAveragePool", since=1, domain=MS, shape=global_pool_shape)
def qlinear_global_average_pool(ctx, x, x_scale, x_zero, y_scale, y_zero=None):
    """The exact int sum of x - x_zero over the image, times x_scale / (y_scale * size)."""
    op = "QLinearGlobalAveragePool"
    check_integer_input(op, x, x_zero, y_zero)
    if x.ndim < 3:
        raise KernelError(f"{op}: input must have rank >= 3, got {x.shape}")
    axes = tuple(range(1, x.ndim - 1)) if _channels_last(ctx) else tuple(range(2, x.ndim))
    size = math.prod(x.shape[a] for a in axes)
    if size == 0:
        raise KernelError(f"{op}: the image is empty")
    acc = accumulator_type(size, x)
    sums = np.sum(x.astype(acc), axis=axes, keepdims=True) - acc(_zero(x_zero, op)) * size
    scale = _scalar(x_scale, "x_scale", op) / (_scalar(y_scale, "y_scale", op) * np.float32(size))
    return _quantized(sums.astype(F32) * scale, _zero(y_zero, op), _out_dtype(y_zero, x.dtype))


def _float_pool(ctx) -> tuple:
    """The float AveragePool kernel and a context with this node's pooling attributes."""
    attrs = {k: v for k, v in ctx.attrs.items() if k != "channels_last"}
    inner = ctx.scratch.get("pool ctx")
    if inner is None:
        inner = ctx.scratch["pool ctx"] = Ctx(attrs, 19, 1, ctx.name)
    return resolve("AveragePool", "", 19), inner


def _to_channels_first(shape):
    return (shape[0], shape[-1]) + tuple(shape[1:-1])


def _average_pool_shape(ctx, x, x_scale, x_zero, y_scale, y_zero=None):
    dtype = _out_dtype(y_zero, x.dtype)
    if x.shape is None:
        return [TensorInfo(dtype, None)]
    if len(x.shape) < 3:
        raise ShapeInferenceError(f"QLinearAveragePool needs rank >= 3, got {x.shape}")
    definition, inner = _float_pool(ctx)
    last = _channels_last(ctx)
    shape = _to_channels_first(x.shape) if last else x.shape
    out = definition.shape(inner, TensorInfo(F32, tuple(shape)))[0].shape
    if last and out is not None:
        out = (out[0],) + tuple(out[2:]) + (out[1],)
    return [TensorInfo(dtype, out)]


@kernel("QLinearAveragePool", since=1, domain=MS, shape=_average_pool_shape)
def qlinear_average_pool(ctx, x, x_scale, x_zero, y_scale, y_zero=None):
    """AveragePool of the dequantized input (float32), quantized on the output scale."""
    op = "QLinearAveragePool"
    check_integer_input(op, x, x_zero, y_zero)
    if x.ndim < 3:
        raise KernelError(f"{op}: input must have rank >= 3, got {x.shape}")
    definition, inner = _float_pool(ctx)
    last = _channels_last(ctx)
    values = _dequantize(x, _scalar(x_scale, "x_scale", op), _zero(x_zero, op))
    if last:
        values = np.ascontiguousarray(np.moveaxis(values, -1, 1))
    pooled = definition.fn(inner, values)
    if last:
        pooled = np.moveaxis(pooled, 1, -1)
    return _quantize(pooled, _scalar(y_scale, "y_scale", op), _zero(y_zero, op), _out_dtype(y_zero, x.dtype))


# ------------------------------------------------------------------------ QLinearConcat


def _concat_shape(ctx, y_scale, y_zero, *triples):
    if len(triples) % 3 or not triples:
        raise ShapeInferenceError("QLinearConcat takes Y_scale, Y_zero_point, then (X, X_scale, "
                                  "X_zero_point) per input")
    xs = triples[::3]
    dtype = _out_dtype(y_zero, xs[0].dtype)
    if any(x.shape is None for x in xs):
        return [TensorInfo(dtype, None)]
    rank = len(xs[0].shape)
    axis = int(ctx.get("axis", 0))
    if not -rank <= axis < rank:
        raise ShapeInferenceError(f"QLinearConcat: axis {axis} is out of range for rank {rank}")
    axis %= rank
    if any(len(x.shape) != rank for x in xs):
        raise ShapeInferenceError("QLinearConcat: inputs of different ranks")
    sizes = [x.shape[axis] for x in xs]
    total = sum(sizes) if all(isinstance(s, int) for s in sizes) else None
    return [TensorInfo(dtype, tuple(xs[0].shape[:axis]) + (total,) + tuple(xs[0].shape[axis + 1:]))]


@kernel("QLinearConcat", since=1, domain=MS, shape=_concat_shape)
def qlinear_concat(ctx, y_scale, y_zero, *triples):
    """Each input requantized to the output's scale and zero point (unchanged where they
    are already the output's), then concatenated."""
    op = "QLinearConcat"
    if len(triples) % 3 or not triples:
        raise KernelError(f"{op} takes Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) per input")
    ys, yz = _scalar(y_scale, "Y_scale", op), _zero(y_zero, op)
    out = _out_dtype(y_zero, triples[0].dtype)
    parts = []
    for x, x_scale, x_zero in zip(triples[::3], triples[1::3], triples[2::3]):
        check_integer_input(op, x, x_zero)
        xs, xz = _scalar(x_scale, "X_scale", op), _zero(x_zero, op)
        if xs == ys and xz == yz and x.dtype == out:
            parts.append(x)
        else:
            parts.append(_quantize(_dequantize(x, xs, xz), ys, yz, out))
    axis = int(ctx.get("axis", 0))
    try:
        return np.concatenate(parts, axis=axis)
    except (ValueError, np.exceptions.AxisError) as error:
        raise KernelError(f"{op}: {error}") from error


qlinear_concat.arity = (5, None)  # Y_scale, Y_zero_point and at least one triple


# ------------------------------------------------ products with a float result


def _float_product_shape(ctx, a, b):
    info = matmul_shape(ctx, a, b)[0]
    return [TensorInfo(F32, info.shape)]


def _per_column(param, n: int, name: str, op: str) -> np.ndarray:
    """A scale or zero point of B: one value, or one per column of B."""
    if param.size == 1:
        return param.reshape(())
    if param.size != n:
        raise KernelError(f"{op}: {name} has {param.size} entries for {n} columns of B")
    return param.reshape(-1)


def _scaled_product(op, a_q, a_zero, b, b_zero, scale, bias) -> np.ndarray:
    """float32(int32 (A - a_zero)(B - b_zero)) * scale (+ bias), in that order, in float32:
    the Cast, Mul and Add of the unfused graph."""
    n = b.shape[-1]
    b_zero = None if b_zero is None else _per_column(b_zero, n, "b_zero_point", op)
    acc = integer_matmul(op, a_q, b, a_zero, b_zero).astype(np.int32, copy=False)
    with np.errstate(invalid="ignore"):  # 0 times an infinite scale (an infinity in A) is NaN, as in float
        y = acc.astype(F32) * scale
    if bias is not None:
        if bias.dtype != F32 or bias.size != n:
            raise KernelError(f"{op}: bias must be {n} float32 values, got {bias.dtype}{list(bias.shape)}")
        y = y + bias.reshape(-1)
    return y.astype(F32, copy=False)


def _dynamic_quantize_matmul_shape(ctx, a, b, b_scale, b_zero=None, bias=None):
    columns = None if b.shape is None or not b.shape else b.shape[-1]
    check_size("DynamicQuantizeMatMul", "b_scale", b_scale, 1, columns)
    check_size("DynamicQuantizeMatMul", "b_zero_point", b_zero, 1, columns)
    check_size("DynamicQuantizeMatMul", "bias", bias, columns)
    return _float_product_shape(ctx, a, b)


@kernel("DynamicQuantizeMatMul", since=1, domain=MS, shape=_dynamic_quantize_matmul_shape)
def dynamic_quantize_matmul(ctx, a, b, b_scale, b_zero=None, bias=None):
    """A quantized as DynamicQuantizeLinear does (uint8, one scale and zero point for the
    whole tensor), times B minus its zero point in exact integers, scaled by a_scale *
    b_scale (per tensor or per column of B) in float32, plus the bias."""
    op = "DynamicQuantizeMatMul"
    if a.dtype != F32 or b_scale.dtype != F32:
        raise KernelError(f"{op}: A and b_scale must be float32, got {a.dtype} and {b_scale.dtype}")
    check_integer_input(op, b, b_zero)
    if b.ndim < 2:
        raise KernelError(f"{op}: B must have rank >= 2, got {b.shape}")
    a_q, a_scale, a_zero = dynamic_quantize_linear(ctx, a)
    scale = a_scale * _per_column(b_scale, b.shape[-1], "b_scale", op)
    return _scaled_product(op, a_q, a_zero, b, b_zero, scale, bias)


def _matmul_integer_to_float_shape(ctx, a, b, a_scale, b_scale, a_zero=None, b_zero=None, bias=None):
    return _float_product_shape(ctx, a, b)


@kernel("MatMulIntegerToFloat", since=1, domain=MS, shape=_matmul_integer_to_float_shape)
def matmul_integer_to_float(ctx, a, b, a_scale, b_scale, a_zero=None, b_zero=None, bias=None):
    """(A - a_zero)(B - b_zero) in exact integers, times a_scale * b_scale in float32, plus
    the bias: MatMulInteger, Cast, Mul and Add in one."""
    op = "MatMulIntegerToFloat"
    check_integer_input(op, a, b, a_zero, b_zero)
    if a.ndim < 2 or b.ndim < 2:
        raise KernelError(f"{op}: A and B must have rank >= 2, got {a.shape} and {b.shape}")
    if a_scale.dtype != F32 or b_scale.dtype != F32:
        raise KernelError(f"{op}: scales must be float32")
    if a_zero is not None and a_zero.size != 1:
        raise KernelError(f"{op}: a_zero_point must be a scalar")
    scale = _scalar(a_scale, "a_scale", op) * _per_column(b_scale, b.shape[-1], "b_scale", op)
    return _scaled_product(op, a, a_zero, b, b_zero, scale, bias)
