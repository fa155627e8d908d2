"""Kernel tests. A package so that its conftest is imported as
``kernels.conftest`` and never shadows ``tests/conftest.py``, which the
simulator tests import by its bare name."""
