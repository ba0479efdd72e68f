"""resize kernels."""
