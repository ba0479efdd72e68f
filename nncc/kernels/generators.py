"""generators kernels."""
