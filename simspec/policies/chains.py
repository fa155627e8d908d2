"""The load-adaptive rules that choose one draft chain per request,
compiled: truncate (SpecDec++'s dynamic head) and goodput (SmartSpec), each
maximising the step's expected tokens per second as marginal does, with
its drafting helpers (simspec.policies.adaptive).

Imports: numpy, numba (simspec.compiled), simspec.policies.pricing,
simspec.policies.adaptive.
"""

from __future__ import annotations

import numpy as np

from simspec.compiled import jit
from simspec.costs.base import CostTables
from simspec.policies.adaptive import _draft_levels, _drafted_chains, _history_alpha, _plan_rate, _rater
from simspec.policies.pricing import Batch, Plan, _chain, _pricing, _verifying


@jit
def _truncate(batch: Batch, costs: CostTables, k_max: int, threshold: float) -> Plan:
    """The dynamic head: each request's chain is cut where its cumulative
    confidence falls under ``threshold`` (the drafter ran one step past the
    cut to see it), and the batch stops drafting where going deeper no
    longer pays (:func:`_draft_levels`). It verifies the cut chains, or
    every drafted level when that has the more predicted tokens per second
    (a cut that saves less verification than the tokens it drops is not made)."""
    b = len(batch.context_tokens)
    p = _pricing(batch, costs, 1)
    v = _verifying(costs, p)
    drafting = _draft_levels(batch, costs, p, v, k_max, threshold)
    levels, cut, worth = drafting.levels, drafting.cut, drafting.worth
    drafted = _drafted_chains(batch, costs, levels)
    r = _rater(costs, p, v)
    gain_cut, n_cut, pairs_cut, gain_all, n_all, pairs_all = float(b), 0, 0, float(b), 0, 0
    for i in range(b):
        gain_cut += worth[i, cut[i]]
        n_cut += cut[i]
        pairs_cut += cut[i] * batch.context_tokens[i]
        gain_all += worth[i, levels[i]]
        n_all += levels[i]
        pairs_all += levels[i] * batch.context_tokens[i]
    rate_all = _plan_rate(costs.layers_s, costs.head_s, p.draft_s, r, drafted.totals, b, gain_all, n_all, pairs_all)
    if rate_all > _plan_rate(costs.layers_s, costs.head_s, p.draft_s, r, drafted.totals, b, gain_cut, n_cut,
                             pairs_cut):
        return _chain(batch, levels.copy(), levels.copy())
    return _chain(batch, cut.copy(), levels.copy())


@jit
def _goodput(batch: Batch, costs: CostTables, k_max: int) -> Plan:
    """SmartSpec: per request the draft length that maximises the step's
    predicted tokens per second, every token valued by the request's
    history alone (goodput's alpha^d: the drafter's confidences go unread),
    the batch's depth decided as :func:`_draft_levels` decides it."""
    b = len(batch.context_tokens)
    history = np.empty((b, k_max, 1))
    alpha = _history_alpha(batch)
    for i in range(b):
        history[i, :, 0] = max(alpha[i], 1e-12)  # every level "drafted", at the history's acceptance
    p = _pricing(batch, costs, 1)
    seen = Batch(batch.context_tokens, batch.visual_tokens, batch.kept_visual_tokens, batch.remaining_tokens,
                 batch.recent_accepted, history, batch.true_ranks, batch.prefill_tokens, batch.prefill_attn_pairs,
                 batch.prefill_kv_tokens, batch.prefill_requests, batch.vision_tokens, batch.prefill_max_context,
                 batch.table_key)
    levels = _draft_levels(seen, costs, p, _verifying(costs, p), k_max, 0.0).levels
    return _chain(batch, levels, levels.copy())


__all__ = ["_truncate", "_goodput"]
