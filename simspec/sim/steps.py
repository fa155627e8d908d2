"""The engine step's arithmetic, compiled: draw, plan, price, accept, log.

Imports: numpy, simspec.compiled (numba), simspec.acceptance.model (the
compiled draw), simspec.policies.rules (plan_batch), simspec.costs.base
(step_cost), simspec.serving (the acceptance estimate), simspec.trees
(accepted_length). No simpy: the SimPy process in replica.py
decides *when* steps happen (admission, preemption, prefill chunks,
arrivals); :func:`run_steps` does the per-step numbers.

A simulated hour of serving is some 300,000 steps, so the replica asks for
several decode-only steps in one call and yields to SimPy once, at the
first step boundary where anything outside the batch could matter: a
request finished, the next arrival is due, the KV cache is short, or a log
buffer is full. Events inside those steps are timestamped step by step, so
the result is the same as yielding after every step.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simspec.acceptance.model import Draws, Randoms, draw_round, normals_per_round
from simspec.compiled import jit
from simspec.costs.base import CostTables, Forward, Step, cpu_s, step_cost
from simspec.policies import rules
from simspec.serving.estimate import after_round
from simspec.serving.queues import NO_PREFILL, Prefill
from simspec import trees


class RequestState(NamedTuple):
    """Per-request arrays of the run, indexed by request id; mutated in place."""

    context: np.ndarray  # [N] int prompt tokens (text + visual)
    visual: np.ndarray  # [N] int visual tokens
    kept: np.ndarray  # [N] int visual tokens the drafter sees
    output: np.ndarray  # [N] int tokens to generate
    emitted: np.ndarray  # [N] int tokens generated so far
    cache: np.ndarray  # [N] int tokens in the KV cache
    absorbed: np.ndarray  # [N] int text tokens of the cache the drafter has run (its KV cache)
    recent: np.ndarray  # [N] float moving average of accepted tokens per drafted round
    drafted: np.ndarray  # [N] int draft tokens in the request's last round
    difficulty: np.ndarray  # [N] float top-1 acceptance logit of the request
    retention: np.ndarray  # [N] float acceptance kept at image-grounded positions
    population: np.ndarray  # [1] float moving average of accepted tokens per drafted round, all requests


class PolicyCall(NamedTuple):
    kernel: int
    params: np.ndarray
    depth: int  # draft depth of a round's confidences / true ranks
    ranks: int
    needs_truth: bool
    chain_drafting: bool  # EngineConfig.drafting == "chain": how the drafter's calls are priced


class EngineTerms(NamedTuple):
    """How an engine mode prices a step beyond the cost model's pieces
    (EngineConfig's fields; simspec.serving.modes)."""

    overlap: bool  # async scheduling: the step's fixed CPU part (overhead_s) overlaps its GPU part
    graphs: int  # GRAPH_NONE, GRAPH_PIECEWISE or GRAPH_FULL_AND_PIECEWISE
    capture: np.ndarray  # [C] int captured token counts, ascending (empty: no graphs)
    piecewise_max: int  # tokens up to which a non-uniform step runs piecewise (above: eager)
    piecewise_s: float  # extra seconds of a step in the piecewise regime (attention launched eagerly)
    eager_s: float  # extra seconds of a step run without graphs
    drafter_over_prefill: bool  # the drafter's first pass also runs over the step's prefill tokens
    lagged_key: bool  # vLLM: batch_table's draft length from the previous step's scheduled requests, prefills too


GRAPH_NONE, GRAPH_PIECEWISE, GRAPH_FULL_AND_PIECEWISE = 0, 1, 2
REGIME_EAGER, REGIME_PIECEWISE, REGIME_FULL = 0, 1, 2


@jit
def graph_regime(terms: EngineTerms, tokens: int, uniform: bool):
    """(regime, padded tokens) of a forward over ``tokens`` query tokens:
    vLLM's dispatcher (vllm/v1/cudagraph_dispatcher.py 0.33, l.233-322)
    pads to the next captured size, replays a full graph for a uniform
    decode batch (every request verifying the same 1 + K tokens, no prefill)
    and a piecewise one otherwise, and runs eagerly above the largest size.
    SGLang's prefill graphs reach further (``piecewise_max``, its chunk
    size): a non-uniform step up to it runs piecewise, unpadded beyond the
    captured sizes."""
    c = terms.capture
    if terms.graphs == GRAPH_NONE or len(c) == 0 or tokens <= 0:
        return REGIME_EAGER, tokens
    if tokens > c[len(c) - 1]:
        if not uniform and tokens <= terms.piecewise_max:
            return REGIME_PIECEWISE, tokens
        return REGIME_EAGER, tokens
    padded = c[np.searchsorted(c, tokens)]
    if uniform and terms.graphs == GRAPH_FULL_AND_PIECEWISE:
        return REGIME_FULL, padded
    return REGIME_PIECEWISE, padded


@jit
def engine_step_s(terms: EngineTerms, overhead_s: float, step_s: float, regime: int) -> float:
    """A step's seconds under the engine's overlap and graph regime, from
    the cost model's ``step_s`` (which includes ``overhead_s``)."""
    if regime == REGIME_PIECEWISE:
        step_s += terms.piecewise_s
    elif regime == REGIME_EAGER:
        step_s += terms.eager_s
    if terms.overlap:  # max(GPU time, CPU time): the fixed part runs beside the GPU's
        return max(step_s - overhead_s, overhead_s)
    return step_s


class Logs(NamedTuple):
    """Preallocated log buffers; ``fill`` counts what is used: [chunks, rounds, steps]."""

    chunk_id: np.ndarray
    chunk_tokens: np.ndarray
    chunk_time_s: np.ndarray
    round_accepted: np.ndarray
    round_depth: np.ndarray
    round_drafted: np.ndarray
    step_start_s: np.ndarray
    step_duration_s: np.ndarray
    step_batch: np.ndarray
    step_plans: np.ndarray  # [S, 3] rounds planned AR / linear / tree
    step_tokens: np.ndarray  # [S] tokens emitted at the step's end
    fill: np.ndarray  # [3] int


@jit
def offchain_rows(codes: np.ndarray, num_nodes: np.ndarray, levels: int) -> np.ndarray:
    """A chain-first engine's extra drafter rows (``EngineConfig.drafting =
    "chain"``): at depth d, one row per distinct plan node at depth d-1 that
    is off the rank-1 chain and has children in the plan. ``[levels]``,
    index d-1 (depth 1 never needs one)."""
    rows = np.zeros(max(levels, 1), np.int64)
    for i in range(codes.shape[0]):
        for a in range(num_nodes[i]):
            d = trees.depth(codes[i, a])
            parent = trees.parent(codes[i, a])
            if d < 2 or trees.on_chain(parent):
                continue
            seen = False
            for b in range(a):  # count each parent once: at its first child
                if trees.parent(codes[i, b]) == parent:
                    seen = True
                    break
            if not seen:
                rows[d - 1] += 1
    return rows


@jit
def run_steps(ids: np.ndarray, state: RequestState, acc: Draws, policy: PolicyCall,
              costs: CostTables, engine: EngineTerms, prefill: Prefill, wake_s: float, start_s: float, stop_s: float,
              max_steps: int, kv_room: int, rand: Randoms, logs: Logs, scheduled_before: int):
    """Run up to ``max_steps`` steps of the decode batch ``ids`` from
    ``start_s``; the first step also carries ``prefill`` and costs
    ``wake_s`` more (waking from idle, CostModel.wake_cost_s). Stops after a
    step in which a request finished, or that ends at or after ``stop_s``,
    or when the KV cache has no ``kv_room`` left for another step.
    Returns (steps run, end time)."""
    b = len(ids)
    depth, ranks = policy.depth, policy.ranks
    t = start_s
    steps = 0
    reserve = b * (depth + 1)
    # The batch is the same in every step of a call: its per-request arrays
    # are made once here and refilled in place each step (a step had made
    # them afresh, a dozen allocations). What does not change within a
    # call (a request's visual tokens, those the drafter keeps, its
    # difficulty and retention) is read once. The draw still makes its
    # arrays each round: written into arrays from outside, its loop ran
    # slower (marginal's whole simulation ~5%), more than the allocations saved.
    visual, kept = np.empty(b, np.int64), np.empty(b, np.int64)
    difficulty, retention = np.empty(b), np.empty(b)
    for i in range(b):
        j = ids[i]
        visual[i], kept[i], difficulty[i], retention[i] = (state.visual[j], state.kept[j], state.difficulty[j],
                                                           state.retention[j])
    ctx, remaining, pending = np.empty(b, np.int64), np.empty(b, np.int64), np.empty(b, np.int64)
    recent = np.empty(b)
    drawn = depth > 0 and b > 0
    conf, true_ranks = np.ones((b, 1, ranks)), np.zeros((b, 1), np.int64)  # a round without drafts
    hidden = np.zeros((b, depth if drawn else 1), np.int64)  # the true ranks a policy that may not see them gets
    none_accepted = np.zeros(b, np.int64)
    level_space = np.zeros(2 * max(depth, 1), np.int64)
    while steps < max_steps:
        first = steps == 0
        pf = prefill if first else NO_PREFILL
        absorbed = state.absorbed
        for i in range(b):
            j = ids[i]
            ctx[i] = state.cache[j]
            remaining[i] = state.output[j] - state.emitted[j]
            pending[i] = ctx[i] - visual[i] - absorbed[j]  # tokens the drafter's first call this round absorbs
            recent[i] = state.recent[j]
        if drawn:
            n = b * depth
            m = normals_per_round(acc, b, depth)
            conf, true_ranks, _ = draw_round(difficulty, retention, depth, ranks, acc,
                                             rand.normals[rand.used[0]:rand.used[0] + m],
                                             rand.uniforms[rand.used[1]:rand.used[1] + 2 * n])
            rand.used[0] += m
            rand.used[1] += 2 * n
        shown = true_ranks if policy.needs_truth else hidden
        # vLLM keys its per-batch-size draft length by every request the
        # previous step scheduled (vllm/v1/core/sched/scheduler.py 0.33
        # l.1709-1713), verified one step later
        key = (scheduled_before if first else b) if engine.lagged_key else -1
        batch = rules.Batch(ctx, visual, kept, remaining, recent, conf, shown, pf.tokens,
                            pf.attn_pairs, pf.kv_tokens, pf.requests, pf.vision_tokens, pf.max_context, key)
        plan = rules.plan_batch(policy.kernel if b > 0 else rules.AR, policy.params, batch, costs)

        # Price the step exactly as planned.
        verify = 0
        pairs = 0
        uniform = pf.tokens == 0 and b > 0
        q0 = 1 + plan.num_nodes[0] if b > 0 else 0
        levels = plan.draft_steps.max() if b > 0 else 0
        over_prefill = engine.drafter_over_prefill and depth > 0 and pf.tokens > 0
        if over_prefill and levels == 0:
            levels = 1  # a prefill-only step still runs the drafter's first pass (its KV)
        if 2 * levels > len(level_space):
            level_space = np.zeros(2 * levels, np.int64)
        level_tokens = level_space[:2 * levels]  # rows of each drafter call
        level_tokens[:] = 0
        if over_prefill:
            level_tokens[0] += pf.tokens
        drafted_kept, select_requests, select_keys = 0, 0, 0
        for i in range(b):
            q = 1 + plan.num_nodes[i]
            uniform = uniform and q == q0
            verify += q
            pairs += q * ctx[i]
            for level in range(plan.draft_steps[i]):
                # The first call absorbs the tokens accepted since the
                # request last drafted (its prompt, the first time); after
                # it, a level-wise engine drafts a tree level in one call of
                # its width, a chain-first one the rank-1 chain, then the
                # tree's off-chain parents depth by depth.
                level_tokens[level] += pending[i] if level == 0 else 1 if policy.chain_drafting else plan.draft_width[i]
            if plan.draft_steps[i] > 0:
                state.absorbed[ids[i]] = ctx[i] - visual[i]
                drafted_kept += kept[i]
                if 0 < kept[i] < visual[i]:
                    select_requests += 1
                    select_keys += visual[i]
        calls = levels
        if policy.chain_drafting and levels > 1:
            extra = offchain_rows(plan.codes, plan.num_nodes, levels)
            for d in range(1, levels):
                if extra[d] > 0:
                    level_tokens[calls] = extra[d]
                    calls += 1
        level_tokens = level_tokens[:calls]
        regime, padded_tokens = graph_regime(engine, pf.tokens + verify, uniform)
        forward = Forward(padded_tokens, pf.kv_tokens + ctx.sum(), pf.attn_pairs + pairs, pf.requests + verify,
                          pf.requests + b, (pf.requests + b) * max(pf.max_context, ctx.max() if b > 0 else 0),
                          pf.tokens, pf.kv_tokens, pf.attn_pairs, pf.requests, verify > b)
        duration = engine_step_s(engine, cpu_s(costs, forward.requests), step_cost(costs, Step(
            forward, pf.vision_tokens, level_tokens, drafted_kept, select_requests, select_keys)), regime)
        if first:
            duration += wake_s
        end = t + duration

        # Accept and log.
        accepted = trees.accepted_length(plan.codes, true_ranks) if plan.codes.shape[1] > 0 else none_accepted
        finished = False
        c, r, s = logs.fill[0], logs.fill[1], logs.fill[2]
        grown = 0
        for i in range(b):
            j = ids[i]
            emit = min(accepted[i] + 1, remaining[i])
            state.cache[j] += emit
            state.emitted[j] += emit
            grown += emit
            logs.chunk_id[c] = j
            logs.chunk_tokens[c] = emit
            logs.chunk_time_s[c] = end
            c += 1
            state.drafted[j] = plan.num_nodes[i]
            if plan.num_nodes[i] > 0:
                logs.round_accepted[r] = accepted[i]
                logs.round_depth[r] = plan.depth[i]
                logs.round_drafted[r] = plan.num_nodes[i]
                r += 1
            after_round(state.recent, state.population, j, plan.num_nodes[i], accepted[i], plan.depth[i])
            if state.emitted[j] >= state.output[j]:
                finished = True
        logs.step_start_s[s] = t
        logs.step_duration_s[s] = duration
        logs.step_batch[s] = b
        logs.step_tokens[s] = grown
        for k in range(3):
            logs.step_plans[s, k] = 0
        for i in range(b):
            logs.step_plans[s, plan.kind[i]] += 1
        logs.fill[0], logs.fill[1], logs.fill[2] = c, r, s + 1
        steps += 1
        t = end
        kv_room -= grown
        if finished or t >= stop_s or kv_room < reserve or prefill.requests > 0:
            break
    return steps, t
