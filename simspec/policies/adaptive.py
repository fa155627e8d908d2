"""The load-adaptive rules, compiled: marginal here, and the drafting
helpers goodput and truncate share with it (simspec.policies.chains).

Imports: numpy, numba (simspec.compiled), simspec.trees,
simspec.costs.base, simspec.policies.pricing, simspec.policies.frontier.
DESIGN.md "Policies".

Each rule maximises one thing: the step's expected tokens per second,
(B + expected accepted draft tokens) / step seconds, over the plans it may
choose, each plan priced whole by the step formula the simulator charges
(simspec.policies.pricing). The step's rate is the objective because a
replica under load is a queue whose service rate is that rate: the more
tokens each second of GPU time yields, the sooner every request in the
batch finishes and the sooner a waiting one is admitted; under light load
the same rate is each request's own speed.

A step's costs come in lumps, not per token: drafting at all (the round's
fixed and per-request terms, the first drafter call, selection), each
level of draft depth (a drafter call, paid once for the whole batch), and
the target's linear layers, whose measured cost steps up at each GEMM tile
(every 64 tokens on an H100). A rule that adds one node at a time and
stops when the next node does not pay never crosses a lump that several
nodes together would amortise. So the rules choose among bundles:

- the batch's draft depth is decided batch-wide: for each depth D the rule
  prices the best plan that drafts at most D levels and keeps the best D;
- within a depth, every prefix of the candidates in value order is priced
  whole (not its last node's increment), so a prefix that fills a tile or
  pays for a level is found;
- the chains a rule chooses among (``linear:k=1..D`` for every request,
  under the rule's own valuation) are among the plans it prices, so it
  never plans worse than them by its own numbers.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simspec import trees
from simspec.compiled import jit
from simspec.costs.base import CostTables, select_s, table_at
from simspec.policies.frontier import Frontier, pop, push, sift_down
from simspec.policies.pricing import (Batch, Memo, Plan, Pricing, Verifying, _chain, _packed, _pricing,
                                      _verified_s, _verifying)
from simspec.serving.estimate import RECENT_WEIGHT
from simspec.types import MAX_DEPTH

CHORD_TOKENS = 64
"""Tokens over which marginal's tree expansion measures the forward's
slope when it asks whether any later node can still pay: a profiled
linear layer is flat within a GEMM tile and steps at its edge (64 tokens
on an H100), so a one-token slope is ~0 inside a tile and a jump at its
edge; the slope over a tile is what a bundle of nodes pays per token."""


# -- drafting, priced as requests draft deeper ----------------------------------

# The helpers below run in the rules' innermost loops. They take numbers
# (the records :class:`Terms`, :class:`Rater`, Verifying) and only the
# arrays they read, each read before the first branch: numba counts a
# reference for every array a call receives, and keeps the pair of atomic
# calls unless the release falls in the entry block (simspec.compiled.jit);
# CostTables holds five arrays and Batch eight, twenty atomic calls a call
# for a helper that takes both.

class Drafted(NamedTuple):
    """Who drafts how deep in a candidate plan, as running totals (one
    step's): each drafter call's rows, and what the calls share."""

    rows: np.ndarray  # [MAX_DEPTH] int64 rows of the drafter call at each level
    totals: np.ndarray  # [6] float64: sum of the calls' table costs, rows, levels, kept tokens, selecting requests, keys


T_TABLE, T_ROWS, T_LEVELS, T_KEPT, T_SELECTING, T_KEYS = range(6)


class Terms(NamedTuple):
    """CostTables' drafting and selection numbers (same names less the
    ``draft_`` / ``select_`` prefix), read once a plan."""

    round_s: float
    round_request_s: float
    cross_call: float
    cross_row: float
    s_per_kept: float
    launch_s: float
    s_per_key: float
    s_per_key_sq: float


class Rater(NamedTuple):
    """What :func:`_plan_rate` prices a plan with besides its arrays: numbers only."""

    v: Verifying
    terms: Terms
    decode_s: float  # the step without drafts (:func:`_decode_s`)


@jit
def _terms(costs: CostTables) -> Terms:
    return Terms(costs.draft_round_s, costs.draft_round_request_s, costs.draft_cross_call, costs.draft_cross_row,
                 costs.draft_s_per_kept, costs.select_launch_s, costs.select_s_per_key, costs.select_s_per_key_sq)


@jit
def _rater(costs: CostTables, p: Pricing, v: Verifying) -> Rater:
    return Rater(v, _terms(costs), _decode_s(p))


@jit
def _drafted() -> Drafted:
    return Drafted(np.zeros(MAX_DEPTH + 1, np.int64), np.zeros(6))


@jit
def _add_rows(draft_s: np.ndarray, d: Drafted, level: int, rows: int) -> None:
    """``rows`` more rows in the drafter call of ``level`` (0-based);
    ``draft_s`` is the cost tables' drafter table. Written without a
    branch, so numba drops the reference counts on the three arrays."""
    before = d.rows[level]
    added = table_at(draft_s, before + rows) - table_at(draft_s, before) * (before > 0)
    d.totals[T_TABLE] += added
    d.rows[level] = before + rows
    d.totals[T_ROWS] += rows
    d.totals[T_LEVELS] = max(d.totals[T_LEVELS], level + 1.0)


@jit
def _start(totals: np.ndarray, kept: int, visual: int) -> None:
    """A request with ``kept`` of its ``visual`` tokens drafts: they join
    every call of the drafting whose ``totals`` these are, and it selects
    them. Without a branch, as :func:`_add_rows`."""
    selects = (kept > 0) & (kept < visual)
    totals[T_KEPT] += kept
    totals[T_SELECTING] += selects
    totals[T_KEYS] += visual * selects


@jit
def _drafting_s(t: Terms, totals: np.ndarray, b: int) -> float:
    """Seconds of the drafting whose ``totals`` these are: costs.base.step_cost's
    round terms, each call's draft_cost and selection, for a batch of ``b``
    decode requests."""
    levels, table, rows, kept = totals[T_LEVELS], totals[T_TABLE], totals[T_ROWS], totals[T_KEPT]
    selecting, keys = int(totals[T_SELECTING]), int(totals[T_KEYS])
    if levels == 0:
        return 0.0
    cross = levels * t.cross_call + rows * t.cross_row if kept > 0 else 0.0
    return (t.round_s + b * t.round_request_s + table + cross + levels * kept * t.s_per_kept
            + select_s(t.launch_s, t.s_per_key, t.s_per_key_sq, selecting, keys))


@jit
def _drafted_chains(batch: Batch, costs: CostTables, levels: np.ndarray) -> Drafted:
    """The drafting of every request's rank-1 chain ``levels[i]`` levels deep."""
    drafted = _drafted()
    table, kept, visual = costs.draft_s, batch.kept_visual_tokens, batch.visual_tokens
    for i in range(len(levels)):
        if levels[i] > 0:
            _start(drafted.totals, kept[i], visual[i])
            for level in range(levels[i]):
                _add_rows(table, drafted, level, 1)
    return drafted


@jit
def _decode_s(p: Pricing) -> float:
    """The step without drafts (AR for every request)."""
    b = p.logits0 - p.pf_requests
    return b / p.rate0 if b > 0 else 0.0


@jit
def _history_alpha(batch: Batch) -> np.ndarray:
    """Each request's per-token acceptance from its history, [B]: the
    geometric accepted / (accepted + 1) of its moving average of accepted
    draft tokens per drafted round, that average first shrunk toward the
    batch's (empirical Bayes): a request's average of a few rounds is
    noisy (a round's count is geometric, variance m (1 + m) for mean m;
    a moving average of weight w keeps w / (2 - w) of it), and alpha^d of
    a noisy alpha overestimates a deep token, most for the requests whose
    estimate is high by chance, which are the ones a rule drafts deepest.
    The shrink weight of a request is its noise over its noise plus the
    spread of the batch's averages beyond noise."""
    b = len(batch.context_tokens)
    recent = batch.recent_accepted
    alpha = np.empty(b)
    if b == 0:
        return alpha
    mean = recent.mean()
    spread = 0.0
    noise = np.empty(b)
    keep = RECENT_WEIGHT / (2.0 - RECENT_WEIGHT)
    for i in range(b):
        spread += (recent[i] - mean) ** 2 / max(b - 1, 1)
        noise[i] = keep * recent[i] * (1.0 + recent[i])
    between = max(spread - noise.mean(), 0.0) if b > 1 else 0.0
    for i in range(b):
        shrink = noise[i] / (noise[i] + between) if noise[i] + between > 0 else 0.0
        r = (1.0 - shrink) * recent[i] + shrink * mean
        alpha[i] = r / (r + 1.0)
    return alpha


@jit
def _plan_rate(layers_s: np.ndarray, head_s: np.ndarray, zero: np.ndarray, r: Rater, totals: np.ndarray, b: int,
               gain: float, n: int, pairs: int) -> float:
    """Tokens per second of a step gaining ``gain`` tokens from ``n``
    verified drafts and drafting what ``totals`` (a Drafted's) holds;
    ``layers_s``, ``head_s`` are the cost tables', ``zero`` the Pricing's
    drafting table (its depth 0: the forward alone)."""
    verified, _ = _verified_s(r.v, layers_s, head_s, zero, Memo(np.nan, np.nan), n, pairs, 0)
    drafting = _drafting_s(r.terms, totals, b)
    # the select as arithmetic (no branch: numba then drops the four arrays' counts on entry); both are finite
    forward = verified * (n > 0) + r.decode_s * (n <= 0)
    return gain / (forward + drafting)


class Drafting(NamedTuple):
    """How deep each request drafts this round, decided level by level
    (:func:`_draft_levels`), and what its chain is worth."""

    levels: np.ndarray  # [B] int64 levels drafted
    cut: np.ndarray  # [B] int64 drafted levels whose path confidence stays at or above the threshold
    worth: np.ndarray  # [B, depth + 1] float64 expected accepted tokens of the first d drafted levels (confidences)


@jit
def _draft_levels(batch: Batch, costs: CostTables, p: Pricing, v: Verifying, depth: int,
                  threshold: float) -> Drafting:
    """Draft as an engine drafts, a level at a time, the confidences of a
    level known once it is drafted. Before each level the rule prices
    stopping (verify what is drafted) against drafting on to each depth D
    up to ``depth`` (the requests still going value their undrafted tokens
    by their history: the drafted path's confidence times alpha^j, alpha
    as goodput's), each plan priced whole; it drafts the next level when
    some D beats stopping. Who goes on: with a ``threshold`` (truncate),
    every request whose path confidence has not fallen under it; without
    (marginal, threshold 0), every request whose next token is worth its
    cost at the step's current rate (the forward's slope over the batch's
    tokens, its drafter rows). A level whose confidences are not known yet
    (0: the live engine has not drafted it) ends the loop there, asking
    for it; the engine drafts it and plans again, and the same decisions
    are replayed up to it."""
    b = len(batch.context_tokens)
    remaining, conf = batch.remaining_tokens, batch.conf  # read once: a read in the loops costs a reference count
    levels = np.zeros(b, np.int64)
    cut = np.zeros(b, np.int64)
    worth = np.zeros((b, depth + 1))
    path = np.ones(b)
    alive = np.zeros(b, np.bool_)
    alpha = _history_alpha(batch)
    for i in range(b):
        alive[i] = remaining[i] > 1
    now, trial = _drafted(), _drafted()
    now_totals, now_rows, trial_totals, trial_rows = now.totals, now.rows, trial.totals, trial.rows
    future = np.empty(b)
    r = _rater(costs, p, v)
    layers_s, head_s, zero, table = costs.layers_s, costs.head_s, p.draft_s, costs.draft_s
    kept, visual, context = batch.kept_visual_tokens, batch.visual_tokens, batch.context_tokens
    going = np.zeros(b, np.bool_)
    everyone = np.zeros(b, np.bool_)
    gain, n, pairs = float(b), 0, 0  # the stop plan: every drafted level verified
    for d in range(depth):
        stop = _plan_rate(layers_s, head_s, zero, r, now_totals, b, gain, n, pairs)
        slope = 0.0
        if threshold <= 0.0 and b > 0:
            ctx = context.sum() // b
            wide = _plan_rate(layers_s, head_s, zero, r, now_totals, b, 1.0, n + b, pairs + b * ctx)  # 1 / seconds
            base = _plan_rate(layers_s, head_s, zero, r, now_totals, b, 1.0, max(n, 1),
                              pairs + (ctx if n == 0 else 0))
            slope = (1.0 / wide - 1.0 / base) / b
        g, eligible = 0, 0
        for i in range(b):
            ok = alive[i] and levels[i] == d and d + 1 < remaining[i]
            everyone[i] = ok
            eligible += ok
            if ok and threshold <= 0.0:
                ok = path[i] * alpha[i] > stop * slope
            going[i] = ok
            g += ok
        if eligible == 0:
            break
        # The requests whose next token pays at the current rate, and (where
        # that is fewer) every request that can draft on: on a tiled cost a
        # bundle of the batch's chains can fill a tile that one by one do not.
        # Only whether a bundle beats stopping, and which beats the other,
        # matter: the first bundle's best is needed whole only when the
        # second follows, and the second's only as far as beating the first.
        best, best_set = stop, 0
        for which in range(2):
            if (which == 0 and g == 0) or (which == 1 and g == eligible):
                continue
            enough = np.inf if which == 0 and g < eligible else best
            # The best rate of drafting the bundle on from level d to some depth in d+1..depth (their undrafted
            # tokens valued path x alpha^j), on top of the plan so far, or the first rate above ``enough``;
            # each depth's plan is the one before it and one level more for the members whose output has room
            # for it. Written here, not in a helper: numba would count every array a helper is given at each
            # call (docs/development.md).
            members = going if which == 0 else everyone
            rate = 0.0
            trial_rows[:] = now_rows
            trial_totals[:] = now_totals
            future[:] = path
            if d == 0:
                for i in range(b):
                    if members[i]:
                        _start(trial_totals, kept[i], visual[i])
            extra_gain, extra_n, extra_pairs = 0.0, 0, 0
            for top in range(d + 1, depth + 1):
                rows = 0
                for i in range(b):
                    if members[i] and top < remaining[i]:  # level top - 1 is within its output
                        future[i] *= alpha[i]
                        extra_gain += future[i]
                        extra_pairs += context[i]
                        rows += 1
                if rows > 0:
                    _add_rows(table, trial, top - 1, rows)
                extra_n += rows
                rate = max(rate, _plan_rate(layers_s, head_s, zero, r, trial_totals, b, gain + extra_gain,
                                            n + extra_n, pairs + extra_pairs))
                if rate > enough:
                    break
            if rate > best:
                best, best_set = rate, which
        if best <= stop:
            break
        if best_set == 1:
            going[:] = everyone
        unknown = False
        for i in range(b):
            if going[i] and conf[i, d, 0] <= 0.0:
                unknown = True
        for i in range(b):
            if not going[i]:
                continue
            if d == 0:
                _start(now_totals, kept[i], visual[i])
            _add_rows(table, now, d, 1)
            levels[i] = d + 1
            if unknown:
                continue
            path[i] *= conf[i, d, 0]
            worth[i, d + 1] = worth[i, d] + path[i]
            gain += path[i]
            n += 1
            pairs += context[i]
            if path[i] >= threshold:
                cut[i] = d + 1
            else:
                alive[i] = False  # the dynamic head stops here: it drafted this level to see it fall
        if unknown:
            break
    return Drafting(levels, cut, worth)


# -- marginal: how deep to draft, then what to verify ------------------------------

@jit
def _chain_worth(batch: Batch, levels: np.ndarray) -> np.ndarray:
    """Each request's drafted chain valued by the drafter's confidences:
    the expected accepted tokens of its first ``levels`` rank-1 drafts. [B]."""
    b = len(levels)
    worth = np.zeros(b)
    for i in range(b):
        path = 1.0
        for d in range(levels[i]):
            path *= batch.conf[i, d, 0]
            worth[i] += path
    return worth


@jit
def _verify_rule(batch: Batch, costs: CostTables, p: Pricing, v: Verifying, levels: np.ndarray, topk: int,
                 max_nodes: int, rows: np.ndarray, chosen: np.ndarray) -> int:
    """What to verify once the drafter has run ``levels`` levels for each
    request: nodes of depth <= its levels and rank <= topk, valued by the
    drafter's confidences (a path's product), enumerated best first over
    the whole batch (a heap of each request's frontier: popping a node adds
    its first child and its next sibling, so pops come in non-increasing
    value); every prefix of that order is priced whole, the drafting as the
    simulator charges it (already run: the same for every prefix, except
    that a request verifying a tree drafts ``topk`` rows a level where a
    chain drafts one). It stops when no later node can raise the rate
    (each is worth at most the one just popped and costs at least the
    forward's slope over CHORD_TOKENS tokens), or at ``max_nodes``.
    Returns how many popped nodes (``rows``, ``chosen``, in pop order) the
    plan keeps, or -1 when verifying every drafted chain, and nothing
    else, beats every prefix."""
    b = len(batch.context_tokens)
    drafted = _drafted_chains(batch, costs, levels)
    rater = _rater(costs, p, v)
    drafting_s = _drafting_s(rater.terms, drafted.totals, b)
    zero, table = p.draft_s, costs.draft_s  # depth 0 of the drafting table: the forward alone
    layers_s, head_s = costs.layers_s, costs.head_s
    context, remaining = batch.context_tokens, batch.remaining_tokens
    # The chains as drafted: a candidate of its own.
    worth = _chain_worth(batch, levels)
    n_chain, pairs_chain, gain_chain = 0, 0, float(b)
    for i in range(b):
        n_chain += levels[i]
        pairs_chain += levels[i] * context[i]
        gain_chain += worth[i]
    chain_rate = _plan_rate(layers_s, head_s, zero, rater, drafted.totals, b, gain_chain, n_chain, pairs_chain)
    best = _plan_rate(layers_s, head_s, zero, rater, drafted.totals, b, float(b), 0, 0)
    memo = Memo(np.nan, np.nan)
    take = 0
    c = b + max_nodes + 1
    f = Frontier(np.empty(c), np.empty(c, dtype=np.int64), np.empty(c, dtype=np.int64), np.empty(c))
    value_of, request_of, code_of, parent_of = f.value, f.request, f.code, f.parent
    conf = batch.conf
    tree = np.zeros(b, np.bool_)
    size = 0
    for i in range(b):
        if levels[i] > 0 and remaining[i] > 1 and conf[i, 0, 0] > 0:
            size = push(f, size, conf[i, 0, 0], i, np.int64(1), 1.0)
    gain, pairs, n = float(b), 0, 0
    forward = 0.0  # the forward of the nodes taken so far: the last pop's, as (n, pairs) are
    while size > 0 and n < max_nodes:
        value, i, code, parent = value_of[0], request_of[0], code_of[0], parent_of[0]
        d = trees.depth(code)
        if n > 0:
            after, memo = _verified_s(v, layers_s, head_s, zero, memo, n + CHORD_TOKENS, pairs, 0)
            slope = (after - forward) / CHORD_TOKENS
            if slope > 0 and value / slope < best:
                break
        rows[n], chosen[n] = i, code
        n += 1
        gain += value
        pairs += context[i]
        if not tree[i] and not trees.on_chain(code):
            tree[i] = True  # its later levels draft topk rows each
            for level in range(1, levels[i]):
                _add_rows(table, drafted, level, topk - 1)
            drafting_s = _drafting_s(rater.terms, drafted.totals, b)
        forward, memo = _verified_s(v, layers_s, head_s, zero, memo, n, pairs, 0)
        rate = gain / (forward + drafting_s)
        if rate > best:
            best, take = rate, n
        below = value * conf[i, d, 0] if d < levels[i] and d + 1 < remaining[i] else 0.0
        r = trees.rank(code)
        beside = parent * conf[i, d - 1, r] if r < topk else 0.0
        if below > 0:  # the first child takes the popped node's place
            sift_down(f, size, below, i, trees.child_at(code, d, 1), value)
            if beside > 0:
                size = push(f, size, beside, i, trees.next_sibling(code, d), parent)
        elif beside > 0:
            sift_down(f, size, beside, i, trees.next_sibling(code, d), parent)
        else:
            size = pop(f, size)
    return -1 if chain_rate > best else take


@jit
def _marginal(batch: Batch, costs: CostTables, depth: int, topk: int, max_nodes: int) -> Plan:
    """The load-adaptive rule in two phases, as an engine runs it: the
    drafter's confidences exist only for the levels it has drafted.

    1. *How deep to draft*, as the drafter goes (:func:`_draft_levels`):
       a level at a time, the drafted levels valued by their confidences
       and the undrafted ones by the request's history, the batch drafts
       on while some deeper plan, priced whole, beats stopping.
    2. *What to verify*, after drafting: :func:`_verify_rule` on the
       drafter's real confidences, cut to the drafted levels, picks the
       nodes (a tree where lower-ranked candidates pay), or every drafted
       chain when that is better.
    """
    b = len(batch.context_tokens)
    if batch.conf.shape[1] < depth or batch.conf.shape[2] < topk:  # the rules read within these
        raise ValueError("marginal: Batch.conf must be [B, D >= depth, R >= topk]")
    p = _pricing(batch, costs, 1)
    v = _verifying(costs, p)
    levels = _draft_levels(batch, costs, p, v, depth, 0.0).levels
    rows = np.empty(max_nodes, dtype=np.int64)
    chosen = np.empty(max_nodes, dtype=np.int64)
    take = _verify_rule(batch, costs, p, v, levels, topk, max_nodes, rows, chosen)
    if take < 0:
        return _chain(batch, levels, levels)
    plan = _packed(rows[:take], chosen[:take], b, topk)
    for i in range(b):
        plan.draft_steps[i] = levels[i]
        if levels[i] > 0 and plan.draft_width[i] == 0:
            plan.draft_width[i] = 1
    return plan
