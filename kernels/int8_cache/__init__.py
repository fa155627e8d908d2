"""int8_cache kernel (see kernels/__init__.py)."""
