"""Draft-tree geometry on rank-path codes, vectorised over a batch.

Imports: numpy, simspec.compiled (numba) and simspec.types. Shared by the acceptance model (to
fit presets under a published draft setting), the policies (to build plans)
and the serving model (to accept). A node is named by the ranks of its
tokens among the drafter's candidates along its root path; ``code`` packs
them 4 bits a depth, depth 1 lowest (types.py glossary). Linear drafts are
the rank-1 chain; a tree is any parent-closed set of codes.

EAGLE-2's dynamic tree (Li et al. 2024, sec. 4): expand depth by depth, each
level growing the ``topk`` best frontier nodes (by path confidence, the
product of confidences along the path) into ``topk`` children each; then
rerank every generated node and keep the ``budget`` best. Path confidence
never grows with depth, so the kept set is a tree (simspec.trees.eagle).

The loops run under numba: a simulated hour of serving plans and accepts
some 300,000 steps, and these small per-step loops would dominate in numpy.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simspec.compiled import jit
from simspec.types import MAX_RANK, PLAN_LINEAR, PLAN_TREE, RANK_BITS

DEPTH_TIEBREAK = 1e-9  # prefer the parent when a child ties its value


# -- one node's code: the rank-path arithmetic, written once -------------------

@jit
def depth(code: int) -> int:
    """Depth of a node (0 for the root, the pending token)."""
    d = 0
    while code > 0:
        code >>= RANK_BITS
        d += 1
    return d


@jit
def parent(code: int) -> int:
    """The node's parent: its code with its own depth's rank cleared (the root's is 0)."""
    d = depth(code)
    return code & ((np.int64(1) << (RANK_BITS * (d - 1))) - 1) if d > 0 else 0


@jit
def rank(code: int) -> int:
    """The node's rank among its parent's candidates (1..MAX_RANK; 0 for the root)."""
    d = depth(code)
    return (code >> (RANK_BITS * (d - 1))) & MAX_RANK if d > 0 else 0


@jit
def child(code: int, r: int) -> int:
    """The node's rank-``r`` child."""
    return child_at(code, depth(code), r)


@jit
def child_at(code: int, d: int, r: int) -> int:
    """:func:`child` of a node known to be at depth ``d`` (no depth count)."""
    return code + (np.int64(r) << (RANK_BITS * d))


@jit
def next_sibling(code: int, d: int) -> int:
    """The depth-``d`` node's sibling one rank lower (rank + 1, which must
    stay <= MAX_RANK): ``child(parent(code), rank(code) + 1)``."""
    return code + (np.int64(1) << (RANK_BITS * (d - 1)))


@jit
def on_chain(code: int) -> bool:
    """Whether every rank on the node's path is 1 (the rank-1 chain of a linear draft)."""
    while code > 0:
        if (code & MAX_RANK) != 1:
            return False
        code >>= RANK_BITS
    return True


def chain_codes(k: int) -> np.ndarray:
    """Codes of the rank-1 chain of depths 1..k: [k] int64."""
    depth = np.arange(k, dtype=np.int64)
    return np.cumsum(np.int64(1) << (RANK_BITS * depth))


def path_codes(ranks: np.ndarray) -> np.ndarray:
    """Codes of every prefix of rank paths: ranks [B, D] (0 = none) -> [B, D].

    A prefix that passes through rank 0 gets code -1 (it names no node)."""
    ranks = np.asarray(ranks, dtype=np.int64)
    shifts = RANK_BITS * np.arange(ranks.shape[-1], dtype=np.int64)
    codes = np.cumsum(ranks << shifts, axis=-1)
    broken = np.cumsum(ranks == 0, axis=-1) > 0
    return np.where(broken, -1, codes)


@jit
def accepted_length(plan_codes: np.ndarray, true_ranks: np.ndarray) -> np.ndarray:
    """Accepted draft tokens per request: the depth of the deepest node on the
    target's own path that the plan holds (greedy, lossless verification).

    plan_codes: [B, M] int64, -1 unused; true_ranks: [B, D] int (0 = the
    target's token is none of the drafter's candidates)."""
    b, m = plan_codes.shape
    out = np.zeros(b, dtype=np.int64)
    for i in range(b):
        code = np.int64(0)
        for d in range(true_ranks.shape[1]):
            r = true_ranks[i, d]
            if r == 0:
                break
            code += np.int64(r) << (RANK_BITS * d)
            held = False
            for j in range(m):
                if plan_codes[i, j] == code:
                    held = True
                    break
            if not held:
                break
            out[i] = d + 1
    return out


@jit
def expand_paths(conf: np.ndarray, depth: int, topk: int):
    """Compiled :func:`expand` (callable from other compiled code)."""
    codes, log_values, depths = expand_log(conf, depth, topk)
    return codes, np.exp(log_values), depths


@jit
def log_confidences(conf: np.ndarray, depth: int, topk: int) -> np.ndarray:
    """[B, depth, topk] log drafter confidences as the expansion reads them
    (floored at 1e-30): one home, so every path sums the same floats."""
    return np.log(np.maximum(conf[:, :depth, :topk], 1e-30))


@jit
def expand_log(conf: np.ndarray, depth: int, topk: int):
    """:func:`expand_paths` with each node's log path confidence (the
    expansion's own arithmetic; exponentiating is left to the caller)."""
    b = conf.shape[0]
    m = topk + (depth - 1) * topk * topk
    codes = np.empty((b, m), dtype=np.int64)
    values = np.empty((b, m))
    depths = np.empty(m, dtype=np.int64)
    depths[:topk] = 1
    for d in range(1, depth):
        depths[topk + (d - 1) * topk * topk: topk + d * topk * topk] = d + 1
    logc = log_confidences(conf, depth, topk)
    bufs = ExpandBuffers(np.empty(topk, dtype=np.int64), np.empty(topk), np.empty(topk * topk, dtype=np.int64),
                          np.empty(topk * topk), np.empty(topk, dtype=np.int64), np.empty(topk * topk))
    for i in range(b):
        expand_row(logc[i], depth, topk, codes[i], values[i], bufs)
    return codes, values, depths


class ExpandBuffers(NamedTuple):
    front_code: np.ndarray  # [topk] int the frontier's codes
    front_val: np.ndarray  # [topk] float their log path confidences
    child_code: np.ndarray  # [topk**2] int the frontier's children
    child_val: np.ndarray  # [topk**2] float
    best: np.ndarray  # [topk] int
    scratch: np.ndarray  # [topk**2] float


@jit
def expand_row(logc: np.ndarray, depth: int, topk: int, codes: np.ndarray, values: np.ndarray,
                bufs: ExpandBuffers) -> None:
    """One request's expansion (logc [depth, topk]) into codes and log values [M]."""
    front_code, front_val, child_code, child_val = bufs.front_code, bufs.front_val, bufs.child_code, bufs.child_val
    for r in range(topk):
        front_code[r] = r + 1
        front_val[r] = logc[0, r]
        codes[r] = r + 1
        values[r] = front_val[r]
    at = topk
    for d in range(1, depth):
        shift = RANK_BITS * d
        for f in range(topk):
            for r in range(topk):
                child_code[f * topk + r] = front_code[f] + (np.int64(r + 1) << shift)
                child_val[f * topk + r] = front_val[f] + logc[d, r]
        codes[at: at + topk * topk] = child_code
        values[at: at + topk * topk] = child_val
        at += topk * topk
        top_into(child_val, topk, bufs.best, bufs.scratch)
        for f in range(topk):
            front_code[f] = child_code[bufs.best[f]]
            front_val[f] = child_val[bufs.best[f]]


@jit
def kth_largest(key: np.ndarray, k: int, scratch: np.ndarray) -> float:
    """The ``k``-th largest of ``key`` (1 <= k <= len(key)): quickselect
    on ``scratch`` (at least as long as ``key``; overwritten), without the
    copy and the general machinery of ``np.partition`` (the same value)."""
    n = len(key)
    for j in range(n):
        scratch[j] = key[j]
    target = n - k  # its index in ascending order
    lo, hi = 0, n - 1
    while lo < hi:
        a, b, c = scratch[lo], scratch[(lo + hi) >> 1], scratch[hi]
        pivot = max(min(a, b), min(max(a, b), c))  # median of three
        i, j = lo, hi
        while i <= j:
            while i < hi and scratch[i] < pivot:
                i += 1
            while j > lo and scratch[j] > pivot:
                j -= 1
            if i <= j:
                scratch[i], scratch[j] = scratch[j], scratch[i]
                i += 1
                j -= 1
        if target <= j:
            hi = j
        elif target >= i:
            lo = i
        else:
            break  # between j and i every value equals the pivot
    return scratch[target]


@jit
def top_into(key: np.ndarray, k: int, out: np.ndarray, scratch: np.ndarray) -> None:
    """Indices of the ``k`` largest keys into ``out[:k]`` (ties: lowest
    index first), in linear time: a quickselect finds the k-th largest, one
    pass collects; ``scratch`` as :func:`kth_largest`'s."""
    n = len(key)
    if k >= n:
        for j in range(n):
            out[j] = j
        return
    kth = kth_largest(key, k, scratch)
    m = 0
    for j in range(n):  # strictly larger first, then ties in index order
        if key[j] > kth:
            out[m] = j
            m += 1
    for j in range(n):
        if m == k:
            break
        if key[j] == kth:
            out[m] = j
            m += 1


@jit
def top_indices(key: np.ndarray, k: int) -> np.ndarray:
    """:func:`top_into` into a fresh array: [min(k, len(key))] int64."""
    out = np.empty(min(k, len(key)), dtype=np.int64)
    top_into(key, k, out, np.empty(len(key)))
    return out


def expand(conf: np.ndarray, depth: int, topk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """EAGLE-2 expansion: every node the drafter generates, with its path
    confidence.

    conf: [B, D, R] drafter confidence of the rank-r candidate at depth d
    (D >= depth, R >= topk). Returns codes [B, M], path confidence [B, M]
    (unsorted) and the depth of each column [M],
    M = topk + (depth - 1) * topk**2.
    """
    return expand_paths(conf, depth, topk)


@jit
def ranked_candidates(values: np.ndarray, codes: np.ndarray, depths: np.ndarray, remaining: np.ndarray,
                      floor: float, max_nodes: int):
    """Candidate nodes of the whole batch, best value first (parents before
    tied children): rows, codes, values and depths, at most ``max_nodes``,
    dropping values <= ``floor`` and nodes past a request's last token."""
    b, m = values.shape
    n = 0
    rows = np.empty(b * m, dtype=np.int64)
    cols = np.empty(b * m, dtype=np.int64)
    keys = np.empty(b * m)
    for i in range(b):
        for j in range(m):
            if values[i, j] > floor and depths[i, j] < remaining[i]:
                rows[n] = i
                cols[n] = j
                keys[n] = -(values[i, j] - DEPTH_TIEBREAK * depths[i, j])
                n += 1
    order = np.argsort(keys[:n], kind="mergesort")[:max_nodes]
    k = len(order)
    out_rows = np.empty(k, dtype=np.int64)
    out_codes = np.empty(k, dtype=np.int64)
    out_values = np.empty(k)
    out_depths = np.empty(k, dtype=np.int64)
    for t in range(k):
        i, j = rows[order[t]], cols[order[t]]
        out_rows[t], out_codes[t], out_values[t], out_depths[t] = i, codes[i, j], values[i, j], depths[i, j]
    return out_rows, out_codes, out_values, out_depths


@jit
def pack_rows(rows: np.ndarray, codes: np.ndarray, b: int):
    """Scatter (row, code) pairs into a -1 padded [B, M] matrix, with each
    row's node count, depth and plan kind (types.PLAN_AR, PLAN_LINEAR: a
    rank-1 chain, PLAN_TREE)."""
    counts = np.zeros(b, dtype=np.int64)
    for t in range(len(rows)):
        counts[rows[t]] += 1
    width = counts.max() if b else 0
    out = np.full((b, width), -1, dtype=np.int64)
    deepest = np.zeros(b, dtype=np.int64)  # the row's largest code, then its depth
    chain = np.ones(b, dtype=np.bool_)
    fill = np.zeros(b, dtype=np.int64)
    for t in range(len(rows)):
        i = rows[t]
        out[i, fill[i]] = codes[t]
        fill[i] += 1
        if chain[i] and not on_chain(codes[t]):
            chain[i] = False
        deepest[i] = max(deepest[i], codes[t])  # a deeper node's code is larger (pack_full_rows)
    kind = np.zeros(b, dtype=np.int8)
    for i in range(b):
        deepest[i] = depth(deepest[i])
        kind[i] = _row_kind(counts[i], deepest[i], chain[i])
    return out, counts, deepest, kind


@jit
def pack_full_rows(codes: np.ndarray):
    """:func:`pack_rows` of rows that are already a matrix, each row
    ``codes.shape[1]`` parent-closed codes (eagle_tree's): the codes as they
    are, no scatter. A row's deepest node is its largest code (a deeper node
    has a rank field above every shallower node's), and only a row whose
    node count is its depth can be a chain, so the ranks are walked only there."""
    b, keep = codes.shape
    counts = np.full(b, keep, dtype=np.int64)
    deepest = np.zeros(b, dtype=np.int64)
    kind = np.zeros(b, dtype=np.int8)
    if keep == 0:
        return codes, counts, deepest, kind
    for i in range(b):
        deepest[i] = depth(codes[i].max())
        chain = deepest[i] == keep
        for j in range(keep if chain else 0):
            chain = chain and on_chain(codes[i, j])
        kind[i] = _row_kind(keep, deepest[i], chain)
    return codes, counts, deepest, kind


@jit
def _row_kind(count: int, deepest: int, chain: bool) -> int:
    """A packed row's plan kind: none, a rank-1 chain (every node on it, one a depth) or a tree."""
    if count == 0:
        return 0
    return PLAN_LINEAR if chain and count == deepest else PLAN_TREE


# EAGLE-2's dynamic tree, built on the expansion and selection above (its own module for length).
from simspec.trees.eagle import eagle_tree  # noqa: E402
