"""Published acceptance at temperature 0 and 1 against simspec's
temperature rule: the held-out rows of ``validation/published/temperature.csv``
(``benchmarks/temperature.py`` prints them; ``tests/test_temperature.py``
holds them to their bounds).

A held-out row gives one head's chain acceptance, position by position, at
temperature 0 and 1 (EAGLE's Table 2, MT-Bench). The default preset's model
shape is fitted to the rates at 0 (its level and depth profile); moved by the
fall of the preset of the row's size (fitted to EAGLE-2's tree lengths on
other datasets, not to these rates), it predicts the rates at 1.

Imports: numpy, simspec.acceptance.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from simspec.acceptance import presets

TABLE = Path(__file__).resolve().parents[2] / "validation" / "published" / "temperature.csv"


@dataclass(frozen=True)
class Check:
    """One held-out row: conditional per-position rates at 0 and 1, and simspec's at both."""

    id: str
    target: str
    fall: float  # the top-1 logit fall applied
    greedy: np.ndarray  # published at 0
    sampled: np.ndarray  # published at 1
    fitted_greedy: np.ndarray  # simspec's at 0 (fitted to ``greedy``)
    predicted: np.ndarray  # simspec's at 1

    @property
    def error(self) -> float:
        """Mean of predicted less published rates at temperature 1."""
        return float(np.mean(self.predicted - self.sampled))


def conditional(cumulative: np.ndarray) -> np.ndarray:
    """Per-position rates given every earlier draft accepted, from the shares accepted at least that deep."""
    return np.r_[cumulative[0], cumulative[1:] / cumulative[:-1]]


def rows() -> list[dict]:
    with TABLE.open(newline="") as f:
        return list(csv.DictReader(f))


def checks() -> list[Check]:
    out = []
    for row in rows():
        if row["role"] != "held-out":
            continue
        greedy = np.array(row["temperature_0"].split(), dtype=float)
        sampled = np.array(row["temperature_1"].split(), dtype=float)
        size = "13B" if "13B" in row["target"] else "7B"
        fall = presets.FITTED_TEMPERATURE_LOGIT[f"SpecVLM/LLaVA-1.5-{size}"]
        template = replace(presets.preset(presets.DEFAULT_PRESET), top1_logit=0.0, class_logit=())
        model = presets.fit_depth_profile(template, tuple(np.cumprod(greedy)))
        moved = model.with_top1_logit(model.top1_logit + fall)
        out.append(Check(id=row["id"], target=row["target"], fall=fall, greedy=greedy, sampled=sampled,
                         fitted_greedy=conditional(presets.chain_rates(model, len(greedy))),
                         predicted=conditional(presets.chain_rates(moved, len(greedy)))))
    return out
