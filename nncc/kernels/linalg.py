"""linalg kernels."""
