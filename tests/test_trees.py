"""Rank-path codes and acceptance along a tree."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simspec import trees
from simspec.trees import eagle
from simspec.types import PLAN_LINEAR, PLAN_TREE


def code(*ranks):
    return sum(r << (4 * d) for d, r in enumerate(ranks))


def test_codes_depths_and_paths():
    assert trees.chain_codes(3).tolist() == [code(1), code(1, 1), code(1, 1, 1)]
    assert [trees.depth(c) for c in (-1, 0, code(3), code(1, 15), code(*[15] * 15))] == [0, 0, 1, 2, 15]
    assert [trees.parent(c) for c in (0, code(3), code(1, 15), code(2, 1, 4))] == [0, 0, code(1), code(2, 1)]
    assert [trees.rank(c) for c in (0, code(3), code(1, 15), code(2, 1, 4))] == [0, 3, 15, 4]
    assert trees.child(0, 2) == code(2) and trees.child(code(1, 3), 5) == code(1, 3, 5)
    for c in (code(1), code(3), code(1, 14), code(2, 1, 4)):
        d = trees.depth(c)
        assert trees.child_at(c, d, 2) == trees.child(c, 2)
        assert trees.next_sibling(c, d) == trees.child(trees.parent(c), trees.rank(c) + 1)
    assert [trees.on_chain(c) for c in (code(1), code(1, 1, 1), code(1, 2), code(2))] == [True, True, False, False]
    assert trees.path_codes(np.array([[2, 1, 0, 1]])).tolist() == [[code(2), code(2, 1), -1, -1]]


@pytest.mark.parametrize("truth,expected", [
    ([1, 1, 1], 3),  # the whole chain
    ([1, 2, 1], 3),  # the target took the rank-2 branch at depth 2, which the plan holds to depth 3
    ([2, 1, 1], 0),  # rank 2 at the root is not in the plan
    ([1, 3, 1], 1),  # rank 3 at depth 2 is not in the plan
    ([1, 0, 1], 1),  # none of the candidates
])
def test_accepted_length_walks_the_target_path(truth, expected):
    plan = np.array([[code(1), code(1, 1), code(1, 1, 1), code(1, 2), code(1, 2, 1), -1]])
    assert trees.accepted_length(plan, np.array([truth])).tolist() == [expected]


@pytest.mark.parametrize("depth,topk", [(1, 1), (3, 4), (7, 10)])
def test_eagle_expansion_generates_its_node_count_and_a_tree(depth, topk):
    conf = np.sort(np.random.default_rng(0).uniform(0, 1, (2, depth, topk)), axis=2)[:, :, ::-1].copy()
    codes, values, depths = trees.expand(conf, depth, topk)
    assert codes.shape == (2, topk + (depth - 1) * topk * topk)
    assert [trees.depth(c) for c in codes[0]] == depths.tolist()
    kept = trees.eagle_tree(conf, depth, topk, budget=min(20, codes.shape[1]))
    for row in kept:
        held = set(row.tolist())
        for c in held:
            assert trees.depth(c) == 1 or trees.parent(c) in held


def eagle_reference(conf, depth, topk, budget):
    """The spec of trees.eagle_tree's set of nodes: every node of the
    expansion keyed by its path confidence less the depth tie-break, the
    budget largest keys, ties by expansion order. Scalar exp, as the
    compiled code's (numpy's vector exp may round the last bit otherwise)."""
    codes, logs, depths = trees.expand_log(conf, depth, topk)
    keys = np.array([[math.exp(v) - 1e-9 * d for v, d in zip(row, depths)] for row in logs.tolist()])
    return np.stack([codes[i, trees.top_indices(keys[i], budget)] for i in range(len(conf))])


def _confidences(kind, rng, b, depth, topk):
    if kind == "sorted":
        return np.sort(rng.uniform(0, 1, (b, depth, topk)), axis=2)[:, :, ::-1].copy()
    if kind == "ties":  # few distinct values, and clamped ones: equal paths across levels
        return np.sort(rng.choice([0.0, 1e-40, 0.25, 0.5, 1.0], (b, depth, topk)), axis=2)[:, :, ::-1].copy()
    if kind == "drafter":  # as the acceptance model draws them: the first candidate, then shares of the rest
        top = rng.uniform(0.05, 0.95, (b, depth, 1))
        return np.minimum.accumulate(np.concatenate([top, (1 - top) * 0.5 ** np.arange(1, topk)], axis=2), axis=2)
    return rng.uniform(0, 1.2, (b, depth, topk))  # unsorted, some above 1: the rows expanded whole


@pytest.mark.parametrize("kind", ["sorted", "ties", "drafter", "unsorted"])
def test_eagle_tree_is_the_budget_best_of_the_expansion(kind):
    rng = np.random.default_rng(len(kind))
    for depth, topk, budget in [(1, 1, 1), (1, 4, 2), (2, 3, 5), (4, 4, 17), (6, 10, 1), (6, 10, 7), (6, 10, 60),
                                (6, 10, 509), (6, 10, 510), (7, 2, 9), (8, 7, 64)]:
        conf = _confidences(kind, rng, 37, depth, topk)
        expected = np.sort(eagle_reference(conf, depth, topk, budget), axis=1)  # rows are sets: order unspecified
        got = np.sort(trees.eagle_tree(conf, depth, topk, budget), axis=1)
        assert got.tolist() == expected.tolist(), (depth, topk, budget)


def expanded_pick(conf, depth, topk, budget):
    """eagle_tree's pick of every row by expanding it whole (the path rows
    not sorted by rank take): the same codes in the same order is what the
    merged path of sorted rows must give."""
    m = topk + (depth - 1) * topk * topk
    keep = min(budget, m)
    logc = trees.log_confidences(conf, depth, topk)
    bufs = trees.ExpandBuffers(np.empty(topk, np.int64), np.empty(topk), np.empty(topk * topk, np.int64),
                                np.empty(topk * topk), np.empty(topk, np.int64), np.empty(topk * topk))
    picked = eagle._Picked(np.empty(m), np.empty(m, np.int64), np.empty(keep, np.int64), np.empty(m))
    out = np.empty((len(conf), keep), np.int64)
    codes, logs = np.empty(m, np.int64), np.empty(m)
    for i in range(len(conf)):
        trees.expand_row(logc[i], depth, topk, codes, logs, bufs)
        eagle._full_row(codes, logs, depth, topk, keep, picked, out[i])
    return out


@pytest.mark.parametrize("kind", ["sorted", "ties", "drafter"])
def test_eagle_tree_merged_rows_pick_what_expanded_rows_pick(kind):
    rng = np.random.default_rng(7 + len(kind))
    for depth, topk, budget in [(2, 3, 5), (4, 4, 17), (6, 10, 1), (6, 10, 7), (6, 10, 60), (6, 10, 200), (8, 7, 64)]:
        conf = _confidences(kind, rng, 53, depth, topk)
        got = trees.eagle_tree(conf, depth, topk, budget)
        assert got.tolist() == expanded_pick(conf, depth, topk, budget).tolist(), (depth, topk, budget)


@pytest.mark.parametrize("kind", ["sorted", "ties", "drafter", "unsorted"])
def test_full_rows_pack_as_scattered_rows_do(kind):
    """pack_full_rows (eagle_tree's matrix as it is) must give what
    pack_rows gives for the same rows scattered, chains among them (a budget
    of one node a level makes rank-1 chains where rank 1 leads every level)."""
    rng = np.random.default_rng(3 + len(kind))
    kinds = set()
    for depth, topk, budget in [(1, 1, 1), (3, 1, 3), (4, 2, 4), (6, 10, 6), (6, 10, 60), (2, 3, 5)]:
        codes = trees.eagle_tree(_confidences(kind, rng, 41, depth, topk), depth, topk, budget)
        b, keep = codes.shape
        rows = np.repeat(np.arange(b), keep)
        expected = trees.pack_rows(rows, codes.ravel(), b)
        got = trees.pack_full_rows(codes)
        for e, g in zip(expected, got):
            assert g.dtype == e.dtype and g.tolist() == e.tolist(), (depth, topk, budget)
        kinds |= set(got[3].tolist())
    assert kinds == {PLAN_LINEAR, PLAN_TREE}
    assert [a.tolist() for a in trees.pack_full_rows(np.empty((3, 0), np.int64))] == \
        [a.tolist() for a in trees.pack_rows(np.empty(0, np.int64), np.empty(0, np.int64), 3)]


@pytest.mark.parametrize("n", [1, 2, 7, 37, 129, 510])
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_top_indices_are_the_largest_keys_lowest_index_first_on_ties(n, ties):
    rng = np.random.default_rng(n)
    key = rng.integers(0, 5, n).astype(float) if ties else rng.normal(size=n)
    for k in sorted({1, 3, n // 2, n - 1, n, n + 2} - {0}):
        got = trees.top_indices(key, k)
        keep = min(k, n)
        kth = np.sort(key)[::-1][keep - 1]  # the spec: every key above the k-th largest, then its ties by index
        above = np.flatnonzero(key > kth)
        expected = np.arange(n) if k >= n else np.concatenate([above, np.flatnonzero(key == kth)[:keep - len(above)]])
        assert got.tolist() == expected.tolist()
