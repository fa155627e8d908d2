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

from typing import NamedTuple

import numpy as np

from simspec import trees
from simspec.compiled import jit
from simspec.costs.base import (BLEND_P, PREFILL, VERIFY, Attention, CostTables, Forward, attention_kind,
                                attention_parts, call_parts, cpu_s, draft_cost, forward_cost, select_cost, table_at)
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
    return _plan_of(plan_codes, num, depth, kind, width)


@jit
def _plan_of(plan_codes: np.ndarray, num: np.ndarray, depth: np.ndarray, kind: np.ndarray, width: int) -> Plan:
    """The plan of packed rows (trees.pack_rows): a tree drafts ``width`` candidates a level, a chain one."""
    b = len(num)
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
    codes, num, deepest, kind = trees.pack_full_rows(trees.eagle_tree(batch.conf, depth, topk, budget))
    plan = _plan_of(codes, num, deepest, kind, topk)
    plan.draft_steps[:] = depth  # EAGLE-2 drafts every level of its expansion
    return plan


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


class Verifying(NamedTuple):
    """The parts of costs.base.forward_cost that a verifying step's draft
    tokens and their pairs leave unchanged (the prefill chunks' attention,
    the decode rounds' memory time, the padded cache), computed once a step
    by :func:`_verifying`; :func:`_verified_s` adds the rest. Numbers only
    (the verify kind's attention row among them): the best-first loop
    passes it to every pricing call, and numba would count a reference for
    each array in it at each call."""

    memory_4: float  # (prefill + decode memory seconds) ** BLEND_P
    compute0: float  # the prefill chunks' compute seconds
    linear0: float  # the prefill chunks' linear seconds
    padded_s: float  # padded slots x their cost
    pairs0: int  # the decode rounds' attention pairs without drafts
    requests: int  # decode requests (B)
    tokens0: int  # Pricing.tokens0
    logits0: int  # Pricing.logits0
    fixed_s: float  # Pricing.fixed_s
    verify: Attention  # costs.attn's VERIFY row


@jit
def _verifying(costs: CostTables, p: Pricing) -> Verifying:
    b = p.logits0 - p.pf_requests
    m1, c1, l1 = attention_parts(costs.attn, PREFILL, p.pf_kv, p.pf_pairs, p.pf_requests, p.pf_tokens)
    m2, _, _ = attention_parts(costs.attn, VERIFY, p.kv_tokens - p.pf_kv, p.pairs0 - p.pf_pairs, b, b)
    return Verifying((m1 + m2) ** BLEND_P, c1, l1, p.padded * costs.kv_s_per_padded, p.pairs0 - p.pf_pairs, b,
                     p.tokens0, p.logits0, p.fixed_s, attention_kind(costs.attn, VERIFY))


class Memo(NamedTuple):
    """:func:`_verified_s`'s last (compute, blend): the blend of memory and
    compute time (a power, most of the pricing) is a function of the
    compute time alone there, and the compute time changes with the pairs
    (and a wave count), not with each draft token; the best-first loop
    prices each pair count three times. NaN at first: never equal."""

    compute_s: float
    blend_s: float


@jit
def _verified_s(v: Verifying, layers_s: np.ndarray, head_s: np.ndarray, draft_s: np.ndarray, memo: Memo, n: int,
                pairs: int, deepest: int) -> tuple[float, Memo]:
    """``_step_s(costs, p, n, pairs, deepest)`` for ``n >= 1`` draft tokens,
    the same float, and the memo for the next call: forward_cost's
    operations in its order, those that do not depend on ``n`` and
    ``pairs`` read from ``v``; ``layers_s``, ``head_s`` are the cost
    tables', ``draft_s`` the Pricing's drafting table.

    The three arrays are read first, before any branch: numba counts a
    reference for each array argument on entry and drops the pair only
    when its release falls in the same block (in a hot loop, a pair of
    atomic calls per array per call otherwise)."""
    layers = table_at(layers_s, v.tokens0 + n)
    head = table_at(head_s, v.logits0 + n)
    drafting = draft_s[deepest]
    _, compute2, linear2 = call_parts(v.verify, 0, v.pairs0 + pairs, v.requests, v.requests + n)
    compute = v.compute0 + compute2
    if compute != memo.compute_s:
        memo = Memo(compute, (v.memory_4 + compute ** BLEND_P) ** (1.0 / BLEND_P))
    attention = memo.blend_s + v.linear0 + linear2 + v.padded_s
    forward = layers + head + attention
    return v.fixed_s + forward + drafting, memo


@jit
def _verify_s(costs: CostTables, p: Pricing, v: Verifying, memo: np.ndarray, n: int, pairs: int,
              deepest: int) -> float:
    """:func:`_verified_s` with its memo kept in ``memo`` [2], for callers
    outside the best-first loop (the planner's tests compare it with
    :func:`_step_s`)."""
    seconds, last = _verified_s(v, costs.layers_s, costs.head_s, p.draft_s, Memo(memo[0], memo[1]), n, pairs,
                                deepest)
    memo[0], memo[1] = last.compute_s, last.blend_s
    return seconds


class Frontier(NamedTuple):
    """The best-first expansion's candidate nodes: a binary heap in arrays,
    ordered as the tuples (-value, request, code) (highest value first, ties
    to the lower request, then the lower code; a node's (request, code) is
    unique, so the order is total and any correct heap pops the same
    sequence). Capacity: the batch plus max_nodes (each pop adds at most one)."""

    value: np.ndarray  # [C] float64 the node's value (expected tokens)
    request: np.ndarray  # [C] int64 its row in the batch
    code: np.ndarray  # [C] int64 its rank-path code
    parent: np.ndarray  # [C] float64 its parent's value (a sibling's is that x its confidence)


@jit
def _before(f: Frontier, a: int, value: float, request: int, code: int) -> bool:
    """Whether heap entry ``a`` pops before the node (value, request, code)."""
    if f.value[a] != value:
        return f.value[a] > value
    if f.request[a] != request:
        return f.request[a] < request
    return f.code[a] < code


@jit
def _move(f: Frontier, to: int, at: int) -> None:
    f.value[to], f.request[to], f.code[to], f.parent[to] = f.value[at], f.request[at], f.code[at], f.parent[at]


@jit
def _put(f: Frontier, at: int, value: float, request: int, code: int, parent: float) -> None:
    f.value[at], f.request[at], f.code[at], f.parent[at] = value, request, code, parent


@jit
def _push(f: Frontier, size: int, value: float, request: int, code: int, parent: float) -> int:
    """Add a node; returns the new size."""
    k = size
    while k > 0:
        up = (k - 1) >> 1
        if _before(f, up, value, request, code):
            break
        _move(f, k, up)
        k = up
    _put(f, k, value, request, code, parent)
    return size + 1


@jit
def _sift_down(f: Frontier, size: int, value: float, request: int, code: int, parent: float) -> None:
    """Place a node at the root's hole and sift it down into heap order."""
    k = 0
    while True:
        c = 2 * k + 1
        if c >= size:
            break
        if c + 1 < size and _before(f, c + 1, f.value[c], f.request[c], f.code[c]):
            c += 1
        if not _before(f, c, value, request, code):
            break
        _move(f, k, c)
        k = c
    _put(f, k, value, request, code, parent)


@jit
def _pop(f: Frontier, size: int) -> int:
    """Drop the root; returns the new size."""
    size -= 1
    if size > 0:
        _sift_down(f, size, f.value[size], f.request[size], f.code[size], f.parent[size])
    return size


class Confidence(NamedTuple):
    """What a node's confidences are in one of marginal's two phases:
    the history prior (every depth's rank 1 is accepted with ``alpha``, the
    lower ranks never) or the drafter's ``conf`` cut to the ``levels`` each
    request drafted (nothing deeper)."""

    conf: np.ndarray  # [B, D, R] float64 the drafter's confidences
    levels: np.ndarray  # [B] int64 levels drafted (phase 2)
    alpha: np.ndarray  # [B] float64 acceptance from history (phase 1)
    prior: bool  # phase 1


@jit
def _confidence(c: Confidence, i: int, d: int, r: int) -> float:
    """Confidence of request ``i``'s rank-``r + 1`` candidate at depth ``d + 1``
    (``d`` below the rule's depth, ``r`` below its topk: ``c.conf`` has
    both, as :func:`_marginal` checks).

    Every array is read before the branch: numba counts a reference for
    each array of ``c`` on entry and, with the releases spread over the
    branches, kept the atomic pairs (6 a pop of the best-first loop)."""
    drafted, alpha, seen = c.levels[i], c.alpha[i], c.conf[i, d, r]
    if c.prior:
        return alpha if r == 0 else 0.0
    return seen if d < drafted else 0.0


class Expansion(NamedTuple):
    """The marginal rule's bounds and its buffers (reused by both phases)."""

    depth: int
    topk: int
    max_nodes: int
    frontier: Frontier
    rows: np.ndarray  # [max_nodes] int64 the popped nodes' requests, in pop order
    chosen: np.ndarray  # [max_nodes] int64 their codes
    depths: np.ndarray  # [max_nodes] int64 their depths


@jit
def _expansion(b: int, depth: int, topk: int, max_nodes: int) -> Expansion:
    c = b + max_nodes + 1
    frontier = Frontier(np.empty(c), np.empty(c, dtype=np.int64), np.empty(c, dtype=np.int64), np.empty(c))
    return Expansion(depth, topk, max_nodes, frontier, np.empty(max_nodes, dtype=np.int64),
                     np.empty(max_nodes, dtype=np.int64), np.empty(max_nodes, dtype=np.int64))


@jit
def _marginal_rule(batch: Batch, costs: CostTables, p: Pricing, v: Verifying, c: Confidence, e: Expansion) -> int:
    """The rule of :func:`_best_prefix` over every node with ranks <=
    topk and depth <= depth valued by the confidences ``c``, enumerated
    lazily best first: a heap over the whole batch holds each request's
    frontier; popping a node adds its first child and its next sibling
    (confidence falls with rank and depth, so pops come in non-increasing
    value). It stops when no later node can raise the step's tokens per
    second: every later node is worth at most the one just popped and
    costs at least the current per-token slope. Returns how many of the
    popped nodes (e.rows, e.chosen, e.depths, in pop order) the plan keeps.

    A node worth 0 (or less) would end the expansion when popped, and a
    heap pops it after every positive one, so it is never added."""
    b = len(batch.context_tokens)
    # Every array the loop reads is bound here, once: numba counts a
    # reference at each read of a tuple's array field and at each array
    # passed to an inlined call, atomic operations that were most of a run.
    f = e.frontier
    value_of, request_of, code_of, parent_of = f.value, f.request, f.code, f.parent
    rows, chosen, depths = e.rows, e.chosen, e.depths
    context, remaining = batch.context_tokens, batch.remaining_tokens
    layers_s, head_s, draft_s = costs.layers_s, costs.head_s, p.draft_s
    max_depth, topk, max_nodes = e.depth, e.topk, e.max_nodes
    memo = Memo(np.nan, np.nan)
    size = 0
    for i in range(b):
        first = _confidence(c, i, 0, 0)
        if remaining[i] > 1 and first > 0:
            size = _push(f, size, first, i, np.int64(1), 1.0)
    gain, pairs, deepest, best, take, n = float(b), 0, 0, p.rate0, 0, 0
    while size > 0 and n < max_nodes:
        value, i, code, parent = value_of[0], request_of[0], code_of[0], parent_of[0]
        d = trees.depth(code)
        # Later nodes are worth at most this one and cost at least the
        # forward's slope here; best is already the highest rate seen.
        after, memo = _verified_s(v, layers_s, head_s, draft_s, memo, n + 2, pairs, 0)
        here, memo = _verified_s(v, layers_s, head_s, draft_s, memo, n + 1, pairs, 0)
        slope = after - here
        if slope > 0 and value / slope < best:
            break
        rows[n], chosen[n], depths[n] = i, code, d
        n += 1
        gain += value
        pairs += context[i]
        deepest = max(deepest, d)
        step_s, memo = _verified_s(v, layers_s, head_s, draft_s, memo, n, pairs, deepest)
        rate = gain / step_s
        if rate > best:
            best, take = rate, n
        below = value * _confidence(c, i, d, 0) if d < max_depth and d + 1 < remaining[i] else 0.0
        r = trees.rank(code)
        beside = parent * _confidence(c, i, d - 1, r) if r < topk else 0.0
        if below > 0:  # the first child takes the popped node's place
            _sift_down(f, size, below, i, trees.child_at(code, d, 1), value)
            if beside > 0:
                size = _push(f, size, beside, i, trees.next_sibling(code, d), parent)
        elif beside > 0:
            _sift_down(f, size, beside, i, trees.next_sibling(code, d), parent)
        else:
            size = _pop(f, size)
    return take


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
    if batch.conf.shape[1] < depth or batch.conf.shape[2] < topk:  # _confidence reads within these
        raise ValueError("marginal: Batch.conf must be [B, D >= depth, R >= topk]")
    p = _pricing(batch, costs, topk)
    v = _verifying(costs, p)
    e = _expansion(b, depth, topk, max_nodes)
    alpha = np.empty(b)
    for i in range(b):
        alpha[i] = batch.recent_accepted[i] / (batch.recent_accepted[i] + 1.0)
    levels = np.zeros(b, dtype=np.int64)
    take = _marginal_rule(batch, costs, p, v, Confidence(batch.conf, levels, alpha, True), e)
    for t in range(take):
        levels[e.rows[t]] = max(levels[e.rows[t]], e.depths[t])
    take = _marginal_rule(batch, costs, p, v, Confidence(batch.conf, levels, alpha, False), e)
    plan = _packed(e.rows[:take], e.chosen[:take], b, topk)
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
