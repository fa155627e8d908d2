"""The scheduler's rules, compiled: one copy, run by the Python
:class:`~simspec.serving.scheduler.Scheduler` (the live engine, the
simulator's SimPy-process path) and by the simulator's compiled serving
loop (simspec.sim.fastloop), which runs many steps' decisions in one call.

Imports: numpy, simspec.compiled (numba), simspec.costs.base (the keys
and pairs of chunked attention), simspec.serving.prefixes (the prefix
cache and the encoder budget the rules consult). DESIGN.md "The serving
model".

Each step (:func:`schedule`), as vLLM's scheduler:

1. admit waiting requests FCFS while ``max_num_seqs`` and the KV budget
   allow (a request needs its prompt and one more token; with prefix
   caching, less the cached prefix it finds);
2. reserve KV for the decode batch, preempting the newest request (its cache
   freed, recomputed later with the tokens it emitted, never dropped) until
   every decode request can grow by ``reserve_tokens``;
3. schedule prefill chunks FCFS in the token budget the decode rounds leave
   (each round counts 1 + its last round's draft tokens, as vLLM counts
   spec tokens; with vLLM's encoder budget a chunk stops short of an image
   the budget cannot take);
4. price the chunks (:func:`prefill_cost`): causal attention pairs, KV
   read, the vision encoder's tokens.

vLLM's order differs: the running requests' rounds first, in the token
budget, and admission only in a step that preempted none. SGLang runs a
prefill batch alone. The queues, the per-request token counts and the
prefix cache are arrays the rules read and write in place (:class:`State`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simspec.compiled import jit
from simspec.costs.base import LocalAttention, attended_span
from simspec.serving.prefixes import (IN_USE, Images, Prefixes, encode_cut, evict, images_reached, lookup, release,
                                      store, use)


class Prefill(NamedTuple):
    """The prefill chunks of one step, as the cost model prices them (zeros when none)."""

    tokens: int  # prompt tokens run this step
    attn_pairs: int  # causal query x key pairs: each new token sees the cache and the chunk before it
    kv_tokens: int  # KV tokens attention reads (cache + chunk)
    requests: int  # chunks
    vision_tokens: int  # visual tokens the vision encoder runs this step
    max_context: int  # the longest context cached before a chunk


NO_PREFILL = Prefill(0, 0, 0, 0, 0, 0)


class Queues(NamedTuple):
    """The waiting and running requests, updated in place: ``waiting`` a
    ring (a preempted request goes back to its head), ``running`` in
    admission order."""

    waiting: np.ndarray  # [N] int ring of request ids, FCFS from counts[WAIT_HEAD]
    running: np.ndarray  # [S] int request ids in admission order (S = max_num_seqs)
    counts: np.ndarray  # [3] int: WAIT_HEAD, WAIT_LEN, RUN_LEN


WAIT_HEAD, WAIT_LEN, RUN_LEN = range(3)


def new_queues(n: int, max_num_seqs: int) -> Queues:
    return Queues(np.zeros(max(n, 1), np.int64), np.zeros(max_num_seqs, np.int64), np.zeros(3, np.int64))


class Tokens(NamedTuple):
    """The Scheduler's per-request token counts (its fields of the same names), updated in place."""

    context: np.ndarray  # [N] int prompt tokens, text + visual
    visual: np.ndarray  # [N] int visual tokens
    output: np.ndarray  # [N] int tokens to generate
    cache: np.ndarray  # [N] int tokens in the KV cache
    target: np.ndarray  # [N] int tokens to prefill
    drafted: np.ndarray  # [N] int draft tokens of the last round
    emitted: np.ndarray  # [N] int tokens generated so far
    hit: np.ndarray  # [N] int prefix-cache hit at the latest admission (0 without prefix caching)
    shared: np.ndarray  # [N] int tokens of the cache held in a shared prefix entry (0 without prefix caching)
    # [N] int prompt tokens whose KV arrives with the request (a disaggregated
    # prefill's, moved to this replica): computed at its first admission, in
    # blocks of its own, as vLLM's KV connector reports external tokens;
    # spent there (a preempted request recomputes them). 0: none.
    ready: np.ndarray


class State(NamedTuple):
    """What the rules read and write."""

    queues: Queues
    tokens: Tokens
    prefixes: Prefixes
    images: Images


class Limits(NamedTuple):
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_budget: int  # tokens
    reserve: int  # tokens a decode request may grow by in one step
    block_size: int  # tokens
    prefix_caching: bool
    encoder_budget: int  # visual tokens a step's chunks may encode (0: a request's images at its prefill's start)
    attention: LocalAttention  # the model's chunked layers, which :func:`prefill_cost` prices


class Decision(NamedTuple):
    """One step's scheduling, written by :func:`schedule`: [S] int lists, the first ``counts[k]`` of each valid."""

    admitted: np.ndarray  # admitted now, in order
    decode: np.ndarray  # the decode batch (running requests past their prefill, in admission order)
    preempted: np.ndarray  # their KV cache dropped, to recompute
    requeued: np.ndarray  # sent back before any of their prompt ran (admitted, never started: not a preemption)
    chunk_ids: np.ndarray  # prefill chunks' requests
    takes: np.ndarray  # ... and tokens
    counts: np.ndarray  # [5] int: ADMITTED, DECODES, PREEMPTED, REQUEUED, CHUNKS


ADMITTED, DECODES, PREEMPTED, REQUEUED, CHUNKS = range(5)


def new_decision(max_num_seqs: int) -> Decision:
    return Decision(*(np.zeros(max_num_seqs, np.int64) for _ in range(6)), np.zeros(5, np.int64))


@jit
def blocks(tokens: int, block_size: int) -> int:
    """``tokens`` rounded up to whole KV blocks."""
    return tokens if block_size == 1 else -(-tokens // block_size) * block_size


@jit
def arrive(q: Queues, i: int) -> None:
    q.waiting[(q.counts[WAIT_HEAD] + q.counts[WAIT_LEN]) % len(q.waiting)] = i
    q.counts[WAIT_LEN] += 1


@jit
def held(tok: Tokens, lim: Limits, i: int) -> int:
    """KV tokens request ``i`` holds or will once prefilled, in whole blocks,
    besides the shared prefix blocks it uses (counted once, in :func:`kv_used`)."""
    return _held(tok.cache[i], tok.target[i], tok.shared[i], lim.block_size)


@jit
def _held(cache: int, target: int, shared: int, block_size: int) -> int:
    """:func:`held` from the request's numbers."""
    return blocks(max(cache, target) - shared, block_size)


@jit
def kv_used(s: State, lim: Limits) -> int:
    """KV tokens the running requests hold (:func:`held`) and the cached prefixes they share.

    The three arrays are read once, before the loop: a call that takes
    ``s.tokens`` counts a reference for each of its arrays, and a call a
    running request would pay those atomic counts for every request of
    every step."""
    q = s.queues
    running, cache, target, shared = q.running, s.tokens.cache, s.tokens.target, s.tokens.shared
    used = s.prefixes.counts[IN_USE]
    for j in range(q.counts[RUN_LEN]):
        i = running[j]
        used += _held(cache[i], target[i], shared[i], lim.block_size)
    return used


@jit
def admit(s: State, lim: Limits, budgeted: bool, token_budget: int, admitted: np.ndarray) -> int:
    """Step 1: admit waiting requests FCFS while max_num_seqs and the KV
    budget allow (each needs its prompt and one more token, less a cached
    prefix it finds, plus the prefix entry's room if no running request
    used it); ``budgeted`` (vLLM's rule), only while ``token_budget`` less
    the running requests' prefill left has room. Writes them to
    ``admitted``; returns how many."""
    q, tok, pre = s.queues, s.tokens, s.prefixes
    used = kv_used(s, lim)
    left = token_budget
    if budgeted:
        for j in range(q.counts[RUN_LEN]):
            i = q.running[j]
            left -= max(tok.target[i] - tok.cache[i], 0)
    count = 0
    while q.counts[WAIT_LEN] > 0 and q.counts[RUN_LEN] < lim.max_num_seqs and (not budgeted or left > 0):
        i = q.waiting[q.counts[WAIT_HEAD]]
        hit = extra = 0
        if lim.prefix_caching:
            hit, extra = lookup(pre, lim.block_size, i, tok.target[i])
        ready = min(tok.ready[i], tok.target[i] - 1)  # the last prompt token runs here, as after a prefix hit
        if ready > hit:
            hit, extra = ready, 0
            need = blocks(tok.target[i] + 1, lim.block_size)  # the arrived KV in blocks of its own
        else:
            ready = 0
            need = blocks(tok.target[i] + 1 - hit, lim.block_size) + extra
        if used + need > lim.kv_budget:
            break
        q.counts[WAIT_HEAD] = (q.counts[WAIT_HEAD] + 1) % len(q.waiting)
        q.counts[WAIT_LEN] -= 1
        q.running[q.counts[RUN_LEN]] = i
        q.counts[RUN_LEN] += 1
        admitted[count] = i
        count += 1
        used += need
        if ready > 0:
            tok.cache[i] = ready
            tok.hit[i] = ready
            tok.ready[i] = 0
        elif lim.prefix_caching:
            if hit > 0:
                use(pre, i)
                tok.cache[i] = hit
                tok.shared[i] = hit
            tok.hit[i] = hit
            if not pre.seen[i]:
                pre.seen[i] = True
                pre.cached_tokens[i] = hit
        if budgeted:
            left -= tok.target[i] - hit
    if lim.prefix_caching:
        evict(pre, lim.kv_budget - used)
    return count


@jit
def preempt(s: State, i: int) -> None:
    """Free request ``i``'s KV cache (its shared prefix stays cached); it
    waits at the queue's head and will prefill its prompt and the tokens it
    already emitted again."""
    q, tok = s.queues, s.tokens
    tok.target[i] = tok.context[i] + tok.emitted[i]
    tok.cache[i] = 0
    tok.drafted[i] = 0
    head = q.counts[WAIT_HEAD]
    q.counts[WAIT_HEAD] = head - 1 if head > 0 else len(q.waiting) - 1
    q.waiting[q.counts[WAIT_HEAD]] = i
    q.counts[WAIT_LEN] += 1
    _release(s, i)


@jit
def _release(s: State, i: int) -> None:
    """Request ``i`` no longer uses its shared prefix's blocks (they stay cached, evictable)."""
    if s.tokens.shared[i] > 0:
        release(s.prefixes, i)
        s.tokens.shared[i] = 0


@jit
def decode_batch(s: State, lim: Limits, decision: Decision) -> None:
    """Step 2: preempt the newest running request until every decoding one
    can grow by ``reserve``. Writes the decode batch, the preempted requests
    and those sent back before any prefill (never started: not a
    preemption)."""
    q, tok, n = s.queues, s.tokens, decision.counts
    n[DECODES] = n[PREEMPTED] = n[REQUEUED] = 0
    while True:
        r = q.counts[RUN_LEN]
        need = kv_used(s, lim)
        for j in range(r):
            if tok.cache[q.running[j]] >= tok.target[q.running[j]]:
                need += lim.reserve
        if need <= lim.kv_budget or r == 1:
            if lim.prefix_caching:
                evict(s.prefixes, lim.kv_budget - need)
            for j in range(r):
                i = q.running[j]
                if tok.cache[i] >= tok.target[i]:
                    decision.decode[n[DECODES]] = i
                    n[DECODES] += 1
            return
        i = q.running[r - 1]
        q.counts[RUN_LEN] -= 1
        if tok.cache[i] > tok.hit[i]:
            decision.preempted[n[PREEMPTED]] = i
            n[PREEMPTED] += 1
        else:
            decision.requeued[n[REQUEUED]] = i
            n[REQUEUED] += 1
        preempt(s, i)


@jit
def in_budget(tok: Tokens, lim: Limits, decode: np.ndarray, nd: int) -> int:
    """vLLM's rule: decode requests take 1 + their draft tokens from the
    step's token budget in order; how many of ``decode[:nd]`` it holds (the
    rest skip the step)."""
    total = 0
    for j in range(nd):
        total += 1 + tok.drafted[decode[j]]
        if total > lim.max_num_batched_tokens:
            return j
    return nd


@jit
def budget_left(tok: Tokens, lim: Limits, decode: np.ndarray, nd: int) -> int:
    """Tokens of the step's budget ``decode[:nd]``'s rounds leave for prefill chunks."""
    left = lim.max_num_batched_tokens
    for j in range(nd):
        left -= 1 + tok.drafted[decode[j]]
    return left


@jit
def prefill_chunks(s: State, lim: Limits, decode: np.ndarray, nd: int, chunk_ids: np.ndarray,
                   takes: np.ndarray) -> int:
    """Step 3: (request, tokens) chunks FCFS in the budget ``decode[:nd]``'s
    rounds leave, each cut before an image the encoder budget cannot take
    (a request stopped at its first chunk's image lets the next run),
    written to ``chunk_ids`` and ``takes``; returns how many."""
    q, tok = s.queues, s.tokens
    budget = budget_left(tok, lim, decode, nd)
    encoder_left = lim.encoder_budget
    count = 0
    if budget <= 0:
        return count
    for j in range(q.counts[RUN_LEN]):
        i = q.running[j]
        if tok.target[i] > tok.cache[i]:  # prompt left, in admission order
            if budget <= 0:
                break
            take = min(tok.target[i] - tok.cache[i], budget)
            if lim.encoder_budget > 0:
                take, encoder_left = encode_cut(s.images, i, tok.cache[i], take, encoder_left)
                if take <= 0:
                    continue
            chunk_ids[count] = i
            takes[count] = take
            count += 1
            budget -= take
    return count


@jit
def schedule(s: State, lim: Limits, vllm: bool, mixed_prefill: bool, decision: Decision) -> None:
    """Steps 1-3 of one step, in the engine's order: ``vllm``, the running
    requests' rounds first (those the token budget holds) and admission only
    in a step that preempted none; else admission first. Without
    ``mixed_prefill`` (SGLang) a step with prefill chunks runs no decodes."""
    n = decision.counts
    if vllm:
        decode_batch(s, lim, decision)
        n[DECODES] = in_budget(s.tokens, lim, decision.decode, n[DECODES])
        n[ADMITTED] = 0 if n[PREEMPTED] > 0 else admit(
            s, lim, True, budget_left(s.tokens, lim, decision.decode, n[DECODES]), decision.admitted)
    else:
        n[ADMITTED] = admit(s, lim, False, 0, decision.admitted)
        decode_batch(s, lim, decision)
    nd = n[DECODES] if mixed_prefill else 0
    n[CHUNKS] = prefill_chunks(s, lim, decision.decode, nd, decision.chunk_ids, decision.takes)
    if not mixed_prefill and n[CHUNKS] > 0:
        n[DECODES] = 0


@jit
def prefill_cost(s: State, lim: Limits, chunk_ids: np.ndarray, takes: np.ndarray, count: int) -> "Prefill":
    """Step 4: what the chunks cost the step's forward. The vision encoder
    runs over the images a chunk reaches (under an encoder budget) or over a
    request's images when its prefill starts (after any prefix-cache hit)."""
    tok = s.tokens
    tokens = pairs = kv = vision = longest = 0
    for c in range(count):
        i, take = chunk_ids[c], takes[c]
        done = tok.cache[i]
        longest = max(longest, done)
        tokens += take
        # causal: each new token sees those before it (in its own chunk, in a chunked layer)
        chunk_kv, chunk_pairs = attended_span(lim.attention, done, take)
        kv += chunk_kv
        pairs += chunk_pairs
        if lim.encoder_budget > 0:
            vision += images_reached(s.images, i, done, take)
        elif done == tok.hit[i]:  # the prefill starts (after any prefix-cache hit, images first)
            vision += tok.visual[i] - min(tok.hit[i], tok.visual[i])
    return Prefill(tokens, pairs, kv, count, vision, longest)


@jit
def complete_prefill(s: State, lim: Limits, chunk_ids: np.ndarray, takes: np.ndarray, count: int,
                     first: np.ndarray) -> int:
    """After the step: the chunks are in the cache (a prefix whose blocks
    are now computed becomes a cache entry); those whose prefill completed
    sampled their next token (written to ``first``; returns how many)."""
    tok = s.tokens
    done = 0
    for c in range(count):
        i = chunk_ids[c]
        tok.cache[i] += takes[c]
        if tok.cache[i] >= tok.target[i]:
            tok.emitted[i] += 1
            first[done] = i
            done += 1
    if lim.prefix_caching:
        for c in range(count):
            i = chunk_ids[c]
            if tok.shared[i] == 0:
                tok.shared[i] = store(s.prefixes, i, tok.cache[i])
    return done


@jit
def retire(s: State, done: np.ndarray) -> int:
    """The running requests that have emitted their output, removed
    (written to ``done`` in admission order; returns how many)."""
    q, tok = s.queues, s.tokens
    count = kept = 0
    for j in range(q.counts[RUN_LEN]):
        i = q.running[j]
        if tok.emitted[i] >= tok.output[i]:
            done[count] = i
            count += 1
        else:
            q.running[kept] = i
            kept += 1
    q.counts[RUN_LEN] = kept
    for c in range(count):
        _release(s, done[c])
    return count


__all__ = ["Prefill", "NO_PREFILL", "Queues", "Tokens", "State", "Limits", "Decision", "WAIT_HEAD", "WAIT_LEN",
           "RUN_LEN", "ADMITTED", "DECODES", "PREEMPTED", "REQUEUED", "CHUNKS", "new_queues", "new_decision",
           "blocks", "arrive", "held", "kv_used", "admit", "preempt", "decode_batch", "in_budget", "budget_left",
           "prefill_chunks", "schedule", "prefill_cost", "complete_prefill", "retire"]
