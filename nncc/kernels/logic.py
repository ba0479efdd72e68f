"""logic kernels."""
