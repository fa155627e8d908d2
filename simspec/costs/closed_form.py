"""Closed-form cost models a user gives for what-if studies and analysis.

Imports: simspec.costs.base. ``constant:STEP_MS`` makes every step cost the
same (prefill, drafting and selection included), which makes timelines
computable by hand; ``affine:BASE_MS,PER_TOKEN_MS`` charges a fixed step cost
plus a price per token through the target (prefill + verification).
"""

from __future__ import annotations

from simspec.costs.base import TOKENS, CostModel, frozen_table


def constant(step_ms: float) -> CostModel:
    return CostModel(label=f"constant: {step_ms:g} ms per step", calibrated=False, overhead_s=step_ms / 1e3)


def affine(base_ms: float, per_token_ms: float) -> CostModel:
    return CostModel(label=f"affine: {base_ms:g} ms + {per_token_ms:g} ms/token", calibrated=False,
                     overhead_s=base_ms / 1e3, layers_s=frozen_table(TOKENS * per_token_ms / 1e3))
