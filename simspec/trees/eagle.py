"""EAGLE-2's dynamic tree (Li et al. 2024, sec. 4): expand depth by depth,
each level growing the ``topk`` best frontier nodes by path confidence
into ``topk`` children each, then keep the ``budget`` best of every node
generated. A row whose confidences fall with rank (as the acceptance model
draws them) is merged from its sorted sibling lists rather than expanded.

Imports: numpy, simspec.compiled (numba), simspec.types, simspec.trees
(node codes, the expansion and the selection it builds on).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simspec.compiled import jit
from simspec.trees import (DEPTH_TIEBREAK, ExpandBuffers, depth as node_depth, expand_row, kth_largest,
                           log_confidences, top_into)
from simspec.types import RANK_BITS


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
    expand = ExpandBuffers(np.empty(topk, dtype=np.int64), np.empty(topk), np.empty(topk * topk, dtype=np.int64),
                            np.empty(topk * topk), np.empty(topk, dtype=np.int64), np.empty(topk * topk))
    fronts = _Fronts(np.empty((depth, topk), dtype=np.int64), np.empty((depth, topk)), np.empty((depth, topk)),
                     np.empty((depth, topk), dtype=np.int64), np.empty((depth, topk)), np.empty(depth, dtype=np.int64),
                     np.empty((1, depth)), np.empty((3, topk), dtype=np.int64))
    picked = _Picked(np.empty(m), np.empty(m, dtype=np.int64), np.empty(keep, dtype=np.int64), np.empty(2 * m))
    row_codes = np.empty(m, dtype=np.int64)
    row_logs = np.empty(m)
    for i in range(b):
        if keep < m and _sorted_row(logc[i]):
            _merged_row(logc[i], depth, topk, keep, fronts, picked, out[i])
        else:
            expand_row(logc[i], depth, topk, row_codes, row_logs, expand)
            _full_row(row_codes, row_logs, depth, topk, keep, picked, out[i])
    return out


class _Fronts(NamedTuple):
    """A sorted row's levels as sorted streams: each level's frontier, and the
    merge of its sibling lists that yields the level's nodes best first."""

    code: np.ndarray  # [depth, topk] int the frontier's codes at each level (0-based)
    value: np.ndarray  # [depth, topk] float their log path confidences, in top_into's order
    best_first: np.ndarray  # [depth, topk] float the frontier's log values as picked: the level's best, in order
    heads: np.ndarray  # [depth, topk] int each sibling list's next rank - 1 in the level's merge
    head_value: np.ndarray  # [depth, topk] float that node's log value, -inf once the list is spent
    top: np.ndarray  # [depth] int the list holding the level's next node (the first of the best)
    ahead: np.ndarray  # [1, depth] float the level's next value past its frontier, in its merge
    picks: np.ndarray  # [3, topk] int a level's picks' lists and ranks, in pick order, and each list's first slot


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
    least = np.exp(kth_log) - DEPTH_TIEBREAK * depth
    least = least * (1.0 - 1e-9) - 1e-12
    return np.log(least) - 1e-9 if least > 0 else -np.inf


@jit
def _ceiling(kth_log: float, depth: int) -> float:
    """The log confidence over which a node outranks every node whose log
    value is at most the budget-th largest ``kth_log``: its key exceeds
    exp(kth) + tiebreak x depth - tiebreak x depth, theirs is at most
    exp(kth) - tiebreak (with a margin far above exp's and the rounding)."""
    most = (np.exp(kth_log) + DEPTH_TIEBREAK * depth) * (1.0 + 1e-9) + 1e-12
    return np.log(most) + 1e-9


@jit(inline=True)
def _full_row(codes: np.ndarray, logs: np.ndarray, depth: int, topk: int, keep: int, picked: _Picked,
              out: np.ndarray) -> None:
    """The budget's pick of one expanded row (codes, log values [M], in expansion order)."""
    m = len(codes)
    floor = _floor(kth_largest(logs, keep, picked.scratch), depth) if keep < m else -np.inf
    n = 0
    for j in range(m):
        if logs[j] >= floor:
            level = 1 if j < topk else 2 + (j - topk) // (topk * topk)
            picked.key[n] = np.exp(logs[j]) - DEPTH_TIEBREAK * level
            picked.code[n] = codes[j]
            n += 1
    top_into(picked.key[:n], keep, picked.best, picked.scratch)
    for j in range(keep):
        out[j] = picked.code[picked.best[j]]


@jit(inline=True)
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


@jit(inline=True)
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


@jit(inline=True)
def _merged_row(logc: np.ndarray, depth: int, topk: int, keep: int, fronts: _Fronts, picked: _Picked,
                out: np.ndarray) -> None:
    """:func:`_full_row`'s pick for a sorted row, without expanding it.

    Level d >= 1's nodes are the sibling lists of level d - 1's frontier,
    each sorted (value_of[d - 1, f] + logc[d, r] falls with r), so merging
    the lists yields the level best first: the frontier is the merge's
    first ``topk`` nodes, and the budget-th largest log value overall is
    found by walking down the merges past the frontiers, counting the
    frontiers' values as it passes them."""
    # the buffers as locals: a tuple field read in a loop costs numba a reference count each time
    code, value_of = fronts.code, fronts.value
    best_first, heads, head_value = fronts.best_first, fronts.heads, fronts.head_value
    top, ahead, picks = fronts.top, fronts.ahead, fronts.picks
    # Frontiers: level 0 is every rank; level d the topk best of the previous
    # frontier's children by (value, lowest index), in top_into's order.
    for r in range(topk):
        code[0, r] = r + 1
        value_of[0, r] = logc[0, r]
        best_first[0, r] = logc[0, r]
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
            picks[0, t] = f
            picks[1, t] = r
            best_first[d, t] = head_value[d, f]
            heads[d, f] = r + 1  # the list's next node (written out: a call's arrays cost more than this)
            head_value[d, f] = value_of[d - 1, f] + logc[d, r + 1] if r + 1 < topk else -np.inf
            top[d] = _first_max(head_value, d, topk)
        _order_front(picks, best_first, value_of, code, d, topk)

    # The budget-th largest log value. Levels 0..depth-2 know their best
    # topk values (best_first, descending); the rest of each level (all of
    # the last one) comes from its merge, whose next value is ahead[0, d].
    # Walk down the merges' values in order: before taking each, count
    # the known values at or above it (all of them compared: no branch to
    # mispredict); the budget-th falls either among the known values
    # between it and the merge value before (then it is picked from them)
    # or on a merge's value.
    known = max(depth - 1, 1)  # levels with a known frontier
    for d in range(depth):
        ahead[0, d] = head_value[d, top[d]] if d > 0 else -np.inf
    scratch = picked.scratch
    count, popped = 0, 0  # values at or above the last merge value taken; merge values taken
    last = np.inf
    kth_log = 0.0
    while True:
        level = _first_max(ahead, 0, depth)
        u = ahead[0, level]  # the largest value not counted yet among the merges (-inf: none left)
        at_or_above = 0
        for d in range(known):
            for t in range(topk):
                at_or_above += best_first[d, t] >= u
        if at_or_above + popped >= keep:  # among the known values in [u, last)
            fresh = 0
            for d in range(known):
                for t in range(topk):
                    v = best_first[d, t]
                    if u <= v < last:
                        scratch[fresh] = v
                        fresh += 1
            kth_log = kth_largest(scratch[:fresh], keep - count, scratch[fresh:])
            break
        popped += 1
        count = at_or_above + popped
        if count == keep:
            kth_log = u
            break
        last = u
        f = top[level]  # the merge moves on, as the frontier's did
        r = heads[level, f] + 1
        heads[level, f] = r
        head_value[level, f] = value_of[level - 1, f] + logc[level, r] if r < topk else -np.inf
        top[level] = _first_max(head_value, level, topk)
        ahead[0, level] = head_value[level, top[level]]
    n = _above_floor(logc, depth, topk, code, value_of, _floor(kth_log, depth), picked.key, picked.code)
    if n == keep:  # no node near the budget-th: all of them, in expansion order, as top_into gives k >= n
        for j in range(keep):
            out[j] = picked.code[j]
        return
    _near_budget(n, keep, kth_log, depth, picked, out)


@jit(inline=True)
def _above_floor(logc: np.ndarray, depth: int, topk: int, code: np.ndarray, value_of: np.ndarray, floor: float,
                 key: np.ndarray, picked_code: np.ndarray) -> int:
    """The nodes whose log value is at or above ``floor`` into ``key`` and
    ``picked_code``, in expansion order (a prefix of each sibling list); returns how many."""
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
    return n


@jit(inline=True)
def _near_budget(n: int, keep: int, kth_log: float, depth: int, picked: _Picked, out: np.ndarray) -> None:
    """The budget's pick of the ``n`` nodes above the floor (``picked.key``
    their log values, ``picked.code`` their codes) when more than the budget
    are: in top_into's order of _full_row's keys."""
    key, picked_code = picked.key, picked.code
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
            scratch[band] = np.exp(key[j]) - DEPTH_TIEBREAK * node_depth(picked_code[j])
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


@jit(inline=True)
def _order_front(picks: np.ndarray, best_first: np.ndarray, value: np.ndarray, code: np.ndarray, d: int,
                 topk: int) -> None:
    """Level ``d``'s frontier, picked best first (``picks``' lists and
    ranks, ``best_first`` their values), into ``value`` and ``code`` in
    top_into's order: the picks above the topk-th value by their index
    among the level's children (list, then rank: a list's picks are its
    first ranks, so its slots start after the earlier lists' and a pick's
    rank places it), then the ties of the topk-th, picked in that order
    already."""
    kth = best_first[d, topk - 1]
    above = 0
    while above < topk and best_first[d, above] > kth:
        above += 1
    for f in range(topk):
        picks[2, f] = 0
    for t in range(above):
        picks[2, picks[0, t]] += 1
    start = 0
    for f in range(topk):
        n = picks[2, f]
        picks[2, f] = start
        start += n
    for t in range(topk):
        f, r = picks[0, t], picks[1, t]
        slot = picks[2, f] + r if t < above else t
        value[d, slot] = best_first[d, t]
        code[d, slot] = code[d - 1, f] + (np.int64(r + 1) << (RANK_BITS * d))


__all__ = ["eagle_tree"]
