"""arithmetic kernels."""
