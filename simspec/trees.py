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
never grows with depth, so the kept set is a tree.

The loops run under numba: a simulated hour of serving plans and accepts
some 300,000 steps, and these small per-step loops would dominate in numpy.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simspec.compiled import jit
from simspec.types import MAX_RANK, PLAN_LINEAR, PLAN_TREE, RANK_BITS

_DEPTH_TIEBREAK = 1e-9  # prefer the parent when a child ties its value


# -- one node's code: the rank-path arithmetic, written once -------------------

@jit
def depth(code: int) -> int:
    """Depth of a node (0 for the root, the pending token)."""
    d = 0
    while code > 0:
        code >>= RANK_BITS
        d += 1
    return d


_depth_of = depth  # for functions whose own ``depth`` is the expansion's


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
    bufs = _ExpandBuffers(np.empty(topk, dtype=np.int64), np.empty(topk), np.empty(topk * topk, dtype=np.int64),
                          np.empty(topk * topk), np.empty(topk, dtype=np.int64), np.empty(topk * topk))
    for i in range(b):
        _expand_row(logc[i], depth, topk, codes[i], values[i], bufs)
    return codes, values, depths


class _ExpandBuffers(NamedTuple):
    front_code: np.ndarray  # [topk] int the frontier's codes
    front_val: np.ndarray  # [topk] float their log path confidences
    child_code: np.ndarray  # [topk**2] int the frontier's children
    child_val: np.ndarray  # [topk**2] float
    best: np.ndarray  # [topk] int
    scratch: np.ndarray  # [topk**2] float


@jit
def _expand_row(logc: np.ndarray, depth: int, topk: int, codes: np.ndarray, values: np.ndarray,
                bufs: _ExpandBuffers) -> None:
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
def eagle_tree(conf: np.ndarray, depth: int, topk: int, budget: int) -> np.ndarray:
    """EAGLE-2's dynamic tree: the ``budget`` best nodes of the expansion by
    path confidence (parents win ties, so each row is parent-closed):
    [B, min(budget, M)] codes, unordered.

    Only nodes that can make the budget are exponentiated (exp is most of
    the work): every node whose log confidence is under the budget-th
    largest one's, by more than the depth tie-break and rounding allow,
    ranks below the budget-th node, so leaving it out changes nothing.

    A row whose confidences fall with rank at every depth (the drafter's
    own order, as the acceptance model draws them) is not expanded at all
    (:func:`_sorted_row`): its frontiers and the budget-th log confidence
    are merged from the sorted sibling lists, and the nodes above the
    floor are read off as a prefix of each list, in the expansion's own
    order. Any other row is expanded whole (:func:`_full_row`). Both pick
    the same nodes in the same order, float for float."""
    b = conf.shape[0]
    m = topk + (depth - 1) * topk * topk
    keep = min(budget, m)
    out = np.empty((b, keep), dtype=np.int64)
    logc = log_confidences(conf, depth, topk)  # [B, depth, topk]
    expand = _ExpandBuffers(np.empty(topk, dtype=np.int64), np.empty(topk), np.empty(topk * topk, dtype=np.int64),
                            np.empty(topk * topk), np.empty(topk, dtype=np.int64), np.empty(topk * topk))
    fronts = _Fronts(np.empty((depth, topk), dtype=np.int64), np.empty((depth, topk)),
                     np.empty((depth, topk), dtype=np.int64), np.empty((depth, topk)),
                     np.empty((depth, topk), dtype=np.int64), np.empty((depth, topk)), np.empty(depth, dtype=np.int64),
                     np.empty(depth, dtype=np.int64), np.empty((1, depth)))
    picked = _Picked(np.empty(m), np.empty(m, dtype=np.int64), np.empty(keep, dtype=np.int64), np.empty(2 * m))
    row_codes = np.empty(m, dtype=np.int64)
    row_logs = np.empty(m)
    for i in range(b):
        if keep < m and _sorted_row(logc[i]):
            _merged_row(logc[i], depth, topk, keep, fronts, picked, out[i])
        else:
            _expand_row(logc[i], depth, topk, row_codes, row_logs, expand)
            _full_row(row_codes, row_logs, depth, topk, keep, picked, out[i])
    return out


class _Fronts(NamedTuple):
    """A sorted row's levels as sorted streams: each level's frontier, and the
    merge of its sibling lists that yields the level's nodes best first."""

    code: np.ndarray  # [depth, topk] int the frontier's codes at each level (0-based)
    value: np.ndarray  # [depth, topk] float their log path confidences, in top_into's order
    index: np.ndarray  # [depth, topk] int their index among the level's children (parent position * topk + rank - 1)
    best_first: np.ndarray  # [depth, topk] float the frontier's log values as picked: the level's best, in order
    heads: np.ndarray  # [depth, topk] int each sibling list's next rank - 1 in the level's merge
    head_value: np.ndarray  # [depth, topk] float that node's log value, -inf once the list is spent
    top: np.ndarray  # [depth] int the list holding the level's next node (the first of the best)
    taken: np.ndarray  # [depth] int nodes of the level the budget's search has taken
    ahead: np.ndarray  # [1, depth] float the level's next value in that search


class _Picked(NamedTuple):
    """The nodes above the floor, in expansion order, and the budget's pick among them."""

    key: np.ndarray  # [M] float path confidence less the depth tie-break
    code: np.ndarray  # [M] int
    best: np.ndarray  # [keep] int
    scratch: np.ndarray  # [2M] float (a band's keys, then kth_largest's own scratch)


@jit
def _floor(kth_log: float, depth: int) -> float:
    """The log confidence under which no node can make the budget, from the
    budget-th largest log confidence: nodes that make it have log value >=
    kth, so key >= exp(kth) - tiebreak * depth, and the budget-th key is at
    least that (less a margin far above exp's and the subtraction's rounding)."""
    least = np.exp(kth_log) - _DEPTH_TIEBREAK * depth
    least = least * (1.0 - 1e-9) - 1e-12
    return np.log(least) - 1e-9 if least > 0 else -np.inf


@jit
def _ceiling(kth_log: float, depth: int) -> float:
    """The log confidence over which a node outranks every node whose log
    value is at most the budget-th largest ``kth_log``: its key exceeds
    exp(kth) + tiebreak x depth - tiebreak x depth, theirs is at most
    exp(kth) - tiebreak (with a margin far above exp's and the rounding)."""
    most = (np.exp(kth_log) + _DEPTH_TIEBREAK * depth) * (1.0 + 1e-9) + 1e-12
    return np.log(most) + 1e-9


@jit
def _full_row(codes: np.ndarray, logs: np.ndarray, depth: int, topk: int, keep: int, picked: _Picked,
              out: np.ndarray) -> None:
    """The budget's pick of one expanded row (codes, log values [M], in expansion order)."""
    m = len(codes)
    floor = _floor(kth_largest(logs, keep, picked.scratch), depth) if keep < m else -np.inf
    n = 0
    for j in range(m):
        if logs[j] >= floor:
            level = 1 if j < topk else 2 + (j - topk) // (topk * topk)
            picked.key[n] = np.exp(logs[j]) - _DEPTH_TIEBREAK * level
            picked.code[n] = codes[j]
            n += 1
    top_into(picked.key[:n], keep, picked.best, picked.scratch)
    for j in range(keep):
        out[j] = picked.code[picked.best[j]]


@jit
def _sorted_row(logc: np.ndarray) -> bool:
    """Whether every level's log confidences [depth, topk] are <= 0 and never
    rise with rank: then a node's children and younger siblings never
    outrank it, and every list of siblings is sorted (float sums keep the
    order of their terms)."""
    for d in range(logc.shape[0]):
        previous = 0.0
        for r in range(logc.shape[1]):
            if not logc[d, r] <= previous:  # NaN fails too
                return False
            previous = logc[d, r]
    return True


@jit
def _first_max(values: np.ndarray, row: int, n: int) -> int:
    """The index of the largest of ``values[row, :n]``, the first on ties;
    written as selects, so the compiled loop has no branch to mispredict
    (and given the row, not a view of it, which would cost a reference count)."""
    top = 0
    best = values[row, 0]
    for f in range(1, n):
        v = values[row, f]
        better = v > best
        top = f if better else top
        best = v if better else best
    return top


@jit
def _merged_row(logc: np.ndarray, depth: int, topk: int, keep: int, fronts: _Fronts, picked: _Picked,
                out: np.ndarray) -> None:
    """:func:`_full_row`'s pick for a sorted row, without expanding it.

    Level d >= 1's nodes are the sibling lists of level d - 1's frontier,
    each sorted (value_of[d - 1, f] + logc[d, r] falls with r), so merging
    the lists yields the level best first: the frontier is the merge's
    first ``topk`` nodes, and the budget-th largest log value overall is
    found by merging the levels' streams."""
    # the buffers as locals: a tuple field read in a loop costs numba a reference count each time
    code, value_of, index_of = fronts.code, fronts.value, fronts.index
    best_first, heads, head_value = fronts.best_first, fronts.heads, fronts.head_value
    top, taken, ahead = fronts.top, fronts.taken, fronts.ahead
    key, picked_code = picked.key, picked.code
    # Frontiers: level 0 is every rank; level d the topk best of the previous
    # frontier's children by (value, lowest index), in top_into's order.
    for r in range(topk):
        code[0, r] = r + 1
        value_of[0, r] = logc[0, r]
        best_first[0, r] = logc[0, r]
        index_of[0, r] = r
    for d in range(1, depth):
        for f in range(topk):
            heads[d, f] = 0
            head_value[d, f] = value_of[d - 1, f] + logc[d, 0]
        top[d] = _first_max(head_value, d, topk)
        if d == depth - 1:
            break  # the last level has no frontier
        for t in range(topk):
            f = top[d]
            r = heads[d, f]
            index_of[d, t] = f * topk + r
            value_of[d, t] = best_first[d, t] = head_value[d, f]
            code[d, t] = code[d - 1, f] + (np.int64(r + 1) << (RANK_BITS * d))
            heads[d, f] = r + 1  # the list's next node (written out: a call's arrays cost more than this)
            head_value[d, f] = value_of[d - 1, f] + logc[d, r + 1] if r + 1 < topk else -np.inf
            top[d] = _first_max(head_value, d, topk)
        _order_front(code, value_of, index_of, d, topk, best_first[d, topk - 1])

    # The budget-th largest log value: merge the levels, each best first
    # (its frontier as picked, then the rest of its merge). ahead[0, d] is
    # level d's next value, -inf once the level is spent.
    for d in range(depth):
        if 0 < d == depth - 1:  # the last level (past 0) has no frontier: it starts in its merge
            taken[d] = topk
            ahead[0, d] = head_value[d, top[d]]
        else:
            taken[d] = 0
            ahead[0, d] = best_first[d, 0]
    kth_log = 0.0
    for _ in range(keep):
        level = _first_max(ahead, 0, depth)
        kth_log = ahead[0, level]
        if taken[level] >= topk:  # the value came from the level's merge: its list moves on, as above
            f = top[level]
            r = heads[level, f] + 1
            heads[level, f] = r
            head_value[level, f] = value_of[level - 1, f] + logc[level, r] if r < topk else -np.inf
            top[level] = _first_max(head_value, level, topk)
        taken[level] += 1
        if taken[level] < topk:
            ahead[0, level] = best_first[level, taken[level]]
        else:
            ahead[0, level] = head_value[level, top[level]] if level > 0 else -np.inf

    # The nodes above the floor, in expansion order: a prefix of each sibling list.
    floor = _floor(kth_log, depth)
    n = 0
    for r in range(topk):
        if not logc[0, r] >= floor:
            break
        key[n] = logc[0, r]
        picked_code[n] = r + 1
        n += 1
    for d in range(1, depth):
        for f in range(topk):
            for r in range(topk):
                value = value_of[d - 1, f] + logc[d, r]
                if not value >= floor:
                    break
                key[n] = value
                picked_code[n] = code[d - 1, f] + (np.int64(r + 1) << (RANK_BITS * d))
                n += 1
    if n == keep:  # no node near the budget-th: all of them, in expansion order, as top_into gives k >= n
        for j in range(keep):
            out[j] = picked_code[j]
        return
    # Nodes above the ceiling outrank every node at or under the budget-th
    # log value, so they are in and ahead of the budget-th key (fewer of them
    # than the budget: only nodes above kth_log can be); the band between
    # floor and ceiling is ranked by _full_row's keys (exp only there).
    ceiling = _ceiling(kth_log, depth)
    above, band = 0, 0
    scratch = picked.scratch
    for j in range(n):
        if key[j] > ceiling:
            above += 1
        else:
            scratch[band] = np.exp(key[j]) - _DEPTH_TIEBREAK * _depth_of(picked_code[j])
            band += 1
    kth_key = kth_largest(scratch[:band], keep - above, scratch[band:])
    m, b = 0, 0  # top_into's order: keys above the budget-th in expansion order, then its ties
    for j in range(n):
        if key[j] > ceiling:
            out[m] = picked_code[j]
            m += 1
        else:
            if scratch[b] > kth_key:
                out[m] = picked_code[j]
                m += 1
            b += 1
    b = 0
    for j in range(n):
        if m == keep:
            break
        if not key[j] > ceiling:
            if scratch[b] == kth_key:
                out[m] = picked_code[j]
                m += 1
            b += 1


@jit
def _order_front(code: np.ndarray, value: np.ndarray, index: np.ndarray, d: int, topk: int, kth: float) -> None:
    """Put level ``d``'s frontier (row d of each [depth, topk] array), picked
    best first, in top_into's order: the values above the k-th by index,
    then its ties by index (picked so already). Given the row, not views of
    it: a view costs a reference count."""
    above = 0
    while above < topk and value[d, above] > kth:
        above += 1
    for t in range(1, above):  # insertion sort by index
        moved_index, moved_value, moved_code = index[d, t], value[d, t], code[d, t]
        u = t
        while u > 0 and index[d, u - 1] > moved_index:
            index[d, u], value[d, u], code[d, u] = index[d, u - 1], value[d, u - 1], code[d, u - 1]
            u -= 1
        index[d, u], value[d, u], code[d, u] = moved_index, moved_value, moved_code


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
                keys[n] = -(values[i, j] - _DEPTH_TIEBREAK * depths[i, j])
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
    deepest = np.zeros(b, dtype=np.int64)
    chain = np.ones(b, dtype=np.bool_)
    fill = np.zeros(b, dtype=np.int64)
    for t in range(len(rows)):
        i = rows[t]
        out[i, fill[i]] = codes[t]
        fill[i] += 1
        if not on_chain(codes[t]):
            chain[i] = False
        deepest[i] = max(deepest[i], depth(codes[t]))
    kind = np.zeros(b, dtype=np.int8)
    for i in range(b):
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
