"""Every ONNX backend node test case nncc does not pass, each with its reason.

This is the one place exclusions live; tests/test_onnx_node.py reads it.
"""

NO_NUMPY_DTYPE = "the target element type (bfloat16, float8, int4/uint4, int2/uint2, float4, float8e8m0) has no numpy dtype; nncc rejects such models with a clear error"

EXCLUDED: dict[str, str] = {
    "test_cast_FLOAT16_to_FLOAT4E2M1": NO_NUMPY_DTYPE,
    "test_cast_FLOAT16_to_FLOAT8E4M3FN": NO_NUMPY_DTYPE,
    "test_cast_FLOAT16_to_FLOAT8E4M3FNUZ": NO_NUMPY_DTYPE,
    "test_cast_FLOAT16_to_FLOAT8E5M2": NO_NUMPY_DTYPE,
    "test_cast_FLOAT16_to_FLOAT8E5M2FNUZ": NO_NUMPY_DTYPE,
    "test_cast_FLOAT16_to_INT2": NO_NUMPY_DTYPE,
    "test_cast_FLOAT16_to_INT4": NO_NUMPY_DTYPE,
    "test_cast_FLOAT16_to_UINT2": NO_NUMPY_DTYPE,
    "test_cast_FLOAT16_to_UINT4": NO_NUMPY_DTYPE,
    "test_cast_FLOAT_to_BFLOAT16": NO_NUMPY_DTYPE,
    "test_cast_FLOAT_to_FLOAT4E2M1": NO_NUMPY_DTYPE,
    "test_cast_FLOAT_to_FLOAT8E4M3FN": NO_NUMPY_DTYPE,
    "test_cast_FLOAT_to_FLOAT8E4M3FNUZ": NO_NUMPY_DTYPE,
    "test_cast_FLOAT_to_FLOAT8E5M2": NO_NUMPY_DTYPE,
    "test_cast_FLOAT_to_FLOAT8E5M2FNUZ": NO_NUMPY_DTYPE,
    "test_cast_FLOAT_to_INT2": NO_NUMPY_DTYPE,
    "test_cast_FLOAT_to_INT4": NO_NUMPY_DTYPE,
    "test_cast_FLOAT_to_UINT2": NO_NUMPY_DTYPE,
    "test_cast_FLOAT_to_UINT4": NO_NUMPY_DTYPE,
    "test_cast_e8m0_FLOAT16_to_FLOAT8E8M0": NO_NUMPY_DTYPE,
    "test_cast_e8m0_FLOAT_to_FLOAT8E8M0": NO_NUMPY_DTYPE,
    "test_cast_no_saturate_FLOAT16_to_FLOAT8E4M3FN": NO_NUMPY_DTYPE,
    "test_cast_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ": NO_NUMPY_DTYPE,
    "test_cast_no_saturate_FLOAT16_to_FLOAT8E5M2": NO_NUMPY_DTYPE,
    "test_cast_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ": NO_NUMPY_DTYPE,
    "test_cast_no_saturate_FLOAT_to_FLOAT8E4M3FN": NO_NUMPY_DTYPE,
    "test_cast_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ": NO_NUMPY_DTYPE,
    "test_cast_no_saturate_FLOAT_to_FLOAT8E5M2": NO_NUMPY_DTYPE,
    "test_cast_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ": NO_NUMPY_DTYPE,
    "test_resize_downsample_scales_linear_align_corners": "the stored output divides by the fractional output length; the spec and onnxruntime divide by the whole-number length (tests/test_kernels_nn.py checks this case against onnxruntime)",
    "test_resize_downsample_scales_cubic_align_corners": "the stored output divides by the fractional output length; the spec and onnxruntime divide by the whole-number length (tests/test_kernels_nn.py checks this case against onnxruntime)",
    "test_range_bfloat16_type_positive_delta_expanded": NO_NUMPY_DTYPE,
}
