"""Element types numpy lacks (bfloat16, float8, float4, 4- and 2-bit integers), through
ml_dtypes.

ml_dtypes is imported only when a model, a plan or an array names one of these types, so
models in the ordinary numpy types never pay for it at start-up. Everything here that
takes a dtype answers from its name, without importing ml_dtypes: an array of such a
dtype can only exist once ml_dtypes is loaded.
"""

from __future__ import annotations

import numpy as np

from nncc.errors import MissingDependencyError

# ONNX TensorProto.DataType code -> ml_dtypes type name (also the numpy dtype's .name)
NAMES: dict[int, str] = {
    16: "bfloat16",
    17: "float8_e4m3fn",
    18: "float8_e4m3fnuz",
    19: "float8_e5m2",
    20: "float8_e5m2fnuz",
    21: "uint4",
    22: "int4",
    23: "float4_e2m1fn",
    24: "float8_e8m0fnu",
    25: "uint2",
    26: "int2",
}
CODES: dict[str, int] = {name: code for code, name in NAMES.items()}

# Bits per element in ONNX storage: these pack several elements per byte (first element
# in the lowest bits); ml_dtypes holds one element per byte.
PACKED_BITS: dict[int, int] = {21: 4, 22: 4, 23: 4, 25: 2, 26: 2}

INTEGER_NAMES = frozenset({"uint4", "int4", "uint2", "int2"})
FLOAT8_NAMES = frozenset({"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"})


def _module():
    try:
        import ml_dtypes  # lazy: ml_dtypes
    except ImportError:
        raise MissingDependencyError(
            "this model uses a low-precision element type (bfloat16, float8, int4...), "
            "which needs the ml_dtypes package: pip install ml_dtypes"
        ) from None
    return ml_dtypes


def dtype_of(code: int) -> np.dtype | None:
    """The numpy dtype of an ONNX low-precision type code (importing ml_dtypes), or None."""
    name = NAMES.get(code)
    if name is None:
        return None
    return np.dtype(getattr(_module(), name))


def dtype_named(name: str) -> np.dtype | None:
    """The dtype for one of the names above (a plan's slot dtype), or None."""
    if name not in CODES:
        return None
    return np.dtype(getattr(_module(), name))


def is_low_precision(dtype) -> bool:
    return dtype is not None and np.dtype(dtype).name in CODES and np.dtype(dtype).kind in "Vf"


def code_of(dtype) -> int | None:
    """ONNX type code of a low-precision dtype, else None."""
    if not is_low_precision(dtype):
        return None
    return CODES[np.dtype(dtype).name]


def is_integer(dtype) -> bool:
    return is_low_precision(dtype) and np.dtype(dtype).name in INTEGER_NAMES


def is_float(dtype) -> bool:
    return is_low_precision(dtype) and np.dtype(dtype).name not in INTEGER_NAMES


def integer_range(dtype) -> tuple[int, int]:
    """(min, max) of an integer dtype, ordinary or low-precision."""
    dtype = np.dtype(dtype)
    if is_integer(dtype):
        info = _module().iinfo(dtype)
    else:
        info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def float_max(dtype) -> float:
    """Largest finite value of a low-precision float dtype."""
    return float(_module().finfo(np.dtype(dtype)).max)


# -- packed storage ------------------------------------------------------------------------


def packed_size(code: int, count: int) -> int:
    """Bytes of ONNX storage for ``count`` elements of type ``code``."""
    bits = PACKED_BITS.get(code)
    if bits is None:
        return count * dtype_of(code).itemsize
    per_byte = 8 // bits
    return -(-count // per_byte)


def unpack(data: np.ndarray, code: int, count: int) -> np.ndarray:
    """uint8 packed bytes -> ``count`` elements of the type, one per byte (flat)."""
    bits = PACKED_BITS[code]
    per_byte = 8 // bits
    mask = np.uint8((1 << bits) - 1)
    data = np.asarray(data, dtype=np.uint8).reshape(-1)
    out = np.empty((data.size, per_byte), dtype=np.uint8)
    for k in range(per_byte):
        np.bitwise_and(data >> np.uint8(k * bits), mask, out=out[:, k])
    return out.reshape(-1)[:count].view(dtype_of(code))


# -- conversion (ONNX Cast rules) ----------------------------------------------------------


def widen(x: np.ndarray) -> np.ndarray:
    """A low-precision array in the smallest numpy type that holds every value exactly
    (float32 for the floats, int8 for the integers); other arrays unchanged."""
    if not is_low_precision(x.dtype):
        return x
    return x.astype(np.int8 if x.dtype.name in INTEGER_NAMES else np.float32)


def convert(x: np.ndarray, dtype: np.dtype, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """``x`` (a numpy array of any numeric type) cast to a low-precision ``dtype``.

    float8: rounded to nearest even; with ``saturate``, out-of-range values and infinities
    become the largest finite value of their sign, otherwise they become NaN (infinity for
    float8e5m2). float4e2m1 has no infinity or NaN and always saturates. 4- and 2-bit
    integers: floats truncate toward zero, then, as for every narrowing integer cast, the
    higher bits are dropped (two's complement). float8e8m0 follows ``round_mode``.
    """
    name = dtype.name
    x = widen(x)
    if name in INTEGER_NAMES:
        bits = dtype_bits(name)
        with np.errstate(invalid="ignore", over="ignore"):
            whole = x.astype(np.int64)
        low = (whole & ((1 << bits) - 1)).astype(np.uint8)
        return low.view(dtype)  # ml_dtypes reads the low bits, sign-extended for int4/int2
    if x.dtype.kind not in "f":
        x = x.astype(np.float64)  # integers and bools: exact below 2**53
    if name == "float8_e8m0fnu":
        return _to_e8m0(x, dtype, saturate, round_mode)
    if name in FLOAT8_NAMES and saturate:
        limit = float_max(dtype)
        x = np.clip(x, -limit, limit)  # NaN stays NaN; infinities become the limits
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(dtype)


def dtype_bits(name: str) -> int:
    return PACKED_BITS[CODES[name]]


_ROUND_MODES = ("up", "down", "nearest")


def _to_e8m0(x: np.ndarray, dtype: np.dtype, saturate: bool, round_mode: str) -> np.ndarray:
    """Powers of two 2**(code - 127), code 0..254; 255 is NaN. The sign is ignored (negative
    inputs are undefined in ONNX). "up" rounds away from zero to the next power, "down"
    toward zero, "nearest" to the nearer power with ties (1.5 * 2**p) going up."""
    if round_mode not in _ROUND_MODES:
        raise ValueError(f"round_mode must be one of {', '.join(_ROUND_MODES)}, got {round_mode!r}")
    magnitude = np.abs(x.astype(np.float64))
    mantissa, exponent = np.frexp(magnitude)  # magnitude = mantissa * 2**exponent, mantissa in [0.5, 1)
    power = exponent.astype(np.int64) - 1  # magnitude in [2**power, 2**(power + 1))
    if round_mode == "up":
        power += mantissa > 0.5
    elif round_mode == "nearest":
        power += mantissa >= 0.75
    code = power + 127
    nan = np.int64(255)
    with np.errstate(invalid="ignore"):
        over = code > 254
        under = (code < 0) | (magnitude == 0)
        code = np.where(over, 254 if saturate else nan, code)
        code = np.where(under, 0 if saturate else nan, code)
        code = np.where(np.isinf(magnitude), 254 if saturate else nan, code)
        code = np.where(np.isnan(magnitude), nan, code)
    return code.astype(np.uint8).view(dtype)
