"""conv kernels."""
