"""Two of vLLM's scheduling rules, compiled, that the queue rules
(simspec.serving.queues) consult: automatic prefix caching
(:class:`Prefixes`) and the vision encoder's per-step budget
(:class:`Images`).

Imports: numpy, simspec.compiled (numba). DESIGN.md "The serving model".

**Prefix caching**, as vLLM V1 keeps shared prefixes' KV blocks
(vllm/v1/core/kv_cache_manager.py, block_pool.py 0.33): a prefix's full
blocks are cached once a request has computed them; a request admitted
later with the same prefix starts with them computed (at most prompt - 1
tokens, as vLLM recomputes the last one, kv_cache_manager.py l.296-302)
and shares them; blocks no request uses stay cached but are free, evicted
least recently used first when the cache needs their room. A prefix is one
entry (its blocks come and go together, as every user of a prefix holds
all of them).

**The encoder budget**: with images, vision encoding runs under vLLM's
per-step budget, max(max_num_batched_tokens, the largest image)
(vllm/v1/core/encoder_cache_manager.py 0.33 l.373-378): an image is
encoded in the step whose chunk reaches it, and a chunk stops short of an
image the budget cannot take (vllm/v1/core/sched/scheduler.py
l.2018-2210).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simspec.compiled import jit


class Prefixes(NamedTuple):
    """The prefix cache, updated in place: per request [N], per entry [P]
    (one entry per distinct prefix). With prefix caching off, every array
    is empty but ``counts``."""

    entry: np.ndarray  # [N] int the request's prefix entry (-1: it shares nothing)
    blocks: np.ndarray  # [N] int tokens of its prefix's full blocks
    seen: np.ndarray  # [N] bool scheduled once already
    cached_tokens: np.ndarray  # [N] int the hit when it was first scheduled
    tokens: np.ndarray  # [P] int tokens the entry holds (0: not cached)
    users: np.ndarray  # [P] int running requests sharing it (0: cached, free, evictable)
    touched: np.ndarray  # [P] int when it was last used or freed (its place in the LRU order)
    counts: np.ndarray  # [3] int: IN_USE, FREE, CLOCK


IN_USE, FREE, CLOCK = range(3)  # tokens of entries in use; of cached free entries; the LRU clock


def new_prefixes(prefix_id: np.ndarray | None, prefix_tokens: np.ndarray | None, n: int,
                 block_size: int) -> tuple[Prefixes, np.ndarray]:
    """The cache for requests with these prefix ids (-1: none) and prefix
    lengths, and the prefix id of each entry; ``None``: prefix caching off."""
    if prefix_id is None:
        none = np.zeros(0, np.int64)
        return Prefixes(none, none, np.zeros(0, np.bool_), np.zeros(n, np.int64), none, none, none,
                        np.zeros(3, np.int64)), none
    prefix_id = np.asarray(prefix_id, dtype=np.int64)
    ids, entry = np.unique(prefix_id[prefix_id >= 0], return_inverse=True)
    dense = np.full(len(prefix_id), -1, np.int64)
    dense[prefix_id >= 0] = entry
    p = len(ids)
    blocks = np.asarray(prefix_tokens, dtype=np.int64) // block_size * block_size
    return Prefixes(dense, blocks, np.zeros(n, np.bool_), np.zeros(n, np.int64), np.zeros(p, np.int64),
                    np.zeros(p, np.int64), np.zeros(p, np.int64), np.zeros(3, np.int64)), ids


@jit
def _touch(pre: Prefixes, e: int) -> None:
    pre.counts[CLOCK] += 1
    pre.touched[e] = pre.counts[CLOCK]


@jit
def lookup(pre: Prefixes, block_size: int, i: int, target: int) -> tuple[int, int]:
    """(tokens request ``i`` finds cached, tokens of room the hit takes from
    free memory: an evictable entry becoming used)."""
    e = pre.entry[i]
    if e < 0 or pre.tokens[e] == 0:
        return 0, 0
    hit = min(pre.tokens[e], (target - 1) // block_size * block_size)
    if hit <= 0:
        return 0, 0
    return hit, pre.tokens[e] if pre.users[e] == 0 else 0


@jit
def use(pre: Prefixes, i: int) -> None:
    """Request ``i`` shares its prefix's cached entry."""
    e = pre.entry[i]
    if pre.users[e] == 0:
        pre.counts[FREE] -= pre.tokens[e]
        pre.counts[IN_USE] += pre.tokens[e]
    pre.users[e] += 1
    _touch(pre, e)


@jit
def store(pre: Prefixes, i: int, cached: int) -> int:
    """After request ``i``'s chunk, ``cached`` tokens in its cache: its
    prefix blocks become an entry once computed, if none holds them yet.
    Returns the tokens ``i`` now shares (0: none)."""
    e = pre.entry[i]
    if e < 0 or pre.blocks[i] == 0 or cached < pre.blocks[i] or pre.tokens[e] > 0:
        return 0
    pre.tokens[e] = pre.blocks[i]
    pre.users[e] = 1
    pre.counts[IN_USE] += pre.blocks[i]
    _touch(pre, e)
    return pre.blocks[i]


@jit
def release(pre: Prefixes, i: int) -> None:
    """Request ``i`` no longer uses its entry; unused, the entry stays cached
    and joins the free blocks' tail (evicted last)."""
    e = pre.entry[i]
    pre.users[e] -= 1
    if pre.users[e] == 0:
        pre.counts[IN_USE] -= pre.tokens[e]
        pre.counts[FREE] += pre.tokens[e]
        _touch(pre, e)


@jit
def evict(pre: Prefixes, room: int) -> None:
    """Drop unused entries, least recently used first, until the cached
    free ones fit in ``room`` tokens of free memory."""
    while pre.counts[FREE] > room:
        oldest = -1
        for e in range(len(pre.tokens)):
            if pre.tokens[e] > 0 and pre.users[e] == 0 and (oldest < 0 or pre.touched[e] < pre.touched[oldest]):
                oldest = e
        if oldest < 0:
            return
        pre.counts[FREE] -= pre.tokens[oldest]
        pre.tokens[oldest] = 0


class Images(NamedTuple):
    """Each request's images, in prompt order at its start: request ``i``'s
    are ``tokens[first[i]:first[i + 1]]`` (visual tokens each)."""

    first: np.ndarray  # [N + 1] int
    tokens: np.ndarray  # [M] int


def new_images(images: list[tuple[int, ...]] | None, n: int) -> Images:
    """``None``: no encoder budget (the record is empty)."""
    if images is None:
        return Images(np.zeros(n + 1, np.int64), np.zeros(0, np.int64))
    sizes = np.array([len(imgs) for imgs in images], np.int64)
    first = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    tokens = np.array([t for imgs in images for t in imgs], np.int64)
    return Images(first, tokens)


@jit
def images_reached(img: Images, i: int, done: int, take: int) -> int:
    """Visual tokens of request ``i``'s images that a chunk of ``take``
    tokens after ``done`` cached ones starts: those the chunk encodes. An
    image before the cache was encoded by an earlier chunk (a chunk never
    ends inside an image it did not encode), and a preempted request, its
    cache dropped, encodes its images again."""
    start = vision = 0
    for k in range(img.first[i], img.first[i + 1]):
        if done <= start < done + take:
            vision += img.tokens[k]
        start += img.tokens[k]
    return vision


@jit
def encode_cut(img: Images, i: int, done: int, take: int, encoder_left: int) -> tuple[int, int]:
    """The chunk of request ``i`` once its images are encoded, and the
    encoder budget left: cut before the first image it cannot take."""
    start = 0
    for k in range(img.first[i], img.first[i + 1]):
        tokens = img.tokens[k]
        if done <= start < done + take:
            if tokens > encoder_left:
                return start - done, encoder_left
            encoder_left -= tokens
        start += tokens
    return take, encoder_left


__all__ = ["Prefixes", "IN_USE", "FREE", "CLOCK", "new_prefixes", "lookup", "use", "store", "release", "evict",
           "Images", "new_images", "images_reached", "encode_cut"]
