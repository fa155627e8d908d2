"""Rank-path codes and acceptance along a tree."""

from __future__ import annotations

import numpy as np
import pytest

from simspec import trees


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
