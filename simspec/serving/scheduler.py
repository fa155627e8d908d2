"""The scheduler in Python: :class:`Scheduler` (admission, preemption,
chunking; the live engine and the simulator's general path run it) and
:class:`PrefixCache` (vLLM V1's automatic prefix caching).

Imports: numpy, simspec.serving.queues (the compiled rules the Scheduler's
methods call), simspec.types. DESIGN.md "The
serving model".

The scheduler keeps, per request, the tokens in its KV cache, the tokens it
must prefill, its last round's draft tokens and its emitted tokens, as
arrays the compiled rules read and write in place. Prefix caching
(admission and the KV reservation) and vLLM's encoder budget (chunking and
pricing) extend the compiled rules here, in Python.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterator

import numpy as np

from simspec.serving.queues import (RUN_LEN, WAIT_HEAD, WAIT_LEN, Limits, Prefill, Tokens, admit, arrive, budget_left,
                                    complete_prefill, decode_batch, in_budget, kv_used, new_queues, prefill_chunks,
                                    prefill_cost, preempt, retire)
from simspec.types import require


class Scheduler:
    """Admission, preemption and chunking over requests ``0..N-1`` (module docstring).

    ``context``, ``visual`` and ``output`` are each request's prompt tokens
    (text + visual), visual tokens and output tokens; ``reserve_tokens`` is
    what a decode request may grow by in one step (1 + the deepest draft).
    """

    def __init__(self, *, context: np.ndarray, visual: np.ndarray, output: np.ndarray, max_num_seqs: int,
                 max_num_batched_tokens: int, kv_budget_tokens: int, reserve_tokens: int,
                 images: list[tuple[int, ...]] | None = None, block_size: int = 1,
                 prefixes: tuple[np.ndarray, np.ndarray] | None = None):
        """``images`` (each request's visual tokens per image, at the
        prompt's start in order): given, the vision encoder runs under
        vLLM's per-step encoder budget, max(max_num_batched_tokens, the
        largest image) (vllm/v1/core/encoder_cache_manager.py 0.33
        l.373-378): an image is encoded in the step whose chunk reaches it,
        and a chunk stops short of an image the budget cannot take
        (vllm/v1/core/sched/scheduler.py l.2018-2210). Without, a request's
        images are all encoded in the step its prefill starts.

        ``prefixes`` (each request's prefix_id and prefix_tokens, as
        Request has them): given, the engine caches prefixes (PrefixCache):
        a request admitted while its prefix's blocks are cached starts with
        them computed, and holds only the rest."""
        n = len(context)
        self.prefixes = PrefixCache(*prefixes, block_size) if prefixes is not None else None
        self.shared = np.zeros(n, np.int64)  # [N] tokens of the cache held in a shared prefix entry
        self.cached_tokens = np.zeros(n, np.int64)  # [N] prefix-cache hit when first scheduled
        self.hit = np.zeros(n, np.int64)  # [N] prefix-cache hit at the request's latest admission
        self.block_size = block_size  # KV is held in blocks of this many tokens (vLLM: 16)
        self.images = images
        if images is not None:
            largest = max((t for imgs in images for t in imgs), default=0)
            self.encoder_budget = max(max_num_batched_tokens, largest)
        self.context = np.asarray(context, dtype=np.int64)  # [N] prompt tokens, text + visual
        self.visual = np.asarray(visual, dtype=np.int64)  # [N] visual tokens
        self.output = np.asarray(output, dtype=np.int64)  # [N] tokens to generate
        self.cache = np.zeros(n, np.int64)  # [N] tokens in the KV cache
        self.target = self.context.copy()  # [N] tokens to prefill: the prompt, + what was emitted on recompute
        self.drafted = np.zeros(n, np.int64)  # [N] draft tokens of the request's last round
        self.emitted = np.zeros(n, np.int64)  # [N] tokens generated so far
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.kv_budget, self.reserve = kv_budget_tokens, reserve_tokens
        # The compiled rules' view of the same state (the rules section above).
        seqs = max(1, min(max_num_seqs, n))
        self.queues = new_queues(n, seqs)
        self.tokens = Tokens(self.context, self.visual, self.output, self.cache, self.target, self.drafted,
                             self.emitted, self.hit, self.shared)
        self.limits = Limits(int(max_num_seqs), int(max_num_batched_tokens), int(kv_budget_tokens),
                             int(reserve_tokens), int(block_size))
        self._lists = [np.zeros(seqs, np.int64) for _ in range(4)]  # the rules' outputs

    def check_fits(self) -> None:
        """Refuse a workload with a request the KV budget can never hold."""
        need = self.context + self.output + self.reserve
        worst = int(np.argmax(need)) if len(need) else 0
        require(not len(need) or need[worst] <= self.kv_budget,
                f"kv_cache_tokens {self.kv_budget} cannot hold request {worst} "
                f"({int(need[worst]) if len(need) else 0} tokens with its output); raise kv_cache_tokens")

    @property
    def running(self) -> list[int]:
        """The running requests in admission order (the newest is preempted first)."""
        return self._running().tolist()

    @property
    def waiting(self) -> list[int]:
        """The waiting requests, first come first."""
        q = self.queues
        head, length = int(q.counts[WAIT_HEAD]), int(q.counts[WAIT_LEN])
        return [int(q.waiting[(head + k) % len(q.waiting)]) for k in range(length)]

    def _running(self) -> np.ndarray:
        return self.queues.running[:self.queues.counts[RUN_LEN]]

    @property
    def idle(self) -> bool:
        return not self.queues.counts[RUN_LEN] and not self.queues.counts[WAIT_LEN]

    def arrive(self, i: int) -> None:
        arrive(self.queues, i)

    def held(self, ids: np.ndarray) -> np.ndarray:
        """KV tokens each request holds or will once prefilled, in whole
        blocks, besides the shared prefix blocks it uses (counted once, in
        :meth:`kv_used`); the compiled :func:`held`, over an array."""
        return self._blocks(np.maximum(self.cache[ids], self.target[ids]) - self.shared[ids])

    def _blocks(self, tokens):
        """``tokens`` (an int or an array) rounded up to whole KV blocks (:func:`blocks`)."""
        b = self.block_size
        return tokens if b == 1 else -(-tokens // b) * b

    @property
    def shared_in_use(self) -> int:
        """KV tokens of cached prefixes some running request uses (held once)."""
        return self.prefixes.in_use if self.prefixes is not None else 0

    def kv_used(self) -> int:
        return kv_used(self.queues, self.tokens, self.limits) + self.shared_in_use

    def admit(self, token_budget: int | None = None) -> list[int]:
        """Step 1: the requests admitted now, in order. With
        ``token_budget`` (vLLM's rule: a waiting request is admitted only
        when its first chunk is scheduled), only while the budget left by
        the running requests' rounds and prefills has room."""
        if self.prefixes is None:
            out = self._lists[0]
            return out[:admit(self.queues, self.tokens, self.limits, token_budget is not None, token_budget or 0,
                              out)].tolist()
        return self._admit_cached(token_budget)

    def _admit_cached(self, token_budget: int | None) -> list[int]:
        """:func:`admit` where prefixes are cached: a request admitted while
        its prefix's blocks are cached starts with them (the hit) and needs
        only the rest, plus the entry's room if no running request used it."""
        used, admitted = self.kv_used(), []
        left = None
        if token_budget is not None:
            ids = self._running()
            left = token_budget - int(np.maximum(self.target[ids] - self.cache[ids], 0).sum()) if len(ids) else token_budget
        q, counts = self.queues, self.queues.counts
        while counts[WAIT_LEN] and counts[RUN_LEN] < self.max_num_seqs and (left is None or left > 0):
            i = int(q.waiting[counts[WAIT_HEAD]])
            hit, extra = self.prefixes.lookup(i, int(self.target[i]))
            need = self._blocks(int(self.target[i]) + 1 - hit) + extra
            if used + need > self.kv_budget:
                break
            counts[WAIT_HEAD] = (counts[WAIT_HEAD] + 1) % len(q.waiting)
            counts[WAIT_LEN] -= 1
            q.running[counts[RUN_LEN]] = i
            counts[RUN_LEN] += 1
            admitted.append(i)
            used += need
            if hit:
                self.prefixes.use(i)
                self.cache[i] = self.shared[i] = hit
            self.hit[i] = hit
            if not self.prefixes.seen[i]:
                self.prefixes.seen[i] = True
                self.cached_tokens[i] = hit
            if left is not None:
                left -= int(self.target[i]) - hit
        self.prefixes.evict(self.kv_budget - used)
        return admitted

    def decode_batch(self) -> tuple[np.ndarray, list[int], list[int]]:
        """Step 2: the decode batch (running requests past their prefill, in
        admission order) after preempting until its step fits; the requests
        preempted (their KV cache dropped); and those sent back to the queue
        before any of their prompt ran (admitted, never started: not a
        preemption)."""
        if self.prefixes is None:
            decode, preempted, requeued = self._lists[:3]
            nd, npre, nreq = decode_batch(self.queues, self.tokens, self.limits, decode, preempted, requeued)
            return decode[:nd].copy(), preempted[:npre].tolist(), requeued[:nreq].tolist()
        preempted, requeued = [], []
        while True:  # :func:`decode_batch`, with the shared prefixes' blocks counted once
            ids = self._running()
            decoding = self.cache[ids] >= self.target[ids]
            need = int(self.held(ids).sum() + decoding.sum() * self.reserve) + self.shared_in_use
            if need <= self.kv_budget or len(ids) == 1:
                self.prefixes.evict(self.kv_budget - need)
                return ids[decoding].copy(), preempted, requeued
            i = int(ids[-1])
            self.queues.counts[RUN_LEN] -= 1
            (preempted if self.cache[i] > self.hit[i] else requeued).append(i)
            preempt(self.queues, self.tokens, i)
            self._release(i)

    def in_budget(self, decode: np.ndarray) -> np.ndarray:
        """vLLM's rule: running requests take 1 + their draft tokens from the
        step's token budget in order; those it cannot hold skip the step."""
        decode = np.asarray(decode, dtype=np.int64)
        return decode[:in_budget(self.tokens, self.limits, decode, len(decode))]

    def round_tokens(self, decode: np.ndarray) -> np.ndarray:
        """Tokens each decoding request's round takes from the step's budget: 1 + its draft tokens."""
        return 1 + self.drafted[decode]

    def budget_left(self, decode: np.ndarray) -> int:
        """Tokens of the step's budget ``decode``'s rounds leave for prefill chunks."""
        decode = np.asarray(decode, dtype=np.int64)
        return int(budget_left(self.tokens, self.limits, decode, len(decode)))

    def prefill_chunks(self, decode: np.ndarray) -> list[tuple[int, int]]:
        """Step 3: (request, tokens) chunks FCFS in the budget ``decode``'s rounds leave."""
        decode = np.asarray(decode, dtype=np.int64)
        if self.images is None:
            ids, takes = self._lists[:2]
            count = prefill_chunks(self.queues, self.tokens, self.limits, decode, len(decode), ids, takes)
            return list(zip(ids[:count].tolist(), takes[:count].tolist()))
        budget = self.budget_left(decode)
        chunks = []
        if budget <= 0 or not self.queues.counts[RUN_LEN]:
            return chunks
        encoder_left = self.encoder_budget
        ids = self._running()
        for i in ids[self.target[ids] > self.cache[ids]].tolist():  # those with prompt left, in admission order
            if budget <= 0:
                break
            take = min(int(self.target[i] - self.cache[i]), budget)
            take, encoder_left = self._encode(i, take, encoder_left)
            if take <= 0:  # stopped at an image the encoder budget cannot take: the next request may run
                continue
            chunks.append((i, take))
            budget -= take
        return chunks

    def _release(self, i: int) -> None:
        """Request ``i`` no longer uses its shared prefix's blocks (they stay cached, evictable)."""
        if self.shared[i]:
            self.prefixes.release(i)
            self.shared[i] = 0

    def _images_reached(self, i: int, take: int) -> Iterator[tuple[int, int]]:
        """(start, tokens) of request ``i``'s images that a chunk of ``take``
        tokens from its cache starts: those the chunk encodes. An image
        before the cache was encoded by an earlier chunk (a chunk never ends
        inside an image it did not encode), and a preempted request, its
        cache dropped, encodes its images again."""
        done, start = int(self.cache[i]), 0
        for tokens in self.images[i]:
            if done <= start < done + take:
                yield start, tokens
            start += tokens

    def _encode(self, i: int, take: int, encoder_left: int) -> tuple[int, int]:
        """The chunk of request ``i`` once its images are encoded, and the
        encoder budget left: cut before the first image it cannot take."""
        for start, tokens in self._images_reached(i, take):
            if tokens > encoder_left:
                return start - int(self.cache[i]), encoder_left
            encoder_left -= tokens
        return take, encoder_left

    def _chunk_arrays(self, chunks: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        ids, takes = self._lists[:2]
        for c, (i, take) in enumerate(chunks):
            ids[c], takes[c] = i, take
        return ids, takes

    def prefill(self, chunks: list[tuple[int, int]]) -> Prefill:
        """Step 4: what ``chunks`` cost the step's forward."""
        if self.images is None:
            return Prefill(*(int(v) for v in prefill_cost(self.tokens, *self._chunk_arrays(chunks), len(chunks))))
        tokens = pairs = kv = vision = longest = 0
        for i, take in chunks:  # :func:`prefill_cost`, each chunk encoding the images it reaches
            done = int(self.cache[i])
            longest = max(longest, done)
            tokens += take
            kv += done + take
            pairs += take * done + take * (take + 1) // 2  # causal: each new token sees those before it
            vision += sum(tokens for _, tokens in self._images_reached(i, take))
        return Prefill(tokens, pairs, kv, len(chunks), vision, longest)

    def complete_prefill(self, chunks: list[tuple[int, int]]) -> list[int]:
        """After the step: the chunks are in the cache; the requests whose
        prefill completed sampled their next token (returned, in order)."""
        first = self._lists[2]
        count = complete_prefill(self.tokens, *self._chunk_arrays(chunks), len(chunks), first)
        if self.prefixes is not None:
            for i, _ in chunks:
                if not self.shared[i]:
                    self.shared[i] = self.prefixes.store(i, int(self.cache[i]))
        return first[:count].tolist()

    def retire(self) -> list[int]:
        """The running requests that have emitted their output, removed."""
        out = self._lists[0]
        done = out[:retire(self.queues, self.tokens, out)].tolist()
        for i in done:
            self._release(i)
        return done


class PrefixCache:
    """Shared prefixes' KV blocks, as vLLM V1's automatic prefix caching
    keeps them (vllm/v1/core/kv_cache_manager.py, block_pool.py 0.33): a
    prefix's full blocks are cached once a request has computed them; a
    request admitted later with the same prefix starts with them computed
    (at most prompt - 1 tokens, as vLLM recomputes the last one,
    kv_cache_manager.py l.296-302) and shares them; blocks no request uses
    stay cached but are free, evicted least recently used first when the
    cache needs their room. A prefix is one entry (its blocks come and go
    together, as every user of a prefix holds all of them)."""

    def __init__(self, prefix_id: np.ndarray, prefix_tokens: np.ndarray, block_size: int):
        self.block_size = block_size
        self.prefix_id = np.asarray(prefix_id, dtype=np.int64)  # [N] -1: nothing shared
        self.blocks = np.asarray(prefix_tokens, dtype=np.int64) // block_size * block_size  # [N] full blocks' tokens
        self.entries: OrderedDict[int, list[int]] = OrderedDict()  # prefix -> [tokens, users], LRU first
        self.in_use = 0  # tokens of entries some request uses
        self.free = 0  # tokens of cached entries no request uses (evictable)
        self.seen = np.zeros(len(self.prefix_id), dtype=bool)  # [N] first scheduled already

    def lookup(self, i: int, target: int) -> tuple[int, int]:
        """(tokens request ``i`` finds cached, tokens of room the hit takes
        from free memory: an evictable entry becoming used)."""
        entry = self.entries.get(int(self.prefix_id[i]))
        if entry is None:
            return 0, 0
        hit = min(entry[0], (target - 1) // self.block_size * self.block_size)
        return (hit, entry[0] if entry[1] == 0 else 0) if hit > 0 else (0, 0)

    def use(self, i: int) -> None:
        entry = self.entries[int(self.prefix_id[i])]
        if entry[1] == 0:
            self.free -= entry[0]
            self.in_use += entry[0]
        entry[1] += 1
        self.entries.move_to_end(int(self.prefix_id[i]))

    def store(self, i: int, cached: int) -> int:
        """After request ``i``'s chunk: its prefix blocks become a cache
        entry once computed, if none holds them yet. Returns the tokens ``i``
        now shares (0: none)."""
        p, tokens = int(self.prefix_id[i]), int(self.blocks[i])
        if p < 0 or tokens == 0 or cached < tokens or p in self.entries:
            return 0
        self.entries[p] = [tokens, 1]
        self.in_use += tokens
        return tokens

    def release(self, i: int) -> None:
        p = int(self.prefix_id[i])
        entry = self.entries[p]
        entry[1] -= 1
        if entry[1] == 0:
            self.in_use -= entry[0]
            self.free += entry[0]
            self.entries.move_to_end(p)  # freed blocks join the free queue's tail: evicted last

    def evict(self, room: int) -> None:
        """Drop unused entries, least recently used first, until the cached
        free ones fit in ``room`` tokens of free memory."""
        for p in [p for p, (_, users) in self.entries.items() if users == 0]:
            if self.free <= room:
                break
            self.free -= self.entries.pop(p)[0]



__all__ = ["Scheduler", "PrefixCache"]
