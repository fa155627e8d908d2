"""The policies' decision rules, compiled: one code path for every caller.

Imports: numpy, numba, simspec.trees, simspec.costs.base (compiled cost
functions). ``Policy.plan(view)`` (the live engine, tests) and the
simulator's compiled step loop both call :func:`plan_batch`, so a policy
decides the same way wherever it runs. A policy is named by a small integer
(``AR`` ... ``STAGED``) and its parameters by a float64 vector, because
compiled code dispatches on plain values.

Pricing: a plan for the batch is priced by the cost model's own step
formula (costs.base.step_cost) with the draft tokens added: one target
forward over prefill chunks + 1 + draft tokens per request (its rounds
priced as verification once any request verifies a draft, as decode
otherwise), drafter steps
(one row per request at depth 1, ``width`` after), selection when the
drafter sees kept visual tokens, overhead. The first drafter call also
absorbs the tokens each request accepted since it last drafted; the
simulator prices that, plans do not: a round without drafts only defers
it to the next round that drafts (and one call absorbing several rounds'
tokens costs less than several calls), so it is not a cost of drafting
now.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import numpy as np

from simspec import trees
from simspec.compiled import jit
from simspec.costs.base import CostTables, Forward, cpu_s, draft_cost, forward_cost, select_cost, table_at
from simspec.types import MAX_DEPTH, PLAN_LINEAR, PLAN_TREE

AR, LINEAR, TREE, TRUNCATE, BATCH_TABLE, GOODPUT, MARGINAL, ORACLE, STAGED = range(9)
STAGE_WIDTH = 5  # a staged policy's parameters: (min batch, rule, p0, p1, p2) per stage, ascending


class Batch(NamedTuple):
    """A ReplicaView's arrays and counts, for compiled code (same meaning)."""

    context_tokens: np.ndarray  # [B] int64
    visual_tokens: np.ndarray  # [B] int64
    kept_visual_tokens: np.ndarray  # [B] int64
    remaining_tokens: np.ndarray  # [B] int64
    recent_accepted: np.ndarray  # [B] float64
    conf: np.ndarray  # [B, D, R] float64
    true_ranks: np.ndarray  # [B, D] int64 (zeros unless the policy may see them)
    prefill_tokens: int
    prefill_attn_pairs: int
    prefill_kv_tokens: int
    prefill_requests: int
    vision_tokens: int
    prefill_max_context: int
    table_key: int = -1  # the batch size batch_table is keyed by; -1: this decode batch's


class Plan(NamedTuple):
    codes: np.ndarray  # [B, M] int64, -1 unused
    num_nodes: np.ndarray  # [B] int64
    depth: np.ndarray  # [B] int64 depth of the deepest planned node
    draft_steps: np.ndarray  # [B] int64 drafter steps run (may exceed depth)
    draft_width: np.ndarray  # [B] int64
    kind: np.ndarray  # [B] int8


# -- pricing ----------------------------------------------------------------

class Pricing(NamedTuple):
    """A step without drafts, and what each draft token and depth adds."""

    tokens0: int  # query tokens through the target without drafts
    logits0: int  # logit rows without drafts
    kv_tokens: int  # KV tokens attention reads
    pairs0: int  # query x key pairs without drafts
    padded: int  # attention rows x the longest cached context (drafts do not change it)
    pf_tokens: int  # the prefill chunks' part of the totals
    pf_kv: int
    pf_pairs: int
    pf_requests: int
    fixed_s: float  # overhead + vision encoder
    draft_s: np.ndarray  # [MAX_DEPTH + 1] drafting d levels, selection included
    rate0: float  # tokens per second of the step without drafts


@jit
def _pricing(batch: Batch, costs: CostTables, width: int) -> Pricing:
    b = len(batch.context_tokens)
    ctx = batch.context_tokens.sum()
    tokens0, logits0 = batch.prefill_tokens + b, batch.prefill_requests + b
    kv, pairs0 = batch.prefill_kv_tokens + ctx, batch.prefill_attn_pairs + ctx
    vision = table_at(costs.vision_s, batch.vision_tokens) if batch.vision_tokens > 0 else 0.0
    fixed = cpu_s(costs, batch.prefill_requests + b) + vision
    padded = logits0 * max(batch.prefill_max_context, batch.context_tokens.max() if b > 0 else 0)
    rate0 = b / (fixed + forward_cost(costs, Forward(tokens0, kv, pairs0, logits0, logits0, padded,
                                                     batch.prefill_tokens, batch.prefill_kv_tokens,
                                                     batch.prefill_attn_pairs, batch.prefill_requests, False)))
    return Pricing(tokens0, logits0, kv, pairs0, padded, batch.prefill_tokens, batch.prefill_kv_tokens,
                   batch.prefill_attn_pairs, batch.prefill_requests, fixed, _draft_table(batch, costs, width), rate0)


@jit
def _step_s(costs: CostTables, p: Pricing, n: int, pairs: int, deepest: int) -> float:
    """Seconds of the step with ``n`` draft tokens adding ``pairs`` attention
    pairs, drafted ``deepest`` levels deep (the drafting table's depth 0
    costs nothing)."""
    forward = Forward(p.tokens0 + n, p.kv_tokens, p.pairs0 + pairs, p.logits0 + n, p.logits0, p.padded, p.pf_tokens,
                      p.pf_kv, p.pf_pairs, p.pf_requests, n > 0)
    return p.fixed_s + forward_cost(costs, forward) + p.draft_s[deepest]


@jit
def _draft_table(batch: Batch, costs: CostTables, width: int) -> np.ndarray:
    """Seconds to draft d levels for the whole batch, selection included: [MAX_DEPTH + 1]."""
    b = len(batch.context_tokens)
    kept = batch.kept_visual_tokens.sum()
    keys, selecting = 0, 0
    for i in range(b):
        if 0 < batch.kept_visual_tokens[i] < batch.visual_tokens[i]:
            keys += batch.visual_tokens[i]
            selecting += 1
    out = np.zeros(MAX_DEPTH + 1)
    first = (select_cost(costs, selecting, keys) + draft_cost(costs, b, kept) + costs.draft_round_s
             + b * costs.draft_round_request_s)
    later = draft_cost(costs, b * width, kept)
    for d in range(1, MAX_DEPTH + 1):
        out[d] = first + later * (d - 1)
    return out


# -- plan assembly ------------------------------------------------------------

@jit
def _chain(batch: Batch, k: np.ndarray, steps: np.ndarray) -> Plan:
    b = len(k)
    width = k.max() if b else 0
    codes = np.full((b, width), -1, dtype=np.int64)
    kind = np.zeros(b, dtype=np.int8)
    draft_width = np.zeros(b, dtype=np.int64)
    for i in range(b):
        code = np.int64(0)
        for d in range(k[i]):
            code = trees.child(code, 1)
            codes[i, d] = code
        if k[i] > 0:
            kind[i] = PLAN_LINEAR
        if steps[i] > 0:
            draft_width[i] = 1
    return Plan(codes, k.copy(), k.copy(), steps.copy(), draft_width, kind)


@jit
def _packed(rows: np.ndarray, codes: np.ndarray, b: int, width: int) -> Plan:
    plan_codes, num, depth, kind = trees.pack_rows(rows, codes, b)
    draft_width = np.zeros(b, dtype=np.int64)
    for i in range(b):
        if kind[i] == PLAN_TREE:
            draft_width[i] = width
        elif num[i] > 0:
            draft_width[i] = 1
    return Plan(plan_codes, num, depth, depth.copy(), draft_width, kind)


# -- the load-adaptive rule ---------------------------------------------------

@jit
def _best_prefix(batch: Batch, costs: CostTables, values: np.ndarray, codes: np.ndarray, depths: np.ndarray,
                 width: int, max_nodes: int) -> Plan:
    """Candidates of every request, best value first across the batch
    (parents before children, since a child's value never exceeds its
    parent's); each prefix of that order is a plan, and the step keeps the
    prefix with the most expected tokens per second. That is the greedy
    "add while extra tokens per extra second beat the step's tokens per
    second" rule taken to its best stopping point, so the drafter's fixed
    cost per depth does not stop it a node too early.

    Nodes worth less than (tokens per second without drafting) x (the
    cheapest extra token's cost) are skipped before sorting: with a forward
    cost convex in tokens they can never raise the step's tokens per second.
    """
    b = len(batch.context_tokens)
    p = _pricing(batch, costs, width)
    # The first draft also turns the rounds into verification: the cheaper
    # of that step and the next is the least any node can cost.
    slope = min(_step_s(costs, p, 1, 0, 0) - _step_s(costs, p, 0, 0, 0),
                _step_s(costs, p, 2, 0, 0) - _step_s(costs, p, 1, 0, 0))
    rows, chosen, value, depth = trees.ranked_candidates(values, codes, depths, batch.remaining_tokens,
                                                         p.rate0 * max(slope, 0.0), max_nodes)
    gain, pairs, deepest, best, take = float(b), 0, 0, p.rate0, 0
    for t in range(len(rows)):
        gain += value[t]
        pairs += batch.context_tokens[rows[t]]
        deepest = max(deepest, depth[t])
        rate = gain / _step_s(costs, p, t + 1, pairs, deepest)
        if rate > best:
            best, take = rate, t + 1
    return _packed(rows[:take], chosen[:take], b, width)


# -- the policies -------------------------------------------------------------

@jit
def _linear(batch: Batch, k: int) -> Plan:
    ks = np.full(len(batch.context_tokens), k, dtype=np.int64)
    return _chain(batch, ks, ks)


@jit
def _tree(batch: Batch, depth: int, topk: int, budget: int) -> Plan:
    b = len(batch.context_tokens)
    codes = trees.eagle_tree(batch.conf, depth, topk, budget)
    keep = codes.shape[1]
    rows = np.empty(b * keep, dtype=np.int64)
    for i in range(b):
        rows[i * keep:(i + 1) * keep] = i
    plan = _packed(rows, codes.ravel(), b, topk)
    steps = np.full(b, depth, dtype=np.int64)  # EAGLE-2 drafts every level of its expansion
    return Plan(plan.codes, plan.num_nodes, plan.depth, steps, plan.draft_width, plan.kind)


@jit
def _truncate(batch: Batch, k_max: int, threshold: float) -> Plan:
    b = len(batch.context_tokens)
    k = np.zeros(b, dtype=np.int64)
    steps = np.zeros(b, dtype=np.int64)
    for i in range(b):
        path = 1.0
        for d in range(k_max):
            path *= batch.conf[i, d, 0]
            if path < threshold:
                break
            k[i] += 1
        steps[i] = min(k[i] + 1, k_max)  # the drafter looked one step past the cut
    return _chain(batch, k, steps)


@jit
def _batch_table(batch: Batch, table: np.ndarray) -> Plan:
    b = len(batch.context_tokens) if batch.table_key < 0 else batch.table_key
    k = 0
    for e in range(0, len(table), 2):  # (min batch, k) pairs, ascending
        if b >= table[e]:
            k = int(table[e + 1])
    return _linear(batch, k)


@jit
def _chain_values(batch: Batch, per_depth: np.ndarray):
    """Rank-1 chain candidates: codes [B, D], values [B, D], depths [B, D]."""
    b, depth = per_depth.shape
    codes = np.empty((b, depth), dtype=np.int64)
    depths = np.empty((b, depth), dtype=np.int64)
    for i in range(b):
        code = np.int64(0)
        for d in range(depth):
            code = trees.child(code, 1)
            codes[i, d] = code
            depths[i, d] = d + 1
    return codes, per_depth, depths


@jit
def _goodput(batch: Batch, costs: CostTables, k_max: int) -> Plan:
    # SmartSpec: predicted per-token acceptance from history. accepted /
    # (accepted + 1) is the geometric estimate when a round ends on its
    # first rejection; the depth-d token is accepted with alpha^d.
    b = len(batch.context_tokens)
    values = np.empty((b, k_max))
    for i in range(b):
        alpha = batch.recent_accepted[i] / (batch.recent_accepted[i] + 1.0)
        for d in range(k_max):
            values[i, d] = alpha ** (d + 1)
    codes, values, depths = _chain_values(batch, values)
    return _best_prefix(batch, costs, values, codes, depths, 1, b * k_max)


@jit
def _marginal_rule(batch: Batch, costs: CostTables, conf: np.ndarray, depth: int, topk: int, max_nodes: int):
    """The rule of :func:`_best_prefix` over every node with ranks <= topk
    and depth <= depth valued by ``conf`` [B, D, R], enumerated lazily best
    first: a heap over the whole batch holds each request's frontier;
    popping a node pushes its first child and its next sibling (confidence
    falls with rank and depth, so pops come in non-increasing value). It
    stops when no later node can raise the step's tokens per second: every
    later node is worth at most the one just popped and costs at least the
    current per-token slope. Returns the chosen (rows, codes) in pop order."""
    b = len(batch.context_tokens)
    p = _pricing(batch, costs, topk)
    heap = [(0.0, 0, np.int64(0), 0, 0, 0.0)]  # (-value, request, code, depth, rank, parent value)
    heap.pop()
    for i in range(b):
        if batch.remaining_tokens[i] > 1 and conf[i, 0, 0] > 0:
            heap.append((-conf[i, 0, 0], i, np.int64(1), 1, 1, 1.0))
    heapq.heapify(heap)
    rows = np.empty(max_nodes, dtype=np.int64)
    chosen = np.empty(max_nodes, dtype=np.int64)
    gain, pairs, deepest, best, take, n = float(b), 0, 0, p.rate0, 0, 0
    while heap and n < max_nodes:
        neg, i, code, d, r, parent = heapq.heappop(heap)
        value = -neg
        # Later nodes are worth at most this one and cost at least the
        # forward's slope here; best is already the highest rate seen.
        slope = _step_s(costs, p, n + 2, pairs, 0) - _step_s(costs, p, n + 1, pairs, 0)
        if value <= 0 or (slope > 0 and value / slope < best):
            break
        rows[n], chosen[n] = i, code
        n += 1
        gain += value
        pairs += batch.context_tokens[i]
        deepest = max(deepest, d)
        rate = gain / _step_s(costs, p, n, pairs, deepest)
        if rate > best:
            best, take = rate, n
        if d < depth and d + 1 < batch.remaining_tokens[i]:  # first child
            heapq.heappush(heap, (-value * conf[i, d, 0], i, trees.child(code, 1), d + 1, 1, value))
        if r < topk:  # next sibling
            sibling = parent * conf[i, d - 1, r]
            heapq.heappush(heap, (-sibling, i, trees.child(trees.parent(code), r + 1), d, r + 1, parent))
    return rows[:take], chosen[:take]


@jit
def _marginal(batch: Batch, costs: CostTables, depth: int, topk: int, max_nodes: int) -> Plan:
    """The load-adaptive rule in two phases, as an engine runs it: the
    drafter's confidences exist only for the levels it has drafted.

    1. *How deep to draft*, before drafting: the rule on each request's
       expected acceptance (its history, as goodput's alpha, rank 1 only)
       gives the depth it would verify; the drafter runs that many levels.
    2. *What to verify*, after drafting: the rule on the drafter's real
       confidences, cut to the drafted levels, picks the nodes (a tree where
       lower-ranked candidates pay).
    """
    b = len(batch.context_tokens)
    prior = np.zeros((b, depth, topk))
    for i in range(b):
        alpha = batch.recent_accepted[i] / (batch.recent_accepted[i] + 1.0)
        for d in range(depth):
            prior[i, d, 0] = alpha
    rows, chosen = _marginal_rule(batch, costs, prior, depth, topk, max_nodes)
    levels = np.zeros(b, dtype=np.int64)
    for t in range(len(rows)):
        levels[rows[t]] = max(levels[rows[t]], trees.depth(chosen[t]))
    seen = np.zeros((b, depth, topk))
    for i in range(b):
        for d in range(levels[i]):
            for r in range(topk):
                seen[i, d, r] = batch.conf[i, d, r]
    rows, chosen = _marginal_rule(batch, costs, seen, depth, topk, max_nodes)
    plan = _packed(rows, chosen, b, topk)
    for i in range(b):
        plan.draft_steps[i] = levels[i]
        if levels[i] > 0 and plan.draft_width[i] == 0:
            plan.draft_width[i] = 1
    return plan


@jit
def _oracle(batch: Batch, costs: CostTables, depth: int) -> Plan:
    # Draft exactly the target's own path, as deep as it pays.
    b = len(batch.context_tokens)
    reached = np.zeros((b, depth))
    codes = np.full((b, depth), -1, dtype=np.int64)
    depths = np.empty((b, depth), dtype=np.int64)
    for i in range(b):
        code = np.int64(0)
        for d in range(depth):
            depths[i, d] = d + 1
            r = batch.true_ranks[i, d]
            if r == 0:
                break
            code = trees.child(code, r)
            codes[i, d] = code
            reached[i, d] = 1.0
    return _best_prefix(batch, costs, reached, codes, depths, 1, b * depth)


@jit
def _single(policy: int, params: np.ndarray, batch: Batch, costs: CostTables) -> Plan:
    if policy == LINEAR:
        return _linear(batch, int(params[0]))
    if policy == TREE:
        return _tree(batch, int(params[0]), int(params[1]), int(params[2]))
    if policy == TRUNCATE:
        return _truncate(batch, int(params[0]), params[1])
    if policy == BATCH_TABLE:
        return _batch_table(batch, params)
    if policy == GOODPUT:
        return _goodput(batch, costs, int(params[0]))
    if policy == MARGINAL:
        return _marginal(batch, costs, int(params[0]), int(params[1]), int(params[2]))
    if policy == ORACLE:
        return _oracle(batch, costs, int(params[0]))
    return _linear(batch, 0)  # AR: no drafts


@jit
def _staged(batch: Batch, costs: CostTables, params: np.ndarray) -> Plan:
    """The stage whose minimum batch size the decode batch reaches decides."""
    b = len(batch.context_tokens)
    at = 0
    for e in range(0, len(params), STAGE_WIDTH):
        if b >= params[e]:
            at = e
    return _single(int(params[at + 1]), params[at + 2:at + STAGE_WIDTH], batch, costs)


@jit
def plan_batch(policy: int, params: np.ndarray, batch: Batch, costs: CostTables) -> Plan:
    """Plan every decode request of a step with the policy named by
    ``policy`` (AR ... STAGED) and its parameter vector."""
    if policy == STAGED:
        return _staged(batch, costs, params)
    return _single(policy, params, batch, costs)
