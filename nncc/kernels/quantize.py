"""Quantization kernels: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv, and the two com.microsoft ops
onnxruntime's quantizer writes by default (QLinearAdd, QGemm).

Integer kernels compute in integers: operands minus their zero points are widened to int32
(int64 when a long reduction could overflow int32) and multiplied with an integer matmul,
so the accumulator is exact. Only requantization (accumulator times the combined scale)
is floating point, rounded half to even and saturated to the output type's range.
"""

from __future__ import annotations

import math

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir import low_precision
from nncc.ir.dtypes import onnx_type_name, to_numpy
from nncc.ir.graph import TensorInfo
from nncc.kernels.conv import conv_geometry, conv_params, conv_shape
from nncc.kernels.linalg import gemm_shape, matmul_shape
from nncc.kernels.registry import kernel
from nncc.kernels.shapes import broadcast
from nncc.kernels.symbolic import fold

_INTEGER_TARGETS = {np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16)}


def _is_quantized_dtype(dtype: np.dtype) -> bool:
    return dtype in _INTEGER_TARGETS or (
        low_precision.is_low_precision(dtype) and dtype.name not in ("bfloat16", "float8_e8m0fnu"))


def _is_integer(dtype: np.dtype) -> bool:
    return dtype.kind in "iu" or low_precision.is_integer(dtype)


def _float_compute(*dtypes: np.dtype) -> np.dtype:
    """The float type a mix of (possibly low-precision) floats is computed in."""
    widened = [np.dtype(np.float32) if low_precision.is_low_precision(d) else d for d in dtypes]
    result = np.result_type(*widened)
    return result if result.kind == "f" else np.dtype(np.float32)


def _as_float(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return low_precision.widen(array).astype(dtype, copy=False)


def _saturate(values: np.ndarray, dtype: np.dtype, saturate: bool = True) -> np.ndarray:
    """Float values (already rounded, for integer targets) into a quantized type."""
    if _is_integer(dtype):
        lo, hi = low_precision.integer_range(dtype)
        with np.errstate(invalid="ignore"):
            clipped = np.clip(values, lo, hi)
            # NaN has no quantized value; onnxruntime gives the lowest, and so does nncc
            whole = np.where(np.isnan(clipped), lo, clipped).astype(np.int64)
        if low_precision.is_low_precision(dtype):
            return low_precision.convert(whole, dtype)
        return whole.astype(dtype)
    return low_precision.convert(values, dtype, saturate)


# -------------------------------------------------------------------- scale layouts


def _quant_axis(ctx, rank: int, err) -> int:
    axis = int(ctx.get("axis", 1))
    if rank == 1 and axis == 1:
        axis = 0  # the default axis of a 1-D input is its only axis
    if not -rank <= axis < max(rank, 1):
        raise err(f"{ctx.name or 'node'}: axis {axis} is out of range for an input of rank {rank}")
    return axis % rank if rank else 0


def _block_size(ctx) -> int:
    return int(ctx.get("block_size", 0)) if ctx.opset >= 21 else 0


def _param_layout(ctx, x_shape, p_shape, what: str, err):
    """How a scale or zero point of shape ``p_shape`` lines up with ``x_shape``: ("tensor",),
    ("axis", axis) or ("block", axis, block_size). Raises ``err`` when they cannot."""
    if p_shape is None or x_shape is None:
        return None
    size = math.prod(d if isinstance(d, int) else 2 for d in p_shape)
    if len(p_shape) == 0 or size == 1 and len(p_shape) == 1:
        return ("tensor",)
    block = _block_size(ctx)
    rank = len(x_shape)
    axis = _quant_axis(ctx, rank, err)
    if block <= 0:
        if len(p_shape) != 1 or ctx.opset < 13:
            raise err(f"{what} must be a scalar{' or a 1-D tensor' if ctx.opset >= 13 else ''}, "
                      f"got shape {tuple(p_shape)}")
        if isinstance(p_shape[0], int) and isinstance(x_shape[axis], int) and p_shape[0] != x_shape[axis]:
            raise err(f"{what} has {p_shape[0]} entries but input axis {axis} has {x_shape[axis]}")
        return ("axis", axis)
    if len(p_shape) != rank:
        raise err(f"{what} of shape {tuple(p_shape)} must have the input's rank {rank} for blocked quantization")
    for i, (d, p) in enumerate(zip(x_shape, p_shape)):
        if not (isinstance(d, int) and isinstance(p, int)):
            continue
        if i == axis:
            if -(-d // block) != p:
                raise err(f"{what} has {p} blocks on axis {axis}, but {d} elements in blocks of "
                          f"{block} make {-(-d // block)}")
        elif d != p:
            raise err(f"{what} of shape {tuple(p_shape)} does not match input {tuple(x_shape)} "
                      f"outside the blocked axis {axis}")
    return ("block", axis, block)


def _expand_param(param: np.ndarray, x_shape, layout) -> np.ndarray:
    """A scale or zero point shaped to broadcast against x."""
    if layout[0] == "tensor":
        return param.reshape(())
    axis = layout[1]
    if layout[0] == "axis":
        dims = [1] * len(x_shape)
        dims[axis] = param.size
        return param.reshape(dims)
    repeated = np.repeat(param, layout[2], axis=axis)
    return repeated[(slice(None),) * axis + (slice(0, x_shape[axis]),)]


def _params(ctx, x: np.ndarray, scale: np.ndarray, zero: np.ndarray | None):
    layout = _param_layout(ctx, x.shape, scale.shape, "scale", KernelError)
    if zero is not None and tuple(zero.shape) != tuple(scale.shape):
        if not (zero.size == 1 and scale.size == 1):
            raise KernelError(f"zero point shape {zero.shape} differs from scale shape {scale.shape}")
    scale = _expand_param(scale, x.shape, layout)
    if zero is not None:
        zero = _expand_param(zero.reshape(scale.shape) if zero.size == 1 else zero, x.shape, layout)
    return scale, zero


def _check_param_shapes(ctx, x, scale, zero, err=ShapeInferenceError):
    if x.shape is None:
        return
    if scale is not None and scale.shape is not None:
        _param_layout(ctx, x.shape, scale.shape, "scale", err)
    if zero is not None and zero.shape is not None and scale is not None and scale.shape is not None:
        both_single = all(isinstance(d, int) for d in zero.shape + scale.shape) and \
            math.prod(zero.shape) == 1 and math.prod(scale.shape) == 1
        if tuple(zero.shape) != tuple(scale.shape) and not both_single:
            raise err(f"zero point shape {zero.shape} differs from scale shape {scale.shape}")


# -------------------------------------------------------------------- QuantizeLinear


def _quantize_target(ctx, zero_dtype, err) -> np.dtype:
    """Output type: output_dtype (21+) or the zero point's type, uint8 without either."""
    code = int(ctx.get("output_dtype", 0)) if ctx.opset >= 21 else 0
    dtype = None
    if code:
        dtype = to_numpy(code)
        if dtype is None or not _is_quantized_dtype(dtype):
            raise err(f"QuantizeLinear cannot quantize to {onnx_type_name(code)}")
        if zero_dtype is not None and zero_dtype != dtype:
            raise err(f"QuantizeLinear output_dtype {onnx_type_name(code)} differs from the zero "
                      f"point's type {zero_dtype}")
    target = dtype or zero_dtype or np.dtype(np.uint8)
    if not _is_quantized_dtype(target):
        raise err(f"QuantizeLinear cannot quantize to {target}")
    return target


def _quantize_compute_dtype(ctx, x_dtype, scale_dtype) -> np.dtype:
    precision = int(ctx.get("precision", 0)) if ctx.opset >= 23 else 0
    if precision:
        dtype = to_numpy(precision)
        if dtype is None or not (dtype.kind == "f" or low_precision.is_float(dtype)):
            raise KernelError(f"QuantizeLinear precision must be a float type, got {onnx_type_name(precision)}")
        return _float_compute(dtype)
    return _float_compute(x_dtype, scale_dtype)


def _quantize_shape(ctx, x, scale, zero=None):
    target = _quantize_target(ctx, None if zero is None else zero.dtype, ShapeInferenceError)
    _check_param_shapes(ctx, x, scale, zero)
    return fold(ctx, quantize_linear, [x, scale, zero], [TensorInfo(target, x.shape)])


def quantize_linear(ctx, x, scale, zero=None):
    target = _quantize_target(ctx, None if zero is None else zero.dtype, KernelError)
    saturate = bool(ctx.get("saturate", 1)) if ctx.opset >= 19 else True
    compute = _quantize_compute_dtype(ctx, x.dtype, scale.dtype)
    scale, zero = _params(ctx, x, scale, zero)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scaled = _as_float(x, compute) / _as_float(scale, compute)
        if _is_integer(target):
            scaled = np.rint(scaled)  # half to even
        if zero is not None:
            scaled = scaled + _as_float(zero, compute)
    return _saturate(scaled, target, saturate)


for _since in (10, 13, 19, 21, 23, 24, 25):
    kernel("QuantizeLinear", since=_since, shape=_quantize_shape)(quantize_linear)


# ------------------------------------------------------------------ DequantizeLinear


def _dequantize_output(ctx, scale_dtype, err) -> np.dtype | None:
    code = int(ctx.get("output_dtype", 0)) if ctx.opset >= 23 else 0
    if code:
        dtype = to_numpy(code)
        if dtype is None or not (dtype.kind == "f" or dtype.name == "bfloat16"):
            raise err(f"DequantizeLinear cannot produce {onnx_type_name(code)}")
        return dtype
    if scale_dtype is not None and low_precision.is_low_precision(scale_dtype) and scale_dtype.name != "bfloat16":
        raise err(f"DequantizeLinear needs output_dtype with a {scale_dtype} scale")
    return scale_dtype


def _dequantize_shape(ctx, x, scale, zero=None):
    out = _dequantize_output(ctx, scale.dtype, ShapeInferenceError)
    if x.dtype is not None and not (_is_quantized_dtype(x.dtype) or x.dtype == np.int32):
        raise ShapeInferenceError(f"DequantizeLinear cannot dequantize {x.dtype}")
    if zero is not None and x.dtype is not None and zero.dtype is not None and zero.dtype != x.dtype:
        raise ShapeInferenceError(f"DequantizeLinear zero point type {zero.dtype} differs from input type {x.dtype}")
    _check_param_shapes(ctx, x, scale, zero)
    return fold(ctx, dequantize_linear, [x, scale, zero], [TensorInfo(out, x.shape)])


def dequantize_linear(ctx, x, scale, zero=None):
    out = _dequantize_output(ctx, scale.dtype, KernelError)
    scale, zero = _params(ctx, x, scale, zero)
    if _is_integer(x.dtype):
        # exact integer difference, then one rounding into float
        wide = np.int64 if x.dtype in (np.dtype(np.int32), np.dtype(np.uint32)) else np.int32
        diff = low_precision.widen(x).astype(wide)
        if zero is not None:
            diff = diff - low_precision.widen(zero).astype(wide)
        compute = np.dtype(np.float64) if wide is np.int64 else _float_compute(np.dtype(np.float32), scale.dtype)
        values = diff.astype(compute)
    else:
        compute = _float_compute(np.dtype(np.float32), scale.dtype)
        values = _as_float(x, compute)
        if zero is not None:
            values = values - _as_float(zero, compute)
    y = values * _as_float(scale, compute)
    return y.astype(out, copy=False)


for _since in (10, 13, 19, 21, 23, 24, 25):
    kernel("DequantizeLinear", since=_since, shape=_dequantize_shape)(dequantize_linear)


# ------------------------------------------------------------- DynamicQuantizeLinear


def _dynamic_quantize_shape(ctx, x):
    if x.dtype is not None and x.dtype != np.float32:
        raise ShapeInferenceError(f"DynamicQuantizeLinear expects float32 input, got {x.dtype}")
    outs = [TensorInfo(np.dtype(np.uint8), x.shape), TensorInfo(np.dtype(np.float32), ()),
            TensorInfo(np.dtype(np.uint8), ())]
    return fold(ctx, dynamic_quantize_linear, [x], outs)


@kernel("DynamicQuantizeLinear", since=11, shape=_dynamic_quantize_shape)
def dynamic_quantize_linear(ctx, x):
    if x.dtype != np.float32:
        raise KernelError(f"DynamicQuantizeLinear expects float32 input, got {x.dtype}")
    qmin, qmax = np.float32(0), np.float32(255)
    # the range always includes 0, so that 0 is exactly representable. A NaN anywhere makes
    # it NaN (ONNX's max(x) and min(x), as the reference evaluator takes them), so the scale
    # is NaN, and so is every product computed with it: onnxruntime's vector min/max instead
    # keeps or drops a NaN, and values sharing its lane, by where it lies in memory
    high = np.maximum(np.float32(0), np.max(x)) if x.size else np.float32(0)
    low = np.minimum(np.float32(0), np.min(x)) if x.size else np.float32(0)
    with np.errstate(invalid="ignore", over="ignore"):
        scale = np.float32((high - low) / (qmax - qmin))
        if scale == 0:
            scale = np.float32(1)  # an all-zero input: any scale works, zero point 0
        # a NaN zero point (the scale NaN, or infinities of both signs): onnxruntime's clamp gives 255
        zero = np.float32(qmax) if np.isnan(qmin - low / scale) else np.rint(np.clip(qmin - low / scale, qmin, qmax))
        # NaN (over a NaN scale, or an infinity over an infinite one) quantizes to 0, as onnxruntime's
        y = np.minimum(np.fmax(np.rint(x / scale) + zero, qmin), qmax)
    return (y.astype(np.uint8), np.array(scale, dtype=np.float32), np.array(zero, dtype=np.uint8))


# ------------------------------------------------------------- integer arithmetic

_INT32_LIMIT = 2**31 - 1


def accumulator_type(terms: int, *operands: np.ndarray) -> type:
    """int32 when a sum of ``terms`` products of the operands cannot overflow it, else int64."""
    bound = terms
    for operand in operands:
        lo, hi = low_precision.integer_range(operand.dtype)
        bound *= hi - lo  # the widest a value minus a zero point of its type can be
    return np.int32 if bound <= _INT32_LIMIT else np.int64


def centered(x: np.ndarray, zero, acc) -> np.ndarray:
    """x - zero_point, exactly, in the accumulator type."""
    values = low_precision.widen(x).astype(acc)
    if zero is not None:
        values -= low_precision.widen(np.asarray(zero)).astype(acc)
    return values


def check_integer_input(op: str, *arrays: np.ndarray) -> None:
    for array in arrays:
        if array is not None and array.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
            raise KernelError(f"{op} expects int8 or uint8 inputs, got {array.dtype}")


def _row_param(param: np.ndarray | None, a_ndim: int) -> np.ndarray | None:
    """A per-row parameter of matrix a ((M,) or (..., M, 1)) shaped to broadcast on a."""
    if param is None or param.size == 1:
        return None if param is None else param.reshape(())
    if param.ndim == 1 and a_ndim >= 2:
        return param.reshape(-1, 1)
    return param


def _column_param(param: np.ndarray | None) -> np.ndarray | None:
    """A per-column parameter of matrix b ((N,) or (..., 1, N)): broadcasts as it is."""
    if param is None or param.size == 1:
        return None if param is None else param.reshape(())
    return param


def integer_matmul(op: str, a, b, a_zero, b_zero) -> np.ndarray:
    if a.ndim == 0 or b.ndim == 0:
        raise KernelError(f"{op}: inputs must have rank >= 1")
    acc = accumulator_type(a.shape[-1], a, b)
    left = centered(a, _row_param(a_zero, a.ndim), acc)
    right = centered(b, _column_param(b_zero), acc)
    # numpy has no fast integer matmul; a float one is exact while every partial sum is
    # an integer the float holds (below 2**24 in float32, 2**53 in float64)
    try:
        return _exact_matmul(left, right, acc, a, b)
    except ValueError as error:
        raise KernelError(f"{op}: incompatible shapes {a.shape} x {b.shape}") from error


_FLOAT32_CHUNKS = 32  # beyond this many float32 products, one float64 product is faster


def _exact_matmul(left: np.ndarray, right: np.ndarray, acc, *operands: np.ndarray) -> np.ndarray:
    """``left @ right`` of centred integers (in ``acc``), exactly, by float matmuls: numpy
    has no fast integer one, and a float matmul is exact while every partial sum is an
    integer the float holds (below 2**24 in float32, 2**53 in float64). float32 takes the
    reduction in chunks short enough for that, summed in ``acc``."""
    per_term = 1
    for operand in operands:
        lo, hi = low_precision.integer_range(operand.dtype)
        per_term *= hi - lo
    terms = left.shape[-1]
    chunk = (2**24 - 1) // per_term
    if chunk >= 1 and -(-terms // chunk) <= _FLOAT32_CHUNKS:
        lf, rf = left.astype(np.float32), right.astype(np.float32)
        if terms <= chunk:
            return np.matmul(lf, rf).astype(acc)
        out = None
        for start in range(0, terms, chunk):
            part = np.matmul(lf[..., start:start + chunk], rf[..., start:start + chunk, :]).astype(acc)
            out = part if out is None else np.add(out, part, out=out)
        return out
    if terms * per_term < 2**53:
        return np.matmul(left.astype(np.float64), right.astype(np.float64)).astype(acc)
    return np.matmul(left, right)


def _requantize(acc: np.ndarray, multiplier, zero, dtype: np.dtype) -> np.ndarray:
    """Accumulator times the combined scale, rounded half to even, plus the output zero
    point, saturated."""
    values = np.rint(acc.astype(np.float64) * np.asarray(multiplier).astype(np.float64))
    if zero is not None:
        values += low_precision.widen(zero).astype(np.float64)
    return _saturate(values, dtype)


# -------------------------------------------------------------------- MatMulInteger


def _matmul_integer_shape(ctx, a, b, a_zero=None, b_zero=None):
    info = matmul_shape(ctx, a, b)[0]
    return fold(ctx, matmul_integer, [a, b, a_zero, b_zero], [TensorInfo(np.dtype(np.int32), info.shape)])


@kernel("MatMulInteger", since=10, shape=_matmul_integer_shape)
def matmul_integer(ctx, a, b, a_zero=None, b_zero=None):
    check_integer_input("MatMulInteger", a, b, a_zero, b_zero)
    # int32 wraps where int64 would not, but the low 32 bits agree: the spec's int32 result
    return integer_matmul("MatMulInteger", a, b, a_zero, b_zero).astype(np.int32, copy=False)


# -------------------------------------------------------------------- QLinearMatMul


def _output_type(y_zero, default) -> np.dtype:
    return default if y_zero is None or y_zero.dtype is None else y_zero.dtype


def _qlinear_matmul_shape(ctx, a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero=None):
    info = matmul_shape(ctx, a, b)[0]
    out = TensorInfo(_output_type(y_zero, a.dtype), info.shape)
    return fold(ctx, qlinear_matmul, [a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero], [out])


def qlinear_matmul(ctx, a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero=None):
    out = a.dtype if y_zero is None else y_zero.dtype
    if not _is_integer(a.dtype) or not _is_integer(b.dtype):  # float8 operands (opset 21)
        left = _as_float(a, np.dtype(np.float32))
        right = _as_float(b, np.dtype(np.float32))
        if a_zero is not None:
            left = left - _as_float(_row_param(a_zero, a.ndim), np.dtype(np.float32))
        if b_zero is not None:
            right = right - _as_float(_column_param(b_zero), np.dtype(np.float32))
        product = np.matmul(left, right) * _combined_scale(a_scale, b_scale, y_scale, a.ndim)
        if y_zero is not None:
            product = product + _as_float(_column_param(y_zero), np.dtype(np.float32))
        return _saturate(product, out)
    acc = integer_matmul("QLinearMatMul", a, b, a_zero, b_zero)
    multiplier = _combined_scale(a_scale, b_scale, y_scale, a.ndim)
    return _requantize(acc, multiplier, _column_param(y_zero), out)


def _combined_scale(a_scale, b_scale, y_scale, a_ndim):
    """a_scale * b_scale / y_scale in the scales' own type (float16 scales multiply in
    float16, as the operator's type says); per-row and per-column scales broadcast."""
    dtype = _float_compute(a_scale.dtype, b_scale.dtype, y_scale.dtype)
    left = _as_float(_row_param(a_scale, a_ndim), dtype)
    right = _as_float(_column_param(b_scale), dtype)
    return left * right / _as_float(_column_param(y_scale), dtype)


for _since in (10, 21):
    kernel("QLinearMatMul", since=_since, shape=_qlinear_matmul_shape)(qlinear_matmul)


# ---------------------------------------------------------------------- convolutions


def integer_conv(ctx, x: np.ndarray, w: np.ndarray, x_zero, w_zero, op: str) -> np.ndarray:
    """The convolution of x - x_zero with w - w_zero, in exact integers (int32, or int64 if
    the reduction could overflow), padding with zero after removing the zero point."""
    if x.ndim < 3 or w.ndim != x.ndim:
        raise KernelError(f"{op}: expected x and w of the same rank >= 3, got {x.shape} and {w.shape}")
    nd, kernel_shape, strides, dilations, pb, pe, auto_pad, group = conv_params(ctx, x.shape, w.shape, KernelError, op)
    if list(kernel_shape) != list(w.shape[2:]):
        raise KernelError(f"{op}: kernel_shape {kernel_shape} does not match weight shape {w.shape}")
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    if c != cg * group or m % group:
        raise KernelError(f"{op}: input channels {c}, weight {w.shape} and group {group} are inconsistent")
    out_sizes, pb, pe = conv_geometry(x.shape[2:], kernel_shape, strides, dilations, pb, pe,
                                       auto_pad, what=op, err=KernelError)
    taps = math.prod(kernel_shape)
    acc = accumulator_type(cg * taps, x, w)
    if w_zero is not None and np.asarray(w_zero).size > 1:
        if np.asarray(w_zero).size != m:
            raise KernelError(f"{op}: w_zero_point has {np.asarray(w_zero).size} entries for {m} output channels")
        w_zero = np.asarray(w_zero).reshape((m,) + (1,) * (nd + 1))
    if x_zero is not None and np.asarray(x_zero).size != 1:
        raise KernelError(f"{op}: x_zero_point must be a scalar")
    xi = centered(x, None if x_zero is None else np.asarray(x_zero).reshape(()), acc)
    wi = centered(w, w_zero, acc)
    if any(p < 0 for p in pb + pe):
        raise KernelError(f"{op}: negative pads are not supported")
    xp = np.pad(xi, [(0, 0), (0, 0)] + list(zip(pb, pe)))
    extent = [(k - 1) * d + 1 for k, d in zip(kernel_shape, dilations)]
    windows = np.lib.stride_tricks.sliding_window_view(xp, extent, axis=tuple(range(2, 2 + nd)))
    windows = windows[(slice(None), slice(None))
                      + tuple(slice(0, o * s, s) for o, s in zip(out_sizes, strides))
                      + tuple(slice(None, None, d) for d in dilations)]
    # (N, C, *out, *k) -> (N, group, P, Cg * K): one integer matmul per group
    p = math.prod(out_sizes)
    spatial = tuple(range(2, 2 + nd))
    taps_axes = tuple(range(2 + nd, 2 + 2 * nd))
    cols = windows.reshape((n, group, cg) + tuple(out_sizes) + tuple(kernel_shape))
    cols = cols.transpose((0, 1) + tuple(a + 1 for a in spatial) + (2,) + tuple(a + 1 for a in taps_axes))
    cols = cols.reshape(n, group, p, cg * taps)
    weights = wi.reshape(group, m // group, cg * taps).transpose(0, 2, 1)
    y = _exact_matmul(cols, weights, acc, x, w)  # (N, group, P, M / group)
    return y.transpose(0, 1, 3, 2).reshape((n, m) + tuple(out_sizes))


def _conv_integer_shape(ctx, x, w, x_zero=None, w_zero=None):
    info = conv_shape(ctx, x, w)[0]
    return [TensorInfo(np.dtype(np.int32), info.shape)]


@kernel("ConvInteger", since=10, shape=_conv_integer_shape)
def conv_integer(ctx, x, w, x_zero=None, w_zero=None):
    check_integer_input("ConvInteger", x, w, x_zero, w_zero)
    return integer_conv(ctx, x, w, x_zero, w_zero, "ConvInteger").astype(np.int32, copy=False)


def _qlinear_conv_shape(ctx, x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero=None, b=None):
    info = conv_shape(ctx, x, w)[0]
    return [TensorInfo(_output_type(y_zero, x.dtype), info.shape)]


@kernel("QLinearConv", since=10, shape=_qlinear_conv_shape)
def qlinear_conv(ctx, x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero=None, b=None):
    check_integer_input("QLinearConv", x, w, x_zero, w_zero, y_zero)
    acc = integer_conv(ctx, x, w, x_zero, w_zero, "QLinearConv")
    m = w.shape[0]
    channel = (1, m) + (1,) * (x.ndim - 2)
    if b is not None:
        if b.size != m:
            raise KernelError(f"QLinearConv: bias has {b.size} entries for {m} output channels")
        acc = acc + b.astype(acc.dtype).reshape(channel)  # int32 bias, same scale as acc
    for name, scale in (("x_scale", x_scale), ("y_scale", y_scale)):
        if scale.size != 1:
            raise KernelError(f"QLinearConv: {name} must be a scalar")
    if w_scale.size not in (1, m):
        raise KernelError(f"QLinearConv: w_scale has {w_scale.size} entries for {m} output channels")
    dtype = _float_compute(x_scale.dtype, w_scale.dtype, y_scale.dtype)
    per_channel = _as_float(w_scale, dtype).reshape(channel if w_scale.size > 1 else ())
    multiplier = _as_float(x_scale, dtype).reshape(()) * per_channel / _as_float(y_scale, dtype).reshape(())
    zero = None if y_zero is None else y_zero.reshape(())
    return _requantize(acc, multiplier, zero, x.dtype if y_zero is None else y_zero.dtype)


# ------------------------------------------------- com.microsoft: QLinearAdd, QGemm
# onnxruntime's quantizer writes these two in its default QOperator format (for Add and
# Gemm); their semantics follow onnxruntime's contrib operator documentation.


def _qlinear_add_shape(ctx, a, a_scale, a_zero, b, b_scale, b_zero, c_scale, c_zero=None):
    out = TensorInfo(_output_type(c_zero, a.dtype), broadcast(a.shape, b.shape))
    return fold(ctx, qlinear_add, [a, a_scale, a_zero, b, b_scale, b_zero, c_scale, c_zero], [out])


@kernel("QLinearAdd", since=1, domain="com.microsoft", shape=_qlinear_add_shape)
def qlinear_add(ctx, a, a_scale, a_zero, b, b_scale, b_zero, c_scale, c_zero=None):
    check_integer_input("QLinearAdd", a, b, a_zero, b_zero, c_zero)
    f32 = np.dtype(np.float32)
    out_scale = _as_float(c_scale, f32).reshape(())
    # As onnxruntime defines it: each side scaled by its ratio to the output scale, in
    # float32, and the output zero point added before rounding (half to even), which
    # decides where a sum lying halfway goes.
    left = centered(a, a_zero, np.int32).astype(f32) * (_as_float(a_scale, f32).reshape(()) / out_scale)
    right = centered(b, b_zero, np.int32).astype(f32) * (_as_float(b_scale, f32).reshape(()) / out_scale)
    values = left + right
    if c_zero is not None:
        values += c_zero.reshape(()).astype(f32)
    return _saturate(np.rint(values), a.dtype if c_zero is None else c_zero.dtype)


def _qgemm_shape(ctx, a, a_scale, a_zero, b, b_scale, b_zero, c=None, y_scale=None, y_zero=None):
    info = gemm_shape(ctx, a, b)[0]
    dtype = np.dtype(np.float32) if y_scale is None else _output_type(y_zero, np.dtype(np.uint8))
    return [TensorInfo(dtype, info.shape)]


@kernel("QGemm", since=1, domain="com.microsoft", shape=_qgemm_shape)
def qgemm(ctx, a, a_scale, a_zero, b, b_scale, b_zero, c=None, y_scale=None, y_zero=None):
    """alpha * a_scale * b_scale * ((A' - a_zero)(B' - b_zero) + C), C an int32 bias on
    the accumulator's scale; quantized with y_scale and y_zero when given, else float32."""
    check_integer_input("QGemm", a, b, a_zero, b_zero, y_zero)
    if a.ndim != 2 or b.ndim != 2:
        raise KernelError(f"QGemm: A and B must be 2-D, got {a.shape} and {b.shape}")
    a = a.T if int(ctx.get("transA", 0)) else a
    b = b.T if int(ctx.get("transB", 0)) else b
    if b_zero is not None and b_zero.size > 1:
        b_zero = b_zero.reshape(1, -1)  # per column of B'
    acc = integer_matmul("QGemm", a, b, a_zero, b_zero)
    if c is not None:
        acc = acc + c.astype(acc.dtype)
    f32 = np.dtype(np.float32)
    per_column = _as_float(b_scale, f32).reshape(1, -1) if b_scale.size > 1 else _as_float(b_scale, f32).reshape(())
    scale = np.float32(ctx.get("alpha", 1.0)) * _as_float(a_scale, f32).reshape(()) * per_column
    if y_scale is None:
        return (acc.astype(np.float64) * scale).astype(f32)
    multiplier = scale / _as_float(y_scale, f32).reshape(())
    zero = None if y_zero is None else y_zero.reshape(())
    return _requantize(acc, multiplier, zero, np.dtype(np.uint8) if y_zero is None else y_zero.dtype)
