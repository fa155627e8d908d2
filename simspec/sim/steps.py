"""The engine step's arithmetic, compiled: draw, plan, price, accept, log.

Imports: numpy, simspec.compiled (numba), simspec.acceptance.model (the
compiled draw), simspec.policies.rules (plan_batch), simspec.costs.base
(step_cost), simspec.serving (the acceptance estimate), simspec.trees
(accepted_length), simspec.types (MAX_DEPTH). No simpy: the SimPy process
in replica.py decides *when* steps happen (admission, preemption, prefill
chunks, arrivals); :func:`run_steps` does the per-step numbers, each step
in three parts, closures inside it: ``draw`` (the round's drafts and
acceptance draws, and the policy's plan), ``price`` (its forward and
seconds) and ``accept_and_log``.

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
from simspec.costs.base import CostTables, Forward, Step, attended_context, cpu_s, step_cost
from simspec.policies import rules
from simspec.serving.estimate import updated
from simspec.serving.queues import NO_PREFILL, Prefill
from simspec import trees
from simspec.types import MAX_DEPTH


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
    """Preallocated log buffers; the ``*_logged`` [1] int arrays count what each holds."""

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
    chunks_logged: np.ndarray  # entries of chunk_*
    rounds_logged: np.ndarray  # ... of round_*
    steps_logged: np.ndarray  # ... of step_*


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


class StepScratch(NamedTuple):
    """The decode batch's per-request arrays for one call of :func:`run_steps`.

    The batch is the same in every step of a call, so these are made once
    and refilled in place each step. The draw still makes its arrays each
    round: written into arrays from outside, its loop runs slower (marginal's
    whole simulation ~5%) than the allocations it would save."""

    visual: np.ndarray  # [B] int visual tokens (fixed within a call, as are the next three)
    kept: np.ndarray  # [B] int visual tokens the drafter sees
    difficulty: np.ndarray  # [B] float top-1 acceptance logit
    retention: np.ndarray  # [B] float acceptance kept at image-grounded positions
    context: np.ndarray  # [B] int tokens in the KV cache at the step's start
    remaining: np.ndarray  # [B] int tokens left to generate
    pending: np.ndarray  # [B] int tokens the drafter's first call this round absorbs
    recent: np.ndarray  # [B] float the acceptance estimate at the step's start
    conf: np.ndarray  # [B, 1, R] float the confidences of a round without drafts
    true_ranks: np.ndarray  # [B, 1] int ... and its true ranks
    hidden: np.ndarray  # [B, D] int the true ranks a policy that may not see them gets (zeros)
    none_accepted: np.ndarray  # [B] int the accepted lengths of a step without drafts
    level_space: np.ndarray  # [2 x levels] int room for the rows of each drafter call


class Round(NamedTuple):
    """A step's round: the policy's plan and the target's true ranks it is verified against."""

    plan: rules.Plan
    true_ranks: np.ndarray  # [B, D] int (D = 1 for a round without drafts)


class Span(NamedTuple):
    """When a step runs."""

    start_s: float
    duration_s: float  # its price, plus the wake cost on a call's first step
    end_s: float


class Accepted(NamedTuple):
    """What a step's accepted tokens did."""

    tokens: int  # tokens emitted over the batch
    finished: bool  # a request emitted its last token


@jit
def step_scratch(ids: np.ndarray, state: RequestState, policy: PolicyCall) -> StepScratch:
    """The batch ``ids``'s StepScratch, with what does not change within a call read in."""
    b, depth = len(ids), policy.depth
    drawn = depth > 0 and b > 0
    visual, kept = np.empty(b, np.int64), np.empty(b, np.int64)
    difficulty, retention = np.empty(b), np.empty(b)
    for i in range(b):
        j = ids[i]
        visual[i], kept[i], difficulty[i], retention[i] = (state.visual[j], state.kept[j], state.difficulty[j],
                                                           state.retention[j])
    # A plan drafts at most MAX_DEPTH levels, the rank-1 chain's off-chain rows as many again.
    return StepScratch(visual=visual, kept=kept, difficulty=difficulty, retention=retention,
                   context=np.empty(b, np.int64), remaining=np.empty(b, np.int64), pending=np.empty(b, np.int64),
                   recent=np.empty(b), conf=np.ones((b, 1, policy.ranks)), true_ranks=np.zeros((b, 1), np.int64),
                   hidden=np.zeros((b, depth if drawn else 1), np.int64), none_accepted=np.zeros(b, np.int64),
                   level_space=np.zeros(2 * max(depth, MAX_DEPTH, 1), np.int64))


@jit
def run_steps(ids: np.ndarray, state: RequestState, acc: Draws, policy: PolicyCall,
              costs: CostTables, engine: EngineTerms, prefill: Prefill, wake_s: float, start_s: float, stop_s: float,
              max_steps: int, kv_room: int, rand: Randoms, logs: Logs, scheduled_before: int):
    """Run up to ``max_steps`` steps of the decode batch ``ids`` from
    ``start_s``; the first step also carries ``prefill`` and costs
    ``wake_s`` more (waking from idle, CostModel.wake_cost_s). Stops after a
    step in which a request finished, or that ends at or after ``stop_s``,
    or when the KV cache has no ``kv_room`` left for another step.
    Returns (steps run, end time).

    Each step is ``draw``, ``price`` and ``accept_and_log``,
    written as closures over the arrays read here once a call: numba counts
    every array of every tuple an inlined helper takes as a parameter, at
    each call (docs/development.md), and a closure's captured arrays only
    where it passes them on to a call."""
    b = len(ids)
    reserve = b * (policy.depth + 1)
    scratch = step_scratch(ids, state, policy)
    # every array the steps read, read once a call
    cache, output, emitted, absorbed, recent = state.cache, state.output, state.emitted, state.absorbed, state.recent
    drafted, population = state.drafted, state.population
    context, visual, kept, remaining = scratch.context, scratch.visual, scratch.kept, scratch.remaining
    pending, recent_now, difficulty, retention = scratch.pending, scratch.recent, scratch.difficulty, scratch.retention
    no_conf, no_ranks, hidden, none_accepted = scratch.conf, scratch.true_ranks, scratch.hidden, scratch.none_accepted
    level_space = scratch.level_space
    normals, uniforms, used = rand.normals, rand.uniforms, rand.used
    params, capture = policy.params, engine.capture
    chunk_id, chunk_tokens, chunk_time_s = logs.chunk_id, logs.chunk_tokens, logs.chunk_time_s
    round_accepted, round_depth, round_drafted = logs.round_accepted, logs.round_depth, logs.round_drafted
    step_start_s, step_duration_s, step_batch = logs.step_start_s, logs.step_duration_s, logs.step_batch
    step_plans, step_tokens = logs.step_plans, logs.step_tokens
    chunks_logged, rounds_logged, steps_logged = logs.chunks_logged, logs.rounds_logged, logs.steps_logged
    depth, ranks = policy.depth, policy.ranks
    # the keys each request's query attends to, the layers' mean: its context
    # unless the model has chunked layers (costs.base.attended_context)
    local = costs.local
    attended = context if local.chunk == 0 else np.empty(b, np.int64)

    def draw(pf: Prefill, scheduled: int) -> Round:
        """The step's round: the batch's snapshot (into the scratch), the
        drafter's confidences and the target's true ranks (read from the
        random blocks), and the policy's plan. ``scheduled``: requests the
        previous step scheduled."""
        for i in range(b):
            j = ids[i]
            context[i] = cache[j]
            remaining[i] = output[j] - emitted[j]
            pending[i] = context[i] - visual[i] - absorbed[j]
            recent_now[i] = recent[j]
            if local.chunk > 0:
                attended[i] = attended_context(local, context[i])
        conf, true_ranks = no_conf, no_ranks
        if depth > 0 and b > 0:
            n = b * depth
            m = normals_per_round(acc, b, depth)
            conf, true_ranks, _ = draw_round(difficulty, retention, depth, ranks, acc,
                                             normals[used[0]:used[0] + m], uniforms[used[1]:used[1] + 2 * n])
            used[0] += m
            used[1] += 2 * n
        shown = true_ranks if policy.needs_truth else hidden
        # vLLM keys its per-batch-size draft length by every request the
        # previous step scheduled (vllm/v1/core/sched/scheduler.py 0.33
        # l.1709-1713), verified one step later
        key = scheduled if engine.lagged_key else -1
        batch = rules.Batch(context_tokens=attended, visual_tokens=visual, kept_visual_tokens=kept,
                            remaining_tokens=remaining, recent_accepted=recent_now, conf=conf,
                            true_ranks=shown, prefill_tokens=pf.tokens, prefill_attn_pairs=pf.attn_pairs,
                            prefill_kv_tokens=pf.kv_tokens, prefill_requests=pf.requests,
                            vision_tokens=pf.vision_tokens, prefill_max_context=pf.max_context, table_key=key)
        plan = rules.plan_batch(policy.kernel if b > 0 else rules.AR, params, batch, costs)
        return Round(plan=plan, true_ranks=true_ranks)

    def drafter_rows(pf: Prefill, plan: rules.Plan) -> np.ndarray:
        """Rows of each of the step's drafter calls (a view of the scratch's level space).

        A request's first call absorbs the tokens it accepted since it last
        drafted (its prompt, the first time); after it, a level-wise engine
        drafts a tree level in one call of its width, a chain-first one the
        rank-1 chain, then the tree's off-chain parents depth by depth."""
        draft_steps, draft_width = plan.draft_steps, plan.draft_width
        levels = draft_steps.max() if b > 0 else 0
        over_prefill = engine.drafter_over_prefill and depth > 0 and pf.tokens > 0
        if over_prefill and levels == 0:
            levels = 1  # a prefill-only step still runs the drafter's first pass (its KV)
        space = level_space if 2 * levels <= len(level_space) else np.zeros(2 * levels, np.int64)
        rows = space[:2 * levels]
        rows[:] = 0
        if over_prefill:
            rows[0] += pf.tokens
        for i in range(b):
            for level in range(draft_steps[i]):
                rows[level] += pending[i] if level == 0 else 1 if policy.chain_drafting else draft_width[i]
        calls = levels
        if policy.chain_drafting and levels > 1:
            extra = offchain_rows(plan.codes, plan.num_nodes, levels)
            for d in range(1, levels):
                if extra[d] > 0:
                    rows[calls] = extra[d]
                    calls += 1
        return rows[:calls]

    def price(pf: Prefill, plan: rules.Plan) -> float:
        """Seconds of the step exactly as planned: its forward (the prefill
        chunks, then each request's 1 + drafted tokens), the drafter's calls,
        selection, under the engine's graph regime and overlap."""
        num_nodes, draft_steps = plan.num_nodes, plan.draft_steps
        verify, pairs = 0, 0
        uniform = pf.tokens == 0 and b > 0
        q0 = 1 + num_nodes[0] if b > 0 else 0
        drafted_kept, select_requests, select_keys = 0, 0, 0
        for i in range(b):
            q = 1 + num_nodes[i]
            uniform = uniform and q == q0
            verify += q
            pairs += q * attended[i]
            if draft_steps[i] > 0:
                drafted_kept += kept[i]
                if 0 < kept[i] < visual[i]:
                    select_requests += 1
                    select_keys += visual[i]
        regime, padded_tokens = graph_regime(engine, pf.tokens + verify, uniform)
        longest = max(pf.max_context, context.max() if b > 0 else 0)
        forward = Forward(tokens=padded_tokens, kv_tokens=pf.kv_tokens + attended.sum(), pairs=pf.attn_pairs + pairs,
                          logits=pf.requests + verify, requests=pf.requests + b, padded=(pf.requests + b) * longest,
                          prefill_tokens=pf.tokens, prefill_kv=pf.kv_tokens, prefill_pairs=pf.attn_pairs,
                          prefill_requests=pf.requests, verifying=verify > b)
        step = Step(forward=forward, vision_tokens=pf.vision_tokens, level_tokens=drafter_rows(pf, plan),
                    kept=drafted_kept, select_requests=select_requests, select_keys=select_keys)
        return engine_step_s(engine, cpu_s(costs, forward.requests), step_cost(costs, step), regime)

    def accept_and_log(rnd: Round, span: Span) -> Accepted:
        """Emit each request's accepted tokens + 1 (at most what it has left)
        at the step's end, note what its drafter absorbed, update the
        acceptance estimate, and log the chunks, drafted rounds and the step."""
        plan = rnd.plan
        draft_steps, num_nodes, plan_depth, kind = plan.draft_steps, plan.num_nodes, plan.depth, plan.kind
        accepted = trees.accepted_length(plan.codes, rnd.true_ranks) if plan.codes.shape[1] > 0 else none_accepted
        finished = False
        c, r, s = chunks_logged[0], rounds_logged[0], steps_logged[0]
        grown = 0
        end_s = span.end_s
        for i in range(b):
            j = ids[i]
            if draft_steps[i] > 0:  # the drafter's KV now holds the text of the cache the step started with
                absorbed[j] = context[i] - visual[i]
            emit = min(accepted[i] + 1, remaining[i])
            cache[j] += emit
            emitted[j] += emit
            grown += emit
            chunk_id[c], chunk_tokens[c], chunk_time_s[c] = j, emit, end_s
            c += 1
            drafted[j] = num_nodes[i]
            if num_nodes[i] > 0:
                round_accepted[r], round_depth[r], round_drafted[r] = accepted[i], plan_depth[i], num_nodes[i]
                r += 1
            recent[j], population[0] = updated(recent[j], population[0], num_nodes[i], accepted[i], plan_depth[i])
            finished = finished or emitted[j] >= output[j]
        step_start_s[s], step_duration_s[s], step_batch[s], step_tokens[s] = span.start_s, span.duration_s, b, grown
        for k in range(3):
            step_plans[s, k] = 0
        for i in range(b):
            step_plans[s, kind[i]] += 1
        chunks_logged[0], rounds_logged[0], steps_logged[0] = c, r, s + 1
        return Accepted(tokens=grown, finished=finished)

    t = float(start_s)  # SimPy's clock reads an int before its first timeout
    steps = 0
    while steps < max_steps:
        first = steps == 0
        pf = prefill if first else NO_PREFILL
        rnd = draw(pf, scheduled_before if first else b)
        duration = price(pf, rnd.plan)
        if first:
            duration += wake_s
        span = Span(start_s=t, duration_s=duration, end_s=t + duration)
        done = accept_and_log(rnd, span)
        steps += 1
        t = span.end_s
        kv_room -= done.tokens
        if done.finished or t >= stop_s or kv_room < reserve or prefill.requests > 0:
            break
    return steps, t
