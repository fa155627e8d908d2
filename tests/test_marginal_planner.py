"""The load-adaptive rules (simspec.policies.adaptive) against the
simulator's own step formula: every plan a rule makes is priced here by
CostModel.step_s, the function the simulator charges, independently of the
planner's incremental pricing; a rule's plan must be at least as good, by
that price and the rule's own valuation of the tokens, as every fixed
chain it chooses among (``ar``, ``linear:k=1..D``), and as good as the
planner says it is.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import H100, LLAVA
from simspec import costs, trees
from simspec.costs.steps import load_step_costs
from simspec.policies import adaptive, rules
from simspec.types import MAX_RANK, RANK_BITS, StepShape

ROOT = Path(__file__).resolve().parents[1]
DEPTH, RANKS = 8, 10  # of the random confidences: room for every policy below
POLICIES = [(7, 10, 512), (3, 3, 16), (5, 1, 64), (1, 4, 512), (7, 10, 1)]  # (depth, topk, max_nodes)
SIZES = (1, 2, 3, 7, 37, 129, 256)


def step_s(model, batch: rules.Batch, plan: rules.Plan) -> float:
    """The plan's step as the simulator prices it (sim/steps.py), with the
    planner's one approximation: a request's first drafter call is one row."""
    b = len(batch.context_tokens)
    ctx = batch.context_tokens
    q = 1 + plan.num_nodes
    levels = int(plan.draft_steps.max()) if b else 0
    rows = [0] * levels
    drafting = plan.draft_steps > 0
    for i in range(b):
        for level in range(plan.draft_steps[i]):
            rows[level] += 1 if level == 0 else int(plan.draft_width[i])
    selecting = drafting & (batch.kept_visual_tokens > 0) & (batch.kept_visual_tokens < batch.visual_tokens)
    pf = batch.prefill_tokens
    return model.step_s(StepShape(
        forward_tokens=pf + int(q.sum()), kv_read_tokens=batch.prefill_kv_tokens + int(ctx.sum()),
        attn_pairs=batch.prefill_attn_pairs + int((q * ctx).sum()), attn_requests=batch.prefill_requests + b,
        padded_kv_tokens=(batch.prefill_requests + b) * max(batch.prefill_max_context, int(ctx.max()) if b else 0),
        prefill_tokens=pf, prefill_kv_tokens=batch.prefill_kv_tokens, prefill_attn_pairs=batch.prefill_attn_pairs,
        prefill_requests=batch.prefill_requests, verifying=bool(plan.num_nodes.sum() > 0),
        logit_tokens=batch.prefill_requests + int(q.sum()), vision_tokens=batch.vision_tokens,
        draft_level_tokens=tuple(rows), draft_kept_visual_tokens=int(batch.kept_visual_tokens[drafting].sum()),
        select_visual_tokens=int(batch.visual_tokens[selecting].sum()), select_requests=int(selecting.sum())))


def rank_at(code: int, d: int) -> int:
    return (int(code) >> (RANK_BITS * (d - 1))) & MAX_RANK


def conf_value(batch: rules.Batch, plan: rules.Plan) -> float:
    """Expected accepted tokens of a plan by the drafter's confidences (a path's product)."""
    total = 0.0
    for i in range(len(plan.num_nodes)):
        for code in plan.codes[i, :plan.num_nodes[i]]:
            total += np.prod([batch.conf[i, d - 1, rank_at(code, d) - 1] for d in range(1, trees.depth(code) + 1)])
    return total


def history_value(batch: rules.Batch, plan: rules.Plan) -> float:
    """... and by each request's history (goodput's alpha^d, chains only;
    alpha as the rules estimate it: test_history_alpha_* below)."""
    alpha = adaptive._history_alpha(batch)
    return float(sum(sum(alpha[i] ** d for d in range(1, int(k) + 1)) for i, k in enumerate(plan.num_nodes)))


def chain(batch: rules.Batch, k: int) -> rules.Plan:
    """``linear:k`` cut at each request's last token."""
    ks = np.minimum(k, np.maximum(batch.remaining_tokens - 1, 0)).astype(np.int64)
    return rules._chain(batch, ks, ks)


def rate(model, batch, plan, value) -> float:
    return (len(batch.context_tokens) + value(batch, plan)) / step_s(model, batch, plan)


def random_batch(rng: np.random.Generator, b: int) -> rules.Batch:
    """A decode batch of ``b`` requests; about half the time with ties
    everywhere (the same alpha, context and confidences for many requests;
    confidences on a coarse grid, equal across ranks), some zeros, some
    requests one to three tokens from their end, a prefill chunk or not."""
    tied = rng.random() < 0.5
    if tied:
        ctx = rng.choice([64, 800, 2000], b)
        recent = rng.choice([0.0, 1.0, 3.0], b)
        grid = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0], (4, DEPTH, RANKS))
        conf = np.sort(grid, axis=2)[:, :, ::-1][rng.integers(0, 4, b)]
    else:
        ctx = rng.integers(1, 4096, b)
        recent = rng.uniform(0.0, 6.0, b)
        top = rng.uniform(0.05, 1.0, (b, DEPTH))
        conf = np.empty((b, DEPTH, RANKS))
        conf[:, :, 0] = top
        for r in range(1, RANKS):
            conf[:, :, r] = conf[:, :, r - 1] * rng.uniform(0.0, 0.6, (b, DEPTH))
        if rng.random() < 0.3:  # unsorted, zeros: the rule must not care
            conf = rng.uniform(0.0, 1.0, (b, DEPTH, RANKS)) * (rng.random((b, DEPTH, RANKS)) < 0.8)
    remaining = np.where(rng.random(b) < 0.3, rng.integers(1, 4, b), rng.integers(1, 400, b))
    visual = rng.choice([0, 576], b)
    kept = np.where(visual > 0, rng.choice([0, 8, 576], b), 0)
    chunk = int(rng.choice([0, 0, 1, 512, 2048]))
    requests = int(rng.integers(1, 3)) if chunk else 0
    cached = int(rng.integers(0, 3000)) if chunk else 0
    return rules.Batch(
        context_tokens=ctx.astype(np.int64), visual_tokens=visual.astype(np.int64),
        kept_visual_tokens=kept.astype(np.int64), remaining_tokens=remaining.astype(np.int64),
        recent_accepted=recent.astype(np.float64), conf=np.ascontiguousarray(conf),
        true_ranks=np.zeros((b, DEPTH), dtype=np.int64), prefill_tokens=chunk,
        prefill_attn_pairs=chunk * cached + chunk * (chunk + 1) // 2, prefill_kv_tokens=chunk + cached,
        prefill_requests=requests, vision_tokens=int(rng.choice([0, 576])) if chunk else 0,
        prefill_max_context=cached)


def cost_model(name: str):
    if name == "steps:validation/cpu":  # fitted to live steps on this project's CPU (a padded cache)
        return load_step_costs(ROOT / "validation" / "cpu" / "step_costs.json")
    if name == "profile:cpu":  # fitted to the CPU profile of LLaVA
        return costs.build("auto", LLAVA, costs.gpu_spec("cpu-intel-xeon-processor"))
    return costs.build(name, LLAVA, H100)


COST_MODELS = ["roofline", "auto", "steps:validation/cpu", "profile:cpu", "affine:5,0.01"]


def batches(seed: int, count: int):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        b = int(rng.choice(SIZES)) if rng.random() < 0.5 else int(rng.integers(1, 257))
        yield random_batch(rng, b), POLICIES[int(rng.integers(len(POLICIES)))]


@pytest.mark.parametrize("name", COST_MODELS)
def test_goodput_is_never_worse_than_the_chains_it_chooses_among(name):
    model = cost_model(name)
    for k, (batch, (depth, _, _)) in enumerate(batches(COST_MODELS.index(name), 60)):
        plan = rules.plan_batch(rules.GOODPUT, np.array([depth], float), batch, model.tables)
        got = rate(model, batch, plan, history_value)
        for d in range(depth + 1):
            assert got >= rate(model, batch, chain(batch, d), history_value) * (1 - 1e-9), f"batch {k}: k={d}"


@pytest.mark.parametrize("name", COST_MODELS)
def test_marginal_is_never_worse_than_verifying_its_own_drafts_as_chains(name):
    """Phase 2 against the chains phase 1 drafted, and AR with the same drafting."""
    model = cost_model(name)
    for k, (batch, (depth, topk, max_nodes)) in enumerate(batches(10 + COST_MODELS.index(name), 60)):
        plan = rules.plan_batch(rules.MARGINAL, np.array([depth, topk, max_nodes], float), batch, model.tables)
        levels = plan.draft_steps
        assert np.all(plan.depth <= levels), f"batch {k}"
        for row in plan.codes:
            held = {int(c) for c in row if c > 0}
            assert all(trees.parent(c) in held for c in held if trees.depth(c) > 1), f"batch {k}: not a tree"
        got = rate(model, batch, plan, conf_value)
        chains = rules._chain(batch, levels.copy(), levels.copy())
        assert got >= rate(model, batch, chains, conf_value) * (1 - 1e-9), f"batch {k}"


def known(batch: rules.Batch) -> rules.Batch:
    """The batch with every level's rank-1 confidence above 0: a 0 says
    "not drafted yet" (the live engine plans before it drafts a level)."""
    conf = batch.conf.copy()
    conf[:, :, 0] = np.maximum(conf[:, :, 0], 1e-3)
    return batch._replace(conf=conf)


def calibrated(batch: rules.Batch) -> rules.Batch:
    """The batch with each request's confidences equal to its history's
    alpha at every depth (rank 1): where the history is right, a rule that
    drafts level by level knows from the start what each chain is worth."""
    batch = batch._replace(recent_accepted=np.maximum(batch.recent_accepted, 0.01))
    conf = np.zeros_like(batch.conf)
    conf[:, :, 0] = adaptive._history_alpha(batch)[:, None]
    return batch._replace(conf=conf)


@pytest.mark.parametrize("spec", ["truncate", "marginal"])
@pytest.mark.parametrize("name", COST_MODELS)
def test_drafting_level_by_level_is_never_worse_than_a_fixed_chain_where_history_is_right(name, spec):
    model = cost_model(name)
    for k, (batch, (depth, topk, max_nodes)) in enumerate(batches(30 + COST_MODELS.index(name), 60)):
        batch = known(calibrated(batch))
        params = [depth, 1e-12] if spec == "truncate" else [depth, topk, max_nodes]  # no threshold cut
        plan = rules.plan_batch(rules.TRUNCATE if spec == "truncate" else rules.MARGINAL, np.array(params, float),
                                batch, model.tables)
        got = rate(model, batch, plan, conf_value)
        for d in range(1, depth + 1):
            assert got >= rate(model, batch, chain(batch, d), conf_value) * (1 - 1e-9), f"batch {k}: k={d}"


@pytest.mark.parametrize("name", COST_MODELS)
def test_truncate_verifies_the_better_of_its_cut_and_its_drafts(name):
    model = cost_model(name)
    for k, (batch, (depth, _, _)) in enumerate(batches(40 + COST_MODELS.index(name), 60)):
        batch = known(batch)
        plan = rules.plan_batch(rules.TRUNCATE, np.array([depth, 0.4], float), batch, model.tables)
        got = rate(model, batch, plan, conf_value)
        drafted = rules._chain(batch, plan.draft_steps.copy(), plan.draft_steps.copy())
        assert got >= rate(model, batch, drafted, conf_value) * (1 - 1e-9), f"batch {k}"
        assert np.all(plan.num_nodes <= plan.draft_steps)


def _recent(values) -> rules.Batch:
    b = len(values)
    return random_batch(np.random.default_rng(0), b)._replace(recent_accepted=np.asarray(values, float))


def test_history_alpha_is_the_geometric_estimate_when_the_batch_agrees():
    alpha = adaptive._history_alpha(_recent([2.0] * 5))
    assert np.allclose(alpha, 2.0 / 3.0)


def test_history_alpha_shrinks_a_noisy_average_toward_the_batch():
    """Every average moves toward the batch's by its noise's share of its
    noise plus the spread beyond noise; where requests truly differ (a
    spread far beyond the noise) they stay apart."""
    recent = np.array([0.5, 1.0, 2.0, 3.0])
    alpha = adaptive._history_alpha(_recent(recent))
    mean = recent.mean()
    r = alpha / (1.0 - alpha)
    assert np.all(np.abs(r - mean) <= np.abs(recent - mean) + 1e-12)
    assert np.all(np.sign(r - mean) == np.sign(recent - mean))
    keep = 0.3 / (2.0 - 0.3)  # RECENT_WEIGHT's moving average keeps this share of a round's variance
    noise = keep * recent * (1 + recent)
    between = max(recent.var(ddof=1) - noise.mean(), 0.0)
    assert np.allclose(r, recent + noise / (noise + between) * (mean - recent))
    wide = np.array([0.05, 0.1, 8.0, 12.0])  # two requests that rarely accept, two that nearly always do
    kept = adaptive._history_alpha(_recent(wide))
    moved = np.abs(kept / (1 - kept) - wide) / np.abs(wide - wide.mean())
    assert np.all(moved[:2] < 0.01)  # a low average is a precise one (variance m (1 + m))
    assert np.all(moved < 0.6)


def test_the_comparisons_can_fail():
    """A rule that drafts the deepest chain whatever it costs loses to a
    shorter chain in some of these batches by the same prices: the checks
    above tell plans apart."""
    model = cost_model("auto")
    worse = 0
    for batch, (depth, _, _) in batches(0, 40):
        deepest = rate(model, batch, chain(batch, depth), history_value)
        worse += any(rate(model, batch, chain(batch, d), history_value) > deepest * 1.01 for d in range(depth))
    assert worse >= 5


@pytest.mark.parametrize("name", ["roofline", "steps:validation/cpu"])
def test_verify_s_is_step_s(name):
    """The split, memoised pricing is the step formula's float, draft counts and pairs alike."""
    tables = cost_model(name).tables
    rng = np.random.default_rng(5)
    for _ in range(30):
        batch = random_batch(rng, int(rng.integers(1, 257)))
        p = rules._pricing(batch, tables, 10)
        v = rules._verifying(tables, p)
        memo = np.full(2, np.nan)
        pairs = rng.choice(rng.integers(0, 2_000_000, 5), 40)  # repeats: the memo's hits and misses
        for n, pairs, deepest in zip(rng.integers(1, 600, 40), pairs, rng.integers(0, 8, 40)):
            assert rules._verify_s(tables, p, v, memo, n, pairs, deepest) == rules._step_s(tables, p, n, pairs, deepest)
