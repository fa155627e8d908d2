"""The compiled marginal planner against its reference: the tuple-heap rule
it replaced, run here by CPython (heapq over (-value, request, code,
depth, rank, parent value) tuples, every candidate priced by
rules._step_s), over random batches with ties. Each phase's popped rows
and codes and the final plan must be identical, not close: a planner that
plans differently is a new policy (issue 21).
"""

from __future__ import annotations

import heapq
from pathlib import Path

import numpy as np
import pytest

from conftest import H100, LLAVA
from simspec import costs, trees
from simspec.costs.steps import load_step_costs
from simspec.policies import rules

ROOT = Path(__file__).resolve().parents[1]
DEPTH, RANKS = 8, 10  # of the random confidences: room for every policy below
POLICIES = [(7, 10, 512), (3, 3, 16), (5, 1, 64), (1, 4, 512), (7, 10, 1)]  # (depth, topk, max_nodes)
SIZES = (1, 2, 3, 7, 37, 129, 256)


def reference_rule(batch: rules.Batch, tables, conf, depth, topk, max_nodes, tie=1):
    """The rule as it was written with heapq (``tie=-1`` breaks value ties
    to the higher request instead: a wrong order, to show the batches
    tell orders apart). Returns the kept (rows, codes) in pop order."""
    b = len(batch.context_tokens)
    p = rules._pricing(batch, tables, topk)
    heap = [(-conf[i, 0, 0], tie * i, 1, 1, 1, 1.0) for i in range(b)
            if batch.remaining_tokens[i] > 1 and conf[i, 0, 0] > 0]
    heapq.heapify(heap)
    rows, chosen = [], []
    gain, pairs, deepest, best, take = float(b), 0, 0, p.rate0, 0
    while heap and len(rows) < max_nodes:
        neg, i, code, d, r, parent = heapq.heappop(heap)
        i, value, n = tie * i, -neg, len(rows)
        slope = rules._step_s(tables, p, n + 2, pairs, 0) - rules._step_s(tables, p, n + 1, pairs, 0)
        if value <= 0 or (slope > 0 and value / slope < best):
            break
        rows.append(i)
        chosen.append(code)
        gain += value
        pairs += int(batch.context_tokens[i])
        deepest = max(deepest, d)
        rate = gain / rules._step_s(tables, p, n + 1, pairs, deepest)
        if rate > best:
            best, take = rate, n + 1
        if d < depth and d + 1 < batch.remaining_tokens[i]:
            heapq.heappush(heap, (-value * conf[i, d, 0], tie * i, trees.child(code, 1), d + 1, 1, value))
        if r < topk:
            heapq.heappush(heap, (-(parent * conf[i, d - 1, r]), tie * i, trees.child(trees.parent(code), r + 1),
                                  d, r + 1, parent))
    return np.array(rows[:take], dtype=np.int64), np.array(chosen[:take], dtype=np.int64)


def reference_phases(batch: rules.Batch, tables, depth, topk, max_nodes, tie=1):
    """Marginal's two phases as they were: the history prior, then the
    drafter's confidences cut to the drafted levels. Returns (rows, codes)
    of each and the levels drafted."""
    b = len(batch.context_tokens)
    alpha = batch.recent_accepted / (batch.recent_accepted + 1.0)
    prior = np.zeros((b, depth, topk))
    prior[:, :, 0] = alpha[:, None]
    first = reference_rule(batch, tables, prior, depth, topk, max_nodes, tie)
    levels = np.zeros(b, dtype=np.int64)
    for i, code in zip(*first):
        levels[i] = max(levels[i], trees.depth(int(code)))
    seen = np.zeros((b, depth, topk))
    for i in range(b):
        seen[i, :levels[i]] = batch.conf[i, :levels[i], :topk]
    return first, reference_rule(batch, tables, seen, depth, topk, max_nodes, tie), levels


def compiled_phases(batch: rules.Batch, tables, depth, topk, max_nodes):
    """The same through the compiled rule, each phase called on its own."""
    b = len(batch.context_tokens)
    p = rules._pricing(batch, tables, topk)
    v = rules._verifying(tables, p)
    e = rules._expansion(b, depth, topk, max_nodes)
    alpha = batch.recent_accepted / (batch.recent_accepted + 1.0)
    levels = np.zeros(b, dtype=np.int64)
    take = rules._marginal_rule(batch, tables, p, v, rules.Confidence(batch.conf, levels, alpha, True), e)
    first = e.rows[:take].copy(), e.chosen[:take].copy()
    for i, d in zip(e.rows[:take], e.depths[:take]):
        levels[i] = max(levels[i], d)
    take = rules._marginal_rule(batch, tables, p, v, rules.Confidence(batch.conf, levels, alpha, False), e)
    return first, (e.rows[:take].copy(), e.chosen[:take].copy()), levels


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
def test_compiled_marginal_plans_as_the_tuple_heap_did(name):
    tables = cost_model(name).tables
    for k, (batch, (depth, topk, max_nodes)) in enumerate(batches(COST_MODELS.index(name), 100)):
        where = f"batch {k}: B={len(batch.context_tokens)}, marginal:depth={depth},topk={topk},max_nodes={max_nodes}"
        want = reference_phases(batch, tables, depth, topk, max_nodes)
        have = compiled_phases(batch, tables, depth, topk, max_nodes)
        for phase, (w, h) in enumerate(zip(want[:2], have[:2]), start=1):
            assert np.array_equal(w[0], h[0]) and np.array_equal(w[1], h[1]), f"{where}, phase {phase}"
        assert np.array_equal(want[2], have[2]), where
        rows, codes = want[1]
        plan = rules._packed(rows, codes, len(batch.context_tokens), topk)
        got = rules.plan_batch(rules.MARGINAL, np.array([depth, topk, max_nodes], dtype=float), batch, tables)
        assert np.array_equal(got.draft_steps, want[2]), where
        for field in ("codes", "num_nodes", "depth", "kind"):
            assert np.array_equal(getattr(got, field), getattr(plan, field)), f"{where}: {field}"
        assert np.array_equal(got.draft_width, np.where((want[2] > 0) & (plan.draft_width == 0), 1, plan.draft_width))


def test_the_batches_tell_tie_orders_apart():
    """The comparison above can fail: breaking value ties to the higher
    request instead picks other nodes in some of its batches."""
    tables = cost_model("roofline").tables
    differ = 0
    for batch, (depth, topk, max_nodes) in batches(0, 40):
        right = reference_phases(batch, tables, depth, topk, max_nodes)
        wrong = reference_phases(batch, tables, depth, topk, max_nodes, tie=-1)
        differ += not all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(right[:2], wrong[:2]))
    assert differ >= 3


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
