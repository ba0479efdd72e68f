"""Generator and type kernels: Shape, Size, Cast, CastLike, ConstantOfShape, Constant, Range,
EyeLike, and the random generators (RandomUniform(Like), RandomNormal(Like), Bernoulli).

Shape functions here are the source of compile-time values: Shape sets ``value`` when the
requested slice of the input shape is static, and partly symbolic contents (``symbolic``,
see nncc.kernels.symbolic) otherwise; Constant always knows its value; the rest fold small outputs.
"""

from __future__ import annotations

import math

import numpy as np

from nncc.errors import KernelError, ShapeInferenceError
from nncc.ir import low_precision
from nncc.ir.dtypes import onnx_type_name, to_numpy
from nncc.ir.graph import TensorInfo
from nncc.kernels.registry import kernel
from nncc.kernels.shapes import known_value
from nncc.util.limits import check_bytes, check_shape
from nncc.kernels.symbolic import (
    fold, freeze, operand_length, set_contents, shape_operand, symbolic_array, symbolic_contents,
)
from nncc.kernels.tensor import tensor_info

# --------------------------------------------------------------------------------------
# Shape, Size


def _shape_slice(ctx, rank: int) -> slice:
    """Shape-15 start/end: python slicing clamps exactly as the spec says."""
    if ctx.opset < 15:
        return slice(0, rank)
    start, end = int(ctx.get("start", 0)), ctx.get("end")
    return slice(start, rank if end is None else int(end))


def _shape_shape(ctx, x):
    if x is None or x.shape is None:
        return [tensor_info(np.int64, (None,))]
    dims = tuple(x.shape)[_shape_slice(ctx, len(x.shape))]
    out = tensor_info(np.int64, (len(dims),))
    return [set_contents(out, symbolic_array(dims))]


@kernel("Shape", since=1, shape=_shape_shape)
def shape(ctx, x):
    return np.array(x.shape[_shape_slice(ctx, x.ndim)], dtype=np.int64)


def _size_shape(ctx, x):
    out = tensor_info(np.int64, ())
    if x is not None and x.is_static:
        out.value = freeze(np.array(math.prod(x.shape), dtype=np.int64))
    return [out]


@kernel("Size", since=1, shape=_size_shape)
def size(ctx, x):
    return np.array(x.size, dtype=np.int64)


# --------------------------------------------------------------------------------------
# Cast, CastLike


def _target_dtype(code, err) -> np.dtype:
    if code is None:
        raise err("Cast requires the 'to' attribute")
    if isinstance(code, str):  # Cast-1 spelled the type as a string
        names = {"FLOAT": 1, "UINT8": 2, "INT8": 3, "UINT16": 4, "INT16": 5, "INT32": 6,
                 "INT64": 7, "STRING": 8, "BOOL": 9, "FLOAT16": 10, "DOUBLE": 11,
                 "UINT32": 12, "UINT64": 13, "COMPLEX64": 14, "COMPLEX128": 15}
        if code.upper() not in names:
            raise err(f"Cast to unsupported type {code!r}")
        code = names[code.upper()]
    dtype = to_numpy(int(code))
    if dtype is None:
        raise err(f"Cast to {onnx_type_name(int(code))} is not supported")
    return dtype


def _cast_rules(ctx, err) -> tuple[bool, str]:
    """(saturate, round_mode): how float8 and float8e8m0 targets treat out-of-range values
    (Cast and CastLike 19+; round_mode from 24)."""
    saturate = bool(ctx.get("saturate", 1)) if ctx.opset >= 19 else True
    round_mode = ctx.get("round_mode", "up") if ctx.opset >= 24 else "up"
    if round_mode not in ("up", "down", "nearest"):
        raise err(f"Cast: round_mode must be up, down or nearest, got {round_mode!r}")
    return saturate, round_mode


def _cast_array(x: np.ndarray, dtype: np.dtype, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    if x.dtype == dtype:
        return x.view()
    if low_precision.is_low_precision(dtype):
        if x.dtype == object:
            x = _cast_array(x, np.dtype(np.float64))
        return low_precision.convert(x, dtype, saturate, round_mode)
    x = low_precision.widen(x)  # from bfloat16, float8...: exact in float32 (int8)
    if x.dtype == dtype:
        return x
    if dtype == object:  # numbers to strings, formatted as onnxruntime does
        if x.dtype.kind == "f":
            text = np.char.mod("%.8g", x.astype(np.float64))
            text = np.where(np.isnan(x), "NaN", np.where(np.isinf(x),
                            np.where(x > 0, "INF", "-INF"), text))
            return text.astype(object)
        if x.dtype.kind == "b":
            return x.astype(np.uint8).astype(str).astype(object)
        return x.astype(str).astype(object)
    if x.dtype == object:  # strings to numbers
        try:
            if dtype.kind == "b":
                return np.array([s.lower() == "true" or (s.lower() != "false" and float(s) != 0)
                                 for s in x.reshape(-1).tolist()], dtype=bool).reshape(x.shape)
            return x.astype(np.float64).astype(dtype)
        except (TypeError, ValueError) as error:
            raise KernelError(f"Cast cannot parse strings as {dtype}: {error}") from None
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(dtype)


def _cast_info(ctx, x, dtype):
    out = tensor_info(dtype, None if x is None else x.shape)
    if x is None:
        return [out]
    sym = symbolic_contents(x)
    if sym is not None and x.value is None:
        if dtype.kind in "iu" and x.dtype is not None and x.dtype.kind in "iu":
            out.symbolic = sym  # shape entries keep their meaning in any integer type
        return [out]
    rules = _cast_rules(ctx, ShapeInferenceError)
    return fold(ctx, lambda c, v: _cast_array(v, dtype, *rules), [x], [out])


def _cast_shape(ctx, x):
    return _cast_info(ctx, x, _target_dtype(ctx.get("to"), ShapeInferenceError))


@kernel("Cast", since=1, shape=_cast_shape)
def cast(ctx, x):
    return _cast_array(x, _target_dtype(ctx.get("to"), KernelError), *_cast_rules(ctx, KernelError))


def _castlike_shape(ctx, x, like):
    if like.dtype is None:
        return [tensor_info(None, x.shape)]
    return _cast_info(ctx, x, np.dtype(like.dtype))


@kernel("CastLike", since=15, shape=_castlike_shape)
def castlike(ctx, x, like):
    return _cast_array(x, like.dtype, *_cast_rules(ctx, KernelError))


# --------------------------------------------------------------------------------------
# ConstantOfShape, Constant


def _fill_value(ctx) -> np.ndarray:
    value = ctx.get("value")
    if value is None:
        return np.zeros(1, dtype=np.float32)
    value = np.asarray(value)
    if value.size != 1:
        raise ShapeInferenceError(f"ConstantOfShape value must have one element, got {value.shape}")
    return value.reshape(1)


def _constant_of_shape_shape(ctx, shape_in):
    dtype = _fill_value(ctx).dtype
    dims = shape_operand(shape_in)
    if dims is None:
        length = operand_length(shape_in)
        return [tensor_info(dtype, None if length is None else (None,) * length)]
    if any(isinstance(d, int) and d < 0 for d in dims):
        raise ShapeInferenceError(f"ConstantOfShape shape {dims} has negative dims")
    return fold(ctx, constant_of_shape, [shape_in], [tensor_info(dtype, dims)])


@kernel("ConstantOfShape", since=9, shape=_constant_of_shape_shape)
def constant_of_shape(ctx, shape_in):
    value = _fill_value(ctx)
    dims = tuple(int(d) for d in np.asarray(shape_in).reshape(-1))
    if any(d < 0 for d in dims):
        raise KernelError(f"ConstantOfShape shape {dims} has negative dims")
    check_shape(dims, value.dtype.itemsize, f"ConstantOfShape output {list(dims)}")  # before allocating
    if value[0] == 0 and value.dtype != object:
        return np.zeros(dims, dtype=value.dtype)
    return np.full(dims, value[0], dtype=value.dtype)


def _constant_array(ctx, err) -> np.ndarray:
    attrs = ctx.attrs
    if "value" in attrs:
        return np.asarray(attrs["value"])
    if "value_float" in attrs:
        return np.array(attrs["value_float"], dtype=np.float32)
    if "value_floats" in attrs:
        return np.array(attrs["value_floats"], dtype=np.float32).reshape(-1)
    if "value_int" in attrs:
        return np.array(attrs["value_int"], dtype=np.int64)
    if "value_ints" in attrs:
        return np.array(attrs["value_ints"], dtype=np.int64).reshape(-1)
    if "value_string" in attrs:
        out = np.empty((), dtype=object)
        out[()] = attrs["value_string"]
        return out
    if "value_strings" in attrs:
        out = np.empty(len(attrs["value_strings"]), dtype=object)
        out[:] = list(attrs["value_strings"])
        return out
    if "sparse_value" in attrs:
        raise err("Constant with a sparse_value is not supported")
    raise err("Constant needs one of value, value_float(s), value_int(s), value_string(s)")


def _constant_shape(ctx):
    array = freeze(_constant_array(ctx, ShapeInferenceError).view())
    return [TensorInfo(array.dtype, tuple(array.shape), array)]


@kernel("Constant", since=1, shape=_constant_shape)
def constant(ctx):
    array = _constant_array(ctx, KernelError).view()
    array.flags.writeable = False  # every run hands out the same data
    return array


# --------------------------------------------------------------------------------------
# Range


def _scalar(array, what: str, err):
    array = np.asarray(array)
    if array.size != 1:
        raise err(f"Range {what} must be a scalar, got shape {array.shape}")
    return array.reshape(-1)[0]


def _range_count(start, limit, delta, dtype: np.dtype, err) -> int:
    if dtype.kind in "iu":
        s, l, d = int(start), int(limit), int(delta)
        if d == 0:
            raise err("Range delta must not be 0")
        return max(-(-(l - s) // d), 0)
    s, l, d = float(start), float(limit), float(delta)
    if d == 0 or not all(math.isfinite(v) for v in (s, l, d)):
        raise err(f"Range needs finite start/limit and a non-zero delta, got {s}, {l}, {d}")
    return max(math.ceil((l - s) / d), 0)


def _range_shape(ctx, start, limit, delta):
    dtype = start.dtype
    values = [known_value(i) for i in (start, limit, delta)]
    if all(v is not None for v in values):
        s, l, d = (_scalar(v, n, ShapeInferenceError)
                   for v, n in zip(values, ("start", "limit", "delta")))
        count = _range_count(s, l, d, np.dtype(dtype), ShapeInferenceError)
        return fold(ctx, range_kernel, [start, limit, delta], [tensor_info(dtype, (count,))])
    if values[0] is not None and values[2] is not None:
        # Range(0, n, 1) with n a (symbolic) dim: length n.
        limit_entries = shape_operand(limit)
        s, d = (_scalar(v, n, ShapeInferenceError) for v, n in zip(
            (values[0], values[2]), ("start", "delta")))
        if limit_entries is not None and len(limit_entries) == 1 and s == 0 and d == 1:
            return [tensor_info(dtype, (limit_entries[0],))]
    return [tensor_info(dtype, (None,))]


@kernel("Range", since=11, shape=_range_shape)
def range_kernel(ctx, start, limit, delta):
    dtype = start.dtype
    s, l, d = (_scalar(v, n, KernelError) for v, n in zip(
        (start, limit, delta), ("start", "limit", "delta")))
    count = _range_count(s, l, d, dtype, KernelError)
    check_bytes(count * max(8, dtype.itemsize), f"Range output of {count:,} elements")  # before allocating
    if dtype.kind in "iu":
        return np.arange(int(s), int(s) + count * int(d), int(d), dtype=dtype)[:count]
    return (float(s) + np.arange(count, dtype=np.float64) * float(d)).astype(dtype)


# --------------------------------------------------------------------------------------
# EyeLike


def _eye_dtype(ctx, x_dtype, err):
    code = ctx.get("dtype")
    if code is None:
        return x_dtype
    dtype = to_numpy(int(code))
    if dtype is None:
        raise err(f"EyeLike dtype {onnx_type_name(int(code))} is not supported")
    return dtype


def _eyelike_shape(ctx, x):
    dtype = _eye_dtype(ctx, x.dtype, ShapeInferenceError)
    if x.shape is not None and len(x.shape) != 2:
        raise ShapeInferenceError(f"EyeLike expects a 2-D input, got {x.shape}")
    out = tensor_info(dtype, x.shape if x.shape is not None else (None, None))
    if x.is_static and math.prod(x.shape) <= 1024:
        probe = np.empty(x.shape, dtype=np.float32 if x.dtype is None else x.dtype)
        out.value = freeze(eyelike(ctx, probe))
    return [out]


@kernel("EyeLike", since=9, shape=_eyelike_shape)
def eyelike(ctx, x):
    if x.ndim != 2:
        raise KernelError(f"EyeLike expects a 2-D input, got {x.shape}")
    return np.eye(x.shape[0], x.shape[1], k=int(ctx.get("k", 0)),
                  dtype=_eye_dtype(ctx, x.dtype, KernelError))


# --------------------------------------------------------------------------------------
# Random generators: RandomUniform(Like), RandomNormal(Like), Bernoulli
#
# Each node owns one generator (in ctx.scratch), seeded from the `seed` attribute when
# there is one (the same sequence of draws on every fresh load of a model) and from the
# operating system otherwise; each run draws new values. These kernels are registered
# non-deterministic, so their outputs are never folded at compile time.


def _generator(ctx) -> np.random.Generator:
    rng = ctx.scratch.get("rng")
    if rng is None:
        seed = ctx.get("seed")
        # the float seed's bits: every value (negative, fractional) names its own stream
        entropy = None if seed is None else int(np.float64(seed).view(np.uint64))
        rng = ctx.scratch["rng"] = np.random.default_rng(entropy)
    return rng


def _random_dtype(ctx, default, err, op: str, kinds: str = "f") -> np.dtype:
    code = ctx.get("dtype")
    if code is None:
        if default is None:
            raise err(f"{op}: the output type is unknown (set the dtype attribute)")
        dtype = np.dtype(default)
    else:
        dtype = to_numpy(int(code))
        if dtype is None:
            raise err(f"{op}: dtype {onnx_type_name(int(code))} is not supported (numpy has no such type)")
    if dtype.kind not in kinds:
        raise err(f"{op}: cannot produce {dtype} values")
    return dtype


def _static_shape(ctx, err, op: str) -> tuple[int, ...]:
    dims = ctx.get("shape")
    if dims is None:
        raise err(f"{op} requires the 'shape' attribute")
    dims = tuple(int(d) for d in dims)
    if any(d < 0 for d in dims):
        raise err(f"{op}: shape {dims} has negative dims")
    return dims


def _uniform(ctx, shape, dtype) -> np.ndarray:
    low, high = float(ctx.get("low", 0.0)), float(ctx.get("high", 1.0))
    u = _generator(ctx).random(shape)
    u *= high - low
    u += low
    return u.astype(dtype)


def _normal(ctx, shape, dtype) -> np.ndarray:
    mean, scale = float(ctx.get("mean", 0.0)), float(ctx.get("scale", 1.0))
    return _generator(ctx).normal(mean, scale, shape).astype(dtype)


def _random_shape(draw, op):
    def shape(ctx):
        return [tensor_info(_random_dtype(ctx, np.float32, ShapeInferenceError, op),
                     _static_shape(ctx, ShapeInferenceError, op))]

    def fn(ctx):
        return draw(ctx, _static_shape(ctx, KernelError, op),
                    _random_dtype(ctx, np.float32, KernelError, op))

    return shape, fn


def _random_like_shape(draw, op):
    def shape(ctx, x):
        default = x.dtype if x.dtype is not None and x.dtype.kind == "f" else None
        if default is None and ctx.get("dtype") is None and x.dtype is None:
            return [tensor_info(None, x.shape)]
        return [tensor_info(_random_dtype(ctx, default, ShapeInferenceError, op), x.shape)]

    def fn(ctx, x):
        default = x.dtype if x.dtype.kind == "f" else None
        return draw(ctx, x.shape, _random_dtype(ctx, default, KernelError, op))

    return shape, fn


for _op, _draw in (("RandomUniform", _uniform), ("RandomNormal", _normal)):
    _shape_fn, _fn = _random_shape(_draw, _op)
    _fn.__name__ = _op.lower()
    kernel(_op, since=1, shape=_shape_fn, deterministic=False)(_fn)
    _shape_fn, _fn = _random_like_shape(_draw, _op + "Like")
    _fn.__name__ = _op.lower() + "_like"
    kernel(_op + "Like", since=1, shape=_shape_fn, deterministic=False)(_fn)


def _bernoulli_shape(ctx, x):
    return [tensor_info(_random_dtype(ctx, x.dtype, ShapeInferenceError, "Bernoulli", "fiub"), x.shape)]


@kernel("Bernoulli", since=15, shape=_bernoulli_shape, deterministic=False)
def bernoulli(ctx, x):
    # 1 with probability x, else 0, in the dtype attribute's type (the input's by default)
    if x.dtype.kind != "f":
        raise KernelError(f"Bernoulli expects floating-point probabilities, got {x.dtype}")
    dtype = _random_dtype(ctx, x.dtype, KernelError, "Bernoulli", "fiub")
    return (_generator(ctx).random(x.shape) < x).astype(dtype)
