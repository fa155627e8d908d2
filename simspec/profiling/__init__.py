"""Operator profiling: measure a device's operator timings into profiles/, or import Vidur's.

Imports: this package may import torch, but only its measuring modules do
(``runner``, ``ops``, ``reference``), and only when a profile is measured:
``add_cli`` and ``import_vidur`` work without torch, so simspec/cli.py can
import this package at module level and simspec.sim never loads torch.

Public API:
- ``run_profile(*, device, models, quick, out, progress) -> list[Path]``
- ``profile_model(model, *, device, grid, out, progress, max_bytes) -> ProfileRun``
- ``import_vidur(src_dir, out) -> list[Path]``
- ``add_cli(subparsers)``: registers ``simspec profile-gpu``.
The folder layout, operator names and CSV columns are in profiles/README.md.
"""

from __future__ import annotations

from simspec.profiling.cli import add_cli
from simspec.profiling.grid import FULL, OPS, QUICK_CPU, QUICK_CUDA, Grid
from simspec.profiling.vidur import import_vidur

__all__ = ["add_cli", "import_vidur", "run_profile", "profile_model", "ProfileRun", "Grid", "OPS", "FULL",
           "QUICK_CPU", "QUICK_CUDA"]

_MEASURING = ("run_profile", "profile_model", "ProfileRun")


def __getattr__(name: str):
    if name in _MEASURING:  # loads torch
        from simspec.profiling import runner
        return getattr(runner, name)
    raise AttributeError(f"module 'simspec.profiling' has no attribute {name!r}")
