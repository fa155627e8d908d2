"""simspec's GPU kernels (installed as ``simspec_kernels``): Triton kernels,
each with a plain-PyTorch reference that is its specification.

Imports: torch and triton only (never simspec).
"""
