"""The scheduler's rules, compiled: one copy, called by the Python
:class:`~simspec.serving.scheduler.Scheduler` (the live engine, the
simulator's general path) and by the simulator's compiled serving loop
(simspec.sim.loop), which runs many steps' decisions in one call.

Imports: numpy, simspec.compiled (numba). DESIGN.md "The serving model".

Each step, as vLLM's scheduler:

1. admit waiting requests FCFS while ``max_num_seqs`` and the KV budget
   allow (a request needs its prompt and one more token);
2. reserve KV for the decode batch, preempting the newest request (its cache
   freed, recomputed later with the tokens it emitted, never dropped) until
   every decode request can grow by ``reserve_tokens``;
3. schedule prefill chunks FCFS in the token budget the decode rounds leave
   (each round counts 1 + its last round's draft tokens, as vLLM counts
   spec tokens);
4. price the chunks: causal attention pairs, KV read, vision-encoder tokens
   of requests starting their prefill.

The per-request token counts and the queues are arrays the rules read and
write in place (:class:`Tokens`, :class:`Queues`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simspec.compiled import jit


class Prefill(NamedTuple):
    """The prefill chunks of one step, as the cost model prices them (zeros when none)."""

    tokens: int  # prompt tokens run this step
    attn_pairs: int  # causal query x key pairs: each new token sees the cache and the chunk before it
    kv_tokens: int  # KV tokens attention reads (cache + chunk)
    requests: int  # chunks
    vision_tokens: int  # visual tokens of the requests starting their prefill (the vision encoder runs)
    max_context: int  # the longest context cached before a chunk


NO_PREFILL = Prefill(0, 0, 0, 0, 0, 0)


# -- the rules, compiled -------------------------------------------------------------
#
# Steps 1-4 as compiled functions over arrays: the Scheduler below calls
# them, and so does the simulator's compiled serving loop (simspec.sim.serve),
# so each rule has one copy. Admission and the KV reservation here know no
# prefix cache, and chunking and pricing encode a request's images when its
# prefill starts; the Scheduler extends those rules in Python where prefixes
# are cached or vLLM's encoder budget decides. The queues are arrays:
# ``waiting`` a ring (a preempted request goes back to its head), ``running``
# in admission order.


class Queues(NamedTuple):
    """The waiting and running requests, updated in place."""

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


class Limits(NamedTuple):
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_budget: int  # tokens
    reserve: int  # tokens a decode request may grow by in one step
    block_size: int  # tokens


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
    besides the shared prefix blocks it uses (counted once, by the PrefixCache)."""
    return blocks(max(tok.cache[i], tok.target[i]) - tok.shared[i], lim.block_size)


@jit
def kv_used(q: Queues, tok: Tokens, lim: Limits) -> int:
    """KV tokens the running requests hold (:func:`held`)."""
    used = 0
    for j in range(q.counts[RUN_LEN]):
        used += held(tok, lim, q.running[j])
    return used


@jit
def admit(q: Queues, tok: Tokens, lim: Limits, budgeted: bool, token_budget: int, admitted: np.ndarray) -> int:
    """Step 1: admit waiting requests FCFS while max_num_seqs and the KV
    budget allow (each needs its prompt and one more token); ``budgeted``
    (vLLM's rule), only while ``token_budget`` less the running requests'
    prefill left has room. Writes them to ``admitted``; returns how many."""
    used = kv_used(q, tok, lim)
    left = token_budget
    if budgeted:
        for j in range(q.counts[RUN_LEN]):
            i = q.running[j]
            left -= max(tok.target[i] - tok.cache[i], 0)
    count = 0
    while q.counts[WAIT_LEN] > 0 and q.counts[RUN_LEN] < lim.max_num_seqs and (not budgeted or left > 0):
        i = q.waiting[q.counts[WAIT_HEAD]]
        need = blocks(tok.target[i] + 1, lim.block_size)
        if used + need > lim.kv_budget:
            break
        q.counts[WAIT_HEAD] = (q.counts[WAIT_HEAD] + 1) % len(q.waiting)
        q.counts[WAIT_LEN] -= 1
        q.running[q.counts[RUN_LEN]] = i
        q.counts[RUN_LEN] += 1
        admitted[count] = i
        count += 1
        used += need
        if budgeted:
            left -= tok.target[i]
    return count


@jit
def preempt(q: Queues, tok: Tokens, i: int) -> None:
    """Free request ``i``'s KV cache; it waits at the queue's head and will
    prefill its prompt and the tokens it already emitted again."""
    tok.target[i] = tok.context[i] + tok.emitted[i]
    tok.cache[i] = 0
    tok.drafted[i] = 0
    head = q.counts[WAIT_HEAD]
    q.counts[WAIT_HEAD] = head - 1 if head > 0 else len(q.waiting) - 1
    q.waiting[q.counts[WAIT_HEAD]] = i
    q.counts[WAIT_LEN] += 1


@jit
def decode_batch(q: Queues, tok: Tokens, lim: Limits, decode: np.ndarray, preempted: np.ndarray,
                 requeued: np.ndarray) -> tuple[int, int, int]:
    """Step 2 (Scheduler.decode_batch): preempt the newest running request
    until every decoding one can grow by ``reserve``. Writes the decode
    batch, the preempted requests and those sent back before any prefill
    (never started: not a preemption); returns their counts."""
    npre = nreq = 0
    while True:
        r = q.counts[RUN_LEN]
        need = 0
        decoding = 0
        for j in range(r):
            i = q.running[j]
            need += held(tok, lim, i)
            if tok.cache[i] >= tok.target[i]:
                decoding += 1
        if need + decoding * lim.reserve <= lim.kv_budget or r == 1:
            nd = 0
            for j in range(r):
                i = q.running[j]
                if tok.cache[i] >= tok.target[i]:
                    decode[nd] = i
                    nd += 1
            return nd, npre, nreq
        i = q.running[r - 1]
        q.counts[RUN_LEN] -= 1
        if tok.cache[i] > tok.hit[i]:
            preempted[npre] = i
            npre += 1
        else:
            requeued[nreq] = i
            nreq += 1
        preempt(q, tok, i)


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
def prefill_chunks(q: Queues, tok: Tokens, lim: Limits, decode: np.ndarray, nd: int, chunk_ids: np.ndarray,
                   takes: np.ndarray) -> int:
    """Step 3: (request, tokens) chunks FCFS in the budget ``decode[:nd]``'s
    rounds leave, written to ``chunk_ids`` and ``takes``; returns how many."""
    budget = budget_left(tok, lim, decode, nd)
    count = 0
    if budget <= 0:
        return count
    for j in range(q.counts[RUN_LEN]):
        i = q.running[j]
        if tok.target[i] > tok.cache[i]:  # prompt left, in admission order
            if budget <= 0:
                break
            take = min(tok.target[i] - tok.cache[i], budget)
            chunk_ids[count] = i
            takes[count] = take
            count += 1
            budget -= take
    return count


@jit
def prefill_cost(tok: Tokens, chunk_ids: np.ndarray, takes: np.ndarray, count: int) -> "Prefill":
    """Step 4: what the chunks cost the step's forward; a request's images
    are encoded when its prefill starts."""
    tokens = pairs = kv = vision = longest = 0
    for c in range(count):
        i, take = chunk_ids[c], takes[c]
        done = tok.cache[i]
        longest = max(longest, done)
        tokens += take
        kv += done + take
        pairs += take * done + take * (take + 1) // 2  # causal: each new token sees those before it
        if done == tok.hit[i]:  # the prefill starts (after any prefix-cache hit, images first)
            vision += tok.visual[i] - min(tok.hit[i], tok.visual[i])
    return Prefill(tokens, pairs, kv, count, vision, longest)


@jit
def complete_prefill(tok: Tokens, chunk_ids: np.ndarray, takes: np.ndarray, count: int, first: np.ndarray) -> int:
    """After the step: the chunks are in the cache; those whose prefill
    completed sampled their next token (written to ``first``; returns how many)."""
    done = 0
    for c in range(count):
        i = chunk_ids[c]
        tok.cache[i] += takes[c]
        if tok.cache[i] >= tok.target[i]:
            tok.emitted[i] += 1
            first[done] = i
            done += 1
    return done


@jit
def retire(q: Queues, tok: Tokens, done: np.ndarray) -> int:
    """The running requests that have emitted their output, removed
    (written to ``done`` in admission order; returns how many)."""
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
    return count



__all__ = ["Prefill", "NO_PREFILL", "Queues", "Tokens", "Limits", "WAIT_HEAD", "WAIT_LEN", "RUN_LEN", "new_queues",
           "blocks", "arrive", "held", "kv_used", "admit", "preempt", "decode_batch", "in_budget", "budget_left",
           "prefill_chunks", "prefill_cost", "complete_prefill", "retire"]
