"""The roofline prior's fused MoE call against the kernel times engines
published (validation/published/moe_kernels.csv): its floor
(FixedCosts.moe_call_s) is what makes a many-expert model's decode call
right; Mixtral's large experts stay within the stated error."""

from __future__ import annotations

import dataclasses

import numpy as np

from simspec.costs.roofline import FIXED
from simspec.validation.moe_kernels import checks


def test_many_expert_calls_at_decode_batches_are_within_12_percent():
    rows = [c for c in checks() if c.experts >= 64 and c.tokens <= 8]
    assert len(rows) == 12
    assert max(abs(c.error) for c in rows) < 0.12, [(c.id, round(c.error, 3)) for c in rows]


def test_the_floor_is_what_brings_the_median_error_down():
    with_floor = np.median([abs(c.error) for c in checks()])
    without = np.median([abs(c.error) for c in checks(fixed=dataclasses.replace(FIXED, moe_call_s=0.0))])
    assert with_floor < 0.07 and without > 0.3


def test_mixtrals_large_experts_are_within_20_percent_and_priced_dear():
    rows = [c for c in checks() if c.model == "Mixtral-8x7B"]
    assert len(rows) == 7 and all(0 < c.error < 0.2 for c in rows)
