"""Fused kernels in the private "nncc" domain, produced by fusion passes."""
