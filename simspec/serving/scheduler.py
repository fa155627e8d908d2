"""The scheduler in Python: :class:`Scheduler`, the live engine's and the
simulator's handle on the compiled rules (simspec.serving.queues): the
requests' state as arrays, and one method per rule.

Imports: numpy, simspec.serving.queues, simspec.serving.prefixes,
simspec.types. DESIGN.md "The serving model".

The scheduler keeps, per request, the tokens in its KV cache, the tokens it
must prefill, its last round's draft tokens and its emitted tokens, as
arrays the compiled rules read and write in place, with the prefix cache
(vLLM V1's automatic prefix caching) and each request's images (vLLM's
encoder budget). Every decision is a compiled rule's; this class only
turns their outputs into lists.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import numpy as np

from simspec.costs.base import NO_LOCAL, LocalAttention
from simspec.serving import queues as rules
from simspec.serving.prefixes import FREE, IN_USE, images_reached, new_images, new_prefixes
from simspec.serving.queues import (ADMITTED, CHUNKS, DECODES, PREEMPTED, REQUEUED, RUN_LEN, WAIT_HEAD, WAIT_LEN,
                                    Limits, Prefill, State, Tokens, new_decision, new_queues)
from simspec.types import require


def shared_array(pool: dict | None, name: str, make: Callable[[], np.ndarray]) -> np.ndarray:
    """``make()``, or where ``pool`` is given, the array of that name in it
    (made by the first to ask): the per-request arrays the alike replicas of
    a fleet share. Each request is served by one replica, which alone reads
    and writes its entries, so one array serves them all: the fleet's
    memory is one replica's over the whole stream, not one a replica."""
    if pool is None:
        return make()
    if name not in pool:
        pool[name] = make()
    return pool[name]


class Scheduler:
    """Admission, preemption and chunking over requests ``0..N-1`` (module docstring).

    ``context``, ``visual`` and ``output`` are each request's prompt tokens
    (text + visual), visual tokens and output tokens; ``reserve_tokens`` is
    what a decode request may grow by in one step (1 + the deepest draft).
    """

    def __init__(self, *, context: np.ndarray, visual: np.ndarray, output: np.ndarray, max_num_seqs: int,
                 max_num_batched_tokens: int, kv_budget_tokens: int, reserve_tokens: int,
                 images: list[tuple[int, ...]] | None = None, block_size: int = 1,
                 prefixes: tuple[np.ndarray, np.ndarray] | None = None, transferred: bool = False,
                 pool: dict | None = None, attention: LocalAttention = NO_LOCAL):
        """``images`` (each request's visual tokens per image, at the
        prompt's start in order): given, the vision encoder runs under
        vLLM's per-step encoder budget (simspec.serving.prefixes). Without,
        a request's images are all encoded in the step its prefill starts.

        ``prefixes`` (each request's prefix_id and prefix_tokens, as
        Request has them): given, the engine caches prefixes: a request
        admitted while its prefix's blocks are cached starts with them
        computed, and holds only the rest.

        ``transferred``: every request arrives with its prompt's KV cache
        (the decode side of a disaggregated fleet: Tokens.ready).

        ``pool``: the per-request counts shared with a fleet's alike
        replicas (:func:`shared_array`).

        ``attention``: the model's chunked layers (CostModel.local), which
        the prefill chunks' keys and pairs average over."""
        n = len(context)
        self.context = np.asarray(context, dtype=np.int64)  # [N] prompt tokens, text + visual
        self.visual = np.asarray(visual, dtype=np.int64)  # [N] visual tokens
        self.output = np.asarray(output, dtype=np.int64)  # [N] tokens to generate

        def zeros(name: str) -> np.ndarray:
            return shared_array(pool, name, lambda: np.zeros(n, np.int64))

        self.cache = zeros("cache")  # [N] tokens in the KV cache
        # [N] tokens to prefill: the prompt, + what was emitted on recompute
        self.target = shared_array(pool, "target", self.context.copy)
        self.drafted = zeros("drafted")  # [N] draft tokens of the last round
        self.emitted = zeros("emitted")  # [N] tokens generated so far
        self.hit = zeros("hit")  # [N] prefix-cache hit at the request's latest admission
        self.shared = zeros("shared")  # [N] tokens of the cache held in a shared prefix entry
        # [N] KV arriving with it
        self.ready = shared_array(pool, "ready", self.context.copy) if transferred else zeros("ready")
        self.block_size = block_size  # KV is held in blocks of this many tokens (vLLM: 16)
        self.images = images
        self.prefix_caching = prefixes is not None
        prefix_cache, self._prefix_ids = new_prefixes(*(prefixes or (None, None)), n, block_size)
        self.cached_tokens = prefix_cache.cached_tokens  # [N] prefix-cache hit when first scheduled
        largest = max((t for imgs in images or () for t in imgs), default=0)
        self.encoder_budget = max(max_num_batched_tokens, largest) if images is not None else 0
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.reserve = reserve_tokens
        self.attention = attention
        seqs = max(1, min(max_num_seqs, n))
        self.tokens = Tokens(self.context, self.visual, self.output, self.cache, self.target, self.drafted,
                             self.emitted, self.hit, self.shared, self.ready)
        self.state = State(new_queues(n, seqs), self.tokens, prefix_cache, new_images(images, n))
        self.queues = self.state.queues
        self.kv_budget = kv_budget_tokens
        self.decision = new_decision(seqs)  # the rules' outputs
        self._first, self._done = np.zeros(seqs, np.int64), np.zeros(seqs, np.int64)

    @property
    def kv_budget(self) -> int:
        return self.limits.kv_budget

    @kv_budget.setter
    def kv_budget(self, tokens: int) -> None:
        self.limits = Limits(max_num_seqs=int(self.max_num_seqs), max_num_batched_tokens=int(self.max_num_batched_tokens),
                             kv_budget=int(tokens), reserve=int(self.reserve), block_size=int(self.block_size),
                             prefix_caching=self.prefix_caching, encoder_budget=int(self.encoder_budget),
                             attention=self.attention)

    def check_fits(self) -> None:
        """Refuse a workload with a request the KV budget can never hold."""
        need = self.context + self.output + self.reserve
        worst = int(np.argmax(need)) if len(need) else 0
        require(not len(need) or need[worst] <= self.kv_budget,
                f"kv_cache_tokens {self.kv_budget} cannot hold request {worst} "
                f"({int(need[worst]) if len(need) else 0} tokens with its output); raise kv_cache_tokens")

    # -- the queues ------------------------------------------------------------
    @property
    def running(self) -> list[int]:
        """The running requests in admission order (the newest is preempted first)."""
        return self.queues.running[:self.queues.counts[RUN_LEN]].tolist()

    @property
    def waiting(self) -> list[int]:
        """The waiting requests, first come first."""
        q = self.queues
        head, length = int(q.counts[WAIT_HEAD]), int(q.counts[WAIT_LEN])
        return [int(q.waiting[(head + k) % len(q.waiting)]) for k in range(length)]

    @property
    def idle(self) -> bool:
        return not self.queues.counts[RUN_LEN] and not self.queues.counts[WAIT_LEN]

    def arrive(self, i: int) -> None:
        rules.arrive(self.queues, i)

    def held(self, ids: np.ndarray) -> np.ndarray:
        """KV tokens each request holds or will once prefilled, in whole
        blocks, besides the shared prefix blocks it uses (:func:`~simspec.serving.queues.held`)."""
        return np.array([rules.held(self.tokens, self.limits, int(i)) for i in ids], np.int64)

    def kv_used(self) -> int:
        """KV tokens the running requests hold, in whole blocks, and the cached prefixes they share."""
        return int(rules.kv_used(self.state, self.limits))

    # -- the prefix cache, read --------------------------------------------------
    @property
    def cached_prefixes(self) -> OrderedDict[int, tuple[int, int]]:
        """prefix_id -> (tokens, running requests sharing it) of each cached
        prefix, least recently used first (the order eviction follows)."""
        pre = self.state.prefixes
        cached = np.flatnonzero(pre.tokens > 0)
        order = cached[np.argsort(pre.touched[cached], kind="stable")]
        return OrderedDict((int(self._prefix_ids[e]), (int(pre.tokens[e]), int(pre.users[e]))) for e in order)

    @property
    def prefix_tokens_in_use(self) -> int:
        """KV tokens of cached prefixes some running request uses (held once)."""
        return int(self.state.prefixes.counts[IN_USE])

    @property
    def prefix_tokens_free(self) -> int:
        """KV tokens of cached prefixes no running request uses (evictable)."""
        return int(self.state.prefixes.counts[FREE])

    # -- one step's decisions ----------------------------------------------------
    def _list(self, field: str, count: int) -> list[int]:
        return getattr(self.decision, field)[:self.decision.counts[count]].tolist()

    def schedule(self, *, vllm: bool = False, mixed_prefill: bool = True) -> tuple[list[int], np.ndarray, list[int],
                                                                                 list[int], list[tuple[int, int]]]:
        """Steps 1-3 of one step (:func:`simspec.serving.queues.schedule`):
        the requests admitted, the decode batch, those preempted, those
        sent back before their prefill ran, and the (request, tokens)
        prefill chunks."""
        rules.schedule(self.state, self.limits, vllm, mixed_prefill, self.decision)
        d, n = self.decision, self.decision.counts
        chunks = list(zip(d.chunk_ids[:n[CHUNKS]].tolist(), d.takes[:n[CHUNKS]].tolist()))
        return (self._list("admitted", ADMITTED), d.decode[:n[DECODES]].copy(), self._list("preempted", PREEMPTED),
                self._list("requeued", REQUEUED), chunks)

    def admit(self, token_budget: int | None = None) -> list[int]:
        """Step 1: the requests admitted now, in order. With
        ``token_budget`` (vLLM's rule: a waiting request is admitted only
        when its first chunk is scheduled), only while the budget left by
        the running requests' rounds and prefills has room."""
        out = self.decision.admitted
        return out[:rules.admit(self.state, self.limits, token_budget is not None, token_budget or 0, out)].tolist()

    def decode_batch(self) -> tuple[np.ndarray, list[int], list[int]]:
        """Step 2: the decode batch (running requests past their prefill, in
        admission order) after preempting until its step fits; the requests
        preempted (their KV cache dropped); and those sent back to the queue
        before any of their prompt ran (admitted, never started: not a
        preemption)."""
        rules.decode_batch(self.state, self.limits, self.decision)
        return (self.decision.decode[:self.decision.counts[DECODES]].copy(), self._list("preempted", PREEMPTED),
                self._list("requeued", REQUEUED))

    def in_budget(self, decode: np.ndarray) -> np.ndarray:
        """vLLM's rule: running requests take 1 + their draft tokens from the
        step's token budget in order; those it cannot hold skip the step."""
        decode = np.asarray(decode, dtype=np.int64)
        return decode[:rules.in_budget(self.tokens, self.limits, decode, len(decode))]

    def budget_left(self, decode: np.ndarray) -> int:
        """Tokens of the step's budget ``decode``'s rounds leave for prefill chunks."""
        decode = np.asarray(decode, dtype=np.int64)
        return int(rules.budget_left(self.tokens, self.limits, decode, len(decode)))

    def prefill_chunks(self, decode: np.ndarray) -> list[tuple[int, int]]:
        """Step 3: (request, tokens) chunks FCFS in the budget ``decode``'s rounds leave."""
        decode = np.asarray(decode, dtype=np.int64)
        ids, takes = self.decision.chunk_ids, self.decision.takes
        count = rules.prefill_chunks(self.state, self.limits, decode, len(decode), ids, takes)
        return list(zip(ids[:count].tolist(), takes[:count].tolist()))

    def _chunk_arrays(self, chunks: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, int]:
        ids, takes = np.zeros(max(len(chunks), 1), np.int64), np.zeros(max(len(chunks), 1), np.int64)
        for c, (i, take) in enumerate(chunks):
            ids[c], takes[c] = i, take
        return ids, takes, len(chunks)

    def prefill(self, chunks: list[tuple[int, int]]) -> Prefill:
        """Step 4: what ``chunks`` cost the step's forward."""
        return Prefill(*(int(v) for v in rules.prefill_cost(self.state, self.limits, *self._chunk_arrays(chunks))))

    def images_reached(self, i: int, take: int) -> int:
        """Visual tokens of request ``i``'s images that its next chunk of
        ``take`` tokens encodes: under the encoder budget, those the chunk
        reaches; without, all of them in the chunk that starts its prefill."""
        done = int(self.cache[i])
        if self.encoder_budget:
            return int(images_reached(self.state.images, i, done, take))
        return int(self.visual[i] - min(self.hit[i], self.visual[i])) if done == self.hit[i] else 0

    def complete_prefill(self, chunks: list[tuple[int, int]]) -> list[int]:
        """After the step: the chunks are in the cache; the requests whose
        prefill completed sampled their next token (returned, in order)."""
        count = rules.complete_prefill(self.state, self.limits, *self._chunk_arrays(chunks), self._first)
        return self._first[:count].tolist()

    def retire(self) -> list[int]:
        """The running requests that have emitted their output, removed."""
        return self._done[:rules.retire(self.state, self._done)].tolist()


__all__ = ["Scheduler"]
