"""selection kernel (see kernels/__init__.py)."""
