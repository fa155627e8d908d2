"""Operator profiling: measure a device's operator timings into profiles/, or import Vidur's.

Imports: this package may import torch, but only its measuring modules do
(``runner``, ``ops``), and only when a profile is measured: ``import_vidur``
works without torch, so simspec.cli can import this package at module level
and simspec.sim never loads torch. The command is simspec.cli.profile.

Public API:
- ``run_profile(*, device, models, quick, out, progress) -> list[Path]``
- ``profile_model(model, *, device, grid, out, progress, max_bytes) -> ProfileRun``
- ``import_vidur(src_dir, out) -> list[Path]``
The folder layout, operator names and CSV columns are in profiles/README.md.
"""

from __future__ import annotations

from simspec.profiling.grid import FULL, OPS, QUICK_CPU, QUICK_CUDA, Grid
from simspec.profiling.vidur import import_vidur

__all__ = ["import_vidur", "run_profile", "profile_model", "ProfileRun", "Grid", "OPS", "FULL",
           "QUICK_CPU", "QUICK_CUDA"]

_MEASURING = ("run_profile", "profile_model", "ProfileRun")


def __getattr__(name: str):
    if name in _MEASURING:  # loads torch
        from simspec.profiling import runner
        return getattr(runner, name)
    raise AttributeError(f"module 'simspec.profiling' has no attribute {name!r}")
