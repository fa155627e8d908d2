"""tree_attention kernel (see kernels/__init__.py)."""
