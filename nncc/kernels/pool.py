"""pool kernels."""
