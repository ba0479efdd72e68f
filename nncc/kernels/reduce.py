"""reduce kernels."""
