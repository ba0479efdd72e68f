"""ONNX TensorProto.DataType codes and their numpy equivalents."""

import numpy as np

from nncc.ir import low_precision

# Codes from onnx.proto's TensorProto.DataType that numpy itself has. The low-precision
# types (bfloat16, float8, float4, int4, int2: codes 16-26) come from ml_dtypes through
# nncc.ir.low_precision, loaded only when a model names one; any other code is absent so
# it fails loudly instead of being misread.
ONNX_TO_NUMPY: dict[int, np.dtype] = {
    1: np.dtype(np.float32),
    2: np.dtype(np.uint8),
    3: np.dtype(np.int8),
    4: np.dtype(np.uint16),
    5: np.dtype(np.int16),
    6: np.dtype(np.int32),
    7: np.dtype(np.int64),
    8: np.dtype(object),  # string
    9: np.dtype(np.bool_),
    10: np.dtype(np.float16),
    11: np.dtype(np.float64),
    12: np.dtype(np.uint32),
    13: np.dtype(np.uint64),
    14: np.dtype(np.complex64),
    15: np.dtype(np.complex128),
}

NUMPY_TO_ONNX: dict[np.dtype, int] = {v: k for k, v in ONNX_TO_NUMPY.items()}

ONNX_TYPE_NAMES = {
    0: "undefined", 1: "float", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16",
    6: "int32", 7: "int64", 8: "string", 9: "bool", 10: "float16", 11: "double",
    12: "uint32", 13: "uint64", 14: "complex64", 15: "complex128", 16: "bfloat16",
    17: "float8e4m3fn", 18: "float8e4m3fnuz", 19: "float8e5m2", 20: "float8e5m2fnuz",
    21: "uint4", 22: "int4", 23: "float4e2m1", 24: "float8e8m0", 25: "uint2", 26: "int2",
    27: "float6e2m3", 28: "float6e3m2",
}


def onnx_type_name(code: int) -> str:
    return ONNX_TYPE_NAMES.get(code, f"type {code}")


def to_numpy(code: int) -> np.dtype | None:
    """numpy dtype for an ONNX type code, or None when nncc cannot represent it."""
    dtype = ONNX_TO_NUMPY.get(code)
    if dtype is None:
        return low_precision.dtype_of(code)  # imports ml_dtypes only for these codes
    return dtype


def to_onnx(dtype) -> int | None:
    """ONNX type code of a numpy (or ml_dtypes) dtype, or None."""
    dtype = np.dtype(dtype)
    code = NUMPY_TO_ONNX.get(dtype)
    if code is None:
        return low_precision.code_of(dtype)
    return code
