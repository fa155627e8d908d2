"""How the planners price a step: the records they read (:class:`Batch`,
:class:`Plan`), a step's seconds for a candidate plan, and the assembly of
plans from chosen nodes.

Imports: numpy, numba (simspec.compiled), simspec.trees, simspec.costs.base
(the compiled cost functions), simspec.types. Every price here is the cost
model's own step formula (costs.base.step_cost), the formula the simulator
charges, with one approximation: a request's first drafter call is priced
as one row, where the simulator's absorbs every token the request accepted
since it last drafted (a round without drafts only defers those rows to the
next round that drafts, so they are not a cost of drafting now).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simspec import trees
from simspec.compiled import jit
from simspec.costs.base import (BLEND_P, PREFILL, VERIFY, Attention, CostTables, Forward, attention_kind,
                                attention_parts, blend_root, call_parts, cpu_s, draft_cost, forward_cost, select_cost,
                                table_at)
from simspec.types import MAX_DEPTH, PLAN_LINEAR, PLAN_TREE

class Batch(NamedTuple):
    """A ReplicaView's arrays and counts, for compiled code (same meaning)."""

    # [B] int64 keys a request's next query attends to: its KV cache's tokens, or with chunked
    # layers the layers' mean (costs.base.attended_context)
    context_tokens: np.ndarray
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
    compute time (a fourth root, costs.base.blend_root) is a function of the
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
        memo = Memo(compute, blend_root(v.memory_4 + compute ** BLEND_P))
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

