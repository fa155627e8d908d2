"""Acceptance: what the drafter proposes, how sure it is, and what the target
actually accepts (DESIGN.md "The serving model", acceptance semantics).

Imports: numpy, scipy, simspec.compiled (numba), simspec.files,
simspec.trees, simspec.types (never simpy or torch).

- :mod:`~simspec.acceptance.context`: what of the image the drafter sees.
- :mod:`~simspec.acceptance.model`: the rank-based model and its compiled draw.
- :mod:`~simspec.acceptance.presets`: published figures as models.
- :mod:`~simspec.acceptance.fit`: models fitted to live acceptance traces, and their files.

``build(spec)`` turns ``--acceptance`` into a model.
"""

from __future__ import annotations

from simspec.acceptance.context import SELECTION_SCALES, DraftContext
from simspec.acceptance.fit import fit_acceptance, load_acceptance, save_acceptance
from simspec.acceptance.model import AcceptanceModel, RandomBlocks, Randoms, Round, draw_round, mean_chain_tokens
from simspec.acceptance.presets import (DEFAULT_PRESET, FITTED_TOP1_LOGIT, PRESETS, DraftSetting, Preset,
                                        expected_length, fit_preset, fit_top1_logit, preset)
from simspec.types import InputError


def build(spec: str, model: str | None = None) -> AcceptanceModel:
    """``--acceptance``: a preset name, ``iid:P`` for i.i.d. acceptance, or
    the path of a calibrated model file (``simspec validate`` writes one),
    which must be of ``model`` where one is given."""
    if spec.lower().endswith(".json"):
        return load_acceptance(spec, model)
    if spec.lower().startswith("iid:"):
        try:
            p = float(spec[4:])
        except ValueError:
            raise InputError(f"acceptance iid:P needs a number P in (0, 1) (got {spec!r})") from None
        return AcceptanceModel.iid(p)
    return preset(spec)


__all__ = ["AcceptanceModel", "DraftContext", "DraftSetting", "Preset", "PRESETS", "DEFAULT_PRESET",
           "FITTED_TOP1_LOGIT", "RandomBlocks", "Randoms", "Round", "SELECTION_SCALES", "build", "draw_round",
           "expected_length", "fit_acceptance", "fit_preset", "fit_top1_logit", "load_acceptance",
           "mean_chain_tokens", "preset", "save_acceptance"]
