"""tensor kernels."""
