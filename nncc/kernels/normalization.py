"""normalization kernels."""
