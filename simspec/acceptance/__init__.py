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
from simspec.types import InputError, require


def build(spec: str, model: str | None = None, temperature: float = 0.0) -> AcceptanceModel:
    """``--acceptance``: a preset name, ``iid:P`` for i.i.d. acceptance, or
    the path of a calibrated model file (``simspec validate`` writes one),
    which must be of ``model`` where one is given. A preset moves with the
    requests' sampling ``temperature`` (presets.temperature_offset); ``iid:P``
    is the acceptance at the run's temperature as given; a calibrated file
    was measured greedy (the calibration serves at temperature 0), so it
    refuses another temperature."""
    if spec.lower().endswith(".json"):
        require(temperature == 0.0, f"temperature {temperature:g}: acceptance file {spec} was calibrated from greedy "
                                    f"runs (temperature 0); give temperature 0 with it, or a preset")
        return load_acceptance(spec, model)
    if spec.lower().startswith("iid:"):
        try:
            p = float(spec[4:])
        except ValueError:
            raise InputError(f"acceptance iid:P needs a number P in (0, 1) (got {spec!r})") from None
        return AcceptanceModel.iid(p)
    return preset(spec, temperature)


__all__ = ["AcceptanceModel", "DraftContext", "DraftSetting", "Preset", "PRESETS", "DEFAULT_PRESET",
           "FITTED_TOP1_LOGIT", "RandomBlocks", "Randoms", "Round", "SELECTION_SCALES", "build", "draw_round",
           "expected_length", "fit_acceptance", "fit_preset", "fit_top1_logit", "load_acceptance",
           "mean_chain_tokens", "preset", "save_acceptance"]
